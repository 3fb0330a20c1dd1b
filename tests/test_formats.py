"""Observation formats against the reference clients' own code: openpi's LIBERO recipe on LIBERO's
OffScreenRenderEnv with openpi-client's image_tools, and vla-eval's LIBEROBenchmark itself; a
policy_only trial against a server that enforces openpi's LiberoInputs contract; which format
a registry entry gets; presets that name real openpi configs."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from pytest_gap.config import ConfigError, PolicyEntry, parse_config
from pytest_gap.policies.endpoint import ObsFormatName
from pytest_gap.policies.formats import (
    FORMATS,
    OpenpiLiberoFormat,
    ReplyError,
    UnsupportedServerRequest,
    VlaEvalLiberoFormat,
    _matrix_to_quat,
    _vla_quat_to_axisangle,
    resize_with_pad,
)
from pytest_gap.servers.manager import OPENPI_LIBERO_CONFIGS, PRESETS
from pytest_gap.sim.libero import fresh_property_samplers, make_env

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"
# (suite, task id, init state): two suites, two scenes, one per reference client (each reference
# renders two 256x256 cameras per step on software GL: about 10 s a case here). The formats do not
# branch on the suite; the scene each is checked on differs.
OPENPI_CASE, VLA_EVAL_CASE = ("libero_object", 2, 3), ("libero_spatial", 4, 11)


def _case_id(case: tuple[str, int, int]) -> str:
    return f"{case[0]}-task{case[1]}-init{case[2]}"


# Actions applied after the settle steps, through both sides (gripper values not at +-1 on
# purpose: vla-eval snaps them, openpi sends them as they are).
ACTIONS = [[0.4, -0.3, 0.2, 0.05, 0.0, -0.1, 0.3], [-0.2, 0.5, -0.4, 0.0, 0.1, 0.0, -0.2]] * 3
MAX_GREY_DIFF = 1.0  # mean absolute difference, grey levels (the tolerance)
# Measured: 0.0. Both sides render the same frames on the same GL backend; an observation
# rendered one physics substep late (LIBERO samples before the step ends) is ~0.9 off.
MEASURED_GREY_DIFF = 0.01
MAX_STATE_DIFF = 1e-5
MEASURED: dict[str, float] = {}
CONTRACT_SERVER = "tests.openpi_double:LiberoInputsContract"
CONTRACT_STEPS = 15  # three requests of 5 actions: every request is checked against the contract


def _libero_task(suite: str, task_id: int):
    from libero.libero import benchmark

    return benchmark.get_benchmark_dict()[suite]().get_task(task_id)


def _grey_diff(ours: np.ndarray, theirs: np.ndarray) -> float:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == np.uint8
    return float(np.abs(ours.astype(float) - theirs.astype(float)).mean())


@pytest.fixture(scope="module")
def case(request):
    """Our env (the runner's options: no cameras configured, no MSAA) reset to the init state."""
    suite, task_id, init = request.param
    with make_env(suite, task_id) as env:
        env.reset(init)
        # Same scene file as LIBERO's own task of that index.
        assert env.task.bddl_file.name == _libero_task(suite, task_id).bddl_file
        yield suite, task_id, init, env


# -- openpi-libero -------------------------------------------------------------------------------


def _openpi_element(obs: dict, prompt: str) -> dict:
    """openpi examples/libero/main.py's request, with openpi-client's own image_tools."""
    from openpi_client import image_tools
    from robosuite.utils.transform_utils import quat2axisangle  # openpi copies this one

    img = np.ascontiguousarray(obs["agentview_image"][::-1, ::-1])
    wrist = np.ascontiguousarray(obs["robot0_eye_in_hand_image"][::-1, ::-1])
    return {
        "observation/image": image_tools.convert_to_uint8(
            image_tools.resize_with_pad(img, 224, 224)
        ),
        "observation/wrist_image": image_tools.convert_to_uint8(
            image_tools.resize_with_pad(wrist, 224, 224)
        ),
        "observation/state": np.concatenate(
            (
                obs["robot0_eef_pos"],
                quat2axisangle(obs["robot0_eef_quat"]),
                obs["robot0_gripper_qpos"],
            )
        ),
        "prompt": str(prompt),
    }


# An init state pins the free objects, not the fixtures (cabinets, stoves): LIBERO jitters those
# (up to ~2 cm) at every reset from NumPy's global RNG. The harness seeds that RNG with the
# trial's seed just before each reset (sim/libero.py). The reference envs below are
# OffScreenRenderEnv as openpi and vla-eval build it (hard resets), seeded with the seed and
# kept from piling up LIBERO's object-state samplers (`fresh_property_samplers`; without it a
# hard reset draws one more number per reset before): they draw the jitter our soft reset
# draws, so what is compared is the observation format, not a scene from another draw.


def _openpi_reference(suite: str, task_id: int, init: int) -> list[dict]:
    """openpi's client loop on LIBERO's OffScreenRenderEnv: the request after the 10 settle
    steps, then after each of ACTIONS (applied as openpi applies a chunk: as sent). openpi
    seeds with 7 (`env.seed(7)`); the seed here is the trial's (see above)."""
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs import OffScreenRenderEnv

    task_suite = benchmark.get_benchmark_dict()[suite]()
    task = task_suite.get_task(task_id)
    bddl = Path(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
    with fresh_property_samplers():
        env = OffScreenRenderEnv(bddl_file_name=str(bddl), camera_heights=256, camera_widths=256)
    try:
        env.seed(init)
        with fresh_property_samplers():
            env.reset()
        obs = env.set_init_state(task_suite.get_task_init_states(task_id)[init])
        for _ in range(10):
            obs, *_ = env.step([0.0] * 6 + [-1.0])
        requests = [_openpi_element(obs, task.language)]
        for action in ACTIONS:
            obs, *_ = env.step(np.asarray(action).tolist())
            requests.append(_openpi_element(obs, task.language))
    finally:
        env.close()
    return requests


@pytest.mark.images
@pytest.mark.parametrize("case", [OPENPI_CASE], indirect=True, ids=_case_id)
def test_openpi_libero_is_what_openpis_libero_client_sends(case):
    suite, task_id, init, env = case
    theirs = _openpi_reference(suite, task_id, init)
    fmt = FORMATS["openpi-libero"]
    env.reset(init)
    ours = [fmt.observation(env, "", {})]
    for action in ACTIONS:
        env.step(fmt.actions({"actions": np.array([action] * 5)}, 5)[0])
        ours.append(fmt.observation(env, "", {}))
    image_diffs, state_diffs = [], []
    for mine, ref in zip(ours, theirs, strict=True):
        assert (
            set(mine)
            == set(ref)
            == {
                "observation/image",
                "observation/wrist_image",
                "observation/state",
                "prompt",
            }
        )
        assert mine["prompt"] == ref["prompt"] == _libero_task(suite, task_id).language
        image_diffs.append([_grey_diff(mine[k], ref[k]) for k in sorted(mine) if "image" in k])
        assert mine["observation/state"].shape == (8,)
        state_diffs.append(np.abs(mine["observation/state"] - ref["observation/state"]).max())
    image_diffs = np.array(image_diffs)
    MEASURED[f"openpi {suite}: max image diff (image, wrist)"] = image_diffs.max(axis=0).tolist()
    MEASURED[f"openpi {suite}: max state diff"] = float(max(state_diffs))
    print(json.dumps(MEASURED))
    assert image_diffs.max() < min(MAX_GREY_DIFF, MEASURED_GREY_DIFF), image_diffs
    assert max(state_diffs) < MAX_STATE_DIFF, state_diffs
    # The 180-degree turn matters: our upright render, not turned, is far from openpi's image.
    upright = resize_with_pad(env.observe(("agentview",)).images["agentview"], 224, 224)
    assert _grey_diff(upright, theirs[-1]["observation/image"]) > 10 * MAX_GREY_DIFF


def test_resize_with_pad_is_openpi_clients():
    from openpi_client import image_tools

    rng = np.random.default_rng(0)
    for shape in ((256, 256, 3), (480, 640, 3), (300, 200, 3), (224, 224, 3), (100, 120, 3)):
        image = rng.integers(0, 256, shape, dtype=np.uint8)
        theirs = image_tools.resize_with_pad(image, 224, 224)
        assert np.array_equal(resize_with_pad(image, 224, 224), np.asarray(theirs)), shape


def test_openpi_libero_replies_need_replan_every_actions():
    fmt = OpenpiLiberoFormat()
    chunk = np.zeros((10, 7), np.float32)
    assert fmt.actions({"actions": chunk}, 5).shape == (10, 7)
    with pytest.raises(ReplyError, match="3 actions, fewer than replan_every=5"):
        fmt.actions({"actions": chunk[:3]}, 5)
    with pytest.raises(ReplyError, match=r"\(H, 7\) `actions`"):
        fmt.actions({"action": chunk}, 5)


# -- vla-eval-libero -----------------------------------------------------------------------------


def _vla_eval_benchmark(suite: str, **params):
    """vla-eval's own LIBEROBenchmark. Its lazy LIBERO set-up imports torch only to patch
    torch.load for LIBERO's torch-pickled init states; the LIBERO installed here loads them
    without torch, so the set-up is done as it does it, minus that patch."""
    from libero.libero import benchmark
    from vla_eval.benchmarks.libero.benchmark import LIBEROBenchmark

    bench = LIBEROBenchmark(suite=suite, **params)
    bench._task_suite = benchmark.get_benchmark_dict()[suite]()
    return bench


def _vla_eval_reference(suite: str, task_id: int, init: int) -> list[dict]:
    """vla-eval's episode loop (SyncEpisodeRunner) without the model server: the observation
    after its reset, then after each of ACTIONS sent as a model server's one-action replies.
    Its env is seeded with the trial's seed, which places fixtures as ours (see above)."""
    import anyio

    bench = _vla_eval_benchmark(suite, send_wrist_image=True, send_state=True, env_seed=init)
    task = {**bench.get_tasks()[task_id], "episode_idx": init}
    observations = []
    try:
        with fresh_property_samplers():
            anyio.run(bench.start_episode, task)
        observations.append(anyio.run(bench.get_observation))
        for action in ACTIONS:
            anyio.run(bench.apply_action, {"actions": np.asarray(action, np.float32)})
            observations.append(anyio.run(bench.get_observation))
    finally:
        bench.cleanup()
    return observations


@pytest.mark.images
@pytest.mark.parametrize("case", [VLA_EVAL_CASE], indirect=True, ids=_case_id)
def test_vla_eval_libero_is_what_vla_evals_libero_benchmark_sends(case):
    suite, task_id, init, env = case
    theirs = _vla_eval_reference(suite, task_id, init)
    fmt = FORMATS["vla-eval-libero"]
    server = {"observation_params": {"send_wrist_image": True, "send_state": True}}
    env.reset(init)
    ours = [fmt.observation(env, "", server)]
    for action in ACTIONS:
        (step,) = fmt.actions({"actions": np.asarray(action, np.float32)}, 5)
        env.step(step)
        ours.append(fmt.observation(env, "", server))
    image_diffs, state_diffs = [], []
    for mine, ref in zip(ours, theirs, strict=True):
        assert (
            set(mine) == set(ref) == {"images", "task_description", "states", "controller_states"}
        )
        assert list(mine["images"]) == list(ref["images"]) == ["agentview", "wrist"]
        assert mine["task_description"] == ref["task_description"]
        image_diffs.append(
            [_grey_diff(mine["images"][k], ref["images"][k]) for k in mine["images"]]
        )
        for key in ("states", "controller_states"):
            assert mine[key].dtype == ref[key].dtype and mine[key].shape == (8,)
        state_diffs.append(
            max(np.abs(mine[k] - ref[k]).max() for k in ("states", "controller_states"))
        )
    image_diffs = np.array(image_diffs)
    MEASURED[f"vla-eval {suite}: max image diff (agentview, wrist)"] = image_diffs.max(
        axis=0
    ).tolist()
    MEASURED[f"vla-eval {suite}: max state diff"] = float(max(state_diffs))
    print(json.dumps(MEASURED))
    assert ours[0]["images"]["agentview"].shape == (256, 256, 3)
    assert image_diffs.max() < min(MAX_GREY_DIFF, MEASURED_GREY_DIFF), image_diffs
    assert max(state_diffs) < MAX_STATE_DIFF, state_diffs


def test_vla_eval_libero_sends_only_what_the_server_asks_for(object_env):
    object_env.reset(0)
    fmt = VlaEvalLiberoFormat()
    bare = fmt.observation(object_env, "", {})  # vla-eval's defaults: no wrist image, no state
    assert set(bare) == {"images", "task_description"} and list(bare["images"]) == ["agentview"]
    assert bare["task_description"] == "pick up the alphabet soup and place it in the basket"
    with pytest.raises(UnsupportedServerRequest, match="absolute_action"):
        fmt.observation(object_env, "", {"observation_params": {"absolute_action": True}})


def test_vla_eval_rotations_are_vla_evals():
    from vla_eval.benchmarks.libero.benchmark import _quat_to_axisangle_robosuite
    from vla_eval.rotation import matrix_to_quat, quat_to_axisangle, quat_to_matrix

    rng = np.random.default_rng(1)
    quats = rng.normal(size=(200, 4))
    quats[:50, 3] *= 1e-4  # near w = 0, where the antipodal choice flips the sign
    quats /= np.linalg.norm(quats, axis=1, keepdims=True)
    for q in quats:
        assert np.array_equal(_vla_quat_to_axisangle(q, True), quat_to_axisangle(q))
        assert np.array_equal(_vla_quat_to_axisangle(q, False), _quat_to_axisangle_robosuite(q))
        mat = quat_to_matrix(q).astype(np.float32)
        assert np.array_equal(_matrix_to_quat(mat), matrix_to_quat(mat))


def test_vla_eval_libero_applies_one_snapped_action_per_reply():
    fmt = VlaEvalLiberoFormat()
    action = fmt.actions({"actions": np.array([0.1, 0, 0, 0, 0, 0, 0.2], np.float32)}, 5)
    assert action.shape == (1, 7) and action[0, 6] == 1.0
    assert fmt.actions({"action": [0, 0, 0, 0, 0, 0, -0.01]}, 5)[0, 6] == -1.0
    assert fmt.actions({"actions": [[0, 0, 0, 0, 0, 0, 0.0]]}, 5)[0, 6] == 1.0
    with pytest.raises(ReplyError, match="one 7-D action per observation"):
        fmt.actions({"actions": np.zeros((4, 7))}, 5)


# -- a policy_only trial against openpi's input contract ----------------------------------------


def _grid(pytester, entry: dict) -> None:
    data = {
        "policies": {"pi": entry},
        "trials": {"max_steps": CONTRACT_STEPS},
        "benchmark": {
            "families": ["libero"],
            "variations": ["object"],
            "modes": ["policy_only"],
            "policies": ["pi"],
            "task_ids": [0],
            "n_seeds": 1,
            "gate_threshold": 0.0,
            "output_dir": "runs",
            "mode_overrides": {"policy_only": {"template": "policy_only"}},
        },
    }
    (pytester.path / "grid.yaml").write_text(yaml.safe_dump(data))


def _contract_server(obs_format: str) -> dict:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {
        "command": [GAP, "policy", "serve", CONTRACT_SERVER, "--port", "{port}"],
        "obs_format": obs_format,
        "env": {"PYTHONPATH": path},
    }


def _only_result(pytester) -> dict:
    (path,) = (pytester.path / "runs").rglob("result.json")
    return json.loads(path.read_text())


@pytest.mark.images
def test_a_policy_only_trial_meets_openpis_libero_inputs_contract(pytester):
    _grid(pytester, _contract_server("openpi-libero"))
    result = pytester.runpytest_inprocess("grid.yaml")
    record = _only_result(pytester)
    assert result.ret == 0, result.stdout.str()
    assert not record["infra_failure"] and record["error"] is None, record
    # (10, 7) chunks of zero motion, 5 actions per request, until the step limit (the
    # bring-up before the policy is not charged to it)
    assert record["exit_status"] == "step_limit"
    assert record["steps"] == CONTRACT_STEPS


def test_the_contract_server_refuses_the_native_format(pytester):
    _grid(pytester, _contract_server("gap"))
    result = pytester.runpytest_inprocess("grid.yaml")
    record = _only_result(pytester)
    assert result.ret == 1
    assert record["infra_failure"] and "LiberoInputs reads exactly" in record["error"]


# -- which format an entry gets ------------------------------------------------------------------


def test_every_format_name_has_a_format():
    from typing import get_args

    assert set(FORMATS) == set(get_args(ObsFormatName))


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"url": "ws://h:1"}, "openpi-libero"),
        ({"preset": "pi05-libero"}, "openpi-libero"),
        ({"url": "ws://h:1", "protocol": "vla-eval"}, "vla-eval-libero"),
        ({"command": [GAP, "policy", "serve", "random", "--port", "{port}"]}, "gap"),
        ({"command": "gap policy serve mypkg:MyVLA --port {port}"}, "gap"),
        (  # vla-eval's own server: it reads what vla-eval's LIBERO benchmark sends
            {
                "command": "gap policy serve replay --protocol vla-eval --port {port}",
                "protocol": "vla-eval",
            },
            "vla-eval-libero",
        ),
        ({"command": "python my_openpi_server.py --port {port}"}, "openpi-libero"),
        ({"url": "ws://h:1", "privileged_state": True}, "gap"),
        (
            {"command": "gap policy serve x --port {port}", "obs_format": "openpi-libero"},
            "openpi-libero",
        ),
        ({"url": "ws://h:1", "obs_format": "gap"}, "gap"),
    ],
)
def test_an_entrys_obs_format_defaults_by_who_wrote_the_server(entry, expected):
    assert PolicyEntry(**entry).resolved_obs_format == expected


