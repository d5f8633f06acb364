"""The semantic partition key: which changes belong in the same micro-batch.

A micro-batch that holds one tenant's documents of one domain from one day is
*topically local*: its chunks land near each other in event time, embed with
similar lengths, and a later query that filters on tenant, domain or a time
range touches fewer segments. The default key is ``(tenant, domain, date)``
where ``date`` is the change's event time cut into ``bucket_us`` buckets (one
UTC day by default).

Key fields are ``tenant``, ``domain``, ``doc_id``, ``source``, ``op``, ``date``
or ``metadata.NAME``.

>>> from streamrag.changes import Change, ChangeBatch, Op
>>> key = PartitionKey(("tenant", "date"), bucket_us=10)
>>> batch = ChangeBatch.from_changes([Change("t", "d", Op.DELETE, 25)])
>>> key.keys(batch)
[('t', 20)]
>>> key.bucket_end(('t', 20))
30
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from streamrag.changes import ChangeBatch
from streamrag.errors import ConfigError
from streamrag.eventtime.stage import field_column
from streamrag.timing import US_PER_S, Duration, Timestamp

__all__ = ["DAY_US", "PartitionKey"]

DAY_US: Duration = 86_400 * US_PER_S


@dataclass(frozen=True, slots=True)
class PartitionKey:
    """Builds each change's partition key from named fields."""

    fields: tuple[str, ...] = ("tenant", "domain", "date")
    bucket_us: Duration = DAY_US

    def __post_init__(self) -> None:
        if not self.fields:
            msg = "a partition key needs at least one field, e.g. ['tenant']"
            raise ConfigError(msg)
        if self.bucket_us <= 0:
            msg = f"the date bucket must be positive, found {self.bucket_us} µs"
            raise ConfigError(msg)

    def keys(self, changes: ChangeBatch) -> list[Hashable]:
        """The partition key of every change, as a tuple of the fields' values."""
        columns: list[Sequence[Hashable]] = []
        for name in self.fields:
            if name == "date":
                times = changes.event_times
                columns.append((times - times % self.bucket_us).tolist())
            else:
                columns.append(field_column(changes, name))
        return list(zip(*columns, strict=True))

    def bucket_end(self, key: Hashable) -> Timestamp | None:
        """End of the key's date bucket, or None when ``date`` is not part of the key."""
        if "date" not in self.fields or not isinstance(key, tuple):
            return None
        start = key[self.fields.index("date")]
        return int(start) + self.bucket_us
