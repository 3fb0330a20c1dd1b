"""Benchmark YAML -> BenchmarkConfig: both shapes, every key and default, all errors at once.

A benchmark YAML is standalone (no `base:` inheritance) and has one of two shapes:
- grid: a `benchmark:` block sweeps modes x (family, variation) x policies;
- suites: no `benchmark:` block; the `suites:` list is the cell axis.
Unknown keys are errors (a typo must not silently fall back to a default). Relative paths
resolve against the YAML's directory. Every problem is reported in one ConfigError, one line
per problem, each naming the file and the key path.

A config that arrives over the network (a `gap serve` submission) goes through the same reader
(`read_yaml_text`) and then the remote profile (`parse_config(..., profile="remote")`): the keys
marked `ServerOnly` (paths, commands, imports) and `RemoteValue` (an import-string backend) are
refused on the data as submitted, before anything is imported or added.
"""

from __future__ import annotations

import difflib
import shlex
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from pytest_gap.errors import GapError, one_line
from pytest_gap.modes import BUILTIN, ModeTable
from pytest_gap.names import check_name

# Defined beside the policy client (the policy layer imports nothing of config); named here too.
from pytest_gap.policies.endpoint import (
    DEFAULT_MAX_REPLY_MB,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WARMUP_TIMEOUT_S,
    PROTOCOL_OBS_FORMATS,
    ObsFormatName,
)
from pytest_gap.redaction import is_secret_name, redact_text, redact_tree

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
# Upper bounds on counts, so that a typo (n_seeds: 10000000000) is a config error and not a plan
# that fills the memory: far above any real benchmark (LIBERO has 50 init states per task).
MAX_SEEDS = 100_000
MAX_WORKERS = 1024
Seeds = Annotated[int, Field(gt=0, le=MAX_SEEDS)]
Workers = Annotated[int, Field(gt=0, le=MAX_WORKERS)]
FRAMES_EVERY_HINT = "a whole number N >= 0: every N-th frame into a WebP strip, 0 for none"


