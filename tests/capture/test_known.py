"""Values known beside a run without them (issue 34, item 1; capture/known.py): small integer and
boolean tensors that come from the inputs, or from sizes alone, keep their real values on meta and
fake tensors. Each expected value is the CPU run's (the same model on real tensors) or derived by
hand beside the assertion."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.errors import ForwardError

from ..helpers import assert_unchanged, snapshot

A = torch.ops.aten


class Positions(nn.Module):
    """Token embeddings plus learned positions from ``arange``: 16 positions."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(100, 8)
        self.pos = nn.Embedding(16, 8)

    def forward(self, ids):
        return self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))


def test_positions_past_the_table_fail_on_meta_as_on_cpu():
    m = Positions()
    ok = torch.randint(0, 100, (1, 16))
    # 16 positions fit: params 100*8 + 16*8 = 928
    assert ls.analyze(m, ok, device="meta").totals.params == 928
    long = torch.randint(0, 100, (1, 32))
    with pytest.raises(IndexError, match="index out of range in self"):
        m(long)                                              # the real run
    before = snapshot(m)
    with pytest.raises(ForwardError, match=r"layer 'pos' .*IndexError: index out of range in self"):
        ls.analyze(m, long, device="meta")                   # positions 16..31 are past the table
    with pytest.raises(ForwardError, match=r"IndexError: index out of range in self"):
        ls.memory(m, long)                                   # the simulated step fails there too
    assert_unchanged(before, m)


def test_gpt2_on_meta_past_its_position_table_fails_like_cpu():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32)
    m = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 50, (1, 64))
    with pytest.raises(IndexError):
        m(ids)
    with pytest.raises(ForwardError, match=r"transformer.wpe.*IndexError"):
        ls.analyze(m, ids, device="meta")
    fits = torch.randint(0, 50, (1, 32))
    assert ls.analyze(m, fits, device="meta").totals.forward.macs == ls.analyze(m, fits).totals.forward.macs


class Varlen(nn.Module):
    """Flash attention over packed sequences whose boundaries come from the lengths given."""

    def forward(self, q, lengths):
        cu = nn.functional.pad(lengths.cumsum(0).to(torch.int32), (1, 0))
        longest = int(lengths.max())
        return A._flash_attention_forward(q, q, q, cu, cu, longest, longest, 0.0, False, False)[0]


def test_varlen_attention_on_meta_counts_the_real_sequences():
    q = torch.randn(20, 4, 8)                 # 5 + 15 tokens packed, H=4, D=8
    rep = ls.analyze(Varlen(), q, torch.tensor([5, 15]), device="meta")
    # Q.K^T: 4 heads * (5*5 + 15*15) * 8 = 8,000 MACs; P.V the same: 16,000
    assert rep.totals.forward.macs == 16_000 and rep.coverage.complete
    # lengths without values (meta tensors given): the lengths are unknown, the op is uncounted
    rep = ls.analyze(Varlen(), q.to("meta"), torch.tensor([5, 15]).to("meta"))
    assert not rep.coverage.complete


class Branch(nn.Module):
    """A data-dependent branch on the mask, as transformers' all-ones checks are."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 32)

    def forward(self, x, mask):
        if bool((mask == 1).all()):
            return self.a(x)
        return self.b(x)


def test_a_branch_on_a_known_mask_takes_the_real_side():
    x = torch.randn(2, 8)
    for mask, macs in ((torch.ones(2, 8, dtype=torch.long), 2 * 8 * 8),      # all ones: a, 128
                       (torch.tensor([[1] * 8, [1] * 4 + [0] * 4]), 2 * 8 * 32)):  # padded: b, 512
        assert ls.analyze(Branch(), x, mask).totals.forward.macs == macs
        assert ls.analyze(Branch(), x, mask, device="meta").totals.forward.macs == macs
    # a mask given on meta has no values: read as 1 (all ones), as before
    assert ls.analyze(Branch().to("meta"), x.to("meta"), torch.zeros(2, 8, dtype=torch.long, device="meta")
                      ).totals.forward.macs == 128


class Overwritten(nn.Module):
    """ids written from something unknown (a float comparison) are unknown again."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.score = nn.Linear(4, 1)

    def forward(self, ids):
        drop = self.score(self.emb(ids)).squeeze(-1) > 1e9      # from float weights: never true
        ids = ids.clone()
        ids.masked_fill_(drop, 99)                              # 99 would be out of range
        ids.add_(0)
        return self.emb(ids)


