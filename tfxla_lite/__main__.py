"""`python -m tfxla_lite run script.py [args...]`: run a script with auto-jit on.

`run` is the explicit form of the start-up hook: it enables tfxla-lite with
`auto_jit=2` (unless `TFXLA_LITE_FLAGS` sets `--auto_jit`) and runs the script as
`__main__` with its own arguments, as `python script.py args...` would. Every
other subcommand is the `tfxla-lite` command line (`tfxla_lite.cli`).
"""

from __future__ import annotations

import os
import runpy
import sys

USAGE = """usage: python -m tfxla_lite run SCRIPT [ARG ...]

Runs SCRIPT as __main__ with every tf.function auto-clustered by tfxla-lite
(auto_jit=2 unless TFXLA_LITE_FLAGS says otherwise). TFXLA_LITE_FLAGS:
"""


def run(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        from tfxla_lite.flags import flags_help

        print(USAGE + flags_help())
        return 0 if argv else 2
    from tfxla_lite import flags

    if "auto_jit" not in flags.PROCESS_OPTIONS.environment_changes():
        flags.set_options(auto_jit=2)
    from tfxla_lite import autojit

    autojit.enable()
    script = argv[0]
    sys.argv = list(argv)
    sys.path.insert(0, _script_directory(script))
    runpy.run_path(script, run_name="__main__")
    return 0


def _script_directory(script: str) -> str:
    return os.path.dirname(os.path.abspath(script))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        from tfxla_lite.flags import FlagError

        try:
            return run(argv[1:])
        except FlagError as error:
            print(error, file=sys.stderr)
            return 2
    from tfxla_lite.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
