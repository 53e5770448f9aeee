"""Regenerate the docs' measured tables and reference blocks from the code and the
committed results, or check that they are current.

    python docs/generate.py           rewrite every generated block in README.md and docs/*.md
    python docs/generate.py --check   exit 1 naming each stale block (tests/test_readme.py runs it)
    python docs/generate.py --example RUN
                                      make RUN (a finished default run's folder) the example
                                      the tables quote: its run.json, less the sample rows,
                                      becomes results/example/run.json; then rewrite
    python docs/generate.py --long RUN
                                      the same for a finished run of the long findings
                                      (`harness.run --findings` naming them): results/long

A generated block sits between two markers and is never edited by hand:

    <!-- generated: KIND [ARGUMENT] -->
    ...
    <!-- /generated -->

Kinds:
  help MODULE     the `--help` of a command (its `build_parser()`), 96 columns wide
  variants        esper's reviewed axes, from `esper.variants` (values and docstrings)
  finding-fields [Recording|Reading|About]
                  the public `Finding` fields (or its parts'), from their docstrings
  findings [long] the review's findings with the verdict of the committed example run
                  (results/example/run.json, rendered the way the report does), or of the
                  committed run of the long findings (results/long/run.json)
  finding-list    every finding of the review with its ticket, variants and provenance, from the
                  registry (`esper_review`)
  words           every enum of words a user reads, what it answers and where
  targets         the GAE targets table of that run (`esper_review.gae_tools.targets`)
  condition NAME, conditions, planted, gate-power, duet
                  the verdict benchmark's tables (one simulated machine's; all in brief), from the reduced results committed in
                  benchmarks/results/ (`benchmarks/verdict_stability.py`)

Exit status: 0 written or current; 1 --check found stale blocks (each named); 2 a marker
that names an unknown kind, or a block left open.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import json
import os
import re
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
EXAMPLE_RUN = REPO / "results" / "example"
#: the committed runs the tables quote, by the name a `findings` block gives
COMMITTED_RUNS = {"example": EXAMPLE_RUN, "long": REPO / "results" / "long"}
BENCHMARK_RESULTS = REPO / "benchmarks" / "results"
BLOCK = re.compile(r"(<!-- generated: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- /generated -->)",
                   re.S)
OPEN = re.compile(r"<!-- generated: ([^>]*?) -->")
HELP_COLUMNS = "96"


class DocsError(Exception):
    """A marker the generator cannot fill (exit 2)."""


def _help(module: str) -> str:
    os.environ["COLUMNS"] = HELP_COLUMNS  # argparse wraps at the terminal's width
    parser = importlib.import_module(module).build_parser()
    return "```text\n" + parser.format_help().rstrip() + "\n```\n"


def _attribute_docs(cls) -> dict[str, str]:
    """Each annotated attribute's docstring (the string right after it in the class body)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for statement, following in zip(body, body[1:]):
        if (isinstance(statement, ast.AnnAssign) and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)):
            docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _variants() -> str:
    from esper.variants import AXES, Variants

    docs = _attribute_docs(Variants)
    lines = ["| axis | values (the original's first) | what it chooses |", "|---|---|---|"]
    for axis, values in AXES.items():
        lines.append(f"| `{axis}` | {' / '.join(f'`{v}`' for v in values)} | "
                     f"{_cell(docs.get(axis, ''))} |")
    return "\n".join(lines) + "\n"


def _finding_fields(kind: str = "Finding") -> str:
    from harness import findings

    kinds = ("Finding", "Recording", "Reading", "About")
    if kind not in kinds:
        raise DocsError(f"finding-fields: expected one of {', '.join(kinds)}; got {kind!r}")
    dataclass = getattr(findings, kind)
    docs = _attribute_docs(dataclass)
    lines = ["| field | default | meaning |", "|---|---|---|"]
    for field in dataclasses.fields(dataclass):
        if field.default is not dataclasses.MISSING:
            default = f"`{field.default!r}`" if not callable(field.default) else "(every case)"
        elif dataclasses.is_dataclass(field.default_factory):
            default = f"`{field.default_factory.__name__}()`"
        elif field.default_factory is not dataclasses.MISSING:
            default = f"`{field.default_factory()!r}`"
        else:
            default = "required"
        lines.append(f"| `{field.name}` | {_cell(default)} | {_cell(docs.get(field.name, ''))} |")
    return "\n".join(lines) + "\n"


