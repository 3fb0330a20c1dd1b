"""The online platform's tasks (`gap online serve`): it takes evaluation tasks (a model name
and a benchmark set) from token holders, queues them, and when capacity frees up starts an
evaluation server for the task (`gap serve` on a free loopback port, the set's config submitted
under the task id as run id) and hands out its endpoint. A task whose run has finished gives its
place to the next one. online.py is its HTTP face.

A task server trusts the platform, never the owner: the platform mints two tokens per task.
The server token (its `GAP_TOKEN`) opens every door of the task's server; the platform alone
holds it, to poll the run's status. The client token (its `GAP_CLIENT_TOKEN`) opens `/episodes`
for the task's run only and `GET /runs/<task id>`: a ready task carries it (`client_token`)
beside its run's secret (`run_secret`) and `endpoint`, and that is all its owner's clients need
to attach and follow the run. The owner's platform token never reaches the task server: it opens
no door there, and no client token opens `/control`, so the work inside a task server is the
set's config and nothing an owner adds. The task servers get the allow-listed environment
(doors.child_env) and these secrets: no operator API key reaches them.

Limits (`Limits`; everything from the network is untrusted and must not hold the platform): each
owner has at most `max_tasks_per_owner` tasks queued or ready (429) and the platform at most
`max_queued` queued (503); a ready task no client attaches to within `attach_timeout_s` ends as
`expired` and gives its place back; each owner's ended tasks are kept for `keep_ended` (older
ones are forgotten; their run dirs stay). The limits on a request itself (its body, its time,
the connections served at once) are online.py's.
"""

from __future__ import annotations

import json
import logging
import secrets
import subprocess
import sys
import threading
import time
import urllib.request
from http import HTTPStatus
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from pytest_gap.bind import LOOPBACK
from pytest_gap.config.messages import ConfigError
from pytest_gap.config.reader import read_yaml
from pytest_gap.doors import child_env, new_secret
from pytest_gap.errors import GapError
from pytest_gap.servers.manager import free_port
from pytest_gap.service.protocol import CLIENT_TOKEN_ENV, RUN_SECRET_ENV, RUNS_PATH, TOKEN_ENV

log = logging.getLogger(__name__)
POLL_S = 1.0  # how often running tasks are asked whether their run finished
MAX_LIST = 200  # tasks in one GET /tasks answer (`limit` at most this)
STOP_WAIT_S = 10.0  # how long a stop waits for task servers still starting to see it

TaskState = Literal["queued", "ready", "finished", "failed", "expired"]
LIVE: tuple[TaskState, ...] = ("queued", "ready")  # what holds (or waits for) a place


# The ceilings of the limits below: far above any use, finite.
MAX_TASKS = 10_000
MAX_WAIT_S = 86_400.0
MAX_REQUEST_S = 600.0
MAX_CONNECTIONS = 4096
MAX_CAPACITY = 256  # evaluation servers at once, each with its clients' simulator slots


class Limits(BaseModel):
    """What one owner, and the network, may take of the platform (`gap online serve` options)."""

    max_tasks_per_owner: int = Field(default=4, ge=1, le=MAX_TASKS)
    max_queued: int = Field(default=32, ge=1, le=MAX_TASKS)
    attach_timeout_s: float = Field(default=300.0, gt=0, le=MAX_WAIT_S, allow_inf_nan=False)
    request_timeout_s: float = Field(default=10.0, gt=0, le=MAX_REQUEST_S, allow_inf_nan=False)
    max_connections: int = Field(default=64, ge=1, le=MAX_CONNECTIONS)
    keep_ended: int = Field(default=100, ge=1, le=MAX_TASKS)