class ConfigError(GapError, ValueError):
    """A benchmark YAML that cannot be used; the message lists every problem, one per line.

    At most `_MAX_LISTED` of them, then how many more: a list of a hundred thousand wrong
    values (written out, or through aliases) is one short message, not one line each."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = _capped(problems)
        super().__init__("\n".join(f"{source}: {p}" for p in self.problems))


# -- the remote profile ---------------------------------------------------------------------------
# A config submitted over the network (`gap serve`'s /control, `gap online`) is data: it may not
# name code to import, a command to run or a path on the server. The keys that do are marked
# where the model defines them, so a new key is marked where it is added.
Profile = Literal["file", "remote"]


@dataclass(frozen=True)
class ServerOnly:
    """A key only the operator's own configs may hold (a file, `gap serve --config`); a
    submitted config naming it is refused: `why` says what the value would make the server do,
    `fix` what to write instead."""

    why: str
    fix: str = "remove it"


@dataclass(frozen=True)
class RemoteValue:
    """A key a submitted config may hold only with a value `check` accepts (it returns why
    not, or None)."""

    check: Callable[[Any], str | None]


SERVER_PATH = ServerOnly("a path on the server", "remove it: a service run keeps to its run dir")
NO_LLM = "remove it: a service run calls no LLM"
SERVER_COMMAND = "remove it and give url: (a placeholder: the client's policy answers)"


def _installed_backend(value: Any) -> str | None:
    from pytest_gap.sim.backend import known_backends

    known = known_backends()
    if not isinstance(value, str) or value in known:
        return None  # a wrong type is the model's to report
    return (
        f"{one_line(repr(value), 60)} is not a backend installed on this server; a submitted "
        f"config names one of {', '.join(known)}, never an import string"
    )


def _no_ground_truth(value: Any) -> str | None:
    """A submitted policy entry may not ask for the simulator's ground truth: the relay would
    hand it to the client, whose policy then scores what no camera sees."""
    if value is not True:
        return None
    return (
        "true is not allowed in a submitted config (the server would send the client the "
        "simulator's ground truth: object poses, the goal); remove it"
    )


def _policy_id(value: str) -> str:
    return check_name(value, "policy id")


# A registry key is a directory of every trial of its policy (<mode>/<policy id>/...) and the
# name of its warm-up record: one strict name, in a file as in a submission.
PolicyId = Annotated[str, AfterValidator(_policy_id)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class LLMConfig(_Strict):
    provider: Literal["openrouter", "openai", "vertex"] = "openrouter"
    model: str | None = None
    endpoint: Annotated[
        str | None, ServerOnly("the server would send its requests (and a key) there", NO_LLM)
    ] = None
    api_key: Annotated[str | None, ServerOnly("a key the server would use", NO_LLM)] = Field(
        default=None, repr=False
    )
    project_id: str | None = None
    region: str | None = None
    temperature: float = 0.7
    max_tokens: PositiveInt | None = None
    max_concurrent_requests: PositiveInt = 4
    cache_dir: Annotated[Path | None, ServerOnly("a path on the server", NO_LLM)] = None
    # Each request's own bound, and how often a failed one is tried again: producing is not
    # charged to a trial's watchdog, so these bound a hanging endpoint (runner._produce).
    timeout_s: PositiveFloat = 120.0
    max_retries: NonNegativeInt = 5


class RayResources(_Strict):
    """What each trial holds on a Ray cluster (`pytest --gap-ray`, pytest_gap/scale/): the
    resources of the long-lived actor that runs it, one actor per slot of a node. `memory` is
    bytes (Ray's unit); None reserves none."""

    num_cpus: NonNegativeFloat = 1.0
    num_gpus: NonNegativeFloat = 0.0
    memory: PositiveInt | None = None

    @model_validator(mode="after")
    def _holds_something(self) -> RayResources:
        if not (self.num_cpus or self.num_gpus):
            raise ValueError(
                "num_cpus and num_gpus are both 0: a node would take any number of actors; "
                "give each trial num_cpus (e.g. 1) or num_gpus"
            )
        return self


class PolicyEntry(_Strict):
    """One `policies:` registry entry: exactly one of url, command (alias start_cmd), preset.

    `obs_format` is what run_policy sends and how it reads replies (policies/formats.py); unset,
    it is `gap` for servers written for this harness over openpi's protocol (a `gap policy
    serve` command, or `privileged_state: true`) and otherwise the protocol's own LIBERO client
    format (openpi -> openpi-libero, vla-eval -> vla-eval-libero). See `resolved_obs_format`.
    """

    url: str | None = None
    command: Annotated[
        list[str] | str | None, ServerOnly("a command the server would run", SERVER_COMMAND)
    ] = Field(default=None, validation_alias=AliasChoices("command", "start_cmd"))
    preset: Annotated[
        str | None, ServerOnly("a policy server the server would start", SERVER_COMMAND)
    ] = None
    env: Annotated[
        dict[str, str], ServerOnly("the environment of a command the server would run")
    ] = {}
    protocol: Literal["openpi", "vla-eval"] = "openpi"
    obs_format: ObsFormatName | None = None
    privileged_state: Annotated[bool, RemoteValue(_no_ground_truth)] = False
    # Seconds a measured reply may take (a later one is an infrastructure failure, never a stale
    # action applied), and the one warm-up inference per process (openpi compiles on its first).
    timeout_s: float = Field(DEFAULT_TIMEOUT_S, gt=0, le=3600)
    warmup_timeout_s: float = Field(DEFAULT_WARMUP_TIMEOUT_S, gt=0, le=7200)
    # The largest frame its server may send us (policies/client.py); actions are kilobytes.
    max_reply_mb: float = Field(DEFAULT_MAX_REPLY_MB, gt=0, le=4096)
    # Under --gap-ray, a managed server runs in a Ray actor holding these resources, on a node
    # that has them (scale/ray_policy.py); without --gap-ray it runs here, as any other.
    ray: Annotated[RayResources | None, ServerOnly("where a server it starts would run")] = None

    @property
    def resolved_obs_format(self) -> ObsFormatName:
        if self.obs_format is not None:
            return self.obs_format
        # `gap policy serve --protocol vla-eval` is vla-eval's own server: it reads what
        # vla-eval's LIBERO benchmark sends, as any vla-eval model server does.
        native = self.privileged_state or _is_gap_policy_serve(self.command)
        if native and self.protocol == "openpi":
            return "gap"
        return PROTOCOL_OBS_FORMATS[self.protocol]

    @field_validator("url")
    @classmethod
    def _websocket_url(cls, url: str | None) -> str | None:
        if url is not None:
            problem = websocket_url_problem(url)
            if problem:
                raise ValueError(problem)
        return url

    @model_validator(mode="after")
    def _exactly_one_source(self) -> PolicyEntry:
        given = [k for k in ("url", "command", "preset") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "set exactly one of url, command (or start_cmd), preset"
                + (f"; got {', '.join(given)}" if given else "")
            )
        if self.url is not None and self.ray is not None:
            raise ValueError(
                "ray places a server the session starts (command or preset); a url: server "
                "runs wherever it was started: drop ray or give a command"
            )
        return self


def websocket_url_problem(url: str) -> str | None:
    """Why `url` is not a policy server's address (ws://HOST[:PORT][/PATH] or wss://), or None.
    Checked at load, so a typo is a config error and not a server that "does not answer"."""
    from urllib.parse import urlsplit

    example = "e.g. ws://127.0.0.1:8000"
    shown = one_line(repr(redact_text(url)), 80)  # a url's password stays out of the message
    if not url or url != url.strip() or any(c.isspace() for c in url):
        return f"{shown} is not a URL (it is empty or has spaces); give the server's, {example}"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port that is not a number in 0..65535
    except ValueError as exc:
        return f"{shown} is not a valid URL ({exc}); {example}"
    if parts.scheme.lower() not in ("ws", "wss"):
        return f"{shown} is not a ws:// or wss:// URL; policy servers speak websockets: {example}"
    if not parts.hostname:
        return f"{shown} has no host; {example}"
    if port == 0:
        return f"{shown}: port 0 is not a server's port; {example}"
    return None


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
    trials_per_generation: Seeds = Field(
        default=1, validation_alias=AliasChoices("trials_per_generation", "total")
    )
    task_ids: list[int] | None = None
    output_dir: Annotated[Path, SERVER_PATH] = Path("gap_runs")
    num_workers: Workers = 1
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
    # Per-trial resources when the session runs on Ray (--gap-ray); ignored otherwise.
    ray: RayResources = RayResources()

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


# The spec's implicit fallback: a template mode given no policy (no benchmark.policies, no
# mode_overrides.<mode>.policy_id) runs this preset, booted like any managed entry.
IMPLICIT_POLICY = "pi05-libero"


def implicit_policy_modes(config: BenchmarkConfig, table: ModeTable) -> list[str]:
    """The grid's template modes that run the implicit `IMPLICIT_POLICY` fallback."""
    block = config.benchmark
    if block is None or block.policies:
        return []
    found = []
    for mode in block.modes:
        row, override = table.get(mode), block.mode_overrides.get(mode)
        if row.takes_policy_axis and row.template and not (override and override.policy_id):
            found.append(mode)
    return found


class ModeOverride(_Strict):
    n_seeds: Seeds | None = None
    num_workers: Workers | None = None
    # What a prebuilt mode runs: a template shipped with pytest-gap (by name), or a directory.
    template: str | None = None
    workflow_dir: Annotated[
        Path | None,
        ServerOnly("a path on the server", "name a shipped template instead (template: NAME)"),
    ] = None
    policy_id: str | None = None
    extra: dict[str, Any] = {}


class BenchmarkBlock(_Strict):
    # The simulator: a registered backend name or an import string module:Class (sim/backend.py)
    backend: Annotated[str, RemoteValue(_installed_backend)] = "libero"
    families: list[str] = ["posvar"]
    # None: every variation of each family.
    variations: list[str] | None = None
    modes: list[str] = list(DEFAULT_MODES)
    n_tasks: PositiveInt = 10
    task_ids: list[int] | None = None
    n_seeds: Seeds = 50
    seeds: list[int] | None = None
    num_workers: Workers = 8
    policies: list[str] = []
    # None inherits trials.record_video.
    record_video: bool | None = None
    output_dir: Annotated[Path, SERVER_PATH] = Path("benchmark_runs")
    gate_threshold: float = Field(default=DEFAULT_GATE_THRESHOLD, ge=0.0, le=1.0)
    gate_rule: GateRule = "point"
    smoke: bool = False
    mode_overrides: dict[str, ModeOverride] = {}


class SuiteEntry(_Strict):
    """One suites-mode cell. `suite_name` is a LIBERO suite (`gap suites`) or family/variation."""

    suite_name: str
    task_prompts: dict[int, str] = {}
    task_ids: list[int] | None = None
    trials_per_generation: Seeds | None = None
    seeds: list[int] | None = None
    timeout_secs: NonNegativeFloat | None = None
    num_workers: Workers | None = None
    objects: dict[str, str] = {}
    workflow_dir: Annotated[Path | None, SERVER_PATH] = None


class BenchmarkConfig(_Strict):
    """A whole benchmark YAML. `source` is the file it came from (set by `load_config`)."""

    task: str = "auto"
    # Suites mode's simulator backend (grid mode's lives in benchmark.backend).
    backend: Annotated[str, RemoteValue(_installed_backend)] = "libero"
    llm: LLMConfig = LLMConfig()
    skills: SkillsConfig = SkillsConfig()
    policies: dict[PolicyId, PolicyEntry] = {}
    policy_manager: PolicyManagerConfig = PolicyManagerConfig()
    trials: TrialsConfig = TrialsConfig()
    composition: CompositionConfig = CompositionConfig()
    benchmark: BenchmarkBlock | None = None
    suites: list[SuiteEntry] | None = None
    # Suites mode's gate threshold and rule (grid mode's live in the benchmark: block).
    gate_threshold: float = Field(default=DEFAULT_GATE_THRESHOLD, ge=0.0, le=1.0)
    gate_rule: GateRule = "point"
    smoke: bool = False
    source: Annotated[Path | None, SERVER_PATH] = Field(default=None, exclude=True)

    @classmethod
    def from_yaml(cls, path: str | Path) -> BenchmarkConfig:
        """The config of a benchmark YAML (`load_config`): ConfigError lists every problem."""
        return load_config(path)

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
    return ".".join(_key_part(p) for p in loc) or "(top level)"


def _key_part(part: Any) -> str:
    """A key as the message shows it: as written, unless it would break the one line (spaces,
    control characters) or run on (quoted, shortened)."""
    text = str(part)
    if text and text.isprintable() and " " not in text and len(text) <= 60:
        return text
    return repr(one_line(text, 60))


def _describe_all(errors: list[dict], data: Any) -> list[str]:
    """One line per offending key. A value that fits none of a union's types (`command:` is a
    list or a string) gives pydantic one error per member, each under a loc with the member's
    type in it (`command.list[str]`): those become one line, under the key the user wrote."""
    grouped: dict[tuple, list[dict]] = {}
    for error in errors:
        loc = _data_loc(error["loc"], data, error["type"])
        grouped.setdefault(loc, []).append({**error, "loc": loc})
    lines = []
    for group in grouped.values():
        if len(group) == 1:
            lines.append(_describe(group[0]))
            continue
        messages = list(dict.fromkeys(_message(e) for e in group))
        value = group[0].get("input")
        shown = _shown(group[0]["loc"], value)
        got = "" if isinstance(value, dict | list) else f" (got {shown})"
        lines.append(f"{_key_path(group[0]['loc'])}: {'; or '.join(messages)}{got}")
    return lines


def _data_loc(loc: tuple, data: Any, kind: str) -> tuple:
    """`loc` without the parts that are not keys of the data (a union member's type name); a
    missing key's own name stays."""
    if len(loc) >= 2 and loc[-1] == "[key]":  # a mapping's key is wrong: name its mapping
        return _data_loc(loc[:-2], data, kind)
    kept, current = [], data
    for i, part in enumerate(loc):
        in_dict = isinstance(current, dict) and part in current
        in_list = isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current)
        if in_dict or in_list:
            kept.append(part)
            current = current[part]
        elif i == len(loc) - 1 and kind == "missing":
            kept.append(part)
    return tuple(kept)


