"""pytest hooks: benchmark YAMLs become one item per trial; the session ends with the gate.

Thin glue over plan (what to run), runner (run one trial), report (fold the run dir) and the
output writers (pytest_gap/outputs/, through the hooks of pytest_gap/hookspecs.py).
Item ids: <yaml>::<mode>[@<policy_id>]::<family>/<variation>::taskNN::seedNNN, or
<yaml>::suites::<suite_name>::taskNN::seedNNN.

One plugin object per role, built in `pytest_configure`, registered and kept in the stash (as
pytest's own LFPlugin and LogXML are):
- `Worker` (an xdist worker) collects and runs trials; the controller's stamp, the services its
  preflight found down and the policy servers it started come in xdist's `workerinput`;
- `Controller` (the xdist controller) runs the preflight, hands workers what they need,
  receives each trial's record with its report, records crashed workers' trials, and writes
  every config's outputs at the end;
- `SingleProcess` (no xdist) does both: what the controller does, and runs the trials; with
  `--gap-ray` its trials run on a Ray cluster instead (pytest_gap/scale/ray_executor.py) and
  each item waits for its own trial's record.
"""

from __future__ import annotations

import argparse
import errno
import faulthandler
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_gap import ids
from pytest_gap.errors import GapError, one_line
from pytest_gap.layout import POLICY_LOGS_DIR, new_stamp, resolve_run_dir
from pytest_gap.progress import Progress
from pytest_gap.results import (
    EXIT_TIMEOUT,
    Corrupt,
    TrialResult,
    read_result,
    scan_results,
    write_json,
)

BENCHMARK_SUFFIXES = (".yaml", ".yml")


class LoadedConfig:
    """One benchmark YAML as this process sees it: config, plan, run dir."""

    def __init__(self, path: Path, session: GapSession):
        from pytest_gap.config.document import load_config
        from pytest_gap.plan import plan
        from pytest_gap.provenance import plan_digest

        self.path = path
        table = session.mode_table
        self.config = load_config(path, mode_table=table)
        if session.frames_every is not None:  # --gap-frames overrides trials.frames_every
            self.config.trials.frames_every = session.frames_every
        self.plan_digest = plan_digest(self.config)
        self.all_cells = plan(self.config, mode_table=table)
        self.cells = (
            plan(self.config, families=session.families, modes=session.modes, mode_table=table)
            if session.families or session.modes
            else self.all_cells
        )
        self.trials = {t.id: t for cell in self.all_cells for t in cell.trials()}
        output_dir = session.output_dir or self.config.output_dir
        self.run_dir = resolve_run_dir(output_dir, session.stamp, session.reuse_latest)
        self.mark_unavailable(session.unavailable.get(str(path), {}))

    def mark_unavailable(self, services: dict[str, str]) -> None:
        """Error the cells that need a service the controller's preflight found down."""
        if services:
            self.all_cells = [cell.unavailable(services) for cell in self.all_cells]
            self.cells = [cell.unavailable(services) for cell in self.cells]
            self.trials = {t.id: t for cell in self.all_cells for t in cell.trials()}


class GapSession:
    """What every role shares: the session's options, its stamp, the configs it loaded."""

    def __init__(self, config: pytest.Config, stamp: str):
        self.config = config
        # From xdist's workerinput, not the environment: a session started inside an xdist
        # worker (a test of a pytest plugin, a subprocess) inherits PYTEST_XDIST_WORKER.
        self.worker: str | None = getattr(config, "workerinput", {}).get("workerid")
        self.stamp = stamp
        self.resume = config.getoption("gap_resume")
        self.reuse_latest = self.resume or bool(config.getoption("lf", False))
        raw_output = config.getoption("gap_output_dir")
        self.output_dir = Path(raw_output).resolve() if raw_output else None
        self.families = _csv(config.getoption("gap_families"))
        self.modes = _csv(config.getoption("gap_modes"))
        self.gate_on = not config.getoption("gap_no_gate")
        self.frames_every: int | None = config.getoption("gap_frames")
        self.shard = _shard_option(config)  # --gap-shard K/N (checked in pytest_cmdline_main)
        # What the preflight found, per config path: services down {"llm" | "policies": why},
        # and the urls of the policy servers it started {policy id: url}.
        self.unavailable: dict[str, dict[str, str]] = {}
        self.policy_urls: dict[str, dict[str, str]] = {}
        self._loaded: dict[Path, LoadedConfig] = {}
        self._mode_table = None

    @property
    def mode_table(self):
        """The session's modes and producers, from every `pytest_gap_modes` and
        `pytest_gap_producers` implementation; built on first use, when the conftests of the
        configs' directories are loaded."""
        if self._mode_table is None:
            from pytest_gap.modes import ModeTable

            hook = self.config.hook
            self._mode_table = ModeTable.of(
                hook.pytest_gap_modes(config=self.config),
                hook.pytest_gap_producers(config=self.config),
            )
        return self._mode_table

    def load(self, path: Path) -> LoadedConfig:
        path = path.resolve()
        if path not in self._loaded:
            loaded = LoadedConfig(path, self)
            for other in self._loaded.values():
                if other.run_dir == loaded.run_dir:
                    from pytest_gap.config.messages import ConfigError

                    raise ConfigError(
                        str(path),
                        [
                            f"output_dir: {other.path} writes to the same run dir "
                            f"({loaded.run_dir.parent}) in this session; give each config its "
                            "own output_dir"
                        ],
                    )
            self._loaded[path] = loaded
        return self._loaded[path]

    def wait_turn(self, item: TrialItem) -> None:
        """Before a trial runs: wait until its mode may start (an xdist Worker's schedule)."""

    def endpoints(self, loaded: LoadedConfig):
        """The policy endpoints this process's trials of `loaded` talk to: a managed server is
        where the lead says it is now (a restart moves it to a new port)."""
        from pytest_gap.policies.registry import endpoints_for
        from pytest_gap.policies.supervisor import live_urls

        started = self.policy_urls.get(str(loaded.path), {})
        if started:
            started = {**started, **live_urls(loaded.run_dir / POLICY_LOGS_DIR)}
        return endpoints_for(loaded.config, started)


