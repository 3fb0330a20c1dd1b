"""Feature statistics of a LeRobot dataset (outputs/lerobot.py), as LeRobot keeps them: per
episode in meta/episodes (`stats/<feature>/<stat>`), over the whole dataset in meta/stats.json.

min, max, mean, std, count and the quantiles q01 q10 q50 q90 q99 of each feature over its rows;
images per channel, scaled to [0, 1], shaped (3, 1, 1). The dataset's are exact for min, max,
mean and std (pooled) and, as LeRobot aggregates them, the count-weighted mean of the episodes'
quantiles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}


def feature_stats(values: np.ndarray, axes: tuple[int, ...]) -> dict[str, np.ndarray]:
    import numpy as np

    values = values.astype(np.float64)
    out = {
        "min": values.min(axis=axes),
        "max": values.max(axis=axes),
        "mean": values.mean(axis=axes),
        "std": values.std(axis=axes),
        "count": np.array([values.shape[0]]),
    }
    for name, q in QUANTILES.items():
        out[name] = np.quantile(values, q, axis=axes)
    return out


def image_stats(frames: np.ndarray) -> dict[str, np.ndarray]:
    """Per channel over (frames, height, width), scaled to [0, 1], shaped (3, 1, 1) as LeRobot
    keeps image stats."""
    stats = feature_stats(frames.astype("float32") / 255.0, (0, 1, 2))
    return {k: v if k == "count" else v.reshape(3, 1, 1) for k, v in stats.items()}


def aggregate(per_episode: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Stats over all episodes from each one's: exact min, max, mean, std (pooled); the
    quantiles as the count-weighted mean of the episodes' (as LeRobot aggregates them)."""
    import numpy as np

    counts = np.array([float(s["count"][0]) for s in per_episode])
    weights = counts / counts.sum()

    def weighted(name):
        return sum(w * s[name] for w, s in zip(weights, per_episode, strict=True))

    mean = weighted("mean")
    second = sum(
        w * (s["std"] ** 2 + (s["mean"] - mean) ** 2)
        for w, s in zip(weights, per_episode, strict=True)
    )
    out = {
        "min": np.min([s["min"] for s in per_episode], axis=0),
        "max": np.max([s["max"] for s in per_episode], axis=0),
        "mean": mean,
        "std": np.sqrt(second),
        "count": np.array([int(counts.sum())]),
    }
    out.update({name: weighted(name) for name in QUANTILES})
    return out


def stats_columns(stats: dict[str, dict[str, np.ndarray]]) -> dict:
    return {
        f"stats/{feature}/{name}": value.tolist()
        for feature, by_name in stats.items()
        for name, value in by_name.items()
    }
