"""torchao hand-off: the dual-axis MX operators' outputs as torchao ``MXTensor`` s, sharing the data's storage
(optional dependency: ``pip install "swiglu-ops[torchao]"``; written against torchao 0.18.0).

torchao 0.18's ``MXTensor`` (``torchao/prototype/mx_formats/mx_tensor.py``) holds ``qdata`` (FP8 codes, or
FP4 as packed ``uint8`` with element ``2j`` in the low nibble: the operators' packing), ``scale``
(``float8_e8m0fnu``) and ``block_size`` (32). Its blocks always run along the **memory-contiguous** axis:
``dequantize()`` takes ``qdata`` contiguous (blocks along the last dim, ``scale [rows, K/32]``) or the plain
transpose of a contiguous tensor (then everything is transposed back first); any other strides fail its
assertions, in ``dequantize()`` and in both matmul paths. Scales are plain (``is_swizzled_scales=False``,
scale ``[rows, K/32]``) or the cuBLAS blocked layout (``True``: the blocked bytes viewed as
``[ceil(rows/128)*32, ceil(K/128)*16]``).

- :func:`rowwise_mxtensor`: ``y1`` with ``mxscale1`` (hidden-axis blocks): ``qdata`` **is** ``y1`` (FP4:
  ``y1.view(torch.uint8)``, the same bytes). Plain scales are a view of ``mxscale1`` when ``N % 64 == 0``;
  otherwise the paired layout has a pad slot per row, the plain ``[M, N/32]`` is a strided view that torchao's
  real GEMM path cannot ``.view()``, so it is copied (``M * N/32`` bytes). Blocked scales are computed
  (:func:`~swiglu_ops.training.layouts.mxscale1_to_blocked`), hence new.
- :func:`tokenwise_mxtensor`: the token-axis output written with ``transpose_y2=True`` (``y2t [N, M]``,
  token-contiguous) as one ``MXTensor [N, M]`` whose blocks run along its last dim (the tokens): ``qdata``
  **is** ``y2t``. Every group must have a multiple of 32 rows (then the groups' blocks are torchao's uniform
  32-blocks along M). Scales: gathered from ``mxscale2`` (it has pad rows per group), a new ``[N, M/32]``.
- :func:`tokenwise_mxtensors`: one ``MXTensor [N, n_g]`` per group: ``qdata = y2t[:, start:end]``, a view.
  That view is contiguous only for a group that holds all M rows (or none), so with several non-empty groups
  torchao cannot read it: a ValueError, unless ``copy_data=True``, which copies each such group's data into a
  contiguous ``[N, n_g]`` (also the only way for CANN's ``[M, N]`` y2, whose token-axis blocks run along its
  strided axis: ``transposed=False``).

What cannot be wrapped raises ValueError: ``N % 32 != 0`` (torchao has no partial last block: its
``dequantize`` cuts the rows into whole 32-element blocks), a group whose rows are not a multiple of 32, the
E1M2 format (``uint8`` results; not a torchao element type) and FP4 ``y2`` (packed along the hidden axis, not
along its blocks). The token-axis wrappers read ``group_index`` on the host (a device synchronisation for a
GPU tensor): the groups' sizes decide the views' shapes.

``dequantize()`` of each result equals :func:`swiglu_ops.mx_dequantize` bitwise (same dtype; for a group, the
transpose of its rows). torchao's emulated MX matmul (``kernel_preference=KernelPreference.EMULATED``, the
default here: ``torch.mm(a, b)`` on MXTensors dequantizes both to ``orig_dtype`` and multiplies) runs on CPU;
``KernelPreference.AUTO`` is its CUDA path (``torch._scaled_mm`` for FP8, ``F.scaled_mm`` for FP4: MX block
scaling, a Blackwell-class GPU; not run here). See ``docs/integration.md`` section 15.
"""

from __future__ import annotations

import torch
from torchao.prototype.mx_formats.mx_tensor import MXTensor
from torchao.quantization.quantize_.common import KernelPreference

from ..numerics import mx
from ..numerics.mx import BLOCK
from ..ops import validate as V
from ..training import layouts

__all__ = ["rowwise_mxtensor", "tokenwise_mxtensor", "tokenwise_mxtensors", "KernelPreference"]

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_FP4 = torch.float4_e2m1fn_x2


