# SPDX-License-Identifier: Apache-2.0
"""aten ops on TpuTensors: recorded into the compiler's graph, decomposed, or run on the CPU.

For each aten op, in order:
1. ops that read a value on the host (``_local_scalar_dense``: ``.item()``, ``bool(x)``, a copy
   to the CPU) cut the graph;
2. an op in ``LOWER`` records the compiler's op or composite for it (layer norm, softmax,
   GELU, convolution, batch norm, embedding, matmul as a dot, reductions, elementwise), so
   fusion sees the composites;
3. otherwise PyTorch's own core-aten decomposition (``torch._decomp``) runs on the TpuTensors
   (its ops come back here);
4. otherwise the CPU fallback (PyTorch/XLA's): the op's TpuTensor arguments are read to the
   host (which cuts the graph before it), PyTorch runs the op on the CPU, the results go back
   to the device; counted as ``aten::NAME``.

Every op's result shapes and dtypes come from PyTorch's own meta kernels, so broadcasting and
type promotion are PyTorch's; a lowering only builds the values.
"""

import math
import weakref

import torch
from torch._decomp import core_aten_decompositions
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from tpusim.torch._lazy import TpuTensor, compiler_dtype, C
from tpusim.torch._metrics import METRICS

aten = torch.ops.aten
_DECOMP = core_aten_decompositions()
LOWER = {}


# The precision of every dot and convolution recorded from now on (set_mat_mul_precision).
PRECISION = [C.Precision.Default]


class Unsupported(Exception):
    """This call of an op has no lowering (its arguments are outside what the compiler has):
    try a decomposition, else the CPU fallback."""


def lowers(*ops):
    def deco(fn):
        for op in ops:
            LOWER[op] = fn
        return fn
    return deco


# ---- helpers ------------------------------------------------------------------------------


class Rec:
    """One op's recording: the device, its graph and the meta results."""

    def __init__(self, dev, meta):
        self.dev = dev
        self.ctx = dev.ctx
        self.g = dev.ctx.graph
        self.meta = meta

    def v(self, x, dtype=None):
        """The graph value of a TpuTensor, a CPU tensor (uploaded as an input) or a scalar."""
        if isinstance(x, TpuTensor):
            if x._dev is not self.dev:
                raise RuntimeError("tpusim.torch: tensors of two devices in one op")
            refresh(x)
            v = self.ctx.value(x._lazy)
        elif isinstance(x, torch.Tensor):
            v = self.ctx.value(self.dev.upload(x, False)._lazy)
        else:
            d = compiler_dtype(dtype) if dtype is not None else (
                C.DType.F32 if isinstance(x, float) else C.DType.S32)
            if isinstance(x, bool):
                d = C.DType.Pred if dtype is None else d
            return C.literal(self.g, float(x), d)
        if dtype is not None:
            v = self.conv(v, dtype)
        return v

    def shape(self, v):
        return list(self.g.shape(v).dims)

    def conv(self, v, dtype):
        want = compiler_dtype(dtype) if isinstance(dtype, torch.dtype) else dtype
        return v if self.g.shape(v).dtype == want else C.convert(self.g, v, want)

    def bcast(self, v, dims):
        """Numpy broadcasting of v to dims."""
        have = self.shape(v)
        dims = list(dims)
        if have == dims:
            return v
        off = len(dims) - len(have)
        keep = [i for i, d in enumerate(have) if d == dims[off + i]]  # the rest are 1s
        if len(keep) != len(have):
            v = C.reshape(self.g, v, [have[i] for i in keep])
        return C.broadcast(self.g, v, dims, [off + i for i in keep])

    def out(self, v, meta=None):
        """Wraps value v as a TpuTensor of meta's shape and dtype."""
        meta = self.meta if meta is None else meta
        v = self.conv(v, meta.dtype)
        if self.shape(v) != list(meta.shape):
            v = C.reshape(self.g, v, list(meta.shape))
        return TpuTensor(self.ctx.wrap(v), self.dev, meta.dtype, meta.shape)

    def ew(self, x, dtype=None):
        """x as an operand of an elementwise op with the result's shape."""
        return self.bcast(self.v(x, dtype), self.meta.shape)


def _norm_dims(dims, rank):
    if dims is None or dims == []:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted(d % rank if rank else 0 for d in dims)


# ---- elementwise --------------------------------------------------------------------------

_BINARY = {aten.mul: C.mul, aten.maximum: C.max, aten.minimum: C.min}


