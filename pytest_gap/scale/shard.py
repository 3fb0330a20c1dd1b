"""`--gap-shard K/N`: the K-th of N disjoint, cost-balanced parts of a session's planned trials.

Every machine of a job array runs the same command with its own K and must agree on who runs
what without talking to the others, so a shard is a pure function of the plan (the trials of
the session's configs, in plan order) and K/N: nothing that differs between machines (the
environment, a service found down, a clock, -k) enters it. The union of shards 1..N is the plan
and no trial is in two of them.

Balance is by expected cost, not count: a trial costs about its step limit (the suite's, or
its family's for that task) times what a step costs in its mode, so 50 policy_only trials of
libero_10 (520 steps, a render and an inference per step) are not 50 workflow trials of
libero_object (280 scripted steps). The unit of assignment is a (cell, task) group: its seeds
share one produced workflow (an LLM mode writes it once per task) and one env in the process's
pool, so a shard keeps them together; a group is split, into runs of consecutive seeds, only
when it alone costs more than a shard's share.
Groups are packed greedily, longest first, each onto the least-loaded shard (LPT scheduling:
within 4/3 of the best possible makespan), equal ones in a fixed pseudo-random order.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from functools import cache

from pydantic import BaseModel, ConfigDict

from pytest_gap import ids
from pytest_gap.cells import Cell, Trial
from pytest_gap.errors import GapError

# Costs in units of one control step with no camera rendered (88-115 per second measured on
# LIBERO; reference/environment.md "Costs").
RESET_COST = 300.0  # env reset + settle per trial: 2.5-3 s measured
POLICY_STEP = 3.0  # a policy in the loop renders its cameras and waits on inference every step:
# policy_only with `hold` ran 280 steps in 9-10 s, about 3x a render-free step
LLM_GROUP_COST = 3000.0  # a mode whose producer calls the LLM writes each task's workflow once:
# tens of seconds of generation, paid by the group (its seeds reuse the workflow)


class ShardSpec(BaseModel):
    """K/N: this is shard `index` (1-based) of `count`."""

    model_config = ConfigDict(frozen=True)

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


SHARD_HINT = "expected K/N with whole numbers 1 <= K <= N, e.g. --gap-shard 2/4"


def parse_shard(raw: str) -> ShardSpec:
    """`raw` as K/N, or a GapError naming the option and the fix."""
    k, sep, n = raw.strip().partition("/")
    try:
        index, count = int(k), int(n)
    except ValueError:
        index = count = 0
    if not sep or not (1 <= index <= count):
        raise GapError(f"--gap-shard {raw!r}: {SHARD_HINT}")
    return ShardSpec(index=index, count=count)


@cache
def _step_limit(backend: str, family: str, variation: str, suite: str, task_id: int) -> int:
    """The task's episode step limit: its family's `step_limit` where it has one (a family that
    lengthens some tasks' episodes, e.g. grocery packing, 280 steps per item), else the
    suite's protocol limit."""
    from pytest_gap.sim.backend import get_backend

    found = get_backend(backend)
    limit = getattr(found.families().get(family), "step_limit", None)
    return (limit(variation, task_id) if limit else None) or found.max_steps(suite)


def trial_cost(cell: Cell, task_id: int) -> float:
    """Expected cost of one trial of `cell`'s task `task_id`: a reset, then up to its step limit
    (the config's trials.max_steps, else the task's) at its mode's cost per step. Read from the
    cell's plan fields only (never `error`, which depends on the machine's environment)."""
    steps = cell.max_steps or _step_limit(
        cell.backend, cell.family, cell.variation, cell.suite, task_id
    )
    per_step = POLICY_STEP if cell.policy_id else 1.0
    return RESET_COST + steps * per_step


class Piece(BaseModel):
    """Consecutive trials of one (cell, task) group: the unit a shard is given."""

    model_config = ConfigDict(frozen=True)

    order: int  # the group's place in the plan
    trials: tuple[str, ...]  # trial keys (`plan_key`: the trial's node id)
    cost: float
    once: float = 0.0  # the group's own cost, paid again by each piece of a split group


def pieces(groups: Sequence[tuple[Sequence[str], float, float]], count: int) -> list[Piece]:
    """Each group (trial keys, cost per trial, cost per group) as one piece, or split into the
    fewest runs of consecutive trials that each cost at most a shard's share; then, while there
    are fewer pieces than shards, the costliest piece of several trials is halved (so no shard
    is left empty when the plan has a trial for each)."""
    total = sum(len(keys) * each + once for keys, each, once in groups)
    share = total / count if count else 0.0
    found = []
    for order, (keys, each, once) in enumerate(groups):
        cost = len(keys) * each + once
        parts = min(len(keys), math.ceil(cost / share)) if share > 0 and cost > share else 1
        found += _split(order, list(keys), each, once, parts)
    while len(found) < count:
        splittable = [p for p in found if len(p.trials) > 1]
        if not splittable:
            break
        biggest = max(splittable, key=lambda p: (p.cost, -p.order))
        at = found.index(biggest)
        each = (biggest.cost - biggest.once) / len(biggest.trials)
        found[at : at + 1] = _split(biggest.order, list(biggest.trials), each, biggest.once, 2)
    return found


def _split(order: int, keys: list[str], each: float, once: float, parts: int) -> list[Piece]:
    """`keys` as `parts` runs of consecutive trials, as even in size as they can be."""
    size, extra = divmod(len(keys), parts)
    found, start = [], 0
    for i in range(parts):
        chunk = tuple(keys[start : start + size + (i < extra)])
        start += len(chunk)
        found.append(Piece(order=order, trials=chunk, cost=len(chunk) * each + once, once=once))
    return found


def pack(found: Iterable[Piece], count: int) -> list[list[Piece]]:
    """Longest first, each onto the least-loaded shard (the lowest index on a tie). Pieces of
    equal cost go in the order of a digest of their first trial, not plan order: plan order
    alternates tasks, and dealing equal groups out in it would give shard 1 every task 0 and
    shard 2 every task 1 (tasks differ in what a cost model cannot see); the digest is the same
    on every machine, as Python's salted hash() is not."""
    shards: list[list[Piece]] = [[] for _ in range(count)]
    loads = [0.0] * count
    for piece in sorted(found, key=lambda p: (-p.cost, _digest(p.trials[0]), p.trials)):
        target = min(range(count), key=lambda i: (loads[i], i))
        shards[target].append(piece)
        loads[target] += piece.cost
    return shards


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def plan_groups(
    plans: Sequence[tuple[str, Sequence[Cell]]],
) -> list[tuple[list[str], float, float]]:
    """The (cell, task) groups of every config's cells, in plan order, each with its trials'
    keys (`<config label>::<trial id>`), the cost of one trial and the group's own cost."""
    groups = []
    for label, cells in plans:
        for cell in cells:
            once = LLM_GROUP_COST if cell.uses_llm else 0.0
            for task_id in cell.task_ids:
                each = trial_cost(cell, task_id)
                keys = [
                    plan_key(label, Trial(cell=cell, task_id=task_id, seed=s)) for s in cell.seeds
                ]
                groups.append((keys, each, once))
    return groups


def plan_key(label: str, trial: Trial) -> str:
    """A trial's key in a session's plan: its node id when `label` is its YAML's node id."""
    return ids.node_id(label, trial.id)


class Shards(BaseModel):
    """The plan cut into `count` shards: each shard's trial keys and expected cost."""

    keys: list[list[str]]
    costs: list[float]

    def of(self, spec: ShardSpec) -> set[str]:
        return set(self.keys[spec.index - 1])


def shard_plan(plans: Sequence[tuple[str, Sequence[Cell]]], count: int) -> Shards:
    """Cut the plan of a session (each config's label, the same on every machine, e.g. its path
    relative to the rootdir, with its planned cells) into `count` shards."""
    packed = pack(pieces(plan_groups(sorted(plans, key=lambda p: p[0])), count), count)
    return Shards(
        keys=[[key for piece in shard for key in piece.trials] for shard in packed],
        costs=[round(sum(piece.cost for piece in shard), 1) for shard in packed],
    )


def too_many_shards(spec: ShardSpec, n_trials: int) -> str | None:
    """Why `spec` cannot cut a plan of `n_trials` (a shard would get no trial), or None."""
    if spec.count > n_trials:
        return (
            f"--gap-shard {spec}: the session plans {n_trials} trial"
            f"{'s' if n_trials != 1 else ''}, fewer than {spec.count} shards; use at most "
            f"{n_trials}"
        )
    return None
