"""Our vla-eval protocol client against a model server built from vla_eval's own classes,
in-process on loopback; and a run_policy trial through it on real LIBERO."""

from __future__ import annotations

import threading

import anyio
import numpy as np
import pytest
from vla_eval.model_servers.predict import PredictModelServer
from vla_eval.model_servers.serve import serve_async

from pytest_gap.policies.client import PolicyTransportError, VlaEvalClient, connect_policy
from pytest_gap.policies.endpoint import PolicyEndpoint


class RecordingServer(PredictModelServer):
    """Returns a 4-step chunk whose x delta encodes the state it saw; remembers observations.
    Asks for the wrist image and the state, as vla-eval's pi0 server does."""

    def __init__(self, fail: bool = False, chunk_size: int | None = None):
        super().__init__(chunk_size=chunk_size)
        self.fail, self.seen, self.episodes = fail, [], 0

    def get_observation_params(self):
        return {"send_wrist_image": True, "send_state": True}

    def predict(self, obs, ctx):
        if self.fail:
            raise RuntimeError("model weights missing")
        self.seen.append(obs)
        actions = np.zeros((4, 7), np.float32)
        actions[:, 0] = obs["states"][0]
        actions[:, 6] = -1.0
        return {"actions": actions}

    async def on_episode_start(self, config, ctx):
        self.episodes += 1
        await super().on_episode_start(config, ctx)


class Served:
    """vla_eval's serve_async on a loopback port, in a thread with its own event loop."""

    def __init__(self, model):
        self.model, self.port = model, None
        self._ready, self._halt = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=anyio.run, args=(self._main,), daemon=True)

    async def _main(self):
        async with anyio.create_task_group() as tg:
            self.port = await tg.start(serve_async, self.model, "127.0.0.1", 0)
            self._ready.set()
            while not self._halt.is_set():
                await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    def __enter__(self):
        self._thread.start()
        assert self._ready.wait(20)
        return self

    def __exit__(self, *exc):
        self._halt.set()
        self._thread.join(10)


def _obs(state0: float) -> dict:
    """An observation in vla-eval's LIBERO keys (what the vla-eval-libero format builds)."""
    rng = np.random.default_rng(0)
    return {
        "images": {
            "agentview": rng.integers(0, 255, (64, 64, 3), dtype=np.uint8),
            "wrist": rng.integers(0, 255, (64, 64, 3), dtype=np.uint8),
        },
        "states": np.array([state0, 0, 0, 0, 0, 0, 0.04, -0.04]),
        "task_description": "put the milk in the basket",
    }


def test_our_client_talks_to_a_vla_eval_model_server():
    model = RecordingServer()
    with Served(model) as served, VlaEvalClient(f"ws://127.0.0.1:{served.port}") as client:
        assert client.metadata["model_server"] == "RecordingServer"
        assert client.metadata["protocol_version"] == 1
        assert client.metadata["observation_params"] == {
            "send_wrist_image": True,
            "send_state": True,
        }
        obs = _obs(0.25)
        reply = client.infer(obs)
        assert reply["actions"].shape == (4, 7) and np.allclose(reply["actions"][:, 0], 0.25)
        seen = model.seen[0]
        assert seen["task_description"] == "put the milk in the basket"
        # images crossed PNG-encoded and came back pixel-exact
        assert np.array_equal(seen["images"]["agentview"], obs["images"]["agentview"])
        assert np.allclose(seen["states"], obs["states"])
        client.episode_end({"success": False})
        client.infer(_obs(0.5))
        assert model.episodes == 2


def test_a_vla_eval_server_error_is_a_transport_error():
    with Served(RecordingServer(fail=True)) as served:
        client = connect_policy(f"ws://127.0.0.1:{served.port}", "vla-eval")
        with pytest.raises(PolicyTransportError, match="model weights missing"):
            client.infer(_obs(0.0))
        with pytest.raises(PolicyTransportError, match="the session is closed"):
            client.infer(_obs(0.0))


def test_run_policy_drives_libero_through_a_vla_eval_server(object_env):
    from pytest_gap.workflow.executor import run_workflow
    from pytest_gap.workflow.schema import validate_workflow

    workflow = validate_workflow(
        {
            "version": 1,
            "name": "three_windows",
            "start": "policy",
            "nodes": {
                "policy": {
                    "type": "tool",
                    "skill": "run_policy",
                    "inputs": {"policy": "vla", "max_windows": 3, "replan_every": 4},
                    "next": "end",
                },
                "end": {"type": "end", "status": "failure"},
            },
        }
    )
    # The server buffers its 4-action chunks and answers one action per observation, as
    # vla-eval model servers do for its own LIBERO benchmark.
    model = RecordingServer(chunk_size=4)
    with Served(model) as served:
        object_env.reset(0)
        # No obs_format: the vla-eval protocol's default, vla-eval-libero.
        endpoint = PolicyEndpoint(url=f"ws://127.0.0.1:{served.port}", protocol="vla-eval")
        result = run_workflow(workflow, object_env, policies={"vla": endpoint})
    assert result.exit_status == "end_failure" and not result.infra_failure
    # 3 windows of 4 actions: 12 observations sent, 3 chunks predicted.
    assert result.outputs["policy"] == {
        "status": "max_windows",
        "windows": 3,
        "steps": 12,
        "released": None,
    }
    assert len(model.seen) == 3
    first = model.seen[0]
    assert set(first) == {"images", "task_description", "states", "controller_states"}
    assert list(first["images"]) == ["agentview", "wrist"]
    assert first["images"]["wrist"].shape == (256, 256, 3)
    assert first["task_description"] == "pick up the alphabet soup and place it in the basket"
    assert first["states"].shape == (8,)
