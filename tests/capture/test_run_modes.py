"""The same numbers however the model is run (issue 18, items 1, 2 and 4): under no_grad or
torch.inference_mode, on meta with inputs that require grad, and with scripted children."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.errors import InputError

from ..helpers import assert_sums, assert_unchanged, snapshot
from ..test_transformers import CASES, _inputs
from ..zoo import models as zoo


def _conv():
    torch.manual_seed(0)
    return nn.Conv2d(3, 8, 3)


def _script(module):
    with warnings.catch_warnings():      # torch 2.13 deprecates jit.script; the test builds one on purpose
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(module)


# --- item 1: inference_mode ---------------------------------------------------------------------------

def test_conv_counted_under_inference_mode():
    # Regression: under torch.inference_mode aten.conv2d arrived whole (no autograd decomposition)
    # and went uncounted: 0 MACs. Hand count: output 1x8x6x6 = 288 positions x (3 x 3 x 3) = 7,776.
    m, x = _conv(), torch.randn(1, 3, 8, 8)
    before = snapshot(m)
    with torch.inference_mode():
        rep = ls.analyze(m, x)
        assert torch.is_inference_mode_enabled()      # the caller's mode is untouched
    assert rep.totals.macs == 7776 and rep.coverage.complete
    assert_unchanged(before, m)


def test_inference_tensor_inputs_with_backward():
    # An input made under inference_mode cannot be saved for backward; the analysis uses a clone.
    # Backward of a conv whose input does not require grad: only the weight gradient, 1 x 7,776.
    m = _conv()
    with torch.inference_mode():
        x = torch.randn(1, 3, 8, 8)
        rep = ls.analyze(m, x, backward=True)
    assert rep.totals.macs == 7776 and rep.totals.backward.macs == 7776
    assert x.is_inference()


def _totals(model, args, **kw):
    rep = ls.analyze(model, *args, **kw)
    assert_sums(rep)
    return rep.totals, [(r.path, r.forward) for r in rep.layers]


ZOO = {
    "convnet": lambda: (zoo.ConvNet(), (torch.randn(2, 3, 16, 16),)),
    "sdpa": lambda: (zoo.SDPABlock(), (torch.randn(2, 8, 32),)),
    "mha": lambda: (zoo.MHA(), (torch.randn(2, 5, 16),)),
    "lstm": lambda: (zoo.LSTMNet(), (torch.randn(2, 5, 16),)),
    "everything": lambda: (zoo.Everything(), (torch.randn(2, 4, 6, 6), torch.randint(0, 10, (2, 5)),
                                              torch.randn(1, 2, 4, 4, 4))),
}


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_same_numbers_in_every_grad_mode(name):
    torch.manual_seed(0)
    model, args = ZOO[name]()
    grad = _totals(model, args)
    with torch.no_grad():
        assert _totals(model, args) == grad
    with torch.inference_mode():
        assert _totals(model, args) == grad
    assert grad[0].complete


@pytest.mark.parametrize("name", list(CASES))
def test_transformers_same_numbers_in_every_grad_mode(name):
    cls, cfg, kind = CASES[name]
    torch.manual_seed(0)
    model = cls(cfg()).eval()
    x = _inputs(kind)
    grad = _totals(model, (x,))
    with torch.inference_mode():
        assert _totals(model, (x,)) == grad
    with torch.no_grad():
        assert _totals(model, (x,)) == grad


# --- item 2: meta keeps requires_grad ---------------------------------------------------------------------

def test_meta_backward_keeps_input_gradient():
    # Regression: device="meta" dropped the input's requires_grad, so the input-gradient convolution
    # vanished. Backward = input gradient (a transposed conv, 7,776 MACs) + weight gradient (7,776).
    m, x = _conv(), torch.randn(1, 3, 8, 8, requires_grad=True)
    cpu = ls.analyze(m, x, backward=True).totals
    meta = ls.analyze(m, x, backward=True, device="meta").totals
    assert cpu.backward.macs == meta.backward.macs == 2 * 7776
    assert cpu == meta
    assert x.grad is None


class Gram(nn.Module):
    def forward(self, x):
        return x @ x.transpose(-1, -2)


def test_meta_backward_parameter_free_model():
    # Regression: a parameter-free model whose input requires grad raised "no output of the model
    # requires grad" on meta. x: 4x8. Forward x @ x^T: 4 x 4 x 8 = 128 MACs. Backward: the gradient
    # reaches x through both operands, G @ x and G^T @ x: 2 x 128 = 256 MACs.
    x = torch.randn(4, 8, requires_grad=True)
    cpu = ls.analyze(Gram(), x, backward=True).totals
    meta = ls.analyze(Gram(), x, backward=True, device="meta").totals
    assert cpu.macs == meta.macs == 128
    assert cpu.backward.macs == meta.backward.macs == 256
    assert cpu == meta


# --- item 4: scripted children and scripted models -----------------------------------------------------------

def test_scripted_child_is_one_counted_layer():
    # Regression: RuntimeError "register_forward_pre_hook is not supported on ScriptModules".
    # Linear(4, 2) on 3x4: 3 x 4 x 2 = 24 MACs; forward FLOPs 2 x 24 + 3 x 2 bias adds = 54.
    torch.manual_seed(0)
    m, x = nn.Sequential(_script(nn.Linear(4, 2)), nn.ReLU()), torch.randn(3, 4)
    before = snapshot(m)
    rep = ls.analyze(m, x)
    lin = rep.layers[1]
    assert (lin.path, lin.type) == ("0", "Linear")
    assert lin.forward.macs == 24 and lin.forward.flops == 54 and lin.num_params == 10
    assert rep.coverage.complete and not rep.coverage.uncalled_modules
    assert_sums(rep)
    bwd = ls.analyze(m, x, backward=True)
    # weight gradient only (the input needs none): 2 x 4 x 3 = 24 MACs
    assert bwd.totals.backward.macs == 24
    assert ls.analyze(m, x, backward=True, device="meta").totals == bwd.totals
    assert_unchanged(before, m)


def test_scripted_child_in_memory_profile_and_activations():
    torch.manual_seed(0)
    m, x = nn.Sequential(_script(nn.Linear(4, 2)), nn.ReLU()), torch.randn(3, 4)
    before = snapshot(m)
    assert ls.memory(m, x).peak_bytes > 0
    lat = ls.profile(m, x, warmup=1, repeats=2)
    assert [(r.path, r.type) for r in lat.layers] == [("", "Sequential"), ("0", "Linear"), ("1", "ReLU")]
    acts = ls.activations(m, x)
    assert set(acts) == {"", "0", "1"}
    assert_unchanged(before, m)


def test_whole_script_module_goes_the_torchscript_path():
    torch.manual_seed(0)
    s = _script(nn.Sequential(nn.Linear(4, 2), nn.ReLU()))
    rep = ls.analyze(s, torch.randn(3, 4))
    assert rep.totals.macs == 24 and [r.path for r in rep.layers] == ["", "0", "1"]
    assert s.training                       # analysed in eval mode, flags restored
    with pytest.raises(InputError, match="backward=True is not supported"):
        ls.analyze(s, torch.randn(3, 4), backward=True)


def test_resnet18_published_numbers_under_inference_mode():
    # Regression: under inference_mode a ResNet-18 gave 512,000 MACs (only the fc's addmm).
    # torchvision's published figures for resnet18: 11,689,512 parameters and 1.81 GFLOPS
    # (its GFLOPS are MACs): 1,814,073,344 MACs at 224x224. HF's ResNet with basic blocks, depths
    # [2, 2, 2, 2] and widths 64..512 is the same network; built and run on meta.
    import transformers as T
    cfg = T.ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                         embedding_size=64, num_labels=1000)
    with torch.device("meta"):
        m = T.ResNetForImageClassification(cfg)
    x = torch.empty(1, 3, 224, 224, device="meta")
    with torch.inference_mode():
        rep = ls.analyze(m, x)
    assert rep.totals.macs == 1_814_073_344 and rep.totals.params == 11_689_512
    assert rep.coverage.complete
