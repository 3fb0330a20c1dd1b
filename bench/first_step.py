"""Seconds from starting `pytest` to the session's first control step.

    python bench/first_step.py [--rounds 3] [--workers 1] [--suite libero_object] [--task 0]

Each round starts a whole `python -m pytest bench.yaml` session (one policy_only trial of 5
control steps against `gap policy serve hold` on loopback, cameras as the policy asks) and
reads, from a probe plugin loaded into the measured processes (bench/first_step_probe.py), when
each stage was reached, counted from the moment before the process was started: imports done,
configured, collected, first env built, first reset done, first control step. With --workers N
the session runs under `-n N` and the first worker to step counts. Round 0 may pay one-off
costs (the OS file cache, numba's on-disk cache); the median of the rounds is printed.
Goal (issue 20): the first control step within 5 s of pytest starting.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.scaling import run_session
from bench.vs_vla_eval import _free_port, _serve_openpi

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 5.0
STAGES = ("imported", "configured", "collected", "env_built", "env_reset", "first_step")


def _config(args, url: str) -> dict:
    return {
        "policies": {"hold": {"url": url}},
        "trials": {"max_steps": 5},
        "benchmark": {
            "families": ["libero"],
            "variations": [args.variation],
            "modes": ["policy_only"],
            "policies": ["hold"],
            "task_ids": [args.task],
            "seeds": list(range(max(1, args.workers))),
            "gate_threshold": 0.0,
            "output_dir": "runs",
            "mode_overrides": {"policy_only": {"template": "policy_only_bare"}},
        },
    }


def _round(tmp: Path, workers: int, scene_cache: str) -> dict[str, float]:
    stamps = tmp / f"stamps-{time.monotonic_ns()}"
    stamps.mkdir()
    args = ["-p", "bench.first_step_probe", *(["-n", str(workers)] if workers > 1 else [])]
    done, t0, total = run_session(
        tmp, args, GAP_FIRST_STEP_DIR=str(stamps), GAP_SCENE_CACHE=scene_cache
    )
    if done.returncode not in (0, 1):
        sys.exit(f"session failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr}")
    seen = [json.loads(p.read_text()) for p in stamps.glob("*.json")]
    stepped = [s for s in seen if "first_step" in s]
    if not stepped:
        sys.exit(f"no process reached a control step:\n{done.stdout[-3000:]}")
    first = min(stepped, key=lambda s: s["first_step"])
    controller = min(seen, key=lambda s: s["imported"])
    out = {stage: first[stage] - t0 for stage in STAGES if stage in first}
    out["imported"] = controller["imported"] - t0
    out["session"] = total
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--variation", default="object", help="a libero family variation")
    parser.add_argument("--task", type=int, default=0)
    args = parser.parse_args()
    port = _free_port()
    server = _serve_openpi(port)
    sides = {"compiled": "off", "cached": ""}
    rows: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    try:
        with tempfile.TemporaryDirectory(prefix="gap-first-step-") as tmp:
            tmp = Path(tmp)
            sides["cached"] = str(tmp / "scene-cache")
            (tmp / "bench.yaml").write_text(yaml.safe_dump(_config(args, f"ws://127.0.0.1:{port}")))
            _round(tmp, args.workers, sides["cached"])  # fills the cache; not measured
            for i in range(args.rounds):
                order = list(sides) if i % 2 == 0 else list(reversed(sides))
                for side in order:
                    rows[side].append(_round(tmp, args.workers, sides[side]))
                    print(
                        f"round {i} {side:8s}: "
                        + "  ".join(f"{k} {v:5.2f}" for k, v in rows[side][-1].items())
                        + " s",
                        flush=True,
                    )
    finally:
        server.terminate()
        server.wait(10)
    print(
        f"libero/{args.variation} task {args.task}, one policy_only trial, "
        f"{'-n ' + str(args.workers) if args.workers > 1 else 'no xdist'}; "
        f"seconds since the pytest process started, median of {args.rounds} round(s)"
    )
    print(f"{'stage':12s} {'compiled':>9s} {'cached':>9s}")
    for stage in (*STAGES, "session"):
        medians = [
            statistics.median(r[stage] for r in rows[side] if stage in r)
            if any(stage in r for r in rows[side])
            else float("nan")
            for side in sides
        ]
        print(f"{stage:12s} {medians[0]:8.2f}s {medians[1]:8.2f}s")
    first = {side: statistics.median(r["first_step"] for r in rows[side]) for side in sides}
    print(
        f"first control step at {first['compiled']:.2f} s compiled, {first['cached']:.2f} s "
        f"with the scene cache ({first['compiled'] / first['cached']:.2f}x; goal <= {GOAL_S:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
