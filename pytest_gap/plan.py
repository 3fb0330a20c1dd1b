"""BenchmarkConfig -> cells -> trials. Deterministic: every xdist worker plans the same.

A cell is one (mode, policy id, family, variation) of a grid, or one suites-mode entry; it scores
its tasks x seeds. What a mode runs and whether it takes the policy axis come from the mode
table `plan` is given (modes.py; the built-in one by default). A cell that cannot run (a
template mode without its template or workflow_dir, a policy mode without a policy,
llm_generation without a model or key) is still planned, with `error` saying why: its trials
are collected and fail as errored, so a gap in the grid is never silently skipped. (The LLM
check reads the key's environment variable, the same in every worker.)
"""

from __future__ import annotations

from pathlib import Path

from pytest_gap.cells import Cell, Trial
from pytest_gap.config.checks import suite_variation
from pytest_gap.config.document import IMPLICIT_POLICY, BenchmarkConfig
from pytest_gap.config.messages import ConfigError
from pytest_gap.control_arms import with_controls
from pytest_gap.modes import BUILTIN, ModeTable
from pytest_gap.producers.chat import LLMConfigError, resolve_settings
from pytest_gap.producers.templates import template_dir
from pytest_gap.sim.backend import episode_modes, get_backend, resolve_variation


def plan(
    config: BenchmarkConfig,
    *,
    families: list[str] | None = None,
    modes: list[str] | None = None,
    mode_table: ModeTable | None = None,
) -> list[Cell]:
    """The cells of a config, in a fixed order. `families`/`modes` restrict a grid;
    `mode_table` says what each mode is (default: the built-in modes)."""
    source = str(config.source or "<config>")
    if config.benchmark is None:
        if families or modes:
            raise ConfigError(
                source,
                [
                    "--families/--modes restrict a grid (benchmark:) config; this is a suites "
                    "config, run it without them"
                ],
            )
        cells = _suite_cells(config, source, mode_table or BUILTIN)
    else:
        cells = _grid_cells(config, source, families, modes, mode_table or BUILTIN)
    add = config.benchmark is not None and config.benchmark.controls
    cells = with_controls(cells, source, add)
    if config.block_seeds:
        k = config.block_seeds
        cells = [c.model_copy(update={"block_seeds": min(k, len(c.seeds))}) for c in cells]
    if config.compare is not None:
        arms = (config.compare.a, config.compare.b)
        cells = [
            c.model_copy(update={"ab_pair": f"{c.mode}/{c.family}/{c.variation}"})
            if c.policy_id in arms
            else c
            for c in cells
        ]
    return cells


def all_trials(cells: list[Cell]) -> list[Trial]:
    return [trial for cell in cells for trial in cell.trials()]


def _check_ids(source: str, key: str, ids: list[int], n_tasks: int, what: str) -> list[str]:
    bad = [i for i in ids if i >= n_tasks]
    if bad:
        return [f"{key}: task ids {bad} do not exist in {what} ({n_tasks} tasks: 0-{n_tasks - 1})"]
    return []


def _runnable(ids: list[int], backend, suite: str) -> list[int]:
    """The tasks of a default task list that can start an episode: a task whose suite ships no
    init state is not one (LIBERO-PRO lists libero_10_with_milk tasks 3 and 4, with none)."""
    return [i for i in ids if backend.n_init_states(suite, i) > 0]


def _check_init_states(key: str, ids: list[int], backend, suite: str, what: str) -> list[str]:
    """Tasks named in a config whose suite ships no init state cannot start an episode (seed s
    runs init state s mod n): a config error, not a crash in every trial."""
    empty = [i for i in ids if backend.n_init_states(suite, i) == 0]
    if empty:
        return [
            f"{key}: task ids {empty} of {what} ({suite}) ship no init states and cannot run; "
            "leave them out of task_ids"
        ]
    return []


def _dataset_fields(trials) -> dict:
    """A cell's dataset recording (Cell.dataset_size, dataset_every) from trials.dataset."""
    dataset = trials.dataset
    if dataset is None:
        return {}
    return {"dataset_size": dataset.image_size, "dataset_every": dataset.every}


