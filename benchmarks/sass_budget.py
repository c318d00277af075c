"""SASS instruction budgets of the Triton kernels, measured without a GPU (docs/triton_backend.md).

    python benchmarks/sass_budget.py              # every specialization, both paths, sm_90 + sm_100
    python benchmarks/sass_budget.py --ci         # the subset tests/test_triton_sass_budget.py holds
    python benchmarks/sass_budget.py --only 'mx_quant' --arch 90 --detail   # + per source function, opcode
    python benchmarks/sass_budget.py --json out.json                        # every row

Every kernel specialization of tests/_triton_compile_checks.py (the ones the dispatch launches) is compiled
with Triton's bundled ptxas for sm_90 and sm_100 (``triton.compile(ASTSource(...), GPUTarget(...))``, the
launchers' options), once per conversion path: the default integer transcriptions and the opt-in PTX
conversions (``HW_CVT``). The cubin is disassembled with the bundled ``nvdisasm``; the script counts the
SASS instructions a thread issues on the hot path:

- loop kernels (swiglu_group_grad): the body of the hidden-dim loop (one iteration), per (gate, up) pair a
  thread handles per iteration;
- loop-free kernels (clipped_swiglu, the MX kernels): the whole program once, per element a thread handles:
  per pair for the elementwise kernels, per quantized element (an element of y1, which is quantized on both
  axes) for the MX kernels. The grouped MX kernels' group-end scan is counted once (one chunk: G < 128).
  Their aligned specializations load without predicates (``PLAIN_LOADS``: what the launcher picks for N a
  multiple of 32, as in GPT-OSS, DeepSeek-V3 and Qwen3's experts); the ``pad_select`` and unaligned ones
  load the padding with masks.

Not counted: NOPs, the trailing self-branch, and the cold paths that ptxas adds for correctly rounded
division/reciprocal (the ``CALL.REL`` to ``__internal_*_slowpath`` and its register moves: taken only for
subnormal, infinite or NaN quotients). Everything else counts once, as if every branch fell through, so the
count is an upper bound of the instructions the common path issues (e.g. ``if not nonempty: return``).

The issue model (``MODELS``; assumptions in docs/triton_backend.md): a GPU issues at most SMs x 4
schedulers x 1 warp-instruction per cycle at its boost clock. For a kernel that moves ``bytes`` per element
and issues ``instr`` per element per thread, the time of pure issue is ``t_issue = instr / (32 * rate)`` and
the time of the copy roofline ``t_copy = bytes / copy_bandwidth``; the model prints both bounds of the % of
copy bandwidth: ``overlap`` = t_copy / max(t_copy, t_issue) (memory and issue fully overlapped) and
``serial`` = t_copy / (t_copy + t_issue) (no overlap). On an H200 the serial bound matched the two kernels
measured (old kernels: group_grad 90 instr/pair, predicted 52 %, measured 50 %; dual-axis 169 instr/element,
predicted 19 %, measured 16 %).

The last line reads ``quantizers max Q instr/element (weighted W), elementwise max E instr/pair, spills S``:
the maxima over the budgeted path (``HW_CVT``, FP8 quantizers; docs/triton_backend.md says why), the FP8
quantizers without and with a routing weight apart, and the spill bytes over every compiled kernel.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

# --------------------------------------------------------------------------------------------- budgets

#: Instructions per quantized element (dual-axis FP8 quantizers) and per pair (elementwise kernels) on the
#: budgeted path (HW_CVT): issue 14's targets (a weighted MX kernel: its ceiling). Rows above are marked OVER.
QUANTIZER_BUDGET = 35.0
ELEMENTWISE_BUDGET = 50.0

#: What tests/test_triton_sass_budget.py holds besides the targets: per kernel (and direction), the largest
#: count on the budgeted path measured for this commit, rounded up. Every budgeted specialization meets its
#: target (the MX kernels at 34.8 at most, the elementwise ones at 49.5); these ceilings keep the counts
#: from growing back, and go down with every kernel change that lowers them.
#: The MX kernels with a routing weight (``.weight``) do more per element than issue 14's operators (the
#: product, and in the backward the forward's activation and grad_weight's products and sums): they are held
#: by their own ceilings, not by its targets.
CEILINGS = {
    "group_grad": 47.0,
    "clipped_swiglu.fwd": 39.0,
    "clipped_swiglu.bwd": 50.0,
    "mx_quant": 35.0,
    "bwd_mx_quant": 35.0,
    "mx_quant.weight": 36.0,
    "bwd_mx_quant.weight": 52.0,
}


def is_weighted(name: str) -> bool:
    return ",weight" in name


def ceiling_key(name: str) -> str:
    kind = _kind(name)
    if kind == "clipped_swiglu":
        return kind + (".bwd" if ",bwd," in name else ".fwd")
    return kind + (".weight" if is_weighted(name) else "")


# ----------------------------------------------------------------------------------------- issue model

#: Per target: SMs, warp schedulers per SM, boost clock (Hz), device-copy bandwidth (bytes/s, read +
#: written). H200: 132 SMs at 1.98 GHz; 4.2e12 B/s is the copy measured on the H200 of 2026-11-30
#: (docs/triton_backend.md). B200: 148 SMs at 1.965 GHz; 6.9e12 B/s is an assumption (~86 % of 8 TB/s HBM3e,
#: the ratio the H200 copy reached), not a measurement.
MODELS = {
    90: {"gpu": "H200", "sms": 132, "schedulers": 4, "clock": 1.98e9, "copy_bw": 4.2e12},
    100: {"gpu": "B200", "sms": 148, "schedulers": 4, "clock": 1.965e9, "copy_bw": 6.9e12},
}


def predicted_pct(instr: float, nbytes: float, arch: int) -> tuple[float, float]:
    """(overlap, serial) % of copy bandwidth the issue model predicts for ``instr`` thread-instructions and
    ``nbytes`` bytes moved per element."""
    m = MODELS[arch]
    t_issue = instr / (32 * m["sms"] * m["schedulers"] * m["clock"])
    t_copy = nbytes / m["copy_bw"]
    return 100 * t_copy / max(t_copy, t_issue), 100 * t_copy / (t_copy + t_issue)


# ------------------------------------------------------------------------------------- SASS analysis

_INSTR = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$")
_LABEL = re.compile(r"^([.$\w][^\s:]*):\s*$")
_LOC = re.compile(r'//## File "([^"]+)", line (\d+)')
_BRANCH_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
_PRED_OPERAND = re.compile(r"^\w+(?:\.\w+)*\s+!?U?P(?:\d+|T)\s*,")


def nvdisasm() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")


def disassemble(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run(
            [nvdisasm(), "-c", "-g", f.name], check=True, capture_output=True, text=True
        ).stdout


def parse_sass(text: str) -> list[dict]:
    """The instructions of the kernel's main body, in order: ``{"op", "labels", "line"}`` (labels that
    precede the instruction, the source line ``nvdisasm -g`` attributes it to). Stops at the first
    ptxas-internal subroutine (``$__internal_*``, the slow paths) and drops NOPs and the trailing
    self-branch."""
    body: list[dict] = []
    labels: list[str] = []
    line = None
    for raw in text.splitlines():
        m = _LOC.search(raw)
        if m:
            line = int(m.group(2))
            continue
        m = _LABEL.match(raw)
        if m:
            if m.group(1).startswith("$__internal"):
                break
            labels.append(m.group(1))
            continue
        m = _INSTR.match(raw)
        if m:
            body.append({"op": m.group(2).rstrip(" ;"), "labels": labels, "line": line})
            labels = []
    while body and (body[-1]["op"] == "NOP" or _self_branch(body[-1])):
        body.pop()
    out: list[dict] = []
    carry: list[str] = []  # a NOP's labels move to the next instruction
    for ins in body:
        if ins["op"] == "NOP":
            carry += ins["labels"]
        else:
            out.append({**ins, "labels": carry + ins["labels"]})
            carry = []
    return out


def _self_branch(ins: dict) -> bool:
    m = _BRANCH_TARGET.search(ins["op"])
    return bool(m and ins["op"].startswith("BRA") and m.group(1) in ins["labels"])


def _opcode(op: str) -> str:
    words = op.split()
    word = words[1] if words[0].startswith("@") else words[0]
    return word.split(".")[0]


def _is_cold_seed(ins: dict) -> bool:
    """A ptxas slow-path call (correctly rounded division/reciprocal of subnormal, infinite or NaN
    operands) or the kernels' cold-path marker (``pmevent 7`` = ``PMTRIG``, the first instruction of the
    PTX path's exact redo of a tile)."""
    return ("CALL.REL" in ins["op"] and "slowpath" in ins["op"]) or _opcode(ins["op"]) == "PMTRIG"