def _pin(worker: str | None, n_workers: int | None) -> None:
    """Give this process its devices, before anything imports the simulator."""
    from pytest_gap.run.devices import pin

    try:
        pin(os.environ, worker, n_workers)
    except GapError as exc:
        raise pytest.UsageError(str(exc)) from None


class Worker(GapSession):
    """An xdist worker: collects and runs trials with what the controller handed it."""

    def __init__(self, config: pytest.Config):
        handed = config.workerinput
        super().__init__(config, handed.get("gap_stamp") or new_stamp())
        self.unavailable = handed.get("gap_unavailable", {})
        self.policy_urls = handed.get("gap_policy_urls", {})
        self.phase_dir: str | None = handed.get("gap_phase_dir")  # scheduling.PhaseGate's
        self.phase_of: dict[str, int] = {}
        _pin(self.worker, handed.get("workercount"))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Each item's phase, as the controller's scheduler numbers them (same collection)."""
        from pytest_gap.scheduling import phases

        ids = [item.nodeid for item in session.items]
        self.phase_of = dict(zip(ids, phases(ids), strict=True))

    def wait_turn(self, item: TrialItem) -> None:
        """A trial of a later mode starts once every earlier mode's trials are done."""
        if self.phase_dir is None or item.nodeid not in self.phase_of:
            return
        from pytest_gap.scheduling import PhaseGate, wait_for_phase

        item.watchdog.pause()  # waiting for a mode is not the trial's time
        try:
            wait_for_phase(PhaseGate(Path(self.phase_dir)), self.phase_of[item.nodeid])
        finally:
            item.watchdog.resume()


