"""Choose MuJoCo's OpenGL backend before anything imports mujoco.

MuJoCo reads MUJOCO_GL once, at import. A user's setting is respected as is. Otherwise EGL is
tried first (GPU machines, and Mesa's llvmpipe on CPU), then OSMesa, each in a throw-away
subprocess so a broken driver cannot poison this process. The choice is exported, so xdist
workers and other children inherit it instead of probing again.

`make_renderer` can put a renderer's EGL context on a chosen EGL device. MuJoCo's own EGL
backend binds every context of a process to one display, chosen from MUJOCO_EGL_DEVICE_ID when
the first context is made; changing the variable later has no effect, so envs of one process
that render on different GPUs need contexts on their own displays.

`close_at_exit` closes what holds GL contexts before the process's EGL displays end, so that a
process (a pytest session, an xdist worker) exits without `__del__` tracebacks.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import subprocess
import sys
import weakref

from pytest_gap.errors import RenderBackendError

_PROBE = "import mujoco; c = mujoco.GLContext(8, 8); c.make_current(); c.free()"
_CANDIDATES = ("egl", "osmesa")
# Set when neither backend works: physics still runs, rendering raises this message.
_unavailable_reason: str | None = None


def _probe(backend: str) -> str | None:
    """Return None if `backend` can create a context, else a short reason."""
    env = dict(os.environ, MUJOCO_GL=backend)
    if backend == "egl":
        env.setdefault("PYOPENGL_PLATFORM", "egl")
    else:
        env["PYOPENGL_PLATFORM"] = backend
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return "probe timed out"
    if proc.returncode == 0:
        return None
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit code {proc.returncode}"


def ensure_gl_backend() -> str:
    """Make sure MUJOCO_GL names a backend; return it. Call before importing mujoco."""
    global _unavailable_reason
    chosen = os.environ.get("MUJOCO_GL", "").strip().lower()
    if chosen:
        # MuJoCo refuses osmesa/egl when PYOPENGL_PLATFORM names the other one, as it does when
        # an earlier choice (ours, exported to children) is still in the environment: the
        # user's MUJOCO_GL wins.
        if chosen in _CANDIDATES and os.environ.get("PYOPENGL_PLATFORM") in _CANDIDATES:
            os.environ["PYOPENGL_PLATFORM"] = chosen
        return chosen
    if "mujoco" in sys.modules:
        # Too late to choose: mujoco already picked its default (glfw, which needs a display).
        _unavailable_reason = (
            "mujoco was imported before pytest-gap could choose a backend and MUJOCO_GL is unset; "
            "export MUJOCO_GL=egl (or osmesa) before starting Python"
        )
        return ""
    reasons = []
    for backend in _CANDIDATES:
        reason = _probe(backend)
        if reason is None:
            os.environ["MUJOCO_GL"] = backend
            if backend == "osmesa" or "PYOPENGL_PLATFORM" not in os.environ:
                os.environ["PYOPENGL_PLATFORM"] = backend
            return backend
        reasons.append(f"{backend}: {reason}")
    _unavailable_reason = (
        "no OpenGL backend for MuJoCo rendering ("
        + "; ".join(reasons)
        + "); install libegl1 libegl-mesa0 or libosmesa6, or set MUJOCO_GL"
    )
    # Physics without cameras still works; only a renderer will raise.
    os.environ["MUJOCO_GL"] = "disable"
    return "disable"


def render_unavailable_reason() -> str | None:
    """Why rendering cannot work in this process, if pytest-gap already knows."""
    if os.environ.get("MUJOCO_GL", "").lower() in ("disable", "disabled", "off", "false", "0"):
        return _unavailable_reason or "MUJOCO_GL disables rendering; unset it or set egl/osmesa"
    return _unavailable_reason


def render_backend_error(cause: BaseException) -> RenderBackendError:
    """Wrap a failure to create an OpenGL context in the one-line error users see."""
    backend = os.environ.get("MUJOCO_GL", "<unset>")
    return RenderBackendError(
        f"MUJOCO_GL={backend}: could not create an OpenGL context ({type(cause).__name__}: "
        f"{cause}); unset MUJOCO_GL to let pytest-gap try egl then osmesa, or install "
        "libegl1 libegl-mesa0 / libosmesa6"
    )


def _not_macro_advice(record) -> bool:
    # robosuite/__init__.py logs nothing but the macro advice
    return not record.pathname.endswith(os.path.join("robosuite", "__init__.py"))


def import_robosuite_quietly() -> None:
    """Import robosuite without its "No private macro file found!" advice. Call after
    `ensure_gl_backend` (robosuite imports mujoco).

    robosuite 1.4 logs that advice (three warnings, through the deprecated `Logger.warn`) at its
    first import in every process without a macros_private.py. Under pytest that lands in the
    first trial of every worker: in its report's captured stderr and captured log, and in the
    warnings summary. The advice is for robosuite developers; the harness uses robosuite's
    default macros, so the records are dropped for good (other robosuite records pass).
    """
    if "robosuite" in sys.modules:
        return
    import logging
    import warnings

    logging.getLogger("robosuite_logs").addFilter(_not_macro_advice)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The 'warn' method is deprecated", DeprecationWarning)
        import robosuite  # noqa: F401


# -- EGL contexts on a chosen device --------------------------------------------------------------
_displays: dict[int, object] = {}


def _egl_display(device: int):
    """An initialised EGL display on EGL device `device`, made once per process and device.

    `device` is an index into eglQueryDevicesEXT's list, as MUJOCO_EGL_DEVICE_ID is."""
    if device in _displays:
        return _displays[device]
    from mujoco.egl import egl_ext as EGL

    devices = EGL.eglQueryDevicesEXT()
    if not 0 <= device < len(devices):
        raise RenderBackendError(
            f"EGL device {device} does not exist: this machine has {len(devices)} EGL "
            f"device(s), 0..{len(devices) - 1}; list existing ids in GAP_MUJOCO_EGL_DEVICES"
        )
    display = EGL.eglGetPlatformDisplayEXT(EGL.EGL_PLATFORM_DEVICE_EXT, devices[device], None)
    if display == EGL.EGL_NO_DISPLAY or EGL.eglInitialize(display, None, None) != EGL.EGL_TRUE:
        raise RenderBackendError(f"EGL device {device}: could not initialise an EGL display on it")
    atexit.register(EGL.eglTerminate, display)
    _displays[device] = display
    return display


