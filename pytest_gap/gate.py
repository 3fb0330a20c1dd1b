"""The session's verdict on a config (`evaluate_gate`): fails on no scored trial, an errored
cell or a planned trial with no record (`coverage`), else the gate rule decides. Pure
functions over cell rows (cell_summary.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, model_validator

from pytest_gap import intervals
from pytest_gap.ab_gate import ABOutcome
from pytest_gap.baseline import BaselineOutcome
from pytest_gap.cell_summary import CellSummary, pooled_reference, reference_rate
from pytest_gap.cells import Cell
from pytest_gap.config.model import GateRule
from pytest_gap.results import TrialResult
from pytest_gap.sequential import SequentialState

MISSING_SHOWN = 3  # missing trial ids the gate line names before "(+N more)"

Verdict = Literal["PASS", "FAIL", "INCONCLUSIVE"]


class Coverage(BaseModel):
    """The session's plan against the run dir's records.

    Planned: the trials the session selected, plus any trial an earlier session recorded in the
    run dir (the summary folds it, and `--lf` or `--gap-resume` did not need to run it again).
    Deselected: the config's other trials (`-k`, `-m`, `--gap-families`, `--gap-modes`).
    Missing: planned trials with no record (the session stopped early, or an item failed before
    its trial recorded), in plan order. Not needed: trials of a cell the sequential gate had
    decided before they ran (neither planned nor missing, and in no rate)."""

    planned: int
    recorded: int
    deselected: int
    missing: list[str]
    not_needed: int = 0

    def line(self) -> str:
        line = f"recorded {self.recorded}/{self.planned} planned"
        if self.not_needed:
            line += f", {self.not_needed} not needed (decided by the sequential gate)"
        return line + (f", {self.deselected} deselected" if self.deselected else "")


DEBUG_RUN_NOTE = "[debug run: in-process (GAP_PARALLEL_INPROC=1), not for scoring]"


class Gate(BaseModel):
    """The session's verdict on a config. `passed` is `verdict == "PASS"`: INCONCLUSIVE (only
    under `gate_rule: wilson`) does not pass, and exits 1 like FAIL."""

    passed: bool
    verdict: Verdict
    rule: GateRule | Literal["baseline", "compare"] = "point"
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
    # gate_rule: sequential: the config's level, and each cell's state by its label (row and
    # column), in plan order.
    alpha: float | None = None
    decisions: dict[str, SequentialState] = {}
    # gate.baseline: the paired reading against the baseline run (rule "baseline"), which
    # decides instead of the threshold.
    baseline: BaselineOutcome | None = None
    # compare: the in-session A/B test's reading (rule "compare"), deciding instead of the
    # threshold.
    ab: ABOutcome | None = None
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
        if self.baseline is not None:
            return self._baseline_line(self.baseline)
        if self.ab is not None:
            return self._ab_line(self.ab)
        values = f"success_rate={self.success_rate:.3f}"
        if self.rule == "wilson" and self.success_ci_low is not None:
            values += f" ci95=[{self.success_ci_low:.3f},{self.success_ci_high:.3f}]"
        values += f" threshold={self.threshold:.3f}"
        if self.rule != "point":
            values += f" rule={self.rule}"
        if self.alpha is not None:
            values += f" alpha={self.alpha:g}"
        # the sequential gate's decided cells, after the reasons (which name the others)
        decided = [f"{label} {s.line()}" for label, s in self.decisions.items() if s.decided]
        return self._assembled(values, [f"decided: {'; '.join(decided)}"] if decided else [])

    def _assembled(self, values: str, notes: list[str]) -> str:
        """`gate V: values (reasons; notes); coverage`: coverage last, so what is read (and
        matched) first stays the spec's `gate V: rate threshold`."""
        shown = self.reasons + notes
        reasons = f" ({'; '.join(shown)})" if shown else ""
        coverage = f"; {self.coverage.line()}" if self.coverage is not None else ""
        debug = f" {DEBUG_RUN_NOTE}" if self.debug else ""
        return f"gate {self.verdict}: {values}{reasons}{coverage}{debug}"

    def _baseline_line(self, against: BaselineOutcome) -> str:
        rate = against.baseline_rate
        values = f"success_rate={self.success_rate:.3f}"
        values += f" baseline={rate:.3f}" if rate is not None else " baseline=-"
        values += f" margin={against.margin:g} rule=baseline:{against.rule} alpha={against.alpha:g}"
        return self._assembled(values, against.notes() if self.verdict == "PASS" else [])

    def _ab_line(self, ab: ABOutcome) -> str:
        values = f"success_rate={self.success_rate:.3f} rule=compare:{ab.b}-vs-{ab.a}"
        values += f" margin={ab.margin:g} alpha={ab.alpha:g}"
        return self._assembled(values, ab.notes() if self.verdict == "PASS" else [])


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
    decisions: dict[str, SequentialState] | None = None,
    alpha: float | None = None,
    baseline: BaselineOutcome | None = None,
    ab: ABOutcome | None = None,
) -> Gate:
    """The gate over `cells`. It fails on no scored trial, an errored cell, or (given
    `coverage`) a planned trial with no record; otherwise `rule` decides: `point` passes when
    the pooled success rate reaches `threshold`; `wilson` passes when the rate's 95% Wilson
    interval lies at or above it, fails when the interval lies below, and is INCONCLUSIVE
    between, naming the further trials at the observed rate that would decide it;
    `sequential` reads each cell's `decisions` (by label; sequential.py, at level `alpha`
    split across them): PASS when every cell passed, FAIL when one failed, INCONCLUSIVE
    while one is undecided. `completion_groups` (scored trials' completions, one list per
    cell x task) give the pooled completion interval."""
    n_trials = sum(c.n_trials for c in cells)
    n_success = sum(c.n_success for c in cells)
    rate = n_success / n_trials if n_trials else 0.0
    completion = (
        sum((c.completion_rate or 0.0) * c.n_trials for c in cells) / n_trials if n_trials else 0.0
    )
    reasons = _what_fails_any_rule(cells, n_trials, coverage)
    success_ci = intervals.wilson(n_success, n_trials)
    completion_ci = intervals.cluster_bootstrap(completion_groups or [])
    verdict: Verdict = "FAIL" if reasons else "PASS"
    to_decide = None
    if baseline is not None or ab is not None:
        # the baseline, or the A/B test, decides instead of the threshold: fails only where
        # this run (arm B) is shown worse than the baseline (arm A), or its pairs are not the
        # same episodes
        rule = "baseline" if baseline is not None else "compare"
        reasons += baseline.reasons() if baseline is not None else ab.reasons()
        verdict = "FAIL" if reasons else "PASS"
    elif rule == "point" and n_trials and rate < threshold:
        reasons.append(f"success rate below threshold ({n_success}/{n_trials})")
        verdict = "FAIL"
    elif rule == "wilson" and n_trials and success_ci[0] < threshold:
        short, found, to_decide = _wilson_short(n_success, n_trials, threshold, success_ci)
        reasons.append(found)
        verdict = "FAIL" if verdict == "FAIL" else short
    elif rule == "sequential" and n_trials:
        verdict, found = _sequential_verdict(decisions or {})
        verdict = "FAIL" if reasons else verdict
        reasons += found
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
        **reference_rate(*pooled_reference(cells)),
        to_decide=to_decide,
        coverage=coverage,
        alpha=alpha if rule == "sequential" else None,
        decisions=(decisions or {}) if rule == "sequential" else {},
        baseline=baseline,
        ab=ab,
    )


