"""run_manifest.json: every session over a run dir, appended: who ran what, where, with which
options (pytest_gap/redaction.py masks secrets in the command line)."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from pytest_gap.config import BenchmarkConfig
from pytest_gap.redaction import redact_argv, redact_tree
from pytest_gap.results import now_iso, write_json

MANIFEST = "run_manifest.json"


def write_manifest(run_dir: Path, config_path: Path, session: dict) -> None:
    """Append this session to run_manifest.json: who ran what, where, with which options.

    The command line is recorded with secret values masked (`--api-key ***`, `TOKEN=***`,
    `Authorization: Bearer ***`, `ws://user:***@host`): a run dir is shared, keys are not.
    """
    from pytest_gap import __version__

    path = run_dir / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        manifest = {"config": str(config_path), "created_at": now_iso(), "sessions": []}
    manifest["pytest_gap_version"] = __version__
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


def session_options(config: pytest.Config) -> dict:
    """The options that change what a session runs: --gap-resume, --gap-families, --gap-modes
    (comma-separated values split, as the plugin reads them)."""

    def split(values: list[str] | None) -> list[str] | None:
        return [v for value in values for v in value.split(",") if v] if values else None

    return {
        "resume": config.getoption("gap_resume"),
        "families": split(config.getoption("gap_families")),
        "modes": split(config.getoption("gap_modes")),
    }


@pytest.hookimpl
def pytest_gap_write_outputs(
    config: pytest.Config, run_dir: Path, benchmark: BenchmarkConfig
) -> None:
    write_manifest(run_dir, benchmark.source, session_options(config))
