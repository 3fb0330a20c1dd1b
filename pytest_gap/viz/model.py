"""What the report shows, read from a run dir: pure functions from files to pydantic models.

The HTML page (`html.py`) only draws these models; the browser never reads the run dir's own
formats. Paths in the models are relative to the directory the report is written to, so the
page finds videos, frame strips and perception images beside it (file:// or `--serve`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from pytest_gap import ids, intervals
from pytest_gap.control_drop import ControlDrop
from pytest_gap.errors import GapError
from pytest_gap.gate import Gate
from pytest_gap.layout import RESULT_FILE, SUMMARY_JSON, is_stamp
from pytest_gap.results import EXIT_TIMEOUT, TrialResult, scan_results
from pytest_gap.viz.files import confined, read_json, relative
from pytest_gap.viz.steps import StepsView, steps_view
from pytest_gap.viz.trace import (
    DAG_TRACE,
    AgentTurn,
    TraceView,
    read_agents,
    read_trace,
    trace_file,
)

Outcome = Literal["success", "failed", "errored", "infra", "timeout"]

log = logging.getLogger(__name__)


def outcome(result: TrialResult) -> Outcome:
    """The filter a trial falls under: the watchdog's stop first, then infrastructure, then a
    trial the harness could not run, then whether the task was done."""
    if result.exit_code == EXIT_TIMEOUT:
        return "timeout"
    if result.infra_failure:
        return "infra"
    if result.errored:
        return "errored"
    return "success" if result.success else "failed"


class TaskBar(BaseModel):
    task_id: int
    n_success: int
    n_trials: int
    rate: float | None
    ci_low: float | None
    ci_high: float | None


class CellView(BaseModel):
    key: str
    row: str
    column: str
    success_rate: float | None
    completion_rate: float | None
    success_ci: tuple[float, float] | None
    completion_ci: tuple[float, float] | None
    n_success: int
    n_trials: int
    n_errored: int
    n_infra: int
    n_planned: int
    error: str | None
    tasks: list[TaskBar]
    control: ControlDrop | None = None  # a perturbed cell against its control arm


class TrialView(BaseModel):
    key: str  # the trial dir relative to the run dir: the page's id for it
    cell: str
    nodeid: str
    task_id: int
    seed: int
    init_state: int | None
    outcome: Outcome
    exit_code: int
    exit_status: str | None
    completion: float
    steps: int
    wall_s: float
    reason: str | None  # why it failed, or why it could not be scored
    prompt: str | None
    video: str | None  # relative to the report
    frames: str | None
    trace: str | None  # the trace dir, relative to the report
    agent_traces: str | None  # the LLM agents' prompts and answers dir (LLM modes)
    failure_label: str | None = None  # how a failed episode failed (sim/failure_labels.py)
    steps_file: str | None = None  # its per-step evidence, relative to the report


class Overview(BaseModel):
    rows: list[str]
    columns: list[str]
    gate: str | None
    verdict: str | None
    coverage: str | None


class Report(BaseModel):
    title: str
    run_dir: str
    overview: Overview
    cells: list[CellView]
    trials: list[TrialView]
    traces: dict[str, TraceView] = {}  # trial key -> trace, for the trials inlined
    agents: dict[str, list[AgentTurn]] = {}  # agent_traces dir -> its turns
    steps: dict[str, StepsView] = {}  # trial key -> its per-step evidence, for those inlined
    compare: dict[str, Any] | None = None  # `gap compare --json` of (another run, this run)
    serve: bool = False  # traces not inlined are fetched from the server


def _cell_view(cell: dict[str, Any]) -> CellView:
    tasks = []
    for t in cell.get("tasks", []):
        ci = intervals.wilson(t.get("n_success", 0), t.get("n_trials", 0))
        tasks.append(
            TaskBar(
                task_id=t["task_id"],
                n_success=t.get("n_success", 0),
                n_trials=t.get("n_trials", 0),
                rate=t.get("success_rate"),
                ci_low=ci[0] if ci else None,
                ci_high=ci[1] if ci else None,
            )
        )

    def pair(low: str, high: str) -> tuple[float, float] | None:
        if cell.get(low) is None or cell.get(high) is None:
            return None
        return (cell[low], cell[high])

    return CellView(
        key=cell["key"],
        row=cell["row"],
        column=cell["column"],
        success_rate=cell.get("success_rate"),
        completion_rate=cell.get("completion_rate"),
        success_ci=pair("success_ci_low", "success_ci_high"),
        completion_ci=pair("completion_ci_low", "completion_ci_high"),
        n_success=cell.get("n_success", 0),
        n_trials=cell.get("n_trials", 0),
        n_errored=cell.get("n_errored", 0),
        n_infra=cell.get("n_infra", 0),
        n_planned=cell.get("n_planned", 0),
        error=cell.get("error"),
        tasks=tasks,
        control=ControlDrop.model_validate(cell["control"]) if cell.get("control") else None,
    )


def _cell_views(raw_cells: list[Any], where: Path) -> list[CellView]:
    """The cells summary.json holds; one it cannot be read as is left out, with a warning."""
    cells = []
    for cell in (c for c in raw_cells if isinstance(c, dict) and "key" in c):
        try:
            cells.append(_cell_view(cell))
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            log.warning("gap viz: %s: a cell it cannot show (%s); left out", where, exc)
    return cells


def _cells_from_records(results: dict[str, TrialResult]) -> list[dict[str, Any]]:
    """Cell rows for a run dir without summary.json (its session was killed before the end):
    counted from the records alone, so the report still opens."""
    grouped: dict[str, list[TrialResult]] = {}
    for key, r in results.items():
        grouped.setdefault(ids.cell_of_key(key), []).append(r)
    cells = []
    for key, records in grouped.items():
        first = records[0]
        scored = [r for r in records if not r.errored]
        k = sum(r.success for r in scored)
        ci = intervals.wilson(k, len(scored))
        by_task: dict[int, list[TrialResult]] = {}
        for r in scored:
            by_task.setdefault(r.task_id, []).append(r)
        errored = [r for r in records if r.errored]
        cells.append(
            {
                "key": key,
                "row": first.mode + (f"@{first.policy_id}" if first.policy_id else ""),
                "column": first.suite_name or f"{first.family}/{first.variation}",
                "success_rate": k / len(scored) if scored else None,
                "completion_rate": (
                    sum(r.completion for r in scored) / len(scored) if scored else None
                ),
                "success_ci_low": ci[0] if ci else None,
                "success_ci_high": ci[1] if ci else None,
                "n_success": k,
                "n_trials": len(scored),
                "n_errored": len(errored),
                "n_infra": sum(r.infra_failure for r in records),
                "n_planned": len(records),
                "error": f"{len(errored)} of {len(records)} trials errored" if errored else None,
                "tasks": [
                    {
                        "task_id": t,
                        "n_success": sum(r.success for r in rs),
                        "n_trials": len(rs),
                        "success_rate": sum(r.success for r in rs) / len(rs),
                    }
                    for t, rs in sorted(by_task.items())
                ],
            }
        )
    return cells


def check_run_dir(path: Path) -> None:
    """A run dir, or a one-line error naming what was given and what to give."""
    if not path.is_dir():
        raise GapError(f"{path}: not a directory; give a run dir (<output_dir>/<YYYYMMDD_HHMMSS>)")
    stamps = sorted(p.name for p in path.iterdir() if p.is_dir() and is_stamp(p.name))
    if stamps and not (path / SUMMARY_JSON).is_file():
        raise GapError(
            f"{path}: an output dir holding run dirs ({', '.join(stamps[-3:])}); give one run "
            f"dir, e.g. {path / stamps[-1]}"
        )


def load_report(
    run_dir: Path,
    out_dir: Path,
    *,
    inline_budget: int,
    serve: bool = False,
) -> Report:
    """The report of `run_dir`, with paths relative to `out_dir`. Traces are inlined, failed
    trials first, until their JSON reaches `inline_budget` bytes; the rest load from the
    server (`serve`) or say how to see them. Every path a record names is confined to the run
    dir (`confined`): the report reads and links nothing outside it."""
    run_dir, out_dir = run_dir.resolve(), out_dir.resolve()
    check_run_dir(run_dir)
    results = scan_results(run_dir)
    summary_file = confined(run_dir, SUMMARY_JSON, "summary")
    summary = read_json(summary_file) if summary_file else None
    summary = summary if isinstance(summary, dict) else {}
    if not results and not summary.get("cells"):
        raise GapError(
            f"{run_dir}: no trial records (result.json) and no summary.json in it; give the run "
            "dir of a session that ran trials"
        )
    raw_cells = summary.get("cells")
    if not isinstance(raw_cells, list) or not raw_cells:
        raw_cells = _cells_from_records(results)
    cells = _cell_views(raw_cells, run_dir / SUMMARY_JSON)
    gate = _gate(summary.get("gate"))
    overview = Overview(
        rows=list(dict.fromkeys(c.row for c in cells)),
        columns=list(dict.fromkeys(c.column for c in cells)),
        gate=gate.model_copy(update={"coverage": None}).line() if gate else None,
        verdict=gate.verdict if gate else None,
        coverage=gate.coverage.line() if gate and gate.coverage else None,
    )
    trials = [_trial_view(run_dir, out_dir, key, r) for key, r in results.items()]
    report = Report(
        title=f"{run_dir.parent.name}/{run_dir.name}",
        run_dir=str(run_dir),
        overview=overview,
        cells=cells,
        trials=trials,
        serve=serve,
    )
    _inline(report, run_dir, out_dir, inline_budget)
    return report


def _trial_view(run_dir: Path, out_dir: Path, key: str, r: TrialResult) -> TrialView:
    """One trial as the report lists it; every path its record names is confined to
    `run_dir` and linked relative to `out_dir`."""
    trial_dir = run_dir / key
    where = f"{trial_dir / RESULT_FILE}:"
    trace_dir = confined(run_dir, r.trace or f"{key}/trace", f"{where} trace")
    if trace_dir is not None and trace_dir.name == DAG_TRACE:  # records name the file;
        trace_dir = trace_dir.parent  # the images sit beside it
    agents = (
        confined(run_dir, f"{r.workflow}/agent_traces", f"{where} workflow") if r.workflow else None
    )
    video = confined(run_dir, r.video, f"{where} video")
    steps = confined(run_dir, r.steps_file, f"{where} steps_file")
    frames = confined(run_dir, r.frames, f"{where} frames")
    return TrialView(
        key=key,
        cell=ids.cell_of_key(key),
        nodeid=r.nodeid,
        task_id=r.task_id,
        seed=r.seed,
        init_state=r.init_state,
        outcome=outcome(r),
        exit_code=r.exit_code,
        exit_status=r.exit_status,
        completion=r.completion,
        steps=r.steps,
        wall_s=r.wall_s,
        reason=r.error if r.errored else r.reason,
        prompt=r.prompt,
        video=relative(video, out_dir) if video and video.is_file() else None,
        frames=relative(frames, out_dir) if frames and frames.is_file() else None,
        trace=relative(trace_dir, out_dir) if trace_dir and trace_file(trace_dir) else None,
        agent_traces=relative(agents, out_dir) if agents and agents.is_dir() else None,
        failure_label=r.failure_label,
        steps_file=relative(steps, out_dir) if steps and steps.is_file() else None,
    )


def _inline(report: Report, run_dir: Path, out_dir: Path, budget: int) -> None:
    """Inline traces, then per-step evidence, trials that did not succeed first, within
    `budget`; and agent traces."""
    order = sorted(report.trials, key=lambda t: (t.outcome == "success", t.key))
    used = 0
    for into, read in (
        (report.traces, lambda t: t.trace and read_trace(out_dir / t.trace, out_dir)),
        (report.steps, lambda t: t.steps_file and steps_view(out_dir / t.steps_file)),
    ):
        for trial in order:
            view = read(trial)
            if not view:
                continue
            size = len(view.model_dump_json())
            if used + size > budget:
                break
            into[trial.key] = view
            used += size
    for trial in order:
        if trial.agent_traces and trial.agent_traces not in report.agents:
            report.agents[trial.agent_traces] = read_agents(out_dir / trial.agent_traces)


def _gate(gate: Any) -> Gate | None:
    """The recorded gate, or None when summary.json has none this harness can read."""
    try:
        return Gate.model_validate(gate) if isinstance(gate, dict) else None
    except ValueError:
        return None
