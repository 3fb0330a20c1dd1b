"""The lead's lines on the terminal (xdist's `TerminalDistReporter`, for a benchmark session).

Every line the session writes goes through `GapReporter`: notices before the session's header
(`say`), the policy servers' restart lines as they come, a config's progress as each trial is
recorded (--gap-progress), and the `pytest-gap` block of the terminal summary: per config its
run dir, its cells, its progress and its gate line, then the notes and the errors. Only the main
thread writes to the terminal; what it writes is decided elsewhere (decisions.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from pytest_gap.plugin.decisions import Outcome
from pytest_gap.plugin.options import GapOptions

if TYPE_CHECKING:
    from pytest_gap.progress import Progress


class GapReporter:
    def __init__(self, config: pytest.Config, options: GapOptions):
        self.config, self.options = config, options

    def terminal(self):
        """pytest's terminal reporter, when there is one (looked up each time: the lead is
        made before it, and `-p no:terminal` has none)."""
        return self.config.pluginmanager.get_plugin("terminalreporter")

    def say(self, line: str) -> None:
        """One line on the terminal, before the session's header (sessionstart)."""
        reporter = self.terminal()
        if reporter is not None:
            reporter.write_line(f"gap: {line}", yellow=True)

    def policy_lines(self, lines: list[str]) -> list[str]:
        """Print the policy servers' restart lines; returns those no terminal could show (they
        are said with the session's notes)."""
        reporter = self.terminal()
        unshown = []
        for line in lines:
            if reporter is None:
                unshown.append(line)
                continue
            # xdist's progress letters leave the cursor mid-line (write_line does not know)
            reporter.ensure_newline()
            if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):
                reporter.write("\n")
            reporter.write_line(f"gap: {line}", yellow=True)
        return unshown

    def progress(self, progress: Progress) -> None:
        """A config's progress, as a trial of it is recorded (--gap-progress)."""
        reporter = self.terminal()
        if self.options.live_progress and reporter is not None and self.verbose():
            reporter.write_line(f"gap progress {progress.line(time.monotonic())}")

    def verbose(self) -> bool:
        return self.config.get_verbosity() >= 0

    def summary(
        self, terminalreporter, outcomes: list[Outcome], notes: list[str], errors: list[str]
    ) -> None:
        """The `pytest-gap` block of the terminal summary (nothing when no trial was recorded)."""
        if not outcomes:
            return
        from pytest_gap.report import console_table  # the session's end only

        terminalreporter.write_sep("=", "pytest-gap")
        for outcome in outcomes:
            terminalreporter.write_line(f"{outcome.config}")
            terminalreporter.write_line(f"run dir: {outcome.run_dir}")
            terminalreporter.write_line(f"report:  gap viz {outcome.run_dir}")
            if outcome.cells:
                terminalreporter.write_line(console_table(outcome.cells))
            self._gate_line(terminalreporter, outcome)
        for note in notes:
            terminalreporter.write_line(f"gap: {note}", yellow=True)
        for error in errors:
            terminalreporter.write_line(f"gap: error: {error}", red=True, bold=True)

    def _gate_line(self, terminalreporter, outcome: Outcome) -> None:
        gate = outcome.gate
        suffix = "" if self.options.gate_on else "  [--gap-no-gate: not deciding the exit status]"
        progress = outcome.progress
        if progress is not None and self.verbose():
            terminalreporter.write_line(f"progress: {progress.line(time.monotonic())}")
        terminalreporter.write_line(
            gate.line() + suffix,
            bold=True,
            green=gate.passed,
            red=gate.verdict == "FAIL",
            yellow=gate.verdict == "INCONCLUSIVE",
        )
