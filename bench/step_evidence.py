"""What per-step evidence (sim/step_log.py) costs a policy trial: the same steps with the log and
without it, side by side in one process, on real LIBERO.

    python bench/step_evidence.py [--suite libero_object] [--task 0] [--steps 100] [--rounds 8]
                                  [--cameras]

Two measurements, each alternating with and without the log round by round (the machine's
noise falls on both alike):

- steps:   `--steps` control steps of one action through `SkillContext.act`, the call every
           skill and run_policy step goes through (the log's cost against the cheapest step:
           physics alone, or with `--cameras` the agentview render a recording trial adds);
- episode: the policy_only template (bring-up, then run_policy) against a replaying policy
           server on loopback, `--steps` long, the steps file written at the end as a trial
           writes it.

Prints each one's median time per step with and without, the difference in percent, and the
time spent in the log's own calls (start, record, write: timed inside them) as a share of the
step without it: that share is the cost, the difference its check under the machine's noise.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from pytest_gap.policies.builtin import ReplayPolicy
from pytest_gap.policies.endpoint import PolicyEndpoint
from pytest_gap.policies.server import PolicyServer
from pytest_gap.producers.templates import template_dir
from pytest_gap.sim.backend import EnvOptions
from pytest_gap.sim.libero import make_env
from pytest_gap.sim.step_log import STEPS_FILE, StepLog
from pytest_gap.skills.context import SkillContext
from pytest_gap.workflow.executor import run_workflow
from pytest_gap.workflow.schema import load_workflow


def _actions(n: int) -> np.ndarray:
    """A wandering hand that opens and closes: the contact and distance queries see work."""
    t = np.arange(n)
    actions = np.zeros((n, 7), np.float32)
    actions[:, 0] = 0.3 * np.sin(t / 9)
    actions[:, 1] = 0.3 * np.cos(t / 11)
    actions[:, 2] = -0.2 * np.sin(t / 13)
    actions[:, 6] = np.where((t // 20) % 2, 1.0, -1.0)
    return actions


class TimedLog(StepLog):
    """A StepLog that also sums the time of its own calls (start, record, write)."""

    spent = 0.0

    def _timed(self, fn, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.spent += time.perf_counter() - t0

    def start(self, state):
        return self._timed(super().start, state)

    def record(self, **fields):
        return self._timed(super().record, **fields)

    def write(self, path):
        return self._timed(super().write, path)


def _steps(env, actions: np.ndarray, logged: bool, seed: int, own: list[float]) -> float:
    env.reset(seed)
    log = TimedLog.of(env) if logged else None
    ctx = SkillContext(env, step_log=log)
    t0 = time.perf_counter()
    for action in actions:
        ctx.act(action)
    spent = (time.perf_counter() - t0) / len(actions)
    if log is not None:
        own.append(log.spent / len(actions))
    return spent


def _episode(env, server_url: str, logged: bool, seed: int, out: Path, own: list) -> float:
    env.reset(seed)
    log = TimedLog.of(env) if logged else None
    template = load_workflow(template_dir("policy_only"), {"policy_id": "p"})
    endpoint = PolicyEndpoint(url=server_url, obs_format="gap")
    t0 = time.perf_counter()
    run = run_workflow(template, env, policies={"p": endpoint}, step_log=log)
    if log is not None:
        log.write(out / STEPS_FILE)
        own.append(log.spent / run.steps)
    return (time.perf_counter() - t0) / run.steps


def _report(name: str, with_log: list[float], without: list[float], own: list[float]) -> None:
    on, off = statistics.median(with_log), statistics.median(without)
    mine = statistics.median(own)
    print(
        f"{name:8s} per step: {1000 * off:7.2f} ms without the log, {1000 * on:7.2f} ms with it"
        f" ({100 * (on / off - 1):+.2f}%, median of {len(with_log)} rounds each); the log's own"
        f" calls {1e6 * mine:6.1f} us a step = {100 * mine / off:.2f}% of the step"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="libero_object")
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--cameras", action="store_true", help="render agentview every step")
    args = parser.parse_args()
    cameras = ("agentview",) if args.cameras else ()
    actions = _actions(args.steps)
    options = EnvOptions(cameras=cameras, max_steps=args.steps)
    with make_env(args.suite, args.task, options) as env, tempfile.TemporaryDirectory() as tmp:
        timings: dict[str, dict[bool, list[float]]] = {
            "steps": {True: [], False: []},
            "episode": {True: [], False: []},
        }
        own: dict[str, list[float]] = {"steps": [], "episode": []}
        _steps(env, actions[:10], True, 0, [])  # warm caches and the renderer once
        with PolicyServer(ReplayPolicy(actions)).start() as server:
            for r in range(args.rounds):
                order = (True, False) if r % 2 else (False, True)
                for logged in order:
                    spent = _steps(env, actions, logged, r, own["steps"])
                    timings["steps"][logged].append(spent)
                for logged in order:
                    spent = _episode(env, server.url, logged, r, Path(tmp), own["episode"])
                    timings["episode"][logged].append(spent)
        print(
            f"{args.suite} task {args.task}, {args.steps} steps, cameras: "
            f"{', '.join(cameras) or 'none'}"
        )
        for name, by in timings.items():
            _report(name, by[True], by[False], own[name])


if __name__ == "__main__":
    main()
