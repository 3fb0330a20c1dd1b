"""One cell's records folded into its row (`summarize_cell`): rates, their 95% intervals,
per-task rows, and the reference loops' rate beside ours (`reference_counts`). Pure functions
over TrialResults; the gate (gate.py) and the run's report (report.py) are built on them.
"""

from __future__ import annotations

from pydantic import BaseModel

from pytest_gap import intervals
from pytest_gap.cells import Cell
from pytest_gap.control_drop import ControlDrop
from pytest_gap.results import TrialResult
from pytest_gap.sequential import SequentialState
from pytest_gap.sim.failure_labels import FAILURE_LABELS


class TaskRow(BaseModel):
    """One task of a cell: its scored trials' rates."""

    task_id: int  # the task's index in its suite
    success_rate: float | None  # None when no trial of the task was scored
    completion_rate: float | None  # mean completion of the task's scored trials
    avg_reward: float | None  # mean final reward
    n_trials: int  # scored trials
    n_success: int  # of them, successes


class CellSummary(BaseModel):
    """One cell (mode x policy x family/variation): an entry of summary.json's `cells`, its
    `<cell key>/cell_result.json`, and a row of summary.tsv (the columns it has)."""

    mode: str  # the cell's mode
    policy_id: str | None  # its policy registry entry (policy modes)
    privileged: bool = False  # an oracle reading ground truth: not comparable with policies
    family: str  # the benchmark family
    variation: str  # the family's variation
    suite_name: str | None  # a suites-mode entry's name
    key: str  # the cell's key, its folder in the run dir (`mode/policy/family/variation`)
    row: str  # its row in the pivot (`mode` or `mode@policy`)
    column: str  # its column in the pivot (`family/variation`, or a suite's name)
    success_rate: float | None  # None when no trial of the cell was scored
    completion_rate: float | None  # mean completion of the scored trials
    avg_reward: float | None  # mean final reward of the scored trials
    n_success: int  # scored trials that succeeded
    n_trials: int  # scored trials; errored ones are not counted
    n_infra: int  # trials errored by infrastructure (server down, worker died)
    n_errored: int  # all errored trials, infrastructure ones included
    n_planned: int  # trials the plan has for the cell
    wall_clock_s: float  # the sum of its trials' wall_s
    produce_s: float  # the sum of its trials' produce_s
    eval_s: float  # the sum of its trials' eval_s
    error: str | None  # why the cell is errored (it then fails the gate), else empty
    tasks: list[TaskRow]  # one row per task
    # 95% intervals: Wilson for the success rate, a task-resampling bootstrap for completion.
    success_ci_low: float | None = None  # None with the rate (no scored trial)
    success_ci_high: float | None = None  # None with the rate (no scored trial)
    completion_ci_low: float | None = None  # of completion_rate (task bootstrap)
    completion_ci_high: float | None = None  # of completion_rate (task bootstrap)
    # The reference loops' rate (`reference_counts`): None when no trial of the cell was run.
    # Defaults: a cell_result.json written before these fields existed still loads.
    ref_success_rate: float | None = None
    ref_n_trials: int = 0  # trials run: n_trials + n_infra
    ref_success_ci_low: float | None = None  # Wilson, over ref_n_trials
    ref_success_ci_high: float | None = None  # Wilson, over ref_n_trials
    # Harness faults (faults.py: an exception the simulator, its renderer or the host raised):
    # the attempts they broke and the trials re-run once on a fresh env after one. A re-run
    # that ran clean is scored like any trial; the rate without the re-runs, to set beside
    # success_rate, is (n_success - rerun_success) / (n_trials - rerun_scored).
    harness_faults: int = 0  # attempts a harness fault broke (a trial faulting twice counts 2)
    rerun_after_fault: int = 0  # trials re-run after a fault (scored, or faulted again)
    rerun_scored: int = 0  # of them, re-runs that ran clean: scored, in n_trials
    rerun_success: int = 0  # of those, successes
    # How its scored failures failed (sim/failure_labels.py): label -> trials, in the labels'
    # order; failures without a label (records older than it) are not counted.
    failure_labels: dict[str, int] = {}
    # gate_rule: sequential: where the cell stands (decided at n=K of N planned, or not yet).
    sequential: SequentialState | None = None
    # A perturbed cell whose matched control arm ran: the paired drop (control_drop.py).
    control: ControlDrop | None = None


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


def reference_rate(successes: int, trials: int) -> dict:
    """The reference rate's fields (CellSummary's and Gate's), with its 95% Wilson interval."""
    ci = intervals.wilson(successes, trials) or (None, None)
    return {
        "ref_success_rate": successes / trials if trials else None,
        "ref_n_trials": trials,
        "ref_success_ci_low": ci[0],
        "ref_success_ci_high": ci[1],
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def completions_by_task(results: list[TrialResult]) -> list[list[float]]:
    """Completions grouped by task: the clusters the completion interval resamples."""
    groups: dict[int, list[float]] = {}
    for r in results:
        groups.setdefault(r.task_id, []).append(r.completion)
    return list(groups.values())


def fault_counts(results: list[TrialResult]) -> dict[str, int]:
    """CellSummary's harness-fault fields over `results`."""
    reruns = [r for r in results if r.rerun_after_fault]
    scored = [r for r in reruns if not r.errored]
    return {
        "harness_faults": sum(r.harness_faults for r in results),
        "rerun_after_fault": len(reruns),
        "rerun_scored": len(scored),
        "rerun_success": sum(r.success for r in scored),
    }


def label_counts(results: list[TrialResult]) -> dict[str, int]:
    """CellSummary.failure_labels over `results`: the scored failures' labels, counted."""
    found = [r.failure_label for r in results if not r.errored and not r.success]
    order = {label: i for i, label in enumerate(FAILURE_LABELS)}
    counts = {label: found.count(label) for label in set(found) if label is not None}
    return dict(sorted(counts.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))


def summarize_cell(cell: Cell, results: list[TrialResult]) -> CellSummary:
    scored = [r for r in results if not r.errored]
    n_success = sum(r.success for r in scored)
    success_ci = intervals.wilson(n_success, len(scored)) or (None, None)
    completion_ci = intervals.cluster_bootstrap(completions_by_task(scored)) or (None, None)
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
        **reference_rate(*reference_counts(results)),
        **fault_counts(results),
        failure_labels=label_counts(results),
    )
