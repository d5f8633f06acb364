"""Stage ⑤ of the data path: split documents, give chunks stable ids and content hashes.

Unchanged chunks of an updated document are recognised by their content hash
and keep their vectors (the pipeline asks the index for them before embedding).
Two splitters share the :class:`Splitter` interface: :class:`TokenSplitter`
(paragraphs, token windows) and :class:`StructuredSplitter` (Markdown sections,
code blocks, HTML, sentences; each chunk headed by its heading path).
"""

from streamrag.chunking.ids import chunk_id, chunk_id_text, content_hash
from streamrag.chunking.splitters import TokenSplitter, count_words
from streamrag.chunking.structured import Chunk, Splitter, StructuredSplitter

__all__ = [
    "Chunk",
    "Splitter",
    "StructuredSplitter",
    "TokenSplitter",
    "chunk_id",
    "chunk_id_text",
    "content_hash",
    "count_words",
]
