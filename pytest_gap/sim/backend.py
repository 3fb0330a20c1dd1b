"""The simulator-backend seam: what the harness asks of a simulator, and how one is found.

A `Backend` is a simulator the harness can evaluate on: a catalogue (suites, their tasks, the
families and variations it registers) and a factory of `Env`s, one per (suite, task). An `Env`
runs episodes: `reset(seed)` then `step(action)` until success or the step limit. The runner,
the env pool, the workflow executor and the skills depend on these protocols only; `plan` and
`config` validate against the chosen backend's catalogue, which must be cheap (no env, no
physics engine import).

A backend is named by `benchmark.backend` (grid) or the top-level `backend:` (suites), default
`libero`. `get_backend(name)` finds it: a name registered in the `pytest_gap.backends` entry-point
group (or the built-in `libero`), or an import string `module:Class`, so a new simulator lands
without an edit of this package (vla-eval resolves its benchmarks the same way).

Contract every backend keeps (the harness's scores depend on it):
- seeds are integers >= 0; seed s starts from init state `s mod n_init_states(suite, task)`,
  the same scene in every process, mode and cell, whatever episodes ran before it: anything
  random about the scene (LIBERO's fixture jitter) is drawn from the seed alone (`jitter_seed`);
- settle steps (the env options' `settle_steps`, run inside `reset`) are not counted in `steps`;
- `episode.init_state_digest` is `state_digest` of the state the episode starts from (before the
  settle steps), or None where the backend cannot read its sim state; `episode.scene_digest`
  is `scene_digest` of the scene after the settle steps (every body's pose, fixtures included,
  and every joint), the scene the first action meets: equal seeds must give equal digests;
- `success()` is the backend's own goal check, `completion()` the fraction of the goal met
  (1.0 on success); an episode ends at success or after `max_steps` counted steps;
- errors a user can cause (unknown suite, task id out of range, bad action) are `SimInputError`s
  with a one-line message naming the fix.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from pytest_gap.errors import SimInputError

# numpy is imported where a digest is made: reading a config, planning and `gap` need none of it
# (it is a tenth of a second of every process start).
if TYPE_CHECKING:
    import numpy as np

    from pytest_gap.sim.scene import SceneView

SETTLE_STEPS = 10
# Decimals an init state is rounded to before it is hashed (state_digest): far below any
# physical difference (a micrometre, a microradian), far above float noise between machines.
STATE_DIGEST_DECIMALS = 6
ENTRY_POINT_GROUP = "pytest_gap.backends"
DEFAULT_BACKEND = "libero"
Predicate = tuple[str, ...]


# -- data -------------------------------------------------------------------------------------
class EnvOptions(BaseModel):
    """How an env renders and how long its episodes are. Part of the env pool's key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cameras: tuple[str, ...] = ()  # rendered into every observation; () = state only
    height: int = Field(256, ge=8, le=2048)
    width: int = Field(256, ge=8, le=2048)
    multisample: bool = False  # 4x MSAA costs about a third more per frame on software GL
    max_steps: int | None = Field(None, ge=1)  # None = the suite's protocol value
    settle_steps: int = Field(SETTLE_STEPS, ge=0)


class FrameStrip(BaseModel):
    """A sprite strip of one episode to record (`Env.reset(frames=...)`): every `every`-th frame
    of the agentview camera, the first being the scene after settling (as a video's first frame
    is), left to right in one WebP at `path` (sim/video.py StripWriter). Recording must not
    change the episode, and rendering is its cost: an env renders only the frames it records."""

    model_config = ConfigDict(frozen=True)

    path: Path
    every: int = Field(ge=1)


class DatasetFrames(BaseModel):
    """One episode recorded for a dataset (`Env.reset(dataset=...)`): both cameras (agentview,
    wrist) at `size` px at every `every`-th step from the scene after settling (step 0), as a
    LIBERO client observes them (the observation instant, 4x MSAA) but upright, each camera
    losslessly into `dir`/DATASET_VIDEO, with the proprio state each frame shows (eef xyz,
    axis-angle, two finger joints: what a policy is sent) in `dir`/DATASET_STATE. Rendering is
    the cost (two MSAA renders a frame): a policy queried every 5th step needs only those."""

    model_config = ConfigDict(frozen=True)

    dir: Path
    size: int = Field(ge=16, le=512)
    every: int = Field(1, ge=1, le=20)


@dataclass
class Observation:
    images: dict[str, np.ndarray]
    state: np.ndarray
    prompt: str

    def as_dict(self) -> dict[str, Any]:
        return {"images": self.images, "state": self.state, "prompt": self.prompt}


