"""ClickHouse tables, declared once.

Each table is described by its columns; the DDL that migrations and test fixtures run and the
types the insert path needs both come from that one description, so tests build exactly the
production schema. ``TABLES`` is the registry (tests truncate every table in it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    codec: str = ""
    default: str = ""

    def ddl(self) -> str:
        parts = [f"`{self.name}`", self.type]
        if self.default:
            parts.append(f"DEFAULT {self.default}")
        if self.codec:
            parts.append(f"CODEC({self.codec})")
        return " ".join(parts)


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    engine: str  # MergeTree family name and arguments, e.g. "ReplacingMergeTree(ingested_at)"
    order_by: str
    partition_by: str = ""
    ttl: str = ""  # may use {retention_days}
    indexes: tuple[str, ...] = ()
    settings: str = "index_granularity = 8192"
    # Insert columns added after rows could already wait in a spool segment, with the value such an
    # older row gets on replay (``rows_completed``).
    added_columns: tuple[tuple[str, object], ...] = ()
    # On a cluster (``TRACEDASH_CLICKHOUSE_CLUSTER``): the sharding key of the ``Distributed`` table
    # that takes this table's name over its ``<name>_local`` replicated tables. Always a hash of row
    # content, never rand(): a re-sent batch (same insert_deduplication_token) must split into the
    # same per-shard blocks to be recognised as a duplicate on each shard.
    shard_key: str = ""

    def rows_completed(self, rows: list) -> list:
        """Rows written before ``added_columns`` existed, given those columns' values for old rows."""
        for name, value in self.added_columns:
            if rows and name not in rows[0]:
                rows = [{**row, name: value} if name not in row else row for row in rows]
        return rows

    @property
    def insert_columns(self) -> tuple[Column, ...]:
        """Columns a writer supplies (those with a DEFAULT are filled by ClickHouse)."""
        return tuple(c for c in self.columns if not c.default)

    def column_types(self) -> dict[str, str]:
        return {c.name: c.type for c in self.columns}

    def local_name(self, cluster: str | None) -> str:
        """Where the rows are stored: ``<name>_local`` on a cluster (``name`` is then the Distributed
        table over it), the table itself otherwise."""
        return local_name(self.name, cluster)

    def create_sql(self, *, retention_days: int, cluster: str | None = None) -> str:
        """The table that stores the rows: the table itself, or on a cluster its ``<name>_local``
        Replicated… table (ON CLUSTER, one replication group per shard: macros {shard}/{replica})."""
        name = self.local_name(cluster)
        body = [c.ddl() for c in self.columns] + [f"INDEX {index}" for index in self.indexes]
        on_cluster = f" ON CLUSTER `{cluster}`" if cluster else ""
        lines = [
            f"CREATE TABLE IF NOT EXISTS {name}{on_cluster}",
            "(",
            "    " + ",\n    ".join(body),
            ")",
            f"ENGINE = {replicated_engine(self.engine, name) if cluster else self.engine}",
        ]
        if self.partition_by:
            lines.append(f"PARTITION BY {self.partition_by}")
        lines.append(f"ORDER BY {self.order_by}")
        if self.ttl:
            lines.append("TTL " + self.ttl.format(retention_days=int(retention_days)))
        settings = ", ".join(part for part in (self.settings, CLEANUP_SETTINGS) if part)
        if cluster and settings:
            # Replicated tables keep their insert hashes in Keeper (replicated_deduplication_window);
            # non_replicated_deduplication_window does not apply to them.
            settings = settings.replace(DEDUP_WINDOW, REPLICATED_DEDUP_WINDOW)
        if settings:
            lines.append(f"SETTINGS {settings}")
        return "\n".join(lines)

    def distributed_sql(self, *, cluster: str, database: str) -> str:
        """The Distributed table under the canonical name, over every shard's ``<name>_local``: the
        app reads and inserts through it unchanged, and a read sees every shard."""
        if not self.shard_key:
            raise ValueError(f"table {self.name} has no shard_key: it cannot be distributed")
        local = self.local_name(cluster)
        return (f"CREATE TABLE IF NOT EXISTS {self.name} ON CLUSTER `{cluster}` AS {local}\n"
                f"ENGINE = Distributed({_literal(cluster)}, {_literal(database)}, {local}, {self.shard_key})")

    def create_statements(self, *, retention_days: int, cluster: str | None = None,
                          database: str | None = None) -> list[str]:
        """Every statement that creates the table: one without a cluster (``create_sql``), the
        local replicated table and the Distributed table over it on a cluster."""
        if not cluster:
            return [self.create_sql(retention_days=retention_days)]
        if not database:
            raise ValueError("a cluster's Distributed tables need the database name")
        return [self.create_sql(retention_days=retention_days, cluster=cluster),
                self.distributed_sql(cluster=cluster, database=database)]


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def local_name(table: str, cluster: str | None) -> str:
    return f"{table}_local" if cluster else table