def _blocks(body: list[dict]):
    """Basic blocks ``[(start, end)]`` (end exclusive) and their successors."""
    where = {label: k for k, ins in enumerate(body) for label in ins["labels"]}
    leaders = {0}
    for k, ins in enumerate(body):
        if ins["labels"]:
            leaders.add(k)
        if _opcode(ins["op"]) in ("BRA", "EXIT", "RET") and k + 1 < len(body):
            leaders.add(k + 1)
    starts = sorted(leaders)
    blocks = [(a, b) for a, b in zip(starts, starts[1:] + [len(body)], strict=True)]
    index = {a: i for i, (a, _) in enumerate(blocks)}
    succ = []
    for i, (_a, b) in enumerate(blocks):
        last = body[b - 1]["op"]
        # a guard predicate (@P0 BRA) or a predicate operand (BRA.U !UP0, target: sm_100's uniform branch)
        conditional = last.startswith("@") or bool(_PRED_OPERAND.match(last))
        op = _opcode(last)
        out = []
        if op == "BRA":
            m = _BRANCH_TARGET.search(last)
            if m and m.group(1) in where:
                out.append(index[where[m.group(1)]])
            if conditional and i + 1 < len(blocks):
                out.append(i + 1)
        elif op in ("EXIT", "RET"):
            if conditional and i + 1 < len(blocks):
                out.append(i + 1)
        elif i + 1 < len(blocks):
            out.append(i + 1)
        succ.append(out)
    return blocks, succ


