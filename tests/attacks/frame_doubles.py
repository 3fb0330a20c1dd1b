"""The frame attacks (issue 33, frames and replies): crafted frames, a real `gap policy serve`
to send them to, a hostile server for our client, and the processes that measure what each
costs. tests/attacks/test_frames.py asserts on them; bench/dos.py prints them as a table.

- `SERVER_ATTACKS`: observation frames for our openpi server; `CLIENT_ATTACKS`: frames a hostile
  server answers our client with (openpi and vla-eval).
- `SlowHold`: a policy for a real server (`gap policy serve tests.attacks.frame_doubles:SlowHold`).
- `python -m tests.attacks.frame_doubles PROTOCOL URL`: our client as a trial uses it (connect,
  fingerprint the metadata, infer once); prints one JSON line: what it raised and how far its
  own peak RSS grew.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgpack
import numpy as np
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from pytest_gap.policies.builtin import HoldPolicy

ROOT = Path(__file__).resolve().parents[2]
GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"
MIB = 2**20
# The bound on a process's peak RSS growth per hostile frame (issue 33), server and client alike.
PEAK_LIMIT_MIB = 256
# A client that never waits for replies: this many frames of PIPELINE_MIB each; the server may
# hold what a few of them take, however many come (websockets' default queue held 16).
PIPELINE_FRAMES, PIPELINE_MIB, PIPELINE_HELD = 20, 16, 8
# Address space for a server under attack: an unbounded decoder fails here instead of taking
# the machine's memory (the unfixed code's 64 MiB frame of small containers wanted ~5 GiB).
SERVER_ADDRESS_SPACE = 3 * 2**30
OBS = {"state": np.zeros(8, np.float32), "prompt": "pick up the milk"}


# -- crafted frames ------------------------------------------------------------------------------
def empty_maps(count: int = 3_000_000) -> bytes:
    """An array of `count` empty maps: 1 byte each on the wire, ~70 as Python objects."""
    return b"\xdd" + count.to_bytes(4, "big") + b"\x80" * count


def nested_maps(depth: int = 1000) -> bytes:
    """{"a": {"a": ... None}} `depth` deep: under msgpack's own stack limit (1024), over any
    recursion that walks it later (metadata_digest)."""
    return b"\x81\xa1a" * depth + b"\xc0"


def small_containers(size: int = 64 * MIB) -> bytes:
    """A `size`-byte frame (the server's default limit) of [{}, [], ""] triples."""
    count = (size - 5) // 4
    return b"\xdd" + count.to_bytes(4, "big") + b"\x93\x80\x90\xa0" * count


def ndarray(data: bytes, dtype: str, shape: list[int]) -> dict:
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}


def observation(state: dict) -> bytes:
    return msgpack.packb({"observation/state": state, "prompt": "pick up the milk"})


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


@functools.cache
def png(width: int, height: int, channels: int = 3, pixels: bool = True) -> bytes:
    """A PNG of zeros as a hostile peer makes one: `pixels` rows that decode (a few hundred KB
    that decode to width x height x channels bytes), or none (a header that claims the size)."""
    color = {3: 2, 4: 6}[channels]
    header = struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0)
    deflate = zlib.compressobj(9)
    row = b"\0" * (1 + width * channels)  # filter byte 0, then the row
    rows = b"".join(deflate.compress(row) for _ in range(height if pixels else 0))
    data = rows + deflate.flush()
    chunks = _chunk(b"IHDR", header) + _chunk(b"IDAT", data) + _chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


def vla_message(kind: str, payload: dict) -> bytes:
    message = {"type": kind, "payload": payload, "seq": 1, "timestamp": 0.0}
    return msgpack.packb(message, use_bin_type=True)


def vla_image(data: bytes, shape: list[int]) -> dict:
    return {"__image__": True, "format": "png", "data": data, "shape": shape}


VLA_HELLO = vla_message("hello", {"protocol_version": 1, "harness_version": "hostile"})


def vla_action(**extra) -> bytes:
    actions = {"__ndarray__": True, "data": bytes(28), "dtype": "<f4", "shape": [1, 7]}
    return vla_message("action", {"actions": actions, **extra})


def openpi_action(**extra) -> bytes:
    return msgpack.packb({"actions": ndarray(bytes(280), "<f4", [10, 7]), **extra})


def openpi_action_around(raw: bytes) -> bytes:
    """An action reply whose "pad" is the msgpack `raw` (a structure, not a bin of it)."""
    actions = msgpack.packb("actions") + msgpack.packb(ndarray(bytes(280), "<f4", [10, 7]))
    return b"\x82" + actions + msgpack.packb("pad") + raw


