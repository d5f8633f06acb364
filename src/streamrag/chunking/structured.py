r"""Structure-aware chunking: Markdown sections, code blocks, HTML and sentences.

:class:`StructuredSplitter` is a drop-in for :class:`~streamrag.chunking.TokenSplitter`
(the same :class:`Splitter` interface, the same ``max_tokens`` / ``overlap_tokens``
counted by the same ``count_tokens``) that follows a document's structure:

* **Sections.** The document is cut at its Markdown headings (ATX ``#`` lines
  and setext underlines; ``#`` lines inside fenced code are not headings). A
  chunk never spans two sections; a section longer than ``max_tokens`` becomes
  several chunks. A heading with no text of its own before the next heading
  (``# Install`` straight followed by ``## Linux``) is not a section of its own:
  it is part of the next one's heading path.
* **Inside a section** the maintained `semantic-text-splitter`_ (``MarkdownSplitter``,
  CommonMark + GFM) packs the largest units that fit: code blocks, tables and
  list items whole where they fit, then paragraphs, then sentences, then words.
  Neighbouring chunks of one section overlap by at most ``overlap_tokens``.
* **Plain text** has no headings: one section, split by paragraphs and sentences
  (never mid-sentence while a sentence fits). A plain text that fits in
  ``max_tokens`` is one chunk, verbatim, exactly as ``TokenSplitter`` makes it, so
  switching splitters re-embeds no short plain document.
* **HTML** that arrives raw (the text starts with a tag and has closing block
  tags) is first rendered as Markdown: ``<h1>``–``<h6>`` become ``#`` lines,
  ``<pre>`` a fenced block, ``<li>`` a list item; scripts, styles and ``<head>``
  are dropped, entities decoded.

**The heading path** of a chunk (``("Install", "Linux", "Debian")``) is the stack
of headings in force where its section starts. It travels as a *contextual
chunk header*: with ``headers=True`` (the default) each chunk's text is
``"Install > Linux > Debian\n\n"`` followed by the section text without its
heading lines, so the path is embedded with the chunk (it improves retrieval,
see ``benchmarks/results/chunking-quality.md``), stored as the chunk's text and
returned as the first line of a search hit's ``text``. The header counts toward
``max_tokens`` (it takes at most half of them; outer levels are dropped first).
:meth:`StructuredSplitter.chunks` returns the path as data
(:attr:`Chunk.heading_path`) for callers that want it apart from the text.

>>> s = StructuredSplitter(max_tokens=12, overlap_tokens=0)
>>> s.split("# Install\n\n## Linux\n\nRun the installer.\n\n## Mac\n\nUse brew.")
['Install > Linux\n\nRun the installer.', 'Install > Mac\n\nUse brew.']
>>> s.split("Short plain text. Two sentences.")
['Short plain text. Two sentences.']

.. _semantic-text-splitter: https://github.com/benbrandt/text-splitter
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any, Protocol, runtime_checkable

from streamrag.chunking.splitters import check_bounds, count_words
from streamrag.errors import MissingDependencyError

__all__ = [
    "Chunk",
    "Section",
    "Splitter",
    "StructuredSplitter",
    "html_to_markdown",
    "looks_like_html",
    "markdown_sections",
]

_PURPOSE = "Structure-aware chunking (chunking.splitter: structured)"
_SEP = " > "
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_NOT_PARAGRAPH = re.compile(r"^ {0,3}(?:[-*+>]|\d+[.)]|#|`{3}|~{3}|\|)")
_HTML_START = re.compile(r"^\s*<(?:!doctype|!--|[a-z][a-z0-9]*\b)", re.IGNORECASE)
_HTML_DOC = re.compile(r"^\s*(?:<!--.*?-->\s*)*<(?:!doctype\s+html|html|head|body)\b", re.I | re.S)
_MD_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+\S", re.MULTILINE)
_HTML_BLOCK_END = re.compile(
    r"</(?:html|body|p|div|h[1-6]|li|ul|ol|section|article|table|pre)\s*>", re.IGNORECASE
)


@runtime_checkable
class Splitter(Protocol):
    """What the chunk stage needs of a splitter (``TokenSplitter`` and ``StructuredSplitter``)."""

    @property
    def max_tokens(self) -> int:
        """Most tokens of a chunk."""
        ...

    @property
    def overlap_tokens(self) -> int:
        """Most tokens repeated between neighbouring chunks."""
        ...

    def split(self, text: str) -> list[str]:
        """The chunks of ``text`` in order."""
        ...

    def split_counted(self, text: str) -> tuple[list[str], int]:
        """The chunks of ``text`` and its token count (chunk overlap not included)."""
        ...


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk: the text stored and embedded, and the headings it sits under."""

    text: str
    heading_path: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        """The heading path as one string, ``"Install > Linux > Debian"``."""
        return _SEP.join(self.heading_path)


