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


def import_circles(modules, edges=imports) -> list[list[str]]:
    """The import circles among `modules`: each set of two or more of them that import one
    another, directly or through others of them (a strongly connected component), sorted.
    `edges(module)` gives a module's direct imports; imports leaving `modules` are not followed."""
    modules = set(modules)

    def reach(module: str) -> set[str]:
        seen, todo = set(), [module]
        while todo:
            for name in edges(todo.pop()):
                if name in modules and name not in seen:
                    seen.add(name)
                    todo.append(name)
        return seen

    reached = {m: reach(m) for m in modules}
    circles = {
        tuple(sorted({m} | {o for o in reached[m] if m in reached[o]}))
        for m in modules
        if m in reached[m]
    }
    return sorted(list(c) for c in circles)


# The plugin package (docs/architecture.md): its entry module (`pytest_gap.plugin`, the pytest11
# entry point), options, the shared session, collection, the item and its watchdog, how an item
# gets its result, the lead's decisions and lines, the three roles, the xdist schedule.
PLUGIN = tuple(
    f"pytest_gap.plugin{m}"
    for m in (
        "",
        ".collect",
        ".controller",
        ".decisions",
        ".execution",
        ".files",
        ".item",
        ".lead",
        ".options",
        ".reporter",
        ".scheduling",
        ".session",
        ".single",
        ".watchdog",
        ".worker",
    )
)
# The output writers are below the plugin (the evaluation service calls them too: outputs/hook.py)
# but for run_manifest.json's, which reads a pytest session's options.
UPPER = (*PLUGIN, "pytest_gap.hookspecs", "pytest_gap.outputs.manifest", "pytest_gap.cli")
SESSIONLESS_WRITERS = tuple(
    f"pytest_gap.outputs.{m}" for m in ("hook", "tsv", "json", "parquet", "videos", "plots", "done")
)
SESSION = (
    "pytest_gap.benchmark",
    "pytest_gap.session_plan",
    "pytest_gap.servers.preflight",
    "pytest_gap.run",
    "pytest_gap.report",
    "pytest_gap.gate",
    "pytest_gap.cell_summary",
    "pytest_gap.control_drop",
    "pytest_gap.provenance",
    "pytest_gap.compare",
)
BENCHMARK = (
    "pytest_gap.config",
    "pytest_gap.cells",
    "pytest_gap.plan",
    "pytest_gap.control_arms",
    "pytest_gap.modes",
    "pytest_gap.producers",
)

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
    *[(m, ("pytest", *UPPER)) for m in SESSIONLESS_WRITERS],
    # The trial level runs in a pytest worker, a Ray actor and the evaluation service alike, and
    # knows none of them (nor the session's preflight, report or Python API).
    (
        "pytest_gap.run",
        (
            "pytest",
            *UPPER,
            "pytest_gap.service",
            "pytest_gap.scale",
            "pytest_gap.benchmark",
            "pytest_gap.servers.preflight",
            "pytest_gap.report",
        ),
    ),
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
    *[
        (m, ("pytest", *UPPER, *SESSION, "pytest_gap.results"))
        for m in ("pytest_gap.cells", "pytest_gap.plan", "pytest_gap.control_arms")
    ],
    ("pytest_gap.modes", ("pytest", *UPPER, *SESSION, "pytest_gap.config", "pytest_gap.plan")),
    ("pytest_gap.producers", ("pytest", *UPPER, *SESSION)),
    # The wire level knows nothing of the session level's servers (servers/ imports it).
    ("pytest_gap.policies", ("pytest", *UPPER, *SESSION, "pytest_gap.servers")),
    ("pytest_gap.servers", ("pytest", *UPPER, "pytest_gap.run", "pytest_gap.benchmark")),
    ("pytest_gap.results", ("pytest", *UPPER, *SESSION)),
    *[
        (m, ("pytest", *UPPER, "pytest_gap.run", "pytest_gap.benchmark"))
        for m in ("pytest_gap.report", "pytest_gap.gate", "pytest_gap.cell_summary")
    ],
    (
        "pytest_gap.run",
        (
            "pytest",
            *UPPER,
            "pytest_gap.benchmark",
            "pytest_gap.servers.preflight",
            "pytest_gap.report",
            "pytest_gap.gate",
            "pytest_gap.cell_summary",
        ),
    ),
    ("pytest_gap.servers.preflight", ("pytest", *UPPER, "pytest_gap.run", "pytest_gap.benchmark")),
    (
        "pytest_gap.outputs",
        ("pytest_gap.plugin", "pytest_gap.cli", "pytest_gap.run", "pytest_gap.benchmark"),
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
    assert "pytest_gap.run.trial" in imports("pytest_gap.scale.ray_actor")  # function-local
    assert "pytest_gap.producers.base" in imports("pytest_gap.modes")  # TYPE_CHECKING
    assert "pytest_gap.policies.endpoint" in imports("pytest_gap.skills.context")
    assert "pytest" in imports("pytest_gap.plugin")
    assert "pytest_gap.config.document" in reaches("pytest_gap.servers.registry")
    assert _violations([("pytest_gap.sim", ("pytest_gap.errors",))], imports) != []


def test_the_circle_finder_finds_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"f", "a"}}
    assert import_circles(graph, lambda m: graph[m]) == [["a", "b", "c"], ["d", "e"], ["f"]]
    assert import_circles(["a", "b"], lambda m: graph[m]) == []  # the way back leaves the set


