"""Fold trial results into cell rows, pivots and the gate: pure functions over TrialResults.

`fold_run` folds every result.json of a run dir (a resumed or `--lf` session never loses what an
earlier session scored); the files are written from its RunSummary by the writers in
`pytest_gap/outputs/` (the `pytest_gap_write_outputs` hook).
"""

from __future__ import annotations

from pydantic import BaseModel

from pytest_gap.plan import Cell
from pytest_gap.results import TrialResult

TSV_COLUMNS = (
    "mode",
    "policy_id",
    "family",
    "variation",
    "suite_name",
    "success_rate",
    "completion_rate",
    "avg_reward",
    "n_success",
    "n_trials",
    "n_infra",
    "wall_clock_s",
    "error",
)


class TaskRow(BaseModel):
    task_id: int
    success_rate: float | None
    completion_rate: float | None
    avg_reward: float | None
    n_trials: int
    n_success: int


class CellSummary(BaseModel):
    mode: str
    policy_id: str | None
    privileged: bool = False  # an oracle reading ground truth: not comparable with policies
    family: str
    variation: str
    suite_name: str | None
    key: str
    row: str
    column: str
    success_rate: float | None  # None when no trial of the cell was scored
    completion_rate: float | None
    avg_reward: float | None
    n_success: int
    n_trials: int  # scored trials; errored ones are not counted
    n_infra: int
    n_errored: int
    n_planned: int
    wall_clock_s: float
    produce_s: float
    eval_s: float
    error: str | None
    tasks: list[TaskRow]


class Gate(BaseModel):
    passed: bool
    success_rate: float
    completion_rate: float
    threshold: float
    n_trials: int
    n_success: int
    reasons: list[str]

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (
            f"gate {verdict}: success_rate={self.success_rate:.3f} "
            f"threshold={self.threshold:.3f}"
            + (f" ({'; '.join(self.reasons)})" if self.reasons else "")
        )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize_cell(cell: Cell, results: list[TrialResult]) -> CellSummary:
    scored = [r for r in results if not r.errored]
    errored = [r for r in results if r.errored]
    error = None
    if errored:
        first = errored[0]
        error = f"{len(errored)} of {len(results)} trials errored: {first.error}"
    tasks = []
    for task_id in sorted({r.task_id for r in results}):
        rows = [r for r in scored if r.task_id == task_id]
        tasks.append(
            TaskRow(
                task_id=task_id,
                success_rate=_mean([float(r.success) for r in rows]),
                completion_rate=_mean([r.completion for r in rows]),
                avg_reward=_mean([r.reward for r in rows]),
                n_trials=len(rows),
                n_success=sum(r.success for r in rows),
            )
        )
    return CellSummary(
        mode=cell.mode,
        policy_id=f"{cell.policy_id} [privileged]" if cell.privileged else cell.policy_id,
        privileged=cell.privileged,
        family=cell.family,
        variation=cell.variation,
        suite_name=cell.suite_name,
        key=cell.key,
        row=cell.row,
        column=cell.column,
        success_rate=_mean([float(r.success) for r in scored]),
        completion_rate=_mean([r.completion for r in scored]),
        avg_reward=_mean([r.reward for r in scored]),
        n_success=sum(r.success for r in scored),
        n_trials=len(scored),
        n_infra=sum(r.infra_failure for r in results),
        n_errored=len(errored),
        n_planned=len(cell.task_ids) * len(cell.seeds),
        wall_clock_s=round(sum(r.wall_s for r in results), 2),
        produce_s=round(sum(r.produce_s for r in results), 2),
        eval_s=round(sum(r.eval_s for r in results), 2),
        error=error,
        tasks=tasks,
    )


