"""Wall time of N trials through `pytest` vs the same trials run directly through the runner.

    python bench/harness_overhead.py [--trials 8] [--rounds 2]

Both sides run the same benchmark config (libero_object task 0, the pick_place graph, seeds
0..N-1) in a fresh Python process, one trial after another, each into its own run dir:
- direct: `TrialRun.execute()` for each planned trial, one env pool, in one process;
- pytest: `python -m pytest CONFIG` (collection, items, reports, summary, gate).
Rounds alternate the two sides so machine noise hits both. Target (issue 4): ratio <= 1.10.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

DIRECT = """
import sys
from pathlib import Path
from pytest_gap.config import load_config
from pytest_gap.plan import all_trials, plan
from pytest_gap.run.trial import TrialRun
from pytest_gap.sim.pool import EnvPool

config_path, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
pool = EnvPool()
for trial in all_trials(plan(load_config(config_path))):
    TrialRun(trial, run_dir, nodeid=trial.id, config=str(config_path), pool=pool).execute()
"""


def _timed(cmd: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        sys.exit(
            f"{cmd[:4]} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gap-overhead-") as tmp:
        tmp = Path(tmp)
        config = tmp / "bench.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "trials": {"trials_per_generation": args.trials, "output_dir": "runs"},
                    "suites": [
                        {
                            "suite_name": "libero_object",
                            "task_ids": [0],
                            "workflow_dir": str(ROOT / "examples/workflows/pick_place"),
                        }
                    ],
                    "gate_threshold": 0.0,
                }
            )
        )
        direct, through_pytest = [], []
        direct_cmd = [sys.executable, "-c", DIRECT, str(config)]
        pytest_cmd = [sys.executable, "-m", "pytest", str(config), "-q", "-p", "no:cacheprovider"]
        for i in range(args.rounds):
            # alternate which side goes first, so a burst of machine load hits both alike
            if i % 2 == 0:
                direct.append(_timed([*direct_cmd, str(tmp / f"direct{i}")], tmp))
                through_pytest.append(_timed(pytest_cmd, tmp))
            else:
                through_pytest.append(_timed(pytest_cmd, tmp))
                direct.append(_timed([*direct_cmd, str(tmp / f"direct{i}")], tmp))
            print(f"round {i}: direct {direct[-1]:.1f} s   pytest {through_pytest[-1]:.1f} s")
    d, p = statistics.median(direct), statistics.median(through_pytest)
    print(f"{args.trials} trials, median of {args.rounds} rounds (process start included)")
    print(f"direct runner   {d:7.1f} s  ({d / args.trials:.2f} s/trial)")
    print(f"through pytest  {p:7.1f} s  ({p / args.trials:.2f} s/trial)")
    print(f"ratio pytest/direct = {p / d:.3f}   (target <= 1.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
