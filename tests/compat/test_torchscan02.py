"""layerscope.compat.torchscan: torch-scan 0.2's crawler, report, measure_flops and utils with
layerscope's counts (issue 38). Values by hand in the comments; compare_reports and
measure_peak_memory are in test_torchscan02_compare_process.py."""

import json

import pytest
import torch
from torch import nn

from ..helpers import assert_unchanged, snapshot
from layerscope.compat import torchscan
from layerscope.compat.torchscan import IncompleteAnalysisError, crawl_module, measure_flops


@torch.library.custom_op("lstest_torchscan::double", mutates_args=())
def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_double.register_fake
def _(x):
    return torch.empty_like(x)


def _total(report, name):
    return report["totals"][name]["value"]


def test_crawl_linear_relu_linear_totals_layers_and_state():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    model[2].requires_grad_(False)
    before = snapshot(model)
    report = crawl_module(model, (8,))
    assert_unchanged(before, model)          # also the process's RNG: the input comes from its own generator
    # Linear(8, 4) on (1, 8): 32 MACs, 2 x 32 + 4 bias adds = 68 FLOPs; ReLU 4; Linear(4, 2): 8 MACs, 16 + 2 = 18
    assert _total(report, "module_flops") == 68 + 4 + 18 == 90
    assert _total(report, "macs") == 32 + 8
    # elements read + written: 8 + 32 + 4 in, 4 out = 48; ReLU 4 + 4; 4 + 8 + 2 in, 2 out = 16
    assert _total(report, "dmas") == 48 + 8 + 16
    for name in ("module_flops", "macs", "dmas"):
        assert _total(report, name) == sum(layer["metrics"][name]["value"] for layer in report["layers"]
                                           if name in layer["metrics"])
    assert [(layer["path"], "module_flops" in layer["metrics"]) for layer in report["layers"]] == [
        ("", False), ("0", True), ("1", True), ("2", True)]   # the container ran no op of its own
    assert (_total(report, "trainable_parameters"), _total(report, "frozen_parameters")) == (36, 10)
    assert report["operator_flops"]["by_operator"] == {"aten.addmm": 68 + 18, "aten.relu": 4}
    assert report["operator_flops"]["ignored_operators"] == {
        "aten.t": {"calls": 2, "reason": "Metadata-only tensor view."}}
    assert report["operator_flops"]["by_module"] == {"Sequential": 90, "Sequential.0": 68, "Sequential.1": 4,
                                                     "Sequential.2": 18}
    assert report["diagnostics"] == []
    assert json.loads(json.dumps(report)) == report


def test_a_container_s_own_ops_are_its_row():
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4, bias=False)

        def forward(self, x):
            return x + self.lin(x)

    report = crawl_module(Residual(), args=(torch.ones(2, 4),))
    root, lin = report["layers"]
    # the residual add: 2 x 4 = 8 FLOPs in the root's own forward; the Linear 2 x 4 x 4 = 32 MACs, 64 FLOPs
    assert root["metrics"]["module_flops"]["value"] == 8
    assert lin["metrics"]["module_flops"]["value"] == 64
    assert _total(report, "module_flops") == _total(report, "operator_flops") == 72


def test_an_op_without_formula_is_partial_and_strict_refuses_it():
    class Doubler(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3, bias=False)

        def forward(self, x):
            return torch.ops.lstest_torchscan.double(self.lin(x))

    report = crawl_module(Doubler(), args=(torch.ones(1, 3),))
    flops = report["totals"]["module_flops"]
    # the Linear's 9 MACs = 18 FLOPs are known; the custom op has no formula: a lower bound, never 0
    assert (flops["status"], flops["value"], flops["known_value"]) == ("partial", None, 18)
    assert report["operator_flops"]["total"]["status"] == "partial"
    assert {d["operator"] for d in report["diagnostics"]} == {"lstest_torchscan.double"}
    with pytest.raises(IncompleteAnalysisError, match="module_flops"):
        crawl_module(Doubler(), args=(torch.ones(1, 3),), strict=True)