def _shown(loc: tuple, value: Any) -> str:
    """The offending value as an error shows it: masked under a secret name (`api_key: 123`
    is a wrong type, and still a key), with url passwords and tokens masked, on one line."""
    if loc and is_secret_name(str(loc[-1])):
        return "'***'"
    if isinstance(value, dict | list | tuple | set):  # never walked: aliases may make it vast
        return f"a {type(value).__name__} of {len(value)}"
    return one_line(repr(redact_tree(value)), 80)


def _message(error: dict) -> str:
    return one_line(error["msg"].removeprefix("Value error, "), 200)


def _describe(error: dict) -> str:
    loc = error["loc"]
    if error["type"] == "extra_forbidden":
        parent, key = loc[:-1], loc[-1]
        fields = _fields_at(parent)
        close = difflib.get_close_matches(str(key), fields, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "remove it"
        return f"{_key_path(loc)}: unknown key; {hint}"
    if error["type"] == "missing":
        return f"{_key_path(loc)}: a required key is missing; add it"
    message = _message(error)
    value = error.get("input")
    shown = _shown(loc, value)
    got = "" if isinstance(value, dict | list) or shown in message else f" (got {shown})"
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
    from pytest_gap.skills.packages import is_directory_entry

    # A directory entry stays right when the config is written anew (the Python API does).
    config.skills.packages = [
        str(fix(Path(p).expanduser())) if is_directory_entry(p) else p
        for p in config.skills.packages
    ]


def remote_problems(data: Any, model: type[BaseModel] | None = None, path: tuple = ()) -> list[str]:
    """One line per key of the raw data `data` (the model `model`'s, default the whole config)
    that a submitted config may not hold (`ServerOnly`) or holds with a value it may not
    (`RemoteValue`). Read before anything is added to the data and before any of it is
    imported or checked against a catalogue; keys the model does not know are left to it."""
    if not isinstance(data, dict):
        return []
    model = model or BenchmarkConfig
    problems = []
    for key, value in data.items():
        field = _field_named(model, key)
        if field is None:
            continue
        where = _key_path((*path, key))
        refused = [m for m in field.metadata if isinstance(m, ServerOnly)]
        for mark in refused:
            problems.append(f"{where}: not allowed in a submitted config ({mark.why}); {mark.fix}")
        for mark in (m for m in field.metadata if isinstance(m, RemoteValue)):
            problem = mark.check(value)
            if problem:
                problems.append(f"{where}: {problem}")
        if not refused:
            problems += _remote_nested(field.annotation, value, (*path, key))
    return problems


def _field_named(model: type[BaseModel], key: Any):
    """The field of `model` that the raw key `key` sets (by name or by a validation alias)."""
    if not isinstance(key, str):
        return None
    for name, field in model.model_fields.items():
        alias = field.validation_alias
        choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
        if key == name or key in choices:
            return field
    return None


def _remote_nested(annotation: Any, value: Any, path: tuple) -> list[str]:
    """`remote_problems` of the models inside a value: a model, a mapping or a list of them."""
    origin, args = get_origin(annotation), get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return remote_problems(value, annotation, path)
    if origin is Annotated:
        return _remote_nested(args[0], value, path)
    if origin in (Union, types.UnionType):
        return [p for arg in args for p in _remote_nested(arg, value, path)]
    if origin is dict and isinstance(value, dict):
        return [p for k, v in value.items() for p in _remote_nested(args[1], v, (*path, k))]
    if origin is list and isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _remote_nested(args[0], v, (*path, i))]
    return []