def ddl_target(table: str, cluster: str | None) -> str:
    """What an ALTER, a mutation or a lightweight DELETE names: the rows live in ``<table>_local``
    on every shard (ON CLUSTER), and a Distributed table cannot be altered that way."""
    return f"{table}_local ON CLUSTER `{cluster}`" if cluster else table


def replicated_engine(engine: str, table: str) -> str:
    """``ReplacingMergeTree(v)`` -> ``ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/t', '{replica}', v)``."""
    name, _, rest = engine.partition("(")
    args = rest.rstrip(")").strip()
    path = f"'/clickhouse/tables/{{shard}}/{{database}}/{table}', '{{replica}}'"
    return f"Replicated{name}({path}{', ' + args if args else ''})"


# Inserts carrying the same insert_deduplication_token within the last N blocks are stored once:
# a spool segment replayed after ClickHouse had already taken it adds nothing.
DEDUP_WINDOW = "non_replicated_deduplication_window = 10000"
# The same on a cluster's Replicated tables: 10,000 inserts per partition, and for a week (the
# server's default forgets a token after an hour: a spool replayed after a longer outage would be
# stored twice).
REPLICATED_DEDUP_WINDOW = "replicated_deduplication_window = 10000, replicated_deduplication_window_seconds = 604800"
DATETIME_NS = "DateTime64(9, 'UTC')"
# Tables read one trace at a time (spans, span_logs, traces: the trace page, the summariser's
# lookups by id): granules of 1,024 rows in blocks of at least 4 KB (ClickHouse's defaults: 8,192
# and 64 KB), so a lookup decompresses ~8x less of each column it reads, for ~3 % more bytes on
# disk and no measured cost to the window scans (docs/BENCHMARKS.md). Set when a table is created;
# a store created before keeps 8,192 (ClickHouse cannot change it on an existing table).
POINT_READ_GRANULES = "index_granularity = 1024, min_compress_block_size = 4096, max_compress_block_size = 65536"
# Young small parts merge once about twenty of a size have gathered, not five (ClickHouse's
# default), on the tables written in many small parts: ``spans`` (under many small ingest batches
# each span is rewritten fewer times; migration 0023, docs/BENCHMARKS.md "Merges of small parts")
# and the summaries, ``traces`` and ``traces_by_start`` (a part of each every summariser run, 2 s:
# their merges cost 38-41 % less CPU, for about twice the parts alive; migration 0026,
# docs/BENCHMARKS.md "The summaries' merges").
FEWER_MERGES = "merge_selector_base = 20"
# Every table's outdated parts (those a merge replaced) are removed by its cleanup thread, which
# waits longer after each round that found little to remove: up to 300 s (ClickHouse's
# max_cleanup_delay_period). Under steady ingestion the merges' outdated parts then pile up between
# rounds, each keeping its metadata in memory (700 in five minutes at 20,500 spans/s in the embedded
# store), and a round that finds over 100 removes them on up to 128 new threads, which stay in the
# process: its RSS (after freed memory was returned) grew 19-29 MiB a minute, its threads by a
# hundred at once. Rounds every 5-10 s keep them at 87-122 at most, the growth at 4-6 MiB a minute
# and the threads at ~60 (migration 0025; docs/BENCHMARKS.md "outdated parts removed every 5-10 s").
# A round costs a listing of the table's parts; on a server, parts still wait ``old_parts_lifetime``.
CLEANUP_SETTINGS = "cleanup_delay_period = 5, max_cleanup_delay_period = 10"
DIM_VALUE_MAX = 256  # the longest attribute value that groups (spans.dims)
_SHORT = f"(k, v) -> v != '' AND length(v) <= {DIM_VALUE_MAX}"
DIMS_DEFAULT = f"mapUpdate(mapFilter({_SHORT}, resource_attributes), mapFilter({_SHORT}, attributes))"
DATETIME_MS = "DateTime64(3, 'UTC')"


