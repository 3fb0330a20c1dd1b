"""`gap compare`: is B worse than A, and where. Paired statistics over recorded trials, as pure
functions over TrialResults; the CLI (`gap compare`) only loads run dirs and prints.

Sides. A side is one row of a run dir, as the terminal pivot labels it (`mode@policy_id`,
`[privileged]` optional): two rows of one run (`gap compare RUN --a ROW --b ROW`), or one row of
each of two runs (`gap compare RUN_A RUN_B`; `--a`/`--b` pick the row where a run has several).

Pairs. A trial of A and a trial of B are a pair when they ran the same episode: the same
(backend, family, variation, task, seed). A pair with an errored trial on either side
(an infrastructure failure or a trial the harness could not run) is excluded from both sides
and counted; trials without a partner are counted and left out.

Refusals (exit 2, one line each, naming what differs and the fix), all reported at once:
- a pair whose two initial sim states differ (init_state_digest, when both are known): the
  sides did not run the same episodes;
- a pair whose two settled scenes differ (scene_digest, when both are known): the same seed
  placed the fixtures otherwise (a harness that drew their jitter from another stream);
- a pair whose harness_surface differs (code and packages that decide outcomes): the changed
  files come from the two run_manifest.json; `--allow-harness-mismatch` turns it into a note;
- different plans for the paired part (see `plan_problems`);
- a pair answered by one server URL on both sides: a policy compared with itself gives a
  difference near zero with every check passing;
- no scored pair at all.
Provenance a record does not carry (records written before it was recorded) is unknown: the
check is skipped and the output says which fields were missing.

Statistics, per cell (family/variation) and pooled over every pair:
- success of A and of B (k/n over the scored pairs) and the difference B - A;
- McNemar's exact test: under "no difference" the discordant pairs (A only succeeded: `a_only`,
  B only succeeded: `b_only`) split 50/50, so p = binomtest(a_only, a_only + b_only, 0.5),
  two-sided; 1.0 with no discordant pair;
- a 95% interval for the difference from a percentile bootstrap that resamples whole tasks
  (the clusters: the seeds of one task share a scene and a prompt, they are not independent
  draws), with a fixed seed so the same records give the same interval;
- Holm's step-down adjustment over the cells; with two or more cells the pooled row joins the
  family, since it can fail the comparison too.
Exit 0 when no row says B is significantly worse after Holm, 1 when one does.

scipy and statsmodels are imported inside the functions that use them (seconds to import).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from pytest_gap.errors import GapError
from pytest_gap.intervals import CONFIDENCE, cluster_bootstrap
from pytest_gap.layout import MANIFEST, SUMMARY_JSON, stamp_of
from pytest_gap.results import TrialResult, scan_results

ALPHA = 0.05
PRIVILEGED = "[privileged]"

# Config keys that do not decide a paired episode's outcome, or that are what is compared:
# outputs, recording, workers and the gate; the grid's extent (pairing finds the overlap);
# the policy registry and axis (checked on the pairs by URL instead).
_PLAN_IGNORED_LEAVES = frozenset(
    {
        "output_dir",
        "record_video",
        "frames_every",
        "enable_tracing",
        "gate_threshold",
        "gate_rule",
        "num_workers",
        "max_concurrent_requests",
        "cache_dir",
        "families",
        "variations",
        "modes",
        "n_tasks",
        "task_ids",
        "n_seeds",
        "seeds",
        "trials_per_generation",
        "policies",
        "policy_id",
    }
)
_PLAN_IGNORED_TOP = frozenset({"policies", "policy_manager"})


class CompareRefused(GapError):
    """The comparison cannot be made; `reasons` holds one line per reason."""

    def __init__(self, reasons: list[str]):
        super().__init__("; ".join(reasons))
        self.reasons = reasons


# -- loading ------------------------------------------------------------------------------------
class RunDir(BaseModel):
    """What `gap compare` reads of one run dir: every result.json, the pivot's row labels
    (summary.json), the harness surface (run_manifest.json) and the config echo."""

    path: str
    results: dict[str, TrialResult]
    labels: dict[str, str] = {}  # row without `[privileged]` -> the label the pivot shows
    surface: dict[str, Any] | None = None  # run_manifest.json's harness_surface
    plan: dict[str, Any] | None = None  # summary.json's config echo ("grid")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def load_run(path: str | Path) -> RunDir:
    run = Path(path)
    if not run.is_dir():
        raise GapError(f"{path}: not a directory; give a run dir (<output_dir>/<YYYYMMDD_HHMMSS>)")
    results = scan_results(run)
    if not results:
        raise GapError(
            f"{path}: no trial records (result.json) in it; give a run dir "
            "(<output_dir>/<YYYYMMDD_HHMMSS>) of a session that ran trials"
        )
    stamps = sorted({s for s in map(stamp_of, results) if s})
    if stamps:
        raise GapError(
            f"{path}: an output dir holding run dirs ({_first(stamps)}); give one run dir, "
            f"e.g. {run / stamps[-1]}"
        )
    summary = _read_json(run / SUMMARY_JSON) or {}
    labels = {
        base_row(c["row"]): c["row"]
        for c in summary.get("cells", [])
        if isinstance(c, dict) and isinstance(c.get("row"), str)
    }
    surface = (_read_json(run / MANIFEST) or {}).get("harness_surface")
    plan = summary.get("grid")
    return RunDir(
        path=str(path),
        results=results,
        labels=labels,
        surface=surface if isinstance(surface, dict) else None,
        plan=plan if isinstance(plan, dict) else None,
    )


# -- sides and pairs ----------------------------------------------------------------------------
def base_row(label: str) -> str:
    """A row label without its `[privileged]` mark: what a record's mode and policy id say."""
    return label.strip().removesuffix(PRIVILEGED).strip()


