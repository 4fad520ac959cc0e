"""What the "beneath a model call" rule costs the per-trace summaries (analytics.summary_sql).

    .venv/bin/python bench/summary_sql.py [--spans 50000] [--rounds 15]

Loads ``--spans`` realistic LLM spans (``bench/load_spans.py``'s generator, ~8.5 spans a trace,
one day) into a fresh embedded store, then times the summariser's ``INSERT … SELECT`` over all of
them (``traces`` truncated before each run), interleaved, ``--rounds`` times each:

- **with the rule**: the statement the summariser runs (fallback-phase spans beneath a model call
  count as inference: parent indexes, pointer jumping);
- **without it**: the same statement with each span's own priority (``epris = pris``).

Twice: on the data as generated (every span states its phase, as the native SDK sends them: the
rule's work is skipped) and after marking every ``network`` and ``other`` span as a fallback one
(as OTLP spans without GenAI attributes and native spans without a phase arrive: most traces then
pay for it). Prints the medians and the ratio with / without, measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench import load_spans  # noqa: E402
from bench.common import machine, table  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)

    load_spans._django()
    from analytics import summary_sql

    store = load_spans.open_store(Path(tempfile.mkdtemp(prefix="tracedash-summary-bench-")))
    load_spans.load(store=store, spans_wanted=args.spans, days=1, batch=10_000, seed=3, now_ns=time.time_ns())
    print(file=sys.stderr)
    params = {"project_id": load_spans.PROJECT_ID, "prices": summary_sql.prices_json({}), "version": 1}
    with_rule = summary_sql.summary_insert_sql(trace_filter="1")
    without = with_rule.replace(summary_sql.EFFECTIVE_PRIORITIES_SQL, "pris AS epris")
    assert without != with_rule

    def run(sql: str) -> float:
        store.command("TRUNCATE TABLE traces", tag="bench.summary_sql.truncate")
        started = time.perf_counter()
        store.command(sql, params, tag="bench.summary_sql.run")
        return (time.perf_counter() - started) * 1000

    rows = []
    for label in ("every span states its phase", "network/other spans are fallback ones"):
        if rows:
            store.command("ALTER TABLE spans UPDATE phase_fallback = 1 WHERE phase IN ('network', 'other')"
                          " SETTINGS mutations_sync = 2", tag="bench.summary_sql.mark")
        times = {"with": [], "without": []}
        for i in range(args.rounds):
            for name, sql in (("with", with_rule), ("without", without)):
                times[name].append(run(sql))
            print(f"\r{label}: round {i + 1}/{args.rounds}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        w, wo = statistics.median(times["with"]), statistics.median(times["without"])
        rows.append([label, f"{wo:.0f}", f"{w:.0f}", f"{w / wo:.3f}"])
    traces = store.query("SELECT count() FROM traces", tag="bench.summary_sql.count").scalar()
    info = machine()
    print(f"\nsummary statement over {args.spans:,} spans ({traces:,} traces), median of {args.rounds} interleaved runs")
    print(table(["data", "without the rule ms", "with the rule ms", "with / without"], rows))
    print(f"machine: nproc {info['nproc']}, {info['cpu_model']}, Python {info['python']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
