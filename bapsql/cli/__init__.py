"""The ``bapsql`` command line. Each command area lives in its own module and registers itself here.

Commands import their heavy dependencies inside the command body, so ``bapsql --help`` stays fast.
"""

from __future__ import annotations

import importlib

import click

# (module, attribute) pairs: each attribute is a click command or group added to the top-level group.
_COMMANDS: tuple[tuple[str, str], ...] = (
    ("bapsql.cli.analyze", "analyze"),
    ("bapsql.cli.db", "estimate"),
    ("bapsql.cli.env", "exec_cmd"),
    ("bapsql.cli.env", "episode_cmd"),
    ("bapsql.cli.eval", "eval_cmd"),
    ("bapsql.cli.eval", "policies_cmd"),
    ("bapsql.cli.eval", "conditions_cmd"),
    ("bapsql.cli.eval", "sft_data_cmd"),
    ("bapsql.cli.data", "data"),
    ("bapsql.cli.sweep", "sweep_cmd"),
    ("bapsql.cli.model", "model"),
    ("bapsql.cli.serve", "serve_cmd"),
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="bapsql")
def cli() -> None:
    """bapsql: budget-aware agentic text-to-SQL — environments, policies, training and analysis."""


for _module, _attr in _COMMANDS:
    cli.add_command(getattr(importlib.import_module(_module), _attr))


def main() -> None:
    cli(prog_name="bapsql")