class Refused(GapError):
    """A task the platform will not take now; `status` is the HTTP answer (429 or 503, and the
    4xx of a request over online.py's limits)."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


class TaskRequest(BaseModel):
    model_name: str = Field(min_length=1, max_length=200)
    benchmark_set: str = Field(min_length=1, max_length=200)
    idempotency_key: str | None = Field(default=None, max_length=200)


class Task(BaseModel):
    task_id: str
    model_name: str
    benchmark_set: str
    state: TaskState
    endpoint: str | None = None  # the evaluation server, once ready
    run_secret: str | None = None  # what attaching to the task's run needs, once ready
    client_token: str | None = None  # its server's token for this run's doors only, once ready
    created_at: float
    ready_at: float | None = None
    finished_at: float | None = None
    error: str | None = None


class _Entry(BaseModel):
    task: Task
    owner: str
    # The task server's own token (minted here, kept in memory only): the platform's polls.
    server_token: str = Field(default_factory=new_secret, repr=False)
    key: str  # idempotency key: a retried submit finds the pending task
    port: int | None = None
    ready_since: float | None = None  # time.monotonic() when it became ready
    attached: bool = False  # a client has attached to its evaluation server


def load_tokens(path: Path) -> dict[str, str]:
    """`token owner` per line (# comments, blank lines allowed) -> {token: owner}."""
    tokens: dict[str, str] = {}
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise GapError(f"--tokens {path}: cannot read it: {exc}") from None
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise GapError(f"--tokens {path}: line {n}: give `TOKEN OWNER` (two words)")
        tokens[parts[0]] = parts[1]
    if not tokens:
        raise GapError(f"--tokens {path}: no token in it; add `TOKEN OWNER` lines")
    return tokens


def load_sets(path: Path) -> dict[str, Path]:
    """`--sets FILE`: YAML {benchmark set name: config path (relative to the file)}."""
    try:  # the hardened reader: tags, keys given twice and alias bombs are refused here too
        data = read_yaml(path)
    except ConfigError as exc:
        raise GapError(f"--sets {exc}") from None
    if not isinstance(data, dict) or not data:
        raise GapError(f"--sets {path}: give a mapping of benchmark set name -> config path")
    sets = {str(k): (path.parent / str(v)).resolve() for k, v in data.items()}
    for name, config in sets.items():
        if not config.is_file():
            raise GapError(f"--sets {path}: {name}: no config at {config}")
    return sets


class Platform:
    def __init__(
        self,
        runs_dir: Path,
        sets: dict[str, Path],
        tokens: dict[str, str],
        capacity: int,
        limits: Limits | None = None,
    ):
        if not 1 <= capacity <= MAX_CAPACITY:
            raise GapError(f"--capacity {capacity}: give a whole number from 1 to {MAX_CAPACITY}")
        self.runs_dir, self.sets, self.tokens = runs_dir.resolve(), sets, tokens
        self.capacity, self.limits = capacity, limits or Limits()
        self.entries: dict[str, _Entry] = {}
        self.servers: dict[str, subprocess.Popen] = {}
        self.lock = threading.Lock()
        self.starting: set[str] = set()  # task ids whose server is being started
        self.stopped = threading.Event()

    # -- tasks ----------------------------------------------------------------------------------
    def create(self, owner: str, request: TaskRequest) -> tuple[Task, bool]:
        """Queue `request` for `owner` (or find its pending twin). The owner's token, which
        online.py authenticated, never reaches the task: its server gets tokens of its own."""
        if request.benchmark_set not in self.sets:
            have = ", ".join(sorted(self.sets))
            raise GapError(f"no benchmark set {request.benchmark_set!r} here (it has: {have})")
        key = request.idempotency_key or f"{request.model_name}\0{request.benchmark_set}"
        with self.lock:
            for entry in self.entries.values():
                live = entry.task.state in LIVE
                if entry.owner == owner and entry.key == key and live:
                    return entry.task, False
            self._admit(owner)
            self._forget(owner)
            task_id = f"t{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"
            task = Task(
                task_id=task_id,
                model_name=request.model_name,
                benchmark_set=request.benchmark_set,
                state="queued",
                created_at=time.time(),
            )
            self.entries[task_id] = _Entry(task=task, owner=owner, key=key)
        # started beside the request, not in it: bringing a server up takes seconds to minutes,
        # and the client's answer (its task, queued) should not wait for that
        threading.Thread(target=self._schedule, name="gap-online-start", daemon=True).start()
        return task, True

    def _admit(self, owner: str) -> None:
        """Refuse a new task over the owner's quota or the platform's queue (lock held): one
        token holder cannot fill the queue, and no one can grow it without bound."""
        mine = sum(e.owner == owner and e.task.state in LIVE for e in self.entries.values())
        if mine >= self.limits.max_tasks_per_owner:
            raise Refused(
                HTTPStatus.TOO_MANY_REQUESTS,
                f"owner {owner} has {mine} tasks queued or ready, the most "
                f"--max-tasks-per-owner ({self.limits.max_tasks_per_owner}) allows; wait for "
                "one to end, then submit",
            )
        queued = sum(e.task.state == "queued" for e in self.entries.values())
        if queued >= self.limits.max_queued:
            raise Refused(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"the platform's queue is full ({queued} tasks queued, --max-queued "
                f"{self.limits.max_queued}); submit again later",
            )

    def _forget(self, owner: str) -> None:
        """Drop the owner's oldest ended tasks beyond `keep_ended` (lock held): the task list,
        and the platform's memory, stay bounded however long it runs."""
        ended = [e for e in self.entries.values() if e.owner == owner and e.task.state not in LIVE]
        ended.sort(key=lambda e: e.task.created_at)
        for entry in ended[: max(0, len(ended) - self.limits.keep_ended)]:
            del self.entries[entry.task.task_id]

    def visible(self, owner: str, offset: int = 0, limit: int = MAX_LIST) -> tuple[list[Task], int]:
        """One page of the owner's tasks, oldest first, and how many it has in all."""
        with self.lock:
            tasks = [e.task for e in self.entries.values() if e.owner == owner]
        return tasks[offset : offset + limit], len(tasks)

    def get(self, owner: str, task_id: str) -> Task | None:
        with self.lock:
            entry = self.entries.get(task_id)
            return entry.task if entry is not None and entry.owner == owner else None

    # -- capacity -------------------------------------------------------------------------------
    def _schedule(self) -> None:
        """Start servers for queued tasks, oldest first, while capacity allows."""
        with self.lock:  # two callers (a submit, the watcher) must not start one task twice
            running = sum(e.task.state == "ready" for e in self.entries.values())
            queued = sorted(
                (
                    e
                    for e in self.entries.values()
                    if e.task.state == "queued" and e.task.task_id not in self.starting
                ),
                key=lambda e: e.task.created_at,
            )
            chosen = queued[: max(0, self.capacity - running - len(self.starting))]
            self.starting.update(e.task.task_id for e in chosen)
        for entry in chosen:
            try:
                self._start(entry)
            finally:
                with self.lock:
                    self.starting.discard(entry.task.task_id)

    def _start(self, entry: _Entry) -> None:
        task = entry.task
        port = free_port()
        gap = [sys.executable, "-m", "pytest_gap.cli"]
        runs = self.runs_dir / task.task_id
        runs.mkdir(parents=True, exist_ok=True)
        log_file = open(runs / "serve.log", "ab")  # noqa: SIM115 (the server's whole life)
        # The task's server takes its tokens (the platform's, the owner's clients') and its run
        # secret through the environment: not argv (ps), not a file in the runs dir.
        # The set's config is the operator's: the server schedules it at start (`--config`),
        # trusted, not through the public submit a tenant's config takes; no token an owner
        # holds opens that door.
        run_secret, client_token = new_secret(), new_secret()
        env = child_env(
            {
                TOKEN_ENV: entry.server_token,
                CLIENT_TOKEN_ENV: client_token,
                RUN_SECRET_ENV: run_secret,
            }
        )
        config = ["--config", str(self.sets[task.benchmark_set]), "--run-id", task.task_id]
        server = subprocess.Popen(
            [*gap, "serve", "--port", str(port), "--runs-dir", str(runs), *config],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log_file.close()
        # Held from its first moment, so a platform stopping now takes this server with it
        # (`stop`), and one started after the stop began ends here.
        with self.lock:
            self.servers[task.task_id] = server
        endpoint = f"http://{LOOPBACK}:{port}"
        try:
            if self.stopped.is_set():
                raise GapError("the platform is stopping")
            _wait_up(endpoint, server, runs / "serve.log", stopped=self.stopped)
        except (OSError, GapError) as exc:
            server.kill()
            server.wait()
            with self.lock:
                self.servers.pop(task.task_id, None)
            detail = str(exc)
            with self.lock:
                task.state, task.error = "failed", f"the evaluation server did not start: {detail}"
            log.warning("task %s failed to start: %s", task.task_id, detail.strip())
            return
        with self.lock:
            entry.port = port
            task.state, task.endpoint, task.ready_at = "ready", endpoint, time.time()
            task.run_secret, task.client_token = run_secret, client_token
            entry.ready_since = time.monotonic()
        log.info("task %s ready at %s", task.task_id, endpoint)

    def watch(self) -> None:
        """Until stopped: retire tasks whose run finished (or whose server died, or that no
        client attached to in time), then schedule."""
        while not self.stopped.wait(POLL_S):
            with self.lock:
                ready = [e for e in self.entries.values() if e.task.state == "ready"]
            for entry in ready:
                ended = self._ended(entry)
                if ended is not None:
                    self._retire(entry, *ended)
            self._schedule()

    def _ended(self, entry: _Entry) -> tuple[TaskState, str | None] | None:
        """How a ready task ended (its state and why), or None while it is still running."""
        server = self.servers.get(entry.task.task_id)
        if server is not None and server.poll() is not None:
            return "failed", f"its evaluation server exited with status {server.returncode}"
        status = self._run_status(entry)
        if status.get("state") == "finished":
            return "finished", None
        if status.get("workers") or status.get("state") not in (None, "waiting for clients"):
            entry.attached = True
        waited = time.monotonic() - (entry.ready_since or time.monotonic())
        if not entry.attached and waited > self.limits.attach_timeout_s:
            # a place nobody uses holds up the queue: give it back
            return "expired", (
                f"no client attached within {self.limits.attach_timeout_s:g} s of it being "
                "ready (--attach-timeout-s); submit it again when the client can start"
            )
        return None

    def _run_status(self, entry: _Entry) -> dict:
        """The task's run status from its evaluation server ({} when it does not answer)."""
        url = f"{entry.task.endpoint}{RUNS_PATH}{entry.task.task_id}"
        headers = {"Authorization": f"Bearer {entry.server_token}"}
        request = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                status = json.loads(answer.read())
        except (OSError, ValueError):
            return {}
        return status if isinstance(status, dict) else {}

    def _retire(self, entry: _Entry, state: TaskState, error: str | None) -> None:
        server = self.servers.pop(entry.task.task_id, None)
        if server is not None and server.poll() is None:
            server.terminate()
            server.wait(timeout=30)
        with self.lock:
            entry.task.state = state
            entry.task.error, entry.task.finished_at = error, time.time()
        log.info("task %s %s", entry.task.task_id, entry.task.state)

    def stop(self) -> None:
        """Stop scheduling and end every task server, those still starting included (a submit
        or the watcher may be inside `_start`: it sees `stopped` and ends its own)."""
        self.stopped.set()
        deadline = time.monotonic() + STOP_WAIT_S
        while True:
            with self.lock:
                servers, busy = list(self.servers.values()), bool(self.starting)
            for server in servers:
                if server.poll() is None:
                    server.terminate()
                    server.wait(timeout=30)
            if not busy or time.monotonic() > deadline:
                return
            time.sleep(POLL_S)


def _wait_up(
    endpoint: str,
    server: subprocess.Popen,
    log: Path,
    timeout_s: float = 60,
    stopped: threading.Event | None = None,
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stopped is not None and stopped.is_set():
            raise GapError("the platform is stopping")
        if server.poll() is not None:
            try:  # its last line says why (a set's config it refused, a port taken)
                why = (log.read_text(errors="replace").strip().splitlines() or [""])[-1]
            except OSError:
                why = ""
            raise GapError(f"gap serve exited with status {server.returncode}: {why}")
        try:
            urllib.request.urlopen(f"{endpoint}/healthz", timeout=1)
            return
        except OSError:
            time.sleep(0.2)
    raise GapError(f"gap serve did not answer at {endpoint} within {timeout_s:g} s")
