# SPDX-License-Identifier: Apache-2.0
"""tpusim.torch: PyTorch on the simulated board through lazy tensors, as PyTorch/XLA runs it.

    import torch, tpusim, tpusim.torch as tt
    model = tt.to_device(torch.nn.Linear(256, 128))      # parameters live on the device
    x = tt.to_device(torch.randn(8, 256))                # a per-step input
    y = model(x)                                         # recorded, not run
    print(y.sum().item())                                # a host read: compiles and runs
    tt.mark_step()                                       # the step's cut (xm.mark_step())
    print(tt.metrics_report())                           # PyTorch/XLA's metrics format

``tt.Device()`` (the default) runs steps on the compiler's host evaluator;
``tt.Device(tpusim.Board(), cores=[0])`` runs them as generated programs on the simulated
board. See python/README.md, "tpusim.torch".
"""

import contextlib

import torch

from tpusim import _core
from tpusim.torch._lazy import (Device, RecompileWarning, TpuTensor, all_reduce, default_device,
                                mark_step, optimizer_step, reduce_gradients, replica_values,
                                set_default_device, shard, to_cpu, to_device)
from tpusim.torch._metrics import METRICS, format_seconds
from tpusim.torch import _ops  # noqa: F401  (registers the lowerings)

__all__ = [
    "Device", "all_reduce", "optimizer_step", "reduce_gradients", "replica_values", "shard", "RecompileWarning", "TpuTensor", "clear_metrics", "counter_value",
    "default_device", "mark_step", "metrics_report", "profile", "set_default_device", "set_mat_mul_precision", "to_cpu",
    "to_device",
]


_PRECISIONS = {"default": _core.compiler.Precision.Default, "high": _core.compiler.Precision.High,
               "highest": _core.compiler.Precision.Highest}


def set_mat_mul_precision(precision: str) -> None:
    """The precision of matmuls and convolutions recorded from now on, as PyTorch/XLA's
    torch_xla._XLAC._xla_set_mat_mul_precision: "default" (one bf16 MXU pass, the TPU's
    default for fp32), "high" (3 passes, bf16x3) or "highest" (6 passes, about fp32)."""
    if precision not in _PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {sorted(_PRECISIONS)}")
    _ops.PRECISION[0] = _PRECISIONS[precision]


def metrics_report() -> str:
    """Metrics and counters in torch_xla.debug.metrics.metrics_report()'s format."""
    return METRICS.report()


def counter_value(name: str) -> int:
    """A counter's value (0 when never counted), as torch_xla's met.counter_value."""
    return METRICS.counters.get(name, 0)


def clear_metrics() -> None:
    """Clears every metric and counter (met.clear_all())."""
    METRICS.clear()


@contextlib.contextmanager
def profile(module: torch.nn.Module, dev: Device = None):
    """Records the ops of each submodule's forward under the module's own name (the compiler's
    scope, which names the fusions). Yields a function that returns, for the last step run,
    [(fusion, kind, [module names])]."""
    dev = dev or default_device()
    stack = []
    handles = []
    for name, mod in module.named_modules():
        if not name:
            continue

        def pre(m, inputs, name=name):
            stack.append(dev.ctx.graph.set_scope(name))

        def post(m, inputs, output):
            dev.ctx.graph.set_scope(stack.pop())

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    try:
        yield lambda: dev.ctx.last_fusions()
    finally:
        for h in handles:
            h.remove()


def _dynamo_backend(gm, example_inputs):
    """torch.compile(model, backend="tpusim"): the FX graph runs on lazy tensors, one step per
    call (inputs uploaded, the graph cut, outputs read back). Parameters passed as graph inputs
    are uploaded once per tensor and kept on the device."""
    dev = default_device()
    resident = {}

    def run(*args):
        lazy = []
        for a in args:
            if isinstance(a, torch.nn.Parameter) or (isinstance(a, torch.Tensor)
                                                     and a.requires_grad):
                key = id(a)
                if key not in resident or resident[key][0] is not a:
                    resident[key] = (a, dev.upload(a.detach(), True))
                lazy.append(resident[key][1])
            elif isinstance(a, torch.Tensor):
                lazy.append(dev.upload(a, False))
            else:
                lazy.append(a)
        with torch.no_grad():
            out = gm(*lazy)
        dev.mark_step()
        return to_cpu(out)

    return run


try:
    from torch._dynamo import register_backend

    register_backend(name="tpusim")(_dynamo_backend)
except Exception:  # noqa: BLE001  (an older torch without dynamo: torch.compile is absent)
    pass
