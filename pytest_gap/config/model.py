"""The sections of a benchmark config other than the policies and the LLM: trials, skills,
composition, the grid's `benchmark:` block with its mode overrides, and the suites list.

The whole document (`BenchmarkConfig`) and the one way it is loaded are in document.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    Field,
    field_validator,
)

from pytest_gap.config.keys import SERVER_PATH, RemoteValue, ServerOnly, Strict
from pytest_gap.config.policies import RayResources
from pytest_gap.errors import one_line
from pytest_gap.modes import BUILTIN
from pytest_gap.sim.backend import known_backends
from pytest_gap.skills.perception_setting import Perception

# The built-in rows of the mode table (pytest_gap/modes.py), for the Python API; validation
# reads the table it is given, so a session knows the modes its plugins add too.
KNOWN_MODES = BUILTIN.names()
# The modes a grid runs when `modes:` is omitted: the benchmark's three ablation modes (and,
# in a session, any plugin row marked `default`).
DEFAULT_MODES = BUILTIN.defaults()
DEFAULT_GATE_THRESHOLD = 0.90
# point: the pooled success rate must reach the threshold (the spec's gate); wilson: its 95%
# Wilson interval must lie above it (below: FAIL; straddling it: INCONCLUSIVE, exit 1);
# sequential: each cell's rate is tested after every block of trials, and a decided cell's
# remaining trials are not run (pytest_gap/sequential.py; the `sequential:` key).
GateRule = Literal["point", "wilson", "sequential"]
# Upper bounds on counts, so that a typo (n_seeds: 10000000000) is a config error and not a plan
# that fills the memory: far above any real benchmark (LIBERO has 50 init states per task).
MAX_SEEDS = 100_000
MAX_WORKERS = 1024
MAX_TASKS = 100_000  # tasks of one suite (LIBERO-90 has 90)
MAX_SEED_VALUE = 2**31 - 1  # a seed is an RNG's seed and an init state's index: 0-based
# Counted steps of one episode: LIBERO's longest suite takes 520, a grocery-packing task 1,400.
MAX_EPISODE_STEPS = 100_000
# A trial's watchdog (task_timeout_secs, timeout_secs): a day; 0 turns it off.
MAX_TRIAL_TIMEOUT_S = 86_400.0
MAX_TRIALS_PER_CELL = 10_000_000  # sequential.max_trials: far above n_tasks x n_seeds
MAX_RETRIES = 100
Seeds = Annotated[int, Field(gt=0, le=MAX_SEEDS)]
Workers = Annotated[int, Field(gt=0, le=MAX_WORKERS)]
# A seed or task id of a list config/checks.py reads too: it reports a negative one with the
# list's other ids (`_id_problems`), so the model bounds it above only.
SeedValue = Annotated[int, Field(le=MAX_SEED_VALUE)]
TaskId = Annotated[int, Field(lt=MAX_TASKS)]
TaskIdFrom0 = Annotated[int, Field(ge=0, lt=MAX_TASKS)]  # one the checks do not read
EpisodeSteps = Annotated[int, Field(gt=0, le=MAX_EPISODE_STEPS)]
TrialTimeout = Annotated[float, Field(ge=0.0, le=MAX_TRIAL_TIMEOUT_S, allow_inf_nan=False)]
BlockSeeds = Annotated[int, Field(gt=0, le=MAX_SEEDS)]
FRAMES_EVERY_HINT = (
    f"a whole number N >= 0 (at most {MAX_EPISODE_STEPS}): every N-th frame into a WebP strip, "
    "0 for none"
)


def installed_backend(value: Any) -> str | None:
    known = known_backends()
    if not isinstance(value, str) or value in known:
        return None  # a wrong type is the model's to report
    return (
        f"{one_line(repr(value), 60)} is not a backend installed on this server; a submitted "
        f"config names one of {', '.join(known)}, never an import string"
    )


CONTROL_HZ = 20  # LIBERO's control rate: a dataset's fps is this over `every`


class DatasetConfig(Strict):
    """trials.dataset: the run's episodes as a LeRobot v3 dataset in <run dir>/dataset/
    (outputs/lerobot.py; `gap dataset RUN_DIR --out DIR` writes one again): both cameras,
    the state, the actions, the task and each episode's success. A recording flag: not part
    of the plan."""

    # Both cameras' frames, square, in px (two renders a frame: the cost of recording).
    image_size: int = Field(default=128, ge=16, le=512)
    # A frame at every N-th control step (N divides 20 Hz; the dataset's fps is 20 / N): a
    # policy queried every 5th step needs only those frames.
    every: int = 1
    # Only the episodes that succeeded (demonstrations to train on).
    only_success: bool = False

    @field_validator("every")
    @classmethod
    def _every(cls, value: int) -> int:
        if value < 1 or CONTROL_HZ % value:
            divisors = ", ".join(str(n) for n in range(1, CONTROL_HZ + 1) if CONTROL_HZ % n == 0)
            raise ValueError(
                f"{value} does not divide LIBERO's {CONTROL_HZ} Hz control rate (a dataset's "
                f"fps is {CONTROL_HZ} / every); use one of {divisors}"
            )
        return value


class TrialsConfig(Strict):
    """How each trial runs and what it records; in suites mode also the entries' defaults."""

    # Suites mode: seeds per entry (0..N-1) where an entry names none (alias `total`).
    trials_per_generation: Seeds = Field(
        default=1, validation_alias=AliasChoices("trials_per_generation", "total")
    )
    # Suites mode: the tasks of an entry that names neither task_ids nor task_prompts.
    task_ids: list[TaskIdFrom0] | None = None
    # Suites mode: where run dirs go (<output_dir>/<YYYYMMDD_HHMMSS>), relative to the YAML.
    output_dir: Annotated[Path, SERVER_PATH] = Path("gap_runs")
    # Suites mode: concurrent trials per entry where an entry names none.
    num_workers: Workers = 1
    # An mp4 of the agentview camera per trial, hard-linked into <run dir>/videos/.
    record_video: bool = False
    # Each trial's workflow trace (nodes, inputs, outputs, timings) in its trace/ dir.
    enable_tracing: bool = True
    # Seconds of the per-trial watchdog, at most a day; 0 turns it off.
    task_timeout_secs: TrialTimeout = 0.0
    # Counted steps per episode. None: each suite's protocol limit (LIBERO spatial 220, object
    # 280, goal 300, libero_10 520). A lower limit is for smoke runs; its rates are not
    # comparable with published ones (the plan digest includes it).
    max_steps: EpisodeSteps | None = None
    # A WebP sprite strip of every N-th agentview frame per trial, in <run dir>/frames/
    # (--gap-frames overrides it). 0 or None: none. A recording flag: not part of the plan.
    frames_every: int | None = None
    # The episodes as a LeRobot dataset in <run dir>/dataset/ (DatasetConfig). None: none.
    dataset: Annotated[
        DatasetConfig | None,
        ServerOnly(
            "disk on the server for every frame of every episode, unbounded by the service's "
            "quotas",
            "remove it: record datasets in a session of your own",
        ),
    ] = None
    # Per-trial resources when the session runs on Ray (--gap-ray); ignored otherwise.
    ray: RayResources = RayResources()

    @field_validator("frames_every", mode="before")
    @classmethod
    def _frames_every(cls, value: Any) -> Any:
        whole = isinstance(value, int) and not isinstance(value, bool)
        if value is None or (whole and 0 <= value <= MAX_EPISODE_STEPS):
            return value
        raise ValueError(FRAMES_EVERY_HINT)


