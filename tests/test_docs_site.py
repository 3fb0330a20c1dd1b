"""The docs site (mkdocs.yml) builds strictly, its reference pages are generated from the code
(every config key the models validate, every `gap` command), and a built page loads nothing
from the network."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from pytest_gap.config.document import BenchmarkConfig
from pytest_gap.config.reference import key_rows

ROOT = Path(__file__).resolve().parent.parent


def test_the_config_reference_reads_types_defaults_bounds_and_comments_from_the_models():
    rows = {r.key: r for r in key_rows(BenchmarkConfig)}
    threshold = rows["benchmark.gate_threshold"]
    assert (threshold.type, threshold.default, threshold.allowed) == (
        "float",
        "0.9",
        ">= 0.0, <= 1.0",
    )
    rule = rows["benchmark.gate_rule"]
    assert rule.allowed == "'point', 'wilson', 'sequential'" and rule.default == "'point'"
    # a description from the comment above the field, and a nested model's keys under it
    assert "matched control arm" in rows["benchmark.controls"].description
    assert rows["benchmark.mode_overrides.<id>.template"].type == "str | null"
    assert "policies.<id>.url" in rows and "suites[].suite_name" in rows
    assert "source" not in rows  # set by the loader, never by a user
    assert not any("Usage Documentation" in r.description for r in rows.values())
    # a key added without a word on what it does fails here, naming it
    assert [key for key, row in rows.items() if not row.description] == []


def test_every_run_dir_name_and_record_field_has_a_description():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from docs_hooks import layout_names
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    from pytest_gap import layout
    from pytest_gap.cell_summary import CellSummary
    from pytest_gap.results import TrialResult

    names = {const: (name, note) for const, name, note in layout_names()}
    assert names["RESULT_FILE"][0] == layout.RESULT_FILE and "plots" in dict(names.values())
    assert [const for const, (_, note) in names.items() if not note] == []
    for model in (TrialResult, CellSummary):
        rows = key_rows(model)
        assert {"seed", "success"} <= {r.key for r in rows} or "n_trials" in {r.key for r in rows}
        assert [r.key for r in rows if not r.description] == [], model.__name__


def build_site(site: Path) -> Path:
    """`mkdocs build --strict` of the repository's site into `site` (any warning fails it)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(site)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return site