def _grid_cells(config, source, families, modes, table: ModeTable) -> list[Cell]:
    block = config.benchmark
    backend = get_backend(block.backend)
    _check_restrictions(source, block, families, modes)
    record_video = (
        block.record_video if block.record_video is not None else config.trials.record_video
    )
    known_variations = {name: f.variations() for name, f in backend.families().items()}
    cells, problems = [], []
    for mode, override, policy_id, family, variation in _grid_axes(
        block, table, families, modes, known_variations
    ):
        resolved = resolve_variation(backend, family, variation)
        task_ids, found = _grid_task_ids(
            source, block, backend, resolved.suite, f"{family}/{variation}", problems
        )
        problems += found
        cells.append(
            Cell(
                mode=mode,
                policy_id=policy_id,
                backend=block.backend,
                family=family,
                variation=variation,
                suite=resolved.suite,
                task_ids=tuple(task_ids),
                seeds=tuple(_grid_seeds(block, override)),
                workflow_dir=_workflow_source(override),
                timeout_s=config.trials.task_timeout_secs,
                max_steps=config.trials.max_steps,
                num_workers=(override and override.num_workers) or block.num_workers,
                record_video=record_video,
                frames_every=config.trials.frames_every or 0,
                **_dataset_fields(config.trials),
                enable_tracing=config.trials.enable_tracing,
                perception=config.skills.perception,
                error=_grid_cell_error(
                    config, table, mode, override, policy_id, episode_modes(backend)
                ),
                uses_llm=table.needs_llm(mode),
                privileged=bool(
                    policy_id
                    and policy_id in config.policies
                    and config.policies[policy_id].privileged_state
                ),
            )
        )
    if problems:
        raise ConfigError(source, sorted(set(problems)))
    return cells


def _check_restrictions(source: str, block, families, modes) -> None:
    """`--families`/`--modes` name only what the config's grid lists; else a ConfigError."""
    problems = []
    for key, chosen, known in (
        ("--families", families, block.families),
        ("--modes", modes, block.modes),
    ):
        for name in chosen or []:
            if name not in known:
                problems.append(f"{key} {name}: not in this config's list ({', '.join(known)})")
    if problems:
        raise ConfigError(source, problems)


def _grid_axes(block, table: ModeTable, families, modes, known_variations):
    """The grid's (mode, its override, policy id, family, variation) in plan order: modes,
    then policies, families and variations, each as the config lists it, restricted by
    `--families`/`--modes` and the config's `variations`."""
    for mode in block.modes:
        if modes and mode not in modes:
            continue
        override = block.mode_overrides.get(mode)
        for policy_id in _policy_axis(table.get(mode), block.policies, override):
            for family in block.families:
                if families and family not in families:
                    continue
                for variation in known_variations[family]:
                    if block.variations is not None and variation not in block.variations:
                        continue
                    yield mode, override, policy_id, family, variation


def _grid_task_ids(
    source: str, block, backend, suite: str, where: str, problems: list[str]
) -> tuple[list[int], list[str]]:
    """A grid cell's task ids (the config's, or its first `n_tasks` that can start an
    episode) and the problems they have. Init states are checked only while no problem is
    found, this cell's or an earlier one's (`problems`)."""
    n_tasks = backend.n_tasks(suite)
    found = []
    if block.task_ids is not None:
        task_ids = block.task_ids
        found += _check_ids(source, "benchmark.task_ids", task_ids, n_tasks, where)
    else:
        task_ids = _runnable(list(range(min(block.n_tasks, n_tasks))), backend, suite)
    if not problems and not found:
        found += _check_init_states("benchmark.task_ids", task_ids, backend, suite, where)
    return task_ids, found


def _workflow_source(override) -> Path | None:
    """The directory a prebuilt mode fills: its workflow_dir, or its shipped template's."""
    if override is None:
        return None
    if override.template is not None:
        return template_dir(override.template)  # validated by config
    return override.workflow_dir


def _policy_axis(row, policies, override) -> list[str | None]:
    if not row.takes_policy_axis:
        return [None]  # llm_generation and workflow ignore the policy axis
    if policies:
        return list(policies)
    if override and override.policy_id:
        return [override.policy_id]
    return [IMPLICIT_POLICY if row.template else None]  # a template mode: the spec's fallback


def _workflow_policies(workflow_dir: Path | None, registry: dict) -> tuple[str, ...]:
    """The managed registry policies a workflow's run_policy nodes name (`url:` entries are
    reached, never booted or probed: suites mode has no preflight)."""
    import json

    try:
        nodes = json.loads((workflow_dir / "workflow.json").read_text()).get("nodes", {})
    except (TypeError, OSError, ValueError, AttributeError):
        return ()  # no workflow here, or one the producer reports on
    named = {
        node.get("inputs", {}).get("policy")
        for node in (nodes.values() if isinstance(nodes, dict) else [])
        if isinstance(node, dict) and node.get("skill") == "run_policy"
    }
    return tuple(
        sorted(p for p in named if isinstance(p, str) and p in registry and not registry[p].url)
    )


