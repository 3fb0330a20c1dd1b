"""Simulation costs, measured side by side in one run.

Prints: env creation (first in a process, and warm) vs a pooled reset, control steps per second
with no camera / one camera / two cameras, and peak memory per env process. The target of the
connector: a pooled reset costs at most 1/3 of a fresh env creation plus reset.

    python bench/sim_costs.py [--suite libero_object] [--task 0] [--resets 10] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _memory_probe(suite: str, task: int) -> dict:
    """Create one env in a fresh process; report its RSS before and after and its peak."""
    code = (
        "import json, resource, sys; sys.path.insert(0, '.');"
        "from bench.sim_costs import _rss_mb;"
        "from pytest_gap.sim.libero import make_env, EnvOptions;"
        "import libero.libero.envs;"
        "base = _rss_mb();"
        f"env = make_env({suite!r}, {task}, EnvOptions(cameras=('agentview', 'wrist')));"
        "env.reset(0); env.step([0]*6 + [-1]);"
        "print(json.dumps({'base_mb': base, 'env_mb': _rss_mb(),"
        " 'peak_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _steps_per_s(env, n: int) -> float:
    env.reset(0)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(n):
        env.step(np.append(rng.uniform(-0.3, 0.3, 6), -1.0))
    return n / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="libero_object")
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument("--resets", type=int, default=10)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()

    from pytest_gap.sim.libero import EnvOptions, make_env

    t0 = time.perf_counter()
    env = make_env(args.suite, args.task)
    create_cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    env.reset(0)
    first_reset = time.perf_counter() - t0

    t0 = time.perf_counter()
    fresh = make_env(args.suite, args.task)
    create_warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    fresh.reset(0)
    fresh_reset = time.perf_counter() - t0
    # LIBERO's default reset rebuilds and recompiles the model; the connector's exact soft
    # reset is what the pool relies on. Timed on the raw env, which is then thrown away.
    fresh.raw.hard_reset = True
    t0 = time.perf_counter()
    fresh._control.reset()
    hard_reset = time.perf_counter() - t0
    fresh.close()

    resets = []
    for seed in range(1, args.resets + 1):
        env.step(np.append(np.full(6, 0.2), 1.0))  # leave the env dirty, as a trial would
        t0 = time.perf_counter()
        env.reset(seed)
        resets.append(time.perf_counter() - t0)
    pooled = float(np.median(resets))
    env.close()

    rates = {}
    for label, cams in (
        ("no camera", ()),
        ("one camera", ("agentview",)),
        ("two cameras", ("agentview", "wrist")),
    ):
        with make_env(args.suite, args.task, EnvOptions(cameras=cams)) as cam_env:
            rates[label] = _steps_per_s(cam_env, args.steps)

    mem = _memory_probe(args.suite, args.task)

    fresh_cold = create_cold + first_reset
    fresh_warm = create_warm + fresh_reset
    print(f"suite {args.suite} task {args.task}  (reset = init state + 10 settle steps)")
    print(f"env create, first in process   {create_cold:7.3f} s  + reset {first_reset:.3f} s")
    print(f"env create, warm process       {create_warm:7.3f} s  + reset {fresh_reset:.3f} s")
    print(f"pooled reset (median of {len(resets)})    {pooled:7.3f} s")
    print(f"LIBERO hard reset (no settle)   {hard_reset:7.3f} s   (what the pool avoids)")
    print(f"ratio pooled / (fresh create + reset), first in process: {pooled / fresh_cold:.3f}")
    print(
        f"ratio pooled / (fresh create + reset), warm process:     {pooled / fresh_warm:.3f}"
        "   target <= 0.333"
    )
    for label, rate in rates.items():
        print(f"control steps/s, {label:12s} {rate:7.1f}   (256x256, multisampling off)")
    print(f"ratio steps/s two cameras / no camera: {rates['two cameras'] / rates['no camera']:.3f}")
    print(
        f"memory: python+libero {mem['base_mb']:.0f} MB, with one env {mem['env_mb']:.0f} MB, "
        f"peak {mem['peak_mb']:.0f} MB (env adds {mem['env_mb'] - mem['base_mb']:.0f} MB)"
    )
    ok = pooled / fresh_warm <= 1 / 3
    print(f"target pooled reset <= 1/3 of fresh create + reset: {'MET' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