def evaluate_gate(cells: list[CellSummary], threshold: float) -> Gate:
    n_trials = sum(c.n_trials for c in cells)
    n_success = sum(c.n_success for c in cells)
    rate = n_success / n_trials if n_trials else 0.0
    completion = (
        sum((c.completion_rate or 0.0) * c.n_trials for c in cells) / n_trials if n_trials else 0.0
    )
    reasons = []
    if n_trials == 0:
        reasons.append("no trial was scored")
    errored = [c.column if c.suite_name else f"{c.row} {c.column}" for c in cells if c.error]
    if errored:
        reasons.append(f"errored cells: {', '.join(errored)}")
    if n_trials and rate < threshold:
        reasons.append(f"success rate below threshold ({n_success}/{n_trials})")
    return Gate(
        passed=not reasons,
        success_rate=rate,
        completion_rate=completion,
        threshold=threshold,
        n_trials=n_trials,
        n_success=n_success,
        reasons=reasons,
    )


def pivot(cells: list[CellSummary], metric: str) -> tuple[list[str], list[str], dict]:
    """Rows mode[@policy_id], columns family/variation (or suite): rate, 'ERR' or '-'."""
    rows = list(dict.fromkeys(c.row for c in cells))
    columns = list(dict.fromkeys(c.column for c in cells))
    matrix: dict[str, dict[str, float | str]] = {r: dict.fromkeys(columns, "-") for r in rows}
    for c in cells:
        value = getattr(c, metric)
        matrix[c.row][c.column] = "ERR" if c.error or value is None else round(value, 4)
    return rows, columns, matrix


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def format_tsv(cells: list[CellSummary]) -> str:
    lines = ["\t".join(TSV_COLUMNS)]
    for c in cells:
        values = c.model_dump()
        values["wall_clock_s"] = f"{c.wall_clock_s:.1f}"
        lines.append("\t".join(_fmt(values[k]).replace("\t", " ") for k in TSV_COLUMNS))
    for metric in ("success_rate", "completion_rate"):
        rows, columns, matrix = pivot(cells, metric)
        lines += ["", "\t".join([f"{metric}_pivot", *columns])]
        lines += ["\t".join([r, *(_fmt(matrix[r][col]) for col in columns)]) for r in rows]
    return "\n".join(lines) + "\n"


def console_table(cells: list[CellSummary]) -> str:
    from tabulate import tabulate

    rows, columns, matrix = pivot(cells, "success_rate")
    table = [[r, *(_fmt(matrix[r][col]) for col in columns)] for r in rows]
    return tabulate(
        table, headers=["success_rate", *columns], tablefmt="simple", disable_numparse=True
    )


class Recorded(BaseModel):
    """How many trials of a scope (the run, or one mode / `suites`) are planned and recorded."""

    planned: int = 0
    recorded: int = 0

    @property
    def complete(self) -> bool:
        return bool(self.planned) and self.recorded == self.planned


class RunSummary(BaseModel):
    """A run dir folded: what every output writer is given."""

    cells: list[CellSummary]  # the cells with at least one record, in plan order
    gate: Gate
    run: Recorded
    by_mode: dict[str, Recorded]  # the run dir's top level: a mode, or "suites"


def fold_run(cells: list[Cell], results: dict[str, TrialResult], threshold: float) -> RunSummary:
    """Fold `results` (keyed by trial dir, as `scan_results` returns them) over the planned
    `cells`; records of trials no longer planned are ignored."""
    summaries: list[CellSummary] = []
    by_mode: dict[str, Recorded] = {}
    for cell in cells:
        trials = cell.trials()
        found = [results[t.key] for t in trials if t.key in results]
        counts = by_mode.setdefault(cell.key.split("/", 1)[0], Recorded())
        counts.planned += len(trials)
        counts.recorded += len(found)
        if found:
            summaries.append(summarize_cell(cell, found))
    run = Recorded(
        planned=sum(c.planned for c in by_mode.values()),
        recorded=sum(c.recorded for c in by_mode.values()),
    )
    return RunSummary(
        cells=summaries, gate=evaluate_gate(summaries, threshold), run=run, by_mode=by_mode
    )
