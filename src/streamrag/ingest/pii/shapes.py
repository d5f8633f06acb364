"""A text's shape: the prefilter that keeps number detectors off text full of short numbers.

The number detectors (:mod:`.detectors`) each need a run of digits of a
certain form — seventeen in a row for an identity number, thirteen or a
``4-4``/``4-6`` group for a card, seven or ``3-4`` for a Chinese phone number,
two capitals and two digits for an IBAN. Their regexes step through every
digit of a text to find one, so text full of short numbers (log lines, ids,
times, hashes) cost them the most while holding nothing. The text's *shape*
(:data:`shape_of`), one ``bytes.translate`` shared by every detector, says
with a substring search at C speed whether such a run exists at all, and
:func:`stretches` where: the detectors then run their patterns only there.

>>> shape_of("call 138-1234 5678 at 9")
b'xxxxs000s0000s0000sxxs0'
>>> digit_count("call 138-1234 5678 at 9")
12
"""

from __future__ import annotations

import functools
import re

__all__ = ["digit_count", "shape_of", "stretches"]


def _shape_table() -> bytes:
    table = bytearray(b"x" * 256)
    table[ord("0") : ord("9") + 1] = b"0" * 10
    table[ord("A") : ord("Z") + 1] = b"A" * 26
    table[ord(" ")] = table[ord("-")] = ord("s")
    table[ord("(")] = table[ord(")")] = ord("p")
    return bytes(table)


_SHAPE = _shape_table()


class _Shape:
    """A text's shape: ASCII digit ``0``, capital ``A``, space or dash ``s``, bracket ``p``.

    Every other character becomes ``x``. UTF-8 encodes every non-ASCII
    character with bytes of 0x80 and above, all mapped to ``x``, and the
    patterns match ASCII digits only, so the shape never hides a match.
    Remembered for the last text, with its count of digits (:data:`digit_count`):
    the detectors of one redactor ask about the same text in turn.
    """

    def __init__(self) -> None:
        self.last: tuple[str, bytes, int] = ("", b"", 0)

    def _of(self, text: str) -> tuple[str, bytes, int]:
        last = self.last
        if last[0] is not text:
            shape = text.encode("utf-8", "surrogatepass").translate(_SHAPE)
            last = (text, shape, shape.count(b"0"))
            self.last = last  # one assignment: safe to share between threads
        return last

    def __call__(self, text: str) -> bytes:
        return self._of(text)[1]

    def digits(self, text: str) -> int:
        """How many ASCII digits ``text`` holds."""
        return self._of(text)[2]


shape_of = _Shape()
"""The shape of a text (:class:`_Shape`): the second prefilter of the number detectors."""

digit_count = shape_of.digits
"""The number of ASCII digits in a text: the first prefilter of every number detector."""


def stretches(
    text: str, shape: bytes, runs: tuple[bytes, ...], chars: bytes
) -> list[tuple[int, int]]:
    """Where to run a pattern: the stretches of ``text`` made of ``chars`` that hold a run.

    ``chars`` are shape characters (``b"0s"``: digits, spaces and dashes) and
    every match of the pattern is made of them only, so it lies inside one
    stretch; ``runs`` are shape runs one of which every match holds
    (``0{13}`` or ``0000s0000`` for a card), so a stretch without one holds no
    match, and a text without one none at all (an empty list, found with a
    substring search). Returns ``(start, end)`` of each stretch, in order. Run
    the pattern from ``start`` (look-behinds still see what stands before) and
    keep the matches that begin before ``end``. On text with non-ASCII
    characters, where the shape's bytes are not the text's characters, the one
    stretch is the whole text.
    """
    if not any(run in shape for run in runs):
        return []
    if not text.isascii():
        return [(0, len(text))]
    out: list[tuple[int, int]] = []
    needle = _either(runs)
    mask = shape.translate(_outside(chars))  # "." where a stretch cannot go
    n, pos = len(shape), 0
    while (m := needle.search(shape, pos)) is not None:
        lo = mask.rfind(b".", pos, m.start()) + 1 or pos
        hi = mask.find(b".", m.end())
        hi = n if hi < 0 else hi
        out.append((lo, hi))
        pos = hi
    return out


@functools.cache
def _either(runs: tuple[bytes, ...]) -> re.Pattern[bytes]:
    """A pattern for any one of ``runs``."""
    return re.compile(b"|".join(re.escape(run) for run in runs))


@functools.cache
def _outside(chars: bytes) -> bytes:
    """A table for ``bytes.translate``: ``.`` for every byte not in ``chars``."""
    table = bytearray(b"." * 256)
    for c in chars:
        table[c] = ord("+")
    return bytes(table)
