"""Start, wait for, and stop the policy servers a benchmark needs; probe the external ones.

Registry entries (`policies:` in the YAML) have exactly one source:
- `url`: an external server; never started, only probed (preflight) before any trial runs;
- `command` (alias `start_cmd`): argv list or shell-style string with `{port}`; managed;
- `preset`: a named openpi command (pi05-libero, pi0-libero, pi0-fast-libero) run in
  $GAP_OPENPI_DIR; managed.
A managed server gets a free port, its own process session (so its whole process tree can be
signalled) and a parent-death signal (so even a SIGKILLed harness does not leave it running).
It counts as started when its port accepts connections; stopping is SIGTERM, then SIGKILL after
`evict_grace_s`. If one server fails to start, every server already started is stopped.
`restart` starts a server that died again, on a new free port, appending to the same log; who
calls it, when and how often is servers/supervisor.py's business.
`gap` as a command's program is this harness's own CLI, run by this interpreter (a session
started as `.venv/bin/python -m pytest` has no venv bin/ on PATH). A program that cannot be
found is a config error (PolicyConfigError), raised before anything starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pytest_gap.config.policies import PolicyEntry, PolicyManagerConfig
from pytest_gap.doors import child_env
from pytest_gap.errors import GapError

OPENPI_DIR_VAR = "GAP_OPENPI_DIR"
PREFLIGHT_TIMEOUT_S = 5.0
# The openpi training configs that serve LIBERO (openpi's src/openpi/training/config.py) and
# publish a checkpoint at gs://openpi-assets/checkpoints/<config>. A preset names one of these.
OPENPI_LIBERO_CONFIGS = ("pi05_libero", "pi0_libero", "pi0_fast_libero")


def _openpi_serve(config: str) -> str:
    """openpi's own server script for one config and its published checkpoint."""
    return (
        "uv run scripts/serve_policy.py --port {port} policy:checkpoint "
        f"--policy.config={config} --policy.dir=gs://openpi-assets/checkpoints/{config}"
    )


# Preset name -> command, run in $GAP_OPENPI_DIR. They speak openpi's protocol and take the
# openpi-libero observation format (the registry entry's defaults).
PRESETS = {
    "pi05-libero": _openpi_serve("pi05_libero"),
    "pi0-libero": _openpi_serve("pi0_libero"),
    "pi0-fast-libero": _openpi_serve("pi0_fast_libero"),
}


class PolicyStartError(GapError, RuntimeError):
    """A managed policy server could not be started."""


class PolicyConfigError(PolicyStartError, ValueError):
    """A managed entry that cannot start as written (unknown preset, no openpi checkout, a
    program that does not exist): the user fixes the config; no server is at fault."""


class PolicyUnreachable(GapError, RuntimeError):
    """An external (url:) policy server did not answer the preflight handshake."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def command_for(policy_id: str, entry: PolicyEntry, port: int) -> tuple[list[str], Path | None]:
    """argv (with {port} filled) and working directory of a managed entry."""
    cwd = None
    if entry.preset is not None:
        if entry.preset not in PRESETS:
            raise PolicyConfigError(
                f"policies.{policy_id}.preset: unknown preset {entry.preset!r}; use one of "
                f"{', '.join(PRESETS)} or give a command"
            )
        root = os.environ.get(OPENPI_DIR_VAR)
        if not root or not Path(root, "scripts/serve_policy.py").is_file():
            raise PolicyConfigError(
                f"policies.{policy_id}.preset {entry.preset}: set {OPENPI_DIR_VAR} to an openpi "
                f"checkout (with scripts/serve_policy.py and uv installed)"
                + (f"; {root} has no scripts/serve_policy.py" if root else "")
            )
        command, cwd = PRESETS[entry.preset], Path(root)
    else:
        command = entry.command
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    argv = [part.replace("{port}", str(port)) for part in argv]
    if not argv:
        raise PolicyConfigError(f"policies.{policy_id}.command is empty; give the server's argv")
    if argv[0] == "gap":
        # This harness's own CLI, from this very install: `gap` on PATH may be missing (the
        # venv's bin/ is not on PATH) or another install's.
        argv = [sys.executable, "-m", "pytest_gap.cli", *argv[1:]]
    return argv, cwd


def check_command(policy_id: str, entry: PolicyEntry) -> None:
    """Raise PolicyConfigError unless a managed entry's program can be found."""
    argv, cwd = command_for(policy_id, entry, 0)
    program = argv[0]
    if "/" in program:
        found = Path(cwd or ".", program).is_file()
    else:
        path = entry.env.get("PATH", os.environ.get("PATH"))
        found = shutil.which(program, path=path) is not None
    if not found:
        raise PolicyConfigError(
            f"policies.{policy_id}: the program {program!r} "
            + ("does not exist" if "/" in program else "is not on PATH")
            + f"; install it or give its full path in policies.{policy_id}.command"
        )


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the harness process dies, however it dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(argv: list[str], cwd: Path | None, entry: PolicyEntry, stdout) -> subprocess.Popen:
    """A server process: its own process session (its whole tree can be signalled), a
    parent-death signal, output to `stdout`, and the entry's `env:` over the allow-listed part
    of this environment (doors.child_env): a policy server never sees the operator's API keys
    or the harness's tokens."""
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=child_env(entry.env),
        stdout=stdout,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )


@dataclass
class ManagedServer:
    """A started server. `process` is its Popen, or for a server another machine runs (a Ray
    actor, scale/ray_policy.py) an object with Popen's poll/pid/returncode and a `stop`."""

    policy_id: str
    port: int
    process: subprocess.Popen | Any
    log: Path | None
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}"


