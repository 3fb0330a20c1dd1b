"""The pytest item of one trial, and how its failure reads.

A trial item carries its trial and its config's `LoadedConfig`, its keywords and markers (mode,
family: `-k`, `-m`) and its watchdog. Where its result comes from is the role's choice
(`TRIALS`, execution.py): the item asks for it and reports it. A trial that ran and did not
complete the task fails with one paragraph (`TrialFailed`), no traceback; so does a trial that
could not be recorded (`NotRecorded`).
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from pytest_gap import ids
from pytest_gap.errors import GapError
from pytest_gap.plugin.session import TRIALS, LoadedConfig
from pytest_gap.plugin.watchdog import TimeoutWatchdog
from pytest_gap.results import Corrupt, TrialResult, read_result


class TrialFailed(Exception):
    def __init__(self, result: TrialResult, replayed: bool):
        prefix = "(recorded by an earlier session, not re-run) " if replayed else ""
        super().__init__(prefix + result.message())


# A run dir that cannot take more writes: a trial run there cannot be recorded.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


class NotRecorded(Exception):
    """The trial could not be recorded (full disk, quota, read-only dir): one line, no
    traceback; --gap-resume runs it again once there is room."""

    def __init__(self, exc: OSError, run_dir: Path):
        super().__init__(
            f"not recorded: {exc.strerror} ({exc.filename or run_dir}); results recorded "
            "earlier are kept: make room and run again with --gap-resume"
        )


class TrialItem(pytest.Item):
    def __init__(self, *, trial, loaded: LoadedConfig, **kwargs):
        super().__init__(**kwargs)
        self.trial, self.loaded = trial, loaded
        self.result: TrialResult | None = None
        self.replayed = False  # its result is an earlier session's record (--gap-resume)
        self.notes: list[str] = []
        self.watchdog = TimeoutWatchdog(self)
        cell = trial.cell
        self.extra_keyword_matches.update(cell.keywords)
        self.add_marker(pytest.mark.gap_mode(name=cell.mode))
        self.add_marker(pytest.mark.gap_family(name=cell.family))
        if cell.timeout_s > 0:
            self.add_marker(pytest.mark.timeout(cell.timeout_s))

    def runtest(self) -> None:
        self.skip_if_not_needed()
        result, replayed = self.config.stash[TRIALS].result_of(self)
        self.result, self.replayed = result, replayed
        self.user_properties.extend(result.properties())
        if not result.success:
            raise TrialFailed(result, replayed)

    def skip_if_not_needed(self) -> None:
        """A trial with no record of a cell the sequential gate has stopped is not run: skipped,
        saying when its cell was decided (sequential.py)."""
        cell = self.trial.cell
        stopped = self.loaded.stopped(cell) if cell.block_seeds else None
        if stopped is not None and read_result(self.loaded.run_dir / self.trial.key) is None:
            pytest.skip(
                f"not needed: the sequential gate stopped {cell.row} {cell.column} {stopped.line()}"
            )

    def recorded(self) -> TrialResult | None:
        """The trial's valid record in its run dir, which --gap-resume replays: None when it has
        none, or an infrastructure failure (re-run), or a corrupt one (re-run, with a note)."""
        found = read_result(self.loaded.run_dir / self.trial.key)
        if isinstance(found, Corrupt):
            self.notes.append(f"corrupt {found.path} ({found.problem}); the trial was re-run")
            return None
        if found is None or found.errored:
            return None
        return found

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, TrialFailed | NotRecorded | GapError):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, ids.split_node_id(self.nodeid)[1]


def carry_record(item: pytest.Item, report: pytest.TestReport) -> None:
    """A trial's call report carries its record: JSON-safe extras travel with the report from
    an xdist worker to the controller (the lead's record intake reads them)."""
    if isinstance(item, TrialItem) and report.when == "call":
        if item.result is not None:
            report.gap_result = item.result.model_dump(mode="json")
        report.gap_run_dir = str(item.loaded.run_dir)
        report.gap_replayed = item.replayed
        report.gap_notes = list(item.notes)
