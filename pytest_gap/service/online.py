"""`gap online serve`: the online platform. It takes evaluation tasks (a model name and a
benchmark set) from token holders, queues them, and when capacity frees up starts an evaluation
server for the task (`gap serve` on a free loopback port, the set's config submitted under the
task id as run id) and hands out its endpoint. A task whose run has finished gives its place to
the next one.

HTTP JSON, bearer tokens (`--tokens FILE`: one `token owner` pair per line): a token sees and
controls only its owner's tasks (others answer 404); a wrong or missing token answers 401. Tokens
are never logged, written under the runs dir, or put on a command line.

    POST /tasks {model_name, benchmark_set, idempotency_key?}  -> Task (201 new, 200 existing)
    GET  /tasks                                                -> [Task] (the owner's)
    GET  /tasks/<task id>                                      -> Task
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.request
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from pytest_gap.bind import LOOPBACK, exposure_notice
from pytest_gap.errors import GapError
from pytest_gap.policies.manager import free_port
from pytest_gap.service.protocol import RUNS_PATH, TOKEN_ENV

log = logging.getLogger(__name__)
POLL_S = 1.0  # how often running tasks are asked whether their run finished
MAX_BODY_BYTES = 64 * 1024

TaskState = Literal["queued", "ready", "finished", "failed"]


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
    created_at: float
    ready_at: float | None = None
    finished_at: float | None = None
    error: str | None = None


class _Entry(BaseModel):
    task: Task
    owner: str
    token: str  # the owner's token: its evaluation server asks for it (kept in memory only)
    key: str  # idempotency key: a retried submit finds the pending task
    port: int | None = None


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
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise GapError(f"--sets {path}: cannot read it: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise GapError(f"--sets {path}: give a mapping of benchmark set name -> config path")
    sets = {str(k): (path.parent / str(v)).resolve() for k, v in data.items()}
    for name, config in sets.items():
        if not config.is_file():
            raise GapError(f"--sets {path}: {name}: no config at {config}")
    return sets


class Platform:
    def __init__(
        self, runs_dir: Path, sets: dict[str, Path], tokens: dict[str, str], capacity: int
    ):
        if capacity < 1:
            raise GapError(f"--capacity {capacity}: give at least 1")
        self.runs_dir, self.sets, self.tokens = runs_dir.resolve(), sets, tokens
        self.capacity = capacity
        self.entries: dict[str, _Entry] = {}
        self.servers: dict[str, subprocess.Popen] = {}
        self.lock = threading.Lock()
        self.starting: set[str] = set()  # task ids whose server is being started
        self.stopped = threading.Event()

    # -- tasks ----------------------------------------------------------------------------------
    def create(self, owner: str, token: str, request: TaskRequest) -> tuple[Task, bool]:
        if request.benchmark_set not in self.sets:
            have = ", ".join(sorted(self.sets))
            raise GapError(f"no benchmark set {request.benchmark_set!r} here (it has: {have})")
        key = request.idempotency_key or f"{request.model_name}\0{request.benchmark_set}"
        with self.lock:
            for entry in self.entries.values():
                live = entry.task.state in ("queued", "ready")
                if entry.owner == owner and entry.key == key and live:
                    return entry.task, False
            task_id = f"t{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"
            task = Task(
                task_id=task_id,
                model_name=request.model_name,
                benchmark_set=request.benchmark_set,
                state="queued",
                created_at=time.time(),
            )
            self.entries[task_id] = _Entry(task=task, owner=owner, key=key, token=token)
        self._schedule()
        return task, True

    def visible(self, owner: str) -> list[Task]:
        with self.lock:
            return [e.task for e in self.entries.values() if e.owner == owner]

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
        # The task's server takes its owner's token, through the environment: not argv (ps),
        # not a file in the runs dir.
        env = {**os.environ, TOKEN_ENV: entry.token}
        server = subprocess.Popen(
            [*gap, "serve", "--port", str(port), "--runs-dir", str(runs)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log_file.close()
        endpoint = f"http://{LOOPBACK}:{port}"
        try:
            _wait_up(endpoint, server)
            subprocess.run(
                [
                    *gap,
                    "submit",
                    str(self.sets[task.benchmark_set]),
                    "--run-id",
                    task.task_id,
                    "--port",
                    str(port),
                ],
                check=True,
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
        except (OSError, subprocess.SubprocessError, GapError) as exc:
            server.kill()
            detail = getattr(exc, "stderr", None) or str(exc)
            with self.lock:
                task.state, task.error = "failed", f"the evaluation server did not start: {detail}"
            log.warning("task %s failed to start: %s", task.task_id, detail.strip())
            return
        with self.lock:
            self.servers[task.task_id] = server
            entry.port = port
            task.state, task.endpoint, task.ready_at = "ready", endpoint, time.time()
        log.info("task %s ready at %s", task.task_id, endpoint)

    def watch(self) -> None:
        """Until stopped: retire tasks whose run finished (or whose server died), then schedule."""
        while not self.stopped.wait(POLL_S):
            with self.lock:
                ready = [e for e in self.entries.values() if e.task.state == "ready"]
            for entry in ready:
                done, error = self._finished(entry)
                if done:
                    self._retire(entry, error)
            self._schedule()

    def _finished(self, entry: _Entry) -> tuple[bool, str | None]:
        server = self.servers.get(entry.task.task_id)
        if server is not None and server.poll() is not None:
            return True, f"its evaluation server exited with status {server.returncode}"
        url = f"{entry.task.endpoint}{RUNS_PATH}{entry.task.task_id}"
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {entry.token}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return json.loads(answer.read()).get("state") == "finished", None
        except OSError:
            return False, None

    def _retire(self, entry: _Entry, error: str | None) -> None:
        server = self.servers.pop(entry.task.task_id, None)
        if server is not None and server.poll() is None:
            server.terminate()
            server.wait(timeout=30)
        with self.lock:
            entry.task.state = "failed" if error else "finished"
            entry.task.error, entry.task.finished_at = error, time.time()
        log.info("task %s %s", entry.task.task_id, entry.task.state)

    def stop(self) -> None:
        self.stopped.set()
        for server in self.servers.values():
            if server.poll() is None:
                server.terminate()
                server.wait(timeout=30)


def _wait_up(endpoint: str, server: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise GapError(f"gap serve exited with status {server.returncode}")
        try:
            urllib.request.urlopen(f"{endpoint}/healthz", timeout=1)
            return
        except OSError:
            time.sleep(0.2)
    raise GapError(f"gap serve did not answer at {endpoint} within {timeout_s:g} s")


def handler_for(platform: Platform) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: HTTPStatus, body) -> None:
            data = (json.dumps(body) + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _owner(self) -> tuple[str, str] | None:
            """(owner, token) of the request's bearer token; None after answering 401."""
            header = self.headers.get("Authorization", "")
            token = header[len("Bearer ") :] if header.startswith("Bearer ") else ""
            # constant time per token: a timing probe learns nothing about valid prefixes
            matches = [o for t, o in platform.tokens.items() if secrets.compare_digest(t, token)]
            if not matches:
                self._send(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong bearer token"})
                return None
            return matches[0], token

        def do_GET(self) -> None:
            caller = self._owner()
            if caller is None:
                return
            owner = caller[0]
            if self.path.rstrip("/") == "/tasks":
                return self._send(
                    HTTPStatus.OK, [t.model_dump(mode="json") for t in platform.visible(owner)]
                )
            if self.path.startswith("/tasks/"):
                task = platform.get(owner, self.path[len("/tasks/") :])
                if task is None:
                    return self._send(HTTPStatus.NOT_FOUND, {"error": "no such task"})
                return self._send(HTTPStatus.OK, task.model_dump(mode="json"))
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path}"})

        def do_POST(self) -> None:
            caller = self._owner()
            if caller is None:
                return
            owner, token = caller
            if self.path.rstrip("/") != "/tasks":
                return self._send(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path}"})
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                return self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "body too big"})
            try:
                request = TaskRequest.model_validate_json(self.rfile.read(length) or b"{}")
                task, created = platform.create(owner, token, request)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(x) for x in first["loc"]) or "body"
                return self._send(HTTPStatus.BAD_REQUEST, {"error": f"{where}: {first['msg']}"})
            except GapError as exc:
                return self._send(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            status = HTTPStatus.CREATED if created else HTTPStatus.OK
            self._send(status, task.model_dump(mode="json"))

        def log_message(self, format: str, *args) -> None:
            pass  # request lines carry no token, but nothing here needs them either

    return Handler


def make_platform_server(platform: Platform, host: str, port: int) -> ThreadingHTTPServer:
    notice = exposure_notice("the platform", host)
    if notice:
        log.warning(notice)
    return ThreadingHTTPServer((host, port), handler_for(platform))