def test_measure_flops_custom_mapping_and_workload_errors():
    x = torch.ones(5)

    def sin_flops(input_shape, *, out_shape):
        torch.cos(torch.ones(1))           # a formula's own ops are not the workload's
        assert input_shape == out_shape == (5,)
        return 3 * out_shape[0]

    report = measure_flops(lambda: torch.sin(x), custom_mapping={torch.ops.aten.sin: sin_flops})
    assert report["by_operator"] == {"aten.sin": 15}          # 3 per element, the formula given
    assert report["total"]["value"] == 15 and report["diagnostics"] == []
    with pytest.raises(TypeError, match="operator packets"):
        measure_flops(lambda: None, custom_mapping={torch.ops.aten.sin.default: sin_flops})

    calls, error = [], ValueError("the workload's own")

    def fails():
        calls.append(1)
        raise error

    with pytest.raises(ValueError) as caught:
        measure_flops(fails)
    assert caught.value is error and calls == [1]


def test_summary_prints_and_returns_the_report(capsys):
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    report = torchscan.summary(model, (3, 32, 32), max_depth=1)
    out = capsys.readouterr().out
    # Conv2d(3, 8, 3) on 32 x 32: 7,200 outputs x 27 = 194,400 MACs, x 2 + 7,200 bias adds = 396,000; ReLU 7,200
    assert "Module-formula forward FLOPs: 403.20 kFLOPs" in out
    assert "Multiply-Accumulations: 194.40 kMACs" in out
    assert "Total params: 224" in out and "├─0" in out
    assert _total(report, "module_flops") == 396_000 + 7_200
    with pytest.raises(ValueError, match="cannot be higher"):
        torchscan.utils.aggregate_info(report, 3)


def test_measure_flops_runs_the_workload_as_written():
    torch.manual_seed(0)
    lin, x = nn.Linear(4, 4), torch.rand(2, 4)
    rng = torch.get_rng_state()
    report = measure_flops(lambda: (lin(x).sum().backward(), torch.rand(1)), modules=lin)
    assert lin.weight.grad is not None                       # gradients as the caller has them
    assert not torch.equal(rng, torch.get_rng_state())       # its random draws are its own
    # forward: addmm 2 x 4 x 4 = 32 MACs, 64 + 8 bias adds = 72; sum 8; backward: the weight's and the
    # input-free bias's gradients: mm 2 x 4 x 4 = 32 MACs = 64 (no grad for x), sum over the batch 8
    assert report["by_operator"] == {"aten.addmm": 72, "aten.mm": 64, "aten.sum": 16}
    assert report["by_module"] == {"Linear": 72}             # forward ops only


def test_by_module_adds_up_every_call():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, x):
            return self.l(self.l(x)) + x

    m, x = Shared(), torch.rand(2, 4)
    # each call of l: 72 (above); the residual add 8
    assert measure_flops(lambda: m(x), modules=m)["by_module"] == {"Shared": 152, "Shared.l": 144}
    assert crawl_module(m, args=(x,))["operator_flops"]["by_module"] == {"Shared": 152, "Shared.l": 144}


def test_a_scripted_child_s_ops_are_its_caller_s_row():
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.jit.script(nn.Linear(4, 4, bias=False))

        def forward(self, x):
            return self.inner(x)

    report = crawl_module(Outer(), args=(torch.ones(1, 4),))
    # TorchScript takes no hooks: its 16 MACs (32 FLOPs) show on the root's row, and the rows add up
    assert [(layer["path"], layer["metrics"]["module_flops"]["value"]) for layer in report["layers"]] == [("", 32)]
    assert _total(report, "module_flops") == _total(report, "operator_flops") == 32


