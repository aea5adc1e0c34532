"""Summary statistics, their 95% intervals and the Student-t table."""

from __future__ import annotations

import itertools
import math

import pytest

from llm_perf_opt.measure.stats import CI_LOG_T, CI_T, CI_T_TRUNCATED, summarize, t_critical_95


def test_known_values() -> None:
    s = summarize([1, 2, 3, 4, 5], "ms")
    assert s.n == 5 and s.unit == "ms"
    assert s.mean == pytest.approx(3.0)
    assert s.std == pytest.approx(1.5811388, abs=1e-6)
    assert (s.min, s.max) == (1.0, 5.0)
    assert s.p50 == pytest.approx(3.0)
    assert s.p90 == pytest.approx(4.6)
    assert s.cv == pytest.approx(1.5811388 / 3, abs=1e-6)
    # Student t (df 4) on the logs: centre ln(120)/5, half-width 2.776445 * sd(logs) / sqrt(5).
    logs = [math.log(v) for v in (1, 2, 3, 4, 5)]
    centre = sum(logs) / 5
    sd = math.sqrt(sum((x - centre) ** 2 for x in logs) / 4)
    half = 2.776445 * sd / math.sqrt(5)
    assert s.ci_method == CI_LOG_T
    assert s.ci95_low == pytest.approx(math.exp(centre - half), abs=1e-6)
    assert s.ci95_high == pytest.approx(math.exp(centre + half), abs=1e-6)
    assert (s.ci95_low, s.ci95_high) == pytest.approx((1.1834, 5.7350), abs=1e-4)


def test_order_does_not_matter() -> None:
    assert summarize([5, 1, 4, 2, 3], "ms") == summarize([1, 2, 3, 4, 5], "ms")


def test_single_value_has_no_interval() -> None:
    s = summarize([7.5], "s")
    assert s.n == 1 and s.mean == 7.5 and s.std == 0.0
    assert s.p50 == s.p90 == s.min == s.max == 7.5
    assert s.cv is None
    assert s.ci95_low is None and s.ci95_high is None and s.ci_method is None


def test_two_values_have_no_interval() -> None:
    # The Student-t interval of these was -402.1 – 541.9 ms: two values say nothing beyond their range.
    s = summarize([24.6, 115.2], "ms")
    assert s.n == 2 and (s.min, s.max) == (24.6, 115.2)
    assert s.cv is not None and s.cv > 0
    assert s.ci95_low is None and s.ci95_high is None and s.ci_method is None


def test_three_values_have_an_interval() -> None:
    s = summarize([10.0, 11.0, 12.0], "ms")
    assert s.ci_method == CI_LOG_T
    assert s.ci95_low is not None and s.ci95_high is not None
    assert 0 < s.ci95_low < 10.0 and s.ci95_high > 12.0  # t(df 2) = 4.30: wider than the range


def test_ten_skewed_values_stay_positive() -> None:
    # One slow pass among ten fast ones (a vision projector): the Student-t interval of the mean went below 0.
    values = [0.17, 0.16, 0.18, 0.15, 0.17, 0.19, 0.16, 0.17, 0.18, 20.0]
    mean = sum(values) / 10
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 9)
    assert mean - 2.262157 * std / math.sqrt(10) < 0  # what the old interval did
    s = summarize(values, "ms")
    assert s.n == 10 and s.ci_method == CI_LOG_T
    assert s.ci95_low is not None and s.ci95_high is not None
    assert 0 < s.ci95_low < 0.17 < s.ci95_high


def test_zeros_truncate_the_mean_interval_at_zero() -> None:
    s = summarize([0.0, 0.0, 0.1, 3.0], "ms")
    assert s.ci_method == CI_T_TRUNCATED
    assert s.ci95_low == 0.0
    half = 3.182446 * s.std / 2
    assert s.ci95_high == pytest.approx(s.mean + half)


def test_signed_values_keep_the_plain_t_interval() -> None:
    s = summarize([-1.0, 0.5, 1.0, 2.5], "x")
    half = 3.182446 * s.std / 2
    assert s.ci_method == CI_T
    assert (s.ci95_low, s.ci95_high) == pytest.approx((s.mean - half, s.mean + half))


def test_zero_mean_has_no_cv() -> None:
    s = summarize([-1.0, 1.0], "x")
    assert s.mean == 0.0 and s.cv is None


def test_constant_values() -> None:
    s = summarize([2.0, 2.0, 2.0], "ms")
    assert s.std == 0.0 and s.cv == 0.0 and s.ci95_low == pytest.approx(2.0) and s.ci95_high == pytest.approx(2.0)


def test_fields_are_python_floats() -> None:
    s = summarize([1.0, 2.0, 4.0], "ms")
    for name in ("mean", "std", "min", "p50", "p90", "max", "ci95_low", "ci95_high"):
        assert type(getattr(s, name)) is float


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")]])
def test_empty_or_non_finite_raises(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        summarize(bad, "ms")


@pytest.mark.parametrize(
    ("df", "t"),
    [(1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (20, 2.086), (30, 2.042), (40, 2.021), (60, 2.000),
     (120, 1.980)],
)  # fmt: skip
def test_t_table(df: int, t: float) -> None:
    assert t_critical_95(df) == pytest.approx(t, abs=5e-4)


@pytest.mark.parametrize(
    # Exact quantiles (mpmath) for df off the table: interpolation in 1/df is good to ~1e-4.
    ("df", "t"),
    [(35, 2.030108), (50, 2.008559), (100, 1.983972), (200, 1.971896), (1000, 1.962339)],
)
def test_t_interpolated(df: int, t: float) -> None:
    assert t_critical_95(df) == pytest.approx(t, abs=1e-4)


def test_t_large_df_tends_to_normal() -> None:
    assert t_critical_95(10**9) == pytest.approx(1.96, abs=1e-3)
    assert t_critical_95(10**9) == pytest.approx(1.959964, abs=1e-6)


def test_t_is_monotone_decreasing() -> None:
    values = [t_critical_95(df) for df in range(1, 500)]
    assert all(a > b for a, b in itertools.pairwise(values))


@pytest.mark.parametrize("df", [0, -1])
def test_t_bad_df_raises(df: int) -> None:
    with pytest.raises(ValueError):
        t_critical_95(df)
