"""The relays of `gap serve`: each attached client as the policy server of its trials.

A trial runs as a pytest `policy_only` trial does, its policy client (policies/client.py) on an
openpi websocket to a policy server. Here that server is the relay: every observation goes down
the attached client's websocket, and its reply comes back as the policy's answer. One listener
on loopback (`RelayHub`), on the server's own event loop, serves the relays of every attachment:
an attachment costs no thread, listening socket or event loop of its own, only the trial's
connection while a trial runs. Each relay is reached by a url token of its own (`?token=`: other
users of the machine can find the port, not the token; records mask it).

The relay waits on the client as long as the trial waits on the relay (half a second less, so
the limit is the reason recorded): the policy entry's `timeout_s`, and its `warmup_timeout_s`
for the attachment's first inference (the trial's warm-up, policies/warmup.py). A client gone,
silent past that, or answering out of turn breaks the relay (`broken` says why): the inference
and every later one fail at once, the trial is an infrastructure failure, and the attachment
ends (a late reply would answer the wrong step).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from pytest_gap.bind import LOOPBACK
from pytest_gap.doors import new_secret, refuse_browsers, same_secret
from pytest_gap.errors import one_line
from pytest_gap.policies.wire import (
    HEALTH_PATH,
    INTERNAL_ERROR_CLOSE,
    MAX_QUEUED_FRAMES,
    WireError,
    packb,
    unpackb,
)

MAX_OBS_BYTES = 64 * 2**20  # an observation from the trial's own client: two images and a state
GONE = "the evaluation client went away"
# The trial's clock starts before the relay's (the observation is in flight), so the relay
# gives up a moment early: the reason recorded is the limit, not the trial's disconnect.
RELAY_MARGIN_S = 0.5


def lost(ws: ServerConnection) -> asyncio.Future:
    """A future done once `ws`'s connection is lost: the one `wait_closed` shields, so waiting
    on it next to other futures makes no task of its own."""
    found = getattr(ws, "connection_lost_waiter", None)
    return found if isinstance(found, asyncio.Future) else asyncio.ensure_future(ws.wait_closed())


class Relay:
    """One attached client (`ws`) as a policy: `ask(obs)` -> its reply, within the trial's own
    reply bounds."""

    def __init__(self, ws: ServerConnection, metadata: dict, timeout_s: float, warmup_s: float):
        self.ws, self.metadata = ws, metadata
        self.timeout_s, self.warmup_s = timeout_s, warmup_s
        self.replies = 0
        self.broken: str | None = None  # why the client can no longer answer
        self.lock = asyncio.Lock()  # one trial connection asks at a time

    def fail(self, why: str) -> None:
        """The client can answer no more (the first reason stays)."""
        if self.broken is None:
            self.broken = why

    async def ask(self, obs: dict, asker: ServerConnection) -> dict:
        """The client's reply to `obs`; ConnectionError (saying why) when it is gone, does not
        answer in time, answers something else, or `asker` (the trial) stops waiting first."""
        if self.broken:
            raise ConnectionError(self.broken)
        first = self.replies == 0
        limit = self.warmup_s if first else self.timeout_s
        key = "warmup_timeout_s" if first else "timeout_s"
        started = time.monotonic()
        exchange = asyncio.ensure_future(self._exchange(obs))
        done, _ = await asyncio.wait(
            {exchange, lost(asker)},
            timeout=limit - min(RELAY_MARGIN_S, limit / 10),
            return_when=asyncio.FIRST_COMPLETED,
        )
        if exchange not in done:
            exchange.cancel()
            self.fail(
                "the trial stopped waiting for the evaluation client's reply after "
                f"{time.monotonic() - started:.1f} s (the policy entry's {key} is {limit:g} s)"
                if done
                else f"the evaluation client did not reply within {limit:g} s (the policy "
                f"entry's {key})"
            )
            raise ConnectionError(self.broken)
        try:
            reply = exchange.result()
        except ConnectionClosed:
            self.fail(GONE)
            raise ConnectionError(self.broken) from None
        except ValueError as exc:
            self.fail(f"the evaluation client's reply was refused: {one_line(str(exc), 200)}")
            raise ConnectionError(self.broken) from None
        self.replies += 1
        return reply

    async def _exchange(self, obs: dict) -> dict:
        await self.ws.send(packb({"type": "obs", "obs": obs}))
        frame = unpackb(await self.ws.recv(), "reply")
        if not isinstance(frame, dict) or frame.get("type") != "reply":
            raise ValueError("the client answered something other than a reply frame")
        if not isinstance(frame.get("reply"), dict):
            raise ValueError("the client's reply frame holds no reply mapping")
        return frame["reply"]


class RelayHub:
    """One loopback listener for every relay of this server, on the server's event loop."""

    def __init__(self) -> None:
        self.port = 0
        self._relays: dict[str, Relay] = {}

    def open(self, relay: Relay) -> str:
        """Serve `relay`; the url its trials' policy client connects to (its token inside)."""
        token = new_secret()
        self._relays[token] = relay
        return f"ws://{LOOPBACK}:{self.port}/?token={token}"

    def close(self, url: str) -> None:
        self._relays.pop(parse_qs(urlsplit(url).query).get("token", [""])[-1], None)

    def _find(self, path: str) -> Relay | None:
        given = parse_qs(urlsplit(path).query).get("token", [None])[-1]
        found = None
        for token, relay in self._relays.items():  # constant time in each token
            if same_secret(given, token):
                found = relay
        return found

    def _http(self, connection: ServerConnection, request):
        refused = refuse_browsers(connection, request)
        if refused is not None:
            return refused
        if urlsplit(request.path).path == HEALTH_PATH:
            return connection.respond(HTTPStatus.OK, "OK\n")
        relay = self._find(request.path)
        if relay is None:
            why = "missing or wrong ?token= in the url: this relay serves its own trials only"
            return connection.respond(HTTPStatus.FORBIDDEN, why + "\n")
        if relay.broken:  # fail fast: the trial's client need not wait for a reply
            return connection.respond(HTTPStatus.GONE, relay.broken + "\n")
        return None

    async def _session(self, conn: ServerConnection) -> None:
        relay = self._find(conn.request.path)
        if relay is None:
            return
        async with relay.lock:
            with contextlib.suppress(ConnectionClosed):
                await conn.send(packb(relay.metadata))  # openpi: the metadata frame first
                while True:
                    frame = await conn.recv()
                    t0 = time.perf_counter()
                    try:
                        reply = dict(await relay.ask(unpackb(frame, "observation"), conn))
                    except (WireError, ConnectionError) as exc:
                        return await _fail(conn, exc)
                    reply["server_timing"] = {"infer_ms": (time.perf_counter() - t0) * 1000}
                    await conn.send(packb(reply))

    async def serve(self, started: asyncio.Future) -> None:
        """Serve until cancelled; `started` receives the bound port."""
        async with serve(
            self._session,
            LOOPBACK,
            0,
            compression=None,
            max_size=MAX_OBS_BYTES,
            max_queue=MAX_QUEUED_FRAMES,
            process_request=self._http,
        ) as server:
            self.port = server.sockets[0].getsockname()[1]
            started.set_result(self.port)
            await asyncio.get_running_loop().create_future()


async def _fail(conn: ServerConnection, exc: Exception) -> None:
    """openpi's convention: an error text frame, then close with 1011."""
    with contextlib.suppress(ConnectionClosed):
        await conn.send(f"{type(exc).__name__}: {one_line(str(exc), 300)}")
        await conn.close(INTERNAL_ERROR_CLOSE, "the evaluation client cannot answer")
