"""MkDocs hooks (mkdocs.yml `hooks:`): the reference pages are generated at build time from the
code, never written by hand. A page holds a marker line; the hook replaces it:

- `<!-- gap:config-keys -->`: every key of a benchmark config (pytest_gap/config/reference.py);
- `<!-- gap:cli -->`: every `gap` command and its arguments (the argparse parser itself).
"""

from __future__ import annotations

import argparse

CONFIG_MARKER = "<!-- gap:config-keys -->"
CLI_MARKER = "<!-- gap:cli -->"


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


def on_page_markdown(markdown: str, page, config, files) -> str:
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    return markdown
