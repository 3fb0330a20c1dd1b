"""Which policy servers a benchmark session needs, and where each process finds them.

The controller process (the only one under pytest-xdist that does not run trials) probes the
external servers, starts the managed ones before any worker exists, and publishes every url
in GAP_POLICY_URLS ({config path: {policy id: url}}), which the workers inherit. `url:` entries
need no publishing: every process reads them from the config.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pytest_gap.config import BenchmarkConfig, PolicyEntry
from pytest_gap.plan import Cell
from pytest_gap.policies.manager import PolicyManager, preflight

URLS_VAR = "GAP_POLICY_URLS"


def needed(config: BenchmarkConfig, cells: list[Cell]) -> dict[str, PolicyEntry]:
    """Registry entries used by cells that will run."""
    ids = sorted({c.policy_id for c in cells if c.policy_id and c.error is None})
    return {pid: config.policies[pid] for pid in ids if pid in config.policies}


def endpoints_for(config: BenchmarkConfig) -> dict[str, dict]:
    """Policy id -> {url, protocol, obs_format, privileged} for one config, in this process;
    obs_format is the entry's resolved format name (PolicyEntry.resolved_obs_format)."""
    published = json.loads(os.environ.get(URLS_VAR) or "{}").get(str(config.source), {})
    endpoints = {}
    for pid, entry in config.policies.items():
        url = entry.url or published.get(pid)
        if url is not None:
            endpoints[pid] = {
                "url": url,
                "protocol": entry.protocol,
                "obs_format": entry.resolved_obs_format,
                "privileged": entry.privileged_state,
            }
    return endpoints


class SessionPolicies:
    """The policy servers of one session: probed or started up front, stopped at the end."""

    def __init__(self) -> None:
        self.managers: list[PolicyManager] = []

    def start(self, configs: list[tuple[BenchmarkConfig, list[Cell], Path]]) -> None:
        """Probe and start what each (config, cells to run, server log dir) needs."""
        published = json.loads(os.environ.get(URLS_VAR) or "{}")
        try:
            for config, cells, log_dir in configs:
                entries = needed(config, cells)
                preflight(
                    {pid: (e.url, e.protocol) for pid, e in entries.items() if e.url is not None}
                )
                manager = PolicyManager(config.policy_manager, log_dir=log_dir)
                self.managers.append(manager)
                started = manager.start_all({p: e for p, e in entries.items() if e.url is None})
                if started:
                    published[str(config.source)] = started
        except BaseException:
            self.stop()
            raise
        os.environ[URLS_VAR] = json.dumps(published)

    def stop(self) -> None:
        for manager in self.managers:
            manager.stop_all()
        self.managers.clear()
