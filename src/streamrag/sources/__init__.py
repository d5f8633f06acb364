"""Stage ① of the data path: where changes come from.

Sources read raw records and report a resume position (:mod:`.base`). The JSONL
file/directory tailer lives in :mod:`.files`.
"""

from streamrag.sources.base import RawBatch, Source, SourceReader
from streamrag.sources.files import JsonlSource, JsonlSourceReader

__all__ = ["JsonlSource", "JsonlSourceReader", "RawBatch", "Source", "SourceReader"]
