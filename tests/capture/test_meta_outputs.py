"""The recorder's meta output cache (capture/recorder.py, _meta_call): on meta, an op that makes new
tensors and ran before with the same input metadata and arguments is answered with empty tensors of
the outputs' shapes, strides and dtypes instead of running its (often Python) meta kernel again.
Records must be exactly those of running every kernel; these tests pin that, and what is never cached."""

from __future__ import annotations

import torch
from torch import nn

import layerscope as ls
from layerscope.capture import recorder as rec

aten = torch.ops.aten


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x):
        h = self.up(self.norm(x))
        h = torch.nn.functional.silu(h) * h.sigmoid()       # elementwise ops with Python meta kernels
        h = torch.cat([h[..., 1:], h[..., :1]], -1)          # a list of tensors first (cat's key)
        x = x + self.down(h) * 0.5                           # a python float scalar
        return x.transpose(0, 1).contiguous().transpose(0, 1)  # views and a copy to new strides


def _model(blocks: int = 4, d: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(_Block(d) for _ in range(blocks)))


def _records(rep):
    return repr(rep.layers), repr(rep.trace.ops), rep.trace.layer_outputs, rep.to_dict()


def test_meta_records_equal_with_and_without_the_cache(monkeypatch):
    model = _model()
    x = torch.randn(3, 5, 16)
    for kw in ({"device": "meta"}, {"device": "meta", "backward": True}):
        cached = ls.analyze(model, x, **kw)
        with monkeypatch.context() as m:
            m.setattr(rec, "_meta_ok", lambda func: False)     # every kernel runs, as before the cache
            plain = ls.analyze(model, x, **kw)
        assert _records(cached) == _records(plain)


def test_repeated_blocks_skip_the_kernel(monkeypatch):
    """Four identical blocks on meta: each cacheable op call's kernel runs once per distinct key (the
    first block sees a contiguous input, the others the strided one a block returns): blocks 2 to 4
    add no kernel run of their own."""
    runs: dict = {}
    body = rec.OpRecorder.__wrapped__      # the class the dispatch_mode decorator builds the mode from
    real_call = body._meta_call

    def counting(self, func, args, kwargs):
        key = rec._meta_key(func, args, kwargs)
        if key is not None:
            runs[key] = runs.get(key, 0) + 1
        return real_call(self, func, args, kwargs)

    monkeypatch.setattr(body, "_meta_call", counting)
    rep = ls.analyze(_model(blocks=4), torch.randn(3, 5, 16), device="meta")
    assert runs, "no op took the cache path"
    assert any(k[0] is aten.cat.default for k in runs)
    assert max(runs.values()) >= 3     # the same call again and again
    keys_of_four = set(runs)
    runs.clear()
    ls.analyze(_model(blocks=2), torch.randn(3, 5, 16), device="meta")
    assert set(runs) == keys_of_four   # blocks 3 and 4 brought no call the first two had not made
    # the blocks' ops were all recorded: blocks 2 to 4 (same input strides) with the same op sequence
    blocks = [r for r in rep.layers if r.type == "_Block"]
    per_block = [[o.op for o in rep.trace.ops if rep.trace.layers[o.layer].path.startswith(b.path + ".")
                  or o.layer == b.index] for b in blocks]
    assert len(blocks) == 4 and per_block[1] and all(p == per_block[1] for p in per_block[2:])


def test_what_is_never_cached():
    # in-place, out= and view ops: their outputs are (or alias) their inputs
    for op in (aten.add_.Tensor, aten.add.out, aten.view.default, aten.transpose.int, aten.split.Tensor):
        assert not rec._meta_ok(op), op
    for op in (aten.add.Tensor, aten.mm.default, aten.native_layer_norm.default, aten.clone.default):
        assert rec._meta_ok(op), op
    m = torch.empty(2, 3, device="meta")
    # a real tensor, a tensor subclass, a symbolic or unknown object: no key, the kernel runs
    assert rec._meta_key(aten.add.Tensor, (m, torch.empty(2, 3)), {}) is None
    assert rec._meta_key(aten.add.Tensor, (m, object()), {}) is None
    # 1, 1.0 and True are equal as dict keys but promote differently: their keys differ
    k_int = rec._meta_key(aten.mul.Tensor, (m, 1), {})
    k_float = rec._meta_key(aten.mul.Tensor, (m, 1.0), {})
    k_bool = rec._meta_key(aten.mul.Tensor, (m, True), {})
    assert len({k_int, k_float, k_bool}) == 3
    # strides and offsets are part of a tensor's key
    assert rec._meta_key(aten.add.Tensor, (m, m), {}) != rec._meta_key(aten.add.Tensor, (m, m.t().contiguous().t()), {})
    # an output at an offset, or that is an input, cannot be remade by empty_strided
    assert rec._meta_spec(torch.empty(10, device="meta")[2:], ()) is None
    assert rec._meta_spec(m, (m,)) is None
    assert rec._meta_spec((m, m), ()) is None
    assert rec._meta_spec(torch.empty(2, 3, device="meta"), (m,)) == (False, (((2, 3), (3, 1), torch.float32),))


def test_no_cache_when_storage_is_tracked():
    """memory() follows storages (and a simulation has its own kernels): the recorder keeps no cache there."""
    from layerscope.capture.session import Session
    from layerscope.costs import CostOptions

    cap = Session(nn.Linear(2, 2), CostOptions(), track_seq=False, storage=object())
    assert rec.OpRecorder(cap)._meta_outs is None
    cap = Session(nn.Linear(2, 2), CostOptions(), track_seq=False)
    assert rec.OpRecorder(cap)._meta_outs == {}


def test_mode_flags_set_directly_and_restored():
    """set_mode sets plain modules' flags without nn.Module.train; a class with its own __setattr__
    (or train/eval) still goes through it; every flag is back afterwards."""
    seen: list = []

    class Spy(nn.Linear):
        def __setattr__(self, name, value):
            if name == "training":
                seen.append(value)
            super().__setattr__(name, value)

        def forward(self, x):
            seen.append(("forward", self.training))
            return super().forward(x)

    class Probe(nn.Module):
        def forward(self, x):
            seen.append(("probe", self.training))
            return x

    model = nn.Sequential(nn.Linear(4, 4), Probe())
    model.train()
    model[0].eval()                      # a mixed model: only the flags that differ move
    ls.analyze(model, torch.randn(2, 4))
    assert seen == [("probe", False)]
    assert model.training and not model[0].training and model[1].training
    seen.clear()
    spied = nn.Sequential(Spy(4, 4))
    spied.train()
    seen.clear()
    ls.analyze(spied, torch.randn(2, 4))
    assert ("forward", False) in seen and False in seen and seen[-1] is True   # its own __setattr__, both ways
    assert spied.training and spied[0].training


def test_layer_record_field_order():
    """capture/session.py's _freeze_layers builds LayerRecords positionally, in this order."""
    from dataclasses import fields

    from layerscope.trace import LayerRecord

    assert [f.name for f in fields(LayerRecord)][:15] == [
        "index", "path", "type", "depth", "call_index", "parent", "children", "inputs", "outputs", "params",
        "buffers", "num_params", "trainable_params", "subtree_params", "kernel_size"]
