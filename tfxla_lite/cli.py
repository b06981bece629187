"""The `tfxla-lite` command: `tfxla-lite demo [EXAMPLE...]`, `tfxla-lite build-op`."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tfxla-lite", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="compile the seed models; show clusters, HLO, timings",
                        add_help=False)
    commands.add_parser("build-op", help="build (or find cached) the C++ launch op",
                        add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from tfxla_lite.demo import main as demo_main

        return demo_main(rest)
    from tfxla_lite.runtime.build import main as build_main

    return build_main(rest)


if __name__ == "__main__":
    sys.exit(main())