def parse_config(
    data: Any,
    source: str | Path = "<config>",
    base: Path | None = None,
    mode_table: ModeTable | None = None,
    profile: Profile = "file",
):
    """Validate already-parsed YAML data against `mode_table` (default: the built-in modes).
    Raises ConfigError listing every problem.

    `profile="remote"`: the data was submitted over the network. `remote_problems` reads it
    first, as given, and any key it refuses ends the check there: nothing it names is imported
    (skill packages, backends) or looked up on the server. Nor is anything added to it (the
    implicit policy preset of a template mode)."""
    source = str(source)
    if data is None:
        raise ConfigError(source, [EMPTY_HINT])
    if not isinstance(data, dict):
        raise ConfigError(
            source,
            [
                "(top level): the file must hold a mapping of keys (benchmark: or suites:, llm:, "
                f"policies:, ...), not a {type(data).__name__}; see examples/benchmark/"
            ],
        )
    if profile == "remote":
        refused = remote_problems(data)
        if refused:
            raise ConfigError(source, refused)
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
        problems += _describe_all(exc.errors(), body)
    skills = body.get("skills")
    if isinstance(skills, dict):  # before the workflows are checked: they may call these skills
        from pytest_gap.skills.catalogue import package_problems

        problems += package_problems(skills.get("packages"), base)
    problems += semantic_problems(body, base, table)
    if problems:
        raise ConfigError(source, problems)
    _resolve_paths(config, base)
    implicit = profile == "file" and implicit_policy_modes(config, table)
    if implicit and IMPLICIT_POLICY not in config.policies:
        config.policies[IMPLICIT_POLICY] = PolicyEntry(preset=IMPLICIT_POLICY)
    if source == "<config>":
        config.source = None
    else:  # a submission's name is no path on this server
        config.source = Path(source) if profile == "remote" else Path(source).resolve()
    return config


