"""run_manifest.json: what produced the run dir's numbers, and every session over it, appended.

The top level follows EBench's run record (spec/ebench-evaluate.md "Record a small manifest
beside the run logs"), as of the latest session; a field that cannot be known says "unknown":

    run_id            the run dir's name
    config            the benchmark YAML; plan_digest, its provenance.plan_digest
    project           pytest-gap's name and version, and `git` of the checkout it runs from
                      (commit, dirty: tracked files changed); config_git the same for the
                      checkout holding the YAML; workflow_dirs: each workflow directory the
                      config names, with its checkout (dirty: that directory has changes,
                      untracked files included)
    packages          versions of the packages a result depends on
    harness_surface   {digest, files, packages}: provenance.harness_surface of the config's
                      backend (`gap compare` names the files whose digests differ)
    backend           the simulator backend
    policies          policy id -> {urls, metadata_digests}: the servers that answered and the
                      digests of their metadata frames, from the records (secrets masked)
    llm               {provider, model} when a planned mode has the LLM write workflows, else
                      "not used"
    split             LIBERO has no train / held-out split ("kind": "unknown"); what is known is
                      the selection: per cell column, its suite, task ids and seeds
    workers           worker (or "main" without xdist) -> the devices its trials saw
    horizon           per cell: run_policy's replan_every (actions applied per observation);
                      action_horizon (the chunk length a server returns) is not recorded
    shard             {spec, index, count, plan_digest} of a `--gap-shard K/N` session, else
                      null (`gap merge` reads it to say which shards its inputs are)
    policy_servers    the managed policy servers of the latest session that started any, their
                      state and every restart (policy_logs/servers.json), or "none"
    started_at, finished_at, host, command (sanitized: pytest_gap/redaction.py)
    results           where the outputs are, relative to the run dir
    sessions          every session over the run dir: its times, host, argv and options

No secret, token or signed url is written: the command line, urls and every string pass through
pytest_gap/redaction.py.
"""

from __future__ import annotations

import inspect
import json
import shlex
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_gap import ids
from pytest_gap.config.document import BenchmarkConfig
from pytest_gap.layout import (
    CELL_RESULT,
    EPISODES,
    MANIFEST,
    POLICY_LOGS_DIR,
    SUMMARY_JSON,
    SUMMARY_TSV,
    VIDEOS_DIR,
)
from pytest_gap.provenance import (
    PACKAGE_ROOT,
    UNKNOWN,
    git_info,
    harness_surface,
    package_versions,
    plan_digest,
)
from pytest_gap.redaction import redact_argv, redact_tree
from pytest_gap.report import RunSummary
from pytest_gap.results import TrialResult, now_iso, write_json

STARTED = pytest.StashKey[str]()
# Packages a result depends on beyond the simulator's (which harness_surface lists).
HARNESS_PACKAGES = (
    "pytest-gap",
    "pytest",
    "pytest-xdist",
    "pytest-timeout",
    "pydantic",
    "websockets",
    "msgpack",
    "openai",
    "pyarrow",
    "vla-eval",
)


def write_manifest(
    run_dir: Path, config_path: Path, session: dict, run: dict | None = None
) -> None:
    """Update run_manifest.json: `run`'s fields at the top level (the latest session's view),
    and this session appended to `sessions`.

    The command line is recorded with secret values masked (`--api-key ***`, `TOKEN=***`,
    `Authorization: Bearer ***`, `ws://user:***@host`, `X-Amz-Signature=***`): a run dir is
    shared, keys are not.
    """
    from pytest_gap import __version__

    path = run_dir / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        manifest = {"config": str(config_path), "created_at": now_iso(), "sessions": []}
    manifest["pytest_gap_version"] = __version__
    run = dict(run or {})
    # Kept out of redact_tree: the surface is digests and versions (nothing to mask), and the
    # command is masked already (command_line); redact_tree would re-split it, losing its quotes.
    kept = {key: run.pop(key) for key in ("harness_surface", "command") if key in run}
    manifest.update(redact_tree(run) | kept)
    manifest["sessions"].append(
        redact_tree(
            {
                "finished_at": now_iso(),
                "host": socket.gethostname(),
                "argv": redact_argv(sys.argv[1:]),
                **session,
            }
        )
    )
    write_json(path, manifest)


