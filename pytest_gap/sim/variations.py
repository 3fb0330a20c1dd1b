"""The benchmark's families and variations, and the scene perturbations they generate.

A variation is resolved from (family, variation) to a LIBERO suite plus, for generated
families, a perturbation of each episode's initial layout. Perturbations are pure functions of
(family, variation, task, seed) and the init state's layout, drawn from a SHA-256-seeded RNG,
so every process, mode and cell sees the same scene for the same seed. Objects are only moved
in the table plane; each keeps its own height and orientation, so it rests where it rested.

Every generated layout is checked before it is used, and redrawn (deterministically) otherwise:
- no two objects' footprints (collision-geometry bounding boxes) come closer than 1 cm;
- every moved object's centre is within the arm's reach: between REACH_RADII of the robot
  base in the table plane and at most REACH_HALF_WIDTH to either side (measured: the gripper
  reaches such points pointing down, from 1.5 cm above the table to 25 cm);
- no target is hidden: the sight line from the front (agentview) camera to the top of each
  target crosses no other object's bounding box (objects stand on the table, at z = 0 in
  libero_object scenes).
Layouts are read from the simulator rounded to 0.1 mm, so last-digit float differences between
machines cannot change which cells or permutations pass.

Families (base scenes: the 10 libero_object tasks, task numbering as libero_object):
- posvar/pos_var: the container moves to one cell of a 20x20 grid over GRID_RECT; the seed
  picks among the cells whose layout passes the checks.
- posvar/permutation: the non-container objects' positions are permuted (never the identity).
- posvar/basket_swap: the container and one other object exchange places.
- posvar/all: objects permuted, then the container exchanges places with one object, then the
  container moves to a grid cell.
- grocery_packing/object: "pack N listed items into the basket", N = 2 + task % 4; the seed
  picks which N of the scene's items; success when all are in the basket, completion the
  delivered fraction; the step limit is libero_object's 280 per listed item.
- grocery_packing/permutation: as object, and the items' positions are permuted too.
- libero/<suite> (spatial, object, goal, 10, 90) and libero_pro/<variant> (every LIBERO-PRO
  suite the package ships, e.g. object_swap, goal_lan, object_temp_x0.3): the package's own
  suites, unchanged.
"""

from __future__ import annotations

import hashlib
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from pytest_gap.errors import SimInputError, VariationError
from pytest_gap.sim import backend
from pytest_gap.sim.suites import (
    CLASSIC_SUITES,
    MAX_STEPS_BY_BASE,
    TaskSpec,
    get_suite,
    list_suites,
)

# Container-centre grid for pos_var, world frame: x from the row of LIBERO's object regions
# nearest the robot (ROBOT_BASE_XY) to the farthest, y across the table.
GRID_RECT = (-0.25, 0.10, -0.28, 0.28)  # x_min, x_max, y_min, y_max
GRID_SIZE = 20
# Where a moved object's centre may go (the tests drive the gripper to this boundary).
ROBOT_BASE_XY = (-0.6, 0.0)
REACH_RADII = (0.30, 0.76)
REACH_HALF_WIDTH = 0.30
CLEARANCE = 0.01
MAX_DRAWS = 500

GENERATED_BASE_SUITE = "libero_object"


class Footprint(BaseModel):
    """An object's table-plane footprint: bounding box corners relative to its centre."""

    model_config = ConfigDict(frozen=True)

    name: str
    category: str
    xy: tuple[float, float]
    lo: tuple[float, float]
    hi: tuple[float, float]
    height: float


class SceneLayout(BaseModel):
    model_config = ConfigDict(frozen=True)

    objects: dict[str, Footprint]
    container: str
    camera: tuple[float, float, float]

    @classmethod
    def from_scene(cls, scene, container: str) -> SceneLayout:
        def mm(values) -> tuple[float, ...]:
            return tuple(round(float(v), 4) for v in values)

        objects = {}
        for obj in scene.objects(include_fixtures=False):
            pos = scene.pose(obj.name).pos
            lo, hi = scene.world_aabb(obj.name)
            objects[obj.name] = Footprint(
                name=obj.name,
                category=obj.category,
                xy=mm(pos[:2]),
                lo=mm(lo[:2] - pos[:2]),
                hi=mm(hi[:2] - pos[:2]),
                height=mm([hi[2] - lo[2]])[0],
            )
        cam = mm(scene.camera_position("agentview"))
        return cls(objects=objects, container=container, camera=cam)

    @property
    def items(self) -> list[str]:
        return [n for n in self.objects if n != self.container]


