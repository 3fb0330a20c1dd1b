"""`gap serve`: the evaluation server. One asyncio websockets server answers the control plane
(HTTP GET: health, run status; websocket `/control`: submissions) and the data plane (websocket
`/episodes`: attached clients). See protocol.py for the messages.

Each attached client gets one simulator slot (its own env pool, on a thread of its own made at
its first trial, since a GL context belongs to the thread that made it) and a relay (relay.py:
one loopback listener on this event loop serves them all). A trial then runs exactly as a pytest
`policy_only` trial does (run/trial.py TrialRun: the mode's template, run_policy, the goal check,
result.json, trace), with the relay as the policy's server; every observation goes down the
client's websocket and its reply comes back as the policy's answer. A client that goes away (its
connection is watched while it runs a trial and while it waits for one) is detached at once; its
trial is an infrastructure failure, handed out again within runs.py's bounds.

What a request may cost is bounded before any work starts (limits.py, the `--max-...` options):
the trials and steps of a run, from its config alone; the clients attached to a run and to the
server, and the worker ids, before a thread, relay or env is made. Reading a run (its config,
plan and records) runs off the event loop: the health check answers while a run loads.

Doors: a browser's request is refused on every path (doors.py); the bearer token, when the
server has one, guards every path but the health check; a client token (`client_token`, which
the online platform mints per task) opens `/episodes` for its run and `GET /runs/<its run>`
only; attaching to a run needs the run's secret (Hello.run_secret, checked against the digest in
its card); a relay answers only connections that carry its own url token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from http import HTTPStatus
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import ValidationError
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Response

from pytest_gap.bind import LOOPBACK, exposure_notice
from pytest_gap.doors import bearer, refuse_browsers, same_secret
from pytest_gap.errors import one_line
from pytest_gap.names import is_name
from pytest_gap.outputs.hook import write_outputs
from pytest_gap.policies.wire import HEALTH_PATH, MAX_QUEUED_FRAMES, packb, unpackb
from pytest_gap.results import now_iso, write_json
from pytest_gap.service.limits import ServiceLimits
from pytest_gap.service.protocol import (
    CONTROL_PATH,
    EPISODES_PATH,
    HELD_OUT,
    MAX_REASONS,
    RUNS_PATH,
    Hello,
    RunRefused,
    RunStatus,
    Submit,
)
from pytest_gap.service.runs import SERVICE_FILE, ServiceRun, submit
from pytest_gap.service.slots import Slots
from pytest_gap.service.splits import Splits

log = logging.getLogger(__name__)
MAX_FRAME_BYTES = 64 * 2**20
IDLE_POLL_S = 0.5  # a worker with nothing to claim looks again this often (or when it closes)


def _first_error(exc: ValidationError) -> str:
    """A malformed frame's first problem on one line, naming the field (never its value)."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "frame"
    return f"{where}: {one_line(first['msg'].removeprefix('Value error, '), 300)}"


