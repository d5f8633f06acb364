"""Stage ① of the data path: where changes come from.

Sources read raw records and report a resume position (:mod:`.base`). The JSONL
file/directory tailer lives in :mod:`.files`; :mod:`.multi` reads several as one
(the configured input and the dead-letter replay folder).
"""

from streamrag.sources.base import RawBatch, Source, SourceReader
from streamrag.sources.files import JsonlSource, JsonlSourceReader
from streamrag.sources.multi import MultiSource, MultiSourceReader

__all__ = [
    "JsonlSource",
    "JsonlSourceReader",
    "MultiSource",
    "MultiSourceReader",
    "RawBatch",
    "Source",
    "SourceReader",
]
