"""Build proof without a GPU: every kernel specialization the Triton dispatch launches compiles for sm_90
(H100/H200) and sm_100 (B200) with Triton's own ptxas, without register spills and without FMAs in the
SwiGLU math. Registers and shared memory per kernel are printed (``pytest -s``) and recorded in
docs/triton_backend.md.

Specializations: the dispatch's constexprs (dtype, optional inputs, tile, grouped or not) on contiguous,
16-byte aligned tensors with sizes that are multiples of 16 (Triton's fast path), plus one unaligned variant
per kernel (Triton re-specializes pointers and sizes on 16-byte divisibility).

Run by tests/test_triton_compile.py in a child pytest process: the CPU suite runs Triton in interpreter
mode, and Triton fixes the mode at import time.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from concurrent.futures import ProcessPoolExecutor

import pytest

assert os.environ.get("TRITON_INTERPRET") != "1", "compiling needs Triton's compiled mode"
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from swiglu_ops import triton as backend  # noqa: E402
from swiglu_ops.triton import _kernels  # noqa: E402

ARCHS = (90, 100)
_DTYPES = ("bf16", "fp16", "fp32")
_DIV16 = [["tt.divisibility", 16]]


def _attrs(fn, names):
    return {(fn.arg_names.index(name),): _DIV16 for name in names}


def _group_grad_specs():
    fn = _kernels.swiglu_group_grad_kernel
    for dt in _DTYPES:
        for has_weight in (False, True):
            for has_mask in (False, True):
                opt = {"w_ptr": "*fp32", "yo_ptr": f"*{dt}", "gw_ptr": "*fp32"} if has_weight else {}
                sig = {"dy_ptr": f"*{dt}", "x_ptr": f"*{dt}", "w_ptr": "constexpr", "yo_ptr": "constexpr",
                       "valid_ptr": "*i64" if has_mask else "constexpr", "gx_ptr": f"*{dt}",
                       "gw_ptr": "constexpr", "rows": "i32", "hidden": "i32", "clamp": "fp32", **opt,
                       "HAS_WEIGHT": "constexpr", "HAS_MASK": "constexpr", "ROWS": "constexpr",
                       "BLOCK_H": "constexpr", "PREFETCH": "constexpr", "HW_CVT": "constexpr"}  # fmt: skip
                consts = {k: None for k, v in sig.items() if v == "constexpr"}
                consts.update(
                    HAS_WEIGHT=has_weight,
                    HAS_MASK=has_mask,
                    ROWS=backend.GROUP_GRAD_ROWS,
                    BLOCK_H=backend.GROUP_GRAD_BLOCK_H,
                    PREFETCH=backend.GROUP_GRAD_PREFETCH,
                )
                ptrs = [k for k, v in sig.items() if v.startswith("*")]
                bf16_full = (dt, has_weight, has_mask) == ("bf16", True, True)
                for aligned, hw in (
                    ((True, False), (False, False), (True, True)) if bf16_full else ((True, False),)
                ):
                    name = f"group_grad[{dt},w={int(has_weight)},mask={int(has_mask)}"
                    name += ("" if aligned else ",unaligned") + (",hw_cvt]" if hw else "]")
                    attrs = _attrs(fn, [*ptrs, "hidden"]) if aligned else {}
                    yield name, fn, sig, {**consts, "HW_CVT": hw}, attrs, backend.GROUP_GRAD_NUM_WARPS


def _mx_specs():
    fn = _kernels.swiglu_bwd_mx_quant_kernel
    # E4M3 + RCEIL (the defaults) for every dtype; the other FP8 format and scale rule are constexprs too
    # (they pick the hardware cvt and the scale formula), compiled once each on bf16.
    combos = [(dt, grouped, False, 1) for dt in _DTYPES for grouped in (False, True)]
    combos += [("bf16", True, True, 1), ("bf16", False, False, 0)]
    for dt, grouped, e5m2, scale_alg in combos:
        sig = {"x_ptr": f"*{dt}", "dy_ptr": f"*{dt}", "ends_ptr": "*i64" if grouped else "constexpr",
               "y1_ptr": "*u8", "s1_ptr": "*u8", "y2_ptr": "*u8", "s2_ptr": "*u8",
               "m": "i32", "n": "i32", "num_groups": "i32", "blocks_per_slice": "i32", "s2_rows": "i32",
               "a_col": "i32", "inv_max": "fp32", "emax": "i32", "mbits": "i32",
               "bias": "i32", "max_code": "i32",
               "GROUPED": "constexpr", "BLOCK_N": "constexpr", "GROUP_CHUNK": "constexpr",
               "E5M2": "constexpr", "SCALE_ALG": "constexpr", "HW_CVT": "constexpr"}  # fmt: skip
        consts = {k: None for k, v in sig.items() if v == "constexpr"}
        ptrs = [k for k, v in sig.items() if v.startswith("*")]
        variant = ("" if not e5m2 else ",e5m2") + ("" if scale_alg else ",floor")
        # The integer conversions (the default) everywhere; the opt-in hardware conversions (HW_CVT) on the
        # aligned bf16 variants.
        cases = [(True, False), (True, True)] if dt == "bf16" else [(True, False)]
        if (dt, grouped, variant) == ("bf16", True, ""):
            cases.append((False, False))
        for aligned, hw in cases:
            name = f"bwd_mx_quant[{dt},grouped={int(grouped)}{variant}"
            name += ("" if aligned else ",unaligned") + (",hw_cvt]" if hw else "]")
            attrs = _attrs(fn, [*ptrs, "n", "a_col"]) if aligned else {}
            # The launcher narrows the tile for tensors that are not 16-byte aligned.
            block_n = backend.MX_BLOCK_N if aligned else min(backend.MX_BLOCK_N, backend.MX_BLOCK_N_UNALIGNED)
            consts = {**consts, "GROUPED": grouped, "BLOCK_N": block_n, "GROUP_CHUNK": backend.MX_GROUP_CHUNK,
                      "E5M2": e5m2, "SCALE_ALG": scale_alg, "HW_CVT": hw}  # fmt: skip
            yield name, fn, sig, consts, attrs, backend.MX_NUM_WARPS


SPECS = {name: spec for name, *spec in (*_group_grad_specs(), *_mx_specs())}


def _compile(name: str, arch: int) -> dict:
    """Compile one specialization; returns its resources from ptxas's log and the PTX checks."""
    fn, sig, consts, attrs, num_warps = SPECS[name]
    triton.knobs.compilation.always_compile = True  # a cache hit would skip ptxas and its log
    triton.knobs.nvidia.dump_ptxas_log = True  # ptxas -v output, printed by Triton's compiler
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        kernel = triton.compile(
            ASTSource(fn, sig, consts, attrs),
            target=GPUTarget("cuda", arch, 32),
            options={"num_warps": num_warps, **backend.LAUNCH_OPTIONS},
        )
    usage = re.search(r"Used (\d+) registers", log.getvalue())
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log.getvalue())
    stack = re.search(r"(\d+) bytes stack frame", log.getvalue())
    ptx = kernel.asm["ptx"]
    return {
        "name": name, "arch": arch, "registers": int(usage.group(1)), "shared": kernel.metadata.shared,
        "spill_stores": int(spills.group(1)), "spill_loads": int(spills.group(2)),
        "stack": int(stack.group(1)), "num_warps": num_warps,
        # An FMA of the spec's math would be a non-flushing fp32 fma; libdevice's exp uses fma.rn.ftz only.
        "contracted_fma": len(re.findall(r"\bfma\.rn\.f32\b", ptx)),
        "approx_div": len(re.findall(r"\b(?:div|rcp)\.(?:full|approx)\.", ptx)),
        # The GPU paths (docs/triton_backend.md): rcp.rn in the sigmoid, hardware bf16 and FP8 conversions.
        "rcp_rn": len(re.findall(r"\brcp\.rn\.f32\b", ptx)),
        "cvt_fp8": len(re.findall(r"\bcvt\.rn\.satfinite\.e[45]m[23]x2\.f32\b", ptx)),
        "ftz_arith": len(re.findall(r"\b(?:mul|add|sub)\.\w+\.ftz\.f32\b", ptx)),
    }  # fmt: skip