# The modules import one another in one direction only, lazy and type-only imports included: a
# reader can start at the bottom (sim: errors -> backend, suites -> variations, gl -> render ->
# scene -> libero -> libero_backend; skills: registry, helpers, skills, catalogue) and never
# meet a module that needs one above it; so no import sits in a function to dodge a circle.
NO_CIRCLES = ("pytest_gap",)


@pytest.mark.parametrize("package", NO_CIRCLES)
def test_no_import_circle_within(package):
    assert import_circles(m for m in MODULES if _in(m, package)) == []


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
        "pytest_gap.outputs.manifest",  # a session's options and argv
        *PLUGIN,  # scheduling.py: xdist's Scheduling protocol (a collection-diff report)
        "pytest_gap.scale.merge_session",  # gap merge: a session over the config, no trial
    ]


# The config package, bottom to top: each module imports only those before it (document.py's
# docstring and the package's say why), and none imports the package itself (its __init__
# re-exports everything for the API and tests, so importing it would pull the whole package).
CONFIG_ORDER = [
    "reference",  # generic over models: imports none of the others
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
    "error.txt",
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


# -- no other module's private name -------------------------------------------------------------
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


def test_no_module_reads_another_modules_private_name():
    """One module's private helper is not another's: a helper two modules share is public
    where it belongs (skills/gripper.py, sim/vla_eval/catalogue.py)."""
    found = [u for m in sorted(MODULES) for u in _private_uses(MODULES[m].read_text(), m)]
    assert found == []


CLI = "pytest_gap.cli"


def test_nothing_imports_the_command_line():
    """The command line is what a user runs, never a library: what a command and a session
    both need belongs in a layer below it."""
    users = sorted(m for m in MODULES if not _in(m, CLI) and any(_in(n, CLI) for n in imports(m)))
    assert users == []


def test_command_groups_stand_alone():
    """A command group (cli/<group>.py) imports no other group and not the entry module, so
    each reads, changes and tests on its own; what groups share is in cli/common.py, which
    imports nothing of the command line."""
    common = f"{CLI}.common"
    groups = sorted(m for m in MODULES if _in(m, CLI) and m not in (CLI, f"{CLI}.__main__"))
    assert common in groups and len(groups) > 2  # the reader found the package
    found = {m: sorted(n for n in imports(m) if _in(n, CLI) and n != common) for m in groups}
    assert found == {m: [] for m in groups}


def test_the_plugin_package_is_its_modules_with_no_circle_and_no_private_name_across():
    """plugin/ is layered under its entry module: no circle (lazy and type-only imports
    included), no module imports the entry (pytest loads it: it imports every role), no module
    reads another's private name, and nothing below the package imports it (`gap merge` plans
    through session_plan.py, the Ray executor is handed its trials)."""
    modules = sorted(m for m in MODULES if _in(m, "pytest_gap.plugin"))
    assert modules == sorted(PLUGIN)
    assert import_circles(modules) == []
    assert [m for m in modules if "pytest_gap.plugin" in imports(m)] == []
    assert [u for m in modules for u in _private_uses(MODULES[m].read_text(), m)] == []
    users = sorted(
        m
        for m in MODULES
        if not _in(m, "pytest_gap.plugin") and any(_in(i, "pytest_gap.plugin") for i in imports(m))
    )
    assert users == []


def test_the_plugin_roles_are_told_apart_by_their_class_not_by_probing():
    """Each role is its own class (worker.py, controller.py, single.py) and what an item needs of
    it is under a stash key (session.py): nothing in plugin/ asks a role or the session which
    one it is by probing its attributes (`getattr(self, "ray", None)`). xdist's own idiom,
    `hasattr(config, "workerinput")`, says whether this process is a worker."""
    probed = {"self", "session", "role", "lead"}
    found = []
    for module in (m for m in MODULES if _in(m, "pytest_gap.plugin")):
        for node in ast.walk(ast.parse(MODULES[module].read_text())):
            probe = isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            if probe and node.func.id in ("getattr", "hasattr") and node.args:
                first = node.args[0]
                if isinstance(first, ast.Name) and first.id in probed:
                    found.append(f"{module}:{node.lineno}")
    assert found == []


# Packages of the session layer split by job (compare/, viz/): their modules import each other,
# never the package itself (compare/'s __init__ re-exports its modules for the CLI, the viewer
# and tests, so importing it from inside would run in a circle), and read no private name of
# another module.
@pytest.mark.parametrize("package", ["pytest_gap.compare", "pytest_gap.viz"])
def test_session_packages_have_no_circle_and_read_no_private_name_across_modules(package):
    inside = sorted(m for m in MODULES if _in(m, package) and m != package)
    assert len(inside) > 1
    assert import_circles(inside) == []
    assert [m for m in inside if package in imports(m)] == []
    assert [u for m in inside for u in _private_uses(MODULES[m].read_text(), m)] == []


MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def test_no_module_over_500_lines_and_no_function_over_80():
    """The sizes of issue 34's house: past them a module holds two jobs, a function three."""
    long_modules, long_functions = [], []
    for name, path in sorted(MODULES.items()):
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}.{node.name}: {length} lines")
    assert not long_modules, f"modules over {MAX_MODULE_LINES} lines: {long_modules}"
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines: {long_functions}"


def test_torch_is_imported_by_the_torch_adapter_alone():
    """torch is an extra: only policies/torch_policy.py imports it, inside its functions, so
    the core, the plugin and every command start without it (and without it installed)."""
    importers = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n == "torch" or n.startswith("torch.") for n in names):
                top_level = node in tree.body
                where = path.relative_to(PACKAGE.parent).as_posix()
                importers.setdefault(where, set()).add(top_level)
    assert importers == {"pytest_gap/policies/torch_policy.py": {False}}
