"""Success of the privileged scripted oracle through the policy_only template, on real LIBERO.

    python bench/scripted_oracle.py [--family libero/object] [--tasks 0-9] [--seeds 0]

The policy is served over the openpi websocket protocol on loopback, exactly as a managed
`gap policy serve scripted` entry with `privileged_state: true` would be.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.graph_success import _ids  # noqa: E402  (after the path is set)


def main() -> int:
    from pytest_gap.policies.builtin import ScriptedPolicy
    from pytest_gap.policies.endpoint import PolicyEndpoint
    from pytest_gap.policies.server import PolicyServer
    from pytest_gap.producers.templates import template_dir
    from pytest_gap.sim.libero import make_env
    from pytest_gap.sim.libero_backend import resolve
    from pytest_gap.workflow.executor import run_workflow
    from pytest_gap.workflow.schema import load_workflow

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="libero/object")
    parser.add_argument("--tasks", default="0-9")
    parser.add_argument("--seeds", default="0")
    args = parser.parse_args()
    variation = resolve(*args.family.split("/"))
    template = load_workflow(template_dir("policy_only"), {"policy_id": "scripted"})
    wins = trials = 0
    t0 = time.perf_counter()
    with PolicyServer(ScriptedPolicy()).start() as server:
        endpoint = PolicyEndpoint(url=server.url, obs_format="gap", privileged=True)
        for task in _ids(args.tasks):
            with make_env(variation.suite, task) as env:
                for seed in _ids(args.seeds):
                    env.reset(seed, variation=variation)
                    result = run_workflow(template, env, policies={"scripted": endpoint})
                    wins, trials = wins + result.success, trials + 1
                    print(
                        f"task {task} seed {seed}: success={result.success} "
                        f"steps={result.steps} exit={result.exit_status}",
                        flush=True,
                    )
    print(
        f"{args.family}: scripted oracle success {wins}/{trials} = {wins / trials:.2f} "
        f"({time.perf_counter() - t0:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