class _Lead(GapSession):
    """The process that owns the session: preflight, every trial's record, outputs, the gate."""

    def __init__(self, config: pytest.Config):
        super().__init__(config, new_stamp())
        self.touched: dict[Path, LoadedConfig] = {}
        self.notes: list[str] = []
        self.other_failures = 0
        self.output_errors: list[str] = []  # summaries that could not be written
        self.selected: set[str] = set()  # node ids of the trials collected and not deselected
        self.outcomes: list[dict[str, Any]] = []
        self.policies = None  # SessionPolicies, when a config needs servers
        self.started = time.monotonic()
        self.progress: dict[Path, Progress] = {}
        self.live_progress = bool(config.getoption("gap_progress"))
        self.debug_run = bool(config.getoption("gap_debug_run"))  # GAP_PARALLEL_INPROC=1
        # Why the session may end with no trial recorded, for `gap benchmark` (the report's
        # "stopped"; "error" when it is a config problem): the first reason seen wins.
        self.stopped: str | None = None
        self.stopped_on_config = False
        self.reported = False
        from pytest_gap import outputs

        outputs.register(config)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Before xdist starts workers (its own sessionstart is trylast): preflight the LLM,
        start policy servers. A config problem stops the session (usage error); a service that
        is down errors the cells that need it (pytest_gap/preflight.py)."""
        if not session.config.option.collectonly:
            self._preflight()

    def _preflight(self) -> None:
        loaded = {}
        for path in _session_config_paths(self.config):
            try:
                loaded[str(path)] = self.load(path)
            except GapError:
                continue  # collection reports it, with every other problem of the file
        self._check_shard(list(loaded.values()))
        from pytest_gap.preflight import check_llms, start_policies

        configs = [
            (c.path, c.config, c.cells, c.run_dir / POLICY_LOGS_DIR) for c in loaded.values()
        ]
        self._implicit_policy_lines(loaded.values())
        try:
            down = check_llms(configs)
            launcher = self._ray_launcher(configs)
            self.policies, policies_down = start_policies(configs, launcher)
        except GapError as exc:
            self._usage_exit(exc)
        if self.policies is not None:
            self.policy_urls = self.policies.urls
            for notice in self.policies.notices:
                self._say(notice)
        for path, services in policies_down.items():
            down[path] = {**down.get(path, {}), **services}
        for path, services in down.items():
            loaded[path].mark_unavailable(services)
        self.unavailable = down
        self._fit_workers(list(loaded.values()))

    def _ray_launcher(self, configs):
        """Under --gap-ray, where managed servers with `ray:` start (scale/ray_policy.py)."""
        address = self.config.getoption("gap_ray", None)
        if not address:
            return None
        from pytest_gap.policies.registry import needed

        if not any(
            e.ray is not None and e.url is None
            for _, config, cells, _ in configs
            for e in needed(config, cells).values()
        ):
            return None
        from pytest_gap.scale.ray_executor import connect, session_namespace
        from pytest_gap.scale.ray_policy import RayLauncher

        return RayLauncher(connect(address, session_namespace(self)))

    def _usage_exit(self, exc: GapError) -> None:
        """Stop the session on a problem the user can fix (usage error), in one line."""
        report_path = self.config.getoption("gap_report_json")
        if report_path:  # `gap benchmark` reads the one line from here
            write_json(Path(report_path), {"passed": False, "error": str(exc), "configs": []})
            self.reported = True
        pytest.exit(f"gap: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)

    def _check_shard(self, loaded: list[LoadedConfig]) -> None:
        """More shards than planned trials is a usage error, said here, before any worker
        starts (a worker's collection error would end an xdist session in an internal error)."""
        from pytest_gap.scale.shard import too_many_shards

        n_trials = sum(len(cell.trials()) for c in loaded for cell in c.cells)
        why = self.shard and n_trials and too_many_shards(self.shard, n_trials)
        if why:
            pytest.exit(f"gap: {why}", returncode=pytest.ExitCode.USAGE_ERROR)

    def _implicit_policy_lines(self, loaded) -> None:
        """Say which template modes run the spec's implicit policy fallback, before it starts."""
        from pytest_gap.config.document import IMPLICIT_POLICY, implicit_policy_modes

        for c in loaded:
            running = {cell.mode for cell in c.cells if not cell.error}
            for mode in implicit_policy_modes(c.config, self.mode_table):
                if mode in running:
                    self._say(
                        f"{c.path.name}: mode {mode} names no policy (benchmark.policies, "
                        f"benchmark.mode_overrides.{mode}.policy_id): it runs the "
                        f"{IMPLICIT_POLICY} preset, the spec's implicit fallback"
                    )

    def _fit_workers(self, loaded: list[LoadedConfig]) -> None:
        """The controller starts no more workers than trials (Controller)."""

    def _say(self, line: str) -> None:
        """One line on the terminal, before the session's header (sessionstart)."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"gap: {line}", yellow=True)

    def _policy_lines(self) -> None:
        """Print the policy servers' restart lines logged since the last look (a supervisor
        thread logs them; only this, the main thread, writes to the terminal)."""
        lines = self.policies.lines() if self.policies is not None else []
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        for line in lines:
            if reporter is None:
                self.notes.append(line)
                continue
            # xdist's progress letters leave the cursor mid-line (write_line does not know)
            reporter.ensure_newline()
            if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):
                reporter.write("\n")
            reporter.write_line(f"gap: {line}", yellow=True)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._policy_lines()
        run_dir = getattr(report, "gap_run_dir", None)
        if run_dir is not None:
            path = Path(getattr(report, "gap_result", {}).get("config") or "")
            if path.name:
                self.touched[path] = self.load(path)
                result = TrialResult.model_validate(report.gap_result)
                replayed = getattr(report, "gap_replayed", False)
                self.config.hook.pytest_gap_trial_result(
                    config=self.config, result=result, run_dir=Path(run_dir), replayed=replayed
                )
                self._progress(self.touched[path], result, replayed)
            self.notes += getattr(report, "gap_notes", [])
        elif report.failed and not _is_trial_nodeid(report.nodeid):
            self.other_failures += 1
        if report.failed and run_dir is None:  # a trial that never ran (a broken fixture)
            self._stop(f"{report.nodeid} failed in {report.when}: {_crash_line(report)}")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            config_file = Path(ids.path_of(report.nodeid)).suffix in BENCHMARK_SUFFIXES
            self._stop(str(report.longrepr) if config_file else _crash_line(report), config_file)

    def pytest_internalerror(self, excrepr) -> None:
        crash = getattr(excrepr, "reprcrash", None)
        self._stop(f"internal error: {one_line(crash.message if crash else excrepr, 300)}")

    def pytest_keyboard_interrupt(self, excinfo) -> None:
        self._stop(f"interrupted: {one_line(excinfo.exconly(), 300)}")

    def _stop(self, why: str, config_error: bool = False) -> None:
        if self.stopped is None:
            self.stopped, self.stopped_on_config = why.strip(), config_error

    def _progress(self, loaded: LoadedConfig, result: TrialResult, replayed: bool) -> None:
        progress = self.progress.get(loaded.path)
        if progress is None:
            workers = getattr(self.config.option, "numprocesses", None)
            ray = getattr(self, "ray", None)
            workers = len(ray.slots) if ray is not None else workers
            progress = self.progress[loaded.path] = Progress(
                name=loaded.path.name,
                total=len(self._selected_trials(loaded)),
                started=self.started,
                parallel=workers if isinstance(workers, int) and workers > 0 else 1,
            )
        progress.record(result, replayed)
        progress.total = max(progress.total, progress.done)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if self.live_progress and reporter is not None and self.config.get_verbosity() >= 0:
            reporter.write_line(f"gap progress {progress.line(time.monotonic())}")

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if session.config.option.collectonly:
            return
        if not self.touched:
            self._report_stop(exitstatus)
            return
        self._write_outputs()
        report_path = self.config.getoption("gap_report_json")
        if report_path:
            write_json(
                Path(report_path),
                {
                    "passed": self.passed,
                    "configs": [
                        {
                            "config": o["config"],
                            "run_dir": o["run_dir"],
                            "gate": o["gate"].model_dump(),
                            # {"llm" | "policies": why}: `gap benchmark` exits 1 on any, gate
                            # or not (the spec's preflight stops the run on a server down)
                            "services_down": o["services_down"],
                        }
                        for o in self.outcomes
                    ],
                },
            )
        if self.gate_on and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            failed = not self.passed or self.other_failures
            session.exitstatus = pytest.ExitCode.TESTS_FAILED if failed else pytest.ExitCode.OK
        if self.output_errors and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # the run has no summaries

    def _report_stop(self, exitstatus: int) -> None:
        """A session that recorded no trial tells `gap benchmark` why, in one line."""
        report_path = self.config.getoption("gap_report_json")
        if not report_path or self.reported:
            return
        why = self.stopped
        if why is None and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
            why = "no trial was selected (check -k, -m, --gap-families, --gap-modes)"
        report: dict[str, Any] = {"passed": False, "configs": [], "stopped": why}
        if self.stopped_on_config:
            report["error"] = why
        write_json(Path(report_path), report)

    def _write_outputs(self) -> None:
        """Fold each touched config's run dir and hand it to every writer."""
        from pytest_gap.report import fold_run

        for path, loaded in self.touched.items():
            results = scan_results(loaded.run_dir)
            summary = fold_run(
                loaded.all_cells,
                results,
                loaded.config.threshold,
                loaded.config.rule,
                selected=self._selected_trials(loaded),
            )
            from pytest_gap.outputs.manifest import was_debug_run

            # A debug session's trials stay in the run dir: so does its mark.
            summary.gate.debug = self.debug_run or was_debug_run(loaded.run_dir)
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
                {
                    "config": str(path),
                    "run_dir": str(loaded.run_dir),
                    "gate": summary.gate,
                    "cells": summary.cells,
                    "progress": self.progress.get(loaded.path),
                    "services_down": self.unavailable.get(str(loaded.path), {}),
                }
            )

    def _selected_trials(self, loaded: LoadedConfig) -> set[str]:
        """The trial ids of `loaded` this session selected (node ids are relative to rootdir)."""
        selected = set()
        for nodeid in self.selected:
            yaml_part, trial_id = ids.split_node_id(nodeid)
            if (self.config.rootpath / yaml_part).resolve() == loaded.path:
                selected.add(trial_id)
        return selected

    @property
    def passed(self) -> bool:
        return all(o["gate"].passed for o in self.outcomes)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        self._policy_lines()
        if not self.outcomes:
            return
        from pytest_gap.report import console_table

        terminalreporter.write_sep("=", "pytest-gap")
        for outcome in self.outcomes:
            terminalreporter.write_line(f"{outcome['config']}")
            terminalreporter.write_line(f"run dir: {outcome['run_dir']}")
            terminalreporter.write_line(f"report:  gap viz {outcome['run_dir']}")
            if outcome["cells"]:
                terminalreporter.write_line(console_table(outcome["cells"]))
            gate = outcome["gate"]
            suffix = "" if self.gate_on else "  [--gap-no-gate: not deciding the exit status]"
            progress = outcome["progress"]
            if progress is not None and self.config.get_verbosity() >= 0:
                terminalreporter.write_line(f"progress: {progress.line(time.monotonic())}")
            terminalreporter.write_line(
                gate.line() + suffix,
                bold=True,
                green=gate.passed,
                red=gate.verdict == "FAIL",
                yellow=gate.verdict == "INCONCLUSIVE",
            )
        for note in self.notes:
            terminalreporter.write_line(f"gap: {note}", yellow=True)
        for error in self.output_errors:
            terminalreporter.write_line(f"gap: error: {error}", red=True, bold=True)

    def pytest_unconfigure(self) -> None:
        if self.policies is not None:
            self.policies.stop()