def _dominators(succ: list[list[int]]) -> list[set[int]]:
    n = len(succ)
    pred = [[] for _ in range(n)]
    for i, out in enumerate(succ):
        for j in out:
            pred[j].append(i)
    dom = [set(range(n)) for _ in range(n)]
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for i in range(1, n):
            new = set.intersection(*(dom[p] for p in pred[i])) if pred[i] else set()
            new = new | {i}
            if new != dom[i]:
                dom[i] = new
                changed = True
    return dom


def hot_path(body: list[dict]) -> dict:
    """Counts on the hot path: ``total`` (every instruction outside cold code), ``loops`` (the body of each
    loop, from its head to its last back-edge: [start, end] indices and its hot count) and ``cold``.

    Cold code is every basic block dominated by a block that holds a cold seed (``_is_cold_seed``): a
    ptxas slow-path call site, or the exact redo of a tile behind the PTX path's ``pmevent`` marker, with
    everything only reachable through it. The code after them that the hot path reaches too (where the
    arms join) stays hot."""
    blocks, succ = _blocks(body)
    dom = _dominators(succ)
    seeds = {i for i, (a, b) in enumerate(blocks) if any(_is_cold_seed(body[k]) for k in range(a, b))}
    cold: set[int] = set()
    for i, (a, b) in enumerate(blocks):
        if dom[i] & seeds:
            cold.update(range(a, b))
    where = {label: k for k, ins in enumerate(body) for label in ins["labels"]}
    heads: dict[int, int] = {}
    for k, ins in enumerate(body):
        m = _BRANCH_TARGET.search(ins["op"])
        if m and _opcode(ins["op"]) == "BRA" and where.get(m.group(1), k + 1) <= k and k not in cold:
            start = where[m.group(1)]
            heads[start] = max(heads.get(start, k), k)
    loops = [
        {"start": a, "end": b, "count": sum(1 for j in range(a, b + 1) if j not in cold)}
        for a, b in sorted(heads.items())
    ]
    return {"total": len(body) - len(cold), "cold": len(cold), "loops": loops, "cold_set": cold}


def source_functions(path: Path):
    """Maps a line of ``path`` to the innermost function that contains it."""
    import ast

    spans = [
        (n.lineno, n.end_lineno, n.name)
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.FunctionDef)
    ]

    def lookup(line):
        best = None
        for a, b, name in spans:
            if line is not None and a <= line <= b and (best is None or b - a < best[1] - best[0]):
                best = (a, b, name)
        return best[2] if best else "?"

    return lookup


