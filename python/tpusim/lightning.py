# SPDX-License-Identifier: Apache-2.0
"""tpusim.lightning: Lightning on lazy tpusim tensors (python/README.md, "tpusim.lightning").

``import tpusim.lightning`` registers the accelerator "tpusim", its strategy and precision
plugin, modelled on Lightning's XLA ones (accelerators/xla.py, strategies/xla.py,
plugins/precision/xla.py):

    import lightning as L, tpusim.lightning
    L.Trainer(accelerator="tpusim", devices=8, max_steps=10).fit(model, loader)

Data parallel over ``devices`` replicas in one process, as one replicated program. As with
Lightning's XLA strategy (one process per device, each with its own DataLoader on Lightning's
DistributedSampler), ``batch_size`` is per device: replica r's batch comes from its own copy of
the DataLoader on Lightning's distributed sampler with rank r, and the step's input is one
shard per replica; the gradients are averaged by an all-reduce recorded inside the step (the
compiler's all-reduce op), and the step ends with a mark_step after the optimizer step
(XLAPrecision's optimizer_step). Steps run on the compiler's host evaluator by default; pass
``accelerator=TpusimAccelerator(board=tpusim.Board())`` to run them on the board's cores.
"""

from functools import partial
from typing import Any

import torch
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.accelerators.accelerator import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import SingleDeviceStrategy, StrategyRegistry
from lightning.fabric.utilities.data import has_iterable_dataset
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from lightning.pytorch.trainer.connectors import accelerator_connector as _connector
from lightning.pytorch.trainer.connectors import data_connector as _data
from lightning.pytorch.utilities.data import _update_dataloader
from torch.utils.data import DataLoader, DistributedSampler

import tpusim.torch as tt

_PRECISIONS = ("32-true", "bf16-true")


class TpusimAccelerator(Accelerator):
    """The simulated board's cores as Lightning devices (one process, one replica per core)."""

    def __init__(self, board=None):
        super().__init__()
        self.board = board

    def setup_device(self, device: torch.device) -> None:
        pass

    def teardown(self) -> None:
        pass

    @staticmethod
    def parse_devices(devices: Any) -> list:
        """1, 8, [5], "auto" (every core of the built-in board: 8) -> core numbers."""
        if devices == "auto" or devices == -1:
            return list(range(8))
        if isinstance(devices, str):
            devices = int(devices)
        if isinstance(devices, int):
            if devices < 1:
                raise ValueError(f"devices={devices}: at least one core")
            return list(range(devices))
        if isinstance(devices, (list, tuple)) and all(isinstance(d, int) for d in devices):
            return list(devices)
        raise TypeError(f"devices={devices!r}: an int, a list of core numbers or 'auto'")

    @staticmethod
    def get_parallel_devices(devices: Any) -> list:
        # The lazy tensors report the CPU (they are a tensor subclass with no storage).
        return [torch.device("cpu", i) for i in TpusimAccelerator.parse_devices(devices)]

    @staticmethod
    def auto_device_count() -> int:
        return 8

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def name() -> str:
        return "tpusim"

    def get_device_stats(self, device) -> dict:
        return {}

    @classmethod
    def register_accelerators(cls, accelerator_registry) -> None:
        accelerator_registry.register("tpusim", cls, description=cls.__name__)


class TpusimPrecision(Precision):
    """XLAPrecision's optimizer step: the closure (forward, backward), the gradients averaged
    over the replicas, the optimizer's step, then mark_step. "32-true" (matmuls at the TPU's
    default precision: bf16 operands, fp32 sums) or "bf16-true" (parameters and floating
    inputs in bf16, as XLA_USE_BF16); a TPU has no fp16."""

    def __init__(self, precision: str = "32-true"):
        precision = {"32": "32-true", "bf16": "bf16-true"}.get(str(precision), str(precision))
        if precision not in _PRECISIONS:
            raise ValueError(
                f"`precision={precision!r}` is not supported by tpusim. `precision` must be one "
                f"of: {_PRECISIONS}.")
        self.precision = precision
        self._dtype = torch.bfloat16 if precision == "bf16-true" else torch.float32

    def convert_module(self, module):
        return module.to(dtype=self._dtype)

    def convert_input(self, data):
        def convert(t):
            return t.to(self._dtype) if torch.is_floating_point(t) else t

        return torch.utils._pytree.tree_map(
            lambda x: convert(x) if isinstance(x, torch.Tensor) else x, data)

    def optimizer_step(self, optimizer, model, closure, **kwargs):
        closure = partial(self._reduce_closure, optimizer, closure)
        closure = partial(self._wrap_closure, model, optimizer, closure)
        result = optimizer.step(closure=closure, **kwargs)
        tt.mark_step(self.device)
        return result

    def _reduce_closure(self, optimizer, closure):
        result = closure()
        tt.reduce_gradients(optimizer, self.device)
        return result


