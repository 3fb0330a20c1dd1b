"""GAP_MUJOCO_EGL_DEVICES: spread worker processes round-robin over the listed GPUs.

Worker i is pinned to devices[(offset + i) % len(devices)] by exporting both
CUDA_VISIBLE_DEVICES and MUJOCO_EGL_DEVICE_ID to that physical id. This must happen before
anything in the process initialises CUDA or an EGL context, i.e. before the simulator is
imported: the plugin does it in the worker's pytest_configure.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from pytest_gap.errors import GapError

DEVICES_VAR = "GAP_MUJOCO_EGL_DEVICES"
PINNED_VARS = ("CUDA_VISIBLE_DEVICES", "MUJOCO_EGL_DEVICE_ID")


def parse_devices(raw: str | None) -> list[str]:
    if raw is None or not raw.strip():
        return []
    devices = [part.strip() for part in raw.split(",")]
    if any(not d.isdigit() for d in devices):
        raise GapError(f"{DEVICES_VAR}={raw!r}: expected comma-separated GPU ids such as 0,1,2")
    return devices


def worker_index(worker_id: str | None) -> int:
    """gw3 -> 3; the controller or a run without xdist is worker 0."""
    if worker_id and worker_id.startswith("gw") and worker_id[2:].isdigit():
        return int(worker_id[2:])
    return 0


def device_for(index: int, offset: int, devices: list[str]) -> str:
    return devices[(offset + index) % len(devices)]


def pin(
    environ: MutableMapping[str, str], worker_id: str | None, offset: int = 0
) -> dict[str, str]:
    """Export the pinned device into `environ`; return what was set ({} without the variable)."""
    devices = parse_devices(environ.get(DEVICES_VAR))
    if not devices:
        return {}
    device = device_for(worker_index(worker_id), offset, devices)
    for var in PINNED_VARS:
        environ[var] = device
    return {var: device for var in PINNED_VARS}


def egl_device_for_cell(worker_id: str | None, offset: int) -> str | None:
    """Suites mode staggers cells: the EGL device this worker's envs of a cell should use."""
    devices = parse_devices(os.environ.get(DEVICES_VAR))
    return device_for(worker_index(worker_id), offset, devices) if devices else None