# ---------------------------------------------------------------------------------------- kernels


def _kind(name: str) -> str:
    return name.split("[")[0]


def _dtype_bytes(dt: str) -> int:
    return {"bf16": 2, "fp16": 2, "fp32": 4}[dt]


def _group_grad_unroll() -> int:
    from swiglu_ops.backends.triton import _kernels

    return int(getattr(_kernels.GROUP_GRAD_UNROLL, "value", _kernels.GROUP_GRAD_UNROLL))


def normalisation(name: str, consts: dict, options: dict, arg_names=()) -> dict:
    """How to count a specialization: ``mode`` ("loop": one iteration of the innermost hot loop, or
    "program"), the ``unit`` (pair or quantized element), the units a thread handles per iteration/program,
    and the bytes one unit moves (inputs read + outputs written, the copy roofline's bytes)."""
    kind = _kind(name)
    threads = 32 * options["num_warps"]
    # The MX kernels loop over column tiles (older versions were loop-free: one tile per program).
    mx_mode = "loop" if "tiles_per_program" in arg_names else "program"
    dt = name.split("[")[1].split(",")[0]
    s = _dtype_bytes(dt)
    if kind == "group_grad":
        weight = consts["HAS_WEIGHT"]
        # the hidden-dim loop's body holds GROUP_GRAD_UNROLL chunks
        per = consts["ROWS"] * consts["BLOCK_H"] * _group_grad_unroll() / threads
        # dy, gate + up, grad_gate + grad_up (+ y_origin), per pair
        return {"mode": "loop", "unit": "pair", "per_thread": per, "bytes": (6 if weight else 5) * s}
    if kind == "clipped_swiglu":
        per = consts["ROWS"] * consts["BLOCK"] / threads
        return {
            "mode": "loop" if "n_chunks" in arg_names else "program",  # the chunk loop's body
            "unit": "pair",
            "per_thread": per,
            "bytes": (5 if consts["BACKWARD"] else 3) * s,
        }
    if kind == "bwd_mx_quant":
        per = 32 * 2 * consts["BLOCK_N"] / threads  # gradient elements (both halves)
        # x (one element per gradient element), dy (half), y1 + y2, the two scales per 32
        return {"mode": mx_mode, "unit": "element", "per_thread": per, "bytes": 1.5 * s + 2 + 2 / 32}
    if kind == "mx_quant":
        per = 32 * consts["BLOCK_N"] / threads  # output columns
        codes = 1 if consts["FP4"] else 2
        return {"mode": mx_mode, "unit": "element", "per_thread": per, "bytes": 2 * s + codes + 2 / 32}
    raise ValueError(name)


def is_quantizer(name: str) -> bool:
    return _kind(name) in ("mx_quant", "bwd_mx_quant")


def is_budgeted(row: dict) -> bool:
    """The budget holds on the HW_CVT path, for the FP8 quantizers and every elementwise kernel; FP4 codes
    have no hardware conversion (reported, not budgeted)."""
    return row["hw_cvt"] and not row["fp4"] and not row["unaligned"]


def budget_of(row: dict) -> float:
    """Issue 14's target of a row; a weighted MX kernel's is its ceiling (see ``CEILINGS``)."""
    if is_weighted(row["name"]):
        return CEILINGS[ceiling_key(row["name"])]
    return QUANTIZER_BUDGET if is_quantizer(row["name"]) else ELEMENTWISE_BUDGET


# ----------------------------------------------------------------------------------------- compile


def spec_names(ci: bool, only: str | None) -> list[tuple[str, bool]]:
    """(spec name, hw_cvt) pairs to compile: every spec of the compile checks on both paths, or the CI
    subset."""
    import _triton_compile_checks as cc

    names = list(cc.SPECS)
    if ci:
        names = [n for n in names if n in CI_SPECS]
        missing = set(CI_SPECS) - set(names)
        assert not missing, f"CI specs not in the compile checks: {sorted(missing)}"
    if only:
        names = [n for n in names if re.search(only, n)]
    out = []
    for n in names:
        if n.endswith(",hw_cvt]"):
            continue  # the HW twin of every spec is compiled below
        out += [(n, True)] if ci else [(n, False), (n, True)]
    return out


