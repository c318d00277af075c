"""x86 instruction budgets of the CPU MX operators' hot loops, from the built library (docs/cpu_backend.md).

    python benchmarks/x86_budget.py               # every ISA: table, benchmarks/results/x86_budget.{json,md}
    python benchmarks/x86_budget.py --isa avx2 --detail   # + instructions per source function on each path
    python benchmarks/x86_budget.py --json out.json --no-mca --no-results
    python benchmarks/x86_budget.py --check benchmarks/x86_budget_limits.json   # exit 1 over a limit

The library (default: the one the package loads, ``swiglu_ops.backends.cpu._kernels``; ``--lib`` another)
holds one copy of every kernel phase per instruction set, named ``swiglu_<phase>_<isa>`` (csrc/kernel.h,
``FN``). For the phases of the two MX operators (``PHASES``: stage 1 of the bf16 forward, chunked backward
and weighted backward; the bf16 quantiser for FP8 and FP4) the script disassembles each copy with
``objdump -d -l --inlines`` (only its address range, from ``nm``), which gives every instruction the chain
of source lines it was inlined through, builds the control-flow graph, finds the natural loops (a back
edge is a branch to a block that dominates it; back edges to one header are one loop) and names the hot
ones by the C loop they come from (``LOOPS``: a loop statement of csrc/mx.h, found by a regular expression
in the source, and the call site it must be inlined through, e.g. codes_run's loop under store_codes_x32's
non-special call). Per hot loop it reports:

- ``instr``: instructions per iteration on the longest path from the loop's header back to it (every branch
  taken the costlier way: an upper bound; ``min`` the shortest path, e.g. the forward's FP8 codes without
  their subnormal results). NOPs are not counted. Calls (the portable build calls its HEAVY helpers, and
  partial vectors call the layers' ``*_part`` helpers) count the callee's instructions too: the longest path
  through its body, a loop in it times its trip count where that is a constant compare of the counter
  (``w_store8``: 32 iterations), else once (flagged ``?``);
- ``el``: quantized elements (elements of y1; stage 1: output values, two per pair in the backward) per
  iteration, from the C loop's step (``LOOPS``; MX_BLOCK = 32 values per codes step, 16 columns of 32
  rows per scale step, ...), checked against the loop's induction increments (an add of step, or step times
  an element size, must be there); ``instr/el``;
- ``spill``: vector loads and stores of whole registers to the stack (rsp/rbp-relative moves and folded
  operands of xmm/ymm/zmm width; broadcasts and scalar loads from stack arrays are not spills) on that path,
  stores/loads; in the portable build this includes the 64-byte vectors passed to and returned from the
  helpers in memory;
- ``mca``: llvm-mca's simulated cycles per iteration and per element of that path (control flow left out,
  the callees' paths inlined) for one CPU model per ISA (``MCA_CPU``), where llvm-mca is installed.

The limits (benchmarks/x86_budget_limits.json, held by tests/test_x86_budget.py) are on ``instr/el`` (per
iteration where a loop has no element count), on the same for the shortest path (``min``: where a loop holds
two ways of doing the same work, the cheaper one, e.g. the AVX-512 stage 1's gathered table reads) and on
spills per iteration: deterministic for a given compiler and source, so a change that costs instructions
fails without timing anything.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import math
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))
CSRC = ROOT / "src" / "swiglu_ops" / "backends" / "cpu" / "csrc"
RESULTS = ROOT / "benchmarks" / "results"
LIMITS = ROOT / "benchmarks" / "x86_budget_limits.json"

ISAS = ("portable", "avx2", "avx512", "avx512_bf16")

#: The llvm-mca CPU model per instruction set: a CPU that runs it (AVX-512 BF16: Cooper Lake).
MCA_CPU = {"portable": "x86-64", "avx2": "haswell", "avx512": "skylake-avx512", "avx512_bf16": "cooperlake"}

# ------------------------------------------------------------------------------------- the hot loops


@dataclass(frozen=True)
class CLoop:
    """A loop statement of csrc/mx.h: ``pattern`` finds it in ``func``; ``via``: the call (function, regex
    of the call's line) it must be inlined through; ``upto``: only the lines of the loop before this regex
    count (the rest is another row). ``step``: the C loop variable's increment; ``per_step``: quantized
    elements per unit of the step (None: per iteration only)."""

    name: str
    func: str
    pattern: str
    step: int
    per_step: float | None
    via: tuple[str, str] | None = None
    upto: str | None = None
    partial: bool = False  # count the paths through the partial-vector helpers (a row's last step)
    what: str = ""

    @property
    def elements(self) -> float | None:
        return None if self.per_step is None else self.step * self.per_step


MX_BLOCK = 32  # csrc/mx.h: values per scale block (one codes step), rows per tile
STEP = 32  # mx_stage1's pairs per step for 16-bit chunked rows (``step = ... ? 16 : 32``)


def _stage1(per_pair: int) -> tuple[CLoop, ...]:
    return (
        CLoop("step", "mx_stage1", r"for \(; q \+ step <= w; q \+= step\)", STEP, per_pair,
              what="stage 1, full vectors: loads, activation lookups, GLU, rounding, tile + column amax"),
        CLoop("tail", "mx_stage1", r"for \(; q < span; q \+= step\)", STEP, None, partial=True,
              what="stage 1, a row's last partial step (masked loads and stores)"),
    )  # fmt: skip


def _quantise(fp8: bool) -> tuple[CLoop, ...]:
    rows = (
        CLoop("codes", "codes_run", r"for \(; j \+ 32 <= n; j \+= 32\)", MX_BLOCK, 1,
              via=("store_codes_x32", r": codes_run\(.*, fp4, 0\)"),
              what="both axes' codes of 32 values (fp8x32_code2), no NaN/inf block"),
        CLoop("col_scales", "mx_quantise", r"for \(int64_t j = 0; j < width; j \+= 16\)", 16, MX_BLOCK,
              what="-2 axis: E8M0 codes, multipliers and offsets of 16 columns (x 32 rows)"),
        CLoop("row_scales", "mx_quantise", r"for \(int64_t k0 = 0; k0 < nblk; k0 \+= 16\)", 16, MX_BLOCK,
              upto=r"store_codes_x32\(y1", what="-1 axis: amax tree, E8M0 codes and offsets of 16 blocks"),
    )  # fmt: skip
    if fp8:
        rows += (
            CLoop("transpose", "mx_quantise", r"for \(int64_t i = 0; i < blk->nrows; i\+\+\) out\[i\]", 1, 1,
                  what="transpose_y2: one code byte into token-contiguous y2"),
        )  # fmt: skip
    return rows


#: Phase (symbol without the ``swiglu_`` prefix and the ISA suffix) -> its hot loops.
PHASES = {
    "mx_stage1_BF16_0000": _stage1(1),  # forward: one output per pair
    "mx_stage1_BF16_1000": _stage1(2),  # backward, chunked: both gradients
    "mx_stage1_BF16_1001": _stage1(2),  # backward with routing weight (+ grad_weight)
    "mx_quantise_BF16_0": _quantise(True),  # FP8
    "mx_quantise_BF16_1": _quantise(False),  # FP4 (E2M1/E1M2, round mode rint)
}


@functools.cache
def _source(file: str) -> str:
    return (CSRC / file).read_text()


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _statement_end(text: str, pos: int) -> int:
    """The offset just past the loop statement that starts at ``pos`` (``for (...)`` then a braced block or
    one statement)."""
    depth, k = 0, text.index("(", pos)
    while True:  # the for's parentheses
        depth += {"(": 1, ")": -1}.get(text[k], 0)
        k += 1
        if depth == 0:
            break
    while text[k].isspace():
        k += 1
    if text[k] != "{":
        return text.index(";", k) + 1
    depth = 0
    while True:
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        k += 1
        if depth == 0:
            return k


def _unique(pattern: str, text: str, what: str) -> re.Match:
    found = list(re.finditer(pattern, text))
    if len(found) != 1:
        raise LookupError(f"{what}: {len(found)} matches of {pattern!r} in csrc/mx.h (expected 1)")
    return found[0]


@functools.cache
def loop_lines(spec: CLoop) -> tuple[range, int | None]:
    """The source lines of ``spec`` in mx.h (``upto``: cut before that line) and the line of its ``via``
    call."""
    text = _source("mx.h")
    m = _unique(spec.pattern, text, spec.name)
    first, last = _line_of(text, m.start()), _line_of(text, _statement_end(text, m.start()))
    if spec.upto:
        last = _line_of(text, m.start() + _unique(spec.upto, text[m.start() :], spec.name).start()) - 1
    via = None
    if spec.via:
        via = _line_of(text, _unique(spec.via[1], text, spec.name).start())
    return range(first, last + 1), via


# ------------------------------------------------------------------------------------- disassembly


@dataclass
class Insn:
    addr: int
    op: str  # mnemonic (with a prefix such as ``rep``/``cs``)
    args: str
    chain: tuple  # ((function, file, line), ...) innermost first
    target: int | None = None  # a direct branch's or call's target

    @property
    def text(self) -> str:
        return f"{self.op} {self.args}".strip()


_SYM = re.compile(r"^([0-9a-f]+)\s+([0-9a-f]+)\s+[tTwW]\s+(\S+)$")
_INSN = re.compile(r"^\s+([0-9a-f]+):\t(.*)$")
_FUNC = re.compile(r"^([\w.]+)\(\):$")
_LOC = re.compile(r"^(/\S+?):(\d+)(?: \(discriminator \d+\))?$")
_INLINED = re.compile(r"^inlined by (/\S+?):(\d+)(?: \(discriminator \d+\))? \(([\w.]+)\)$")
_TARGET = re.compile(r"^([0-9a-f]+) <")
_PREFIXES = ("rep", "repz", "repnz", "cs", "ds", "lock", "notrack", "bnd", "data16")


def library_path() -> str:
    """The library the package loads (the loader's own lookup)."""
    import importlib.util

    spec = importlib.util.find_spec("swiglu_ops.backends.cpu._kernels")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("swiglu_ops.backends.cpu._kernels is not built (pip install -e .)")
    return spec.origin


@functools.lru_cache(maxsize=4)
def symbols(lib: str) -> dict[str, tuple[int, int]]:
    """Function symbols: name -> (address, size)."""
    out = subprocess.run(["nm", "-S", "--defined-only", lib], check=True, capture_output=True, text=True)
    syms = {}
    for line in out.stdout.splitlines():
        m = _SYM.match(line)
        if m:
            syms[m.group(3)] = (int(m.group(1), 16), int(m.group(2), 16))
    return syms


def parse_objdump(text: str) -> list[Insn]:
    """The instructions of ``objdump -d [-l --inlines] --no-show-raw-insn`` output, each with its inline
    chain. objdump prints a location (``func():``, ``/file:line``, ``inlined by`` lines) only where it
    changes."""
    out: list[Insn] = []
    func, loc, frames, chain, fresh = "?", ("?", 0), [], (("?", "?", 0),), True
    for raw in text.splitlines():
        if raw.startswith("  ") and (m := _INSN.match(raw)):
            if frames is not None:  # the location changed: its chain, once
                chain, frames = tuple([(func, *loc)] + frames), None
            words = m.group(2).split(None, 1)
            op, args = (words + [""])[:2]
            if op in _PREFIXES and args:
                more = args.split(None, 1)
                op, args = f"{op} {more[0]}", (more + [""])[1]
            t = _TARGET.match(args) if op[0] in "jc" else None
            out.append(Insn(int(m.group(1), 16), op, args.strip(), chain, int(t.group(1), 16) if t else None))
            fresh = True
        elif raw.startswith("inlined by ") and (m := _INLINED.match(raw)):
            if fresh or frames is None:  # a new chain under the same innermost location
                frames, fresh = [], False
            frames.append((m.group(3), m.group(1).rsplit("/", 1)[-1], int(m.group(2))))
        elif raw.startswith("/") and (m := _LOC.match(raw)):
            loc, frames, fresh = (m.group(1).rsplit("/", 1)[-1], int(m.group(2))), [], False
        elif m := _FUNC.match(raw):
            func, frames, fresh = m.group(1), [], False
    return out


@functools.lru_cache(maxsize=256)
def disassemble(lib: str, name: str, lines: bool = True) -> tuple[Insn, ...]:
    """The instructions of function ``name``; ``lines``: with their inline chains (``objdump -l --inlines``,
    about 0.1 s a function: it reads the debug information), else each attributed to ``name`` itself (the
    callees: ``w_store8``, ``ld16_part``, ...)."""
    addr, size = symbols(lib)[name]
    cmd = [
        "objdump",
        "-d",
        "--no-show-raw-insn",
        f"--start-address={addr:#x}",
        f"--stop-address={addr + size:#x}",
    ]
    cmd.append(lib)
    if lines:
        cmd[2:2] = ["-l", "--inlines"]
    insns = parse_objdump(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    if not lines:
        for i in insns:
            i.chain = ((name, "", 0),)
    return tuple(insns)


# ---------------------------------------------------------------------------------- control flow


def _is_jump(i: Insn) -> bool:
    return i.op.startswith("j")


def _ends_block(i: Insn) -> bool:
    return _is_jump(i) or i.op.startswith("ret") or i.op == "ud2"


def _counted(i: Insn) -> bool:
    return "nop" not in i.op and i.op != "xchg %ax,%ax"


@dataclass
class Loop:
    header: int
    blocks: set[int]
    latches: set[int]
    children: list[Loop] = field(default_factory=list)
    parent: Loop | None = None

    def own(self) -> set[int]:
        """Blocks of this loop outside its nested loops."""
        inner = set().union(*(c.blocks for c in self.children)) if self.children else set()
        return self.blocks - inner


@dataclass
class Cfg:
    insns: tuple[Insn, ...]
    blocks: list[tuple[int, int]]  # [start, end) indices into insns
    succ: list[list[int]]
    loops: list[Loop]

    def block_insns(self, b: int) -> tuple[Insn, ...]:
        a, e = self.blocks[b]
        return self.insns[a:e]


def build_cfg(insns: tuple[Insn, ...]) -> Cfg:
    """Basic blocks, successors and the natural loops (nested) of one function."""
    where = {i.addr: k for k, i in enumerate(insns)}
    leaders = {0}
    for k, i in enumerate(insns):
        if _is_jump(i) and i.target in where:
            leaders.add(where[i.target])
        if _ends_block(i) and k + 1 < len(insns):
            leaders.add(k + 1)
    starts = sorted(leaders)
    blocks = list(zip(starts, starts[1:] + [len(insns)], strict=True))
    index = {insns[a].addr: b for b, (a, _) in enumerate(blocks)}
    succ: list[list[int]] = []
    for b, (_a, e) in enumerate(blocks):
        last, out = insns[e - 1], []
        if _is_jump(last):
            if last.target in index:
                out.append(index[last.target])
            if last.op != "jmp" and b + 1 < len(blocks):
                out.append(b + 1)
        elif not _ends_block(last) and b + 1 < len(blocks):
            out.append(b + 1)
        succ.append(out)
    return Cfg(insns, blocks, succ, _natural_loops(succ))


def _dominators(succ: list[list[int]]) -> list[int]:
    """Immediate dominators (Cooper, Harvey and Kennedy's iteration in reverse post-order), -1 where a block
    is unreachable from the entry."""
    order, seen, stack = [], {0}, [(0, iter(succ[0]))]
    while stack:  # post-order without recursion
        node, it = stack[-1]
        nxt = next((s for s in it if s not in seen), None)
        if nxt is None:
            order.append(node)
            stack.pop()
        else:
            seen.add(nxt)
            stack.append((nxt, iter(succ[nxt])))
    rpo = order[::-1]
    number = {b: k for k, b in enumerate(rpo)}
    pred: list[list[int]] = [[] for _ in succ]
    for u, out in enumerate(succ):
        for v in out:
            pred[v].append(u)
    idom = [-1] * len(succ)
    idom[0] = 0
    changed = True
    while changed:
        changed = False
        for b in rpo[1:]:
            new = -1
            for p in pred[b]:
                if idom[p] == -1:
                    continue
                if new == -1:
                    new = p
                    continue
                x, y = p, new
                while x != y:
                    while number[x] > number[y]:
                        x = idom[x]
                    while number[y] > number[x]:
                        y = idom[y]
                new = x
            if new != idom[b]:
                idom[b], changed = new, True
    return idom


def _dominates(idom: list[int], h: int, u: int) -> bool:
    while u != h and u > 0 and idom[u] not in (-1, u):
        u = idom[u]
    return u == h


def _natural_loops(succ: list[list[int]]) -> list[Loop]:
    """Back edges u -> h (h dominates u) and the blocks that reach u backwards without passing h, merged per
    header h."""
    idom = _dominators(succ)
    pred: list[list[int]] = [[] for _ in succ]
    for u, out in enumerate(succ):
        for v in out:
            pred[v].append(u)
    by_header: dict[int, Loop] = {}
    for u, out in enumerate(succ):
        for h in out:
            if idom[u] == -1 or not _dominates(idom, h, u):
                continue
            body, stack = {h, u}, [u] if u != h else []
            while stack:
                for p in pred[stack.pop()]:
                    if p not in body:
                        body.add(p)
                        stack.append(p)
            loop = by_header.setdefault(h, Loop(h, set(), set()))
            loop.blocks |= body
            loop.latches.add(u)
    loops = sorted(by_header.values(), key=lambda lp: len(lp.blocks))
    for k, lp in enumerate(loops):  # the parent: the smallest larger loop holding the header
        lp.parent = next((o for o in loops[k + 1 :] if lp.header in o.blocks), None)
        if lp.parent is not None:
            lp.parent.children.append(lp)
    return loops


# ---------------------------------------------------------------------------------------- counting


_IMM_ADD = re.compile(r"^\$(0x[0-9a-f]+),%(\w+)$")
_LEA = re.compile(r"^(0x[0-9a-f]+)\(%(\w+)(?:,%\w+,\d)?\),%(\w+)$")
_CMP_IMM = re.compile(r"^\$(0x[0-9a-f]+),%(\w+)$")


def increments(insns) -> set[int]:
    """Constant increments in ``insns``: ``add $k``, ``sub $-k``, ``lea k(...)``, ``inc``."""
    out = set()
    for i in insns:
        if i.op in ("add", "sub") and (m := _IMM_ADD.match(i.args)):
            v = int(m.group(1), 16)
            out.add(v if i.op == "add" else (1 << 64) - v)
        elif i.op == "lea" and (m := _LEA.match(i.args)):
            out.add(int(m.group(1), 16))
        elif i.op == "inc":
            out.add(1)
    return out


def trip_count(cfg: Cfg, loop: Loop) -> int | None:
    """A constant trip count: a latch ends with ``cmp $N,%r`` + branch and the loop adds a constant ``k`` to
    ``%r`` (from 0: N / k), else None."""
    for u in loop.latches:
        body = cfg.block_insns(u)
        cmp = next((i for i in reversed(body) if i.op == "cmp"), None)
        m = _CMP_IMM.match(cmp.args) if cmp else None
        if not m:
            continue
        reg, n = m.group(2), int(m.group(1), 16)
        for b in loop.blocks:
            for i in cfg.block_insns(b):
                a = _IMM_ADD.match(i.args)
                if i.op == "add" and a and a.group(2) == reg and int(a.group(1), 16) > 0:
                    return max(1, math.ceil(n / int(a.group(1), 16)))
    return None


@dataclass
class Path_:
    """The instructions a path issues (callees and constant-trip loops expanded) and notes on estimates."""

    insns: list[Insn]
    unknown_trips: int = 0

    @property
    def count(self) -> int:
        return sum(1 for i in self.insns if _counted(i))


class Counter:
    """Longest/shortest paths through a loop body or a function, calls expanded into the callee's path."""

    def __init__(self, lib: str):
        self.lib = lib
        self.by_addr = {a: n for n, (a, _s) in symbols(lib).items()} if lib else {}

    @functools.lru_cache(maxsize=256)  # noqa: B019 - one Counter per run
    def cfg(self, name: str, lines: bool = True) -> Cfg:
        return build_cfg(disassemble(self.lib, name, lines))

    @functools.lru_cache(maxsize=256)  # noqa: B019
    def callee(self, addr: int) -> Path_:
        """A called function's longest path from its entry to a return."""
        name = self.by_addr.get(addr)
        if name is None:
            return Path_([])
        cfg = self.cfg(name, lines=False)
        top = [lp for lp in cfg.loops if lp.parent is None]
        return self._path(cfg, set(range(len(cfg.blocks))), top, 0, None, longest=True)

    def _block_path(self, cfg: Cfg, b: int, keep) -> Path_:
        out, unknown = [], 0
        for i in cfg.block_insns(b):
            if keep is not None and not keep(i):
                continue
            out.append(i)
            if i.op.startswith("call") and i.target is not None:
                sub = self.callee(i.target)
                out += sub.insns
                unknown += sub.unknown_trips
        return Path_(out, unknown)

    def _loop_node(self, cfg: Cfg, lp: Loop, keep) -> Path_:
        """A nested loop run to completion: its body's longest path times its trip count (once if unknown)."""
        body = self.loop_path(cfg, lp, keep, longest=True)
        trips = trip_count(cfg, lp)
        return Path_(body.insns * (trips or 1), body.unknown_trips + (trips is None and body.count > 0))

    def loop_path(self, cfg: Cfg, lp: Loop, keep=None, longest=True, partial=False) -> Path_:
        """One iteration of ``lp``: from its header back to it, its nested loops run to completion; ``keep``:
        the instructions that count (None: all); ``partial``: also the paths through the partial-vector
        helpers."""
        return self._path(cfg, lp.own(), lp.children, lp.header, lp, longest, keep, partial)

    def _partial(self, cfg: Cfg, b: int) -> bool:
        """Block ``b`` calls a layer's partial-vector helper (``ld16_part``, ``u_store8_part``, ...)."""
        return any(
            i.op.startswith("call") and "_part" in self.by_addr.get(i.target, "") for i in cfg.block_insns(b)
        )

    def _path(self, cfg, own, children, entry, loop, longest, keep=None, partial=False) -> Path_:
        """The longest (shortest) path from ``entry`` through ``own`` blocks and the ``children`` loops (each
        a node run to completion) to the end: back to ``loop``'s header, or a return where ``loop`` is None.
        Unless ``partial``, the path with the fewest blocks that call a partial-vector helper."""
        node_of = {b: ("b", b) for b in own}
        for c in children:
            node_of.update({b: ("l", id(c)) for b in c.blocks})
        kids = {id(c): c for c in children}
        avoid = set() if partial else {b for b in own if self._partial(cfg, b)}

        @functools.cache
        def weight(node) -> Path_:
            kind, ref = node
            if kind == "b":
                return self._block_path(cfg, ref, keep)
            return self._loop_node(cfg, kids[ref], keep)

        def outs(node):
            kind, ref = node
            blocks = [ref] if kind == "b" else [b for b in kids[ref].blocks]
            seen = []
            for b in blocks:
                for s in cfg.succ[b]:
                    if loop is not None and s == loop.header:
                        seen.append(None)  # back to the header: the iteration's end
                    elif s in node_of and node_of[s] != node:
                        seen.append(node_of[s])
                    elif s not in node_of and loop is None:
                        seen.append(None)
            if loop is None and kind == "b" and not cfg.succ[ref]:
                seen.append(None)  # a return
            return list(dict.fromkeys(seen))

        sign = 1 if longest else -1

        @functools.cache
        def best(node) -> tuple[int, int, tuple]:
            """(-partial blocks, +-count, nodes) of the best path from ``node`` to the end: the fewest partial
            blocks first, then the most (longest) or fewest instructions."""
            options = [(0, 0, ()) if nxt is None else best(nxt) for nxt in outs(node)]
            if not options:
                return (-(10**9), 0, ())  # an exit of the loop: no iteration ends here
            tail = max(options, key=lambda o: o[:2])
            own = 1 if node[0] == "b" and node[1] in avoid else 0
            return (tail[0] - own, tail[1] + sign * weight(node).count, (node,) + tail[2])

        sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))
        _partials, _count, nodes = best(node_of[entry])
        path = Path_([])
        for n in nodes:
            w = weight(n)
            path.insns += w.insns
            path.unknown_trips += w.unknown_trips
        return path


_VREG = re.compile(r"%[xyz]mm\d+")
_STACK = re.compile(r"-?(?:0x[0-9a-f]+)?\(%r[sb]p(?:,[^)]*)?\)")
_NOT_SPILL = re.compile(
    r"^(v?pbroadcast|vbroadcast|v?movs[sd]$|v?mov[dq]$|v?pinsr|vinsert|v?movhp|v?movlp|v?pextr)"
)


def spills(insns) -> tuple[int, int]:
    """(stores, loads) of whole vector registers to and from the stack: a vector instruction whose memory
    operand is rsp/rbp-relative (the destination: a store), except broadcasts and scalar moves."""
    stores = loads = 0
    for i in insns:
        if not _VREG.search(i.args) or not _STACK.search(i.args) or _NOT_SPILL.match(i.op):
            continue
        ops = [o.strip() for o in re.split(r",(?![^(]*\))", i.args)]
        if _STACK.search(ops[-1]):
            stores += 1
        else:
            loads += 1
    return stores, loads


# ------------------------------------------------------------------------------------------ llvm-mca


def mca_cycles(insns, cpu: str) -> dict | None:
    """llvm-mca's simulated cycles per iteration of ``insns`` (branches, calls and NOPs dropped) and its
    static reciprocal throughput, or None without llvm-mca or where it does not take the input."""
    exe = shutil.which("llvm-mca") or shutil.which("llvm-mca-14")
    body = [i.text for i in insns if _counted(i) and not (_is_jump(i) or i.op.startswith(("call", "ret")))]
    if exe is None or not body:
        return None
    iterations = max(10, min(100, 20000 // len(body)))
    cmd = [exe, f"-mcpu={cpu}", f"-iterations={iterations}", "-"]
    proc = subprocess.run(cmd, input="\n".join(body) + "\n", capture_output=True, text=True)
    total = re.search(r"Total Cycles:\s+(\d+)", proc.stdout)
    rthr = re.search(r"Block RThroughput:\s+([\d.]+)", proc.stdout)
    if proc.returncode != 0 or not total:
        return None
    return {"cycles": int(total.group(1)) / iterations, "rthroughput": float(rthr.group(1)) if rthr else None}


# -------------------------------------------------------------------------------------- the analysis


def _frames_match(i: Insn, spec: CLoop, lines: range, via: int | None) -> bool:
    inside = any(f == spec.func and file == "mx.h" and line in lines for f, file, line in i.chain)
    if not inside or via is None:
        return inside
    return any(f == spec.via[0] and file == "mx.h" and line == via for f, file, line in i.chain)


def find_loop(cfg: Cfg, spec: CLoop) -> tuple[Loop | None, int]:
    """The machine loop of ``spec``: of the loops whose control (header, latch or exiting blocks) holds an
    instruction of the loop statement's first line (its condition and increment; through ``via``), the
    innermost; the one with the most such instructions where several are (copies), and how many there were."""
    lines, via = loop_lines(spec)
    head = range(lines.start, lines.start + 1)
    hits = {}
    for lp in cfg.loops:
        control = (
            {lp.header} | lp.latches | {b for b in lp.blocks if any(s not in lp.blocks for s in cfg.succ[b])}
        )
        n = sum(
            _counted(i) and _frames_match(i, spec, head, via) for b in control for i in cfg.block_insns(b)
        )
        if n:
            hits[id(lp)] = (lp, n)
    # drop a loop that holds another candidate (an outer loop with hoisted code of the statement)
    inner = [(lp, n) for lp, n in hits.values() if not any(id(c) in hits for c in _descendants(lp))]
    if not inner:
        return None, 0
    return max(inner, key=lambda t: t[1])[0], len(inner)


def _descendants(lp: Loop):
    for c in lp.children:
        yield c
        yield from _descendants(c)


def analyse_loop(counter: Counter, cfg: Cfg, spec: CLoop, isa: str, mca: bool, detail: bool) -> dict:
    row = {"loop": spec.name, "what": spec.what, "found": False}
    lp, copies = find_loop(cfg, spec)
    if lp is None:
        return row
    lines, via = loop_lines(spec)
    keep = None
    if spec.upto:  # only the loop's own lines up to ``upto`` (the inner loop's call is another row)
        keep = lambda i: _frames_match(i, spec, lines, via)  # noqa: E731
    path = counter.loop_path(cfg, lp, keep, longest=True, partial=spec.partial)
    short = counter.loop_path(cfg, lp, keep, longest=False, partial=spec.partial)
    own = [i for b in lp.own() for i in cfg.block_insns(b)]
    incs = increments(own)
    st, ld = spills(path.insns)
    el = spec.elements
    calls = sum(1 for b in sorted(lp.own()) for i in cfg.block_insns(b) if i.op.startswith("call"))
    row.update({
        "found": True, "copies": copies, "instr": path.count, "min": short.count,
        "own": sum(1 for b in lp.own() for i in cfg.block_insns(b) if _counted(i)),
        "calls": calls, "unknown_trips": path.unknown_trips, "elements": el,
        "per_element": round(path.count / el, 3) if el else None,
        "spill_stores": st, "spill_loads": ld, "spills": st + ld,
        "induction": any(spec.step * s in incs for s in (1, 2, 4)),
    })  # fmt: skip
    if mca:
        m = mca_cycles(path.insns, MCA_CPU[isa])
        if m:
            row["mca_cpu"] = MCA_CPU[isa]
            row["mca_cycles"] = round(m["cycles"], 2)
            row["mca_rthroughput"] = m["rthroughput"]
            row["mca_per_element"] = round(m["cycles"] / el, 3) if el else None
    if detail:
        funcs = collections.Counter(_source_function(i) for i in path.insns if _counted(i))
        row["by_function"] = dict(funcs.most_common())
    return row


def _source_function(i: Insn) -> str:
    """The innermost function of csrc (not of a compiler's intrinsic header) an instruction comes from."""
    return next((f for f, file, _line in i.chain if not file.endswith("intrin.h")), i.chain[0][0])


def analyse(lib: str, isas=ISAS, phases=None, mca: bool = True, detail: bool = False) -> list[dict]:
    """One row per (ISA, phase, hot loop); a missing phase symbol gives a row with ``found`` False."""
    counter, syms, rows = Counter(lib), symbols(lib), []
    names = [f"swiglu_{p}_{isa}" for isa in isas for p in PHASES if not phases or p in phases]
    with ThreadPoolExecutor(max_workers=2) as pool:  # objdump runs in its own process: two at a time
        list(pool.map(lambda n: disassemble(lib, n), [n for n in names if n in syms]))
    for isa in isas:
        for phase, specs in PHASES.items():
            if phases and phase not in phases:
                continue
            name = f"swiglu_{phase}_{isa}"
            if name not in syms:
                rows += [
                    {"isa": isa, "phase": phase, "loop": s.name, "found": False, "missing": name}
                    for s in specs
                ]
                continue
            cfg = counter.cfg(name)
            for spec in specs:
                rows.append(
                    {"isa": isa, "phase": phase, **analyse_loop(counter, cfg, spec, isa, mca, detail)}
                )
    return rows


# ------------------------------------------------------------------------------------------ limits


def _per(r: dict, count: int) -> float:
    """``count`` instructions of one iteration of ``r``'s loop per element (else per iteration)."""
    return round(count / r["elements"], 3) if r["elements"] else count


def check(rows: list[dict], limits: dict) -> list[str]:
    """What breaks the limits: a row over its instructions per element (per iteration where it has no
    elements) or spills per iteration, a limit without a row, a row not found or without its induction."""
    problems = []
    seen = set()
    for r in rows:
        key = (r["isa"], r["phase"], r["loop"])
        seen.add(key)
        lim = limits.get(r["isa"], {}).get(r["phase"], {}).get(r["loop"])
        if not r["found"]:
            problems.append(f"{'/'.join(key)}: not found in the library")
            continue
        if lim is None:
            problems.append(f"{'/'.join(key)}: no limit in the limits file")
            continue
        if not r["induction"]:
            problems.append(f"{'/'.join(key)}: no induction increment of the C loop's step")
        value = r["per_element"] if r["elements"] else r["instr"]
        unit = "instr/element" if r["elements"] else "instr/iteration"
        if value > lim["instr"]:
            problems.append(f"{'/'.join(key)}: {value} {unit} over the limit {lim['instr']}")
        shortest = _per(r, r["min"])
        if "min" in lim and shortest > lim["min"]:
            problems.append(
                f"{'/'.join(key)}: {shortest} {unit} on the shortest path over the limit {lim['min']}"
            )
        if r["spills"] > lim["spills"]:
            problems.append(f"{'/'.join(key)}: {r['spills']} spills/iteration over the limit {lim['spills']}")
    for isa, phases in limits.items():
        for phase, loops in phases.items():
            for loop in loops:
                if (isa, phase, loop) not in seen:
                    problems.append(f"{isa}/{phase}/{loop}: limited but not analysed")
    return problems


def limits_from(rows: list[dict], headroom: float = 0.10) -> dict:
    """Limits at ``rows``' numbers plus ``headroom`` (spills: + max(1, 10 %))."""
    out: dict = {}
    for r in rows:
        if not r["found"]:
            continue
        value = r["per_element"] if r["elements"] else r["instr"]
        out.setdefault(r["isa"], {}).setdefault(r["phase"], {})[r["loop"]] = {
            "instr": round(value * (1 + headroom), 2),
            "min": round(_per(r, r["min"]) * (1 + headroom), 2),
            "spills": r["spills"] + max(1, math.ceil(r["spills"] * headroom)),
        }
    return out


def limits_json(limits: dict) -> str:
    """The limits file's text: one line per (ISA, phase)."""
    isas = []
    for isa, phases in limits.items():
        lines = [f"  {json.dumps(phase)}: {json.dumps(loops)}" for phase, loops in phases.items()]
        isas.append(f" {json.dumps(isa)}: {{\n" + ",\n".join(lines) + "\n }")
    return "{\n" + ",\n".join(isas) + "\n}\n"


# ------------------------------------------------------------------------------------------ report


def _fmt(v, spec="{:.2f}") -> str:
    return "-" if v is None else spec.format(v)


#: The table's columns: heading and alignment/width.
COLUMNS = (
    ("isa", "<11"), ("phase", "<20"), ("loop", "<10"), ("instr", ">6"), ("min", ">6"), ("el", ">4"),
    ("instr/el", ">8"), ("spill st/ld", ">11"), ("calls", ">5"), ("mca cpu", "<14"), ("mca cyc/it", ">10"),
    ("mca cyc/el", ">10"),
)  # fmt: skip


def table(rows: list[dict], markdown: bool = False) -> str:
    def line(cells) -> str:
        if markdown:
            return "| " + " | ".join(cells) + " |"
        return " ".join(f"{c:{fmt}}" for c, (_h, fmt) in zip(cells, COLUMNS, strict=True)).rstrip()

    lines = [line([h for h, _f in COLUMNS])]
    if markdown:
        lines.append("|" + "---|" * len(COLUMNS))
    for r in rows:
        if not r["found"]:
            cells = [r["isa"], r["phase"], r["loop"], "MISSING"] + [""] * (len(COLUMNS) - 4)
        else:
            cells = [
                r["isa"], r["phase"], r["loop"], f"{r['instr']}{'?' if r['unknown_trips'] else ''}",
                str(r["min"]), _fmt(r["elements"], "{:g}"), _fmt(r["per_element"]),
                f"{r['spill_stores']}/{r['spill_loads']}", str(r["calls"]), r.get("mca_cpu", "-"),
                _fmt(r.get("mca_cycles"), "{:.1f}"), _fmt(r.get("mca_per_element")),
            ]  # fmt: skip
        lines.append(line(cells))
        if not markdown and r.get("by_function"):
            lines.append("    functions: " + ", ".join(f"{k} {v}" for k, v in r["by_function"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lib", help="the library to read (default: the one the package loads)")
    p.add_argument("--isa", nargs="+", choices=ISAS, default=list(ISAS))
    p.add_argument("--phase", nargs="+", choices=sorted(PHASES), help="default: every phase")
    p.add_argument("--detail", action="store_true", help="instructions per source function on each path")
    p.add_argument("--no-mca", action="store_true", help="skip llvm-mca")
    p.add_argument("--json", help="write the rows to this file")
    p.add_argument("--check", nargs="?", const=str(LIMITS), help="exit 1 over the limits of this file")
    p.add_argument("--write-limits", help="write limits at today's numbers + 10 %% to this file")
    p.add_argument("--no-results", action="store_true", help="do not write benchmarks/results/x86_budget.*")
    args = p.parse_args(argv)
    lib = args.lib or library_path()
    rows = analyse(lib, args.isa, args.phase, mca=not args.no_mca, detail=args.detail)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"library": lib, "rows": rows}, indent=1))
    full = set(args.isa) == set(ISAS) and not args.phase
    if full and not args.no_results and not args.lib:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "x86_budget.json").write_text(json.dumps({"rows": rows}, indent=1) + "\n")
        (RESULTS / "x86_budget.md").write_text(
            "# x86 instruction budget (benchmarks/x86_budget.py)\n\n" + table(rows, markdown=True) + "\n"
        )
    if args.write_limits:
        Path(args.write_limits).write_text(limits_json(limits_from(rows)))
    if args.check:
        problems = check(rows, json.loads(Path(args.check).read_text()))
        for line in problems:
            print("OVER:", line)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