def load_config(path: str | Path, mode_table: ModeTable | None = None) -> BenchmarkConfig:
    path = Path(path)
    data = read_yaml(path)
    return parse_config(data, path, base=path.parent.resolve(), mode_table=mode_table)


# -- reading the YAML ------------------------------------------------------------------------------
# A benchmark config is a page or two of YAML. A far bigger file is something else (a log, a
# dataset, a wrong path): it is refused before it is parsed.
MAX_CONFIG_BYTES = 1 << 20
# What the data may expand to, YAML aliases expanded, in values (scalars, lists, mappings). A real
# config has hundreds; an alias bomb ("billion laughs") reaches billions from a few lines and is
# refused from its node graph, before any of it is built or validated.
MAX_CONFIG_VALUES = 100_000
# The tags yaml.safe_load knows (str, int, map, ...). Any other tag (`!!python/object`, `!include`)
# is named with its key: a config is plain data.
_SAFE_TAGS = frozenset(tag for tag in yaml.SafeLoader.yaml_constructors if tag is not None)
_MAX_LISTED = 20  # problems of one kind listed before "... and N more"
EMPTY_HINT = (
    "the file is empty; a benchmark config needs a benchmark: block (grid shape) or a suites: "
    "list (suites shape), see examples/benchmark/"
)


