"""GAP_MUJOCO_EGL_DEVICES: which devices a worker owns and which one a suites cell's envs use
(the xdist session test in test_plugin.py checks real workers against robosuite's own check)."""

from __future__ import annotations

import pytest

from pytest_gap.errors import GapError
from pytest_gap.run.devices import (
    egl_device_for_cell,
    parse_devices,
    pin,
    worker_devices,
    worker_index,
)


def test_workers_share_out_the_devices_or_round_robin_when_there_are_fewer():
    devices = parse_devices(" 1, 2,3,4 ")
    assert devices == ["1", "2", "3", "4"]
    assert [worker_devices(devices, i, 2) for i in range(2)] == [["1", "3"], ["2", "4"]]
    assert [worker_devices(devices, i, 3) for i in range(3)] == [["1", "4"], ["2"], ["3"]]
    assert [worker_devices(devices[:3], i, 4) for i in range(4)] == [["1"], ["2"], ["3"], ["1"]]
    assert worker_devices(devices, 0, 1) == devices  # no xdist: one process owns them all
    assert worker_index("gw3") == 3 and worker_index(None) == 0 and worker_index("master") == 0


def test_pin_exports_the_owned_devices_and_the_first_as_egl_default():
    environ = {"GAP_MUJOCO_EGL_DEVICES": "4,6,8,9", "PYTEST_XDIST_WORKER_COUNT": "2"}
    assert pin(environ, "gw1") == {"CUDA_VISIBLE_DEVICES": "6,9", "MUJOCO_EGL_DEVICE_ID": "6"}
    assert environ["CUDA_VISIBLE_DEVICES"] == "6,9" and environ["MUJOCO_EGL_DEVICE_ID"] == "6"
    untouched = {"CUDA_VISIBLE_DEVICES": "0"}
    assert pin(untouched, "gw1") == {} and untouched == {"CUDA_VISIBLE_DEVICES": "0"}


def test_a_malformed_device_list_names_the_variable():
    with pytest.raises(GapError, match="GAP_MUJOCO_EGL_DEVICES='0;1': expected comma-separated"):
        parse_devices("0;1")


def test_suites_cells_stagger_over_the_workers_own_devices_only():
    environ = {"GAP_MUJOCO_EGL_DEVICES": "0,1,2,3", "PYTEST_XDIST_WORKER_COUNT": "2"}
    pin(environ, "gw1")  # owns 1 and 3
    staggered = [egl_device_for_cell(offset, environ) for offset in range(4)]
    assert staggered == [1, 3, 1, 3]
    assert all(str(d) in environ["CUDA_VISIBLE_DEVICES"].split(",") for d in staggered)
    assert egl_device_for_cell(2, {"CUDA_VISIBLE_DEVICES": "0,1"}) is None  # variable unset
