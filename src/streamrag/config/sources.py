"""Settings of the connectors: where changes come from, and how records become documents.

``sources:`` in the config file is a list; each entry has a ``kind`` and a
``name`` (unique: it prefixes the partitions the connector reports, and names
its entry in ``/v1/status``). Without ``sources:``, the job tails the JSONL
file or folder of ``source.path``, as before.

Secrets never go in the file: each connector names the *environment variable*
that holds them (``password_env``, ``client_env``), and they are left out of
logs and status.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from streamrag.config.base import Frozen

__all__ = [
    "FolderSourceSettings",
    "JsonlSourceSettings",
    "KafkaSourceSettings",
    "NatsSourceSettings",
    "PostgresSourceSettings",
    "RecordFormat",
    "RedisSourceSettings",
    "RowMapping",
    "SourceSpec",
]

RecordFormat = Literal["change", "row", "debezium"]
"""How a message's bytes become a change.

* ``change`` — streamrag's own JSON change (``doc_id``, ``event_time``, ``text``...);
* ``row`` — any JSON object, turned into a document by ``mapping`` (always an upsert);
* ``debezium`` — a Debezium change event (``before``/``after``/``op``/``source.ts_ms``,
  with or without the ``schema``/``payload`` wrapper; a ``null`` value is a tombstone),
  whose row goes through ``mapping``.
