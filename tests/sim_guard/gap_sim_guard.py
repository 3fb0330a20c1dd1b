"""The fast tier's tripwire: with it armed, building a real simulator raises, and a Python
process started by a test is recorded.

Every simulator the harness runs (LIBERO through the libero and vla-eval backends, robosuite,
the scene cache) ends in MuJoCo compiling or loading a model; the fake backend never does. So a
model built while GAP_TEST_NO_SIMULATOR names a file is a test of the fast tier
(`-m "not libero"`) that builds a real simulator: a test the `libero` marker rule of
tests/conftest.py missed. The build raises SimulatorForbidden, and because a harness session may
turn that into an infra-failed trial (or a child process may swallow it), it is also appended to
that file, which tests/conftest.py reads after every test to fail it loudly.

The fast tier starts no other process either (tests/tiers.py gives a test that does `libero`
too, with `slow`): a Python process that starts (by exec: a fork runs no sitecustomize) while
ENV names a test's log rather than the session's records itself there when NO_PROCESS is set
too, and the test fails the same way.

This module is imported in the test process by tests/conftest.py, and in every Python process
started under an armed session through sitecustomize.py next to it (its folder is put first on
PYTHONPATH). It imports nothing of the simulator: the patch lands when MuJoCo is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys

ENV = "GAP_TEST_NO_SIMULATOR"  # GAP_*: passes the harness's child-environment allow-list
NO_PROCESS = "GAP_TEST_NO_PROCESS"  # set when the session holds only fast-tier tests
SESSION_LOG = "session.jsonl"  # ENV's file while no test runs (a session's start, its workers)
HOW_TO_FIX = (
    "the fast tier (-m 'not libero') forbids building a real simulator: this test builds one "
    "but is not marked `libero`; make the marking rule in tests/tiers.py cover it"
)
HOW_TO_FIX_PROCESS = (
    "the fast tier (-m 'not libero') starts no other process: this test started a Python "
    "process but is not marked `libero` and `slow`; make the marking rule in tests/tiers.py "
    "cover it"
)
# MjModel's constructors (robosuite, LIBERO and the scene cache build through them) and MjSpec's
# compile (newer MuJoCo scene building).
BUILDERS = {"MjModel": ("from_xml_string", "from_xml_path", "from_binary_path")}
SPEC_BUILDERS = {"MjSpec": ("compile",)}


class SimulatorForbidden(RuntimeError):
    """A real simulator was about to be built in an armed (fast-tier) session."""


def armed() -> bool:
    return bool(os.environ.get(ENV))


def _record(record: dict) -> None:
    try:
        with open(os.environ[ENV], "a") as log:
            log.write(json.dumps(record) + "\n")
    except OSError:
        pass  # a build still raises; a start goes unrecorded only if the log is gone


def _trip(what: str) -> None:
    if not armed():
        return
    _record({"pid": os.getpid(), "built": what, "argv": sys.orig_argv[:6]})
    raise SimulatorForbidden(f"{what}: {HOW_TO_FIX}")


def started() -> None:
    """Record this process's start if a test of an armed session started it."""
    if not (armed() and os.environ.get(NO_PROCESS)):
        return
    if os.path.basename(os.environ[ENV]) != SESSION_LOG:
        _record({"pid": os.getpid(), "started": sys.orig_argv[:6]})


def _guarded(cls_name: str, name: str, original, *, method: bool):
    def builder(*args, **kwargs):
        _trip(f"mujoco.{cls_name}.{name}")
        return original(*args, **kwargs)

    builder.__gap_sim_guard__ = True
    builder.__wrapped__ = original
    return builder if method else staticmethod(builder)


def patch_mujoco(mujoco) -> None:
    """Wrap MuJoCo's model builders (once per process) so that they check `armed()`."""
    for table, method in ((BUILDERS, False), (SPEC_BUILDERS, True)):
        for cls_name, names in table.items():
            cls = getattr(mujoco, cls_name, None)
            for name in names if cls is not None else ():
                original = getattr(cls, name, None)
                if original is None or getattr(original, "__gap_sim_guard__", False):
                    continue
                setattr(cls, name, _guarded(cls_name, name, original, method=method))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds `mujoco` as the rest of sys.meta_path would, and patches it once it has run."""

    def find_spec(self, name, path=None, target=None):
        if name != "mujoco":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch_mujoco(module)

        loader.exec_module = exec_and_patch
        return spec


def install() -> None:
    """Guard this process: patch MuJoCo now if it is loaded, else when it is imported."""
    if "mujoco" in sys.modules:
        patch_mujoco(sys.modules["mujoco"])
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