class TpusimStrategy(SingleDeviceStrategy):
    """One process driving every replica: the module's parameters on the lazy device, each
    batch sharded over the replicas, logged values averaged over them."""

    strategy_name = "tpusim"

    def __init__(self, accelerator=None, cores=None, precision_plugin=None):
        super().__init__(device=torch.device("cpu"), accelerator=accelerator,
                         precision_plugin=precision_plugin or TpusimPrecision())
        self._cores = cores
        self.lazy_device = None
        self.num_nodes = 1

    def _make_device(self):
        if self.lazy_device is None:
            cores = self._cores or [0]
            acc = self.accelerator
            board = getattr(acc, "board", None)
            if board is not None:
                self.lazy_device = tt.Device(board, cores=cores)
            else:
                self.lazy_device = tt.Device(replicas=len(cores))
            tt.set_default_device(self.lazy_device)
        self.precision_plugin.device = self.lazy_device
        return self.lazy_device

    @property
    def precision_plugin(self):
        return self._tpusim_precision

    @precision_plugin.setter
    def precision_plugin(self, plugin):
        # The connector hands every strategy its default plugin: it becomes ours, with its
        # precision checked (XLAStrategy gets XLAPrecision the same way).
        if plugin is not None and not isinstance(plugin, TpusimPrecision):
            plugin = TpusimPrecision(getattr(plugin, "precision", "32-true"))
        if plugin is not None and self.lazy_device_or_none() is not None:
            plugin.device = self.lazy_device
        self._tpusim_precision = plugin

    def lazy_device_or_none(self):
        return getattr(self, "lazy_device", None)

    @property
    def num_replicas(self) -> int:
        return self._make_device().replicas

    def model_to_device(self) -> None:
        tt.to_device(self.model, self._make_device())

    def process_dataloader(self, dataloader: object) -> object:
        """A DataLoader that did not get one sampler per replica (_prepare_dataloader): every
        replica reads its batches, as each XLA process would iterate its own copy (a sampler
        of the user's own, use_distributed_sampler=False, an iterable dataset)."""
        n = self.num_replicas
        if n == 1 or not isinstance(dataloader, DataLoader):
            return dataloader
        return _ReplicaLoader([dataloader], n)

    def batch_to_device(self, batch, device=None, dataloader_idx: int = 0):
        dev = self._make_device()
        flat, _ = torch.utils._pytree.tree_flatten(batch)
        for x in flat:
            _check_leaf(x)
        return tt.shard(batch, dev)

    def reduce(self, tensor, group=None, reduce_op="mean"):
        if not isinstance(tensor, tt.TpuTensor):
            return tensor
        n = self.lazy_device.replicas
        op = str(reduce_op).lower()
        scale = 1.0 / n if op in ("mean", "avg", "reduceop.avg", "reduceop.mean") else 1.0
        return tt.all_reduce(tensor, scale)

    def teardown(self) -> None:
        if self.lazy_device is not None:
            tt.mark_step(self.lazy_device)
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls, description=cls.__name__)


def _check_leaf(x) -> None:
    if not isinstance(x, (torch.Tensor, int, float, bool)) and x is not None:
        raise TypeError(f"tpusim: a batch holds a {type(x).__name__}: only tensors "
                        "(in lists, tuples and dicts) move to the device")


class _SharedDraw:
    """A DistributedSamplerWrapper's index list as seen by ranks 1..n-1: rank 0's draw."""

    def __init__(self, inner):
        self._inner = inner
        self._sampler = inner._sampler  # set_epoch reaches the user's sampler through it

    def reset(self) -> None:
        pass

    def __len__(self):
        return len(self._inner)

    def __getitem__(self, i):
        return self._inner[i]


class _SamplerEpochs:
    """Every replica's sampler under one set_epoch (Lightning calls it on loader.sampler)."""

    def __init__(self, samplers):
        self.samplers = samplers

    def set_epoch(self, epoch: int) -> None:
        for s in {id(s): s for s in self.samplers}.values():
            if callable(getattr(s, "set_epoch", None)):
                s.set_epoch(epoch)


