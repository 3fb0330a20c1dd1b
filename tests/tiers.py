"""The test tiers, decided at collection from the code each test runs (tests/conftest.py).

The fast tier is `pytest tests -m "not libero" -n 2`: the harness's logic in this process, on
the fake backend (tests/fake_backend.py) where it needs a simulator. Every test it leaves out
carries `libero`, the full tier's marker, for one of two reasons:

- the test builds a real simulator (LIBERO through the libero or vla-eval backend, robosuite, a
  MuJoCo model), in this process or in one it starts, or runs a harness session over a LIBERO
  config: env creation costs seconds per env. It carries `libero` alone.
- the test builds no simulator but starts other processes (pytest sessions, `gap` commands,
  servers, spawned workers, a Ray cluster): a second or more each, and process-level behaviour
  (kills, hangs, xdist) is what such tests are about. It carries `slow` as well, so that
  `-m "libero and not slow"` selects the simulator tests and `-m slow` the process tests.

Nothing is marked by hand. The rule reads what a test can reach: its function, the fixtures it
requests, and the functions, classes (the methods it calls by name) and constants of tests/ they
use, with the strings among them (configs, scripts) and its parameters. A test builds a
simulator when that reaches
  1. the mujoco or robosuite package, a builder of real envs (SIMULATOR_BUILDERS), bench/
     (whose scripts drive LIBERO), or a script text that imports or builds one; or
  2. a session (pytester, a subprocess) over a config naming a LIBERO suite or family, or a
     path under benchmarks/, examples/ or bench/, without naming the fake backend;
and starts processes when it reaches one of PROCESSES, or a subprocess-style `run`.
Where the rule errs towards the fast tier, the tripwire of tests/tripwire.py catches it: in a
session of fast-tier tests, building a simulator in any process, or starting a Python process,
fails the test and names what it built or started. Where it errs the other way (a session over
a LIBERO config that stops at a config error), the test only moves to the full tier.
"""

from __future__ import annotations

import builtins
import inspect
import re
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

LIBERO = "libero"
SLOW = "slow"

# torch (the [torch] extra) is no simulator, but its import alone takes seconds and the fast
# tier never pays for it: a test that reaches it is in the full tier with the simulator's.
SIMULATOR_PACKAGES = frozenset({"mujoco", "robosuite", "bench", "torch"})
# Names whose call builds a real env (pytest_gap.sim and LIBERO's own), wherever they live.
SIMULATOR_BUILDERS = frozenset(
    {
        "make_env",
        "LiberoEnv",
        "VlaEvalEnv",
        "EnvPool",
        "SceneCache",
        "OffScreenRenderEnv",
        "ControlEnv",
    }
)
SIMULATOR_SCRIPT = re.compile(
    r"\bmake_env\(|MjModel\.from_|^\s*(?:import|from)\s+(?:mujoco|robosuite)\b", re.MULTILINE
)
LIBERO_CONFIG = re.compile(
    r"^(?:libero(?:_\w+)?|posvar|grocery_packing)$|(?:^|/)(?:benchmarks|examples|bench)(?:/|$)"
)
FAKE_BACKEND = re.compile(r"\bfake_backend\b")
FAKE_MODULES = ("tests.fake_backend", "tests.fake_session")
# Calls that run a pytest or gap session, in this process or another.
SESSIONS = frozenset(
    {"runpytest", "runpytest_inprocess", "runpytest_subprocess", "inline_run", "Popen"}
)
# Calls that start another process (with `run` and `check_output`: subprocess's, when the test
# reaches the subprocess module), the harness's managed policy servers among them.
PROCESSES = frozenset(
    {"runpytest_subprocess", "Popen", "Process", "get_context", "Pool", "PolicyManager"}
)
SUBPROCESS_CALLS = frozenset({"run", "check_output", "check_call", "call"})
# Modules whose `run` starts a process: subprocess's, and the Python API's (`benchmark.run` and
# `run_benchmark` launch a pytest session, as do `evaluate.run` and `evaluate.choose`);
# pytester's `run` when the test requests pytester.
PROCESS_MODULES = frozenset(
    {"subprocess", "pytest_gap.benchmark", "benchmark", "pytest_gap.evaluate", "evaluate"}
)
PROCESS_FIXTURES = frozenset({"pytester", "testdir"})
_ALWAYS_RUN = ("__init__", "__enter__", "__exit__", "__call__", "__post_init__")


@dataclass
class Reach:
    """What a test's code can reach: the names it uses (globals and attributes), the strings
    among its constants, and the modules it imports or takes objects from."""

    names: set[str] = field(default_factory=set)
    strings: set[str] = field(default_factory=set)
    modules: set[str] = field(default_factory=set)
    fixtures: set[str] = field(default_factory=set)

    @property
    def packages(self) -> set[str]:
        return {m.split(".")[0] for m in self.modules}

    def builds_simulator(self) -> bool:
        return bool(
            self.packages & SIMULATOR_PACKAGES
            or self.names & SIMULATOR_BUILDERS
            or any(SIMULATOR_SCRIPT.search(s) for s in self.strings)
        )

    def fake_backend(self) -> bool:
        return any(FAKE_BACKEND.search(s) for s in self.strings) or any(
            m.startswith(FAKE_MODULES) for m in self.modules
        )

    def subprocess_calls(self) -> bool:
        starters = self.modules & PROCESS_MODULES or self.fixtures & PROCESS_FIXTURES
        calls = SUBPROCESS_CALLS | {"run_benchmark", "choose"}
        return bool(starters) and bool(self.names & calls)

    def runs_libero_session(self) -> bool:
        session = bool(self.names & SESSIONS) or self.subprocess_calls()
        libero = any(LIBERO_CONFIG.search(s) for s in self.strings)
        return session and libero and not self.fake_backend()

    def starts_processes(self) -> bool:
        return bool(self.names & PROCESSES) or self.subprocess_calls()