SPANS = Table(
    name="spans",
    columns=(
        Column("project_id", "UInt64"),
        Column("trace_id", "FixedString(32)"),
        Column("span_id", "FixedString(16)"),
        Column("parent_span_id", "String", "ZSTD(1)"),  # '' for a root span
        Column("name", "LowCardinality(String)"),
        Column("phase", "LowCardinality(String)"),  # network|preprocess|inference|postprocess|other
        # 1 when the span did not state its phase and it was derived by the fallback rules (an HTTP
        # client span => network, else other): beneath a model call such a span is part of the call
        # and counts as inference (migration 0016). 0 for a stated phase and for older rows.
        Column("phase_fallback", "UInt8"),
        # What the span says of a cache in front of the model (migration 0018), mapped at ingestion
        # from ``tracedash.cache.hit`` and the conventions of docs/otlp.md: 0 no cache consulted (or
        # nothing said), 1 consulted and missed, 2 the cache answered. A column of its own, so the
        # cache figures never read the attributes (prompts). Older rows get 0.
        Column("cache", "UInt8"),
        Column("service", "LowCardinality(String)"),
        Column("model", "LowCardinality(String)"),
        Column("start_time", DATETIME_NS, "DoubleDelta, ZSTD(1)"),
        Column("duration_ns", "UInt64", "T64, ZSTD(1)"),
        Column("status", "LowCardinality(String)"),  # ok|error
        Column("status_message", "String", "ZSTD(1)"),
        Column("ttft_ns", "Nullable(UInt64)", "ZSTD(1)"),  # missing is missing, never 0
        Column("input_tokens", "Nullable(UInt32)", "ZSTD(1)"),  # not reported: NULL, never 0 (migration 0014)
        Column("output_tokens", "Nullable(UInt32)", "ZSTD(1)"),
        Column("cost_usd", "Nullable(Float64)", "ZSTD(1)"),
        Column("attributes", "Map(LowCardinality(String), String)", "ZSTD(1)"),
        Column("resource_attributes", "Map(LowCardinality(String), String)", "ZSTD(1)"),
        Column("event_times", f"Array({DATETIME_NS})", "ZSTD(1)"),
        Column("event_names", "Array(LowCardinality(String))", "ZSTD(1)"),
        Column("event_attributes", "Array(Map(String, String))", "ZSTD(1)"),
        Column("ingested_at", DATETIME_MS, "", "now64(3)"),
        # Filled by ClickHouse at insert (migration 0013): what the summaries read to tell load-test
        # traffic, without reading the attributes (prompts) again.
        Column("loadtest_run_id", "String", "ZSTD(1)", "attributes['loadtest.run_id']"),
        # The span's short attribute values, span and resource attributes in one map (migration 0020),
        # filled by ClickHouse at insert: what grouping and the Variants view read to tell which value
        # of a key a span carries, without reading the attribute values (prompts of kilobytes) again.
        # A key's value is the span attribute's, else the resource attribute's; empty values and values
        # over DIM_VALUE_MAX characters are left out. Parts written before the migration compute it
        # from ``attributes`` when read (same values, at the old cost).
        Column("dims", "Map(LowCardinality(String), String)", "ZSTD(1)", DIMS_DEFAULT),
    ),
    # A span re-sent with the same ids collapses into one row on merge.
    engine="ReplacingMergeTree(ingested_at)",
    partition_by="toDate(start_time)",
    order_by="(project_id, service, start_time, trace_id, span_id)",
    ttl="toDateTime(start_time) + toIntervalDay({retention_days})",
    indexes=(
        "idx_trace_id trace_id TYPE bloom_filter(0.001) GRANULARITY 1",
        "idx_duration duration_ns TYPE minmax GRANULARITY 4",
    ),
    # (a trace's spans lie in a few granules, one per service it touched: POINT_READ_GRANULES)
    settings=f"{POINT_READ_GRANULES}, ttl_only_drop_parts = 1, {DEDUP_WINDOW}, {FEWER_MERGES}",
    added_columns=(("phase_fallback", 0), ("cache", 0)),
    # Cluster: by trace, so a trace's spans, span logs, summary and scores share one shard (FINAL and
    # the per-trace summary, joins and IN (traces) stay correct within a shard); every copy of a span
    # carries its trace id, so duplicates meet and collapse there too.
    shard_key="cityHash64(trace_id)",
)

# GenAI events that arrive as OTLP log records (``POST /v1/logs``: prompts, completions, tool
# messages, inference details), kept with their trace and span (``span_id`` '' for one of the trace
# as a whole). The trace page reads a trace's events together: ORDER BY starts with the trace.
SPAN_LOGS = Table(
    name="span_logs",
    columns=(
        Column("project_id", "UInt64"),
        Column("trace_id", "FixedString(32)"),
        Column("span_id", "String", "ZSTD(1)"),  # '' when the event names no span
        Column("time", DATETIME_NS, "ZSTD(1)"),
        Column("event_name", "LowCardinality(String)"),  # gen_ai.user.message, gen_ai.choice, …
        Column("severity", "LowCardinality(String)"),  # severity text, else the severity number's name
        Column("body", "String", "ZSTD(1)"),  # the AnyValue body as JSON text ('' for none)
        Column("attributes", "Map(LowCardinality(String), String)", "ZSTD(1)"),
        Column("service", "LowCardinality(String)"),
        Column("resource_attributes", "Map(LowCardinality(String), String)", "ZSTD(1)"),
        Column("ingested_at", DATETIME_MS, "", "now64(3)"),
    ),
    engine="MergeTree",
    partition_by="toDate(time)",
    order_by="(project_id, trace_id, time)",
    ttl="toDateTime(time) + toIntervalDay({retention_days})",
    settings=f"{POINT_READ_GRANULES}, ttl_only_drop_parts = 1, {DEDUP_WINDOW}",
    # Cluster: by trace, beside the trace's spans (the trace page reads both for one trace).
    shard_key="cityHash64(trace_id)",
)

