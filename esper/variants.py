"""The reviewed choices, one frozen dataclass with a value on every axis.

Every part of esper reads its behaviour from a `Variants` instance; there are no
global flags. `Variants.original()` is the code as reviewed, `Variants.optimized()`
the choices the review proposed.
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
    "step_counts": ("list", "tensor", "cached"),
    "gae": tuple(GAE_METHODS),
    "sync": ("stream", "event"),
    "env_pool": ("recreate", "pool"),
    "bootstrap": ("tensor", "copy", "packed"),
    "masks": ("stack", "preallocated", "packed"),
    "transfer": ("per_tensor", "flat"),
    "scaler": ("shared", "per_optimizer"),
    "seed_clip": ("none", "clip"),
    "stream_guard": ("is_cuda", "stream"),
    "accumulators": ("separate", "stacked"),
    "validation": ("inference_mode", "no_grad"),
    "add_checks": ("none", "checked"),
}


@dataclass(frozen=True)
class Variants:
    """One choice per reviewed axis."""

    reset: str = "clone"
    """How the per-env loop GAE resets the trace at a true terminal: `clone` allocates
    `zero.clone()` (original), `mask` multiplies by a precomputed not-done, `assign` takes
    `zero` itself where `clone` clones (B4-DRL-03's allocation alone). Only the `loop`
    method has a reset to choose; with any other `gae` this axis changes nothing."""
    step_counts: str = "list"
    """Buffer bookkeeping of per-env step counts: Python `list` (original), CPU int
    `tensor` (B4-PT-05's fix), or a list with a `cached` count tensor rebuilt when it
    changed (the ticket's second option; `RolloutBuffer.step_counts_tensor`)."""
    gae: str = "loop"
    """Advantage computation method, a key of `esper.gae.METHODS`."""
    sync: str = "stream"
    """The epoch boundary of the vectorized env phase on CUDA (`VectorizedTrainer.env_phase`):
    per env a host `stream.synchronize()` and reads after training, validation on the env
    streams, the same again after it (original); or an `event` per env stream that the
    default stream waits on, validation there, one read (the review's H3 fix)."""
    env_pool: str = "recreate"
    """Envs of each new batch of episodes: `recreate`d (new host networks, optimizers and
    streams, the original) or reset in place from a `pool` (`esper.env.pool`)."""
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
    value is stored, a [1] mask broadcasts) or checks every one first and raises a
    `ValueError` naming it (`checked`, the rollout-buffer audit's fix; a buffer made
    without `variants` checks). AUDIT-5.1-add-checks measures what the checks cost."""

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
    def optimized(cls) -> "Variants":
        """The reviewed fixes that measured not slower (README, "What the default CPU run
        says"). It keeps `transfer=per_tensor` (the flat copy's host side measured slower
        on the CPU; its transfer needs a GPU to measure), `seed_clip=none` (clipping
        changes training: a stability choice, not a speed one, see C3-seed-grad-clip) and
        `accumulators=separate` (one stacked add measured slower). For `bootstrap` and
        `masks` it takes this project's `packed` designs, which go further than the
        review's fixes (one transfer and one forward or read per step, not one per env),
        and `validation=inference_mode`, the original's choice (L1). It takes
        `add_checks=checked`, which measured slower: a safety choice (bad input raises
        where the original stored it), not a speed one. It computes what `original()`
        computes (under mixed precision, as long as no gradient overflows)."""
        return cls(reset="mask", step_counts="tensor", gae="scan", sync="event",
                   env_pool="pool", bootstrap="packed", masks="packed",
                   transfer="per_tensor", scaler="per_optimizer", seed_clip="none",
                   stream_guard="stream", accumulators="separate",
                   validation="inference_mode", add_checks="checked")

    @classmethod
    def parse(cls, spec: str, base: "Variants | None" = None) -> "Variants":
        """Parse `"gae=scan,reset=mask"` over `base` (default `original()`).

        `spec` may also name a preset, `original` or `optimized`, anywhere among the
        `axis=value` overrides: the preset replaces `base` first, then every override
        applies, whatever the order (`"gae=scan,original"` is `original` with gae=scan).
        Two different presets, or one axis given two different values, are a
        `ValueError` naming both. An empty spec (or only commas) is `base`.

        Raises:
            TypeError: `spec` is not a str, or `base` neither a `Variants` nor None.
            ValueError: a part is malformed, names an unknown axis or value, or two
                presets or two values of one axis disagree.
        """
        if not isinstance(spec, str):
            raise TypeError(f"Variants.parse: spec: expected a str such as 'gae=scan,reset=mask' "
                            f"or 'optimized'; got {spec!r} ({type(spec).__name__})")
        if base is not None and not isinstance(base, Variants):
            raise TypeError(f"Variants.parse: base: expected a Variants or None; got {base!r} "
                            f"({type(base).__name__})")
        presets: list[str] = []
        overrides: dict[str, str] = {}
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            if part in ("original", "optimized"):
                if presets and presets[0] != part:
                    raise ValueError(
                        f"variant spec: expected at most one preset; got {presets[0]!r} and {part!r}"
                    )
                presets.append(part)
                continue
            if "=" not in part:
                raise ValueError(
                    f"variant spec: expected 'axis=value' or 'original'/'optimized'; got {part!r}"
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