@dataclass(frozen=True)
class ServerAttack:
    """An observation frame for our server, and what its one log line must say."""

    frame: Callable[[], bytes]
    refusal: str


SERVER_ATTACKS = {
    "2.9 MiB of empty maps": ServerAttack(empty_maps, "holds more than 65536 msgpack objects"),
    "1000-deep nested maps": ServerAttack(nested_maps, "nests deeper than 32 levels"),
    "ndarray (10**6, 10**6) with 8 bytes": ServerAttack(
        lambda: observation(ndarray(bytes(8), "<f8", [10**6, 10**6])),
        r"observation\['observation/state'\]: data is 8 bytes but shape",
    ),
    "object dtype": ServerAttack(
        lambda: observation(ndarray(bytes(8), "|O", [1])),
        r"observation\['observation/state'\]: dtype '\|O' is an object dtype",
    ),
    "64 MiB of small containers": ServerAttack(
        small_containers, "holds more than 65536 msgpack objects"
    ),
}


@dataclass(frozen=True)
class ClientAttack:
    """What a hostile server sends: `greeting` frames on connect, then `replies[i]` after the
    i-th frame it receives (None: no answer, as for vla-eval's episode_start)."""

    protocol: str
    greeting: Callable[[], list[bytes]]
    replies: Callable[[], list[bytes | None]]
    refusal: str


def _openpi(reply: Callable[[], bytes], refusal: str, metadata=lambda: msgpack.packb({})):
    return ClientAttack("openpi", lambda: [metadata()], lambda: [reply()], refusal)


def _vla(reply: Callable[[], bytes], refusal: str) -> ClientAttack:
    return ClientAttack("vla-eval", list, lambda: [VLA_HELLO, None, reply()], refusal)


CLIENT_ATTACKS = {
    "openpi reply of 64 MiB": _openpi(
        lambda: openpi_action(pad=bytes(64 * MIB)),
        r"sent a frame over our limit \(frame with \d+ bytes exceeds limit of 16777216 bytes\)"
        r".*raise the limit \(policies\.<id>\.max_reply_mb",
    ),
    "vla-eval reply of 64 MiB": _vla(
        lambda: vla_action(pad=bytes(64 * MIB)), "sent a frame over our limit"
    ),
    "openpi reply of 2.9 MiB of empty maps": _openpi(
        lambda: openpi_action_around(empty_maps()), "action: holds more than 65536 msgpack objects"
    ),
    "openpi metadata 1000 deep": _openpi(
        openpi_action, "metadata: nests deeper than 32 levels", metadata=nested_maps
    ),
    "vla-eval png claiming 100000x100000": _vla(
        lambda: vla_action(image=vla_image(png(100_000, 100_000, pixels=False), [1, 1, 3])),
        r"\['image'\]: png image claims over 4096x4096 pixels",
    ),
    "vla-eval png bomb 8000x8000 (~200 KB)": _vla(
        lambda: vla_action(image=vla_image(png(8000, 8000), [8000, 8000, 3])),
        r"\['image'\]: png image claims 8000x8000 pixels, over the wire format's bound",
    ),
    "vla-eval four 4096x4096 RGBA pngs": _vla(
        lambda: vla_action(images=[vla_image(png(4096, 4096, 4), [4096, 4096, 4])] * 4),
        r"\['images'\]\[1\]: png image of 4096x4096 RGBA would take the frame's decoded images "
        "over 64 MiB",
    ),
}


