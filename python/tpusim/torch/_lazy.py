# SPDX-License-Identifier: Apache-2.0
"""Lazy tensors on a tpusim device (python/README.md, "tpusim.torch").

A :class:`TpuTensor` is a ``__torch_dispatch__`` wrapper subclass: it has a shape and dtype but
no storage, and holds a handle on a compiler LazyTensor. It sits below autograd, so PyTorch's
own autograd and torch.optim call aten ops on it (forward, backward and the optimizer's
in-place updates alike), and each aten op is recorded into the compiler's pending graph
(``_ops.py``) instead of running. The graph is cut and run at :func:`mark_step` and wherever
the host needs a value; an op that cannot be lowered runs on the CPU (PyTorch/XLA's CPU
fallback) and is counted as ``aten::NAME``.
"""

import time
import warnings

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from tpusim import _core
from tpusim.torch._metrics import METRICS

C = _core.compiler

_DTYPES = {
    torch.float32: C.DType.F32,
    torch.float64: C.DType.F32,
    torch.float16: C.DType.F32,
    torch.bfloat16: C.DType.BF16,
    torch.int64: C.DType.S32,
    torch.int32: C.DType.S32,
    torch.int16: C.DType.S32,
    torch.int8: C.DType.S32,
    torch.uint8: C.DType.S32,
    torch.bool: C.DType.Pred,
}


def compiler_dtype(dtype: torch.dtype):
    """The compiler's element type for a torch dtype (float64 and float16 compute as fp32, the
    integer types as s32, as PyTorch/XLA's XLA_USE_32BIT_LONG does)."""
    if dtype not in _DTYPES:
        raise TypeError(f"tpusim.torch: dtype {dtype} has no compiler type")
    return _DTYPES[dtype]


def _core_spec(cores):
    # A core list for Board.cores: "0-3", "all" and a core number as they are, else a list.
    return cores if isinstance(cores, (str, int)) else list(cores)


