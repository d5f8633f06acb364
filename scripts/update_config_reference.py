"""Rewrite the configuration reference in docs/configuration.md from streamrag.config (run after changing Settings)."""

from __future__ import annotations

import re
from pathlib import Path

from streamrag.config import reference_markdown

README = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"

text = README.read_text(encoding="utf-8")
new = re.sub(
    r"(<!-- config-reference:start -->\n).*?(\n<!-- config-reference:end -->)",
    lambda m: m.group(1) + reference_markdown() + m.group(2),
    text,
    flags=re.S,
)
README.write_text(new, encoding="utf-8")
