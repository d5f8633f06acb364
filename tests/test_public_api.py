"""The top-level package exports a small, pinned set of names, and imports fast."""

from __future__ import annotations

import subprocess
import sys

import streamrag

EXPECTED = {
    "Change",
    "ChangeBatch",
    "Embedder",
    "ExactIndex",
    "Op",
    "Pipeline",
    "Service",
    "Settings",
    "StreamragError",
    "create_app",
    "load_settings",
}


def test_all_is_pinned_and_every_name_resolves() -> None:
    assert set(streamrag.__all__) == EXPECTED
    for name in streamrag.__all__:
        assert getattr(streamrag, name).__doc__, name


def test_import_is_light() -> None:
    code = (
        "import sys, streamrag\n"
        "heavy = [m for m in ('torch', 'sentence_transformers', 'fastapi', 'numpy') "
        "if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_error_derives_from_the_root() -> None:
    from streamrag import errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.StreamragError)