RESOURCE_SAMPLES = Table(
    name="resource_samples",
    columns=(
        Column("project_id", "UInt64"),
        Column("time", DATETIME_MS, "DoubleDelta, ZSTD(1)"),
        Column("host", "LowCardinality(String)"),
        Column("gpu_index", "Int16"),  # -1: a host-level sample (CPU, memory)
        Column("gpu_uuid", "LowCardinality(String)"),
        Column("gpu_name", "LowCardinality(String)"),
        Column("gpu_utilization", "Nullable(Float32)", "ZSTD(1)"),
        Column("gpu_memory_used", "Nullable(UInt64)", "ZSTD(1)"),
        Column("gpu_memory_total", "Nullable(UInt64)", "ZSTD(1)"),
        Column("gpu_temperature", "Nullable(Float32)", "ZSTD(1)"),
        Column("gpu_power_watts", "Nullable(Float32)", "ZSTD(1)"),
        Column("cpu_percent", "Nullable(Float32)", "ZSTD(1)"),
        Column("memory_used", "Nullable(UInt64)", "ZSTD(1)"),
        Column("memory_total", "Nullable(UInt64)", "ZSTD(1)"),
        Column("process_pids", "Array(UInt32)", "ZSTD(1)"),
        Column("process_names", "Array(String)", "ZSTD(1)"),
        Column("process_gpu_memory", "Array(UInt64)", "ZSTD(1)"),
    ),
    engine="MergeTree",
    partition_by="toDate(time)",
    order_by="(project_id, host, gpu_index, time)",
    ttl="toDateTime(time) + toIntervalDay({retention_days})",
    settings=f"index_granularity = 8192, ttl_only_drop_parts = 1, {DEDUP_WINDOW}",
    # Cluster: by series (the ORDER BY key without the time), the same key as resource_minute and
    # resource_hour, so the local materialized views that fill those write on the shard where a
    # Distributed insert into them would have gone.
    shard_key="cityHash64(project_id, host, gpu_index)",
)

# Inference engines' own metrics (vLLM, TGI, SGLang: scraped from their Prometheus ``/metrics`` by
# the agent, or sent over OTLP), one row per (series, sample time), under the canonical names of
# ``agent.engines.METRICS``. Gauges are the value at that time; counters and histogram buckets
# (``le``: the bucket's upper bound in seconds, inf for the count; 0 for every other metric) are
# cumulative, so reads take increases between samples (a drop — an engine restart — restarts from 0).
ENGINE_SAMPLES = Table(
    name="engine_samples",
    columns=(
        Column("project_id", "UInt64"),
        Column("time", DATETIME_MS, "DoubleDelta, ZSTD(1)"),
        Column("host", "LowCardinality(String)"),  # where the agent ran (OTLP: host.name)
        Column("engine", "LowCardinality(String)"),  # vllm | tgi | sglang | the --scrape label
        Column("target", "LowCardinality(String)"),  # the scraped URL (OTLP: service.instance.id)
        Column("model", "LowCardinality(String)"),  # the engine's model label ('' when it has none)
        Column("metric", "LowCardinality(String)"),
        Column("le", "Float64"),
        Column("value", "Float64", "Gorilla, ZSTD(1)"),
    ),
    engine="MergeTree",
    partition_by="toDate(time)",
    order_by="(project_id, metric, engine, target, model, le, time)",
    ttl="toDateTime(time) + toIntervalDay({retention_days})",
    settings=f"index_granularity = 8192, ttl_only_drop_parts = 1, {DEDUP_WINDOW}",
    # Cluster: by series (the ORDER BY key without the time): a counter's increases between samples
    # are taken along one series, which then sits whole on one shard.
    shard_key="cityHash64(project_id, metric, engine, target, model, le)",
)

