"""Whose failure an exception is: the harness's (its simulator, renderer or host) or the
workflow's and policy's that it ran for. Decided by where the exception was raised, never by
its type alone: an IndexError raised inside MuJoCo's renderer is a fault of the renderer, the
same IndexError raised by a skill is the skill's bug.

`harness_fault(exc)` is the one rule (a pure function of the exception and its traceback), used
by the executor for an exception out of a workflow node and by the trial runner for one out of
everything around it (env build, reset, scoring):

- a host resource failure (MemoryError, a thread that cannot start, an OSError whose errno is
  a resource: no memory, no file descriptor, no process slot, no disk space) is the host's,
  wherever it was raised: no skill asked for it;
- otherwise the innermost frame of the traceback that belongs to a party decides. Frames of
  the standard library and of the numeric libraries every party calls (NEUTRAL_PACKAGES) say
  nothing and are skipped. A frame of mujoco, robosuite, libero, PyOpenGL or pytest_gap.sim is
  the simulator's (its renderer's when in RENDERER_MODULES); any other frame (a skill, the
  executor, a user's package, a test) is the caller's, and the failure stays scored;
- the simulator's own exception classes (mujoco.FatalError: MuJoCo's C core calling
  mju_error, which leaves no Python frame of its own) are the simulator's wherever the call was;
- the simulator layer's refusals of its caller's input (SimInputError: a NaN action, an unknown
  object; EpisodeError: a step past the limit) are the caller's, although raised inside
  pytest_gap.sim: they exist to name the caller's mistake.

A fault is an infrastructure failure of the trial: it is re-run once on a fresh env
(run/trial.py) and never counted against the policy.
"""

from __future__ import annotations

import errno
import sys
import traceback
from typing import Literal

from pydantic import BaseModel

from pytest_gap.errors import EpisodeError, SimInputError, one_line

FaultKind = Literal["simulator", "renderer", "host"]

SIMULATOR_PACKAGES = ("mujoco", "robosuite", "libero", "OpenGL", "pytest_gap.sim")
# Packages whose own exception classes only their code raises (MuJoCo's from its C core).
SIMULATOR_EXCEPTIONS = ("mujoco", "robosuite", "libero")
RENDERER_MODULES = (
    "mujoco.renderer",
    "mujoco.rendering",
    "mujoco.gl_context",
    "mujoco.egl",
    "mujoco.osmesa",
    "mujoco.glfw",
    "OpenGL",
    "pytest_gap.sim.render",
    "pytest_gap.sim.gl",
)
# Called by every party with the party's arguments: where they raise says nothing of whose the
# failure is (the frame that called them does).
NEUTRAL_PACKAGES = frozenset(sys.stdlib_module_names) | {
    "numpy",
    "scipy",
    "pydantic",
    "pydantic_core",
    "typing_extensions",
}
RESOURCE_ERRNOS = frozenset(
    {
        errno.ENOMEM,  # no memory
        errno.EMFILE,  # no file descriptor left to this process
        errno.ENFILE,  # nor to the system
        errno.EAGAIN,  # no process or thread slot (fork, clone)
        errno.ENOSPC,  # no disk space
        errno.EDQUOT,  # no disk quota
        errno.ENOBUFS,  # no buffer space
    }
)
# CPython's RuntimeError when a thread cannot be made (no memory for its stack, a task limit).
THREAD_FAILURE = "can't start new thread"
# The simulator layer raises these to refuse its caller's input: the caller's failure.
CALLER_ERRORS = (SimInputError, EpisodeError)
MAX_FAULT_TRACEBACK_CHARS = 4000  # the tail a record keeps; a whole one can be megabytes
MAX_CHAIN = 8  # causes followed looking for a resource failure


class HarnessFault(BaseModel):
    """An exception the harness's simulator, renderer or host raised during a trial."""

    kind: FaultKind  # simulator, renderer (a camera render) or host (memory, threads, files)
    where: str  # the frame that decided it: `module:line in function`
    error: str  # `Type: message`, on one line
    traceback: str = ""  # its last 4000 characters (MAX_FAULT_TRACEBACK_CHARS)

    def line(self) -> str:
        return f"a {self.kind} fault at {self.where}: {self.error}"


def _in(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def is_resource_failure(exc: BaseException) -> bool:
    """The host ran out of something: memory, a thread, a file descriptor, a process, disk."""
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS:
        return True
    return isinstance(exc, RuntimeError) and str(exc).startswith(THREAD_FAILURE)


def _frames(exc: BaseException) -> list[tuple[str, int, str]]:
    """(module, line, function) of each frame of `exc`'s traceback, innermost first."""
    found = [
        (frame.f_globals.get("__name__") or "", lineno, frame.f_code.co_name)
        for frame, lineno in traceback.walk_tb(exc.__traceback__)
    ]
    return found[::-1]


def _deciding_frame(exc: BaseException) -> tuple[str, int, str] | None:
    """The innermost frame of a party (not of NEUTRAL_PACKAGES), None if there is none."""
    for module, lineno, function in _frames(exc):
        if module.split(".")[0] not in NEUTRAL_PACKAGES:
            return module, lineno, function
    return None


def _fault(kind: FaultKind, where: tuple[str, int, str] | None, exc: BaseException):
    text = "".join(traceback.format_exception(exc))
    return HarnessFault(
        kind=kind,
        where=f"{where[0]}:{where[1]} in {where[2]}" if where else "?",
        error=one_line(f"{type(exc).__name__}: {exc}", 300),
        traceback=text[-MAX_FAULT_TRACEBACK_CHARS:],
    )


def _causes(exc: BaseException) -> list[BaseException]:
    chain, seen = [exc], {id(exc)}
    while (cause := chain[-1].__cause__) is not None and len(chain) < MAX_CHAIN:
        if id(cause) in seen:
            break
        chain.append(cause)
        seen.add(id(cause))
    return chain


def harness_fault(exc: BaseException) -> HarnessFault | None:
    """The harness's fault `exc` is (see the module's docstring), None when it is the caller's:
    the workflow's, its skills' or the policy's, to be scored as their failure."""
    for link in _causes(exc):
        if is_resource_failure(link):
            return _fault("host", (_frames(link) or [None])[0], link)
    if isinstance(exc, CALLER_ERRORS):
        return None
    where = _deciding_frame(exc)
    if where is not None and _in(where[0], SIMULATOR_PACKAGES):
        return _fault("renderer" if _in(where[0], RENDERER_MODULES) else "simulator", where, exc)
    if _in(type(exc).__module__, SIMULATOR_EXCEPTIONS):
        return _fault("simulator", where, exc)
    return None
