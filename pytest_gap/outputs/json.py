"""summary.json (the config echoed without secrets, cells, pivots, gate, the pooled rates with
their intervals) and each cell's cell_result.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gap.config import BenchmarkConfig
from pytest_gap.redaction import redact_tree
from pytest_gap.report import RunSummary, pivot
from pytest_gap.results import now_iso, write_json

SUMMARY_JSON = "summary.json"
CELL_RESULT = "cell_result.json"


def write_summary_json(run_dir: Path, summary: RunSummary, grid: dict) -> None:
    for cell in summary.cells:
        write_json(run_dir / cell.key / CELL_RESULT, cell.model_dump(mode="json"))
    gate = summary.gate
    matrix = {m: pivot(summary.cells, m)[2] for m in ("success_rate", "completion_rate")}
    write_json(
        run_dir / SUMMARY_JSON,
        {
            "grid": redact_tree(grid),  # a policy url's password, a token in a command
            "cells": [s.model_dump(mode="json") for s in summary.cells],
            "matrix": matrix,
            "gate": gate.model_dump(mode="json"),
            "n_trials": gate.n_trials,
            "n_success": gate.n_success,
            "success_rate": gate.success_rate,
            "completion_rate": gate.completion_rate,
            # 95% intervals of the pooled rates (pytest_gap/intervals.py); null with no trial
            "success_ci_low": gate.success_ci_low,
            "success_ci_high": gate.success_ci_high,
            "completion_ci_low": gate.completion_ci_low,
            "completion_ci_high": gate.completion_ci_high,
            "updated_at": now_iso(),
        },
    )


@pytest.hookimpl
def pytest_gap_write_outputs(
    run_dir: Path, summary: RunSummary, benchmark: BenchmarkConfig
) -> None:
    write_summary_json(run_dir, summary, benchmark.echo())
