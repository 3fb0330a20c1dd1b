"""Fold trial results into cell rows, pivots and the gate: pure functions over TrialResults.

`fold_run` folds every result.json of a run dir (a resumed or `--lf` session never loses what an
earlier session scored); the files are written from its RunSummary by the writers in
`pytest_gap/outputs/` (the `pytest_gap_write_outputs` hook).

One cell's row is cell_summary.py's, the gate gate.py's; this module folds a run dir into them
and writes the tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from pytest_gap import ids
from pytest_gap.ab_gate import outcome as ab_outcome
from pytest_gap.baseline import Baseline, BaselineOutcome, load_baseline, unreadable
from pytest_gap.baseline import outcome as baseline_outcome
from pytest_gap.cell_summary import (
    CellSummary,
    completions_by_task,
    pooled_reference,
    reference_rate,
    summarize_cell,
)
from pytest_gap.cells import Cell
from pytest_gap.config.model import ABCompare, GateRule, SequentialGate
from pytest_gap.control_drop import ControlDrop, control_drops
from pytest_gap.errors import GapError
from pytest_gap.gate import Gate, coverage, evaluate_gate
from pytest_gap.redaction import redact_tree
from pytest_gap.results import TrialResult, now_iso
from pytest_gap.sequential import SequentialState, alpha_per_cell, cell_state
from pytest_gap.sim.failure_labels import FAILURE_LABELS

if TYPE_CHECKING:
    from pytest_gap.config.document import BenchmarkConfig

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
# A perturbed cell against its matched control arm (control_drop.py), empty elsewhere: last, so
# readers by position keep working, and only in a run where some cell has a control arm.
CONTROL_COLUMNS = (
    "control",
    "control_rate",
    "perturbed_rate",
    "drop",
    "drop_ci_low",
    "drop_ci_high",
    "drop_p",
    "drop_n_pairs",
)
# Harness faults (faults.py) and the trials re-run after one (cell_summary.fault_counts): last,
# and only in a run where some trial faulted, so readers by position keep working.
FAULT_COLUMNS = ("harness_faults", "rerun_after_fault", "rerun_scored", "rerun_success")
# How the cells' failures failed (CellSummary.failure_labels): one `fail_<label>` column per
# label some cell has, in the labels' order, after the control columns and before the fault
# columns; none in a run without a labelled failure.
FAILURE_PREFIX = "fail_"
DROP_MEANING = (
    "drop = control arm's success - the cell's on the same (task, seed) episodes "
    "[95% task bootstrap], McNemar p"
)
REF_LABEL = "ref_success_rate"
REF_MEANING = "as openpi's and vla-eval's loops count: infrastructure failures count as failures"


def pivot(cells: list[CellSummary], metric: str) -> tuple[list[str], list[str], dict]:
    """Rows mode[@policy_id], columns family/variation (or suite): rate, 'ERR' or '-'."""
    rows = list(dict.fromkeys(c.row for c in cells))
    columns = list(dict.fromkeys(c.column for c in cells))
    matrix: dict[str, dict[str, float | str]] = {r: dict.fromkeys(columns, "-") for r in rows}
    for c in cells:
        value = getattr(c, metric)
        matrix[c.row][c.column] = "ERR" if c.error or value is None else round(value, 4)
    return rows, columns, matrix


def _control_values(drop: ControlDrop | None) -> dict:
    """A cell's CONTROL_COLUMNS (all None without a control arm)."""
    if drop is None:
        return dict.fromkeys(CONTROL_COLUMNS)
    return {
        "control": drop.control,
        "control_rate": drop.control_rate,
        "perturbed_rate": drop.perturbed_rate,
        "drop": drop.drop,
        "drop_ci_low": drop.drop_ci_low,
        "drop_ci_high": drop.drop_ci_high,
        "drop_p": drop.p_value,
        "drop_n_pairs": drop.n_pairs,
    }


