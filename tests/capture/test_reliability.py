"""Reliability: fuzzed module trees keep every invariant, bad input gets a clear error, analyses in
two threads at once agree with one at a time, and saved model files load safely."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import layerscope as ls

from ..helpers import assert_sums, assert_unchanged, snapshot

D = 8


class Node(nn.Module):
    """One node of a fuzzed tree: a leaf layer, a chain, a branch-and-merge, a loop over a
    ModuleList, a ModuleDict, a reused child, or a functional op."""

    def __init__(self, kind: str, children: list[nn.Module]) -> None:
        super().__init__()
        self.kind = kind
        if kind == "dict":
            self.parts = nn.ModuleDict({f"k{i}": c for i, c in enumerate(children)})
        elif kind == "list":
            self.parts = nn.ModuleList(children)
        else:
            self.body = nn.Sequential(*children)

    def forward(self, x):
        if self.kind == "chain":
            return self.body(x)
        if self.kind == "branch":           # every child sees x; outputs merge by a sum
            out = x
            for c in self.body:
                out = out + c(x)
            return out
        if self.kind == "reuse":            # the same children twice
            return self.body(self.body(x))
        if self.kind == "func":
            return torch.tanh(self.body(x)) * 2 + x.mean(dim=-1, keepdim=True)
        if self.kind == "list":
            for c in self.parts:
                x = c(x)
            return x
        for k in sorted(self.parts):        # dict
            x = self.parts[k](x)
        return x


LEAVES = {
    "linear": lambda: nn.Linear(D, D),
    "relu": nn.ReLU,
    "bn": lambda: nn.BatchNorm1d(D),
    "dropout": lambda: nn.Dropout(0.5),
    "ln": lambda: nn.LayerNorm(D),
    "frozen": lambda: nn.Linear(D, D).requires_grad_(False),
}


def _leaf(name):
    return LEAVES[name]()


leaves = st.sampled_from(sorted(LEAVES)).map(_leaf)
trees = st.recursive(
    leaves,
    lambda kids: st.tuples(st.sampled_from(["chain", "branch", "reuse", "func", "list", "dict"]),
                           st.lists(kids, min_size=1, max_size=3)).map(lambda t: Node(t[0], t[1])),
    max_leaves=8)


class Root(nn.Module):
    """The fuzzed tree, optionally a weight shared with another Linear, and a dict output."""

    def __init__(self, tree: nn.Module, tie: bool, train: bool) -> None:
        super().__init__()
        self.tree = tree
        self.head = nn.Linear(D, D)
        self.tail = nn.Linear(D, D)
        if tie:
            self.tail.weight = self.head.weight
        self.train(train)

    def forward(self, x):
        h = self.tree(self.head(x))
        return {"out": self.tail(h), "aux": [h.sum()]}


def _unique_params(m: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())


@settings(max_examples=int(os.environ.get("LAYERSCOPE_FUZZ_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees, tie=st.booleans(), train=st.booleans(), backward=st.booleans())
@pytest.mark.slow
def test_fuzzed_trees_keep_every_invariant(tree, tie, train, backward):
    torch.manual_seed(0)
    m = Root(tree, tie, train)
    x = torch.randn(4, D)
    before = snapshot(m)
    rep = ls.analyze(m, x, mode="same", backward=backward)
    assert_unchanged(before, m)
    assert_sums(rep)
    assert rep.totals.params == _unique_params(m)
    again = ls.analyze(m, x, mode="same", backward=backward)
    assert again.totals == rep.totals and len(again.layers) == len(rep.layers)
    mem = ls.memory(m, x, optimizer="adamw" if backward else None, training=backward)
    assert_unchanged(before, m)
    assert mem.peak_bytes > 0
    prof = ls.profile(m, x, warmup=0, repeats=1, backward=backward)
    assert_unchanged(before, m)
    assert [(r.path, r.call_index) for r in prof.layers] == [(r.path, r.call_index) for r in rep.layers]


class Takes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, *, scale: float):
        return self.fc(x) * scale


@pytest.mark.parametrize("bad, error, message", [
    # wrong dtype: an int tensor into a Linear, named with what it received
    (lambda: ls.analyze(nn.Sequential(nn.Linear(4, 4)), torch.ones(2, 4, dtype=torch.long)),
     ls.ForwardError, r"layer '0' \(Linear\) called with Tensor\[2, 4\] int64"),
    # a missing keyword argument and an unexpected one: the model's own call fails, named
    (lambda: ls.analyze(Takes(), torch.randn(2, 4)), ls.ForwardError, "scale"),
    (lambda: ls.analyze(Takes(), torch.randn(2, 4), scale=1.0, shift=2.0), ls.ForwardError, "shift"),
    # an input on another device than the model (meta here: no GPU needed)
    (lambda: ls.analyze(nn.Sequential(nn.Linear(4, 4)), torch.randn(2, 4, device="meta"), device="cpu"),
     ls.LayerscopeError, "meta"),
])
def test_bad_input_catalogue(bad, error, message):
    with pytest.raises(error, match=message):
        bad()


class Interrupted(nn.Module):
    """Ctrl-C in the middle of a forward, after one layer has run."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        self.fc(self.bn(x))
        raise KeyboardInterrupt


