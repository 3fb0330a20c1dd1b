"""95% intervals on a run's rates, and how many trials a decision needs: pure functions.

- Success rates are proportions of independent trials: Wilson's score interval, which stays
  inside [0, 1] and keeps its coverage at 0 or n successes and small n, where the normal
  approximation does not.
- Completion rates are means of per-trial fractions, and trials of one task are alike (same
  scene, same prompt): they are not independent draws. The interval comes from a bootstrap
  that resamples whole tasks (the clusters) with all their trials, so a rate carried by a few
  easy tasks gets the wide interval it deserves. The seed is fixed: a summary rebuilt from the
  same records gives the same interval.
- `trials_to_decide` and `trials_per_arm` size a run: further trials at the observed rate that
  would let the Wilson gate decide, and trials per arm to see a difference at 80% power.

Both intervals are computed here with the standard library and numpy, not scipy: importing
scipy.stats costs 1-2 s, and every session's end (the summaries) would pay it. The test suite
checks them against scipy (`binomtest(...).proportion_ci(method="wilson")` and
`scipy.stats.bootstrap(method="percentile")` with the same ratio statistic). statsmodels only
sizes runs (`trials_per_arm`, for docs/benchmarks.md), never in a session.
"""

from __future__ import annotations

from collections.abc import Sequence

CONFIDENCE = 0.95
BOOTSTRAP_SEED = 20240915  # fixed: the same records always give the same interval
BOOTSTRAP_RESAMPLES = 9999
DECIDE_CAP = 10_000_000  # beyond this many further trials, a run will not decide it

Interval = tuple[float, float]


def wilson(k: int, n: int, confidence: float = CONFIDENCE) -> Interval | None:
    """Wilson score interval for `k` successes in `n` trials; None when n is 0. At 0 or n
    successes the bound is exactly 0 or 1 (as scipy sets it)."""
    if n <= 0:
        return None
    import math
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p, z2 = k / n, z * z
    center = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    low = 0.0 if k <= 0 else max(0.0, center - half)
    high = 1.0 if k >= n else min(1.0, center + half)
    return low, high


def cluster_bootstrap(
    groups: Sequence[Sequence[float]], confidence: float = CONFIDENCE
) -> Interval | None:
    """Percentile bootstrap interval for the mean of every value in `groups` (the trial-weighted
    mean), resampling whole groups (tasks) with replacement; None when there is no value.

    With one group there is nothing between tasks to resample: the trials of that task are
    resampled instead (the interval then says nothing about other tasks). When every value is
    the same, or when every group has the same mean, each resample gives the point itself: the
    interval is that point."""
    groups = [list(g) for g in groups if len(g)]
    values = [v for g in groups for v in g]
    if not values:
        return None
    mean = sum(values) / len(values)
    if len(groups) == 1:
        groups = [[v] for v in groups[0]]
    sums = [sum(g) for g in groups]
    counts = [len(g) for g in groups]
    if len({s / c for s, c in zip(sums, counts, strict=True)}) == 1:
        return mean, mean  # every resample's mean is the point

    import numpy as np

    # Each resample draws len(groups) whole groups with replacement: the mean over its trials
    # is the ratio of the drawn groups' sums to their counts.
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    drawn = rng.integers(0, len(groups), size=(BOOTSTRAP_RESAMPLES, len(groups)))
    means = np.asarray(sums, float)[drawn].sum(axis=1) / np.asarray(counts, float)[drawn].sum(
        axis=1
    )
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return float(low), float(high)


def decides(interval: Interval, threshold: float) -> bool:
    """The Wilson gate's test: the interval clears the threshold or falls below it."""
    low, high = interval
    return low >= threshold or high < threshold


def trials_to_decide(k: int, n: int, threshold: float) -> int | None:
    """How many further trials at the observed rate k/n (successes rounded to whole trials)
    make the Wilson interval decide against `threshold` (0 when it already does). None when no
    number can: nothing observed yet, a rate exactly at the threshold (a perfect rate against a
    threshold of 1.0 too: Wilson's lower bound never reaches 1), or more than DECIDE_CAP trials.

    The lower bound of a rate above the threshold rises, and the upper bound of one below it
    falls, as n grows at a fixed rate, so the total is found by bisection: the result decides,
    one trial fewer does not (rounding can make it off by a few from the very fewest)."""
    if n <= 0:
        return None
    rate = k / n
    if decides(wilson(k, n), threshold):
        return 0
    if rate == threshold:
        return None

    def decided(total: int) -> bool:
        return decides(wilson(round(rate * total), total), threshold)

    low, high = n, 2 * n  # not decided at `low`
    while not decided(high):
        if high - n > DECIDE_CAP:
            return None
        low, high = high, 2 * high
    while high - low > 1:  # not decided at `low`, decided at `high`
        middle = (low + high) // 2
        low, high = (low, middle) if decided(middle) else (middle, high)
    return high - n


def trials_per_arm(base: float, difference: float, power: float = 0.8, alpha: float = 0.05) -> int:
    """Trials per arm for a two-sided test of two independent proportions (`base` and
    `base - difference`, a regression of that size) to detect the difference with `power` at
    level `alpha` (Cohen's arcsine effect size, normal approximation; statsmodels).

    Paired trials (same tasks and seeds in both arms, McNemar) need fewer when the arms agree
    on most trials; this is the number without that help."""
    import math

    from statsmodels.stats.power import NormalIndPower
    from statsmodels.stats.proportion import proportion_effectsize

    effect = abs(float(proportion_effectsize(base, base - difference)))
    n = NormalIndPower().solve_power(
        effect_size=effect, power=power, alpha=alpha, ratio=1.0, alternative="two-sided"
    )
    return math.ceil(float(n))


def power_table(
    bases: Sequence[float] = (0.5, 0.8), differences: Sequence[float] = (0.05, 0.10, 0.20)
) -> str:
    """The table in docs/benchmarks.md: trials per arm at 80% power, alpha 0.05, per base rate."""
    header = "| base rate | " + " | ".join(f"drop {d:.2f}" for d in differences) + " |"
    rule = "|---|" + "---|" * len(differences)
    rows = [
        f"| {b:.2f} | " + " | ".join(str(trials_per_arm(b, d)) for d in differences) + " |"
        for b in bases
    ]
    return "\n".join([header, rule, *rows])