def drop_pivot(cells: list[CellSummary]) -> tuple[list[str], list[str], dict] | None:
    """Rows and the perturbed cells' columns: each drop (`-` where none); None when no cell
    has a control arm."""
    with_control = [c for c in cells if c.control is not None]
    if not with_control:
        return None
    rows = list(dict.fromkeys(c.row for c in with_control))
    columns = list(dict.fromkeys(c.column for c in with_control))
    matrix: dict[str, dict[str, float | str]] = {r: dict.fromkeys(columns, "-") for r in rows}
    for c in with_control:
        matrix[c.row][c.column] = "-" if c.control.drop is None else round(c.control.drop, 4)
    return rows, columns, matrix


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def format_tsv(cells: list[CellSummary]) -> str:
    names = (*TSV_COLUMNS, *CI_COLUMNS, *REF_COLUMNS)
    if any(c.control is not None for c in cells):
        names += CONTROL_COLUMNS
    labels = failure_columns(cells)
    names += tuple(FAILURE_PREFIX + label for label in labels)
    if any(c.harness_faults for c in cells):
        names += FAULT_COLUMNS
    lines = ["\t".join(names)]
    for c in cells:
        values = c.model_dump() | _control_values(c.control)
        values |= {FAILURE_PREFIX + label: c.failure_labels.get(label, 0) for label in labels}
        values["wall_clock_s"] = f"{c.wall_clock_s:.1f}"
        lines.append("\t".join(_fmt(values[k]).replace("\t", " ") for k in names))
    pivots = [(f"{m}_pivot", pivot(cells, m)) for m in ("success_rate", "completion_rate")]
    if (drops := drop_pivot(cells)) is not None:
        pivots.append(("drop_pivot", drops))
    for title, (rows, columns, matrix) in pivots:
        lines += ["", "\t".join([title, *columns])]
        lines += ["\t".join([r, *(_fmt(matrix[r][col]) for col in columns)]) for r in rows]
    return "\n".join(lines) + "\n"


def failure_columns(cells: list[CellSummary]) -> list[str]:
    """The failure labels some cell counts, in the labels' order (FAILURE_LABELS)."""
    present = {label for c in cells for label, n in c.failure_labels.items() if n}
    return [label for label in FAILURE_LABELS if label in present] + sorted(
        present - set(FAILURE_LABELS)
    )


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
    lines += _drop_block(cells)
    faults = fault_text(cells)
    if not any(c.n_infra for c in cells):
        same = f"{REF_LABEL} = success_rate: no trial failed on infrastructure"
        lines.append(f"{same}; {faults}" if faults else same)
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
    pooled = reference_rate(successes, trials)
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
    if faults:
        lines.append(faults)
    return "\n".join(lines)


def fault_totals(cells: list[CellSummary]) -> dict[str, int]:
    """FAULT_COLUMNS summed over `cells`."""
    return {name: sum(getattr(c, name) for c in cells) for name in FAULT_COLUMNS}


def fault_text(cells: list[CellSummary]) -> str:
    """The terminal's words on harness faults ('' when none): how many attempts they broke,
    and what became of the trials re-run after one."""
    t = fault_totals(cells)
    if not t["harness_faults"]:
        return ""
    again = t["rerun_after_fault"] - t["rerun_scored"]
    text = (
        f"harness faults (simulator, renderer, host): {t['harness_faults']}; "
        f"{t['rerun_after_fault']} trial(s) re-run once on a fresh env: {t['rerun_scored']} "
        f"scored ({t['rerun_success']} succeeded)"
    )
    return text + (f", {again} faulted again (infrastructure failures)" if again else "")


def _drop_block(cells: list[CellSummary]) -> list[str]:
    """The perturbed cells' drops against their control arms, as a pivot and what it means."""
    found = drop_pivot(cells)
    if found is None:
        return []
    from tabulate import tabulate

    rows, columns, _ = found
    shown = {r: dict.fromkeys(columns, "-") for r in rows}
    controls = {}
    for c in cells:
        if c.control is not None:
            shown[c.row][c.column] = c.control.text()
            controls.setdefault(c.control.control, []).append(c.column)
    table = [[r, *(shown[r][col] for col in columns)] for r in rows]
    against = "; ".join(f"{', '.join(dict.fromkeys(v))} vs {k}" for k, v in controls.items())
    return [
        "",
        tabulate(table, headers=["drop", *columns], tablefmt="simple", disable_numparse=True),
        f"{DROP_MEANING} ({against})",
    ]


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