@dataclass
class StepResult:
    obs: Observation
    success: bool
    completion: float
    steps: int
    truncated: bool  # the step limit was reached without success

    @property
    def done(self) -> bool:
        return self.success or self.truncated

    @property
    def reward(self) -> float:
        return 1.0 if self.success else 0.0


@dataclass
class EpisodeInfo:
    """The running episode: its seed, the init state that seed chose, its instruction.

    `init_state_digest` is `state_digest` of the sim state the episode starts from (the init
    state with the variation's perturbation applied, before any step), or None where the
    backend cannot read it: two episodes with equal digests start from the same scene."""

    seed: int
    init_state: int
    prompt: str
    goal: tuple[Predicate, ...]  # the goal's conjuncts, in the backend's own notation
    perturbation: Any = None  # how a generated variation changed the scene (backend-specific)
    video: Path | None = None
    video_frames: int = 0
    init_state_digest: str | None = None
    # `scene_digest` of the scene after the settle steps (None where it cannot be read): what
    # the init state digest cannot see, the fixtures' jitter and the settling, included.
    scene_digest: str | None = None


@dataclass
class EpisodeOutcome:
    """What a backend's own episode loop reports for one episode (see `EpisodeLoopEnv`)."""

    init_state: int
    prompt: str
    success: bool
    steps: int
    completion: float  # 1.0 on success; backends without partial credit report 0.0 otherwise
    reason: str | None = None  # why it did not succeed
    # What the backend's harness reported beyond the score: its version, the server url, ...
    info: dict[str, Any] = field(default_factory=dict)
    init_state_digest: str | None = None  # as EpisodeInfo's
    scene_digest: str | None = None  # as EpisodeInfo's
    # The server's handshake reply (vla-eval's HELLO), for the record's policy identity; not
    # written anywhere as is (the runner keeps its digest only).
    server_metadata: dict[str, Any] | None = None
    # The episode's per-step evidence (a sim/step_log.py StepLog), where the loop kept one
    step_log: Any = None


@dataclass
class WarmUp:
    """One warm-up inference of a policy server, before any measured trial of this process."""

    url: str
    seconds: float  # everything the warm-up took (connect, env reset, the inference)
    inference_s: float  # the first inference alone
    info: dict[str, Any] = field(default_factory=dict)


class Variation(BaseModel):
    """A resolved (family, variation): the suite its trials run on.

    `generated`: the variation changes the episode per seed (its instruction may differ from
    seed to seed, so a workflow is produced per instruction, not per task). Backends subclass
    this to carry how (LIBERO's perturbations)."""

    model_config = ConfigDict(frozen=True)

    family: str
    variation: str
    suite: str

    @property
    def generated(self) -> bool:
        return False


# -- protocols --------------------------------------------------------------------------------
@runtime_checkable
class Env(Protocol):
    """One (suite, task) of a backend. Create once, then `reset(seed)` for every episode."""

    egl_device: int | None  # where its cameras render (None: the process default / no GL)
    max_steps: int  # counted steps the running episode may take
    # Scene queries (object poses, boxes, the gripper, camera renders) for skills that plan;
    # None where the backend offers none: only skills registered with scene=False run there.
    scene: SceneView | None

    @property
    def episode(self) -> EpisodeInfo:
        """The running episode; EpisodeError before the first reset."""

    @property
    def steps(self) -> int:
        """Counted control steps since the reset (settle steps excluded)."""

    def reset(
        self,
        seed: int,
        *,
        variation: Variation | None = None,
        video: str | Path | None = None,
        frames: FrameStrip | None = None,
        dataset: DatasetFrames | None = None,
    ) -> Observation:
        """Start an episode from init state `seed mod n_init_states`, with the variation applied,
        after the settle steps; with `video`, record this episode to that mp4; with `frames`,
        to that sprite strip; with `dataset`, its frames for a dataset (a backend that cannot
        record raises SimInputError naming the setting to turn off). The runner passes
        `frames` and `dataset` only when a trial asks for them."""

    def step(self, action: Any) -> StepResult:
        """One counted control step; SimInputError for an action the env cannot take."""

    def observe(self, cameras: tuple[str, ...] | None = None) -> Observation:
        """The observation now, without stepping."""

    def success(self) -> bool:
        """The backend's goal check."""

    def completion(self) -> float:
        """The fraction of the goal met now; 1.0 on success."""

    def goal_status(self) -> list[bool]:
        """Whether each of the episode's goal conjuncts holds now."""

    def finish_video(self) -> int:
        """Finalise the episode's recordings (video, frame strip), those that are recorded; the
        video's frame count (else 0)."""

    def close(self) -> None:
        """Release the env (idempotent)."""


