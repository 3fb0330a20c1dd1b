"""videos/: every trial video hard-linked under a flat descriptive name, one per trial."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pytest_gap.layout import VIDEOS_DIR
from pytest_gap.outputs.hook import hookimpl
from pytest_gap.results import TrialResult


def video_name(r: TrialResult) -> str:
    """The trial's identity as a flat name (TrialIdentity.slug), then its verdict."""
    return f"{r.identity.slug}__{'pass' if r.success else 'fail'}.mp4"


def collate_videos(run_dir: Path, results: list[TrialResult]) -> int:
    """Hard-link every trial video into run_dir/videos/; a re-run trial replaces its old link
    (whose verdict may differ)."""
    videos = run_dir / VIDEOS_DIR
    count = 0
    for r in results:
        if not r.video or not (run_dir / r.video).is_file():
            continue
        name = video_name(r)
        dest = videos / name
        videos.mkdir(exist_ok=True)
        for stale in videos.glob(name.rsplit("__", 1)[0] + "__*.mp4"):
            stale.unlink()
        try:
            os.link(run_dir / r.video, dest)
        except OSError:  # another filesystem, or links unsupported
            shutil.copy2(run_dir / r.video, dest)
        count += 1
    return count


@hookimpl
def pytest_gap_write_outputs(run_dir: Path, results: dict[str, TrialResult]) -> None:
    collate_videos(run_dir, list(results.values()))
