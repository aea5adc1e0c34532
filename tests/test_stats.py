"""Summary statistics and the Student-t table."""

from __future__ import annotations

import itertools
import math

import pytest

from llm_perf_opt.measure.stats import summarize, t_critical_95


def test_known_values() -> None:
    s = summarize([1, 2, 3, 4, 5], "ms")
    assert s.n == 5 and s.unit == "ms"
    assert s.mean == pytest.approx(3.0)
    assert s.std == pytest.approx(1.5811388, abs=1e-6)
    assert (s.min, s.max) == (1.0, 5.0)
    assert s.p50 == pytest.approx(3.0)
    assert s.p90 == pytest.approx(4.6)
    assert s.cv == pytest.approx(1.5811388 / 3, abs=1e-6)
    half = 2.776445 * math.sqrt(2.5) / math.sqrt(5)
    assert s.ci95_low == pytest.approx(3.0 - half, abs=1e-6)
    assert s.ci95_high == pytest.approx(3.0 + half, abs=1e-6)
    assert s.ci95_high - 3.0 == pytest.approx(1.963, abs=1e-3)


def test_order_does_not_matter() -> None:
    assert summarize([5, 1, 4, 2, 3], "ms") == summarize([1, 2, 3, 4, 5], "ms")


def test_single_value() -> None:
    s = summarize([7.5], "s")
    assert s.n == 1 and s.mean == 7.5 and s.std == 0.0
    assert s.p50 == s.p90 == s.min == s.max == 7.5
    assert s.cv is None
    assert s.ci95_low == s.ci95_high == 7.5


def test_zero_mean_has_no_cv() -> None:
    s = summarize([-1.0, 1.0], "x")
    assert s.mean == 0.0 and s.cv is None


def test_constant_values() -> None:
    s = summarize([2.0, 2.0, 2.0], "ms")
    assert s.std == 0.0 and s.cv == 0.0 and s.ci95_low == s.ci95_high == 2.0


def test_fields_are_python_floats() -> None:
    s = summarize([1.0, 2.0], "ms")
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