@pytest.fixture(scope="module")
def compiled():
    jobs = [(name, arch) for name in SPECS for arch in ARCHS]
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        results = list(pool.map(_compile, *zip(*jobs, strict=True)))
    print(f"\n{'kernel':<48} {'sm':>4} {'warps':>5} {'regs':>5} {'spill':>6} {'smem':>6}")
    for r in results:
        print(f"{r['name']:<48} {r['arch']:>4} {r['num_warps']:>5} {r['registers']:>5} "
              f"{r['spill_stores'] + r['spill_loads']:>6} {r['shared']:>6}")  # fmt: skip
    return results


def test_every_specialization_compiles_without_spills(compiled):
    assert len(compiled) == len(SPECS) * len(ARCHS)
    spilled = [
        (r["name"], r["arch"]) for r in compiled if r["spill_stores"] or r["spill_loads"] or r["stack"]
    ]
    assert not spilled, f"register spills: {spilled}"
    # Occupancy floor on the fast path: at least two CTAs fit the 64K registers of an SM.
    heavy = [(r["name"], r["arch"], r["registers"]) for r in compiled
             if "unaligned" not in r["name"] and r["registers"] * r["num_warps"] * 32 > 32768]  # fmt: skip
    assert not heavy, f"too many registers: {heavy}"


def test_swiglu_math_is_not_contracted(compiled):
    """Spec: every multiply and add rounds separately, the sigmoid divides exactly, nothing flushes."""
    bad = [
        (r["name"], r["arch"]) for r in compiled if r["contracted_fma"] or r["approx_div"] or r["ftz_arith"]
    ]
    assert not bad, f"fma / approximate division / ftz arithmetic in: {bad}"


def test_conversion_paths_follow_hw_cvt(compiled):
    """With HW_CVT (opt-in) every kernel divides with rcp.rn.f32 and the quantizer encodes FP8 with the
    hardware satfinite cvt; without it (the default) neither instruction appears: the integer paths run."""
    hw = [r for r in compiled if "hw_cvt" in r["name"]]
    assert {r["name"].split("[")[0] for r in hw} == {"group_grad", "bwd_mx_quant"}
    assert all(r["rcp_rn"] for r in hw), [r["name"] for r in hw if not r["rcp_rn"]]
    no_cvt = [r["name"] for r in hw if r["name"].startswith("bwd_mx") and not r["cvt_fp8"]]
    assert not no_cvt, f"no hardware FP8 cvt in: {no_cvt}"
    default = [r for r in compiled if "hw_cvt" not in r["name"]]
    assert not [r["name"] for r in default if r["rcp_rn"] or r["cvt_fp8"]]


def test_fma_check_can_fail():
    """The PTX check above does see contraction when the launch options allow it."""
    fn, sig, consts, attrs, num_warps = SPECS["group_grad[bf16,w=0,mask=0]"]
    kernel = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": num_warps, "enable_fp_fusion": True})  # fmt: skip
    assert re.search(r"\bfma\.rn\.f32\b", kernel.asm["ptx"])