def _what_fails_any_rule(
    cells: list[CellSummary], n_trials: int, coverage: Coverage | None
) -> list[str]:
    """Why the gate fails whatever its rule: nothing scored, an errored cell, a trial missing."""
    reasons = []
    if n_trials == 0:
        reasons.append("no trial was scored")
    errored = [c.column if c.suite_name else f"{c.row} {c.column}" for c in cells if c.error]
    if errored:
        reasons.append(f"errored cells: {', '.join(errored)}")
    if coverage is not None and coverage.missing:
        reasons.append(_missing_reason(coverage.missing))
    return reasons


def _wilson_short(
    n_success: int, n_trials: int, threshold: float, ci: tuple[float, float]
) -> tuple[Verdict, str, int | None]:
    """A Wilson interval whose low end misses `threshold`: FAIL when it lies below, else
    INCONCLUSIVE with the further trials at the observed rate that would decide it; and why."""
    if ci[1] < threshold:
        return "FAIL", f"interval below threshold ({n_success}/{n_trials})", None
    rate = n_success / n_trials
    to_decide = intervals.trials_to_decide(n_success, n_trials, threshold)
    more = (
        f"about {to_decide} more trials at {rate:.3f} would decide it"
        if to_decide is not None
        else f"no number of further trials at {rate:.3f} decides it"
    )
    why = f"interval straddles the threshold ({n_success}/{n_trials}); {more}"
    return "INCONCLUSIVE", why, to_decide


def _sequential_verdict(decisions: dict[str, SequentialState]) -> tuple[Verdict, list[str]]:
    """The config's verdict from its cells' (PASS only when every cell passed), and the
    reasons of one that is not PASS: the cells that failed, or those still undecided."""
    failed = [f"{label} {s.line()}" for label, s in decisions.items() if s.verdict == "FAIL"]
    if failed:
        return "FAIL", [f"below threshold: {'; '.join(failed)}"]
    open_ = [f"{label} {s.line()}" for label, s in decisions.items() if not s.decided]
    if open_:
        return "INCONCLUSIVE", [f"undecided: {'; '.join(open_)}"]
    return "PASS", []


def coverage(
    cells: list[Cell],
    results: dict[str, TrialResult],
    selected: set[str],
    decided: frozenset[str] = frozenset(),
) -> Coverage:
    """The session's coverage (see `Coverage`): `selected` holds the trial ids it selected,
    `decided` the keys of the cells the sequential gate has decided."""
    planned = recorded = deselected = not_needed = 0
    missing: list[str] = []
    for trial in (t for cell in cells for t in cell.trials()):
        has_record = trial.key in results
        if not has_record and trial.cell.key in decided:
            not_needed += 1
            continue
        if not has_record and trial.id not in selected:
            deselected += 1
            continue
        planned += 1
        recorded += has_record
        if not has_record:
            missing.append(trial.id)
    return Coverage(
        planned=planned,
        recorded=recorded,
        deselected=deselected,
        missing=missing,
        not_needed=not_needed,
    )
