"""Fold trial results into cell rows, pivots and the gate: pure functions over TrialResults.

`fold_run` folds every result.json of a run dir (a resumed or `--lf` session never loses what an
earlier session scored); the files are written from its RunSummary by the writers in
`pytest_gap/outputs/` (the `pytest_gap_write_outputs` hook).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, model_validator

from pytest_gap import ids, intervals
from pytest_gap.config.model import GateRule
from pytest_gap.plan import Cell
from pytest_gap.redaction import redact_tree
from pytest_gap.results import TrialResult, now_iso

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
# 95% intervals (pytest_gap/intervals.py), after the spec's columns so readers by position keep
# working: Wilson for the success rate, a task-resampling bootstrap for the completion rate.
CI_COLUMNS = ("success_ci_low", "success_ci_high", "completion_ci_low", "completion_ci_high")
# The reference loops' rate (see `reference_counts`), after the intervals for the same reason.
REF_COLUMNS = ("ref_success_rate", "ref_n_trials", "ref_success_ci_low", "ref_success_ci_high")
REF_LABEL = "ref_success_rate"
REF_MEANING = "as openpi's and vla-eval's loops count: infrastructure failures count as failures"
MISSING_SHOWN = 3  # missing trial ids the gate line names before "(+N more)"

Verdict = Literal["PASS", "FAIL", "INCONCLUSIVE"]


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
    success_ci_low: float | None = None  # None with the rate (no scored trial)
    success_ci_high: float | None = None
    completion_ci_low: float | None = None
    completion_ci_high: float | None = None
    # The reference loops' rate (`reference_counts`): None when no trial of the cell was run.
    # Defaults: a cell_result.json written before these fields existed still loads.
    ref_success_rate: float | None = None
    ref_n_trials: int = 0
    ref_success_ci_low: float | None = None
    ref_success_ci_high: float | None = None


def reference_counts(results: list[TrialResult]) -> tuple[int, int]:
    """(successes, trials) as openpi's and vla-eval's own LIBERO loops count them: every trial
    that was run is in the denominator, an infrastructure failure (a crashed worker, a policy
    server down or timing out) counted as a failure. Our `success_rate` leaves infrastructure
    failures out (Refractal's convention: they are not the policy's); this is the number to set
    beside a published one.

    A trial errored for any other reason (a config problem, a mode not available) was never
    run, by us or by a reference loop given the same config: it stays out of both. A trial the
    preflight errored because its policy server was down counts as run: a reference loop would
    have run it against the down server and counted the failure. As the harness records every
    infrastructure failure errored, `trials` is the cell's n_trials + n_infra."""
    run = [r for r in results if not r.errored or r.infra_failure]
    return sum(r.success and not r.errored for r in run), len(run)


def pooled_reference(cells: list[CellSummary]) -> tuple[int, int]:
    """(successes, trials) of `reference_counts` over every trial of `cells`: a reference
    loop's successes are the scored ones, so the numerator is the cells' n_success."""
    return sum(c.n_success for c in cells), sum(c.ref_n_trials for c in cells)


def _ref_rate(successes: int, trials: int) -> dict:
    """The reference rate's fields (CellSummary's and Gate's), with its 95% Wilson interval."""
    ci = intervals.wilson(successes, trials) or (None, None)
    return {
        "ref_success_rate": successes / trials if trials else None,
        "ref_n_trials": trials,
        "ref_success_ci_low": ci[0],
        "ref_success_ci_high": ci[1],
    }


class Coverage(BaseModel):
    """The session's plan against the run dir's records.

    Planned: the trials the session selected, plus any trial an earlier session recorded in the
    run dir (the summary folds it, and `--lf` or `--gap-resume` did not need to run it again).
    Deselected: the config's other trials (`-k`, `-m`, `--gap-families`, `--gap-modes`).
    Missing: planned trials with no record (the session stopped early, or an item failed before
    its trial recorded), in plan order."""

    planned: int
    recorded: int
    deselected: int
    missing: list[str]

    def line(self) -> str:
        line = f"recorded {self.recorded}/{self.planned} planned"
        return line + (f", {self.deselected} deselected" if self.deselected else "")


DEBUG_RUN_NOTE = "[debug run: in-process (GAP_PARALLEL_INPROC=1), not for scoring]"


