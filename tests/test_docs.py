"""The README's configuration reference is generated from the settings and kept in sync."""

from __future__ import annotations

import re
from pathlib import Path

from streamrag.config import reference_markdown

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_config_reference_is_current() -> None:
    text = README.read_text(encoding="utf-8")
    found = re.search(
        r"<!-- config-reference:start -->\n(.*?)\n<!-- config-reference:end -->", text, re.S
    )
    assert found, "README.md lacks the config-reference markers"
    assert found.group(1).strip() == reference_markdown().strip(), (
        "README config reference is stale: paste streamrag.config.reference_markdown() into it"
    )


def test_readme_shows_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make demo" in text
    assert "make test" in text
