"""aaa_done_flag.txt, in the run dir and in each mode's (or `suites`) dir: a sentinel that exists
only while every planned trial of its scope has a record. Written after every other writer
(`trylast`), so whoever waits for a flag finds the summaries written."""

from __future__ import annotations

from pathlib import Path

from pytest_gap.layout import DONE_FLAG
from pytest_gap.outputs.hook import hookimpl
from pytest_gap.report import Recorded, RunSummary
from pytest_gap.results import now_iso


def write_flags(run_dir: Path, summary: RunSummary) -> None:
    _flag(run_dir / DONE_FLAG, summary.run)
    for top, counts in summary.by_mode.items():
        _flag(run_dir / top / DONE_FLAG, counts)


def _flag(path: Path, counts: Recorded) -> None:
    if counts.complete:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            f"done {now_iso()}: {counts.recorded} of {counts.planned} trials recorded\n"
        )
    else:
        path.unlink(missing_ok=True)


@hookimpl(trylast=True)
def pytest_gap_write_outputs(run_dir: Path, summary: RunSummary) -> None:
    write_flags(run_dir, summary)