class Family(Protocol):
    """A family of variations a backend registers (e.g. LIBERO's `posvar`)."""

    name: str

    def variations(self) -> list[str]:
        """Its variations, in a fixed order (cheap: catalogue only)."""

    def resolve(self, variation: str) -> Variation:
        """The Variation for one of `variations()`.

        Optionally a family also has `step_limit(variation, task_id) -> int | None`: the step
        limit of that task's episodes where it differs from its suite's (`--gap-shard` costs
        trials with it; pytest_gap/scale/shard.py), and `control(variation) -> (family,
        variation) | None`: its matched control arm, the same tasks and seeds without the
        perturbation (task i and seed s there are the episode this variation perturbs), which
        the summary sets its rate beside (`declared_control`)."""


@runtime_checkable
class Backend(Protocol):
    """A simulator: a cheap catalogue of suites and families, and a factory of envs.

    The catalogue methods raise SimInputError (one line, with a hint) for an unknown or
    unusable suite or a task id out of range."""

    name: str

    def suites(self) -> list[str]:
        """The suites that can be evaluated here."""

    def unavailable(self) -> dict[str, str]:
        """Suites this backend knows but cannot evaluate here, and why (not installed, ...)."""

    def n_tasks(self, suite: str) -> int: ...

    def max_steps(self, suite: str) -> int:
        """The suite's protocol step limit per episode."""

    def task_prompt(self, suite: str, task_id: int) -> str:
        """The task's own instruction (a variation may change it per seed)."""

    def n_init_states(self, suite: str, task_id: int) -> int: ...

    def families(self) -> Mapping[str, Family]:
        """The families it registers, by name, in a fixed order."""

    def make_env(
        self,
        suite: str,
        task_id: int,
        options: EnvOptions | None = None,
        egl_device: int | None = None,
    ) -> Env:
        """A new env for (suite, task); `egl_device` is where it renders under MUJOCO_GL=egl."""


@runtime_checkable
class EpisodeLoopEnv(Protocol):
    """An env whose backend runs bare-policy trials through its own episode loop (vla-eval).

    For a cell whose mode is in the backend's `episode_modes`, the runner produces no workflow:
    the trial is `run_episode(seed, url=...)` against the cell's policy server, after a
    `warm_up(url, seed)` that is charged to no trial. Failures of the loop, the server or the
    simulator raise `InfraFailure` (the trial is errored, not failed)."""

    def warm_up(self, url: str, seed: int, *, timeout_s: float) -> WarmUp:
        """One inference on `url` with seed's first observation, `timeout_s` to answer (the
        runner sends one per server and process, before the first measured trial there)."""

    def run_episode(
        self,
        seed: int,
        *,
        url: str,
        timeout_s: float,
        frames: FrameStrip | None = None,
        dataset: DatasetFrames | None = None,
    ) -> EpisodeOutcome:
        """One episode from init state `seed mod n_init_states` against the server at `url`,
        each reply within `timeout_s`; `frames` and `dataset` as in `Env.reset` (passed only
        when the trial asks for them). Its outcome carries the scene digest after the settle
        steps."""


def state_digest(state: np.ndarray) -> str:
    """sha256 (hex) of a sim state vector (MuJoCo's flattened time, qpos, qvel), rounded to
    STATE_DIGEST_DECIMALS and with -0.0 made 0.0, as little-endian float64 bytes: equal for the
    same scene in every process, different for different scenes."""
    import numpy as np

    vector = np.round(np.asarray(state, dtype=np.float64).reshape(-1), STATE_DIGEST_DECIMALS)
    return hashlib.sha256((vector + 0.0).astype("<f8").tobytes()).hexdigest()


def scene_digest(data) -> str:
    """The digest of a MuJoCo scene (an MjData, or anything with its `qpos`, `qvel`, `xpos` and
    `xquat`): every joint's position and velocity and every body's world pose, so a fixture moved
    by a reset's jitter (a body without a joint, whose pose is in the model) changes it as a
    moved object does. Rounded as `state_digest` rounds."""
    import numpy as np

    arrays = (data.qpos, data.qvel, data.xpos, data.xquat)
    return state_digest(np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays]))


def jitter_seed(seed: int) -> int:
    """The seed of the RNG a reset draws the scene's randomness from, for trial seed `seed`:
    the seed itself (NumPy's legacy seeding takes 32 bits)."""
    if seed < 0:
        raise SimInputError(f"seed {seed}: seeds are integers >= 0")
    return seed % 2**32