class SingleProcess(_Lead):
    """No xdist: leads the session and runs its trials in this process."""

    def __init__(self, config: pytest.Config):
        super().__init__(config)
        _pin(None, 1)  # one process owns every device
        self.ray = None  # RayExecution, with --gap-ray

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """The session's plan: what collection kept after -k, -m, --lf and other deselection;
        with --gap-ray, its trials start on the cluster now."""
        self.selected.update(i.nodeid for i in session.items if _is_trial_nodeid(i.nodeid))
        address = self.config.getoption("gap_ray")
        if address and not self.config.option.collectonly:
            from pytest_gap.scale.ray_executor import start_items

            try:
                self.ray, line = start_items(address, self, session.items)
            except GapError as exc:
                self._usage_exit(exc)
            self._say(line)

    def pytest_unconfigure(self) -> None:
        if self.ray is not None:  # the actors this session started (also after Ctrl-C)
            self.ray.close(shutdown=False)
        super().pytest_unconfigure()  # the policy servers, some maybe on Ray too
        ray = sys.modules.get("ray")
        if self.config.getoption("gap_ray", None) and ray is not None and ray.is_initialized():
            ray.shutdown()


class Controller(_Lead):
    """The xdist controller: leads the session; its workers run the trials."""

    def _fit_workers(self, loaded: list[LoadedConfig]) -> None:
        """Before xdist starts its workers (its sessionstart runs last): no more of them than
        the planned trials, when the session runs benchmark configs only and every one loaded
        (-k and -m select later, at collection: the plan is the bound known now), and a
        warning when they outnumber the cores or the memory."""
        from pytest_gap.run.workers import capacity_warning, fit_workers

        option = self.config.option
        tx = list(getattr(option, "tx", None) or [])
        paths = _session_config_paths(self.config)
        fittable = (
            tx
            and set(tx) == {"popen"}
            and paths
            and len(loaded) == len(paths)
            and all(_is_benchmark_arg(self.config, a) for a in self.config.args)
        )
        if not fittable:  # a test suite, custom --tx specs, a config that did not load
            return
        n_trials = sum(len(cell.trials()) for c in loaded for cell in c.cells)
        workers = fit_workers(len(tx), n_trials)
        if workers < len(tx):
            option.tx, option.numprocesses = ["popen"] * workers, workers
            self._say(
                f"{len(tx)} workers asked for {n_trials} planned trial"
                f"{'s' if n_trials != 1 else ''}: starting {workers}"
            )
        warning = capacity_warning(workers)
        if warning:
            self._say(warning)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        """Every worker writes into this session's run dir stamp and plans the same errored
        cells; its trials find the policy servers started here (the preflight ran before)."""
        node.workerinput["gap_stamp"] = self.stamp
        node.workerinput["gap_unavailable"] = self.unavailable
        node.workerinput["gap_policy_urls"] = self.policy_urls
        if self._schedules(self.config):
            node.workerinput["gap_phase_dir"] = str(self.phase_dir)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        """The session's plan, as each worker collected it after its deselection (-k, -m,
        --lf); every worker collects the same items."""
        self.selected.update(i for i in ids if _is_trial_nodeid(i))

    @property
    def phase_dir(self) -> Path:
        """Where the scheduler tells workers which modes are done (scheduling.PhaseGate)."""
        if getattr(self, "_phase_dir", None) is None:
            import tempfile

            self._phase_dir = Path(tempfile.mkdtemp(prefix="gap-phases-"))
        return self._phase_dir

    @staticmethod
    def _schedules(config: pytest.Config) -> bool:
        """Benchmark sessions with xdist's default `--dist load` get our scheduler, when every
        worker is local (`popen`): its phase gate is a directory they all see."""
        if config.getoption("dist") != "load":
            return False
        from xdist.workermanage import parse_tx_spec_config

        if not all(spec.startswith("popen") for spec in parse_tx_spec_config(config)):
            return False
        return any(_is_benchmark_arg(config, a) for a in config.args)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log):
        """Modes one after another, a task's seeds on one worker (pytest_gap/scheduling.py)."""
        if not self._schedules(config):
            return None
        from xdist.workermanage import parse_tx_spec_config

        from pytest_gap.scheduling import ModePhaseScheduling, PhaseGate

        numnodes = len(parse_tx_spec_config(config))
        return ModePhaseScheduling(config, log, gate=PhaseGate(self.phase_dir), numnodes=numnodes)

    def pytest_unconfigure(self) -> None:
        super().pytest_unconfigure()
        if getattr(self, "_phase_dir", None) is not None:
            import shutil

            shutil.rmtree(self._phase_dir, ignore_errors=True)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report, sched) -> None:
        """Record the trial of a worker that died; the report then reaches logreport."""
        if not _is_trial_nodeid(crashitem):
            return
        from pytest_gap.run.record import record_crash

        yaml_part, trial_id = ids.split_node_id(crashitem)
        loaded = self.load(self.config.rootpath / yaml_part)
        trial = loaded.trials.get(trial_id)
        if trial is None:
            return
        endpoint = self.endpoints(loaded).get(trial.cell.policy_id or "")
        result = record_crash(
            trial,
            loaded.run_dir,
            nodeid=crashitem,
            config=str(loaded.path),
            detail=str(report.longrepr),
            plan_digest=loaded.plan_digest,
            policy_url=endpoint.url if endpoint is not None else None,
        )
        report.gap_result = result.model_dump(mode="json")
        report.gap_run_dir = str(loaded.run_dir)
        report.longrepr = f"{report.longrepr}\n{result.message()}"