# Scores of a trace or of one of its spans (migration 0019): a reviewer's good/bad or 1-5 rating,
# an eval's or an LLM judge's number, an app's own feedback. One row per score; ``score_id`` is the
# sender's id, or derived from (trace, span, name, source, author) when it sent none, so a re-sent
# score — or a reviewer changing their mind — replaces the earlier one. Reads take the latest copy
# (``FINAL``). Kept apart from the spans so that a score may arrive days after its trace (or before
# it); it ages from when it was given (``time``), not from its trace. ORDER BY starts with the trace:
# the trace page and the variants' joins read a set of traces' scores without a scan.
SCORES = Table(
    name="scores",
    columns=(
        Column("project_id", "UInt64"),
        Column("trace_id", "FixedString(32)"),
        Column("span_id", "String", "ZSTD(1)"),  # '' for a score of the trace as a whole
        Column("name", "LowCardinality(String)"),  # e.g. quality, helpfulness, judge.correct
        Column("score_id", "String", "ZSTD(1)"),
        Column("data_type", "LowCardinality(String)"),  # numeric | boolean | categorical
        Column("value", "Float64"),  # numeric: the number; boolean: 1 true / 0 false; categorical: 0
        Column("string_value", "String", "ZSTD(1)"),  # categorical: the category; else ''
        Column("source", "LowCardinality(String)"),  # api | sdk | annotation | eval
        Column("author", "String", "ZSTD(1)"),  # who gave it ('' unknown): a reviewer, an eval's name
        Column("comment", "String", "ZSTD(1)"),
        Column("time", DATETIME_MS, "DoubleDelta, ZSTD(1)"),  # when it was given
        Column("ingested_at", DATETIME_MS, "", "now64(3)"),
    ),
    engine="ReplacingMergeTree(ingested_at)",
    order_by="(project_id, trace_id, span_id, name, score_id)",
    ttl="toDateTime(time) + toIntervalDay({retention_days})",
    settings=f"index_granularity = 8192, {DEDUP_WINDOW}",
    # Cluster: by trace, beside the trace's spans and summary; a re-sent score (same ORDER BY key,
    # which starts with the trace) lands on the same shard and replaces the earlier one under FINAL.
    shard_key="cityHash64(trace_id)",
)

_MODEL_COLUMNS = (
    Column("model_input_tokens", "Map(String, UInt64)", "ZSTD(1)"),
    Column("model_output_tokens", "Map(String, UInt64)", "ZSTD(1)"),
    Column("model_cost_usd", "Map(String, Float64)", "ZSTD(1)"),
)

# One row per trace: every per-trace figure of DOMAIN.md, computed by analytics.trace_math from
# the trace's spans by the summariser task and re-written (a higher ``version``) whenever spans of
# the trace arrive later. The explorer sorts and filters on it, a trace id finds its spans' time
# bounds here without a scan (ORDER BY starts with the id), and the rollups aggregate it.
# Reads take the latest version of a trace: ``FINAL`` or ``ORDER BY version DESC LIMIT 1 BY trace_id``.
TRACES = Table(
    name="traces",
    columns=(
        Column("project_id", "UInt64"),
        Column("trace_id", "FixedString(32)"),
        Column("start_time", DATETIME_NS, "DoubleDelta, ZSTD(1)"),  # the root's start (no root: first span's)
        Column("e2e_ns", "UInt64", "T64, ZSTD(1)"),  # the root's duration (no root: extent of the spans present)
        Column("has_root", "UInt8"),
        Column("spans_start", DATETIME_NS, "ZSTD(1)"),  # earliest span start (clock skew can put it before the root)
        Column("spans_end", DATETIME_NS, "ZSTD(1)"),  # latest span end
        Column("root_name", "LowCardinality(String)"),
        Column("service", "LowCardinality(String)"),  # the root's
        Column("model", "LowCardinality(String)"),  # the first model call's
        Column("services", "Array(LowCardinality(String))"),  # every service / model / phase seen in the trace
        Column("models", "Array(LowCardinality(String))"),
        Column("phases", "Array(LowCardinality(String))"),
        Column("status", "LowCardinality(String)"),  # the request's: ok | recovered | error (DOMAIN.md "Status")
        Column("error_message", "String", "ZSTD(1)"),
        Column("ttft_ns", "Nullable(UInt64)", "ZSTD(1)"),
        Column("tpot_ns", "Nullable(Float64)", "ZSTD(1)"),
        Column("input_tokens", "UInt64", "T64, ZSTD(1)"),
        Column("output_tokens", "UInt64", "T64, ZSTD(1)"),
        Column("cost_usd", "Nullable(Float64)", "ZSTD(1)"),
        Column("cost_estimated", "UInt8"),
        Column("span_count", "UInt32", "T64, ZSTD(1)"),
        Column("network_ns", "UInt64", "T64, ZSTD(1)"),  # exclusive phase time (DOMAIN.md)
        Column("preprocess_ns", "UInt64", "T64, ZSTD(1)"),
        Column("inference_ns", "UInt64", "T64, ZSTD(1)"),
        Column("postprocess_ns", "UInt64", "T64, ZSTD(1)"),
        Column("other_ns", "UInt64", "T64, ZSTD(1)"),
        Column("version", "UInt64"),  # when it was summarised (unix ns): the latest wins
        Column("error_spans", "UInt32", "T64, ZSTD(1)"),  # spans with status error (migration 0012)
        # Tokens and cost per model of the spans (each call under its own model; '' for none).
        *_MODEL_COLUMNS,
        # Sum of a hash of every stored copy of every span (id, ingested_at) the summary was computed
        # from (migration 0013): equal for the trace's spans now means nothing arrived since.
        Column("spans_digest", "UInt64", "", "0"),  # 0: written by trace_row (seeds), never a digest
        Column("loadtest", "UInt8", "", "0"),  # a span carries loadtest.run_id: load-test traffic (no paging)
        # The request's cache outcome (migration 0018): the highest ``spans.cache`` of its spans, so 2
        # (hit) when any span was answered by a cache, 1 (miss) when one consulted a cache and none
        # hit, 0 when none consulted one. Summaries written before are 0 until summarised again.
        Column("cache", "UInt8"),
    ),
    engine="ReplacingMergeTree(version)",
    order_by="(project_id, trace_id)",
    ttl="toDateTime(start_time) + toIntervalDay({retention_days})",
    indexes=(
        "idx_start start_time TYPE minmax GRANULARITY 1",
        "idx_service service TYPE set(256) GRANULARITY 4",
    ),
    settings=f"{POINT_READ_GRANULES}, {DEDUP_WINDOW}, {FEWER_MERGES}",
    # Cluster: by trace (the ReplacingMergeTree key is the trace): every version of a summary meets
    # on the shard that holds the trace's spans, where the summariser reads them.
    shard_key="cityHash64(trace_id)",
)

