# SPDX-License-Identifier: Apache-2.0
"""tpusim.torch: lazy tensors against PyTorch on the CPU.

Tolerances. At the default matmul precision a TPU (and the compiler: evaluator and device alike)
rounds both operands of every matmul and convolution to bf16 (8 significant bits: a relative
error of at most 2^-9 each, so 2^-8 per product) and accumulates in fp32. Through a few layers
with normalisations between them the error stays a small multiple of that, so forward values
are compared within DEFAULT_RTOL = 4 * 2^-8 of the output's largest magnitude. At "highest"
precision (six bf16 passes, about fp32 products) the only difference left is the order of
additions (the compiler sums reductions in 128-lane chunks, a dot in 128-deep MXU passes;
PyTorch's CPU kernels block differently): about sqrt(K) ulp of the sums, so HIGHEST_RTOL =
1e-5 of the largest magnitude (fp32's ulp is 2^-23 = 1.2e-7 relative; K here is at most a few
hundred).
"""

import warnings

import pytest
import torch

import tpusim
import tpusim.torch as tt

DEFAULT_RTOL = 4 * 2.0**-8
HIGHEST_RTOL = 1e-5


@pytest.fixture(autouse=True)
def fresh_device():
    """Each test records on its own host-evaluator device, with the metrics cleared."""
    tt.set_default_device(tt.Device())
    tt.clear_metrics()
    tt.set_mat_mul_precision("default")
    torch.manual_seed(0)
    yield
    tt.set_mat_mul_precision("default")


def close(got, want, rtol):
    scale = want.abs().max().item()
    err = (got - want).abs().max().item()
    assert err <= rtol * scale, f"max error {err:.3g} > {rtol:.3g} x {scale:.3g}"


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


# ---- transformers models, forward ------------------------------------------------------------


def _models():
    import transformers as tr

    ids = lambda: dict(input_ids=torch.randint(0, 100, (2, 16)))  # noqa: E731
    img = lambda: dict(pixel_values=torch.randn(2, 3, 32, 32))  # noqa: E731
    return {
        "bert": (lambda: tr.BertModel(tr.BertConfig(
            vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=32)), ids),
        "gpt2": (lambda: tr.GPT2Model(tr.GPT2Config(
            vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=32,
            bos_token_id=0, eos_token_id=0)), ids),
        "vit": (lambda: tr.ViTModel(tr.ViTConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            image_size=32, patch_size=8)), img),
        "resnet": (lambda: tr.ResNetModel(tr.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic")), img),
        "mobilenetv2": (lambda: tr.MobileNetV2Model(tr.MobileNetV2Config(
            image_size=32, depth_multiplier=0.35)), img),
    }


def _forward(name, precision):
    make, inputs = _models()[name]
    torch.manual_seed(0)
    model = make().eval()
    x = inputs()
    with torch.no_grad():
        want = model(**x).last_hidden_state
        tt.set_mat_mul_precision(precision)
        got = tt.to_device(model)(**tt.to_device(x)).last_hidden_state
    tt.mark_step()
    assert isinstance(got, tt.TpuTensor)
    return got.cpu(), want


@pytest.mark.parametrize("name", ["bert", "gpt2", "vit", "resnet"])
def test_transformers_forward_matches_cpu(name):
    got, want = _forward(name, "default")
    close(got, want, DEFAULT_RTOL)


@pytest.mark.parametrize("name", ["bert", "vit"])
def test_transformers_forward_at_highest_precision_differs_only_in_the_order_of_additions(name):
    got, want = _forward(name, "highest")
    close(got, want, HIGHEST_RTOL)


def test_gpt2_lowers_without_fallback_and_compiles_one_graph():
    _forward("gpt2", "default")
    assert not [k for k in tt._metrics.METRICS.counters if k.startswith("aten::")]
    assert tt.counter_value("UncachedCompile") == 1


def test_depthwise_convolution_falls_back_to_the_cpu_and_is_counted():
    # MobileNetV2's depthwise convolutions (groups = channels) have no compiler lowering: each
    # runs on the CPU (PyTorch/XLA's fallback), its inputs read to the host, which cuts the graph.
    got, want = _forward("mobilenetv2", "default")
    close(got, want, DEFAULT_RTOL)
    # 0.35 x MobileNetV2 has 17 inverted-residual blocks, each with one depthwise convolution.
    assert tt.counter_value("aten::convolution") == 17
    assert "Counter: aten::convolution\n  Value: 17\n" in tt.metrics_report()


# ---- training ----------------------------------------------------------------------------------


def _train(model, batches, lazy):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in batches:
        if lazy:
            x, y = tt.to_device(x), tt.to_device(y)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if lazy:
            tt.mark_step()
        losses.append(loss.item())
    return losses


def test_training_loop_compiles_once_then_hits_the_cache_and_matches_cpu_losses():
    batches = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(6)]
    want = _train(mlp(), batches, lazy=False)
    got = _train(tt.to_device(mlp()), batches, lazy=True)
    # The first step compiles its graph; the second compiles again because the parameters now
    # have the layouts the first step gave them (part of the graph, compiler/README.md); every
    # later step is a cache hit.
    assert tt.counter_value("UncachedCompile") == 2
    assert tt.counter_value("CachedCompile") == 4
    assert tt.counter_value("MarkStep") == 6
    # Six SGD steps on bf16 matmuls: each loss within the forward tolerance of the CPU's.
    for g, w in zip(got, want):
        assert abs(g - w) <= DEFAULT_RTOL * abs(w), (got, want)


