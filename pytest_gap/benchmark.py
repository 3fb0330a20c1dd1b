"""Python API: run a benchmark config through pytest and get its summary back.

    from pytest_gap import benchmark
    summary = benchmark.run("benchmarks/grid.yaml", gate=True)
    assert summary.ok, summary.gate_line

`run` wraps the async `run_benchmark`. Both launch `python -m pytest CONFIG` in a subprocess (the
same session a user gets from the command line: items, xdist workers, run dir, summary, gate)
and read back what the session wrote.

`GAP_PARALLEL_INPROC=1` with one worker runs that session in this process instead (no
subprocess, no xdist), so breakpoints and monkeypatches reach the trials: a debug escape hatch.
Its run is marked a debug run (summary.json's `debug_run`, the manifest, the gate line): one
process shares one GPU, one GIL and process-global state across cells, so never score with it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import tempfile
from pathlib import Path

import yaml
from pydantic import BaseModel

from pytest_gap.cell_summary import CellSummary
from pytest_gap.config.document import BenchmarkConfig, load_config
from pytest_gap.config.messages import ConfigError
from pytest_gap.config.model import DEFAULT_GATE_THRESHOLD, KNOWN_MODES, ModeOverride
from pytest_gap.errors import GapError
from pytest_gap.gate import Gate
from pytest_gap.layout import SUMMARY_JSON
from pytest_gap.modes import BUILTIN, ModeTable
from pytest_gap.plan import llm_problem, plan
from pytest_gap.run.workers import fit_workers
from pytest_gap.servers.preflight import check_config
from pytest_gap.session_plan import session_mode_table

__all__ = [
    "DEFAULT_GATE_THRESHOLD",
    "FAMILY_SUITES",  # noqa: F822 (module __getattr__)
    "KNOWN_FAMILIES",  # noqa: F822
    "KNOWN_MODES",
    "POSVAR_SUITES",  # noqa: F822
    "BenchmarkConfig",
    "BenchmarkModeOverride",
    "BenchmarkRunError",
    "BenchmarkSummary",
    "run",
    "run_benchmark",
]

BenchmarkModeOverride = ModeOverride


@functools.cache
def _family_suites() -> dict[str, dict[str, str]]:
    from pytest_gap.sim.backend import get_backend, resolve_variation

    backend = get_backend("libero")
    return {
        name: {v: resolve_variation(backend, name, v).suite for v in family.variations()}
        for name, family in backend.families().items()
    }


def __getattr__(name: str):
    """The family catalogue, read from the families the LIBERO backend registers (not a second
    list) on first use, since reading it imports LIBERO and importing this module should not:
    FAMILY_SUITES {family: {variation: suite}}, KNOWN_FAMILIES (their names, in order) and
    POSVAR_SUITES (FAMILY_SUITES["posvar"]). Each access returns a fresh copy."""
    if name == "FAMILY_SUITES":
        return {family: dict(suites) for family, suites in _family_suites().items()}
    if name == "KNOWN_FAMILIES":
        return tuple(_family_suites())
    if name == "POSVAR_SUITES":
        return dict(_family_suites()["posvar"])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


INPROC_ENV = "GAP_PARALLEL_INPROC"


def in_process(workers: int) -> bool:
    """Run the session in this process: GAP_PARALLEL_INPROC=1 and one worker."""
    if os.environ.get(INPROC_ENV) != "1":
        return False
    if workers > 1:
        print(
            f"gap: {INPROC_ENV}=1 ignored: the run has {workers} workers (it needs "
            "num_workers: 1, or -n 1)",
            file=sys.stderr,
        )
        return False
    return True


def _run_in_process(args: list[str], quiet: bool) -> int:
    """The pytest session in this process (a debug run, marked so in its outputs)."""
    import contextlib
    import io

    import pytest

    sink = io.StringIO()
    with contextlib.redirect_stdout(sink) if quiet else contextlib.nullcontext():
        return int(pytest.main([*args, "--gap-debug-run"]))


class BenchmarkRunError(GapError, RuntimeError):
    """The pytest session ended without a summary (it crashed or was interrupted)."""


class BenchmarkConfigError(GapError, ValueError):
    """The pytest session stopped before any trial on a config problem (its preflight found
    a key the LLM provider refuses, an unknown model, a policy command that does not exist)."""


class BenchmarkSummary(BaseModel):
    """What a `gap benchmark` session reported. `ok` is False whenever the preflight found a
    service down (`services_down`), gated or not: the spec's preflight stops the run on an
    unreachable policy server; here its cells error without running and the rest of the grid
    is scored, but the run is not a success."""

    ok: bool  # the gate passed (gated) or the session scored trials (not gated); no service down
    gated: bool
    gate_threshold: float
    gate_line: str
    success_rate: float
    completion_rate: float
    n_trials: int
    n_success: int
    run_dir: Path
    cells: list[CellSummary]
    summary: dict
    exit_code: int  # the pytest session's exit status
    # What the preflight found down, {"llm" | "policies": why}; `why` names the server (its
    # url) or the LLM endpoint and the fix. Empty when every service answered.
    services_down: dict[str, str] = {}


def default_workers(config: BenchmarkConfig, mode_table: ModeTable | None = None) -> int:
    if config.benchmark is not None:
        return config.benchmark.num_workers
    return sum(cell.num_workers for cell in plan(config, mode_table=mode_table))


def pytest_args(
    config_path: Path,
    *,
    gate: bool,
    resume: bool,
    families: list[str] | None = None,
    modes: list[str] | None = None,
    output_dir: str | Path | None = None,
    workers: int = 1,
    ray: str | None = None,
    shard: str | None = None,
    verbose: bool = False,
    baseline: str | Path | None = None,
    report_json: Path,
) -> list[str]:
    args = [str(config_path), f"--gap-report-json={report_json}", "--gap-progress"]
    if not gate:
        args.append("--gap-no-gate")
    if resume:
        args.append("--gap-resume")
    if families:
        args.append(f"--gap-families={','.join(families)}")
    if modes:
        args.append(f"--gap-modes={','.join(modes)}")
    if output_dir:
        args.append(f"--gap-output-dir={Path(output_dir).resolve()}")
    if shard:
        args.append(f"--gap-shard={shard}")
    if baseline:
        args.append(f"--gap-baseline={Path(baseline).resolve()}")
    if ray:  # trials on Ray actors, not xdist workers
        args.append(f"--gap-ray={ray}")
    elif workers > 1:
        args += ["-n", str(workers)]
    args += ["-v", "--log-level=DEBUG"] if verbose else []
    return args


def mode_table_of_session(config_path: Path) -> ModeTable:
    """The mode table the pytest session over `config_path` will build, so that the checks and
    the plan made here, before any process starts, know the modes a conftest.py or an
    installed plugin adds, as the session does. Read by starting that session's configuration
    in this process (the same plugins, conftest.py files and PYTEST_ADDOPTS) and ending it at
    pytest_cmdline_main, after all of them are loaded and before anything is configured or
    collected. A session that cannot even start says why itself; until then the checks use
    the built-in modes."""
    import contextlib
    import io
    import warnings

    import pytest

    found: dict[str, ModeTable | GapError] = {}

    class TableOfSession:
        @pytest.hookimpl(tryfirst=True)
        def pytest_cmdline_main(self, config: pytest.Config) -> int:
            try:
                found["table"] = session_mode_table(config)
            except GapError as exc:  # a mode or producer defined twice
                found["table"] = exc
            return 0

    quiet = io.StringIO()
    with (
        contextlib.redirect_stdout(quiet),
        contextlib.redirect_stderr(quiet),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        # --assert=plain: this process imported its plugins before; pytest would warn that it
        # cannot rewrite their asserts (nothing here runs an assert of theirs)
        pytest.main([str(config_path), "--assert=plain"], plugins=[TableOfSession()])
    table = found.get("table", BUILTIN)
    if isinstance(table, GapError):
        raise ConfigError(str(config_path), [str(table)])
    return table


def _config_file(
    config: BenchmarkConfig | str | Path, tmp: Path
) -> tuple[Path, BenchmarkConfig, ModeTable]:
    if not isinstance(config, BenchmarkConfig):
        table = mode_table_of_session(Path(config))
        return Path(config), load_config(config, mode_table=table), table
    # A config built in Python: its paths are absolute already; written with 0600 since it
    # may carry an API key, and removed with the temporary directory.
    path = tmp / "benchmark.yaml"
    # What was set, not every default: a default of the other shape (suites mode's top-level
    # `backend`) would be refused by a grid config's reader.
    data = config.model_dump(mode="json", exclude_none=True, exclude_unset=True, exclude={"source"})
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as handle:
        yaml.safe_dump(data, handle)
    return path, config, mode_table_of_session(path)


def _prepare(
    config: BenchmarkConfig | str | Path,
    tmp: Path,
    *,
    gate: bool = False,
    resume: bool = False,
    families: list[str] | None = None,
    modes: list[str] | None = None,
    output_dir: str | Path | None = None,
    workers: int | None = None,
    ray: str | None = None,
    shard: str | None = None,
    verbose: bool = False,
    baseline: str | Path | None = None,
) -> tuple[Path, list[str], Path, int]:
    """Check the config (its errors before any trial) and build the session's pytest args:
    (config path, args, where the session reports, workers)."""
    path, loaded, table = _config_file(config, tmp)
    # config errors before any trial
    cells = plan(loaded, families=families, modes=modes, mode_table=table)
    if any(c.uses_llm for c in cells):
        problem = llm_problem(loaded)
        if problem:  # fail fast: every cell whose producer is the LLM would error on it
            raise ConfigError(str(path), [problem])
    check_config(path.resolve(), loaded, cells, on_ray=bool(ray))  # a missing program
    report_json = tmp / "report.json"
    # No more workers than trials: a one-trial config with -n 8 starts one process.
    n_trials = sum(len(cell.trials()) for cell in cells)
    if shard:  # a bad K/N is one line before any process starts
        from pytest_gap.scale.shard import parse_shard, too_many_shards

        spec = parse_shard(shard)
        why = too_many_shards(spec, n_trials)
        if why:
            raise ConfigError(str(path), [why])
        n_trials = -(-n_trials // spec.count)  # about a shard's share
    workers = fit_workers(workers or default_workers(loaded, table), n_trials)
    args = pytest_args(
        path,
        gate=gate,
        resume=resume,
        families=families,
        modes=modes,
        output_dir=output_dir,
        workers=workers,
        ray=ray,
        shard=shard,
        verbose=verbose,
        baseline=baseline,
        report_json=report_json,
    )
    return path, args, report_json, workers


def _read_report(path: Path, report_json: Path, exit_code: int) -> dict:
    """What the session reported, or the one-line error of a session that scored nothing."""
    report = json.loads(report_json.read_text()) if report_json.is_file() else None
    if report is not None and report.get("error"):
        raise BenchmarkConfigError(report["error"])
    if exit_code == 4:  # pytest's usage error, from an option or a plugin
        raise BenchmarkConfigError(
            f"{path}: the pytest session stopped on a usage error (exit status 4); its "
            "message is above"
        )
    if report is None or not report.get("configs"):
        why = (report or {}).get("stopped")
        raise BenchmarkRunError(
            f"{path}: the pytest session ended with exit status {exit_code} and scored "
            + (f"nothing: {why}" if why else "nothing; run it with -v to see why")
        )
    return report


def _summary(report: dict, exit_code: int, gate: bool) -> BenchmarkSummary:
    entry = report["configs"][0]
    run_dir = Path(entry["run_dir"])
    summary = json.loads((run_dir / SUMMARY_JSON).read_text())
    gate_result = Gate.model_validate(entry["gate"])
    services_down = entry.get("services_down") or {}
    finished = gate_result.passed if gate else exit_code in (0, 1)
    return BenchmarkSummary(
        ok=finished and not services_down,
        gated=gate,
        gate_threshold=gate_result.threshold,
        gate_line=gate_result.line(),
        success_rate=gate_result.success_rate,
        completion_rate=gate_result.completion_rate,
        n_trials=gate_result.n_trials,
        n_success=gate_result.n_success,
        run_dir=run_dir,
        cells=[CellSummary.model_validate(c) for c in summary["cells"]],
        summary=summary,
        exit_code=exit_code,
        services_down=services_down,
    )


async def run_benchmark(
    config: BenchmarkConfig | str | Path,
    *,
    gate: bool = False,
    resume: bool = False,
    families: list[str] | None = None,
    modes: list[str] | None = None,
    output_dir: str | Path | None = None,
    workers: int | None = None,
    ray: str | None = None,
    shard: str | None = None,
    verbose: bool = False,
    quiet: bool = False,
    baseline: str | Path | None = None,
) -> BenchmarkSummary:
    options = {
        "baseline": baseline,
        "gate": gate,
        "resume": resume,
        "families": families,
        "modes": modes,
        "output_dir": output_dir,
        "workers": workers,
        "ray": ray,
        "shard": shard,
        "verbose": verbose,
    }
    with tempfile.TemporaryDirectory(prefix="gap-benchmark-") as tmp:
        path, args, report_json, workers = _prepare(config, Path(tmp), **options)
        if in_process(workers):
            exit_code = _run_in_process(args, quiet)
        else:
            quiet_io = asyncio.subprocess.DEVNULL if quiet else None
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "pytest", *args, stdout=quiet_io, stderr=quiet_io
            )
            exit_code = await process.wait()
        report = _read_report(path, report_json, exit_code)
    return _summary(report, exit_code, gate)


def run(config: BenchmarkConfig | str | Path, **kwargs) -> BenchmarkSummary:
    """Synchronous `run_benchmark` (do not call it from inside a running event loop).

    With GAP_PARALLEL_INPROC=1 it runs no event loop at all, so the in-process session's
    trials are free to run their own."""
    if os.environ.get(INPROC_ENV) == "1":
        return _run_sync(config, **kwargs)
    return asyncio.run(run_benchmark(config, **kwargs))


def _run_sync(
    config: BenchmarkConfig | str | Path, *, quiet: bool = False, **options
) -> BenchmarkSummary:
    import subprocess

    with tempfile.TemporaryDirectory(prefix="gap-benchmark-") as tmp:
        path, args, report_json, workers = _prepare(config, Path(tmp), **options)
        if in_process(workers):
            exit_code = _run_in_process(args, quiet)
        else:
            quiet_io = subprocess.DEVNULL if quiet else None
            command = [sys.executable, "-m", "pytest", *args]
            exit_code = subprocess.run(command, stdout=quiet_io, stderr=quiet_io).returncode
        report = _read_report(path, report_json, exit_code)
    return _summary(report, exit_code, options.get("gate", False))