# The same summaries ordered by start time, filled by a materialized view on every insert into
# ``traces`` (migration 0009): the explorer's time-window queries read only their days and granules
# here, where ``traces`` (ordered by trace id) would read the whole table. A summary whose start
# moved (its root arrived late) leaves its old row behind under the old start, so the summariser
# retires it (analytics.summarizer.starts_retire; migration 0022 for summaries stored before): a
# row with no spans (``span_count = 0``) one version below the new summary replaces the old row
# under FINAL. Window reads take FINAL and skip retired rows (panel_selectors.latest_summaries_sql);
# the explorer keeps a row only when its ``version`` is the trace's latest in ``traces``.
TRACES_BY_START = Table(
    name="traces_by_start",
    columns=TRACES.columns,
    engine="ReplacingMergeTree(version)",
    partition_by="toDate(start_time)",
    order_by="(project_id, start_time, trace_id)",
    ttl="toDateTime(start_time) + toIntervalDay({retention_days})",
    settings=f"index_granularity = 8192, ttl_only_drop_parts = 1, {DEDUP_WINDOW}, {FEWER_MERGES}",
    # Cluster: by trace, as ``traces``: the materialized view copies each shard's traces_local into
    # its own traces_by_start_local, and a row's versions (same start) meet there under FINAL.
    shard_key="cityHash64(trace_id)",
)

# --- Rollups (analytics.rollup_services writes them, analytics.rollups reads them) ----------
# Per-bucket aggregates of the ``traces`` table per project/service/model. A bucket is always
# recomputed whole from its source and written with a higher ``version``; reads take the latest
# (FINAL), so running a bucket twice changes nothing. Percentiles come from log-bucket
# histograms: key ``k`` >= 1 counts values in (γ^(k-1), γ^k] ns with γ = 1.01 (key 0: values <= 1 ns);
# histograms of any number of buckets merge by adding (sumMap), and the value shown for a bucket
# is within 0.5 % of any value in it (analytics.rollups.HIST_GAMMA).
ROLLUP_HISTOGRAMS = ("e2e", "ttft", "tpot", "network", "preprocess", "inference", "postprocess", "other")
_HIST = "Map(UInt16, UInt64)"


def _rollup_table(name: str, *, partition_by: str, ttl: str, settings: str) -> Table:
    return Table(
        name=name,
        columns=(
            Column("project_id", "UInt64"),
            Column("bucket", "DateTime('UTC')", "DoubleDelta, ZSTD(1)"),  # the bucket's start
            Column("service", "LowCardinality(String)"),  # the trace's (its root's)
            Column("model", "LowCardinality(String)"),  # the trace's (its first model call's)
            Column("requests", "UInt64"),  # traces with a root that started in the bucket
            Column("errors", "UInt64"),  # requests whose status is error (their root failed)
            Column("e2e_sum_ns", "UInt64"),  # Little's law: concurrency = sum of E2E / seconds
            Column("e2e_max_ns", "UInt64"),
            Column("input_tokens", "UInt64"),
            Column("output_tokens", "UInt64"),
            Column("cost_usd", "Float64"),
            Column("cost_requests", "UInt64"),  # requests that have a cost
            Column("cost_estimated_requests", "UInt64"),  # ... of which some came from the price table
            Column("ttft_sum_ns", "UInt64"),
            Column("ttft_count", "UInt64"),
            Column("tpot_sum_ns", "Float64"),
            Column("tpot_count", "UInt64"),
            Column("network_sum_ns", "UInt64"),  # exclusive phase time summed over the requests
            Column("preprocess_sum_ns", "UInt64"),
            Column("inference_sum_ns", "UInt64"),
            Column("postprocess_sum_ns", "UInt64"),
            Column("other_sum_ns", "UInt64"),
            *(Column(f"{h}_hist", _HIST, "ZSTD(1)") for h in ROLLUP_HISTOGRAMS),
            Column("version", "UInt64"),  # when it was computed (unix ns): the latest wins
            # migration 0012: requests recovered (root ok, a span failed), spans with errors, and
            # tokens and cost per model of the calls (not the trace's first model)
            Column("recovered", "UInt64"),
            Column("error_spans", "UInt64"),
            *_MODEL_COLUMNS,
        ),
        engine="ReplacingMergeTree(version)",
        partition_by=partition_by,
        order_by="(project_id, bucket, service, model)",
        ttl=ttl,
        settings=settings,
        # Cluster: by the whole ReplacingMergeTree key, so every recomputed version of a bucket
        # lands on the shard of the earlier ones and FINAL (applied per shard) keeps the latest.
        shard_key="cityHash64(project_id, bucket, service, model)",
    )


