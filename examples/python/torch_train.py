# SPDX-License-Identifier: Apache-2.0
"""A PyTorch training loop on lazy tpusim tensors (python/README.md, "tpusim.torch").

The model, autograd and torch.optim are PyTorch's own; only the tensors are moved. Each step
is recorded and cut at mark_step(): the first two steps compile, the rest hit the cache. Then
the trained model's inference runs on the simulated board, with its cycles.
"""

import torch

import tpusim
import tpusim.torch as tt

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
tt.to_device(model)                                   # on the default device: the host evaluator
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

for step in range(5):
    x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
    loss = torch.nn.functional.cross_entropy(model(tt.to_device(x)), tt.to_device(y))
    opt.zero_grad()
    loss.backward()
    opt.step()
    tt.mark_step()                                    # the step's cut: compile (or hit) and run
    print(f"step {step}: loss {loss.item():.4f}")     # a read of data already computed

assert tt.counter_value("UncachedCompile") == 2 and tt.counter_value("CachedCompile") == 3
print(tt.metrics_report())

# Inference on the simulated board: the step runs as one generated program on core 0.
with tpusim.Board() as board:
    dev = tt.Device(board, cores=[0])
    net = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 128)).eval()
    tt.to_device(net, dev)
    with torch.no_grad():
        out = net(tt.to_device(torch.randn(8, 128), dev))
    tt.mark_step(dev)
    s = dev.stats()
    print(f"board: {s['launches']} launch, {s['last_step_cycles']} cycles, "
          f"{dev.ctx.last_summary().count('fusion.')} fusions")
    assert s["last_step_cycles"] > 0 and out.cpu().shape == (8, 128)
