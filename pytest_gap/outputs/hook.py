"""The output hook without a pytest session: the evaluation service writes a run dir's outputs
through the same `pytest_gap_write_outputs` implementations a session calls.

`hookimpl` is pytest's own marker (`pytest.hookimpl` is `pluggy.HookimplMarker("pytest")`), so
a writer module is a pytest plugin without importing pytest, and a server host that has no
pytest session still runs it. `write_outputs` calls the writers on a plugin manager of its own,
in the order a session would (the done flags last), with `config=None`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from pytest_gap.config.document import BenchmarkConfig
    from pytest_gap.report import RunSummary
    from pytest_gap.results import TrialResult

hookimpl = pluggy.HookimplMarker("pytest")

# The writers a run dir gets outside a pytest session: every one but run_manifest.json, whose
# fields are a pytest session's (its options, argv, workers); the service writes its own card.
SESSIONLESS_WRITERS = ("tsv", "json", "parquet", "videos", "plots", "done")


def write_outputs(
    run_dir: Path,
    summary: RunSummary,
    results: dict[str, TrialResult],
    benchmark: BenchmarkConfig,
    writers: tuple[str, ...] = SESSIONLESS_WRITERS,
) -> None:
    """Call `pytest_gap_write_outputs` of the named writers (pytest_gap/outputs/<name>.py)."""
    manager = pluggy.PluginManager("pytest")
    for name in writers:
        manager.register(importlib.import_module(f"pytest_gap.outputs.{name}"), name)
    manager.hook.pytest_gap_write_outputs(
        config=None, run_dir=run_dir, summary=summary, results=results, benchmark=benchmark
    )
