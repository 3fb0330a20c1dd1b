"""GAP_MUJOCO_EGL_DEVICES: spread worker processes, and suites-mode cells, over the listed GPUs.

The listed numbers are used both as CUDA ids (CUDA_VISIBLE_DEVICES) and as EGL device indices
(MUJOCO_EGL_DEVICE_ID: a position in eglQueryDevicesEXT's list, which CUDA_VISIBLE_DEVICES does
not filter). The two orders agree on most single-vendor hosts but not all (DESIGN: "EGL device
index != CUDA index"); list ids that mean the same GPU in both, which robosuite assumes too: it
asserts at import that MUJOCO_EGL_DEVICE_ID is one of CUDA_VISIBLE_DEVICES.

Worker i of n owns devices[i::n] when there are at least n devices, else the one device
devices[i % len]. It is pinned before anything in it initialises CUDA or EGL (the plugin does it
in the worker's pytest_configure): CUDA_VISIBLE_DEVICES lists every device it owns and
MUJOCO_EGL_DEVICE_ID names the first. Neither changes afterwards. A suites-mode cell staggers
its envs over the worker's own devices (`egl_device_for_cell`); the env is built for that EGL
device and renders on it explicitly (sim/gl.py), never through a mutated environment variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from pytest_gap.errors import GapError

DEVICES_VAR = "GAP_MUJOCO_EGL_DEVICES"


def parse_devices(raw: str | None, var: str = DEVICES_VAR) -> list[str]:
    if raw is None or not raw.strip():
        return []
    devices = [part.strip() for part in raw.split(",")]
    if any(not d.isdigit() for d in devices):
        raise GapError(f"{var}={raw!r}: expected comma-separated GPU ids such as 0,1,2")
    return devices


def worker_index(worker_id: str | None) -> int:
    """gw3 -> 3; the controller or a run without xdist is worker 0."""
    if worker_id and worker_id.startswith("gw") and worker_id[2:].isdigit():
        return int(worker_id[2:])
    return 0


def worker_devices(devices: list[str], index: int, n_workers: int) -> list[str]:
    """The devices worker `index` of `n_workers` owns (its first is its default)."""
    n_workers = max(n_workers, 1)
    if len(devices) >= n_workers:
        return devices[index % n_workers :: n_workers]
    return [devices[index % len(devices)]]


def pin(
    environ: MutableMapping[str, str], worker_id: str | None, n_workers: int | None = None
) -> dict[str, str]:
    """Export the worker's devices into `environ`; return what was set ({} without the variable).

    `n_workers` is the session's worker count (xdist's workerinput); None reads
    PYTEST_XDIST_WORKER_COUNT (1 without xdist)."""
    devices = parse_devices(environ.get(DEVICES_VAR))
    if not devices:
        return {}
    n_workers = n_workers or int(environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    own = worker_devices(devices, worker_index(worker_id), n_workers)
    pinned = {"CUDA_VISIBLE_DEVICES": ",".join(own), "MUJOCO_EGL_DEVICE_ID": own[0]}
    environ.update(pinned)
    return pinned


def egl_device_for_cell(offset: int, environ: Mapping[str, str] = os.environ) -> int | None:
    """Suites mode staggers cells: the EGL device this worker's envs of a cell are built for.

    One of the worker's own devices (those `pin` exported in CUDA_VISIBLE_DEVICES), picked by the
    cell's offset; None when GAP_MUJOCO_EGL_DEVICES is not set (the process default device)."""
    if not parse_devices(environ.get(DEVICES_VAR)):
        return None
    own = parse_devices(environ.get("CUDA_VISIBLE_DEVICES"), "CUDA_VISIBLE_DEVICES")
    return int(own[offset % len(own)]) if own else None
