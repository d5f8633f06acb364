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
_CONTROL_BYTES = bytes([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
"""The characters of :data:`_CONTROL` as bytes: an ASCII text is searched for them by
``bytes.translate``, much faster than the regex on text that holds none."""


def _has_control(text: str) -> bool:
    if text.isascii():
        raw = text.encode("ascii")
        return len(raw.translate(None, _CONTROL_BYTES)) != len(raw)
    return _CONTROL.search(text) is not None


def normalize_text(text: str) -> str:
    r"""Return ``text`` in NFC without control characters, stripped.

    >>> normalize_text("Cafe\u0301 menu\x00 ")
    'Café menu'
    """
    if not text.isascii():
        text = unicodedata.normalize("NFC", text)
    if _has_control(text):
        text = _CONTROL.sub("", text)
    return text.strip()
