"""The reviewed choices, one frozen dataclass with a value on every axis.

Every part of esper reads its behaviour from a `Variants` instance; there are no
global flags. Three presets: `Variants.original()` is the code as reviewed,
`Variants.reviews()` every fix as the reviews wrote it, `Variants.ours()` this project's
designs where it has one and the reviews' fixes elsewhere.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from esper.gae import METHODS as GAE_METHODS
from esper.gae import RESETS as GAE_RESETS

#: axis name -> allowed values; the first value is the original system's choice. This is
#: the one list of every axis's values: the modules that act on an axis read theirs here.
#: The two GAE axes are the GAE package's own names (it cannot import this module):
#: its loop's resets, and the methods it can run on this machine (loop first).
AXES: dict[str, tuple[str, ...]] = {
    "reset": GAE_RESETS,
    "step_counts": ("list", "tensor", "cached", "numpy_view"),
    "gae": tuple(GAE_METHODS),
    "sync": ("stream", "event"),
    "env_pool": ("recreate", "checkpoint", "pool"),
    "bootstrap": ("tensor", "copy", "packed"),
    "masks": ("stack", "preallocated", "packed"),
    "transfer": ("per_tensor", "flat"),
    "scaler": ("shared", "per_optimizer"),
    "seed_clip": ("none", "clip"),
    "stream_guard": ("is_cuda", "stream"),
    "accumulators": ("separate", "stacked"),
    "validation": ("inference_mode", "no_grad"),
    "add_checks": ("none", "mask_shapes", "checked"),
}


@dataclass(frozen=True)
class Variants:
    """One choice per reviewed axis."""

    reset: str = "clone"
    """How the per-env loop GAE resets the trace at a true terminal: `clone` allocates
    `zero_tensor.clone()` (original), `mask` multiplies the trace by a precomputed
    `1 - done_mask[t]` (B4-DRL-03's option 3 in the reviewed lines), `assign` takes
    `zero_tensor` itself where `clone` clones (the allocation alone), `restructured` is a
    loop of this project's with a precomputed not-done trace (`esper.gae.loop`). Only the
    `loop` method has a reset to choose; with any other `gae` this axis changes nothing."""
    step_counts: str = "list"
    """Buffer bookkeeping of per-env step counts: Python `list` (original), a CPU int32
    `tensor` counted up by `step_counts[env_id] += 1` in each add (B4-PT-05's first
    fix), a list with a `cached` count tensor rebuilt when it changed (the ticket's
    second), or a CPU int64 tensor counted up through a `numpy_view` of its memory
    (this project's: no aten op per add; `RolloutBuffer.step_counts_tensor`)."""
    gae: str = "loop"
    """Advantage computation method, a key of `esper.gae.METHODS`."""
    sync: str = "stream"
    """The epoch boundary of the vectorized env phase on CUDA (`VectorizedTrainer.env_phase`):
    per env a host `stream.synchronize()` and reads after training, validation on the env
    streams, the same again after it (original); or an `event` per env stream that the
    default stream waits on, validation there, one read (the review's H3 fix)."""
    env_pool: str = "recreate"
    """Envs of each new batch of episodes: `recreate`d (new host networks, optimizers and
    streams, the original), kept and reset with their host weights restored from a
    `checkpoint` taken when they were made (the review's H1 `reset_env_state`), or kept
    in a `pool` and reset with their weights drawn again in place (this project's;
    `esper.env.pool`)."""
    bootstrap: str = "tensor"
    """The bootstrap values at an episode's end (`esper.env.bootstrap_states`): per env a new
    `tensor` from its feature list, a batch-1 forward of the whole policy and an `.item()`
    (original); the same with each env's state `copy`-ed into a `[1, D]` device buffer
    allocated once (the review's H4 fix); or every env's row `packed` into one staged
    buffer, one copy, one batched value forward and one read (this project's design)."""
    masks: str = "stack"
    """One step's action masks for the policy (`esper.env.mask_batch`): each env's built on
    the device, then `stack`ed per head (original); the same per-env device masks copied
    row by row into `preallocated` `[N, K]` device tensors (the review's H5 fix); or built
    on the host and `packed` into one staged buffer moved in one copy (this project's)."""
    transfer: str = "per_tensor"
    """`RolloutBuffer.get_batched_sequences` to another device: one `.to()` `per_tensor`
    (original) or one `flat` (pinned on CUDA) copy split into views (`esper.rollout.transfer`)."""
    scaler: str = "shared"
    """Under mixed precision (`EnvConfig.amp`), one GradScaler `shared` by the host and seed
    optimizers (original) or one `per_optimizer` (`esper.env.optimizers`)."""
    seed_clip: str = "none"
    """Seed optimizers stepped with no gradient clipping (`none`, original) or after
    `clip_grad_norm_` (`clip`, `EnvConfig.seed_clip_norm`)."""
    stream_guard: str = "is_cuda"
    """Per training batch, `record_stream` when the env has a stream and the inputs
    `is_cuda` (original), or when it has a `stream` (`esper.env.stream_guard`)."""
    accumulators: str = "separate"
    """Per training batch, the loss and correct-count accumulators updated by two
    `separate` `add_` (original) or one `stacked` `add_` (`esper.env.accumulators`)."""
    validation: str = "inference_mode"
    """The host's validation forward in each epoch (`MorphoEnv.launch_val`) under
    `torch.inference_mode()` (original, the review's L1) or `torch.no_grad()`."""
    add_checks: str = "none"
    """`RolloutBuffer.add` writes its arguments unchecked (`none`, the original: a wrong
    value is stored, a [1] mask broadcasts), checks each mask's shape first and raises a
    `ValueError` naming it (`mask_shapes`, the rollout-buffer audit's 5.1 fix), or
    checks every argument first (`checked`, this project's; a buffer made without
    `variants` checks). AUDIT-5.1-add-checks measures what the checks cost."""

    def __post_init__(self) -> None:
        for axis, allowed in AXES.items():
            value = getattr(self, axis)
            if value not in allowed:
                raise ValueError(
                    f"Variants.{axis}: expected one of {', '.join(allowed)}; got {value!r}"
                )

    @classmethod
    def original(cls) -> "Variants":
        """The reviewed code: the first value of every axis (clone resets, list step counts,
        loop GAE, stream sync, recreated envs, ...)."""
        return cls(**{axis: values[0] for axis, values in AXES.items()})

    @classmethod
    def reviews(cls) -> "Variants":
        """Every fix as the reviews wrote it: B4-DRL-03's option 3 (`reset=mask`),
        B4-PT-05's count tensor, B4-CR-03's vectorized loop (`gae=batched`), H3's events,
        H1's checkpointed pool, H4's state buffer, H5's pre-allocated masks, audit 1.3's
        flat transfer, C1's scaler per optimizer, H2's stream guard, L2's stacked add and
        audit 5.1's mask-shape checks. Two choices stay the original's: `seed_clip=none`
        (C3's clipping changes what the seeds learn, so the iteration would not compute
        what `original()` computes; C3-seed-grad-clip measures it) and
        `validation=inference_mode` (L1 proposes no change)."""
        return cls(reset="mask", step_counts="tensor", gae="batched", sync="event",
                   env_pool="checkpoint", bootstrap="copy", masks="preallocated",
                   transfer="flat", scaler="per_optimizer", seed_clip="none",
                   stream_guard="stream", accumulators="stacked",
                   validation="inference_mode", add_checks="mask_shapes")

    @classmethod
    def ours(cls) -> "Variants":
        """This project's designs where it has one, the reviews' fixes elsewhere: the
        `restructured` loop reset, counts through a `numpy_view`, the `scan` GAE, the
        `pool` that draws weights again in place, `packed` bootstrap states and masks,
        `checked` adds (every argument; a safety choice: bad input raises where the
        original stored it), the two `separate` accumulator adds (L2's stacked add
        measured slower); the reviews' events, flat transfer, scaler per optimizer and
        stream guard; and the original's `seed_clip=none` and
        `validation=inference_mode`, as `reviews()`. It computes what `original()`
        computes (under mixed precision, as long as no gradient overflows)."""
        return cls(reset="restructured", step_counts="numpy_view", gae="scan",
                   sync="event", env_pool="pool", bootstrap="packed", masks="packed",
                   transfer="flat", scaler="per_optimizer", seed_clip="none",
                   stream_guard="stream", accumulators="separate",
                   validation="inference_mode", add_checks="checked")

    @classmethod
    def parse(cls, spec: str, base: "Variants | None" = None) -> "Variants":
        """Parse `"gae=scan,reset=mask"` over `base` (default `original()`).

        `spec` may also name a preset (`PRESETS`: `original`, `reviews`, `ours`) anywhere
        among the `axis=value` overrides: the preset replaces `base` first, then every
        override applies, whatever the order (`"gae=scan,original"` is `original` with gae=scan).
        Two different presets, or one axis given two different values, are a
        `ValueError` naming both. An empty spec (or only commas) is `base`.

        Raises:
            TypeError: `spec` is not a str, or `base` neither a `Variants` nor None.
            ValueError: a part is malformed, names an unknown axis or value, or two
                presets or two values of one axis disagree.
        """
        if not isinstance(spec, str):
            raise TypeError(f"Variants.parse: spec: expected a str such as 'gae=scan,reset=mask' "
                            f"or 'ours'; got {spec!r} ({type(spec).__name__})")
        if base is not None and not isinstance(base, Variants):
            raise TypeError(f"Variants.parse: base: expected a Variants or None; got {base!r} "
                            f"({type(base).__name__})")
        presets: list[str] = []
        overrides: dict[str, str] = {}
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            if part in PRESETS:
                if presets and presets[0] != part:
                    raise ValueError(
                        f"variant spec: expected at most one preset; got {presets[0]!r} and {part!r}"
                    )
                presets.append(part)
                continue
            if "=" not in part:
                raise ValueError(
                    f"variant spec: expected 'axis=value' or a preset ({', '.join(PRESETS)}); "
                    f"got {part!r}"
                )
            axis, value = (s.strip() for s in part.split("=", 1))
            if axis not in AXES:
                raise ValueError(
                    f"variant spec: unknown axis {axis!r}; valid axes: {', '.join(AXES)}"
                )
            if overrides.get(axis, value) != value:
                raise ValueError(
                    f"variant spec: {axis}: expected one value; got {overrides[axis]!r} and {value!r}"
                )
            overrides[axis] = value
        result = getattr(cls, presets[0])() if presets else base if base is not None else cls.original()
        return dataclasses.replace(result, **overrides)

    def spec(self) -> str:
        """The inverse of `parse`: `"reset=clone,step_counts=list,gae=loop,sync=stream"`."""
        return ",".join(f"{axis}={getattr(self, axis)}" for axis in AXES)

    def __str__(self) -> str:
        return self.spec()


#: the presets' names, as `Variants.parse` and the command lines take them
PRESETS: tuple[str, ...] = ("original", "reviews", "ours")