def test_keyword_inputs_and_the_element_size_of_dmas():
    class KeywordOnly(nn.Module):
        def forward(self, *, x):
            return torch.relu(x)

    x = torch.ones(2, 4, dtype=torch.float16)
    report = crawl_module(KeywordOnly(), kwargs={"x": x})
    # no parameters: DMAs in the input's 2-byte elements: relu reads 8 and writes 8 = 16
    assert _total(report, "dmas") == 16 and _total(report, "module_flops") == 8
    assert report["inputs"]["kwargs"]["x"]["shape"] == [2, 4]


class _ReturnsInput(nn.Module):
    def forward(self, x):
        return x


def test_a_module_of_the_users_that_runs_no_op_is_partial_and_strict_refuses_it():
    """Issue 58 item 7, torch-scan 0.2's contract (its tests/test_report.py): a module that runs no op
    is partial, and strict=True raises. Its 0 is what the recorder saw, but work done outside torch
    (NumPy, Python numbers) is invisible to it; nn.Identity, torch's own, does nothing: 0, complete.
    Before: complete 0, no diagnostic, strict passed."""
    x = torch.randn(2, 4)
    report = crawl_module(_ReturnsInput(), args=(x,))
    flops = report["totals"]["module_flops"]
    assert (flops["status"], flops["value"], flops["known_value"]) == ("partial", None, 0)
    assert {d["code"] for d in report["diagnostics"]} == {"no_operator"}
    with pytest.raises(IncompleteAnalysisError):
        crawl_module(_ReturnsInput(), args=(x,), strict=True)
    ident = crawl_module(nn.Identity(), args=(x,), strict=True)
    assert ident["totals"]["module_flops"]["status"] == "complete" and ident["diagnostics"] == []

    class View(nn.Module):           # one op that moves nothing (a view): it ran, 0 is the count
        def forward(self, x):
            return x.view(-1)
    assert crawl_module(View(), args=(x,), strict=True)["totals"]["module_flops"]["value"] == 0


def test_module_flops_refuses_the_options_torchscan_02_refuses():
    """torch-scan 0.2's modules.module_flops raises NotImplementedError for a MultiheadAttention with
    add_zero_attn or add_bias_kv and for a non-ReLU nn.Transformer (its tests/test_modules.py); 0.1's
    counts them: MultiheadAttention(4, 2, add_zero_attn) on (2, 3, 4), dropout 0: 2 x the 792 FLOPs
    docs/compat.md derives for one (1, 3, 4) sequence (its test_metric_failure_... row) = 1,584; a GELU
    Transformer (6 + 6 layers, d_model 4, feed-forward 8): 46,248, the figure 0.2's front end gave
    before it refused (unchanged for 0.1)."""
    from layerscope.compat.torchscan import modules
    from layerscope.compat.torchscan01 import modules as modules01
    q = torch.rand((2, 3, 4))
    zero = nn.MultiheadAttention(4, 2, batch_first=True, add_zero_attn=True)
    with pytest.raises(NotImplementedError, match="add_bias_kv or add_zero_attn"):
        modules.module_flops(zero, (q, q, q), None)
    with pytest.raises(NotImplementedError, match="add_bias_kv or add_zero_attn"):
        modules.module_flops(nn.MultiheadAttention(4, 2, batch_first=True, add_bias_kv=True), (q, q, q), None)
    gelu = nn.Transformer(d_model=4, nhead=2, dim_feedforward=8, activation="gelu", batch_first=True)
    with pytest.raises(NotImplementedError, match="default ReLU"):
        modules.module_flops(gelu, (q, q), None)
    assert modules01.module_flops(zero, (q, q, q), None) == 1_584
    assert modules01.module_flops(gelu, (q, q), None) == 46_248
    # what 0.2 does count is unchanged: the plain MultiheadAttention
    assert modules.module_flops(nn.MultiheadAttention(4, 2, batch_first=True), (q, q, q)) > 0