def test_a_cnn_with_batch_norm_trains_and_updates_its_running_statistics():
    def cnn():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                   torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                   torch.nn.Flatten(), torch.nn.Linear(8, 4))

    batches = [(torch.randn(8, 3, 8, 8), torch.randint(0, 4, (8,))) for _ in range(3)]
    cpu = cnn()
    want = _train(cpu, batches, lazy=False)
    lazy = tt.to_device(cnn())
    got = _train(lazy, batches, lazy=True)
    for g, w in zip(got, want):
        assert abs(g - w) <= DEFAULT_RTOL * abs(w), (got, want)
    # The running statistics are updated in place inside the step (momentum 0.1, unbiased var).
    close(lazy[1].running_mean.cpu(), cpu[1].running_mean, DEFAULT_RTOL)
    close(lazy[1].running_var.cpu(), cpu[1].running_var, DEFAULT_RTOL)
    assert int(lazy[1].num_batches_tracked.item()) == 3
    assert not [k for k in tt._metrics.METRICS.counters if k.startswith("aten::")]


def _bert_classifier(dropout):
    import transformers as tr

    torch.manual_seed(0)
    return tr.BertForSequenceClassification(tr.BertConfig(
        vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=32, num_labels=3,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout))


def _train_hf(model, batches, lazy):
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for ids, y in batches:
        if lazy:
            ids, y = tt.to_device(ids), tt.to_device(y)
        opt.zero_grad()
        loss = model(input_ids=ids, labels=y).loss
        loss.backward()
        opt.step()
        if lazy:
            tt.mark_step()
        losses.append(loss.item())
    return losses


def test_bert_trains_with_autograd_and_sgd_as_on_the_cpu():
    # The backward of attention (PyTorch's CPU flash kernel, no decomposition of its own) is
    # recorded as the math attention's gradient; layer norm's comes from torch._decomp.
    batches = [(torch.randint(0, 100, (4, 16)), torch.randint(0, 3, (4,))) for _ in range(2)]
    want = _train_hf(_bert_classifier(0.0), batches, lazy=False)
    got = _train_hf(tt.to_device(_bert_classifier(0.0)), batches, lazy=True)
    for g, w in zip(got, want):
        assert abs(g - w) <= DEFAULT_RTOL * abs(w), (got, want)
    fallbacks = {k for k in tt._metrics.METRICS.counters if k.startswith("aten::")}
    assert fallbacks == {"aten::gather"}   # the token type ids' buffer


def test_bert_trains_on_the_board_as_on_the_cpu():
    # The training step touches more buffers than a launch carries (54 > 31 addresses): code
    # generation cuts it into several programs, each a launch; unsupported fusions run on the
    # host. Same bf16 rule as on the host evaluator.
    batches = [(torch.randint(0, 100, (4, 16)), torch.randint(0, 3, (4,))) for _ in range(2)]
    want = _train_hf(_bert_classifier(0.0), batches, lazy=False)
    with tpusim.Board() as board:
        dev = tt.Device(board, cores=[0])
        tt.set_default_device(dev)
        got = _train_hf(tt.to_device(_bert_classifier(0.0), dev), batches, lazy=True)
        s = dev.stats()
    for g, w in zip(got, want):
        assert abs(g - w) <= DEFAULT_RTOL * abs(w), (got, want)
    assert s["launches"] > s["executions"]


