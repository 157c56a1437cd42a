"""layerscope.compat.torchscan01's torchscan 0.1.2 modules: modules (module_flops/macs/dmas/rf), process,
utils and crawler.apply. Values by hand under layerscope's conventions (README, "Cost conventions")."""

import warnings

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.compat import torchscan01 as ts
from layerscope.compat.torchscan01 import crawler, process, utils
from layerscope.compat.torchscan01.modules import module_dmas, module_flops, module_macs, module_rf

from .models import same_state, state


class NoForward(nn.Module):
    pass


def test_package_layout():
    # torchscan 0.1.2's top level: its three modules and crawler's crawl_module / summary
    assert ts.crawl_module is crawler.crawl_module and ts.summary is crawler.summary
    assert {"modules", "process", "utils", "crawler"} <= set(dir(ts))


def test_linear_counts():
    lin = nn.Linear(8, 4)
    x = torch.randn(2, 8)
    # MACs: 2 rows x 8 inputs x 4 outputs = 64
    assert module_macs(lin, x, None) == 64
    # FLOPs: 2 x 64 MACs + 2 x 4 = 8 bias adds = 136
    assert module_flops(lin, (x,), None) == 136
    # DMAs in float32 elements: input 16 + weight 32 + bias 4 read, output 8 written = 60
    assert module_dmas(lin, x, None) == 60
    # float64: the same 60 elements (480 bytes / 8)
    assert module_dmas(nn.Linear(8, 4).double(), x.double(), None) == 60


def test_conv_relu_counts():
    conv = nn.Conv2d(2, 3, 3, bias=False)
    x = torch.randn(1, 2, 5, 5)
    # output 3 x 3 x 3 = 27 positions, each 2 x 3 x 3 = 18 MACs: 486; FLOPs 2 x 486 (no bias)
    assert (module_macs(conv, x), module_flops(conv, (x,))) == (486, 972)
    # ReLU on 8 elements: 1 FLOP each, no MACs
    assert (module_flops(nn.ReLU(), (torch.randn(1, 8),)), module_macs(nn.ReLU(), torch.randn(1, 8))) == (8, 0)


def test_module_rf():
    # a 3-tap window, stride 2, padding 1 from the input: field 3, stride 2, padding 1 (first spatial dim)
    conv = nn.Conv2d(1, 1, 3, stride=2, padding=1)
    assert module_rf(conv, torch.randn(1, 1, 8, 8), None) == (3.0, 2.0, 1.0)
    # dilation 2: k_eff = 2 x (3 - 1) + 1 = 5
    assert module_rf(nn.Conv2d(1, 1, 3, dilation=2), torch.randn(1, 1, 8, 8), None) == (5.0, 1.0, 0.0)
    # no window: the field passes through, torchscan's (1, 1, 0)
    assert module_rf(nn.Linear(8, 4), torch.randn(1, 8), None) == (1.0, 1.0, 0.0)


def test_state_and_input_left_as_they_were():
    # BatchNorm in train mode updates its running statistics when it runs: they come back as they were
    bn = nn.BatchNorm1d(4)
    before = state(bn)
    rng = torch.get_rng_state()
    # 2 x 4 x 3 = 24 elements x (4 statistics + 2 normalise + weight + bias) + 1 (num_batches_tracked += 1)
    assert module_flops(bn, (torch.ones(2, 4, 3),)) == 24 * 8 + 1
    assert same_state(before, state(bn)) and bn.training
    assert torch.equal(rng, torch.get_rng_state())
    # an in-place module runs on a copy of the caller's tensor
    x = torch.tensor([[-1.0, 2.0, -3.0]])
    assert module_flops(nn.ReLU(inplace=True), (x,)) == 3
    assert torch.equal(x, torch.tensor([[-1.0, 2.0, -3.0]]))


def test_no_forward_and_bad_input():
    # nothing runs, nothing is counted: torchscan's 0 and UserWarning
    for fn in (module_flops, module_macs, module_dmas):
        with pytest.warns(UserWarning, match="NoForward"):
            assert fn(NoForward(), None, None) == 0
    with pytest.warns(UserWarning):
        assert module_rf(NoForward(), None, None) == (1.0, 1.0, 0.0)
    with pytest.raises(ls.InputError, match="tensor or a non-empty tuple"):
        module_flops(nn.Linear(2, 2), None, None)
    with pytest.raises(ls.InputError, match="nn.Module"):
        module_macs("linear", torch.ones(1, 2), None)


def test_process_gpu_ram_without_cuda(monkeypatch):
    # torchscan on a CPU machine: 0.0 and its warning, nothing spawned
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(UserWarning, match="CUDA is unavailable"):
        assert process.get_process_gpu_ram(1) == 0.0


def test_process_gpu_ram_reads_nvidia_smi(monkeypatch, tmp_path):
    # with CUDA: nvidia-smi's per-process list (here a stand-in script), its output captured
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '123, 456'\necho '789, 10'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert process.get_process_gpu_ram(123) == 456.0
    assert process.get_process_gpu_ram(5) == 0.0       # not listed, not this process: nothing on the GPU


def test_crawler_apply_names():
    mod = nn.Sequential(nn.Conv2d(1, 1, 1), nn.Sequential(nn.ReLU()))
    seen = []
    crawler.apply(mod, lambda m, name: seen.append((type(m).__name__, name)))
    assert seen == [("Sequential", "sequential"), ("Conv2d", "sequential.0"), ("Sequential", "sequential.1"),
                    ("ReLU", "sequential.1.0")]
    seen.clear()
    crawler.apply(mod[1], lambda m, name: seen.append(name), name="head")
    assert seen == ["head", "head.0"]


def test_utils_helpers():
    assert utils.format_name("x", depth=2) == "|    └─x"
    # "mid": head + "[...]" + "." + last part, 10 characters: "ab" + "[...].ij"
    assert utils.wrap_string("abc.defgh.ij", 10, mode="mid") == "ab[...].ij"
    assert utils.wrap_string("abcdefghijkl", 10, mode="end") == "abcde[...]"
    with pytest.raises(ValueError):
        utils.wrap_string("abcdefghijkl", 10, mode="middle")
    assert utils.unit_scale(2.5e6) == (2.5, "M") and utils.unit_scale(999) == (999, "")


def test_module_functions_quiet_on_counted_modules():
    # a module layerscope counts in full warns nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module_flops(nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU()), (torch.randn(1, 1, 6, 6),))
