"""`esper-bench`: one console script for the product's commands, as `asv run` / `asv publish`.

    esper-bench run [OPTIONS]      = python -m harness.run      (measure)
    esper-bench report [OPTIONS]   = python -m harness.report   (render)
    esper-bench gate [OPTIONS]     = python -m harness.gate     (CI gate)
    esper-bench bisect [OPTIONS]   = python -m harness.bisect   (first changed commit)
    esper-bench train [OPTIONS]    = python -m esper.train      (train the PPO)

Each subcommand calls the same `main` as its `python -m` form, with the same options
and exit codes; `esper-bench SUBCOMMAND --help` shows them. `esper-bench --version`
prints the installed version.
"""

from __future__ import annotations

import importlib
import sys

from harness.exits import version

#: subcommand -> module whose `main(argv)` it calls
SUBCOMMANDS = {
    "run": "harness.run",
    "report": "harness.report.cli",
    "gate": "harness.gate.cli",
    "bisect": "harness.bisect.cli",
    "train": "esper.train",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = f"usage: esper-bench {{{','.join(SUBCOMMANDS)}}} [OPTIONS]"
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[0] + "\n\n" + usage)
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"esper-bench {version()}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in SUBCOMMANDS:
        print(f"{usage}\nesper-bench: unknown subcommand {command!r}; "
              f"expected one of {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    return importlib.import_module(SUBCOMMANDS[command]).main(rest)


if __name__ == "__main__":
    sys.exit(main())