@dataclass(frozen=True, slots=True)
class Section:
    """A run of a Markdown document under one heading path."""

    heading_path: tuple[str, ...]
    heading: str
    """The heading lines that open the section (with those of empty parents)."""
    body: str
    """The text under the heading, up to the next heading."""
    start: int
    """Character offset of the section in the document."""


def _headings(text: str) -> list[tuple[int, int, int, str]]:
    """``(start, end, level, title)`` of every heading, outside fenced code."""
    out: list[tuple[int, int, int, str]] = []
    fence: str | None = None
    pos = 0
    prev: tuple[int, str] | None = None  # the previous line if it is paragraph text
    blank_before = True
    for line in text.splitlines(keepends=True):
        start, pos = pos, pos + len(line)
        bare = line.rstrip("\r\n")
        m = _FENCE.match(bare)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            prev, blank_before = None, False
            continue
        if m:
            fence, prev, blank_before = m.group(1), None, False
            continue
        atx = _ATX.match(bare)
        if atx:
            out.append((start, pos, len(atx.group(1)), (atx.group(2) or "").strip()))
            prev, blank_before = None, False
            continue
        setext = _SETEXT.match(bare)
        if setext and prev is not None:
            level = 1 if setext.group(1)[0] == "=" else 2
            out.append((prev[0], pos, level, prev[1].strip()))
            prev, blank_before = None, False
            continue
        if not bare.strip():
            prev, blank_before = None, True
            continue
        # Only a one-line paragraph after a blank line can be a setext heading here.
        prev = (start, bare) if blank_before and not _NOT_PARAGRAPH.match(bare) else None
        blank_before = False
    return out


def markdown_sections(text: str) -> list[Section]:
    r"""Cut a Markdown document at its headings, each section with its heading path.

    A heading with no text under it before the next heading joins the next
    section (its heading lines are kept in that section's ``heading``); a
    trailing one stays a section with an empty body.

    >>> [(s.heading_path, s.body) for s in markdown_sections("Intro\n# A\n## B\nb\n# C\nc")]
    [((), 'Intro\n'), (('A', 'B'), 'b\n'), (('C',), 'c')]
    """
    heads = _headings(text)
    out: list[Section] = []
    first = heads[0][0] if heads else len(text)
    if text[:first].strip():
        out.append(Section((), "", text[:first], 0))
    stack: list[tuple[int, str]] = []
    pending = ""
    pending_start = -1
    for i, (start, end, level, title) in enumerate(heads):
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, title))
        nxt = heads[i + 1][0] if i + 1 < len(heads) else len(text)
        body = text[end:nxt]
        if pending_start < 0:
            pending_start = start
        pending += text[start:end]
        if body.strip() or i + 1 == len(heads):
            path = tuple(t for _, t in stack if t)
            out.append(Section(path, pending, body, pending_start))
            pending, pending_start = "", -1
        else:
            pending += body  # blank lines between headings
    return out


