"""The baseline gate's sequential rule against its fixed rule, on simulated paired sessions:
false alarms, power and trials used.

    python bench/baseline_gate.py [--sims 10000] [--seeds 50] [--block-seeds 5]
                                  [--margin 0.05] [--alpha 0.05] [--rho 0.5]

One simulated session is one cell gated against its baseline: 10 tasks whose baseline success
rates differ (task effects: logits spread evenly over +-1 around a shift chosen so that their
mean is the baseline's rate), `--seeds` seeds per task, so N = 10 x seeds pairs at most. The
candidate's task rates are spread the same way around its own mean (baseline + diff). The two
trials of a pair are correlated as a scene is: with probability `--rho` both read one uniform
draw (the same episode is easy or hard for both), else independent draws.

- sequential (pytest_gap/baseline.py's rule, its `look_at` called at every look): after each
  block of `--block-seeds` seeds of every task, the e-values over the pairs so far
  (compare/noninferiority.py): FAIL when the one against "within the margin" reaches 2/alpha,
  PASS when the one against "worse by the margin or more" reaches 1/alpha; at the last look
  FAIL too when Tango's p < alpha/2; undecided at N passes (not shown worse).
- fixed: every pair, then Tango's score test at alpha (FAIL when p < alpha).

Per setting (baseline rate, diff = candidate - baseline) it prints the fraction of sessions
that FAIL under each rule, the sequential rule's early PASS, its mean pairs used and the
fraction saved (1 - mean n / N).

Checks, printed at the end (exit status 1 if one fails):
- false alarms: where the candidate is at most `margin` worse (diff >= -margin: the null), the
  sequential FAIL rate <= alpha + 3 Monte Carlo standard errors, at every setting;
- where diff <= -margin - 0.1 or diff >= 0 (a clear regression, or none), mean pairs saved;
- power (FAIL where diff <= -margin - 0.1): the sequential rule's against the fixed rule's.
The issue's targets (35% fewer trials, power within 5 points of the fixed design) are printed
beside what was measured; the paired test is judged on them, not tuned to them.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.sequential import task_rates  # noqa: E402
from pytest_gap.baseline import look_at  # noqa: E402
from pytest_gap.compare.noninferiority import tango_p  # noqa: E402

TASKS = 10
BASELINE_RATES = (0.6, 0.8, 0.9)
DIFFS = (0.05, 0.0, -0.05, -0.1, -0.15, -0.2, -0.3)

look = functools.lru_cache(maxsize=None)(look_at)
tango = functools.lru_cache(maxsize=None)(tango_p)


def simulate(base: float, diff: float, args, rng) -> dict:
    """Both rules on `args.sims` sessions of one setting."""
    rates_a, rates_b = task_rates(base), task_rates(base + diff)
    shape = (args.sims, args.seeds, TASKS)
    shared = rng.random(shape)
    own = rng.random(shape)
    a = shared < rates_a
    b = np.where(rng.random(shape) < args.rho, shared, own) < rates_b
    a_only = (a & ~b).sum(axis=2)  # per (session, seed): summed over tasks
    b_only = (b & ~a).sum(axis=2)
    k = args.block_seeds
    fail = early_pass = used = 0
    for s in range(args.sims):
        ca, cb = np.cumsum(a_only[s]), np.cumsum(b_only[s])
        n = 0
        for seeds in range(k, args.seeds + 1, k):
            n = seeds * TASKS
            last = seeds + k > args.seeds
            x, y = int(ca[seeds - 1]), int(cb[seeds - 1])
            verdict = look(x, y, n, args.margin, args.alpha, last=last)[0]
            if verdict != "UNDECIDED":
                fail += verdict == "FAIL"
                early_pass += verdict == "PASS" and not last
                break
        used += n
    n_max = args.seeds * TASKS
    fixed_fail = sum(
        tango(int(a_only[s].sum()), int(b_only[s].sum()), n_max, args.margin) < args.alpha
        for s in range(args.sims)
    )
    mean_n = used / args.sims
    return {
        "seq_fail": fail / args.sims,
        "seq_pass_early": early_pass / args.sims,
        "fixed_fail": fixed_fail / args.sims,
        "mean_n": mean_n,
        "saved": 1 - mean_n / n_max,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=10000)
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--block-seeds", type=int, default=5)
    parser.add_argument("--margin", type=float, default=0.05)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--rho", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    n_max = args.seeds * TASKS
    print(
        f"{args.sims} sessions per setting, {TASKS} tasks x {args.seeds} seeds = {n_max} pairs, "
        f"blocks of {args.block_seeds} seeds, margin {args.margin}, alpha {args.alpha}, "
        f"rho {args.rho}"
    )
    print("baseline | diff  | seq FAIL | seq PASS early | fixed FAIL | mean n | saved")
    rows = []
    for base in BASELINE_RATES:
        for diff in DIFFS:
            if not 0.02 <= base + diff <= 0.98:
                continue
            found = simulate(base, diff, args, rng)
            rows.append((base, diff, found))
            print(
                f"{base:8.2f} | {diff:+.2f} | {found['seq_fail']:8.4f} | "
                f"{found['seq_pass_early']:14.4f} | {found['fixed_fail']:10.4f} | "
                f"{found['mean_n']:6.1f} | {found['saved']:5.1%}"
            )
    se = 3 * math.sqrt(args.alpha * (1 - args.alpha) / args.sims)
    ok = True
    nulls = [(b, d, f) for b, d, f in rows if d >= -args.margin - 1e-9]
    worst = max(f["seq_fail"] for _, _, f in nulls)
    held = worst <= args.alpha + se
    ok &= held
    print(
        f"false alarms (diff >= -margin): worst sequential FAIL rate {worst:.4f} <= "
        f"alpha + 3 SE = {args.alpha + se:.4f}: {'yes' if held else 'NO'}"
    )
    clear = [f for _, d, f in rows if d <= -args.margin - 0.1 + 1e-9 or d >= 0]
    saved = sum(f["saved"] for f in clear) / len(clear)
    print(
        f"pairs saved where the answer is clear (diff <= {-args.margin - 0.1:+.2f} or >= 0): "
        f"{saved:.1%} on average (issue target: 35%)"
    )
    regressions = [f for _, d, f in rows if d <= -args.margin - 0.1 + 1e-9]
    gap = max(f["fixed_fail"] - f["seq_fail"] for f in regressions)
    print(
        f"power (FAIL where diff <= {-args.margin - 0.1:+.2f}): at most {gap * 100:.1f} points "
        "below the fixed rule's (issue target: within 5)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
