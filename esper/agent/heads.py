"""The factored action space: 8 heads, their sizes, and which heads each op uses."""

from __future__ import annotations

#: head name -> number of choices, in the order the buffer and policy store them.
HEAD_SIZES: dict[str, int] = {
    "slot": 3,
    "blueprint": 13,
    "style": 4,
    "tempo": 3,
    "alpha_target": 3,
    "alpha_speed": 4,
    "alpha_curve": 3,
    "op": 6,
}
HEAD_NAMES: tuple[str, ...] = tuple(HEAD_SIZES)

#: op index -> name; `op` is sampled first and decides which other heads matter.
OPS: tuple[str, ...] = ("WAIT", "GERMINATE", "SET_ALPHA", "PRUNE", "FOSSILIZE", "ADVANCE")
OP_INDEX: dict[str, int] = {name: i for i, name in enumerate(OPS)}

#: op name -> heads whose log-prob carries the advantage for that op (causal masks).
HEADS_FOR_OP: dict[str, tuple[str, ...]] = {
    "WAIT": ("op",),
    "GERMINATE": ("op", "slot", "blueprint", "style", "tempo", "alpha_target"),
    "SET_ALPHA": ("op", "slot", "style", "alpha_target", "alpha_speed", "alpha_curve"),
    "PRUNE": ("op", "slot", "alpha_speed", "alpha_curve"),
    "FOSSILIZE": ("op", "slot"),
    "ADVANCE": ("op", "slot"),
}
