"""Every front end's output against its golden (tests/goldens/compat/<tool>/<case>.txt): the exact
strings torchinfo's ``summary``, ``layerscope.summary``, torchscan's ``summary`` and ``crawl_module``,
DeepSpeed's profile text and ``get_model_profile`` values, and torchModelSummary's ``Statistics``
print or return. Captured before issue 32's restructuring, so they prove it changed nothing; a
missing golden fails (``pytest --update-goldens`` writes it). Nothing here is timed: DeepSpeed's
latencies come from models on meta (no timing run) or from a hand-made latency report."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.compat import deepspeed, modelsummary, torchinfo
from layerscope.compat import torchscan01 as torchscan
from layerscope.examples import SmallCNN, TinyGPT

from ..reports.test_goldens import check_golden, dataframe_text, hand_made_latency
from .models import CNN, FrozenTied, LSTMNet, TinyResNet, vgg_like

# the probed kernels' scratch differs from CPU to CPU: goldens count it 0 (conftest.py)
pytestmark = pytest.mark.usefixtures("machine_independent_kernels")


def _seeded(factory, *args):
    torch.manual_seed(0)
    return factory(*args)


# ---- torchinfo -------------------------------------------------------------------------------------

TORCHINFO = {
    "small_cnn": lambda: torchinfo.summary(_seeded(SmallCNN), (1, 3, 32, 32), verbose=0),
    "small_cnn_every_column": lambda: torchinfo.summary(
        _seeded(SmallCNN), (2, 3, 32, 32), verbose=0, depth=1,
        col_names=("input_size", "output_size", "num_params", "params_percent", "kernel_size", "mult_adds",
                   "trainable"), row_settings=("var_names", "depth")),
    "resnet_depth_all": lambda: torchinfo.summary(
        _seeded(TinyResNet), input_data=torch.zeros(1, 3, 8, 8), verbose=0, depth=-1,
        col_names=("output_size", "num_params", "mult_adds"), col_width=16, row_settings=("ascii_only",)),
    "lstm_kwargs_and_dtypes": lambda: torchinfo.summary(
        _seeded(LSTMNet), (2, 6), dtypes=[torch.long], verbose=0,
        col_names=("input_size", "output_size", "num_params", "mult_adds"), row_settings=("var_names",)),
    "tiny_gpt_no_input": lambda: torchinfo.summary(_seeded(TinyGPT, 2), verbose=0),
}


@pytest.mark.parametrize("case", sorted(TORCHINFO))
def test_torchinfo_str(case, update_goldens):
    check_golden(f"compat/torchinfo/{case}.txt", str(TORCHINFO[case]()) + "\n", update_goldens)


def test_torchinfo_printed_verbose_2(capsys, update_goldens):
    """verbose=2 prints torchinfo's table with one inner row per parameter."""
    torchinfo.summary(_seeded(CNN), (2, 3, 8, 8), verbose=2, col_names=("num_params", "mult_adds"))
    check_golden("compat/torchinfo/cnn_verbose_2.txt", capsys.readouterr().out, update_goldens)


def test_torchinfo_dataframe(update_goldens):
    pytest.importorskip("pandas")
    stats = TORCHINFO["small_cnn"]()
    check_golden("compat/torchinfo/small_cnn_dataframe.txt", dataframe_text(stats.to_dataframe()), update_goldens)


def test_layerscope_summary_printed(capsys, update_goldens):
    """``layerscope.summary``: torchinfo's arguments, layerscope's table (plain text off a terminal)."""
    stats = ls.summary(_seeded(SmallCNN), (1, 3, 32, 32), depth=2,
                       col_names=("input_size", "output_size", "num_params", "mult_adds", "flops"),
                       receptive_field=True)
    printed = capsys.readouterr().out
    check_golden("compat/layerscope_summary/small_cnn.txt", printed + "\n--- str ---\n" + str(stats) + "\n",
                 update_goldens)
    ls.summary(_seeded(TinyGPT, 4), input_data=torch.zeros(1, 16, dtype=torch.long), verbose=2)
    check_golden("compat/layerscope_summary/tiny_gpt_verbose_2.txt", capsys.readouterr().out, update_goldens)


# ---- torchscan -------------------------------------------------------------------------------------