class CompositionConfig(Strict):
    """How an LLM-written workflow is checked and fixed before it runs."""

    # How often an LLM-written workflow that fails validation is sent back to be fixed.
    max_validation_retries: int = Field(default=2, ge=0, le=MAX_RETRIES)


class SkillsConfig(Strict):
    """How skills move the arm and what they see. Only the builtin IK servo (`ik`) exists:
    cuRobo motion planning was never wired into the skills, so asking for it is an error, not a
    silent fallback. `perception`: `privileged` (default) sees through the front camera and an
    overhead one and may ask the simulator's goal check; `policy_cameras` sees only through the
    two cameras a policy gets (front and wrist) and never asks the goal check."""

    # How skills move the arm: the builtin IK servo (cuRobo is refused).
    planner: Literal["ik"] = "ik"
    # privileged: front and overhead cameras and the goal check; policy_cameras: only the
    # two cameras a policy gets.
    perception: Perception = "privileged"
    # User skill packages (pytest_gap/skills/packages.py): importable module names, or
    # directories of skill modules relative to the config; loaded by every process of a session.
    packages: Annotated[
        list[str],
        ServerOnly("code the server would import", "remove it: the server's own skills run"),
    ] = []

    @field_validator("planner", mode="before")
    @classmethod
    def _no_curobo(cls, value: Any) -> Any:
        if value == "curobo":
            raise ValueError(
                "cuRobo motion planning is not supported by this version of pytest-gap; "
                "remove the key or set planner: ik (the builtin IK servo)"
            )
        return value


