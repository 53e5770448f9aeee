"""`esper-bench`: one console script for the product's commands, as `asv run` / `asv publish`.

    esper-bench run [OPTIONS]      = python -m harness.run      (measure)
    esper-bench report [OPTIONS]   = python -m harness.report   (render)
    esper-bench gate [OPTIONS]     = python -m harness.gate     (CI gate)
    esper-bench bisect [OPTIONS]   = python -m harness.bisect   (first changed commit)

and the commands the project's findings modules add (`harness.Defaults.commands`, for
the modules the nearest pyproject.toml names). Each subcommand calls the same `main` as
its `python -m` form, with the same options and exit codes; `esper-bench SUBCOMMAND
--help` shows them. `esper-bench --version` prints the installed version. As with
`python -m`, modules import from the current folder first.
"""

from __future__ import annotations

import os
import sys

from harness.exits import UsageError, run_module, version

#: subcommand -> module whose `main(argv)` it calls
SUBCOMMANDS = {
    "run": "harness.run",
    "report": "harness.report.cli",
    "gate": "harness.gate.cli",
    "bisect": "harness.bisect.cli",
}


def subcommands() -> dict[str, str]:
    """The harness's subcommands and those the project's findings modules add (never
    replacing one)."""
    from harness.findings import defaults  # late: --version must not load torch
    from harness.project import load_findings

    _, modules = load_findings(None, required=False)
    added = {name: module for name, module in defaults(modules).commands
             if name not in SUBCOMMANDS}
    return {**SUBCOMMANDS, **added}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--version":
        print(f"esper-bench {version()}")
        return 0
    # as `python -m harness.run` does: the project's modules import from the current folder
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if argv and argv[0] in SUBCOMMANDS:  # no findings module is imported to find it
        return run_module(SUBCOMMANDS[argv[0]], argv[1:])
    try:
        commands = subcommands()
    except UsageError as err:  # the project's pyproject.toml or findings modules
        print(f"error: {err}", file=sys.stderr)
        return 2
    usage = f"usage: esper-bench {{{','.join(commands)}}} [OPTIONS]"
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[0] + "\n\n" + usage)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in commands:
        print(f"{usage}\nesper-bench: unknown subcommand {command!r}; "
              f"expected one of {', '.join(commands)}", file=sys.stderr)
        return 2
    return run_module(commands[command], rest)


if __name__ == "__main__":
    sys.exit(main())
