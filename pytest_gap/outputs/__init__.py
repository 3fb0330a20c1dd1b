"""The run dir's files, each written by one implementation of `pytest_gap_write_outputs`.

One module per output (summary.tsv, summary.json with the cell_result.json files,
episodes.parquet, videos/, plots/, run_manifest.json, the done flags): each has a plain function
that does the writing and a one-line hookimpl over it. The plugin registers `WRITERS` on the process
that writes outputs; a third-party writer registers itself the same way (see
pytest_gap/hookspecs.py) and needs no change here.
"""

from __future__ import annotations

import importlib
from typing import Any

WRITERS = ("tsv", "json", "parquet", "videos", "plots", "lerobot", "manifest", "done")


def register(config: Any) -> None:
    """Register the harness's own writers as plugins named `gap-output-<name>` on the pytest
    session `config` (typed Any: this package imports no pytest, so the evaluation service can
    call its writers; outputs/hook.py)."""
    for name in WRITERS:
        module = importlib.import_module(f"{__name__}.{name}")
        config.pluginmanager.register(module, f"gap-output-{name}")