class ModeOverride(Strict):
    # This mode's seeds: the first n of the grid's.
    n_seeds: Seeds | None = None
    # This mode's concurrent trials (a shared policy server serializes them anyway).
    num_workers: Workers | None = None
    # What a prebuilt mode runs: a template shipped with pytest-gap (by name), or a directory.
    template: str | None = None
    # A directory holding the workflow.json this mode runs (instead of a shipped template).
    workflow_dir: Annotated[
        Path | None,
        ServerOnly("a path on the server", "name a shipped template instead (template: NAME)"),
    ] = None
    # The registry policy a template's run_policy nodes use when benchmark.policies is empty.
    policy_id: str | None = None
    # Free-form settings for a mode a plugin adds; the built-in modes read none.
    extra: dict[str, Any] = {}


class SequentialGate(Strict):
    """How `gate_rule: sequential` decides (pytest_gap/sequential.py)."""

    # The config's level: the chance of a false PASS (or a false FAIL), split across its cells.
    alpha: float = Field(default=0.05, gt=0.0, lt=1.0)
    # Seeds of every task per block: the rate is looked at after each whole block. Each block
    # builds each task's env once (or reuses it from the pool), so fewer seeds per block look
    # more often and build envs more often.
    block_seeds: BlockSeeds = 5
    # Stop a cell undecided (INCONCLUSIVE) after this many scored trials; None: its plan.
    max_trials: Annotated[int, Field(gt=0, le=MAX_TRIALS_PER_CELL)] | None = None


class BaselineGate(Strict):
    """`gate:`: the regression gate against a baseline run (pytest_gap/baseline.py). With a
    baseline, the session passes unless its trials are worse than the baseline's on the same
    episodes by more than `margin` (paired by task and seed, one-sided, per cell)."""

    # A run dir (<output_dir>/<YYYYMMDD_HHMMSS>) or its episodes.parquet; relative to the YAML.
    baseline: Annotated[Path | None, SERVER_PATH] = None
    # How much lower a success rate may be than the baseline's and still pass.
    margin: float = Field(default=0.05, ge=0.0, lt=1.0)
    # sequential: looked at after every block, a decided cell stops; fixed: Tango's score
    # test once every trial has run, Holm across the cells.
    rule: Literal["sequential", "fixed"] = "sequential"
    # The chance of failing a run that is not worse by more than the margin, split across cells.
    alpha: float = Field(default=0.05, gt=0.0, lt=1.0)
    block_seeds: BlockSeeds = 5  # seeds of every task per block (rule: sequential)
    # Compare with a baseline recorded on other harness code or simulator packages.
    allow_harness_mismatch: bool = False

    @property
    def sequential(self) -> bool:
        return self.baseline is not None and self.rule == "sequential"