class Gate(BaseModel):
    """The session's verdict on a config. `passed` is `verdict == "PASS"`: INCONCLUSIVE (only
    under `gate_rule: wilson`) does not pass, and exits 1 like FAIL."""

    passed: bool
    verdict: Verdict
    rule: GateRule = "point"
    success_rate: float
    completion_rate: float
    threshold: float
    n_trials: int
    n_success: int
    reasons: list[str]
    success_ci_low: float | None = None  # pooled over every scored trial
    success_ci_high: float | None = None
    completion_ci_low: float | None = None
    completion_ci_high: float | None = None
    # The pooled reference loops' rate (`reference_counts`), beside the rate the gate reads;
    # it decides nothing. None with no trial run (and in gates recorded before it existed).
    ref_success_rate: float | None = None
    ref_n_trials: int = 0
    ref_success_ci_low: float | None = None
    ref_success_ci_high: float | None = None
    to_decide: int | None = None  # INCONCLUSIVE: further trials at the rate that would decide
    coverage: Coverage | None = None  # None outside a session (no selection to check)
    # Recorded by an in-process debug session (GAP_PARALLEL_INPROC=1): not for scoring.
    debug: bool = False

    @model_validator(mode="before")
    @classmethod
    def _verdict_of_passed(cls, data):
        """A gate recorded before verdicts existed: its verdict is what `passed` said."""
        if isinstance(data, dict) and "verdict" not in data and "passed" in data:
            data = {**data, "verdict": "PASS" if data["passed"] else "FAIL"}
        return data

    def line(self) -> str:
        values = f"success_rate={self.success_rate:.3f}"
        if self.rule == "wilson" and self.success_ci_low is not None:
            values += f" ci95=[{self.success_ci_low:.3f},{self.success_ci_high:.3f}]"
        values += f" threshold={self.threshold:.3f}"
        if self.rule != "point":
            values += f" rule={self.rule}"
        reasons = f" ({'; '.join(self.reasons)})" if self.reasons else ""
        # Coverage last: what is read (and matched) first stays the spec's `gate V: rate threshold`
        coverage = f"; {self.coverage.line()}" if self.coverage is not None else ""
        debug = f" {DEBUG_RUN_NOTE}" if self.debug else ""
        return f"gate {self.verdict}: {values}{reasons}{coverage}{debug}"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _by_task(results: list[TrialResult]) -> list[list[float]]:
    """Completions grouped by task: the clusters the completion interval resamples."""
    groups: dict[int, list[float]] = {}
    for r in results:
        groups.setdefault(r.task_id, []).append(r.completion)
    return list(groups.values())


def summarize_cell(cell: Cell, results: list[TrialResult]) -> CellSummary:
    scored = [r for r in results if not r.errored]
    n_success = sum(r.success for r in scored)
    success_ci = intervals.wilson(n_success, len(scored)) or (None, None)
    completion_ci = intervals.cluster_bootstrap(_by_task(scored)) or (None, None)
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
        n_success=n_success,
        n_trials=len(scored),
        n_infra=sum(r.infra_failure for r in results),
        n_errored=len(errored),
        n_planned=len(cell.task_ids) * len(cell.seeds),
        wall_clock_s=round(sum(r.wall_s for r in results), 2),
        produce_s=round(sum(r.produce_s for r in results), 2),
        eval_s=round(sum(r.eval_s for r in results), 2),
        error=error,
        tasks=tasks,
        success_ci_low=success_ci[0],
        success_ci_high=success_ci[1],
        completion_ci_low=completion_ci[0],
        completion_ci_high=completion_ci[1],
        **_ref_rate(*reference_counts(results)),
    )


def _missing_reason(missing: list[str]) -> str:
    shown = ", ".join(missing[:MISSING_SHOWN])
    more = f", ... (+{len(missing) - MISSING_SHOWN} more)" if len(missing) > MISSING_SHOWN else ""
    count = "1 planned trial has" if len(missing) == 1 else f"{len(missing)} planned trials have"
    return f"{count} no record; missing: {shown}{more}"


