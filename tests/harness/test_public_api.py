"""The public API for declaring findings: its names are frozen, and a wrong declaration is
a ValueError that names the finding, the field, the expected and the received value."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from pathlib import Path

import pytest
import torch

import harness
from tests.review import review_findings
from harness import About, Case, Finding, Reading, Recording, max_abs_difference, register
from harness import findings as registry

#: what a user may import from `harness`; changing it breaks their finding modules
PUBLIC_NAMES = ["About", "Case", "Defaults", "Finding", "PlantTarget", "Reading", "Recording",
                "max_abs_difference",
                "max_relative_error", "register", "rounding_tolerance", "set_defaults",
                "unit_roundoff"]
#: Finding's fields, in order: a user's keyword arguments
FINDING_FIELDS = ("id", "title", "claim", "variants", "baseline", "cases", "build", "make_call",
                  "check", "reference", "tolerance", "skip", "peers", "margin", "proposed",
                  "long", "ours", "recording", "reading", "about", "gated")
#: Recording's fields: how calls are sampled and what each records beside its time
RECORDING_FIELDS = ("paired", "budget_factor", "profile_max_s", "extra_metrics",
                    "sample_metrics", "phases", "min_bytes", "caches_cold", "compile_groups")
#: Reading's fields: how the report reads the measurement against the claim
READING_FIELDS = ("answer", "headline_case", "per_iteration", "claim_factor", "claim_tolerance")
#: About's fields: the text a report shows of a finding
ABOUT_FIELDS = ("ticket", "reviewed", "fix", "premise", "notes", "duration_s")


def test_the_public_names_are_frozen_and_are_the_registry_s_own():
    assert harness.__all__ == PUBLIC_NAMES
    assert set(PUBLIC_NAMES) <= set(dir(harness))
    assert (Case, Finding, max_abs_difference, register) == (
        registry.Case, registry.Finding, registry.max_abs_difference, registry.register)
    assert (harness.Defaults, harness.PlantTarget, harness.set_defaults) == (
        registry.Defaults, registry.PlantTarget, registry.set_defaults)
    with pytest.raises(AttributeError, match="has no attribute 'Findings'"):
        harness.Findings  # noqa: B018


@pytest.mark.parametrize("kind, names", [(Finding, FINDING_FIELDS), (About, ABOUT_FIELDS),
                                         (Recording, RECORDING_FIELDS),
                                         (Reading, READING_FIELDS)])
def test_finding_s_fields_are_frozen_and_each_has_a_docstring(kind, names):
    assert tuple(f.name for f in dataclasses.fields(kind)) == names
    assert registry.FIELDS == FINDING_FIELDS
    body = ast.parse(textwrap.dedent(inspect.getsource(kind))).body[0].body
    documented = {statement.target.id for statement, following in zip(body, body[1:])
                  if isinstance(statement, ast.AnnAssign) and isinstance(following, ast.Expr)
                  and isinstance(following.value, ast.Constant)}
    assert sorted(set(names) - documented) == []


def _declare(**changes) -> Finding:
    """A valid declaration with `changes` applied."""
    fields = dict(
        id="API-test", title="a test", claim="b is ~2x faster than a", variants=("a", "b"),
        baseline="a", cases=lambda quick: [Case.of(n=4)],
        build=lambda case, device, seed: torch.ones(case["n"], device=device),
        make_call=lambda variant, x: lambda: x.sum(), check=max_abs_difference,
    )
    return Finding(**{**fields, **changes})


@pytest.mark.parametrize("changes, message", [
    ({"baseline": "c"}, "Finding 'API-test': baseline: expected one of the variants (a, b); got 'c'"),
    ({"variants": ()}, "Finding 'API-test': variants: expected at least one name; got ()"),
    ({"variants": ("a", "a", "b")}, "variants: expected each name once (a repeated); got ('a', 'a', 'b')"),
    ({"variants": "ab"}, "variants: expected a tuple of str; got 'ab'"),
    ({"variants": ("a", "")}, "variants: expected non-empty strs; got ('a', '')"),
    ({"cases": []}, "cases: expected a non-empty list of Case (or a function quick -> list of Case); got []"),
    ({"cases": [{"n": 4}]}, "cases: expected a non-empty list of Case"),
    ({"cases": [Case.of(n=4), Case.of(n=4)]}, "cases: expected distinct cases (n=4 repeated)"),
    ({"cases": None}, "cases: expected a callable quick -> list of Case; got None"),
    ({"build": "torch.ones"}, "build: expected a callable (case, device, seed) -> inputs; got 'torch.ones'"),
    ({"make_call": None}, "make_call: expected a callable (variant, inputs) -> zero-argument callable; got None"),
    ({"check": 0.1}, "check: expected None or a callable (output, reference) -> max error; got 0.1"),
    ({"check": None, "reference": lambda x: x}, "check: expected a callable (output, reference) -> max error, since a reference is given"),
    ({"reference": "float64"}, "reference: expected None or a callable inputs -> reference output; got 'float64'"),
    ({"tolerance": -1e-3}, "tolerance: expected a number >= 0 or a function (case[, device]) -> number; got -0.001"),
    ({"tolerance": "1e-3"}, "tolerance: expected a callable (case[, device]) -> max error allowed; got '1e-3'"),
    ({"skip": None}, "skip: expected a callable (variant, case, device) -> reason or None; got None"),
    ({"peers": ("z",)}, "peers: expected variants of the finding (a, b); got ['z']"),
    ({"peers": ("a",)}, "peers: expected variants other than the baseline"),
    ({"title": ""}, "title: expected a non-empty str; got ''"),
    ({"claim": None}, "claim: expected a non-empty str; got None"),
    ({"recording": Recording(paired="yes")}, "recording.paired: expected True or False; got 'yes'"),
    ({"gated": 1}, "gated: expected True or False; got 1"),
    ({"long": "no"}, "long: expected True or False; got 'no'"),
    ({"reading": Reading(answer="rate")}, "reading.answer: expected a tuple of str; got 'rate'"),
    ({"reading": Reading(claim_tolerance=0)}, "reading.claim_tolerance: expected a fraction in (0, 1], e.g. 0.25; got 0"),
    ({"reading": Reading(per_iteration=(0, "E2E"))}, "reading.per_iteration: expected None or (calls per training iteration > 0"),
    ({"recording": Recording(profile_max_s=0)}, "recording.profile_max_s: expected None or seconds > 0; got 0"),
    ({"recording": Recording(budget_factor=0)}, "recording.budget_factor: expected a finite number > 0; got 0"),
    ({"recording": Recording(budget_factor=float("inf"))}, "recording.budget_factor: expected a finite number > 0; got inf"),
    ({"recording": {"paired": True}}, "recording: expected Recording(...), from harness; got {'paired': True}"),
    ({"about": About(duration_s=30)}, "about.duration_s: expected None or (quick seconds, default seconds), each >= 0; got 30"),
    ({"about": About(notes="one note")}, "about.notes: expected a tuple of non-empty str; got 'one note'"),
    ({"about": "a ticket"}, "about: expected About(...), from harness; got 'a ticket'"),
    ({"about": About(reviewed=599)}, "about.reviewed: expected a str; got 599"),
    ({"ours": ("a",)}, "ours: expected variants other than the baseline and the peers"),
    ({"ours": ("z",)}, "ours: expected variants other than the baseline and the peers (a design of this project's own); got ['z']"),
    ({"recording": Recording(min_bytes=64)}, "recording.min_bytes: expected None or a callable case -> bytes; got 64"),
    ({"recording": Recording(caches_cold=True)}, "recording.caches_cold: expected None or a callable () -> bool; got True"),
    ({"recording": Recording(compile_groups=("a", "b"))}, "recording.compile_groups: expected a tuple of str; got 'a'"),
    ({"recording": Recording(compile_groups=(("a", "c"),))}, "recording.compile_groups: expected names of the finding's variants (a, b); c is not one; got (('a', 'c'),)"),
    ({"recording": Recording(compile_groups=(("a",), ("b", "a")))}, "recording.compile_groups: expected each variant in one group (a is in more)"),
    ({"recording": Recording(compile_groups=((),))}, "recording.compile_groups: expected at least one name; got ()"),
    ({"recording": Recording(compile_groups="ab")}, "recording.compile_groups: expected a tuple of tuples of variant names; got 'ab'"),
    ({"id": "my claim"}, "Finding: id: expected a str of letters, digits, '.', '_' or '-' starting "
                         "with a letter or digit, e.g. 'MY-claim-1'; got 'my claim'"),
    ({"id": ""}, "Finding: id: expected a str"),
])
def test_a_wrong_field_is_a_value_error_naming_it(changes, message):
    with pytest.raises(ValueError) as caught:
        _declare(**changes)
    assert message in str(caught.value)


def test_lists_and_numbers_are_accepted_where_a_stranger_would_write_them():
    finding = _declare(variants=["a", "b"], cases=[Case.of(n=4), Case.of(n=8)], tolerance=1e-3,
                       about=About(notes=["one note"]))
    assert finding.variants == ("a", "b") and finding.about.notes == ("one note",)
    grouped = _declare(recording=Recording(compile_groups=[["a"], ["b"]]))
    assert grouped.recording.compile_groups == (("a",), ("b",))
    assert [c.label for c in finding.cases(True)] == [c.label for c in finding.cases(False)] == ["n=4", "n=8"]
    assert finding.tolerance(Case.of(n=4), torch.device("cpu")) == 1e-3
    assert _declare().tolerance(Case.of(n=4), torch.device("cpu")) == 0.0  # exact by default


@pytest.mark.parametrize("params, message", [
    ((), "Case: params: expected at least one (name, value) pair"),
    ((("n", 1), ("n", 2)), "Case: params: expected each name once; got ['n', 'n']"),
    ((("", 1),), "Case: params: expected at least one (name, value) pair with a non-empty str name"),
])
def test_a_bad_case_is_a_value_error(params, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        Case(params)


def test_register_rejects_a_duplicate_id_and_a_non_finding():
    review_findings()
    with pytest.raises(ValueError, match="register: finding id 'B4-CR-03' is already registered "
                                         r"\(esper_review[.\w]*\); choose another id"):
        register(_declare(id="B4-CR-03"))
    with pytest.raises(ValueError, match="register: finding: expected a Finding; got dict"):
        register({"id": "API-test"})
    finding = register(_declare(id="API-twice"))
    try:
        assert registry.ORIGINS["API-twice"] == __name__  # the module that called register
        with pytest.raises(ValueError, match=f"'API-twice' is already registered \\({__name__}\\)"):
            register(_declare(id="API-twice"))
    finally:
        del registry.FINDINGS[finding.id], registry.ORIGINS[finding.id]


def test_cases_that_fail_become_one_failed_case_whose_build_names_the_cause():
    def broken(quick):
        raise KeyError("no such size")

    for cases, message in ((broken, "cases(quick=True) raised KeyError: 'no such size'"),
                           (lambda quick: [], "cases(quick=True): expected a non-empty list of Case; got []"),
                           (lambda quick: [Case.of(n=1), 2], "cases(quick=True): expected Case objects")):
        stand_in = registry.planned(_declare(cases=cases), quick=True)
        assert stand_in.cases(True) == stand_in.cases(False) == [registry.CASES_FAILED]
        assert stand_in.skip("a", registry.CASES_FAILED, torch.device("cpu")) is None
        with pytest.raises(registry.CasesError) as caught:
            stand_in.build(registry.CASES_FAILED, torch.device("cpu"), 0)
        assert message in str(caught.value)


def test_planned_calls_cases_once_and_keeps_the_list():
    calls = []

    def cases(quick):
        calls.append(quick)
        return [Case.of(n=4 if quick else 64)]

    finding = registry.planned(_declare(cases=cases), quick=False)
    assert [c.label for c in finding.cases(True)] == ["n=64"] and calls == [False]


@pytest.mark.parametrize("claim, factor", [
    ("could be ~4x faster with tensor operations", 4.0),
    ("about ~ 2.5x less time", 2.5),
    ("up to 25x fewer allocations", 25.0),
    ("about 3.5x faster", 3.5),
    ("up to 25 allocations per environment", None),  # a count, not a speed-up
])
def test_the_claimed_speed_up_is_read_from_the_claim(claim, factor):
    """One reader of a claim's factor (`harness.findings.claim_factor_of`), the one the
    report's claim word uses too."""
    assert registry.claim_factor_of(claim) == factor


def test_max_abs_difference_compares_two_tensors_as_the_api_page_says():
    """docs/api.md says what the check takes; the annotations the first-call check reads
    say the same (a tuple or a dict needs a check of its own)."""
    parameters = inspect.signature(max_abs_difference).parameters.values()
    assert [p.annotation for p in parameters] == ["torch.Tensor", "torch.Tensor"]
    assert max_abs_difference(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5])) == 0.5
    api = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    assert "`max_abs_difference(output, reference)` compares two tensors" in " ".join(api.split())