def _ceil_div(n: int, k: int) -> int:
    return -(-n // k)


def _qdata(name: str, data: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
    """torchao's ``(qdata, elem_dtype)`` of an operator output: FP8 as is, FP4 as its uint8 bytes (a view)."""
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(data).__name__}")
    if data.dtype in _FP8:
        return data, data.dtype
    if data.dtype == _FP4:
        return data.view(torch.uint8), _FP4
    raise ValueError(
        f"{name} must be float8_e4m3fn, float8_e5m2 or float4_e2m1fn_x2 (torchao's MX element types), got "
        f"{data.dtype}" + (" (E1M2 or raw codes: torchao has no E1M2)" if data.dtype == torch.uint8 else "")
    )


def _scale_dtype(name: str, scale: torch.Tensor) -> None:
    if not isinstance(scale, torch.Tensor) or scale.dtype not in (torch.float8_e8m0fnu, torch.uint8):
        raise TypeError(f"{name} must be a float8_e8m0fnu (or uint8) tensor")


def _swizzled(plain: torch.Tensor) -> torch.Tensor:
    """``[rows, K/32]`` plain scales -> torchao's swizzled ``[ceil(rows/128)*32, ceil(K/128)*16]`` (a view of
    the blocked layout, which has the same bytes)."""
    rows, cols = plain.shape
    blocked = layouts.to_blocked(plain)
    return blocked.view(_ceil_div(rows, 128) * 32, _ceil_div(cols, 4) * 16)


def _check_options(kernel_preference, **flags) -> None:
    """The wrappers' options, before anything is read: each flag a bool (a string would be taken for its
    truth), ``kernel_preference`` None or a torchao ``KernelPreference`` (another value failed only later,
    inside torchao's matmul)."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    if kernel_preference is not None and not isinstance(kernel_preference, KernelPreference):
        raise TypeError(
            f"kernel_preference must be a torchao KernelPreference or None, got {kernel_preference!r}"
        )


def _make(qdata, scale, elem_dtype, orig_dtype, kernel_preference, swizzled) -> MXTensor:
    if orig_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"orig_dtype must be bfloat16, float16 or float32, got {orig_dtype}")
    kp = KernelPreference.EMULATED if kernel_preference is None else kernel_preference
    scale = scale.view(torch.float8_e8m0fnu)
    return MXTensor(qdata, scale, elem_dtype, BLOCK, orig_dtype, kp, None, swizzled)


def rowwise_mxtensor(
    y1: torch.Tensor,
    mxscale1: torch.Tensor,
    *,
    orig_dtype: torch.dtype = torch.bfloat16,
    blocked: bool = False,
    kernel_preference: KernelPreference | None = None,
) -> MXTensor:
    """``y1 [..., M, N]`` (FP4: ``[..., M, N/2]``) and ``mxscale1 [..., M, ceil(N/64), 2]`` as a torchao
    ``MXTensor`` of shape ``[..., M, N]`` (blocks of 32 along N), ``qdata`` sharing ``y1``'s storage.

    Args:
        orig_dtype: the MXTensor's dtype (what ``dequantize()`` and the emulated matmul produce).
        blocked: scales in the cuBLAS blocked layout (``is_swizzled_scales=True``; 2-D ``y1`` only), what
            torchao's real GEMM reads without converting.
        kernel_preference: torchao's ``KernelPreference`` (default ``EMULATED``, the one that runs on CPU).

    Scales: a view of ``mxscale1`` when plain and ``N % 64 == 0``; otherwise new (see the module doc).
    """
    _check_options(kernel_preference, blocked=blocked)
    qdata, elem = _qdata("y1", y1)
    _scale_dtype("mxscale1", mxscale1)
    if y1.dim() < 2 or not y1.is_contiguous():
        raise ValueError(f"y1 must be a contiguous operator output of rank >= 2, got shape {tuple(y1.shape)}")
    n = y1.shape[-1] * (2 if elem == _FP4 else 1)
    if n % BLOCK:
        raise ValueError(
            f"N = {n} is not a multiple of {BLOCK}: torchao's MXTensor has no partial last block "
            "(mx_dequantize handles it)"
        )
    expected = mx.mxscale1_shape((*y1.shape[:-1], n))
    if tuple(mxscale1.shape) != expected:
        raise ValueError(
            f"mxscale1 must have shape {expected} for y1 of shape {tuple(y1.shape)}, got "
            f"{tuple(mxscale1.shape)}"
        )
    plain = layouts.mxscale1_to_plain(mxscale1, n)  # a view; strided when N % 64 == 32
    if blocked:
        if y1.dim() != 2:
            raise ValueError("blocked=True needs 2-D y1 (torchao's swizzled scales are per matrix)")
        scale = _swizzled(plain)
    else:
        scale = plain.contiguous()  # no copy when N % 64 == 0
    return _make(qdata, scale, elem, orig_dtype, kernel_preference, blocked)


def _group_bounds(group_index, m: int) -> list[tuple[int, int]]:
    """``[(start, end)]`` per group, read on the host and checked as the operators check them."""
    if group_index is None:
        return [(0, m)]
    V.check_group_index(group_index, V.ENDS)
    ends = group_index.cpu()  # the views' shapes need the values on the host
    V.check_group_ends(ends, m)
    return mx.clamp_group_ends(ends, m)  # checked: the clamp changes nothing


def _check_y2(y2, mxscale2, transposed: bool) -> tuple[torch.Tensor, torch.dtype, int, int]:
    if isinstance(y2, torch.Tensor) and y2.dtype == _FP4:
        raise ValueError(
            "FP4 y2 cannot be wrapped: it is packed along the hidden axis, torchao packs along the blocks"
        )
    qdata, elem = _qdata("y2", y2)
    _scale_dtype("mxscale2", mxscale2)
    if y2.dim() != 2 or not y2.is_contiguous():
        raise ValueError(f"y2 must be a contiguous 2-D operator output, got shape {tuple(y2.shape)}")
    if mxscale2.dim() != 3 or mxscale2.shape[-1] != 2:
        raise ValueError(f"mxscale2 must have shape [R, N, 2], got {tuple(mxscale2.shape)}")
    n = mxscale2.shape[1]
    m = y2.shape[1] if transposed else y2.shape[0]
    if (y2.shape[0] if transposed else y2.shape[1]) != n:
        hint = (
            " (a [M, N] y2? write it with transpose_y2=True, or give it to tokenwise_mxtensors with "
            "transposed=False, copy_data=True)"
            if transposed
            else " (was y2 written with transpose_y2=True? then pass transposed=True)"
        )
        raise ValueError(
            f"y2 of shape {tuple(y2.shape)} does not match mxscale2's N = {n}: expected "
            f"{'[N, M]' if transposed else '[M, N]'}{hint}"
        )
    return qdata, elem, m, n


def _check_square_layout(tokens_last: torch.Tensor, blocks: torch.Tensor, elem: torch.dtype) -> None:
    """A square y2 (M == N) cannot tell its layout by shape, so check it against the scales: in the
    operators' outputs every block with a finite scale above the smallest (codes 1..254) holds a code of at
    least half the format's largest value (OCP scales put the block's amax at or above 2**emax, RCEIL ones
    above max / 2). ``tokens_last`` ``[N, M]`` is the data as the call reads it, ``blocks`` ``[M/32, N]``
    the scale codes of its 32-token blocks. Reads the data once and synchronises with the host; only for
    M == N."""
    n, m = tokens_last.shape
    half = mx.format_of_dtype(elem).max_value / 2
    amax = tokens_last.view(elem).float().abs().reshape(n, m // BLOCK, BLOCK).amax(-1)  # [N, M/32]
    codes = blocks.view(torch.uint8).t()
    wrong = (codes > 0) & (codes < 255) & (amax < half)
    if bool(wrong.any()):
        raise ValueError(
            f"y2 does not fit mxscale2: {int(wrong.sum())} of its 32-token blocks hold no code near their "
            "scale's range, so it is not in the layout this call reads (with M == N the shapes cannot tell "
            "CANN's [M, N] y2 from the [N, M] one that transpose_y2=True writes)"
        )


def _whole_blocks(bounds, what: str) -> None:
    for g, (s, e) in enumerate(bounds):
        if (e - s) % BLOCK:
            raise ValueError(
                f"group {g} has {e - s} rows, not a multiple of {BLOCK}: torchao's MXTensor needs whole "
                f"{BLOCK}-token blocks {what} (mx_dequantize handles partial blocks)"
            )


def tokenwise_mxtensor(
    y2t: torch.Tensor,
    mxscale2: torch.Tensor,
    group_index: torch.Tensor | None = None,
    *,
    orig_dtype: torch.dtype = torch.bfloat16,
    blocked: bool = False,
    kernel_preference: KernelPreference | None = None,
) -> MXTensor:
    """The token-axis output of all groups as one ``MXTensor [N, M]`` (blocks of 32 tokens along its last
    dim), ``qdata`` = ``y2t`` itself: ``y2t [N, M]`` is the FP8 ``y2`` written with ``transpose_y2=True``.

    Every group's row count must be a multiple of 32 (then its blocks are torchao's 32-blocks along M; an
    empty group is fine). This is the wgrad GEMM's ``A`` operand (``dW = y2t @ dY``, K = tokens) when one
    GEMM covers all tokens; per expert, use :func:`tokenwise_mxtensors`. Scales are new (``[N, M/32]``
    gathered from ``mxscale2``, or blocked with ``blocked=True``).

    A CANN ``[M, N]`` y2 is refused by its shape; when M == N the shapes cannot tell, and the data is checked
    against the scales instead (one read of it and a host synchronisation, only then).
    """
    _check_options(kernel_preference, blocked=blocked)
    qdata, elem, m, n = _check_y2(y2t, mxscale2, transposed=True)
    bounds = _group_bounds(group_index, m)
    _whole_blocks(bounds, "(one MXTensor over all groups)")
    plain = layouts.mxscale2_to_plain(mxscale2, m, group_index)[: m // BLOCK]  # [M/32, N]
    if m == n:
        _check_square_layout(qdata, plain, elem)
    plain = plain.t()  # [N, M/32]
    scale = _swizzled(plain) if blocked else plain.contiguous()
    return _make(qdata, scale, elem, orig_dtype, kernel_preference, blocked)


def tokenwise_mxtensors(
    y2: torch.Tensor,
    mxscale2: torch.Tensor,
    group_index: torch.Tensor | None = None,
    *,
    transposed: bool = True,
    copy_data: bool = False,
    orig_dtype: torch.dtype = torch.bfloat16,
    blocked: bool = False,
    kernel_preference: KernelPreference | None = None,
) -> list[MXTensor]:
    """One ``MXTensor [N, n_g]`` per group (blocks of 32 tokens along its last dim): the token-axis operand
    of group ``g``'s wgrad GEMM (``dW_g = y2[start:end].T @ dY_g``).

    Args:
        y2: the FP8 token-axis output: ``[N, M]`` written with ``transpose_y2=True`` (``transposed=True``,
            the default) or CANN's ``[M, N]`` (``transposed=False``, needs ``copy_data=True``).
        mxscale2, group_index: as the operator returned / took them (None: one group).
        copy_data: allow copying a group's data when torchao cannot read it in place (see below).
        orig_dtype, blocked, kernel_preference: as :func:`rowwise_mxtensor`.

    Group ``g``'s ``qdata`` is ``y2[:, start:end]`` (same storage) when that view is contiguous (the group
    holds all M rows, or none); otherwise (several non-empty groups, or ``transposed=False``) torchao's
    MXTensor cannot read it in place and this raises ValueError, unless ``copy_data=True``: then that
    group's data is copied into a contiguous ``[N, n_g]``. Each group's rows must be a multiple of 32.
    Scales are new (each group's ``[N, n_g/32]``).
    """
    _check_options(kernel_preference, transposed=transposed, copy_data=copy_data, blocked=blocked)
    qdata, elem, m, n = _check_y2(y2, mxscale2, transposed)
    bounds = _group_bounds(group_index, m)
    _whole_blocks(bounds, "per group")
    plain = layouts.mxscale2_to_plain(mxscale2, m, group_index)  # [P, N]: the groups' blocks in order
    if m == n:
        _check_square_layout(qdata if transposed else qdata.t(), plain[: m // BLOCK], elem)
    out, block = [], 0
    for g, (s, e) in enumerate(bounds):
        data = qdata[:, s:e] if transposed else qdata[s:e].t()
        if not data.is_contiguous():
            if not copy_data:
                raise ValueError(
                    f"group {g} (rows {s}:{e} of {m}) is a strided view of y2 that torchao's MXTensor cannot "
                    "read (it needs contiguous qdata with the blocks along the last dim"
                    + ("" if transposed else "; CANN's [M, N] y2 has its token blocks along the strided axis")
                    + "): pass copy_data=True to copy the group's data, or use tokenwise_mxtensor for one "
                    "MXTensor over all groups"
                )
            data = data.contiguous()
        nb = (e - s) // BLOCK
        group_scale = plain[block : block + nb].t()  # [N, n_g/32]
        block += nb
        scale = _swizzled(group_scale) if blocked else group_scale.contiguous()
        out.append(_make(data, scale, elem, orig_dtype, kernel_preference, blocked))
    return out
