"""What runs on a Ray node: a long-lived actor that runs trials one at a time (TrialRun,
run/trial.py), as an xdist worker does, into a run dir of its own, and returns each trial's
record and files.

Knows nothing of pytest and needs no filesystem shared with the controller: a request carries
everything the trial reads that lives on the controller (the cell's `workflow_dir`, the task's
workflows produced so far, the session's conftest files that register skills, modes and
producers), and the outcome carries every file the trial wrote (result.json, trace/, video,
frame strip, the workflow it produced), relative to the run dir, for the controller to write.
The actor keeps its env pool (sim/pool.py) and its local run dir between trials, so a task's
seeds reuse one env and one produced workflow.

Every node needs pytest-gap (and what the configs' backends import) installed; the controller
forwards PYTHONPATH and the harness's settings (ray_cluster.forwarded_env).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pytest_gap.cells import Trial
from pytest_gap.config.llm import LLMConfig
from pytest_gap.layout import inside
from pytest_gap.policies.endpoint import PolicyEndpoint
from pytest_gap.results import EXIT_TIMEOUT, EarlierAttempt, TrialResult
from pytest_gap.run.devices import DEVICES_VAR

Files = dict[str, bytes]  # path relative to a root (a run dir, a workflow dir) -> content


class ActorSetup(BaseModel):
    """What every actor of a session loads once, before its first trial."""

    # The session's conftest modules: (module name, source). Executed on the actor under the
    # same name, so the skills they register exist and a mode table naming them unpickles.
    plugins: list[tuple[str, str]] = []
    mode_table: bytes | None = None  # the session's ModeTable, cloudpickled; None: built-ins


class TrialRequest(BaseModel):
    trial: Trial
    nodeid: str
    config: str  # the YAML's path on the controller (recorded, not read)
    run_dir: str  # the controller's run dir: names the actor's local copy of it
    plan_digest: str | None = None
    policies: dict[str, PolicyEndpoint] = {}
    llm: LLMConfig | None = None
    max_validation_retries: int = 2
    earlier_attempts: list[EarlierAttempt] = []
    workflow_source: Files = {}  # the cell's workflow_dir (or its one .json file: key "")
    run_files: Files = {}  # the task's workflows already in the controller's run dir


class TrialOutcome(BaseModel):
    result: TrialResult
    files: Files  # every file the trial wrote or changed, relative to the run dir


def read_files(root: Path) -> Files:
    """Every file under `root` (a file itself: key "")."""
    if root.is_file():
        return {"": root.read_bytes()}
    if not root.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    if not root.is_dir():
        return {}
    return {
        p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    }


def _place(root: Path, files: Files) -> None:
    for rel, data in files.items():
        path = root / rel if rel else root
        if path.is_file() and path.read_bytes() == data:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def pin_ray_devices(environ: dict | os._Environ, gpu_ids: list) -> dict[str, str]:
    """The actor's devices are the GPUs Ray assigned it (Ray exports CUDA_VISIBLE_DEVICES):
    MUJOCO_EGL_DEVICE_ID names the first and GAP_MUJOCO_EGL_DEVICES lists them, so the env is
    built and rendered on the same GPU CUDA sees (run/devices.py, as an xdist worker is
    pinned)."""
    if not gpu_ids:
        environ.pop(DEVICES_VAR, None)  # no GPU of its own: the process default device
        return {}
    own = ",".join(str(g) for g in gpu_ids)
    pinned = {"CUDA_VISIBLE_DEVICES": own, "MUJOCO_EGL_DEVICE_ID": str(gpu_ids[0])}
    environ.update({**pinned, DEVICES_VAR: own})
    return pinned


class _TrialTimeout(BaseException):
    """Raised into the trial by SIGALRM; a BaseException, so TrialRun's own handlers let it by
    (as they let pytest-timeout's by)."""


class AlarmWatchdog:
    """The trial's time limit on the actor, as pytest-timeout's signal method keeps it in a
    pytest process: SIGALRM after the budget left, paused while the trial waits (the Watchdog
    protocol of run/watchdog.py).
    A trial stuck where signals do not reach is the controller's to end (dispatch.GRACE_S)."""

    def __init__(self, limit_s: float):
        self.limit_s, self.charged = limit_s, 0.0
        self.started: float | None = None
        self._armed_at: float | None = None

    def _set(self, seconds: float) -> None:
        signal.setitimer(signal.ITIMER_REAL, seconds)

    def arm(self) -> None:
        signal.signal(signal.SIGALRM, _alarm)
        self.started = time.time()
        self.resume()

    def pause(self) -> None:
        if self._armed_at is None:
            return
        self._set(0)
        self.charged += time.monotonic() - self._armed_at
        self._armed_at = None

    def resume(self) -> None:
        if self._armed_at is not None or self.started is None:
            return
        self._armed_at = time.monotonic()
        self._set(max(self.limit_s - self.charged, 0.001))

    def restart(self) -> None:
        self.pause()
        self.charged, self.started = 0.0, time.time()
        self.resume()

    def disarm(self) -> None:
        self._set(0)
        self._armed_at = None


def _alarm(signum, frame) -> None:
    raise _TrialTimeout


class TrialActor:
    """One slot of a node. Made a Ray actor by the controller (`ray.remote(TrialActor)`)."""

    def __init__(self, name: str, setup: dict[str, Any], gpu_ids: list | None = None):
        if gpu_ids is None:
            import ray

            gpu_ids = ray.get_gpu_ids()
        pin_ray_devices(os.environ, gpu_ids)  # before anything imports the simulator
        setup_ = ActorSetup.model_validate(setup)
        for module_name, source in setup_.plugins:
            if module_name not in sys.modules:
                module = types.ModuleType(module_name)
                module.__file__ = f"<{module_name} from the controller>"
                sys.modules[module_name] = module
                exec(compile(source, module.__file__, "exec"), module.__dict__)
        self.mode_table = pickle.loads(setup_.mode_table) if setup_.mode_table else None
        self.name = name
        self.root = Path(tempfile.mkdtemp(prefix=f"gap-ray-{name}-"))

    def where(self) -> dict[str, Any]:
        """Who this actor is: for the controller's log and the tests."""
        return {"name": self.name, "pid": os.getpid(), "root": str(self.root)}

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        # Imported in the actor's process only: the trial level pulls in the simulator, which
        # the controller (which pickles this class) must not import.
        from pytest_gap.run.trial import TrialRun
        from pytest_gap.sim.pool import env_pool

        req = TrialRequest.model_validate(request)
        local = self.root / hashlib.sha256(req.run_dir.encode()).hexdigest()[:12]
        trial = req.trial
        if req.workflow_source:  # the cell's workflow_dir, placed on this node
            is_file = set(req.workflow_source) == {""}
            digest = hashlib.sha256(repr(sorted(req.workflow_source.items())).encode())
            source = self.root / "workflow_dirs" / digest.hexdigest()[:12]
            if is_file:
                source = source / Path(trial.cell.workflow_dir).name
            _place(source, req.workflow_source)
            trial = trial.model_copy(
                update={"cell": trial.cell.model_copy(update={"workflow_dir": source})}
            )
        _place(local, req.run_files)
        shutil.rmtree(inside(local, trial.key), ignore_errors=True)
        before = _snapshot(local)
        run = TrialRun(
            trial,
            local,
            nodeid=req.nodeid,
            config=req.config,
            pool=env_pool(),
            worker=self.name,
            policies=req.policies,
            llm=req.llm,
            max_validation_retries=req.max_validation_retries,
            mode_table=self.mode_table,
            plan_digest=req.plan_digest,
            earlier_attempts=req.earlier_attempts,
        )
        limit = trial.cell.timeout_s
        # Signals reach only the main thread (where Ray runs a threaded actor's calls).
        watchdog = AlarmWatchdog(limit) if limit and _on_main_thread() else None
        run.watchdog = watchdog or run.watchdog
        try:
            if watchdog is not None:
                watchdog.arm()
            result = run.execute()
        except _TrialTimeout:
            watchdog.disarm()
            result = run.abort(EXIT_TIMEOUT, f"timed out after {limit:g} s (the trial watchdog)")
        finally:
            if watchdog is not None:
                watchdog.disarm()
        after = _snapshot(local)
        changed = [rel for rel, stamp in after.items() if before.get(rel) != stamp]
        files = {rel: (local / rel).read_bytes() for rel in changed}
        # Sent: the node keeps only what later trials reuse (the task's produced workflows).
        shutil.rmtree(inside(local, trial.key), ignore_errors=True)
        run.frames_path.unlink(missing_ok=True)
        return TrialOutcome(result=result, files=files).model_dump()
