"""Collection: a benchmark YAML becomes a tree of groups and one item per trial.

    <yaml>::<mode>[@<policy_id>]::<family>/<variation>::taskNN::seedNNN
    <yaml>::suites::<suite_name>::taskNN::seedNNN

`BenchmarkFile` loads its config through the session (so every process plans it alike) and
yields one `TrialGroup` per level of a trial's id down to the `TrialItem`s. `--gap-shard K/N`
deselects the trials of the other shards (`deselect_other_shards`), as -k deselects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_gap import ids
from pytest_gap.errors import GapError
from pytest_gap.plugin.files import is_benchmark_file
from pytest_gap.plugin.item import TrialItem
from pytest_gap.plugin.session import SESSION, LoadedConfig
from pytest_gap.scale.shard import shard_plan, too_many_shards


def collect_file(file_path: Path, parent: pytest.Collector) -> BenchmarkFile | None:
    if is_benchmark_file(parent.config, file_path):
        return BenchmarkFile.from_parent(parent, path=file_path)
    return None


class BenchmarkFile(pytest.File):
    def collect(self):
        try:
            loaded = self.config.stash[SESSION].load(self.path)
        except GapError as exc:
            raise self.CollectError(str(exc)) from None
        tree: dict[str, Any] = {}
        for cell in loaded.cells:
            for trial in cell.trials():
                group, cell_name, task, seed = ids.id_parts_of(trial.id)
                tree.setdefault(group, {}).setdefault(cell_name, {}).setdefault(task, {})[seed] = (
                    trial
                )
        for name, children in tree.items():
            yield TrialGroup.from_parent(self, name=name, children=children, loaded=loaded)


class TrialGroup(pytest.Collector):
    """A mode (or `suites`), a cell, or a task: one level of a trial's id."""

    def __init__(self, *, children: dict, loaded: LoadedConfig, **kwargs):
        super().__init__(**kwargs)
        self._children, self._loaded = children, loaded

    def collect(self):
        for name, child in self._children.items():
            if isinstance(child, dict):
                yield TrialGroup.from_parent(self, name=name, children=child, loaded=self._loaded)
            else:
                yield TrialItem.from_parent(self, name=name, trial=child, loaded=self._loaded)


def order_in_blocks(items: list[pytest.Item]) -> None:
    """The trials of a cell gated sequentially run block by block (Cell.blocks: a few seeds of
    every task, then the next seeds), not task by task as the collection tree holds them: the
    cell's items keep their places in the list, in the cell's run order (Cell.trials). The two
    cells of an A/B pair (`Cell.turn_key`) share their places: block 1 of A, block 1 of B,
    block 2 of A, ..., so that the pairs of a block are complete together."""
    places: dict[tuple[Path, str], list[int]] = {}
    for index, item in enumerate(items):
        if isinstance(item, TrialItem) and item.trial.cell.block_seeds:
            places.setdefault((item.loaded.path, item.trial.cell.turn_key), []).append(index)
    for indices in places.values():
        group = [items[i] for i in indices]
        cells = {item.trial.cell.key: item.trial.cell for item in group}
        rank = {
            trial.id: (cell.block_of(trial.seed), side, position)
            for side, cell in enumerate(cells.values())
            for position, trial in enumerate(cell.trials())
        }
        group.sort(key=lambda item: rank[item.trial.id])
        for index, item in zip(indices, group, strict=True):
            items[index] = item


def deselect_other_shards(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--gap-shard K/N deselects every trial outside shard K, as -k deselects: in each process
    that collects (every xdist worker alike), from the plan of the configs collected, so every
    worker keeps the same items."""
    spec = config.stash[SESSION].options.shard
    if spec is None:
        return
    trials = [item for item in items if isinstance(item, TrialItem)]
    if not trials:  # a config that failed to load says so itself
        return
    plans = {ids.path_of(item.nodeid): item.loaded.cells for item in trials}
    shards = shard_plan(list(plans.items()), spec.count)
    why = too_many_shards(spec, sum(len(keys) for keys in shards.keys))
    if why and not hasattr(config, "workerinput"):  # the controller said it (Lead.check_shard)
        raise pytest.UsageError(why)
    mine = shards.of(spec)  # keys are trial node ids: <yaml>::<trial id>
    kept = [i for i in items if not isinstance(i, TrialItem) or i.nodeid in mine]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in trials if i.nodeid not in mine])
        items[:] = kept
