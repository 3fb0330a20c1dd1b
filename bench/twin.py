"""Twins: the same open-loop episodes through the libero backend's policy_only_bare and through
vla-eval's own LIBERO loop (the vla-eval backend), side by side, per episode.

    python bench/twin.py [--episodes SUITE:TASK:SEED[:WORKFLOW_DIR],...] [--gripper-zero]
                         [--out DIR] [--sessions | --messages] [--json]

For each episode the privileged scripted oracle (policies/builtin.py ScriptedPolicy, fed the
simulator's ground truth), or the workflow graph named after the seed, is run once on the libero
backend and every action it applied is recorded (float32, as vla-eval's wire carries them).
The recording is then served back open-loop by `gap policy serve replay --protocol vla-eval`
(one action per observation) and run through

- ours:     the libero backend, template policy_only_bare (run_policy until success), the
            server spoken to over vla-eval's protocol with the vla-eval-libero format;
- vla-eval: the vla-eval backend: vla-eval's LIBEROBenchmark and SyncEpisodeRunner.

A twin gives the same outcome at the same step and starts from the same scene (`scene_digest`).
The oracle's episodes are long enough for what used to differ: a release before the end, a
second object (libero_10), fixtures jittered by the seed. `--gripper-zero` replays the same
actions with every close command (+1) written as exactly 0: vla-eval snaps 0 to close, and so
must our vla-eval-libero format, so the twins must not move. `--sessions` runs each side as a
whole pytest session (`gap benchmark`'s path: config, plan, runner, managed server) instead of
calling the backends directly. `--messages` serves the recording with vla-eval's own model
server class instead, logging every message it receives, and compares the two loops' streams
message for message (EPISODE_START's task, every observation to the bit, EPISODE_END's result;
timings aside).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REPLAN = 5  # the oracle's chunks are applied 5 at a time, as openpi's client does
# One object; two objects into one basket (a release, then a second grasp); a fixture's place
# (the cabinet that LIBERO jitters at every reset: the bottle onto it, its drawer opened),
# recorded from the do_task skill graph.
DEFAULT_EPISODES = (
    "libero_object:0:0,libero_10:0:0,libero_goal:2:0:examples/workflows/do_task,"
    "libero_goal:0:0:examples/workflows/do_task"
)


@dataclass
class Episode:
    suite: str
    task: int
    seed: int
    source: str = "oracle"  # who acts in the recording: the oracle, or a workflow dir

    @classmethod
    def parse(cls, text: str) -> Episode:
        suite, task, seed, *source = text.split(":")
        return cls(suite, int(task), int(seed), *source)

    @property
    def name(self) -> str:
        return f"{self.suite} task {self.task} seed {self.seed}"


@dataclass
class Outcome:
    success: bool
    steps: int
    scene_digest: str | None
    seconds: float


def record(episode: Episode) -> tuple[np.ndarray, Outcome]:
    """The actions applied on `episode` (libero backend) by its source, until it succeeds or
    the suite's budget runs out, and how that went. Every action is rounded to float32 before
    it is applied, so that what a replay sends over vla-eval's wire is exactly what ran."""
    from pytest_gap.sim.libero import make_env

    t0 = time.perf_counter()
    with make_env(episode.suite, episode.task) as env:
        env.reset(episode.seed)
        scene, applied = env.episode.scene_digest, []
        step = env.step

        def recorded_step(action):
            applied.append(np.asarray(action, np.float32))
            return step(applied[-1])

        env.step = recorded_step  # this env only, and only for this recording
        success = _act(episode, env)
        outcome = Outcome(success, env.steps, scene, time.perf_counter() - t0)
    return np.asarray(applied, np.float32), outcome


def _act(episode: Episode, env) -> bool:
    """Run the episode's source on `env`; whether the task succeeded."""
    if episode.source != "oracle":  # a workflow graph, closed loop on privileged perception
        from pytest_gap.workflow.executor import run_workflow
        from pytest_gap.workflow.schema import load_workflow

        return run_workflow(load_workflow(ROOT / episode.source), env).success
    from pytest_gap.policies.builtin import ScriptedPolicy
    from pytest_gap.skills.policy import privileged_state

    policy, success = ScriptedPolicy(), False
    while not success and env.steps < env.max_steps:
        chunk = policy.infer({"privileged": privileged_state(env)})["actions"][:REPLAN]
        for action in chunk:
            success = env.step(action).success
            if success or env.steps >= env.max_steps:
                break
    return success


def zero_closes(actions: np.ndarray) -> np.ndarray:
    """The same actions with every close command (gripper > 0) written as exactly 0."""
    out = actions.copy()
    out[out[:, 6] > 0, 6] = 0.0
    return out


