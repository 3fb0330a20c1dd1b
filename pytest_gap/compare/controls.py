"""`gap compare --controls`: each perturbed cell of B against its declared control arm in A
(a family's `control`, sim/backend.py `declared_control`), paired by (task, seed).

Two arms of a declared control pair run different initial sim states by design (the
perturbation moved the scene), so the init-state and scene digests are not compared; what must
hold instead is that both started from the same init state of the suite (the records'
`init_state` index) and that the pair is declared: any other two cells stay unpaired.
"""

from __future__ import annotations

from pytest_gap.compare.pairing import Key, Pair, Pairing, Side, episode_keys
from pytest_gap.compare.wording import count_pairs, first_few
from pytest_gap.errors import GapError, SimInputError
from pytest_gap.results import TrialResult

DEFAULT_BACKEND = "libero"  # records written before the backend was kept ran on LIBERO


def declared_controls(records: list[TrialResult]) -> dict[tuple[str, str, str], tuple[str, str]]:
    """(backend, family, variation) of `records` -> its declared control (family, variation),
    for the cells that declare one."""
    from pytest_gap.sim.backend import declared_control, get_backend

    found = {}
    for backend_name, family, variation in {
        (r.backend or DEFAULT_BACKEND, r.family, r.variation) for r in records
    }:
        try:
            control = declared_control(get_backend(backend_name), family, variation)
        except SimInputError as exc:
            raise GapError(
                f"--controls: cannot read the control arm {family}/{variation} declares: {exc}"
            ) from None
        if control is not None:
            found[(backend_name, family, variation)] = control
    return found


def control_pairing(a: Side, b: Side) -> tuple[Pairing, list[str]]:
    """(B's perturbed trials paired with A's control arms, refusals). A pair's key is B's
    episode; one control trial may pair with several perturbed cells (posvar's four
    variations share libero/object)."""
    declared = declared_controls(b.records)
    if not declared:
        cells = first_few(sorted({f"{r.family}/{r.variation}" for r in b.records}))
        return Pairing(pairs=[], only_a=0, only_b=0, without_backend=False, duplicates=[]), [
            f"--controls: no cell of B ({cells}) declares a control arm (`gap families` lists "
            "the families; posvar and LIBERO-PRO's position, object, swap and language "
            "variants do)"
        ]
    control_records, twice_keys = episode_keys(a.records, with_backend=True)
    twice = [f"{a.row} in {a.run}: {k[1]}/{k[2]} task {k[3]} seed {k[4]}" for k in twice_keys]
    pairs: list[Pair] = []
    used: set[Key] = set()
    only_b = 0
    for r in b.records:
        control = declared.get((r.backend or DEFAULT_BACKEND, r.family, r.variation))
        if control is None:
            continue
        key = (r.backend, *control, r.task_id, r.seed)
        if key in control_records:
            used.add(key)
            own = (r.backend, r.family, r.variation, r.task_id, r.seed)
            pairs.append(Pair(key=own, a=control_records[key], b=r))
        else:
            only_b += 1
    controls = set(declared.values())
    only_a = sum(1 for k in control_records if k[1:3] in controls and k not in used)
    pairs.sort(key=lambda p: (p.key[1], p.key[2], p.key[3], p.key[4]))
    pairing = Pairing(
        pairs=pairs, only_a=only_a, only_b=only_b, without_backend=False, duplicates=twice
    )
    if not pairs:
        wanted = first_few(sorted({f"{f}/{v}" for f, v in declared.values()}))
        return pairing, [
            f"--controls: A ({a.row} in {a.run}) holds no trial of the control arms B's cells "
            f"declare ({wanted}) with B's tasks and seeds; run them (benchmark.controls: true)"
        ]
    return pairing, []


def init_state_problems(pairs: list[Pair]) -> list[str]:
    """Pairs whose two arms started from different init states of their suites: not the same
    episode, perturbed and not."""
    differ = [
        p
        for p in pairs
        if p.a.init_state is not None
        and p.b.init_state is not None
        and p.a.init_state != p.b.init_state
    ]
    if not differ:
        return []
    return [
        f"init state index differs for {count_pairs(len(differ))} "
        f"({first_few([f'{p.where}: {p.a.init_state} vs {p.b.init_state}' for p in differ])}): "
        "the control arm did not start where its perturbation started; the two suites ship "
        "different numbers of init states, so compare seeds below the smaller count"
    ]