class Perturbation(BaseModel):
    model_config = ConfigDict(frozen=True)

    family: str
    variation: str
    task_id: int
    seed: int
    moves: dict[str, tuple[float, float]]
    goal: tuple[tuple[str, ...], ...] | None = None
    prompt: str | None = None
    max_steps: int | None = None  # None = the suite's protocol value
    details: dict[str, Any] = {}


# -- validity -----------------------------------------------------------------------------------
def in_reach(x: float, y: float) -> bool:
    r = np.hypot(x - ROBOT_BASE_XY[0], y - ROBOT_BASE_XY[1])
    return REACH_RADII[0] <= r <= REACH_RADII[1] and abs(y) <= REACH_HALF_WIDTH


def _box(fp: Footprint, xy) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(xy, float)
    return c + fp.lo, c + fp.hi


def _segment_hits_box(p0, p1, lo, hi) -> bool:
    """Slab test: does the segment p0->p1 pass through the axis-aligned box [lo, hi]?"""
    t0, t1 = 0.0, 1.0
    d = p1 - p0
    for axis in range(3):
        if abs(d[axis]) < 1e-12:
            if not lo[axis] <= p0[axis] <= hi[axis]:
                return False
            continue
        a, b = (lo[axis] - p0[axis]) / d[axis], (hi[axis] - p0[axis]) / d[axis]
        t0, t1 = max(t0, min(a, b)), min(t1, max(a, b))
        if t0 > t1:
            return False
    return True


def layout_problems(
    layout: SceneLayout, positions: dict[str, tuple[float, float]], targets: list[str]
) -> list[str]:
    """Why a layout (object -> centre xy) is not valid; empty when it is."""
    problems = []
    boxes = {n: _box(layout.objects[n], xy) for n, xy in positions.items()}
    for a, b in itertools.combinations(positions, 2):
        (alo, ahi), (blo, bhi) = boxes[a], boxes[b]
        gap = np.maximum(blo - ahi, alo - bhi)
        if np.all(gap < CLEARANCE):
            problems.append(f"{a} overlaps {b}")
    for name, (x, y) in positions.items():
        if positions[name] != layout.objects[name].xy and not in_reach(x, y):
            problems.append(f"{name} out of reach at ({x:.3f}, {y:.3f})")
    cam = np.asarray(layout.camera)
    for target in targets:
        fp = layout.objects[target]
        top = np.array([*positions[target], 0.9 * fp.height])
        for other, (lo, hi) in boxes.items():
            if other == target:
                continue
            h = layout.objects[other].height
            if _segment_hits_box(cam, top, np.array([*lo, 0.0]), np.array([*hi, h])):
                problems.append(f"{target} hidden behind {other}")
    return problems


# -- generators ---------------------------------------------------------------------------------
def grid_cells() -> list[tuple[int, int, float, float]]:
    """(row, col, x, y) of every pos_var cell centre."""
    x0, x1, y0, y1 = GRID_RECT
    dx, dy = (x1 - x0) / GRID_SIZE, (y1 - y0) / GRID_SIZE
    return [
        (i, j, x0 + (i + 0.5) * dx, y0 + (j + 0.5) * dy)
        for i in range(GRID_SIZE)
        for j in range(GRID_SIZE)
    ]


def _permute(rng, names, positions):
    """A non-identity permutation of `names`' positions."""
    order = rng.permutation(len(names))
    while len(names) > 1 and np.all(order == np.arange(len(names))):
        order = rng.permutation(len(names))
    moved = dict(positions)
    for src, dst in zip(names, order, strict=True):
        moved[src] = positions[names[dst]]
    return moved, {n: names[d] for n, d in zip(names, order, strict=True)}


def _valid_cells(layout, positions, targets):
    cont = layout.container
    cells = []
    for i, j, x, y in grid_cells():
        trial = dict(positions, **{cont: (x, y)})
        if not layout_problems(layout, trial, targets):
            cells.append((i, j, x, y))
    return cells


