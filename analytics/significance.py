"""Small, pure statistics behind the Variants view (docs/variants.md "Statistics").

Every comparison is "variant − baseline" with a 95 % interval and a two-sided p-value:

- ``bootstrap_diff``: percentiles (and any statistic) on per-trace values, a seeded percentile
  bootstrap (reproducible: the same data give the same interval).
- ``welch_diff``: difference of two means from (count, mean, sample variance): Welch's t.
- ``proportion_diff``: difference of two rates (error rate, share of "true"): two-proportion z
  (unpooled standard error for the interval, pooled for the test).
- ``holm``: Holm's step-down correction of a family of p-values (one figure, several variants
  against the same baseline).

No SciPy: the normal distribution comes from ``math.erf``; Student's t quantile and tail use
classic expansions (accurate to well under 1 % for 3+ degrees of freedom, exact in the limit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05
Z95 = 1.959963984540054
BOOTSTRAP_RESAMPLES = 2000
SEED = 20260117


@dataclass(frozen=True)
class Diff:
    """variant − baseline, its 95 % interval, the p-value (Holm-adjusted once ``holm`` ran)."""

    estimate: float | None
    low: float | None
    high: float | None
    p_value: float | None
    method: str
    p_adjusted: float | None = None

    @property
    def significant(self) -> bool | None:
        p = self.p_adjusted if self.p_adjusted is not None else self.p_value
        if p is None or self.low is None or self.high is None:
            return None
        return p < ALPHA and not (self.low <= 0 <= self.high)

    @property
    def verdict(self) -> str:
        s = self.significant
        return "n/a" if s is None else "significant" if s else "not significant"

    def as_dict(self) -> dict:
        return {"difference": self.estimate, "low": self.low, "high": self.high, "p_value": self.p_value,
                "p_adjusted": self.p_adjusted, "method": self.method, "significant": self.significant,
                "verdict": self.verdict}


NONE = Diff(None, None, None, None, "none")


def normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2))


def t_quantile_975(df: float) -> float:
    """Student's t 0.975 quantile (Cornish–Fisher expansion around the normal)."""
    if not math.isfinite(df) or df > 1e6:
        return Z95
    df = max(df, 1.0)
    z = Z95
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def t_two_sided_p(t: float, df: float) -> float:
    """Two-sided p of Student's t (a normal approximation of t's tail, Peizer-Pratt style)."""
    t = abs(t)
    if not math.isfinite(df) or df > 1e6:
        return 2 * normal_sf(t)
    df = max(df, 1.0)
    z = t * (1 - 1 / (4 * df)) / math.sqrt(1 + t * t / (2 * df))
    return min(1.0, 2 * normal_sf(z))


def welch_diff(n_a: int, mean_a: float | None, var_a: float | None,
               n_b: int, mean_b: float | None, var_b: float | None) -> Diff:
    """Mean of b − mean of a (Welch's t; variances are sample variances)."""
    if n_a < 2 or n_b < 2 or mean_a is None or mean_b is None:
        return NONE
    var_a, var_b = max(var_a or 0.0, 0.0), max(var_b or 0.0, 0.0)
    se2 = var_a / n_a + var_b / n_b
    diff = mean_b - mean_a
    if se2 <= 0:
        p = 1.0 if diff == 0 else 0.0
        return Diff(diff, diff, diff, p, "welch")
    se = math.sqrt(se2)
    denom = (var_a / n_a) ** 2 / (n_a - 1) + (var_b / n_b) ** 2 / (n_b - 1)
    df = se2**2 / denom if denom > 0 else math.inf
    q = t_quantile_975(df)
    return Diff(diff, diff - q * se, diff + q * se, t_two_sided_p(diff / se, df), "welch")


def proportion_diff(x_a: int, n_a: int, x_b: int, n_b: int) -> Diff:
    """Rate of b − rate of a (two-proportion z test)."""
    if n_a < 1 or n_b < 1:
        return NONE
    p_a, p_b = x_a / n_a, x_b / n_b
    diff = p_b - p_a
    se = math.sqrt(p_a * (1 - p_a) / n_a + p_b * (1 - p_b) / n_b)
    pooled = (x_a + x_b) / (n_a + n_b)
    se0 = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    p = 1.0 if se0 == 0 else 2 * normal_sf(abs(diff) / se0)
    return Diff(diff, diff - Z95 * se, diff + Z95 * se, p, "two-proportion z")


