"""GAP_MUJOCO_EGL_DEVICES round-robin pinning (the xdist session test checks real workers)."""

from __future__ import annotations

import pytest

from pytest_gap.devices import device_for, egl_device_for_cell, parse_devices, pin, worker_index
from pytest_gap.errors import GapError


def test_workers_round_robin_over_the_listed_devices_from_an_offset():
    devices = parse_devices(" 1, 2,3 ")
    assert devices == ["1", "2", "3"]
    assert [device_for(worker_index(f"gw{i}"), 0, devices) for i in range(4)] == [
        "1",
        "2",
        "3",
        "1",
    ]
    assert [device_for(i, 2, devices) for i in range(3)] == ["3", "1", "2"]
    assert worker_index(None) == 0 and worker_index("master") == 0


def test_pin_exports_both_variables_or_nothing():
    environ = {"GAP_MUJOCO_EGL_DEVICES": "4,6"}
    assert pin(environ, "gw1") == {"CUDA_VISIBLE_DEVICES": "6", "MUJOCO_EGL_DEVICE_ID": "6"}
    assert environ["CUDA_VISIBLE_DEVICES"] == environ["MUJOCO_EGL_DEVICE_ID"] == "6"
    untouched = {"CUDA_VISIBLE_DEVICES": "0"}
    assert pin(untouched, "gw1") == {} and untouched == {"CUDA_VISIBLE_DEVICES": "0"}


def test_a_malformed_device_list_names_the_variable():
    with pytest.raises(GapError, match="GAP_MUJOCO_EGL_DEVICES='0;1': expected comma-separated"):
        parse_devices("0;1")


def test_suites_cells_stagger_the_egl_device(monkeypatch):
    monkeypatch.setenv("GAP_MUJOCO_EGL_DEVICES", "0,1,2")
    assert [egl_device_for_cell("gw0", offset) for offset in (0, 2, 5)] == ["0", "2", "2"]
    monkeypatch.delenv("GAP_MUJOCO_EGL_DEVICES")
    assert egl_device_for_cell("gw0", 2) is None
