"""Which files of a session are benchmark configs, and which node ids are trials.

A YAML is a benchmark config when the command line names it, or when it lies under one of the
`gap_benchmark_dirs` (ini, relative to rootdir): a test suite's other YAML files are left to
other plugins. A trial's node id is `<config yaml>::<trial id>` (ids.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gap import ids

BENCHMARK_SUFFIXES = (".yaml", ".yml")


def is_trial_nodeid(nodeid: str) -> bool:
    path, rest = ids.split_node_id(nodeid)
    return bool(rest) and Path(path).suffix in BENCHMARK_SUFFIXES


def is_benchmark_file(config: pytest.Config, file_path: Path) -> bool:
    """A YAML named on the command line, or one under a gap_benchmark_dirs directory."""
    if file_path.suffix not in BENCHMARK_SUFFIXES:
        return False
    explicit = {Path(config.invocation_params.dir, ids.path_of(a)).resolve() for a in config.args}
    roots = [(config.rootpath / d).resolve() for d in config.getini("gap_benchmark_dirs")]
    resolved = file_path.resolve()
    return resolved in explicit or any(root in resolved.parents for root in roots)


def is_benchmark_arg(config: pytest.Config, arg: str) -> bool:
    path = Path(config.invocation_params.dir, ids.path_of(arg)).resolve()
    if path.suffix in BENCHMARK_SUFFIXES:
        return True
    roots = [(config.rootpath / d).resolve() for d in config.getini("gap_benchmark_dirs")]
    return any(path == root or root in path.parents for root in roots)


def session_config_paths(config: pytest.Config) -> list[Path]:
    """The benchmark configs the session's arguments name (a file, or the YAMLs of a dir)."""
    paths = []
    for arg in config.args:
        path = Path(config.invocation_params.dir, ids.path_of(arg)).resolve()
        candidates = [path] if path.is_file() else sorted(path.rglob("*.y*ml"))
        paths += [p for p in candidates if is_benchmark_file(config, p)]
    return list(dict.fromkeys(paths))