class EvalServer:
    def __init__(
        self,
        runs_dir: Path,
        *,
        host: str = LOOPBACK,
        port: int = 0,
        token: str | None = None,
        splits: Splits | None = None,
        limits: ServiceLimits | None = None,
        client_token: str | None = None,
        client_run: str | None = None,
    ):
        self.runs_dir, self.host, self.port = runs_dir.resolve(), host, port
        self.token, self.splits = token, splits or {}
        self.limits = limits or ServiceLimits()
        self.client_token, self.client_run = client_token, client_run
        self.runs: dict[str, ServiceRun] = {}
        self.refused: dict[str, str] = {}  # run id -> why its run on disk is not served
        self._loading: dict[str, asyncio.Future] = {}
        self._scopes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.slots = Slots(self.limits, self._write_summary)

    # -- runs -----------------------------------------------------------------------------------
    async def run(self, run_id: str) -> ServiceRun | None:
        """The run, loaded from the runs dir the first time it is asked for, off the event loop
        (a restarted server resumes every run it finds there). RunRefused, kept, for a run on
        disk this server will not serve (over its limits, splits it lacks)."""
        if run_id in self.runs:
            return self.runs[run_id]
        if run_id in self.refused:
            raise RunRefused(self.refused[run_id])
        if not is_name(run_id):  # a run id from a url path: never a path of its own
            return None
        run_dir = self.runs_dir / run_id
        if not (run_dir / SERVICE_FILE).is_file() or run_dir.parent != self.runs_dir:
            return None
        loading = self._loading.get(run_id)
        if loading is None:  # one load however many ask at once
            loading = asyncio.ensure_future(
                asyncio.to_thread(ServiceRun, run_dir, self.splits, self.limits)
            )
            self._loading[run_id] = loading
        try:
            run = await asyncio.shield(loading)
        except RunRefused as exc:
            self.refused[run_id] = str(exc)
            raise
        finally:
            self._loading.pop(run_id, None)
        return self.runs.setdefault(run_id, run)

    def status(self, run: ServiceRun) -> RunStatus:
        workers = [w for (rid, _), w in sorted(self.slots.workers.items()) if rid == run.run_id]
        held_out = run.split == HELD_OUT
        if held_out:  # a trial key names its seed
            workers = [w.model_copy(update={"current": None}) for w in workers]
        attached = [w for w in workers if w.state == "attached"]
        relays = self.slots.relays.items()
        replies = sum(r.replies for (rid, _), r in relays if rid == run.run_id)
        if run.ended and run.summarized and not attached:
            state = "finished"
        elif run.ended:  # its outputs being written, or its clients told: not over yet
            state = "active"
        elif not attached:
            state = "waiting for clients"
        elif not run.saved and not replies:
            state = "model loading"
        else:
            state = "active"
        reasons = run.given_up_reasons(held_out)
        return RunStatus(
            run_id=run.run_id,
            split=run.split,
            state=state,
            expected=len(run.trials),
            saved=len(run.saved),
            in_progress=len(run.in_progress),
            remaining=len(run.trials) - len(run.saved) - len(run.in_progress) - len(run.given_up),
            given_up=len(run.given_up),
            given_up_reasons=reasons[:MAX_REASONS],
            infra_failures=run.infra_failures,
            smoke_episodes=run.smoke_episodes,
            workers=workers,
            gate=run.gate_line if run.ended else None,
        )

    # -- control plane --------------------------------------------------------------------------
    def _scope(self, headers: Headers) -> str | bool | None:
        """What the request's bearer token opens: None every door, a run id that run's doors
        (the client token), False none."""
        if self.token is None:
            return None
        given = bearer(headers)
        if same_secret(given, self.token):
            return None
        if self.client_token and self.client_run and same_secret(given, self.client_token):
            return self.client_run
        return False

    @staticmethod
    def _json(status: HTTPStatus, body: dict) -> Response:
        data = (json.dumps(body) + "\n").encode()
        headers = Headers(
            [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
        )
        return Response(status.value, status.phrase, headers, data)

    async def _http(self, connection: ServerConnection, request) -> Response | None:
        refused = refuse_browsers(connection, request)
        if refused is not None:
            return refused
        path = urlsplit(request.path).path
        if path == HEALTH_PATH:
            return connection.respond(HTTPStatus.OK, "OK\n")
        scope = self._scope(request.headers)
        if scope is False:
            return self._json(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong bearer token"})
        if scope is not None and path not in (EPISODES_PATH, RUNS_PATH + scope):
            error = (
                f"this token opens run {scope} only (/episodes to attach, {RUNS_PATH}{scope} for "
                "its status); submitting runs needs the server's own token"
            )
            return self._json(HTTPStatus.FORBIDDEN, {"error": error})
        if path in (EPISODES_PATH, CONTROL_PATH):
            if scope is not None:
                self._scopes[connection] = scope
            return None  # the websocket handshake goes on
        if path.startswith(RUNS_PATH):
            return await self._run_status(path[len(RUNS_PATH) :])
        return self._json(HTTPStatus.NOT_FOUND, {"error": f"no such path {path}"})

    async def _run_status(self, run_id: str) -> Response:
        try:
            run = await self.run(run_id)
        except RunRefused as exc:  # e.g. over this server's limits, or splits it lacks
            return self._json(HTTPStatus.CONFLICT, {"error": str(exc)})
        if run is None:
            error = f"no run {run_id} on this server; `gap submit` it first"
            return self._json(HTTPStatus.NOT_FOUND, {"error": error})
        if run.ended and run.gate_line is None:  # its records read once, off the loop
            await asyncio.to_thread(run.gate)
        return self._json(HTTPStatus.OK, self.status(run).model_dump(mode="json"))

    async def _session(self, ws: ServerConnection) -> None:
        path = urlsplit(ws.request.path).path
        try:
            if path == CONTROL_PATH:
                await self._control(ws)
            else:
                await self._episodes(ws)
        except ConnectionClosed:
            pass

    async def _control(self, ws: ServerConnection) -> None:
        try:
            request = Submit.model_validate(unpackb(await ws.recv(), "submission"))
            done = await asyncio.to_thread(submit, self.runs_dir, request, self.splits, self.limits)
        except (ValidationError, ValueError, RunRefused) as exc:
            message = _first_error(exc) if isinstance(exc, ValidationError) else str(exc)
            await ws.send(packb({"ok": False, "error": message}))
            return
        self.runs.pop(request.run_id, None)  # reloaded from disk as submitted
        self.refused.pop(request.run_id, None)
        await ws.send(packb({"ok": True, **done.model_dump()}))

    # -- data plane -----------------------------------------------------------------------------
    async def _refuse(self, ws: ServerConnection, error: str) -> None:
        await ws.send(packb({"type": "error", "error": error}))

    async def _episodes(self, ws: ServerConnection) -> None:
        """One attached client: its hello admitted (within the limits, before anything is
        made for it), then its episodes; its slot and relay released however it ends."""
        try:
            hello = Hello.model_validate(unpackb(await ws.recv(), "hello"))
        except (ValidationError, ValueError) as exc:
            why = _first_error(exc) if isinstance(exc, ValidationError) else str(exc)
            return await self._refuse(ws, f"the first frame must be a hello: {why}")
        try:
            run = await self._admitted(hello, self._scopes.get(ws))
        except RunRefused as exc:
            return await self._refuse(ws, str(exc))
        attachment = self.slots.attach(ws, hello, run)
        try:
            await self.slots.serve(attachment)
        finally:
            await self.slots.detach(attachment)

    async def _admitted(self, hello: Hello, scope: str | None) -> ServiceRun:
        """The run `hello` attaches to; RunRefused, saying why and the fix, when it may not."""
        if scope is not None and hello.run_id != scope:
            raise RunRefused(f"run {hello.run_id}: this token attaches to run {scope} only")
        run = await self.run(hello.run_id)
        if run is None:
            raise RunRefused(
                f"no run {hello.run_id} on this server; `gap submit CONFIG --run-id "
                f"{hello.run_id}` first"
            )
        if not run.admits(hello.run_secret):
            raise RunRefused(
                f"run {hello.run_id}: missing or wrong run secret; give the one `gap submit` "
                "returned (gap eval reads it from where gap submit wrote it, --run-secret-file "
                "or GAP_RUN_SECRET)"
            )
        self.slots.within_limits(hello, run)
        return run

    def _write_summary(self, run: ServiceRun) -> None:
        """The run dir's outputs, by the writers a pytest session calls (summary.tsv/json,
        episodes.parquet, plots, done flags), and the run's card completed: who ran it, what
        was saved (it stands in for a session's run_manifest.json). Once per run: its other
        clients' handlers wait for the first to write them (the writers share matplotlib's
        state), and the run is `finished` only after (`status`)."""
        with run.summary_lock:
            if run.summarized:
                return
            self._write_outputs(run)
            run.summarized = True

    def _write_outputs(self, run: ServiceRun) -> None:
        summary, results = run.folded()
        run.gate_line = summary.gate.line()
        write_outputs(run.run_dir, summary, results, run.config)
        status = self.status(run)
        card = {
            **run.card,
            "endpoint": f"http://{self.host}:{self.port}",  # this server's; it holds no secret
            "workers": [{"worker_id": w.worker_id, "host": w.host} for w in status.workers],
            "coverage": {
                "expected": status.expected,
                "saved": status.saved,
                "infra_failures": status.infra_failures,
                "given_up": status.given_up,
                "smoke_episodes": status.smoke_episodes,
            },
            "given_up": run.given_up_reasons(held_out=False)[:MAX_REASONS],
            "gate": status.gate,
            "finished_at": now_iso(),
        }
        write_json(run.run_dir / SERVICE_FILE, card)

    # -- serving --------------------------------------------------------------------------------
    async def serve(self, started: asyncio.Future | None = None) -> None:
        """Serve until cancelled; `started` receives the bound port."""
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        notice = exposure_notice("the evaluation server", self.host)
        if notice:
            log.warning(notice)
        loop = asyncio.get_running_loop()
        hub_started = loop.create_future()
        hub = asyncio.create_task(self.slots.hub.serve(hub_started))
        try:
            await asyncio.wait({hub_started, hub}, return_when=asyncio.FIRST_COMPLETED)
            if not hub_started.done():
                hub.result()  # the relay listener could not start: say why
            await self._serve(started)
        finally:
            hub.cancel()

    async def _serve(self, started: asyncio.Future | None) -> None:
        async with serve(
            self._session,
            self.host,
            self.port,
            compression=None,
            max_size=MAX_FRAME_BYTES,
            max_queue=MAX_QUEUED_FRAMES,  # one request in flight per connection, ever
            process_request=self._http,
        ) as server:
            self.port = server.sockets[0].getsockname()[1]
            if started is not None:
                started.set_result(self.port)
            await asyncio.get_running_loop().create_future()