def test_endpoints_carry_the_format_and_the_started_servers_url():
    from pytest_gap.policies.endpoint import PolicyEndpoint
    from pytest_gap.servers.registry import endpoints_for

    config = parse_config(
        {
            "policies": {
                "pi": {"url": "ws://h:1"},
                "vla": {"url": "ws://h:2", "protocol": "vla-eval"},
                "mine": {"url": "ws://h:3", "obs_format": "gap"},
                "served": {"command": "gap policy serve x --port {port}", "privileged_state": True},
            },
            "benchmark": {"modes": ["policy_only"], "policies": ["pi", "vla", "mine", "served"]},
        }
    )
    assert set(endpoints_for(config)) == {"pi", "vla", "mine"}  # "served" is not started
    endpoints = endpoints_for(config, {"served": "ws://127.0.0.1:5"})
    formats = {pid: e.obs_format for pid, e in endpoints.items()}
    assert formats == {
        "pi": "openpi-libero",
        "vla": "vla-eval-libero",
        "mine": "gap",
        "served": "gap",
    }
    assert endpoints["served"] == PolicyEndpoint(
        url="ws://127.0.0.1:5",
        protocol="openpi",
        obs_format="gap",
        privileged=True,
        policy_id="served",
    )
    # built by hand (a script, a test), an endpoint gets its protocol's format
    assert PolicyEndpoint(url="ws://h:2", protocol="vla-eval").obs_format == "vla-eval-libero"