def was_debug_run(run_dir: Path) -> bool:
    """Did a session record trials in `run_dir` in-process (GAP_PARALLEL_INPROC=1)? Its
    results stay there, so a later session's summary is marked too."""
    try:
        sessions = json.loads((run_dir / MANIFEST).read_text()).get("sessions", [])
    except (OSError, ValueError, AttributeError):
        return False
    return any(isinstance(s, dict) and s.get("debug_run") for s in sessions)


def session_options(config: pytest.Config) -> dict:
    """The options that change what a session runs: --gap-resume, --gap-families, --gap-modes
    (comma-separated values split, as the plugin reads them), --gap-shard."""

    def split(values: list[str] | None) -> list[str] | None:
        return [v for value in values for v in value.split(",") if v] if values else None

    return {
        "resume": config.getoption("gap_resume"),
        "families": split(config.getoption("gap_families")),
        "modes": split(config.getoption("gap_modes")),
        "shard": config.getoption("gap_shard", None),
    }


def command_line(argv: list[str]) -> str:
    """The session's command as a shell line, secrets masked."""
    program = Path(argv[0]).name if argv else "pytest"
    if program == "__main__.py":  # python -m pytest
        program = "python -m pytest"
    return " ".join([program, shlex.join(redact_argv(argv[1:]))]).strip()


# -- the run's fields ------------------------------------------------------------------------------
def _cell_key(trial_dir: str) -> str:
    return ids.cell_of_key(trial_dir)


def policy_identities(results: dict[str, TrialResult], planned: list[str]) -> dict:
    """policy id -> the urls that served it and the digests of their metadata frames."""
    found: dict[str, dict[str, set]] = {pid: {"urls": set(), "digests": set()} for pid in planned}
    for r in results.values():
        if r.policy_id:
            entry = found.setdefault(r.policy_id, {"urls": set(), "digests": set()})
            entry["urls"] |= {r.policy_url} if r.policy_url else set()
            entry["digests"] |= {r.policy_digest} if r.policy_digest else set()
    return {
        pid: {
            "urls": sorted(e["urls"]) or UNKNOWN,
            "metadata_digests": sorted(e["digests"]) or UNKNOWN,
        }
        for pid, e in sorted(found.items())
    }


def worker_devices(results: dict[str, TrialResult]) -> dict:
    """worker -> the devices its latest trial saw ("main": a session without xdist)."""
    latest = sorted(results.values(), key=lambda r: r.finished_at or "")
    return {r.worker or "main": dict(r.devices) or UNKNOWN for r in latest}


def _replan_every_default() -> int:
    from pytest_gap.skills.policy import run_policy

    return inspect.signature(run_policy).parameters["replan_every"].default


def horizons(run_dir: Path, results: dict[str, TrialResult]) -> dict:
    """Per cell key: the replan_every of every run_policy node its trials' workflows ran."""
    per_cell: dict[str, set] = {}
    for key, r in results.items():
        values = per_cell.setdefault(_cell_key(key), set())
        if r.workflow:
            try:
                graph = json.loads((run_dir / r.workflow / "workflow.json").read_text())
            except (OSError, ValueError):
                continue
            for node in (graph.get("nodes") or {}).values():
                if isinstance(node, dict) and node.get("skill") == "run_policy":
                    value = (node.get("inputs") or {}).get("replan_every", _replan_every_default())
                    values.add(value if isinstance(value, int) else "from another node")
        elif r.backend_info.get("backend") == "vla-eval":
            values.add("1 (vla-eval's loop: one action per observation)")
    return {
        "replan_every": {
            cell: sorted(values, key=str) if values else "no run_policy"
            for cell, values in sorted(per_cell.items())
        },
        "action_horizon": UNKNOWN,  # the chunk length a server returns is not recorded
    }


def policy_servers(run_dir: Path) -> dict | str:
    """The managed servers' final state and restarts, as their supervisor published them."""
    from pytest_gap.servers.supervisor import read_state

    found = read_state(run_dir / POLICY_LOGS_DIR)
    if found is None:
        return "none"
    return {
        "started_at": found.started_at,
        "servers": {
            pid: s.model_dump(include={"state", "deaths", "restarts", "max_restarts", "reason"})
            for pid, s in found.servers.items()
        },
        "restarts": [event.model_dump() for event in found.restarts],
    }


def planned_cells(config: pytest.Config, benchmark: BenchmarkConfig):
    """The config's cells as the session planned them (the session's mode table)."""
    from pytest_gap.modes import ModeTable
    from pytest_gap.plan import plan

    hook = config.hook
    table = ModeTable.of(
        hook.pytest_gap_modes(config=config), hook.pytest_gap_producers(config=config)
    )
    return plan(benchmark, mode_table=table)


