"""The plans two sides ran under, checked on the paired part only: `plan_problems` refuses
paired records whose plans differ where it decides their episodes, and `paired_plan` says
which part of a config echo that is."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pytest_gap.compare.pairing import Pair, RunDir
from pytest_gap.compare.wording import first_few, short_digest

# Config keys that do not decide a paired episode's outcome, or that are what is compared:
# outputs, recording, workers and the gate; the grid's extent (pairing finds the overlap);
# the policy registry and axis (checked on the pairs by URL instead).
_PLAN_IGNORED_LEAVES = frozenset(
    {
        "output_dir",
        "record_video",
        "frames_every",
        "dataset",
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
        "controls",  # adds control arms: the grid's extent
    }
)
_PLAN_IGNORED_TOP = frozenset({"policies", "policy_manager", "gate", "compare"})


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


def paired_plan(
    plan: dict[str, Any], modes: set[str], ignored: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The part of a config echo that shapes the paired episodes, as dotted keys.

    Left out: the policy registry and axis (what the two sides compare), the grid's extent
    (families, variations, modes, tasks, seeds: pairing finds the overlap), outputs, recording,
    workers and the gate, and the leaves named in `ignored`. `mode_overrides` counts only when
    both sides ran one mode (`modes`), and then only that mode's entry: two modes legitimately
    run two workflows."""
    flat = {}
    for key, value in _flatten(plan).items():
        parts = key.split(".")
        if parts[0] in _PLAN_IGNORED_TOP or parts[-1] in _PLAN_IGNORED_LEAVES | ignored:
            continue
        if parts[:2] == ["benchmark", "mode_overrides"] and (
            len(modes) != 1 or len(parts) < 3 or parts[2] not in modes
        ):
            continue
        flat[key] = value
    return flat


def plan_differences(flat_a: dict[str, Any], flat_b: dict[str, Any]) -> list[str]:
    """`key: A's value vs B's value` for each dotted key whose values differ (`(unset)` where a
    side lacks it), in key order."""
    return [
        f"{k}: {flat_a.get(k, '(unset)')!r} vs {flat_b.get(k, '(unset)')!r}"
        for k in sorted(set(flat_a) | set(flat_b))
        if flat_a.get(k, "(unset)") != flat_b.get(k, "(unset)")
    ]


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
                f"({', '.join(short_digest(d) for d in digests[:3])}): the run was resumed with a "
                "changed config; rerun that row into a fresh run dir"
            ], []
        sides[name] = digests[0] if digests else None
    if sides["A"] and sides["A"] == sides["B"]:
        return [], []
    if run_b is None:
        if sides["A"] and sides["B"]:
            return [
                f"plan digest differs between the rows (A {short_digest(sides['A'])}, B "
                f"{short_digest(sides['B'])}): the run was resumed with a changed config; rerun "
                "one row into a fresh run dir"
            ], []
        return [], []
    if run_a.plan is None or run_b.plan is None:
        if not (sides["A"] and sides["B"]):
            return [], ["plan not checked: a run dir has no summary.json config echo"]
        missing = run_a.path if run_a.plan is None else run_b.path
        return [
            f"plan digest differs (A {short_digest(sides['A'])}, B {short_digest(sides['B'])}) and "
            f"{missing} has no summary.json to say where; rerun it to completion"
        ], []
    modes = {p.a.mode for p in pairs} | {p.b.mode for p in pairs}
    flat_a, flat_b = paired_plan(run_a.plan, modes), paired_plan(run_b.plan, modes)
    differ = plan_differences(flat_a, flat_b)
    if differ:
        return [
            f"plan differs on the paired part ({first_few(differ)}): run both sides from one "
            "config (list both policies, or select each with -k)"
        ], []
    if not (sides["A"] and sides["B"]):
        return [], []
    return [], [
        "the two runs' plans differ only in what is compared (policies, modes) or in the "
        "grid's extent; the paired part is the same"
    ]