@pytest.mark.parametrize("run", [
    lambda m, x: ls.analyze(m, x, mode="train", backward=True),
    lambda m, x: ls.memory(m, x, optimizer="adamw"),
    lambda m, x: ls.profile(m, x, warmup=0, repeats=1),
])
def test_interrupt_leaves_the_model_as_it_was(run):
    m = Interrupted().train()
    x = torch.randn(3, 4)
    before = snapshot(m)
    with pytest.raises(KeyboardInterrupt):
        run(m, x)
    assert_unchanged(before, m)  # hooks off, BatchNorm statistics and mode as they were


class Route(nn.Module):
    """Picks an expert by a tensor's value, as switch_transformers does: meta has no value to read."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleDict({"e0": nn.Linear(4, 4), "e1": nn.Linear(4, 4)})

    def forward(self, x):
        return self.experts[f"e{x.sum().gt(0).long()}"](x)


def test_value_dependent_code_on_meta_says_what_to_do():
    m = Route()
    assert ls.analyze(m, torch.randn(2, 4)).totals.macs == 2 * 4 * 4  # one expert on 2 rows
    with pytest.raises(ls.ForwardError, match="analyse the model on cpu instead") as ei:
        ls.analyze(m, torch.randn(2, 4), device="meta")
    assert "Route" in str(ei.value) and "Tensor[2, 4]" in str(ei.value)
    assert isinstance(ei.value.__cause__, KeyError)  # the model's own error, kept


class Uniq(nn.Module):
    def forward(self, ids):
        return torch.unique(ids, return_inverse=True, return_counts=True)


def test_unique_on_meta_reads_values_as_one():
    ids = torch.tensor([[1, 2], [3, 1]])
    # meta tensors without values read every value as 1: one unique value, inverse indices shaped
    # like the input, one count; on cpu the real values: 1, 2, 3 and their counts
    shapes = lambda rep: [s.shape for s in rep.layers[0].outputs]  # noqa: E731
    assert shapes(ls.analyze(Uniq(), ids.to("meta"))) == [(1,), (2, 2), (1,)]
    assert shapes(ls.analyze(Uniq(), ids)) == [(3,), (2, 2), (3,)]
    # real ids analysed on meta: their values go along (capture/known.py), so the real shapes
    assert shapes(ls.analyze(Uniq(), ids, device="meta")) == [(3,), (2, 2), (3,)]
    # the memory simulation (fake tensors, no values) reads them the same way instead of stopping
    assert ls.memory(Uniq(), ids, training=False).peak_bytes > 0


def test_edge_inputs_that_are_fine():
    # an empty model: the input comes back, nothing is counted, nothing crashes
    rep = ls.analyze(nn.Sequential(), torch.randn(2, 4))
    assert rep.totals.macs == 0 and rep.totals.params == 0
    # zero-size batch: shapes with a 0, zero MACs
    rep = ls.analyze(nn.Linear(4, 3), torch.randn(0, 4))
    assert rep.totals.macs == 0 and rep.layers[0].outputs[0].shape == (0, 3)
    # huge sizes on meta: Linear(65,536 -> 65,536) on 1,048,576 rows, counted without allocating:
    # 2^20 * 2^16 * 2^16 = 2^52 MACs
    big = nn.Linear(65_536, 65_536, device="meta")
    rep = ls.analyze(big, torch.empty(1_048_576, 65_536, device="meta"))
    assert rep.totals.macs == 2 ** 52


def test_two_threads_agree_with_one_at_a_time():
    from layerscope.examples import small_cnn, tiny_gpt
    a, b = small_cnn(), tiny_gpt()
    xa, xb = torch.randn(2, 3, 32, 32), torch.randint(0, 1000, (1, 16))
    alone = (ls.analyze(a, xa, backward=True).totals, ls.analyze(b, xb, backward=True).totals)
    out: dict = {}
    errors: list = []

    def run(key, m, x):
        try:
            for _ in range(3):
                out.setdefault(key, []).append(ls.analyze(m, x, backward=True).totals)
        except Exception as e:      # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=("a", a, xa)), threading.Thread(target=run, args=("b", b, xb))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(t == alone[0] for t in out["a"]) and all(t == alone[1] for t in out["b"])
    # the same model from two threads: they take turns (an analysis sets the model's flags while it
    # runs), so each gets what it gets alone; small_cnn is built in train mode, analysed in eval
    out.clear()
    threads = [threading.Thread(target=run, args=(k, a, xa)) for k in ("a1", "a2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(t == alone[0] for k in ("a1", "a2") for t in out[k])


def test_saved_files_load_safely(tmp_path):
    from layerscope.specs import build_model
    from layerscope.examples import small_cnn
    m = small_cnn()
    ts, sd, pk = tmp_path / "ts.pt", tmp_path / "sd.pt", tmp_path / "pk.pt"
    torch.jit.script(m).save(str(ts))
    torch.save(m.state_dict(), str(sd))
    torch.save(m, str(pk))
    assert isinstance(build_model(str(ts)).model, torch.jit.ScriptModule)
    with pytest.raises(ls.SpecError, match="state dict"):
        build_model(str(sd))
    with pytest.raises(ls.SpecError, match="--allow-pickle"):
        build_model(str(pk))
    assert type(build_model(str(pk), allow_pickle=True).model).__name__ == "SmallCNN"


class Experts(nn.Module):
    """Three experts' [4, 8] weights; six rows routed two per expert (mixture-of-experts). Sizes keep
    the CPU kernel's 16-byte strides."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4, 8))

    def forward(self, x):
        offs = torch.tensor([2, 4, 6], dtype=torch.int32, device=x.device)
        return torch._grouped_mm(x, self.w, offs=offs)