# -- measuring -----------------------------------------------------------------------------------
def peak_rss_mib(pid: int | str = "self") -> float:
    """A process's peak resident set so far (VmHWM), MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Served:
    url: str
    pid: int
    log: Path

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()


def _env() -> dict[str, str]:
    """This environment, with the repository importable (tests.attacks); a PYTHONPATH given
    stays first, so the attacks can be run against another copy of pytest_gap (the unfixed
    code, for the "before" column)."""
    paths = [p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _cap_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (SERVER_ADDRESS_SPACE, SERVER_ADDRESS_SPACE))


@contextlib.contextmanager
def policy_server(workdir: Path, policy: str = "hold", *flags: str) -> Iterator[Served]:
    """A real `gap policy serve POLICY` on loopback, run in `workdir` with its stderr (its log)
    in `workdir/server.log`, until the block ends."""
    port, log = _free_port(), workdir / "server.log"
    health = "/health" if "vla-eval" in flags else "/healthz"  # vla-eval's server's own path
    with log.open("w") as err:
        proc = subprocess.Popen(
            [GAP, "policy", "serve", policy, "--port", str(port), *flags],
            cwd=workdir,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
            preexec_fn=_cap_address_space,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{health}", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    detail = log.read_text()
                    raise RuntimeError(f"gap policy serve never listened: {detail}") from None
                time.sleep(0.1)
        yield Served(f"ws://127.0.0.1:{port}", proc.pid, log)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def send_frame(url: str, frame: bytes) -> tuple[str, int | None]:
    """Send one observation frame as a peer would: the server's answer (its text frame, or
    what came instead) and the close code."""
    with connect(url, compression=None, max_size=None, open_timeout=30) as ws:
        ws.recv(timeout=30)  # the metadata frame
        ws.send(frame)
        try:
            answer = ws.recv(timeout=120)
        except ConnectionClosed as exc:
            return "closed without an answer", exc.rcvd.code if exc.rcvd else None
        except TimeoutError:
            return "no answer in 120 s", None
        if isinstance(answer, bytes):
            return f"served: a {len(answer)}-byte reply", None
        try:
            ws.recv(timeout=30)
        except ConnectionClosed as exc:
            return answer, exc.rcvd.code if exc.rcvd else None
        return answer, None


def honest_client(url: str) -> tuple[int, ...]:
    """An honest client's action shape, from a fresh connection."""
    from pytest_gap.policies.client import PolicyClient

    with PolicyClient(url, timeout_s=60) as client:
        return tuple(client.infer(dict(OBS))["actions"].shape)


class HostileServer:
    """A server on loopback that answers as `attack` says, on a thread of this process."""

    def __init__(self, attack: ClientAttack):
        self.greeting, self.replies = attack.greeting(), attack.replies()
        self.port: int | None = None
        self._started, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)

    async def _session(self, ws) -> None:
        with contextlib.suppress(ConnectionClosed):
            for frame in self.greeting:
                await ws.send(frame)
            for reply in self.replies:
                await ws.recv()
                if reply is not None:
                    await ws.send(reply)
            await ws.wait_closed()

    async def _main(self) -> None:
        async with serve(self._session, "127.0.0.1", 0, compression=None, max_size=None) as srv:
            self.port = srv.sockets[0].getsockname()[1]
            self._started.set()
            while not self._stop.is_set():
                await asyncio.sleep(0.02)

    def __enter__(self) -> str:
        self._thread.start()
        assert self._started.wait(30)
        return f"ws://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def client_outcome(attack: ClientAttack) -> dict:
    """Our client (a process of its own) against a server answering as `attack` says."""
    with HostileServer(attack) as url:
        done = subprocess.run(
            [sys.executable, "-P", "-m", "tests.attacks.frame_doubles", attack.protocol, url],
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
    if done.returncode != 0 or not done.stdout.strip():
        return {"raised": f"exit {done.returncode}", "error": done.stderr.strip()[-300:]}
    return json.loads(done.stdout.splitlines()[-1])


# -- the processes -------------------------------------------------------------------------------
class SlowHold(HoldPolicy):
    """The hold policy taking a model's while per inference: frames a client sends without
    waiting for replies pile up in front of it (the per-connection queue attack)."""

    def infer(self, obs: dict) -> dict:
        time.sleep(1.0)
        return super().infer(obs)


def pipeline(url: str, frames: int, size: int) -> None:
    """Send `frames` frames of `size` bytes without reading a reply, for a few seconds."""
    frame = msgpack.packb({"pad": bytes(size)})
    with connect(url, compression=None, max_size=None, close_timeout=1) as ws:
        ws.recv(timeout=30)

        def pump() -> None:
            with contextlib.suppress(Exception):  # the socket closes under it at the end
                for _ in range(frames):
                    ws.send(frame)

        threading.Thread(target=pump, daemon=True).start()
        time.sleep(5)


def probe(protocol: str, url: str) -> dict:
    """Connect, fingerprint the metadata and infer once, as a trial does (skills/context.py)."""
    import PIL.PngImagePlugin  # noqa: F401  (before the baseline: decoding an image loads it)

    from pytest_gap.errors import InfraFailure
    from pytest_gap.policies.client import connect_policy
    from pytest_gap.policies.wire import metadata_digest

    before = peak_rss_mib()
    outcome: dict = {"raised": None, "error": None, "infra_failure": False}
    try:
        client = connect_policy(url, protocol, timeout_s=60)
        metadata_digest(client.metadata)
        reply = client.infer(dict(OBS))
        outcome["reply_keys"] = sorted(map(str, reply))
    except BaseException as exc:  # the point is to see what escapes, whatever it is
        outcome.update(
            raised=type(exc).__name__, error=str(exc), infra_failure=isinstance(exc, InfraFailure)
        )
    outcome["peak_rss_growth_mib"] = peak_rss_mib() - before
    return outcome


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1], sys.argv[2])))