# Small granules: a row holds eight histograms of up to hundreds of entries each, and a read of a
# few hours at a window's edge should decompress those hours, not a whole day or month of rows.
ROLLUP_MINUTE = _rollup_table("rollup_minute", partition_by="toDate(bucket)",
                              ttl="bucket + toIntervalDay({retention_days})",
                              settings="index_granularity = 1024, ttl_only_drop_parts = 1")
# Hour and day rollups outlive the raw spans: long-range trends stay visible after the spans go.
ROLLUP_HOUR = _rollup_table("rollup_hour", partition_by="toYYYYMM(bucket)", ttl="bucket + toIntervalDay(400)",
                            settings="index_granularity = 128")
ROLLUP_DAY = _rollup_table("rollup_day", partition_by="toYear(bucket)", ttl="bucket + toIntervalDay(1830)",
                           settings="index_granularity = 128")
# Six-hour buckets: the step of a 30-day series (about 120 points), so it merges 120 rows, not 720.
ROLLUP_6H = _rollup_table("rollup_6h", partition_by="toYYYYMM(bucket)", ttl="bucket + toIntervalDay(400)",
                          settings="index_granularity = 64")

# The same hours and days summed over every service and model (service and model ''): what a
# page reads when it filters neither, with several times fewer histogram entries to merge than
# the per-(service, model) rows (measured: docs/BENCHMARKS.md "Panels").
ROLLUP_HOUR_ALL = _rollup_table("rollup_hour_all", partition_by="toYYYYMM(bucket)", ttl="bucket + toIntervalDay(400)",
                                settings="index_granularity = 32")
ROLLUP_DAY_ALL = _rollup_table("rollup_day_all", partition_by="toYear(bucket)", ttl="bucket + toIntervalDay(1830)",
                               settings="index_granularity = 32")
ROLLUP_6H_ALL = _rollup_table("rollup_6h_all", partition_by="toYYYYMM(bucket)", ttl="bucket + toIntervalDay(400)",
                              settings="index_granularity = 32")

# Minutes whose rollup must be recomputed: the summariser marks the minute a trace starts in (and
# the one it started in before, when a late root moved it); the rollup task reads the marks made
# since its last run. Durable, so a crash between the two loses nothing.
ROLLUP_DIRTY = Table(
    name="rollup_dirty",
    columns=(
        Column("project_id", "UInt64"),
        Column("bucket", "DateTime('UTC')"),  # a minute
        Column("marked_at", DATETIME_MS, "", "now64(3)"),
    ),
    engine="MergeTree",
    order_by="(project_id, marked_at)",
    ttl="toDateTime(marked_at) + toIntervalDay(3)",
    # Cluster: by (project, minute): no merge semantics to keep, only a deterministic key (a
    # re-sent batch of marks must split the same way for its dedup token to match).
    shard_key="cityHash64(project_id, bucket)",
)

# Where each periodic job got to (per project): the latest value wins.
TASK_WATERMARKS = Table(
    name="task_watermarks",
    columns=(
        Column("project_id", "UInt64"),
        Column("job", "LowCardinality(String)"),
        Column("value", "Int64"),  # unix ms of the ClickHouse clock, up to which the job has read
    ),
    engine="ReplacingMergeTree(value)",
    order_by="(project_id, job)",
    # Cluster: by the whole ReplacingMergeTree key, so a job's watermarks meet and the latest wins.
    shard_key="cityHash64(project_id, job)",
)

