"""Wire and server hardening: crafted frames against our decoder, our client and our server
(real websocket connections on loopback, real `gap policy serve`), the message size cap, and
one-line error frames (tracebacks only with --debug)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import msgpack
import numpy as np
import pytest
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from vla_eval.protocol.messages import Message, MessageType, pack_message
from vla_eval.protocol.numpy_codec import set_image_format
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from pytest_gap.cli import build_parser
from pytest_gap.policies.builtin import HoldPolicy
from pytest_gap.policies.client import PolicyClient, PolicyTransportError, VlaEvalClient
from pytest_gap.policies.server import PolicyServer
from pytest_gap.policies.wire import WireError, packb, packer, unpack_vla, unpackb

# openpi-client 0.1.2 connects the way websockets 17.1 deprecated; that is its warning, not ours.
OPENPI_CONNECT = pytest.mark.filterwarnings(
    "ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"
)
GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"


def ndarray(data, dtype, shape) -> dict:
    """An openpi-tagged ndarray map with whatever fields a faulty peer may put in it."""
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}


GOOD = ndarray(np.zeros((2, 2), np.float32).tobytes(), "<f4", [2, 2])

# id -> (a crafted map, what the error must say about it)
CRAFTED = {
    "complex": (ndarray(np.zeros(2, np.complex128).tobytes(), "<c16", [2]), "complex dtype"),
    "object": (ndarray(b"\0" * 8, "|O", [1]), "object dtype"),
    "structured": (ndarray(b"\0" * 12, "i4,f8", [1]), "void or structured dtype"),
    "void": (ndarray(b"\0" * 4, "|V4", [1]), "void or structured dtype"),
    "short data": (
        ndarray(b"\0" * 10, "|u1", [224, 224, 3]),
        r"data is 10 bytes but shape \[224, 224, 3\] x itemsize 1 \(\|u1\) needs 150528",
    ),
    "long data": (ndarray(b"\0" * 40, "<f4", [8]), "data is 40 bytes .* needs 32"),
    "negative shape": (ndarray(b"", "|u1", [-1, 0]), "not a list of non-negative ints"),
    "float shape": (ndarray(b"\0" * 4, "|u1", [2.0, 2]), "not a list of non-negative ints"),
    "unknown dtype": (ndarray(b"", "float3", [0]), "dtype 'float3' is not a numpy dtype"),
    "no dtype string": (ndarray(b"", 7, [0]), "not a numpy dtype string"),
    "complex scalar": ({b"__npgeneric__": True, b"data": 1.0, b"dtype": "<c8"}, "complex"),
}


def crafted_obs(bad: dict) -> bytes:
    return msgpack.packb({"observation/image": GOOD, "images": {"wrist": bad}, "prompt": "x"})


@pytest.mark.parametrize("case", list(CRAFTED))
def test_decoder_refuses_crafted_arrays_naming_the_field(case):
    bad, reason = CRAFTED[case]
    with pytest.raises(WireError, match=rf"^observation\['images'\]\['wrist'\]: .*{reason}") as err:
        unpackb(crafted_obs(bad), "observation")
    assert "\n" not in str(err.value)


LAYOUTS = [
    np.array(1.5, np.float32),
    np.zeros((0, 3)),
    np.arange(3, dtype=">i4"),
    np.array([True, False]),
    np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    np.arange(12, dtype=np.uint64).reshape(3, 4)[:, ::2],
    np.array(["a", "bc"]),
    np.array(["2020-01-01"], dtype="M8[D]"),
    np.zeros((224, 224, 3), np.uint8),
]


@pytest.mark.parametrize("array", LAYOUTS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_encoder_is_byte_identical_to_openpi_client_for_every_layout(array):
    assert packb({"x": array}) == msgpack_numpy.packb({"x": array})
    reused = packer()  # a connection's encoder, reused message after message
    assert reused.pack({"x": array}) == reused.pack({"x": array}) == packb({"x": array})
    back = unpackb(packb({"x": array}))["x"]
    assert np.array_equal(back, array) and back.dtype == array.dtype


def test_decoder_keeps_what_openpi_client_sends():
    obs = {
        "observation/image": np.arange(24, dtype=np.uint8).reshape(2, 4, 3),
        "empty": np.zeros((0, 3), np.float32),
        "big_endian": np.arange(3, dtype=">i4"),
        "names": np.array(["a", "bc"]),
        "flag": np.bool_(True),
    }
    back = unpackb(msgpack_numpy.packb(obs))
    for key, value in obs.items():
        assert np.array_equal(back[key], value) and back[key].dtype == value.dtype


def vla_frame(payload: dict, kind: str = "action") -> bytes:
    message = {"type": kind, "payload": payload, "seq": 1, "timestamp": 0.0}
    return msgpack.packb(message, use_bin_type=True)


def vla_array(data, dtype, shape) -> dict:
    return {"__ndarray__": True, "data": data, "dtype": dtype, "shape": shape}


def png_bytes(shape) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.zeros(shape, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


VLA_CRAFTED = {
    "short ndarray": (vla_array(b"\0" * 3, "<f4", [1]), "data is 3 bytes .* needs 4"),
    "complex ndarray": (vla_array(b"\0" * 16, "<c16", [1]), "complex dtype"),
    "unicode ndarray": (vla_array(b"\0" * 4, "<U1", [1]), "allowed kinds: biuf"),
    "raw image": (
        {"__image__": True, "format": "raw", "data": b"\0" * 5, "dtype": "|u1", "shape": [2, 2, 3]},
        "data is 5 bytes .* needs 12",
    ),
    "not a png": (
        {"__image__": True, "format": "png", "data": b"GIF89a", "shape": [2, 2, 3]},
        "'png' image does not decode",
    ),
    "png of another size": (
        {"__image__": True, "format": "png", "data": png_bytes((4, 4, 3)), "shape": [2, 2, 3]},
        r"image decodes to \[4, 4, 3\], not shape \[2, 2, 3\]",
    ),
}


@pytest.mark.parametrize("case", list(VLA_CRAFTED))
def test_vla_eval_decoder_refuses_crafted_arrays_naming_the_field(case):
    bad, reason = VLA_CRAFTED[case]
    frame = vla_frame({"actions": vla_array(b"\0" * 4, "<f4", [1]), "images": {"agentview": bad}})
    with pytest.raises(WireError, match=r"^message\['payload'\]\['images'\]\['agentview'\]: "):
        unpack_vla(frame)
    with pytest.raises(WireError, match=reason):
        unpack_vla(frame)


@pytest.mark.parametrize("image_format", ["png", "raw"])
def test_vla_eval_decoder_keeps_what_vla_eval_sends(image_format):
    payload = {
        "actions": np.ones((4, 7), np.float32),
        "image": np.arange(48, dtype=np.uint8).reshape(4, 4, 3),
    }
    set_image_format(image_format)
    try:
        frame = pack_message(Message(MessageType.ACTION, payload))
    finally:
        set_image_format("png")
    back = unpack_vla(frame)["payload"]
    assert np.array_equal(back["actions"], payload["actions"])
    assert np.array_equal(back["image"], payload["image"])


class FaultServer:
    """A faulty peer on loopback: sends `greeting` frames on connect, then answers the i-th frame
    it receives with `replies[i]` (frames our own server never sends)."""

    def __init__(self, greeting: list[bytes], replies: list[bytes] = ()):
        self.greeting, self.replies = greeting, list(replies)
        self.port: int | None = None
        self._started, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)

    async def _session(self, ws) -> None:
        for frame in self.greeting:
            await ws.send(frame)
        with contextlib.suppress(ConnectionClosed):
            for reply in self.replies:
                await ws.recv()
                await ws.send(reply)
            await ws.wait_closed()

    async def _main(self) -> None:
        async with serve(self._session, "127.0.0.1", 0, compression=None) as server:
            self.port = server.sockets[0].getsockname()[1]
            self._started.set()
            while not self._stop.is_set():
                await asyncio.sleep(0.02)

    def __enter__(self) -> str:
        self._thread.start()
        assert self._started.wait(10)
        return f"ws://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


OBS = {"state": np.zeros(8, np.float32), "prompt": "pick up the milk"}


@pytest.mark.parametrize("case", ["complex", "short data", "structured"])
def test_our_client_refuses_a_crafted_action_frame(case):
    bad, reason = CRAFTED[case]
    action = msgpack.packb({"actions": bad})
    with FaultServer([msgpack_numpy.packb({})], [action]) as url, PolicyClient(url) as client:
        with pytest.raises(
            PolicyTransportError, match=rf"sent a frame we refuse: action\['actions'\]: .*{reason}"
        ):
            client.infer(OBS)
        with pytest.raises(PolicyTransportError, match="the session is closed"):
            client.infer(OBS)


def test_our_client_refuses_crafted_metadata():
    metadata = msgpack.packb({"camera": {"intrinsics": CRAFTED["object"][0]}})
    with (
        FaultServer([metadata]) as url,
        pytest.raises(
            PolicyTransportError, match=r"metadata\['camera'\]\['intrinsics'\]: .*object dtype"
        ),
    ):
        PolicyClient(url)


def test_our_vla_eval_client_refuses_a_crafted_hello():
    hello = vla_frame({"action_spec": {"low": VLA_CRAFTED["not a png"][0]}}, kind="hello")
    with (
        FaultServer([], [hello]) as url,
        pytest.raises(
            PolicyTransportError,
            match=r"sent a frame we refuse: message\['payload'\]\['action_spec'\]\['low'\]: "
            "'png' image does not decode",
        ),
    ):
        VlaEvalClient(url)


def send_raw(url: str, frame: bytes | str) -> tuple[str, int]:
    """Send one frame as a peer would; the server's answer (text frame) and close code."""
    with connect(url, compression=None, max_size=None) as ws:
        assert isinstance(ws.recv(timeout=10), bytes)  # the metadata frame
        ws.send(frame)
        answer = ws.recv(timeout=10)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    return answer, closed.value.rcvd.code


