"""A corpus of malformed benchmark configs: each is refused with one line per problem, naming the
offending key, with exit 2, no traceback and no run dir.

The configs that can be stored are tests/malformed_configs/*.yaml; the first line of each says
what the error must name (`# expect: KEY`; none: the file is empty). Those that cannot be stored
as readable files (binary, over the size limit, nested too deeply, not UTF-8) are made here.
Every one goes through load_config and through `gap benchmark`'s own code (cli.main, in this
process); a representative few also through a real `gap benchmark` process and a real pytest
session. Validation fails before any simulator is built, so the whole corpus takes seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gap import cli
from pytest_gap.config import MAX_CONFIG_BYTES, ConfigError, load_config

CORPUS = Path(__file__).resolve().parent / "malformed_configs"
GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"
_PAD = b"# padding, as a log or a dataset pasted by mistake would be\n"

# name -> (file content, what the error names)
GENERATED: dict[str, tuple[bytes, str]] = {
    "binary": (bytes([0x87, 0xFF, 0x00, 0x13]) * 64, "not UTF-8"),
    "latin1": ("benchmark: {families: [café]}\n".encode("latin-1"), "not UTF-8"),
    "nul_bytes": (b"benchmark:\x00 {}\n", "line 1"),
    "huge": (b"benchmark: {}\n" + _PAD * (MAX_CONFIG_BYTES // len(_PAD) + 1), "1 MiB limit"),
    "deep_nesting": (b"benchmark: {families: " + b"[" * 5000 + b"]" * 5000 + b"}\n", "nested"),
}


# Secrets two corpus configs carry where an error names them (secret_wrong_type,
# policy_url_with_password): no message may show them.
SECRETS = ("1234567890123", "hunter2secret")


def _expected(path: Path) -> str:
    first = path.read_text().partition("\n")[0]
    return first.partition("# expect:")[2].strip() or "the file is empty"


CASES = {p.stem: (p.read_bytes(), _expected(p)) for p in sorted(CORPUS.glob("*.yaml"))}
CASES.update(GENERATED)


def _place(tmp_path: Path, name: str) -> tuple[Path, str]:
    """The config alone in an empty directory: a run dir would appear beside it."""
    content, expect = CASES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(content)
    return path, expect


def _left_behind(tmp_path: Path, config: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p != config)


def test_the_corpus_covers_every_kind_of_bad_input():
    assert len(CASES) >= 30
    kinds = {
        "binary",
        "huge",
        "empty",
        "alias_bomb",
        "python_object_tag",
        "both_shapes",
        "duplicate_policies",
        "policy_url_http",
        "n_seeds_zero",
        "unknown_family",
        "n_seeds_word",
    }
    assert kinds <= set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_config_is_refused_in_one_line_per_problem(name, tmp_path, capsys, monkeypatch):
    path, expect = _place(tmp_path, name)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    problems = info.value.problems
    assert problems and all("\n" not in p and len(p) < 400 for p in problems), problems
    assert any(expect in p for p in problems), problems
    # `gap benchmark` on it: exit 2, the same lines (one per problem), nothing started
    code = cli.main(["benchmark", str(path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert not [secret for secret in SECRETS if secret in err]
    lines = err.strip().splitlines()
    assert len(lines) == len(problems), err
    assert all(str(path) in line for line in lines) and expect in err
    assert _left_behind(tmp_path, path) == []


@pytest.mark.parametrize(
    "name", ["binary", "alias_bomb", "python_object_tag", "duplicate_policies", "policy_url_http"]
)
def test_gap_benchmark_process_refuses_it_in_one_line(name, tmp_path):
    path, expect = _place(tmp_path, name)
    out = subprocess.run(
        [GAP, "benchmark", str(path)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert expect in out.stderr and str(path) in out.stderr
    assert _left_behind(tmp_path, path) == []


@pytest.mark.parametrize(
    "name", ["binary", "huge", "python_object_tag", "both_shapes", "duplicate_policies"]
)
def test_pytest_session_refuses_it_as_one_collection_error(name, tmp_path):
    """`pytest CONFIG`: a collection error (exit 2) whose message is the config's one line; no
    INTERNALERROR, no traceback, no run dir."""
    path, expect = _place(tmp_path, name)
    report = tmp_path.parent / f"{tmp_path.name}-report.json"  # what `gap benchmark` reads
    command = [sys.executable, "-m", "pytest", path.name, f"--gap-report-json={report}"]
    out = subprocess.run(
        [*command, "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    output = out.stdout + out.stderr
    assert out.returncode == 2, output
    assert "Traceback" not in output and "INTERNALERROR" not in output, output
    errors = [line for line in output.splitlines() if line.startswith(f"{path}:")]
    assert len(errors) == 1 and expect in errors[0], output
    assert _left_behind(tmp_path, path) == []
    # the session tells `gap benchmark` it stopped on a config problem (exit 2 there)
    stopped = json.loads(report.read_text())
    assert stopped["error"] == stopped["stopped"] == errors[0] and stopped["configs"] == []
