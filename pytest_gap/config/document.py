"""The whole benchmark config (`BenchmarkConfig`) and the one way it is loaded (`load_config`).

A benchmark YAML is standalone (no `base:` inheritance) and has one of two shapes:
- grid: a `benchmark:` block sweeps modes x (family, variation) x policies;
- suites: no `benchmark:` block; the `suites:` list is the cell axis.
Relative paths resolve against the YAML's directory. Every problem is reported in one
ConfigError, one line per problem, each naming the file and the key path.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from pytest_gap.config.checks import semantic_problems
from pytest_gap.config.keys import SERVER_PATH, Profile, RemoteValue, Strict
from pytest_gap.config.llm import LLMConfig
from pytest_gap.config.messages import EMPTY_HINT, ConfigError, describe_all
from pytest_gap.config.model import (
    DEFAULT_GATE_THRESHOLD,
    ABCompare,
    BaselineGate,
    BenchmarkBlock,
    CompositionConfig,
    GateRule,
    SequentialGate,
    SkillsConfig,
    SuiteEntry,
    TrialsConfig,
    installed_backend,
)
from pytest_gap.config.policies import PolicyEntry, PolicyId, PolicyManagerConfig
from pytest_gap.config.reader import read_yaml, read_yaml_text
from pytest_gap.config.remote import remote_problems
from pytest_gap.modes import BUILTIN, ModeTable
from pytest_gap.redaction import redact_tree
from pytest_gap.skills.catalogue import package_problems
from pytest_gap.skills.packages import is_directory_entry

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


class BenchmarkConfig(Strict):
    """A whole benchmark YAML. `source` is the file it came from (set by `load_config`)."""

    # auto: each task's instruction comes from LIBERO's metadata (the spec's only value).
    task: str = "auto"
    # Suites mode's simulator backend (grid mode's lives in benchmark.backend).
    backend: Annotated[str, RemoteValue(installed_backend)] = "libero"
    llm: LLMConfig = LLMConfig()
    skills: SkillsConfig = SkillsConfig()
    # The policy registry: id -> where its server is or how to start it.
    policies: dict[PolicyId, PolicyEntry] = {}
    policy_manager: PolicyManagerConfig = PolicyManagerConfig()
    trials: TrialsConfig = TrialsConfig()
    composition: CompositionConfig = CompositionConfig()
    # Present: the grid shape (modes x families/variations x policies).
    benchmark: BenchmarkBlock | None = None
    # Without a benchmark block: the suites shape, one cell per entry.
    suites: list[SuiteEntry] | None = None
    # Suites mode's gate threshold and rule (grid mode's live in the benchmark: block).
    gate_threshold: float = Field(default=DEFAULT_GATE_THRESHOLD, ge=0.0, le=1.0)
    # Suites mode's gate rule: point, wilson or sequential (as benchmark.gate_rule).
    gate_rule: GateRule = "point"
    # Suites mode's sequential settings (as benchmark.sequential).
    sequential: SequentialGate = SequentialGate()
    # Both shapes: the regression gate against a baseline run (baseline.py).
    gate: BaselineGate = BaselineGate()
    # A grid's two policies as a sequential A/B test (ab_gate.py).
    compare: ABCompare | None = None
    # A config submitted to an evaluation server with splits (`gap serve --splits`): the split
    # it runs on. The server's split decides its seeds, tasks, step limit and template, and
    # takes this key off before the config is read; anywhere else it is refused.
    split: Literal["val_train", "val_unseen", "test"] | None = None
    # An inert marker of smoke configs (the spec's); changes nothing.
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
    def sequential_gate(self) -> SequentialGate:
        """How `gate_rule: sequential` decides (the grid's, or the suites config's)."""
        return self.benchmark.sequential if self.benchmark else self.sequential

    @property
    def block_seeds(self) -> int:
        """Seeds of every task per block when a gate looks after blocks (0: no blocks)."""
        if self.compare is not None:
            return self.compare.block_seeds
        if self.gate.sequential:
            return self.gate.block_seeds
        return self.sequential_gate.block_seeds if self.rule == "sequential" else 0

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


def _resolve_paths(config: BenchmarkConfig, base: Path) -> None:
    def fix(path: Path | None) -> Path | None:
        return None if path is None else (base / path).expanduser().resolve()

    config.trials.output_dir = fix(config.trials.output_dir)
    config.gate.baseline = fix(config.gate.baseline)
    if config.llm.cache_dir is not None:
        config.llm.cache_dir = fix(config.llm.cache_dir)
    if config.benchmark is not None:
        config.benchmark.output_dir = fix(config.benchmark.output_dir)
        for override in config.benchmark.mode_overrides.values():
            override.workflow_dir = fix(override.workflow_dir)
    for entry in config.suites or []:
        entry.workflow_dir = fix(entry.workflow_dir)
    # A directory entry stays right when the config is written anew (the Python API does).
    config.skills.packages = [
        str(fix(Path(p).expanduser())) if is_directory_entry(p) else p
        for p in config.skills.packages
    ]


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
        refused = remote_problems(data, BenchmarkConfig)
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
        problems += describe_all(exc.errors(), body, BenchmarkConfig)
    skills = body.get("skills")
    if isinstance(skills, dict):  # before the workflows are checked: they may call these skills
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


def load_config(
    source: str | Path,
    *,
    text: str | None = None,
    profile: Profile = "file",
    base: Path | None = None,
    mode_table: ModeTable | None = None,
    amend: Callable[[dict], dict] | None = None,
) -> BenchmarkConfig:
    """The one way a config is loaded, by every entry point (the plugin, `gap benchmark`, the
    Python API, the evaluation service, merge): the hardened reader, then `parse_config`.

    `source` is the file to read, or, with `text` (a config that arrived as text), the name
    its messages give it. `profile="remote"` (a submission): the remote profile is checked on
    the data as read, before `amend` adds anything to it (a service's split: its seeds, tasks,
    step limit). `base`: where relative paths resolve (default: the file's directory).
    ConfigError lists every problem."""
    if text is None:
        path = Path(source)
        data = read_yaml(path)
        base = base or path.parent.resolve()
    else:
        data = read_yaml_text(text, str(source))
    if profile == "remote" and isinstance(data, dict):
        refused = remote_problems(data, BenchmarkConfig)
        if refused:
            raise ConfigError(str(source), refused)
    if amend is not None and isinstance(data, dict):
        data = amend(dict(data))
    return parse_config(data, source, base=base, mode_table=mode_table, profile=profile)


def json_schema() -> dict[str, Any]:
    """JSON Schema of the benchmark YAML, for editor completion and validation."""
    schema = BenchmarkConfig.model_json_schema(by_alias=False)
    schema["properties"].pop("source", None)
    schema["title"] = "pytest-gap benchmark config"
    return schema
