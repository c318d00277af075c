"""Build proof without a GPU: every kernel specialization the Triton dispatch launches compiles for sm_90
(H100/H200) and sm_100 (B200) with Triton's own ptxas, without register spills and without FMAs in the
SwiGLU math. Registers and shared memory per kernel are printed (``pytest -s``) and recorded in
docs/triton_backend.md.

Specializations: every value of every constexpr the dispatch sets (dtype, optional inputs, tile, grouped
or not, direction, layout, clipped variant and clamp_mode, element format, scale rule, round mode, y2
layout, HW_CVT),
each at least once, on contiguous, 16-byte aligned tensors with sizes that are multiples of 16 (Triton's
fast path), plus unaligned variants (Triton re-specializes pointers and sizes on 16-byte divisibility) at the
launchers' options for them (narrow MX tile, no register budget).

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

from swiglu_ops.backends import triton as backend  # noqa: E402
from swiglu_ops.backends.triton import _kernels  # noqa: E402

ARCHS = (90, 100)
_DTYPES = ("bf16", "fp16", "fp32")
_DIV16 = [["tt.divisibility", 16]]
#: The approximate quotient's quarter-scaled denominator (``_kernels._QUOTIENT_APPROX``), which tells its
#: asm block from the backward's fast reciprocal (both use ``rcp.approx.ftz.f32``).
_QUARTER = "0f3E800000, 0f3E800000"
assert _QUARTER in _kernels._QUOTIENT_APPROX.value


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
                    expect = {"fast_rcp"} | ({"cvt_bf16"} if dt == "bf16" else set())
                    options = {"num_warps": backend.GROUP_GRAD_NUM_WARPS,
                               "maxnreg": backend.group_grad_maxnreg(aligned)}  # fmt: skip
                    yield name, fn, sig, {**consts, "HW_CVT": hw}, attrs, options, expect if hw else set()


def _mx_bwd_specs():
    fn = _kernels.swiglu_bwd_mx_quant_kernel
    # E4M3 + RCEIL + CANN's plain chunked SwiGLU (the defaults) for every dtype; the other FP8 format and
    # scale rule are constexprs too (they pick the hardware cvt and the scale formula), compiled once each
    # on bf16; the GLU variants (interleaved layout, clipped stage 1) on every dtype (grouped).
    plain = [(dt, grouped, False, 1, False, False) for dt in _DTYPES for grouped in (False, True)]
    combos = plain + [("bf16", True, True, 1, False, False), ("bf16", False, False, 0, False, False)]
    combos += [("bf16", True, False, 1, True, False), ("bf16", True, False, 1, False, True)]
    combos += [(dt, True, False, 1, True, True) for dt in _DTYPES]
    combos = [(*c, False) for c in combos]
    combos += [("bf16", True, False, 1, False, False, True)]
    combos += [(dt, True, False, 1, True, True, True) for dt in _DTYPES]
    # The padding's select (PAD_SELECT: infinite alpha or bias, swiglu_ops.triton.padding) once; GPT-OSS's
    # parameters and the plain GLU launch without it.
    combos = [(*c, False) for c in combos] + [("bf16", True, False, 1, True, True, False, True)]
    # The clipped variants with GPT-OSS's finite limit key the fast reciprocal by its operand (DEN_KEY,
    # swiglu_ops.triton.den_key); an infinite limit or a negative alpha once without it.
    combos = [(*c, c[5]) for c in combos] + [("bf16", True, False, 1, True, True, False, False, False)]
    for dt, grouped, e5m2, scale_alg, inter, clipped, transpose, pad_select, den_key in combos:
        sig = {"x_ptr": f"*{dt}", "dy_ptr": f"*{dt}", "ends_ptr": "*i64" if grouped else "constexpr",
               "y1_ptr": "*u8", "s1_ptr": "*u8", "y2_ptr": "*u8", "s2_ptr": "*u8",
               "w_ptr": "constexpr", "gw_ptr": "constexpr",
               "m": "i32", "n": "i32", "num_groups": "i32", "blocks_per_slice": "i32", "s2_rows": "i32",
               "alpha": "fp32", "limit": "fp32", "glu_bias": "fp32",
               "inv_max": "fp32", "emax": "i32", "mbits": "i32",
               "n_tiles": "i32", "tiles_per_program": "i32",
               "A_INDEX": "constexpr", "PAD_SELECT": "constexpr", "PLAIN_LOADS": "constexpr",
               **dict.fromkeys(("GROUPED", "BLOCK_N", "GROUP_CHUNK", "INTERLEAVED", "CLIPPED", "MODE", "E5M2",
                                "SCALE_ALG", "TRANSPOSE_Y2", "WIDE", "DEN_KEY", "HW_CVT", "HAS_WEIGHT",
                                "GW_DIRECT", "ROW_VEC"), "constexpr")}  # fmt: skip
        variant = ("" if not e5m2 else ",e5m2") + ("" if scale_alg else ",floor")
        variant += (",interleaved" if inter else "") + (",clipped" if clipped else "")
        variant += ",abs_key" if clipped and not den_key else ""
        variant += (",transpose_y2" if transpose else "") + (",pad_select" if pad_select else "")
        # The integer conversions (the default) everywhere; the opt-in hardware conversions (HW_CVT) on the
        # aligned bf16 variants.
        cases = [(True, False, False), (True, True, False)] if dt == "bf16" else [(True, False, False)]
        if dt == "bf16" and grouped and variant in ("", ",interleaved,clipped"):
            cases.append((False, False, False))
        if dt == "bf16" and grouped and variant == "":  # HW_CVT unaligned: codes selected per element
            cases.append((False, True, False))
        # The routing weight (HAS_WEIGHT, grad_weight over several programs), aligned: the grouped plain GLU
        # in bf16 (also HW_CVT) and fp32 (the most registers), the grouped GPT-OSS GLU in bf16 (narrow tile).
        if grouped and dt in ("bf16", "fp32") and variant == "":
            cases += [(True, False, True)] + ([(True, True, True)] if dt == "bf16" else [])
        if grouped and dt == "bf16" and variant == ",interleaved,clipped":
            cases += [(True, False, True)]
        for aligned, hw, weighted in cases:
            wsig = {**sig, "w_ptr": "*fp32", "gw_ptr": "*fp32"} if weighted else sig
            ptrs = [k for k, v in wsig.items() if v.startswith("*")]
            name = f"bwd_mx_quant[{dt},grouped={int(grouped)}{variant}" + (",weight" if weighted else "")
            name += ("" if aligned else ",unaligned") + (",hw_cvt]" if hw else "]")
            attrs = _attrs(fn, [*ptrs, "n"]) if aligned else {}
            plain = aligned and not pad_select  # PLAIN_LOADS
            block_n = backend.mx_block_n(  # the launcher's tile
                True, aligned, transpose, hw, interleaved=inter, clipped=clipped, plain=plain,
                weighted=weighted,
            )  # fmt: skip
            consts = {k: None for k, v in wsig.items() if v == "constexpr"}
            consts.update(A_INDEX=0, PAD_SELECT=pad_select, PLAIN_LOADS=plain,
                          GROUPED=grouped, BLOCK_N=block_n,
                          GROUP_CHUNK=backend.MX_GROUP_CHUNK,
                          INTERLEAVED=inter, CLIPPED=clipped, MODE=0, E5M2=e5m2, SCALE_ALG=scale_alg,
                          TRANSPOSE_Y2=transpose, WIDE=False, DEN_KEY=den_key, HW_CVT=hw,
                          HAS_WEIGHT=weighted, GW_DIRECT=False,
                          ROW_VEC=backend.row_vec(16 if aligned else 1, aligned, hw))  # fmt: skip
            expect = {"fast_rcp", "cvt_fp8"} | ({"cvt_bf16"} if dt == "bf16" else set())
            options = {"num_warps": backend.MX_NUM_WARPS, "maxnreg": backend.mx_maxnreg(aligned)}
            yield name, fn, wsig, consts, attrs, options, expect if hw else set()


# (format, scale_alg, round mode): the FP8 defaults, the other FP8 format and scale rule, FP4 in every round
# mode (E2M1 and E1M2 are the same code: their constants are runtime arguments).
_FWD_E4M3 = ("e4m3", 1, "rint")
_FWD_FORMATS = [("e5m2", 1, "rint"), ("e4m3", 0, "rint"), ("e2m1", 0, "rint"), ("e2m1", 0, "round"),
                ("e2m1", 0, "floor")]  # fmt: skip


def _mx_fwd_specs():
    fn = _kernels.swiglu_mx_quant_kernel
    combos = [(dt, grouped, _FWD_E4M3, False, False) for dt in _DTYPES for grouped in (False, True)]
    combos += [("bf16", True, f, False, False) for f in _FWD_FORMATS]
    combos += [(dt, True, ("e2m1", 0, "rint"), False, False) for dt in ("fp16", "fp32")]
    combos += [("bf16", True, _FWD_E4M3, True, False), ("bf16", True, _FWD_E4M3, False, True)]
    combos += [(dt, True, _FWD_E4M3, True, True) for dt in _DTYPES]
    combos += [("bf16", True, ("e2m1", 0, "floor"), True, True)]
    combos = [(*c, False) for c in combos] + [("bf16", True, _FWD_E4M3, False, False, True)]
    # The padding's select once (see _mx_bwd_specs).
    combos = [(*c, False) for c in combos] + [("bf16", True, _FWD_E4M3, True, True, False, True)]
    for dt, grouped, (fmt, scale_alg, mode), inter, clipped, transpose, pad_select in combos:
        sig = {"x_ptr": f"*{dt}", "ends_ptr": "*i64" if grouped else "constexpr",
               "y1_ptr": "*u8", "s1_ptr": "*u8", "y2_ptr": "*u8", "s2_ptr": "*u8", "w_ptr": "constexpr",
               "m": "i32", "n": "i32", "num_groups": "i32", "blocks_per_slice": "i32", "s2_rows": "i32",
               "s1_slots": "i32", "alpha": "fp32", "limit": "fp32", "glu_bias": "fp32", "b_pad_bits": "i32",
               "inv_max": "fp32", "emax": "i32", "mbits": "i32",
               "n_tiles": "i32", "tiles_per_program": "i32",
               "A_INDEX": "constexpr", "PAD_SELECT": "constexpr", "PLAIN_LOADS": "constexpr",
               **dict.fromkeys(("GROUPED", "BLOCK_N", "GROUP_CHUNK", "INTERLEAVED", "CLIPPED", "MODE", "FP4",
                                "E5M2", "SCALE_ALG", "ROUND", "TRANSPOSE_Y2", "WIDE", "HW_CVT", "HAS_WEIGHT",
                                "ROW_VEC", "SMALL_NUM"), "constexpr")}  # fmt: skip
        fp4 = fmt == "e2m1"
        variant = f",{fmt}" + (f",round={mode}" if fp4 else "" if scale_alg else ",floor")
        variant += (",interleaved" if inter else "") + (",clipped" if clipped else "")
        variant += (",transpose_y2" if transpose else "") + (",pad_select" if pad_select else "")
        cases = [(True, False)]
        if dt == "bf16" and grouped and (not fp4 or mode == "floor"):
            cases.append((True, True))
        if dt == "bf16" and grouped and (variant == ",e4m3" or (fp4 and inter)):
            cases.append((False, False))
        if dt == "bf16" and grouped and variant == ",e4m3":  # HW_CVT unaligned: codes selected per element
            cases.append((False, True))
        if dt == "fp32" and grouped and variant == ",e4m3":  # HW_CVT, the quotient's SMALL_NUM form
            cases.append((True, True))
        cases = [(aligned, hw, False) for aligned, hw in cases]
        # The routing weight (HAS_WEIGHT) in bf16: the grouped E4M3 plain GLU (also HW_CVT, and unaligned: the
        # masked loads' weight and column select) and the grouped GPT-OSS GLU.
        if grouped and dt == "bf16" and variant == ",e4m3":
            cases += [(True, False, True), (True, True, True), (False, False, True)]
        if grouped and dt == "bf16" and variant == ",e4m3,interleaved,clipped":
            cases += [(True, False, True)]
        for aligned, hw, weighted in cases:
            wsig = {**sig, "w_ptr": "*fp32"} if weighted else sig
            ptrs = [k for k, v in wsig.items() if v.startswith("*")]
            name = f"mx_quant[{dt},grouped={int(grouped)}{variant}" + (",weight" if weighted else "")
            name += ("" if aligned else ",unaligned") + (",hw_cvt]" if hw else "]")
            attrs = _attrs(fn, [*ptrs, "n"]) if aligned else {}
            block_n = backend.mx_block_n(False, aligned, transpose, hw)  # the launcher's tile
            consts = {k: None for k, v in wsig.items() if v == "constexpr"}
            consts.update(A_INDEX=0, PAD_SELECT=pad_select, PLAIN_LOADS=aligned and not pad_select,
                          GROUPED=grouped, BLOCK_N=block_n,
                          GROUP_CHUNK=backend.MX_GROUP_CHUNK, INTERLEAVED=inter, CLIPPED=clipped, MODE=0,
                          FP4=fp4, E5M2=fmt == "e5m2",
                          SCALE_ALG=scale_alg, ROUND=_kernels.ROUND_MODES[mode], TRANSPOSE_Y2=transpose,
                          WIDE=False, HW_CVT=hw, HAS_WEIGHT=weighted,
                          ROW_VEC=backend.row_vec(16 if aligned else 1, aligned, hw),
                          # the launcher's small_numerators: fp32 inputs (the specs' clipped limit is 7)
                          SMALL_NUM=hw and dt == "fp32")  # fmt: skip
            # FP4 codes have no hardware conversion; the forward's quotient is the approximate one.
            expect = {"approx_quotient"} | ({"cvt_bf16"} if dt == "bf16" else set())
            expect |= set() if fp4 else {"cvt_fp8"}
            options = {"num_warps": backend.MX_NUM_WARPS, "maxnreg": backend.mx_maxnreg(aligned)}
            yield name, fn, wsig, consts, attrs, options, expect if hw else set()


def _clipped_specs():
    fn = _kernels.clipped_swiglu_kernel
    combos = [(dt, bwd, inter, mode, True) for dt in _DTYPES for bwd in (False, True)
              for inter in (False, True) for mode in (0, 1)]  # fmt: skip
    combos += [("bf16", bwd, inter, 0, False) for bwd in (False, True) for inter in (False, True)]
    for dt, bwd, inter, mode, has_mask in combos:
        sig = {"x_ptr": f"*{dt}", "dy_ptr": f"*{dt}" if bwd else "constexpr",
               "valid_ptr": "*i64" if has_mask else "constexpr", "out_ptr": f"*{dt}",
               "rows": "i32", "half": "i32", "chunk0": "i32", "n_chunks": "i32",
               "alpha": "fp32", "limit": "fp32", "bias": "fp32",
               **dict.fromkeys(("A_INDEX", "BACKWARD", "INTERLEAVED", "MODE", "HAS_MASK", "ROWS", "BLOCK",
                                "CHUNKS", "DEN_KEY", "HW_CVT"), "constexpr")}  # fmt: skip
        ptrs = [k for k, v in sig.items() if v.startswith("*")]
        # The masked backward with GPT-OSS's finite limit (DEN_KEY); without a mask, the default infinite
        # limit (its key den + |A~|), on the fast path too.
        den_key = bwd and mode == 0 and has_mask
        cases = [(True, False)]
        if dt == "bf16" and has_mask and inter:
            cases += [(True, True)] + ([(False, False)] if mode == 0 else [])
        if dt == "bf16" and bwd and not has_mask and inter:
            cases += [(True, True)]
        for aligned, hw in cases:
            name = f"clipped_swiglu[{dt},{'bwd' if bwd else 'fwd'},mode={mode}"
            name += (",interleaved" if inter else "") + ("" if has_mask else ",no_mask")
            name += ("" if aligned else ",unaligned") + (",hw_cvt]" if hw else "]")
            attrs = _attrs(fn, [*ptrs, "half"]) if aligned else {}
            consts = {k: None for k, v in sig.items() if v == "constexpr"}
            consts.update(A_INDEX=0, BACKWARD=bwd, INTERLEAVED=inter, MODE=mode, HAS_MASK=has_mask,
                          DEN_KEY=den_key, ROWS=backend.CLIPPED_ROWS, BLOCK=backend.CLIPPED_BLOCK,
                          CHUNKS=backend.CLIPPED_CHUNKS, HW_CVT=hw)  # fmt: skip
            expect = ({"fast_rcp"} if bwd else set()) | ({"cvt_bf16"} if dt == "bf16" else set())
            options = {"num_warps": backend.CLIPPED_NUM_WARPS}
            yield name, fn, sig, consts, attrs, options, expect if hw else set()


SPECS = {
    name: spec
    for name, *spec in (*_group_grad_specs(), *_clipped_specs(), *_mx_fwd_specs(), *_mx_bwd_specs())
}


def spec_consts(name: str, hw_cvt: bool | None = None) -> dict:
    """The constexprs of one specialization, with ``HW_CVT`` overridden when ``hw_cvt`` is given (and the
    tile width that the launcher picks on that path: ``mx_block_n``)."""
    consts = SPECS[name][2]
    if hw_cvt is None:
        return consts
    consts = {**consts, "HW_CVT": hw_cvt}
    if name.startswith("mx_quant"):  # the launcher's quotient form (fp32 inputs; the specs' limit is 7)
        consts["SMALL_NUM"] = hw_cvt and name.startswith("mx_quant[fp32")
    if name.startswith(("mx_quant", "bwd_mx_quant")):  # the launcher's tile
        backward, aligned = name.startswith("bwd_"), ",unaligned" not in name
        consts["ROW_VEC"] = backend.row_vec(
            16 if aligned else 1, aligned, hw_cvt
        )  # aligned specs: n % 16 == 0
        consts["BLOCK_N"] = backend.mx_block_n(
            backward, aligned, consts["TRANSPOSE_Y2"], hw_cvt, interleaved=consts["INTERLEAVED"],
            clipped=consts["CLIPPED"], plain=consts["PLAIN_LOADS"], weighted=bool(consts.get("HAS_WEIGHT")),
        )  # fmt: skip
    return consts


def compile_spec(name: str, arch: int, hw_cvt: bool | None = None):
    """Compile one specialization (with ``HW_CVT`` overridden when ``hw_cvt`` is given): the compiled kernel
    and its resources from ptxas's ``-v`` log (registers, spill bytes, stack frame) and metadata (shared
    memory). Also used by benchmarks/sass_budget.py."""
    fn, sig, _consts, attrs, options, _expect = SPECS[name]
    consts = spec_consts(name, hw_cvt)
    triton.knobs.compilation.always_compile = True  # a cache hit would skip ptxas and its log
    triton.knobs.nvidia.dump_ptxas_log = True  # ptxas -v output, printed by Triton's compiler
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        kernel = triton.compile(
            ASTSource(fn, sig, consts, attrs),
            target=GPUTarget("cuda", arch, 32),
            options={**options, **backend.LAUNCH_OPTIONS},
        )
    usage = re.search(r"Used (\d+) registers", log.getvalue())
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log.getvalue())
    stack = re.search(r"(\d+) bytes stack frame", log.getvalue())
    return kernel, {
        "registers": int(usage.group(1)), "shared": kernel.metadata.shared,
        "spill_stores": int(spills.group(1)), "spill_loads": int(spills.group(2)),
        "stack": int(stack.group(1)),
    }  # fmt: skip


#: A line of the kernels' own PTX that only the masked row-wise FP8 conversion holds (_cvt_fp8x4_asm).
_MASKED_CVT = "setp.eq.u32 p, $5, 255"


def _four_columns_a_thread(layout: str) -> bool:
    """Whether a blocked layout gives each thread runs of at least four consecutive elements of the last
    (column) axis, which is also its fastest: then every four consecutive registers the asm packs are four
    columns of one 32-column block."""
    m = re.search(r"sizePerThread = \[([\d, ]+)\].*order = \[([\d, ]+)\]", layout)
    if m is None or not layout.startswith("#ttg.blocked"):
        return False
    size = [int(v) for v in m.group(1).split(",")]
    order = [int(v) for v in m.group(2).split(",")]
    return order[0] == len(size) - 1 and size[-1] >= 4 and size[-1] % 4 == 0


def _compile(name: str, arch: int) -> dict:
    """Compile one specialization; returns its resources from ptxas's log and the PTX checks."""
    _fn, _sig, _consts, _attrs, options, expect = SPECS[name]
    kernel, res = compile_spec(name, arch)
    ptx = kernel.asm["ptx"]
    # The kernels' own PTX (inline asm) is checked by what it is; the compiler's code must not contract,
    # approximate or flush anything.
    asm = re.findall(r"// begin inline asm(.*?)// end inline asm", ptx, flags=re.S)
    own = re.sub(r"// begin inline asm.*?// end inline asm", "", ptx, flags=re.S)
    # The row-wise FP8 conversion that zeroes four codes by the first one's block (ROW_VEC): the register
    # layout of each of its fp32 operands, which must put four consecutive columns of a row in a thread
    ttgir = kernel.asm["ttgir"]
    layouts = dict(re.findall(r"^(#\w+) = (.*)$", ttgir, flags=re.M))
    masked = [
        layouts[m.group(1)]
        for line in ttgir.splitlines()
        if _MASKED_CVT in line
        for m in [re.search(r"tensor<[0-9x]+xf32, (#\w+)>", line)]
    ]
    return {
        "name": name, "arch": arch, **res, "num_warps": options["num_warps"],
        # An FMA of the spec's math would be a non-flushing fp32 fma; libdevice's exp uses fma.rn.ftz only.
        "contracted_fma": len(re.findall(r"\bfma\.rn\.f32\b", own)),
        "approx_div": len(re.findall(r"\b(?:div|rcp)\.(?:full|approx)\.", own)),
        "ftz_arith": len(re.findall(r"\b(?:mul|add|sub)\.\w+\.ftz\.f32\b", own)),
        # The GPU paths (docs/triton_backend.md): the fast reciprocals and quotients of the backward
        # (_rcp_fast_x4 / _div_fast_x4: rcp.approx + Newton + Markstein), hardware bf16 and FP8 conversions.
        "fast_rcp": sum("rcp.approx.ftz.f32" in block and _QUARTER not in block for block in asm),
        # The MX forward's approximate quotient (_QUOTIENT_APPROX: the quarter-scaled denominator).
        "approx_quotient": sum("rcp.approx.ftz.f32" in block and _QUARTER in block for block in asm),
        "cvt_fp8": len(re.findall(r"\bcvt\.rn\.satfinite\.e[45]m[23]x2\.f32\b", ptx)),
        "cvt_bf16": len(re.findall(r"\bcvt\.rn\.bf16(?:x2)?\.f32\b", ptx)),
        "masked_cvt": len(masked),
        "masked_cvt_scattered": [lay for lay in masked if not _four_columns_a_thread(lay)],
        "expect": sorted(expect),
    }  # fmt: skip