def episode_modes(backend: Backend) -> frozenset[str]:
    """The modes whose trials `backend` runs through its own episode loop (none for most)."""
    return frozenset(getattr(backend, "episode_modes", ()))


# -- the registry -----------------------------------------------------------------------------
def _registered() -> dict[str, str]:
    """name -> import string, from the `pytest_gap.backends` entry points: pytest-gap's own
    (pyproject.toml) and any installed package's, one list."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known_backends() -> list[str]:
    return sorted(_registered())


def backend_target(name: str) -> str:
    """The import string a backend name resolves to (an import string names itself)."""
    return _registered().get(name, name)


@functools.cache
def get_backend(name: str) -> Backend:
    """The backend `name` names: a registered name or an import string `module:Class`.

    One instance per name and process; SimInputError (one line) if it cannot be found."""
    registered = _registered()
    target = registered.get(name)
    if target is None and ":" not in name:
        close = difflib.get_close_matches(name, registered, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise SimInputError(
            f"unknown backend {name!r}; {hint}known backends: {', '.join(sorted(registered))}, "
            "or an import string module:Class"
        )
    target = target or name
    try:
        factory = pkgutil.resolve_name(target)
    except (ImportError, AttributeError, ValueError) as exc:
        raise SimInputError(
            f"backend {name!r}: cannot import {target} ({type(exc).__name__}: {exc}); "
            "check the module is on the path and the class name"
        ) from None
    try:
        backend = factory() if isinstance(factory, type) else factory
    except Exception as exc:  # a constructor that needs arguments, or fails
        raise SimInputError(
            f"backend {name!r}: {target}() failed ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(backend, Backend):
        raise SimInputError(
            f"backend {name!r}: {target} is not a Backend (it needs name, suites, n_tasks, "
            "families, make_env, ...; see pytest_gap/sim/backend.py)"
        )
    return backend


def resolve_variation(backend: Backend, family: str, variation: str) -> Variation:
    """The Variation of `family/variation` on `backend`; SimInputError with a hint otherwise."""
    families = backend.families()
    if family not in families:
        raise SimInputError(
            f"unknown family {family!r} of backend {backend.name}: use one of {sorted(families)}"
        )
    options = families[family].variations()
    if variation not in options:
        close = difflib.get_close_matches(str(variation), options, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"use one of {options}"
        raise SimInputError(f"unknown variation {variation!r} of family {family}: {hint}")
    return families[family].resolve(variation)


def declared_control(backend: Backend, family: str, variation: str) -> tuple[str, str] | None:
    """The (family, variation) `family/variation` names as its matched control, checked to be
    one of the backend's; None when it names none (or the family is unknown here)."""
    found = backend.families().get(family)
    control = getattr(found, "control", None)
    named = control(variation) if callable(control) else None
    if named is None:
        return None
    if not (
        isinstance(named, tuple) and len(named) == 2 and all(isinstance(n, str) for n in named)
    ):
        raise SimInputError(
            f"family {family} of backend {backend.name}: control({variation!r}) returned "
            f"{named!r}; it must return a (family, variation) pair or None"
        )
    if named == (family, variation):
        raise SimInputError(
            f"family {family} of backend {backend.name}: {family}/{variation} names itself as "
            "its control; return None for a variation that perturbs nothing"
        )
    try:
        resolve_variation(backend, *named)
    except SimInputError as exc:
        raise SimInputError(
            f"family {family} of backend {backend.name}: the control of {variation} is "
            f"{named[0]}/{named[1]}, which this backend cannot run ({exc})"
        ) from None
    return named


def suite_variation(backend: Backend, suite_name: str) -> Variation:
    """The Variation a suites-mode `suite_name` names: `family/variation`, or one of the
    backend's suites as the first family that runs it unchanged (not generated)."""
    if "/" in suite_name:
        family, _, variation = suite_name.partition("/")
        return resolve_variation(backend, family, variation)
    suites = backend.suites()
    if suite_name in suites:
        for family in backend.families().values():
            for variation in family.variations():
                resolved = family.resolve(variation)
                if resolved.suite == suite_name and not resolved.generated:
                    return resolved
    why = backend.unavailable().get(suite_name)
    if why:
        raise SimInputError(f"{backend.name} suite {suite_name!r} is not usable: {why}")
    close = difflib.get_close_matches(suite_name, suites, n=1)
    hint = f"did you mean {close[0]!r}?" if close else "see `gap suites` and `gap families`"
    raise SimInputError(
        f"unknown suite {suite_name!r}: name a {backend.name} suite or a family/variation; {hint}"
    )
