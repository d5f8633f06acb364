"""Which embedder makes the next vectors: the configured one, a fast variant, or a fallback.

A job has one *configured* embedder (``primary``) and may name two others of
the same vector space:

* a **fallback**, used while the configured one fails. When an ingest call
  fails after its retries (:func:`~streamrag.embed.resilient.embed_resilient`
  raised :class:`~streamrag.errors.EmbedderError`), or a query embed fails,
  the *circuit opens*: ingest and queries go to the fallback instead of
  stalling. Every ``probe_every_s`` one text of the next batch is tried on the
  configured embedder again (a single call, no retries, so a dead endpoint
  costs one refused connection); when it answers the circuit closes and the
  batch goes back to it. This is the circuit breaker of Nygard's *Release It!*
  with a half-open probe.
* a **fast** variant, used while changes wait too long: when the oldest change
  of a batch has waited more than ``fast_above_lag_us``, the batch is embedded
  with it (MiniLM with int8 weights is about twice as fast on a CPU); below
  half that wait the configured one takes over again (hysteresis, so the
  choice does not flap at the threshold).

**One vector space.** A query embedded by one model must never be compared
with vectors made by another. All three embedders must name the same
``space`` (an embedder's ``space`` attribute, else its ``version``): a
precision variant of a model shares the model's space, another model does not
(changing model is a re-index: :mod:`streamrag.runtime.generations`).
:func:`space_agreement` measures it: the cosine between two embedders' vectors
of the same texts, which must be at least :data:`MIN_COSINE`.

Every chunk records the ``version`` of the embedder that made its vector, and
:meth:`EmbedderChoice.status` says which is in use and why (``/v1/status``).
The clock is injected; nothing here sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from streamrag.embed.base import Embedder, check_vectors, in_process
from streamrag.embed.computes_here import ComputesHere
from streamrag.errors import ConfigError
from streamrag.timing import US_PER_S, Clock, Timestamp, format_timestamp

__all__ = ["MIN_COSINE", "PROBE_TEXTS", "Choice", "EmbedderChoice", "space_agreement", "space_of"]

Role = Literal["primary", "fast", "fallback"]

MIN_COSINE = 0.99
"""Two embedders share a vector space when every probe text's vectors agree at least this well."""

PROBE_TEXTS = (
    "How do I reset my password?",
    "The invoice for March was sent twice to the same customer.",
    "Kubernetes pods restart in a loop after the upgrade to 1.30.",
    "Quarterly revenue grew 12% while operating costs stayed flat.",
    "def merge(a, b): return sorted(a + b)",
    "Der Zug nach Berlin fällt heute wegen eines Streiks aus.",
)
"""Texts the space check embeds with both embedders (short and long, prose and code)."""


def space_of(embedder: Embedder) -> str:
    """The vector space an embedder's vectors live in: its ``space``, else its ``version``."""
    space = getattr(embedder, "space", None)
    return str(space) if space else embedder.version


def space_agreement(a: Embedder, b: Embedder, texts: Sequence[str] = PROBE_TEXTS) -> float:
    """The lowest cosine between ``a``'s and ``b``'s vectors of the same texts."""
    va = check_vectors(a.embed_many(list(texts)), len(texts), a.dim, type(a).__name__)
    vb = check_vectors(b.embed_many(list(texts)), len(texts), b.dim, type(b).__name__)
    return float(np.min(np.sum(va * vb, axis=1)))


@dataclass(frozen=True, slots=True)
class Choice:
    """The embedder for one call, the part it plays, and why it was chosen."""

    embedder: Embedder
    role: Role
    why: str
    probe: bool = False
    """True when this call tries the configured embedder while the circuit is open."""


