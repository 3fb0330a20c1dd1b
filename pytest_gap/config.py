"""Benchmark YAML -> BenchmarkConfig: both shapes, every key and default, all errors at once.

A benchmark YAML is standalone (no `base:` inheritance) and has one of two shapes:
- grid: a `benchmark:` block sweeps modes x (family, variation) x policies;
- suites: no `benchmark:` block; the `suites:` list is the cell axis.
Unknown keys are errors (a typo must not silently fall back to a default). Relative paths
resolve against the YAML's directory. Every problem is reported in one ConfigError, one line
per problem, each naming the file and the key path.
"""

from __future__ import annotations

import difflib
import shlex
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from pytest_gap.errors import GapError
from pytest_gap.modes import BUILTIN, ModeTable

# Defined beside the policy client (the policy layer imports nothing of config); named here too.
from pytest_gap.policies.endpoint import PROTOCOL_OBS_FORMATS, ObsFormatName
from pytest_gap.redaction import redact_tree

# The built-in rows of the mode table (pytest_gap/modes.py), for the Python API; validation
# reads the table it is given, so a session knows the modes its plugins add too.
KNOWN_MODES = BUILTIN.names()
# The modes a grid runs when `modes:` is omitted: the benchmark's three ablation modes (and,
# in a session, any plugin row marked `default`).
DEFAULT_MODES = BUILTIN.defaults()
POLICY_MODES = tuple(m for m in KNOWN_MODES if BUILTIN.get(m).takes_policy_axis)
DEFAULT_GATE_THRESHOLD = 0.90
# point: the pooled success rate must reach the threshold (the spec's gate); wilson: its 95%
# Wilson interval must lie above it (below: FAIL; straddling it: INCONCLUSIVE, exit 1).
GateRule = Literal["point", "wilson"]
# What skills see with: the names of skills.context.PERCEPTION_CAMERAS (a test keeps them equal).
Perception = Literal["privileged", "policy_cameras"]
FRAMES_EVERY_HINT = "a whole number N >= 0: every N-th frame into a WebP strip, 0 for none"


class ConfigError(GapError, ValueError):
    """A benchmark YAML that cannot be used; the message lists every problem, one per line."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class LLMConfig(_Strict):
    provider: Literal["openrouter", "openai", "vertex"] = "openrouter"
    model: str | None = None
    endpoint: str | None = None
    api_key: str | None = Field(default=None, repr=False)
    project_id: str | None = None
    region: str | None = None
    temperature: float = 0.7
    max_tokens: PositiveInt | None = None
    max_concurrent_requests: PositiveInt = 4
    cache_dir: Path | None = None


class PolicyEntry(_Strict):
    """One `policies:` registry entry: exactly one of url, command (alias start_cmd), preset.

    `obs_format` is what run_policy sends and how it reads replies (policies/formats.py); unset,
    it is `gap` for servers written for this harness (a `gap policy serve` command, or
    `privileged_state: true`) and otherwise the protocol's own LIBERO client format
    (openpi -> openpi-libero, vla-eval -> vla-eval-libero). See `resolved_obs_format`.
    """

    url: str | None = None
    command: list[str] | str | None = Field(
        default=None, validation_alias=AliasChoices("command", "start_cmd")
    )
    preset: str | None = None
    env: dict[str, str] = {}
    protocol: Literal["openpi", "vla-eval"] = "openpi"
    obs_format: ObsFormatName | None = None
    privileged_state: bool = False

    @property
    def resolved_obs_format(self) -> ObsFormatName:
        if self.obs_format is not None:
            return self.obs_format
        if self.privileged_state or _is_gap_policy_serve(self.command):
            return "gap"
        return PROTOCOL_OBS_FORMATS[self.protocol]

    @model_validator(mode="after")
    def _exactly_one_source(self) -> PolicyEntry:
        given = [k for k in ("url", "command", "preset") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "set exactly one of url, command (or start_cmd), preset"
                + (f"; got {', '.join(given)}" if given else "")
            )
        return self


def _is_gap_policy_serve(command: list[str] | str | None) -> bool:
    """Whether a managed command runs this harness's own server (`gap policy serve ...`)."""
    if command is None:
        return False
    try:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
    except ValueError:  # unbalanced quotes: the manager reports the command itself
        return False
    return len(argv) >= 3 and Path(argv[0]).name == "gap" and argv[1:3] == ["policy", "serve"]