class Launcher(Protocol):
    """Starts the entries it `places` somewhere other than this machine (scale/ray_policy.py)."""

    def places(self, entry: PolicyEntry) -> bool: ...

    def start(self, policy_id: str, entry: PolicyEntry, log: Path | None) -> ManagedServer: ...


class PolicyManager:
    def __init__(
        self,
        settings: PolicyManagerConfig | None = None,
        log_dir: Path | None = None,
        launcher: Launcher | None = None,
    ):
        self.settings = settings or PolicyManagerConfig()
        self.log_dir = log_dir
        self.launcher = launcher
        self.servers: dict[str, ManagedServer] = {}
        self.entries: dict[str, PolicyEntry] = {}  # what each server was started from

    def _placed(self, entry: PolicyEntry) -> bool:
        return self.launcher is not None and self.launcher.places(entry)

    def start_all(self, entries: dict[str, PolicyEntry]) -> dict[str, str]:
        """Start every managed entry; on any failure stop them all and raise. Returns urls."""
        managed = {p: e for p, e in entries.items() if e.url is None and p not in self.servers}
        for policy_id, entry in managed.items():  # a wrong command starts nothing
            if not self._placed(entry):  # a placed one is checked where it runs
                check_command(policy_id, entry)
        try:
            for policy_id, entry in managed.items():
                self.entries[policy_id] = entry
                self.servers[policy_id] = self._start(policy_id, entry)
            for server in self.servers.values():
                self._wait(server)
        except BaseException:
            self.stop_all()
            raise
        return {pid: s.url for pid, s in self.servers.items()}

    def _start(self, policy_id: str, entry: PolicyEntry) -> ManagedServer:
        log = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log = self.log_dir / f"policy_{policy_id}.log"
        if self._placed(entry):
            return self.launcher.start(policy_id, entry, log)
        port = free_port()
        argv, cwd = command_for(policy_id, entry, port)
        stdout = log.open("ab") if log is not None else subprocess.DEVNULL
        try:
            process = spawn(argv, cwd, entry, stdout)
        except OSError as exc:  # not executable, not a program: the command is wrong
            raise PolicyConfigError(
                f"policies.{policy_id}: cannot start {argv[0]!r} ({exc.strerror})"
            ) from None
        finally:
            if stdout is not subprocess.DEVNULL:
                stdout.close()
        return ManagedServer(policy_id, port, process, log)

    def restart(self, policy_id: str, cancel: threading.Event | None = None) -> ManagedServer:
        """Start a managed server that exited again, on a new free port (the old one may still
        be held by connections in TIME_WAIT), and wait until it listens. A restart that does not
        come up is stopped, stays in `servers` (its exit status is its process's returncode)
        and raises PolicyStartError; so does `cancel` being set while waiting."""
        server = self._start(policy_id, self.entries[policy_id])
        self.servers[policy_id] = server
        try:
            self._wait(server, cancel)
        except BaseException:
            self._terminate(server)
            raise
        return server

    def _wait(self, server: ManagedServer, cancel: threading.Event | None = None) -> None:
        deadline = time.monotonic() + self.settings.startup_timeout_s
        loopback_only = getattr(server.process, "loopback_only", None)
        while not port_open(server.port, server.host):
            code = server.process.poll()
            where = f"; its output is in {server.log}" if server.log else ""
            why = loopback_only(server.host) if loopback_only is not None else None
            if why:
                raise PolicyStartError(f"policies.{server.policy_id}: {why}")
            if cancel is not None and cancel.is_set():
                raise PolicyStartError(
                    f"policies.{server.policy_id}: the session ended before the server listened"
                )
            if code is not None:
                raise PolicyStartError(
                    f"policies.{server.policy_id}: the server exited with status {code} before "
                    f"listening on port {server.port}{_on(server)}{where}"
                )
            if time.monotonic() > deadline:
                raise PolicyStartError(
                    f"policies.{server.policy_id}: not listening on port {server.port}"
                    f"{_on(server)} after "
                    f"{self.settings.startup_timeout_s:g} s (policy_manager.startup_timeout_s)"
                    f"{where}"
                )
            time.sleep(0.1)

    def stop(self, policy_id: str) -> None:
        server = self.servers.pop(policy_id, None)
        if server is not None:
            self._terminate(server)

    def _terminate(self, server: ManagedServer) -> None:
        if not isinstance(server.process, subprocess.Popen):  # another machine's: it stops it
            server.process.stop(self.settings.evict_grace_s)
            return
        if server.process.poll() is not None:
            return
        _signal_group(server.process, signal.SIGTERM)
        try:
            server.process.wait(timeout=self.settings.evict_grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(server.process, signal.SIGKILL)
            server.process.wait(timeout=10)

    def stop_all(self) -> None:
        for policy_id in list(self.servers):
            self.stop(policy_id)


def _on(server: ManagedServer) -> str:
    return "" if server.host == "127.0.0.1" else f" of {server.host}"


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def preflight(
    urls: dict[str, tuple[str, str, dict[str, str]]], timeout_s: float = PREFLIGHT_TIMEOUT_S
) -> None:
    """Handshake (in its protocol, with its credentials' headers) with every external server,
    {id: (url, protocol, headers)}; raise for the first that does not answer, naming it and how
    to start it."""
    from pytest_gap.policies.client import PolicyTransportError, connect_policy

    for policy_id, (url, protocol, headers) in urls.items():
        try:
            connect_policy(
                url, protocol, connect_timeout_s=timeout_s, timeout_s=timeout_s, headers=headers
            ).close()
        except PolicyTransportError as exc:
            raise PolicyUnreachable(
                f"preflight: policy {policy_id} at {url} did not answer a {timeout_s:g} s "
                f"handshake ({exc.reason}); start it first (e.g. gap policy serve {policy_id} "
                f"--port P) or fix policies.{policy_id}.url"
            ) from None
