"""Which policy servers a benchmark session needs, and where each process finds them.

The controller process (the only one under pytest-xdist that does not run trials) probes the
external servers and starts the managed ones before any worker exists; `SessionPolicies.urls`
({config path: {policy id: url}}) is what the plugin hands each worker (xdist's workerinput).
A managed server that dies is restarted on a new port by the controller (servers/supervisor.py),
so a trial asks `supervisor.live_urls` where it is now. `url:` entries need no handing over:
every process reads them from the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pytest_gap.cells import Cell
from pytest_gap.config.document import BenchmarkConfig
from pytest_gap.config.policies import PolicyEntry
from pytest_gap.policies.credentials import credential_headers, unset
from pytest_gap.policies.endpoint import PolicyEndpoint
from pytest_gap.servers.manager import Launcher, PolicyConfigError, PolicyManager, preflight
from pytest_gap.servers.supervisor import STATE_FILE, Supervisor


def needed(config: BenchmarkConfig, cells: list[Cell]) -> dict[str, PolicyEntry]:
    """Registry entries used by cells that will run."""
    ids = sorted(
        {p for c in cells if c.error is None for p in (c.policy_id, *c.workflow_policies) if p}
    )
    return {pid: config.policies[pid] for pid in ids if pid in config.policies}


def endpoints_for(
    config: BenchmarkConfig, started: Mapping[str, str] | None = None
) -> dict[str, PolicyEndpoint]:
    """Policy id -> endpoint for one config's entries that have a url: their own, or for a
    managed server the one it was started on (`started`: {policy id: url}, from
    SessionPolicies.urls). obs_format is the entry's resolved format
    (PolicyEntry.resolved_obs_format)."""
    published = started or {}
    endpoints = {}
    for pid, entry in config.policies.items():
        url = entry.url or published.get(pid)
        if url is not None:
            endpoints[pid] = PolicyEndpoint(
                url=url,
                protocol=entry.protocol,
                obs_format=entry.resolved_obs_format,
                privileged=entry.privileged_state,
                timeout_s=entry.timeout_s,
                warmup_timeout_s=entry.warmup_timeout_s,
                max_reply_mb=entry.max_reply_mb,
                policy_id=pid,
                api_key_env=entry.api_key_env,
                headers_env=entry.headers_env,
            )
    return endpoints


class SessionPolicies:
    """The policy servers of one session: probed or started up front, kept up while the session
    runs (servers/supervisor.py: a server that dies is restarted), stopped at the end."""

    def __init__(self) -> None:
        self.managers: list[PolicyManager] = []
        self.supervisors: list[Supervisor] = []
        self.urls: dict[str, dict[str, str]] = {}  # config path -> {policy id: url} started
        self.notices: list[str] = []  # one line per started server reachable beyond loopback

    def start(
        self,
        configs: list[tuple[BenchmarkConfig, list[Cell], Path]],
        launcher: Launcher | None = None,
    ) -> None:
        """Probe and start what each (config, cells to run, server log dir) needs; entries
        `launcher` places start there (Ray actors, under --gap-ray), the rest on this machine."""
        try:
            for config, cells, log_dir in configs:
                entries = needed(config, cells)
                check_credentials(config.source, entries)
                preflight(
                    {
                        pid: (e.url, e.protocol, _headers(pid, e))
                        for pid, e in entries.items()
                        if e.url is not None
                    }
                )
                self.notices += [
                    f"policies.{pid}.ray places a server on a Ray cluster under --gap-ray only: "
                    "this session starts it on this machine"
                    for pid, e in entries.items()
                    if e.ray is not None and launcher is None
                ]
                manager = PolicyManager(config.policy_manager, log_dir=log_dir, launcher=launcher)
                self.managers.append(manager)
                (log_dir / STATE_FILE).unlink(missing_ok=True)  # an earlier session's servers
                started = manager.start_all({p: e for p, e in entries.items() if e.url is None})
                if started:
                    self.urls[str(config.source)] = started
                    supervisor = Supervisor(manager, log_dir)
                    self.supervisors.append(supervisor)
                    supervisor.start()
                    self.notices += _exposure_notices(started)
        except BaseException:
            self.stop()
            raise

    def servers(self) -> list:
        """Every managed server started, as servers/manager.py `ManagedServer`s."""
        return [s for manager in self.managers for s in manager.servers.values()]

    def lines(self) -> list[str]:
        """The restart lines logged since the last call, for the session's output."""
        found = []
        for supervisor in self.supervisors:
            while not supervisor.lines.empty():
                found.append(supervisor.lines.get())
        return found

    def stop(self) -> None:
        for supervisor in self.supervisors:  # first: no restart of a server being stopped
            supervisor.stop()
        self.supervisors.clear()
        for manager in self.managers:
            manager.stop_all()
        self.managers.clear()


def check_credentials(source, entries: Mapping[str, PolicyEntry]) -> None:
    """PolicyConfigError (a usage error, before any server starts) naming each credential
    variable an entry names that this environment lacks."""
    missing = [
        line
        for pid, e in entries.items()
        for line in unset(f"policies.{pid}", e.api_key_env, e.headers_env)
    ]
    if missing:
        raise PolicyConfigError(f"{source}: " + "; ".join(missing))


def _headers(policy_id: str, entry: PolicyEntry) -> dict[str, str]:
    return credential_headers(f"policies.{policy_id}", entry.api_key_env, entry.headers_env)


def _exposure_notices(started: dict[str, str]) -> list[str]:
    """The managed servers whose command bound them beyond loopback (the harness reaches them
    on 127.0.0.1; other machines could too)."""
    from urllib.parse import urlsplit

    from pytest_gap.bind import reachable_beyond_loopback

    notices = []
    for policy_id, url in started.items():
        parts = urlsplit(url)
        port = parts.port
        if parts.hostname != "127.0.0.1":  # placed on a cluster node (scale/ray_policy.py)
            notices.append(
                f"policies.{policy_id}: started by Ray at {url}, listening beyond loopback as "
                "trials on other nodes need"
            )
            continue
        address = reachable_beyond_loopback(port) if port else None
        if address is not None:
            notices.append(
                f"policies.{policy_id}: the managed server listens beyond loopback (port {port} "
                f"answers on {address}): other machines can reach it; bind it to 127.0.0.1 if "
                "its command allows"
            )
    return notices
