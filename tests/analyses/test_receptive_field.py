"""Receptive field: torchscan's recurrence on branch-free networks, the largest path where branches meet."""

from __future__ import annotations

import torch
from torch import nn

import layerscope as ls


def _rf(rep, path):
    return rep.find(path)[0].receptive_field


def test_branch_free_matches_torchscan_recurrence():
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3),                 # r = 1 + 2*1 = 3, j = 1, P = 0
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, stride=2, padding=1),  # r = 3 + 2*1 = 5, j = 2, P = 0 + 1*1 = 1
        nn.MaxPool2d(2),                    # r = 5 + 1*2 = 7, j = 4, P = 1
        nn.Conv2d(4, 4, 3, dilation=2),     # k_eff = 5: r = 7 + 4*4 = 23, j = 4, P = 1
    )
    rep = ls.analyze(net, torch.randn(1, 3, 64, 64))
    assert _rf(rep, "0").size == (3.0, 3.0)
    rf2 = _rf(rep, "2")
    assert (rf2.size[0], rf2.stride[0], rf2.padding[0]) == (5.0, 2.0, 1.0)
    rf3 = _rf(rep, "3")
    assert (rf3.size[0], rf3.stride[0], rf3.padding[0]) == (7.0, 4.0, 1.0)
    rf4 = _rf(rep, "4")
    assert (rf4.size[0], rf4.stride[0], rf4.padding[0]) == (23.0, 4.0, 1.0)
    assert _rf(rep, "1").size == (3.0, 3.0)  # a ReLU passes the field through
    assert rep.layers[0].receptive_field.size == (23.0, 23.0)


def test_branches_take_the_largest_path():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.short = nn.Conv2d(2, 2, 1)                       # r = 1
            self.long = nn.Sequential(nn.Conv2d(2, 2, 3, padding=1),
                                      nn.Conv2d(2, 2, 3, padding=1))  # r = 5
            self.after = nn.Conv2d(2, 2, 3, padding=1)            # r = 5 + 2 = 7

        def forward(self, x):
            return self.after(self.short(x) + self.long(x))

    rep = ls.analyze(Branchy(), torch.randn(1, 2, 8, 8))
    assert _rf(rep, "short").size[0] == 1.0
    assert _rf(rep, "long").size[0] == 5.0
    assert _rf(rep, "after").size[0] == 7.0


def test_non_square_kernels_and_transformers_have_none():
    rep = ls.analyze(nn.Conv2d(1, 1, (3, 5)), torch.randn(1, 1, 9, 9))
    assert rep.layers[0].receptive_field.size == (3.0, 5.0)
    rep = ls.analyze(nn.Linear(4, 4), torch.randn(2, 4))
    assert rep.layers[0].receptive_field is None


def test_upsample_and_transposed_conv():
    net = nn.Sequential(nn.Conv2d(1, 1, 3, stride=2),          # r 3, j 2
                        nn.Upsample(scale_factor=2),            # r 3, j 1
                        nn.ConvTranspose2d(1, 1, 3, stride=2))  # j = 1/2, r = 3 + 2 * 0.5 = 4
    rep = ls.analyze(net, torch.randn(1, 1, 9, 9))
    assert _rf(rep, "1").stride[0] == 1.0
    rf = _rf(rep, "2")
    assert (rf.size[0], rf.stride[0]) == (4.0, 0.5)


def test_table_shows_size_stride_and_padding():
    # Issue 34 item 7: the README promises size, effective stride and effective padding.
    # small_cnn by hand (r: size, j: stride, p: padding; conv k, s, pad: r += (k-1)*j, p += pad*j, j *= s):
    #   stem.0 conv 3x3 s1 p1: r=3, j=1, p=1; block.0 conv 3x3: r=5, p=2; block.3 conv 3x3: r=7, p=3;
    #   pool 2x2 s2 p0: r = 7 + 1*1 = 8, j = 2, p = 3.
    from layerscope.examples import small_cnn
    rep = ls.analyze(small_cnn(), input_size=(1, 3, 32, 32))
    rows = {r.path: r for r in rep.layers}
    want = {"stem.0": (3, 1, 1), "block.0": (5, 1, 2), "block.3": (7, 1, 3), "pool": (8, 2, 3)}
    got = {p: (rows[p].receptive_field.size[0], rows[p].receptive_field.stride[0],
               rows[p].receptive_field.padding[0]) for p in want}
    assert got == want
    text = rep.table(columns="receptive_field,rf_stride,rf_padding")
    line = next(ln for ln in text.splitlines() if "pool: MaxPool2d" in ln)
    assert line.split()[-3:] == ["8", "2", "3"], line
