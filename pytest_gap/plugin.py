"""pytest hooks: benchmark YAMLs become one item per trial; the session ends with the gate.

Thin glue over plan (what to run), runner (run one trial) and report (fold the run dir).
Item ids: <yaml>::<mode>[@<policy_id>]::<family>/<variation>::taskNN::seedNNN, or
<yaml>::suites::<suite_name>::taskNN::seedNNN. Under pytest-xdist the workers collect and run;
the controller receives each trial's record with its report, records crashed workers' trials,
and rebuilds every summary from the run dir at the end.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_gap.errors import GapError
from pytest_gap.results import (
    EXIT_TIMEOUT,
    Corrupt,
    TrialResult,
    new_stamp,
    read_result,
    resolve_run_dir,
    scan_results,
    write_json,
)

BENCHMARK_SUFFIXES = (".yaml", ".yml")


class LoadedConfig:
    """One benchmark YAML as this process sees it: config, plan, run dir."""

    def __init__(self, path: Path, session: GapSession):
        from pytest_gap.config import load_config
        from pytest_gap.plan import plan

        self.path = path
        self.config = load_config(path)
        self.all_cells = plan(self.config)
        self.cells = (
            plan(self.config, families=session.families, modes=session.modes)
            if session.families or session.modes
            else self.all_cells
        )
        self.trials = {t.id: t for cell in self.all_cells for t in cell.trials()}
        output_dir = session.output_dir or self.config.output_dir
        self.run_dir = resolve_run_dir(output_dir, session.stamp, session.reuse_latest)
        from pytest_gap.preflight import unavailable

        self.mark_unavailable(unavailable(path))

    def mark_unavailable(self, services: dict[str, str]) -> None:
        """Error the cells that need a service the controller's preflight found down."""
        if services:
            self.all_cells = [cell.unavailable(services) for cell in self.all_cells]
            self.cells = [cell.unavailable(services) for cell in self.cells]
            self.trials = {t.id: t for cell in self.all_cells for t in cell.trials()}


class GapSession:
    """Per-process state of one pytest session (stored in config.stash)."""

    def __init__(self, config: pytest.Config):
        self.config = config
        workerinput = getattr(config, "workerinput", None)
        self.is_worker = workerinput is not None
        self.worker = os.environ.get("PYTEST_XDIST_WORKER")
        self.stamp = (workerinput or {}).get("gap_stamp") or new_stamp()
        self.resume = config.getoption("gap_resume")
        self.reuse_latest = self.resume or bool(config.getoption("lf", False))
        raw_output = config.getoption("gap_output_dir")
        self.output_dir = Path(raw_output).resolve() if raw_output else None
        self.families = _csv(config.getoption("gap_families"))
        self.modes = _csv(config.getoption("gap_modes"))
        self.gate_on = not config.getoption("gap_no_gate")
        self._loaded: dict[Path, LoadedConfig] = {}
        self.touched: dict[Path, LoadedConfig] = {}
        self.notes: list[str] = []
        self.other_failures = 0
        self.outcomes: list[dict[str, Any]] = []
        self.policies = None  # SessionPolicies, on the controller when a config needs servers

    def load(self, path: Path) -> LoadedConfig:
        path = path.resolve()
        if path not in self._loaded:
            loaded = LoadedConfig(path, self)
            for other in self._loaded.values():
                if other.run_dir == loaded.run_dir:
                    from pytest_gap.config import ConfigError

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


SESSION = pytest.StashKey[GapSession]()


