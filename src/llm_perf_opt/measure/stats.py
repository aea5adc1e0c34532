"""Summary statistics for repeated measurements: spread, percentiles and a 95% confidence interval (none below
`MIN_VALUES_FOR_CI` (3) values: the range is all there is). Its method is recorded in `Summary.ci_method`:

- `CI_LOG_T` when every value is positive (times, rates): a Student-t interval on the log values, mapped back (an
  interval for the geometric mean, at or below the arithmetic mean). Never below 0, asymmetric like timing noise,
  and exact-width for small n (a percentile bootstrap is too narrow at 3–5 passes).
- `CI_T_TRUNCATED` when the values are non-negative and some are 0 (log undefined): a Student-t interval of the
  mean with the lower bound raised to 0 (a non-negative mean cannot be below it, so coverage is unchanged).
- `CI_T` when some value is negative (a signed quantity): the plain Student-t interval of the mean.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from llm_perf_opt.records.common import Summary

# Two-sided 95% (0.975 quantile) critical values of Student's t, exact to 6 decimals.
_T95_EXACT: dict[int, float] = {
    1: 12.706205, 2: 4.302653, 3: 3.182446, 4: 2.776445, 5: 2.570582,
    6: 2.446912, 7: 2.364624, 8: 2.306004, 9: 2.262157, 10: 2.228139,
    11: 2.200985, 12: 2.178813, 13: 2.160369, 14: 2.144787, 15: 2.131450,
    16: 2.119905, 17: 2.109816, 18: 2.100922, 19: 2.093024, 20: 2.085963,
    21: 2.079614, 22: 2.073873, 23: 2.068658, 24: 2.063899, 25: 2.059539,
    26: 2.055529, 27: 2.051831, 28: 2.048407, 29: 2.045230, 30: 2.042272,
    40: 2.021075, 60: 2.000298, 120: 1.979930,
}  # fmt: skip
_Z975 = 1.959964  # normal limit (df -> infinity)
_SPARSE_DF: tuple[int, ...] = (30, 40, 60, 120)

MIN_VALUES_FOR_CI = 3
CI_LOG_T = "Student t on log values (geometric mean)"
CI_T_TRUNCATED = "Student t of the mean, truncated at 0"
CI_T = "Student t of the mean"


def t_critical_95(df: int) -> float:
    """Two-sided 95% critical value of Student's t with ``df`` degrees of freedom: exact for df 1..30, 40, 60 and
    120; between those (and from 120 to the normal limit) linear in 1/df, accurate to about 1e-4."""
    if isinstance(df, bool) or not isinstance(df, int | np.integer) or df < 1:
        raise ValueError(f"df must be an integer >= 1, got {df!r}")
    df = int(df)
    if df in _T95_EXACT:
        return _T95_EXACT[df]
    if df > _SPARSE_DF[-1]:
        lo_df, lo_t, hi_inv, hi_t = _SPARSE_DF[-1], _T95_EXACT[_SPARSE_DF[-1]], 0.0, _Z975
    else:
        i = bisect.bisect_left(_SPARSE_DF, df)
        lo_df, hi_df = _SPARSE_DF[i - 1], _SPARSE_DF[i]
        lo_t, hi_inv, hi_t = _T95_EXACT[lo_df], 1.0 / hi_df, _T95_EXACT[hi_df]
    lo_inv = 1.0 / lo_df
    frac = (lo_inv - 1.0 / df) / (lo_inv - hi_inv)
    return lo_t + frac * (hi_t - lo_t)


def confidence_interval_95(values: Sequence[float] | npt.NDArray[np.float64]) -> tuple[float, float, str] | None:
    """(low, high, method) of the 95% interval of finite `values` (see the module docstring); None below 3 values."""
    arr = np.asarray(values, dtype=np.float64)
    n = int(arr.size)
    if n < MIN_VALUES_FOR_CI:
        return None
    t = t_critical_95(n - 1)
    if np.all(arr > 0):
        logs = np.log(arr)
        centre, half = float(logs.mean()), t * float(logs.std(ddof=1)) / math.sqrt(n)
        return math.exp(centre - half), math.exp(centre + half), CI_LOG_T
    mean, half = float(arr.mean()), t * float(arr.std(ddof=1)) / math.sqrt(n)
    if np.all(arr >= 0):
        return max(mean - half, 0.0), mean + half, CI_T_TRUNCATED
    return mean - half, mean + half, CI_T


def summarize(values: Sequence[float], unit: str) -> Summary:
    """Summarise finite measurements (percentiles interpolated linearly); empty or non-finite input raises."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"expected a flat sequence of numbers, got shape {arr.shape}")
    n = int(arr.size)
    if n == 0:
        raise ValueError("cannot summarise an empty sequence")
    if not np.all(np.isfinite(arr)):
        raise ValueError("values must all be finite (no NaN or inf)")
    mean = float(arr.mean())
    std = float(arr.std(ddof=1)) if n > 1 else 0.0
    interval = confidence_interval_95(arr)
    ci_low, ci_high, ci_method = interval if interval is not None else (None, None, None)
    p50, p90 = (float(p) for p in np.percentile(arr, [50.0, 90.0]))
    return Summary(
        n=n,
        mean=mean,
        std=std,
        min=float(arr.min()),
        p50=p50,
        p90=p90,
        max=float(arr.max()),
        cv=std / abs(mean) if n > 1 and mean != 0 else None,
        ci95_low=ci_low,
        ci95_high=ci_high,
        unit=unit,
        ci_method=ci_method,
    )
