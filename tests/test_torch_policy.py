"""A torch module served as a policy (pytest_gap/policies/torch_policy.py): its checkpoint file,
`gap policy serve torch --checkpoint` as a real process on loopback, batching across
connections that keeps each reply its own, and the one-line refusals of a bad checkpoint."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from pytest_gap.evaluate import as_policy
from pytest_gap.policies.client import PolicyClient
from pytest_gap.policies.server import PolicyServer
from pytest_gap.policies.torch_policy import (
    TorchPolicy,
    file_digest,
    load_checkpoint,
    save_checkpoint,
)

# torch is imported by the tests that use it, not at collection: the fast tier collects this
# module and never pays for torch (tests/tiers.py)

ROOT = Path(__file__).resolve().parents[1]
GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"
FACTORY = "examples.policies.visuomotor:VisuomotorPolicy"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def observation(k: int, size: int = 64) -> dict:
    rng = np.random.default_rng(k)
    return {
        "images": {
            camera: rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
            for camera in ("agentview", "wrist")
        },
        "state": rng.normal(size=8).astype(np.float32),
        "prompt": ["pick up the alphabet soup", "open the top drawer"][k % 2],
    }


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import torch

    from examples.policies.visuomotor import VisuomotorPolicy

    torch.manual_seed(0)
    model = VisuomotorPolicy(image_size=32, chunk=4)
    with torch.no_grad():  # statistics a training run would have set
        model.action_mean.copy_(torch.linspace(-0.5, 0.5, 7))
    path = tmp_path_factory.mktemp("ckpt") / "late.pt"
    digest = save_checkpoint(
        path, model, factory=FACTORY, kwargs={"image_size": 32, "chunk": 4}, meta={"step": 900}
    )
    return path, digest, model


def test_a_checkpoint_loads_back_as_the_same_policy_and_says_which_file_it_is(checkpoint):
    import torch

    path, digest, model = checkpoint
    policy = load_checkpoint(path)
    assert digest == file_digest(path)
    assert policy.metadata == {"policy": FACTORY, "checkpoint": digest, "step": 900}
    obs = [observation(k) for k in range(3)]
    with torch.no_grad():
        expected = model.eval()(model.batch(obs)).numpy()
    got = np.stack([r["actions"] for r in policy.infer_batch(obs)])
    assert got.shape == (3, 4, 7) and np.allclose(got, expected, atol=1e-6)
    assert np.allclose(policy.infer(obs[1])["actions"], expected[1], atol=1e-6)
    # a training loop hands the module itself to pytest_gap.evaluate: it is served as this
    assert isinstance(as_policy(model), TorchPolicy)


def _serve(path: Path, *extra: str):
    with __import__("socket").socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [GAP, "policy", "serve", "torch", "--checkpoint", str(path), "--port", str(port), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return proc, f"ws://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"gap policy serve torch did not come up: {proc.communicate()}")
            time.sleep(0.2)


def test_gap_policy_serve_torch_batches_connections_and_keeps_each_reply_its_own(checkpoint):
    import torch

    path, digest, model = checkpoint
    obs = [observation(k) for k in range(8)]
    with torch.no_grad():
        expected = model.eval()(model.batch(obs)).numpy()
    proc, url = _serve(path, "--max-batch-size", "8", "--max-wait-ms", "50", "--threads", "1")
    try:
        replies: dict[int, list[np.ndarray]] = {}
        start = threading.Barrier(len(obs))

        def client(k: int) -> None:
            with PolicyClient(url) as policy:
                assert policy.metadata["checkpoint"] == digest
                start.wait()  # all eight ask at once: the server batches them
                replies[k] = [policy.infer(obs[k])["actions"] for _ in range(3)]

        threads = [threading.Thread(target=client, args=(k,)) for k in range(len(obs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    assert sorted(replies) == list(range(8))
    for k, got in replies.items():
        for actions in got:
            assert np.allclose(actions, expected[k], atol=1e-5), k


def test_concurrent_episodes_share_one_forward_pass(checkpoint):
    """Eight connections asking at once are answered by fewer forward passes than requests,
    each reply still the one its observation gets alone."""
    path, _, _ = checkpoint
    policy = load_checkpoint(path)
    sizes: list[int] = []
    alone = [policy.infer(observation(k))["actions"] for k in range(8)]

    class Counting(TorchPolicy):
        def infer_batch(self, observations):
            sizes.append(len(observations))
            return super().infer_batch(observations)

    counting = Counting(policy.module)
    replies: dict[int, np.ndarray] = {}
    start = threading.Barrier(8)
    with PolicyServer(counting, max_batch_size=8, max_wait_ms=50).start() as running:

        def client(k: int) -> None:
            with PolicyClient(running.url) as remote:
                start.wait()
                replies[k] = remote.infer(observation(k))["actions"]

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert sum(sizes) == 8 and max(sizes) > 1, sizes
    for k in range(8):
        assert np.allclose(replies[k], alone[k], atol=1e-5), k


def test_a_bad_checkpoint_or_flag_is_one_line_naming_it(tmp_path, checkpoint):
    import torch

    path, _, model = checkpoint

    def serve(*args):
        done = subprocess.run(
            [GAP, "policy", "serve", *args, "--port", "1"],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=60,
        )
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr
        return done.stderr

    assert "needs --checkpoint FILE" in serve("torch")
    assert "no such file" in serve("torch", "--checkpoint", str(tmp_path / "none.pt"))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    assert f"--checkpoint {junk}: not a torch checkpoint" in serve(
        "torch", "--checkpoint", str(junk)
    )
    plain = tmp_path / "plain.pt"
    torch.save(model.state_dict(), plain)  # weights alone: no class, no format
    assert "not a pytest-gap-torch/1 checkpoint" in serve("torch", "--checkpoint", str(plain))
    wrong = tmp_path / "wrong.pt"
    save_checkpoint(wrong, model, factory=FACTORY, kwargs={"image_size": 32, "chunk": 6})
    assert "its weights do not fit" in serve("torch", "--checkpoint", str(wrong))
    gone = tmp_path / "gone.pt"
    save_checkpoint(gone, model, factory="examples.policies.nowhere:Model")
    assert "cannot import its module examples.policies.nowhere:Model" in serve(
        "torch", "--checkpoint", str(gone)
    )
    assert "--checkpoint is for `gap policy serve torch` only" in serve(
        "hold", "--checkpoint", str(path)
    )