def row_of(result: TrialResult) -> str:
    return f"{result.mode}@{result.policy_id}" if result.policy_id else result.mode


class Side(BaseModel):
    run: str
    row: str  # as the pivot labels it
    records: list[TrialResult]


def select(run: RunDir, row: str | None, flag: str) -> Side:
    """The records of one row of `run`; `row` None picks the run's only row."""
    rows = list(dict.fromkeys(row_of(r) for r in run.results.values()))
    shown = ", ".join(run.labels.get(r, r) for r in rows)
    if row is None:
        if len(rows) > 1:
            raise GapError(f"{run.path} has rows {shown}: choose one with {flag} ROW")
        wanted = rows[0]
    else:
        wanted = base_row(row)
        if wanted not in rows:
            raise GapError(f"{flag} {row}: {run.path} has no such row (rows: {shown})")
    records = [r for r in run.results.values() if row_of(r) == wanted]
    return Side(run=run.path, row=run.labels.get(wanted, wanted), records=records)


Key = tuple[str | None, str, str, int, int]


class Pair(BaseModel):
    key: Key
    a: TrialResult
    b: TrialResult

    @property
    def cell(self) -> str:
        return f"{self.key[1]}/{self.key[2]}"

    @property
    def task(self) -> tuple:
        """The bootstrap's cluster: one task of one backend's family/variation."""
        return self.key[:4]

    @property
    def where(self) -> str:
        return f"{self.cell} task {self.key[3]} seed {self.key[4]}"

    @property
    def excluded(self) -> bool:
        return self.a.errored or self.b.errored


class Pairing(BaseModel):
    pairs: list[Pair]
    only_a: int
    only_b: int
    without_backend: bool  # a record did not name its backend: paired without it
    duplicates: list[str]  # a side with two records of one episode


def _keys(records: list[TrialResult], with_backend: bool) -> tuple[dict, list[Key]]:
    found: dict[Key, TrialResult] = {}
    twice: list[Key] = []
    for r in records:
        key = (r.backend if with_backend else None, r.family, r.variation, r.task_id, r.seed)
        if key in found:
            twice.append(key)
        found[key] = r
    return found, twice