def test_dropout_is_recorded_with_the_compilers_random_numbers():
    batches = [(torch.randint(0, 100, (4, 16)), torch.randint(0, 3, (4,))) for _ in range(3)]
    losses = _train_hf(tt.to_device(_bert_classifier(0.1)), batches, lazy=True)
    assert all(0.5 < x < 2.0 for x in losses)
    assert tt.counter_value("aten::bernoulli_") == 0
    assert tt.counter_value("aten::native_dropout") == 0
    # The seeds are data: the third step's graphs are the second's.
    assert tt.counter_value("CachedCompile") > 0


def test_a_changed_batch_shape_recompiles_and_warns():
    model = tt.to_device(mlp())
    batches = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", tt.RecompileWarning)
        _train(model, batches, lazy=True)
    compiles = tt.counter_value("UncachedCompile")
    with pytest.warns(tt.RecompileWarning, match="new graph was compiled"):
        _train(model, [(torch.randn(5, 16), torch.randint(0, 4, (5,)))], lazy=True)
    assert tt.counter_value("UncachedCompile") == compiles + 1


def test_item_is_a_host_sync_that_runs_only_what_it_needs():
    model = tt.to_device(mlp())
    y = model(tt.to_device(torch.randn(4, 16)))
    s = y.sum()
    assert s._lazy.pending
    value = s.item()
    assert not s._lazy.pending and y._lazy.pending   # y waits for the next cut
    assert value == pytest.approx(y.cpu().sum().item(), rel=1e-6)
    assert tt.default_device().stats()["host_syncs"] == 2


def test_tied_weights_stay_one_parameter():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    model[2].weight = model[0].weight
    tt.to_device(model)
    assert model[2].weight is model[0].weight
    assert len(list(model.parameters())) == 3


# ---- printing, metrics, torch.compile, profile ------------------------------------------------


def test_printing_and_reads():
    x = tt.to_device(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    y = x * 2 + 1
    assert "device='tpusim:0'" in repr(y)
    assert y.tolist() == [[3.0, 5.0], [7.0, 9.0]]
    assert bool((y > 8).any())
    assert (y.argmax().item()) == 3  # argmax is not lowered: the CPU fallback
    assert tt.counter_value("aten::argmax") == 1


def test_metrics_report_has_pytorch_xla_format():
    model = tt.to_device(mlp())
    model(tt.to_device(torch.randn(4, 16))).sum().item()
    report = tt.metrics_report()
    for name in ("CompileTime", "ExecuteTime", "TransferToDeviceTime"):
        assert f"Metric: {name}\n  TotalSamples: " in report
    assert "  Accumulator: " in report and "  Percentiles: 1%=" in report
    assert "Counter: UncachedCompile\n  Value: 1\n" in report
    assert tt.format_seconds(1.0053) == "01s05ms300.000us"
    assert tt.format_seconds(0.226137620) == "226ms137.620us"
    assert tt.format_seconds(6.378e-6) == "006.378us"


def test_transfers_to_the_board_are_its_host_link_writes():
    # The device backend writes new tensors when the first step reading them runs: those
    # writes' link time is TransferToDeviceTime (as on PyTorch/XLA), not ExecuteTime.
    with tpusim.Board() as board:
        dev = tt.Device(board, cores=[0])
        net = tt.to_device(torch.nn.Linear(128, 128), dev)
        t0 = board.cycle
        with torch.no_grad():
            y = net(tt.to_device(torch.randn(8, 128), dev))
        tt.mark_step(dev)  # runs y's graph (a live pending tensor)
        h2d, step = dev.stats()["h2d_cycles"], board.cycle - t0
        assert dev.stats()["launches"] == 1 and y.shape == (8, 128)
        hz = board.clock_mhz * 1e6
    # Three writes over the host link (2000 ns set-up + bytes / 12 GB/s, at 940 MHz, rounded
    # up): the weight, 128 x 128 f32 = 65536 B: 7461.3 ns -> 7014 cycles; the bias, 512 B:
    # 2042.7 ns -> 1921; the input, 8 x 128 f32 = 4096 B: 2341.3 ns -> 2201.
    assert h2d == 7014 + 1921 + 2201
    transfer = tt._metrics.METRICS.metric("TransferToDeviceTime")
    execute = tt._metrics.METRICS.metric("ExecuteTime")
    assert transfer.total == pytest.approx(h2d / hz, rel=1e-12)
    assert execute.total == pytest.approx((step - h2d) / hz, rel=1e-12)


def test_torch_compile_backend():
    model = mlp().eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        want = model(x)
        compiled = torch.compile(model, backend="tpusim")
        got = compiled(x)
    assert not isinstance(got, tt.TpuTensor)
    close(got, want, DEFAULT_RTOL)
    assert tt.counter_value("MarkStep") >= 1


def test_profile_names_fusions_after_the_modules():
    model = tt.to_device(mlp())
    with tt.profile(model) as fusions:
        y = model(tt.to_device(torch.randn(4, 16)))  # noqa: F841 (alive: an output of the step)
        tt.mark_step()
    layers = [layer for _, _, names in fusions() for layer in names]
    assert "0" in layers and "2" in layers   # the two Linear modules, by their names


# ---- on the simulated board -----------------------------------------------------------------


def test_mlp_on_the_board_gives_values_and_cycles():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 128)).eval()
    x = torch.randn(8, 128)
    with torch.no_grad():
        want = model(x)
    with tpusim.Board() as board:
        dev = tt.Device(board, cores=[0])
        m = tt.to_device(model, dev)
        with torch.no_grad():
            for _ in range(3):
                got = m(tt.to_device(x, dev))
                tt.mark_step(dev)
        s = dev.stats()
        close(got.cpu(), want, DEFAULT_RTOL)
    # Two output fusions (dot + bias + ReLU, dot + bias) in one program: one launch per step,
    # no host fusion; the third step reuses the second's compiled step and program.
    assert s["launches"] == 3 and s["host_fusions"] == 0
    assert s["last_step_cycles"] > 0
    assert tt.counter_value("CachedCompile") == 1 and s["programs_generated"] == 2