@lowers(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def _add_sub(r, a, b, alpha=1):
    t = r.meta.dtype
    fn = C.add if r.func.overloadpacket is aten.add else C.sub
    bv = r.ew(b, t)
    if alpha != 1:
        bv = C.mul(r.g, bv, r.ew(alpha, t))
    return r.out(fn(r.g, r.ew(a, t), bv))


@lowers(aten.mul.Tensor, aten.mul.Scalar, aten.maximum.default, aten.minimum.default)
def _binary(r, a, b):
    t = r.meta.dtype
    return r.out(_BINARY[r.func.overloadpacket](r.g, r.ew(a, t), r.ew(b, t)))


@lowers(aten.div.Tensor, aten.div.Scalar)
def _div(r, a, b):
    # A division by a constant stays a division (the device's vpu_divide), not x * (1 / c).
    t = r.meta.dtype
    return r.out(C.div(r.g, r.ew(a, t), r.ew(b, t)))


@lowers(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(r, a, b, alpha=1):
    t = r.meta.dtype
    av = r.ew(a, t)
    if alpha != 1:
        av = C.mul(r.g, av, r.ew(alpha, t))
    return r.out(C.sub(r.g, r.ew(b, t), av))


_UNARY = {
    aten.neg.default: C.neg, aten.abs.default: C.abs, aten.exp.default: C.exp,
    aten.log.default: C.log, aten.rsqrt.default: C.rsqrt, aten.sqrt.default: C.sqrt,
    aten.tanh.default: C.tanh, aten.erf.default: C.erf, aten.relu.default: C.relu,
}


@lowers(*_UNARY)
def _unary(r, a):
    return r.out(_UNARY[r.func](r.g, r.v(a, r.meta.dtype)))


@lowers(aten.sigmoid.default)
def _sigmoid(r, a):
    x = r.v(a, r.meta.dtype)
    one = r.bcast(C.literal(r.g, 1.0, C.DType.F32), r.meta.shape)
    return r.out(C.div(r.g, one, C.add(r.g, one, C.exp(r.g, C.neg(r.g, x)))))


@lowers(aten.reciprocal.default)
def _reciprocal(r, a):
    return r.out(C.div(r.g, r.ew(1.0, r.meta.dtype), r.v(a, r.meta.dtype)))


@lowers(aten.pow.Tensor_Scalar)
def _pow(r, a, e):
    x = r.v(a, r.meta.dtype)
    if e == 2:
        return r.out(C.mul(r.g, x, x))
    if e == 0.5:
        return r.out(C.sqrt(r.g, x))
    if e == 1:
        return r.out(x)
    return r.out(C.pow(r.g, x, r.ew(float(e), r.meta.dtype)))


@lowers(aten.gelu.default)
def _gelu(r, a, approximate="none"):
    return r.out(C.gelu(r.g, r.v(a, r.meta.dtype), approximate == "tanh"))


@lowers(aten.gelu_backward.default)
def _gelu_backward(r, dy, x, approximate="none"):
    t = r.meta.dtype
    return r.out(C.gelu_grad(r.g, r.v(dy, t), r.v(x, t), approximate == "tanh"))


@lowers(aten.threshold_backward.default)
def _threshold_backward(r, dy, x, threshold):
    t = r.meta.dtype
    pred = C.compare(r.g, r.ew(x, t), r.ew(float(threshold), t), C.Comparison.Gt)
    return r.out(C.select(r.g, pred, r.ew(dy, t), r.ew(0.0, t)))


@lowers(aten.hardtanh.default, aten.clamp.default)
def _clamp(r, a, lo=None, hi=None):
    t = r.meta.dtype
    x = r.v(a, t)
    if lo is not None:
        x = C.max(r.g, x, r.ew(lo, t))
    if hi is not None:
        x = C.min(r.g, x, r.ew(hi, t))
    return r.out(x)


_CMP = {
    aten.eq: C.Comparison.Eq, aten.ne: C.Comparison.Ne, aten.lt: C.Comparison.Lt,
    aten.le: C.Comparison.Le, aten.gt: C.Comparison.Gt, aten.ge: C.Comparison.Ge,
}


@lowers(*[getattr(op, o) for op in _CMP for o in ("Tensor", "Scalar")])
def _compare(r, a, b):
    t = torch.result_type(_meta(a), _meta(b))  # the comparison's operand type, PyTorch's
    return r.out(C.compare(r.g, r.ew(a, t), r.ew(b, t), _CMP[r.func.overloadpacket]))


@lowers(aten.where.self)
def _where(r, cond, a, b):
    t = r.meta.dtype
    return r.out(C.select(r.g, r.ew(cond, torch.bool), r.ew(a, t), r.ew(b, t)))


@lowers(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(r, x, mask, value):
    t = r.meta.dtype
    return r.out(C.select(r.g, r.ew(mask, torch.bool), r.ew(value, t), r.ew(x, t)))


@lowers(aten.logical_not.default)
def _logical_not(r, a):
    return r.out(C.compare(r.g, r.v(a, torch.bool), r.bcast(C.literal(r.g, 0.0, C.DType.Pred),
                                                              list(a.shape)), C.Comparison.Eq))


@lowers(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim,
        aten.all.dims)
def _any_all(r, a, dims=None, keepdim=False):
    # any: the max of the values as 0/1; all: not any of their negation.
    is_all = r.func.overloadpacket is aten.all
    ne = C.compare(r.g, r.v(a, torch.float32), r.bcast(C.literal(r.g, 0.0), list(a.shape)),
                   C.Comparison.Eq if is_all else C.Comparison.Ne)
    one = C.full(r.g, 1.0, C.Shape(C.DType.F32, list(a.shape)))
    zero = C.full(r.g, 0.0, C.Shape(C.DType.F32, list(a.shape)))
    m = C.select(r.g, ne, one, zero)
    if a.dim():
        m = C.reduce(r.g, m, _norm_dims(dims, a.dim()), C.Reducer.Max)
    m = C.reshape(r.g, m, list(r.meta.shape)) if r.shape(m) != list(r.meta.shape) else m
    hit = C.compare(r.g, m, r.ew(0.0, torch.float32),
                    C.Comparison.Eq if is_all else C.Comparison.Gt)
    return r.out(hit)


@lowers(aten.constant_pad_nd.default)
def _pad(r, a, pad, value=0):
    # pad lists (before, after) pairs from the last dim backwards; negative pads crop.
    if any(p < 0 for p in pad):
        raise Unsupported()
    v = r.v(a)
    dt = r.g.shape(v).dtype
    for i in range(len(pad) // 2):
        dim = a.dim() - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        parts = []
        for n in (lo, None, hi):
            if n is None:
                parts.append(v)
            elif n:
                dims = r.shape(v)
                dims[dim] = n
                parts.append(C.full(r.g, float(value), C.Shape(dt, dims)))
        if len(parts) > 1:
            v = C.concatenate(r.g, parts, dim)
    return r.out(v)


# ---- copies, dtypes, views ----------------------------------------------------------------


@lowers(aten._to_copy.default)
def _to_copy(r, a, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if device is not None and torch.device(device).type == "cpu" and isinstance(a, TpuTensor):
        return a._dev.to_host(a).to(dtype or a.dtype)
    if not isinstance(a, TpuTensor):
        raise Unsupported()
    return r.out(r.v(a, r.meta.dtype))


@lowers(aten.clone.default, aten.contiguous.default, aten.lift_fresh.default)
def _clone(r, a, memory_format=None):
    return r.out(r.v(a))


# ---- views that alias their base -----------------------------------------------------------
# A view (view, squeeze, permute, transpose, slice, select, split) is a value of its own that
# remembers its base (the tensor it views, through any chain of views), how it is computed from
# the base and how an updated view goes back into it (PyTorch's functionalization: view_fn and
# the *_scatter ops). An in-place update of a view writes its base through; a base updated in
# place bumps its generation, and a view derived from an older generation is derived again when
# it is next read. Aliases (detach, .data) share the lazy tensor and this state. A view holds
# its base weakly (a strong reference would keep the base live, an extra output of every step):
# once the base is gone, its views no longer see each other's updates.


class _ViewState:
    __slots__ = ("gen", "base", "view_fn", "scatter_fn", "base_gen")

    def __init__(self):
        self.gen = 0
        self.base = None


def _state(x):
    st = x.__dict__.get("_vs")
    if st is None:
        st = x._vs = _ViewState()
    return st


def _base_of(st):
    return st.base() if st.base is not None else None


def _link(out, parent, view_fn, scatter_fn):
    """Makes `out` a view: view_fn(g, parent value) is its value, scatter_fn(g, parent value,
    view value) the parent after the view is updated; composed down to the parent's base."""
    pst = _state(parent)
    base = _base_of(pst)
    if base is not None:  # a view of a view: one view of the base
        f1, s1 = pst.view_fn, pst.scatter_fn
        vf, sf = view_fn, scatter_fn
        view_fn = lambda g, bv: vf(g, f1(g, bv))  # noqa: E731
        scatter_fn = lambda g, bv, vv: s1(g, bv, sf(g, f1(g, bv), vv))  # noqa: E731
    else:
        base = parent
    st = _state(out)
    st.base, st.view_fn, st.scatter_fn = weakref.ref(base), view_fn, scatter_fn
    st.base_gen = _state(base).gen
    return out


def refresh(x):
    """A view whose base was updated in place since it was derived: derived again."""
    st = _state(x)
    base = _base_of(st)
    if base is not None and st.base_gen != _state(base).gen:
        ctx = x._dev.ctx
        ctx.assign(x._lazy, st.view_fn(ctx.graph, ctx.value(base._lazy)))
        st.base_gen = _state(base).gen


def assign(dst, v):
    """An in-place update: dst's value becomes v, written through to the base dst views."""
    ctx = dst._dev.ctx
    ctx.assign(dst._lazy, v)
    st = _state(dst)
    st.gen += 1
    base = _base_of(st)
    if base is not None:
        refresh(base)
        assign(base, st.scatter_fn(ctx.graph, ctx.value(base._lazy), ctx.value(dst._lazy)))
        st.base_gen = _state(base).gen


def _as_view(r, a, view_fn, scatter_fn, meta=None):
    return _link(r.out(view_fn(r.g, r.v(a)), meta), a, view_fn, scatter_fn)


def _reshape_view(r, a):
    dims, back = list(r.meta.shape), list(a.shape)
    return _as_view(r, a, lambda g, pv: C.reshape(g, pv, dims),
                    lambda g, pv, vv: C.reshape(g, vv, back))


def _slice_view(r, a, dim, start, end, meta=None, squeeze=False):
    """a[start:end] along dim (squeezed to `meta`'s shape for select)."""
    shape = list(a.shape)  # the closures keep no reference to `a` (see _link)
    lo, hi = [0] * len(shape), list(shape)
    lo[dim], hi[dim] = start, end
    dims = list((meta if meta is not None else r.meta).shape)
    n = shape[dim]

    def view_fn(g, pv):
        v = C.slice(g, pv, lo, hi)
        return C.reshape(g, v, dims) if squeeze else v

    def scatter_fn(g, pv, vv):
        if squeeze:
            vv = C.reshape(g, vv, [hi[i] - lo[i] for i in range(len(lo))])
        parts = []
        if start > 0:
            parts.append(C.slice(g, pv, [0] * len(lo),
                                 [start if i == dim else d for i, d in enumerate(shape)]))
        parts.append(vv)
        if end < n:
            parts.append(C.slice(g, pv, [end if i == dim else 0 for i in range(len(lo))], shape))
        return parts[0] if len(parts) == 1 else C.concatenate(g, parts, dim)

    return _as_view(r, a, view_fn, scatter_fn, meta)


@lowers(aten.detach.default, aten.alias.default)
def _alias(r, a):
    # The same lazy tensor: an in-place update of one is seen by the other (param.data).
    out = TpuTensor(a._lazy, a._dev, a.dtype, a.shape)
    out._vs = _state(a)
    return out


@lowers(aten.view.default, aten._unsafe_view.default)
def _view(r, a, *_):
    return _reshape_view(r, a)


@lowers(aten.reshape.default, aten.view.dtype)
def _reshape(r, a, *_):
    if r.meta.dtype != a.dtype:
        raise Unsupported()
    return r.out(C.reshape(r.g, r.v(a), list(r.meta.shape)))


@lowers(aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
        aten.flatten.using_ints)
def _reshape_like(r, a, *_):
    return _reshape_view(r, a)


@lowers(aten.expand.default)
def _expand(r, a, size, implicit=False):
    return r.out(r.bcast(r.v(a), r.meta.shape))


def _permute_view(r, a, perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return _as_view(r, a, lambda g, pv: C.transpose(g, pv, perm),
                    lambda g, pv, vv: C.transpose(g, vv, inv))


@lowers(aten.permute.default)
def _permute(r, a, perm):
    rank = a.dim()
    return _permute_view(r, a, [p % rank for p in perm])


@lowers(aten.t.default, aten.transpose.int)
def _transpose(r, a, d0=0, d1=1):
    rank = a.dim()
    if rank < 2:
        return _as_view(r, a, lambda g, pv: pv, lambda g, pv, vv: vv)
    perm = list(range(rank))
    d0, d1 = d0 % rank, d1 % rank
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return _permute_view(r, a, perm)


@lowers(aten.slice.Tensor)
def _slice(r, a, dim=0, start=None, end=None, step=1):
    if step != 1:
        raise Unsupported()
    dim %= a.dim()
    n = a.shape[dim]
    start = 0 if start is None else (start + n if start < 0 else min(start, n))
    end = n if end is None else (end + n if end < 0 else min(end, n))
    end = max(end, start)
    return _slice_view(r, a, dim, start, end)


@lowers(aten.select.int)
def _select(r, a, dim, index):
    dim %= a.dim()
    index %= a.shape[dim]
    return _slice_view(r, a, dim, index, index + 1, squeeze=True)


@lowers(aten.cat.default)
def _cat(r, tensors, dim=0):
    t = r.meta.dtype
    parts = [r.v(x, t) for x in tensors if x.numel() > 0 or x.dim() > 1]
    if len(parts) == 1:
        return r.out(parts[0])
    return r.out(C.concatenate(r.g, parts, dim % r.meta.dim()))


@lowers(aten.split_with_sizes.default)
def _split(r, a, sizes, dim=0):
    dim %= a.dim()
    outs, start = [], 0
    for m, s in zip(r.meta, sizes):
        outs.append(_slice_view(r, a, dim, start, start + s, meta=m))
        start += s
    return outs


@lowers(aten.copy_.default)
def _copy_(r, dst, src, non_blocking=False):
    if not isinstance(dst, TpuTensor):
        raise Unsupported()
    v = r.bcast(r.v(src, dst.dtype), list(dst.shape))
    assign(dst, v)
    return dst


@lowers(aten.fill_.Scalar, aten.zero_.default)
def _fill_(r, dst, value=0):
    v = C.full(r.g, float(value), C.Shape(compiler_dtype(dst.dtype), list(dst.shape)))
    assign(dst, v)
    return dst


@lowers(aten.full_like.default, aten.zeros_like.default, aten.ones_like.default,
        aten.empty_like.default, aten.new_zeros.default, aten.new_ones.default,
        aten.new_empty.default, aten.new_full.default, aten.empty_strided.default)
def _full_like(r, a, *args, **kwargs):
    name = r.func.overloadpacket.__name__
    value = {"zeros_like": 0.0, "ones_like": 1.0, "empty_like": 0.0, "new_zeros": 0.0,
             "new_ones": 1.0, "new_empty": 0.0, "empty_strided": 0.0}.get(name)
    if value is None:
        value = float(args[0] if name == "full_like" else args[1])
    m = r.meta
    return r.out(C.full(r.g, value, C.Shape(compiler_dtype(m.dtype), list(m.shape))))


# ---- reductions, contractions, composites ------------------------------------------------


def _reduce(r, a, dims, keepdim, reducer, dtype):
    x = r.v(a, dtype)
    dims = _norm_dims(dims, a.dim())
    if a.dim() == 0:
        return r.out(x)
    return r.out(C.reduce(r.g, x, dims, reducer))


@lowers(aten.sum.dim_IntList, aten.sum.default)
def _sum(r, a, dims=None, keepdim=False, dtype=None):
    return _reduce(r, a, dims, keepdim, C.Reducer.Sum, r.meta.dtype)


@lowers(aten.mean.dim, aten.mean.default)
def _mean(r, a, dims=None, keepdim=False, dtype=None):
    d = _norm_dims(dims, a.dim())
    n = math.prod(a.shape[i] for i in d) if a.dim() else 1
    x = C.reduce(r.g, r.v(a, r.meta.dtype), d, C.Reducer.Sum) if a.dim() else r.v(a)
    x = C.reshape(r.g, x, list(r.meta.shape)) if r.shape(x) != list(r.meta.shape) else x
    return r.out(C.div(r.g, x, r.ew(float(n), r.meta.dtype)))


@lowers(aten.amax.default)
def _amax(r, a, dims=(), keepdim=False):
    return _reduce(r, a, list(dims), keepdim, C.Reducer.Max, r.meta.dtype)


@lowers(aten.var.correction)
def _var(r, a, dims=None, correction=None, keepdim=False):
    t = r.meta.dtype
    d = _norm_dims(dims, a.dim())
    n = math.prod(a.shape[i] for i in d)
    x = r.v(a, t)
    kept = [1 if i in d else s for i, s in enumerate(a.shape)]
    mean = C.div(r.g, C.reshape(r.g, C.reduce(r.g, x, d, C.Reducer.Sum), kept),
                 r.bcast(C.literal(r.g, float(n)), kept))
    dev = C.sub(r.g, x, r.bcast(mean, list(a.shape)))
    ss = C.reduce(r.g, C.mul(r.g, dev, dev), d, C.Reducer.Sum)
    c = 1 if correction is None else correction
    ss = C.reshape(r.g, ss, list(r.meta.shape))
    return r.out(C.div(r.g, ss, r.ew(float(max(n - c, 0)), t)))


@lowers(aten.mm.default)
def _mm(r, a, b):
    t = r.meta.dtype
    return r.out(C.matmul(r.g, r.v(a, t), r.v(b, t), False, False, PRECISION[0]))


@lowers(aten.addmm.default)
def _addmm(r, bias, a, b, beta=1, alpha=1):
    t = r.meta.dtype
    y = C.matmul(r.g, r.v(a, t), r.v(b, t), False, False, PRECISION[0])
    if alpha != 1:
        y = C.mul(r.g, y, r.ew(alpha, t))
    bv = r.ew(bias, t)
    if beta != 1:
        bv = C.mul(r.g, bv, r.ew(beta, t))
    return r.out(C.add(r.g, y, bv))


@lowers(aten.bmm.default)
def _bmm(r, a, b):
    t = r.meta.dtype
    dims = C.DotDims([0], [0], [2], [1])
    return r.out(C.dot(r.g, r.v(a, t), r.v(b, t), dims, PRECISION[0]))


@lowers(aten._softmax.default)
def _softmax(r, a, dim, half_to_float=False):
    return r.out(C.softmax(r.g, r.v(a, r.meta.dtype), dim % max(a.dim(), 1)))


@lowers(aten._log_softmax.default)
def _log_softmax(r, a, dim, half_to_float=False):
    return r.out(C.log_softmax(r.g, r.v(a, r.meta.dtype), dim % max(a.dim(), 1)))


@lowers(aten._softmax_backward_data.default)
def _softmax_bwd(r, dy, y, dim, input_dtype):
    t = r.meta.dtype
    return r.out(C.softmax_grad(r.g, r.v(dy, t), r.v(y, t), dim % y.dim()))


@lowers(aten._log_softmax_backward_data.default)
def _log_softmax_bwd(r, dy, y, dim, input_dtype):
    t = r.meta.dtype
    return r.out(C.log_softmax_grad(r.g, r.v(dy, t), r.v(y, t), dim % y.dim()))


@lowers(aten.native_layer_norm.default)
def _layer_norm(r, x, normalized_shape, weight, bias, eps):
    if len(normalized_shape) != 1:
        raise Unsupported()
    t = r.meta[0].dtype
    n = normalized_shape[0]
    shp = C.Shape(compiler_dtype(t), [n])
    w = r.v(weight, t) if weight is not None else C.full(r.g, 1.0, shp)
    b = r.v(bias, t) if bias is not None else C.full(r.g, 0.0, shp)
    y, mean, rstd = C.layer_norm(r.g, r.v(x, t), w, b, float(eps))
    return r.out(y, r.meta[0]), r.out(mean, r.meta[1]), r.out(rstd, r.meta[2])


def _nchw_to_nhwc(r, v):
    return C.transpose(r.g, v, [0, 2, 3, 1])


def _nhwc_to_nchw(r, v):
    return C.transpose(r.g, v, [0, 3, 1, 2])


def _square(v, what):
    v = list(v)
    if len(v) == 1:
        return v[0]
    if len(v) != 2 or v[0] != v[1]:
        raise Unsupported(what)
    return v[0]


def _conv_params(w, stride, padding, dilation, transposed, groups):
    if transposed or groups != 1 or any(d != 1 for d in dilation) or w.dim() != 4:
        raise Unsupported()
    if w.shape[2] != w.shape[3]:
        raise Unsupported()
    if isinstance(padding, str):
        raise Unsupported()
    return _square(stride, "stride"), _square(padding, "padding")


@lowers(aten.convolution.default)
def _convolution(r, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    s, p = _conv_params(w, stride, padding, dilation, transposed, groups)
    t = r.meta.dtype
    y = C.conv2d(r.g, _nchw_to_nhwc(r, r.v(x, t)), C.transpose(r.g, r.v(w, t), [2, 3, 1, 0]), s, p,
                 PRECISION[0])
    if bias is not None:
        y = C.add(r.g, y, r.bcast(r.v(bias, t), r.shape(y)))
    return r.out(_nhwc_to_nchw(r, y))


@lowers(aten.convolution_backward.default)
def _convolution_backward(r, dy, x, w, bias_sizes, stride, padding, dilation, transposed,
                          output_padding, groups, mask):
    s, p = _conv_params(w, stride, padding, dilation, transposed, groups)
    t = x.dtype
    dyv = _nchw_to_nhwc(r, r.v(dy, t))
    outs = [None, None, None]
    if mask[0]:
        nhwc = [x.shape[0], x.shape[2], x.shape[3], x.shape[1]]
        gi = C.conv2d_input_grad(r.g, dyv, C.transpose(r.g, r.v(w, t), [2, 3, 1, 0]), nhwc, s, p,
                                 PRECISION[0])
        outs[0] = r.out(_nhwc_to_nchw(r, gi), r.meta[0])
    if mask[1]:
        gw = C.conv2d_filter_grad(r.g, _nchw_to_nhwc(r, r.v(x, t)), dyv, w.shape[2], s, p,
                                  PRECISION[0])
        outs[1] = r.out(C.transpose(r.g, gw, [3, 2, 0, 1]), r.meta[1])
    if mask[2]:
        outs[2] = r.out(C.reduce(r.g, r.v(dy, t), [0, 2, 3], C.Reducer.Sum), r.meta[2])
    return tuple(outs)


def _pool_params(kernel, stride, padding, dilation=(1,), ceil_mode=False):
    if ceil_mode or any(d != 1 for d in dilation):
        raise Unsupported()
    k = _square(kernel, "kernel")
    s = _square(stride, "stride") if stride else k
    return k, s, _square(padding, "padding")


@lowers(aten.max_pool2d_with_indices.default)
def _max_pool(r, x, kernel, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    k, s, p = _pool_params(kernel, stride, padding, dilation, ceil_mode)
    y = C.pool(r.g, _nchw_to_nhwc(r, r.v(x)), C.PoolKind.Max, k, s, p)
    # The indices are not computed: the backward lowering finds each window's maximum again
    # from the input (select-and-scatter, as XLA's max-pool gradient does).
    idx = C.full(r.g, -1.0, C.Shape(C.DType.S32, list(r.meta[1].shape)))
    return r.out(_nhwc_to_nchw(r, y), r.meta[0]), r.out(idx, r.meta[1])


@lowers(aten.max_pool2d_with_indices_backward.default)
def _max_pool_bwd(r, dy, x, kernel, stride, padding, dilation, ceil_mode, indices):
    k, s, p = _pool_params(kernel, stride, padding, dilation, ceil_mode)
    g = C.max_pool_grad(r.g, _nchw_to_nhwc(r, r.v(x)), _nchw_to_nhwc(r, r.v(dy)), k, s, p)
    return r.out(_nhwc_to_nchw(r, g))


@lowers(aten.avg_pool2d.default)
def _avg_pool(r, x, kernel, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    if not count_include_pad and _square(padding, "padding") or divisor_override:
        raise Unsupported()
    k, s, p = _pool_params(kernel, stride, padding, (1,), ceil_mode)
    y = C.pool(r.g, _nchw_to_nhwc(r, r.v(x)), C.PoolKind.Avg, k, s, p)
    return r.out(_nhwc_to_nchw(r, y))


@lowers(aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool2d.default)
def _adaptive_avg_pool(r, x, output_size):
    if list(output_size) != [1, 1]:
        raise Unsupported()
    y = C.global_avg_pool(r.g, _nchw_to_nhwc(r, r.v(x)))
    return r.out(y)


@lowers(aten._native_batch_norm_legit_no_training.default)
def _bn_inference(r, x, w, b, mean, var, momentum, eps):
    t = r.meta[0].dtype
    c = x.shape[1]
    shp = C.Shape(compiler_dtype(t), [c])
    wv = r.v(w, t) if w is not None else C.full(r.g, 1.0, shp)
    bv = r.v(b, t) if b is not None else C.full(r.g, 0.0, shp)
    y = C.batch_norm_inference(r.g, r.v(x, t), wv, bv, r.v(mean, t), r.v(var, t), float(eps), 1)
    empty = [r.out(C.full(r.g, 0.0, C.Shape(compiler_dtype(m.dtype), list(m.shape))), m)
             if m.numel() else m.to("cpu") for m in r.meta[1:]]
    return (r.out(y, r.meta[0]), *empty)


@lowers(aten._native_batch_norm_legit.default, aten._native_batch_norm_legit_functional.default)
def _bn_training(r, x, w, b, running_mean, running_var, training, momentum, eps):
    if not training:
        raise Unsupported()
    t = r.meta[0].dtype
    c = x.shape[1]
    n = x.numel() // c
    shp = C.Shape(compiler_dtype(t), [c])
    wv = r.v(w, t) if w is not None else C.full(r.g, 1.0, shp)
    bv = r.v(b, t) if b is not None else C.full(r.g, 0.0, shp)
    y, mean, var = C.batch_norm_training(r.g, r.v(x, t), wv, bv, float(eps), 1)
    invstd = C.rsqrt(r.g, C.add(r.g, var, C.full(r.g, float(eps), shp)))
    outs = [r.out(y, r.meta[0]), r.out(mean, r.meta[1]), r.out(invstd, r.meta[2])]

    def update(running, stat):
        old = r.v(running, t)
        m = C.full(r.g, float(momentum), shp)
        keep = C.full(r.g, 1.0 - float(momentum), shp)
        return C.add(r.g, C.mul(r.g, old, keep), C.mul(r.g, stat, m))

    if running_mean is not None:
        unbiased = C.mul(r.g, var, C.full(r.g, n / max(n - 1, 1), shp))
        new_mean, new_var = update(running_mean, mean), update(running_var, unbiased)
        if r.func is aten._native_batch_norm_legit.default:
            assign(running_mean, new_mean)
            assign(running_var, new_var)
        else:
            outs += [r.out(new_mean, r.meta[3]), r.out(new_var, r.meta[4])]
    return tuple(outs)


@lowers(aten.native_batch_norm_backward.default)
def _bn_backward(r, dy, x, w, running_mean, running_var, save_mean, save_invstd, train, eps,
                 mask):
    if not train:
        raise Unsupported()
    t = x.dtype
    c = x.shape[1]
    shp = C.Shape(compiler_dtype(t), [c])
    # The compiler's gradient takes the variance: var = 1 / invstd^2 - eps.
    inv = r.v(save_invstd, t)
    var = C.sub(r.g, C.div(r.g, C.full(r.g, 1.0, shp), C.mul(r.g, inv, inv)),
                C.full(r.g, float(eps), shp))
    wv = r.v(w, t) if w is not None else C.full(r.g, 1.0, shp)
    dx, dw, db = C.batch_norm_grad(r.g, r.v(x, t), wv, r.v(save_mean, t), var, r.v(dy, t),
                                   float(eps), 1)
    return tuple(r.out(v, m) if ok and m is not None else None
                 for v, m, ok in zip((dx, dw, db), r.meta, mask))


@lowers(aten.embedding.default)
def _embedding(r, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    idx = C.reshape(r.g, r.v(indices, torch.int32), [indices.numel()])
    return r.out(C.gather_rows(r.g, r.v(weight), idx))


@lowers(aten.embedding_dense_backward.default)
def _embedding_bwd(r, dy, indices, num_weights, padding_idx, scale_grad_by_freq):
    if scale_grad_by_freq:
        raise Unsupported()
    n = indices.numel()
    idx = C.reshape(r.g, r.v(indices, torch.int32), [n])
    upd = C.reshape(r.g, r.v(dy, r.meta.dtype), [n, r.meta.shape[1]])
    if padding_idx >= 0:
        d = r.meta.shape[1]
        pad = C.broadcast(r.g, C.literal(r.g, float(padding_idx), C.DType.S32), [n], [])
        keep = C.broadcast(r.g, C.compare(r.g, idx, pad, C.Comparison.Ne), [n, d], [0])
        upd = C.select(r.g, keep, upd, C.full(r.g, 0.0, C.Shape(C.DType.F32, [n, d])))
    return r.out(C.scatter_add_rows(r.g, idx, upd, num_weights))


@lowers(aten.index_select.default)
def _index_select(r, a, dim, index):
    if dim % a.dim() != 0 or a.dim() != 2:
        raise Unsupported()
    return r.out(C.gather_rows(r.g, r.v(a), r.v(index, torch.int32)))


def _onehot_valid(r, logits_shape, target, ignore_index):
    """onehot [B, C] (f32) of target, zero rows where target == ignore_index, and the count of
    valid rows."""
    b, c = logits_shape
    tv = r.v(target, torch.int32)
    classes = C.iota(r.g, [b, c], 1, C.DType.S32)
    hit = C.compare(r.g, classes, C.broadcast(r.g, tv, [b, c], [0]), C.Comparison.Eq)
    valid = C.compare(r.g, tv, r.bcast(C.literal(r.g, float(ignore_index), C.DType.S32), [b]),
                      C.Comparison.Ne)
    one = C.full(r.g, 1.0, C.Shape(C.DType.F32, [b, c]))
    zero = C.full(r.g, 0.0, C.Shape(C.DType.F32, [b, c]))
    onehot = C.select(r.g, hit, one, zero)
    validf = C.select(r.g, valid, C.full(r.g, 1.0, C.Shape(C.DType.F32, [b])),
                      C.full(r.g, 0.0, C.Shape(C.DType.F32, [b])))
    onehot = C.mul(r.g, onehot, C.broadcast(r.g, validf, [b, c], [0]))
    return onehot, C.reduce(r.g, validf, [0], C.Reducer.Sum)


@lowers(aten.nll_loss_forward.default)
def _nll_loss(r, logp, target, weight, reduction, ignore_index):
    if weight is not None or logp.dim() != 2 or reduction not in (1, 2):
        raise Unsupported()
    onehot, count = _onehot_valid(r, list(logp.shape), target, ignore_index)
    total = C.neg(r.g, C.reduce(r.g, C.mul(r.g, r.v(logp, torch.float32), onehot), [0, 1],
                                C.Reducer.Sum))
    if reduction == 1:  # mean
        total = C.div(r.g, total, count)
    return r.out(total, r.meta[0]), r.out(count if reduction == 1 else count, r.meta[1])


@lowers(aten.nll_loss_backward.default)
def _nll_loss_bwd(r, dy, logp, target, weight, reduction, ignore_index, total_weight):
    if weight is not None or logp.dim() != 2 or reduction not in (1, 2):
        raise Unsupported()
    shape = list(logp.shape)
    onehot, _ = _onehot_valid(r, shape, target, ignore_index)
    scale = r.v(dy, torch.float32)
    if reduction == 1:
        scale = C.div(r.g, scale, r.v(total_weight, torch.float32))
    g = C.mul(r.g, C.neg(r.g, onehot), C.broadcast(r.g, scale, shape, []))
    return r.out(g)


@lowers(aten.bernoulli_.float)
def _bernoulli_(r, x, p=0.5, generator=None):
    # u < p with u uniform in [0, 1) from the compiler's rng, seeded by a scalar drawn from
    # PyTorch's CPU generator: the seed is data (an input), so every step hits the same graph.
    if generator is not None:
        raise Unsupported()
    seed = r.v(torch.randint(0, 2**31 - 1, (), dtype=torch.int32))
    u = C.rng_uniform(r.g, seed, list(x.shape))
    hit = C.compare(r.g, u, r.bcast(C.literal(r.g, float(p)), list(x.shape)), C.Comparison.Lt)
    assign(x, r.conv(hit, x.dtype))
    return x


@lowers(aten.native_dropout.default)
def _native_dropout(r, x, p, train):
    if not train or p == 0:
        keep = C.full(r.g, 1.0, C.Shape(C.DType.Pred, list(x.shape)))
        return r.out(r.v(x), r.meta[0]), r.out(keep, r.meta[1])
    seed = r.v(torch.randint(0, 2**31 - 1, (), dtype=torch.int32))
    u = C.rng_uniform(r.g, seed, list(x.shape))
    keep = C.compare(r.g, u, r.bcast(C.literal(r.g, float(p)), list(x.shape)), C.Comparison.Ge)
    t = r.meta[0].dtype
    scaled = C.mul(r.g, r.v(x, t), r.ew(1.0 / (1.0 - p), t))
    zero = C.full(r.g, 0.0, C.Shape(compiler_dtype(t), list(x.shape)))
    return r.out(C.select(r.g, keep, scaled, zero), r.meta[0]), r.out(keep, r.meta[1])


def _sdpa_cpu_backward(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, attn_mask=None,
                       scale=None):
    """The gradient of scaled dot-product attention (PyTorch's CPU flash kernel has no
    decomposition): the scores recomputed, then dV = P^T dO, dS = P (dP - rowsum(dP P)),
    dQ = dS K s, dK = dS^T Q s, as PyTorch's math attention differentiates."""
    if dropout_p:
        return NotImplemented
    s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q, k.transpose(-2, -1)) * s
    if is_causal:
        n, m = q.shape[-2], k.shape[-2]
        causal = torch.ones(n, m, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        scores = (scores.masked_fill(attn_mask.logical_not(), float("-inf"))
                  if attn_mask.dtype == torch.bool else scores + attn_mask)
    p = torch.softmax(scores, -1)
    dv = torch.matmul(p.transpose(-2, -1), grad_out)
    dp = torch.matmul(grad_out, v.transpose(-2, -1))
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    dq = torch.matmul(ds, k) * s
    dk = torch.matmul(ds.transpose(-2, -1), q) * s
    return dq, dk, dv


_EXTRA_DECOMP = {
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _sdpa_cpu_backward,
}


# ---- dispatch -----------------------------------------------------------------------------

_HOST_READ = {aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default}


def _device_of(flat):
    for x in flat:
        if isinstance(x, TpuTensor):
            return x._dev
    return None


def _meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty(tuple(x.shape), dtype=x.dtype, device="meta")
    return x


def _to_host_tree(args, kwargs):
    return tree_map(lambda x: x._dev.to_host(x) if isinstance(x, TpuTensor) else x,
                    (args, kwargs))


def fallback(dev, func, args, kwargs):
    """PyTorch/XLA's CPU fallback: inputs to the host, the op on the CPU, results back."""
    METRICS.count(f"aten::{func.overloadpacket.__name__}")
    cargs, ckwargs = _to_host_tree(args, kwargs)
    out = func(*cargs, **ckwargs)
    flat_in, _ = tree_flatten((args, kwargs))
    # In-place ops write back into their TpuTensor argument.
    if func._schema.is_mutable:
        for a, ca in zip(flat_in, tree_flatten((cargs, ckwargs))[0]):
            if isinstance(a, TpuTensor):
                new = dev.upload(ca, False)
                assign(a, dev.ctx.value(new._lazy))
        flat_out, spec = tree_flatten(out)
        for i, o in enumerate(flat_out):
            for a, ca in zip(flat_in, tree_flatten((cargs, ckwargs))[0]):
                if o is ca and isinstance(a, TpuTensor):
                    flat_out[i] = a
        return tree_unflatten(flat_out, spec)
    return tree_map(lambda x: dev.upload(x, False) if isinstance(x, torch.Tensor) else x, out)


def record(dev, func, args, kwargs):
    """Lowers func on its arguments; raises Unsupported when there is no lowering."""
    low = LOWER.get(func)
    if low is None:
        raise Unsupported()
    meta_args, meta_kwargs = tree_map(_meta, (args, kwargs))
    try:
        meta = func(*meta_args, **meta_kwargs)
    except Exception as e:  # an op without a meta kernel: no lowering either
        raise Unsupported() from e
    r = Rec(dev, meta)
    r.func = func
    return low(r, *args, **kwargs)


_INPLACE_CACHE = {}


def _out_of_place(func):
    """aten.add_.Tensor -> aten.add.Tensor (None when there is none)."""
    if func not in _INPLACE_CACHE:
        name = func.overloadpacket.__name__
        op = None
        if name.endswith("_") and not name.startswith("_"):
            packet = getattr(aten, name[:-1], None)
            op = getattr(packet, func._overloadname, None) if packet is not None else None
        _INPLACE_CACHE[func] = op
    return _INPLACE_CACHE[func]


def dispatch(func, args, kwargs):
    flat, _ = tree_flatten((args, kwargs))
    dev = _device_of(flat)
    if func in _HOST_READ:  # .item(), bool(x), torch.equal: a host read, not a fallback
        cargs, ckwargs = _to_host_tree(args, kwargs)
        return func(*cargs, **ckwargs)
    try:
        return record(dev, func, args, kwargs)
    except Unsupported:
        pass
    # An in-place op: its out-of-place form, assigned back (param.add_(), buf.mul_()).
    pure = _out_of_place(func)
    if pure is not None and isinstance(args[0], TpuTensor):
        try:
            res = record(dev, pure, args, kwargs)
        except Unsupported:
            res = None
            if pure in _DECOMP:
                res = _DECOMP[pure](*args, **kwargs)
        if res is not None:
            dst = args[0]
            v = dev.ctx.value(res._lazy)
            g = dev.ctx.graph
            if g.shape(v).dtype != compiler_dtype(dst.dtype):
                v = C.convert(g, v, compiler_dtype(dst.dtype))
            assign(dst, v)
            return dst
    for table in (_DECOMP, _EXTRA_DECOMP):
        if func in table:
            out = table[func](*args, **kwargs)
            if out is not NotImplemented:
                return out
    decomposed = func.decompose(*args, **kwargs)
    if decomposed is not NotImplemented:
        return decomposed
    return fallback(dev, func, args, kwargs)