@OPENPI_CONNECT
@pytest.mark.parametrize("case", ["complex", "short data", "negative shape", "unknown dtype"])
def test_our_server_answers_a_crafted_frame_with_one_line_and_goes_on(case):
    bad, _reason = CRAFTED[case]
    with PolicyServer(HoldPolicy(), metadata={"policy": "hold"}).start() as running:
        answer, code = send_raw(running.url, crafted_obs(bad))
        assert code == 1011
        assert "\n" not in answer
        assert answer.startswith("WireError: observation['images']['wrist']: ")
        client = WebsocketClientPolicy(running.url)  # a new session is served as before
        assert client.infer(OBS)["actions"].shape == (10, 7)
        client._ws.close()


def test_our_server_answers_non_msgpack_frames():
    with PolicyServer(HoldPolicy()).start() as running:
        assert send_raw(running.url, "hello") == (
            "WireError: observation: got a text frame, not a binary msgpack frame",
            1011,
        )
        answer, _code = send_raw(running.url, b"\xc1")
        assert answer.startswith("WireError: observation: not an openpi msgpack frame (1 bytes)")
        with PolicyClient(running.url) as client:
            assert client.infer(OBS)["actions"].shape == (10, 7)


class Broken:
    def infer(self, obs: dict) -> dict:
        raise ValueError("checkpoint has no action head;\nretrain it")