class _ReplicaLoader:
    """The replicas' DataLoaders zipped (one loader repeated when every replica reads the same
    batches). Each step yields replica 0's batch, then 1's, ... concatenated along dim 0, so
    batch_to_device's split into equal shards hands replica r exactly its own batch; hooks
    such as on_before_batch_transfer see that global batch."""

    def __init__(self, loaders, replicas: int):
        self.loaders = loaders
        self.replicas = replicas
        self.dataset = loaders[0].dataset
        self.sampler = _SamplerEpochs([dl.sampler for dl in loaders])

    def __len__(self):
        return min(len(dl) for dl in self.loaders)

    def __iter__(self):
        if len(self.loaders) == 1:
            for batch in self.loaders[0]:
                yield _concat([batch] * self.replicas)
        else:
            for batches in zip(*self.loaders):
                yield _concat(list(batches))


def _concat(batches):
    """Per-replica batches (the same structure) -> one batch, tensors joined along dim 0."""
    tree = torch.utils._pytree
    flats = [tree.tree_flatten(b) for b in batches]
    spec = flats[0][1]
    out = []
    for i, leaves in enumerate(zip(*(f[0] for f in flats))):
        first = leaves[0]
        _check_leaf(first)
        if isinstance(first, torch.Tensor):
            shapes = {tuple(x.shape) for x in leaves}
            if len(shapes) != 1 or first.dim() == 0:
                raise ValueError(f"tpusim: the replicas' batches differ in shape at leaf {i} "
                                 f"({sorted(shapes)}): one replicated step needs equal shapes "
                                 "on every replica")
            out.append(torch.cat(leaves, 0))
        else:
            if any(x != first for x in leaves):
                raise ValueError(f"tpusim: the replicas' batches differ at leaf {i} ({leaves})")
            out.append(first)
    for _, s in flats[1:]:
        if s != spec:
            raise ValueError("tpusim: the replicas' batches differ in structure")
    return tree.tree_unflatten(out, spec)


def _choose_strategy(self, _original=_connector._AcceleratorConnector._choose_strategy):
    """Lightning picks DDP for an unknown accelerator with several devices: "tpusim" gets its
    own strategy (as "tpu" gets XLAStrategy)."""
    flag = self._accelerator_flag
    if flag == "tpusim" or isinstance(flag, TpusimAccelerator):
        acc = flag if isinstance(flag, TpusimAccelerator) else TpusimAccelerator()
        cores = [d.index or 0 for d in self._parallel_devices] or [0]
        # num_nodes: the next chips' cores of the board (a pod preset), one process driving all.
        per_node = max(cores) + 1
        cores = [n * per_node + c for n in range(self._num_nodes_flag) for c in cores]
        strategy = TpusimStrategy(accelerator=acc, cores=cores)
        strategy.num_nodes = self._num_nodes_flag
        return strategy
    return _original(self)


def _prepare_dataloader(self, dataloader, shuffle, mode=None,
                        _original=_data._DataConnector._prepare_dataloader):
    """Lightning's XLA strategy gives each process's DataLoader Lightning's distributed sampler
    (num_replicas = world size, rank = the process). One process drives every replica here: the
    same rule (_requires_distributed_sampler with the replicas as the world) makes one DataLoader
    per replica, with _get_distributed_sampler's sampler for rank r, zipped by _ReplicaLoader."""
    trainer = self.trainer
    strategy = trainer.strategy
    if not isinstance(strategy, TpusimStrategy) or strategy.num_replicas == 1 or not (
            isinstance(dataloader, DataLoader)
            and trainer._accelerator_connector.use_distributed_sampler
            and not isinstance(dataloader.sampler, DistributedSampler)
            and not has_iterable_dataset(dataloader)):
        return _original(self, dataloader, shuffle, mode)
    n = strategy.num_replicas
    loaders, first = [], None
    for r in range(n):
        sampler = _data._get_distributed_sampler(dataloader, shuffle, mode=mode,
                                                 overfit_batches=trainer.overfit_batches,
                                                 num_replicas=n, rank=r)
        if isinstance(sampler, DistributedSamplerWrapper):
            # The wrapper draws the user's sampler's order at each __iter__: rank 0's loader,
            # iterated first, draws it and the other ranks read that draw, as XLA's processes,
            # seeded alike, draw one order.
            if first is None:
                first = sampler.dataset
            else:
                sampler.dataset = _SharedDraw(first)
        loaders.append(_update_dataloader(dataloader, sampler, mode=mode))
    return _ReplicaLoader(loaders, n)


def _register() -> None:
    if "tpusim" not in AcceleratorRegistry:
        TpusimAccelerator.register_accelerators(AcceleratorRegistry)
    if "tpusim" not in StrategyRegistry:
        TpusimStrategy.register_strategies(StrategyRegistry)
    _connector._AcceleratorConnector._choose_strategy = _choose_strategy
    _data._DataConnector._prepare_dataloader = _prepare_dataloader


_register()