def test_an_output_and_its_view_on_the_board():
    # Both outputs hold one value (the view's reshape is simplified away), so buffer assignment
    # gives them one buffer; the device backend once handed the second an unwritten one
    # (GPT-2's last_hidden_state read back as zeros on the board).
    x = torch.randn(1, 16, 64)
    with tpusim.Board() as board:
        dev = tt.Device(board, cores=[0])
        y = torch.exp(tt.to_device(x, dev))
        z = y.view(1, 16, 64)
        tt.mark_step(dev)
        close(y.cpu(), torch.exp(x), 1e-6)
        close(z.cpu(), torch.exp(x), 1e-6)


def _slice_add(a):
    a[1:3].add_(1)
    return a


def _select_mul(a):
    a[2].mul_(2)
    return a


def _view_of_a_view(a):
    a[1][2:4].zero_()
    return a


def _column_fill(a):
    a[:, 1].fill_(7.0)
    return a


def _transposed_row(a):
    a.t()[0].add_(100)
    return a


def _flat_view(a):
    a.view(-1)[5:9].add_(1)
    return a


def _sibling_view_sees_it(a):
    v1, v2 = a[0:2], a[1:3]
    v1.add_(10)
    return v2.clone()


def _view_sees_its_base_updated(a):
    v = a[1]
    a.add_(1)
    return v.clone()


def _copy_into_columns(a):
    a[:, 2:4].copy_(torch.ones(4, 2))
    return a


def _split_part(a):
    _, y = a.split([2, 2])
    y.mul_(0)
    return a


@pytest.mark.parametrize("update", [
    _slice_add, _select_mul, _view_of_a_view, _column_fill, _transposed_row, _flat_view,
    _sibling_view_sees_it, _view_sees_its_base_updated, _copy_into_columns, _split_part],
    ids=lambda f: f.__name__.strip("_"))
def test_an_in_place_update_of_a_view_reaches_its_base(update):
    # fp32 additions and products of small integers: exact on both sides.
    a = torch.arange(24.0).reshape(4, 6)
    want = update(a.clone())
    got = update(tt.to_device(a.clone())).cpu()
    assert torch.equal(got, want)


def test_bad_input_fails_with_a_clear_error():
    a = tt.to_device(torch.ones(4))
    b = tt.to_device(torch.ones(4), tt.Device())
    with pytest.raises(RuntimeError, match="tensors of two devices in one op"):
        a + b
    with pytest.raises(ValueError, match="a batch of 6 does not split into 4 equal shards"):
        tt.shard(torch.ones(6, 2), tt.Device(replicas=4))
    with pytest.raises(ValueError, match="precision 'fast'"):
        tt.set_mat_mul_precision("fast")
    with pytest.raises(TypeError, match="complex64 has no compiler type"):
        tt.to_device(torch.ones(2, dtype=torch.complex64))