def read_yaml(path: Path) -> Any:
    """The data of a YAML file, or ConfigError (one line per problem, none a traceback) for a
    file that is unreadable, too big, not UTF-8, empty, not YAML, tagged with anything but plain
    data tags, holding a key twice, or an alias bomb."""
    source = str(path)
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except IsADirectoryError:
        raise ConfigError(source, ["is a directory; give a benchmark YAML file"]) from None
    except OSError as exc:
        raise ConfigError(source, [f"cannot read the file: {exc.strerror}"]) from None
    if len(raw) > MAX_CONFIG_BYTES:
        size = _file_size(path, len(raw))
        raise ConfigError(
            source,
            [
                f"the file is {size}, over the {MAX_CONFIG_BYTES >> 20} MiB limit of a benchmark "
                "config; is it the right file?"
            ],
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            source,
            [
                f"line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start});"
                " a benchmark config is a YAML text file: check the path, or save it as UTF-8"
            ],
        ) from None
    return _yaml_data(text, source)


def read_yaml_text(text: str, source: str) -> Any:
    """The data of a config that arrived as text (a submission), through `read_yaml`'s checks:
    the same size limit, tags, duplicate keys, depth and alias bombs, the same messages."""
    size = len(text) if len(text) > MAX_CONFIG_BYTES else len(text.encode("utf-8", "replace"))
    if size > MAX_CONFIG_BYTES:  # more characters than the limit's bytes: over it, uncounted
        shown = f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size} bytes"
        raise ConfigError(
            source,
            [
                f"the config is {shown}, over the {MAX_CONFIG_BYTES >> 20} MiB limit of a "
                "benchmark config; is it the right file?"
            ],
        )
    return _yaml_data(text, source)


