"""summary.json (the config echoed without secrets, cells, pivots, gate, the pooled rates with
their intervals) and each cell's cell_result.json."""

from __future__ import annotations

from pathlib import Path

from pytest_gap.config.document import BenchmarkConfig
from pytest_gap.layout import CELL_RESULT, SUMMARY_JSON
from pytest_gap.outputs.hook import hookimpl
from pytest_gap.report import RunSummary, summary_document
from pytest_gap.results import write_json


def write_summary_json(run_dir: Path, summary: RunSummary, grid: dict) -> None:
    for cell in summary.cells:
        write_json(run_dir / cell.key / CELL_RESULT, cell.model_dump(mode="json"))
    write_json(run_dir / SUMMARY_JSON, summary_document(summary, grid))


@hookimpl
def pytest_gap_write_outputs(
    run_dir: Path, summary: RunSummary, benchmark: BenchmarkConfig
) -> None:
    write_summary_json(run_dir, summary, benchmark.echo())
