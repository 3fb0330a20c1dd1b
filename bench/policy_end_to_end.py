"""One learned network shared by several pytest workers, batched and unbatched: the wall time of
the same episodes end to end, side by side in one run.

    python bench/policy_end_to_end.py [--checkpoint examples/policies/checkpoints/late.pt]
        [--workers 4] [--tasks 0,1,2,3] [--seeds 40,41] [--max-steps 100] [--batch 8]
        [--rounds 1]

Two `gap policy serve torch` processes of the checkpoint run beside the sessions (1 torch thread
each), one with --max-batch-size 1 and one with --max-batch-size N (--max-wait-ms 5). Each
session is `pytest CONFIG -n WORKERS` on real LIBERO, policy_only, whose one policy is a `url:`
entry (`obs_format: gap`) naming one of the two servers, so all its workers' episodes reach one
model. Sessions alternate between the servers (`--rounds` times each): the machine's noise falls
on both. Printed per server: the session's wall time, the control steps its trials took and
their successes; then the ratio of wall times.

On 2 CPU cores every worker renders its own cameras in software, so episodes are render-bound
and the server is idle most of the time: the ratio says what batching buys *here*, end to end,
beside bench/policy_throughput.py's server-only figures, which say what it buys when the
server is the bottleneck (a GPU box with many workers).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.policy_throughput import serve  # noqa: E402


def config(url: str, args: argparse.Namespace, out: Path) -> dict:
    return {
        "policies": {"learned": {"url": url, "obs_format": "gap"}},
        "trials": {"max_steps": args.max_steps, "task_timeout_secs": 900},
        "benchmark": {
            "families": ["libero"],
            "variations": ["object"],
            "modes": ["policy_only"],
            "policies": ["learned"],
            "task_ids": [int(t) for t in args.tasks.split(",")],
            "seeds": [int(s) for s in args.seeds.split(",")],
            "num_workers": args.workers,
            "output_dir": str(out),
            "gate_threshold": 0.0,
            "mode_overrides": {"policy_only": {"template": "policy_only"}},
        },
    }


def session(url: str, args: argparse.Namespace, work: Path, name: str) -> dict:
    """One pytest session against `url`: its wall time and what its trials' records say."""
    out = work / name
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config(url, args, out)))
    command = [sys.executable, "-m", "pytest", str(path), "-n", str(args.workers), "-q"]
    command += ["-p", "no:cacheprovider"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"session {name} exited {done.returncode}:\n{done.stdout[-2000:]}")
    records = [json.loads(p.read_text()) for p in out.rglob("result.json")]
    return {
        "wall_s": wall,
        "trials": len(records),
        "steps": sum(r["steps"] for r in records),
        "successes": sum(bool(r["success"]) for r in records),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = ROOT / "examples/policies/checkpoints/late.pt"
    parser.add_argument("--checkpoint", type=Path, default=default)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tasks", default="0,1,2,3")
    parser.add_argument("--seeds", default="40,41")
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()

    servers = {
        "unbatched": serve(args.checkpoint, 1, 1),
        "batched": serve(args.checkpoint, args.batch, 1),
    }
    results: dict[str, list[dict]] = {name: [] for name in servers}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                for name, (_, url) in servers.items():
                    results[name].append(session(url, args, Path(tmp), f"{name}{r}"))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=10)
    print(
        f"{len(args.tasks.split(','))} tasks x {len(args.seeds.split(','))} seeds, "
        f"-n {args.workers}, max_steps {args.max_steps}, batch {args.batch}, "
        f"{os.cpu_count()} CPUs"
    )
    walls = {}
    for name, runs in results.items():
        walls[name] = sum(r["wall_s"] for r in runs) / len(runs)
        steps = sum(r["steps"] for r in runs) / len(runs)
        wins = sum(r["successes"] for r in runs)
        trials = sum(r["trials"] for r in runs)
        print(
            f"  {name:9s}  wall {walls[name]:6.1f} s  steps {steps:6.0f}  success {wins}/{trials}"
        )
    print(f"  batched / unbatched wall time: x{walls['batched'] / walls['unbatched']:.2f}")


if __name__ == "__main__":
    main()