class Device:
    """One lazy device: a LazyContext on a backend (the host evaluator, or cores of a board).

    ``Device()`` runs steps on the host evaluator (fp32 in the compiler's order of additions,
    matmuls as the MXU's bf16 passes); ``Device(board, cores=[0])`` runs them as generated
    programs on the simulated board, with its cycles (``last_step_cycles``);
    ``Device(board, cores, evaluator=True)`` runs them on the host evaluator in the numerics of
    those cores of the board (one replica per core: its MXU's passes and its all-reduce's order
    of additions, the torus on a torus board), the reference the board's values equal bit for
    bit. The board itself runs nothing then."""

    def __init__(self, board=None, cores=(0,), index: int = 0, host_fallback: bool = True,
                 replicas: int = 1, evaluator: bool = False):
        self.index = index
        self.fusions_run = 0
        if board is not None and evaluator:
            cb = board._board
            cores = list(board.cores(_core_spec(cores)))
            self.board = None  # host time, no board clock
            self.backend = C.HostBackend(len(cores), board=cb, cores=cores)
            self.ctx = C.LazyContext(self.backend, cb)  # compiled for the board, as a device's
            return
        self.board = board
        if board is None:
            self.backend = C.HostBackend(replicas)
            self.ctx = C.LazyContext(self.backend)
        else:
            cb = board._board
            self.backend = C.DeviceBackend(cb, list(board.cores(_core_spec(cores))), host_fallback)
            self.ctx = C.LazyContext(self.backend, cb)

    def __repr__(self):
        where = "host" if self.board is None else "board"
        return f"tpusim:{self.index} ({where})"

    @property
    def replicas(self) -> int:
        """Replicas every step runs on (data parallel: one per core on a board)."""
        return self.backend.replicas

    def _sim_seconds(self):
        # A closed board's device lives on while tensors hold data on it (reads still work);
        # its clock is no longer the Board's to report.
        if self.board is None or self.board._board.closed:
            return None
        return self.board.cycle / (self.board.clock_mhz * 1e6)

    def timed(self, name, fn, *args):
        """Runs fn, adding its time to metric `name`: simulated seconds on a board, host
        seconds on the host backend."""
        t0, s0 = time.perf_counter(), self._sim_seconds()
        h0 = self._h2d_cycles()
        out = fn(*args)
        s1 = self._sim_seconds()
        if s0 is None or s1 is None:
            METRICS.metric(name).add(time.perf_counter() - t0)
            return out
        # The device backend writes a new tensor (an input, a parameter, a CPU fallback's
        # result) when the first step that reads it runs: that link time is a transfer to the
        # device, as PyTorch/XLA counts it, not part of the execution.
        h2d = (self._h2d_cycles() - h0) / (self.board.clock_mhz * 1e6)
        if h2d > 0:
            METRICS.metric("TransferToDeviceTime").add(h2d)
        METRICS.metric(name).add(max(s1 - s0 - h2d, 0.0))
        return out

    def _h2d_cycles(self):
        return self.backend.stats()["h2d_cycles"] if self.board is not None else 0

    def _count_compiles(self, before):
        after = self.ctx.stats()
        for key, name in (("uncached_compiles", "UncachedCompile"),
                          ("cached_compiles", "CachedCompile")):
            METRICS.count(name, after[key] - before[key])
        if after["compile_seconds"] > before["compile_seconds"]:
            METRICS.metric("CompileTime").add(after["compile_seconds"] - before["compile_seconds"])
        if after["uncached_compiles"] > before["uncached_compiles"] and before["mark_steps"] >= 2:
            warnings.warn("tpusim.torch: a new graph was compiled (a changed shape or op; "
                          f"{after['uncached_compiles']} compiles so far): "
                          "keep shapes fixed across steps", RecompileWarning, stacklevel=4)

    def run(self, fn, *args):
        """A cut: fn runs graphs; compiles and execution time are counted."""
        before = self.ctx.stats()
        out = self.timed("ExecuteTime", fn, *args)
        self._count_compiles(before)
        if self.ctx.stats()["executions"] > before["executions"]:
            # A cut runs at most one graph: the fusions it ran (on the device or the host).
            self.fusions_run += len(self.ctx.last_fusions())
        return out

    def mark_step(self):
        METRICS.count("MarkStep")
        self.run(self.ctx.mark_step)

    def upload(self, t: torch.Tensor, parameter: bool, name: str = ""):
        """A CPU tensor to device data (timed over the host link on a board)."""
        t = t.detach()
        shape = C.Shape(compiler_dtype(t.dtype), list(t.shape))
        values = t.to(torch.float32).contiguous().numpy().reshape(-1)
        make = self.ctx.parameter if parameter else self.ctx.input
        lazy = self._staged(make, name or "t", shape, [values])
        return TpuTensor(lazy, self, t.dtype, t.shape)

    def _staged(self, make, *args):
        # On the host evaluator the copy is the transfer; on a board the backend writes the
        # tensor when a step first reads it (timed then, in `timed`).
        if self.board is None:
            return self.timed("TransferToDeviceTime", make, *args)
        return make(*args)

    def upload_shards(self, shards, name: str = "batch"):
        """One tensor per replica (same shape and dtype) as one per-step input: replica r
        holds shards[r]."""
        if len(shards) != self.replicas:
            raise ValueError(f"{len(shards)} shards for {self.replicas} replicas")
        first = shards[0]
        for s in shards:
            if s.shape != first.shape or s.dtype != first.dtype:
                raise ValueError(f"shards differ: {tuple(s.shape)} {s.dtype} and "
                                 f"{tuple(first.shape)} {first.dtype}")
        shape = C.Shape(compiler_dtype(first.dtype), list(first.shape))
        values = [s.detach().to(torch.float32).contiguous().numpy().reshape(-1) for s in shards]
        lazy = self._staged(self.ctx.input, name, shape, values)
        return TpuTensor(lazy, self, first.dtype, first.shape)

    def to_host(self, x: "TpuTensor", replica: int = 0) -> torch.Tensor:
        """A host read of one replica: runs the graph x needs (a host sync when x is
        pending)."""
        from tpusim.torch._ops import refresh

        refresh(x)  # a view whose base was updated in place
        if x._lazy.pending:
            values = self.run(self.ctx.to_host, x._lazy, replica)
        else:
            values = self.timed("TransferFromDeviceTime", self.ctx.to_host, x._lazy, replica)
        out = torch.from_numpy(np.asarray(values).reshape(tuple(x.shape)))
        if not x.dtype.is_floating_point:
            out = out.round()
        return out.to(x.dtype)

    def stats(self) -> dict:
        """The lazy context's counts, and on a board the device backend's (last_step_cycles)."""
        s = dict(self.ctx.stats())
        s["fusions"] = self.fusions_run  # fusions of every step run (device and host)
        if self.board is not None:
            s.update(self.backend.stats())
        return s


class RecompileWarning(UserWarning):
    """A step compiled a new graph after the loop had settled (a changed batch shape)."""


_default = None


def default_device() -> Device:
    global _default
    if _default is None:
        _default = Device()
    return _default


def set_default_device(dev: Device) -> None:
    global _default
    _default = dev