def test_a_value_written_from_the_unknown_is_forgotten_not_guessed():
    ids = torch.randint(0, 10, (2, 3))
    real = ls.analyze(Overwritten(), ids)
    meta = ls.analyze(Overwritten(), ids, device="meta")      # no false "out of range"
    assert meta.totals.forward.macs == real.totals.forward.macs


def test_unique_and_boolean_indexing_take_the_real_sizes_on_meta():
    class Select(nn.Module):
        def forward(self, x, ids):
            keep = ids > 2
            return x[keep], torch.unique(ids)
    x, ids = torch.randn(2, 4), torch.tensor([[1, 3, 5, 3], [0, 4, 2, 9]])
    rep = ls.analyze(Select(), x, ids, device="meta")
    # ids > 2: 3, 5, 3, 4, 9 -> 5 elements selected; unique of {0, 1, 2, 3, 4, 5, 9}: 7 values
    assert [tuple(s.shape) for s in rep.layers[0].outputs] == [(5,), (7,)]


def test_draws_are_not_computed_and_the_rng_is_left_alone():
    class Draw(nn.Module):
        def forward(self, ids):
            return (torch.rand(ids.shape, device=ids.device) < 0.5) & (ids > 0)
    torch.manual_seed(0)
    emb = nn.Sequential(nn.Embedding(4, 2))
    state = torch.get_rng_state()
    ls.analyze(Draw(), torch.ones(2, 3, dtype=torch.long), device="meta")
    ls.memory(emb, torch.ones(2, 3, dtype=torch.long))
    assert torch.equal(state, torch.get_rng_state())


class Router(nn.Module):
    """A top-2 router over 4 experts, each expert run on the tokens routed to it (JetMoe, Mixtral)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(8, 4)
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))

    def forward(self, x):
        _, choice = self.gate(x).topk(2, dim=-1)              # [T, 2]: from float weights
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows = (choice == e).any(-1).nonzero().squeeze(-1)
            out = out.index_add(0, rows, expert(x[rows]))
        return out


def test_a_router_over_unknown_scores_spreads_tokens_evenly_and_says_so():
    x = torch.randn(6, 8)
    rep = ls.analyze(Router(), x, device="meta")
    # the assumption: token i picks experts (2i, 2i + 1) mod 4, so each expert gets 6 * 2 / 4 = 3
    # tokens: experts 4 * 3 * 8 * 8 = 768 MACs, the gate 6 * 8 * 4 = 192: 960
    assert rep.totals.forward.macs == 960
    assert any("spread evenly" in n for n in rep.notes)
    # on CPU the real choices: the experts together still see 6 * 2 = 12 token rows: 960 as well
    assert ls.analyze(Router(), x).totals.forward.macs == 960


@pytest.mark.parametrize("padded", [False, True])
def test_transformers_mask_checks_take_the_real_side_on_meta(padded):
    # transformers skips the mask when it is all ones (SDPA's is_causal) and builds one when a row is
    # padded: on meta the mask's values go along, so the ops and their counts are the CPU run's
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                   num_key_value_heads=2, vocab_size=64, use_cache=False)
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    if padded:
        mask[1, :3] = 0
    cpu = ls.analyze(m, input_ids=ids, attention_mask=mask)
    meta = ls.analyze(m, input_ids=ids, attention_mask=mask, device="meta")
    # the mask's own ops (its checks, and the mask built where a row is padded) are the CPU run's;
    # attention itself is SDPA's CPU flash kernel on CPU and its math decomposition on meta
    mask_ops = {"aten.eq", "aten.ne", "aten.lt", "aten.le", "aten.gt", "aten.ge", "aten.all", "aten.any",
                "aten.bitwise_and", "aten.bitwise_or", "aten.logical_and", "aten.logical_or", "aten.where",
                "aten.masked_fill", "aten.index"}
    # the checks and the mask transformers builds run in the decoder ('model'), outside attention
    # (whose math decomposition on meta builds its own causal mask)
    seq = lambda rep: [o.op for o in rep.trace.ops if o.op in mask_ops and o.layer is not None  # noqa: E731
                       and rep.layers[o.layer].path == "model"]
    assert seq(meta) == seq(cpu) and (len(seq(cpu)) > 1) == padded     # all ones: the check alone
    assert meta.totals.forward.macs == cpu.totals.forward.macs


class Durations(nn.Module):
    """FastSpeech2's length regulator: each token repeated by a duration the model predicts."""

    def __init__(self) -> None:
        super().__init__()
        self.predict = nn.Linear(8, 1)

    def forward(self, x):                                      # x [T, 8]
        d = self.predict(x).squeeze(-1).exp().round().long()    # from float weights: unknown on meta
        out = torch.zeros(int(d.sum()), 8, device=x.device)
        rep = torch.repeat_interleave(x, d, dim=0)
        out[: rep.shape[0]] = rep
        return out


