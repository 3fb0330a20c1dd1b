"""The import rule of docs/architecture.md: lower layers never import upper ones.

Read from the source with `ast` (every import, module-level, function-local or TYPE_CHECKING
alike), so a lazy import that crosses a layer is caught as surely as a top-level one. Rules on
what a layer *reaches* follow imports transitively: importing the module pulls all of it in.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_gap"

# The policy layer's wire-level modules (client, server, formats): skills and the executor
# use them. registry and manager turn a config into endpoints and servers, a session's job.
POLICY_WIRE = {
    f"pytest_gap.policies.{m}"
    for m in (
        "builtin",
        "client",
        "endpoint",
        "formats",
        "server",
        "vla_eval_server",
        "warmup",
        "wire",
    )
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(name: str) -> str:
    """The package module an imported name lives in (`pytest_gap.sim.backend.Env` -> the
    module `pytest_gap.sim.backend`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


@cache
def imports(module: str) -> frozenset[str]:
    """The package modules `module` imports directly (and `pytest`, if it imports it)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "pytest":
                found.add("pytest")
            elif name.startswith("pytest_gap"):
                found.add(_resolve(name))
    found.discard(module)
    return frozenset(found)


@cache
def reaches(module: str) -> frozenset[str]:
    """Every package module importing `module` can pull in, and `pytest` if one of them does."""
    seen, todo = set(), [module]
    while todo:
        for name in imports(todo.pop()):
            if name not in seen:
                seen.add(name)
                if name in MODULES:
                    todo.append(name)
    return frozenset(seen)


def _in(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


UPPER = ("pytest_gap.plugin", "pytest_gap.hookspecs", "pytest_gap.outputs", "pytest_gap.cli")
SESSION = (
    "pytest_gap.benchmark",
    "pytest_gap.preflight",
    "pytest_gap.runner",
    "pytest_gap.report",
    "pytest_gap.gate",
    "pytest_gap.cell_summary",
    "pytest_gap.provenance",
    "pytest_gap.compare",
)
BENCHMARK = ("pytest_gap.config", "pytest_gap.plan", "pytest_gap.modes", "pytest_gap.producers")

# (who, what it must never reach, transitively). `pytest` stands for the pytest package.
REACH_RULES = [
    # The simulator layer: errors only (and itself); no pytest, no benchmark, no policy.
    (
        "pytest_gap.sim",
        (
            "pytest",
            *UPPER,
            *SESSION,
            *BENCHMARK,
            "pytest_gap.results",
            "pytest_gap.policies",
            "pytest_gap.skills",
            "pytest_gap.workflow",
        ),
    ),
    # Policies on the wire, skills and workflows know nothing of benchmarks or pytest.
    *[
        (
            m,
            (
                "pytest",
                *UPPER,
                *SESSION,
                *BENCHMARK,
                "pytest_gap.results",
                "pytest_gap.skills",
                "pytest_gap.workflow",
            ),
        )
        for m in sorted(POLICY_WIRE)
    ],
    (
        "pytest_gap.skills",
        ("pytest", *UPPER, *SESSION, *BENCHMARK, "pytest_gap.results", "pytest_gap.workflow"),
    ),
    ("pytest_gap.workflow", ("pytest", *UPPER, *SESSION, *BENCHMARK, "pytest_gap.results")),
    # Reading instructions is pure text: no simulator, no skills (which call it), no LLM.
    *[
        (
            m,
            (
                "pytest",
                *UPPER,
                *SESSION,
                *BENCHMARK,
                "pytest_gap.results",
                "pytest_gap.sim",
                "pytest_gap.policies",
                "pytest_gap.skills",
                "pytest_gap.workflow",
            ),
        )
        for m in (
            "pytest_gap.instructions",
            "pytest_gap.instruction_references",
            "pytest_gap.instruction_stand_ins",
            "pytest_gap.instruction_steps",
        )
    ],
]
# The report viewer and the evaluation service are applications over the session layer: they
# run without pytest (a server host, a laptop opening a report).
REACH_RULES += [
    ("pytest_gap.viz", ("pytest", *UPPER)),
    ("pytest_gap.service", ("pytest", *UPPER)),
    ("pytest_gap.progress", ("pytest", *UPPER)),
    # Cutting a plan into shards is a pure function of the plan: every machine computes it.
    ("pytest_gap.scale.shard", ("pytest", *UPPER, *SESSION, "pytest_gap.results")),
    ("pytest_gap.scale.merge", ("pytest", *UPPER)),  # its session is merge_session's
    # The Ray executor runs on nodes without pytest; the plugin drives it, not the reverse.
    *[
        (f"pytest_gap.scale.{m}", ("pytest", *UPPER))
        for m in ("dispatch", "ray_actor", "ray_cluster", "ray_executor", "ray_policy")
    ],
]
# (who, what it must never import directly): the layers above reach the ones below only.
IMPORT_RULES = [
    ("pytest_gap.config", ("pytest", *UPPER, *SESSION, "pytest_gap.results")),
    ("pytest_gap.plan", ("pytest", *UPPER, *SESSION, "pytest_gap.results")),
    ("pytest_gap.modes", ("pytest", *UPPER, *SESSION, "pytest_gap.config", "pytest_gap.plan")),
    ("pytest_gap.producers", ("pytest", *UPPER, *SESSION)),
    ("pytest_gap.policies", ("pytest", *UPPER, *SESSION)),
    ("pytest_gap.results", ("pytest", *UPPER, *SESSION)),
    *[
        (m, ("pytest", *UPPER, "pytest_gap.runner", "pytest_gap.benchmark"))
        for m in ("pytest_gap.report", "pytest_gap.gate", "pytest_gap.cell_summary")
    ],
    (
        "pytest_gap.runner",
        (
            "pytest",
            *UPPER,
            "pytest_gap.benchmark",
            "pytest_gap.preflight",
            "pytest_gap.report",
            "pytest_gap.gate",
            "pytest_gap.cell_summary",
        ),
    ),
    ("pytest_gap.preflight", ("pytest", *UPPER, "pytest_gap.runner", "pytest_gap.benchmark")),
    (
        "pytest_gap.outputs",
        ("pytest_gap.plugin", "pytest_gap.cli", "pytest_gap.runner", "pytest_gap.benchmark"),
    ),
]


def _violations(rules, edges) -> list[str]:
    found = []
    for who, banned in rules:
        for module in sorted(m for m in MODULES if _in(m, who)):
            for name in sorted(edges(module)):
                if _in(name, *banned) and not _in(name, who):
                    found.append(f"{module} -> {name}")
    return found


def test_the_rules_read_every_import():
    """The reader sees lazy, relative and TYPE_CHECKING imports (a broken reader passes all)."""
    assert "pytest_gap.sim.backend" in imports("pytest_gap.runner")  # function-local
    assert "pytest_gap.producers.base" in imports("pytest_gap.modes")  # TYPE_CHECKING
    assert "pytest_gap.policies.endpoint" in imports("pytest_gap.skills.context")
    assert "pytest" in imports("pytest_gap.plugin")
    assert "pytest_gap.config.document" in reaches("pytest_gap.policies.registry")
    assert _violations([("pytest_gap.sim", ("pytest_gap.errors",))], imports) != []


@pytest.mark.parametrize(
    "rules, edges", [(REACH_RULES, reaches), (IMPORT_RULES, imports)], ids=["reach", "import"]
)
def test_lower_layers_never_import_upper_ones(rules, edges):
    assert _violations(rules, edges) == []


def test_only_the_pytest_glue_imports_pytest():
    users = sorted(m for m in MODULES if "pytest" in imports(m))
    assert users == [
        "pytest_gap.benchmark",  # GAP_PARALLEL_INPROC=1: the session in this process
        "pytest_gap.hookspecs",
        "pytest_gap.outputs",
        *sorted(
            m for m in MODULES if m.startswith("pytest_gap.outputs.") and "pytest" in imports(m)
        ),
        "pytest_gap.plugin",
        "pytest_gap.scale.merge_session",  # gap merge: a session over the config, no trial
        "pytest_gap.scheduling",  # xdist's Scheduling protocol (a collection-diff report)
    ]


# The config package, bottom to top: each module imports only those before it (document.py's
# docstring and the package's say why), and none imports the package itself (its __init__
# re-exports everything for the API and tests, so importing it would pull the whole package).
CONFIG_ORDER = [
    "keys",
    "llm",
    "messages",
    "reader",
    "remote",
    "policies",
    "model",
    "checks",
    "document",
]


def test_the_config_package_is_layered():
    modules = {f"pytest_gap.config.{m}" for m in CONFIG_ORDER}
    assert modules | {"pytest_gap.config"} == {m for m in MODULES if _in(m, "pytest_gap.config")}
    found = []
    for i, name in enumerate(CONFIG_ORDER):
        allowed = {f"pytest_gap.config.{m}" for m in CONFIG_ORDER[:i]}
        for target in imports(f"pytest_gap.config.{name}"):
            if _in(target, "pytest_gap.config") and target not in allowed:
                found.append(f"pytest_gap.config.{name} -> {target}")
    users = [m for m in MODULES if "pytest_gap.config" in imports(m) and m != "pytest_gap.config"]
    assert found == [] and users == []


# Trial names and run-dir names are made and read in ids.py and layout.py only: elsewhere a
# node id split by hand, a key cut with rsplit or a record's file name spelled out would drift
# from them. A "::" alone is an IPv6 address (bind.py's any-address, loopback names).
NAMING_HOMES = {"pytest_gap.ids", "pytest_gap.layout"}
IPV6_LITERALS = {"::", "::1"}
RUN_DIR_FILES = {
    "result.json",
    "running.json",
    "summary.json",
    "summary.tsv",
    "run_manifest.json",
    "cell_result.json",
    "episodes.parquet",
    "aaa_done_flag.txt",
}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            found.add(id(first.value))
    return found


def _naming_by_hand(module: str) -> list[str]:
    tree = ast.parse(MODULES[module].read_text())
    skip, found = _docstrings(tree), []
    in_fstrings = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        where = f"{module}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            ipv6 = node.value in IPV6_LITERALS and id(node) not in in_fstrings
            if "::" in node.value and not ipv6:
                found.append(f"{where} a node id part {node.value!r}")
            if node.value in RUN_DIR_FILES:
                found.append(f"{where} a run-dir name {node.value!r}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            first = next((a.value for a in node.args[:1] if isinstance(a, ast.Constant)), None)
            if (node.func.attr, first) == ("rsplit", "/"):
                found.append(f"{where} a key taken apart by hand (rsplit)")
        if isinstance(node, ast.JoinedStr):
            for before, after in zip(node.values, node.values[1:], strict=False):
                by_hand = isinstance(before, ast.Constant) and isinstance(after, ast.FormattedValue)
                if by_hand and str(before.value).endswith(("task_", "seed_", "task", "seed")):
                    found.append(f"{where} a task or seed part built by hand")
    return found


def test_trial_and_run_dir_names_are_made_in_ids_and_layout_only():
    found = [f for m in sorted(MODULES) if m not in NAMING_HOMES for f in _naming_by_hand(m)]
    assert found == []
    # the check sees what it looks for
    assert _naming_by_hand("pytest_gap.ids") and _naming_by_hand("pytest_gap.layout")


# -- inside a package: no import circle, no other module's private name ---------------------------
def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of a graph (module -> modules it imports): each strongly connected
    component of more than one module, sorted (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def _package_circles(package: str) -> list[list[str]]:
    inside = [m for m in MODULES if _in(m, package) and m != package]
    return _circles({m: {n for n in imports(m) if n in inside} for m in inside})


def _private_uses(source: str, module: str) -> list[str]:
    """The private names (`_name`, not dunders) of other package modules that `source` (the
    text of `module`) uses: imported by name (`from pytest_gap.x import _y`) or read off an
    imported module (`x._y`), lazy imports included."""
    parts = module.split(".")[:-1]  # the module's package
    bound: dict[str, str] = {}  # a local name -> the package module it stands for
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound.update({a.asname: a.name for a in node.names if a.asname and a.name in MODULES})
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
        for a in node.names:
            if f"{base}.{a.name}" in MODULES:
                bound[a.asname or a.name] = f"{base}.{a.name}"
            elif base.startswith("pytest_gap") and base != module and _private(a.name):
                found.append(f"{module} imports {base}.{a.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and bound.get(node.value.id, module) != module
            and _private(node.attr)
        ):
            found.append(f"{module} reads {bound[node.value.id]}.{node.attr}")
    return sorted(set(found))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_the_package_checks_see_circles_and_private_names():
    """A broken check passes everything: each one finds what it looks for."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
    source = (
        "from pytest_gap.skills import motion\n"
        "from pytest_gap.skills.gripper import _hidden, CLOSE\n"
        "def f():\n"
        "    from pytest_gap.skills import perception as seen\n"
        "    return motion._secret, seen._sites, motion.__name__, motion.servo\n"
    )
    assert _private_uses(source, "pytest_gap.skills.some") == [
        "pytest_gap.skills.some imports pytest_gap.skills.gripper._hidden",
        "pytest_gap.skills.some reads pytest_gap.skills.motion._secret",
        "pytest_gap.skills.some reads pytest_gap.skills.perception._sites",
    ]


def test_skills_has_no_import_circle_and_reads_no_private_name_across_modules():
    """skills/ is layered (registry, the helpers, the skills, the catalogue on top): no circle,
    lazy imports included, so no import sits in a function to dodge one; and one module's
    private helper is not another's (shared ones are public where they belong: gripper.py)."""
    assert _package_circles("pytest_gap.skills") == []
    skills = sorted(m for m in MODULES if _in(m, "pytest_gap.skills"))
    assert [u for m in skills for u in _private_uses(MODULES[m].read_text(), m)] == []


# Packages of the session layer split by job (compare/, viz/): their modules import each other,
# never the package itself (compare/'s __init__ re-exports its modules for the CLI, the viewer
# and tests, so importing it from inside would run in a circle), and read no private name of
# another module.
@pytest.mark.parametrize("package", ["pytest_gap.compare", "pytest_gap.viz"])
def test_session_packages_have_no_circle_and_read_no_private_name_across_modules(package):
    inside = sorted(m for m in MODULES if _in(m, package) and m != package)
    assert len(inside) > 1
    assert _package_circles(package) == []
    assert [m for m in inside if package in imports(m)] == []
    assert [u for m in inside for u in _private_uses(MODULES[m].read_text(), m)] == []