def _csv(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [v for value in values for v in value.split(",") if v]


# -- options and configuration ---------------------------------------------------------------------
def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_gap import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


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
    parser.addini(
        "gap_benchmark_dirs",
        type="args",
        default=["benchmarks"],
        help="directories (relative to rootdir) whose YAML files are benchmark configs",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gap_mode(name): the benchmark mode of a trial")
    config.addinivalue_line("markers", "gap_family(name): the benchmark family of a trial")
    session = GapSession(config)
    config.stash[SESSION] = session
    if not session.is_worker:
        from pytest_gap import outputs

        outputs.register(config)
    controller = not session.is_worker and config.getoption("numprocesses", None)
    if not controller:
        from pytest_gap.devices import pin

        try:
            pin(os.environ, session.worker)  # before anything imports the simulator
        except GapError as exc:
            raise pytest.UsageError(str(exc)) from None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: every worker writes into the controller's run dir stamp."""
    node.workerinput["gap_stamp"] = node.config.stash[SESSION].stamp


def _is_benchmark_arg(config: pytest.Config, arg: str) -> bool:
    path = Path(config.invocation_params.dir, arg.split("::")[0]).resolve()
    if path.suffix in BENCHMARK_SUFFIXES:
        return True
    roots = [(config.rootpath / d).resolve() for d in config.getini("gap_benchmark_dirs")]
    return any(path == root or root in path.parents for root in roots)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Benchmark sessions hand each worker a contiguous run of trials (work stealing).

    Collection order keeps a (cell, task)'s seeds together, so a worker mostly runs whole tasks
    and reuses their env and workflow; only idle workers steal from the end of another's run.
    xdist's loadscope/loadgroup would keep tasks whole, but they stall after a worker crash,
    and a crash must never stop a benchmark.
    """
    if config.getoption("dist") != "load":
        return None
    if not any(_is_benchmark_arg(config, a) for a in config.args):
        return None
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)


# -- collection ------------------------------------------------------------------------------------
def _is_benchmark_file(config: pytest.Config, file_path: Path) -> bool:
    """A YAML named on the command line, or one under a gap_benchmark_dirs directory."""
    if file_path.suffix not in BENCHMARK_SUFFIXES:
        return False
    explicit = {Path(config.invocation_params.dir, a.split("::")[0]).resolve() for a in config.args}
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
                group, cell_name, task, seed = trial.id_parts
                tree.setdefault(group, {}).setdefault(cell_name, {}).setdefault(task, {})[seed] = (
                    trial
                )
        for name, children in tree.items():
            yield TrialGroup.from_parent(self, name=name, children=children, loaded=loaded)


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


class _TimeoutWatchdog:
    """pytest-timeout's timer of one item, paused while its trial waits for a slot.

    Uses pytest-timeout's public hooks (`pytest_timeout_set_timer` / `_cancel_timer`): pausing
    cancels the timer, resuming sets a new one for the budget left, whatever the method
    (signal or thread). The settings come from `pytest_timeout_set_timer` below.
    """

    def __init__(self, item: pytest.Item):
        self.item = item
        self.settings = None  # pytest-timeout's Settings of the first (full-budget) timer
        self.armed_at: float | None = None
        self.charged = 0.0

    def armed(self, settings) -> None:
        if self.settings is None:
            self.settings = settings
        self.armed_at = time.monotonic()

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


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings) -> None:
    """Note when a trial's watchdog starts; pytest-timeout's own implementation sets it."""
    if isinstance(item, TrialItem):
        item.watchdog.armed(settings)


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
        replayed = self._recorded(run_dir) if session.resume else None
        result = replayed or self._run(session, run_dir)
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

    def _run(self, session: GapSession, run_dir: Path) -> TrialResult:
        from pytest_gap.policies.registry import endpoints_for
        from pytest_gap.runner import TrialRun
        from pytest_gap.sim.pool import env_pool

        run = TrialRun(
            self.trial,
            run_dir,
            nodeid=self.nodeid,
            config=str(self.loaded.path),
            pool=env_pool(),
            worker=session.worker,
            policies=endpoints_for(self.loaded.config),
            llm=self.loaded.config.llm,
            max_validation_retries=self.loaded.config.composition.max_validation_retries,
            watchdog=self.watchdog,
        )
        try:
            return run.execute()
        except pytest.fail.Exception as exc:
            if "pytest-timeout" not in str(exc):
                raise
            limit = self.trial.cell.timeout_s
            return run.abort(EXIT_TIMEOUT, f"timed out after {limit:g} s (the trial watchdog)")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, TrialFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, self.nodeid.split("::", 1)[-1]


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


# -- the controller's side -------------------------------------------------------------------------
class _Controller:
    """Collects what the controller learns from reports; registered on the controller only."""

    def __init__(self, session: GapSession):
        self.session = session

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        run_dir = getattr(report, "gap_run_dir", None)
        if run_dir is not None:
            path = Path(getattr(report, "gap_result", {}).get("config") or "")
            if path.name:
                self.session.touched[path] = self.session.load(path)
                self.session.config.hook.pytest_gap_trial_result(
                    config=self.session.config,
                    result=TrialResult.model_validate(report.gap_result),
                    run_dir=Path(run_dir),
                    replayed=getattr(report, "gap_replayed", False),
                )
            self.session.notes += getattr(report, "gap_notes", [])
        elif report.failed and not _is_trial_nodeid(report.nodeid):
            self.session.other_failures += 1

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report, sched) -> None:
        if not _is_trial_nodeid(crashitem):
            return
        from pytest_gap.runner import record_crash

        session = self.session
        yaml_part, _, trial_id = crashitem.partition("::")
        loaded = session.load(session.config.rootpath / yaml_part)
        trial = loaded.trials.get(trial_id)
        if trial is None:
            return
        result = record_crash(
            trial,
            loaded.run_dir,
            nodeid=crashitem,
            config=str(loaded.path),
            detail=str(report.longrepr),
        )
        report.gap_result = result.model_dump(mode="json")
        report.gap_run_dir = str(loaded.run_dir)
        report.longrepr = f"{report.longrepr}\n{result.message()}"


def _is_trial_nodeid(nodeid: str) -> bool:
    return any(f"{suffix}::" in nodeid for suffix in BENCHMARK_SUFFIXES)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """On the controller, before xdist starts workers: preflight the LLM, start policy servers.

    A config problem stops the session (usage error); a service that is down errors the cells
    that need it (pytest_gap/preflight.py).
    """
    gap = session.config.stash[SESSION]
    if gap.is_worker:
        return
    session.config.pluginmanager.register(_Controller(gap), "gap-controller")
    if session.config.option.collectonly:
        return
    loaded = {}
    for path in _session_config_paths(session.config):
        try:
            loaded[str(path)] = gap.load(path)
        except GapError:
            continue  # collection reports it, with every other problem of the file
    from pytest_gap.preflight import check_llms, publish, start_policies

    configs = [(c.path, c.config, c.cells, c.run_dir / "policy_logs") for c in loaded.values()]
    try:
        down = check_llms(configs)
        gap.policies, policies_down = start_policies(configs)
    except GapError as exc:
        report_path = session.config.getoption("gap_report_json")
        if report_path:  # `gap benchmark` reads the one line from here
            write_json(Path(report_path), {"passed": False, "error": str(exc), "configs": []})
        pytest.exit(f"gap: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
    for path, services in policies_down.items():
        down[path] = {**down.get(path, {}), **services}
    for path, services in down.items():
        loaded[path].mark_unavailable(services)
    publish(down)


def _session_config_paths(config: pytest.Config) -> list[Path]:
    paths = []
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::")[0]).resolve()
        candidates = [path] if path.is_file() else sorted(path.rglob("*.y*ml"))
        paths += [p for p in candidates if _is_benchmark_file(config, p)]
    return list(dict.fromkeys(paths))


def pytest_unconfigure(config: pytest.Config) -> None:
    gap = config.stash.get(SESSION, None)
    if gap is not None and gap.policies is not None:
        gap.policies.stop()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    gap = session.config.stash[SESSION]
    if gap.is_worker or session.config.option.collectonly or not gap.touched:
        return
    from pytest_gap.report import fold_run

    all_passed = True
    for path, loaded in gap.touched.items():
        results = scan_results(loaded.run_dir)
        summary = fold_run(loaded.all_cells, results, loaded.config.threshold)
        session.config.hook.pytest_gap_write_outputs(
            config=session.config,
            run_dir=loaded.run_dir,
            summary=summary,
            results=results,
            benchmark=loaded.config,
        )
        all_passed &= summary.gate.passed
        gap.outcomes.append(
            {
                "config": str(path),
                "run_dir": str(loaded.run_dir),
                "gate": summary.gate,
                "cells": summary.cells,
            }
        )
    report_path = session.config.getoption("gap_report_json")
    if report_path:
        write_json(
            Path(report_path),
            {
                "passed": all_passed,
                "configs": [
                    {"config": o["config"], "run_dir": o["run_dir"], "gate": o["gate"].model_dump()}
                    for o in gap.outcomes
                ],
            },
        )
    if gap.gate_on and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        failed = not all_passed or gap.other_failures
        session.exitstatus = pytest.ExitCode.TESTS_FAILED if failed else pytest.ExitCode.OK


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    gap = config.stash[SESSION]
    if gap.is_worker or not gap.outcomes:
        return
    from pytest_gap.report import console_table

    terminalreporter.write_sep("=", "pytest-gap")
    for outcome in gap.outcomes:
        terminalreporter.write_line(f"{outcome['config']}")
        terminalreporter.write_line(f"run dir: {outcome['run_dir']}")
        if outcome["cells"]:
            terminalreporter.write_line(console_table(outcome["cells"]))
        gate = outcome["gate"]
        suffix = "" if gap.gate_on else "  [--gap-no-gate: not deciding the exit status]"
        terminalreporter.write_line(
            gate.line() + suffix, bold=True, green=gate.passed, red=not gate.passed
        )
    for note in gap.notes:
        terminalreporter.write_line(f"gap: {note}", yellow=True)