def pair(a: Side, b: Side) -> Pairing:
    """Pair the two sides' trials by (backend, family, variation, task, seed). The backend is
    left out of the key when a record does not name it (records written before it was kept).
    In the pair list, cells keep the order A recorded them in; tasks and seeds are sorted."""
    with_backend = all(r.backend for r in [*a.records, *b.records])
    ka, twice_a = _keys(a.records, with_backend)
    kb, twice_b = _keys(b.records, with_backend)
    duplicates = [
        f"{side.row} in {side.run}: {k[1]}/{k[2]} task {k[3]} seed {k[4]}"
        for side, twice in ((a, twice_a), (b, twice_b))
        for k in twice
    ]
    cells = list(dict.fromkeys(k[:3] for k in ka))
    shared = sorted(set(ka) & set(kb), key=lambda k: (cells.index(k[:3]), k[3], k[4]))
    return Pairing(
        pairs=[Pair(key=k, a=ka[k], b=kb[k]) for k in shared],
        only_a=len(set(ka) - set(kb)),
        only_b=len(set(kb) - set(ka)),
        without_backend=not with_backend,
        duplicates=duplicates,
    )


# -- refusals -----------------------------------------------------------------------------------
def _short(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12]


def _pairs(n: int) -> str:
    return f"{n} pair" if n == 1 else f"{n} pairs"