def test_an_unknown_obs_format_is_a_one_line_config_error():
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "policies": {"pi": {"url": "ws://h:1", "obs_format": "openpi"}},
                "benchmark": {"modes": ["policy_only"], "policies": ["pi"]},
            }
        )
    (line,) = str(info.value).splitlines()
    assert "policies.pi.obs_format" in line and "'openpi-libero'" in line and "'openpi'" in line


# -- presets ---------------------------------------------------------------------------------------


def test_presets_serve_real_openpi_libero_configs():
    assert set(PRESETS) == {"pi05-libero", "pi0-libero", "pi0-fast-libero"}
    for name, command in PRESETS.items():
        argv = shlex.split(command)
        assert argv[:3] == ["uv", "run", "scripts/serve_policy.py"], name
        options = dict(a.split("=", 1) for a in argv if a.startswith("--policy."))
        config = options["--policy.config"]
        assert config in OPENPI_LIBERO_CONFIGS, name
        assert name.replace("-", "_") == config, name
        assert options["--policy.dir"] == f"gs://openpi-assets/checkpoints/{config}", name


@pytest.mark.images
def test_libero_obs_shows_a_perturbed_scene_even_without_settle_steps():
    """The LIBERO view is the scene robosuite last sampled; a variation moves objects after
    that sample, and with no settle step to resample, the view must still show them moved."""
    from pytest_gap.sim.libero import EnvOptions
    from pytest_gap.sim.libero_backend import resolve

    with make_env("libero_object", 0, EnvOptions(settle_steps=0)) as env:
        env.reset(0, variation=resolve("posvar", "pos_var"))
        seen = env.libero_obs()["agentview_image"][::-1]
        live = env.scene.renderer.rgb("agentview", 256, 256, multisample=True)
    assert _grey_diff(seen, live) == 0.0
