"""Keep a session's managed policy servers up: restart one that dies (bounded, with backoff)
and tell every process of the session where each server is now.

Who owns the servers under pytest-xdist: the session's lead process (the xdist controller, or
the only process) starts them before any worker exists, and only it restarts them. One
`Supervisor` per PolicyManager runs one thread per server that polls the server's process, so
each death is seen once and restarted once, however many workers' trials it broke. Workers
never start a server: they read `<run dir>/policy_logs/servers.json` (`ServerWatch`), which the
lead rewrites atomically at every change, and wait while a restart is in progress.

Restart policy: the k-th restart of a server (k <= policy_manager.max_restarts) starts after
restart_backoff_s * 2**(k-1) s, on a new free port (servers/manager.py `restart`). A restart
that does not come up uses up its attempt too. With no attempt left the server is `down`: the
trials that need it from then on are infrastructure failures that say why, without running, and
their cells error (the floor: a server that cannot be kept up fails the gate).

Each restart is one line (server id, the exit status that caused it, attempt k/N, the last lines
of the server's log): in servers.json's `restarts`, appended to policy_logs/restarts.log, and
queued for the lead to print (`lines`).

A restarted server must be started by a thread that outlives it: PR_SET_PDEATHSIG (manager.py)
fires when the *thread* that forked the child exits, not the process. Restarts therefore run on
the server's own watcher thread, which lives until the session stops the servers.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from pytest_gap.config.document import BenchmarkConfig
from pytest_gap.config.policies import PolicyManagerConfig
from pytest_gap.layout import POLICY_LOGS_DIR
from pytest_gap.results import now_iso, write_json
from pytest_gap.servers.manager import ManagedServer, PolicyManager, PolicyStartError

STATE_FILE = "servers.json"
RESTART_LOG = "restarts.log"
POLL_S = 0.1  # how often a watcher looks at its server's process
# After a trial's infrastructure failure, how long its process waits for the lead to notice a
# server death before deciding the failure had another cause (a hang, a garbage reply).
DEATH_GRACE_S = 2.0
LOG_TAIL_LINES = 3
RESTART_MARK = "--- gap: "  # begins the line a restart writes into the server's own log


class ServerState(BaseModel):
    """One managed server as servers.json publishes it."""

    policy_id: str
    state: Literal["up", "restarting", "down"] = "up"
    url: str
    pid: int | None = None
    deaths: int = 0  # times its process was found exited during the session
    restarts: int = 0  # restart attempts used, those that did not come up included
    max_restarts: int = 0
    reason: str | None = None  # why it is down
    log: str | None = None


class RestartEvent(BaseModel):
    """One restart attempt: what caused it, and how it went."""

    policy_id: str
    at: str
    exit_status: int  # of the process whose exit caused this attempt
    attempt: int
    of: int
    backoff_s: float
    outcome: Literal["up", "failed"]
    url: str | None = None  # where it listens now (outcome up)
    error: str | None = None  # why it did not come up (outcome failed)
    log_tail: list[str] = []

    def line(self) -> str:
        done = f"up on {self.url}" if self.outcome == "up" else f"failed: {self.error}"
        tail = " | ".join(self.log_tail) or "(empty)"
        return (
            f"policy server {self.policy_id} exited with {exit_status(self.exit_status)}; "
            f"restart {self.attempt}/{self.of} after {self.backoff_s:g} s: {done}; "
            f"its log ended: {tail}"
        )


class ServersFile(BaseModel):
    started_at: str
    servers: dict[str, ServerState] = {}
    restarts: list[RestartEvent] = []


def exit_status(code: int) -> str:
    """A Popen returncode in words: `status 3`, `status -9 (SIGKILL)`."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"status {code} ({signal.Signals(-code).name})"
    return f"status {code}"


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last non-empty lines of a server log, each cut to 200 characters."""
    if path is None:
        return []
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(handle.tell() - 8192, 0))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    kept = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.startswith(RESTART_MARK)
    ]
    return [line[:200] for line in kept[-lines:]]


def backoff_s(settings: PolicyManagerConfig, attempt: int) -> float:
    return settings.restart_backoff_s * 2 ** (attempt - 1)


def restart_bound_s(settings: PolicyManagerConfig) -> float:
    """The longest a restart sequence can take (every attempt waits its backoff, then up to the
    startup timeout and the stop grace): how long a trial waits before giving up on it."""
    n = settings.max_restarts
    per_try = settings.startup_timeout_s + settings.evict_grace_s + 5.0
    return sum(backoff_s(settings, k) for k in range(1, n + 1)) + n * per_try + 10.0


def read_state(log_dir: Path) -> ServersFile | None:
    """servers.json of a run dir's policy_logs/, None if absent or unreadable (mid-replace
    cannot happen: it is replaced atomically)."""
    try:
        return ServersFile.model_validate_json((log_dir / STATE_FILE).read_text())
    except (OSError, ValueError, ValidationError):
        return None


def live_urls(log_dir: Path) -> dict[str, str]:
    """{policy id: url} of the managed servers as they are now (a restart moves a server)."""
    found = read_state(log_dir)
    return {pid: s.url for pid, s in found.servers.items()} if found else {}


class Supervisor:
    """The lead's watcher of one PolicyManager's servers (see the module docstring)."""

    def __init__(self, manager: PolicyManager, log_dir: Path):
        self.manager, self.settings = manager, manager.settings
        self.log_dir = log_dir
        self.lines: queue.SimpleQueue[str] = queue.SimpleQueue()  # for the lead to print
        self._lock = threading.Lock()  # one writer of servers.json at a time
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._file = ServersFile(
            started_at=now_iso(),
            servers={
                pid: ServerState(
                    policy_id=pid,
                    url=s.url,
                    pid=s.process.pid,
                    max_restarts=self.settings.max_restarts,
                    log=str(s.log) if s.log else None,
                )
                for pid, s in manager.servers.items()
            },
        )

    def start(self) -> None:
        self._publish()
        for policy_id in self._file.servers:
            thread = threading.Thread(
                target=self._watch, args=(policy_id,), name=f"gap-supervise-{policy_id}"
            )
            thread.daemon = True
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop watching (a restart in progress is abandoned); the servers stay to be stopped."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self._threads.clear()

    def _publish(self, **changes) -> None:
        with self._lock:
            for policy_id, update in changes.items():
                state = self._file.servers[policy_id]
                self._file.servers[policy_id] = state.model_copy(update=update)
            write_json(self.log_dir / STATE_FILE, self._file.model_dump(mode="json"))

    def _watch(self, policy_id: str) -> None:
        while not self._stop.wait(POLL_S):
            server = self.manager.servers.get(policy_id)
            if server is None:  # stopped by the session
                return
            code = server.process.poll()
            if code is None:
                continue
            if not self._revive(policy_id, server, code):
                return

    def _revive(self, policy_id: str, dead: ManagedServer, code: int) -> bool:
        """Restart a server whose process exited with `code`; False when it stays down."""
        state = self._file.servers[policy_id]
        self._publish(**{policy_id: {"state": "restarting", "deaths": state.deaths + 1}})
        tail = log_tail(dead.log)
        used, limit = state.restarts, self.settings.max_restarts
        died, error = code, None
        while used < limit:
            used += 1
            wait = backoff_s(self.settings, used)
            self._publish(**{policy_id: {"restarts": used}})
            if self._stop.wait(wait):
                return False
            self._log_line(dead.log, f"restart {used}/{limit} of policy server {policy_id}")
            try:
                server = self.manager.restart(policy_id, cancel=self._stop)
            except Exception as exc:  # PolicyStartError, or anything else: an attempt used
                if self._stop.is_set():
                    return False
                error = str(exc) if isinstance(exc, PolicyStartError) else repr(exc)
                self._event(policy_id, code, used, wait, "failed", tail, error=error)
                failed = self.manager.servers[policy_id].process.returncode
                code = failed if failed is not None else code
                tail = log_tail(dead.log)
                continue
            self._event(policy_id, code, used, wait, "up", tail, url=server.url)
            self._publish(
                **{policy_id: {"state": "up", "url": server.url, "pid": server.process.pid}}
            )
            return True
        if limit == 0:
            why = "restarts are off (policy_manager.max_restarts: 0)"
        elif error is None:
            why = f"all {limit} restarts (policy_manager.max_restarts) were used before"
        else:
            why = f"{limit} of {limit} restarts (policy_manager.max_restarts) did not come up"
        reason = (
            f"policy server {policy_id} could not be kept up: it exited with "
            f"{exit_status(died)} and {why}"
            + (f"; the last: {error}" if error else "")
            + (f"; its output is in {dead.log}" if dead.log and not error else "")
        )
        line = f"{reason}; its log ended: {' | '.join(log_tail(dead.log)) or '(empty)'}"
        # The line goes out before the state says down: whoever sees "down" also finds why.
        self.lines.put(line)
        self._append_log(line)
        self._publish(**{policy_id: {"state": "down", "reason": reason}})
        return False

    def _event(self, policy_id: str, code: int, attempt: int, wait: float, outcome, tail, **kw):
        event = RestartEvent(
            policy_id=policy_id,
            at=now_iso(),
            exit_status=code,
            attempt=attempt,
            of=self.settings.max_restarts,
            backoff_s=wait,
            outcome=outcome,
            log_tail=tail,
            **kw,
        )
        with self._lock:
            self._file.restarts.append(event)
        self.lines.put(event.line())
        self._append_log(event.line())

    def _append_log(self, line: str) -> None:
        with self._lock, (self.log_dir / RESTART_LOG).open("a") as handle:
            handle.write(f"{now_iso()} {line}\n")

    @staticmethod
    def _log_line(log: Path | None, line: str) -> None:
        """A marker in the server's own log, so its reader sees where each run begins."""
        if log is not None:
            with contextlib.suppress(OSError), log.open("a") as handle:
                handle.write(f"{RESTART_MARK}{line} at {now_iso()} ---\n")


