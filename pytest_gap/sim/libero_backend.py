"""LIBERO (and LIBERO-PRO) as a `Backend`: the in-process MuJoCo simulator, the default.

Its catalogue reads the package's BDDL and init-state folders (sim/suites.py) and the families
of sim/variations.py; neither imports MuJoCo or robosuite, so validating a config stays cheap.
Envs are `LiberoEnv`s (sim/libero.py), whose module imports MuJoCo and robosuite only when an
env is made.

The top of the LIBERO stack: it imports suites, variations and libero, and none of them imports
it (`resolve` lives here, not in variations, for that reason).
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_gap.sim import backend
from pytest_gap.sim.backend import EnvOptions, Family
from pytest_gap.sim.libero import LiberoEnv
from pytest_gap.sim.suites import get_suite, get_task, list_suites, unusable_suites
from pytest_gap.sim.variations import FAMILIES, Variation


class LiberoBackend:
    name = "libero"

    def suites(self) -> list[str]:
        return list_suites()

    def unavailable(self) -> dict[str, str]:
        return unusable_suites()

    def n_tasks(self, suite: str) -> int:
        return get_suite(suite).n_tasks

    def max_steps(self, suite: str) -> int:
        return get_suite(suite).max_steps

    def task_prompt(self, suite: str, task_id: int) -> str:
        return get_task(suite, task_id).prompt

    def n_init_states(self, suite: str, task_id: int) -> int:
        return get_task(suite, task_id).n_init_states

    def families(self) -> Mapping[str, Family]:
        return FAMILIES

    def make_env(
        self,
        suite: str,
        task_id: int,
        options: EnvOptions | None = None,
        egl_device: int | None = None,
    ):
        return LiberoEnv(get_task(suite, task_id), options, egl_device)


def resolve(family: str, variation: str) -> Variation:
    """The LIBERO Variation of `family/variation` (SimInputError with a hint otherwise): the
    short form of `backend.resolve_variation(LiberoBackend(), family, variation)` for scripts,
    notebooks and tests that drive a `LiberoEnv` themselves."""
    resolved = backend.resolve_variation(LiberoBackend(), family, variation)
    assert isinstance(resolved, Variation)
    return resolved