@OPENPI_CONNECT
def test_a_policy_failure_is_one_line_unless_debug():
    with PolicyServer(Broken()).start() as running:
        client = WebsocketClientPolicy(running.url)
        with pytest.raises(RuntimeError) as err:
            client.infer(OBS)
        assert str(err.value) == (
            "Error in inference server:\nValueError: checkpoint has no action head; retrain it"
        )
    with PolicyServer(Broken(), debug=True).start() as running:
        answer, code = send_raw(running.url, msgpack_numpy.packb(OBS))
        assert answer.startswith("Traceback (most recent call last):") and code == 1011
        assert answer.rstrip().endswith("ValueError: checkpoint has no action head;\nretrain it")
        client = PolicyClient(running.url)  # ours reports the traceback's last line
        with pytest.raises(PolicyTransportError, match=r"failed: retrain it$"):
            client.infer(OBS)


@OPENPI_CONNECT
def test_an_oversize_message_is_refused_naming_the_limit_and_the_flag():
    big = {**OBS, "image": np.zeros(2 * 2**20, np.uint8)}
    with PolicyServer(HoldPolicy(), max_message_bytes=2**20).start() as running:
        with (
            PolicyClient(running.url) as client,
            pytest.raises(
                PolicyTransportError,
                match=r"refused our 2\.0 MiB message as too big \(frame with \d+ bytes exceeds "
                r"limit of 1048576 bytes\); raise its limit \(gap policy serve NAME "
                r"--max-message-mb MB\)",
            ),
        ):
            client.infer(big)
        openpi = WebsocketClientPolicy(running.url)
        with pytest.raises(ConnectionClosed) as closed:
            openpi.infer(big)
        assert closed.value.rcvd.code == 1009
        with PolicyClient(running.url) as client:  # the server goes on
            assert client.infer(OBS)["actions"].shape == (10, 7)


@contextlib.contextmanager
def gap_policy_serve(*flags: str):
    """The real `gap policy serve hold` on a free loopback port, until the block ends; then
    the yielded list holds what it wrote to stderr."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [GAP, "policy", "serve", "hold", "--port", str(port), *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "never listened"
                time.sleep(0.1)
        yield f"ws://127.0.0.1:{port}", stderr
    finally:
        proc.terminate()
        stderr.append(proc.communicate(timeout=10)[1])


def test_gap_policy_serve_caps_messages_at_64_mib_by_default():
    assert (
        build_parser().parse_args(["policy", "serve", "hold", "--port", "1"]).max_message_mb == 64
    )
    with gap_policy_serve() as (url, _):
        client = PolicyClient(url)
        with pytest.raises(PolicyTransportError, match="exceeds limit of 67108864 bytes"):
            client.infer({"image": np.zeros(64 * 2**20 + 1, np.uint8)})
        with PolicyClient(url) as client:
            assert client.infer(OBS)["actions"].shape == (10, 7)


def test_gap_policy_serve_max_message_mb_and_debug():
    with gap_policy_serve("--max-message-mb", "0.5") as (url, stderr):
        client = PolicyClient(url)
        with pytest.raises(PolicyTransportError, match="exceeds limit of 524288 bytes"):
            client.infer({"image": np.zeros(2**19, np.uint8)})
        answer, _ = send_raw(url, crafted_obs(CRAFTED["complex"][0]))
        assert answer.startswith("WireError: observation['images']['wrist']: ")
        assert "\n" not in answer
    assert "--max-message-mb" in stderr[0]  # the server says how to raise its limit
    with gap_policy_serve("--debug") as (url, _):
        answer, _ = send_raw(url, crafted_obs(CRAFTED["complex"][0]))
        assert answer.startswith("Traceback (most recent call last):")
        assert "WireError: observation['images']['wrist']: " in answer
