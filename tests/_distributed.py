"""Run a test body on a small ``gloo`` process group on CPU, spawned by the test itself.

``run_on_group(worker, world_size=2, timeout=120, args=())`` starts ``world_size`` fresh processes (spawn:
nothing of the parent's state leaks in), each of which joins a ``gloo`` group on a free localhost port and
calls ``worker(rank, world_size, *args)``; it ends each worker with ``dist.barrier()`` before
``destroy_process_group`` (torch 2.13 needs the barrier) and fails the test with the worker's traceback if one
raises, crashes or does not finish within ``timeout`` seconds (the group is then killed, nothing hangs).
``worker`` must be a module-level function of an importable module (a test module is one).

What a worker returns is sent back: ``run_on_group`` returns the list of the ranks' results. Tensors that a
worker returns must be plain CPU tensors (FP8 and E8M0 tensors cannot cross a collective on torch 2.13: view
them as uint8 when a worker exchanges them).
"""

from __future__ import annotations

import io
import os
import socket
import time
import traceback

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world_size, port, worker, args, results):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        buf = io.BytesIO()
        torch.save(worker(rank, world_size, *args), buf)  # bytes: shared-memory tensors die with the rank
        results.put((rank, "ok", buf.getvalue()))
    except BaseException:  # noqa: BLE001 - reported to the parent with its traceback
        results.put((rank, "error", traceback.format_exc()))
        raise
    finally:
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def run_on_group(worker, world_size: int = 2, timeout: float = 120.0, args=()) -> list:
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(r, world_size, port, worker, args, results), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    got = {}
    try:
        while len(got) < world_size and time.monotonic() < deadline:
            if results.empty():
                if any(p.exitcode not in (None, 0) for p in procs) and results.empty():
                    break  # a rank died without reporting (a crash)
                time.sleep(0.05)
                continue
            rank, status, payload = results.get()
            if status == "error":
                raise AssertionError(f"rank {rank} failed:\n{payload}")
            got[rank] = torch.load(io.BytesIO(payload), weights_only=False)
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    finally:
        alive = [p for p in procs if p.is_alive()]
        for p in alive:
            p.kill()
    if alive:
        raise AssertionError(f"the gloo group did not finish within {timeout} s (ranks {sorted(got)} done)")
    bad = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode != 0]
    if bad or len(got) != world_size:
        raise AssertionError(f"ranks exited with {bad} (results from ranks {sorted(got)})")
    return [got[r] for r in range(world_size)]
