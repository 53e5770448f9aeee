"""Whether a training batch's inputs are recorded on the env's CUDA stream (review H2).

The reviewed system writes, per batch, `if env_state.stream and inputs.is_cuda:
inputs.record_stream(env_state.stream)`; the review notes that a stream already implies
CUDA inputs, so `.is_cuda` is redundant. `Variants.stream_guard` picks the guard:
`is_cuda` (the original) or `stream` (a stream alone). Both decide the same wherever an env
has a stream, since an env's data live on its stream's device.
"""

from __future__ import annotations

from typing import Callable

import torch

from esper.variants import AXES

Guard = Callable[[object, torch.Tensor], bool]


def _stream_and_cuda_inputs(stream, inputs: torch.Tensor) -> bool:
    return stream is not None and inputs.is_cuda


def _stream(stream, inputs: torch.Tensor) -> bool:
    return stream is not None


#: guard name (`Variants.stream_guard`'s values: `is_cuda`, the original, then `stream`)
#: -> (stream or None, a batch tensor) -> record the batch on the stream?
GUARDS: dict[str, Guard] = dict(zip(AXES["stream_guard"], (_stream_and_cuda_inputs, _stream),
                                    strict=True))


def record_on_stream(guard: Guard, stream,
                     *tensors: torch.Tensor) -> None:
    """`record_stream` each tensor on `stream` when `guard(stream, tensors[0])` says so:
    the caching allocator then keeps their memory until the stream's work on them is done."""
    if guard(stream, tensors[0]):
        for tensor in tensors:
            tensor.record_stream(stream)
