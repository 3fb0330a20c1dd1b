"""Serve a policy over the openpi websocket protocol (see wire.py).

Any object with `infer(obs: dict) -> dict` (openpi's BasePolicy shape) can be served. Inference
runs in a worker thread, one call at a time (a model is one device), so slow inference never
blocks the event loop's handshakes and health checks. `GET /healthz` answers 200 on the same
port.

Episodes: openpi's protocol has no episode messages, so each websocket connection is one
episode (run_policy opens one per trial, its warm-up one of its own). A policy with
`fork() -> policy` keeps per-episode state: the server calls fork() once per connection and
serves that connection from the copy, so a new connection starts afresh and two concurrent
ones never share state (a replay's position). A policy without fork() is shared by all.

Dynamic batching (`max_batch_size` > 1, for policies with `infer_batch(list) -> list`):
observations arriving from different connections within `max_wait_ms` of the first are
inferred together, and each connection gets its own reply. A policy with fork() cannot be
batched (one infer_batch call cannot keep the connections' states apart) and is refused.

Hardening: a frame over `max_message_bytes` (default 64 MiB) is refused by the websocket layer
with close code 1009 before it is buffered whole; a frame that does not decode, or a policy
that raises, gets openpi's answer (an error text frame, then close 1011) on that connection
only: the server goes on serving the others and new ones. The text frame is one line (the
exception type and message) unless `debug`, when it is the traceback as openpi sends it.

Doors: a browser's request (an `Origin` or `Sec-Fetch-Site` header) is refused with 403
(doors.py: a web page must not drive a policy on loopback). With `url_token` (the relays of
`gap serve`), a handshake whose url does not carry `?token=<url_token>` is refused with 403:
other users of the machine can find the port, not the token (it lives in this process only,
and records mask a url's `token=`).

Frames decode within wire.py's bounds (objects, depth, strings, dtypes), so a hostile frame
costs what reading it costs, not what it claims, and one warning line in the log. Memory per
connection is bounded too: the websocket layer reads one frame ahead of the one being served
and then stops reading the socket (wire.MAX_QUEUED_FRAMES), so a client that sends without
waiting for replies holds about four times max_message_bytes however many frames it sends
(measured: ~270 MiB at 64 MiB; websockets' default queue let 10 such frames hold 600 MiB), and
the batching queue holds at most one batch of waiting observations.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import traceback
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from pytest_gap.bind import exposure_notice
from pytest_gap.doors import refuse_browsers, same_secret
from pytest_gap.errors import GapError, shown
from pytest_gap.policies.wire import (
    HEALTH_PATH,
    INTERNAL_ERROR_CLOSE,
    MAX_QUEUED_FRAMES,
    MESSAGE_TOO_BIG_CLOSE,
    WireError,
    packer,
    unpackb,
)

DEFAULT_MAX_MESSAGE_MB = 64
log = logging.getLogger(__name__)


class Policy(Protocol):
    def infer(self, obs: dict) -> dict: ...


def check_batchable(policy: Any, max_batch_size: int) -> None:
    """GapError unless `policy` can be served `max_batch_size` observations at a time: it needs
    infer_batch, and no per-connection state (fork()) one batch across connections would mix."""
    if max_batch_size > 1 and not callable(getattr(policy, "infer_batch", None)):
        raise GapError(
            f"max_batch_size {max_batch_size}: batching needs a policy with "
            "infer_batch(list of obs) -> list of replies"
        )
    if max_batch_size > 1 and callable(getattr(policy, "fork", None)):
        raise GapError(
            f"max_batch_size {max_batch_size}: the policy keeps per-connection state "
            "(fork()), which one infer_batch call across connections cannot keep apart; "
            "serve it with max_batch_size 1"
        )


class PolicyServer:
    def __init__(
        self,
        policy: Policy,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        metadata: dict[str, Any] | None = None,
        max_batch_size: int = 1,
        max_wait_ms: float = 5.0,
        max_message_bytes: int | None = DEFAULT_MAX_MESSAGE_MB * 2**20,
        debug: bool = False,
        url_token: str | None = None,
    ):
        check_batchable(policy, max_batch_size)
        self.policy, self.host, self.port = policy, host, port
        self.metadata = metadata or {}
        self.max_batch_size, self.max_wait_s = max_batch_size, max_wait_ms / 1000
        self.max_message_bytes, self.debug = max_message_bytes, debug
        self.url_token = url_token
        self.batch_sizes: list[int] = []  # for inspection: the size of every batch inferred
        self._infer_lock = threading.Lock()
        self._queue: asyncio.Queue | None = None

    def _connection_policy(self) -> Policy:
        fork = getattr(self.policy, "fork", None)
        return fork() if callable(fork) else self.policy

    def _infer_one(self, policy: Policy, obs: dict) -> dict:
        with self._infer_lock:
            return policy.infer(obs)

    def _infer_many(self, batch: list[dict]) -> list[dict]:
        with self._infer_lock:
            replies = list(self.policy.infer_batch(batch))
        if len(replies) != len(batch):
            raise RuntimeError(f"infer_batch returned {len(replies)} replies for {len(batch)}")
        return replies

    async def _infer(self, policy: Policy, obs: dict) -> dict:
        if self._queue is None:
            return await asyncio.to_thread(self._infer_one, policy, obs)
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((obs, future))
        return await future

    async def _batcher(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self.max_wait_s
            while len(batch) < self.max_batch_size:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), remaining))
                except TimeoutError:
                    break
            self.batch_sizes.append(len(batch))
            try:
                replies = await asyncio.to_thread(self._infer_many, [obs for obs, _ in batch])
            except Exception as exc:
                for _, future in batch:
                    future.set_exception(exc)
                continue
            for (_, future), reply in zip(batch, replies, strict=True):
                future.set_result(reply)

    async def _session(self, ws: ServerConnection) -> None:
        pack = packer().pack
        policy = self._connection_policy()  # one episode: a fresh state for a stateful policy
        await ws.send(pack(self.metadata))
        while True:
            try:
                frame = await ws.recv()
            except ConnectionClosed as exc:
                if exc.sent is not None and exc.sent.code == MESSAGE_TOO_BIG_CLOSE:
                    log.warning(
                        "refused a message from %s: %s (raise the limit with "
                        "gap policy serve --max-message-mb)",
                        ws.remote_address,
                        shown(exc.sent.reason),
                    )
                return
            t0 = time.perf_counter()
            try:
                obs = unpackb(frame, "observation")
            except WireError as exc:  # the peer's fault, not ours: one line, never a traceback
                # the reason may quote the frame: escaped, a peer cannot forge log lines
                log.warning("refused a frame from %s: %s", ws.remote_address, shown(exc))
                return await self._fail(ws, exc)
            del frame  # obs holds its data: a big frame is not kept twice while inferring
            try:
                action = dict(await self._infer(policy, obs))
                action["server_timing"] = {"infer_ms": (time.perf_counter() - t0) * 1000}
                await ws.send(pack(action))
            except ConnectionClosed:
                return
            except Exception as exc:
                return await self._fail(ws, exc)

    async def _fail(self, ws: ServerConnection, exc: Exception) -> None:
        """openpi's convention: an error text frame, then close with 1011."""
        with contextlib.suppress(ConnectionClosed):
            await ws.send(self._error_text(exc))
            await ws.close(INTERNAL_ERROR_CLOSE, "Internal server error")

    def _error_text(self, exc: Exception) -> str:
        if self.debug:
            return "".join(traceback.format_exception(exc))
        return f"{type(exc).__name__}: {' '.join(str(exc).split())}"

    def _http(self, connection: ServerConnection, request):
        refused = refuse_browsers(connection, request)
        if refused is not None:
            return refused
        parts = urlsplit(request.path)
        if parts.path == HEALTH_PATH:
            return connection.respond(HTTPStatus.OK, "OK\n")
        if self.url_token is not None:
            given = parse_qs(parts.query).get("token", [None])[-1]
            if not same_secret(given, self.url_token):
                why = "missing or wrong ?token= in the url: this relay serves its own trials only"
                return connection.respond(HTTPStatus.FORBIDDEN, why + "\n")
        return None

    async def serve(self, started: asyncio.Future | None = None) -> None:
        """Serve until cancelled; `started` receives the bound port."""
        batcher = None
        if self.max_batch_size > 1:
            # Each connection waits for its reply before it reads on, so waiting observations
            # are one per connection; past a batch's worth, a connection waits to queue.
            self._queue = asyncio.Queue(maxsize=self.max_batch_size)
            batcher = asyncio.create_task(self._batcher())
        try:
            await self._serve(started)
        finally:
            if batcher is not None:
                batcher.cancel()

    async def _serve(self, started: asyncio.Future | None) -> None:
        notice = exposure_notice("the policy server", self.host)
        if notice:
            log.warning(notice)
        async with serve(
            self._session,
            self.host,
            self.port,
            compression=None,
            max_size=self.max_message_bytes,
            max_queue=MAX_QUEUED_FRAMES,
            process_request=self._http,
        ) as server:
            self.port = server.sockets[0].getsockname()[1]
            if started is not None:
                started.set_result(self.port)
            await asyncio.get_running_loop().create_future()  # until cancelled

    def run(self, listening: Callable[[int], None] | None = None) -> None:
        """Serve in the foreground until interrupted; `listening` gets the port once it is
        bound (a "serving" line printed before that would let a client race the bind)."""

        async def main() -> None:
            started = asyncio.get_running_loop().create_future()
            if listening is not None:
                started.add_done_callback(lambda done: listening(done.result()))
            await self.serve(started)

        asyncio.run(main())

    def start(self) -> RunningServer:
        """Serve from a background thread (in-process use and tests)."""
        return RunningServer(self)


class RunningServer:
    def __init__(self, server: PolicyServer):
        self.server = server
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._task: asyncio.Task | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="gap-policy-server", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=30)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        started = self._loop.create_future()
        self._task = self._loop.create_task(self.server.serve(started))
        started.add_done_callback(lambda _: self._ready.set())
        try:
            self._loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # e.g. the port is taken
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        """Where clients connect, with the url token if the server has one."""
        base = f"ws://{self.server.host}:{self.server.port}"
        return base if self.server.url_token is None else f"{base}/?token={self.server.url_token}"

    def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(timeout=10)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
