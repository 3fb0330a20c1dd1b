"""Per-trial records and the run-dir layout they live in; the resume scan.

    <output_dir>/<YYYYMMDD_HHMMSS>/<cell key>/task_NN/seed_NNN/result.json

A result.json is written atomically (temporary file, then rename), so a session killed at any
moment leaves either a whole record or none. `running.json` marks a trial in progress; a crashed
worker leaves it behind, which is how the controller tells a watchdog kill from a crash.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from pytest_gap import ids
from pytest_gap.faults import HarnessFault
from pytest_gap.layout import RESULT_FILE, RUNNING_FILE
from pytest_gap.redaction import redact_tree

if TYPE_CHECKING:
    from pytest_gap.cells import Trial

RESULT_VERSION = 1
MAX_RESULT_BYTES = 16 * 2**20  # a record is a few KB; a run dir's bigger file is not one

# exit_code of a trial: 0 it ran (success or not); 1 the harness could not run it;
# 124 the watchdog stopped it; 137 its worker died.
EXIT_RAN, EXIT_ERROR, EXIT_TIMEOUT, EXIT_CRASH = 0, 1, 124, 137


class TrialIdentity(BaseModel):
    """Which trial a record belongs to: its pytest node id, its config file and its place in
    the plan. Built only by `of`, wherever a record is made (a trial run, a crash record)."""

    model_config = ConfigDict(frozen=True)

    nodeid: str
    config: str
    mode: str
    policy_id: str | None = None
    family: str
    variation: str
    suite: str
    suite_name: str | None = None
    task_id: int
    seed: int

    @classmethod
    def of(cls, trial: Trial, *, nodeid: str, config: str) -> TrialIdentity:
        cell = trial.cell
        return cls(
            nodeid=nodeid,
            config=config,
            mode=cell.mode,
            policy_id=cell.policy_id,
            family=cell.family,
            variation=cell.variation,
            suite=cell.suite,
            suite_name=cell.suite_name,
            task_id=trial.task_id,
            seed=trial.seed,
        )

    @property
    def slug(self) -> str:
        """A flat file name stem (ids.slug)."""
        return ids.slug(
            self.mode,
            self.policy_id,
            self.family,
            self.variation,
            self.suite_name,
            self.task_id,
            self.seed,
        )


class EarlierAttempt(BaseModel):
    """An attempt of a trial that infrastructure broke, replaced by a re-run: its policy
    server died (re-run after the server's restart, servers/supervisor.py), or the harness
    faulted (`fault`: re-run once on a fresh env, run/trial.py)."""

    error: str | None = None  # what broke it
    exit_code: int = EXIT_ERROR  # as the record's exit_code
    steps: int = 0  # control steps it took before it broke
    policy_url: str | None = None  # the server that died under it
    started_at: str | None = None  # ISO 8601 with the local offset
    finished_at: str | None = None  # ISO 8601 with the local offset
    rerun_because: str  # why it was re-run (a server's restart, a harness fault)
    # The simulator, renderer or host fault that broke it (faults.py), None for a server death
    fault: HarnessFault | None = None

    @classmethod
    def of(cls, result: TrialResult, because: str) -> EarlierAttempt:
        return cls(
            **result.model_dump(
                include={
                    "error",
                    "exit_code",
                    "steps",
                    "policy_url",
                    "started_at",
                    "finished_at",
                    "fault",
                }
            ),
            rerun_because=because,
        )


class TrialResult(BaseModel):
    """One trial's record, `<run dir>/<cell key>/task_NN/seed_NNN/result.json`: written once the
    trial ended, atomically, and read back by resume, `--lf`, the summaries, `gap compare`."""

    version: int = RESULT_VERSION  # of this record's layout
    nodeid: str  # the pytest item's node id (`bench.yaml::mode::family/variation::task00::seed000`)
    config: str  # the benchmark config file it was planned from
    mode: str  # the cell's mode (workflow, policy_only, ...)
    policy_id: str | None = None  # the cell's policy registry entry (policy modes)
    family: str  # the benchmark family (libero, posvar, grocery_packing, ...)
    variation: str  # the family's variation (object, spatial, ...)
    suite: str  # the LIBERO suite the episode ran in
    suite_name: str | None = None  # a suites-mode entry's name
    task_id: int  # the task's index in its suite
    seed: int  # the trial's seed: the init state (seed mod the suite's count) and fixture jitter
    init_state: int | None = None  # the index of the suite's init state the episode started from
    prompt: str | None = None  # the instruction the workflow was produced for
    env_prompt: str | None = None  # the env's own instruction, when different sources matter
    workflow: str | None = None  # the workflow dir it ran, relative to the run dir
    success: bool = False  # the simulator's goal check held
    completion: float = 0.0  # the fraction of the goal's conjuncts held at the end; 1 on success
    reward: float = 0.0  # the env's reward at the end
    # Control steps (20 Hz) the episode's budget counted, at most the budget; settle steps and
    # a bring-up's not counted.
    steps: int = 0
    # The steps a bring-up took (policy_only: home, open the gripper) before the policy acted,
    # beside `steps`: charged to no budget (the policy had all of it).
    bringup_steps: int = 0
    exit_code: int = EXIT_RAN  # 0 it ran, 1 the harness could not run it, 124 watchdog, 137 died
    exit_status: str | None = None  # how the workflow ended (executor exit status)
    reason: str | None = None  # why a trial that ran did not succeed
    error: str | None = None  # why the harness could not score it (errored trial)
    infra_failure: bool = False  # errored by infrastructure (a policy server down, a dead worker)
    wall_s: float = 0.0  # wall-clock seconds of the whole trial
    slot_wait_s: float = 0.0  # waiting for a num_workers slot; not charged to the watchdog
    produce_s: float = 0.0  # producing the workflow (an LLM call, a template; cached: ~0)
    eval_s: float = 0.0  # running the episode
    video: str | None = None  # relative to the run dir
    frames: str | None = None  # the trial's WebP frame strip, relative to the run dir
    trace: str | None = None  # relative to the run dir
    # Every control step's evidence (sim/step_log.py), relative to the run dir
    steps_file: str | None = None
    # How a failed episode failed, read from that evidence (sim/failure_labels.py; None when it
    # succeeded or errored)
    failure_label: str | None = None
    worker: str | None = None  # the xdist worker, Ray actor or service slot that ran it
    # What a backend running its own episode loop reported (vla-eval: its version, the server)
    backend_info: dict[str, Any] = {}
    devices: dict[str, str] = {}  # the GPU pinning it ran under (CUDA/EGL device variables)
    # Provenance (issue 15): what exactly produced this record, for episodes.parquet and
    # `gap compare`. Optional: records written before these fields existed still load.

    backend: str | None = None  # the simulator backend's name (or import string)
    plan_digest: str | None = None  # the benchmark config, output paths and recording removed
    init_state_digest: str | None = None  # the sim state the episode started from
    # The scene after the settle steps (sim/backend.py scene_digest): fixtures' jitter included,
    # which the init state cannot show. Equal seeds of one task give equal digests.
    scene_digest: str | None = None
    policy_url: str | None = None  # the server that answered (policy modes)
    policy_digest: str | None = None  # the server's metadata frame, hashed
    harness_version: str | None = None  # pytest-gap's version
    harness_surface: str | None = None  # digest of the code and packages that decide outcomes
    packages: dict[str, str] = {}  # simulator package versions (mujoco, robosuite, ...)
    started_at: str | None = None  # ISO 8601 with the local offset
    finished_at: str | None = None  # ISO 8601 with the local offset
    # Attempts infrastructure broke before this one: a policy server's death (re-run once after
    # its restart) or a harness fault (re-run once on a fresh env), each with what broke it.
    earlier_attempts: list[EarlierAttempt] = []
    # This attempt's own simulator, renderer or host fault (faults.py): the trial is then an
    # infrastructure failure (errored), never the policy's
    fault: HarnessFault | None = None

    @property
    def harness_faults(self) -> int:
        """Attempts of this trial a harness fault broke, this one included."""
        return sum(a.fault is not None for a in self.earlier_attempts) + (self.fault is not None)

    @property
    def rerun_after_fault(self) -> bool:
        """This record is the re-run of an attempt a harness fault broke."""
        return any(a.fault is not None for a in self.earlier_attempts)

    @property
    def identity(self) -> TrialIdentity:
        return TrialIdentity.model_validate(
            self.model_dump(include=set(TrialIdentity.model_fields))
        )

    @property
    def errored(self) -> bool:
        """Not scored: excluded from success denominators, re-run on resume, errors its cell."""
        return self.error is not None

    def message(self) -> str:
        """The one-paragraph failure message of a pytest item (no traceback)."""
        where = f"task {self.task_id} seed {self.seed} (init state {self.init_state})"
        if self.errored:
            kind = "infrastructure failure" if self.infra_failure else "not run"
            return f"{kind}: {where}: {self.error}"
        parts = [
            f"task not completed: {where}",
            f"completion {self.completion:.2f}",
            f"steps {self.steps}",
            f"exit_code {self.exit_code}",
        ]
        if self.reason:
            parts.append(f"reason: {self.reason}")
        if self.prompt:
            parts.append(f"prompt: {self.prompt!r}")
        if self.env_prompt and self.env_prompt != self.prompt:
            parts.append(f"env prompt: {self.env_prompt!r}")
        return "; ".join(parts)

    def properties(self) -> list[tuple[str, Any]]:
        """JUnit testcase properties."""
        return [
            ("success", self.success),
            ("completion", round(self.completion, 4)),
            ("reward", self.reward),
            ("steps", self.steps),
            ("seed", self.seed),
            ("init_state", self.init_state),
            ("exit_code", self.exit_code),
            ("wall_s", round(self.wall_s, 2)),
            ("infra_failure", self.infra_failure),
            ("video", self.video or ""),
            ("prompt", self.prompt or ""),
            ("env_prompt", self.env_prompt or ""),
            ("workflow", self.workflow or ""),
        ]


def now_iso() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # A temporary name of this thread's own: two service slots (threads of one process) write
    # the same warm-up record at once, and a shared name lost one writer's file to the other.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def write_result(trial_dir: Path, result: TrialResult) -> None:
    """result.json, secrets masked (a policy url's password, a key in an error message)."""
    write_json(trial_dir / RESULT_FILE, redact_tree(result.model_dump(mode="json")))
    (trial_dir / RUNNING_FILE).unlink(missing_ok=True)


class Corrupt(BaseModel):
    path: str
    problem: str


def read_result(trial_dir: Path) -> TrialResult | Corrupt | None:
    """The recorded result, None if there is none, Corrupt if it cannot be used."""
    path = trial_dir / RESULT_FILE
    if not path.is_file():  # a FIFO or a device is no record (and is not read: it could block)
        return None
    if path.is_symlink() or path.stat().st_size > MAX_RESULT_BYTES:
        why = "a symlink" if path.is_symlink() else f"over {MAX_RESULT_BYTES // 2**20} MiB"
        return Corrupt(path=str(path), problem=f"{why}: a record is a file the harness wrote")
    try:
        result = TrialResult.model_validate_json(path.read_text())
    except (OSError, ValueError, ValidationError) as exc:
        return Corrupt(path=str(path), problem=str(exc).splitlines()[0])
    if result.version != RESULT_VERSION:
        return Corrupt(path=str(path), problem=f"version {result.version}, expected 1")
    return result


def recorded_results(run_dir: Path, trial_keys: Iterable[str]) -> dict[str, TrialResult]:
    """The valid records of the trials `trial_keys` (trial dirs) in a run dir now: what a
    sequential rule reads before each trial, in every process."""
    found = {}
    for key in trial_keys:
        result = read_result(run_dir / key)
        if isinstance(result, TrialResult):
            found[key] = result
    return found


def scan_results(run_dir: Path) -> dict[str, TrialResult]:
    """Every valid result.json under a run dir, keyed by trial dir relative to the run dir."""
    found = {}
    for path in sorted(run_dir.rglob(RESULT_FILE)):
        result = read_result(path.parent)
        if isinstance(result, TrialResult):
            found[path.parent.relative_to(run_dir).as_posix()] = result
    return found
