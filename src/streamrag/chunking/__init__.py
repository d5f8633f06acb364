"""Stage ⑤ of the data path: split documents, give chunks stable ids and content hashes.

Unchanged chunks of an updated document are recognised by their content hash
and keep their vectors (the pipeline asks the index for them before embedding).
"""

from streamrag.chunking.ids import chunk_id, chunk_id_text, content_hash
from streamrag.chunking.splitters import TokenSplitter, count_words

__all__ = ["TokenSplitter", "chunk_id", "chunk_id_text", "content_hash", "count_words"]
