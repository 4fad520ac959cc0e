"""The capacity model's arithmetic (bench/capacity.py capacity_table): a pure function, checked
against figures worked out by hand. No timing, no store."""

import math

import pytest

from bench.capacity import capacity_table, human_bytes

FIGURES = {
    "web_cpu_s_per_1000_spans": 0.02,  # 20 ms of CPU per 1,000 spans
    "store_cpu_s_per_1000_spans": 0.03,
    "summary_cpu_s_per_1000_spans": 0.05,
    "rollup_run_cpu_s": 0.2,
    "rollup_cpu_s_per_1000_traces": 0.01,
    "rollup_interval_s": 10.0,
    "rollup_window_s": 600.0,
    "spans_per_trace": 10.0,
    "bytes_per_span": 100.0,
    "bytes_per_trace": 400.0,
    "rollup_bytes_per_minute": 10_000.0,
}


def test_one_rate_worked_by_hand():
    (row,) = capacity_table(FIGURES, rates=[10_000], retention_days=[7, 30], utilisation=0.5)
    assert row["spans_per_s"] == 10_000
    assert row["web_cpu"] == pytest.approx(0.2)  # 10 × 0.02
    assert row["web_cores"] == 1  # 0.2 / 0.5 = 0.4 → 1
    assert row["store_cpu"] == pytest.approx(0.3)
    assert row["summary_cpu"] == pytest.approx(0.5)
    # 1,000 traces/s; a run every 10 s recomputes 600 s = 600,000 traces: (0.2 + 600 × 0.01) / 10
    assert row["rollup_cpu"] == pytest.approx(0.62)
    assert row["clickhouse_cpu"] == pytest.approx(0.3 + 0.5 + 0.62)
    assert row["clickhouse_cores"] == math.ceil(1.42 / 0.5)  # 2.84 → 3
    per_day = 86400 * (10_000 * 100 + 1_000 * 400) + 1440 * 10_000
    assert row["disk_bytes_per_day"] == pytest.approx(per_day)
    assert row["disk_bytes"] == {7: pytest.approx(7 * per_day), 30: pytest.approx(30 * per_day)}


def test_the_late_window_recovered_less_often_costs_less():
    # Every 10 s the minutes that ended since (each trace once: 10 s of traces, 10,000 a run), the
    # 600 s window every 60 s.
    figures = dict(FIGURES, rollup_late_every_s=60.0)
    (row,) = capacity_table(figures, rates=[10_000], retention_days=[7])
    assert row["rollup_cpu"] == pytest.approx((0.2 + 10 * 0.01) / 10 + (0.2 + 600 * 0.01) / 60)
    # Not above the interval: every run covers the window, as without the figure.
    (same,) = capacity_table(dict(FIGURES, rollup_late_every_s=10.0), rates=[10_000], retention_days=[7])
    assert same["rollup_cpu"] == pytest.approx(0.62)


def test_scales_with_rate_and_utilisation():
    low, high = capacity_table(FIGURES, rates=[1_000, 100_000], retention_days=[90], utilisation=1.0)
    assert high["web_cpu"] == pytest.approx(100 * low["web_cpu"])
    assert high["store_cpu"] == pytest.approx(100 * low["store_cpu"])
    # The rollup's fixed cost per run does not grow with the rate, so less than 100 times.
    assert low["rollup_cpu"] < high["rollup_cpu"] < 100 * low["rollup_cpu"]
    assert high["web_cores"] == 2  # exactly 2.0 CPU-seconds a second at 100 % → 2 cores, not 3
    (tight,) = capacity_table(FIGURES, rates=[100_000], retention_days=[90], utilisation=0.6)
    assert tight["web_cores"] == 4  # 2.0 / 0.6 = 3.33 → 4
    assert tight["disk_bytes"][90] == pytest.approx(90 * high["disk_bytes_per_day"])


def test_rejects_a_utilisation_outside_0_1():
    with pytest.raises(ValueError, match="utilisation"):
        capacity_table(FIGURES, utilisation=0)
    with pytest.raises(ValueError, match="utilisation"):
        capacity_table(FIGURES, utilisation=1.5)


def test_human_bytes():
    assert human_bytes(999) == "999 B"
    assert human_bytes(1_500) == "1.5 KB"
    assert human_bytes(2.5e12) == "2.5 TB"