def _ours(obj: Any) -> bool:
    """Defined in tests/ (tests.*, or a conftest): code the rule follows."""
    module = getattr(obj, "__module__", None) or ""
    return module.split(".")[0] == "tests" or module.endswith("conftest")


def _strings(value: Any, into: set[str], depth: int = 0) -> None:
    if depth > 8:
        return
    if isinstance(value, str):
        into.add(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _strings(key, into, depth + 1)
            _strings(item, into, depth + 1)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            _strings(item, into, depth + 1)


def _function(value: Any) -> Callable | None:
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    if isinstance(value, property):
        value = value.fget
    # A decorated function (contextmanager, functools.wraps) runs the code it wraps.
    value = inspect.unwrap(value) if callable(value) else value
    return value if inspect.isfunction(value) else None


class _Walker:
    """Follows code from its roots: nested code, tests/ functions it names, the methods of
    tests/ classes it reaches that are called by name somewhere in what it reaches."""

    def __init__(self) -> None:
        self.reach = Reach()
        self._seen: set[types.CodeType] = set()
        self._classes: set[type] = set()
        self._methods: set[tuple[type, str]] = set()
        self._todo: list[tuple[types.CodeType, dict]] = []

    def add(self, fn: Callable) -> None:
        self._todo.append((fn.__code__, fn.__globals__))
        _strings(fn.__defaults__ or (), self.reach.strings)
        _strings(list((fn.__kwdefaults__ or {}).values()), self.reach.strings)

    def walk(self) -> Reach:
        while self._todo:
            while self._todo:
                self._code(*self._todo.pop())
            self._follow_methods()
        return self.reach

    def _code(self, code: types.CodeType, namespace: dict) -> None:
        if code in self._seen:
            return
        self._seen.add(code)
        reach = self.reach
        reach.names.update(code.co_names)
        reach.modules.update(n for n in code.co_names if "." in n)  # `import a.b` in a function
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self._todo.append((const, namespace))
            else:
                _strings(const, reach.strings)
        for name in code.co_names:
            if name in namespace:
                self._value(namespace[name])
            elif not hasattr(builtins, name):
                reach.modules.add(name)  # the module of an `import name` inside the function

    def _value(self, value: Any) -> None:
        reach = self.reach
        if isinstance(value, types.ModuleType):
            reach.modules.add(value.__name__)
        elif inspect.isclass(value) and _ours(value):
            self._classes.add(value)
        elif (fn := _function(value)) is not None and _ours(value):
            self.add(fn)
        elif isinstance(value, str | dict | list | tuple | set | frozenset):
            _strings(value, reach.strings)
        else:
            module = getattr(value, "__module__", None)
            if isinstance(module, str):
                reach.modules.add(module)
            name = getattr(value, "__name__", None)
            if isinstance(name, str):
                reach.names.add(name)

    def _follow_methods(self) -> None:
        for cls in list(self._classes):
            for klass in cls.__mro__:
                if not _ours(klass):
                    continue
                for name, value in vars(klass).items():
                    if (klass, name) in self._methods:
                        continue
                    if name not in self.reach.names and name not in _ALWAYS_RUN:
                        continue
                    fn = _function(value)
                    if fn is not None:
                        self._methods.add((klass, name))
                        self.add(fn)


def reach_of(item: pytest.Item) -> Reach:
    """What `item` can reach: its test function, its fixtures' functions, its parameters."""
    walker = _Walker()
    roots: list[Callable] = []
    if inspect.isfunction(getattr(item, "obj", None)):
        roots.append(item.obj)
    info = getattr(item, "_fixtureinfo", None)
    walker.reach.fixtures.update(getattr(item, "fixturenames", ()))
    for name in getattr(item, "fixturenames", ()):
        defs = info.name2fixturedefs.get(name) if info is not None else None
        fn = _function(defs[-1].func) if defs else None
        if fn is not None and _ours(fn):
            roots.append(fn)
    for fn in roots:
        walker.add(fn)
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        _strings(list(callspec.params.values()), walker.reach.strings)
    return walker.walk()


def tier_of(item: pytest.Item) -> str | None:
    """`libero`, `slow` or None (the fast tier) for one collected test."""
    reach = reach_of(item)
    if reach.builds_simulator() or reach.runs_libero_session():
        return LIBERO
    if reach.starts_processes():
        return SLOW
    return None


# The markers of each tier: all the fast tier leaves out carries `libero`.
MARKERS = {LIBERO: (LIBERO,), SLOW: (LIBERO, SLOW)}


def mark(items: Iterable[pytest.Item]) -> None:
    """Add the markers of the tier each item's code calls for."""
    for item in items:
        for marker in MARKERS.get(tier_of(item), ()):
            item.add_marker(marker)