class _HtmlToMarkdown(HTMLParser):
    _SKIP = frozenset({"script", "style", "head", "noscript", "template", "svg"})
    _BLOCK = frozenset(
        {
            *("p", "div", "section", "article", "header", "footer", "main", "nav", "aside"),
            *("blockquote", "table", "ul", "ol", "dl", "dt", "dd", "form", "figure", "hr"),
            *("figcaption", "address", "details", "summary", "body", "html"),
        }
    )

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0
        self.pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self.skip += 1
        elif tag in {"h1", "h2", "h3", "h4", "h5", "h6"}:
            self.parts.append("\n\n" + "#" * int(tag[1]) + " ")
        elif tag == "pre":
            self.pre += 1
            self.parts.append("\n\n```\n")
        elif tag == "li":
            self.parts.append("\n- ")
        elif tag in {"br", "tr"}:
            self.parts.append("\n")
        elif tag in {"td", "th"}:
            self.parts.append(" ")
        elif tag in self._BLOCK:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag in {"h1", "h2", "h3", "h4", "h5", "h6"} or tag in self._BLOCK:
            self.parts.append("\n\n")
        elif tag == "pre":
            self.pre = max(0, self.pre - 1)
            self.parts.append("\n```\n\n")

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        if self.pre:
            self.parts.append(data.strip("\n"))
        else:
            self.parts.append(re.sub(r"\s+", " ", data))

    def markdown(self) -> str:
        lines = [line.rstrip() for line in "".join(self.parts).split("\n")]
        out: list[str] = []
        fenced = False
        for line in lines:
            if line.startswith("```"):
                fenced = not fenced
            else:
                line = line if fenced else line.strip()
            if not line and out and not out[-1] and not fenced:
                continue
            out.append(line)
        return "\n".join(out).strip()


def looks_like_html(text: str) -> bool:
    """Whether ``text`` is an HTML document rather than Markdown or plain text.

    A document that opens with ``<!doctype html>``, ``<html>``, ``<head>`` or
    ``<body>`` is; one that opens with another tag is when it has closing block
    tags and no Markdown heading line (a README may open with ``<p align=...>``).
    """
    if _HTML_DOC.match(text):
        return True
    return (
        bool(_HTML_START.match(text))
        and _HTML_BLOCK_END.search(text) is not None
        and _MD_HEADING.search(text) is None
    )


def html_to_markdown(text: str) -> str:
    r"""Render HTML as Markdown: headings as ``#`` lines, ``<pre>`` fenced, lists as items.

    >>> html_to_markdown("<h1>Install</h1><p>Run &amp; wait.</p><h2>Linux</h2><pre>apt  x</pre>")
    '# Install\n\nRun & wait.\n\n## Linux\n\n```\napt  x\n```'
    """
    parser = _HtmlToMarkdown()
    parser.feed(text)
    parser.close()
    return parser.markdown()


