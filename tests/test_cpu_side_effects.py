"""The cpu backend leaves the threads it uses as it found them (docs/cpu_backend.md, Parallel).

A call of an MX operator used to leave exception flags (IE, DE, OE, UE) raised in the caller's MXCSR (its
first call built an activation table on the calling thread) and, through inheritance, in the OpenMP thread
that libgomp started inside the call; the issue saw PyTorch's next parallel operation compute other bits on
its second thread, now and then. Each case runs in a fresh process (a child forked from one subprocess that
has imported torch and swiglu_ops but used neither, so that every child makes the library's first call):

* the MXCSR of the calling thread and of every thread of PyTorch's OpenMP team, read before and after a call
  (the team's threads from inside a GOMP_parallel region of the same libgomp, as PyTorch's own operations
  run there), must be unchanged: with the caller's default MXCSR and with a non-default one (FTZ, DAZ,
  rounding up), with the team started before the call and started by it;
* the issue's reproduction (the same ``torch.exp`` twice right after the call) must give equal bits, with
  MKL's VML primed on one thread first: the issue's flake was MKL's own race at a process's first VML call
  (docs/cpu_backend.md, Floating-point environment), which any parallel torch operation right before that
  call sets up as well as ours; primed, the check tests what this library leaves behind, not that race.

Both MX operators, and both ways a job runs (PyTorch's OpenMP team, ``SWIGLU_OPS_CPU_POOL=own``).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

import swiglu_ops
from swiglu_ops.backends import cpu

pytestmark = [
    pytest.mark.skipif(cpu.LIBRARY.lib is None, reason=f"cpu backend unavailable: {cpu.LIBRARY.why}"),
    pytest.mark.skipif(
        not (sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")),
        reason="reads the MXCSR with x86-64 machine code, forks",
    ),
]

REPRO_CHILDREN = 10  # per operator and pool (the flake was 1 in 100-800 processes: a smoke check)

CHILD = textwrap.dedent(
    r"""
    import ctypes, mmap, os, sys
    import torch
    import swiglu_ops

    # stmxcsr [rsp-4]; mov eax, [rsp-4]; ret  /  mov [rsp-4], edi; ldmxcsr [rsp-4]; ret
    code = bytes.fromhex("0fae5c24fc8b4424fcc3" "897c24fc0fae5424fcc3")
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    base = ctypes.addressof(ctypes.c_char.from_buffer(page))
    get_csr = ctypes.CFUNCTYPE(ctypes.c_uint)(base)
    set_csr = ctypes.CFUNCTYPE(None, ctypes.c_uint)(base + 10)
    gomp = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)  # PyTorch's, already loaded
    gomp.omp_get_thread_num.restype = ctypes.c_int
    THREADS = 2
    torch.set_num_threads(THREADS)

    def team_csr():
        seen = {}
        def body(_):
            csr = get_csr()
            seen[gomp.omp_get_thread_num()] = csr
        cb = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(body)
        gomp.GOMP_parallel(cb, None, THREADS, 0)
        return [seen.get(i) for i in range(THREADS)]

    def call(op, x, yg):
        if op == "bwd":
            swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, yg, backend="cpu")
        else:
            swiglu_ops.swiglu_mx_quant_dual_axis(x, backend="cpu")

    def state_case(op, warm, csr):
        torch.manual_seed(0)
        x = (torch.randn(40, 128) * 3).bfloat16()
        yg = torch.randn(40, 64).bfloat16()
        if warm:
            set_csr(csr)
            team_csr()  # the team exists before the call, started with the caller's MXCSR
        problems = []
        for i in range(2):  # the first call builds the activation table, the second finds it
            set_csr(csr)
            call(op, x, yg)
            after = get_csr()
            set_csr(csr)  # so that reading the team does not see the caller's flags through a new thread
            team = team_csr()
            set_csr(0x1FA0)
            if after != csr or any(v != csr for v in team):
                problems.append(
                    f"call {i + 1}: caller {after:#06x}, team {[hex(v) for v in team]}, expected {csr:#06x}"
                )
        return problems

    def repro_case(op):
        x = (torch.randn(40, 128) * 3).bfloat16()
        yg = torch.randn(40, 64).bfloat16()
        t = -(x[:, :64].float())
        # MKL picks its VML kernels at the process's first VML call and stores the CPU type in two steps
        # (raw, then remapped): a thread entering meanwhile reads the raw value and runs the AVX2 EP kernel
        # where PyTorch asks for HA. Our call leaves PyTorch's team spinning, as any parallel torch op
        # would, so both threads of the next exp enter together. 16 elements (< the grain) run inline.
        torch.exp(torch.zeros(16))
        call(op, x, yg)
        a, b = torch.exp(t), torch.exp(t)
        if torch.equal(a, b):
            return []
        d = (a != b).nonzero()
        return [f"exp differs right after the call in {len(d)} elements, first {d[0].tolist()}"]

    def in_child(fn, *args):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                msg = "\n".join(fn(*args))
            except BaseException as exc:
                msg = f"{type(exc).__name__}: {exc}"
            os.write(w, msg.encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            out = f.read().decode()
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            out += f" (exit status {os.waitstatus_to_exitcode(status)})"
        return out

    pool, n_repro = sys.argv[1], int(sys.argv[2])
    failures = []
    for op in ("bwd", "fwd"):
        for warm in (False, True):
            for csr in (0x1FA0, 0xDFE0):  # default (inexact flag set); FTZ + DAZ + round up
                msg = in_child(state_case, op, warm, csr)
                if msg:
                    failures.append(f"{pool} {op} warm={warm} csr={csr:#06x}: {msg}")
        bad = [m for m in (in_child(repro_case, op) for _ in range(n_repro)) if m]
        if bad:
            failures.append(f"{pool} {op}: {len(bad)} of {n_repro} processes: {bad[0]}")
    print("\n".join(failures) if failures else "OK")
    """
)


@pytest.mark.slow(20)
@pytest.mark.parametrize("pool", ["auto", "own"])
def test_calls_leave_threads_as_found(pool):
    env = dict(os.environ, SWIGLU_OPS_CPU_POOL=pool, OMP_NUM_THREADS="2")
    src = os.path.dirname(os.path.dirname(os.path.abspath(swiglu_ops.__file__)))  # the tree under test
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, pool, str(REPRO_CHILDREN)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "OK", proc.stdout + proc.stderr[-2000:]


FORK_CHILD = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import swiglu_ops
    torch.set_num_threads(2)
    (torch.randn(2048, 2048) * 2).sum()  # PyTorch's OpenMP team now exists in this (the parent) process
    if sys.argv[1] == "loaded":  # the cpu backend loaded before the fork, but no job on two threads yet
        swiglu_ops.clipped_swiglu(torch.randn(2, 8), backend="cpu")
    g = torch.randn(256, 2048).to(torch.bfloat16)
    dy = torch.randn(256, 1024).to(torch.bfloat16)
    pid = os.fork()
    if pid == 0:  # the child's first job on two threads
        swiglu_ops.swiglu_group_grad(dy, g, backend="cpu")
        os._exit(0)
    t0 = time.time()
    while time.time() - t0 < 30:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            print("status", status)
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("HUNG")
    """
)


@pytest.mark.slow(10)
@pytest.mark.parametrize("before_fork", ["imported", "loaded"])
def test_a_forked_child_runs_its_first_job_on_its_own_threads(before_fork):
    """A child forked from a process with PyTorch's OpenMP team: the parent's team does not survive fork, so
    the child's jobs run on the library's own pool. Its first job on two threads used to hang for good when
    the backend was first used (or first loaded) after the fork: the library took the child for the
    process that owns the team (e.g. DataLoader workers with more than one thread)."""
    env = dict(os.environ, OMP_NUM_THREADS="2")
    env.pop("SWIGLU_OPS_CPU_POOL", None)
    src = os.path.dirname(os.path.dirname(os.path.abspath(swiglu_ops.__file__)))  # the tree under test
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", FORK_CHILD, before_fork], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "status 0", proc.stdout + proc.stderr[-2000:]
