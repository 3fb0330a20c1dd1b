"""MkDocs hooks (mkdocs.yml `hooks:`): the reference pages are generated at build time from the
code, never written by hand. A page holds a marker line; the hook replaces it:

- `<!-- gap:config-keys -->`: every key of a benchmark config (pytest_gap/config/reference.py);
- `<!-- gap:cli -->`: every `gap` command and its arguments (the argparse parser itself);
- `<!-- gap:pytest-options -->`: the plugin's command-line options and ini keys (its own
  `add_options`, given a parser);
- `<!-- gap:hooks -->`: the plugin's hooks (hookspecs.py: signature and docstring);
- `<!-- gap:skills -->`: the skill catalogue (`gap skills --json`);
- `<!-- gap:parquet -->`: the columns of episodes.parquet (outputs/parquet.py's schema).
"""

from __future__ import annotations

import argparse
import inspect
import warnings

CONFIG_MARKER = "<!-- gap:config-keys -->"
CLI_MARKER = "<!-- gap:cli -->"


def _cell(text) -> str:
    return " ".join(str(text or "").split()).replace("|", "\\|")


def config_reference() -> str:
    from pytest_gap.config.document import BenchmarkConfig
    from pytest_gap.config.reference import key_rows, markdown_table

    return markdown_table(key_rows(BenchmarkConfig))


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    return ", ".join(f"`{flag}`" for flag in action.option_strings)


def cli_reference() -> str:
    from pytest_gap.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in commands._choices_actions}
    sections = []
    for name, sub in commands.choices.items():
        rows = ["| argument | what it does | default |", "| --- | --- | --- |"]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            default = "" if action.default in (None, False, argparse.SUPPRESS) else action.default
            text = " ".join((action.help or "").split()).replace("|", "\\|")
            rows.append(
                f"| {_flags(action)} | {text} | {f'`{default}`' if default != '' else ''} |"
            )
        sections.append(f"## gap {name}\n\n{helps.get(name) or ''}\n\n" + "\n".join(rows))
    return "\n\n".join(sections)


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


MARKERS = {
    CONFIG_MARKER: config_reference,
    CLI_MARKER: cli_reference,
    "<!-- gap:pytest-options -->": pytest_reference,
    "<!-- gap:hooks -->": hooks_reference,
    "<!-- gap:skills -->": skills_reference,
    "<!-- gap:parquet -->": parquet_reference,
}


def on_page_markdown(markdown: str, page, config, files) -> str:
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
