"""summary.tsv: one row per cell (the spec's columns, then the rates' 95% intervals, then the
reference loops' rate: report.REF_COLUMNS; in a run where they occur, the drops against control
arms and the harness faults: report.CONTROL_COLUMNS, report.FAULT_COLUMNS), then the success
and completion pivots (report.format_tsv)."""

from __future__ import annotations

from pathlib import Path

from pytest_gap.layout import SUMMARY_TSV
from pytest_gap.outputs.hook import hookimpl
from pytest_gap.report import RunSummary, format_tsv


def write_tsv(run_dir: Path, summary: RunSummary) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / SUMMARY_TSV).write_text(format_tsv(summary.cells))


@hookimpl
def pytest_gap_write_outputs(run_dir: Path, summary: RunSummary) -> None:
    write_tsv(run_dir, summary)