TORCHSCAN = {
    "small_cnn_rf": dict(model=SmallCNN, shape=(3, 32, 32), receptive_field=True),
    "small_cnn_depth_1": dict(model=SmallCNN, shape=(3, 32, 32), max_depth=1),
    "vgg_effective_rf": dict(model=vgg_like, shape=(3, 16, 16), receptive_field=True, effective_rf_stats=True,
                             wrap_mode="end"),
    # added before the front ends moved their layouts to render/ (issue 32 step 4): names wrapped
    # in each mode, frozen / shared / buffers in the footer, folding with receptive fields
    "frozen_tied_wrap_mid": dict(model=FrozenTied, shape=(3, 8, 8), receptive_field=True, effective_rf_stats=True),
    "frozen_tied_wrap_end": dict(model=FrozenTied, shape=(3, 8, 8), wrap_mode="end"),
    "frozen_tied_wrap_none": dict(model=FrozenTied, shape=(3, 8, 8), wrap_mode=None, receptive_field=True),
    "frozen_tied_depth_1_rf": dict(model=FrozenTied, shape=(3, 8, 8), max_depth=1, receptive_field=True,
                                   effective_rf_stats=True),
}


@pytest.mark.parametrize("case", sorted(TORCHSCAN))
def test_torchscan_summary(case, capsys, update_goldens):
    kw = dict(TORCHSCAN[case])
    model, shape = _seeded(kw.pop("model")), kw.pop("shape")
    torchscan.summary(model, shape, **kw)
    check_golden(f"compat/torchscan/{case}.txt", capsys.readouterr().out, update_goldens)


def test_torchscan_crawl_module(update_goldens):
    info = torchscan.crawl_module(_seeded(TinyResNet), (3, 8, 8))
    check_golden("compat/torchscan/crawl_tiny_resnet.json", json.dumps(info, indent=1, sort_keys=True) + "\n",
                 update_goldens)
    info = torchscan.crawl_module(_seeded(FrozenTied), (3, 8, 8))
    check_golden("compat/torchscan/crawl_frozen_tied.json", json.dumps(info, indent=1, sort_keys=True) + "\n",
                 update_goldens)


# ---- DeepSpeed -------------------------------------------------------------------------------------

def test_deepspeed_get_model_profile_on_meta(capsys, update_goldens):
    """On meta nothing is timed (latencies 0): the printed profile and the returned values."""
    with torch.device("meta"):
        model = CNN()
    strings = deepspeed.get_model_profile(model, input_shape=(2, 3, 8, 8))
    printed = capsys.readouterr().out
    numbers = deepspeed.get_model_profile(model, input_shape=(2, 3, 8, 8), print_profile=False, as_string=False)
    deepspeed.get_model_profile(model, input_shape=(2, 3, 8, 8), module_depth=1, top_modules=2, detailed=False)
    shallow = capsys.readouterr().out
    check_golden("compat/deepspeed/cnn_meta.txt",
                 printed + f"--- returned ---\n{strings!r}\n{numbers!r}\n--- module_depth=1, top_modules=2, "
                           f"detailed=False ---\n{shallow}", update_goldens)


class _Net(nn.Module):
    """The model of ``hand_made_latency``: its paths (blocks.N.fc, head) are this model's."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential() for _ in range(4))
        for b in self.blocks:
            b.add_module("fc", nn.Linear(32, 32))
        self.head = nn.Linear(32, 32)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def test_deepspeed_profile_text_with_fixed_latencies(update_goldens):
    """The profile text with every latency, percentage and FLOPS from a hand-made latency report."""
    model = _seeded(_Net)
    costs = ls.analyze(model, torch.zeros(8, 32))
    prof = deepspeed.ModuleProfile(model, costs, hand_made_latency())
    text = deepspeed.model_profile_text(prof, profile_step=3, module_depth=-1, top_modules=2)
    text += "--- fwd_latency=0.012 ---\n" + deepspeed.model_profile_text(prof, detailed=False, fwd_latency=0.012)
    check_golden("compat/deepspeed/net_fixed_latency.txt", text, update_goldens)


# ---- torchModelSummary -----------------------------------------------------------------------------

MODELSUMMARY = {
    "small_cnn": lambda: modelsummary.Statistics(_seeded(SmallCNN), (3, 32, 32)),
    "tiny_resnet_tensor": lambda: modelsummary.Statistics(_seeded(TinyResNet), torch.zeros(1, 3, 8, 8)),
    "cnn_no_input": lambda: modelsummary.Statistics(_seeded(CNN)),
    "frozen_tied": lambda: modelsummary.Statistics(_seeded(FrozenTied), (3, 8, 8)),
    "frozen_tied_no_input": lambda: modelsummary.Statistics(_seeded(FrozenTied)),
    # 2 x 128 x 2048 x 2048 = 1,073,741,824 MACs >= 1e9: the footer's "(G)" branch
    "linear_giga_macs": lambda: modelsummary.Statistics(_seeded(nn.Linear, 2048, 2048), (128, 2048)),
}


@pytest.mark.parametrize("case", sorted(MODELSUMMARY))
def test_modelsummary(case, update_goldens):
    stats = MODELSUMMARY[case]()
    rows = "\n".join(repr(i) for i in stats.summary_list)
    check_golden(f"compat/modelsummary/{case}.txt", f"{stats!r}\n--- summary_list ---\n{rows}\n", update_goldens)