def ours(episode: Episode, url: str) -> Outcome:
    """The libero backend's policy_only_bare against the vla-eval-protocol server at `url`."""
    from pytest_gap.policies.endpoint import PolicyEndpoint
    from pytest_gap.producers.templates import template_dir
    from pytest_gap.sim.libero import make_env
    from pytest_gap.workflow.executor import run_workflow
    from pytest_gap.workflow.schema import load_workflow

    template = load_workflow(template_dir("policy_only_bare"), {"policy_id": "replay"})
    endpoint = PolicyEndpoint(url=url, protocol="vla-eval")
    t0 = time.perf_counter()
    with make_env(episode.suite, episode.task) as env:
        env.reset(episode.seed)
        scene = env.episode.scene_digest
        run = run_workflow(template, env, policies={"replay": endpoint})
    if run.infra_failure or run.exit_status not in ("task_success", "step_limit"):
        raise RuntimeError(f"ours on {episode.name}: {run.exit_status}: {run.error}")
    return Outcome(run.success, run.steps, scene, time.perf_counter() - t0)


def vla_eval(episode: Episode, url: str) -> Outcome:
    """vla-eval's own loop (the vla-eval backend) against the server at `url`."""
    from pytest_gap.sim.backend import get_backend

    t0 = time.perf_counter()
    env = get_backend("vla-eval").make_env(episode.suite, episode.task)
    try:
        done = env.run_episode(episode.seed, url=url, timeout_s=30.0)
    finally:
        env.close()
    return Outcome(done.success, done.steps, done.scene_digest, time.perf_counter() - t0)


# -- the messages a vla-eval model server receives from each loop ---------------------------------
class Served:
    """A vla-eval model server run by vla_eval's own `serve_async` on a loopback port, in a
    thread with its own event loop; `port` is set once it listens."""

    def __init__(self, model):
        import anyio

        self.model, self.port = model, None
        self._ready, self._halt = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=anyio.run, args=(self._main,), daemon=True)

    async def _main(self):
        import anyio
        from vla_eval.model_servers.serve import serve_async

        async with anyio.create_task_group() as tg:
            self.port = await tg.start(serve_async, self.model, "127.0.0.1", 0)
            self._ready.set()
            while not self._halt.is_set():
                await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def __enter__(self) -> Served:
        self._thread.start()
        assert self._ready.wait(SERVER_START_S), "vla-eval's serve_async did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._halt.set()
        self._thread.join(10)


SERVER_START_S = 60  # a ceiling for serve_async to listen, not a wait (a loaded machine: seconds)
SETTLE_S = 60  # a ceiling for a server to have handled what a finished loop sent it
TIMING_KEYS = ("elapsed_sec",)  # EPISODE_END's wall time: a measurement, never equal twice


def canonical(payload):
    """A message payload as comparable data: each numpy array as its dtype, shape and sha256
    (equal only if equal to the bit), numpy scalars as Python ones."""
    if isinstance(payload, dict):
        return {k: canonical(v) for k, v in payload.items()}
    if isinstance(payload, list | tuple):
        return [canonical(v) for v in payload]
    if isinstance(payload, np.ndarray):
        data = hashlib.sha256(np.ascontiguousarray(payload).tobytes()).hexdigest()
        return {"ndarray": payload.dtype.str, "shape": list(payload.shape), "sha256": data}
    if isinstance(payload, np.generic):
        return payload.item()
    return payload


