"""Wall time of one benchmark session under `pytest -n 1` vs `-n 2`, in one run.

    python bench/scaling.py [--tasks 2] [--seeds 2] [--steps 40] [--rounds 1]

Defaults: a policy_only grid on the libero backend, libero_object tasks 0..1 x seeds 0..1 (4
trials), 40 control steps each, the template policy_only_bare (replan every 5) against
`gap policy serve hold` on loopback (zero motion, gripper open; one server for both sessions).
Each side is a whole `python -m pytest CONFIG -n N` session (process start, collection, the
xdist workers' imports and env creation, summary and gate included), into its own run dir.
Rounds alternate which side goes first so that machine noise hits both. Goal (issue 20):
`-n 2` >= 1.7x `-n 1` (the ratio printed is wall(-n 1) / wall(-n 2)).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.vs_vla_eval import _free_port, _serve_openpi

ROOT = Path(__file__).resolve().parent.parent
GOAL = 1.7


def _config(args, url: str) -> dict:
    return {
        "policies": {"hold": {"url": url}},
        "trials": {"max_steps": args.steps},
        "benchmark": {
            "families": ["libero"],
            "variations": ["object"],
            "modes": ["policy_only"],
            "policies": ["hold"],
            "task_ids": list(range(args.tasks)),
            "seeds": list(range(args.seeds)),
            "gate_threshold": 0.0,
            "output_dir": "runs",
            "mode_overrides": {"policy_only": {"template": "policy_only_bare"}},
        },
    }


def run_session(
    tmp: Path, args: list[str], **environ: str
) -> tuple[subprocess.CompletedProcess, float, float]:
    """`python -m pytest bench.yaml ARGS` in `tmp`, this checkout importable, `environ` over
    this process's; (its outcome, when it started by the wall clock, its seconds)."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        **environ,
    )
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "bench.yaml", "-q", "-p", "no:cacheprovider", *args]
    started, t0 = time.time(), time.perf_counter()
    done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
    return done, started, time.perf_counter() - t0


def _session(tmp: Path, workers: int, trials: int) -> float:
    done, _, elapsed = run_session(tmp, ["-n", str(workers)])
    if done.returncode not in (0, 1):
        sys.exit(f"-n {workers} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr}")
    # A session whose trials crashed is fast and proves nothing: every trial must have run.
    run_dir = max((tmp / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    results = [json.loads(p.read_text()) for p in run_dir.rglob("result.json")]
    bad = [r["error"] for r in results if r.get("error") or r.get("infra_failure")]
    if len(results) != trials or bad:
        sys.exit(f"-n {workers}: {len(results)} of {trials} trials ran; errors {bad[:2]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2, help="libero_object tasks 0..N-1")
    parser.add_argument("--seeds", type=int, default=2, help="seeds 0..N-1 per task")
    parser.add_argument("--steps", type=int, default=40, help="control steps per episode")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    port = _free_port()
    server = _serve_openpi(port)
    walls: dict[int, list[float]] = {1: [], 2: []}
    try:
        with tempfile.TemporaryDirectory(prefix="gap-scaling-") as tmp:
            tmp = Path(tmp)
            (tmp / "bench.yaml").write_text(yaml.safe_dump(_config(args, f"ws://127.0.0.1:{port}")))
            for i in range(args.rounds):
                for workers in (1, 2) if i % 2 == 0 else (2, 1):
                    walls[workers].append(_session(tmp, workers, args.tasks * args.seeds))
                print(f"round {i}: -n 1 {walls[1][-1]:.1f} s   -n 2 {walls[2][-1]:.1f} s")
    finally:
        server.terminate()
        server.wait(10)
    one, two = statistics.median(walls[1]), statistics.median(walls[2])
    trials = args.tasks * args.seeds
    print(
        f"libero_object tasks 0..{args.tasks - 1} x seeds 0..{args.seeds - 1} = {trials} trials, "
        f"{args.steps} steps, policy_only_bare vs a hold server; median of {args.rounds} "
        f"round(s), whole pytest sessions; {os.cpu_count()} CPUs"
    )
    print(f"pytest -n 1  {one:7.1f} s  ({60 * trials / one:.2f} trials/min)")
    print(f"pytest -n 2  {two:7.1f} s  ({60 * trials / two:.2f} trials/min)")
    print(f"ratio -n 2 over -n 1 = {one / two:.2f}x  (goal >= {GOAL}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
