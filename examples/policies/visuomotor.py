"""A small visuomotor policy for LIBERO: both cameras at a reduced size, the proprio state and
the task's words in, a chunk of actions out. Served by `gap policy serve torch --checkpoint
FILE` (pytest_gap/policies/torch_policy.py); its inputs are the native `gap` observation.

    images  agentview, wrist: each resized to `image_size`, a 4-layer CNN to a 64-D feature
    state   8-D proprio, standardised with the training set's mean and std (buffers)
    prompt  its words hashed into `vocab` buckets, an EmbeddingBag (no vocabulary to ship)
    out     an MLP to `chunk` x 7 actions, un-standardised with the training set's statistics

About 0.2 M parameters: a forward pass of one observation is a few milliseconds on a CPU core,
which is what makes batching across episodes measurable (bench/policy_throughput.py).
"""

from __future__ import annotations

import zlib

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

CAMERAS = ("agentview", "wrist")


def word_buckets(prompt: str, vocab: int) -> list[int]:
    """A prompt's words as stable bucket ids (crc32: the same in every process, unlike hash)."""
    words = prompt.lower().replace(",", " ").replace(".", " ").split()
    return [zlib.crc32(w.encode()) % vocab for w in words] or [0]


class Encoder(nn.Module):
    def __init__(self, width: int = 32, out: int = 64):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(3, width, 5, stride=2, padding=2),
            nn.GELU(),
            nn.Conv2d(width, width, 3, stride=2, padding=1),
            nn.GELU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
            nn.GELU(),
            nn.Conv2d(2 * width, out, 3, stride=2, padding=1),
        )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.conv(image).amax(dim=(2, 3))  # global max pool: where a feature fired


class VisuomotorPolicy(nn.Module):
    def __init__(self, image_size: int = 96, chunk: int = 10, vocab: int = 512, hidden: int = 256):
        super().__init__()
        self.image_size, self.chunk, self.vocab = image_size, chunk, vocab
        self.encoders = nn.ModuleDict({c: Encoder() for c in CAMERAS})
        self.words = nn.EmbeddingBag(vocab, 32, mode="mean")
        self.head = nn.Sequential(
            nn.Linear(64 * len(CAMERAS) + 8 + 32, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, chunk * 7),
        )
        for name, size in (("state", 8), ("action", 7)):
            self.register_buffer(f"{name}_mean", torch.zeros(size))
            self.register_buffer(f"{name}_std", torch.ones(size))

    def batch(self, observations: list[dict]) -> dict[str, torch.Tensor]:
        """The native observations as this model's inputs (TorchPolicy calls it)."""
        out = {}
        for camera in CAMERAS:
            stacked = np.stack([np.asarray(o["images"][camera], np.uint8) for o in observations])
            images = torch.from_numpy(stacked).permute(0, 3, 1, 2).float().div_(255.0)
            if images.shape[-1] != self.image_size:
                images = F.interpolate(images, size=(self.image_size, self.image_size), mode="area")
            out[camera] = images
        out["state"] = torch.from_numpy(
            np.stack([np.asarray(o["state"], np.float32).reshape(8) for o in observations])
        )
        ids = [word_buckets(str(o.get("prompt", "")), self.vocab) for o in observations]
        out["words"] = torch.tensor([i for row in ids for i in row], dtype=torch.long)
        out["word_offsets"] = torch.tensor(np.cumsum([0] + [len(r) for r in ids[:-1]]))
        return out

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        features = [self.encoders[c](batch[c]) for c in CAMERAS]
        state = (batch["state"] - self.state_mean) / self.state_std
        words = self.words(batch["words"], batch["word_offsets"])
        raw = self.head(torch.cat([*features, state, words], dim=1))
        actions = raw.view(-1, self.chunk, 7)
        return actions * self.action_std + self.action_mean