@dataclass(frozen=True, eq=False)
class StructuredSplitter:
    """Section-, code-block- and sentence-aware splitting within a token bound.

    Use it wherever a ``TokenSplitter`` goes: ``StructuredSplitter(max_tokens,
    overlap_tokens, count_tokens=embedder.count_tokens)``. ``headers`` prefixes
    each chunk with its heading path (see the module docstring). Needs the
    ``documents`` extra (``semantic-text-splitter``): constructing one without it
    raises :class:`~streamrag.errors.MissingDependencyError` (at start-up, not
    as a dead letter per document).
    Picklable: the native splitters it builds are rebuilt after unpickling.
    """

    max_tokens: int = 128
    overlap_tokens: int = 16
    count_tokens: Callable[[str], int] = count_words
    headers: bool = True
    _native: dict[int, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_bounds(self.max_tokens, self.overlap_tokens)
        self._native[self.max_tokens] = self._build(self.max_tokens)  # fails here if missing

    def __getstate__(self) -> dict[str, Any]:
        keys = ("max_tokens", "overlap_tokens", "count_tokens", "headers")
        return {k: getattr(self, k) for k in keys}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)
        object.__setattr__(self, "_native", {})

    def split(self, text: str) -> list[str]:
        """Return the chunks of ``text`` in order (``[]`` for a blank text)."""
        return self.split_counted(text)[0]

    def split_counted(self, text: str) -> tuple[list[str], int]:
        """The chunks of ``text`` and its token count (chunk overlap not included)."""
        if looks_like_html(text):
            text = html_to_markdown(text)
        total = self.count_tokens(text)
        return [c.text for c in self._chunks(text, total)], total

    def chunks(self, text: str) -> list[Chunk]:
        """The chunks of ``text`` with their heading paths."""
        if looks_like_html(text):
            text = html_to_markdown(text)
        return self._chunks(text, None)

    def _chunks(self, text: str, total: int | None) -> list[Chunk]:
        if not text.strip():
            return []
        sections = markdown_sections(text)
        plain = len(sections) == 1 and not sections[0].heading_path
        if plain and (self.count_tokens(text) if total is None else total) <= self.max_tokens:
            return [Chunk(text)]  # plain text or Markdown without headings: verbatim
        out: list[Chunk] = []
        for sec in sections:
            out.extend(self._section(sec))
        return out

    def _section(self, sec: Section) -> list[Chunk]:
        path = sec.heading_path
        half = self.max_tokens // 2
        if self.headers and path:
            header = self._header(path)
            if header:
                return self._under(header, sec.body, path, every=True)
        lead = sec.heading.strip()
        if not lead or self.count_tokens(lead + "\n\n") <= half:
            # The heading lines open the section's first chunk.
            return self._under(lead, sec.body, path, every=False)
        whole = sec.heading + sec.body  # a heading too long to lead: cut with the rest
        return [Chunk(c, path) for c in self._pieces(whole, self.max_tokens)]

    def _under(self, header: str, body: str, path: tuple[str, ...], *, every: bool) -> list[Chunk]:
        """``body`` in pieces, ``header`` before every piece (or only the first)."""
        if not header:
            return [Chunk(c, path) for c in self._pieces(body, self.max_tokens)]
        if not body.strip():
            return [Chunk(header, path)]
        room = self.max_tokens - self.count_tokens(header + "\n\n")
        out: list[Chunk] = []
        for piece in self._pieces(body, room):
            if every or not out:
                out.extend(Chunk(f"{header}\n\n{p}", path) for p in self._fit(header, piece, room))
            else:
                out.append(Chunk(piece, path))
        return out

    def _header(self, path: tuple[str, ...]) -> str:
        """The heading path as a header of at most half the token budget."""
        budget = self.max_tokens // 2
        count = self.count_tokens
        parts = list(path)
        while len(parts) > 1 and count(_SEP.join(parts) + "\n\n") > budget:
            parts.pop(0)
        words = _SEP.join(parts).split()
        while words and count(" ".join(words) + "\n\n") > budget:
            words.pop()
        return " ".join(words)

    def _fit(self, header: str, piece: str, room: int) -> list[str]:
        """``piece`` cut further until header and piece together fit (tokens may not add up)."""
        count = self.count_tokens
        excess = count(f"{header}\n\n{piece}") - self.max_tokens
        if excess <= 0 or room <= 1:
            return [piece]
        return [
            p
            for sub in self._pieces(piece, room - excess)
            for p in self._fit(header, sub, room - excess)
        ]

    def _pieces(self, text: str, capacity: int) -> list[str]:
        capacity = max(1, capacity)
        native = self._native.get(capacity)
        if native is None:
            native = self._native[capacity] = self._build(capacity)
        return [c for c in native.chunks(text) if c.strip()]

    def _build(self, capacity: int) -> Any:
        try:
            from semantic_text_splitter import MarkdownSplitter
        except ImportError:
            package = "semantic-text-splitter"
            raise MissingDependencyError(package, "documents", _PURPOSE) from None
        overlap = min(self.overlap_tokens, capacity - 1)
        return MarkdownSplitter.from_callback(self.count_tokens, capacity, overlap)
