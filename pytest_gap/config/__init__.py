"""Benchmark YAML -> BenchmarkConfig: both shapes, every key and default, all errors at once.

One way in, for files and for text from the network alike: `document.load_config` reads with
the hardened reader (reader.py), holds a submission to the remote profile (remote.py, from the
marks of keys.py), validates the models (llm.py, policies.py, model.py, document.py), runs the
checks pydantic cannot express (checks.py) and reports every problem in one ConfigError, a line
each naming the file and the key (messages.py).

The package's modules import each other in that order and never import this file; the names
below are re-exported for the Python API, tests and scripts. Modules of pytest_gap import from
the module that defines a name.
"""

from pytest_gap.config.checks import semantic_problems, suite_variation
from pytest_gap.config.document import (
    IMPLICIT_POLICY,
    BenchmarkConfig,
    implicit_policy_modes,
    json_schema,
    load_config,
    parse_config,
)
from pytest_gap.config.keys import Profile, RemoteValue, ServerOnly, Strict
from pytest_gap.config.llm import LLMConfig
from pytest_gap.config.messages import EMPTY_HINT, ConfigError
from pytest_gap.config.model import (
    DEFAULT_GATE_THRESHOLD,
    DEFAULT_MODES,
    FRAMES_EVERY_HINT,
    KNOWN_MODES,
    MAX_SEEDS,
    MAX_WORKERS,
    BenchmarkBlock,
    CompositionConfig,
    GateRule,
    ModeOverride,
    Perception,
    SequentialGate,
    SkillsConfig,
    SuiteEntry,
    TrialsConfig,
)
from pytest_gap.config.policies import (
    PolicyEntry,
    PolicyManagerConfig,
    RayResources,
    websocket_url_problem,
)
from pytest_gap.config.reader import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_VALUES,
    read_yaml,
    read_yaml_text,
)
from pytest_gap.config.remote import remote_problems

__all__ = [
    "DEFAULT_GATE_THRESHOLD",
    "DEFAULT_MODES",
    "EMPTY_HINT",
    "FRAMES_EVERY_HINT",
    "IMPLICIT_POLICY",
    "KNOWN_MODES",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_VALUES",
    "MAX_SEEDS",
    "MAX_WORKERS",
    "BenchmarkBlock",
    "BenchmarkConfig",
    "CompositionConfig",
    "ConfigError",
    "GateRule",
    "LLMConfig",
    "ModeOverride",
    "Perception",
    "PolicyEntry",
    "PolicyManagerConfig",
    "Profile",
    "RayResources",
    "RemoteValue",
    "SequentialGate",
    "ServerOnly",
    "SkillsConfig",
    "Strict",
    "SuiteEntry",
    "TrialsConfig",
    "implicit_policy_modes",
    "json_schema",
    "load_config",
    "parse_config",
    "read_yaml",
    "read_yaml_text",
    "remote_problems",
    "semantic_problems",
    "suite_variation",
    "websocket_url_problem",
]
