# SPDX-License-Identifier: Apache-2.0
"""tpusim.lightning: Lightning's Trainer on lazy tensors, data parallel over replicas.

Data. As with Lightning's XLA strategy, a DataLoader's ``batch_size`` is per device: replica r
reads the batches of Lightning's DistributedSampler with rank r (training shuffles, seed 0,
set_epoch per epoch). The references (Lightning on the CPU, tpusim on 1 core) read the same
global batches in the same order: step k's global batch is rank 0's k-th batch, then rank 1's,
..., built by ``xla_order`` from torch's DistributedSampler.

Tolerances. Against Lightning on the CPU (fp32, SGD, the same global batches in the same
order), every matmul and convolution of the forward and backward passes rounds its operands to
bf16 (the TPU's default precision: 2^-8 relative per product), so each step's loss is compared
within 4 x 2^-8 of its value, as the forward tests in test_torch.py are. 8 replicas against 1
run the same products on the same bf16 operands; only the order of the gradient's sum over the
batch differs (8 partial sums joined by the all-reduce, against one), a few fp32 ulp, which can
move a later bf16 rounding by one bf16 ulp in a few operands: within 1e-4 relative.
"""

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import tpusim.lightning  # noqa: F401  (registers "tpusim")
import tpusim.torch as tt

CPU_RTOL = 4 * 2.0**-8
REPLICA_RTOL = 1e-4


class WeightSharingModule(L.LightningModule):
    """The Lightning TPU docs' module: layer_3 shares layer_1's weight."""

    def __init__(self):
        super().__init__()
        self.layer_1 = nn.Linear(32, 10, bias=False)
        self.layer_2 = nn.Linear(10, 32, bias=False)
        self.layer_3 = nn.Linear(32, 10, bias=False)
        self.layer_3.weight = self.layer_1.weight
        self.losses = []

    def forward(self, x):
        return self.layer_3(self.layer_2(self.layer_1(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("loss", loss)
        # The global batch's loss: the mean over the replicas (Lightning's strategy.reduce).
        self.losses.append(self.trainer.strategy.reduce(loss.detach()))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SmallCNN(WeightSharingModule):
    def __init__(self):
        L.LightningModule.__init__(self)
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))
        self.losses = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.losses.append(self.trainer.strategy.reduce(loss.detach()))
        return loss


@pytest.fixture(autouse=True)
def fresh():
    tt.clear_metrics()
    tt.set_mat_mul_precision("default")


STEPS = 4


def xla_order(size, replicas, per_device, steps=STEPS):
    """The sample indices of the first `steps` global batches when each of `replicas` devices
    reads `per_device` samples a step from DistributedSampler(shuffle=True, seed=0) with its
    rank (Lightning's training sampler), epoch after epoch."""
    order, epoch = [], 0
    while len(order) < steps * replicas * per_device:
        ranks = []
        for r in range(replicas):
            s = DistributedSampler(range(size), replicas, r, shuffle=True, seed=0)
            s.set_epoch(epoch)
            ranks.append(list(s))
        for k in range(len(ranks[0]) // per_device):
            for rank in ranks:
                order += rank[k * per_device:(k + 1) * per_device]
        epoch += 1
    return order[:steps * replicas * per_device]


def global_loader(data, replicas, per_device):
    """The reference's loader: the devices' batches of a step joined into one global batch."""
    return DataLoader(data, batch_size=replicas * per_device,
                      sampler=xla_order(len(data), replicas, per_device))


def fit(module_cls, loader, **trainer):
    torch.manual_seed(1)
    model = module_cls()
    L.Trainer(max_steps=STEPS, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False, **trainer).fit(model, loader)
    return model, [float(x.item()) for x in model.losses]


def close(got, want, rtol):
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) <= rtol * abs(w), (got, want)


def test_weight_sharing_module_trains_on_8_replicas_as_on_1_and_on_the_cpu():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 32), torch.randn(64, 10))
    _, cpu = fit(WeightSharingModule, global_loader(data, 8, 2), accelerator="cpu", devices=1)
    one, lazy1 = fit(WeightSharingModule, global_loader(data, 8, 2), accelerator="tpusim",
                     devices=1)
    eight, lazy8 = fit(WeightSharingModule, DataLoader(data, batch_size=2), accelerator="tpusim",
                       devices=8)
    assert isinstance(eight.trainer.strategy, tpusim.lightning.TpusimStrategy)
    assert eight.trainer.strategy.num_replicas == 8
    # Tied weights stay one parameter (one buffer per replica).
    assert eight.layer_3.weight is eight.layer_1.weight
    assert len(list(eight.parameters())) == 2
    close(lazy1, cpu, CPU_RTOL)
    close(lazy8, lazy1, REPLICA_RTOL)
    # Every step ends with a mark_step; after the first two compiles, each step is a hit.
    assert tt.counter_value("CachedCompile") >= 2


class ShardRecorder(WeightSharingModule):
    def training_step(self, batch, batch_idx):
        if batch_idx == 0:
            self.first_shards = [x for x in tt.replica_values(batch[0])]
        return super().training_step(batch, batch_idx)


def test_replica_r_reads_the_batches_of_lightning_s_sampler_with_rank_r():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 32), torch.randn(64, 10))
    model, _ = fit(ShardRecorder, DataLoader(data, batch_size=2), accelerator="tpusim",
                   devices=8)
    order = xla_order(64, 8, 2, steps=1)
    for r, shard in enumerate(model.first_shards):
        assert torch.equal(shard, data.tensors[0][order[2 * r:2 * r + 2]]), r


