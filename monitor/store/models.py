"""The schema as SQLAlchemy 2.0 typed ORM models; migrations/ is what creates and changes it.

Tables:

* ``requests``: one row per :class:`decoder.record.RequestRecord`, every field, ``request_id`` unique.
  On PostgreSQL it is partitioned by ``RANGE (ts_start)`` (migration 0014, :mod:`monitor.store.partitions`):
  there its primary key is ``(id, ts_start)`` and the unique key ``(request_id, ts_start)``, since a
  partitioned table's unique keys must hold the partition key. The ORM maps ``id`` alone as the
  identity (ids come from one sequence, so they stay unique), and the unique keys are declared per
  dialect (``ddl_if``; :func:`declared_for` says which the comparison with a database holds to).
* ``model_versions`` and ``deployment_events``: the first time a (role, model, version) is seen is
  an event with a timestamp, so the monitor can annotate charts and reset baselines.
* ``rollup_minute`` and ``rollup_bins``: per-minute counts and sums per workload, pair and mode,
  plus fixed-bucket histograms (latency per output token, TTFT), per-position acceptance counts and
  acceptance by prompt-length bucket and output span (:mod:`monitor.store.lengths`), all additive
  so that any range aggregates by summing. On PostgreSQL both are partitioned by ``RANGE (bucket)``
  (migration 0016), with the primary key ``(id, bucket)``; the rollup key holds ``bucket`` already.
* ``recorder_batches``: one row per committed recorder batch; it makes spool replay exactly-once.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.schema import SchemaItem
from sqlalchemy.types import TypeDecorator

# Alembic autogenerate and the constraint names in migrations follow this convention.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# BIGINT ids on PostgreSQL; SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
BigId = BigInteger().with_variant(Integer(), "sqlite")
# Plain JSON (text) also on PostgreSQL: the arrays are only read back whole, never queried inside,
# and JSONB's conversion cost showed up in ingest throughput.
JsonList = JSON()
# A missing list is SQL NULL, as the bulk writer stores it, not the JSON text 'null'.
OptionalJsonList = JSON(none_as_null=True)


class UTCDateTime(TypeDecorator[datetime]):
    """Timestamps stored in UTC and read back timezone-aware on both dialects.

    SQLite has no timezone type, so values are normalised to naive UTC on the way in (which also
    keeps its text comparisons in time order) and get ``tzinfo=UTC`` on the way out.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime, str: Text}


# The rows of ix_requests_baseline_*: requests decoded without speculation, the speed comparisons' baseline.
BASELINE_MODES = "mode <> 'speculative'"


def declared_for(item: SchemaItem, dialect_name: str) -> bool:
    """Whether the model declares ``item`` (an index, a constraint) on ``dialect_name``, not for another (``ddl_if``).

    Alembic's comparison of the models with a database (autogenerate, the migration tests) passes
    its objects through this, so that each dialect's unique key of ``requests`` is compared only there.
    """
    condition = getattr(item, "_ddl_if", None)
    return condition is None or condition.dialect in (None, dialect_name)


