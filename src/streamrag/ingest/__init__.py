"""Stage ② of the data path: decode, validate and normalize; dead-letter the rest."""

from streamrag.ingest.deadletter import DeadLetter, DeadLetterStore
from streamrag.ingest.decode import Decoder
from streamrag.ingest.normalize import normalize_text

__all__ = ["DeadLetter", "DeadLetterStore", "Decoder", "normalize_text"]