class MessageLog:
    """A mixin for a vla-eval model server, before its ModelServer base: every message its hooks
    receive (EPISODE_START, OBSERVATION, EPISODE_END), in order, per connection (vla-eval's
    session id), as `canonical` data. vla-eval's serve.py also calls `on_episode_end({})` when a
    connection closes inside an episode (no message came): logged as what the server was given.
    HELLO is answered by serve.py itself and reaches no hook."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._messages: dict[str, list[tuple[str, object]]] = {}
        self._changed = threading.Condition()

    def _log(self, ctx, kind: str, payload) -> None:
        with self._changed:
            self._messages.setdefault(ctx.session_id, []).append((kind, canonical(payload)))
            self._changed.notify_all()

    async def on_episode_start(self, config, ctx):
        self._log(ctx, "episode_start", config)
        await super().on_episode_start(config, ctx)

    async def on_observation(self, obs, ctx):
        self._log(ctx, "observation", obs)
        await super().on_observation(obs, ctx)

    async def on_episode_end(self, result, ctx):
        self._log(ctx, "episode_end", result)
        await super().on_episode_end(result, ctx)

    def streams(self, count: int = 0, timeout_s: float = SETTLE_S) -> list[list[tuple]]:
        """Each connection's messages, in the order the connections began; first waiting (up to
        `timeout_s`) until at least `count` connections have each ended an episode, so that what
        a loop that just returned sent is all in."""

        def settled() -> bool:
            ends = [m[-1][0] == "episode_end" for m in self._messages.values()]
            return len(ends) >= count and all(ends)

        with self._changed:
            self._changed.wait_for(settled, timeout_s)
            return [list(m) for m in self._messages.values()]


def first_difference(ours: list[tuple], theirs: list[tuple]) -> str | None:
    """Where two message streams differ (timings aside: `TIMING_KEYS` are compared by type),
    as one line, or None if they are equal message for message."""

    def untimed(message: tuple) -> tuple:
        kind, payload = message
        if kind == "episode_end" and isinstance(payload, dict):
            times = {k: type(payload[k]).__name__ for k in TIMING_KEYS if k in payload}
            payload = {**payload, **times}
        return kind, payload

    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if untimed(a) != untimed(b):
            return f"message {i}: ours {_brief(a)} but vla-eval's {_brief(b)}"
    if len(ours) != len(theirs):
        return f"ours sent {len(ours)} messages, vla-eval's loop {len(theirs)}"
    return None


def _brief(message: tuple) -> str:
    kind, payload = message
    keys = sorted(payload) if isinstance(payload, dict) else payload
    shown = payload if kind != "observation" else f"keys {keys}"
    return f"{kind} {str(shown)[:300]}"


@functools.cache
def _logged_replay_class() -> type:
    from vla_eval.model_servers.predict import PredictModelServer

    class LoggedReplay(MessageLog, PredictModelServer):
        """vla-eval's PredictModelServer replaying `actions` open-loop, action k at an episode's
        k-th observation (zero motion, open, past the end), asking for the observations in
        `observation_params`; it logs every message (MessageLog)."""

        def __init__(self, actions: np.ndarray, observation_params: dict):
            super().__init__()
            self.actions, self.params = np.asarray(actions, np.float32), observation_params

        def get_observation_params(self):
            return dict(self.params)

        def predict(self, obs, ctx):
            if ctx.step < len(self.actions):
                return {"actions": self.actions[ctx.step]}
            return {"actions": np.array([0, 0, 0, 0, 0, 0, -1], np.float32)}

    return LoggedReplay


@contextlib.contextmanager
def logged_replay(actions: np.ndarray, observation_params: dict | None = None):
    """`actions` served back one per observation by vla-eval's own model server class, which
    logs every message it receives; yields (url, server): `server.streams()` reads the log."""
    model = _logged_replay_class()(actions, observation_params or {})
    with Served(model) as served:
        yield served.url, model


@contextlib.contextmanager
def replay_server(actions: np.ndarray):
    """`gap policy serve replay --protocol vla-eval --actions FILE` (vla-eval's own model server
    around the replay policy), started and stopped as a session starts a managed entry
    (servers/manager.py); yields its url."""
    from pytest_gap.servers.manager import PolicyManager

    with tempfile.TemporaryDirectory() as tmp:
        actions_file = Path(tmp) / "actions.npy"
        np.save(actions_file, actions)
        manager = PolicyManager()
        try:
            urls = manager.start_all({"replay": _replay_entry(actions_file)})
            yield urls["replay"]
        finally:
            manager.stop_all()


def _replay_entry(actions_file: Path):
    from pytest_gap.config import PolicyEntry

    command = ["gap", "policy", "serve", "replay", "--actions", str(actions_file)]
    command += ["--chunk", str(REPLAN), "--protocol", "vla-eval", "--port", "{port}"]
    return PolicyEntry(command=command, protocol="vla-eval")


def _session_config(episode: Episode, actions_file: Path, backend: str) -> dict:
    template = {"template": "policy_only_bare"} if backend == "libero" else {}
    entry = _replay_entry(actions_file)
    return {
        "policies": {"replay": {"command": entry.command, "protocol": entry.protocol}},
        "trials": {"task_timeout_secs": 0},
        "benchmark": {
            "backend": backend,
            "families": ["libero"],
            "variations": [episode.suite.removeprefix("libero_")],
            "modes": ["policy_only"],
            "policies": ["replay"],
            "task_ids": [episode.task],
            "seeds": [episode.seed],
            "num_workers": 1,
            "gate_threshold": 0.0,
            "output_dir": f"runs_{backend}",
            "mode_overrides": {"policy_only": template},
        },
    }


def in_session(episode: Episode, actions: np.ndarray, backend: str, work: Path) -> Outcome:
    """One whole pytest session of one trial on `backend` (what `gap benchmark` runs)."""
    import yaml

    work.mkdir(parents=True, exist_ok=True)
    actions_file = work / "actions.npy"
    np.save(actions_file, actions)
    config = work / f"twin_{backend}.yaml"
    config.write_text(yaml.safe_dump(_session_config(episode, actions_file, backend)))
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", config.name, "-p", "no:cacheprovider", "-q"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    results = sorted((work / f"runs_{backend}").rglob("result.json"))
    if done.returncode not in (0, 1) or not results:
        raise RuntimeError(f"{backend} session on {episode.name}: {done.stdout[-2000:]}")
    record = json.loads(results[-1].read_text())
    if record.get("error"):
        raise RuntimeError(f"{backend} session on {episode.name}: {record['error']}")
    return Outcome(
        record["success"], record["steps"], record.get("scene_digest"), time.perf_counter() - t0
    )


def twin(episode: Episode, actions: np.ndarray, sessions: bool = False) -> dict[str, Outcome]:
    """Both loops on `episode` with `actions` replayed open-loop."""
    if sessions:
        with tempfile.TemporaryDirectory() as tmp:
            return {b: in_session(episode, actions, b, Path(tmp)) for b in ("libero", "vla-eval")}
    with replay_server(actions) as url:
        return {"libero": ours(episode, url), "vla-eval": vla_eval(episode, url)}


# What a stream's server asks for: the state with the agentview image (the wrist camera costs
# ours a render per step; tests/test_vla_eval_backend.py compares streams with it too).
STREAM_PARAMS = {"send_state": True}


def message_twins(
    episode: Episode, actions: np.ndarray, observation_params: dict | None = None
) -> tuple[dict[str, Outcome], list[tuple], list[tuple]]:
    """Both loops on `episode` against one vla-eval model server that replays `actions` and
    logs what it receives (`logged_replay`): the outcomes, then the messages ours sent and those
    vla-eval's loop sent (one connection each, ours first)."""
    with logged_replay(
        actions, STREAM_PARAMS if observation_params is None else observation_params
    ) as (url, server):
        outcomes = {"libero": ours(episode, url), "vla-eval": vla_eval(episode, url)}
        mine, theirs = server.streams(2)
    return outcomes, mine, theirs