class RequestRow(Base):
    """One finished request: the record's fields, nothing derived."""

    __tablename__ = "requests"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(128))
    ts_start: Mapped[datetime]
    ts_end: Mapped[datetime]
    workload: Mapped[str] = mapped_column(String(64))
    target_model: Mapped[str]
    drafter: Mapped[str]
    draft_model: Mapped[str | None]
    target_version: Mapped[str | None]
    draft_version: Mapped[str | None]
    mode: Mapped[str] = mapped_column(String(16))
    num_speculative_tokens: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    num_spec_steps: Mapped[int] = mapped_column(BigInteger)
    num_draft_tokens: Mapped[int] = mapped_column(BigInteger)
    num_accepted_tokens: Mapped[int] = mapped_column(BigInteger)
    accepted_per_position: Mapped[list[int]] = mapped_column(JsonList)
    acceptance_histogram: Mapped[list[int]] = mapped_column(JsonList)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    draft_ms: Mapped[float | None] = mapped_column(Float)
    verify_ms: Mapped[float | None] = mapped_column(Float)
    temperature: Mapped[float] = mapped_column(Float)
    top_p: Mapped[float] = mapped_column(Float)
    finish_reason: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None]
    source: Mapped[str]
    prompt_hash: Mapped[str | None]
    stopped_mid_step: Mapped[bool] = mapped_column(Boolean)
    holdout_reason: Mapped[str | None] = mapped_column(String(16))
    # NULL where the source does not know output positions (serving stacks), and before migration 0007.
    drafted_by_span: Mapped[list[int] | None] = mapped_column(OptionalJsonList)
    accepted_by_span: Mapped[list[int] | None] = mapped_column(OptionalJsonList)
    # NULL where not measured apart from queueing, and before migration 0010.
    decode_ms: Mapped[float | None] = mapped_column(Float)
    upstream_inflight: Mapped[int | None] = mapped_column(Integer)
    # False before migration 0012, when no record said so.
    mode_inferred: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # What a cause of a drop needs (decoder/causes.py): NULL where the path or the engine does not give it,
    # and before migration 0017.
    replica: Mapped[str | None]
    cached_prompt_tokens: Mapped[int | None] = mapped_column(BigInteger)
    style_hash: Mapped[str | None] = mapped_column(String(12))
    prompt_copy_share: Mapped[float | None] = mapped_column(Float)
    engine_version: Mapped[str | None]
    replica_uptime_s: Mapped[float | None] = mapped_column(Float)
    uptime_from: Mapped[str | None] = mapped_column(String(16))
    kv_cache_use: Mapped[float | None] = mapped_column(Float)
    ingested_at: Mapped[datetime]

    __table_args__ = (
        # A record is stored once: by request id on SQLite, by request id and start on partitioned PostgreSQL
        # (migration 0014; a PostgreSQL table still to convert with `draftwatch db partition` has the former).
        UniqueConstraint("request_id").ddl_if(dialect="sqlite"),
        UniqueConstraint("request_id", "ts_start").ddl_if(dialect="postgresql"),
        # Covering on PostgreSQL (migration 0002): drift sampling reads ids per workload and window from the index.
        Index("ix_requests_workload_ts", "workload", "ts_start", postgresql_include=["id"]),
        Index("ix_requests_pair_ts", "target_model", "drafter", "draft_model", "ts_start"),
        # BRIN on PostgreSQL: time-only scans (retention) at almost no cost per insert.
        Index("ix_requests_ts", "ts_start", postgresql_using="brin"),
        # Baseline traffic only (holdout and plain, a few per cent of rows; migration 0008): the dashboard's cost
        # ratios per workload and the drift run's net-loss fallback per target read it without walking speculation.
        Index(
            "ix_requests_baseline_workload_ts",
            "workload",
            "ts_start",
            postgresql_where=text(BASELINE_MODES),
            sqlite_where=text(BASELINE_MODES),
        ),
        Index(
            "ix_requests_baseline_target_ts",
            "target_model",
            "ts_start",
            postgresql_include=["id", "mode"],
            postgresql_where=text(BASELINE_MODES),
            sqlite_where=text(BASELINE_MODES),
        ),
    )


class ModelVersionRow(Base):
    """A (role, model, version) the monitor has seen, with when it was first seen."""

    __tablename__ = "model_versions"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    role: Mapped[str] = mapped_column(String(16))  # "target" or "draft"
    model: Mapped[str]
    version: Mapped[str]
    first_seen: Mapped[datetime]

    __table_args__ = (UniqueConstraint("role", "model", "version"),)


