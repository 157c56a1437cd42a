"""Capture: inputs of any nesting, reused and tied modules, meta/fake tensors, backward attribution,
errors that name the layer, and the model left exactly as it was."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import layerscope as ls
from tests.helpers import assert_sums, assert_unchanged, snapshot
from tests.zoo import models as zoo


def test_convnet_costs_and_invariants():
    m = zoo.ConvNet()
    before = snapshot(m)
    rep = ls.analyze(m, input_size=(2, 3, 16, 16))
    assert rep.totals.macs == zoo.ConvNet.MACS
    assert rep.coverage.complete
    assert_sums(rep)
    assert_unchanged(before, m)
    assert [r.path for r in rep.layers] == ["", "conv1", "bn1", "pool", "conv2", "fc"]
    assert rep.find("conv1")[0].kernel_size == (3, 3)


def test_dict_in_dataclass_out():
    m = zoo.DictModel()
    batch = {"a": torch.randn(3, 4), "parts": [torch.randn(3, 6)]}
    rep = ls.analyze(m, batch, scale=2.0)
    assert rep.totals.macs == zoo.DictModel.MACS
    root = rep.layers[0]
    assert [s.shape for s in root.inputs] == [(3, 4), (3, 6)]
    # outputs: logits, extras[0]["a"], extras[1][0]
    assert [s.shape for s in root.outputs] == [(3, 5), (3, 5), (3, 5)]
    assert_sums(rep)


def test_integer_inputs_and_tied_weights():
    m = zoo.Tied()
    rep = ls.analyze(m, torch.randint(0, 100, (2, 6)))
    assert rep.totals.params == zoo.Tied.PARAMS
    assert rep.totals.shared_params == 1_600
    assert rep.totals.macs == zoo.Tied.MACS
    emb, head = rep.find("emb")[0], rep.find("head")[0]
    assert emb.params[0].shared and head.params[0].shared
    assert emb.num_params == 1_600 and head.num_params == 0  # counted once, at the first owner
    assert_sums(rep)


def test_module_called_three_times():
    rep = ls.analyze(zoo.Reused(), torch.randn(4, 8))
    calls = rep.find("lin")
    assert [c.call_index for c in calls] == [0, 1, 2]
    assert [c.forward.macs for c in calls] == [256, 256, 256]
    assert rep.totals.macs == zoo.Reused.MACS
    assert sum(c.num_params for c in calls) == zoo.Reused.PARAMS
    assert_sums(rep)


def test_input_size_dtypes_batch_dim():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.lin = nn.Linear(4, 4)

        def forward(self, ids, x):
            return self.emb(ids) + self.lin(x)

    rep = ls.analyze(Two(), input_size=[(3,), (3, 4)], dtypes=[torch.long, torch.float32], batch_dim=0)
    assert [s.shape for s in rep.layers[0].inputs] == [(1, 3), (1, 3, 4)]
    assert [s.dtype for s in rep.layers[0].inputs] == ["int64", "float32"]
    # lin: 3 rows * 4 * 4 = 48 MACs
    assert rep.totals.macs == 48


def test_input_size_does_not_touch_global_rng():
    m = nn.Linear(3, 3)  # built first: initialising weights draws from the global RNG
    state = torch.get_rng_state()
    ls.analyze(m, input_size=(2, 3))
    assert torch.equal(state, torch.get_rng_state())


def test_meta_model_allocates_nothing():
    with torch.device("meta"):
        m = zoo.ConvNet()
    rep = ls.analyze(m, input_size=(2, 3, 16, 16))
    assert rep.totals.macs == zoo.ConvNet.MACS
    assert rep.trace.options["device"] == "meta"


def test_real_model_on_meta_device_keeps_weights():
    m = zoo.ConvNet()
    x = torch.randn(2, 3, 16, 16)  # drawn before the snapshot of the RNG
    before = snapshot(m)
    rep = ls.analyze(m, x, device="meta")
    assert rep.totals.macs == zoo.ConvNet.MACS
    assert rep.trace.options["device"] == "meta"
    assert_unchanged(before, m)
    assert next(m.parameters()).device.type == "cpu"


def test_fake_tensors():
    with FakeTensorMode():
        m = zoo.ConvNet()
        x = torch.empty(2, 3, 16, 16)
    rep = ls.analyze(m, x)
    assert rep.totals.macs == zoo.ConvNet.MACS


def test_backward_attribution_matches_modules():
    m = zoo.ConvNet()
    x = torch.randn(2, 3, 16, 16)  # drawn before the snapshot of the RNG
    before = snapshot(m)
    rep = ls.analyze(m, x, backward=True)
    assert_unchanged(before, m)
    # fc backward: grad input + grad weight = 2 * 5,120 MACs, attributed to fc (not to its parent)
    assert rep.find("fc")[0].backward.macs == 2 * 5_120
    # conv2 backward: 2 * 18,432; conv1's input needs no grad: 110,592
    assert rep.find("conv2")[0].backward.macs == 2 * 18_432
    assert rep.find("conv1")[0].backward.macs == 110_592
    assert rep.layers[0].backward.macs == 0  # nothing counted lands on the root
    assert [o for o in rep.trace.ops if o.op == "aten.native_batch_norm_backward"][0].layer == \
        rep.find("bn1")[0].index
    assert_sums(rep)


def test_backward_keeps_user_grads():
    m = nn.Linear(3, 2)
    m.weight.grad = torch.ones_like(m.weight)
    x = torch.randn(4, 3)  # drawn before the snapshot of the RNG
    before = snapshot(m)
    ls.analyze(m, x, backward=True)
    assert_unchanged(before, m)


def test_backward_leaves_input_grads_alone():
    # regression: a backward analysis accumulated into .grad of the user's input tensor, so a second
    # analysis of the same input counted an extra accumulate-add
    x = torch.randn(4, 3, requires_grad=True)
    m = nn.Linear(3, 2)
    first = ls.analyze(m, x, backward=True)
    assert x.grad is None
    x.grad = torch.full_like(x, 7.0)
    second = ls.analyze(m, x, backward=True)
    assert torch.equal(x.grad, torch.full_like(x, 7.0))
    assert second.totals.backward == first.totals.backward


def test_train_mode_restores_batchnorm_stats_and_flags():
    m = zoo.ConvNet()
    m.eval()
    m.fc.train()
    x = torch.randn(2, 3, 16, 16)  # drawn before the snapshot of the RNG
    before = snapshot(m)
    ls.analyze(m, x, mode="train")
    assert_unchanged(before, m)


def test_dropout_in_train_mode_leaves_rng():
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    x = torch.randn(2, 4)  # drawn before the snapshot of the RNG
    before = snapshot(m)
    ls.analyze(m, x, mode="train")
    assert_unchanged(before, m)


def test_forward_error_names_layer_and_shapes_and_restores():
    m = zoo.Raises()
    m.train()
    x = torch.randn(3, 4)  # drawn before the snapshot of the RNG
    before = snapshot(m)
    with pytest.raises(ls.ForwardError) as ei:
        ls.analyze(m, x, mode="train")
    err = ei.value
    assert err.path == "body.1"
    assert err.module_type == "Linear"
    assert err.input_shapes == ((3, 6),)
    assert "body.1" in str(err) and "[3, 6]" in str(err)
    assert isinstance(err.__cause__, RuntimeError)  # nothing lost
    assert_unchanged(before, m)


def test_analysis_inside_an_except_block_records_outputs():
    # regression: the failure check read sys.exc_info(), which is set inside any except block
    try:
        raise ValueError("unrelated")
    except ValueError:
        rep = ls.analyze(zoo.Reused(), torch.randn(4, 8))
    assert [s.shape for s in rep.layers[1].outputs] == [(4, 8)]


def test_keyboard_interrupt_removes_hooks():
    class Stop(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            self.lin(x)
            raise KeyboardInterrupt

    m = Stop()
    x = torch.randn(1, 2)  # drawn before the snapshot of the RNG
    before = snapshot(m)
    with pytest.raises(KeyboardInterrupt):
        ls.analyze(m, x)
    assert_unchanged(before, m)


@pytest.mark.parametrize("bad, message", [
    (lambda: ls.analyze("not a model", torch.randn(1)), "torch.nn.Module"),
    (lambda: ls.analyze(nn.Linear(2, 2)), "no example inputs"),
    (lambda: ls.analyze(nn.Linear(2, 2), torch.randn(1, 2), input_size=(1, 2)), "not both"),
    (lambda: ls.analyze(nn.Linear(2, 2), input_size="big"), "input_size"),
    (lambda: ls.analyze(nn.Linear(2, 2), torch.randn(1, 2), mode="fast"), "mode"),
    (lambda: ls.analyze(nn.Linear(2, 2), torch.randn(1, 2), device="cuda:0"), "never moves"),
    (lambda: ls.analyze(nn.Linear(2, 2), torch.randn(1, 2), causal="half"), "causal"),
    (lambda: ls.analyze(nn.Linear(2, 2), input_size=(1, 2), dtypes=[torch.long, torch.long]), "dtypes"),
])
def test_bad_input_messages(bad, message):
    with pytest.raises(ls.LayerscopeError, match=message):
        bad()


def test_backward_without_grad_outputs():
    m = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ls.InputError, match="requires grad"):
        ls.analyze(m, torch.randn(1, 2), backward=True)

    class NoTensor(nn.Module):  # like a transformers backbone with no out_features chosen
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            self.lin(x)
            return {"feature_maps": None}

    with pytest.raises(ls.InputError, match=r"output \(dict\) holds no tensor"):
        ls.analyze(NoTensor(), torch.randn(1, 2), backward=True)


def test_same_numbers_on_second_call():
    m = zoo.SDPABlock()
    x = torch.randn(2, 8, 32)
    a, b = ls.analyze(m, x), ls.analyze(m, x)
    assert a.totals == b.totals
    assert [r.forward for r in a.layers] == [r.forward for r in b.layers]


def test_report_module_returns_live_submodule():
    m = zoo.ConvNet()
    rep = ls.analyze(m, torch.randn(2, 3, 16, 16))
    assert rep.module("conv2") is m.conv2
    with pytest.raises(ls.InputError):
        rep.module("nope")


def test_activations_by_type_and_pattern():
    m = zoo.ConvNet()
    x = torch.randn(2, 3, 16, 16)  # drawn before the snapshot of the RNG
    before = snapshot(m)
    acts = ls.activations(m, x, select=[nn.Conv2d, "fc"])
    assert set(acts) == {"conv1", "conv2", "fc"}
    assert acts["conv2"].shape == (2, 16, 4, 4) and not acts["conv2"].requires_grad
    assert_unchanged(before, m)
    reused = ls.activations(zoo.Reused(), torch.randn(4, 8), select="lin")
    assert set(reused) == {"lin", "lin[1]", "lin[2]"}


def test_uncalled_modules_listed():
    class Spare(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(2, 2)
            self.spare = nn.Linear(2, 2)
            self.stack = nn.ModuleList([nn.Linear(2, 2)])

        def forward(self, x):
            return self.stack[0](self.used(x))

    rep = ls.analyze(Spare(), torch.randn(1, 2))
    assert rep.coverage.uncalled_modules == ("spare",)  # a ModuleList is never called by design
    assert rep.totals.params == 18


def test_functional_ops_counted():
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(6, 4))

        def forward(self, x):
            # F.linear 2*4*6 = 48 MACs; x @ x.T: 2*4*2 = 16 MACs -> 64
            return torch.nn.functional.linear(x, self.w).sum() + (x @ x.T).sum()

    rep = ls.analyze(Functional(), torch.randn(2, 4))
    assert rep.totals.macs == 64


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_every_layer_family_forward_and_backward_has_a_formula(mode):
    torch.manual_seed(0)
    m = zoo.Everything()
    g = torch.Generator().manual_seed(1)
    img, ids, vol = torch.randn(2, 4, 6, 6, generator=g), torch.randint(0, 10, (2, 5), generator=g), \
        torch.randn(1, 2, 4, 4, 4, generator=g)
    before = snapshot(m)
    rep = ls.analyze(m, img, ids, vol, backward=True, mode=mode)
    assert rep.coverage.complete, rep.coverage.uncounted
    # nn.MultiheadAttention reads out_proj's weights functionally and never calls the module
    assert rep.coverage.uncalled_modules == ("mha.out_proj",)
    assert_sums(rep)
    assert_unchanged(before, m)
    assert rep.totals.backward.flops > rep.totals.forward.flops


def test_dataflow_producers():
    rep = ls.analyze(zoo.ConvNet(), torch.randn(2, 3, 16, 16))
    ops = rep.trace.ops
    conv1 = next(o for o in ops if o.op == "aten.convolution")
    # conv1 reads the model input and two parameters
    assert conv1.producers == (ls.trace.PRODUCER_INPUT, ls.trace.PRODUCER_STATE, ls.trace.PRODUCER_STATE)
    conv2 = [o for o in ops if o.op == "aten.convolution"][1]
    pool = next(o for o in ops if o.op == "aten.max_pool2d_with_indices")
    assert conv2.producers[0] == pool.index  # the pooled tensor feeds the second conv
    assert all(p < o.index for o in ops for p in o.producers)


def test_activation_checkpointing_recompute_is_attributed():
    from torch.utils.checkpoint import checkpoint

    class Ckpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False)

    x = torch.randn(4, 8, requires_grad=True)
    rep = ls.analyze(Ckpt(), x, backward=True)
    # forward: 2 linears * 4*8*8 = 512 MACs, one record per module call of the forward only
    assert rep.totals.macs == 512
    assert [r.path for r in rep.layers] == ["", "inner", "inner.0", "inner.1", "inner.2"]
    # backward: grads (input and weight) of both linears 2 * 2 * 256 = 1,024, plus the recompute, which
    # stops early once every saved tensor is back: inner.2's addmm saved its input, so only inner.0's
    # matmul (256) reruns -> 1,280
    assert rep.totals.backward.macs == 1_280
    assert rep.layers[0].backward.macs == 0