def bootstrap_diff(a, b, statistic=None, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = SEED) -> Diff:
    """statistic(b) − statistic(a), percentile bootstrap interval, seeded. ``statistic`` takes a
    2-D array (resamples × values) and returns one value per row; default the mean."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2:
        return NONE
    statistic = statistic or (lambda x: x.mean(axis=1))
    rng = np.random.default_rng(seed)
    estimate = float(statistic(b[None, :])[0] - statistic(a[None, :])[0])
    # Resample in chunks so a 20k-value side stays within a few tens of MB.
    diffs = []
    chunk = max(1, 2_000_000 // max(a.size, b.size))
    done = 0
    while done < resamples:
        k = min(chunk, resamples - done)
        ra = a[rng.integers(0, a.size, size=(k, a.size))]
        rb = b[rng.integers(0, b.size, size=(k, b.size))]
        diffs.append(statistic(rb) - statistic(ra))
        done += k
    d = np.concatenate(diffs)
    low, high = (float(v) for v in np.quantile(d, [ALPHA / 2, 1 - ALPHA / 2]))
    # Two-sided bootstrap p: twice the smaller share of resampled differences on either side of 0.
    p = min(1.0, 2 * min(float(np.mean(d <= 0)), float(np.mean(d >= 0))))
    if low == high == estimate == 0.0:
        p = 1.0
    return Diff(estimate, low, high, max(p, 1.0 / (resamples + 1)) if p < 1 else p, "bootstrap")


def quantile_statistic(q: float):
    return lambda x: np.quantile(x, q, axis=1)


def holm(diffs: list[Diff]) -> list[Diff]:
    """Holm-adjusted p-values for a family of comparisons (the variants against one baseline)."""
    indexed = [(d.p_value, i) for i, d in enumerate(diffs) if d.p_value is not None]
    m = len(indexed)
    adjusted: dict[int, float] = {}
    running = 0.0
    for rank, (p, i) in enumerate(sorted(indexed)):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return [Diff(d.estimate, d.low, d.high, d.p_value, d.method, adjusted.get(i)) for i, d in enumerate(diffs)]


def bootstrap_quantiles(a, b, qs: tuple[float, ...], *, resamples: int = BOOTSTRAP_RESAMPLES,
                        seed: int = SEED) -> list[Diff]:
    """The percentile bootstrap of quantile(b, q) − quantile(a, q) for each q, without resampling
    arrays: the q-quantile (nearest rank k = ⌈q·n⌉) of a resample of n values is the k-th order
    statistic of n draws from the sample, i.e. ``sorted[floor(U·n)]`` with U ~ Beta(k, n − k + 1)
    (the k-th order statistic of n uniforms). Exactly the bootstrap distribution, drawn in O(resamples)
    after one sort, so 20,000 values per side cost a few milliseconds."""
    a, b = np.sort(np.asarray(a, dtype=float)), np.sort(np.asarray(b, dtype=float))
    if a.size < 2 or b.size < 2:
        return [NONE for _ in qs]
    rng = np.random.default_rng(seed)

    def draws(x, q):
        n = x.size
        k = min(max(int(math.ceil(q * n)), 1), n)
        u = rng.beta(k, n - k + 1, size=resamples)
        return x[np.minimum((u * n).astype(np.int64), n - 1)]

    def nearest_rank(x, q):
        n = x.size
        return float(x[min(max(int(math.ceil(q * n)), 1), n) - 1])

    out = []
    for q in qs:
        col = draws(b, q) - draws(a, q)
        estimate = nearest_rank(b, q) - nearest_rank(a, q)
        low, high = (float(v) for v in np.quantile(col, [ALPHA / 2, 1 - ALPHA / 2]))
        p = min(1.0, 2 * min(float(np.mean(col <= 0)), float(np.mean(col >= 0))))
        if low == high == estimate == 0.0:
            p = 1.0
        out.append(Diff(estimate, low, high, max(p, 1.0 / (resamples + 1)) if p < 1 else p, "bootstrap"))
    return out
