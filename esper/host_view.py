"""Read a CPU tensor's elements from Python without dispatching an aten op.

Input checks on hot paths (`RolloutBuffer.add`, `compute_gae`) read a few tensor values
(a step count, an action, a mask entry). The usual readers dispatch aten ops that the
harness counts: `.item()`, `float(t)`, `bool(t)` call `aten::_local_scalar_dense` (a host
sync), `.tolist()` two ops and `.numpy()` four (detach, to, resolve_conj, resolve_neg).
`host_view` and `host_item` instead read the tensor's own memory through ctypes: no op,
no copy, no sync, well under a microsecond.

On other devices there is no host memory to read; checks there use device-side asserts
(`torch._assert_async`) instead.
"""

from __future__ import annotations

import ctypes

import torch

#: dtypes whose elements ctypes reads directly, as Python bools, ints and floats
_CTYPES = {
    torch.bool: ctypes.c_bool,
    torch.uint8: ctypes.c_uint8,
    torch.int8: ctypes.c_int8,
    torch.int16: ctypes.c_int16,
    torch.int32: ctypes.c_int32,
    torch.int64: ctypes.c_int64,
    torch.float32: ctypes.c_float,
    torch.float64: ctypes.c_double,
}


def host_view(tensor: torch.Tensor) -> ctypes.Array:
    """The elements of CPU `tensor`, flattened in C order, as a ctypes array of Python
    bools, ints or floats (`len`, indexing and iteration as a list).

    A contiguous tensor of a dtype above is read in place: no aten op, no copy. Anything
    else (a strided view, float16, bfloat16, a lazy negation) is first copied to a
    contiguous float64 or int64 tensor: a few aten ops, still no host sync. The array
    keeps its tensor alive; it sees later writes to it.
    """
    if not tensor.is_cpu:
        raise ValueError(f"host_view: tensor.device: expected cpu; got {tensor.device}")
    ctype = _CTYPES.get(tensor.dtype)
    if ctype is None or not tensor.is_contiguous() or tensor.is_neg():
        wide = torch.float64 if tensor.is_floating_point() else torch.int64
        tensor = tensor.detach().resolve_neg().to(wide).contiguous()
        ctype = _CTYPES[wide]
    count = tensor.numel()
    view = (ctype * count).from_address(tensor.data_ptr()) if count else (ctype * 0)()
    view._tensor = tensor  # the memory it reads stays alive as long as the view
    return view


def host_item(tensor: torch.Tensor, index: int = 0) -> bool | int | float:
    """Element `index` of CPU `tensor`, which has at most one dim (0-d: index 0), or the
    element of any one-element tensor (index 0), as a Python bool, int or float. The
    caller keeps `index` in range (it is not checked).

    Reads the one element in place (any stride) for the dtypes `host_view` reads in
    place: no aten op, no copy; otherwise through `host_view`'s copy.
    """
    ctype = _CTYPES.get(tensor.dtype)
    if ctype is None or not tensor.is_cpu or tensor.is_neg():
        return host_view(tensor)[index]
    offset = index * tensor.stride(0) if tensor.dim() else 0
    return ctype.from_address(tensor.data_ptr() + offset * tensor.element_size()).value