#: The CI subset, compiled on the budgeted path only (HW_CVT; tests/test_triton_compile.py checks every
#: specialization's registers and spills on both paths): per kernel and direction, the specialization with
#: the most instructions per unit found by the full script, plus the CANN defaults and the GPT-OSS
#: variants of the MX kernels.
CI_SPECS = (
    "group_grad[bf16,w=1,mask=1]",
    "clipped_swiglu[fp32,fwd,mode=0,interleaved]",
    "clipped_swiglu[fp32,bwd,mode=1,interleaved]",
    "mx_quant[bf16,grouped=1,e4m3]",
    "mx_quant[bf16,grouped=1,e4m3,interleaved,clipped]",
    "mx_quant[bf16,grouped=1,e4m3,transpose_y2]",
    "mx_quant[bf16,grouped=1,e4m3,interleaved,clipped,pad_select]",
    "bwd_mx_quant[bf16,grouped=1]",
    "bwd_mx_quant[bf16,grouped=1,interleaved,clipped]",
    "bwd_mx_quant[fp16,grouped=1,interleaved,clipped,transpose_y2]",
    "mx_quant[bf16,grouped=1,e4m3,interleaved,clipped,weight]",
    "bwd_mx_quant[bf16,grouped=1,interleaved,clipped,weight]",
)


