"""Document files into changes: text out of Markdown, plain text, HTML, PDF, DOCX and JSON.

The folder reader (:mod:`streamrag.sources.folder`) sends one record per file
version: a JSON header line (path, upsert or delete, size, modification time)
and the file's bytes. :class:`DocumentDecoder` turns each into one change:

* an upsert of the document whose id is the path, with the text extracted by a
  maintained library for its format — ``pypdf`` (PDF), ``python-docx`` (DOCX),
  ``beautifulsoup4`` (HTML: scripts and styles dropped, headings kept as
  Markdown ``#`` lines so a structure-aware splitter sees the sections), and
  JSON pretty-printed; Markdown and text are read as UTF-8 (other encodings
  are guessed by ``bs4``'s ``UnicodeDammit``). Metadata: ``path``, ``size``,
  ``mtime`` (ISO-8601), ``format``; the title where the format has one (HTML
  ``<title>``, PDF and DOCX properties, a Markdown file's first ``#`` heading);
* a delete, for a removed file — and for a file with no text at all (empty, or a
  PDF of scanned pages): the index must not keep the text of an older version;
* or a dead letter, with the path and the position, for a file that cannot be
  used: corrupt or encrypted, too large, unreadable, or with more text than
  ``ingest.max_document_bytes``. The last good version stays in the index.

The libraries are the ``documents`` extra; each is imported when the first
file of its format arrives, so a folder of Markdown needs none of them.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from streamrag.changes import ChangeBatch, Op
from streamrag.errors import DecodeError
from streamrag.ingest.deadletter import DeadLetter
from streamrag.ingest.formats import ChangeColumns, check_change
from streamrag.sources.base import RawBatch
from streamrag.sources.folder import FileHeader, decode_record, describe
from streamrag.timing import format_timestamp

if TYPE_CHECKING:
    from streamrag.config import FolderSourceSettings

__all__ = ["DocumentDecoder", "extract", "file_format"]

Extracted = tuple[str, str | None]
"""The text of a file and its title (None where it has none)."""

_FORMATS = {
    ".md": "markdown",
    ".markdown": "markdown",
    ".txt": "text",
    ".html": "html",
    ".htm": "html",
    ".pdf": "pdf",
    ".docx": "docx",
    ".json": "json",
    ".jsonl": "jsonl",
}


def file_format(path: str) -> str:
    """The format a file's name says (``text`` for names it does not know).

    >>> file_format("notes/Plan.PDF"), file_format("a.rst")
    ('pdf', 'text')
    """
    dot = path.rfind(".")
    return _FORMATS.get(path[dot:].lower(), "text") if dot > path.rfind("/") else "text"


class DocumentDecoder:
    """Folder records into changes (see the module docstring); one outcome per record."""

    stage = "decode"

    def __init__(
        self,
        *,
        tenant: str = "default",
        domain: str | None = None,
        max_file_bytes: int = 50_000_000,
        max_document_bytes: int = 1_000_000,
    ) -> None:
        self.tenant = tenant
        self.domain = domain
        self.max_file_bytes = max_file_bytes
        self.max_document_bytes = max_document_bytes

    @classmethod
    def from_settings(
        cls, spec: FolderSourceSettings, *, default_tenant: str, max_document_bytes: int
    ) -> DocumentDecoder:
        """The decoder of a ``kind: folder`` source."""
        return cls(
            tenant=spec.tenant or default_tenant,
            domain=spec.domain,
            max_file_bytes=spec.max_file_bytes,
            max_document_bytes=max_document_bytes,
        )

    def decode(self, raws: Sequence[RawBatch]) -> tuple[ChangeBatch, list[DeadLetter]]:
        """Each record to a change or a dead letter; never raises."""
        cols = ChangeColumns()
        letters: list[DeadLetter] = []
        for raw in raws:
            times = raw.times or [None] * len(raw.lines)
            for line, offset, when in zip(raw.lines, raw.offsets, times, strict=True):
                header: FileHeader | None = None
                try:
                    header, body = decode_record(line)
                    if when is None:
                        msg = "the record carries no event time; it did not come from a folder"
                        raise DecodeError(msg)
                    op, payload = self._change(header, body)
                    doc_id, tenant, checked = check_change(
                        header.path, self.tenant, op, domain=self.domain, **payload
                    )
                except Exception as exc:  # any failure dead-letters the file, never the read
                    shown = (
                        describe(header)
                        if header is not None
                        else line[:200].decode("utf-8", "replace")
                    )
                    letters.append(DeadLetter(raw.source, offset, self.stage, _reason(exc), shown))
                    continue
                cols.add(tenant, doc_id, op, when, checked, raw.source, offset)
        return cols.batch(), letters

    def _change(self, header: FileHeader, body: bytes) -> tuple[Op, dict[str, Any]]:
        """The operation and the fields of the change a record makes."""
        _check_path(header.path)
        if header.op == "delete":
            return Op.DELETE, {}
        if header.op != "upsert":
            msg = f"unknown operation {header.op!r} in a folder record"
            raise DecodeError(msg)
        if header.error:
            msg_0 = f"{header.path}: {header.error}"
            raise DecodeError(msg_0)
        if header.size > self.max_file_bytes:
            msg = (
                f"{header.path}: the file is {header.size:,} bytes, above "
                f"max_file_bytes={self.max_file_bytes:,}"
            )
            raise DecodeError(msg)
        fmt = file_format(header.path)
        text, title = extract(fmt, body)
        if not text.strip():
            return Op.DELETE, {}  # nothing to index: the older version must go too
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.max_document_bytes:
            msg = (
                f"{header.path}: its text is {size:,} bytes, above ingest.max_document_bytes="
                f"{self.max_document_bytes:,}; split the document or raise the limit"
            )
            raise DecodeError(msg)
        metadata = {
            "path": header.path,
            "size": header.size,
            "mtime": format_timestamp(header.mtime_us),
            "format": fmt,
        }
        return Op.UPSERT, {"text": text, "title": title, "metadata": metadata}


def _check_path(path: str) -> None:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        msg = f"the file name {path!r} is not UTF-8; rename the file"
        raise DecodeError(msg) from None


def _reason(exc: Exception) -> str:
    if isinstance(exc, DecodeError):
        return str(exc)
    if isinstance(exc, RecursionError):
        return "the file is nested too deeply to read (RecursionError)"
    return f"the text could not be extracted: {type(exc).__name__}: {exc}"[:1000]


# -- extraction, one function per format ---------------------------------------------


def extract(fmt: str, data: bytes) -> Extracted:
    r"""The text and title of a file of format ``fmt`` (see :func:`file_format`).

    >>> extract("html", b"<title>T</title><h2>Part</h2><p>Body <b>bold</b></p><script>x()</script>")
    ('## Part\n\nBody bold', 'T')
    """
    return _EXTRACTORS.get(fmt, _text)(data)


def _decode_text(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    from bs4.dammit import UnicodeDammit

    guess = UnicodeDammit(data, is_html=False)
    if guess.unicode_markup is None:
        msg = "the file is not UTF-8 text, and its encoding could not be told"
        raise DecodeError(msg)
    return guess.unicode_markup


def _text(data: bytes) -> Extracted:
    return _decode_text(data), None


_MD_TITLE = re.compile(r"^#[ \t]+(.+?)[ \t#]*$", re.MULTILINE)


def _markdown(data: bytes) -> Extracted:
    text = _decode_text(data)
    found = _MD_TITLE.search(text)
    return text, found.group(1).strip() if found else None


def _json(data: bytes) -> Extracted:
    value = json.loads(_decode_text(data))
    return json.dumps(value, indent=2, ensure_ascii=False), None


def _jsonl(data: bytes) -> Extracted:
    parts = []
    for n, line in enumerate(_decode_text(data).splitlines(), start=1):
        if line.strip():
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                msg = f"line {n} is not JSON: {exc}"
                raise DecodeError(msg) from None
            parts.append(json.dumps(value, indent=2, ensure_ascii=False))
    return "\n\n".join(parts), None


_BLOCKS = [
    "p",
    "div",
    "section",
    "article",
    "main",
    "aside",
    "header",
    "footer",
    "nav",
    "li",
    "dt",
    "dd",
    "tr",
    "table",
    "ul",
    "ol",
    "dl",
    "pre",
    "blockquote",
    "figure",
    "figcaption",
    "form",
    "fieldset",
    "address",
    "details",
    "summary",
    "hr",
    "br",
]
_DROP = ("script", "style", "noscript", "template", "svg", "iframe", "object", "head", "title")


def _html(data: bytes) -> Extracted:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(data, "html.parser")
    title = soup.title.get_text(" ", strip=True) if soup.title else None
    for tag in soup(list(_DROP)):
        tag.decompose()
    for level in range(1, 7):
        for h in soup.find_all(f"h{level}"):
            heading = " ".join(h.get_text(" ", strip=True).split())
            h.replace_with(f"\n\n{'#' * level} {heading}\n\n" if heading else "\n")
    for tag in soup.find_all(_BLOCKS):
        if tag.name == "li":
            tag.insert_before("\n- ")
        else:
            tag.insert_before("\n")
        tag.insert_after("\n")
    return _tidy(soup.get_text()), title or None


def _tidy(text: str) -> str:
    """Spaces collapsed within lines, at most one blank line between blocks."""
    lines = [" ".join(line.split()) for line in text.splitlines()]
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip()


def _pdf(data: bytes) -> Extracted:
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted and not reader.decrypt(""):
        msg = "the PDF is encrypted with a password; store it decrypted"
        raise DecodeError(msg)
    pages = [(page.extract_text() or "").strip() for page in reader.pages]
    meta = reader.metadata
    title = meta.title if meta is not None and meta.title else None
    return "\n\n".join(p for p in pages if p), title


def _docx(data: bytes) -> Extracted:
    import docx
    from docx.table import Table

    document = docx.Document(io.BytesIO(data))
    parts: list[str] = []
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            for row in block.rows:
                cells = [c.text.strip() for c in row.cells]
                parts.append(" | ".join(c for c in cells if c))
            continue
        text = block.text.strip()
        if not text:
            continue
        style = (block.style.name if block.style is not None else "") or ""
        if style == "Title":
            parts.append(f"# {text}")
        elif style.startswith("Heading ") and style[8:].isdigit():
            parts.append(f"{'#' * min(6, int(style[8:]))} {text}")
        else:
            parts.append(text)
    title = document.core_properties.title or None
    return "\n\n".join(p for p in parts if p), title


_EXTRACTORS: dict[str, Callable[[bytes], Extracted]] = {
    "markdown": _markdown,
    "text": _text,
    "html": _html,
    "pdf": _pdf,
    "docx": _docx,
    "json": _json,
    "jsonl": _jsonl,
}
