"""The sequential gate against the fixed-n gate, on simulated sessions: error rates, power and
trials used.

    python bench/sequential.py [--sims 10000] [--seeds 50] [--block-seeds 5] [--alpha 0.05]

One simulated session is one cell: 10 tasks whose success rates differ (task effects: the
logits of the task rates spread evenly over +-1 around a shift chosen so that their mean is the
cell's true rate), `--seeds` seeds per task, so N = 10 x seeds trials at most. The sequential
gate looks after each block of `--block-seeds` seeds of every task, with the product's own
per-look boundaries on the success count (pytest_gap/sequential.py `boundaries`: the e-values
against 1/alpha, and at the last look the exact test at the level the earlier looks left
unspent). The fixed-n design runs all N trials and applies the one-sided exact binomial test
at the same alpha in either direction (PASS when the rate is shown above the threshold, FAIL
when shown below).

Per setting (threshold, true rate) it prints:

    threshold | true rate | seq PASS | seq FAIL | seq undecided | fixed PASS | fixed FAIL |
    mean n | saved

- seq/fixed PASS and FAIL: fractions of sessions. At a true rate equal to the threshold both
  are errors (type I); below it a PASS is one, above it a FAIL is one.
- mean n: the sequential gate's mean scored trials; saved: 1 - mean n / N.

Checks, printed at the end (exit status 1 if one fails):
- type I error <= alpha + 3 Monte Carlo standard errors at every setting (PASS at or below the
  threshold, FAIL at or above it);
- where the true rate is 0.1 or more from the threshold: mean trials saved >= 35% on average,
  and the sequential power within 5 points of the fixed design's at every such setting.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit
from scipy.stats import binom

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_gap.sequential import boundaries  # noqa: E402

TASKS = 10
THRESHOLDS = (0.5, 0.7, 0.8, 0.9)
OFFSETS = (-0.3, -0.2, -0.1, -0.05, 0.0, 0.05, 0.1, 0.2, 0.3)
TRUE_RATES = (0.5, 0.95)  # the true rates simulated: within these bounds
TASK_SPREAD = 1.0  # task logits spread evenly over +-this around the shift


def task_rates(mean: float) -> np.ndarray:
    """TASKS rates whose logits are evenly spread around a shift, with the given mean."""
    spread = np.linspace(-TASK_SPREAD, TASK_SPREAD, TASKS)
    shift = brentq(lambda s: expit(spread + s).mean() - mean, -20, 20)
    return expit(spread + shift)


def simulate(rates: np.ndarray, seeds: int, k: int, bars, threshold, alpha, sims, rng) -> dict:
    blocks = math.ceil(seeds / k)
    sizes = [min(k, seeds - b * k) for b in range(blocks)]
    per_block = np.stack(
        [rng.binomial(size, rates, size=(sims, TASKS)).sum(1) for size in sizes], 1
    )
    cumulative = per_block.cumsum(1)
    looks = np.cumsum([size * TASKS for size in sizes])
    decided = np.zeros(sims, bool)
    verdict = np.zeros(sims, int)  # 1 PASS, -1 FAIL, 0 undecided
    used = np.full(sims, looks[-1])
    for b, (pass_at, fail_at) in enumerate(bars):
        s = cumulative[:, b]
        now_pass = ~decided & (s >= pass_at)
        now_fail = ~decided & (s <= fail_at)
        verdict[now_pass], verdict[now_fail] = 1, -1
        used[now_pass | now_fail] = looks[b]
        decided |= now_pass | now_fail
    total = cumulative[:, -1]
    n = looks[-1]
    fixed_pass = binom.sf(total - 1, n, threshold) <= alpha  # P(X >= total | threshold)
    fixed_fail = binom.cdf(total, n, threshold) <= alpha
    return {
        "seq_pass": (verdict == 1).mean(),
        "seq_fail": (verdict == -1).mean(),
        "undecided": (verdict == 0).mean(),
        "fixed_pass": fixed_pass.mean(),
        "fixed_fail": fixed_fail.mean(),
        "mean_n": used.mean(),
        "N": n,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=10_000)
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--block-seeds", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=0.05)
    args = parser.parse_args()
    rng = np.random.default_rng(20261205)
    k, alpha = args.block_seeds, args.alpha
    sizes = [(min(b + k, args.seeds) - b) * TASKS for b in range(0, args.seeds, k)]
    looks = list(np.cumsum(sizes))
    print(
        f"N = {TASKS} tasks x {args.seeds} seeds = {TASKS * args.seeds}; looks every {k} "
        f"seeds of every task ({len(looks)} looks); alpha = {alpha}; {args.sims} sessions "
        "per row"
    )
    print(
        "threshold | true rate | seq PASS | seq FAIL | seq undecided | fixed PASS | "
        "fixed FAIL | mean n | saved"
    )
    problems, far = [], []
    se = math.sqrt(alpha * (1 - alpha) / args.sims)
    for threshold in THRESHOLDS:
        bars = boundaries(sizes, threshold, alpha, final=True)
        for offset in OFFSETS:
            rate = round(threshold + offset, 3)
            if not TRUE_RATES[0] - 0.2 <= rate <= TRUE_RATES[1] or rate >= 1:
                continue
            r = simulate(task_rates(rate), args.seeds, k, bars, threshold, alpha, args.sims, rng)
            saved = 1 - r["mean_n"] / r["N"]
            print(
                f"{threshold:.2f} | {rate:.2f} | {r['seq_pass']:.4f} | {r['seq_fail']:.4f} | "
                f"{r['undecided']:.4f} | {r['fixed_pass']:.4f} | {r['fixed_fail']:.4f} | "
                f"{r['mean_n']:.1f} | {saved:.0%}"
            )
            if offset <= 0 and r["seq_pass"] > alpha + 3 * se:
                problems.append(f"false PASS {r['seq_pass']:.4f} at {threshold}/{rate}")
            if offset >= 0 and r["seq_fail"] > alpha + 3 * se:
                problems.append(f"false FAIL {r['seq_fail']:.4f} at {threshold}/{rate}")
            if abs(offset) >= 0.1 - 1e-9:
                power, fixed = (
                    (r["seq_pass"], r["fixed_pass"])
                    if offset > 0
                    else (r["seq_fail"], r["fixed_fail"])
                )
                far.append((saved, power, fixed, f"{threshold}/{rate}"))
    mean_saved = sum(f[0] for f in far) / len(far)
    print(
        f"\nwhere |true rate - threshold| >= 0.1: mean trials saved {mean_saved:.0%} "
        f"(target >= 35%) over {len(far)} settings"
    )
    worst = min(far, key=lambda f: f[1] - f[2])
    print(
        f"largest power loss against the fixed design: {worst[2] - worst[1]:+.3f} at "
        f"{worst[3]} (target <= 0.05)"
    )
    if mean_saved < 0.35:
        problems.append(f"mean saving {mean_saved:.0%} < 35%")
    problems += [
        f"power {p:.3f} vs fixed {f:.3f} at {where}" for _, p, f, where in far if f - p > 0.05
    ]
    print(
        "type I error: every row within alpha + 3 MC SE"
        if not any("false" in p for p in problems)
        else ""
    )
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