class TpuTensor(torch.Tensor):
    """A tensor on a tpusim device: shape and dtype, its value a compiler LazyTensor."""

    @staticmethod
    def __new__(cls, lazy, dev, dtype, shape, requires_grad=False):
        r = torch.Tensor._make_wrapper_subclass(cls, tuple(shape), dtype=dtype, device="cpu",
                                                requires_grad=requires_grad)
        r._lazy = lazy
        r._dev = dev
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from tpusim.torch._ops import dispatch
        return dispatch(func, args, kwargs or {})

    # Host reads that PyTorch would serve from storage.
    def cpu(self, *args, **kwargs):
        return self._dev.to_host(self)

    def numpy(self, *args, **kwargs):
        return self._dev.to_host(self).numpy()

    def tolist(self):
        return self._dev.to_host(self).tolist()

    def __repr__(self, *args, **kwargs):
        body = repr(self._dev.to_host(self))
        return body[:-1] + f", device='tpusim:{self._dev.index}')"

    def __format__(self, spec):
        if self.dim() == 0:
            return self.item().__format__(spec)
        return repr(self)


def is_tpu(x) -> bool:
    return isinstance(x, TpuTensor)


def to_device(obj, dev: Device = None, parameter: bool = None):
    """Moves a tensor, or a module's parameters and buffers, to a tpusim device.

    Module parameters and buffers live across steps (compiler parameters, updated in place by
    the optimizer); other tensors are per-step inputs. Tied parameters (one Parameter object
    under two names) stay one tensor."""
    dev = dev or default_device()
    if isinstance(obj, torch.nn.Module):
        memo = {}
        for mod_name, mod in obj.named_modules():
            for name, p in list(mod._parameters.items()):
                if p is None or isinstance(p, TpuTensor):
                    continue
                if id(p) not in memo:
                    t = dev.upload(p.data, True, f"{mod_name}.{name}".strip("."))
                    memo[id(p)] = torch.nn.Parameter(t, requires_grad=p.requires_grad)
                mod._parameters[name] = memo[id(p)]
            for name, b in list(mod._buffers.items()):
                if b is None or isinstance(b, TpuTensor):
                    continue
                if id(b) not in memo:
                    memo[id(b)] = dev.upload(b, True, f"{mod_name}.{name}".strip("."))
                mod._buffers[name] = memo[id(b)]
        return obj
    if isinstance(obj, TpuTensor):
        return obj
    if isinstance(obj, torch.Tensor):
        t = dev.upload(obj, bool(parameter))
        if obj.requires_grad:
            t.requires_grad_(True)
        return t
    if isinstance(obj, (list, tuple, dict)):
        flat, spec = tree_flatten(obj)
        return tree_unflatten([to_device(x, dev, parameter) for x in flat], spec)
    return obj


def to_cpu(obj):
    """Tensors (in any nesting) back to the host: a host read of each."""
    return tree_map(lambda x: x._dev.to_host(x) if isinstance(x, TpuTensor) else x, obj)


def shard(batch, dev: Device = None):
    """A global batch (tensors in any nesting) split along dim 0 into one equal shard per
    replica, each replica's shard one per-step input (the data-parallel batch)."""
    dev = dev or default_device()

    def split(t):
        if not isinstance(t, torch.Tensor):
            return t
        n = dev.replicas
        if t.shape[0] % n:
            raise ValueError(f"a batch of {t.shape[0]} does not split into {n} equal shards")
        return dev.upload_shards(list(torch.chunk(t, n, 0)))

    return tree_map(split, batch)


def replica_values(x: "TpuTensor"):
    """Every replica's value of x (host reads)."""
    return [x._dev.to_host(x, r) for r in range(x._dev.replicas)]


def all_reduce(x: "TpuTensor", scale: float = 1.0) -> "TpuTensor":
    """The sum over replicas times scale (xm.all_reduce), recorded: the compiler's all-reduce."""
    from tpusim.torch._ops import Rec

    r = Rec(x._dev, x)
    return r.out(C.all_reduce(r.g, r.v(x), float(scale)), x)


def reduce_gradients(optimizer, dev: Device = None) -> None:
    """xm.reduce_gradients: every parameter's gradient becomes its mean over the replicas
    (recorded in place, so the all-reduce is inside the step)."""
    dev = dev or default_device()
    if dev.replicas == 1:
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            if isinstance(p.grad, TpuTensor):
                g = p.grad
                v = C.all_reduce(dev.ctx.graph, dev.ctx.value(g._lazy), 1.0 / dev.replicas)
                dev.ctx.assign(g._lazy, v)


def optimizer_step(optimizer, dev: Device = None):
    """xm.optimizer_step: reduce_gradients, then optimizer.step()."""
    reduce_gradients(optimizer, dev)
    return optimizer.step()


def mark_step(dev: Device = None) -> None:
    """xm.mark_step(): runs every live pending tensor's graph as one step."""
    (dev or default_device()).mark_step()
