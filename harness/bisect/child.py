"""One bisect probe: the counters of a finding's quick cases on one commit's code.

`harness.bisect.probe` runs this file's source with `python -c` from a neutral folder, in
a fresh process, with one argument: the JSON of a `ProbeConfig`. It first imports the
*installed* harness's counting code (`harness.measure`: the same counter definitions on
every commit), then the code under test from the commit's tree:

the findings modules (`findings_modules`): the tree's import folders (`paths`) go first
on `sys.path` and the modules are loaded through the installed harness's registry, as
`harness.gate --against` does.

From the tree only the long-stable findings API is used (`select`, `cases`, `build`,
`make_call`, `skip`, `variants`, and `peers` where the tree has it). Per finding x quick
case x variant (peers aside), after a warm-up call: `profile_call`'s counters on the CPU
with one torch thread, as the gate counts them, and the sources of those counters
(`attribute_call`) where asked: for every cell (`attribute: "all"`), or for the cells
whose counters differ from `reference`.

Output, one JSON object on stdout: `{"cells": [...]}` with, per cell, `finding`, `case`,
`variant` and `counts` (and `sources`), or `error`, or `skipped`; or `{"unusable": why}`
when the findings cannot be had on this commit (missing, or they do not import). Dies with
the bisect that started it, even one killed outright.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: the counters compared, as the gate's baseline holds them
COUNTERS = ("op_calls", "host_syncs", "allocations", "allocated_bytes", "peak_bytes")


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def _registry(config: dict, tree: Path):
    """The installed harness's registry with the tree's findings modules loaded (module
    docstring), or the reason there is none."""
    sys.path[:0] = [str((tree / p).resolve()) for p in config["paths"]]
    from harness import findings as registry  # the installed one: it measures the tree's
    for name in config["findings_modules"]:
        try:
            registry.load_findings_module(name)
        except ValueError as err:  # names the module and the cause
            return None, str(err)
        where = Path(sys.modules[name].__file__).resolve()
        if tree not in where.parents:
            return None, f"{name} came from {where}, not from the commit's tree {tree}"
    return registry, None


def measure(config: dict) -> dict:
    import torch

    from harness.measure.counters import profile_call
    from harness.measure.sources import ProjectFiles, attribute_call
    from harness.measure.timing import pinned_threads

    tree = Path(config["tree"]).resolve()
    registry, why = _registry(config, tree)
    if registry is None:
        return {"unusable": why}
    try:
        findings = registry.select(list(config["findings"]))
    except ValueError as err:  # an id this commit does not register
        return {"unusable": f"not on this commit: {err}"}
    files = ProjectFiles(tree)
    reference = {tuple(c["key"]): c["counts"] for c in config.get("reference", [])}
    device = torch.device("cpu")
    cells = []
    with pinned_threads(1):
        for finding in findings:
            peers = getattr(finding, "peers", ())
            try:
                cases = finding.cases(True)
            except Exception as err:  # this commit cannot list the cases: one error row
                cells += [{"finding": finding.id, "case": "cases()", "variant": v,
                           "error": _error(err)} for v in finding.variants if v not in peers]
                continue
            for case in cases:
                base = {"finding": finding.id, "case": case.label}
                variants = [v for v in finding.variants if v not in peers]
                try:
                    inputs = finding.build(case, device, config["seed"])
                except Exception as err:  # every variant of the case is an error row
                    cells += [{**base, "variant": v, "error": f"building inputs: {_error(err)}"}
                              for v in variants]
                    continue
                for variant in variants:
                    cells.append(_cell(finding, case, variant, inputs, base, device, files,
                                       config, reference, profile_call, attribute_call))
    return {"cells": cells}


def _cell(finding, case, variant, inputs, base, device, files, config, reference,
          profile_call, attribute_call) -> dict:
    cell = {**base, "variant": variant}
    reason = finding.skip(variant, case, device)
    if reason:
        return {**cell, "skipped": reason}
    try:
        call = finding.make_call(variant, inputs)
        call()  # warm-up: lazy initialisation and compilation stay out of the counts
        counts = {k: v for k, v in profile_call(call, "cpu").as_row().items() if k in COUNTERS}
        cell["counts"] = counts
        key = (finding.id, case.label, variant)
        wanted = config["attribute"] == "all" or (
            key in reference and reference[key] != counts)
        if wanted:
            cell["sources"] = attribute_call(call, files).as_json()
    except Exception as err:  # a crashing variant is a row; the others go on
        cell["error"] = _error(err)
    return cell


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: child.py CONFIG_JSON", file=sys.stderr)
        return 2
    config = json.loads(argv[0])
    from harness.exits import die_with_parent  # the installed harness

    die_with_parent(config.get("parent"), "the bisect")
    from harness.isa_checks import check_isas_lazily

    check_isas_lazily()
    # nothing may come from the working directory: the tree is put on sys.path
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    print(json.dumps(measure(config)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
