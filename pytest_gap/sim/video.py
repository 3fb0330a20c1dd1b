"""MP4 recording of one episode through imageio-ffmpeg, written as frames arrive."""

from __future__ import annotations

from pathlib import Path

import numpy as np



class VideoWriter:
    def __init__(self, path: str | Path, fps: int = 20):
        import imageio.v2 as imageio

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.frames = 0
        self._writer = imageio.get_writer(
            str(self.path), fps=fps, codec="libx264", quality=8, macro_block_size=1
        )

    def append(self, frame: np.ndarray) -> None:
        self._writer.append_data(np.ascontiguousarray(frame, dtype=np.uint8))
        self.frames += 1

    def close(self) -> int:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        return self.frames


def read_frames(path: str | Path) -> np.ndarray:
    """All frames of a video as (N, H, W, 3) uint8."""
    import imageio.v2 as imageio

    with imageio.get_reader(str(path)) as reader:
        return np.stack([np.asarray(f) for f in reader])