#: every enum of words a user reads, with where it is read: one question each
WORD_ENUMS = (
    ("harness.measure.decision", "Word", "every ratio's interval: a run's row, and a compare row (new against old); the gate turns it into pass or regression"),
    ("harness.measure.decision", "ClaimWord", "a claim that states a factor (`~4x`)"),
    ("harness.results", "Status", "a run's row: was it timed"),
    ("harness.measure.stats", "Verdict", "a run's summary row: its Word, or its Status where it was not timed"),
    ("harness.report.compare", "Change", "`report --compare`: one row between two runs, in Word's words where both runs timed it"),
    ("harness.gate.table", "Outcome", "`harness.gate`: one row of a check"),
    ("harness.bisect.search", "Decision", "`harness.bisect`: one measured commit"),
)


def _words() -> str:
    lines = ["| words | what they answer | read in | `module.Enum` |", "|---|---|---|---|"]
    for module, name, where in WORD_ENUMS:
        enum = getattr(importlib.import_module(module), name)
        question = " ".join(inspect.getdoc(enum).split("\n\n")[0].split())
        words = ", ".join(f"*{member.value}*" for member in enum)
        lines.append(f"| {words} | {_cell(question)} | {_cell(where)} | `{module}.{name}` |")
    return "\n".join(lines) + "\n"


def _findings(name: str = "example") -> str:
    from harness.report.data import recorded_info, run_headlines
    from harness.results import load_run

    if name not in COMMITTED_RUNS:
        raise DocsError(f"findings: expected a committed run among {', '.join(COMMITTED_RUNS)}; "
                        f"got {name!r}")
    if not (COMMITTED_RUNS[name] / "run.json").is_file():
        raise DocsError(f"findings {name}: expected {COMMITTED_RUNS[name].relative_to(REPO)}"
                        f"/run.json; got none (make one with --{name} RUN)")
    run = load_run(COMMITTED_RUNS[name])
    lines = ["| finding | claim | the baseline reproduces | verdict at the headline case |",
             "|---|---|---|---|"]
    for head in run_headlines(run):
        info = recorded_info(run.metadata, head.finding) or {}
        reviewed = info.get("reviewed") or "-"
        lines.append(f"| `{head.finding}` | {_cell(head.claim)} | {_cell(reviewed)} | "
                     f"{_cell(head.where)}: {_cell(head.verdict_text())} |")
    meta = run.metadata
    which = ("the committed example run" if name == "example"
             else "the committed run of the long findings")
    report = ("; its report is `reports/example/index.html`" if name == "example"
              else f" (`results/{name}/run.json`)")
    lines += ["", f"From {which} `{run.run_id}` ({meta.get('device')}, "
              f"{meta.get('cpu_model') or meta.get('device_name')}, {meta.get('threads')} "
              f"threads, commit {str(meta.get('git_commit'))[:8]}){report}."]
    return "\n".join(lines) + "\n"


def _finding_list() -> str:
    from harness import findings as registry

    registry.load_findings_module("esper_review")  # the findings pyproject.toml names
    lines = ["| finding | ticket | variants (baseline first; ours marked) | the baseline "
             "reproduces | the review's fix | where the premise does not hold |",
             "|---|---|---|---|---|---|"]
    for finding in registry.select(None, include_long=True, modules=["esper_review"]):
        names = [finding.baseline, *[v for v in finding.variants if v != finding.baseline]]
        variants = ", ".join(f"`{v}`" + (" (ours)" if v in finding.ours else "")
                             + (" (peer)" if v in finding.peers else "") for v in names)
        long = " (long)" if finding.long else ""
        lines.append(f"| `{finding.id}`{long} | {_cell(finding.about.ticket or '-')} | {variants} | "
                     f"{_cell(finding.about.reviewed or '-')} | {_cell(finding.about.fix or '-')} | "
                     f"{_cell(finding.about.premise or '-')} |")
    return "\n".join(lines) + "\n"


def _targets() -> str:
    from harness.results import load_run
    from esper_review.gae_tools.targets import markdown, target_cells

    return markdown(target_cells(load_run(EXAMPLE_RUN).summary)) + "\n"