@pytest.fixture(scope="module")
def compiled():
    jobs = [(name, arch) for name in SPECS for arch in ARCHS]
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        results = list(pool.map(_compile, *zip(*jobs, strict=True)))
    print(f"\n{'kernel':<64} {'sm':>4} {'warps':>5} {'regs':>5} {'spill':>6} {'smem':>6}")
    for r in results:
        print(f"{r['name']:<64} {r['arch']:>4} {r['num_warps']:>5} {r['registers']:>5} "
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
    """With HW_CVT (opt-in) every kernel uses the fast paths it has: the fast reciprocal (MUFU + Newton, with
    the exact redo of a tile behind it) where the backward forms a reciprocal or quotient, the approximate
    quotient in the MX forward (whose outputs are codes), cvt.rn.bf16(x2) for
    bf16 values, the satfinite FP8 cvt for FP8 codes (FP4 codes have none); without it (the default) none of
    them appears: the integer paths and div.rn run."""
    paths = ("fast_rcp", "approx_quotient", "cvt_fp8", "cvt_bf16")
    hw = [r for r in compiled if "hw_cvt" in r["name"]]
    kernels = {"group_grad", "clipped_swiglu", "mx_quant", "bwd_mx_quant"}
    assert {r["name"].split("[")[0] for r in hw} == kernels
    assert all(r["expect"] for r in hw)
    wrong = [(r["name"], p) for r in hw for p in paths if bool(r[p]) != (p in r["expect"])]
    assert not wrong, f"hardware conversions not as expected: {wrong}"
    default = [r for r in compiled if "hw_cvt" not in r["name"]]
    assert not [r["name"] for r in default if any(r[p] for p in paths)]


def test_masked_fp8_conversion_only_where_a_thread_holds_four_columns(compiled):
    """ROW_VEC's row-wise FP8 conversion zeroes four codes by the block of the first: each of its operands
    is laid out with four consecutive columns of a row per thread. It is used on the aligned HW_CVT MX
    specializations (the check is not vacuous) and not on the unaligned ones, where Triton lays the tile
    out one element per thread and register (there it zeroed finite blocks' codes and converted NaN
    blocks' from v * -inf)."""
    scattered = [
        (r["name"], r["arch"], r["masked_cvt_scattered"]) for r in compiled if r["masked_cvt_scattered"]
    ]
    assert not scattered, scattered
    fp8 = [
        r for r in compiled if "mx_quant" in r["name"] and "hw_cvt" in r["name"] and ",e2m1" not in r["name"]
    ]
    aligned = [r["name"] for r in fp8 if "unaligned" not in r["name"]]
    unaligned = [r["name"] for r in fp8 if "unaligned" in r["name"]]
    assert aligned and unaligned
    assert not [r["name"] for r in fp8 if (r["masked_cvt"] > 0) == ("unaligned" in r["name"])]


def test_fma_check_can_fail():
    """The PTX check above does see contraction when the launch options allow it."""
    fn, sig, consts, attrs, options, _ = SPECS["group_grad[bf16,w=0,mask=0]"]
    kernel = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                            options={**options, "enable_fp_fusion": True})  # fmt: skip
    assert re.search(r"\bfma\.rn\.f32\b", kernel.asm["ptx"])