def _draw(layout: SceneLayout, kind: str, rng, targets: list[str]):
    """One valid layout for a posvar-like kind; returns (positions, details), or None."""
    base = {n: fp.xy for n, fp in layout.objects.items()}
    cont = layout.container
    items = layout.items
    for _ in range(MAX_DRAWS):
        positions, details = dict(base), {}
        if kind in ("permutation", "all"):
            positions, mapping = _permute(rng, items, positions)
            details["permutation"] = mapping  # object -> the object whose place it took
        if kind in ("basket_swap", "all"):
            partner = items[int(rng.integers(len(items)))]
            positions[cont], positions[partner] = positions[partner], positions[cont]
            details["swapped_with"] = partner
        if kind in ("pos_var", "all"):
            cells = _valid_cells(layout, positions, targets)
            if not cells:
                if kind == "pos_var":
                    return None  # nothing else is random: another draw cannot help
                continue
            i, j, x, y = cells[int(rng.integers(len(cells)))]
            positions[cont] = (x, y)
            details["grid_cell"] = [i, j]
        if not layout_problems(layout, positions, targets):
            return positions, details
    return None


def _stable_rng(*key: object) -> np.random.Generator:
    digest = hashlib.sha256("/".join(map(str, key)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _spoken(category: str) -> str:
    return category.replace("_", " ")


def _grocery_prompt(layout: SceneLayout, items: list[str]) -> str:
    names = [f"the {_spoken(layout.objects[i].category)}" for i in items]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"pack {listed} into the {_spoken(layout.objects[layout.container].category)}"


# -- families -----------------------------------------------------------------------------------
class EpisodePlan(BaseModel):
    """What a generated family asks of one episode, before its layout is drawn."""

    targets: list[str]  # the objects that must stay visible and reachable
    kind: str | None  # the posvar-like layout change to draw (None: the init layout)
    goal: tuple[tuple[str, ...], ...] | None = None  # None = the task's own
    prompt: str | None = None
    max_steps: int | None = None


class GeneratedFamily(ABC):
    """A family whose variations perturb each episode of the libero_object scenes per seed."""

    name: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]]

    def variations(self) -> list[str]:
        return list(self.kinds)

    def resolve(self, variation: str) -> Variation:
        return Variation(family=self.name, variation=variation, suite=GENERATED_BASE_SUITE)

    def control(self, variation: str) -> tuple[str, str] | None:
        """The unperturbed arm of `variation` (backend.Family.control); none by default."""
        return None

    @abstractmethod
    def plan(
        self, variation: str, task_id: int, rng, layout: SceneLayout, goal: list[tuple[str, ...]]
    ) -> EpisodePlan:
        """Targets, layout change and task changes for one episode; draws from `rng` only."""


class PosVar(GeneratedFamily):
    """The container moves, objects are permuted or swapped; the task stays the same."""

    name = "posvar"
    kinds = ("pos_var", "permutation", "basket_swap", "all")

    def plan(self, variation, task_id, rng, layout, goal) -> EpisodePlan:
        return EpisodePlan(targets=[p[1] for p in goal if p[0] == "in"], kind=variation)

    def control(self, variation: str) -> tuple[str, str]:
        """The same scene before it is moved: seed s of the base suite is the init state and
        jitter posvar perturbs, so libero/object's trials pair with these by (task, seed)."""
        return "libero", GENERATED_BASE_SUITE.removeprefix("libero_")


class GroceryPacking(GeneratedFamily):
    """Pack N = 2 + task % 4 listed items (picked by the seed) into the container."""

    name = "grocery_packing"
    kinds = ("object", "permutation")

    @staticmethod
    def n_items(task_id: int) -> int:
        return 2 + task_id % 4

    def step_limit(self, variation: str, task_id: int) -> int:
        """A task's episodes may take the base suite's limit once per item (known before any
        layout is drawn: `--gap-shard` costs trials with it)."""
        return MAX_STEPS_BY_BASE[GENERATED_BASE_SUITE] * self.n_items(task_id)

    def plan(self, variation, task_id, rng, layout, goal) -> EpisodePlan:
        n_items = self.n_items(task_id)
        picked = rng.choice(len(layout.items), size=n_items, replace=False)
        targets = [layout.items[int(i)] for i in sorted(picked)]
        region = f"{layout.container}_contain_region"
        return EpisodePlan(
            targets=targets,
            kind="permutation" if variation == "permutation" else None,
            goal=tuple(("in", t, region) for t in targets),
            prompt=_grocery_prompt(layout, targets),
            max_steps=self.step_limit(variation, task_id),
        )