def _row(label: str, outcome: Outcome) -> str:
    digest = (outcome.scene_digest or "-")[:12]
    return (
        f"  {label:<22} success={outcome.success!s:<5} steps={outcome.steps:<4} "
        f"scene={digest}  {outcome.seconds:5.1f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", default=DEFAULT_EPISODES, help="SUITE:TASK:SEED,...")
    parser.add_argument("--gripper-zero", action="store_true", help="closes written as 0")
    parser.add_argument("--sessions", action="store_true", help="whole pytest sessions")
    parser.add_argument(
        "--messages", action="store_true", help="compare the messages a logging server receives"
    )
    parser.add_argument("--out", type=Path, help="keep each recording here (.npy)")
    parser.add_argument("--json", action="store_true", help="one JSON line per episode")
    args = parser.parse_args()
    twins = 0
    episodes = [Episode.parse(e) for e in args.episodes.split(",")]
    for episode in episodes:
        actions, recorded = record(episode)
        if args.gripper_zero:
            actions = zero_closes(actions)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            np.save(args.out / f"{episode.suite}_{episode.task}_{episode.seed}.npy", actions)
        streams = None
        if args.messages:
            both, *streams = message_twins(episode, actions)
        else:
            both = twin(episode, actions, sessions=args.sessions)
        same = all(
            (o.success, o.steps, o.scene_digest)
            == (recorded.success, recorded.steps, recorded.scene_digest)
            for o in both.values()
        )
        difference = first_difference(*streams) if streams else None
        same = same and difference is None
        twins += same
        if args.json:
            sides = {k: asdict(v) for k, v in both.items()}
            line = {"episode": asdict(episode), "recorded": asdict(recorded), **sides}
            if streams:
                line["messages"] = {"sent": [len(m) for m in streams], "difference": difference}
            print(json.dumps({**line, "twins": same}))
            continue
        zeroed = " (closes written as 0)" if args.gripper_zero else ""
        print(f"{episode.name}: {len(actions)} recorded actions{zeroed}")
        print(_row(f"recorded ({Path(episode.source).name})", recorded))
        print(_row("ours policy_only_bare", both["libero"]))
        print(_row("vla-eval's loop", both["vla-eval"]))
        if streams:
            print(f"  messages: {difference or f'{len(streams[0])} sent by each, equal'}")
        print(f"  -> {'twins' if same else 'DIFFER'}")
    print(f"{twins}/{len(episodes)} episodes are twins")
    return 0 if twins == len(episodes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
