"""The intervals and sample sizes of pytest_gap/intervals.py, against answers computed here
independently (closed forms, constructed data with a known truth)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from statistics import NormalDist

import pytest

from pytest_gap.intervals import (
    cluster_bootstrap,
    power_table,
    trials_per_arm,
    trials_to_decide,
    wilson,
)

Z = NormalDist().inv_cdf(0.975)
BENCHMARKS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def closed_form_wilson(k: float, n: float) -> tuple[float, float]:
    """Wilson (1927): (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)."""
    p = k / n
    centre = (p + Z**2 / (2 * n)) / (1 + Z**2 / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z**2 / (4 * n**2)) / (1 + Z**2 / n)
    return centre - half, centre + half


@pytest.mark.parametrize(("k", "n"), [(8, 10), (0, 10), (10, 10), (3, 7), (41, 50), (1, 1)])
def test_wilson_matches_the_closed_form(k, n):
    low, high = wilson(k, n)
    expected = closed_form_wilson(k, n)
    assert low == pytest.approx(max(expected[0], 0.0), abs=1e-12)
    assert high == pytest.approx(min(expected[1], 1.0), abs=1e-12)


def test_wilson_known_value_and_no_trials():
    assert wilson(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)  # published tables
    assert wilson(0, 0) is None


def _groups(task_rates: list[float], trials: int, rng: random.Random) -> list[list[float]]:
    return [[float(rng.random() < p) for _ in range(trials)] for p in task_rates]


def test_the_completion_interval_resamples_tasks_not_trials():
    """Same 100 trial values twice: once with five tasks that always complete and five that
    never do, once spread evenly over the tasks. Resampling trials sees the same multiset and
    gives the same interval both times; resampling tasks sees that the first set's rate rests
    on which tasks were drawn."""
    split = [[1.0] * 10] * 5 + [[0.0] * 10] * 5
    even = [[1.0] * k + [0.0] * (10 - k) for k in (4, 6, 5, 5, 4, 6, 5, 5, 4, 6)]
    assert sorted(v for g in split for v in g) == sorted(v for g in even for v in g)
    low_split, high_split = cluster_bootstrap(split)
    low_even, high_even = cluster_bootstrap(even)
    assert low_split < 0.5 < high_split and low_even <= 0.5 <= high_even
    # tasks: the split set's SE is sqrt(0.25/10) = 0.16 (width ~0.6); trials: sqrt(0.25/100)
    assert high_split - low_split > 0.45
    assert high_even - low_even < 0.15


def test_the_completion_interval_covers_the_true_mean_at_about_its_level():
    """Datasets of 12 tasks x 10 trials whose tasks are easy (0.9) or hard (0.1), half and half
    in expectation: the true completion rate is 0.5. The task-resampling interval covers it in
    most datasets; one that resampled trials would be three times too narrow and cover it in
    about half."""
    rng = random.Random(7)
    covered = 0
    for _ in range(200):
        rates = [rng.choice((0.1, 0.9)) for _ in range(12)]
        low, high = cluster_bootstrap(_groups(rates, 10, rng))
        covered += low <= 0.5 <= high
    assert 0.85 <= covered / 200 <= 1.0, covered


def test_the_completion_interval_degenerate_cases_give_points_or_none():
    assert cluster_bootstrap([]) is None
    assert cluster_bootstrap([[], []]) is None
    assert cluster_bootstrap([[0.7]]) == (0.7, 0.7)
    assert cluster_bootstrap([[1.0, 1.0], [1.0]]) == (1.0, 1.0)
    assert cluster_bootstrap([[0.5, 1.0], [1.0, 0.5]]) == (0.75, 0.75)  # alike tasks
    # One task: its trials are what can be resampled; the interval holds the mean, inside [0,1].
    one = [[1.0, 0.0, 1.0, 1.0, 0.5]]
    low, high = cluster_bootstrap(one)
    assert 0.0 <= low < 0.7 < high <= 1.0
    # Reproducible: a rebuilt summary gives the same interval.
    many = _groups([0.2, 0.8, 0.5], 6, random.Random(1))
    assert cluster_bootstrap(many) == cluster_bootstrap(many)


def _decided(k: float, n: float, threshold: float) -> bool:
    low, high = closed_form_wilson(k, n)
    return low >= threshold or high < threshold


@pytest.mark.parametrize(
    ("k", "n", "threshold"),
    [(8, 10, 0.6), (2, 10, 0.5), (24, 36, 0.6), (45, 50, 0.85)],
)
def test_trials_to_decide_is_the_fewest_further_trials_at_the_observed_rate(k, n, threshold):
    more = trials_to_decide(k, n, threshold)
    assert more > 0 and not _decided(k, n, threshold)
    rate = k / n
    assert _decided(round(rate * (n + more)), n + more, threshold)
    assert not _decided(round(rate * (n + more - 1)), n + more - 1, threshold)


def test_trials_to_decide_edges():
    assert trials_to_decide(9, 10, 0.3) == 0  # already decided: PASS
    assert trials_to_decide(0, 10, 0.5) == 0  # already decided: FAIL
    assert trials_to_decide(5, 10, 0.5) is None  # at the threshold: never
    assert trials_to_decide(10, 10, 1.0) is None  # Wilson's lower bound never reaches 1
    assert trials_to_decide(0, 0, 0.5) is None


@pytest.mark.parametrize(("base", "drop"), [(0.5, 0.05), (0.5, 0.10), (0.8, 0.20), (0.9, 0.1)])
def test_trials_per_arm_is_the_arcsine_sample_size(base, drop):
    """n = 2 ((z_{1-a/2} + z_{power}) / h)^2 with Cohen's h = 2 asin sqrt p1 - 2 asin sqrt p2."""
    h = 2 * math.asin(math.sqrt(base)) - 2 * math.asin(math.sqrt(base - drop))
    z_power = NormalDist().inv_cdf(0.8)
    expected = 2 * ((Z + z_power) / h) ** 2
    assert trials_per_arm(base, drop) == math.ceil(expected)