# -- the trial side ------------------------------------------------------------------------------
class Before(BaseModel):
    """The server as a trial found it before running: its death count, or why it is down."""

    deaths: int
    down: str | None = None


class Verdict(BaseModel):
    """After a trial's infrastructure failure: re-run it (the server died and is back), or
    not, with why the server cannot serve it (`reason`, None when it did not die)."""

    rerun: bool = False
    reason: str | None = None
    because: str | None = None  # what the re-run's record says of the attempt it replaces
    deaths: int = 0


class ServerWatch:
    """One trial's view of its cell's managed server, read from servers.json (any process)."""

    def __init__(
        self,
        log_dir: Path,
        policy_id: str,
        settings: PolicyManagerConfig,
        *,
        grace_s: float = DEATH_GRACE_S,
        poll_s: float = POLL_S,
    ):
        self.log_dir, self.policy_id, self.settings = log_dir, policy_id, settings
        self.grace_s, self.poll_s = grace_s, poll_s

    @classmethod
    def for_cell(cls, run_dir: Path, cell, config: BenchmarkConfig) -> ServerWatch | None:
        """The watch of a cell whose policy is a managed server this session supervises."""
        entry = config.policies.get(cell.policy_id or "")
        if cell.error or entry is None or entry.url is not None:
            return None
        watch = cls(run_dir / POLICY_LOGS_DIR, cell.policy_id, config.policy_manager)
        return watch if watch.read() is not None else None

    def read(self) -> ServerState | None:
        found = read_state(self.log_dir)
        return found.servers.get(self.policy_id) if found else None

    def before_trial(self) -> Before:
        """The server's state for a trial about to run; waits out a restart in progress."""
        state = self._settled(self.read())
        return Before(deaths=state.deaths, down=state.reason if state.state == "down" else None)

    def after_failure(self, before: Before) -> Verdict:
        """After a trial's infrastructure failure: did its server die meanwhile? Waits up to
        `grace_s` for the lead to notice a death, then for the restart's outcome."""
        deadline = time.monotonic() + self.grace_s
        state = self.read()
        while state is not None and state.deaths == before.deaths and state.state == "up":
            if time.monotonic() > deadline:
                return Verdict(deaths=state.deaths)  # not a death: a hang, a bad reply
            time.sleep(self.poll_s)
            state = self.read()
        state = self._settled(state)
        if state.state == "down":
            return Verdict(reason=state.reason, deaths=state.deaths)
        return Verdict(
            rerun=True,
            deaths=state.deaths,
            because=(
                f"policy server {self.policy_id} died during it and was restarted "
                f"({state.restarts}/{state.max_restarts}, now {state.url})"
            ),
        )

    def _settled(self, state: ServerState | None) -> ServerState:
        """`state` once no restart is in progress (bounded by restart_bound_s)."""
        deadline = time.monotonic() + restart_bound_s(self.settings)
        while state is not None and state.state == "restarting":
            if time.monotonic() > deadline:
                break
            time.sleep(self.poll_s)
            state = self.read()
        if state is None or state.state == "restarting":
            return ServerState(
                policy_id=self.policy_id,
                url="",
                state="down",
                deaths=state.deaths if state else 0,
                reason=(
                    f"policy server {self.policy_id} did not come back within "
                    f"{restart_bound_s(self.settings):.0f} s (the session's lead restarts it; "
                    f"see {self.log_dir / RESTART_LOG})"
                ),
            )
        return state