class EGLDeviceContext:
    """mujoco.egl.GLContext, but on the display of one chosen EGL device."""

    def __init__(self, device: int, max_width: int, max_height: int):
        from mujoco.egl import EGL_ATTRIBUTES
        from mujoco.egl import egl_ext as EGL

        self._context = None
        self.device = device
        self._display = _egl_display(device)
        configs = (EGL.EGLConfig * 1)()
        found = ctypes.c_long()
        EGL.eglReleaseThread()
        EGL.eglChooseConfig(self._display, EGL_ATTRIBUTES, configs, 1, found)
        if found.value < 1:
            raise RenderBackendError(f"EGL device {device}: no framebuffer configuration fits")
        EGL.eglBindAPI(EGL.EGL_OPENGL_API)
        self._context = EGL.eglCreateContext(self._display, configs[0], EGL.EGL_NO_CONTEXT, None)
        if not self._context:
            raise RenderBackendError(f"EGL device {device}: could not create an EGL context")

    def make_current(self) -> None:
        from mujoco.egl import egl_ext as EGL

        if not EGL.eglMakeCurrent(
            self._display, EGL.EGL_NO_SURFACE, EGL.EGL_NO_SURFACE, self._context
        ):
            raise RuntimeError(f"EGL device {self.device}: failed to make the context current")

    def free(self) -> None:
        if not self._context:
            return
        from mujoco.egl import egl_ext as EGL

        current = EGL.eglGetCurrentContext()
        if current and self._context.address == current.address:
            EGL.eglMakeCurrent(
                self._display, EGL.EGL_NO_SURFACE, EGL.EGL_NO_SURFACE, EGL.EGL_NO_CONTEXT
            )
        EGL.eglDestroyContext(self._display, self._context)
        EGL.eglReleaseThread()
        self._context = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.free()


def uses_egl() -> bool:
    return os.environ.get("MUJOCO_GL", "").strip().lower() == "egl"


def make_renderer(model, height: int, width: int, egl_device: int | None = None):
    """A mujoco.Renderer; under MUJOCO_GL=egl with `egl_device`, its context is on that device.

    mujoco.Renderer makes its context from its module's `gl_context.GLContext`; that one name is
    swapped for the duration of the constructor (one thread renders per process)."""
    import mujoco

    if egl_device is None or not uses_egl():
        renderer = mujoco.Renderer(model, height, width)
    else:
        _egl_display(egl_device)  # a missing device is a one-line error, before MuJoCo's
        module = sys.modules[mujoco.Renderer.__module__].gl_context
        default = module.GLContext
        module.GLContext = lambda w, h: EGLDeviceContext(egl_device, w, h)
        try:
            renderer = mujoco.Renderer(model, height, width)
        finally:
            module.GLContext = default
    close_at_exit(renderer)
    return renderer


# -- closing GL objects before their display ends ---------------------------------------------
# Alive objects whose close() frees GL contexts; weak, so a closed and dropped one leaves.
_open: weakref.WeakSet = weakref.WeakSet()


def close_at_exit(obj) -> None:
    """Close `obj` (a renderer, an env: anything whose `close()` frees its GL contexts) when the
    process exits, before any EGL display it renders on is terminated. Call it after `obj` made
    its first context.

    MuJoCo and robosuite register `eglTerminate(display)` with atexit when they make a
    display's first context (as `_egl_display` does for ours). A renderer still alive after
    that is freed by its `__del__` at interpreter shutdown, on a terminated display, and each
    such free prints an "Exception ignored in ... __del__" traceback (about 60 lines at the end
    of `pytest benchmarks/ -n 2`). atexit calls its functions last registered first, so the
    hook that closes them moves to the end of the queue at every call: behind every display
    made so far, hence run before their ends."""
    _open.add(obj)
    atexit.unregister(close_open_objects)
    atexit.register(close_open_objects)


def close_open_objects() -> None:
    """Close every object given to `close_at_exit` that is still alive (closing twice is a
    no-op for them); each is closed even when one fails, and the first failure is raised."""
    failure = None
    for obj in list(_open):
        try:
            obj.close()
        except Exception as exc:
            failure = failure or exc
    _open.clear()
    if failure is not None:
        raise failure
