"""`dflash` command line: one subcommand per module in dflash_cli/commands/."""

from __future__ import annotations

import argparse
import importlib
import sys

from dflash_plugin.errors import DFlashError

# Subcommand name -> module with `add_arguments(parser)` and `run(args) -> int`.
COMMANDS = {
    "generate": "dflash_cli.commands.generate",
    "train": "dflash_cli.commands.train",
    "serve": "dflash_cli.commands.serve",
    "bench": "dflash_cli.commands.bench",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dflash", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name != module_name:
                raise
            continue  # a subcommand not written yet
        command = sub.add_parser(name, help=module.HELP, description=module.__doc__,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except DFlashError as err:
        print(f"dflash {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
