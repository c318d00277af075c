"""Every public operator x backend x tensor kind: the right result or a clear error, never a crash.

A *tensor kind* is how an argument reaches the operator: plain, non-contiguous, a FakeTensor (inside and
outside ``FakeTensorMode``), a meta tensor, a negative/conjugate view (``torch._neg_view``,
``z.conj().imag``), torch's ``TwoTensor``, a minimal wrapper subclass that unwraps in its own
``__torch_dispatch__`` (and one that handles nothing), a DTensor; and for ``out=``: plain, fake, meta,
``TwoTensor``, a negative view, and one that overlaps an input through another storage object (two NumPy
views of one buffer, a DLPack view). The gate of :mod:`swiglu_ops.ops.validate` decides which kinds reach a
kernel through a pointer; a kind it lets through wrongly reads the wrong memory (a wrong result) or
dereferences a fake tensor's null pointer (a crash), which is why every case runs in a subprocess.

The cases run batched: one child process per backend (``python tests/test_tensor_kinds.py <child>``) runs
all operators x kinds, printing ``START <case>`` before and one ``RESULT {json}`` line after each case; the
parent asserts every planned case has a passing result, and a crashed child names the case it died in. The
``mx_dequantize_layouts`` child runs the same input kinds through ``mx_dequantize`` and the layout helpers
(``swiglu_ops.layouts``), the ``dtensor`` child every public function on DTensors.

Expectations:

- kinds that compute (non-contiguous, negative/conjugate inputs, TwoTensor, the unwrapping subclass, plain
  ``out=``) give bitwise the outputs of the plain call (same inputs, same bits, on every backend);
- fake and meta inputs give fake / meta outputs of the plain call's shapes and dtypes;
- kinds that cannot be served (fake tensors beside real ones or under a ``FakeTensorMode`` that refuses real
  ones, a meta ``group_index`` beside CPU data, fake / meta / subclass / negative ``out=``, an ``out=``
  overlapping an input, ``out=`` with a subclass input) raise a ``TypeError`` / ``ValueError`` whose
  message names the argument; a subclass that handles no op gets torch's ``TypeError`` naming the subclass;
- ``mx_dequantize`` with bad cumulative ends (counts, decreasing, negative, short, float, on another device)
  raises;
- DTensor (1-process gloo group, 1-device CPU mesh, ``Replicate()``): a DTensor result equal to the plain
  one, or the ``NotImplementedError`` of DTensor's missing sharding strategy.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

#: the children: one per backend, the DTensor run (reference and cpu backends), mx_dequantize and the layouts
CHILDREN = ("reference", "cpu", "triton", "dtensor", "mx_dequantize_layouts")
#: seconds a child may take (the triton one runs its kernels in Triton's interpreter)
CHILD_TIMEOUT = 240


# =============================================================================================== parent


def _child_env(name: str) -> dict:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    if name in ("triton", "dtensor"):
        env["TRITON_INTERPRET"] = "1"  # Triton runs on CPU tensors only in its interpreter
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _needed_backends(name: str) -> tuple[str, ...]:
    return {"dtensor": ("reference",), "mx_dequantize_layouts": ()}.get(name, (name,))


def _unavailable(name: str) -> str | None:
    import swiglu_ops

    for backend in _needed_backends(name):
        if backend == "triton":  # available in the child, which sets TRITON_INTERPRET=1 before importing it
            if importlib.util.find_spec("triton") is None:
                return "triton is not installed"
        elif backend not in swiglu_ops.available_backends("cpu"):
            return swiglu_ops.ops.registry.backend_status(backend, "cpu")[1]
    return None


@pytest.mark.parametrize(
    "child", [pytest.param(c, marks=pytest.mark.slow(seconds=30)) if c == "triton" else c for c in CHILDREN]
)
def test_tensor_kinds(child):
    why = _unavailable(child)
    if why is not None:
        pytest.skip(f"{child}: {why}")
    try:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), child],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT,
            env=_child_env(child),
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{child}: the child ran past {CHILD_TIMEOUT}s; its output:\n{exc.stdout}")
    plan, started, results = None, [], {}
    for line in proc.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "PLAN":
            plan = json.loads(rest)
        elif tag == "START":
            started.append(rest)
        elif tag == "RESULT":
            result = json.loads(rest)
            results[result["case"]] = result
    tail = proc.stderr[-4000:]
    assert plan, f"{child}: the child planned no cases (rc {proc.returncode}):\n{tail}"
    missing = [case for case in plan if case not in results]
    if missing or proc.returncode != 0:
        last = started[-1] if started else "(none)"
        pytest.fail(
            f"{child}: the child exited with {proc.returncode} (a negative code is a signal: a crash) during "
            f"case {last!r}; {len(missing)} of {len(plan)} cases have no result: {missing[:8]}\n{tail}"
        )
    failed = [f"{r['case']}: {r['detail']}" for r in results.values() if not r["ok"]]
    assert not failed, f"{child}: {len(failed)} of {len(plan)} cases failed:\n" + "\n".join(failed)


# ================================================================================================ child
#
# Everything below runs in the child process only (torch is imported there).


class Failure(AssertionError):
    """A case that gave the wrong result or the wrong error."""


def _classes():
    """The two minimal wrapper subclasses: one unwraps in ``__torch_dispatch__`` and wraps the results, the
    other handles no op (returns NotImplemented)."""
    import torch
    from torch.utils._pytree import tree_map

    class Unwrapping(torch.Tensor):
        @staticmethod
        def __new__(cls, inner):
            return torch.Tensor._make_wrapper_subclass(
                cls, inner.shape, strides=inner.stride(), dtype=inner.dtype, device=inner.device
            )

        def __init__(self, inner):
            self.inner = inner

        def __repr__(self):
            return f"Unwrapping({self.inner!r})"

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            unwrap = lambda t: t.inner if isinstance(t, Unwrapping) else t  # noqa: E731
            out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
            return tree_map(lambda t: Unwrapping(t) if isinstance(t, torch.Tensor) else t, out)

    class HandlesNothing(Unwrapping):
        def __repr__(self):
            return "HandlesNothing(...)"

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return NotImplemented

    return Unwrapping, HandlesNothing


def _bits(t):
    import torch

    t = t.detach().contiguous()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(-1).view(torch.uint8)


def _flat_outputs(result) -> list:
    if result is None or not isinstance(result, (tuple, list)):
        return [result]
    return list(result)


def _same_bits(label, got, want) -> None:
    import torch

    if want is None:
        if got is not None:
            raise Failure(f"{label}: expected None, got {type(got).__name__}")
        return
    if type(got) is not torch.Tensor:
        raise Failure(f"{label}: expected a plain torch.Tensor, got {type(got).__name__}")
    if got.shape != want.shape or got.dtype != want.dtype or got.device != want.device:
        raise Failure(
            f"{label}: expected {tuple(want.shape)} {want.dtype} on {want.device}, "
            f"got {tuple(got.shape)} {got.dtype} on {got.device}"
        )
    if got.is_neg() or got.is_conj():
        got = got.resolve_neg().resolve_conj()
    if not torch.equal(_bits(got), _bits(want)):
        diff = (_bits(got) != _bits(want)).sum().item()
        raise Failure(f"{label}: {diff} bytes differ from the plain call's result")


def _expect_same(result, base, unwrap=lambda t, label: [(label, t)]) -> str:
    outs = _flat_outputs(result)
    if len(outs) != len(base):
        raise Failure(f"expected {len(base)} outputs, got {len(outs)}")
    for i, (got, want) in enumerate(zip(outs, base, strict=True)):
        if got is None or want is None:
            _same_bits(f"output {i}", got, want)
            continue
        for label, t in unwrap(got, f"output {i}"):
            _same_bits(label, t, want)
    return "bitwise equal to the plain call"


def _expect_shapes(result, base, check) -> str:
    outs = _flat_outputs(result)
    if len(outs) != len(base):
        raise Failure(f"expected {len(base)} outputs, got {len(outs)}")
    for i, (got, want) in enumerate(zip(outs, base, strict=True)):
        if want is None:
            if got is not None:
                raise Failure(f"output {i}: expected None, got {type(got).__name__}")
            continue
        if got.shape != want.shape or got.dtype != want.dtype:
            raise Failure(
                f"output {i}: expected {tuple(want.shape)} {want.dtype}, got {tuple(got.shape)} {got.dtype}"
            )
        problem = check(got)
        if problem:
            raise Failure(f"output {i}: {problem}")
    return "shapes and dtypes of the plain call"


def _expect_error(exc: BaseException | None, types, words) -> str:
    if exc is None:
        raise Failure(f"expected {'/'.join(t.__name__ for t in types)} naming {words}, got a result")
    msg = str(exc)
    if not isinstance(exc, types):
        raise Failure(
            f"expected {'/'.join(t.__name__ for t in types)}, got {type(exc).__name__}: {msg[:300]}\n"
            + "".join(traceback.format_exception(exc))[-1500:]
        )
    absent = [w for w in words if w not in msg]
    if absent:
        raise Failure(f"{type(exc).__name__} message does not name {absent}: {msg[:300]}")
    return f"{type(exc).__name__}: {msg.splitlines()[0][:160]}"


class Case:
    """One call: ``call()`` gives the result (or raises), ``expect(result, exc)`` judges it."""

    def __init__(self, name, call, expect):
        self.name, self.call, self.expect = name, call, expect


def _run(cases) -> None:
    print("PLAN " + json.dumps([c.name for c in cases]), flush=True)
    for case in cases:
        print(f"START {case.name}", flush=True)
        result, exc = None, None
        try:
            result = case.call()
        except Exception as e:  # noqa: BLE001 - judged by the case's expectation
            exc = e
        try:
            detail, ok = case.expect(result, exc), True
        except Failure as f:
            detail, ok = str(f), False
        except Exception as e:  # noqa: BLE001 - a bug in the check itself is a failure too
            detail, ok = f"checking raised {type(e).__name__}: {e}", False
        print("RESULT " + json.dumps({"case": case.name, "ok": ok, "detail": detail}), flush=True)


# ---------------------------------------------------------------------------------- tensor transforms


def _noncontig(t):
    """``t``'s values in a non-contiguous tensor (every other element of the last axis; 1-D too)."""
    import torch

    wide = torch.zeros((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype, device=t.device)
    view = wide[..., ::2]
    view.copy_(t)
    assert not view.is_contiguous() and torch.equal(view, t)
    return view


def _neg(t):
    """``t``'s values behind the negative bit."""
    import torch

    v = torch._neg_view(-t)
    assert v.is_neg()
    return v


def _conj_imag(t):
    """``t``'s values as ``z.conj().imag`` of a complex tensor (a view with the negative bit)."""
    import torch

    z = torch.complex(torch.zeros_like(t), -t)
    v = z.conj().imag
    assert v.is_neg() and torch.equal(v.resolve_neg(), t)
    return v


def _two(t):
    from torch.testing._internal.two_tensor import TwoTensor

    return TwoTensor(t, t.clone())


def _two_parts(t, label):
    from torch.testing._internal.two_tensor import TwoTensor

    if not isinstance(t, TwoTensor):
        raise Failure(f"{label}: expected a TwoTensor, got {type(t).__name__}")
    return [(f"{label}.a", t.a), (f"{label}.b", t.b)]


def _unwrap_parts(t, label):
    if type(t).__name__ != "Unwrapping":
        raise Failure(f"{label}: expected the wrapper subclass, got {type(t).__name__}")
    return [(label, t.inner)]


def _is_fake(t):
    from torch._subclasses.fake_tensor import is_fake

    return None if is_fake(t) else f"not a FakeTensor ({type(t).__name__} on {t.device})"


def _is_meta(t):
    return None if t.device.type == "meta" else f"not a meta tensor ({t.device})"


def _overlapping_out(x, shape, dtype, via: str):
    """``(x2, out)``: ``x2`` holds x's values, ``out`` (``shape``, ``dtype``) starts 16 bytes into x2's
    memory; the two are views of one buffer through two different storage objects (two ``torch.from_numpy``
    views of one NumPy array, or ``torch.from_dlpack`` of a view)."""
    import numpy as np
    import torch

    x_bytes = x.numel() * x.element_size()
    out_bytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
    buf = np.zeros(16 + max(x_bytes, out_bytes) + 64, dtype=np.uint8)
    x2 = torch.from_numpy(buf[:x_bytes]).view(x.dtype).view(x.shape)
    x2.copy_(x)
    if via == "numpy":
        out = torch.from_numpy(buf[16 : 16 + out_bytes])
    else:
        out = torch.from_dlpack(torch.from_numpy(buf)[16 : 16 + out_bytes])
    out = out.view(dtype).view(shape)
    assert x2.untyped_storage()._cdata != out.untyped_storage()._cdata
    return x2, out


# ------------------------------------------------------------------------------------- operator cases


def _operator_cases(backend: str) -> list:
    import numpy as np  # noqa: F401 - imported early: _overlapping_out needs it
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import swiglu_ops
    from swiglu_ops.ops.table import PUBLIC

    unwrapping, handles_nothing = _classes()
    cases = []
    for op in PUBLIC:
        fn = getattr(swiglu_ops, op.name)
        args = op.example(torch.Generator().manual_seed(0), torch.float32, "cpu")
        tensors = [n for n in op.tensor_params if isinstance(args.get(n), torch.Tensor)]
        floats = [n for n in tensors if args[n].is_floating_point()]
        data = floats[-1] if "x" not in floats else "x"
        base = _flat_outputs(fn(**args, backend=backend))

        def call(mapped, *, out=None, mode=None, fn=fn):
            def run():
                kw = {"out": out} if out is not None else {}
                if mode is None:
                    return fn(**mapped, backend=backend, **kw)
                with mode:
                    return fn(**mapped, backend=backend, **kw)

            return run

        def each(transform, names=tensors, args=args):
            return {n: transform(v) if n in names else v for n, v in args.items()}

        def fresh_outs(base=base, fn=fn):
            outs = [None if t is None else torch.empty_like(t) for t in base]
            return outs[0] if len(outs) == 1 else tuple(outs)

        def out_with_first(first, base=base):
            rest = [None if t is None else torch.empty_like(t) for t in base[1:]]
            return first if len(base) == 1 else (first, *rest)

        def add(kind, run, expect, op=op):
            cases.append(Case(f"{op.name}/{kind}", run, expect))

        same = lambda unwrap=None, base=base: (  # noqa: E731
            lambda r, e: _reraise(e) or _expect_same(r, base, *(() if unwrap is None else (unwrap,)))
        )
        shaped = lambda check, base=base: lambda r, e: _reraise(e) or _expect_shapes(r, base, check)  # noqa: E731
        error = lambda types, *words: lambda r, e: _expect_error(e, types, words)  # noqa: E731
        first_out = op.out_names()[0]

        # --- kinds that compute: bitwise the plain call's outputs
        add("plain", call(dict(args)), same())
        add("noncontiguous", call(each(_noncontig)), same())
        add("neg_view", call(each(_neg)), same())
        add("neg_view_group_index", call(each(_neg, ["group_index"])), same())
        add("conj_imag", call(each(_conj_imag, floats)), same())
        add("two_tensor", call(each(_two)), same(_two_parts))
        add("two_tensor_one_arg", call(each(_two, [data])), same(_two_parts))
        add("wrapper_unwraps", call(each(unwrapping)), same(_unwrap_parts))
        holder = {}

        def plain_out(call=call, args=args, fresh_outs=fresh_outs, holder=holder):
            holder["out"] = fresh_outs()
            result = call(dict(args), out=holder["out"])()
            outs = _flat_outputs(holder["out"])
            if any(r is not o for r, o in zip(_flat_outputs(result), outs, strict=True) if o is not None):
                raise Failure("out= given: the result must be the out= tensors themselves")
            return result

        add("out_plain", plain_out, same())
        # torch's default device elsewhere (meta here; cuda on a GPU host): the outputs still on x's device
        add("default_device_meta", call(dict(args), mode=torch.device("meta")), same())
        # autograd's storage-less zeros (ZeroTensor): computed as zeros, never read through a null pointer
        zeros = each(torch.zeros_like, floats)
        add(
            "zero_tensor",
            lambda call=call, zeros=zeros, floats=floats, each=each, fn=fn: _expect_same(
                call(each(lambda t: torch._efficientzerotensor(t.shape, dtype=t.dtype), floats))(),
                _flat_outputs(fn(**zeros, backend=backend)),
            ),
            lambda r, e: _reraise(e) or r,
        )

        # --- fake and meta inputs: outputs of the right shapes and dtypes, no kernel runs
        mode = FakeTensorMode()
        fake_args = each(mode.from_tensor)
        add("fake_outside_mode", call(fake_args), shaped(_is_fake))
        add("fake_inside_mode", call(fake_args, mode=mode), shaped(_is_fake))
        add("meta", call(each(lambda t: t.to("meta"))), shaped(_is_meta))

        # --- refused: the error names the argument
        other_mode = FakeTensorMode()
        add(
            "fake_group_index",
            call(each(other_mode.from_tensor, ["group_index"])),
            error((TypeError,), "group_index", "fake"),
        )
        add(
            "fake_data_real_group_index",
            call(each(other_mode.from_tensor, [data])),
            error((TypeError,), "group_index", "fake"),
        )
        add(
            "plain_inside_fake_mode",
            call(dict(args), mode=FakeTensorMode()),
            error((TypeError,), data, "fake"),
        )
        add(
            "fake_two_modes",
            call({**each(other_mode.from_tensor, ["group_index"]), data: mode.from_tensor(args[data])}),
            error((TypeError,), "group_index", "one FakeTensorMode"),
        )
        add(
            "plain_inside_fake_mode_allowing_real",
            call(dict(args), mode=FakeTensorMode(allow_non_fake_inputs=True)),
            shaped(_is_fake),
        )
        add(
            "meta_group_index",
            call(each(lambda t: t.to("meta"), ["group_index"])),
            error((ValueError,), "group_index", "meta"),
        )
        add("handles_nothing", call(each(handles_nothing, [data])), error((TypeError,), "HandlesNothing"))
        add(
            "vmap",
            lambda args=args, data=data, fn=fn: torch.func.vmap(
                lambda d: fn(**{**args, data: d}, backend=backend)
            )(args[data].unsqueeze(0)),
            error((TypeError,), data, "torch.func"),
        )
        add(
            "out_zero_tensor",
            lambda call=call, args=args, base=base, out_with_first=out_with_first: call(
                dict(args), out=out_with_first(torch._efficientzerotensor(base[0].shape, dtype=base[0].dtype))
            )(),
            error((ValueError,), first_out, "ZeroTensor"),
        )
        add(
            "out_fake",
            lambda call=call, args=args, fresh_outs=fresh_outs: call(
                dict(args), out=_map_outs(FakeTensorMode().from_tensor, fresh_outs())
            )(),
            error((TypeError,), first_out, "fake"),
        )
        add(
            "out_fake_inside_mode",
            lambda call=call, fake_args=fake_args, fresh_outs=fresh_outs, mode=mode: call(
                fake_args, out=_map_outs(mode.from_tensor, fresh_outs()), mode=mode
            )(),
            error((TypeError,), "out="),
        )
        add(
            "out_plain_two_tensor_input",
            lambda call=call, args=args, fresh_outs=fresh_outs, each=each, data=data: call(
                each(_two, [data]), out=fresh_outs()
            )(),
            error((TypeError,), "out="),
        )
        add(
            "out_meta",
            lambda call=call, args=args, fresh_outs=fresh_outs: call(
                dict(args), out=_map_outs(lambda t: t.to("meta"), fresh_outs())
            )(),
            error((ValueError, TypeError), first_out, "meta"),
        )
        add(
            "out_two_tensor",
            lambda call=call, args=args, fresh_outs=fresh_outs: call(
                dict(args), out=_map_outs(_two, fresh_outs())
            )(),
            error((TypeError,), first_out, "TwoTensor"),
        )
        add(
            "out_neg_view",
            lambda call=call, args=args, base=base, out_with_first=out_with_first: call(
                dict(args), out=out_with_first(torch._neg_view(torch.empty_like(base[0])))
            )(),
            error((ValueError,), first_out, "negative"),
        )
        for via in ("numpy", "dlpack"):

            def overlapping(
                via=via, args=args, data=data, call=call, base=base, out_with_first=out_with_first
            ):
                x2, out0 = _overlapping_out(args[data], base[0].shape, base[0].dtype, via)
                return call({**args, data: x2}, out=out_with_first(out0))()

            add(
                f"out_overlaps_{data}_via_{via}",
                overlapping,
                error((ValueError,), first_out, "overlap", data),
            )
    return cases


def _map_outs(f, outs):
    return tuple(f(t) for t in outs) if isinstance(outs, tuple) else f(outs)


def _reraise(exc):
    if exc is not None:
        raise Failure(
            f"expected a result, got {type(exc).__name__}: {str(exc)[:300]}\n"
            + "".join(traceback.format_exception(exc))[-1500:]
        )


# --------------------------------------------------------------------------------------- mx_dequantize


def _scale_cases() -> list:
    """mx_dequantize and the layout helpers (:func:`_scale_calls`) x kinds, and mx_dequantize's bad ends."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import swiglu_ops
    from swiglu_ops.ops.table import OPERATORS

    unwrapping, _ = _classes()
    cases = []
    for name, fn, plain in _scale_calls():
        base = _flat_outputs(fn(**plain))
        tensors = [n for n, v in plain.items() if isinstance(v, torch.Tensor)]

        def each(transform, names=tensors, plain=plain):
            return {n: transform(v) if n in names else v for n, v in plain.items()}

        def add(kind, mapped, expect, name=name, fn=fn, mode=None):
            def run():
                if mode is None:
                    return fn(**mapped)
                with mode:
                    return fn(**mapped)

            cases.append(Case(f"{name}/{kind}", run, expect))

        same = lambda unwrap=None, base=base: (  # noqa: E731
            lambda r, e: _reraise(e) or _expect_same(r, base, *(() if unwrap is None else (unwrap,)))
        )
        shaped = lambda check, base=base: lambda r, e: _reraise(e) or _expect_shapes(r, base, check)  # noqa: E731
        add("plain", dict(plain), same())
        add("noncontiguous", each(_noncontig), same())
        add("two_tensor", each(_two), same(_two_parts))
        add("wrapper_unwraps", each(unwrapping), same(_unwrap_parts))
        mode = FakeTensorMode()
        add("fake_outside_mode", each(mode.from_tensor), shaped(_is_fake))
        add("fake_inside_mode", each(mode.from_tensor), shaped(_is_fake), mode=mode)
        add("meta", each(lambda t: t.to("meta")), shaped(_is_meta))
        if plain.get("group_index") is not None:
            add("neg_view_group_index", each(_neg, ["group_index"]), same())
            add("noncontiguous_group_index", each(_noncontig, ["group_index"]), same())
            add("two_tensor_group_index", each(_two, ["group_index"]), same(_two_parts))
            add(
                "fake_group_index",
                each(FakeTensorMode().from_tensor, ["group_index"]),
                lambda r, e: _expect_error(e, (TypeError,), ("group_index", "fake")),
            )
            add(
                "meta_group_index",
                each(lambda t: t.to("meta"), ["group_index"]),
                lambda r, e: _expect_error(e, (ValueError,), ("group_index", "meta")),
            )

    args = OPERATORS["swiglu_mx_quant_dual_axis"].example(
        torch.Generator().manual_seed(0), torch.float32, "cpu"
    )
    ends = args["group_index"]  # [33, 33, 100]: an empty group
    _, _, y2, s2 = swiglu_ops.swiglu_mx_quant_dual_axis(**args, backend="reference")
    m = y2.shape[0]
    # bad cumulative ends: raise, never other numbers
    bad = {
        "counts": (torch.tensor([33, 0, m - 33]), ValueError, ("group_index", "counts")),
        "decreasing": (torch.tensor([33, 20, m]), ValueError, ("group_index", "non-decreasing")),
        "negative": (torch.tensor([-1, 33, m]), ValueError, ("group_index", ">= 0")),
        "short": (torch.tensor([33, 33, m - 1]), ValueError, ("group_index", "last value")),
        "float": (torch.tensor([33.0, 33.0, float(m)]), TypeError, ("group_index", "int64")),
        "meta": (ends.to("meta"), ValueError, ("group_index", "device")),
        "counts_neg_view": (_neg(torch.tensor([33, 0, m - 33])), ValueError, ("group_index", "counts")),
    }
    for kind, (gi, types, words) in bad.items():
        cases.append(
            Case(
                f"mx_dequantize/axis-2/bad_ends_{kind}",
                lambda gi=gi: swiglu_ops.mx_dequantize(y2, s2, axis=-2, group_index=gi),
                lambda r, e, types=types, words=words: _expect_error(e, (types,), words),
            )
        )
    return cases


# --------------------------------------------------------------------------------------------- DTensor


def _dtensor_cases() -> list:
    import socket

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate

    import swiglu_ops
    from swiglu_ops.ops.table import PUBLIC

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    mesh = init_device_mesh("cpu", (1,))
    cases = []

    def add(name, fn, args, strict=False):
        """``fn(**args)`` with every tensor argument a replicated DTensor. ``strict``: the operators of the
        table, which have sharding rules: a DTensor result is required (no NotImplementedError)."""
        base = _flat_outputs(fn(**args))
        mapped = {
            n: DTensor.from_local(v, mesh, [Replicate()]) if isinstance(v, torch.Tensor) else v
            for n, v in args.items()
        }

        def expect(r, e):
            if isinstance(e, NotImplementedError) and not strict:
                return f"NotImplementedError (no sharding strategy): {str(e).splitlines()[0][:160]}"
            _reraise(e)

            def local(t, label):
                if not isinstance(t, DTensor):
                    raise Failure(f"{label}: expected a DTensor, got {type(t).__name__}")
                return [(label, t.to_local())]

            return _expect_same(r, base, local)

        cases.append(Case(f"{name}/dtensor_replicate", lambda: fn(**mapped), expect))

    for backend in swiglu_ops.available_backends("cpu"):  # reference, cpu and triton (interpreted here)
        for op in PUBLIC:
            fn = functools.partial(getattr(swiglu_ops, op.name), backend=backend)
            example = op.example(torch.Generator().manual_seed(0), torch.float32, "cpu")
            add(f"{op.name}/{backend}", fn, example, strict=True)
    for name, fn, args in _scale_calls():
        add(name, fn, args)
    return cases


def _scale_calls() -> list:
    """``(name, function, arguments)``: mx_dequantize and every layout helper, on the MX forward operator's
    outputs for its example (with groups)."""
    import torch

    import swiglu_ops
    from swiglu_ops import layouts
    from swiglu_ops.ops.table import OPERATORS

    args = OPERATORS["swiglu_mx_quant_dual_axis"].example(
        torch.Generator().manual_seed(0), torch.float32, "cpu"
    )
    ends, (m, c) = args["group_index"], args["x"].shape
    y1, s1, y2, s2 = swiglu_ops.swiglu_mx_quant_dual_axis(**args, backend="reference")
    return [
        ("mx_dequantize/axis-1", swiglu_ops.mx_dequantize, dict(data=y1, scale=s1, axis=-1)),
        (
            "mx_dequantize/axis-2",
            swiglu_ops.mx_dequantize,
            dict(data=y2, scale=s2, axis=-2, group_index=ends),
        ),
        ("layouts.to_blocked", layouts.to_blocked, dict(scales=s1.flatten(-2))),
        ("layouts.mxscale1_to_plain", layouts.mxscale1_to_plain, dict(mxscale1=s1, num_cols=c // 2)),
        ("layouts.mxscale1_to_blocked", layouts.mxscale1_to_blocked, dict(mxscale1=s1, group_index=ends)),
        (
            "layouts.mxscale2_to_plain",
            layouts.mxscale2_to_plain,
            dict(mxscale2=s2, num_rows=m, group_index=ends),
        ),
        (
            "layouts.mxscale2_to_blocked",
            layouts.mxscale2_to_blocked,
            dict(mxscale2=s2, num_rows=m, group_index=ends),
        ),
    ]


def _child(name: str) -> None:
    import swiglu_ops

    assert Path(swiglu_ops.__file__).resolve().is_relative_to(Path(__file__).resolve().parents[1]), (
        f"the child imported swiglu_ops from {swiglu_ops.__file__}, not this tree"
    )
    if name == "dtensor":
        import torch.distributed as dist

        try:
            _run(_dtensor_cases())
        finally:
            if dist.is_initialized():
                dist.barrier()
                dist.destroy_process_group()
    elif name == "mx_dequantize_layouts":
        _run(_scale_cases())
    else:
        _run(_operator_cases(name))


if __name__ == "__main__":
    _child(sys.argv[1])
