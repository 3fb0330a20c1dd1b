"""The lead of a session: the process that owns it (the single process, or xdist's controller).

It runs the preflight before any trial (the LLM key, the policy servers), takes in every
report (each trial's record, other failures, why a session stopped), writes every touched
config's outputs at the end and decides the exit status with the gate. What each event means
is decided in decisions.py; what it prints, by the reporter; the roles (single.py,
controller.py) add how their trials run.

What only a benchmark session needs (the preflight, the policy servers, the report, the Ray
launcher) is imported where it is used: this package is loaded by every pytest run of the
environment, a test suite's too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_gap.errors import GapError
from pytest_gap.layout import POLICY_LOGS_DIR, new_stamp
from pytest_gap.plugin.decisions import (
    Outcome,
    Stop,
    collect_stop,
    exit_status,
    first_stop,
    intake,
    internal_error_stop,
    interrupt_stop,
    report_document,
    selected_trials,
    stopped_report,
)
from pytest_gap.plugin.files import session_config_paths
from pytest_gap.plugin.reporter import GapReporter
from pytest_gap.plugin.session import GapSession, LoadedConfig
from pytest_gap.progress import Progress
from pytest_gap.results import TrialResult, scan_results, write_json


@dataclass
class Tally:
    """What the lead has taken in so far."""

    touched: dict[Path, LoadedConfig] = field(default_factory=dict)  # configs with a record
    notes: list[str] = field(default_factory=list)
    other_failures: int = 0
    selected: set[str] = field(default_factory=set)  # trial node ids collected, not deselected
    progress: dict[Path, Progress] = field(default_factory=dict)
    stop: Stop | None = None


class Lead:
    """The process that owns the session: preflight, every trial's record, outputs, the gate."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.session = GapSession(config, new_stamp())
        self.options = self.session.options
        self.reporter = GapReporter(config, self.options)
        self.tally = Tally()
        self.policies = None  # SessionPolicies, when a config needs servers
        self.started = time.monotonic()
        self.outcomes: list[Outcome] = []
        self.output_errors: list[str] = []  # summaries that could not be written
        self.reported = False  # the --gap-report-json document is written
        from pytest_gap import outputs  # the writers: a lead writes outputs, a worker never

        outputs.register(config)

    # -- the preflight ----------------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Before xdist starts workers (its own sessionstart is trylast): preflight the LLM,
        start policy servers. A config problem stops the session (usage error); a service that
        is down errors the cells that need it (pytest_gap/servers/preflight.py)."""
        if not session.config.option.collectonly:
            self.preflight()

    def preflight(self) -> None:
        loaded = {}
        for path in session_config_paths(self.config):
            try:
                loaded[str(path)] = self.session.load(path)
            except GapError:
                continue  # collection reports it, with every other problem of the file
        self.check_shard(list(loaded.values()))
        from pytest_gap.servers.preflight import check_llms, start_policies

        configs = [
            (c.path, c.config, c.cells, c.run_dir / POLICY_LOGS_DIR) for c in loaded.values()
        ]
        self.implicit_policy_lines(loaded.values())
        try:
            down = check_llms(configs)
            launcher = self.ray_launcher(configs)
            self.policies, policies_down = start_policies(configs, launcher)
        except GapError as exc:
            self.usage_exit(exc)
        if self.policies is not None:
            self.session.policy_urls = self.policies.urls
            for notice in self.policies.notices:
                self.reporter.say(notice)
        for path, services in policies_down.items():
            down[path] = {**down.get(path, {}), **services}
        for path, services in down.items():
            loaded[path].mark_unavailable(services)
        self.session.unavailable = down
        self.fit_workers(list(loaded.values()))

    def ray_launcher(self, configs):
        """Under --gap-ray, where managed servers with `ray:` start (scale/ray_policy.py)."""
        address = self.options.ray
        if not address:
            return None
        from pytest_gap.servers.registry import needed

        if not any(
            e.ray is not None and e.url is None
            for _, config, cells, _ in configs
            for e in needed(config, cells).values()
        ):
            return None
        from pytest_gap.scale.ray_executor import connect, session_namespace
        from pytest_gap.scale.ray_policy import RayLauncher

        return RayLauncher(connect(address, session_namespace(self.session.stamp)))

    def usage_exit(self, exc: GapError) -> None:
        """Stop the session on a problem the user can fix (usage error), in one line."""
        report_path = self.options.report_json
        if report_path:  # `gap benchmark` reads the one line from here
            write_json(Path(report_path), {"passed": False, "error": str(exc), "configs": []})
            self.reported = True
        pytest.exit(f"gap: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)

    def check_shard(self, loaded: list[LoadedConfig]) -> None:
        """More shards than planned trials is a usage error, said here, before any worker
        starts (a worker's collection error would end an xdist session in an internal error)."""
        from pytest_gap.scale.shard import too_many_shards

        shard = self.options.shard
        n_trials = sum(len(cell.trials()) for c in loaded for cell in c.cells)
        why = shard and n_trials and too_many_shards(shard, n_trials)
        if why:
            pytest.exit(f"gap: {why}", returncode=pytest.ExitCode.USAGE_ERROR)

    def implicit_policy_lines(self, loaded) -> None:
        """Say which template modes run the spec's implicit policy fallback, before it starts."""
        from pytest_gap.config.document import IMPLICIT_POLICY, implicit_policy_modes

        for c in loaded:
            running = {cell.mode for cell in c.cells if not cell.error}
            for mode in implicit_policy_modes(c.config, self.session.mode_table):
                if mode in running:
                    self.reporter.say(
                        f"{c.path.name}: mode {mode} names no policy (benchmark.policies, "
                        f"benchmark.mode_overrides.{mode}.policy_id): it runs the "
                        f"{IMPLICIT_POLICY} preset, the spec's implicit fallback"
                    )

    def fit_workers(self, loaded: list[LoadedConfig]) -> None:
        """After the preflight, before any worker starts: the controller fits its workers to the
        plan (controller.py); a single process has none."""

    # -- record intake ----------------------------------------------------------------------------
    def policy_lines(self) -> None:
        """Print the policy servers' restart lines logged since the last look (a supervisor
        thread logs them; only this, the main thread, writes to the terminal)."""
        lines = self.policies.lines() if self.policies is not None else []
        self.tally.notes += self.reporter.policy_lines(lines)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.policy_lines()
        taken = intake(report)
        record = taken.record
        if record is not None:
            loaded = self.tally.touched[record.config] = self.session.load(record.config)
            self.config.hook.pytest_gap_trial_result(
                config=self.config,
                result=record.result,
                run_dir=record.run_dir,
                replayed=record.replayed,
            )
            self.count(loaded, record.result, record.replayed)
        self.tally.notes += taken.notes
        self.tally.other_failures += taken.other_failure
        if taken.stop is not None:
            self.stop(taken.stop)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        stop = collect_stop(report)
        if stop is not None:
            self.stop(stop.why, stop.on_config)

    def pytest_internalerror(self, excrepr) -> None:
        self.stop(internal_error_stop(excrepr))

    def pytest_keyboard_interrupt(self, excinfo) -> None:
        self.stop(interrupt_stop(excinfo))

    def stop(self, why: str, on_config: bool = False) -> None:
        self.tally.stop = first_stop(self.tally.stop, why, on_config)

    def parallel(self) -> int:
        """How many trials run at once (a progress line's ETA): xdist's workers, else one."""
        workers = getattr(self.config.option, "numprocesses", None)
        return workers if isinstance(workers, int) and workers > 0 else 1

    def count(self, loaded: LoadedConfig, result: TrialResult, replayed: bool) -> None:
        """A config's progress, one record more."""
        progress = self.tally.progress.get(loaded.path)
        if progress is None:
            progress = self.tally.progress[loaded.path] = Progress(
                name=loaded.path.name,
                total=len(self.selected_of(loaded)),
                started=self.started,
                parallel=self.parallel(),
            )
        progress.record(result, replayed)
        progress.total = max(progress.total, progress.done)
        self.reporter.progress(progress)

    def selected_of(self, loaded: LoadedConfig) -> set[str]:
        """The trial ids of `loaded` this session selected (node ids are relative to rootdir)."""
        return selected_trials(self.tally.selected, self.config.rootpath, loaded.path)

    # -- the end ----------------------------------------------------------------------------------
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if session.config.option.collectonly:
            return
        if not self.tally.touched:
            self.report_stop(exitstatus)
            return
        self.write_outputs()
        if self.options.report_json:
            write_json(Path(self.options.report_json), report_document(self.outcomes))
        status = exit_status(
            exitstatus,
            session.exitstatus,
            gate_on=self.options.gate_on,
            outcomes=self.outcomes,
            other_failures=self.tally.other_failures,
            output_errors=self.output_errors,
        )
        if status != session.exitstatus:
            session.exitstatus = status

    def report_stop(self, exitstatus: int) -> None:
        """A session that recorded no trial tells `gap benchmark` why, in one line."""
        if not self.options.report_json or self.reported:
            return
        report = stopped_report(self.tally.stop, exitstatus)
        write_json(Path(self.options.report_json), report)

    def write_outputs(self) -> None:
        """Fold each touched config's run dir and hand it to every writer."""
        from pytest_gap.outputs.manifest import was_debug_run
        from pytest_gap.report import fold_config

        for path, loaded in self.tally.touched.items():
            results = scan_results(loaded.run_dir)
            summary = fold_config(
                loaded.all_cells, results, loaded.config, self.selected_of(loaded)
            )
            # A debug session's trials stay in the run dir: so does its mark.
            summary.gate.debug = self.options.debug_run or was_debug_run(loaded.run_dir)
            try:
                self.config.hook.pytest_gap_write_outputs(
                    config=self.config,
                    run_dir=loaded.run_dir,
                    summary=summary,
                    results=results,
                    benchmark=loaded.config,
                )
            except OSError as exc:  # a full disk, a read-only dir: say so, keep what is recorded
                self.output_errors.append(
                    f"could not write the summaries of {loaded.run_dir} ({exc}); the "
                    f"{len(results)} trial results recorded there are kept: make room and "
                    "run again with --gap-resume to finish the run and its summaries"
                )
            self.outcomes.append(
                Outcome(
                    config=str(path),
                    run_dir=str(loaded.run_dir),
                    gate=summary.gate,
                    cells=summary.cells,
                    progress=self.tally.progress.get(loaded.path),
                    services_down=self.session.unavailable.get(str(loaded.path), {}),
                )
            )

    def pytest_terminal_summary(self, terminalreporter) -> None:
        self.policy_lines()
        self.reporter.summary(terminalreporter, self.outcomes, self.tally.notes, self.output_errors)

    def pytest_unconfigure(self) -> None:
        if self.policies is not None:
            self.policies.stop()
