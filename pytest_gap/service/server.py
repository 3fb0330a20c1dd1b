"""`gap serve`: the evaluation server. One asyncio websockets server answers the control plane
(HTTP GET: health, run status; websocket `/control`: submissions) and the data plane (websocket
`/episodes`: attached clients). See protocol.py for the messages.

Each attached client gets one simulator slot (its own env pool, on its own thread, since a GL
context belongs to the thread that made it) and a relay: an in-process policy server on
loopback whose policy is the client itself. A trial then runs exactly as a pytest `policy_only`
trial does (run/trial.py TrialRun: the mode's template, run_policy, the goal check, result.json,
trace), with the relay as the policy's server; every observation goes down the client's
websocket and its reply comes back as the policy's answer. A client that goes away mid-episode
breaks the relay: the trial is recorded as an infrastructure failure and handed out again.

Doors: a browser's request is refused on every path (doors.py); the bearer token, when the
server has one, guards every path but the health check; attaching to a run needs the run's
secret (Hello.run_secret, checked against the digest in its card); a relay answers only
connections that carry its own url token, which lives in this process alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import ValidationError
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Response

from pytest_gap import ids
from pytest_gap.bind import LOOPBACK, exposure_notice
from pytest_gap.cells import Trial
from pytest_gap.doors import bearer, new_secret, refuse_browsers, same_secret
from pytest_gap.errors import one_line
from pytest_gap.layout import SMOKE_DIR
from pytest_gap.names import is_name
from pytest_gap.outputs.hook import write_outputs
from pytest_gap.policies.server import PolicyServer
from pytest_gap.policies.wire import HEALTH_PATH, MAX_QUEUED_FRAMES, packb, unpackb
from pytest_gap.results import now_iso, write_json
from pytest_gap.run.trial import TrialRun
from pytest_gap.service.protocol import (
    CONTROL_PATH,
    EPISODES_PATH,
    HELD_OUT,
    RUNS_PATH,
    Hello,
    RunStatus,
    Submit,
    WorkerStatus,
)
from pytest_gap.service.runs import SERVICE_FILE, RunRefused, ServiceRun, Splits, submit
from pytest_gap.sim.pool import EnvPool

log = logging.getLogger(__name__)
REPLY_TIMEOUT_S = 300.0  # a client that has not answered an observation by then is gone
MAX_FRAME_BYTES = 64 * 2**20
IDLE_POLL_S = 0.5  # a worker with nothing to claim waits this long for episodes to come back


def _first_error(exc: ValidationError) -> str:
    """A malformed frame's first problem on one line, naming the field (never its value)."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "frame"
    return f"{where}: {one_line(first['msg'].removeprefix('Value error, '), 300)}"


class Relay:
    """The attached client as a policy (`infer(obs) -> reply`), called from a trial's thread."""

    def __init__(self, ws: ServerConnection, loop: asyncio.AbstractEventLoop, timeout_s: float):
        self.ws, self.loop, self.timeout_s = ws, loop, timeout_s
        self.broken: str | None = None  # why the client can no longer answer
        self.replies = 0

    async def _ask(self, obs: dict) -> dict:
        await self.ws.send(packb({"type": "obs", "obs": obs}))
        frame = unpackb(await self.ws.recv(), "reply")
        if not isinstance(frame, dict) or frame.get("type") != "reply":
            raise ValueError("the client answered something other than a reply frame")
        if not isinstance(frame.get("reply"), dict):
            raise ValueError("the client's reply frame holds no reply mapping")
        self.replies += 1
        return frame["reply"]

    def infer(self, obs: dict) -> dict:
        if self.broken:
            raise ConnectionError(self.broken)
        future = asyncio.run_coroutine_threadsafe(self._ask(obs), self.loop)
        try:
            return future.result(self.timeout_s)
        except Exception as exc:
            future.cancel()
            self.broken = f"the evaluation client went away mid-episode ({type(exc).__name__})"
            raise ConnectionError(self.broken) from None


class _OneBuildAtATime:
    """A slot's env pool whose env creation takes a lock shared by every slot: two threads
    importing a simulator at once break its imports (robosuite's `controllers` package raised
    a circular ImportError when two slots made their first env together)."""

    def __init__(self, pool, lock: threading.Lock):
        self.pool, self.lock = pool, lock

    def get(self, *args, **kwargs):
        with self.lock:
            return self.pool.get(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.pool, name)