class PolicyManagerConfig(_Strict):
    startup_timeout_s: NonNegativeFloat = 120.0
    evict_grace_s: NonNegativeFloat = 10.0
    # A managed server that dies mid-session is restarted at most max_restarts times (0: never),
    # the k-th restart after restart_backoff_s * 2**(k-1) s (pytest_gap/policies/supervisor.py).
    max_restarts: NonNegativeInt = 3
    restart_backoff_s: NonNegativeFloat = 1.0


class TrialsConfig(_Strict):
    trials_per_generation: PositiveInt = Field(
        default=1, validation_alias=AliasChoices("trials_per_generation", "total")
    )
    task_ids: list[int] | None = None
    output_dir: Path = Path("gap_runs")
    num_workers: PositiveInt = 1
    record_video: bool = False
    enable_tracing: bool = True
    # 0 turns the per-trial watchdog off.
    task_timeout_secs: NonNegativeFloat = 0.0
    # Counted steps per episode. None: each suite's protocol limit (LIBERO spatial 220, object
    # 280, goal 300, libero_10 520). A lower limit is for smoke runs; its rates are not
    # comparable with published ones (the plan digest includes it).
    max_steps: PositiveInt | None = None
    # A WebP sprite strip of every N-th agentview frame per trial, in <run dir>/frames/
    # (--gap-frames overrides it). 0 or None: none. A recording flag: not part of the plan.
    frames_every: int | None = None

    @field_validator("frames_every", mode="before")
    @classmethod
    def _frames_every(cls, value: Any) -> Any:
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return value
        raise ValueError(FRAMES_EVERY_HINT)


class CompositionConfig(_Strict):
    max_validation_retries: int = Field(default=2, ge=0)


class SkillsConfig(_Strict):
    """How skills move the arm and what they see. Only the builtin IK servo (`ik`) exists:
    cuRobo motion planning was never wired into the skills, so asking for it is an error, not a
    silent fallback. `perception`: `privileged` (default) sees through the front camera and an
    overhead one and may ask the simulator's goal check; `policy_cameras` sees only through the
    two cameras a policy gets (front and wrist) and never asks the goal check."""

    planner: Literal["ik"] = "ik"
    perception: Perception = "privileged"

    @field_validator("planner", mode="before")
    @classmethod
    def _no_curobo(cls, value: Any) -> Any:
        if value == "curobo":
            raise ValueError(
                "cuRobo motion planning is not supported by this version of pytest-gap; "
                "remove the key or set planner: ik (the builtin IK servo)"
            )
        return value


class ModeOverride(_Strict):
    n_seeds: PositiveInt | None = None
    num_workers: PositiveInt | None = None
    # What a prebuilt mode runs: a template shipped with pytest-gap (by name), or a directory.
    template: str | None = None
    workflow_dir: Path | None = None
    policy_id: str | None = None
    extra: dict[str, Any] = {}


class BenchmarkBlock(_Strict):
    # The simulator: a registered backend name or an import string module:Class (sim/backend.py)
    backend: str = "libero"
    families: list[str] = ["posvar"]
    # None: every variation of each family.
    variations: list[str] | None = None
    modes: list[str] = list(DEFAULT_MODES)
    n_tasks: PositiveInt = 10
    task_ids: list[int] | None = None
    n_seeds: PositiveInt = 50
    seeds: list[int] | None = None
    num_workers: PositiveInt = 8
    policies: list[str] = []
    # None inherits trials.record_video.
    record_video: bool | None = None
    output_dir: Path = Path("benchmark_runs")
    gate_threshold: float = Field(default=DEFAULT_GATE_THRESHOLD, ge=0.0, le=1.0)
    gate_rule: GateRule = "point"
    smoke: bool = False
    mode_overrides: dict[str, ModeOverride] = {}


class SuiteEntry(_Strict):
    """One suites-mode cell. `suite_name` is a LIBERO suite (`gap suites`) or family/variation."""

    suite_name: str
    task_prompts: dict[int, str] = {}
    task_ids: list[int] | None = None
    trials_per_generation: PositiveInt | None = None
    seeds: list[int] | None = None
    timeout_secs: NonNegativeFloat | None = None
    num_workers: PositiveInt | None = None
    objects: dict[str, str] = {}
    workflow_dir: Path | None = None


