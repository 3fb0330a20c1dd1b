"""The regression gate against a baseline run: `gate: {baseline: RUN_DIR_OR_PARQUET, margin}` in
a benchmark YAML (either shape), or `gap benchmark --baseline` / `pytest --gap-baseline`.

What CI on a policy repository asks: is this checkpoint worse than the one before it? Each trial
of this run is paired with the baseline's trial of the same episode (backend, family, variation,
task, seed; compare/pairing.py), row by row: a row of this run with the baseline's row of the
same label or, when each run has one row, with that row (the new checkpoint may have a new policy
id). Per cell the question is one-sided: is this run's success rate below the baseline's by more
than `margin`?

- rule `sequential` (the default): after each block of `block_seeds` seeds of every task, two
  anytime-valid e-values over the cell's scored pairs so far (compare/noninferiority.py), at
  level alpha split across the cells (Bonferroni; `look_at`): FAIL once the one against
  "within the margin" reaches 2/alpha_cell, PASS once the one against "worse by the margin or
  more" reaches 1/alpha_cell, and at the plan's last look FAIL too where Tango's test gives
  p < alpha_cell/2. A decided cell's remaining trials are not run (as under `gate_rule:
  sequential`). A cell still undecided when its plan is spent was not shown worse: it passes,
  and its line says undecided.
- rule `fixed`: Tango's score test per cell over every pair, Holm across the cells: FAIL where
  the adjusted p-value is below alpha.

The session passes when no cell fails (the gate's threshold and rule are not read). Refused
before any trial runs, as `gap compare` refuses (`start_problems`: one line each, naming
`gate.baseline` and the fix): a baseline that cannot be read, no row to pair a row with, trials
recorded on another harness surface (`gate.allow_harness_mismatch: true` accepts it), a plan
that differs on the paired part. Pairs whose initial states or scenes differ show only as
trials record: the gate fails, naming them. What a candidate may change is what is gated: its
policies (checkpoints) and its workflows (`CANDIDATE_KEYS`). Trials with no scored partner in the
baseline are not tested, and counted. One server answering both runs is no refusal here: a run
of the baseline's own checkpoint is a fair run, and should pass.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, PrivateAttr

from pytest_gap.cells import Cell
from pytest_gap.compare.noninferiority import log_e_within, log_e_worse, tango_p
from pytest_gap.compare.pairing import Pair, RunDir, base_row, load_run, row_of
from pytest_gap.compare.plans import paired_plan, plan_differences
from pytest_gap.compare.refusals import episode_problems, surface_changes
from pytest_gap.compare.stats import holm
from pytest_gap.compare.wording import first_few, short_digest
from pytest_gap.config.model import BaselineGate
from pytest_gap.errors import GapError
from pytest_gap.results import TrialResult, recorded_results
from pytest_gap.sequential import alpha_per_cell

if TYPE_CHECKING:
    from pytest_gap.config.document import BenchmarkConfig

BaselineVerdict = Literal["PASS", "FAIL", "UNDECIDED"]
# What a candidate may change against its baseline besides its policies (which the plan check
# ignores anyway): the workflow it runs. Everything else on the paired part must be the same.
CANDIDATE_KEYS = frozenset({"workflow_dir", "template"})
Episode = tuple[str, str, str, int, int]  # (row, family, variation, task, seed)


class BaselineState(BaseModel):
    """Where a cell stands against the baseline."""

    verdict: BaselineVerdict
    rule: Literal["sequential", "fixed"]
    alpha: float  # sequential: the cell's share of the level; fixed: the level (Holm)
    margin: float
    n: int  # scored pairs looked at
    planned: int  # the cell's planned trials
    looks: int = 0
    success: int = 0  # this run's successes over those pairs
    baseline_success: int = 0  # the baseline's, over the same pairs
    a_only: int = 0  # only the baseline succeeded
    b_only: int = 0  # only this run succeeded
    unpaired: int = 0  # this run's scored trials the baseline has no scored trial for
    decided_at: int | None = None
    spent: bool = False  # undecided with every block looked at
    p_value: float | None = None  # fixed: Tango's one-sided p-value
    p_holm: float | None = None
    e_worse: float | None = None  # sequential: the e-values at the last look
    e_within: float | None = None

    @property
    def decided(self) -> bool:
        return self.verdict != "UNDECIDED"

    @property
    def stopped(self) -> bool:
        """No more of its trials are needed (sequential only: decided, or every block run)."""
        return self.rule == "sequential" and (self.decided or self.spent)

    @property
    def diff(self) -> float | None:
        return (self.success - self.baseline_success) / self.n if self.n else None

    def line(self) -> str:
        """`FAIL at n=10 of 20 planned (3/10 vs baseline 9/10, margin 0.05)`."""
        what = self.verdict if self.decided else "undecided"
        counts = f"{self.success}/{self.n} vs baseline {self.baseline_success}/{self.n}"
        extra = f", p_holm={self.p_holm:.3g}" if self.p_holm is not None else ""
        extra += f", {self.unpaired} without a baseline partner" if self.unpaired else ""
        return (
            f"{what} at n={self.n} of {self.planned} planned "
            f"({counts}, margin {self.margin:g}{extra})"
        )


class Baseline(BaseModel):
    """A baseline run as the gate reads it: its records by episode, and the settings."""

    path: str
    run: RunDir
    settings: BaselineGate
    rows: dict[str, str]  # this run's row (without [privileged]) -> the baseline's
    _by_episode: dict[Episode, list[TrialResult]] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context) -> None:
        for r in self.run.results.values():
            episode = (row_of(r), r.family, r.variation, r.task_id, r.seed)
            self._by_episode.setdefault(episode, []).append(r)

    def partner(self, row: str, result: TrialResult) -> TrialResult | None:
        """The baseline's record of the episode `result` ran (row mapped; the same backend
        where both records name theirs)."""
        episode = (self.rows.get(base_row(row), ""), result.family, result.variation)
        for r in self._by_episode.get((*episode, result.task_id, result.seed), []):
            if r.backend is None or result.backend is None or r.backend == result.backend:
                return r
        return None


def load_baseline(config: BenchmarkConfig, cells: list[Cell]) -> Baseline:
    """The config's baseline (`gate.baseline`), its rows paired with `cells`' rows. Raises
    GapError naming `gate.baseline` when it cannot be read or a row has no partner."""
    settings = config.gate
    if settings.baseline is None:
        raise GapError("gate.baseline is not set")
    where = settings.baseline
    try:
        run = load_run(where)
    except GapError as exc:
        raise GapError(f"gate.baseline: {exc}") from None
    ours = list(dict.fromkeys(base_row(c.row) for c in cells if c.error is None))
    theirs = list(dict.fromkeys(row_of(r) for r in run.results.values()))
    if len(ours) == 1 and len(theirs) == 1:
        rows = {ours[0]: theirs[0]}
    else:
        missing = [r for r in ours if r not in theirs]
        if missing:
            raise GapError(
                f"gate.baseline: {where} has no row {first_few(missing)} (its rows: "
                f"{', '.join(theirs)}); gate against a run of the same rows, or gate one row "
                "against a baseline of one row"
            )
        rows = {r: r for r in ours}
    return Baseline(path=str(where), run=run, settings=settings, rows=rows)


def start_problems(
    baseline: Baseline, plan_digest: str, echo: dict, surface: dict | None
) -> list[str]:
    """Why this run cannot be gated against `baseline` before any trial runs: another harness
    surface (`surface`: this installation's {digest, files, packages}) unless allowed, or a plan
    that differs on the paired part (`echo`: this config's echo). One line each."""
    problems = []
    records = list(baseline.run.results.values())
    theirs = sorted({r.harness_surface for r in records if r.harness_surface})
    mine = (surface or {}).get("digest")
    if mine and theirs and theirs != [mine] and not baseline.settings.allow_harness_mismatch:
        changed = surface_changes(baseline.run.surface, surface) or "changed files unknown"
        problems.append(
            f"gate.baseline: {baseline.path} was recorded on another harness surface "
            f"({', '.join(short_digest(d) for d in theirs)}, this checkout "
            f"{short_digest(mine)}; {changed}): rerun the baseline on this checkout, or read "
            "the changes and set gate.allow_harness_mismatch: true"
        )
    digests = {r.plan_digest for r in records if r.plan_digest}
    if digests and digests != {plan_digest}:
        if baseline.run.plan is None:
            problems.append(
                f"gate.baseline: {baseline.path} ran another plan (digest "
                f"{', '.join(short_digest(d) for d in sorted(digests))}) and holds no config echo "
                "(summary.json) to say where: give the run dir of a finished session, not an "
                "episodes.parquet"
            )
        else:
            modes = {r.mode for r in records}
            flat_a = paired_plan(baseline.run.plan, modes, CANDIDATE_KEYS)
            flat_b = paired_plan(echo, modes, CANDIDATE_KEYS)
            differ = plan_differences(flat_a, flat_b)
            if differ:
                problems.append(
                    f"gate.baseline: {baseline.path} ran another plan on the paired part "
                    f"({first_few(differ)}): gate against a run of this config"
                )
    return problems


# -- the statistics over a cell's pairs ---------------------------------------------------------
class _Counts(BaseModel):
    n: int = 0
    success: int = 0
    baseline_success: int = 0
    a_only: int = 0
    b_only: int = 0
    unpaired: int = 0

    def add(self, ours: TrialResult, theirs: TrialResult | None) -> None:
        if ours.errored:
            return
        if theirs is None or theirs.errored:
            self.unpaired += 1
            return
        self.n += 1
        self.success += ours.success
        self.baseline_success += theirs.success
        self.a_only += theirs.success and not ours.success
        self.b_only += ours.success and not theirs.success


def cell_state(
    cell: Cell, results: dict[str, TrialResult], baseline: Baseline, alpha: float
) -> BaselineState:
    """`cell`'s state as `results` (keyed by trial dir) record it: block by block under the
    sequential rule (stopping at the first incomplete block or decisive look), every pair under
    the fixed rule (Holm is applied over the cells by `cell_states`)."""
    settings = baseline.settings
    margin, counts = settings.margin, _Counts()
    planned = len(cell.trials())
    if settings.rule == "fixed":
        complete = True
        for trial in cell.trials():
            found = results.get(trial.key)
            complete &= found is not None
            if found is not None:
                counts.add(found, baseline.partner(cell.row, found))
        p = tango_p(counts.a_only, counts.b_only, counts.n, margin) if counts.n else None
        verdict: BaselineVerdict = "UNDECIDED"
        return BaselineState(
            verdict=verdict,
            rule="fixed",
            alpha=alpha,
            margin=margin,
            planned=planned,
            looks=int(complete),
            spent=complete,
            p_value=p,
            **counts.model_dump(),
        )
    blocks = cell.blocks()
    state = BaselineState(
        verdict="UNDECIDED", rule="sequential", alpha=alpha, margin=margin, n=0, planned=planned
    )
    for look, block in enumerate(blocks, 1):
        found = [results.get(t.key) for t in block]
        if any(r is None for r in found):
            break
        for r in found:
            counts.add(r, baseline.partner(cell.row, r))
        last = look == len(blocks)
        found_look = look_at(counts.a_only, counts.b_only, counts.n, margin, alpha, last=last)
        verdict, worse, within, p = found_look
        state = BaselineState(
            verdict=verdict,
            rule="sequential",
            alpha=alpha,
            margin=margin,
            planned=planned,
            looks=look,
            decided_at=counts.n if verdict != "UNDECIDED" else None,
            spent=verdict == "UNDECIDED" and last,
            p_value=p,
            e_worse=math.exp(min(worse, 700.0)),
            e_within=math.exp(min(within, 700.0)),
            **counts.model_dump(),
        )
        if verdict != "UNDECIDED":
            break
    return state


def look_at(
    a_only: int, b_only: int, n: int, margin: float, alpha: float, *, last: bool
) -> tuple[BaselineVerdict, float, float, float | None]:
    """One look of the sequential rule at a cell's pairs so far: (verdict, log e-value against
    "within the margin", log e-value against "worse by it or more", Tango's p at the last look).

    The level is split: alpha/2 for the e-value, read at every look (FAIL at 2/alpha), and
    alpha/2 for Tango's test at the plan's last look, so a regression too small for the
    anytime test to see early is still caught at the full plan (bench/baseline_gate.py: the
    power of the fixed rule, at most alpha in false alarms). PASS early at 1/alpha."""
    worse = log_e_worse(a_only, b_only, n, margin)
    within = log_e_within(a_only, b_only, n, margin)
    p = tango_p(a_only, b_only, n, margin) if last else None
    if worse >= math.log(2 / alpha) or (p is not None and p < alpha / 2):
        return "FAIL", worse, within, p
    if within >= math.log(1 / alpha):
        return "PASS", worse, within, p
    return "UNDECIDED", worse, within, p


def cell_states(
    cells: list[Cell], results: dict[str, TrialResult], baseline: Baseline
) -> dict[str, BaselineState]:
    """Each runnable cell's state by cell key: the sequential rule's at alpha split across the
    cells; the fixed rule's with Holm-adjusted p-values and verdicts once every trial ran."""
    runnable = [c for c in cells if c.error is None]
    alpha = baseline.settings.alpha
    if baseline.settings.rule == "sequential":
        share = alpha_per_cell(alpha, len(runnable))
        return {c.key: cell_state(c, results, baseline, share) for c in runnable}
    states = {c.key: cell_state(c, results, baseline, alpha) for c in runnable}
    tested = [k for k, s in states.items() if s.p_value is not None]
    for key, adjusted in zip(tested, holm([states[k].p_value for k in tested]), strict=True):
        state = states[key]
        state.p_holm = adjusted
        if state.spent:
            state.verdict = "FAIL" if adjusted < alpha else "PASS"
            state.decided_at = state.n
    return states


def recorded_state(
    run_dir: Path, cell: Cell, cells: list[Cell], baseline: Baseline
) -> BaselineState:
    """`cell`'s sequential state from the records in `run_dir` now (every process reads them
    before each trial); `cells`: the config's cells, which share its level."""
    results = recorded_results(run_dir, (t.key for t in cell.trials()))
    share = alpha_per_cell(baseline.settings.alpha, sum(c.error is None for c in cells))
    return cell_state(cell, results, baseline, share)


def recorded_pair_problems(
    cells: list[Cell], results: dict[str, TrialResult], baseline: Baseline
) -> list[str]:
    """Pairs that did not run the same episode (their initial states or scenes differ), as
    `gap compare` refuses them; one line, naming the baseline."""
    pairs = []
    for cell in cells:
        for trial in cell.trials():
            ours = results.get(trial.key)
            theirs = baseline.partner(cell.row, ours) if ours is not None else None
            if ours is not None and theirs is not None:
                key = (ours.backend, ours.family, ours.variation, ours.task_id, ours.seed)
                pairs.append(Pair(key=key, a=theirs, b=ours))
    return [f"gate.baseline {baseline.path}: {p}" for p in episode_problems(pairs)]


class BaselineOutcome(BaseModel):
    """The gate's reading against a baseline: each cell's state by its label, and problems
    found as trials recorded (pairs that ran different episodes) or in reading the baseline."""

    path: str
    rule: Literal["sequential", "fixed"]
    margin: float
    alpha: float
    states: dict[str, BaselineState] = {}
    problems: list[str] = []

    @property
    def baseline_rate(self) -> float | None:
        n = sum(s.n for s in self.states.values())
        return sum(s.baseline_success for s in self.states.values()) / n if n else None

    def reasons(self) -> list[str]:
        """Why the gate does not pass: problems, then the cells shown worse."""
        worse = [f"{label} {s.line()}" for label, s in self.states.items() if s.verdict == "FAIL"]
        if worse:
            return [
                *self.problems,
                f"worse than the baseline by more than the margin: {'; '.join(worse)}",
            ]
        return list(self.problems)

    def notes(self) -> list[str]:
        """The other cells' states: decided within the margin, or undecided (not shown worse)."""
        found = [f"{label} {s.line()}" for label, s in self.states.items() if s.verdict != "FAIL"]
        return [f"against the baseline: {'; '.join(found)}"] if found else []


def outcome(
    cells: list[Cell],
    results: dict[str, TrialResult],
    baseline: Baseline,
    labels: dict[str, str],
) -> BaselineOutcome:
    """The gate's reading of `results` against `baseline`; `labels`: cell key -> label."""
    settings = baseline.settings
    states = cell_states(cells, results, baseline)
    return BaselineOutcome(
        path=baseline.path,
        rule=settings.rule,
        margin=settings.margin,
        alpha=settings.alpha,
        states={labels[key]: state for key, state in states.items()},
        problems=recorded_pair_problems(cells, results, baseline),
    )


def unreadable(config: BenchmarkConfig, why: str) -> BaselineOutcome:
    """The reading of a baseline that could not be loaded when the run was folded."""
    settings = config.gate
    return BaselineOutcome(
        path=str(settings.baseline),
        rule=settings.rule,
        margin=settings.margin,
        alpha=settings.alpha,
        problems=[why],
    )


def baseline_of(config: BenchmarkConfig, path: Path | None) -> BenchmarkConfig:
    """`config` with its gate's baseline set to `path` (`--gap-baseline`), when given."""
    if path is None:
        return config
    gate = config.gate.model_copy(update={"baseline": path.resolve()})
    return config.model_copy(update={"gate": gate})