def shard_record(config: pytest.Config, benchmark: BenchmarkConfig) -> dict | None:
    """The session's `--gap-shard K/N` and the plan it cut, or None (an unsharded session)."""
    from pytest_gap.scale.shard import parse_shard

    raw = config.getoption("gap_shard", None)
    if raw is None:
        return None
    spec = parse_shard(raw)
    return {
        "spec": str(spec),
        "index": spec.index,
        "count": spec.count,
        "plan_digest": plan_digest(benchmark),
    }


def workflow_dirs(benchmark: BenchmarkConfig) -> list[Path]:
    dirs = [entry.workflow_dir for entry in benchmark.suites or []]
    if benchmark.benchmark is not None:
        dirs += [o.workflow_dir for o in benchmark.benchmark.mode_overrides.values()]
    return sorted({Path(d) for d in dirs if d is not None})


def run_fields(
    config: pytest.Config,
    run_dir: Path,
    benchmark: BenchmarkConfig,
    results: dict[str, TrialResult],
) -> dict[str, Any]:
    """The manifest's top level for this run dir, as of now."""
    from pytest_gap import __version__

    cells = planned_cells(config, benchmark)
    backend = cells[0].backend if cells else UNKNOWN
    surface = harness_surface(backend) if cells else None
    llm_cells = [c for c in cells if c.uses_llm]
    split: dict[str, Any] = {}
    for cell in cells:
        entry = split.setdefault(cell.column, {"suite": cell.suite, "task_ids": [], "seeds": []})
        entry["task_ids"] = sorted({*entry["task_ids"], *cell.task_ids})
        entry["seeds"] = sorted({*entry["seeds"], *cell.seeds})
    source = benchmark.source
    return {
        "run_id": run_dir.name,
        "plan_digest": plan_digest(benchmark),
        "project": {
            "name": "pytest-gap",
            "version": __version__,
            "git": git_info(PACKAGE_ROOT).model_dump(),
        },
        "config_git": git_info(source).model_dump() if source else UNKNOWN,
        "workflow_dirs": {
            str(d): git_info(d, only_here=True, untracked=True).model_dump()
            for d in workflow_dirs(benchmark)
        },
        "packages": package_versions(HARNESS_PACKAGES)
        | (surface.packages if surface is not None else {}),
        "harness_surface": surface.model_dump() if surface is not None else UNKNOWN,
        "backend": backend,
        "policies": policy_identities(results, sorted({c.policy_id for c in cells if c.policy_id})),
        "llm": {"provider": benchmark.llm.provider, "model": benchmark.llm.model or UNKNOWN}
        if llm_cells
        else "not used",
        "split": {"kind": UNKNOWN, "cells": split},
        "workers": worker_devices(results),
        "horizon": horizons(run_dir, results),
        "policy_servers": policy_servers(run_dir),
        "shard": shard_record(config, benchmark),
        "started_at": config.stash.get(STARTED, UNKNOWN),
        "finished_at": now_iso(),
        "host": socket.gethostname(),
        "command": command_line(sys.argv),
        "results": {
            "run_dir": str(run_dir),
            "summary_tsv": SUMMARY_TSV,
            "summary_json": SUMMARY_JSON,
            "episodes": EPISODES,
            "cells": sorted(f"{c.key}/{CELL_RESULT}" for c in cells),
            "trials": len(results),
            "videos": f"{VIDEOS_DIR}/" if (run_dir / VIDEOS_DIR).is_dir() else "none",
            "policy_logs": f"{POLICY_LOGS_DIR}/"
            if (run_dir / POLICY_LOGS_DIR).is_dir()
            else "none",
        },
    }


@pytest.hookimpl
def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[STARTED] = now_iso()


@pytest.hookimpl
def pytest_gap_write_outputs(
    config: pytest.Config,
    run_dir: Path,
    benchmark: BenchmarkConfig,
    results: dict[str, TrialResult],
    summary: RunSummary,
) -> None:
    run = run_fields(config, run_dir, benchmark, results)
    run["debug_run"] = summary.gate.debug
    session = {
        "debug_run": bool(config.getoption("gap_debug_run")),
        "started_at": run["started_at"],
        "plan_digest": run["plan_digest"],
        "harness_surface": run["harness_surface"]["digest"]
        if isinstance(run["harness_surface"], dict)
        else UNKNOWN,
        **session_options(config),
    }
    write_manifest(run_dir, benchmark.source, session, run)