class DeploymentEventRow(Base):
    """A version of a target or draft model appeared: ``first_seen`` for a new model, else ``version_changed``."""

    __tablename__ = "deployment_events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    ts: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(32))
    role: Mapped[str] = mapped_column(String(16))
    model: Mapped[str]
    version: Mapped[str]
    model_version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id", ondelete="CASCADE"))
    workload: Mapped[str | None] = mapped_column(String(64))
    note: Mapped[str | None]

    __table_args__ = (Index("ix_deployment_events_ts", "ts"),)


# The rollup key: minute bucket, workload, pair (target, drafter, draft model) and mode. draft_model
# is '' rather than NULL here because NULLs never collide in a unique constraint.
ROLLUP_KEY = ("bucket", "workload", "target_model", "drafter", "draft_model", "mode")


class RollupMinuteRow(Base):
    """Additive per-minute figures for one workload, pair and mode."""

    __tablename__ = "rollup_minute"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    bucket: Mapped[datetime]
    workload: Mapped[str] = mapped_column(String(64))
    target_model: Mapped[str]
    drafter: Mapped[str]
    draft_model: Mapped[str]
    mode: Mapped[str] = mapped_column(String(16))
    n_requests: Mapped[int] = mapped_column(BigInteger)
    n_errors: Mapped[int] = mapped_column(BigInteger)
    sum_prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    sum_output_tokens: Mapped[int] = mapped_column(BigInteger)
    sum_spec_steps: Mapped[int] = mapped_column(BigInteger)
    sum_draft_tokens: Mapped[int] = mapped_column(BigInteger)
    sum_accepted_tokens: Mapped[int] = mapped_column(BigInteger)
    # request-weighted acceptance: sum of per-request rates over requests that drafted anything
    n_drafting: Mapped[int] = mapped_column(BigInteger)
    sum_acceptance_rate: Mapped[float] = mapped_column(Float)
    # decode-phase ms per token (RequestRecord.decode_ms_per_token), over requests that have one
    n_timed: Mapped[int] = mapped_column(BigInteger)
    sum_ms_per_token: Mapped[float] = mapped_column(Float)
    # whole-request throughput, over requests with a latency and at least one output token
    sum_timed_latency_ms: Mapped[float] = mapped_column(Float)
    sum_timed_output_tokens: Mapped[int] = mapped_column(BigInteger)
    n_ttft: Mapped[int] = mapped_column(BigInteger)
    sum_ttft_ms: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        # Named by hand: the conventional name would pass PostgreSQL's 63-character limit.
        UniqueConstraint(*ROLLUP_KEY, name="uq_rollup_minute_key"),
        Index("ix_rollup_minute_workload_bucket", "workload", "bucket"),
    )


class RollupBinRow(Base):
    """Histogram counts per minute key: ``metric`` is one of :data:`monitor.store.bins.METRICS`."""

    __tablename__ = "rollup_bins"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    bucket: Mapped[datetime]
    workload: Mapped[str] = mapped_column(String(64))
    target_model: Mapped[str]
    drafter: Mapped[str]
    draft_model: Mapped[str]
    mode: Mapped[str] = mapped_column(String(16))
    metric: Mapped[str] = mapped_column(String(32))
    bin: Mapped[int] = mapped_column(Integer)
    count: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        UniqueConstraint(*ROLLUP_KEY, "metric", "bin", name="uq_rollup_bins_key"),
        Index("ix_rollup_bins_workload_metric_bucket", "workload", "metric", "bucket"),
    )


class RecorderBatchRow(Base):
    """A batch the recorder committed; its id is written in the same transaction as its records."""

    __tablename__ = "recorder_batches"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    batch_id: Mapped[str] = mapped_column(String(64), unique=True)
    origin: Mapped[str] = mapped_column(String(16))  # "live", "spool" or "sync"
    n_records: Mapped[int] = mapped_column(Integer)
    committed_at: Mapped[datetime]
    host: Mapped[str | None]
    pid: Mapped[int | None] = mapped_column(Integer)
