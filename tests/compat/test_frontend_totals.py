"""The front ends' parameter totals have one definition (issue 32): the Report's totals where a forward
ran, ``capture.records.param_totals`` (the same sums) where none did. Values by hand."""

import torch
from torch import nn

import layerscope as ls
from layerscope.capture.records import param_totals
from layerscope.compat import deepspeed, modelsummary, torchinfo
from layerscope.compat import torchscan01 as torchscan

from .models import FrozenTied

# FrozenTied: conv 4*3*3*3 + 4 = 112, BatchNorm 4 + 4 = 8, frozen Linear 16 + 4 = 20, the Linear called
# twice 20 (once): 160 parameters, 140 trainable, 160 * 4 = 640 bytes in fp32
HAND = (160, 140, 640)


def _tied():
    """Two Linear(4, 4) sharing one weight: 16 + 4 + 4 = 24 parameters (the weight once), 96 bytes."""
    a, b = nn.Linear(4, 4), nn.Linear(4, 4)
    b.weight = a.weight
    return nn.Sequential(a, b)


def test_param_totals_by_hand_and_against_the_report():
    model = FrozenTied()
    assert param_totals(model) == HAND
    t = ls.analyze(model, torch.zeros(1, 3, 8, 8)).totals
    assert (t.params, t.trainable_params, t.param_bytes) == HAND
    assert param_totals(_tied()) == (24, 24, 96)
    assert param_totals(nn.ReLU()) == (0, 0, 0)


def test_every_front_end_reads_the_same_totals():
    model = FrozenTied()
    for stats in (modelsummary.Statistics(model, (3, 8, 8)), modelsummary.Statistics(model)):
        assert (stats.total_params, stats.trainable_params, stats.total_params_bytes * 1024 ** 2) == HAND
    for stats in (torchinfo.summary(model, (1, 3, 8, 8), verbose=0), torchinfo.summary(model, verbose=0)):
        assert (stats.total_params, stats.trainable_params, stats.total_param_bytes) == HAND
    o = torchscan.crawl_module(model, (3, 8, 8))["overall"]
    assert (o["grad_params"] + o["nograd_params"], o["grad_params"], o["param_size"]) == HAND
    assert deepspeed.ModuleProfile(model, None).total_params == 160
    assert deepspeed.ModuleProfile(_tied(), None).total_params == 24
