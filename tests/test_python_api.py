"""The Python API's names (pytest_gap.benchmark), as the spec lists them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_name_the_spec_lists_is_exported():
    from pytest_gap import benchmark
    from pytest_gap.benchmark import (  # noqa: F401
        DEFAULT_GATE_THRESHOLD,
        FAMILY_SUITES,
        KNOWN_FAMILIES,
        KNOWN_MODES,
        POSVAR_SUITES,
        BenchmarkConfig,
        BenchmarkModeOverride,
        BenchmarkSummary,
        run,
        run_benchmark,
    )

    assert {"FAMILY_SUITES", "KNOWN_FAMILIES", "POSVAR_SUITES"} <= set(benchmark.__all__)
    assert DEFAULT_GATE_THRESHOLD == 0.90
    assert {"llm_generation", "llm_plus_policy", "policy_only"} <= set(KNOWN_MODES)
    config = BenchmarkConfig.from_yaml(ROOT / "benchmarks/grid.yaml")
    assert isinstance(config, BenchmarkConfig) and config.benchmark is not None
    assert set(BenchmarkSummary.model_fields) >= {
        "ok", "gated", "gate_threshold", "success_rate", "completion_rate", "n_trials",
        "n_success", "run_dir", "cells", "summary",
    }  # fmt: skip


def test_the_family_tables_are_the_registered_families():
    from pytest_gap.benchmark import FAMILY_SUITES, KNOWN_FAMILIES, POSVAR_SUITES
    from pytest_gap.sim.backend import get_backend

    families = get_backend("libero").families()
    assert tuple(families) == KNOWN_FAMILIES
    assert {f: list(v) for f, v in FAMILY_SUITES.items()} == {
        name: family.variations() for name, family in families.items()
    }
    assert FAMILY_SUITES["posvar"] == POSVAR_SUITES
    assert POSVAR_SUITES["basket_swap"] == "libero_object"  # as `gap families` says
    assert FAMILY_SUITES["libero_pro"]["object_swap"] == "libero_object_swap"
    FAMILY_SUITES["posvar"]["x"] = "y"  # a copy: the next reader is not affected
    from pytest_gap import benchmark

    assert "x" not in benchmark.FAMILY_SUITES["posvar"]


def test_importing_the_api_does_not_import_the_simulator():
    code = (
        "import sys, pytest_gap.benchmark;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('libero', 'robosuite')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stderr
