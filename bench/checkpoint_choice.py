"""Two checkpoints of one training run told apart by the sequential A/B (`evaluate.choose`),
against the fixed-n design at the same error rate.

    python bench/checkpoint_choice.py [--config examples/policies/held_out.yaml]
        [--best examples/policies/checkpoints/early.pt]
        [--candidate examples/policies/checkpoints/late.pt]
        [--block-seeds 1] [--alpha 0.05] [--margin 0.05] [--power 0.8]

Both checkpoints run in this process (no websocket) on the config's tasks and held-out seeds,
pair by pair, and the session stops at the first complete block where the anytime-valid test
decides (pytest_gap/compare/sequential_ab.py). Printed:

- the verdict and the pairs it read, against the pairs the plan holds (what a fixed-n design on
  the same plan runs whatever the effect);
- each arm's success rate on the pairs it ran, with its 95% Wilson interval;
- the pairs a fixed-n one-sided McNemar test at the cell's alpha would need for this effect at
  `--power` (Connor 1987, from the discordant rates observed): the fixed design at the same
  type I error, sized knowing the effect beforehand, which a sequential test does not need.

Run from the repository root (the checkpoints' class is examples/policies/visuomotor.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def mcnemar_pairs(a_only: int, b_only: int, n: int, alpha: float, power: float) -> float:
    """Pairs a one-sided McNemar test at `alpha` needs to detect this discordance at `power`."""
    from scipy.stats import norm

    p_b, p_a = b_only / n, a_only / n
    psi, delta = p_a + p_b, abs(p_b - p_a)
    if delta == 0:
        return math.inf
    z_a, z_b = norm.ppf(1 - alpha), norm.ppf(power)
    return (z_a * math.sqrt(psi) + z_b * math.sqrt(max(psi - delta**2, 0.0))) ** 2 / delta**2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    policies = ROOT / "examples/policies"
    parser.add_argument("--config", type=Path, default=policies / "held_out.yaml")
    parser.add_argument("--best", type=Path, default=policies / "checkpoints/early.pt")
    parser.add_argument("--candidate", type=Path, default=policies / "checkpoints/late.pt")
    parser.add_argument("--block-seeds", type=int, default=1)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--margin", type=float, default=0.05)
    parser.add_argument("--power", type=float, default=0.8)
    parser.add_argument("--output-dir", type=Path, default=ROOT / "benchmark_runs/choice")
    args = parser.parse_args()

    from pytest_gap import evaluate
    from pytest_gap.policies.torch_policy import load_checkpoint, set_threads

    set_threads(1)
    started = time.perf_counter()
    choice = evaluate.choose(
        args.config,
        best=load_checkpoint(args.best),
        candidate=load_checkpoint(args.candidate),
        margin=args.margin,
        alpha=args.alpha,
        block_seeds=args.block_seeds,
        output_dir=args.output_dir,
    )
    seconds = time.perf_counter() - started
    summary = json.loads((choice.run_dir / "summary.json").read_text())
    states = summary["gate"]["ab"]["states"]
    print(f"verdict: {choice.verdict} ({seconds:.0f} s, run dir {choice.run_dir})")
    for label, line in choice.pairs.items():
        print(f"  {label}: {line}")
    print(f"trials: {choice.trials_run} run of {choice.trials_planned} planned (fixed-n)")
    for cell in summary["cells"]:
        s, n = cell["n_success"], cell["n_trials"]
        lo, hi = cell["success_ci_low"], cell["success_ci_high"]
        print(f"  {cell['row']}: {s}/{n} = {cell['success_rate']:.2f} [{lo:.2f},{hi:.2f}]")
    for label, state in states.items():
        needed = mcnemar_pairs(
            state["a_only"], state["b_only"], state["n"], state["alpha"], args.power
        )
        print(
            f"  {label}: fixed-n McNemar at alpha {state['alpha']:.3f}, power {args.power}: "
            f"{math.ceil(needed) if math.isfinite(needed) else 'inf'} pairs "
            f"(sequential read {state['n']}; a_only {state['a_only']}, "
            f"b_only {state['b_only']})"
        )


if __name__ == "__main__":
    main()