def test_durations_from_unknown_floats_read_as_ones_consistently():
    # every duration 1 (the rule for values without one): the sum is 4, repeat_interleave keeps 4
    # rows, so the sizes agree (before: the sum read as 1 against 4 repeated rows, a shape error)
    rep = ls.analyze(Durations(), torch.randn(4, 8), device="meta")
    assert tuple(rep.layers[0].outputs[0].shape) == (4, 8)
    assert any("read as all ones" in n for n in rep.notes)


def test_a_cpu_scalar_tensor_beside_meta_ones_is_a_scalar():
    class Fill(nn.Module):           # SEW-D's XSoftmax: masked_fill with torch.tensor(min) on any device
        def forward(self, x):
            return x.masked_fill(x > 0, torch.tensor(torch.finfo(x.dtype).min))
    x = torch.randn(2, 3)
    # masked_fill: 6 elements, one FLOP each by its formula; the same on meta as on CPU
    assert ls.analyze(Fill(), x, device="meta").totals.forward == ls.analyze(Fill(), x).totals.forward


class NamedExperts(nn.Module):
    """SwitchTransformers: the experts hit are found with nonzero and called by a formatted name."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(8, 4)
        self.experts = nn.ModuleDict({f"expert_{i}": nn.Linear(8, 8) for i in range(4)})

    def forward(self, x):
        choice = self.router(x).argmax(-1)                                  # [T]
        hit = torch.bincount(choice, minlength=4).gt(0).nonzero()
        out = torch.zeros_like(x)
        for idx in hit:
            rows = (choice == idx[0]).nonzero().squeeze(-1)
            out = out.index_add(0, rows, self.experts[f"expert_{idx[0]}"](x[rows]))
        return out


def test_experts_called_by_a_formatted_index_on_meta():
    # argmax spread evenly over 4 experts: 8 tokens, 2 each; experts 8 * 8 * 8 = 512 MACs, the
    # router 8 * 8 * 4 = 256: 768 (the CPU run's choices differ, its total is the same: 8 token rows)
    x = torch.randn(8, 8)
    assert ls.analyze(NamedExperts(), x, device="meta").totals.forward.macs == 768
    assert ls.analyze(NamedExperts(), x).totals.forward.macs == 768


def test_positions_of_a_real_mask_beside_meta_tensors_are_its_real_positions():
    class Pick(nn.Module):
        def forward(self, x, keep):
            rows = keep.nonzero().squeeze(-1)
            return x[keep], rows.sum()
    x, keep = torch.randn(5, 2), torch.tensor([True, False, True, True, False])
    rep = ls.analyze(Pick().to("meta"), x.to("meta"), keep)       # the mask given real, the rest meta
    # 3 rows kept: x[keep] is [3, 2]; positions 0, 2, 3
    assert tuple(rep.layers[0].outputs[0].shape) == (3, 2)


def test_a_list_written_in_place_from_the_unknown_is_forgotten():
    from layerscope.capture.known import KnownValues
    k = KnownValues()
    a, b = torch.empty(2, device="meta"), torch.empty(2, device="meta")
    k.put(a, torch.tensor([1.0, 2.0]))
    k.put(b, torch.tensor([3.0, 4.0]))
    k.forget([a, b])           # _foreach_add_([a, b], [unknown, unknown]) writes both
    assert not k.has(a) and not k.has(b)


def test_forgetting_a_value_forgets_its_views_and_nothing_else():
    # the table finds the values sharing a storage through an index, not a pass over every value (an optimizer
    # step forgets one value per parameter: 2,000 parameters made memory() of a deep MLP 2x slower)
    from layerscope.capture.known import KnownValues
    k = KnownValues()
    base = torch.arange(6.0)
    a, av, b = (torch.empty(n, device="meta") for n in (6, 3, 2))
    k.put(a, base)
    k.put(av, base[:3])        # a view of a's value: one storage
    k.put(b, torch.tensor([7.0, 8.0]))
    k.put(b, torch.tensor([9.0, 10.0]))    # b's value replaced: its old storage leaves the index
    k.forget(av)               # written from the unknown: a's values with it
    assert not k.has(a) and not k.has(av) and k.value(b).tolist() == [9.0, 10.0]
    assert list(k.shared.values()) == [{id(b)}]


class MaskedIds(nn.Module):
    """Ids past the table set to 0 through a boolean mask (``ids[ids >= 50] = 0``, an in-place
    index_put_), then looked up in a table of 50 rows: in range on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 4)

    def forward(self, ids):
        ids = ids.clone()
        ids[ids >= 50] = 0
        return self.emb(ids)


