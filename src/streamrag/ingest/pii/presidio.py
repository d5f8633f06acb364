"""Names, organisations and places through Presidio: the optional ``pii`` extra.

Patterns cannot tell that "Ada Lovelace" is a person; a trained named-entity
model can. :class:`PresidioDetector` runs Microsoft Presidio's analyzer over a
spaCy pipeline and reports ``PERSON``, ``ORGANIZATION`` and ``LOCATION`` (or the
Presidio types configured in ``redaction.presidio.entities``). Add it with
``redaction.detectors: [..., presidio]``.

What it needs, and where to get it:

* the package: ``pip install 'streamrag[pii]'`` (presidio-analyzer and spaCy);
* a spaCy pipeline with a named-entity recognizer. spaCy's trained pipelines
  (``en_core_web_sm`` and the others) are not on PyPI: install one from
  spaCy's model releases (``python -m spacy download en_core_web_sm``, or
  ``pip install`` of its wheel or of a copy on a package index of one's own),
  or give ``redaction.presidio.model`` the directory of any saved pipeline.

Both are checked when the detector is built, so a job configured with it and
without them refuses to start and says which is missing — Presidio itself would
try to download the model instead. The analyzer and the model load on the
first text (seconds), not when streamrag is imported.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streamrag.errors import MissingDependencyError, MissingModelError
from streamrag.ingest.pii.detectors import Span, resolve

__all__ = ["PresidioDetector"]

_MODEL_HOW = (
    "python -m spacy download {model} (spaCy's trained pipelines are not on PyPI; a wheel "
    "from spaCy's model releases, or a copy on a package index of your own, installs with "
    "pip too), or set redaction.presidio.model to the directory of a saved spaCy pipeline"
)


class PresidioDetector:
    """Presidio's analyzer over a spaCy pipeline: people, organisations, places."""

    name: str = "presidio"

    def __init__(
        self,
        model: str = "en_core_web_sm",
        entities: Sequence[str] = ("PERSON", "ORGANIZATION", "LOCATION"),
        score_threshold: float = 0.5,
        language: str = "en",
    ) -> None:
        self.model = model
        self.entities = tuple(entities)
        self.score_threshold = score_threshold
        self.language = language
        self._analyzer: Any = None
        self._lock = threading.Lock()
        self.check()

    def check(self) -> None:
        """Raise a clear error when the package or the spaCy pipeline is not installed."""
        purpose = "the Presidio redaction detector (redaction.detectors: presidio)"
        if importlib.util.find_spec("presidio_analyzer") is None:
            package = "presidio-analyzer"
            raise MissingDependencyError(package, "pii", purpose)
        if not (Path(self.model).is_dir() or importlib.util.find_spec(self.model) is not None):
            raise MissingModelError(self.model, purpose, _MODEL_HOW.format(model=self.model))

    def _load(self) -> Any:
        with self._lock:
            if self._analyzer is None:
                from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
                from presidio_analyzer.nlp_engine import SpacyNlpEngine
                from presidio_analyzer.predefined_recognizers import SpacyRecognizer

                engine = SpacyNlpEngine(
                    models=[{"lang_code": self.language, "model_name": self.model}]
                )
                registry = RecognizerRegistry(supported_languages=[self.language])
                registry.add_recognizer(
                    SpacyRecognizer(
                        supported_language=self.language, supported_entities=list(self.entities)
                    )
                )
                self._analyzer = AnalyzerEngine(
                    nlp_engine=engine,
                    registry=registry,
                    supported_languages=[self.language],
                )
            return self._analyzer

    def find(self, text: str) -> list[Span]:
        """The people, organisations and places Presidio finds in ``text``."""
        if not text.strip():
            return []
        results = self._load().analyze(
            text,
            language=self.language,
            entities=list(self.entities),
            score_threshold=self.score_threshold,
        )
        return resolve(
            (0, Span(int(r.start), int(r.end), str(r.entity_type)))
            for r in results
            if r.end > r.start
        )
