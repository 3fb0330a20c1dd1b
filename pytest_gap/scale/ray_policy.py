"""Managed policy servers as Ray actors: `policies.<id>.ray` under `--gap-ray`.

A managed entry (command or preset) with `ray: {num_gpus: 1}` is started by a Ray actor that
holds those resources, on whichever node has them (a GPU node, where the controller may have
none). The actor runs the server as a child process, as the controller would (a free port of
that node, its own process session, a parent-death signal), and the session reaches it at
ws://<node address>:<port>, as do the trial actors on every other node. Ray's GPU assignment
(CUDA_VISIBLE_DEVICES) is the server's environment.

On the controller the server is a `ManagedServer` whose `process` is a `RayServerProcess`: the
subset of `subprocess.Popen` that servers/manager.py and servers/supervisor.py use (poll, pid,
returncode), so the supervisor restarts a server Ray placed exactly as a local one: a server
that exits, or an actor or node that dies, reads as an exit; the restart asks Ray again, which
may place it elsewhere. The server's output is copied into the session's
`policy_logs/policy_<id>.log` as it comes, so restart lines quote its tail as for a local one.

The server must listen beyond its node's loopback for trials on other nodes to reach it
(openpi's serve_policy.py binds 0.0.0.0; `gap policy serve` takes `--host 0.0.0.0`); one that
answers only on 127.0.0.1 is a start error that says so.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from pytest_gap.config.policies import PolicyEntry, RayResources
from pytest_gap.scale.ray_cluster import STARTUP_TIMEOUT_S
from pytest_gap.servers.manager import (
    ManagedServer,
    PolicyConfigError,
    PolicyStartError,
    check_command,
    command_for,
    free_port,
    port_open,
    spawn,
)

CALL_TIMEOUT_S = 30.0  # one call to a server's actor (it answers at once unless its node is gone)
# The exit status a server reads as when its actor or node is gone: killed.
GONE = -signal.SIGKILL


class PolicyServerActor:
    """Runs one policy server process on its node (made a Ray actor class by `actor_class`)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.log: Path | None = None
        self.port = 0

    def start(self, policy_id: str, entry_json: str) -> dict[str, Any]:
        """Start the server; {host, port, pid, gpus} or {"error": one line} for a config
        problem found on this node (a program or an openpi checkout that is not here)."""
        import ray

        entry = PolicyEntry.model_validate_json(entry_json)
        self.port = free_port("0.0.0.0")  # free on every address: it may bind any
        try:
            check_command(policy_id, entry)
            argv, cwd = command_for(policy_id, entry, self.port)
        except PolicyConfigError as exc:
            return {"error": f"{exc} (on Ray node {ray.util.get_node_ip_address()})"}
        self.log = Path(tempfile.mkdtemp(prefix="gap-policy-")) / f"policy_{policy_id}.log"
        try:
            with self.log.open("ab") as out:
                self.process = spawn(argv, cwd, entry, out)
        except OSError as exc:  # not executable, not a program: the command is wrong
            return {
                "error": f"policies.{policy_id}: cannot start {argv[0]!r} ({exc.strerror}) on "
                f"Ray node {ray.util.get_node_ip_address()}"
            }
        return {
            "host": ray.util.get_node_ip_address(),
            "node": ray.get_runtime_context().get_node_id(),
            "port": self.port,
            "pid": self.process.pid,
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    def poll(self, offset: int) -> tuple[int | None, bytes]:
        """The server's exit status (None while it runs) and its output from byte `offset` on:
        one round trip for the supervisor's every look."""
        code = None if self.process is None else self.process.poll()
        return code, self.output(offset)

    def loopback_only(self, host: str) -> bool:
        """Whether the server answers on this node's 127.0.0.1 but not on `host`."""
        return port_open(self.port) and not port_open(self.port, host)

    def output(self, offset: int) -> bytes:
        """The server's output from byte `offset` on."""
        if self.log is None or not self.log.is_file():
            return b""
        with self.log.open("rb") as handle:
            handle.seek(offset)
            return handle.read()

    def stop(self, grace_s: float) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait(timeout=10)


class RayServerProcess:
    """The controller's view of a server a Ray actor runs (see the module docstring)."""

    def __init__(
        self,
        ray,
        actor,
        pid: int,
        log: Path | None,
        node: str = "",
        held: RayResources | None = None,
    ):
        self._ray, self._actor = ray, actor
        self.pid = pid
        self.node, self.held = node, held  # where it runs, what it holds there
        self.returncode: int | None = None
        self._log, self._offset = log, 0

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        try:
            code, data = self._ray.get(
                self._actor.poll.remote(self._offset), timeout=CALL_TIMEOUT_S
            )
        except self._ray.exceptions.GetTimeoutError:
            return None  # no answer yet is not an exit
        except self._ray.exceptions.RayError:  # the actor, or its node, is gone
            code, data = GONE, b""
        self._append(data)
        if code is not None:
            self.returncode = code
            # The actor holds its resources (a GPU) until it goes: free them for the restart.
            with contextlib.suppress(Exception):
                self._ray.kill(self._actor, no_restart=True)
        return self.returncode

    def loopback_only(self, host: str) -> str | None:
        """Why the server will never answer the session (it listens on its node's 127.0.0.1
        only), or None."""
        with contextlib.suppress(self._ray.exceptions.RayError):
            if self._ray.get(self._actor.loopback_only.remote(host), timeout=CALL_TIMEOUT_S):
                return (
                    f"the server on Ray node {host} listens on 127.0.0.1 only, so no other "
                    "node reaches it; bind it to 0.0.0.0 (gap policy serve: --host 0.0.0.0)"
                )
        return None

    def sync_output(self) -> None:
        """Append what the server wrote since the last look to the session's log."""
        if self._log is None:
            return
        with contextlib.suppress(self._ray.exceptions.RayError):
            self._append(
                self._ray.get(self._actor.output.remote(self._offset), timeout=CALL_TIMEOUT_S)
            )

    def _append(self, data: bytes) -> None:
        if data and self._log is not None:
            self._offset += len(data)
            with self._log.open("ab") as handle:
                handle.write(data)

    def stop(self, grace_s: float) -> None:
        if self.returncode is None:
            with contextlib.suppress(self._ray.exceptions.RayError):
                code = self._ray.get(
                    self._actor.stop.remote(grace_s), timeout=grace_s + CALL_TIMEOUT_S
                )
                self.returncode = code if code is not None else GONE
            self.sync_output()
        with contextlib.suppress(Exception):
            self._ray.kill(self._actor, no_restart=True)
        if self.returncode is None:
            self.returncode = GONE


def held_by_servers(servers: list[ManagedServer]) -> dict[str, dict[str, float]]:
    """Node id -> the resources the running Ray-placed servers among `servers` hold there (in
    `ray.nodes()` terms), so that trial actors are not planned into them."""
    held: dict[str, dict[str, float]] = {}
    for server in servers:
        process = server.process
        if isinstance(process, RayServerProcess) and process.returncode is None and process.held:
            node = held.setdefault(process.node, {})
            for key, value in (
                ("CPU", process.held.num_cpus),
                ("GPU", process.held.num_gpus),
                ("memory", process.held.memory),
            ):
                if value:
                    node[key] = node.get(key, 0.0) + value
    return held


def actor_class(ray):
    return ray.remote(max_restarts=0, max_concurrency=4)(PolicyServerActor)


class RayLauncher:
    """Starts managed servers whose entry has `ray:` as Ray actors (PolicyManager's hook)."""

    def __init__(self, ray):
        self.ray = ray
        self._cls = actor_class(ray)

    def places(self, entry: PolicyEntry) -> bool:
        return entry.ray is not None

    def start(self, policy_id: str, entry: PolicyEntry, log: Path | None) -> ManagedServer:
        resources: RayResources = entry.ray
        options: dict[str, Any] = {"num_cpus": resources.num_cpus, "num_gpus": resources.num_gpus}
        if resources.memory:
            options["memory"] = resources.memory
        actor = self._cls.options(**options).remote()
        try:
            started = self.ray.get(
                actor.start.remote(policy_id, entry.model_dump_json()), timeout=STARTUP_TIMEOUT_S
            )
        except self.ray.exceptions.GetTimeoutError:
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)
            raise PolicyStartError(
                f"policies.{policy_id}: Ray placed no actor with policies.{policy_id}.ray "
                f"({resources.model_dump(exclude_none=True)}) within {STARTUP_TIMEOUT_S:g} s; "
                "does a node of the cluster have those resources free?"
            ) from None
        except self.ray.exceptions.RayError as exc:
            raise PolicyStartError(
                f"policies.{policy_id}: the Ray actor that starts the server failed "
                f"({str(exc).splitlines()[0][:200]})"
            ) from None
        if "error" in started:
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)
            raise PolicyConfigError(started["error"])
        if log is not None:
            with log.open("a") as handle:
                handle.write(
                    f"gap: started by Ray on node {started['host']} ({started['node'][:12]}), "
                    f"CUDA_VISIBLE_DEVICES={started['gpus']}, pid {started['pid']}\n"
                )
        process = RayServerProcess(self.ray, actor, started["pid"], log, started["node"], resources)
        return ManagedServer(policy_id, started["port"], process, log, host=started["host"])