class RandomOrder(torch.utils.data.Sampler):
    """A sampler of the user's own: a new random order at every iteration."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(torch.randperm(self.n).tolist())


def test_a_sampler_of_the_user_s_own_is_drawn_once_for_every_replica():
    # Lightning wraps it in DistributedSamplerWrapper; each XLA process (seeded alike) draws
    # the same order and takes its rank's part, so the replicas' shards never overlap.
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 32), torch.randn(64, 10))
    model, _ = fit(ShardRecorder, DataLoader(data, batch_size=2, sampler=RandomOrder(64)),
                   accelerator="tpusim", devices=8)
    rows = torch.cat(model.first_shards)
    assert len({tuple(r.tolist()) for r in rows}) == 16


class ValidationRecorder(WeightSharingModule):
    def validation_step(self, batch, batch_idx):
        self.seen = getattr(self, "seen", []) + tt.replica_values(batch[0])


def test_validation_reads_every_sample_once_over_the_replicas():
    # Lightning's validation sampler (no shuffle): 64 samples, 8 replicas x 4 a step, 2 steps.
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 32), torch.randn(64, 10))
    model = ValidationRecorder()
    L.Trainer(accelerator="tpusim", devices=8, logger=False, enable_progress_bar=False,
              enable_model_summary=False).validate(model, DataLoader(data, batch_size=4))
    assert len(model.seen) == 16 and all(x.shape == (4, 32) for x in model.seen)
    rows = {tuple(r.tolist()) for x in model.seen for r in x}
    assert rows == {tuple(r.tolist()) for r in data.tensors[0]}


def test_without_the_distributed_sampler_every_replica_reads_the_same_batch():
    # use_distributed_sampler=False: each XLA process would iterate its own copy of the
    # loader, so every replica reads the same batch and the mean loss is that batch's.
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 32), torch.randn(64, 10))
    _, one = fit(WeightSharingModule, DataLoader(data, batch_size=4), accelerator="tpusim",
                 devices=1)
    _, eight = fit(WeightSharingModule, DataLoader(data, batch_size=4), accelerator="tpusim",
                   devices=8, use_distributed_sampler=False)
    close(eight, one, REPLICA_RTOL)


def test_small_cnn_trains_on_8_replicas_as_on_1_and_on_the_cpu():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 3, 8, 8), torch.randint(0, 4, (64,)))
    _, cpu = fit(SmallCNN, global_loader(data, 8, 2), accelerator="cpu", devices=1)
    _, lazy1 = fit(SmallCNN, global_loader(data, 8, 2), accelerator="tpusim", devices=1)
    _, lazy8 = fit(SmallCNN, DataLoader(data, batch_size=2), accelerator="tpusim", devices=8)
    close(lazy1, cpu, CPU_RTOL)
    close(lazy8, lazy1, REPLICA_RTOL)


def test_num_nodes_drives_every_node_s_cores_from_one_process():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 32), torch.randn(64, 10))
    # 16 replicas x 2 samples: 2 steps an epoch, so the 4 steps cross into epoch 1.
    _, one = fit(WeightSharingModule, global_loader(data, 16, 2), accelerator="tpusim",
                 devices=1)
    model, sixteen = fit(WeightSharingModule, DataLoader(data, batch_size=2),
                         accelerator="tpusim", devices=8, num_nodes=2)
    assert model.trainer.strategy.num_replicas == 16 and model.trainer.num_nodes == 2
    close(sixteen, one, REPLICA_RTOL)


def test_bf16_true_trains_as_lightning_on_the_cpu_does():
    # Parameters, inputs and every result in bf16 on both sides: each op rounds to 8
    # significant bits, in a different order of additions, so losses agree within a few bf16
    # ulp (4 x 2^-8) of each other.
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 32), torch.randn(64, 10))
    _, cpu = fit(WeightSharingModule, global_loader(data, 8, 2), accelerator="cpu", devices=1,
                 precision="bf16-true")
    model, lazy = fit(WeightSharingModule, DataLoader(data, batch_size=2), accelerator="tpusim",
                      devices=8, precision="bf16-true")
    assert model.layer_1.weight.dtype == torch.bfloat16
    close(lazy, cpu, CPU_RTOL)


def test_unsupported_precision_and_batches_fail_with_their_names():
    with pytest.raises(ValueError, match="`precision='bf16-mixed'` is not supported by tpusim"):
        fit(WeightSharingModule,
            DataLoader(TensorDataset(torch.randn(16, 32), torch.randn(16, 10)), batch_size=16),
            accelerator="tpusim", devices=1, precision="bf16-mixed")
    strategy = tpusim.lightning.TpusimStrategy(accelerator=tpusim.lightning.TpusimAccelerator())
    with pytest.raises(TypeError, match="a batch holds a object"):
        strategy.batch_to_device({"x": torch.zeros(2), "what": object()})


def test_weight_sharing_module_on_8_cores_of_the_board():
    # The step as generated programs on the board's 8 cores, the gradient all-reduce on the
    # ring inside it; fusions not generated yet run on the host (the device backend's
    # fallback). Same bf16 rule as on the host evaluator.
    import tpusim

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 32), torch.randn(64, 10))
    _, cpu = fit(WeightSharingModule, global_loader(data, 8, 2), accelerator="cpu", devices=1)
    with tpusim.Board() as board:
        acc = tpusim.lightning.TpusimAccelerator(board=board)
        model, lazy8 = fit(WeightSharingModule, DataLoader(data, batch_size=2), accelerator=acc,
                           devices=8)
        s = model.trainer.strategy.lazy_device.stats()
    close(lazy8, cpu, CPU_RTOL)
    assert s["last_step_cycles"] > 0 and s["launches"] >= 4