def _grid_seeds(block, override) -> list[int]:
    n = override.n_seeds if override and override.n_seeds else None
    if block.seeds is not None:
        return block.seeds[:n] if n else block.seeds
    return list(range(n or block.n_seeds))


def llm_problem(config: BenchmarkConfig) -> str | None:
    """Why the config's llm: block cannot generate workflows (no model, no key), or None."""
    try:
        resolve_settings(config.llm, str(config.source or "config"))
    except LLMConfigError as exc:
        return str(exc)
    return None


def _grid_cell_error(
    config,
    table: ModeTable,
    mode: str,
    override,
    policy_id: str | None,
    own_loop: frozenset[str] = frozenset(),
) -> str | None:
    """`own_loop`: the modes the backend runs through its own episode loop (no workflow)."""
    row = table.get(mode)
    if table.needs_llm(mode):
        problem = llm_problem(config)
        if problem:
            return problem
    if table.needs_workflow(mode) and mode not in own_loop and _workflow_source(override) is None:
        key = f"benchmark.mode_overrides.{mode}"
        if row.template:
            return (
                f"{key}.template is not set: the {mode} mode runs a workflow template; set "
                f"template: {row.template} (shipped with pytest-gap) or a workflow_dir"
            )
        return (
            f"{key}.workflow_dir is not set: the {mode} mode runs that workflow directory; "
            "set it (e.g. examples/workflows/pick_place)"
        )
    if row.takes_policy_axis and policy_id is None:
        return (
            f"mode {mode} needs a policy: list policy ids in benchmark.policies or set "
            f"benchmark.mode_overrides.{mode}.policy_id"
        )
    return None


def _suite_cells(config: BenchmarkConfig, source: str, table: ModeTable) -> list[Cell]:
    backend = get_backend(config.backend)
    cells, problems, seen, offset = [], [], {}, 0
    for i, entry in enumerate(config.suites or []):
        variation = suite_variation(entry.suite_name, backend)
        n_tasks = backend.n_tasks(variation.suite)
        task_ids = (
            entry.task_ids
            or sorted(entry.task_prompts)
            or config.trials.task_ids
            or _runnable(list(range(n_tasks)), backend, variation.suite)
        )
        problems += _check_ids(source, f"suites.{i}", task_ids, n_tasks, entry.suite_name)
        if not problems:
            problems += _check_init_states(
                f"suites.{i}.task_ids", task_ids, backend, variation.suite, entry.suite_name
            )
        seen[entry.suite_name] = seen.get(entry.suite_name, 0) + 1
        name = entry.suite_name.replace("/", "__")
        if seen[entry.suite_name] > 1:
            name = f"{name}_{seen[entry.suite_name]:02d}"
        n_seeds = entry.trials_per_generation or config.trials.trials_per_generation
        workers = entry.num_workers or config.trials.num_workers
        timeout = entry.timeout_secs
        mode = table.suites_mode(given=entry.workflow_dir is not None)
        cells.append(
            Cell(
                mode=mode,
                backend=config.backend,
                family=variation.family,
                variation=variation.variation,
                suite=variation.suite,
                suite_name=name,
                task_ids=tuple(task_ids),
                seeds=tuple(entry.seeds if entry.seeds is not None else range(n_seeds)),
                workflow_dir=entry.workflow_dir,
                timeout_s=timeout if timeout is not None else config.trials.task_timeout_secs,
                max_steps=config.trials.max_steps,
                num_workers=workers,
                device_offset=offset,
                record_video=config.trials.record_video,
                frames_every=config.trials.frames_every or 0,
                **_dataset_fields(config.trials),
                enable_tracing=config.trials.enable_tracing,
                perception=config.skills.perception,
                task_prompts=entry.task_prompts,
                objects=entry.objects,
                error=llm_problem(config) if table.needs_llm(mode) else None,
                uses_llm=table.needs_llm(mode),
                workflow_policies=_workflow_policies(entry.workflow_dir, config.policies),
            )
        )
        offset += workers
    if problems:
        raise ConfigError(source, problems)
    return cells
