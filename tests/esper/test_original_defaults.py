"""Every default of PPOConfig and TrainConfig says what esper-lite used and where.

Each field's docstring has a line `Original: `VALUE`, FILE:LINE @COMMIT.` (VALUE a Python
literal, compared with our default) or `Original: none: WHY.` (no counterpart, e.g. our
synthetic environment). A default that differs from its original value must say why in
a `Differs on purpose: ...` sentence and be listed in `DIFFER_ON_PURPOSE` below: a new
difference fails here until it is documented.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap

import pytest

from esper.agent.ppo import PPOConfig
from esper.env.config import EnvConfig
from esper.training.trainer import TrainConfig

#: The fields whose default is not esper-lite's, each with the reason in its docstring.
DIFFER_ON_PURPOSE = {
    ("TrainConfig", "seed"),
}

#: The commits the reviews read (notes 29): a citation names one of them.
COMMITS = ("599f3895", "2df957ed", "181a4c41", "5c759205")
CITED = re.compile(r"Original: `(?P<value>[^`]*)`, (?P<where>\S+\.py:\d+[-\d,]*) @(?P<commit>[0-9a-f]{8})")
NO_COUNTERPART = re.compile(r"Original: none: \S")


def field_docs(cls) -> dict[str, str]:
    """Field name -> the docstring under it, read from the class's source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:] + [None]):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def default_of(field: dataclasses.Field) -> object:
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()


def rows(cls):
    docs = field_docs(cls)
    for field in dataclasses.fields(cls):
        yield cls.__name__, field.name, default_of(field), docs.get(field.name, "")


ALL_FIELDS = [row for cls in (PPOConfig, TrainConfig) for row in rows(cls)]


@pytest.mark.parametrize("owner, name, default, doc", ALL_FIELDS,
                         ids=[f"{o}.{n}" for o, n, _, _ in ALL_FIELDS])
def test_every_default_cites_the_original(owner, name, default, doc):
    cited = CITED.search(doc)
    assert cited or NO_COUNTERPART.search(doc), (
        f"{owner}.{name}: its docstring needs 'Original: `VALUE`, FILE:LINE @COMMIT.' or "
        f"'Original: none: WHY.'; got {doc!r}")
    if cited:
        assert cited["commit"] in COMMITS, cited["commit"]


def differs(default: object, doc: str) -> bool:
    cited = CITED.search(doc)
    return cited is not None and ast.literal_eval(cited["value"]) != default


def test_the_defaults_are_the_originals_except_those_that_differ_on_purpose():
    differing = {(owner, name) for owner, name, default, doc in ALL_FIELDS if differs(default, doc)}
    assert differing == DIFFER_ON_PURPOSE
    for owner, name, _, doc in ALL_FIELDS:
        if (owner, name) in DIFFER_ON_PURPOSE:
            assert "Differs on purpose:" in doc, f"{owner}.{name}: say why it differs"


def test_ppo_takes_one_gradient_step_per_rollout_as_the_original():
    """esper-lite trains its recurrent policy with `recurrent_n_epochs = 1` (599f3895
    src/esper/simic/agent/ppo.py:221,265) and one `agent.update()` per batch."""
    assert PPOConfig().update_epochs == 1



def test_the_env_options_that_reproduce_the_original_cite_it():
    """The synthetic environment has no original to match field by field; the options
    that bring the original's behaviour into it do, and default to it."""
    docs = field_docs(EnvConfig)
    for name in ("terminal_bonus", "lr", "seed_lr", "momentum", "weight_decay"):
        cited = CITED.search(docs[name])
        assert cited and cited["commit"] in COMMITS, (name, docs[name])
        assert ast.literal_eval(cited["value"]) == getattr(EnvConfig(), name)
