"""A trial's names, made and read in this one place.

A trial (cell x task x seed) is named four ways, each for a reader that needs its own form:
- its **id**, the pytest item's name after the YAML's path (`-k`, `--lf`, JUnit):
  `<mode>[@<policy id>]::<family>/<variation>::task03::seed007`, or
  `suites::<suite name>::task03::seed007` for a suites cell;
- its **node id**, `<yaml path>::<id>`: pytest's, and the key a session's plan, its shards and
  the evaluation service use;
- its **key**, its directory relative to the run dir:
  `<mode>[/<policy id>]/<family>/<variation>/task_03/seed_007`, or `suites/<suite name>/...`
  (the cell's key is the part before `/task_03`);
- its **slug**, a flat file name stem for files that sit side by side (videos, frame strips):
  `<mode>[__<policy id>]__<family>__<variation>__task03__seed007` (suites: `suites__<name>__...`).

Every part is a strict name (pytest_gap/names.py), so `::` and `/` never occur inside one and
each form can be taken apart again. Plain functions of plain values: the plan's `Cell` and
`Trial`, the records' `TrialIdentity`, the plugin, the scheduler, the service and the scripts
all call these and build no name by hand.
"""

from __future__ import annotations

SEP = "::"  # between the parts of an id and of a node id (pytest's own separator)
SUITES = "suites"  # the mode part of a suites cell's id and key (`suites/<suite name>`)
SLUG_SEP = "__"
ID_PARTS = 4  # an id: mode part, cell part, task part, seed part


def task_part(task_id: int) -> str:
    return f"task{task_id:02d}"


def seed_part(seed: int) -> str:
    return f"seed{seed:03d}"


def cell_key(
    mode: str, policy_id: str | None, family: str, variation: str, suite_name: str | None
) -> str:
    """A cell's directory relative to the run dir."""
    if suite_name is not None:
        return f"{SUITES}/{suite_name}"
    policy = f"/{policy_id}" if policy_id else ""
    return f"{mode}{policy}/{family}/{variation}"


def cell_id_parts(
    mode: str, policy_id: str | None, family: str, variation: str, suite_name: str | None
) -> tuple[str, str]:
    """A cell's two parts of a trial id: its mode (with `@<policy id>`) and its column."""
    if suite_name is not None:
        return (SUITES, suite_name)
    return (f"{mode}@{policy_id}" if policy_id else mode, f"{family}/{variation}")


def task_dir(cell: str, task_id: int) -> str:
    """The directory of a cell's task (its produced workflow), relative to the run dir."""
    return f"{cell}/task_{task_id:02d}"


def trial_key(cell: str, task_id: int, seed: int) -> str:
    """A trial's directory relative to the run dir, from its cell's key."""
    return f"{task_dir(cell, task_id)}/seed_{seed:03d}"


def cell_of_key(key: str) -> str:
    """The cell key of a trial key (`<cell key>/task_NN/seed_NNN`)."""
    return key.rsplit("/", 2)[0]


def mode_of_key(key: str) -> str:
    """The first directory of a cell or trial key: its mode, or `suites`."""
    return key.split("/", 1)[0]


def trial_id(cell_parts: tuple[str, str], task_id: int, seed: int) -> str:
    return SEP.join((*cell_parts, task_part(task_id), seed_part(seed)))


def node_id(path: str, trial: str) -> str:
    """A trial's node id: its YAML's node id (a path, or a label), then its id."""
    return f"{path}{SEP}{trial}"


def split_node_id(node: str) -> tuple[str, str]:
    """(the path part, the rest) of a node id; the rest is '' for a file's own node id."""
    path, _, rest = node.partition(SEP)
    return path, rest


def path_of(node: str) -> str:
    """The file part of a node id or of a command-line argument (`file.yaml::mode...`)."""
    return node.split(SEP, 1)[0]


def is_trial_node(node: str) -> bool:
    """Whether a node id names a trial (a path, then the four parts of an id)."""
    return len(node.split(SEP)) >= 1 + ID_PARTS


def phase_of(node: str) -> str:
    """The phase of an item: `<yaml>::<mode>[@<policy id>]` (or `<yaml>::suites`) of a trial;
    other items (plain tests) share their file's phase."""
    parts = node.split(SEP)
    return SEP.join(parts[:2]) if is_trial_node(node) else parts[0]


def task_of(node: str) -> str:
    """The (cell, task) of a trial's node id: its seeds reuse one worker's env. A plain test's
    node id is its own."""
    return SEP.join(node.split(SEP)[:4]) if is_trial_node(node) else node


def id_parts_of(trial: str) -> tuple[str, ...]:
    """The parts of a trial id (mode part, cell part, task part, seed part)."""
    return tuple(trial.split(SEP))


def run_label(name: str, family: str, variation: str, task_id: int, seed: int) -> str:
    """A one-off trial's directory name (`gap run`'s default trace dir): what it runs, then
    where: `<name>_<family>_<variation>_task03_seed007`."""
    return "_".join((name, family, variation, task_part(task_id), seed_part(seed)))


def slug(
    mode: str,
    policy_id: str | None,
    family: str,
    variation: str,
    suite_name: str | None,
    task_id: int,
    seed: int,
) -> str:
    """A flat file name stem: <mode>[__<policy id>] or suites__<suite name>, then family,
    variation, taskNN, seedNNN, joined by `__`."""
    head = [mode, policy_id] if suite_name is None else [SUITES, suite_name]
    parts = [*head, family, variation, task_part(task_id), seed_part(seed)]
    return SLUG_SEP.join(p for p in parts if p)