SESSION = pytest.StashKey[GapSession]()


def _crash_line(report) -> str:
    """The one line of a failed report: its exception and message, not the traceback."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return one_line(crash.message, 300)
    lines = [line for line in str(report.longrepr).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E ")]
    return one_line((errors or lines or ["no detail"])[-1].removeprefix("E "), 300)


def _role(config: pytest.Config) -> GapSession:
    if hasattr(config, "workerinput"):
        return Worker(config)
    if config.getoption("numprocesses", None):
        return Controller(config)
    return SingleProcess(config)


def _csv(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [v for value in values for v in value.split(",") if v]


def _is_trial_nodeid(nodeid: str) -> bool:
    path, rest = ids.split_node_id(nodeid)
    return bool(rest) and Path(path).suffix in BENCHMARK_SUFFIXES


def _session_config_paths(config: pytest.Config) -> list[Path]:
    paths = []
    for arg in config.args:
        path = Path(config.invocation_params.dir, ids.path_of(arg)).resolve()
        candidates = [path] if path.is_file() else sorted(path.rglob("*.y*ml"))
        paths += [p for p in candidates if _is_benchmark_file(config, p)]
    return list(dict.fromkeys(paths))


def _is_benchmark_arg(config: pytest.Config, arg: str) -> bool:
    path = Path(config.invocation_params.dir, ids.path_of(arg)).resolve()
    if path.suffix in BENCHMARK_SUFFIXES:
        return True
    roots = [(config.rootpath / d).resolve() for d in config.getini("gap_benchmark_dirs")]
    return any(path == root or root in path.parents for root in roots)


# -- options and configuration ---------------------------------------------------------------------
def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_gap import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@pytest.hookimpl(tryfirst=True)
def pytest_gap_modes(config: pytest.Config):
    """The harness's own rows, first in the session's table."""
    from pytest_gap.modes import BUILTIN_MODES

    return BUILTIN_MODES


@pytest.hookimpl(tryfirst=True)
def pytest_gap_producers(config: pytest.Config):
    from pytest_gap.modes import BUILTIN_PRODUCERS

    return BUILTIN_PRODUCERS


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gap", "pytest-gap benchmarks")
    group.addoption(
        "--gap-resume",
        action="store_true",
        help="reuse the latest run dir; skip trials that already have a valid result.json",
    )
    group.addoption(
        "--gap-no-gate",
        action="store_true",
        help="do not let the gate decide the exit status (pytest's usual status instead)",
    )
    group.addoption("--gap-output-dir", help="write run dirs here instead of the config's")
    group.addoption(
        "--gap-families", action="append", help="restrict grid configs to these families (csv)"
    )
    group.addoption("--gap-modes", action="append", help="restrict grid configs to these modes")
    group.addoption("--gap-report-json", help="write each config's run dir and gate here")
    group.addoption(
        "--gap-shard",
        metavar="K/N",
        help="run only shard K of N: disjoint parts of the planned trials, balanced by expected "
        "cost, the same on every machine (merge the shards' run dirs with `gap merge`)",
    )
    group.addoption(
        "--gap-frames",
        type=_frames_every,
        metavar="N",
        help="write a WebP strip of every N-th agentview frame of each trial into the run "
        "dir's frames/ (overrides trials.frames_every; 0 turns it off)",
    )
    group.addoption(
        "--gap-progress",
        action="store_true",
        help="print each config's progress (trials done, successes, errored, elapsed, ETA) "
        "as every trial is recorded (`gap benchmark` turns it on)",
    )
    group.addoption(
        "--gap-no-plots",
        action="store_true",
        help="do not draw the run dir's plots/ (PNG heatmap and per-family bars)",
    )
    group.addoption(
        "--gap-ray",
        metavar="auto|ADDRESS",
        help="run each trial on a Ray cluster (`auto`: the one `ray start` runs on this machine, "
        "or its address host:port / ray://...); the run dir is written here; not with -n",
    )
    group.addoption(
        "--gap-debug-run",
        action="store_true",
        help="mark the run as an in-process debug run, not for scoring (`gap benchmark` with "
        "GAP_PARALLEL_INPROC=1 sets it)",
    )
    parser.addini(
        "gap_benchmark_dirs",
        type="args",
        default=["benchmarks"],
        help="directories (relative to rootdir) whose YAML files are benchmark configs",
    )


def _frames_every(raw: str) -> int:
    from pytest_gap.config.model import FRAMES_EVERY_HINT

    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{raw!r}: {FRAMES_EVERY_HINT}")
    return value


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """A bad --gap-shard, or --gap-ray with -n, is one line and exit 2, before anything
    starts."""
    try:
        _shard_option(config)
        if config.getoption("gap_ray") and config.getoption("numprocesses", None):
            raise GapError(
                "--gap-ray runs trials on Ray actors, -n on xdist workers: drop one of them"
            )
    except GapError as exc:
        sys.stderr.write(f"ERROR: {exc}\n")
        return 2
    return None


def _shard_option(config: pytest.Config):
    from pytest_gap.scale.shard import parse_shard

    raw = config.getoption("gap_shard", None)
    return parse_shard(raw) if raw is not None else None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gap_mode(name): the benchmark mode of a trial")
    config.addinivalue_line("markers", "gap_family(name): the benchmark family of a trial")
    role = _role(config)
    config.stash[SESSION] = role
    config.pluginmanager.register(role, f"gap-{type(role).__name__.lower()}")


# -- collection ------------------------------------------------------------------------------------
def _is_benchmark_file(config: pytest.Config, file_path: Path) -> bool:
    """A YAML named on the command line, or one under a gap_benchmark_dirs directory."""
    if file_path.suffix not in BENCHMARK_SUFFIXES:
        return False
    explicit = {Path(config.invocation_params.dir, ids.path_of(a)).resolve() for a in config.args}
    roots = [(config.rootpath / d).resolve() for d in config.getini("gap_benchmark_dirs")]
    resolved = file_path.resolve()
    return resolved in explicit or any(root in resolved.parents for root in roots)


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if _is_benchmark_file(parent.config, file_path):
        return BenchmarkFile.from_parent(parent, path=file_path)
    return None


class BenchmarkFile(pytest.File):
    def collect(self):
        try:
            loaded = self.config.stash[SESSION].load(self.path)
        except GapError as exc:
            raise self.CollectError(str(exc)) from None
        tree: dict[str, Any] = {}
        for cell in loaded.cells:
            for trial in cell.trials():
                group, cell_name, task, seed = ids.id_parts_of(trial.id)
                tree.setdefault(group, {}).setdefault(cell_name, {}).setdefault(task, {})[seed] = (
                    trial
                )
        for name, children in tree.items():
            yield TrialGroup.from_parent(self, name=name, children=children, loaded=loaded)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--gap-shard K/N deselects every trial outside shard K, as -k deselects: in each process
    that collects (every xdist worker alike), from the plan of the configs collected, so every
    worker keeps the same items. First (tryfirst), so -k, -m and --lf select within the shard
    and never change which shard a trial is in."""
    spec = config.stash[SESSION].shard
    if spec is None:
        return
    from pytest_gap.scale.shard import shard_plan, too_many_shards

    trials = [item for item in items if isinstance(item, TrialItem)]
    if not trials:  # a config that failed to load says so itself
        return
    plans = {ids.path_of(item.nodeid): item.loaded.cells for item in trials}
    shards = shard_plan(list(plans.items()), spec.count)
    why = too_many_shards(spec, sum(len(keys) for keys in shards.keys))
    if why and not hasattr(config, "workerinput"):  # the controller said it (_check_shard)
        raise pytest.UsageError(why)
    mine = shards.of(spec)  # keys are trial node ids: <yaml>::<trial id>
    kept = [i for i in items if not isinstance(i, TrialItem) or i.nodeid in mine]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in trials if i.nodeid not in mine])
        items[:] = kept


