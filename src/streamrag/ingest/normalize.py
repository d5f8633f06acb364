"""Text normalization applied to every document before chunking.

Unicode is brought to NFC so that the same text typed two ways hashes and embeds
the same; control characters other than newlines and tabs are removed; trailing
whitespace is trimmed. ASCII text skips the Unicode work.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["holds_any_ascii", "normalize_text"]

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_CONTROL_BYTES = bytes([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
"""The characters of :data:`_CONTROL` as bytes, for :func:`holds_any_ascii`."""


def holds_any_ascii(text: str, chars: bytes) -> bool:
    """Whether ``text`` holds one of the ASCII characters ``chars``: one ``bytes.translate``.

    UTF-8 encodes every non-ASCII character with bytes of 0x80 and above only, so
    ASCII characters are found as bytes exactly where they are characters. Much
    faster than a regex search on text that holds none of them.
    """
    raw = text.encode("utf-8", "surrogatepass")
    return len(raw.translate(None, chars)) != len(raw)


def normalize_text(text: str) -> str:
    r"""Return ``text`` in NFC without control characters, stripped.

    >>> normalize_text("Cafe\u0301 menu\x00 ")
    'Café menu'
    """
    if not text.isascii():
        text = unicodedata.normalize("NFC", text)
    if holds_any_ascii(text, _CONTROL_BYTES):
        text = _CONTROL.sub("", text)
    return text.strip()