def evaluate_gate(
    cells: list[CellSummary],
    threshold: float,
    rule: GateRule = "point",
    coverage: Coverage | None = None,
    completion_groups: list[list[float]] | None = None,
) -> Gate:
    """The gate over `cells`. It fails on no scored trial, an errored cell, or (given
    `coverage`) a planned trial with no record; otherwise `rule` decides: `point` passes when
    the pooled success rate reaches `threshold`; `wilson` passes when the rate's 95% Wilson
    interval lies at or above it, fails when the interval lies below, and is INCONCLUSIVE
    between, naming the further trials at the observed rate that would decide it.
    `completion_groups` (scored trials' completions, one list per cell x task) give the pooled
    completion interval."""
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
    if coverage is not None and coverage.missing:
        reasons.append(_missing_reason(coverage.missing))
    success_ci = intervals.wilson(n_success, n_trials)
    completion_ci = intervals.cluster_bootstrap(completion_groups or [])
    verdict: Verdict = "FAIL" if reasons else "PASS"
    to_decide = None
    if rule == "point" and n_trials and rate < threshold:
        reasons.append(f"success rate below threshold ({n_success}/{n_trials})")
        verdict = "FAIL"
    elif rule == "wilson" and n_trials and success_ci[0] < threshold:
        if success_ci[1] < threshold:
            reasons.append(f"interval below threshold ({n_success}/{n_trials})")
            verdict = "FAIL"
        else:
            to_decide = intervals.trials_to_decide(n_success, n_trials, threshold)
            more = (
                f"about {to_decide} more trials at {rate:.3f} would decide it"
                if to_decide is not None
                else f"no number of further trials at {rate:.3f} decides it"
            )
            reasons.append(f"interval straddles the threshold ({n_success}/{n_trials}); {more}")
            verdict = "FAIL" if verdict == "FAIL" else "INCONCLUSIVE"
    return Gate(
        passed=verdict == "PASS",
        verdict=verdict,
        rule=rule,
        success_rate=rate,
        completion_rate=completion,
        threshold=threshold,
        n_trials=n_trials,
        n_success=n_success,
        reasons=reasons,
        success_ci_low=success_ci[0] if success_ci else None,
        success_ci_high=success_ci[1] if success_ci else None,
        completion_ci_low=completion_ci[0] if completion_ci else None,
        completion_ci_high=completion_ci[1] if completion_ci else None,
        **_ref_rate(*pooled_reference(cells)),
        to_decide=to_decide,
        coverage=coverage,
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
    names = (*TSV_COLUMNS, *CI_COLUMNS, *REF_COLUMNS)
    lines = ["\t".join(names)]
    for c in cells:
        values = c.model_dump()
        values["wall_clock_s"] = f"{c.wall_clock_s:.1f}"
        lines.append("\t".join(_fmt(values[k]).replace("\t", " ") for k in names))
    for metric in ("success_rate", "completion_rate"):
        rows, columns, matrix = pivot(cells, metric)
        lines += ["", "\t".join([f"{metric}_pivot", *columns])]
        lines += ["\t".join([r, *(_fmt(matrix[r][col]) for col in columns)]) for r in rows]
    return "\n".join(lines) + "\n"


def _with_interval(rate: float, low: float, high: float, n: int) -> str:
    """`0.82 [0.71,0.90] n=50`: a success rate, its Wilson interval, its trials."""
    return f"{rate:.2f} [{low:.2f},{high:.2f}] n={n}"


def console_table(cells: list[CellSummary]) -> str:
    """The terminal's success pivot (rate, interval, scored trials per cell), then what the
    reference loops would report (`reference_counts`): a second pivot headed `ref_success_rate`
    and a line saying what it counts, with the pooled rate; when no trial failed on
    infrastructure the two rates are the same and one line says so. A separate block, not a
    second number in each cell, because the cells where the rates differ are errored (`ERR`
    above): there the reference rate is the only number shown."""
    from tabulate import tabulate

    rows, columns, matrix = pivot(cells, "success_rate")
    shown = {r: {col: _fmt(v) for col, v in matrix[r].items()} for r in rows}
    for c in cells:
        if isinstance(matrix[c.row][c.column], float) and c.success_ci_low is not None:
            shown[c.row][c.column] = _with_interval(
                c.success_rate, c.success_ci_low, c.success_ci_high, c.n_trials
            )
    table = [[r, *(shown[r][col] for col in columns)] for r in rows]
    lines = [
        tabulate(
            table, headers=["success_rate", *columns], tablefmt="simple", disable_numparse=True
        )
    ]
    if not any(c.n_infra for c in cells):
        lines.append(f"{REF_LABEL} = success_rate: no trial failed on infrastructure")
        return "\n".join(lines)
    ref = {r: dict.fromkeys(columns, "-") for r in rows}
    for c in cells:
        ref[c.row][c.column] = (
            _with_interval(
                c.ref_success_rate, c.ref_success_ci_low, c.ref_success_ci_high, c.ref_n_trials
            )
            if c.ref_success_rate is not None
            else "ERR"  # no trial was run: every record errored before it could
        )
    table = [[r, *(ref[r][col] for col in columns)] for r in rows]
    lines += [
        "",
        tabulate(table, headers=[REF_LABEL, *columns], tablefmt="simple", disable_numparse=True),
    ]
    successes, trials = pooled_reference(cells)
    pooled = _ref_rate(successes, trials)
    pooled_text = (
        _with_interval(
            pooled["ref_success_rate"],
            pooled["ref_success_ci_low"],
            pooled["ref_success_ci_high"],
            trials,
        )
        if trials
        else "none (no trial was run)"
    )
    lines.append(f"{REF_LABEL} ({REF_MEANING}): pooled {pooled_text}; the gate reads success_rate")
    return "\n".join(lines)


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


def coverage(cells: list[Cell], results: dict[str, TrialResult], selected: set[str]) -> Coverage:
    """The session's coverage (see `Coverage`): `selected` holds the trial ids it selected."""
    planned = recorded = deselected = 0
    missing: list[str] = []
    for trial in (t for cell in cells for t in cell.trials()):
        has_record = trial.key in results
        if not has_record and trial.id not in selected:
            deselected += 1
            continue
        planned += 1
        recorded += has_record
        if not has_record:
            missing.append(trial.id)
    return Coverage(planned=planned, recorded=recorded, deselected=deselected, missing=missing)


def fold_run(
    cells: list[Cell],
    results: dict[str, TrialResult],
    threshold: float,
    rule: GateRule = "point",
    selected: set[str] | None = None,
) -> RunSummary:
    """Fold `results` (keyed by trial dir, as `scan_results` returns them) over the planned
    `cells`; records of trials no longer planned are ignored. Given `selected` (the trial ids a
    session selected), the gate checks coverage too: a selected trial with no record fails it."""
    summaries: list[CellSummary] = []
    by_mode: dict[str, Recorded] = {}
    completion_groups: list[list[float]] = []
    for cell in cells:
        trials = cell.trials()
        found = [results[t.key] for t in trials if t.key in results]
        counts = by_mode.setdefault(ids.mode_of_key(cell.key), Recorded())
        counts.planned += len(trials)
        counts.recorded += len(found)
        if found:
            summaries.append(summarize_cell(cell, found))
            completion_groups += _by_task([r for r in found if not r.errored])
    run = Recorded(
        planned=sum(c.planned for c in by_mode.values()),
        recorded=sum(c.recorded for c in by_mode.values()),
    )
    gate = evaluate_gate(
        summaries,
        threshold,
        rule,
        coverage=coverage(cells, results, selected) if selected is not None else None,
        completion_groups=completion_groups,
    )
    return RunSummary(cells=summaries, gate=gate, run=run, by_mode=by_mode)


def summary_document(summary: RunSummary, grid: dict) -> dict:
    """summary.json: the config echoed without secrets, cells, pivots, gate, the pooled rates
    with their intervals."""
    gate = summary.gate
    matrix = {m: pivot(summary.cells, m)[2] for m in ("success_rate", "completion_rate")}
    return {
        "grid": redact_tree(grid),  # a policy url's password, a token in a command
        "cells": [s.model_dump(mode="json") for s in summary.cells],
        "matrix": matrix,
        "gate": gate.model_dump(mode="json"),
        "debug_run": gate.debug,  # GAP_PARALLEL_INPROC=1 recorded trials here: not for scoring
        "n_trials": gate.n_trials,
        "n_success": gate.n_success,
        "success_rate": gate.success_rate,
        "completion_rate": gate.completion_rate,
        # 95% intervals of the pooled rates (pytest_gap/intervals.py); null with no trial
        "success_ci_low": gate.success_ci_low,
        "success_ci_high": gate.success_ci_high,
        "completion_ci_low": gate.completion_ci_low,
        "completion_ci_high": gate.completion_ci_high,
        # The reference loops' pooled rate (reference_counts): infrastructure failures count
        # as failures; the gate does not read it.
        "ref_success_rate": gate.ref_success_rate,
        "ref_n_trials": gate.ref_n_trials,
        "ref_success_ci_low": gate.ref_success_ci_low,
        "ref_success_ci_high": gate.ref_success_ci_high,
        "updated_at": now_iso(),
    }