def _verdict_stability():
    """benchmarks/verdict_stability.py, imported from this repository."""
    sys.path.insert(0, str(REPO))
    from benchmarks import verdict_stability

    return verdict_stability


def _benchmark(kind: str, *argument: str) -> str:
    return _verdict_stability().markdown(kind, BENCHMARK_RESULTS, *argument) + "\n"


KINDS = {
    "help": _help,
    "variants": _variants,
    "finding-fields": _finding_fields,
    "findings": _findings,
    "finding-list": _finding_list,
    "words": _words,
    "targets": _targets,
    **{kind: (lambda *argument, kind=kind: _benchmark(kind, *argument))
       for kind in ("condition", "conditions", "planted", "gate-power", "duet")},
}


def render(spec: str) -> str:
    """The body of the block whose marker says `spec` ("help harness.run", "variants")."""
    kind, *argument = spec.split()
    if kind not in KINDS:
        raise DocsError(f"generated block: expected a kind among {', '.join(KINDS)}; "
                        f"got {kind!r}")
    return KINDS[kind](*argument)


def regenerate(text: str, where: str) -> tuple[str, list[str]]:
    """`text` with every generated block rendered anew, and the specs that changed."""
    if len(OPEN.findall(text)) != len(BLOCK.findall(text)):
        raise DocsError(f"{where}: a '<!-- generated: ... -->' block has no "
                        f"'<!-- /generated -->' after it")
    stale: list[str] = []

    def fill(match: re.Match) -> str:
        body = render(match["spec"])
        if body != match["body"]:
            stale.append(match["spec"])
        return match.group(1) + body + match.group(4)

    return BLOCK.sub(fill, text), stale


def portable_command(command: str) -> str:
    """`command` with the folder after `--out` shown as `results/`: the committed copy
    must not name the folder of the machine it was measured on."""
    return re.sub(r"(--out)(=|\s+)\S+", r"\1\2results/", command)


def set_example(run_folder: Path, name: str = "example") -> None:
    """Copy a finished run's run.json into results/NAME, without its sample rows (the
    tables read the summary and the metadata; the samples stay with the run)."""
    from harness.results import load_run

    run = load_run(run_folder)
    if run.metadata.get("status") != "complete":
        raise DocsError(f"--{name}: expected a complete run; {run_folder} is "
                        f"{run.metadata.get('status')!r}")
    document = json.loads((Path(run_folder) / "run.json").read_text())
    document["rows"] = []
    document["command"] = portable_command(document.get("command", ""))
    target = COMMITTED_RUNS[name]
    target.mkdir(parents=True, exist_ok=True)
    temp = target / f".run.json.{os.getpid()}.tmp"
    temp.write_text(json.dumps(document, indent=1) + "\n")
    os.replace(temp, target / "run.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming each stale block")
    parser.add_argument("--example", type=Path, metavar="RUN",
                        help="first make RUN's run.json (less its sample rows) the example")
    parser.add_argument("--long", type=Path, metavar="RUN",
                        help="first make RUN's run.json (less its sample rows) the committed "
                             "run of the long findings")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    for name in ("example", "long"):
        if getattr(args, name) is not None and args.check:
            parser.error(f"--{name}: expected without --check (it writes the run)")
    found_stale = []
    try:
        for name in ("example", "long"):
            if getattr(args, name) is not None:
                set_example(getattr(args, name), name)
        for document in DOCUMENTS:
            text = document.read_text()
            new, stale = regenerate(text, document.name)
            found_stale += [f"{document.relative_to(REPO)}: {spec}" for spec in stale]
            if stale and not args.check:
                temp = document.with_name(f".{document.name}.{os.getpid()}.tmp")
                temp.write_text(new)
                os.replace(temp, document)  # never a half-written page
    except DocsError as err:
        print(f"docs/generate.py: {err}", file=sys.stderr)
        return 2
    if args.check and found_stale:
        print("stale generated blocks (run python docs/generate.py):\n  "
              + "\n  ".join(found_stale), file=sys.stderr)
        return 1
    print(f"{len(found_stale)} block(s) {'stale' if args.check else 'rewritten'}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