def test_a_known_sample_size_and_the_docs_table():
    # 0.5 vs 0.4 at 80% power: the classical two-proportion formula gives 387; arcsine 388.
    assert trials_per_arm(0.5, 0.10) == 388
    assert power_table() in BENCHMARKS_PAGE.read_text()


@pytest.mark.parametrize(
    ("k", "n"), [(0, 1), (1, 1), (8, 10), (3, 7), (41, 50), (0, 200), (199, 200)]
)
def test_wilson_is_scipys_wilson(k, n):
    """The harness computes Wilson without scipy (its import costs every session 1-2 s); it
    must be scipy's interval."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert wilson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_the_task_bootstrap_is_scipys_percentile_bootstrap_over_tasks():
    """The same resampling as scipy.stats.bootstrap over paired per-task (sum, count) with the
    ratio statistic: the intervals agree to Monte Carlo precision."""
    import numpy as np
    from scipy.stats import bootstrap

    rng = random.Random(3)
    groups = [[rng.random() * p for _ in range(rng.randint(2, 6))] for p in (0.1, 0.5, 0.9, 1.0)]
    groups += [[0.0, 0.2], [1.0, 1.0, 0.7]]
    sums = np.array([sum(g) for g in groups])
    counts = np.array([len(g) for g in groups], float)
    theirs = bootstrap(
        (sums, counts),
        lambda s, c, axis=-1: s.sum(axis=axis) / c.sum(axis=axis),
        paired=True,
        vectorized=True,
        n_resamples=9999,
        method="percentile",
        rng=np.random.default_rng(0),
    ).confidence_interval
    assert cluster_bootstrap(groups) == pytest.approx((theirs.low, theirs.high), abs=0.01)
