"""A cell and its trials: what a plan is made of (plan.py makes them from a config).

A cell is one (mode, policy id, family, variation) of a grid, or one suites-mode entry; it
scores its tasks x seeds. A trial is one (cell, task, seed): one pytest item, one episode.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, model_validator

from pytest_gap import ids
from pytest_gap.config.model import Perception
from pytest_gap.names import check_name


class Cell(BaseModel):
    model_config = ConfigDict(frozen=True)

    mode: str
    policy_id: str | None = None
    backend: str = "libero"  # the simulator backend (a name or import string, sim/backend.py)
    family: str
    variation: str
    suite: str  # the backend's suite the trials run on
    suite_name: str | None = None  # suites mode: the entry's (de-duplicated) name
    task_ids: tuple[int, ...]
    seeds: tuple[int, ...]
    workflow_dir: Path | None = None
    timeout_s: float = 0.0
    max_steps: int | None = None  # None: the suite's protocol step limit
    num_workers: int = 1
    device_offset: int = 0  # suites mode staggers cells over GAP_MUJOCO_EGL_DEVICES
    record_video: bool = False
    frames_every: int = 0  # a sprite strip of every N-th frame per trial; 0: none
    # trials.dataset: both cameras at this size, every dataset_every-th step; 0: none
    dataset_size: int = 0
    dataset_every: int = 1
    enable_tracing: bool = True
    # What the skills see with (config skills.perception; skills.perception_setting).
    perception: Perception = "privileged"
    task_prompts: dict[int, str] = {}
    objects: dict[str, str] = {}
    error: str | None = None
    infra_error: bool = False  # `error` is a service found down before any trial, not config
    privileged: bool = False  # its policy reads ground truth (privileged_state: true)
    # Suites mode: the managed policies its workflow's run_policy nodes name (booted for it).
    workflow_policies: tuple[str, ...] = ()
    # Its mode's producer has the LLM write the workflow (read from the plan's mode table).
    uses_llm: bool = False
    # gate_rule: sequential: its trials run in blocks of this many seeds of every task, and
    # the gate looks at its rate after each whole block (sequential.py). 0: no blocks.
    block_seeds: int = 0
    # compare: (an A/B test): the (mode, family, variation) this cell and its partner share;
    # their blocks run together (`turn_key`) and both stop on one decision (ab_gate.py)
    ab_pair: str | None = None
    # The key of its matched control arm in this plan, the same tasks and seeds unperturbed
    # (control_arms.py): the summary sets that cell's rate beside this one's (control_drop.py).
    control: str | None = None

    @model_validator(mode="after")
    def _names_are_path_parts(self) -> Cell:
        """Each name of `key` is a directory of the run: one strict pattern (names.py), here
        too, whatever made the name (a config, a plugin's mode, a backend's catalogue)."""
        for what, name in (
            ("mode", self.mode),
            ("policy id", self.policy_id),
            ("family", self.family),
            ("variation", self.variation),
            ("suite name", self.suite_name),
        ):
            if name is not None:
                check_name(name, what)
        return self

    @property
    def needs_llm(self) -> bool:
        """Its trials will call the LLM: its mode's producer does, and nothing else is wrong."""
        return self.uses_llm and self.error is None

    def unavailable(self, services: dict[str, str]) -> Cell:
        """This cell, errored as an infrastructure failure if a service it needs is down.

        `services` ({"llm": why, "policies": why}) comes from the controller's preflight.
        """
        why = (self.needs_llm and services.get("llm")) or (
            (self.policy_id or self.workflow_policies)
            and self.error is None
            and services.get("policies")
        )
        return self.model_copy(update={"error": why, "infra_error": True}) if why else self

    @property
    def row(self) -> str:
        """Pivot row: mode, or mode@policy_id on the policy axis; oracles are labelled."""
        label = f"{self.mode}@{self.policy_id}" if self.policy_id else self.mode
        return f"{label}[privileged]" if self.privileged else label

    @property
    def throttle_key(self) -> str:
        """Trials sharing this key share the cell's num_workers concurrency limit."""
        return f"suites__{self.suite_name}" if self.suite_name else self.mode

    @property
    def column(self) -> str:
        return self.suite_name if self.suite_name else f"{self.family}/{self.variation}"

    @property
    def key(self) -> str:
        """This cell's directory, relative to the run dir (ids.py)."""
        return ids.cell_key(*self._names)

    @property
    def id_parts(self) -> tuple[str, str]:
        """The cell's two parts of its trials' ids (ids.py)."""
        return ids.cell_id_parts(*self._names)

    @property
    def _names(self) -> tuple[str, str | None, str, str, str | None]:
        return (self.mode, self.policy_id, self.family, self.variation, self.suite_name)

    @property
    def keywords(self) -> list[str]:
        words = [self.mode, self.family, self.variation, self.suite]
        words += [w for w in (self.policy_id, self.suite_name) if w]
        return words

    def trials(self) -> list[Trial]:
        """Its trials in run order: task by task, or block by block (`blocks`)."""
        if self.block_seeds:
            return [trial for block in self.blocks() for trial in block]
        return [Trial(cell=self, task_id=t, seed=s) for t in self.task_ids for s in self.seeds]

    @property
    def turn_key(self) -> str:
        """What takes turns block by block: the cell, or its A/B pair."""
        return self.ab_pair or self.key

    def block_of(self, seed: int) -> int:
        """The index of the block that runs `seed` (0 without blocks)."""
        return self.seeds.index(seed) // self.block_seeds if self.block_seeds else 0

    def blocks(self) -> list[list[Trial]]:
        """Its trials in blocks of `block_seeds` seeds of every task (the last block may hold
        fewer), each block task by task: a worker running a block in order reuses each task's
        env for its seeds, and every block holds each task equally, so the rate read after a
        whole block is the task-balanced rate. Without blocks: one block of every trial."""
        if not self.block_seeds:
            return [self.trials()]
        k = self.block_seeds
        return [
            [
                Trial(cell=self, task_id=t, seed=s)
                for t in self.task_ids
                for s in self.seeds[i : i + k]
            ]
            for i in range(0, len(self.seeds), k)
        ]


class Trial(BaseModel):
    model_config = ConfigDict(frozen=True)

    cell: Cell
    task_id: int
    seed: int

    @property
    def id(self) -> str:
        """The pytest item's name after its YAML's path (ids.py)."""
        return ids.trial_id(self.cell.id_parts, self.task_id, self.seed)

    @property
    def task_dir(self) -> str:
        return ids.task_dir(self.cell.key, self.task_id)

    @property
    def key(self) -> str:
        """This trial's directory, relative to the run dir (ids.py)."""
        return ids.trial_key(self.cell.key, self.task_id, self.seed)