def test_a_masked_write_carries_its_values():
    # ids 0..99: after the write 50..99 read 0, so every index is below 50 and the lookup is in range;
    # the values before the write (up to 99) would be "out of range in self" if left unchanged
    ids = torch.arange(100).reshape(2, 50)
    real = ls.analyze(MaskedIds(), ids)
    meta = ls.analyze(MaskedIds(), ids, device="meta")
    assert meta.totals.forward.bytes_read == real.totals.forward.bytes_read
    mem = ls.memory(MaskedIds(), ids, optimizer="sgd")
    assert mem.peak_bytes > 0


def test_a_value_leaves_the_table_when_its_tensor_dies():
    # a causal mask made in each of a 70B model's 80 layers held 1.5 GB until the run ended: the
    # table's entries now go with their tensors
    from layerscope.capture.known import KnownValues
    table = KnownValues()
    t = torch.empty(64, 64, dtype=torch.bool, device="meta")
    table.put(t, torch.ones(64, 64, dtype=torch.bool))
    assert table.value(t) is not None and len(table.values) == 1
    del t
    assert not table.values and not table.shared


class _Pick(nn.Module):
    def forward(self, m):
        return m.nonzero()


class _Picked(nn.Module):
    """A model whose ``pick`` calls (nonzero) show, by their output shapes, which values a run read."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.pick = _Pick()


def _meta_picks(model: nn.Module, *inputs):
    """The output shapes of ``model``'s pick calls in a meta analysis, and the report's notes."""
    rep = ls.analyze(model, *inputs, device="meta")
    return [tuple(r.outputs[0].shape) for r in rep.layers if r.type == "_Pick"], rep.notes


class Writes(_Picked):
    """Writes into tensors with known values through views, and what nonzero() then finds: a slice of a mask
    set to 0 and another copied into, one element of a fill of ``n`` written, a fill written whole in place
    then a row of it zeroed, ones added to then a slice zeroed, and a real CPU tensor made beside meta ones
    and written into."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, ids):
        d = self.lin.weight.device
        mask = (ids.to(d) >= 0).long()
        mask[:, :3] = 0
        mask[:, 6:].copy_(torch.zeros(2, 2, dtype=torch.long, device=d))
        z = torch.zeros(2, self.n, dtype=torch.long, device=d)
        z[0, 1] = 5
        w = torch.zeros(2, self.n, dtype=torch.long, device=d)
        w.masked_fill_(w == 0, 1)
        w[1].zero_()
        o = torch.ones(3, self.n, device=d).long()
        o.add_(1)
        o[0, :4].fill_(0)
        c = torch.zeros(2, 8, dtype=torch.long)      # on the CPU whatever the model's device
        c[0, 1] = 5
        return [self.pick(x) for x in (mask, z, w, o, c)], self.lin(ids.float())


@pytest.mark.parametrize("n", [8, 100_000], ids=["fills-whole", "fills-of-one-element"])
def test_writes_through_views_reach_their_base_on_meta(n):
    # the real run's shapes: mask 2 x (8 - 3 - 2) = 6 rows, z 1, w n (row 0), o 3n - 4, c 1. Before the
    # writes went through, meta read 16, 0, 16, 24 and 0 rows at n = 8: the base kept its old values (or,
    # for the CPU tensor, a copy of its zeros)
    ids = torch.arange(16).reshape(2, 8)
    real = [tuple(t.shape) for t in Writes(n)(ids)[0]]
    assert real == [(6, 2), (1, 2), (n, 2), (3 * n - 4, 2), (1, 2)]
    picks, notes = _meta_picks(Writes(n), ids)
    assert picks == real
    assert notes == ()                  # every value read was known: nothing invented


