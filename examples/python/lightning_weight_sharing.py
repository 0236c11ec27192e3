# SPDX-License-Identifier: Apache-2.0
"""The Lightning TPU docs' WeightSharingModule, trained on 8 simulated cores of a board
(python/README.md, "tpusim.lightning"). The module is the docs' own; only the accelerator
changes. Each step is one replicated program with the gradients' all-reduce inside it.
"""

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tpusim
import tpusim.lightning
import tpusim.torch as tt


class WeightSharingModule(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer_1 = nn.Linear(32, 10, bias=False)
        self.layer_2 = nn.Linear(10, 32, bias=False)
        self.layer_3 = nn.Linear(32, 10, bias=False)
        self.layer_3.weight = self.layer_1.weight   # tied: one parameter

    def forward(self, x):
        return self.layer_3(self.layer_2(self.layer_1(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("loss", loss, sync_dist=True)    # the mean over the 8 cores
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = TensorDataset(torch.randn(128, 32), torch.randn(128, 10))
model = WeightSharingModule()
with tpusim.Board() as board:
    trainer = L.Trainer(accelerator=tpusim.lightning.TpusimAccelerator(board=board), devices=8,
                        max_steps=4, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, DataLoader(data, batch_size=4))    # per core, as on a TPU: 32 a step
    stats = trainer.strategy.lazy_device.stats()
assert model.layer_3.weight is model.layer_1.weight
print(f"loss {trainer.callback_metrics['loss'].item():.4f}; last step {stats['last_step_cycles']} "
      f"cycles on 8 cores, {stats['launches']} launches in all, "
      f"{stats['fallback_fusions']} fusions on the host")
print(tt.metrics_report())