class TrialGroup(pytest.Collector):
    """A mode (or `suites`), a cell, or a task: one level of a trial's id."""

    def __init__(self, *, children: dict, loaded: LoadedConfig, **kwargs):
        super().__init__(**kwargs)
        self._children, self._loaded = children, loaded

    def collect(self):
        for name, child in self._children.items():
            if isinstance(child, dict):
                yield TrialGroup.from_parent(self, name=name, children=child, loaded=self._loaded)
            else:
                yield TrialItem.from_parent(self, name=name, trial=child, loaded=self._loaded)


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


# How long after the `signal` watchdog fires a trial may stay stuck before the backstop ends
# its process: long enough for any C call that does return (an env build, a render) to return
# and let the SIGALRM handler run.
BACKSTOP_GRACE_S = 10.0


class _TimeoutWatchdog:
    """pytest-timeout's timer of one item, paused while its trial waits for a slot.

    Uses pytest-timeout's public hooks (`pytest_timeout_set_timer` / `_cancel_timer`): pausing
    cancels the timer, resuming sets a new one for the budget left, whatever the method
    (signal or thread). The settings come from `pytest_timeout_set_timer` below.

    The `signal` method (the default) cannot end a trial stuck in C code that signals do not
    interrupt (a lock, a driver call): its SIGALRM handler only runs once the main thread is
    back in Python. So each signal timer has a thread backstop `BACKSTOP_GRACE_S` later: if the
    trial is still stuck, it records the trial as timed out (124), as the thread method would be
    judged, and ends the process (an xdist worker is replaced and the run goes on; a single
    process run is finished with --gap-resume).
    """

    def __init__(self, item: pytest.Item):
        self.item = item
        self.settings = None  # pytest-timeout's Settings of the first (full-budget) timer
        self.armed_at: float | None = None
        self.started: float | None = None  # epoch seconds of the first timer (runner.Watchdog)
        self.charged = 0.0
        self._backstop: threading.Timer | None = None

    def armed(self, settings) -> None:
        if self.settings is None:
            self.settings, self.started = settings, time.time()
        self.armed_at = time.monotonic()
        if settings.method == "signal":
            self.stand_down()
            self._backstop = threading.Timer(settings.timeout + BACKSTOP_GRACE_S, self._stuck)
            self._backstop.daemon = True
            self._backstop.start()

    def stand_down(self) -> None:
        """The timer was cancelled, or its signal reached Python: no backstop needed."""
        if self._backstop is not None:
            self._backstop.cancel()
            self._backstop = None

    def _stuck(self) -> None:
        """The trial outlived its signal watchdog by the grace: record it and end the process."""
        from pytest_gap.run.record import record_crash

        item = self.item
        limit = item.trial.cell.timeout_s
        worker = hasattr(item.config, "workerinput")
        try:
            record_crash(
                item.trial,
                item.loaded.run_dir,
                nodeid=item.nodeid,
                config=str(item.loaded.path),
                detail="stuck where signals do not reach",
                plan_digest=item.loaded.plan_digest,
            )
        finally:
            capture = item.config.pluginmanager.getplugin("capturemanager")
            if capture is not None:  # say it on the real stderr, not into the item's capture
                capture.suspend_global_capture(item)
            then = "its worker is replaced" if worker else "finish the run with --gap-resume"
            sys.stderr.write(
                f"\npytest-gap: {item.nodeid} is still running {BACKSTOP_GRACE_S:g} s after its "
                f"{limit:g} s watchdog fired (stuck in code signals do not interrupt); recorded "
                f"as timed out (124), ending this process; {then}\n"
            )
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
            os._exit(1)

    def pause(self) -> None:
        if self.armed_at is None:
            return
        self.charged += time.monotonic() - self.armed_at
        self.armed_at = None
        self.item.ihook.pytest_timeout_cancel_timer(item=self.item)

    def resume(self) -> None:
        if self.settings is None or self.armed_at is not None:
            return
        left = max(self.settings.timeout - self.charged, 0.001)
        self.item.ihook.pytest_timeout_set_timer(
            item=self.item, settings=self.settings._replace(timeout=left)
        )

    def restart(self) -> None:
        """The whole budget again, from now: the trial is re-run after a server restart."""
        if self.settings is None:
            return
        self.pause()
        self.charged, self.started = 0.0, time.time()
        self.resume()


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings) -> None:
    """Note when a trial's watchdog starts; pytest-timeout's own implementation sets it."""
    if isinstance(item, TrialItem):
        item.watchdog.armed(settings)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> None:
    """A trial's watchdog is cancelled (paused, or the item ended): so is its backstop."""
    if isinstance(item, TrialItem):
        item.watchdog.stand_down()