def test_a_large_fill_holds_one_element():
    # zeros_like of an optimizer's state for Llama-2-70B's shards on 64 ranks held 8.6 GB of real zeros as
    # known values; a fill above FILL_WHOLE elements is one element expanded (4 bytes here, not 4 MiB)
    from layerscope.capture.known import FILL_WHOLE, KnownValues
    k = KnownValues()
    big = torch.empty(1024, 1024, device="meta")
    assert big.numel() > FILL_WHOLE
    k.fill(big, 0.0)
    v = k.value(big)
    assert tuple(v.shape) == (1024, 1024) and v.untyped_storage().nbytes() == 4 and v.abs().sum().item() == 0
    # written in place, it is made whole first (then 4 MiB: the write's values are real)
    w = k.writable(big)
    assert w.untyped_storage().nbytes() == 4 * 1024 * 1024 and k.value(big) is w and not k.fills
    small = torch.empty(16, device="meta")
    k.fill(small, 1.0)
    assert k.value(small).untyped_storage().nbytes() == 64


def _fed(fn):
    """Run ``fn()`` on meta tensors with a KnownValues table fed every op (as the recorder feeds it); the
    table."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from layerscope.capture.known import KnownValues
    from layerscope.capture.known_ops import carry_values
    table = KnownValues()

    class Feed(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            carry_values(table, func, args, kwargs or {}, out)
            return out
    with Feed():
        fn(table)
    return table


_L = torch.long
_N = 40_000        # 2 x 40,000 elements: a fill above FILL_WHOLE, held as one element


def _out_add(d):
    z = torch.zeros(2, _N, dtype=_L, device=d)
    torch.add(torch.ones(2, _N, dtype=_L, device=d), 0, out=z)      # out= is a keyword argument
    return z


def _out_tril(d):
    z = torch.zeros(300, 300, dtype=_L, device=d)
    torch.tril(torch.ones(300, 300, dtype=_L, device=d), out=z)
    return z


def _t_then_row(d):
    m = torch.zeros(300, 299, dtype=_L, device=d)
    m.t_()                          # the shape changes in place: (299, 300)
    m[0].fill_(1)
    return m


def _squeeze_then_column(d):
    m = torch.ones(1, 300, 300, dtype=torch.bool, device=d)
    m.squeeze_(0)
    m[:, 0] = False
    return m


@pytest.mark.parametrize("make", [_out_add, _out_tril, _t_then_row, _squeeze_then_column],
                         ids=["out-add", "out-tril", "t_", "squeeze_"])
def test_large_fills_written_through_out_or_reshaped_in_place_keep_the_real_values(make):
    # found by a reviewer helper: out= (a keyword) never made the one-element fill whole, nor did an in-place
    # op that changes the shape; the real op then raised (the fill stayed, stale: 0 rows) or wrote every
    # element into the one (tril: 90,000 rows)
    real = make("cpu")
    seen = {}
    table = _fed(lambda k: seen.setdefault("t", make("meta")))
    assert torch.equal(table.value(seen["t"]), real)


def test_a_write_from_the_unknown_forgets_what_it_does_not_reach():
    made = []

    def run(k):
        d = "meta"
        # out= from a source without values: the target is unknown, not its old zeros
        z = torch.zeros(2, 8, dtype=_L, device=d)
        torch.add(torch.randint(1, 2, (2, 8), device=d), 0, out=z)
        # a view taken while its base had no values, the base filled, then the view written: the view's new
        # value does not share the base's, so the base is unknown, not left at its ones
        m = torch.empty(2, 8, dtype=_L, device=d)
        v = m[:, :3]
        m.fill_(1)
        v.fill_(0)
        # a view of a known base written: the base sees it (6 of 16 elements zeroed)
        b = torch.ones(2, 8, dtype=_L, device=d)
        b[:, :3].fill_(0)
        made.extend((z, m, v, b))
    table = _fed(run)
    z, m, v, b = made
    assert not table.has(z) and not table.has(m) and table.value(v).tolist() == [[0, 0, 0]] * 2
    assert int(table.value(b).sum()) == 10


class _Unknowable(_Picked):
    """Reads values a meta run has no way to know: a branch on an uninitialised tensor, and its nonzero()."""

    def forward(self, x):
        m = torch.empty(2, 8, device=self.lin.weight.device)
        if (m > 0).any():
            x = x * 2
        return self.lin(x), self.pick(m), self.pick(m)


def test_a_meta_run_says_what_it_read_without_values():
    # the rule (values read as 1) was silent on meta; memory()'s simulation said it in its notes
    rep = ls.analyze(_Unknowable(), torch.randn(2, 8), device="meta")
    item, nonzero = rep.notes
    assert item.startswith("on meta tensors a tensor's value (.item(), bool(tensor), int(tensor)) had no values "
                           "(1 time, in (root)): read as 1")
    assert nonzero.startswith("on meta tensors nonzero had no values (2 times, in pick (x2)): every element counted")
    assert "Analyze on the CPU" in nonzero and "Note" in str(rep)
    # on the CPU the same model reads real values: no note
    assert ls.analyze(_Unknowable(), torch.randn(2, 8)).notes == ()


class _Labels(_Picked):
    """transformers' label pattern: a shifted view taken, low labels masked to -100 through a boolean mask,
    then the view written; and a view taken before a boolean-mask write that selects nothing."""

    def forward(self, ids):
        d = self.lin.weight.device
        labels = ids.to(d).clone()
        shifted = labels[:, 1:]
        labels[labels < 3] = -100
        shifted[:, :2] = 0
        m = (ids.to(d) >= 0).long()
        v = m[:, :3]
        m[ids.to(d) > 100] = 0
        v.fill_(0)
        return self.pick(labels != -100), self.pick(labels), self.pick(m), self.lin(ids.float())


def test_a_boolean_mask_write_keeps_the_views_it_reaches():
    # the reviewer helper's case: x[mask] = v forgot x's views (meta read them all nonzero: 16 and 16
    # rows, not 15 and 12); now written in place into the stored value, which the views share
    ids = torch.arange(16).reshape(2, 8)
    real = [tuple(t.shape) for t in _Labels()(ids)[:3]]
    assert real == [(15, 2), (12, 2), (10, 2)]
    assert _meta_picks(_Labels(), ids) == (real, ())


class _Second(_Picked):
    """Four more writes a second reviewer round found: rows of one tensor given values one by one, a
    tensor set_ onto another then the other written, a boolean mask after a slice (``m[:, mask] = 0``), and
    a write into the first input read through the second (the same tensor twice, or a view of it)."""

    def forward(self, ids, alias):
        d = self.lin.weight.device
        m = torch.empty(2, 8, dtype=_L, device=d)
        a, b = m[0], m[1]
        a.fill_(0)
        b.fill_(1)                        # does not touch a's elements: a keeps its zeros
        s = torch.zeros(2, 8, dtype=_L, device=d)
        t = (ids >= 0).long()
        s.set_(t)
        t[:, :5] = 0
        k = (ids >= 0).long()
        k[:, ids[0] % 2 == 0] = 0         # None and a mask among the indices
        ids[:, :3] = 0                    # written in place: ``alias`` shares its storage
        return [self.pick(x) for x in (a, b, s, k, alias)], self.lin(ids.float())


@pytest.mark.parametrize("aliasing", ["same-tensor", "a-view"])
def test_second_review_round_cases_match_the_cpu_run(aliasing):
    # real: a 0 rows, b 8, s 2 x 3 = 6, k 2 x 4 = 8, alias 2 x 5 = 10 (the same tensor: 8 - 3 columns left
    # nonzero; ids[:, 1:]: 7 columns, of which 2 zeroed).
    # Before: a forgotten (8 rows, with a note), s forgotten (16), k an internal TypeError, alias 16 and 14
    def inputs():
        ids = torch.arange(1, 17).reshape(2, 8)
        return ids, (ids if aliasing == "same-tensor" else ids[:, 1:])
    real = [tuple(t.shape) for t in _Second()(*inputs())[0]]
    assert real == [(0, 1), (8, 1), (6, 2), (8, 2), (10, 2)]
    assert _meta_picks(_Second(), *inputs()) == (real, ())


class _Strided(_Picked):
    """zeros_like of a transposed tensor keeps its strides: as_strided and view read its storage's order."""

    def forward(self, ids):
        d = self.lin.weight.device
        z = torch.zeros_like(ids.to(d).t())          # (8, 2), strides (1, 8)
        z[0, 1] = 3                                   # storage element 8
        w = torch.zeros_like(ids.to(d).t())
        w.t().view(-1)[3] = 1                         # legal on w's storage order only
        return self.pick(z.as_strided((8,), (1,))), self.pick(w), self.lin(ids.float())


def test_fill_values_keep_the_tensors_strides():
    # real: storage elements 0..7 of z are its column 0, all zero: 0 rows; w has one element set: 1 row.
    # Before, the values were row-major: as_strided read element 1 (3) and the view failed (w stale: 0)
    ids = torch.arange(16).reshape(2, 8)
    real = [tuple(t.shape) for t in _Strided()(ids)[:2]]
    assert real == [(0, 1), (1, 2)]
    assert _meta_picks(_Strided(), ids) == (real, ())
