"""MkDocs hooks (mkdocs.yml `hooks:`): the reference pages are generated at build time from the
code, never written by hand. A page holds a marker line; the hook replaces it:

- `<!-- gap:config-keys -->`: every key of a benchmark config (pytest_gap/config/reference.py);
- `<!-- gap:cli -->`: every `gap` command and its arguments (the argparse parser itself);
- `<!-- gap:pytest-options -->`: the plugin's command-line options and ini keys (its own
  `add_options`, given a parser);
- `<!-- gap:hooks -->`: the plugin's hooks (hookspecs.py: signature and docstring);
- `<!-- gap:skills -->`: the skill catalogue (`gap skills --json`);
- `<!-- gap:parquet -->`: the columns of episodes.parquet (outputs/parquet.py's schema);
- `<!-- gap:run-dir -->`: the run dir's layout and every name in it (layout.py: its docstring's
  tree, its name constants and their comments);
- `<!-- gap:result -->`, `<!-- gap:cell -->`: result.json's fields (results.TrialResult) and a
  cell's (cell_summary.CellSummary: summary.json, cell_result.json), with summary.tsv's columns
  in their order (report.py).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import textwrap
import tokenize
import warnings

CONFIG_MARKER = "<!-- gap:config-keys -->"
CLI_MARKER = "<!-- gap:cli -->"


def _cell(text) -> str:
    from pytest_gap.config.reference import table_cell

    return table_cell(text)


def config_reference() -> str:
    from pytest_gap.config.document import BenchmarkConfig
    from pytest_gap.config.reference import key_rows, markdown_table

    return markdown_table(key_rows(BenchmarkConfig))


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    return ", ".join(f"`{flag}`" for flag in action.option_strings)


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def cli_sections(parser: argparse.ArgumentParser, prefix: str = "gap") -> list[str]:
    """A section per command at every level (`gap policy serve torch` as well as `gap run`):
    its help, then each argument with its help and default."""
    commands = _subcommands(parser)
    if commands is None:
        return []
    helps = {a.dest: a.help for a in commands._choices_actions}
    sections = []
    for name, sub in commands.choices.items():
        rows = ["| argument | what it does | default |", "| --- | --- | --- |"]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if action.help == argparse.SUPPRESS:
                continue
            default = "" if action.default in (None, False, argparse.SUPPRESS) else action.default
            shown = _cell(f"`{default}`") if default != "" else ""
            rows.append(f"| {_flags(action)} | {_cell(action.help)} | {shown} |")
        command = f"{prefix} {name}"
        body = "\n".join(rows) if len(rows) > 2 else ""
        sections.append(f"## {command}\n\n{_cell(helps.get(name))}\n\n{body}".rstrip())
        sections += cli_sections(sub, command)
    return sections


def cli_reference() -> str:
    from pytest_gap.cli import build_parser

    return "\n\n".join(cli_sections(build_parser()))


def pytest_reference() -> str:
    from pytest_gap.plugin.options import add_options

    with warnings.catch_warnings():  # pytest's Parser is private: fine for reading its options
        warnings.simplefilter("ignore")
        from _pytest.config.argparsing import Parser

        parser = Parser()
    add_options(parser)
    rows = ["| option | what it does | default |", "| --- | --- | --- |"]
    for option in parser.getgroup("gap").options:
        attrs = option.attrs()
        default = attrs.get("default")
        shown = "" if default in (None, False) else f"`{default}`"
        names = ", ".join(f"`{n}`" for n in option.names())
        rows.append(f"| {names} | {_cell(attrs.get('help'))} | {shown} |")
    ini = ["| ini key | what it does | type | default |", "| --- | --- | --- | --- |"]
    for name, (text, kind, default) in parser._inidict.items():
        ini.append(f"| `{name}` | {_cell(text)} | {kind or 'string'} | `{default}` |")
    return "\n".join(rows) + "\n\n" + "\n".join(ini)


def hooks_reference() -> str:
    from pytest_gap import hookspecs

    sections = []
    for name, function in inspect.getmembers(hookspecs, inspect.isfunction):
        if not name.startswith("pytest_gap_"):
            continue
        signature = f"{name}{inspect.signature(function)}"
        sections.append(f"## `{name}`\n\n```python\n{signature}\n```\n\n{inspect.getdoc(function)}")
    return "\n\n".join(sections)


def skills_reference() -> str:
    from pytest_gap.skills.catalogue import catalogue

    sections = []
    for entry in catalogue():
        inputs = entry["inputs"].get("properties", {})
        rows = "\n".join(
            f"- `{key}`: {_cell(value.get('description') or value.get('type') or '')}"
            for key, value in inputs.items()
        )
        failures = "\n".join(f"- {_cell(f)}" for f in entry.get("failures", []))
        text = f"## `{entry['name']}`\n\n{_cell(entry['description'])}\n\n"
        text += f"Inputs:\n\n{rows}\n\n" if rows else ""
        text += f"Takes its `on_error` edge when:\n\n{failures}\n" if failures else ""
        sections.append(text)
    return "\n\n".join(sections)


def parquet_reference() -> str:
    from pytest_gap.outputs.parquet import SCHEMA

    rows = ["| column | type | may be null |", "| --- | --- | --- |"]
    rows += [f"| `{f.name}` | {f.type} | {'yes' if f.nullable else 'no'} |" for f in SCHEMA]
    return "\n".join(rows)


def layout_names() -> list[tuple[str, str, str]]:
    """(constant, name, comment) of every run-dir name layout.py declares, in source order."""
    from pytest_gap import layout

    source = inspect.getsource(layout)
    comments = {
        t.start[0]: t.string.lstrip("#").strip()
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type == tokenize.COMMENT
    }
    names = []
    for node in ast.parse(source).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and not node.targets[0].id.endswith(("_FORMAT", "_RE"))
        ):
            note = comments.get(node.lineno) or comments.get(node.lineno - 1, "")
            names.append((node.targets[0].id, node.value.value, note))
    return names


def run_dir_reference() -> str:
    from pytest_gap import layout

    doc = inspect.cleandoc(layout.__doc__ or "")
    tree = "\n".join(line for line in doc.splitlines() if line.startswith("    "))
    rows = ["| name | in the code | what it holds |", "| --- | --- | --- |"]
    rows += [f"| `{name}` | `layout.{c}` | {_cell(note)} |" for c, name, note in layout_names()]
    return f"```text\n{textwrap.dedent(tree)}\n```\n\n" + "\n".join(rows)


def _fields(model) -> str:
    from pytest_gap.config.reference import key_rows

    rows = ["| field | type | what it holds |", "| --- | --- | --- |"]
    rows += [f"| `{r.key}` | {_cell(r.type)} | {_cell(r.description)} |" for r in key_rows(model)]
    return "\n".join(rows)


def result_reference() -> str:
    from pytest_gap.results import TrialResult

    return _fields(TrialResult)


def cell_reference() -> str:
    from pytest_gap.cell_summary import CellSummary
    from pytest_gap.report import (
        CI_COLUMNS,
        CONTROL_COLUMNS,
        FAULT_COLUMNS,
        REF_COLUMNS,
        TSV_COLUMNS,
    )

    groups = [
        ("the spec's columns", TSV_COLUMNS),
        ("95% intervals", CI_COLUMNS),
        ("the reference loops' rate", REF_COLUMNS),
        ("against the matched control arm (only in a run where a cell has one)", CONTROL_COLUMNS),
        ("harness faults and re-runs (only in a run where a trial faulted)", FAULT_COLUMNS),
    ]
    tsv = "\n".join(f"- {what}: {', '.join(f'`{c}`' for c in cols)}" for what, cols in groups)
    return f"{_fields(CellSummary)}\n\nsummary.tsv's columns, in order:\n\n{tsv}"


MARKERS = {
    CONFIG_MARKER: config_reference,
    CLI_MARKER: cli_reference,
    "<!-- gap:pytest-options -->": pytest_reference,
    "<!-- gap:hooks -->": hooks_reference,
    "<!-- gap:skills -->": skills_reference,
    "<!-- gap:parquet -->": parquet_reference,
    "<!-- gap:run-dir -->": run_dir_reference,
    "<!-- gap:result -->": result_reference,
    "<!-- gap:cell -->": cell_reference,
}


def on_page_markdown(markdown: str, page, config, files) -> str:
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