def _first(items: Sequence[str], n: int = 3) -> str:
    more = f" and {len(items) - n} more" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def surface_changes(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str | None:
    """What differs between two run_manifest.json harness surfaces ({digest, files, packages}):
    changed, added and removed files, then package versions; None when either is missing."""
    if not a or not b:
        return None
    changes = []
    files_a, files_b = a.get("files") or {}, b.get("files") or {}
    for path in sorted(set(files_a) | set(files_b)):
        if path not in files_b:
            changes.append(f"{path} (only in A)")
        elif path not in files_a:
            changes.append(f"{path} (only in B)")
        elif files_a[path] != files_b[path]:
            changes.append(path)
    packages_a, packages_b = a.get("packages") or {}, b.get("packages") or {}
    for name in sorted(set(packages_a) | set(packages_b)):
        if packages_a.get(name) != packages_b.get(name):
            changes.append(f"{name} {packages_a.get(name, '-')} -> {packages_b.get(name, '-')}")
    return _first(changes, 6) if changes else "no file or package differs in the manifests"


def _harness_problem(
    pairs: list[Pair], run_a: RunDir, run_b: RunDir | None
) -> tuple[str, str] | None:
    """(which digests differ, what changed) when a pair's two harness surfaces differ."""
    differing = [
        p
        for p in pairs
        if p.a.harness_surface
        and p.b.harness_surface
        and p.a.harness_surface != p.b.harness_surface
    ]
    if not differing:
        return None
    first = differing[0]
    digests = f"A {_short(first.a.harness_surface)}, B {_short(first.b.harness_surface)}"
    if run_b is None:
        changed = "changed files unknown: one run dir keeps one surface (the run was resumed "
        changed += "on other code)"
    else:
        sa, sb = run_a.surface or {}, run_b.surface or {}
        if sa.get("digest") == first.a.harness_surface and sb.get("digest") == (
            first.b.harness_surface
        ):
            changed = f"changed: {surface_changes(sa, sb)}"
        else:
            changed = "changed files unknown: the run manifests do not hold these surfaces"
    return f"{_pairs(len(differing))} ({digests})", changed


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        items: Iterable = tree.items()
    elif isinstance(tree, list) and any(isinstance(v, dict) for v in tree):
        items = enumerate(tree)
    else:
        return {prefix: tree}
    flat: dict[str, Any] = {}
    for key, value in items:
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def paired_plan(plan: dict[str, Any], modes: set[str]) -> dict[str, Any]:
    """The part of a config echo that shapes the paired episodes, as dotted keys.

    Left out: the policy registry and axis (what the two sides compare), the grid's extent
    (families, variations, modes, tasks, seeds: pairing finds the overlap), outputs, recording,
    workers and the gate. `mode_overrides` counts only when both sides ran one mode (`modes`),
    and then only that mode's entry: two modes legitimately run two workflows."""
    flat = {}
    for key, value in _flatten(plan).items():
        parts = key.split(".")
        if parts[0] in _PLAN_IGNORED_TOP or parts[-1] in _PLAN_IGNORED_LEAVES:
            continue
        if parts[:2] == ["benchmark", "mode_overrides"] and (
            len(modes) != 1 or len(parts) < 3 or parts[2] not in modes
        ):
            continue
        flat[key] = value
    return flat


def plan_problems(
    pairs: list[Pair], run_a: RunDir, run_b: RunDir | None
) -> tuple[list[str], list[str]]:
    """(refusals, notes) about the plans the paired records ran under.

    A record's plan_digest hashes its benchmark config without the policies, outputs,
    recording, concurrency and the gate (provenance.plan_digest), but with the grid's extent
    and modes. So:
    - each side's paired records must carry one plan digest (a run resumed with a changed
      config mixes two);
    - two rows of one run: both sides' digest must be the same (they are, unless the run was
      resumed with a changed config);
    - two runs: the same digest means the same plan (e.g. one config run twice, each run
      selecting its policy with -k, or two configs that differ only in their policies). Two
      runs that planned different grids or modes have different digests, so their configs
      (the summary.json echo) are compared on the paired part only (`paired_plan`): a
      difference there is refused, naming the keys.
    """
    sides = {}
    for name, records in (("A", [p.a for p in pairs]), ("B", [p.b for p in pairs])):
        digests = sorted({r.plan_digest for r in records if r.plan_digest})
        if len(digests) > 1:
            return [
                f"plan digest: side {name}'s paired records ran under {len(digests)} plans "
                f"({', '.join(_short(d) for d in digests[:3])}): the run was resumed with a "
                "changed config; rerun that row into a fresh run dir"
            ], []
        sides[name] = digests[0] if digests else None
    if sides["A"] and sides["A"] == sides["B"]:
        return [], []
    if run_b is None:
        if sides["A"] and sides["B"]:
            return [
                f"plan digest differs between the rows (A {_short(sides['A'])}, B "
                f"{_short(sides['B'])}): the run was resumed with a changed config; rerun one "
                "row into a fresh run dir"
            ], []
        return [], []
    if run_a.plan is None or run_b.plan is None:
        if not (sides["A"] and sides["B"]):
            return [], ["plan not checked: a run dir has no summary.json config echo"]
        missing = run_a.path if run_a.plan is None else run_b.path
        return [
            f"plan digest differs (A {_short(sides['A'])}, B {_short(sides['B'])}) and "
            f"{missing} has no summary.json to say where; rerun it to completion"
        ], []
    modes = {p.a.mode for p in pairs} | {p.b.mode for p in pairs}
    flat_a, flat_b = paired_plan(run_a.plan, modes), paired_plan(run_b.plan, modes)
    differ = [
        f"{k}: {flat_a.get(k, '(unset)')!r} vs {flat_b.get(k, '(unset)')!r}"
        for k in sorted(set(flat_a) | set(flat_b))
        if flat_a.get(k, "(unset)") != flat_b.get(k, "(unset)")
    ]
    if differ:
        return [
            f"plan differs on the paired part ({_first(differ)}): run both sides from one "
            "config (list both policies, or select each with -k)"
        ], []
    if not (sides["A"] and sides["B"]):
        return [], []
    return [], [
        "the two runs' plans differ only in what is compared (policies, modes) or in the "
        "grid's extent; the paired part is the same"
    ]


_PROVENANCE = (
    "backend",
    "init_state_digest",
    "scene_digest",
    "harness_surface",
    "plan_digest",
    "policy_url",
)


def refusals(
    pairing: Pairing,
    run_a: RunDir,
    run_b: RunDir | None,
    *,
    allow_harness_mismatch: bool = False,
) -> tuple[list[str], list[str]]:
    """(reasons the comparison cannot be made, notes for the output); pure."""
    reasons: list[str] = []
    notes: list[str] = []
    if pairing.duplicates:
        reasons.append(
            f"a row holds two records of one episode ({_first(pairing.duplicates)}): a suites "
            "config that lists one suite twice; compare those entries as two runs"
        )
    pairs = pairing.pairs
    if not pairs:
        reasons.append(
            "no paired trials: the sides share no (backend, family, variation, task, seed); "
            "compare rows that ran the same tasks and seeds"
        )
        return reasons, notes
    if all(p.excluded for p in pairs):
        reasons.append(
            f"no scored pair: each of the {_pairs(len(pairs))} has an errored trial; fix the "
            "errors (the trials' result.json say why) and rerun with --gap-resume"
        )
    init = [
        p
        for p in pairs
        if p.a.init_state_digest
        and p.b.init_state_digest
        and p.a.init_state_digest != p.b.init_state_digest
    ]
    if init:
        reasons.append(
            f"init states differ for {_pairs(len(init))} ({_first([p.where for p in init])}): "
            "the sides did not run the same episodes; compare runs made with the same "
            "simulator packages and init-state files"
        )
    scene = [
        p
        for p in pairs
        if p.a.scene_digest and p.b.scene_digest and p.a.scene_digest != p.b.scene_digest
    ]
    if scene and not init:  # another init state is another scene too: said once, above
        reasons.append(
            f"scenes differ for {_pairs(len(scene))} ({_first([p.where for p in scene])}): the "
            "same seed settled into another scene (the fixtures' places, scene_digest); compare "
            "runs whose harness draws the scene from the seed alone (both recorded a "
            "scene_digest) on one simulator install"
        )
    harness = _harness_problem(pairs, run_a, run_b)
    if harness and allow_harness_mismatch:
        notes.append(f"harness_surface differs for {harness[0]}, allowed: {harness[1]}")
    elif harness:
        reasons.append(
            f"harness_surface differs for {harness[0]}; {harness[1]}: rerun both sides on one "
            "checkout, or read the changes and pass --allow-harness-mismatch"
        )
    plan_reasons, plan_notes = plan_problems(pairs, run_a, run_b)
    reasons += plan_reasons
    notes += plan_notes
    shared = [p for p in pairs if p.a.policy_url and p.a.policy_url == p.b.policy_url]
    # One url may serve two checkpoints at different times (a loopback port reused between
    # runs); the servers' own digests tell them apart. Equal or unrecorded digests cannot.
    told_apart = [
        p
        for p in shared
        if p.a.policy_digest and p.b.policy_digest and p.a.policy_digest != p.b.policy_digest
    ]
    same = sorted({p.a.policy_url for p in shared if p not in told_apart})
    if same:
        reasons.append(
            f"both sides were answered by {_first(same)} with no different policy digest: a "
            "policy compared with itself; serve each side on its own url, or record both runs "
            "with servers that send their metadata"
        )
    elif told_apart:
        notes.append(
            f"both sides used {_first(sorted({p.a.policy_url for p in told_apart}))}, told apart "
            "by their policy digests"
        )
    records = [r for p in pairs if not p.excluded for r in (p.a, p.b)]
    unknown = [
        f
        for f in _PROVENANCE
        # a trial without a policy has no server to name
        if any(getattr(r, f) is None and (f != "policy_url" or r.policy_id) for r in records)
    ]
    if unknown:
        notes.append(
            f"not recorded in some records (written before provenance was kept): "
            f"{', '.join(unknown)}; the checks on them were skipped"
            + (", and trials were paired without the backend" if pairing.without_backend else "")
        )
    return reasons, notes


# -- statistics ---------------------------------------------------------------------------------
def mcnemar_p(a_only: int, b_only: int) -> float:
    """McNemar's exact test, two-sided: the discordant pairs split 50/50 under no difference."""
    if a_only + b_only == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(a_only, a_only + b_only, 0.5).pvalue)