class BenchmarkConfig(_Strict):
    """A whole benchmark YAML. `source` is the file it came from (set by `load_config`)."""

    task: str = "auto"
    # Suites mode's simulator backend (grid mode's lives in benchmark.backend).
    backend: str = "libero"
    llm: LLMConfig = LLMConfig()
    skills: SkillsConfig = SkillsConfig()
    policies: dict[str, PolicyEntry] = {}
    policy_manager: PolicyManagerConfig = PolicyManagerConfig()
    trials: TrialsConfig = TrialsConfig()
    composition: CompositionConfig = CompositionConfig()
    benchmark: BenchmarkBlock | None = None
    suites: list[SuiteEntry] | None = None
    # Suites mode's gate threshold and rule (grid mode's live in the benchmark: block).
    gate_threshold: float = Field(default=DEFAULT_GATE_THRESHOLD, ge=0.0, le=1.0)
    gate_rule: GateRule = "point"
    smoke: bool = False
    source: Path | None = Field(default=None, exclude=True)

    @property
    def shape(self) -> Literal["grid", "suites"]:
        return "grid" if self.benchmark is not None else "suites"

    @property
    def threshold(self) -> float:
        return self.benchmark.gate_threshold if self.benchmark else self.gate_threshold

    @property
    def rule(self) -> GateRule:
        """How the gate reads the pooled success rate against the threshold (report.py)."""
        return self.benchmark.gate_rule if self.benchmark else self.gate_rule

    @property
    def output_dir(self) -> Path:
        return self.benchmark.output_dir if self.benchmark else self.trials.output_dir

    def echo(self) -> dict[str, Any]:
        """The config as JSON, without secrets (summaries and manifests carry this)."""
        data = self.model_dump(mode="json", exclude_none=True)
        data.get("llm", {}).pop("api_key", None)
        for entry in data.get("policies", {}).values():
            # the names say how a server was started; values under secret names are masked
            entry["env"] = redact_tree(entry.get("env", {}))
        return data


