"""Text normalization applied to every document before chunking.

Unicode is brought to NFC so that the same text typed two ways hashes and embeds
the same; control characters other than newlines and tabs are removed; trailing
whitespace is trimmed. ASCII text skips the Unicode work.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["normalize_text"]

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def normalize_text(text: str) -> str:
    r"""Return ``text`` in NFC without control characters, stripped.

    >>> normalize_text("Cafe\u0301 menu\x00 ")
    'Café menu'
    """
    if not text.isascii():
        text = unicodedata.normalize("NFC", text)
    if _CONTROL.search(text):
        text = _CONTROL.sub("", text)
    return text.strip()
