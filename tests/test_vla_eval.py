"""Our vla-eval protocol client against a model server built from vla_eval's own classes,
in-process on loopback; and a run_policy trial through it on real LIBERO."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from vla_eval.model_servers.predict import PredictModelServer

# vla_eval's serve_async on loopback (other tests import Served from here)
from bench.twin import MessageLog, Served
from pytest_gap.policies.client import PolicyTransportError, VlaEvalClient, connect_policy
from pytest_gap.policies.endpoint import PolicyEndpoint
from tests.test_policies import Batched


class RecordingServer(MessageLog, PredictModelServer):
    """Returns a 4-step chunk whose x delta encodes the state it saw; remembers observations and
    logs every message (bench/twin.py MessageLog). Asks for the wrist image and the state, as
    vla-eval's pi0 server does."""

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


PROMPT = "pick up the alphabet soup and place it in the basket"


def _policy_node(**inputs):
    from pytest_gap.workflow.schema import validate_workflow

    return validate_workflow(
        {
            "version": 1,
            "name": "policy_node",
            "start": "policy",
            "nodes": {
                "policy": {
                    "type": "tool",
                    "skill": "run_policy",
                    "inputs": {"policy": "vla", **inputs},
                    "next": "end",
                },
                "end": {"type": "end", "status": "failure"},
            },
        }
    )


def test_run_policy_drives_libero_through_a_vla_eval_server(object_env):
    """... as one episode of vla-eval's protocol, with the messages vla-eval's loop sends: the
    task first, the result when the node returns (here at max_windows)."""
    from pytest_gap.workflow.executor import run_workflow

    workflow = _policy_node(max_windows=3, replan_every=4)
    # The server buffers its 4-action chunks and answers one action per observation, as
    # vla-eval model servers do for its own LIBERO benchmark.
    model = RecordingServer(chunk_size=4)
    with Served(model) as served:
        object_env.reset(0)
        # No obs_format: the vla-eval protocol's default, vla-eval-libero.
        endpoint = PolicyEndpoint(url=f"ws://127.0.0.1:{served.port}", protocol="vla-eval")
        result = run_workflow(workflow, object_env, policies={"vla": endpoint})
        (stream,) = model.streams(1)
    assert result.exit_status == "end_failure" and not result.infra_failure
    assert [kind for kind, _ in stream] == ["episode_start", *["observation"] * 12, "episode_end"]
    task = {"name": PROMPT, "suite": "libero_object", "task_id": 0, "episode_idx": 0}
    assert stream[0] == ("episode_start", {"task": task})
    _, end = stream[-1]
    assert end["metrics"] == {"success": False} and end["steps"] == 12
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
    assert first["task_description"] == PROMPT
    assert first["states"].shape == (8,)


class SecondReplyBad(MessageLog, PredictModelServer):
    """One 7-D action, then two at once: what vla-eval's LIBERO benchmark cannot apply (its step
    asserts 7 numbers: an env_step error), nor the vla-eval-libero format (a SkillFailure)."""

    def predict(self, obs, ctx):
        actions = np.zeros((1 if ctx.step == 0 else 2, 7), np.float32)
        actions[:, 6] = -1.0
        return {"actions": actions[0] if ctx.step == 0 else actions}


def test_after_an_error_run_policy_sends_no_episode_end_as_vla_evals_loop_sends_none(object_env):
    """vla-eval's SyncEpisodeRunner raises past its `end_episode`; the server sees only its own
    serve.py end the episode at the disconnect (`on_episode_end({})`, no message came)."""
    from pytest_gap.workflow.executor import run_workflow

    model = SecondReplyBad()
    with Served(model) as served:
        object_env.reset(0)
        endpoint = PolicyEndpoint(url=served.url, protocol="vla-eval")
        result = run_workflow(_policy_node(), object_env, policies={"vla": endpoint})
        (stream,) = model.streams(1)
    assert result.exit_status == "error" and "shape (2, 7)" in result.error, result.error
    kinds = [kind for kind, _ in stream]
    assert kinds == ["episode_start", "observation", "observation", "episode_end"]
    task = {"name": PROMPT, "suite": "libero_object", "task_id": 0, "episode_idx": 0}
    assert stream[0] == ("episode_start", {"task": task})
    assert stream[-1] == ("episode_end", {})


def test_vla_evals_server_batches_connections_through_the_policys_infer_batch():
    """Four vla-eval clients at once against `model_server(..., max_batch_size=4)`: vla-eval's
    PredictModelServer gathers their observations into predict_batch, one infer_batch call, and
    each client gets its own reply back."""
    from pytest_gap.errors import GapError
    from pytest_gap.policies.builtin import HoldPolicy
    from pytest_gap.policies.vla_eval_server import model_server

    policy = Batched(sender=lambda obs: obs["states"][0])
    # A window far longer than four clients need: a full batch goes at once.
    server = model_server(policy, "batched", max_batch_size=4, max_wait_ms=10_000)
    replies, barrier = {}, threading.Barrier(4)

    def one_client(i: int, url: str) -> None:
        with VlaEvalClient(url) as client:
            barrier.wait()
            replies[i] = client.infer(_obs(float(i)))["actions"]

    with Served(server) as served:
        url = f"ws://127.0.0.1:{served.port}"
        threads = [threading.Thread(target=one_client, args=(i, url)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert sorted(replies) == [0, 1, 2, 3]
    assert all(np.allclose(replies[i], i) for i in replies)  # nobody got another's reply
    assert max(policy.calls) > 1 and sum(policy.calls) == 4 and server.batch_sizes == policy.calls
    with pytest.raises(GapError, match="batching needs a policy with infer_batch"):
        model_server(HoldPolicy(), "hold", max_batch_size=2)
