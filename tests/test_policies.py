"""The openpi websocket protocol: our server and client, interop with PyPI openpi-client,
failures, timeouts, health checks and `gap policy serve` on loopback."""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.asyncio.server import serve

from pytest_gap.errors import GapError
from pytest_gap.policies.builtin import HoldPolicy, RandomPolicy, load_policy
from pytest_gap.policies.client import PolicyClient, PolicyTransportError
from pytest_gap.policies.server import PolicyServer
from pytest_gap.policies.wire import WireError, packb, unpackb

# openpi-client 0.1.2 connects the way websockets 17.1 deprecated; that is its warning, not ours.
OPENPI_CONNECT = pytest.mark.filterwarnings(
    "ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"
)
GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"


def _connect_when_listening(port: int, timeout_s: float = 20.0) -> WebsocketClientPolicy:
    """openpi-client's connection to a server process that is still starting."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return WebsocketClientPolicy(f"ws://127.0.0.1:{port}")
        except OSError:
            assert time.monotonic() < deadline, "the server never listened"
            time.sleep(0.2)


def _obs(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "images": {
            "agentview": rng.integers(0, 255, (224, 224, 3), dtype=np.uint8),
            "wrist": rng.integers(0, 255, (224, 224, 3), dtype=np.uint8),
        },
        "state": rng.normal(size=8).astype(np.float32),
        "prompt": "pick up the milk and place it in the basket",
        "step": np.int64(3),
    }


class Echo:
    """Answers with what it was sent, so a test sees exactly what crossed the wire."""

    def infer(self, obs: dict) -> dict:
        return {"actions": np.ones((5, 7), np.float32), "echo": obs}


class Broken:
    def infer(self, obs: dict) -> dict:
        raise ValueError("checkpoint has no action head")


class Slow:
    def infer(self, obs: dict) -> dict:
        time.sleep(2.0)
        return {"actions": np.zeros((1, 7))}


def test_wire_format_is_byte_identical_to_openpi_client():
    obs = _obs()
    assert packb(obs) == msgpack_numpy.packb(obs)
    back = unpackb(msgpack_numpy.packb(obs))
    assert np.array_equal(back["images"]["wrist"], obs["images"]["wrist"])
    assert back["state"].dtype == np.float32 and back["step"] == 3
    assert isinstance(back["step"], np.int64) and back["prompt"] == obs["prompt"]
    assert np.array_equal(unpackb(packb(np.arange(6.0).reshape(2, 3)[:, ::2])), [[0, 2], [3, 5]])
    with pytest.raises(WireError, match="object/void/complex"):
        packb({"x": np.array([1 + 2j])})
    with pytest.raises(WireError, match="not an openpi msgpack frame"):
        unpackb(b"\xc1")


@OPENPI_CONNECT
def test_openpi_client_talks_to_our_server():
    with PolicyServer(Echo(), metadata={"policy": "echo"}).start() as running:
        client = WebsocketClientPolicy(f"ws://127.0.0.1:{running.port}")
        assert client.get_server_metadata() == {"policy": "echo"}
        obs = _obs(1)
        reply = client.infer(obs)
        assert reply["actions"].shape == (5, 7)
        assert np.array_equal(reply["echo"]["images"]["agentview"], obs["images"]["agentview"])
        assert reply["server_timing"]["infer_ms"] >= 0
        client._ws.close()
        url = f"http://127.0.0.1:{running.port}/healthz"
        with urllib.request.urlopen(url, timeout=5) as health:
            assert health.status == 200


def _openpi_reference_server(started: threading.Event, port_box: list, stop: threading.Event):
    """A server written with openpi-client's wire functions only (as openpi's own serves)."""

    async def session(ws):
        await ws.send(msgpack_numpy.packb({"from": "openpi"}))
        async for frame in ws:
            obs = msgpack_numpy.unpackb(frame)
            await ws.send(msgpack_numpy.packb({"actions": np.full((4, 7), obs["state"][0])}))

    async def main():
        async with serve(session, "127.0.0.1", 0, compression=None, max_size=None) as server:
            port_box.append(server.sockets[0].getsockname()[1])
            started.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)

    asyncio.run(main())


def test_our_client_talks_to_an_openpi_server():
    started, stop, port = threading.Event(), threading.Event(), []
    thread = threading.Thread(target=_openpi_reference_server, args=(started, port, stop))
    thread.start()
    try:
        assert started.wait(10)
        with PolicyClient(f"ws://127.0.0.1:{port[0]}") as client:
            assert client.metadata == {"from": "openpi"}
            obs = _obs()
            reply = client.infer(obs)
            assert reply["actions"].shape == (4, 7)
            assert np.allclose(reply["actions"], obs["state"][0])
    finally:
        stop.set()
        thread.join(10)


def test_a_failing_policy_is_a_transport_error_and_closes_the_session():
    with PolicyServer(Broken()).start() as running, PolicyClient(running.url) as client:
        with pytest.raises(PolicyTransportError, match="failed: ValueError: checkpoint has no"):
            client.infer(_obs())
        with pytest.raises(PolicyTransportError, match="the session is closed"):
            client.infer(_obs())


def test_a_late_reply_closes_the_session_instead_of_being_applied():
    with PolicyServer(Slow()).start() as running:
        client = PolicyClient(running.url, timeout_s=0.5)
        with pytest.raises(PolicyTransportError, match=r"sent no action within 0\.5 s"):
            client.infer(_obs())
        time.sleep(2.0)  # the late reply arrives now; it must not be read as the next answer
        with pytest.raises(PolicyTransportError, match="the session is closed"):
            client.infer(_obs())


def test_an_unreachable_server_says_how_to_fix_it():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connection refused
        with pytest.raises(PolicyTransportError, match=r"is unreachable .*gap policy serve"):
            PolicyClient(f"ws://127.0.0.1:{port}", connect_timeout_s=2)


def test_builtin_policies_and_loading_user_classes():
    hold = HoldPolicy().infer(_obs())["actions"]
    assert hold.shape == (10, 7) and not hold[:, :6].any() and (hold[:, 6] == -1).all()
    a, b = RandomPolicy(seed=1).infer({}), RandomPolicy(seed=1).infer({})
    assert np.array_equal(a["actions"], b["actions"]) and set(np.unique(a["actions"][:, 6])) <= {
        -1.0,
        1.0,
    }
    assert isinstance(load_policy("pytest_gap.policies.builtin:HoldPolicy"), HoldPolicy)
    with pytest.raises(GapError, match=r"use a built-in .* or module:Class"):
        load_policy("pi0")
    with pytest.raises(GapError, match="cannot import it"):
        load_policy("no_such_module:Policy")
    with pytest.raises(GapError, match="no infer"):
        load_policy("pytest_gap.policies.builtin:DEFAULT_HORIZON")


@OPENPI_CONNECT
def test_gap_policy_serve_serves_until_terminated():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [GAP, "policy", "serve", "hold", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().startswith(f"serving hold on ws://127.0.0.1:{port}")
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # listening by then
        client = _connect_when_listening(port)
        assert client.get_server_metadata() == {"policy": "hold"}
        assert client.infer(_obs())["actions"].shape == (10, 7)
        client._ws.close()
        assert proc.poll() is None  # still serving once its client has gone
    finally:
        proc.terminate()
        code = proc.wait(10)
        proc.stdout.close()
    assert code == -signal.SIGTERM  # it served until the signal ended it, and that ended it


@pytest.mark.parametrize("protocol", ["openpi", "vla-eval"])
def test_gap_policy_serve_says_serving_only_once_it_listens(protocol):
    command = [GAP, "policy", "serve", "hold", "--protocol", protocol, "--port"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([*command, str(port)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "serving" not in done.stdout  # a reader waiting for the line would wait for nothing
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([*command, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith(f"serving hold on ws://127.0.0.1:{port}")
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # listening by then
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()


@OPENPI_CONNECT
def test_gap_policy_serve_runs_a_registry_entry(tmp_path):
    import yaml

    config = tmp_path / "bench.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "benchmark": {"families": ["libero"], "variations": ["object"]},
                "policies": {
                    "mine": {"command": [GAP, "policy", "serve", "random", "--port", "{port}"]},
                    "remote": {"url": "ws://gpu-box:9100"},
                },
            }
        )
    )
    external = subprocess.run(
        [GAP, "policy", "serve", "remote", "--config", str(config), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert external.returncode == 2 and "policies.remote is external" in external.stderr
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [GAP, "policy", "serve", "mine", "--config", str(config), "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().startswith("serving mine: ")
        client = _connect_when_listening(port)
        assert client.get_server_metadata() == {"policy": "random"}
        client._ws.close()
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()


class Batched:
    """Replies with the sender's id (`sender(obs)`) in every action; records how it was
    called."""

    def __init__(self, sender=lambda obs: obs["client"]):
        self.calls, self.sender = [], sender

    def infer(self, obs):
        raise AssertionError("a batching server must call infer_batch")

    def infer_batch(self, batch):
        self.calls.append(len(batch))
        time.sleep(0.05)
        return [{"actions": np.full((2, 7), self.sender(obs), np.float32)} for obs in batch]


def test_dynamic_batching_groups_connections_and_answers_each():
    policy = Batched()
    # A window far longer than four clients need to send, even on a loaded machine: a full
    # batch goes at once, so the window only bounds how long a late client is waited for.
    server = PolicyServer(policy, max_batch_size=4, max_wait_ms=10_000)
    replies, barrier = {}, threading.Barrier(4)

    def one_client(i: int, url: str) -> None:
        with PolicyClient(url) as client:
            barrier.wait()
            replies[i] = client.infer({"client": np.float32(i)})["actions"]

    with server.start() as running:
        threads = [threading.Thread(target=one_client, args=(i, running.url)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
    assert sorted(replies) == [0, 1, 2, 3]
    assert all((replies[i] == i).all() for i in replies)  # nobody got another's reply
    assert max(policy.calls) > 1 and sum(policy.calls) == 4
    with pytest.raises(GapError, match="batching needs a policy with infer_batch"):
        PolicyServer(HoldPolicy(), max_batch_size=2)