# Resource samples per host/GPU and minute, filled by a materialized view on every insert into
# ``resource_samples`` (migration 0010), so the Resources page reads minutes, not every sample, for
# ranges whose chart buckets are a minute or more. Averages are kept as sums and counts of the
# samples that carried the figure, peaks as maxima (-1: no sample carried it), per-process GPU
# memory as a maxMap by pid; parts merge by these functions (AggregatingMergeTree), reads GROUP BY.
def _resource_rollup(name: str) -> Table:
    return Table(
        name=name,
        columns=(
            Column("project_id", "UInt64"),
            Column("bucket", "DateTime('UTC')", "DoubleDelta, ZSTD(1)"),
            Column("host", "LowCardinality(String)"),
            Column("gpu_index", "Int16"),
            Column("gpu_name", "SimpleAggregateFunction(anyLast, String)"),
            *(Column(f"{figure}_{part}", f"SimpleAggregateFunction(sum, {kind})")
              for figure in ("gpu_utilization", "gpu_temperature", "gpu_power_watts", "cpu_percent")
              for part, kind in (("sum", "Float64"), ("n", "UInt64"))),
            Column("gpu_memory_percent_max", "SimpleAggregateFunction(max, Float64)"),
            Column("memory_percent_max", "SimpleAggregateFunction(max, Float64)"),
            Column("process_memory", "SimpleAggregateFunction(maxMap, Tuple(Array(UInt32), Array(UInt64)))"),
            Column("process_names", "SimpleAggregateFunction(groupUniqArrayArray, Array(Tuple(UInt32, String)))"),
        ),
        engine="AggregatingMergeTree",
        partition_by="toDate(bucket)",  # daily, as the samples: TTL drops whole days
        order_by="(project_id, host, gpu_index, bucket)",
        ttl="bucket + toIntervalDay({retention_days})",
        settings="index_granularity = 8192, ttl_only_drop_parts = 1",
        # Cluster: by series (host/GPU), as resource_samples: the local views fill the shard's own
        # minutes and hours, and a bucket's partial rows (one per insert block) merge there.
        shard_key="cityHash64(project_id, host, gpu_index)",
    )


RESOURCE_MINUTE = _resource_rollup("resource_minute")
# The same per hour, filled by a materialized view on ``resource_minute`` (migration 0011): a
# 30-day chart reads 720 rows per host/GPU.
RESOURCE_HOUR = _resource_rollup("resource_hour")

# --- The attribute index (analytics.attribute_index) ------------------------------------------
# The attribute keys a project groups by (declared on first use: grouping, the Variants view, a
# grouped latency rule), at most analytics.attribute_index.MAX_KEYS per project. ``ready`` once the
# spans stored before the declaration were indexed (the backfill); ``removed`` stops the indexing.
# The latest ``version`` of a (project, key) wins.
DIM_KEYS = Table(
    name="dim_keys",
    columns=(
        Column("project_id", "UInt64"),
        Column("key", "String"),
        Column("declared_at", DATETIME_MS),
        Column("ready", "UInt8"),  # 1: every stored span carrying the key is in span_key_values
        Column("removed", "UInt8"),
        Column("version", "UInt64"),  # unix ns of the change
    ),
    engine="ReplacingMergeTree(version)",
    order_by="(project_id, key)",
    # Cluster: by the whole ReplacingMergeTree key, so a key's versions meet and the latest wins.
    shard_key="cityHash64(project_id, key)",
)

# For each declared key, the traces carrying it (on a span, with a non-empty value of at most
# DIM_VALUE_MAX bytes: the key of ``spans.dims``): a row per (trace, value) with the start of the
# trace's first span carrying that value, ordered by (project, key, value, start) in day partitions. The read that assigns a
# window's traces to the key's values (analytics.grouping.trace_value_sql: the value of the
# earliest span) reads the window's rows of one key here, not every span's ``dims`` of the window;
# the Variants view finds the hosts (``host.name``) a trace ran on here too. Written by the
# summariser for every trace it summarises (the project's declared keys then) and by a key's
# backfill for the spans stored before (analytics.attribute_index). A trace's value is here once
# per time the trace was summarised (and per day, for a backfill): reads take the earliest start.
SPAN_KEY_VALUES = Table(
    name="span_key_values",
    columns=(
        Column("project_id", "UInt64"),
        Column("key", "LowCardinality(String)"),
        Column("start_time", DATETIME_NS, "DoubleDelta, ZSTD(1)"),
        Column("trace_id", "FixedString(32)"),
        Column("value", "String", "ZSTD(1)"),
    ),
    engine="MergeTree",
    # A window reads its days' partitions; within them a key's rows, and where the read names
    # values (the Variants view's hosts that have GPU samples), only those values' rows.
    partition_by="toDate(start_time)",
    order_by="(project_id, key, value, start_time)",
    ttl="toDateTime(start_time) + toIntervalDay({retention_days})",
    settings="index_granularity = 8192, ttl_only_drop_parts = 1",
    # Cluster: by trace, as ``spans``: each shard's summariser writes its own traces' rows.
    shard_key="cityHash64(trace_id)",
)

TABLES: dict[str, Table] = {t.name: t for t in (SPANS, SPAN_LOGS, RESOURCE_SAMPLES, ENGINE_SAMPLES, SCORES, TRACES, TRACES_BY_START,
                                                   ROLLUP_MINUTE, ROLLUP_HOUR, ROLLUP_DAY, ROLLUP_HOUR_ALL,
                                                   ROLLUP_DAY_ALL, ROLLUP_6H, ROLLUP_6H_ALL, ROLLUP_DIRTY,
                                                   TASK_WATERMARKS, RESOURCE_MINUTE, RESOURCE_HOUR,
                                                   DIM_KEYS, SPAN_KEY_VALUES)}