class EmbedderChoice:
    """Chooses the embedder for each batch and each query (see the module docstring)."""

    def __init__(
        self,
        primary: Embedder,
        *,
        clock: Clock,
        fallback: Embedder | None = None,
        fast: Embedder | None = None,
        probe_every_s: float = 5.0,
        fast_above_lag_us: Timestamp | None = None,
        measure: Callable[[], ComputesHere] = ComputesHere,
    ) -> None:
        for role, other in (("fallback", fallback), ("fast", fast)):
            if other is not None:
                _check_same_space(primary, other, role)
        self.primary, self.fallback, self.fast = primary, fallback, fast
        self.clock = clock
        self.probe_every_us = int(probe_every_s * US_PER_S)
        self.fast_above_lag_us = fast_above_lag_us
        self._lock = threading.Lock()
        self._open_since: Timestamp | None = None
        self._next_probe: Timestamp = 0
        self._reason = ""
        self._fast_on = False
        self._last: Choice = Choice(primary, "primary", "configured")
        self.switches = 0
        """How many times the embedder in use changed."""
        self.agreement: float | None = None
        """The measured cosine between the configured embedder and the fallback, once checked."""
        self.measure = measure
        """Makes the meter of a query embedder that does not say whether it computes here."""
        self._measured: dict[Role, ComputesHere] = {}

    @property
    def in_use(self) -> str:
        """The version of the embedder that made the latest vectors."""
        return self._last.embedder.version

    @property
    def in_process(self) -> bool:
        """Every embedder a query may be given to computes here, with no I/O to wait on.

        As the embedder says (``in_process``), or, where it does not say, as
        its query calls measured so far show (:mod:`.computes_here`).
        """
        roles: tuple[tuple[Role, Embedder | None], ...] = (
            ("primary", self.primary),
            ("fallback", self.fallback),
        )
        for role, e in roles:
            if e is None:
                continue
            said = in_process(e)
            if said is None:
                meter = self._measured.get(role)
                said = meter is not None and meter.verdict
            if not said:
                return False
        return True

    @property
    def circuit_open(self) -> bool:
        """True while the configured embedder is failing and the fallback stands in."""
        return self._open_since is not None

    def embedders(self) -> list[Embedder]:
        """Every embedder this choice may use (to load them all before serving)."""
        return [e for e in (self.primary, self.fast, self.fallback) if e is not None]

    def verify(self) -> float | None:
        """Check that the fallback and the fast variant agree with the configured embedder.

        Returns the lowest cosine found (None when there is nothing to check or
        the configured embedder does not answer now: then it is checked again
        when a probe succeeds). Raises :class:`ConfigError` below :data:`MIN_COSINE`.
        """
        lowest: float | None = None
        for role, other in (("fallback", self.fallback), ("fast", self.fast)):
            if other is None:
                continue
            try:
                agree = space_agreement(self.primary, other)
            except Exception:  # the configured embedder is down: nothing to compare yet
                return None
            if agree < MIN_COSINE:
                msg = (
                    f"embedder.{role} ({other.version}) does not make the configured embedder's "
                    f"vectors ({self.primary.version}): cosine {agree:.4f} on probe texts, "
                    f"expected >= {MIN_COSINE}; use another precision of the same model, or "
                    "change model with `streamrag reindex`"
                )
                raise ConfigError(msg)
            lowest = agree if lowest is None else min(lowest, agree)
        self.agreement = lowest
        return lowest

    # -- ingest --------------------------------------------------------------------

    def for_batch(self, lag_us: Timestamp | None) -> Choice:
        """The embedder for the next ingest batch, whose oldest change has waited ``lag_us``."""
        now = self.clock.now_us()
        with self._lock:
            if self._open_since is not None and self.fallback is not None:
                if now >= self._next_probe:
                    self._next_probe = now + self.probe_every_us
                    return Choice(self.primary, "primary", "probing after failures", probe=True)
                return self._use(Choice(self.fallback, "fallback", self._reason))
            fast = self.fast
            if fast is not None and self.fast_above_lag_us is not None and lag_us is not None:
                if lag_us > self.fast_above_lag_us:
                    self._fast_on = True
                elif lag_us < self.fast_above_lag_us // 2:
                    self._fast_on = False
                if self._fast_on:
                    waited = f"changes waited {lag_us / US_PER_S:.1f} s"
                    limit = f"{self.fast_above_lag_us / US_PER_S:.1f} s"
                    return self._use(Choice(fast, "fast", f"{waited} (above {limit})"))
            return self._use(Choice(self.primary, "primary", "configured"))

    def failed(self, choice: Choice, error: BaseException) -> Choice | None:
        """The configured embedder failed: open the circuit and return the fallback, if any."""
        if choice.role != "primary" or self.fallback is None:
            return None
        now = self.clock.now_us()
        with self._lock:
            if self._open_since is None:
                self._open_since = now
            self._next_probe = now + self.probe_every_us
            self._reason = f"{self.primary.version} failed: {_short(error)}"
            return self._use(Choice(self.fallback, "fallback", self._reason))

    def succeeded(self, choice: Choice) -> None:
        """A call on the configured embedder succeeded: close the circuit."""
        if choice.role != "primary" or self._open_since is None:
            return
        with self._lock:
            self._open_since = None
            self._reason = ""
            self._use(Choice(self.primary, "primary", "answering again"))

    # -- queries -------------------------------------------------------------------

    def embed_queries(self, texts: Sequence[str]) -> tuple[npt.NDArray[np.float32], Embedder]:
        """Query vectors from the configured embedder, or the fallback while it fails."""
        if self._open_since is None or self.fallback is None:
            try:
                return self._embed("primary", self.primary, texts), self.primary
            except Exception as exc:
                if self.fallback is None:
                    raise
                self.failed(Choice(self.primary, "primary", "configured"), exc)
        assert self.fallback is not None
        return self._embed("fallback", self.fallback, texts), self.fallback

    def _embed(self, role: Role, embedder: Embedder, texts: Sequence[str]) -> Any:
        """``embedder.embed_many(texts)``, measured where the embedder does not say how it runs."""
        if in_process(embedder) is not None:
            return embedder.embed_many(list(texts))
        meter = self._measured.get(role)
        if meter is None:
            with self._lock:
                meter = self._measured.setdefault(role, self.measure())
        return meter.call(embedder.embed_many, texts)

    # -- where things stand --------------------------------------------------------

    def _use(self, choice: Choice) -> Choice:
        if choice.embedder is not self._last.embedder:
            self.switches += 1
        self._last = choice
        return choice

    def status(self) -> dict[str, Any]:
        """Which embedder is in use and why, for ``/v1/status``."""
        last = self._last
        out: dict[str, Any] = {
            "in_use": self.in_use,
            "role": last.role,
            "why": last.why,
            "configured": self.primary.version,
            "space": space_of(self.primary),
            "switches": self.switches,
            "in_process": self.in_process,
        }
        if self._measured:
            out["measured"] = {role: m.status() for role, m in list(self._measured.items())}
        if self.fallback is not None:
            since = self._open_since
            out["fallback"] = {
                "embedder": self.fallback.version,
                "circuit": "open" if since is not None else "closed",
                "open_since": None if since is None else format_timestamp(since),
                "agreement": self.agreement,
            }
        if self.fast is not None:
            out["fast"] = {
                "embedder": self.fast.version,
                "above_lag_ms": None
                if self.fast_above_lag_us is None
                else self.fast_above_lag_us // 1000,
                "on": self._fast_on,
            }
        return out


def _check_same_space(primary: Embedder, other: Embedder, role: str) -> None:
    if other.dim != primary.dim or space_of(other) != space_of(primary):
        msg = (
            f"embedder.{role} makes {other.dim}-dimensional vectors in space "
            f"{space_of(other)!r}, the configured embedder {primary.dim}-dimensional ones in "
            f"{space_of(primary)!r}; a {role} must be the same model (another precision or "
            "another server of it). To change model, re-index: `streamrag reindex`"
        )
        raise ConfigError(msg)


def _short(error: BaseException) -> str:
    text = str(error.args[0]) if error.args else type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."