def measure(name: str, hw: bool, arch: int, detail: bool = False) -> dict:
    """Compile one specialization on one path for one arch; its registers, spills and SASS counts."""
    import _triton_compile_checks as cc

    kernel, res = cc.compile_spec(name, arch, hw_cvt=hw)
    fn, _sig, _consts, _attrs, options, _expect = cc.SPECS[name]
    consts = cc.spec_consts(name, hw)
    body = parse_sass(disassemble(kernel.asm["cubin"]))
    hot = hot_path(body)
    norm = normalisation(name, consts, options, fn.arg_names)
    if norm["mode"] == "loop":
        assert hot["loops"], f"{name}: no loop found in the SASS"
        # the hidden-dim / column-tile loop: the grouped MX kernels' group-end scan is a smaller loop
        loop = max(hot["loops"], key=lambda lp: lp["count"])
        count, rng = loop["count"], range(loop["start"], loop["end"] + 1)
    else:
        count, rng = hot["total"], range(len(body))
    per_unit = count / norm["per_thread"]
    overlap, serial = predicted_pct(per_unit, norm["bytes"], arch)
    regs = res["registers"]
    warps = options["num_warps"]
    # CTAs per SM from registers (64K per SM, allocated per warp in units of 256), warps (64 per SM) and
    # shared memory (228 KiB on sm_90/sm_100, 1 KiB reserved per CTA).
    regs_per_warp = -(-regs * 32 // 256) * 256
    ctas = min(65536 // (regs_per_warp * warps), 64 // warps, 32)
    if res["shared"]:
        ctas = min(ctas, (228 * 1024) // (res["shared"] + 1024))
    row = {
        "name": name.replace(",hw_cvt]", "]"), "arch": arch, "hw_cvt": hw, "kind": _kind(name),
        "fp4": ",e2m1" in name, "unaligned": ",unaligned" in name,
        "registers": regs, "spills": res["spill_stores"] + res["spill_loads"] + res["stack"],
        "shared": res["shared"], "warps": warps, "ctas_per_sm": ctas, "warps_per_sm": ctas * warps,
        "mode": norm["mode"], "unit": norm["unit"], "per_thread": norm["per_thread"], "count": count,
        "per_unit": round(per_unit, 2), "bytes_per_unit": norm["bytes"],
        "pred_overlap": round(overlap, 1), "pred_serial": round(serial, 1),
    }  # fmt: skip
    if detail:
        lookup = source_functions(Path(cc._kernels.__file__))
        funcs = collections.Counter(lookup(body[j]["line"]) for j in rng if j not in hot["cold_set"])
        ops = collections.Counter(_opcode(body[j]["op"]) for j in rng if j not in hot["cold_set"])
        row["by_function"] = {k: round(v / norm["per_thread"], 2) for k, v in funcs.most_common()}
        row["by_opcode"] = {k: round(v / norm["per_thread"], 2) for k, v in ops.most_common()}
    return row


def _measure_job(args):
    return measure(*args)


def run(jobs: list[tuple[str, bool, int, bool]], workers: int) -> list[dict]:
    if workers <= 1:
        return [measure(*j) for j in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_measure_job, jobs))


# ----------------------------------------------------------------------------------------- report


def summary(rows: list[dict]) -> dict:
    budgeted = [r for r in rows if is_budgeted(r)]
    quant = [r["per_unit"] for r in budgeted if is_quantizer(r["name"]) and not is_weighted(r["name"])]
    weighted = [r["per_unit"] for r in budgeted if is_weighted(r["name"])]
    elem = [r["per_unit"] for r in budgeted if not is_quantizer(r["name"])]
    return {
        "quantizers_max": max(quant, default=float("nan")),
        "weighted_max": max(weighted, default=float("nan")),
        "elementwise_max": max(elem, default=float("nan")),
        "spills": sum(r["spills"] for r in rows),
        "over_budget": [
            (r["name"], r["arch"], r["per_unit"]) for r in budgeted if r["per_unit"] > budget_of(r)
        ],
        "over_ceiling": [
            (r["name"], r["arch"], r["per_unit"], CEILINGS[ceiling_key(r["name"])])
            for r in budgeted
            if r["per_unit"] > CEILINGS[ceiling_key(r["name"])]
        ],
    }


def print_table(rows: list[dict], detail: bool) -> None:
    head = ("kernel", "sm", "path", "regs", "spill", "smem", "CTA/SM", "instr", "per", "pred % (ovl/ser)")
    print(f"{head[0]:<62} {head[1]:>3} {head[2]:>4} {head[3]:>4} {head[4]:>5} {head[5]:>5} {head[6]:>6} "
          f"{head[7]:>6} {head[8]:<7} {head[9]}")  # fmt: skip
    for r in sorted(rows, key=lambda r: (r["kind"], r["name"], r["arch"], r["hw_cvt"])):
        mark = ""
        if is_budgeted(r):
            mark = " OVER" if r["per_unit"] > budget_of(r) else " ok"
        print(f"{r['name']:<62} {r['arch']:>3} {'hw' if r['hw_cvt'] else 'int':>4} {r['registers']:>4} "
              f"{r['spills']:>5} {r['shared']:>5} {r['ctas_per_sm']:>2}x{r['warps']:<3} "
              f"{r['per_unit']:>6.1f} "
              f"{r['unit']:<7} {r['pred_overlap']:5.0f} / {r['pred_serial']:3.0f}{mark}")  # fmt: skip
        if detail and "by_function" in r:
            print("    functions:", ", ".join(f"{k} {v}" for k, v in r["by_function"].items()))
            print("    opcodes:  ", ", ".join(f"{k} {v}" for k, v in list(r["by_opcode"].items())[:24]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", type=int, nargs="+", default=[90, 100], choices=sorted(MODELS))
    p.add_argument("--ci", action="store_true", help="only the subset the CI budget test holds")
    p.add_argument("--only", help="regular expression on the specialization names")
    p.add_argument("--detail", action="store_true", help="instructions per source function and opcode")
    p.add_argument("--json", help="write every row and the summary to this file")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        p.error("compiling needs Triton's compiled mode: unset TRITON_INTERPRET")
    jobs = [(n, hw, arch, args.detail) for n, hw in spec_names(args.ci, args.only) for arch in args.arch]
    rows = run(jobs, args.workers)
    print_table(rows, args.detail)
    s = summary(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": s}, indent=1))
    if s["over_budget"]:
        print(f"over the targets ({QUANTIZER_BUDGET:g} / {ELEMENTWISE_BUDGET:g}):", s["over_budget"])
    if s["over_ceiling"]:
        print("over the ceilings (CEILINGS):", s["over_ceiling"])
    print(f"quantizers max {s['quantizers_max']:.1f} instr/element (weighted {s['weighted_max']:.1f}), "
          f"elementwise max {s['elementwise_max']:.1f} instr/pair, spills {s['spills']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