# -- loading ------------------------------------------------------------------------------------
def _key_path(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _describe(error: dict) -> str:
    loc = error["loc"]
    if error["type"] == "extra_forbidden":
        parent, key = loc[:-1], loc[-1]
        fields = _fields_at(parent)
        close = difflib.get_close_matches(str(key), fields, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "remove it"
        return f"{_key_path(loc)}: unknown key; {hint}"
    message = error["msg"].removeprefix("Value error, ")
    value = error.get("input")
    got = "" if isinstance(value, dict | list) else f" (got {value!r})"
    return f"{_key_path(loc)}: {message}{got}"


def _fields_at(loc: tuple) -> list[str]:
    """The known keys of the model at `loc` (for "did you mean" hints)."""
    model: Any = BenchmarkConfig
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            # dict[str, Model] value: the key is user data, keep the same model's value type
            continue
        model = _model_of(field.annotation)
    return list(model.model_fields) if model is not None else []


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _resolve_paths(config: BenchmarkConfig, base: Path) -> None:
    def fix(path: Path | None) -> Path | None:
        return None if path is None else (base / path).expanduser().resolve()

    config.trials.output_dir = fix(config.trials.output_dir)
    if config.llm.cache_dir is not None:
        config.llm.cache_dir = fix(config.llm.cache_dir)
    if config.benchmark is not None:
        config.benchmark.output_dir = fix(config.benchmark.output_dir)
        for override in config.benchmark.mode_overrides.values():
            override.workflow_dir = fix(override.workflow_dir)
    for entry in config.suites or []:
        entry.workflow_dir = fix(entry.workflow_dir)


def parse_config(
    data: Any,
    source: str | Path = "<config>",
    base: Path | None = None,
    mode_table: ModeTable | None = None,
):
    """Validate already-parsed YAML data against `mode_table` (default: the built-in modes).
    Raises ConfigError listing every problem."""
    source = str(source)
    if not isinstance(data, dict):
        raise ConfigError(source, ["the file must hold a mapping of keys (llm:, benchmark:, ...)"])
    problems: list[str] = []
    if "base" in data:
        problems.append(
            "base: benchmark YAMLs are standalone; copy the keys you need instead of inheriting"
        )
    if data.get("benchmark") is None and not data.get("suites"):
        problems.append(
            "neither a benchmark: block (grid mode) nor a non-empty suites: list (suites mode); "
            "add one of them"
        )
    body = {k: v for k, v in data.items() if k != "base"}
    table = mode_table or BUILTIN
    block = body.get("benchmark")
    if isinstance(block, dict) and "modes" not in block:
        body["benchmark"] = {**block, "modes": list(table.defaults())}
    base = base or Path.cwd()
    config = None
    try:
        config = BenchmarkConfig.model_validate(body)
    except ValidationError as exc:
        problems += [_describe(e) for e in exc.errors()]
    problems += semantic_problems(body, base, table)
    if problems:
        raise ConfigError(source, problems)
    _resolve_paths(config, base)
    config.source = Path(source).resolve() if source != "<config>" else None
    return config


def load_config(path: str | Path, mode_table: ModeTable | None = None) -> BenchmarkConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read the file: {exc.strerror}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(str(path), [f"{where}not valid YAML: {problem}"]) from None
    return parse_config(data, path, base=path.parent.resolve(), mode_table=mode_table)


# -- checks pydantic cannot express ---------------------------------------------------------------
# These read the raw YAML data (defensively), so they are reported together with the structural
# errors above instead of only after those are fixed.
def semantic_problems(data: dict, base: Path, mode_table: ModeTable = BUILTIN) -> list[str]:
    problems: list[str] = []
    backend = _backend(data, problems)
    policies = data.get("policies") if isinstance(data.get("policies"), dict) else {}
    block = data.get("benchmark")
    if isinstance(block, dict):
        families = (
            {name: f.variations() for name, f in backend.families().items()} if backend else None
        )
        problems += _grid_problems(block, policies, families, base, mode_table)
        if data.get("suites"):
            problems.append(
                "suites: a grid config (with a benchmark: block) does not use a suites: list; "
                "remove one of them"
            )
    suites = data.get("suites")
    for i, entry in enumerate(suites if isinstance(suites, list) else []):
        if isinstance(entry, dict):
            problems += _suite_problems(f"suites.{i}", entry, base, backend)
    return problems


def _backend(data: dict, problems: list[str]):
    """The config's simulator backend (families and suites are checked against its
    catalogue), or None after adding why it cannot be had to `problems`."""
    from pytest_gap.sim.backend import DEFAULT_BACKEND, get_backend

    key = "backend"
    if isinstance(data.get("benchmark"), dict):
        if "backend" in data:
            problems.append(
                "backend: a grid config names its simulator in benchmark.backend; move it there"
            )
        key, name = "benchmark.backend", data["benchmark"].get("backend", DEFAULT_BACKEND)
    else:
        name = data.get("backend", DEFAULT_BACKEND)
    if not isinstance(name, str):
        return None  # pydantic reports the type
    try:
        return get_backend(name)
    except GapError as exc:
        problems.append(f"{key}: {exc}")
        return None


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _unknown(key: str, what: str, value: str, known) -> str:
    known = list(known)
    close = difflib.get_close_matches(value, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(known)}"
    return f"{key}: unknown {what} {value!r}; {hint}"


def _grid_problems(
    block: dict, policies: dict, families, base: Path, mode_table: ModeTable
) -> list[str]:
    """`families` is the backend's catalogue (None: the backend is unknown, nothing to check
    them against)."""
    problems = []
    chosen = _strings(block.get("families", ["posvar"]))
    for family in chosen if families is not None else []:
        if family not in families:
            problems.append(_unknown("benchmark.families", "family", family, sorted(families)))
    if block.get("variations") is not None and families is not None:
        known = sorted({v for f in chosen for v in families.get(f, [])})
        for variation in _strings(block["variations"]):
            if variation not in known:
                problems.append(
                    _unknown(
                        "benchmark.variations", "variation of the chosen families", variation, known
                    )
                )
    known_modes = mode_table.names()
    for mode in _strings(block.get("modes")):
        if mode not in known_modes:
            problems.append(_unknown("benchmark.modes", "mode", mode, known_modes))
    overrides = block.get("mode_overrides")
    for mode, override in overrides.items() if isinstance(overrides, dict) else []:
        key = f"benchmark.mode_overrides.{mode}"
        if mode not in known_modes:
            problems.append(_unknown("benchmark.mode_overrides", "mode", str(mode), known_modes))
        if not isinstance(override, dict):
            continue
        problems += _workflow_source_problems(key, mode, override, mode_table)
        problems += _workflow_dir_problems(
            f"{key}.workflow_dir", override.get("workflow_dir"), base
        )
        policy = override.get("policy_id")
        if isinstance(policy, str) and policy not in policies:
            problems.append(
                f"{key}.policy_id: {policy!r} is not in the policies: registry; add it there"
            )
    for policy in _strings(block.get("policies")):
        if policy not in policies:
            problems.append(
                f"benchmark.policies: {policy!r} is not in the policies: registry; add an entry "
                "with url, command or preset"
            )
    problems += _same_server_problems(_strings(block.get("policies")), policies)
    problems += _id_problems("benchmark.task_ids", block.get("task_ids"))
    problems += _id_problems("benchmark.seeds", block.get("seeds"))
    return problems


def _suite_problems(key: str, entry: dict, base: Path, backend) -> list[str]:
    problems = []
    if isinstance(entry.get("suite_name"), str) and backend is not None:
        try:
            suite_variation(entry["suite_name"], backend)
        except GapError as exc:
            problems.append(f"{key}.suite_name: {exc}")
    problems += _workflow_dir_problems(f"{key}.workflow_dir", entry.get("workflow_dir"), base)
    problems += _id_problems(f"{key}.task_ids", entry.get("task_ids"))
    problems += _id_problems(f"{key}.seeds", entry.get("seeds"))
    prompts = entry.get("task_prompts")
    problems += _id_problems(
        f"{key}.task_prompts", list(prompts) if isinstance(prompts, dict) else None
    )
    return problems


def _server_key(url: str) -> tuple:
    """What makes two urls the same server: scheme, host (loopback names as one), port, path."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url.strip())
        port = parts.port or {"ws": 80, "http": 80, "wss": 443, "https": 443}.get(parts.scheme)
    except ValueError:
        return (url,)
    host = (parts.hostname or "").lower()
    if host in ("localhost", "127.0.0.1", "::1", "0.0.0.0"):
        host = "loopback"
    return (parts.scheme.lower(), host, port, parts.path.rstrip("/"))


def _same_server_problems(compared: list[str], policies: dict) -> list[str]:
    """Two policies of one comparison on one server compare a checkpoint with itself: a
    difference near zero that every check passes. One server per checkpoint."""
    seen: dict[tuple, str] = {}
    problems = []
    for pid in dict.fromkeys(compared):
        entry = policies.get(pid)
        url = entry.get("url") if isinstance(entry, dict) else None
        if not isinstance(url, str):
            continue  # managed servers each get their own port
        first = seen.setdefault(_server_key(url), pid)
        if first != pid:
            problems.append(
                f"benchmark.policies: {first!r} and {pid!r} point at the same server ({url}); "
                "a comparison needs one server per checkpoint: give each its own url"
            )
    return problems


def _id_problems(key: str, ids: Any) -> list[str]:
    if not isinstance(ids, list):
        return []
    ids = [i for i in ids if isinstance(i, int)]
    problems = []
    if any(i < 0 for i in ids):
        problems.append(f"{key}: ids are 0-based and cannot be negative (got {ids})")
    if len(set(ids)) != len(ids):
        problems.append(f"{key}: an id is listed twice (got {ids})")
    return problems


def _workflow_source_problems(
    key: str, mode: Any, override: dict, mode_table: ModeTable
) -> list[str]:
    """A mode override names its workflow by `template` or `workflow_dir` (one of them), and
    only for a mode whose producer starts from a given workflow."""
    from pytest_gap.producers.templates import template_names, unknown_template

    given = [k for k in ("template", "workflow_dir") if override.get(k) is not None]
    if mode in mode_table.names() and given and not mode_table.needs_workflow(mode):
        return [
            f"{key}.{given[0]}: the {mode} mode produces its own workflow; remove {given[0]} "
            "(mode workflow runs a directory as written)"
        ]
    if len(given) == 2:
        return [f"{key}: set template or workflow_dir, not both"]
    template = override.get("template")
    if isinstance(template, str) and template not in template_names():
        return [f"{key}.template: {unknown_template(template)}"]
    return []


def _workflow_dir_problems(key: str, raw: Any, base: Path) -> list[str]:
    if not isinstance(raw, str):
        return []
    path = (base / raw).expanduser().resolve()
    if not (path / "workflow.json").is_file():
        return [f"{key}: {path} has no workflow.json; point it at a workflow directory"]
    return []


def suite_variation(suite_name: str, backend="libero"):
    """The Variation a suites-mode `suite_name` names on `backend` (a Backend or its name):
    `family/variation`, or one of the backend's suites."""
    from pytest_gap.sim import backend as sim

    chosen = sim.get_backend(backend) if isinstance(backend, str) else backend
    return sim.suite_variation(chosen, suite_name)


def json_schema() -> dict[str, Any]:
    """JSON Schema of the benchmark YAML, for editor completion and validation."""
    schema = BenchmarkConfig.model_json_schema(by_alias=False)
    schema["properties"].pop("source", None)
    schema["title"] = "pytest-gap benchmark config"
    return schema