def _yaml_data(text: str, source: str) -> Any:
    """Compose the node graph, check it (`_node_problems`), and only then build the data."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [_yaml_problem(exc, text)]) from None
    except RecursionError:
        raise ConfigError(
            source, ["nested too deeply to be a benchmark config; check the brackets"]
        ) from None
    if node is None:
        raise ConfigError(source, [EMPTY_HINT])
    problems = _node_problems(node)
    if problems:
        raise ConfigError(source, problems)
    try:
        return yaml.SafeLoader("").construct_document(node)
    except (yaml.YAMLError, ValueError, TypeError) as exc:  # `!!int abc`, a bad `<<:` merge
        raise ConfigError(source, [_yaml_problem(exc)]) from None


def _file_size(path: Path, read: int) -> str:
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    size = max(size, read)
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size} bytes"


def _yaml_problem(exc: Exception, text: str = "") -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}: " if mark else ""
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML refuses (a NUL byte)
        where = f"line {text[: exc.position].count(chr(10)) + 1}: "
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    return f"{where}not valid YAML: {one_line(problem)}"


def _tag_name(tag: str) -> str:
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org") else tag


def _node_problems(root: yaml.Node) -> list[str]:
    """Walk the composed node graph once (an alias is the node it names, visited once): tags
    that are not plain data, keys given twice in one mapping, aliases that contain themselves,
    and the size the data would expand to (each node's expanded size, memoized)."""
    tags: list[str] = []
    duplicates: list[str] = []
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    class _Refused(Exception):
        pass

    def walk(node: yaml.Node, path: tuple) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise _Refused(
                f"{_key_path(path)}: line {node.start_mark.line + 1}: a YAML alias that contains "
                "itself (an endless value); remove the alias"
            )
        if node.tag not in _SAFE_TAGS:
            tags.append(
                f"{_key_path(path)}: line {node.start_mark.line + 1}: the YAML tag "
                f"{one_line(_tag_name(node.tag), 60)} is not allowed (a benchmark config is "
                "plain data: no tags that build objects or include files); remove the tag"
            )
        open_nodes.add(id(node))
        size = 1
        if isinstance(node, yaml.SequenceNode):
            for i, child in enumerate(node.value):
                size += walk(child, (*path, i))
        elif isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                if isinstance(key_node, yaml.ScalarNode) and key != "<<":
                    line = key_node.start_mark.line + 1
                    if key in seen:
                        duplicates.append(
                            f"{_key_path((*path, key))}: the key is given twice (lines "
                            f"{seen[key]} and {line}); YAML would keep only the last: keep one"
                        )
                    seen.setdefault(key, line)
                size += walk(key_node, (*path, key)) + walk(value_node, (*path, key))
        open_nodes.discard(id(node))
        if size > MAX_CONFIG_VALUES:
            raise _Refused(
                f"{_key_path(path)}: expands to over {MAX_CONFIG_VALUES} values through YAML "
                "aliases (an alias bomb?); a benchmark config is far smaller: write it out "
                "without the nested aliases"
            )
        sizes[id(node)] = size
        return size

    try:
        walk(root, ())
    except _Refused as refused:
        return [str(refused)]
    except RecursionError:
        return ["nested too deeply to be a benchmark config; check the brackets"]
    return _capped(tags) + _capped(duplicates)


def _capped(problems: list[str]) -> list[str]:
    if len(problems) <= _MAX_LISTED:
        return problems
    return [*problems[:_MAX_LISTED], f"... and {len(problems) - _MAX_LISTED} more like these"]


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
    for key in ("families", "variations", "modes", "policies"):
        problems += _duplicate_problems(f"benchmark.{key}", block.get(key))
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


def _duplicate_problems(key: str, values: Any) -> list[str]:
    """A family, variation, mode or policy listed twice would run (and count) its cells twice."""
    if not isinstance(values, list):
        return []
    hashable = [v for v in values if isinstance(v, str | int | float | bool)]
    twice = [v for v in dict.fromkeys(hashable) if hashable.count(v) > 1]
    return [
        f"{key}: {value!r} is listed {hashable.count(value)} times; each entry makes its own "
        "cells, so a repeat would run and count them again: list it once"
        for value in twice
    ]


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