class TrialItem(pytest.Item):
    def __init__(self, *, trial, loaded: LoadedConfig, **kwargs):
        super().__init__(**kwargs)
        self.trial, self.loaded = trial, loaded
        self.result: TrialResult | None = None
        self.replayed = False  # its result is an earlier session's record (--gap-resume)
        self.notes: list[str] = []
        self.watchdog = _TimeoutWatchdog(self)
        cell = trial.cell
        self.extra_keyword_matches.update(cell.keywords)
        self.add_marker(pytest.mark.gap_mode(name=cell.mode))
        self.add_marker(pytest.mark.gap_family(name=cell.family))
        if cell.timeout_s > 0:
            self.add_marker(pytest.mark.timeout(cell.timeout_s))

    def runtest(self) -> None:
        session = self.config.stash[SESSION]
        run_dir = self.loaded.run_dir
        ray = getattr(session, "ray", None)
        if ray is not None and ray.planned(self.nodeid):
            self.watchdog.pause()  # its actor keeps the trial's time
            try:
                result, notes = ray.result_of(self.nodeid)
            except OSError as exc:  # the controller could not write what the actor sent
                if exc.errno not in NO_ROOM:
                    raise
                raise NotRecorded(exc, run_dir) from None
            replayed, self.notes = None, self.notes + notes
        else:
            replayed = self._recorded(run_dir) if session.resume else None
            if replayed is None:
                session.wait_turn(self)
            result = replayed or self._supervised(session, run_dir)
        self.result, self.replayed = result, replayed is not None
        self.user_properties.extend(result.properties())
        if not result.success:
            raise TrialFailed(result, replayed is not None)

    def _recorded(self, run_dir: Path) -> TrialResult | None:
        found = read_result(run_dir / self.trial.key)
        if isinstance(found, Corrupt):
            self.notes.append(f"corrupt {found.path} ({found.problem}); the trial was re-run")
            return None
        if found is None or found.errored:
            return None
        return found

    def _supervised(self, session: GapSession, run_dir: Path) -> TrialResult:
        """The trial, re-run once if the managed policy server it needs died under it and was
        restarted (runner.run_supervised)."""
        from pytest_gap.policies.supervisor import ServerWatch
        from pytest_gap.run.supervised import run_supervised

        watch = ServerWatch.for_cell(run_dir, self.trial.cell, self.loaded.config)
        if watch is None:
            return self._run(session, run_dir, self.trial)
        result, notes = run_supervised(
            self.trial,
            lambda trial, earlier: self._run(session, run_dir, trial, earlier),
            watch,
            self.watchdog,
            run_dir,
        )
        self.notes += notes
        return result

    def _run(self, session: GapSession, run_dir: Path, trial, earlier=()) -> TrialResult:
        from pytest_gap.run.trial import TrialRun
        from pytest_gap.sim.pool import env_pool

        run = TrialRun(
            trial,
            run_dir,
            nodeid=self.nodeid,
            config=str(self.loaded.path),
            pool=env_pool(),
            worker=session.worker,
            policies=session.endpoints(self.loaded),
            llm=self.loaded.config.llm,
            max_validation_retries=self.loaded.config.composition.max_validation_retries,
            mode_table=session.mode_table,
            watchdog=self.watchdog,
            plan_digest=self.loaded.plan_digest,
            earlier_attempts=list(earlier),
        )
        try:
            return run.execute()
        except OSError as exc:
            if exc.errno not in NO_ROOM:
                raise
            raise NotRecorded(exc, run_dir) from None
        except pytest.fail.Exception as exc:
            if "pytest-timeout" not in str(exc):
                raise
            self.watchdog.stand_down()  # back in Python: recording the timeout may take a while
            limit = self.trial.cell.timeout_s
            return run.abort(EXIT_TIMEOUT, f"timed out after {limit:g} s (the trial watchdog)")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, TrialFailed | NotRecorded | GapError):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, ids.split_node_id(self.nodeid)[1]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    if isinstance(item, TrialItem) and report.when == "call":
        # JSON-safe extras travel with the report from an xdist worker to the controller.
        if item.result is not None:
            report.gap_result = item.result.model_dump(mode="json")
        report.gap_run_dir = str(item.loaded.run_dir)
        report.gap_replayed = item.replayed
        report.gap_notes = list(item.notes)
    return report
