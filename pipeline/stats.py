"""Latency statistics over repeated, interleaved windows: estimates with 95% intervals, and ratios.

Each rung × batch is timed in several windows, the rungs' windows interleaved in rounds (teacher,
student, INT8, teacher, …), so a busy period hits every rung of a round alike. The unit of
replication is the window, not the call: calls within one window share its clocks, temperature and
neighbours, and treating them as independent gives intervals far too narrow (a 10-second busy spell
is one event, not ten thousand). So:

- a percentile's estimate is the median over windows of each window's percentile, and its interval
  a percentile bootstrap over windows (resampling windows with replacement);
- a ratio between two rungs is bootstrapped over *rounds*, keeping each round's pair together
  (paired): what a busy round does to both cancels in their ratio, which is the point of interleaving.

With few windows the bootstrap's coverage is below its nominal 95%; the order-statistic interval for
a median ([min, max] of 5 windows covers 94%) would be exact but cannot give a ratio's interval, and
a ratio is what the report has to defend. The seed is fixed so a report is reproducible.

The resampling is SciPy's (:func:`scipy.stats.bootstrap`) with ``method="percentile"``, chosen on purpose:
with 3–8 windows BCa's jackknife acceleration of a median is unstable (and undefined when windows tie),
and the "basic" interval can reach below zero for a latency.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

LEVEL = 0.95
BOOTSTRAP = 4000
SEED = 20221125


def _percentile_bootstrap(samples: tuple[np.ndarray, ...], statistic, level: float) -> tuple[float, float]:
    """(low, high) of SciPy's percentile bootstrap; the samples are resampled together (paired)."""
    from scipy.stats import bootstrap  # lazily: SciPy is the build side's, through scikit-learn

    result = bootstrap(samples, statistic, n_resamples=BOOTSTRAP, vectorized=True, paired=True,
                       confidence_level=level, method="percentile", rng=np.random.default_rng(SEED))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def median_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(estimate, low, high): the median over windows and its bootstrap interval."""
    data = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    if len(data) == 0:
        return (float("nan"),) * 3
    estimate = float(np.median(data))
    if len(data) == 1:  # one window has no spread to resample
        return estimate, estimate, estimate
    return (estimate, *_percentile_bootstrap((data,), lambda x, axis: np.median(x, axis=axis), level))


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float],
                   level: float = LEVEL) -> tuple[float, float, float]:
    """(estimate, low, high) of median(numerator) / median(denominator), bootstrapped over paired rounds.

    ``numerator[i]`` and ``denominator[i]`` are the two rungs' windows of round ``i``; a round where
    either is missing is dropped.
    """
    pairs = np.asarray([(a, b) for a, b in zip(numerator, denominator)
                        if a is not None and b is not None and np.isfinite(a) and np.isfinite(b) and b > 0],
                       dtype=np.float64)
    if len(pairs) == 0:
        return (float("nan"),) * 3
    estimate = float(np.median(pairs[:, 0]) / np.median(pairs[:, 1]))
    if len(pairs) == 1:
        return estimate, estimate, estimate
    return (estimate, *_percentile_bootstrap(
        (pairs[:, 0], pairs[:, 1]), lambda a, b, axis: np.median(a, axis=axis) / np.median(b, axis=axis), level))


def cv(values: Sequence[float]) -> float | None:
    """Coefficient of variation across windows (sample standard deviation over the mean)."""
    data = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    if len(data) < 2 or data.mean() == 0:
        return None
    return float(data.std(ddof=1) / data.mean())


def significant(low: float, high: float) -> bool:
    """Whether a ratio's interval excludes 1 (otherwise: no measurable difference)."""
    return bool(np.isfinite(low) and np.isfinite(high) and (high < 1 or low > 1))


def binomial_interval(correct: int, total: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson's score interval of a proportion (``correct`` of ``total``): an accuracy's interval over its images."""
    from scipy import stats

    if total <= 0:
        return math.nan, math.nan
    z = float(stats.norm.ppf(0.5 + level / 2))
    p = correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(mean, low, high): Student's t interval of a mean over independent replicates (a benchmark's seeds); nan
    bounds with fewer than two, all nan with none."""
    from scipy import stats

    data = np.asarray(values, dtype=float)
    if len(data) == 0:
        return math.nan, math.nan, math.nan
    mean = float(data.mean())
    if len(data) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, len(data) - 1) * data.std(ddof=1) / math.sqrt(len(data)))
    return mean, mean - half, mean + half


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: ``only_a`` images right under A alone, ``only_b`` under B alone.

    Under "no difference" each disagreement is a fair coin: the exact binomial test of ``only_a`` of
    ``only_a + only_b`` at ½ (SciPy's ``binomtest``); 1 when the two never disagree.
    """
    from scipy.stats import binomtest

    n = only_a + only_b
    return 1.0 if n == 0 else float(binomtest(min(only_a, only_b), n, 0.5).pvalue)
