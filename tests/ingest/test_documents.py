"""The document decoder over real files of every format, made here by the libraries that write them.

A PDF is written with fpdf2, a DOCX with python-docx; HTML, Markdown, text and
JSON by hand. Each goes through the folder reader's record format and the
decoder, and comes out as one change — or one dead letter, with its path and
position, for a file that cannot be used.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from streamrag.changes import Op
from streamrag.config import FolderSourceSettings, Settings
from streamrag.ingest.documents import DocumentDecoder, extract, file_format
from streamrag.runtime.build import build_decoders
from streamrag.sources.base import RawBatch
from streamrag.sources.folder import FileHeader, encode_record

pytestmark = pytest.mark.timeout(60)

T0 = 1_714_564_800_000_000  # 2024-05-01T12:00:00Z


def _pdf(*pages: str, title: str | None = None) -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    if title:
        pdf.set_title(title)
    pdf.set_font("helvetica", size=12)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 10, text)
    return bytes(pdf.output())


def _docx() -> bytes:
    import docx

    document = docx.Document()
    document.core_properties.title = "Runbook"
    document.add_heading("Restarting the queue", level=1)
    document.add_paragraph("Drain the consumers first.")
    document.add_heading("Checks", level=2)
    table = document.add_table(rows=2, cols=2)
    table.cell(0, 0).text = "metric"
    table.cell(0, 1).text = "limit"
    table.cell(1, 0).text = "lag"
    table.cell(1, 1).text = "5s"
    document.add_paragraph("Then restart the brokers.")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _record(path: str, body: bytes, *, op: str = "upsert", error: str | None = None) -> bytes:
    header = FileHeader(path=path, op=op, size=len(body), mtime_us=T0, error=error)
    return encode_record(header, body)


def _batch(records: list[tuple[str, bytes]], offset: int = 300) -> list[RawBatch]:
    """One batch per file, as the folder reader makes them."""
    return [
        RawBatch(
            f"folder:docs:{path}",
            [line],
            [offset + 3 * i],
            offset + 3 * i + 1,
            decoder="docs",
            keys=[path.encode()],
            times=[T0 + i],
        )
        for i, (path, line) in enumerate(records)
    ]


def _decoder(**kw: object) -> DocumentDecoder:
    return DocumentDecoder(tenant="acme", domain="handbook", **kw)  # type: ignore[arg-type]


HTML = b"""<!doctype html><html><head><title>Deploy guide</title>
<style>body { color: red }</style><script>track("secret-tracker")</script></head>
<body><nav>Home</nav><h1>Deploying</h1><p>Run the <b>build</b> first.</p>
<h2>Rollback</h2><ul><li>stop traffic</li><li>revert</li></ul></body></html>"""


def test_every_format_becomes_its_text_with_path_metadata_and_title() -> None:
    files = {
        "guide/deploy.html": HTML,
        "notes.md": b"# Weekly notes\n\nShip the **folder** source.\n",
        "plain.txt": "caf\u00e9 menu".encode(),
        "report.pdf": _pdf("Quarterly revenue grew.", "Second page: outlook.", title="Q3"),
        "runbook.docx": _docx(),
        "config.json": b'{"name": "svc", "replicas": 3}',
        "events.jsonl": b'{"id": 1}\n\n{"id": 2}\n',
    }
    changes, letters = _decoder().decode(_batch([(p, _record(p, b)) for p, b in files.items()]))
    assert letters == []
    assert changes.doc_ids == list(files)
    assert set(changes.tenants) == {"acme"}
    assert list(changes.ops) == [Op.UPSERT] * len(files)
    assert list(changes.event_times) == [T0 + i for i in range(len(files))]
    assert list(changes.offsets) == [300 + 3 * i for i in range(len(files))]
    got = dict(zip(changes.doc_ids, changes.payloads, strict=True))

    html = got["guide/deploy.html"]
    assert html["title"] == "Deploy guide"
    assert "# Deploying" in html["text"]
    assert "## Rollback" in html["text"]
    assert "Run the build first." in html["text"]
    assert "- stop traffic" in html["text"]
    assert "secret-tracker" not in html["text"]
    assert "color" not in html["text"]
    assert html["domain"] == "handbook"
    assert html["metadata"] == {
        "path": "guide/deploy.html",
        "size": len(HTML),
        "mtime": "2024-05-01T12:00:00Z",
        "format": "html",
    }
    assert got["notes.md"]["title"] == "Weekly notes"
    assert got["notes.md"]["text"].startswith("# Weekly notes")
    assert got["plain.txt"]["text"] == "caf\u00e9 menu"
    pdf = got["report.pdf"]
    assert "Quarterly revenue grew." in pdf["text"]
    assert "Second page: outlook." in pdf["text"]
    assert pdf["title"] == "Q3"
    assert pdf["metadata"]["format"] == "pdf"
    docx_text = got["runbook.docx"]["text"]
    assert got["runbook.docx"]["title"] == "Runbook"
    assert "# Restarting the queue" in docx_text
    assert "## Checks" in docx_text
    assert "lag | 5s" in docx_text
    assert docx_text.index("Drain") < docx_text.index("lag | 5s") < docx_text.index("Then restart")
    assert json.loads(got["config.json"]["text"]) == {"name": "svc", "replicas": 3}
    assert '\n  "replicas": 3' in got["config.json"]["text"], "pretty-printed"
    assert got["events.jsonl"]["text"] == '{\n  "id": 1\n}\n\n{\n  "id": 2\n}'


def test_a_corrupt_pdf_is_dead_lettered_with_its_path_and_position() -> None:
    good = _pdf("fine")
    records = [
        ("ok.md", _record("ok.md", b"fine")),
        ("broken.pdf", _record("broken.pdf", good[: len(good) // 3])),
        ("notjson.json", _record("notjson.json", b"{nope")),
        ("bad.jsonl", _record("bad.jsonl", b'{"a": 1}\n{oops\n')),
        ("after.txt", _record("after.txt", b"still read")),
    ]
    changes, letters = _decoder().decode(_batch(records))
    assert changes.doc_ids == ["ok.md", "after.txt"], "the records around a bad one are decoded"
    assert [(d.source, d.offset) for d in letters] == [
        ("folder:docs:broken.pdf", 303),
        ("folder:docs:notjson.json", 306),
        ("folder:docs:bad.jsonl", 309),
    ]
    assert all(d.stage == "decode" for d in letters)
    assert "broken.pdf" in letters[0].raw
    assert "could not be extracted" in letters[0].reason
    assert "line 2 is not JSON" in letters[2].reason


def test_removed_and_empty_files_are_deletes_refused_reads_are_dead_letters() -> None:
    records = [
        ("gone.md", _record("gone.md", b"", op="delete")),
        ("empty.txt", _record("empty.txt", b"  \n\n ")),
        ("scanned.pdf", _record("scanned.pdf", _pdf(""))),
        ("locked.txt", _record("locked.txt", b"", error="the file could not be read: denied")),
        ("what.md", _record("what.md", b"x", op="truncate")),
    ]
    changes, letters = _decoder().decode(_batch(records))
    assert changes.doc_ids == ["gone.md", "empty.txt", "scanned.pdf"]
    assert list(changes.ops) == [Op.DELETE] * 3, "no text: the older version must not stay"
    assert [d.source.rsplit(":", 1)[1] for d in letters] == ["locked.txt", "what.md"]
    assert "could not be read: denied" in letters[0].reason
    assert "unknown operation" in letters[1].reason


def test_size_limits_refuse_with_the_sizes_named() -> None:
    big_text = b"word " * 400
    records = [
        ("big.txt", _record("big.txt", big_text)),
        ("huge.pdf", encode_record(FileHeader(path="huge.pdf", size=10_000, mtime_us=T0))),
    ]
    changes, letters = _decoder(max_document_bytes=1000, max_file_bytes=5000).decode(
        _batch(records)
    )
    assert len(changes) == 0
    assert "above ingest.max_document_bytes=1,000" in letters[0].reason
    assert "10,000 bytes, above max_file_bytes=5,000" in letters[1].reason


def test_records_that_are_not_folder_records_are_refused_never_raised() -> None:
    raws = [
        RawBatch("folder:docs:x", [b"not a header\nbody"], [3], 4, decoder="docs", times=[T0]),
        RawBatch("folder:docs:y", [_record("y.md", b"text")], [6], 7, decoder="docs"),
        RawBatch(
            "folder:docs:z",
            [_record("caf\udce9.md", b"text")],
            [9],
            10,
            decoder="docs",
            times=[T0],
        ),
    ]
    changes, letters = _decoder().decode(raws)
    assert len(changes) == 0
    assert len(letters) == 3
    assert "no event time" in letters[1].reason
    assert "not UTF-8" in letters[2].reason


def test_text_in_another_encoding_is_read() -> None:
    latin = "Pr\u00e9sentation de l'\u00e9quipe: caf\u00e9, cr\u00e8me, na\u00efve".encode("cp1252")
    text, _ = extract("text", latin)
    assert "café" in text
    assert "équipe" in text


def test_formats_come_from_the_name() -> None:
    assert file_format("a/B.HTM") == "html"
    assert file_format("x.markdown") == "markdown"
    assert file_format("dir.v2/README") == "text"
    assert file_format("notes.rst") == "text"


def test_the_job_builds_this_decoder_for_a_folder_source(tmp_path: Path) -> None:
    settings = Settings(
        state_dir=tmp_path,
        sources=[
            FolderSourceSettings(kind="folder", name="docs", path=tmp_path, tenant="t1", domain="d")
        ],
        ingest={"max_document_bytes": 1234, "default_tenant": "fallback"},
    )
    decoders = build_decoders(settings)
    decoder = decoders.named["docs"]
    assert isinstance(decoder, DocumentDecoder)
    assert (decoder.tenant, decoder.domain, decoder.max_document_bytes) == ("t1", "d", 1234)
    changes, letters = decoders.decode(_batch([("a.md", _record("a.md", b"hello"))]))
    assert (changes.doc_ids, changes.tenants, letters) == (["a.md"], ["t1"], [])
