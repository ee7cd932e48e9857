"""``devicesim``: one command, one subcommand per simulator kind."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module providing ``add_arguments(parser)`` and ``run(args) -> int``
SIMULATORS = {"sensors": "devices.sensors", "camera": "devices.camera"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="devicesim", description="edgefed device simulators")
    commands = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, module_name in SIMULATORS.items():
        module = importlib.import_module(module_name)
        modules[name] = module
        module.add_arguments(commands.add_parser(name, help=(module.__doc__ or name).splitlines()[0]))
    args = parser.parse_args(argv)
    return modules[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
