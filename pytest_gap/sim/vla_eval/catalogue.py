"""What vla-eval offers this backend, read without importing vla-eval: its benchmark adapters
(`BENCHMARKS`), whether it and each adapter's simulator are installed, its LIBERO suites and
their step limits (read from its source, claims.py), and the `libero` family over them.

Cheap by design: `VlaEvalBackend`'s catalogue (config checks, `gap suites`) runs on it, so
nothing here imports vla-eval, its adapters or a simulator (`vla_eval_version` imports the
package's top module only, when a trial records it).
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from pytest_gap.sim.backend import Variation
from pytest_gap.sim.vla_eval.claims import ClaimBroken, Source, max_step_mapping

NAME = "vla-eval"


@dataclass(frozen=True)
class Benchmark:
    """One vla-eval benchmark adapter and what it needs to run here."""

    name: str
    import_string: str
    simulator: str | None  # the module its adapter imports (None: nothing beyond vla-eval)
    wired: str | None = None  # why it is not wired to this backend yet (None: it is)


# vla-eval 0.8.0's benchmark adapters (vla_eval/benchmarks/*/benchmark.py).
BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("libero", "vla_eval.benchmarks.libero.benchmark:LIBEROBenchmark", "libero.libero"),
    *(
        Benchmark(name, f"vla_eval.benchmarks.{name}.benchmark:{cls}", sim, wired)
        for name, cls, sim, wired in (
            (
                "libero_pro",
                "LIBEROProBenchmark",
                "libero.libero",
                "not wired yet: its base-suite step limits are unchecked against this catalogue",
            ),
            ("libero_plus", "LIBEROPlusBenchmark", "libero_plus", None),
            ("libero_mem", "LIBEROMemBenchmark", "libero_mem", None),
            ("robocerebra", "RoboCerebraBenchmark", "robocerebra", None),
            ("calvin", "CALVINBenchmark", "calvin_env", None),
            ("simpler", "SimplerEnvBenchmark", "simpler_env", None),
            ("maniskill2", "ManiSkill2Benchmark", "mani_skill2", None),
            ("robomme", "RoboMMEBenchmark", "robomme", None),
            ("mikasa", "MIKASABenchmark", "mikasa_robo_suite", None),
            ("rlbench", "RLBenchBenchmark", "rlbench", None),
            ("robocasa", "RoboCasaBenchmark", "robocasa", None),
            ("robocasa365", "RoboCasa365Benchmark", "robocasa", None),
            ("robotwin", "RoboTwinBenchmark", "envs", None),
            ("vlabench", "VLABenchBenchmark", "VLABench", None),
            ("behavior1k", "Behavior1KBenchmark", "omnigibson", None),
            ("kinetix", "KinetixBenchmark", "kinetix", None),
            ("duobench", "DuoBenchBenchmark", "duobench", None),
            ("molmospaces", "MolmoSpacesBenchmark", "molmo_spaces", None),
            ("robodojo", "RoboDojoBenchmark", "isaaclab", None),
        )
    ),
)
LIBERO = BENCHMARKS[0]


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


@functools.cache
def package_dir() -> Path | None:
    """The installed vla_eval package directory, found without importing it (cheap)."""
    spec = importlib.util.find_spec("vla_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@functools.cache
def libero_step_limits() -> dict[str, int]:
    """vla-eval's LIBERO suites and their step limits, read from its source."""
    root = package_dir()
    if root is None:
        return {}
    try:
        return max_step_mapping(Source(root))
    except (ClaimBroken, SyntaxError):
        return {}  # `gap verify-harness` names the broken claim


def vla_eval_version() -> str:
    from vla_eval import __version__

    return __version__


class LiberoSuites:
    """The `libero` family on vla-eval: its LIBERO suites, unchanged (`libero_<variation>`)."""

    name = "libero"

    def variations(self) -> list[str]:
        return [s.removeprefix("libero_") for s in libero_step_limits()]

    def resolve(self, variation: str) -> Variation:
        return Variation(family=self.name, variation=variation, suite=f"libero_{variation}")
