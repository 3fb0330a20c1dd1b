"""What the harness's own GL code does on this machine, and what a LIBERO step costs in it: the
check to run on a GPU machine (issue 37), which runs on CPU too (software GL).

Reports, into OUT/gpu_check.json and OUT/gpu_check.md:
- the GL backend the harness chose (sim/gl.py `ensure_gl_backend`: a user's MUJOCO_GL, else egl
  then osmesa), and the GL vendor, renderer and version of the context it rendered with, with
  the EGL device that context's display is on (under egl);
- per-frame render time of the two LIBERO cameras (agentview, robot0_eye_in_hand) at 256x256
  with 4x multisampling, through the harness's renderer (sim/render.py SceneRenderer: what a
  policy's observation costs), median of `--frames` after two warm-up frames;
- physics time per control step: MuJoCo's steps of one 20 Hz control step (robosuite's
  control_freq; robosuite's Python controller is not included), median over `--steps`;
- that two processes pinned through GAP_MUJOCO_EGL_DEVICES (run/devices.py `pin`, as two xdist
  workers are) render on the EGL device each was given, through MuJoCo's own EGL context
  (MUJOCO_EGL_DEVICE_ID) and through the harness's device context (sim/gl.py make_renderer).

The scene: a LIBERO scene built by the harness where LIBERO is installed (`--suite`, `--task`),
or the cut scene bench/gpu_scene.py makes for machines without LIBERO (`--scene X.mjb.xz`: the
same faces drawn, less texture; its JSON beside it says what was kept).

    python bench/gpu_check.py --out OUT [--scene S.mjb.xz | --suite libero_object --task 0]
                              [--frames 20] [--steps 200] [--devices 0,1]

Needs only mujoco, numpy and PyOpenGL besides the harness's sim/gl.py, sim/render.py and
run/devices.py (no pydantic, no LIBERO with --scene): what bench/gpu_pack.py carries.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import lzma
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CAMERAS = ("agentview", "robot0_eye_in_hand")
SIZE = 256
CONTROL_PERIOD_S = 0.05  # robosuite's control_freq 20, as LIBERO runs it
EGL_DEVICE_EXT = 0x322C
EGL_DRM_DEVICE_FILE_EXT = 0x3233
# A scene for the pinning probe: any model renders on the device it is given.
PROBE_XML = """<mujoco><worldbody><light pos="0 0 3"/><camera name="c" pos="0 -1 0.5"
xyaxes="1 0 0 0 0.5 1"/><geom type="box" size=".1 .1 .1" rgba="1 0 0 1"/></worldbody></mujoco>"""


# -- what a GL context is on ----------------------------------------------------------------------
def gl_strings() -> dict[str, str]:
    """Vendor, renderer and version of the current GL context."""
    from OpenGL import GL

    def text(name) -> str:
        value = GL.glGetString(name)
        return value.decode(errors="replace") if value else ""

    return {
        "vendor": text(GL.GL_VENDOR),
        "renderer": text(GL.GL_RENDERER),
        "version": text(GL.GL_VERSION),
    }


def _egl_function(name: str, restype, *argtypes):
    from OpenGL import EGL

    address = EGL.eglGetProcAddress(name.encode())
    if not address:
        return None
    pointer = address if isinstance(address, int) else ctypes.cast(address, ctypes.c_void_p).value
    return ctypes.CFUNCTYPE(restype, *argtypes)(pointer)


def current_egl_device() -> dict:
    """The EGL device the current context's display is on: its index in eglQueryDevicesEXT's
    list (MUJOCO_EGL_DEVICE_ID's numbering) and its DRM file where the driver names one."""
    from mujoco.egl import egl_ext as EGL

    display = EGL.eglGetCurrentDisplay()
    query = _egl_function(
        "eglQueryDisplayAttribEXT",
        ctypes.c_uint,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_void_p),
    )
    if query is None:
        return {"index": None, "why": "no eglQueryDisplayAttribEXT"}
    handle = ctypes.c_void_p()
    display_ptr = ctypes.cast(display, ctypes.c_void_p).value
    if not query(display_ptr, EGL_DEVICE_EXT, ctypes.byref(handle)):
        return {"index": None, "why": "the display names no EGL device"}
    devices = [ctypes.cast(d, ctypes.c_void_p).value for d in EGL.eglQueryDevicesEXT()]
    index = devices.index(handle.value) if handle.value in devices else None
    name = _egl_function("eglQueryDeviceStringEXT", ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int)
    drm = name(handle.value, EGL_DRM_DEVICE_FILE_EXT) if name else None
    return {"index": index, "drm": drm.decode() if drm else None, "n_devices": len(devices)}


def egl_device_count() -> int:
    from mujoco.egl import egl_ext as EGL

    return len(EGL.eglQueryDevicesEXT())