def cluster_interval(
    groups: Sequence[Sequence[float]], confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """Percentile bootstrap interval for the mean of every value in `groups` (here: per-pair
    differences B - A, one group per task), resampling whole tasks; intervals.cluster_bootstrap."""
    return cluster_bootstrap(groups, confidence)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (statsmodels), in the order given."""
    if not pvalues:
        return []
    from statsmodels.stats.multitest import multipletests

    return [float(p) for p in multipletests(list(pvalues), alpha=ALPHA, method="holm")[1]]


Verdict = Literal["B worse", "B better", "n.s.", "-"]


class RowStats(BaseModel):
    """One row of the table: a cell (family/variation), or `pooled` over every pair."""

    cell: str
    n_pairs: int  # scored pairs (neither trial errored)
    n_tasks: int
    a_success: int
    b_success: int
    diff: float | None  # B - A
    ci_low: float | None
    ci_high: float | None
    a_only: int  # discordant: A succeeded, B did not
    b_only: int  # discordant: B succeeded, A did not
    p_value: float | None
    p_holm: float | None = None
    n_excluded: int  # pairs left out: an errored trial on either side
    n_infra: int  # of those, pairs with an infrastructure failure
    verdict: Verdict = "-"


def row_stats(cell: str, pairs: list[Pair]) -> RowStats:
    scored = [p for p in pairs if not p.excluded]
    excluded = [p for p in pairs if p.excluded]
    tasks: dict[tuple, list[float]] = {}
    for p in scored:
        tasks.setdefault(p.task, []).append(float(p.b.success) - float(p.a.success))
    a_only = sum(p.a.success and not p.b.success for p in scored)
    b_only = sum(p.b.success and not p.a.success for p in scored)
    interval = cluster_interval(list(tasks.values()))
    n = len(scored)
    return RowStats(
        cell=cell,
        n_pairs=n,
        n_tasks=len(tasks),
        a_success=sum(p.a.success for p in scored),
        b_success=sum(p.b.success for p in scored),
        diff=(b_only - a_only) / n if n else None,
        ci_low=interval[0] if interval else None,
        ci_high=interval[1] if interval else None,
        a_only=a_only,
        b_only=b_only,
        p_value=mcnemar_p(a_only, b_only) if n else None,
        n_excluded=len(excluded),
        n_infra=sum(p.a.infra_failure or p.b.infra_failure for p in excluded),
    )


def statistics(pairs: list[Pair], alpha: float = ALPHA) -> tuple[list[RowStats], RowStats]:
    """(per-cell rows, pooled row), with Holm-adjusted p-values and verdicts filled."""
    by_cell: dict[tuple, list[Pair]] = {}
    for p in pairs:
        by_cell.setdefault(p.key[:3], []).append(p)
    several = len({backend for backend, _, _ in by_cell}) > 1  # then the label names it
    cells = [
        row_stats(f"{backend}:{found[0].cell}" if several else found[0].cell, found)
        for (backend, _, _), found in by_cell.items()
    ]
    pooled = row_stats("pooled", pairs)
    family = [c for c in cells if c.p_value is not None]
    if len(cells) > 1 and pooled.p_value is not None:
        family.append(pooled)
    for row, adjusted in zip(family, holm([r.p_value for r in family]), strict=True):
        row.p_holm = adjusted
    if len(cells) == 1:
        pooled.p_holm = cells[0].p_holm
    for row in [*cells, pooled]:
        if row.p_holm is None or row.diff is None:
            continue
        if row.p_holm >= alpha or row.diff == 0:
            row.verdict = "n.s."
        else:
            row.verdict = "B worse" if row.diff < 0 else "B better"
    return cells, pooled


# -- the comparison -----------------------------------------------------------------------------
class Comparison(BaseModel):
    a: Side
    b: Side
    alpha: float
    cells: list[RowStats]
    pooled: RowStats
    only_a: int
    only_b: int
    notes: list[str]

    @property
    def worse(self) -> list[RowStats]:
        return [r for r in [*self.cells, self.pooled] if r.verdict == "B worse"]

    @property
    def exit_code(self) -> int:
        return 1 if self.worse else 0

    def verdict(self) -> str:
        if self.worse:
            where = ", ".join(f"{r.cell} (p_holm={r.p_holm:.3g})" for r in self.worse)
            return f"B is significantly worse than A (Holm, alpha {self.alpha}): {where}"
        return f"B is not significantly worse than A anywhere (Holm, alpha {self.alpha})"

    def to_json(self) -> dict[str, Any]:
        return {
            "a": {"run": self.a.run, "row": self.a.row},
            "b": {"run": self.b.run, "row": self.b.row},
            "alpha": self.alpha,
            "cells": [c.model_dump() for c in self.cells],
            "pooled": self.pooled.model_dump(),
            "unpaired": {"a": self.only_a, "b": self.only_b},
            "notes": self.notes,
            "verdict": self.verdict(),
            "exit_code": self.exit_code,
        }


def compare(
    run_a: RunDir,
    run_b: RunDir | None,
    row_a: str | None,
    row_b: str | None,
    *,
    allow_harness_mismatch: bool = False,
    alpha: float = ALPHA,
) -> Comparison:
    """Compare row B with row A: of one run (`run_b` None) or of two. Raises CompareRefused."""
    if run_b is None and (row_a is None or row_b is None):
        raise GapError(
            f"{run_a.path}: comparing two rows of one run needs both --a ROW and --b ROW "
            "(or give two run dirs)"
        )
    a = select(run_a, row_a, "--a")
    b = select(run_b or run_a, row_b, "--b")
    if run_b is None and base_row(a.row) == base_row(b.row):
        raise GapError(f"--a and --b name the same row {a.row}; name two rows of the run")
    pairing = pair(a, b)
    reasons, notes = refusals(pairing, run_a, run_b, allow_harness_mismatch=allow_harness_mismatch)
    if reasons:
        raise CompareRefused(reasons)
    cells, pooled = statistics(pairing.pairs, alpha)
    for name, count in (("A", pairing.only_a), ("B", pairing.only_b)):
        if count:
            other = "B" if name == "A" else "A"
            notes.append(f"{count} trials of {name} have no partner in {other}: not compared")
    for row in [*cells, pooled]:
        if row.n_tasks == 1 and row.n_pairs > 1 and row.cell != "pooled":
            notes.append(f"{row.cell}: one task, so its interval resamples seeds, not tasks")
    return Comparison(
        a=a,
        b=b,
        alpha=alpha,
        cells=cells,
        pooled=pooled,
        only_a=pairing.only_a,
        only_b=pairing.only_b,
        notes=notes,
    )


# -- output -------------------------------------------------------------------------------------
HEADERS = (
    "cell",
    "pairs",
    "A",
    "B",
    "B-A",
    "95% CI (tasks)",
    "A only",
    "B only",
    "p",
    "p Holm",
    "excluded",
    "verdict",
)


def _num(value: float | None, spec: str = "+.3f") -> str:
    return "-" if value is None else format(value, spec)


def _table_row(r: RowStats) -> list[str]:
    interval = "-" if r.ci_low is None else f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}]"
    excluded = f"{r.n_excluded} ({r.n_infra} infra)" if r.n_infra else str(r.n_excluded)
    return [
        r.cell,
        str(r.n_pairs),
        f"{r.a_success}/{r.n_pairs}",
        f"{r.b_success}/{r.n_pairs}",
        _num(r.diff),
        interval,
        str(r.a_only),
        str(r.b_only),
        _num(r.p_value, ".3g"),
        _num(r.p_holm, ".3g"),
        excluded,
        r.verdict,
    ]


def render(comparison: Comparison, markdown: bool = False) -> str:
    """The table with its sides, notes and verdict: for a terminal, or Markdown for a PR."""
    from tabulate import tabulate

    c = comparison
    same_run = c.a.run == c.b.run
    rows = [_table_row(r) for r in [*c.cells, c.pooled]]
    table = tabulate(
        rows, headers=HEADERS, tablefmt="github" if markdown else "simple", disable_numparse=True
    )
    where_b = "same run" if same_run else c.b.run
    if markdown:
        lines = [
            f"**A** `{c.a.row}` ({c.a.run})  ",
            f"**B** `{c.b.row}` ({where_b})",
            "",
            table,
            "",
            *(f"- {note}" for note in c.notes),
            *([""] if c.notes else []),
            f"**{c.verdict()}**",
        ]
    else:
        lines = [
            f"A  {c.a.row}  ({c.a.run})",
            f"B  {c.b.row}  ({where_b})",
            "",
            table,
            "",
            *(f"note: {note}" for note in c.notes),
            c.verdict(),
        ]
    return "\n".join(lines)