class SuiteFamily:
    """A family whose variations are the package's own suites, unchanged (`libero_<variation>`)."""

    def __init__(
        self,
        name: str,
        variations: Callable[[], list[str]],
        control: Callable[[str], tuple[str, str] | None] = lambda variation: None,
    ):
        self.name = name
        self._variations = variations
        self._control = control

    def variations(self) -> list[str]:
        return self._variations()

    def resolve(self, variation: str) -> Variation:
        return Variation(family=self.name, variation=variation, suite=f"libero_{variation}")

    def control(self, variation: str) -> tuple[str, str] | None:
        return self._control(variation)


def libero_pro_variants() -> list[str]:
    return [s.removeprefix("libero_") for s in list_suites() if s not in CLASSIC_SUITES]


def libero_pro_control(variation: str) -> tuple[str, str] | None:
    """A LIBERO-PRO suite's unperturbed arm: its base LIBERO suite, where task i of both is
    the same task (the position, object, swap, language and instruction variants). Suites
    that add distractors rename and reorder their tasks (libero_goal_with_milk task 0 is
    "FLOOR_SCENE1_open_the_middle_layer_of_the_drawer"): they have no matched control."""
    suite = get_suite(f"libero_{variation}")
    if suite.base is None or suite.base not in list_suites():
        return None
    if get_suite(suite.base).task_names != suite.task_names:
        return None
    return "libero", suite.base.removeprefix("libero_")


# The LIBERO backend's families, in `gap families` order. A new family is one entry here.
FAMILIES: dict[str, backend.Family] = {
    family.name: family
    for family in (
        PosVar(),
        GroceryPacking(),
        SuiteFamily("libero", lambda: [s.removeprefix("libero_") for s in CLASSIC_SUITES]),
        SuiteFamily("libero_pro", libero_pro_variants, libero_pro_control),
    )
}


# -- variations ---------------------------------------------------------------------------------
class Variation(backend.Variation):
    """A resolved LIBERO (family, variation): which suite, and how each episode is perturbed."""

    @property
    def generated(self) -> bool:
        return isinstance(FAMILIES.get(self.family), GeneratedFamily)

    def perturbation(self, task: TaskSpec, seed: int, scene) -> Perturbation | None:
        if not self.generated:
            return None
        goal = [tuple(p) for p in scene.goal_state()]
        container = next((p[2].removesuffix("_contain_region") for p in goal if p[0] == "in"), None)
        if container is None:
            raise SimInputError(
                f"{self.family}/{self.variation}: task {task.task_id} of {task.suite} has no "
                "container goal; generated families need libero_object-like scenes"
            )
        layout = SceneLayout.from_scene(scene, container)
        return self.generate(task.task_id, seed, layout, goal)

    def generate(
        self, task_id: int, seed: int, layout: SceneLayout, goal: list[tuple[str, ...]]
    ) -> Perturbation:
        """The perturbation for (task, seed) on `layout`; pure and deterministic."""
        family = FAMILIES[self.family]
        assert isinstance(family, GeneratedFamily), self.family
        rng = _stable_rng(self.family, self.variation, task_id, seed)
        base = {n: fp.xy for n, fp in layout.objects.items()}
        planned = family.plan(self.variation, task_id, rng, layout, goal)
        targets = planned.targets
        drawn = _draw(layout, planned.kind, rng, targets) if planned.kind else (base, {})
        if drawn is None:
            raise VariationError(
                f"{self.family}/{self.variation} task {task_id} seed {seed}: no valid layout "
                "(overlap, reach or visibility) could be drawn for this init state; this is a "
                "generator bug, please report the family, task and seed"
            )
        positions, details = drawn
        moves = {n: xy for n, xy in positions.items() if xy != base[n]}
        return Perturbation(
            family=self.family,
            variation=self.variation,
            task_id=task_id,
            seed=seed,
            moves=moves,
            goal=planned.goal,
            prompt=planned.prompt,
            max_steps=planned.max_steps,
            details={**details, "targets": targets},
        )


def list_families() -> dict[str, list[str]]:
    return {name: family.variations() for name, family in FAMILIES.items()}
