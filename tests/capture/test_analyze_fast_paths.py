"""The shortcuts analyze() takes for speed (issue 61 item 5) give what the long ways gave: the module walk
in one loop, the subtree sums in one loop, a repeated op's cost reused, the run freed without the cyclic
collector, the copy's own check for inference tensors."""

from __future__ import annotations

import gc

import torch
from torch import nn

import layerscope as ls
from layerscope.capture.records import _param_table, _subtree_params
from layerscope.capture.session import Session
from layerscope.capture.tracker import named_modules


def _models():
    shared = nn.Linear(3, 3)
    with_none = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with_none.add_module("gap", None)
    tied = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    tied[1].weight = tied[0].weight
    return [
        nn.Sequential(*(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(4))),
        nn.Sequential(shared, nn.Sequential(shared, nn.ReLU()), nn.ModuleList([nn.Linear(3, 1), shared])),
        with_none,
        tied,
        nn.Sequential(torch.jit.script(nn.Sequential(nn.Linear(2, 2), nn.ReLU())), nn.Tanh()),
        torch.jit.script(nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU()))),
    ]


def test_named_modules_is_torchs_walk():
    # torch's own generator is the reference: the same paths, the same module objects, the same order
    for m in _models():
        assert [(p, id(x)) for p, x in named_modules(m)] == [(p, id(x)) for p, x in m.named_modules()]


def test_subtree_sums_in_one_loop_equal_the_recursion():
    for m in _models():
        modules = [x for _, x in m.named_modules()]
        holders, _ = _param_table(modules)
        assert _subtree_params(m, holders, modules) == _subtree_params(m, holders)
    # by hand: Linear(4, 4) holds 4*4 + 4 = 20, Linear(4, 2) holds 4*2 + 2 = 10
    m = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 2)))
    modules = [x for _, x in m.named_modules()]
    sums = _subtree_params(m, _param_table(modules)[0], modules)
    assert sums[id(m)] == 30 and sums[id(m[1])] == 10 and sums[id(m[0])] == 20


def test_a_repeated_op_costs_what_its_formula_says():
    # Five blocks of Linear(16, 16) + ReLU at batch 4: the second to fifth addmm reuse the first's cost
    # (capture/cost_keys.py). By hand, each addmm: MACs 4*16*16 = 1024; FLOPs 2*1024 + 4*16 (the bias
    # add) = 2112; bytes read (16 + 4*16 + 16*16) * 4 = 1344 (bias, input, weight in fp32); written
    # 4*16*4 = 256. Each relu: 64 FLOPs, 256 bytes read and 256 written.
    torch.manual_seed(0)
    m = nn.Sequential(*(nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(5)))
    r = ls.analyze(m, torch.randn(4, 16))
    mm = [o for o in r.trace.ops if o.op == "aten.addmm"]
    relu = [o for o in r.trace.ops if o.op == "aten.relu"]
    assert len(mm) == len(relu) == 5
    for o in mm:
        c = o.costs
        assert (c.macs, c.flops, c.bytes_read, c.bytes_written) == (1024, 2112, 1344, 256)
    for o in relu:
        c = o.costs
        assert (c.macs, c.flops, c.bytes_read, c.bytes_written) == (0, 64, 256, 256)
    assert r.totals.forward.macs == 5 * 1024
    # each op still names its own block (the reused part is the cost, not the record)
    assert [r.layers[o.layer].path for o in mm] == [f"{i}.0" for i in range(5)]


def test_shapes_that_differ_are_priced_apart():
    # the same op at two shapes in one run: Linear(8, 4) then Linear(4, 2) at batch 3.
    # By hand: 3*8*4 = 96 MACs and 3*4*2 = 24 MACs
    m = nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 2), nn.Linear(2, 4), nn.Linear(4, 2))
    r = ls.analyze(m, torch.randn(3, 8))
    assert [o.costs.macs for o in r.trace.ops if o.op == "aten.addmm"] == [96, 24, 24, 24]


def test_the_run_is_freed_without_the_cyclic_collector():
    # Regression (issue 61 item 5): the Session and its tracker held each other, and through the call
    # records the analysis's copy of the model, until a collection found the cycle
    m = nn.Sequential(*(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(10)))
    x = torch.randn(2, 4)
    ls.analyze(m, x)
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        rep = ls.analyze(m, x)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, (Session, nn.Module))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    assert left == []
    assert rep.totals.forward.macs == 10 * 2 * 4 * 4     # by hand: 10 blocks of 2*4*4 MACs


def test_models_holding_inference_tensors_still_run_in_inference_mode():
    # the copy's walk finds the inference tensors (the guard's own walk is gone): by hand, a
    # Linear(4, 4) at batch 2 is 2*4*4 = 32 MACs; the copy's buffers stay inference tensors
    with torch.inference_mode():
        m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    r = ls.analyze(m, torch.randn(2, 4))
    assert r.totals.forward.macs == 32
    assert m[1].running_mean.is_inference()
    with torch.inference_mode():
        r = ls.analyze(nn.Linear(4, 4), torch.randn(2, 4))
    assert r.totals.forward.macs == 32