def test_the_site_builds_strictly_with_generated_references_and_nothing_fetched(tmp_path):
    site = build_site(tmp_path / "site")
    config_page = (site / "reference/config/index.html").read_text()
    for row in key_rows(BenchmarkConfig):
        assert row.key.replace("<", "&lt;").replace(">", "&gt;") in config_page, row.key
    cli_page = (site / "reference/cli/index.html").read_text()
    for command in ("benchmark", "compare", "viz", "families", "policy", "serve", "run"):
        assert f"gap {command}" in cli_page, command
    assert "--controls" in cli_page  # an argument added this week is there without an edit
    pages = {name: (site / f"reference/{name}/index.html").read_text() for name in
             ("pytest", "hooks", "skills", "parquet")}  # fmt: skip
    assert "--gap-resume" in pages["pytest"] and "gap_benchmark_dirs" in pages["pytest"]
    from pytest_gap import hookspecs
    from pytest_gap.outputs.parquet import SCHEMA

    hooks = [n for n in vars(hookspecs) if n.startswith("pytest_gap_")]
    assert hooks and all(n in pages["hooks"] for n in hooks)
    # the catalogue a fresh process has (this one's may hold skills other tests registered)
    listed = subprocess.run(
        [sys.executable, "-m", "pytest_gap.cli", "skills", "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert all(entry["name"] in pages["skills"] for entry in json.loads(listed))
    assert all(field.name in pages["parquet"] for field in SCHEMA)
    from pytest_gap import layout
    from pytest_gap.cell_summary import CellSummary
    from pytest_gap.report import CONTROL_COLUMNS, TSV_COLUMNS
    from pytest_gap.results import TrialResult

    run_dir = (site / "reference/run-dir/index.html").read_text()
    for name in (layout.SUMMARY_TSV, layout.RESULT_FILE, layout.DONE_FLAG, layout.WARMUP_DIR):
        assert f"<code>{name}</code>" in run_dir, name
    fields = [r.key for model in (TrialResult, CellSummary) for r in key_rows(model)]
    assert all(f"<code>{f}</code>" in run_dir for f in [*fields, *TSV_COLUMNS, *CONTROL_COLUMNS])
    for page in site.rglob("*.html"):
        text = page.read_text()
        loaded = re.findall(r'<(?:script|img)[^>]+src="(https?://[^"]+)"', text)
        loaded += re.findall(r'<link[^>]+rel="stylesheet"[^>]+href="(https?://[^"]+)"', text)
        assert loaded == [], f"{page.relative_to(site)} fetches {loaded}"


def test_the_readme_is_a_front_door_whose_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    # the two commands come first, and the second is exactly what CI runs
    commands = [line for line in readme.splitlines() if line.startswith("bash scripts/setup.sh")]
    ci = (ROOT / ".ci/run").read_text().strip().splitlines()[-1]
    assert commands[0].endswith("pytest benchmarks/ -n 2") and commands[1].endswith(ci)
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), f"README links to {target}, which is not there"


def test_the_service_pages_split_and_submission_are_what_a_server_takes(tmp_path):
    """docs/service.md's splits.yaml and run.yaml, read as `gap serve --splits` and a submission
    are: the split file loads, and the submission plans the split's seeds and tasks."""
    from pytest_gap.service import runs
    from pytest_gap.service.limits import ServiceLimits
    from pytest_gap.service.splits import load_splits

    page = (ROOT / "docs/service.md").read_text()
    blocks = dict(re.findall(r"```yaml\n# (\S+) [^\n]*\n(.*?)```", page, re.S))
    (tmp_path / "splits.yaml").write_text(blocks["splits.yaml"])
    splits = load_splits(tmp_path / "splits.yaml")
    _, cells, split = runs._config(
        blocks["run.yaml"], "run.yaml", tmp_path, splits, ServiceLimits()
    )
    assert split == "test"
    trials = [t for cell in cells for t in cell.trials()]
    assert sorted({t.seed for t in trials}) == splits["test"].seeds


def _defined(path: Path) -> set[str]:
    """The names a module's source defines at its top level and in its classes (no import)."""
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):  # a name a package re-exports
            names |= {a.asname or a.name for a in node.names}
    return names


def _missing_reference(ref: str) -> str | None:
    """None if `ref` (`pytest_gap/x/y.py`, a folder, or `pytest_gap.x.y[.name[.attr]]`) names
    what is there; else what is not."""
    if "/" in ref:
        return None if (ROOT / ref.rstrip("/")).exists() else "no such file"
    parts = ref.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        module = (
            base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        )
        if module.is_file():
            rest = parts[cut:]
            if not rest or rest[0] in _defined(module) or (base / f"{rest[0]}.py").is_file():
                return None
            return f"{'.'.join(parts[:cut])} defines no {rest[0]}"
    return "no such module"


def test_every_package_path_and_module_the_docs_name_exists():
    """A module moved or renamed leaves no page pointing at its old place: every
    `pytest_gap/...` path and `pytest_gap....` dotted name in docs/ and the README is there."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    pattern = re.compile(r"pytest_gap(?:/[\w.]+)+/?|pytest_gap(?:\.\w+)+")
    # Dotted names the package itself uses as names (an entry-point group): not modules.
    source = "".join(p.read_text() for p in (ROOT / "pytest_gap").rglob("*.py"))
    wrong = []
    for page in pages:
        for ref in sorted(set(pattern.findall(page.read_text()))):
            ref = ref.rstrip(".")
            if f'"{ref}"' in source:
                continue
            problem = _missing_reference(ref.split(":")[0])
            if problem:
                wrong.append(f"{page.relative_to(ROOT)}: {ref}: {problem}")
    assert wrong == []