def fold_run(
    cells: list[Cell],
    results: dict[str, TrialResult],
    threshold: float,
    rule: GateRule = "point",
    selected: set[str] | None = None,
    sequential: SequentialGate | None = None,
    baseline: Baseline | BaselineOutcome | None = None,
    ab: ABCompare | None = None,
) -> RunSummary:
    """Fold `results` (keyed by trial dir, as `scan_results` returns them) over the planned
    `cells`; records of trials no longer planned are ignored. Given `selected` (the trial ids a
    session selected), the gate checks coverage too: a selected trial with no record fails it.
    Under `rule: sequential` each cell's state is read from its records (`sequential`: the
    config's settings; default ones if None), and a decided cell's trials with no record are
    not needed: they count in no scope's planned trials. Given a `baseline` (baseline.py),
    the gate reads each cell against it instead of the threshold (a BaselineOutcome: one that
    could not be read, its problem the gate's reason). Given `ab` (a `compare:` block), the
    gate reads its A/B pairs instead (ab_gate.py)."""
    summaries: list[CellSummary] = []
    by_mode: dict[str, Recorded] = {}
    completion_groups: list[list[float]] = []
    states = (
        _sequential_states(cells, results, threshold, sequential) if rule == "sequential" else {}
    )
    labels = {c.key: c.column if c.suite_name else f"{c.row} {c.column}" for c in cells}
    against = baseline
    if isinstance(baseline, Baseline):
        against = baseline_outcome(cells, results, baseline, labels)
        decided = frozenset(
            c.key
            for c in cells
            if (state := against.states.get(labels[c.key])) is not None and state.stopped
        )
    else:
        decided = frozenset(key for key, state in states.items() if state.stopped)
    found_ab = None
    if ab is not None:
        found_ab, decided = ab_outcome(cells, results, ab)
    drops = control_drops(cells, results)
    for cell in cells:
        trials = cell.trials()
        found = [results[t.key] for t in trials if t.key in results]
        counts = by_mode.setdefault(ids.mode_of_key(cell.key), Recorded())
        counts.planned += len(found) if cell.key in decided else len(trials)
        counts.recorded += len(found)
        if found:
            summary = summarize_cell(cell, found)
            summary.sequential = states.get(cell.key)
            summary.control = drops.get(cell.key)
            summaries.append(summary)
            completion_groups += completions_by_task([r for r in found if not r.errored])
    run = Recorded(
        planned=sum(c.planned for c in by_mode.values()),
        recorded=sum(c.recorded for c in by_mode.values()),
    )
    gate = evaluate_gate(
        summaries,
        threshold,
        rule,
        coverage=coverage(cells, results, selected, decided) if selected is not None else None,
        completion_groups=completion_groups,
        decisions={labels[key]: state for key, state in states.items()},
        alpha=(sequential or SequentialGate()).alpha,
        baseline=against,
        ab=found_ab,
    )
    return RunSummary(cells=summaries, gate=gate, run=run, by_mode=by_mode)


def fold_config(
    cells: list[Cell],
    results: dict[str, TrialResult],
    config: BenchmarkConfig,
    selected: set[str] | None = None,
    baseline: Baseline | None = None,
) -> RunSummary:
    """`fold_run` with `config`'s gate: its threshold, rule and sequential settings, or its
    baseline (`baseline`, already loaded; else loaded here from `gate.baseline`)."""
    against: Baseline | BaselineOutcome | None = baseline
    if against is None and config.gate.baseline is not None:
        try:
            against = load_baseline(config, cells)
        except GapError as exc:  # moved or deleted since the session started
            against = unreadable(config, str(exc))
    return fold_run(
        cells,
        results,
        config.threshold,
        config.rule,
        selected,
        config.sequential_gate,
        against,
        config.compare,
    )


def _sequential_states(
    cells: list[Cell],
    results: dict[str, TrialResult],
    threshold: float,
    settings: SequentialGate | None,
) -> dict[str, SequentialState]:
    """Each scored cell's sequential state, at the config's level split across its cells."""
    settings = settings or SequentialGate()
    runnable = [c for c in cells if c.error is None]
    alpha = alpha_per_cell(settings.alpha, len(runnable))  # as sequential.recorded_state
    return {c.key: cell_state(c, results, threshold, alpha, settings.max_trials) for c in runnable}


def summary_document(summary: RunSummary, grid: dict) -> dict:
    """summary.json: the config echoed without secrets, cells, pivots, gate, the pooled rates
    with their intervals."""
    gate = summary.gate
    matrix = {m: pivot(summary.cells, m)[2] for m in ("success_rate", "completion_rate")}
    if (drops := drop_pivot(summary.cells)) is not None:
        matrix["drop"] = drops[2]
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
        # harness faults and the trials re-run after one, over every cell (FAULT_COLUMNS)
        **fault_totals(summary.cells),
        "updated_at": now_iso(),
    }