class EvalServer:
    def __init__(
        self,
        runs_dir: Path,
        *,
        host: str = LOOPBACK,
        port: int = 0,
        token: str | None = None,
        reply_timeout_s: float = REPLY_TIMEOUT_S,
        splits: Splits | None = None,
    ):
        self.runs_dir, self.host, self.port = runs_dir.resolve(), host, port
        self.token, self.reply_timeout_s = token, reply_timeout_s
        self.splits: Splits = splits or {}
        self._building = threading.Lock()
        self.runs: dict[str, ServiceRun] = {}
        self.workers: dict[tuple[str, int], WorkerStatus] = {}
        self.relays: dict[tuple[str, int], Relay] = {}

    # -- runs -----------------------------------------------------------------------------------
    def run(self, run_id: str) -> ServiceRun | None:
        """The run, loaded from the runs dir the first time it is asked for (a restarted server
        resumes every run it finds there)."""
        if run_id not in self.runs:
            if not is_name(run_id):  # a run id from a url path: never a path of its own
                return None
            run_dir = self.runs_dir / run_id
            if not (run_dir / SERVICE_FILE).is_file() or run_dir.parent != self.runs_dir:
                return None
            self.runs[run_id] = ServiceRun(run_dir, self.splits)
        return self.runs[run_id]

    def status(self, run: ServiceRun) -> RunStatus:
        workers = [w for (rid, _), w in sorted(self.workers.items()) if rid == run.run_id]
        if run.split == HELD_OUT:  # a trial key names its seed
            workers = [w.model_copy(update={"current": None}) for w in workers]
        attached = [w for w in workers if w.state == "attached"]
        replies = sum(r.replies for (rid, _), r in self.relays.items() if rid == run.run_id)
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
        gate = run.summary().gate.line() if run.ended else None
        return RunStatus(
            run_id=run.run_id,
            split=run.split,
            state=state,
            expected=len(run.trials),
            saved=len(run.saved),
            in_progress=len(run.in_progress),
            remaining=len(run.trials) - len(run.saved) - len(run.in_progress) - len(run.given_up),
            given_up=len(run.given_up),
            infra_failures=run.infra_failures,
            smoke_episodes=run.smoke_episodes,
            workers=workers,
            gate=gate,
        )

    # -- control plane --------------------------------------------------------------------------
    def _authorized(self, headers: Headers) -> bool:
        return self.token is None or same_secret(bearer(headers), self.token)

    @staticmethod
    def _json(status: HTTPStatus, body: dict) -> Response:
        data = (json.dumps(body) + "\n").encode()
        headers = Headers(
            [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
        )
        return Response(status.value, status.phrase, headers, data)

    def _http(self, connection: ServerConnection, request) -> Response | None:
        refused = refuse_browsers(connection, request)
        if refused is not None:
            return refused
        path = urlsplit(request.path).path
        if path == HEALTH_PATH:
            return connection.respond(HTTPStatus.OK, "OK\n")
        if not self._authorized(request.headers):
            return self._json(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong bearer token"})
        if path in (EPISODES_PATH, CONTROL_PATH):
            return None  # the websocket handshake goes on
        if path.startswith(RUNS_PATH):
            run_id = path[len(RUNS_PATH) :]
            try:
                run = self.run(run_id)
            except RunRefused as exc:  # e.g. restarted without the --splits its run asked for
                return self._json(HTTPStatus.CONFLICT, {"error": str(exc)})
            if run is None:
                error = f"no run {run_id} on this server; `gap submit` it first"
                return self._json(HTTPStatus.NOT_FOUND, {"error": error})
            return self._json(HTTPStatus.OK, self.status(run).model_dump(mode="json"))
        return self._json(HTTPStatus.NOT_FOUND, {"error": f"no such path {path}"})

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
            done = await asyncio.to_thread(submit, self.runs_dir, request, self.splits)
        except (ValidationError, ValueError, RunRefused) as exc:
            message = _first_error(exc) if isinstance(exc, ValidationError) else str(exc)
            await ws.send(packb({"ok": False, "error": message}))
            return
        self.runs.pop(request.run_id, None)  # reloaded from disk as submitted
        await ws.send(packb({"ok": True, **done.model_dump()}))

    # -- data plane -----------------------------------------------------------------------------
    async def _refuse(self, ws: ServerConnection, error: str) -> None:
        await ws.send(packb({"type": "error", "error": error}))

    async def _episodes(self, ws: ServerConnection) -> None:
        """One attached client: its hello admitted, a slot (thread, env pool) and a relay of its
        own while it runs episodes; both released however it ends."""
        try:
            hello = Hello.model_validate(unpackb(await ws.recv(), "hello"))
        except (ValidationError, ValueError) as exc:
            why = _first_error(exc) if isinstance(exc, ValidationError) else str(exc)
            return await self._refuse(ws, f"the first frame must be a hello: {why}")
        try:
            run = self._admitted(hello)
        except RunRefused as exc:
            return await self._refuse(ws, str(exc))
        key = (hello.run_id, hello.worker_id)
        live = self.workers.get(key)
        status = WorkerStatus(
            worker_id=hello.worker_id,
            state="attached",
            host=hello.host,
            smoke=hello.smoke,
            episodes_done=live.episodes_done if live else 0,
        )
        self.workers[key] = status
        relay = Relay(ws, asyncio.get_running_loop(), self.reply_timeout_s)
        self.relays[key] = relay
        # The relay's url token keeps other local users off it: they can find its port only.
        policy = PolicyServer(
            relay, host=LOOPBACK, metadata=hello.metadata, url_token=new_secret()
        ).start()
        # One thread per slot: its env's GL context lives and dies on it.
        slot = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"gap-slot-{hello.worker_id}")
        pool = _OneBuildAtATime(EnvPool(max_envs=1), self._building)
        loop = asyncio.get_running_loop()

        def in_slot(run_dir: Path, trial: Trial) -> asyncio.Future:
            """Run `trial` into `run_dir` on the slot's thread, the client as its policy."""
            return loop.run_in_executor(
                slot, self._run_trial, run, run_dir, trial, pool, policy.url, hello.worker_id
            )

        try:
            await self._serve_client(ws, hello, run, status, relay, in_slot)
        finally:
            status.state, status.current = "detached", None
            policy.stop()
            await loop.run_in_executor(slot, pool.close)
            slot.shutdown(wait=False)

    def _admitted(self, hello: Hello) -> ServiceRun:
        """The run `hello` attaches to; RunRefused, saying why and the fix, when it may not."""
        run = self.run(hello.run_id)
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
        live = self.workers.get((hello.run_id, hello.worker_id))
        if live is not None and live.state == "attached":
            raise RunRefused(
                f"worker id {hello.worker_id} of run {hello.run_id} is already attached "
                f"(from {live.host or 'another client'}); give each client its own worker id"
            )
        return run

    async def _serve_client(
        self,
        ws: ServerConnection,
        hello: Hello,
        run: ServiceRun,
        status: WorkerStatus,
        relay: Relay,
        in_slot: Callable[[Path, Trial], Awaitable[None]],
    ) -> None:
        """The attached client's episodes: its smoke episode, or the run's trials it claims
        until none is left or it goes away; then the finished frame (and the run's summary
        when it ended)."""
        if hello.smoke:
            trial = run.smoke_trial()
            await in_slot(run.run_dir / SMOKE_DIR, trial)
            run.smoke_episodes += 1
        while not hello.smoke and relay.broken is None:
            trial = run.claim(hello.worker_id)
            if trial is None:
                if run.ended or not run.in_progress:
                    break
                await asyncio.sleep(IDLE_POLL_S)  # another client's episode may come back
                continue
            status.current = trial.key
            try:
                await in_slot(run.run_dir, trial)
            finally:  # whatever happened, the trial is saved or handed out again
                run.finish(trial.key)
                status.current = None
            status.episodes_done += trial.key in run.saved
        if relay.broken is None:
            if run.ended:
                await asyncio.to_thread(self._write_summary, run)
            await ws.send(
                packb(
                    {
                        "type": "finished",
                        "smoke": hello.smoke,
                        "expected": len(run.trials),
                        "saved": len(run.saved),
                    }
                )
            )

    @staticmethod
    def _run_trial(run, run_dir, trial, pool, url, worker_id) -> None:
        config = run.card["config_name"]
        TrialRun(
            trial,
            run_dir,
            nodeid=ids.node_id(config, trial.id),
            config=config,
            pool=pool,
            worker=f"service-{worker_id}",
            policies={run.policy_id: run.endpoint(url)},
        ).execute()

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