def test_grouped_mm_is_counted_on_cpu_and_meta():
    # each of the 6 rows of x [6, 4] meets one expert's [4, 8]: 6 * 4 * 8 = 192 MACs, 384 FLOPs
    m, x = Experts(), torch.randn(6, 4)
    for kw in ({}, {"device": "meta"}):
        rep = ls.analyze(m, x, **kw)
        assert rep.totals.complete and (rep.totals.macs, rep.totals.flops) == (192, 384)


def test_weight_norm_counted():
    # weight_norm over Linear(4, 3): v [3, 4] -> the norm (2 per element) and the scale (1) on its
    # 12 elements = 36 FLOPs, plus the Linear: 2 rows * 4 * 3 = 24 MACs -> 48 FLOPs + 6 bias adds
    with pytest.warns(FutureWarning):          # the old API, still what audio models use
        m = torch.nn.utils.weight_norm(nn.Linear(4, 3))
    rep = ls.analyze(m, torch.randn(2, 4))
    assert rep.totals.complete and rep.totals.flops == 36 + 48 + 6


def test_a_submodule_shared_by_blocks_gets_its_own_tensors_back():
    # torch's reparametrize_module left the swapped-in fake tensor in a module reached under 8 names
    from ..helpers import assert_unchanged, snapshot

    class Block(torch.nn.Module):
        def __init__(self, shared):
            super().__init__()
            self.shared, self.own = shared, torch.nn.Linear(16, 16)

        def forward(self, x):
            return x + self.own(self.shared(x))
    shared = torch.nn.Linear(16, 16)
    model = torch.nn.Sequential(*[Block(shared) for _ in range(8)])
    before = snapshot(model)
    ls.memory(model, input_size=(4, 16), optimizer="adamw")
    assert type(model[0].shared.weight) is torch.nn.Parameter
    assert_unchanged(before, model)
