"""The work a config asks for (its trials, and the steps they may take: each trial's step limit,
`trials.max_steps` or its task's own protocol limit), counted from the validated config alone:
arithmetically, cells x tasks x seeds, from the backend's cheap catalogue, before any cell is
planned. Milliseconds, and memory that does not grow with the count (`work_problems`); the
limits it is held to are limits.py's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from pytest_gap.config.document import BenchmarkConfig
from pytest_gap.errors import SimInputError
from pytest_gap.modes import BUILTIN
from pytest_gap.service.limits import OPTION, ServiceLimits
from pytest_gap.sim.backend import declared_control, get_backend, resolve_variation, suite_variation


class Work(BaseModel):
    """What a config asks for: its trials and the steps they may take, at most."""

    trials: int = 0
    steps: int = 0

    def add(self, trials: int, steps: int) -> None:
        self.trials += trials
        self.steps += steps


def work_problems(config: BenchmarkConfig, limits: ServiceLimits, name: str) -> list[str]:
    """The lines refusing `config` (named `name`) for asking more work than `limits` allow,
    or none. Counted, never planned: the count stops at the first bound it passes."""
    work = count_work(config, limits)
    problems = []
    if work.trials > limits.max_trials_per_run:
        problems.append(
            f"{name}: the run asks for at least {work.trials:,} trials (cells x tasks x seeds); "
            f"this server takes at most {limits.max_trials_per_run:,} per run "
            f"({OPTION['max_trials_per_run']}): ask for fewer seeds, tasks or variations"
        )
    elif work.steps > limits.max_steps_per_run:
        problems.append(
            f"{name}: the run's {work.trials:,} trials may take {work.steps:,} steps in all "
            f"(trials x each trial's step limit); this server takes at most "
            f"{limits.max_steps_per_run:,} per run ({OPTION['max_steps_per_run']}): ask for "
            "fewer trials or a lower trials.max_steps"
        )
    return problems


def count_work(config: BenchmarkConfig, limits: ServiceLimits | None = None) -> Work:
    """The trials and steps `config` plans, as plan.py would plan them (a task list without
    task_ids counted as the suite's first n_tasks, an upper bound). Once the trials pass
    `limits`' bound the count stops: the answer is a refusal either way, and a config that
    repeats an axis a hundred thousand times is not walked to its end."""
    cap = (limits or ServiceLimits()).max_trials_per_run
    work = Work()
    for tasks, seeds, steps_of, copies in _cells(config):
        trials = len(tasks) * seeds * copies
        if work.trials + trials > cap:
            work.add(trials, 0)
            break
        work.add(trials, seeds * copies * sum(steps_of(task) for task in tasks))
    return work


def _cells(config: BenchmarkConfig) -> Iterator[tuple[Any, int, Any, int]]:
    """(tasks, seeds per task, steps of a task, how many such cells) of each kind of cell the
    config plans; a cell the planner would refuse (an unknown suite) is left to its message."""
    return _grid(config) if config.benchmark is not None else _suites(config)


def _grid(config: BenchmarkConfig) -> Iterator[tuple[Any, int, Any, int]]:
    block = config.benchmark
    backend = get_backend(block.backend)
    families = backend.families()
    wanted = None if block.variations is None else set(block.variations)
    arms = [
        ((family, variation), copies)
        for family, copies in Counter(block.families).items()
        if family in families
        for variation in families[family].variations()
        if wanted is None or variation in wanted
    ]
    cells: dict[tuple[str, str], Any] = {}
    for mode, repeats in Counter(block.modes).items():
        row = BUILTIN.get(mode) if mode in BUILTIN.names() else None
        policies = len(block.policies) if row is None or row.takes_policy_axis else 1
        seeds = _grid_seeds(block, block.mode_overrides.get(mode))
        present = {arm for arm, _ in arms}
        for arm, copies in arms:
            cell = cells.setdefault(arm, _grid_cell(config, backend, *arm))
            if cell is None:
                continue
            yield cell[0], seeds, cell[1], repeats * max(policies, 1) * copies
            control = _control(backend, *arm) if block.controls else None
            if control is not None and control not in present:
                present.add(control)  # one added arm per row, with the first cell's tasks
                added = _grid_cell(config, backend, *control, tasks=cell[0])
                if added is not None:
                    yield added[0], seeds, added[1], repeats * max(policies, 1)


def _grid_seeds(block, override) -> int:
    n = override.n_seeds if override and override.n_seeds else None
    if block.seeds is not None:
        return len(block.seeds[:n] if n else block.seeds)
    return n or block.n_seeds


def _grid_cell(config, backend, family: str, variation: str, tasks=None):
    """(task ids, steps of a task) of one grid cell, or None when its suite is unknown."""
    try:
        suite = resolve_variation(backend, family, variation).suite
        if tasks is None:
            block = config.benchmark
            first = range(min(block.n_tasks, backend.n_tasks(suite)))
            tasks = block.task_ids if block.task_ids is not None else first
    except SimInputError:
        return None
    return tasks, _steps_of(config, backend, family, variation, suite)


def _control(backend, family: str, variation: str) -> tuple[str, str] | None:
    try:
        return declared_control(backend, family, variation)
    except SimInputError:
        return None


def _suites(config: BenchmarkConfig) -> Iterator[tuple[Any, int, Any, int]]:
    backend = get_backend(config.backend)
    for entry in config.suites or []:
        try:
            found = suite_variation(backend, entry.suite_name)
            tasks = (
                entry.task_ids
                or sorted(entry.task_prompts)
                or config.trials.task_ids
                or range(backend.n_tasks(found.suite))
            )
        except SimInputError:
            continue
        seeds = (
            len(entry.seeds)
            if entry.seeds is not None
            else (entry.trials_per_generation or config.trials.trials_per_generation)
        )
        steps_of = _steps_of(config, backend, found.family, found.variation, found.suite)
        yield tasks, seeds, steps_of, 1


def _steps_of(config, backend, family: str, variation: str, suite: str):
    """A task's step limit: trials.max_steps, else its family's own (grocery packing's grows
    with the items), else the suite's protocol limit."""
    if config.trials.max_steps is not None:
        fixed = config.trials.max_steps
        return lambda task: fixed
    try:
        protocol = backend.max_steps(suite)
    except SimInputError:
        protocol = 0
    own = getattr(backend.families().get(family), "step_limit", None)
    if not callable(own):
        return lambda task: protocol

    def steps(task: int) -> int:
        try:
            return own(variation, task) or protocol
        except (SimInputError, ValueError, IndexError, KeyError):
            return protocol

    return steps
