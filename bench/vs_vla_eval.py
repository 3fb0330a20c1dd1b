"""Episodes per minute: this harness vs vla-eval's own LIBERO loop, on identical episodes.

    python bench/vs_vla_eval.py [--suite libero_object] [--task 0] [--episodes 2] [--steps 100]
        [--no-warmup]

Defaults: libero_object task 0, seeds 0..1 (init states 0 and 1), 100 control steps per
episode (a whole libero_object episode is 280; pass --steps 280 for it). Each side runs the
same policy_only trials (same suite, task, init state index, step limit, 10 settle steps), both
cameras at 256x256 with 4x multisampling, against a fixed-action server on loopback (zero motion,
gripper open), in its own fresh process:

- ours, default: the libero backend, template policy_only_bare (replan every 5) against
  `gap policy serve hold` (openpi protocol, 10-action chunks): one observation per 5 steps;
- ours, every step: the same with replan_every 1: one observation per step;
- ours, vla-eval server: the libero backend against the vla-eval side's server (vla-eval
  protocol, one action per observation, PNG images): one observation per step;
- vla-eval: `benchmark.backend: vla-eval` (vla-eval 0.8.0's LIBEROBenchmark, Connection and
  SyncEpisodeRunner in-process) against a vla-eval PredictModelServer: one observation per step,
  vla-eval's own (and only) protocol.

Each side first runs one unmeasured warm-up trial (imports, env creation, the server's first
inference), then the measured ones; seconds are the trials' own wall time (`TrialResult.wall_s`).
The per-step breakdown comes from timers this script wraps around a few functions in the side's
process (nothing in pytest_gap is instrumented): physics (LiberoEnv.step, less any render in it),
render (SceneRenderer.rgb), policy round trip (the policy clients' infer), harness (the rest:
reset and settle steps, workflow, trace and result files; for vla-eval, its per-episode scene
rebuild too).
Goals (issue 20): >= 3x vla-eval at one observation per step, >= 6x at default protocols.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
GOAL_EQUAL, GOAL_DEFAULT = 3.0, 6.0
TEMPLATE = ROOT / "pytest_gap/templates/policy_only_bare"

# name, backend, policy, replan_every (None: the backend's own loop), query rate
SIDES = (
    ("ours, default", "libero", "hold", 5, "1 obs / 5 steps"),
    ("ours, every step", "libero", "hold", 1, "1 obs / step"),
    ("ours, vla-eval server", "libero", "vla", 5, "1 obs / step"),
    ("vla-eval", "vla-eval", "vla", None, "1 obs / step"),
)


# -- servers ----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_port(proc: subprocess.Popen, port: int, what: str, health: bool) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if health:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    return
            else:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                sys.exit(f"{what} did not come up on port {port}")
            time.sleep(0.2)


def _serve_openpi(port: int) -> subprocess.Popen:
    gap = shutil.which("gap", path=str(Path(sys.executable).parent))
    cmd = [gap] if gap else [sys.executable, "-m", "pytest_gap.cli"]
    proc = subprocess.Popen(
        [*cmd, "policy", "serve", "hold", "--port", str(port)], stdout=subprocess.DEVNULL
    )
    _wait_port(proc, port, "gap policy serve hold", health=True)
    return proc


def _serve_vla_eval(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-vla-eval", str(port)], stdout=subprocess.DEVNULL
    )
    _wait_port(proc, port, "the vla-eval model server", health=False)
    return proc


def serve_vla_eval(port: int) -> None:
    """A vla-eval model server (vla-eval's own classes) answering one fixed action per
    observation: zero motion, gripper open. Asks for the wrist image and the state, so both
    cameras cross the wire (as vla-eval's pi0 server asks)."""
    import anyio
    import numpy as np
    from vla_eval.model_servers.predict import PredictModelServer
    from vla_eval.model_servers.serve import serve_async

    class Fixed(PredictModelServer):
        def get_observation_params(self):
            return {"send_wrist_image": True, "send_state": True}

        def predict(self, obs, ctx):
            action = np.zeros(7, np.float32)
            action[6] = -1.0
            return {"actions": action}

    async def main():
        async with anyio.create_task_group() as tg:
            await tg.start(serve_async, Fixed(), "127.0.0.1", port)

    anyio.run(main)


# -- one side, in its own process -------------------------------------------------------------
class Timers:
    """Exclusive wall time per label: time inside a nested timed call counts to the inner
    label only (a render inside a step is render, not physics)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[float] = []  # time spent in children of each open call

    def _done(self, label: str, t0: float) -> None:
        elapsed = time.perf_counter() - t0
        children = self._stack.pop()
        if self._stack:
            self._stack[-1] += elapsed
        self.seconds[label] = self.seconds.get(label, 0.0) + elapsed - children
        self.calls[label] = self.calls.get(label, 0) + 1

    def wrap(self, owner, name: str, label: str) -> None:
        fn = getattr(owner, name)
        if inspect.iscoroutinefunction(fn):  # vla-eval's Connection.act

            @functools.wraps(fn)
            async def timed_async(*args, **kwargs):
                t0 = time.perf_counter()
                self._stack.append(0.0)
                try:
                    return await fn(*args, **kwargs)
                finally:
                    self._done(label, t0)

            setattr(owner, name, timed_async)
            return

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            self._stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                self._done(label, t0)

        setattr(owner, name, timed)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def run_side(config_path: Path, out_path: Path, warmup: bool) -> None:
    from pytest_gap.config import load_config
    from pytest_gap.plan import all_trials, plan
    from pytest_gap.policies.client import PolicyClient, VlaEvalClient
    from pytest_gap.run.trial import TrialRun
    from pytest_gap.servers.registry import endpoints_for
    from pytest_gap.sim.libero import LiberoEnv
    from pytest_gap.sim.pool import EnvPool
    from pytest_gap.sim.render import SceneRenderer

    timers = Timers()
    timers.wrap(LiberoEnv, "step", "physics")
    timers.wrap(SceneRenderer, "rgb", "render")
    timers.wrap(PolicyClient, "infer", "policy")
    timers.wrap(VlaEvalClient, "infer", "policy")
    config = load_config(config_path)
    if config.benchmark.backend == "vla-eval":
        from vla_eval.benchmarks.libero.benchmark import LIBEROBenchmark
        from vla_eval.connection import Connection

        timers.wrap(LIBEROBenchmark, "step", "physics+render")  # OffScreenRenderEnv renders
        timers.wrap(LIBEROBenchmark, "make_obs", "physics+render")
        timers.wrap(Connection, "act", "policy")
    trials = all_trials(plan(config))
    endpoints = endpoints_for(config)
    pool = EnvPool()
    run_dir = config_path.parent / f"runs-{config_path.stem}"
    rows = []
    try:
        if warmup:  # unmeasured: imports, env creation, the server's first inference, alike
            TrialRun(
                trials[0], run_dir / "warmup", nodeid="warmup", config=str(config_path),
                pool=pool, policies=endpoints,
            ).execute()  # fmt: skip
        timers.reset()
        for trial in trials:
            result = TrialRun(
                trial, run_dir, nodeid=trial.id, config=str(config_path),
                pool=pool, policies=endpoints,
            ).execute()  # fmt: skip
            if result.errored or result.infra_failure:
                sys.exit(f"{config_path.stem}: trial {trial.id} failed: {result.error}")
            rows.append({"seed": trial.seed, "steps": result.steps, "wall_s": result.wall_s})
    finally:
        pool.close()
    out_path.write_text(json.dumps({"trials": rows, "timers": timers.seconds}))


# -- the comparison ---------------------------------------------------------------------------
def _config(tmp: Path, args, backend: str, policy: str, replan: int | None, urls: dict) -> dict:
    benchmark = {
        "backend": backend,
        "families": ["libero"],
        "variations": [args.suite.removeprefix("libero_")],
        "modes": ["policy_only"],
        "policies": [policy],
        "task_ids": [args.task],
        "seeds": list(range(args.episodes)),
        "gate_threshold": 0.0,
        "output_dir": "runs",
    }
    if replan is not None:  # the libero backend's twin of vla-eval's loop, at this query rate
        workflow = json.loads((TEMPLATE / "workflow.json").read_text())
        workflow["nodes"]["policy"]["inputs"]["replan_every"] = replan
        wf_dir = tmp / f"policy_only_replan{replan}"
        wf_dir.mkdir(exist_ok=True)
        (wf_dir / "workflow.json").write_text(json.dumps(workflow))
        benchmark["mode_overrides"] = {"policy_only": {"workflow_dir": str(wf_dir)}}
    return {
        "policies": {
            "hold": {"url": urls["hold"]},
            "vla": {"url": urls["vla"], "protocol": "vla-eval"},
        },
        "trials": {"max_steps": args.steps},
        "benchmark": benchmark,
    }


def _run(tmp: Path, name: str, config: dict, warmup: bool) -> dict:
    stem = name.replace(", ", "_").replace(" ", "_").replace("-", "_")
    path = tmp / f"{stem}.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp / f"{stem}.json"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    cmd = [sys.executable, __file__, "--side", str(path), str(out)]
    done = subprocess.run(
        cmd + ([] if warmup else ["--no-warmup"]), cwd=tmp, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"{name} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="libero_object")
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument("--episodes", type=int, default=2, help="seeds 0..N-1 (init states)")
    parser.add_argument("--steps", type=int, default=100, help="control steps per episode")
    parser.add_argument(
        "--no-warmup",
        action="store_true",
        help="count the first trial's env creation and first inference (smoke runs)",
    )
    parser.add_argument("--serve-vla-eval", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--side", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_vla_eval:
        serve_vla_eval(args.serve_vla_eval)
        return 0
    if args.side:
        run_side(Path(args.side[0]), Path(args.side[1]), warmup=not args.no_warmup)
        return 0

    ports = {"hold": _free_port(), "vla": _free_port()}
    servers = [_serve_openpi(ports["hold"]), _serve_vla_eval(ports["vla"])]
    urls = {"hold": f"ws://127.0.0.1:{ports['hold']}", "vla": f"ws://127.0.0.1:{ports['vla']}"}
    results = {}
    try:
        with tempfile.TemporaryDirectory(prefix="gap-vs-vla-eval-") as tmp:
            tmp = Path(tmp)
            for name, backend, policy, replan, _ in SIDES:
                t0 = time.perf_counter()
                results[name] = _run(
                    tmp, name, _config(tmp, args, backend, policy, replan, urls), not args.no_warmup
                )
                print(f"ran {name:24s} in {time.perf_counter() - t0:6.1f} s", flush=True)
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(10)

    print(
        f"\n{args.suite} task {args.task}, seeds 0..{args.episodes - 1} (init states "
        f"0..{args.episodes - 1}), {args.steps} control steps, 2 cameras 256x256: the same "
        "episodes on every side; fixed-action servers on loopback; "
        + ("no warm-up" if args.no_warmup else "one warm-up trial per side not counted")
    )
    print(f"{'side':24s} {'query rate':16s} {'episodes':>8s} {'seconds':>8s} {'ep/min':>7s}")
    rate = {}
    for name, *_, query in SIDES:
        rows = results[name]["trials"]
        seconds = sum(r["wall_s"] for r in rows)
        rate[name] = 60 * len(rows) / seconds
        steps = {r["steps"] for r in rows}
        print(
            f"{name:24s} {query:16s} {len(rows):8d} {seconds:8.1f} {rate[name]:7.2f}"
            f"   steps {sorted(steps)}"
        )
    base = rate["vla-eval"]
    equal, default = rate["ours, every step"] / base, rate["ours, default"] / base
    print(f"ratio at equal query rate (1 obs/step), ours / vla-eval = {equal:.2f}x  (goal >= 3x)")
    print(
        f"ratio same server (vla-eval protocol), ours / vla-eval = "
        f"{rate['ours, vla-eval server'] / base:.2f}x"
    )
    print(f"ratio at default protocols, ours / vla-eval = {default:.2f}x  (goal >= 6x)")

    print("\nper-step breakdown (ms per control step, measured trials):")
    labels = ("physics", "render", "physics+render", "policy")
    print(f"{'side':24s} " + " ".join(f"{k:>14s}" for k in (*labels, "harness", "total")))
    for name, *_ in SIDES:
        rows, timers = results[name]["trials"], results[name]["timers"]
        steps = sum(r["steps"] for r in rows)
        total = sum(r["wall_s"] for r in rows)
        harness = total - sum(timers.get(k, 0.0) for k in labels)
        cells = [timers.get(k) for k in labels] + [harness, total]
        print(
            f"{name:24s} "
            + " ".join(f"{1000 * c / steps:14.1f}" if c else f"{'-':>14s}" for c in cells)
        )
    print(
        "(vla-eval: its step renders both cameras inside OffScreenRenderEnv, so physics and render "
        "are one figure; its policy round trip includes PNG encoding)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