"""


class RowMapping(Frozen):
    """How a row (a table row, a JSON object, a Debezium ``after``) becomes a document."""

    id: list[str] = Field(
        default_factory=lambda: ["id"],
        min_length=1,
        description="Column(s) whose values, joined by ':', are the document id.",
    )
    id_prefix: str | None = Field(
        None,
        description="Put before the id, so two tables' ids cannot meet "
        "(default: the table name and '/', for tables; nothing for messages).",
    )
    text: list[str] = Field(
        default_factory=lambda: ["text"],
        description="Columns whose values, joined by blank lines, are the text.",
    )
    template: str | None = Field(
        None,
        description="Instead of text: a template over the columns, such as "
        "'{subject}\\n\\n{body}' (Python str.format names).",
    )
    title: str | None = Field(None, description="Column that holds the title.")
    metadata: list[str] = Field(
        default_factory=list, description="Columns copied into the document's metadata."
    )
    tenant: str | None = Field(
        None, description="Column that holds the tenant (else ingest.default_tenant)."
    )
    domain: str | None = Field(None, description="Column that holds the domain.")
    event_time: str | None = Field(
        None,
        description="Column that holds the event time (ISO-8601 or epoch seconds); "
        "default: the time the system stamped (commit time, message timestamp).",
    )


class _Connector(Frozen):
    name: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Unique name: prefixes the connector's partitions, names it in status.",
    )


class JsonlSourceSettings(_Connector):
    """A JSONL file, or a folder of JSONL files, tailed (one change per line)."""

    kind: Literal["jsonl"]
    path: Path = Field(description="A JSONL file, or a directory of JSONL files.")
    glob: str = Field("*.jsonl", description="Which files of a directory to read.")


class FolderSourceSettings(_Connector):
    """A folder of documents: each file is one document, kept in step with the folder."""

    kind: Literal["folder"]
    path: Path = Field(description="The folder to index (read recursively).")
    include: list[str] = Field(
        default_factory=lambda: [
            "*.md",
            "*.txt",
            "*.html",
            "*.htm",
            "*.pdf",
            "*.docx",
            "*.json",
            "*.jsonl",
        ],
        description="File-name patterns to index.",
    )
    exclude: list[str] = Field(
        default_factory=lambda: [".*", "*~", "*.tmp", "*.swp"],
        description="File-name patterns to skip (hidden and temporary files by default).",
    )
    settle_ms: int = Field(
        500,
        ge=0,
        description="A file is read once it has not changed for this long, so a file "
        "being written is never indexed half-way.",
    )
    max_file_bytes: int = Field(
        50_000_000, gt=0, description="Larger files are dead-lettered, not read."
    )
    tenant: str | None = Field(None, description="Tenant of the folder's documents.")
    domain: str | None = Field(None, description="Domain of the folder's documents.")


class PostgresSourceSettings(_Connector):
    """Tables of a PostgreSQL database: a consistent snapshot, then logical replication."""

    kind: Literal["postgres"]
    dsn: str = Field(
        "host=127.0.0.1 port=5432 dbname=postgres",
        description="libpq connection string, without the password (see password_env).",
    )
    password_env: str | None = Field(
        None,
        description="Environment variable that holds the password (libpq's PGPASSWORD works too).",
    )
    tables: list[str] = Field(min_length=1, description="Tables to follow, as schema.table.")
    slot: str = Field("streamrag", description="Replication slot (created if missing).")
    publication: str = Field(
        "streamrag", description="Publication of the tables (created if missing)."
    )
    mapping: RowMapping = Field(
        default_factory=RowMapping, description="How a row becomes a document."
    )
    table_mappings: dict[str, RowMapping] = Field(
        default_factory=dict, description="Per table (schema.table), instead of mapping."
    )
    status_interval_s: float = Field(
        10.0, gt=0, description="How often the server hears the confirmed position."
    )


class KafkaSourceSettings(_Connector):
    """Kafka topics, read in a consumer group."""

    kind: Literal["kafka"]
    brokers: str = Field("127.0.0.1:9092", description="bootstrap.servers.")
    topics: list[str] = Field(min_length=1, description="Topics to read.")
    group_id: str = Field("streamrag", description="Consumer group.")
    format: RecordFormat = Field("change", description="What a record's value holds.")
    mapping: RowMapping = Field(
        default_factory=RowMapping, description="For format row or debezium."
    )
    client: dict[str, str] = Field(
        default_factory=dict, description="More librdkafka settings (no secrets)."
    )
    client_env: dict[str, str] = Field(
        default_factory=dict,
        description="librdkafka settings taken from environment variables, such as "
        "{'sasl.password': 'KAFKA_PASSWORD'}.",
    )


class NatsSourceSettings(_Connector):
    """A NATS JetStream stream, read by a durable pull consumer."""

    kind: Literal["nats"]
    servers: list[str] = Field(
        default_factory=lambda: ["nats://127.0.0.1:4222"], description="NATS server URLs."
    )
    stream: str = Field(description="JetStream stream to read.")
    subject: str | None = Field(None, description="Only this subject (filter) of the stream.")
    durable: str = Field("streamrag", description="Durable consumer name.")
    format: RecordFormat = Field("change", description="What a message holds.")
    mapping: RowMapping = Field(
        default_factory=RowMapping, description="For format row or debezium."
    )
    user_env: str | None = Field(None, description="Environment variable with the user.")
    password_env: str | None = Field(None, description="Environment variable with the password.")
    token_env: str | None = Field(None, description="Environment variable with a token.")


class RedisSourceSettings(_Connector):
    """Redis Streams, read in a consumer group."""

    kind: Literal["redis"]
    url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL, without the password.")
    password_env: str | None = Field(None, description="Environment variable with the password.")
    streams: list[str] = Field(min_length=1, description="Stream keys to read.")
    group: str = Field("streamrag", description="Consumer group (created if missing).")
    consumer: str = Field("streamrag", description="This job's consumer name in the group.")
    field: str = Field("data", description="Entry field that holds the record.")
    key_field: str | None = Field(
        "key", description="Entry field that holds the record's key (Debezium Server writes one)."
    )
    claim_idle_ms: int = Field(
        30_000,
        gt=0,
        description="Entries pending this long at another consumer of the group are claimed.",
    )
    format: RecordFormat = Field("change", description="What an entry holds.")
    mapping: RowMapping = Field(
        default_factory=RowMapping, description="For format row or debezium."
    )


SourceSpec = Annotated[
    JsonlSourceSettings
    | FolderSourceSettings
    | PostgresSourceSettings
    | KafkaSourceSettings
    | NatsSourceSettings
    | RedisSourceSettings,
    Field(discriminator="kind"),
]
"""One entry of ``sources:``."""