def describe_context(renderer) -> dict:
    """GL strings (and EGL device) of a mujoco.Renderer's context, made current."""
    renderer._gl_context.make_current()
    found = gl_strings()
    if os.environ.get("MUJOCO_GL") == "egl":
        found["egl_device"] = current_egl_device()
    return found


# -- the scene ------------------------------------------------------------------------------------
def load_scene(args) -> tuple[object, dict]:
    """(MjModel, what it is) from --scene, or built from LIBERO by the harness."""
    import mujoco

    if args.scene:
        path = Path(args.scene)
        raw = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
        with tempfile.NamedTemporaryFile(suffix=".mjb") as f:
            f.write(raw)
            f.flush()
            model = mujoco.MjModel.from_binary_path(f.name)
        about_file = path.with_name(path.name.split(".")[0] + ".json")
        about = json.loads(about_file.read_text()) if about_file.is_file() else {}
        return model, {"scene": str(path), **about}
    from pytest_gap.sim.libero import make_env

    env = make_env(args.suite, args.task)
    env.reset(0)
    model = env.raw.sim.model._model
    from bench.gpu_scene import drawn_faces

    return model, {
        "scene": f"{args.suite} task {args.task} (LIBERO, as the harness builds it)",
        "drawn_faces": drawn_faces(model),
        "_env": env,
    }


def episode_start(model, env=None):
    """MjData where an episode starts: the live env's, or the scene's `episode_start` key."""
    import mujoco

    data = mujoco.MjData(model)
    if env is not None:
        source = env.raw.sim.data._data
        data.qpos[:], data.qvel[:] = source.qpos, source.qvel
    elif model.nkey:
        mujoco.mj_resetDataKeyframe(model, data, 0)
    mujoco.mj_forward(model, data)
    return data


def time_render(model, data, frames: int, egl_device: int | None = None) -> dict:
    """Median ms per 256x256 4x-MSAA frame of each LIBERO camera, through SceneRenderer."""
    import numpy as np

    from pytest_gap.sim.render import SceneRenderer

    renderer = SceneRenderer(model, data, np.zeros(model.ngeom, int), {}, egl_device=egl_device)
    cameras = [c for c in CAMERAS if c in {model.camera(i).name for i in range(model.ncam)}]
    per_camera = {}
    for camera in cameras:
        for _ in range(2):
            renderer.rgb(camera, SIZE, SIZE, multisample=True)
        times = []
        for _ in range(frames):
            start = time.perf_counter()
            image = renderer.rgb(camera, SIZE, SIZE, multisample=True)
            times.append(time.perf_counter() - start)
        per_camera[camera] = round(1000 * statistics.median(times), 3)
    context = describe_context(renderer._renderer(SIZE, SIZE, True))
    renderer.close()
    return {
        "ms_per_frame": per_camera,
        "ms_both_cameras": round(sum(per_camera.values()), 3),
        "frames": frames,
        "mean_pixel": float(image.mean()),  # a black frame renders nothing
        "context": context,
    }


def time_physics(model, data, steps: int) -> dict:
    """Median ms of one control step's MuJoCo steps, from the episode's start (no action)."""
    import mujoco

    substeps = max(1, round(CONTROL_PERIOD_S / model.opt.timestep))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        for _ in range(substeps):
            mujoco.mj_step(model, data)
        times.append(time.perf_counter() - start)
    return {"ms_per_control_step": round(1000 * statistics.median(times), 3), "substeps": substeps}


# -- two pinned processes -------------------------------------------------------------------------
def probe_worker(worker_id: str, n_workers: int) -> dict:
    """In a child: pin as an xdist worker would, render once through MuJoCo's own EGL context
    and once through the harness's device context, and say where each was."""
    from pytest_gap.run.devices import pin

    pinned = pin(os.environ, worker_id, n_workers)
    from pytest_gap.sim.gl import ensure_gl_backend

    backend = ensure_gl_backend()
    import mujoco

    model = mujoco.MjModel.from_xml_string(PROBE_XML)
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    found = {"worker": worker_id, "pinned": pinned, "backend": backend}
    given = int(os.environ["MUJOCO_EGL_DEVICE_ID"])
    from pytest_gap.sim.gl import make_renderer

    for path, device in (("mujoco", None), ("harness", given)):
        renderer = make_renderer(model, 64, 64, device)
        renderer.update_scene(data, camera="c")
        pixels = renderer.render()
        found[path] = {**describe_context(renderer), "mean_pixel": float(pixels.mean())}
        renderer.close()
    return found


