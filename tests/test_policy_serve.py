"""`gap policy serve` over both protocols, and the replay built-in: real servers in their own
processes on loopback ports, asked by the references' own clients (openpi-client's
WebsocketClientPolicy; vla-eval's Connection, as vla-eval's episode runner uses it) and by ours.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import anyio
import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from vla_eval.connection import Connection

from pytest_gap.cli import main
from pytest_gap.errors import GapError
from pytest_gap.policies.builtin import ReplayPolicy
from pytest_gap.policies.client import connect_policy
from pytest_gap.policies.server import PolicyServer
from pytest_gap.servers.manager import free_port

# openpi-client 0.1.2 connects the way websockets 17.1 deprecated; that is its warning, not ours.
OPENPI_CONNECT = pytest.mark.filterwarnings(
    "ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"
)
HEALTH = {"openpi": "/healthz", "vla-eval": "/health"}
N_ACTIONS = 12


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """A recorded trajectory as a .npy file: distinct rows, gripper +1 at the end (closed)."""
    actions = np.random.default_rng(7).uniform(-1, 1, (N_ACTIONS, 7)).astype(np.float32)
    actions[:, 6] = np.where(np.arange(N_ACTIONS) < N_ACTIONS // 2, -1.0, 1.0)
    path = tmp_path_factory.mktemp("replay") / "actions.npy"
    np.save(path, actions)
    return path, actions


def _held(actions: np.ndarray) -> np.ndarray:
    """What the replay sends after the recording ends: no motion, the last gripper command."""
    return np.array([0, 0, 0, 0, 0, 0, actions[-1, 6]])


@contextlib.contextmanager
def served(*argv: str, protocol: str = "openpi"):
    """`gap policy serve ARGV --protocol P --port PORT` in its own process until the block ends;
    yields the port once the health check answers 200."""
    port = free_port()
    command = [sys.executable, "-m", "pytest_gap.cli", "policy", "serve", *argv]
    proc = subprocess.Popen(
        [*command, "--protocol", protocol, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                url = f"http://127.0.0.1:{port}{HEALTH[protocol]}"
                with urllib.request.urlopen(url, timeout=1) as health:
                    assert health.status == 200
                    break
            except OSError:
                assert proc.poll() is None, proc.stderr.read()
                assert time.monotonic() < deadline, "the server never listened"
                time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def _vla_eval(port: int, episode):
    """Run `episode(connect)` in an event loop; `connect()` opens a vla-eval Connection."""

    async def run():
        async with contextlib.AsyncExitStack() as stack:

            async def connect() -> Connection:
                conn = Connection(f"ws://127.0.0.1:{port}", timeout=10, max_retries=1)
                await conn.connect()
                stack.push_async_callback(conn.close)
                return conn

            return await episode(connect)

    return anyio.run(run)


def _act(conn: Connection, obs: dict | None = None):
    return conn.act(obs if obs is not None else {"task_description": "replay"})


def test_replay_over_vla_eval_is_one_recorded_action_per_observation(recording):
    path, actions = recording

    async def episodes(connect):
        conn = await connect()
        await conn.start_episode({"task": {"name": "first"}})
        first = [(await _act(conn))["actions"] for _ in range(N_ACTIONS + 3)]
        await conn.end_episode({"success": False})
        await conn.start_episode({"task": {"name": "second"}})
        second = (await _act(conn))["actions"]
        return conn.server_info, first, second

    with served("replay", "--actions", str(path), protocol="vla-eval") as port:
        hello, first, second = _vla_eval(port, episodes)
    assert hello["model_server"] == "GapPolicyServer" and "observation_params" not in hello
    assert all(np.shape(a) == (7,) for a in first)
    assert np.allclose(first[:N_ACTIONS], actions)  # in order, one per observation
    assert np.allclose(first[N_ACTIONS:], _held(actions))  # then still, gripper as last commanded
    assert np.allclose(second, actions[0])  # EPISODE_START: from the first action again


def test_two_vla_eval_connections_keep_their_own_replay_positions(recording):
    path, actions = recording

    async def interleaved(connect):
        a, b = await connect(), await connect()
        for conn in (a, b):
            await conn.start_episode({})
        a_first = [(await _act(a))["actions"] for _ in range(3)]
        b_first = (await _act(b))["actions"]
        return [*a_first, (await _act(a))["actions"]], b_first, (await _act(b))["actions"]

    with served("replay", "--actions", str(path), protocol="vla-eval") as port:
        a, b_first, b_second = _vla_eval(port, interleaved)
    assert np.allclose(a, actions[:4])
    assert np.allclose([b_first, b_second], actions[:2])


def test_hold_and_random_over_vla_eval_answer_one_7d_action_per_observation():
    async def ten_steps(connect):
        conn = await connect()
        await conn.start_episode({})
        return [(await _act(conn))["actions"] for _ in range(12)]

    with served("hold", protocol="vla-eval") as port:
        hold = np.array(_vla_eval(port, ten_steps))
        with connect_policy(f"ws://127.0.0.1:{port}", "vla-eval") as ours:
            ours_hold = ours.infer({"task_description": "hold"})["actions"]
    assert hold.shape == (12, 7) and not hold[:, :6].any() and (hold[:, 6] == -1).all()
    assert ours_hold.shape == (1, 7) and (ours_hold[0, 6] == -1) and not ours_hold[0, :6].any()
    with served("random", protocol="vla-eval") as port:
        random = np.array(_vla_eval(port, ten_steps))
    assert random.shape == (12, 7) and np.isfinite(random).all()
    assert set(np.unique(random[:, 6])) <= {-1.0, 1.0}
    assert len({tuple(row) for row in random}) == 12  # 12 actions drawn, none repeated


@OPENPI_CONNECT
def test_replay_over_openpi_is_chunks_of_chunk_per_connection(recording):
    path, actions = recording
    with served("replay", "--actions", str(path), "--chunk", "5") as port:
        url = f"ws://127.0.0.1:{port}"
        first = WebsocketClientPolicy(url)
        assert first.get_server_metadata() == {"policy": "replay"}
        chunks = [first.infer({"prompt": "replay"})["actions"] for _ in range(4)]
        second = WebsocketClientPolicy(url)  # a new connection while the first is open
        again = second.infer({"prompt": "replay"})["actions"]
        after = first.infer({"prompt": "replay"})["actions"]
        with connect_policy(url) as ours:
            our_chunk = ours.infer({"prompt": "replay"})["actions"]
        for client in (first, second):
            client._ws.close()
    assert [c.shape for c in chunks] == [(5, 7)] * 4
    replayed = np.concatenate(chunks)
    assert np.allclose(replayed[:N_ACTIONS], actions)
    assert np.allclose(replayed[N_ACTIONS:], _held(actions)) and np.allclose(after, _held(actions))
    assert np.allclose(again, actions[:5]) and np.allclose(our_chunk, actions[:5])


def _gap(*argv: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pytest_gap.cli", "policy", "serve", *argv, "--port", "1"]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def _one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gap: error: "), result.stderr
    return lines[0]


def test_scripted_over_vla_eval_is_refused_in_one_line():
    line = _one_line_error(_gap("scripted", "--protocol", "vla-eval"))
    assert "privileged" in line and "--protocol openpi" in line


def _write(path: Path, content: bytes | str | np.ndarray) -> Path:
    if isinstance(content, np.ndarray):
        np.save(path, content, allow_pickle=True)  # a test's object array goes as a pickle
    else:
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def _npz(path: Path) -> None:
    """An .npz archive under a .npy name (np.load reads the archive whatever the name)."""
    with path.open("wb") as out:
        np.savez(out, actions=np.zeros((2, 7)))


GOOD = [[0.1] * 7, [0.2] * 7]
BAD_FILES = {
    "no such file": ("missing.npy", None, "no such file"),
    "a directory": ("folder.npy", Path.mkdir, "cannot read it"),
    "another suffix": ("actions.csv", "0,0,0,0,0,0,-1\n", "not a .npy or .json file"),
    "not npy bytes": ("actions.npy", b"\x93NUMPY garbage", "not a numpy .npy array"),
    "a pickle": ("actions.npy", np.array([{"a": 1}], dtype=object), "not a numpy .npy array"),
    "an npz": ("actions.npy", _npz, "an .npz archive"),
    "strings": ("actions.npy", np.array([["a"] * 7]), "not numbers"),
    "six columns": ("actions.npy", np.zeros((3, 6)), "shape [3, 6], not (N, 7)"),
    "one row flat": ("actions.npy", np.zeros(7), "shape [7], not (N, 7)"),
    "no rows": ("actions.npy", np.zeros((0, 7)), "shape [0, 7], not (N, 7)"),
    "a nan": ("actions.npy", np.array([[0.0] * 7, [np.nan] * 7]), "action 1 is not finite"),
    "not json": ("actions.json", "{actions: [", "not JSON"),
    "no actions key": ("actions.json", json.dumps({"steps": GOOD}), 'no "actions" list'),
    "string numbers": ("actions.json", json.dumps({"actions": [["0.1"] * 7]}), 'no "actions"'),
    "ragged rows": ("actions.json", json.dumps({"actions": [[0.1] * 7, [0.2]]}), "differ"),
    "an infinity": ("actions.json", '{"actions": [[0, 0, 0, 0, 0, 0, Infinity]]}', "not finite"),
}


@pytest.mark.parametrize("case", BAD_FILES, ids=list(BAD_FILES))
def test_a_bad_action_file_is_one_line_naming_it_and_the_fix(case, tmp_path, capsys):
    name, content, problem = BAD_FILES[case]
    path = tmp_path / name
    if callable(content):
        content(path)
    elif content is not None:  # None: no file at all
        _write(path, content)
    assert main(["policy", "serve", "replay", "--actions", str(path), "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"gap: error: --actions {path}: "), err
    assert problem in err
    if case != "a nan" and case != "an infinity":
        assert "give a .npy float array (N, 7) or a .json" in err  # the fix


def test_bad_action_files_exit_non_zero_without_a_traceback(tmp_path):
    """The same errors from the real command line, for both protocols."""
    six = _write(tmp_path / "six.npy", np.zeros((3, 6)))
    for protocol in ("openpi", "vla-eval"):
        line = _one_line_error(_gap("replay", "--actions", str(six), "--protocol", protocol))
        assert f"--actions {six}: actions of shape [3, 6]" in line
    assert "no such file" in _one_line_error(_gap("replay", "--actions", "gone.json"))


def test_the_replay_flags_belong_to_replay(tmp_path, capsys):
    good = _write(tmp_path / "good.json", json.dumps({"actions": GOOD}))
    cases = {
        ("replay",): "policy 'replay' needs --actions FILE",
        ("hold", "--actions", str(good)): "--actions is for the replay policy only",
        ("random", "--chunk", "3"): "--chunk is for the replay policy only",
        ("hold", "--config", "bench.yaml", "--protocol", "vla-eval"): "--protocol: a --config",
        ("hold", "--protocol", "vla-eval", "--max-batch-size", "4"): "batching needs a policy",
    }
    for argv, message in cases.items():
        assert main(["policy", "serve", *argv, "--port", "1"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (argv, err)


def test_without_vla_eval_the_protocol_says_what_to_install(monkeypatch, capsys):
    from pytest_gap.policies import vla_eval_server

    vla_eval_server._server_class.cache_clear()
    monkeypatch.setitem(sys.modules, "vla_eval.model_servers.predict", None)  # not installed
    try:
        assert main(["policy", "serve", "hold", "--protocol", "vla-eval", "--port", "1"]) == 2
    finally:
        vla_eval_server._server_class.cache_clear()
    assert capsys.readouterr().err == (
        "gap: error: gap policy serve --protocol vla-eval needs vla-eval "
        "(pip install 'pytest-gap[vla-eval]')\n"
    )


class ForkingBatcher:
    """Per-connection state (fork) and batching (infer_batch): the two cannot go together."""

    def fork(self):
        return ForkingBatcher()

    def infer(self, obs):
        return {"actions": np.zeros((1, 7))}

    def infer_batch(self, batch):
        return [self.infer(obs) for obs in batch]


def test_a_forking_policy_is_served_per_connection_and_never_batched(recording):
    _, actions = recording
    with pytest.raises(GapError, match=r"per-connection state \(fork\(\)\).*max_batch_size 1"):
        PolicyServer(ForkingBatcher(), max_batch_size=2)
    PolicyServer(ForkingBatcher(), max_batch_size=1)  # unbatched, it is served
    replay = ReplayPolicy(actions, chunk=3)
    with (
        PolicyServer(replay).start() as running,
        connect_policy(running.url) as a,
        connect_policy(running.url) as b,
    ):
        assert np.allclose(a.infer({})["actions"], actions[:3])
        assert np.allclose(a.infer({})["actions"], actions[3:6])
        assert np.allclose(b.infer({})["actions"], actions[:3])
    assert np.allclose(replay.infer({})["actions"], actions[:3])  # the served original: unused


def test_a_json_recording_replays_as_its_npy_twin_would(tmp_path):
    path = _write(tmp_path / "demo.json", json.dumps({"actions": [[0.5] * 6 + [1], [-0.5] * 7]}))
    replay = ReplayPolicy.from_file(path, chunk=3)
    first = replay.infer({"ignored": True})["actions"]
    assert np.allclose(first, [[0.5] * 6 + [1], [-0.5] * 7, [0] * 6 + [-0.5]])
    fork = replay.fork()  # a new episode: from the first action, sharing the recording
    assert fork.actions is replay.actions and np.allclose(fork.infer({})["actions"], first)
    assert np.allclose(replay.infer({})["actions"], [[0] * 6 + [-0.5]] * 3)


class StepRecorder:
    """The real env, with every action it is stepped with kept (what reached the simulator)."""

    def __init__(self, env):
        self._env, self.actions = env, []

    def step(self, action):
        self.actions.append(np.array(action, dtype=np.float64))
        return self._env.step(action)

    def __getattr__(self, name):
        return getattr(self._env, name)


@pytest.mark.parametrize("protocol", ["openpi", "vla-eval"])
def test_run_policy_applies_a_served_replay_exactly_on_libero(protocol, object_env, tmp_path):
    """run_policy (replan_every 5) through `gap policy serve replay --chunk 5`: the simulator
    is stepped with the recording, in order, then with the hold."""
    from pytest_gap.policies.endpoint import PolicyEndpoint
    from pytest_gap.workflow.executor import run_workflow
    from pytest_gap.workflow.schema import validate_workflow

    actions = np.random.default_rng(3).uniform(-0.3, 0.3, (N_ACTIONS, 7))
    actions[:, 6] = -1.0  # open throughout: no gripper cycle ends the run early
    path = tmp_path / "demo.npy"
    np.save(path, actions)
    inputs = {"policy": "replay", "max_windows": 3, "replan_every": 5}
    workflow = validate_workflow(
        {
            "version": 1,
            "name": "replay",
            "start": "policy",
            "nodes": {
                "policy": {"type": "tool", "skill": "run_policy", "inputs": inputs, "next": "end"},
                "end": {"type": "end", "status": "failure"},
            },
        }
    )
    env = StepRecorder(object_env)
    with served("replay", "--actions", str(path), "--chunk", "5", protocol=protocol) as port:
        object_env.reset(0)
        endpoint = PolicyEndpoint(url=f"ws://127.0.0.1:{port}", protocol=protocol)
        result = run_workflow(workflow, env, policies={"replay": endpoint})
    assert not result.infra_failure and result.outputs["policy"]["steps"] == 15
    assert np.allclose(env.actions[:N_ACTIONS], actions, atol=1e-6)
    assert np.allclose(env.actions[N_ACTIONS:], _held(actions))
