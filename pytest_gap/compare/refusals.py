"""Why two sides cannot be compared (refusals, exit 2) and what the output should say about
them (notes): pure checks over the pairs and the run dirs they came from.

Each refusal is one line naming what differs and the fix; all are reported at once (see the
package docstring for the list). Provenance a record does not carry is unknown: its check is
skipped and a note names the missing fields.
"""

from __future__ import annotations

from typing import Any

from pytest_gap.compare.controls import init_state_problems
from pytest_gap.compare.pairing import Pair, Pairing, RunDir
from pytest_gap.compare.plans import plan_problems
from pytest_gap.compare.wording import count_pairs, first_few, short_digest

Problems = tuple[list[str], list[str]]  # (refusals, notes)


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
    return first_few(changes, 6) if changes else "no file or package differs in the manifests"


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
    digests = (
        f"A {short_digest(first.a.harness_surface)}, B {short_digest(first.b.harness_surface)}"
    )
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
    return f"{count_pairs(len(differing))} ({digests})", changed


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
    same_policy_ok: bool = False,
    controls: bool = False,
) -> Problems:
    """(reasons the comparison cannot be made, notes for the output); pure. `same_policy_ok`:
    one server on both sides is no refusal (a baseline gate re-running its own checkpoint).
    `controls`: the pairs are perturbed cells and their declared control arms (controls.py),
    which start from other sim states by design: their init state indices are checked instead
    of the digests, and one policy on both arms is the point."""
    reasons: list[str] = []
    notes: list[str] = []
    if pairing.duplicates:
        reasons.append(
            f"a row holds two records of one episode ({first_few(pairing.duplicates)}): a suites "
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
            f"no scored pair: each of the {count_pairs(len(pairs))} has an errored trial; fix the "
            "errors (the trials' result.json say why) and rerun with --gap-resume"
        )
    for found_reasons, found_notes in (
        (init_state_problems(pairs) if controls else episode_problems(pairs), []),
        _harness_problems(pairs, run_a, run_b, allow_harness_mismatch),
        plan_problems(pairs, run_a, run_b),
        ([], []) if same_policy_ok or controls else _policy_problems(pairs),
        ([], _unrecorded(pairs, pairing.without_backend)),
    ):
        reasons += found_reasons
        notes += found_notes
    return reasons, notes


def episode_problems(pairs: list[Pair]) -> list[str]:
    """Pairs whose two sides did not start from one initial state, or settled into two
    scenes: they ran different episodes."""
    reasons = []
    init = [
        p
        for p in pairs
        if p.a.init_state_digest
        and p.b.init_state_digest
        and p.a.init_state_digest != p.b.init_state_digest
    ]
    if init:
        reasons.append(
            f"init states differ for {count_pairs(len(init))} "
            f"({first_few([p.where for p in init])}): "
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
            f"scenes differ for {count_pairs(len(scene))} ({first_few([p.where for p in scene])}): "
            "the same seed settled into another scene (the fixtures' places, scene_digest); "
            "compare runs whose harness draws the scene from the seed alone (both recorded a "
            "scene_digest) on one simulator install"
        )
    return reasons


def _harness_problems(
    pairs: list[Pair], run_a: RunDir, run_b: RunDir | None, allow_harness_mismatch: bool
) -> Problems:
    """A refusal when paired trials ran on two harness surfaces; a note when that is allowed."""
    harness = _harness_problem(pairs, run_a, run_b)
    if harness and allow_harness_mismatch:
        return [], [f"harness_surface differs for {harness[0]}, allowed: {harness[1]}"]
    if harness:
        return [
            f"harness_surface differs for {harness[0]}; {harness[1]}: rerun both sides on one "
            "checkout, or read the changes and pass --allow-harness-mismatch"
        ], []
    return [], []


def _policy_problems(pairs: list[Pair]) -> Problems:
    """A refusal when one server url answered both sides of a pair with nothing to tell the
    two policies apart: a policy compared with itself."""
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
        return [
            f"both sides were answered by {first_few(same)} with no different policy digest: a "
            "policy compared with itself; serve each side on its own url, or record both runs "
            "with servers that send their metadata"
        ], []
    if told_apart:
        return [], [
            f"both sides used {first_few(sorted({p.a.policy_url for p in told_apart}))}, told "
            "apart by their policy digests"
        ]
    return [], []


def _unrecorded(pairs: list[Pair], without_backend: bool) -> list[str]:
    """A note naming the provenance fields some scored records lack (their checks skipped)."""
    records = [r for p in pairs if not p.excluded for r in (p.a, p.b)]
    unknown = [
        f
        for f in _PROVENANCE
        # a trial without a policy has no server to name
        if any(getattr(r, f) is None and (f != "policy_url" or r.policy_id) for r in records)
    ]
    if not unknown:
        return []
    return [
        f"not recorded in some records (written before provenance was kept): "
        f"{', '.join(unknown)}; the checks on them were skipped"
        + (", and trials were paired without the backend" if without_backend else "")
    ]