class ABCompare(Strict):
    """`compare:`: a sequential A/B test of two policies of a grid inside one session
    (ab_gate.py): each (mode, family, variation) cell of A is paired with B's by task and
    seed, their blocks run together, and both stop once the paired test decides."""

    # The reference arm: a policy id on the grid's policy axis.
    a: str
    # The candidate arm, compared with a by (task, seed).
    b: str
    # Only the anytime-valid sequential test exists in a session (gap compare has the fixed ones).
    rule: Literal["sequential"] = "sequential"
    # How much worse than A's success rate B's may be and count as not worse.
    margin: float = Field(default=0.05, gt=0.0, lt=1.0)
    # The level of the whole A/B test, split across its cells.
    alpha: float = Field(default=0.05, gt=0.0, lt=1.0)
    block_seeds: BlockSeeds = 5  # seeds of every task per block, for both arms


class BenchmarkBlock(Strict):
    # The simulator: a registered backend name or an import string module:Class (sim/backend.py)
    backend: Annotated[str, RemoteValue(installed_backend)] = "libero"
    # The variation families of the grid (`gap families` lists them).
    families: list[str] = ["posvar"]
    # None: every variation of each family.
    variations: list[str] | None = None
    # How each cell's workflow is produced (llm_generation, llm_plus_policy, policy_only,
    # workflow, or a plugin's).
    modes: list[str] = list(DEFAULT_MODES)
    # The first n tasks of each variation's suite (where task_ids is unset).
    n_tasks: Annotated[int, Field(gt=0, le=MAX_TASKS)] = 10
    # The tasks of every cell; overrides n_tasks.
    task_ids: list[TaskId] | None = None
    # Seeds 0..n-1 per task; seed s starts from the suite's init state s mod its count.
    n_seeds: Seeds = 50
    # Exactly these seeds; overrides n_seeds.
    seeds: list[SeedValue] | None = None
    # Concurrent trials per cell (under xdist, the workers a cell's trials may use at once).
    num_workers: Workers = 8
    # The policy axis: registry ids each policy-taking mode runs once per.
    policies: list[str] = []
    # None inherits trials.record_video.
    record_video: bool | None = None
    # Where run dirs go (<output_dir>/<YYYYMMDD_HHMMSS>), relative to the YAML.
    output_dir: Annotated[Path, SERVER_PATH] = Path("benchmark_runs")
    # The success rate the gate asks for (pooled, or per cell under gate_rule: sequential).
    gate_threshold: float = Field(default=DEFAULT_GATE_THRESHOLD, ge=0.0, le=1.0)
    # point: pooled rate >= threshold; wilson: its 95% interval decides; sequential: per
    # cell, anytime-valid, stopping early.
    gate_rule: GateRule = "point"
    sequential: SequentialGate = SequentialGate()
    # An inert marker of smoke configs (the spec's); changes nothing.
    smoke: bool = False
    # Per-mode settings, keyed by mode name.
    mode_overrides: dict[str, ModeOverride] = {}
    # Add each perturbed variation's matched control arm (its family's declaration, e.g.
    # posvar -> libero/object): the same tasks and seeds unperturbed, for the paired drop.
    controls: bool = False


class SuiteEntry(Strict):
    """One suites-mode cell. `suite_name` is a LIBERO suite (`gap suites`) or family/variation."""

    # A LIBERO suite (`gap suites`) or family/variation: the cell's scenes.
    suite_name: str
    # Task id -> the instruction the workflow is given instead of the suite's.
    task_prompts: dict[TaskId, str] = {}
    # The entry's tasks (else task_prompts' keys, else trials.task_ids).
    task_ids: list[TaskId] | None = None
    # Seeds 0..n-1 per task (else trials.trials_per_generation).
    trials_per_generation: Seeds | None = None
    # Exactly these seeds; overrides trials_per_generation.
    seeds: list[SeedValue] | None = None
    # Per-trial watchdog limit (else trials.task_timeout_secs).
    timeout_secs: TrialTimeout | None = None
    # Concurrent trials of this entry (else trials.num_workers).
    num_workers: Workers | None = None
    # Object hints for the LLM: name -> what it is, added to the task text.
    objects: dict[str, str] = {}
    # A directory holding the workflow.json this entry runs, instead of producing one.
    workflow_dir: Annotated[Path | None, SERVER_PATH] = None
