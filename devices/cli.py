"""``devicesim``: one command, one subcommand per simulator kind."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module providing ``add_arguments(parser)`` and ``run(args) -> int``
SIMULATORS = {"sensors": "devices.sensors", "camera": "devices.camera"}


def build_parser() -> argparse.ArgumentParser:
    """devicesim's parser; each subcommand's parsed arguments carry its ``run``."""
    parser = argparse.ArgumentParser(prog="devicesim", description="edgefed device simulators")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, module_name in SIMULATORS.items():
        module = importlib.import_module(module_name)
        command = commands.add_parser(name, help=(module.__doc__ or name).splitlines()[0])
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