def pinned_processes(devices: str) -> dict:
    """Two processes pinned through GAP_MUJOCO_EGL_DEVICES=`devices`: each renders on the
    device it was given, through both paths."""
    env = {**os.environ, "GAP_MUJOCO_EGL_DEVICES": devices, "MUJOCO_GL": "egl"}
    env.pop("MUJOCO_EGL_DEVICE_ID", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    children = [
        subprocess.Popen(
            # -S where this process runs without site-packages (the carried wheels only)
            [
                sys.executable,
                *(["-S"] if sys.flags.no_site else []),
                __file__,
                "--probe-worker",
                f"gw{i}",
                "--workers",
                "2",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    workers = []
    for child in children:
        out, err = child.communicate(timeout=300)
        if child.returncode != 0:
            tail = err.strip().splitlines()[-1:] or [f"exit {child.returncode}"]
            workers.append({"error": tail[0]})
            continue
        workers.append(json.loads(out.strip().splitlines()[-1]))
    for worker in workers:
        if "error" in worker:
            worker["ok"] = False
            continue
        given = int(worker["pinned"]["MUJOCO_EGL_DEVICE_ID"])
        worker["given"] = given
        worker["ok"] = all(
            worker[path]["egl_device"]["index"] == given and worker[path]["mean_pixel"] > 0
            for path in ("mujoco", "harness")
        )
    return {"devices": devices, "workers": workers, "ok": all(w["ok"] for w in workers)}


# -- the report -----------------------------------------------------------------------------------
def markdown(report: dict) -> str:
    render, physics, scene = report["render"], report["physics"], report["scene"]
    context = render["context"]
    device = context.get("egl_device") or {}
    rows = [
        ("machine", f"{report['machine']} (Python {report['python']}, MuJoCo {report['mujoco']})"),
        ("GL backend chosen", report["backend"]),
        ("GL renderer", f"{context['renderer']} ({context['vendor']}; {context['version']})"),
        (
            "EGL device",
            f"{device.get('index')} of {device.get('n_devices')} ({device.get('drm')})"
            if device
            else "- (not EGL)",
        ),
        ("scene", scene["scene"]),
        (
            "faces drawn",
            f"{scene.get('drawn_faces')} (whole scene: "
            f"{scene.get('drawn_faces_whole_scene', scene.get('drawn_faces'))})",
        ),
    ]
    for camera, ms in render["ms_per_frame"].items():
        rows.append((f"render {camera} {SIZE}x{SIZE} 4x MSAA", f"{ms:.2f} ms/frame"))
    rows += [
        ("render both cameras", f"{render['ms_both_cameras']:.2f} ms per observation"),
        (
            "physics per control step",
            f"{physics['ms_per_control_step']:.2f} ms ({physics['substeps']} MuJoCo steps)",
        ),
    ]
    pinned = report["pinned"]
    if pinned is None:
        rows.append(("two pinned processes", "- (not EGL)"))
    else:
        for worker in pinned["workers"]:
            if "error" in worker:
                rows.append(("pinned process", f"FAILED: {worker['error']}"))
                continue
            where = ", ".join(
                f"{path}: device {worker[path]['egl_device']['index']} ({worker[path]['renderer']})"
                for path in ("mujoco", "harness")
            )
            verdict = "ok" if worker["ok"] else "WRONG DEVICE"
            rows.append(
                (f"{worker['worker']} given device {worker['given']}", f"{verdict}: {where}")
            )
    lines = ["| what | measured |", "| --- | --- |"]
    lines += [f"| {a} | {b} |" for a, b in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where gpu_check.json and gpu_check.md go")
    parser.add_argument("--scene", help="a scene from bench/gpu_scene.py (.mjb.xz or .mjb)")
    parser.add_argument("--suite", default="libero_object")
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument(
        "--devices",
        help="GAP_MUJOCO_EGL_DEVICES for the two pinned processes (default: the first two EGL "
        "devices, or 0,0 where there is one)",
    )
    parser.add_argument("--probe-worker", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe_worker:
        print(json.dumps(probe_worker(args.probe_worker, args.workers)))
        return 0
    if args.out is None:
        parser.error("--out DIR is required")
    from pytest_gap.sim.gl import ensure_gl_backend

    backend = ensure_gl_backend()
    import mujoco

    model, scene = load_scene(args)
    env = scene.pop("_env", None)
    data = episode_start(model, env)
    report = {
        "machine": platform.node() or "?",
        "python": platform.python_version(),
        "mujoco": mujoco.__version__,
        "backend": backend,
        "scene": scene,
        "render": time_render(model, data, args.frames),
        "physics": time_physics(model, data, args.steps),
        "pinned": None,
    }
    if env is not None:
        env.close()
    if backend == "egl":
        n = egl_device_count()
        devices = args.devices or ("0,1" if n > 1 else "0,0")
        report["pinned"] = pinned_processes(devices)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    table = markdown(report)
    (args.out / "gpu_check.md").write_text(table)
    print(table)
    ok = report["render"]["mean_pixel"] > 0 and (report["pinned"] or {"ok": True})["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
