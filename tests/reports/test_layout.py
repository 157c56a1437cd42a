"""The pure formatting, folding and fitting functions, on hand-made records: no model runs here."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from layerscope.render.fold import find_folds, roles
from layerscope.render.layout import fit, grid, shorten, shorten_name
from layerscope.render.text import grid_text
from layerscope.options import iec
from layerscope.render.units import fmt, si
from layerscope.reports.table import Column, Fact, flat_table, select_columns, tree_table


@dataclass
class Rec:
    index: int
    path: str
    type: str
    depth: int
    parent: int | None
    macs: int
    peak: int
    call_index: int = 0


COLS = (Column("macs", "MACs", "count", lambda r, rep: r.macs),
        Column("peak", "Peak", "bytes", lambda r, rep: r.peak, fold=False, drop=1))


def stack(n: int, macs=None) -> list[Rec]:
    """root > layers.0..n-1 (Block) > fc (Linear) each; the peak grows with the block number."""
    recs = [Rec(0, "", "Net", 0, None, 0, 0)]
    for b in range(n):
        m = 100 if macs is None else macs[b]
        recs.append(Rec(len(recs), f"layers.{b}", "Block", 1, 0, m, 1000 * (b + 1)))
        recs.append(Rec(len(recs), f"layers.{b}.fc", "Linear", 2, len(recs) - 1, m, 1000 * (b + 1) + 1))
    recs.append(Rec(len(recs), "head", "Linear", 1, 0, 7, 10))
    return recs


def table(recs):
    return tree_table("t", "title", None, recs, COLS, footer=(Fact("Total MACs", 1.5e15, "count"),))


# ---- units ------------------------------------------------------------------------------------

@pytest.mark.parametrize("unit,value,text", [
    ("count", 3_746_783_780_000_000_000, "3.75 E"),     # 3.7e18: was "3746783.78 T"
    ("count", 1.21e15, "1.21 P"),
    ("count", 999, "999"),
    ("count", 0, "0"),                                   # zero MACs is 0 everywhere, not "--"
    ("count", None, "--"),
    ("params", 124_439_808, "124,439,808"),
    ("bytes", 2 ** 50 * 3, "3.00 PiB"),
    ("bytes", 512, "512 B"),
    ("seconds", 0.0025, "2.50 ms"),
    ("seconds", 25e-6, "25.0 us"),
    ("percent", 0.125, "12.50%"),
    ("shape", ((1, 32, 64), (1, 4)), "[1, 32, 64] +1"),
    ("+count", 2.5e9, "+2.50 G"),
    ("+count", -2.5e9, "-2.50 G"),
    ("+params", -49_984, "-49,984"),
])
def test_units(unit, value, text):
    assert fmt(unit, value) == text


def test_params_in_charts_are_si():
    assert fmt("params", 68_976_648_192, chart=True) == "68.98 G"
    assert si(1e21) == "1000.00 E" and iec(2 ** 61) == "2.00 EiB"


# ---- folding ------------------------------------------------------------------------------------

def test_identical_blocks_fold_and_volatile_columns_do_not_stop_it():
    t = table(stack(5))
    (f,) = find_folds(t)
    assert (f.count, f.prefix, f.first, f.last) == (5, "layers.", "0", "4")
    text = grid_text(grid(t))
    # the fold row shows the highest peak of the five blocks (5,000 B), its child likewise (5,001 B)
    assert "├─layers.0-4: Block x5 (each)   100  4.88 KiB" in text and "fc: Linear                100  4.88 KiB" in text
    assert "layers.3" not in text and text.count("fc: Linear") == 1
    assert "Folded rows" in text and "Peak: the highest over the folded blocks" in text
    assert grid_text(grid(t, fold=False)).count("fc: Linear") == 5


def test_a_different_block_splits_the_run():
    t = table(stack(7, macs=[100, 100, 100, 5, 100, 100, 100]))
    assert [(f.first, f.last) for f in find_folds(t)] == [("0", "2"), ("4", "6")]


def test_two_blocks_do_not_fold():
    assert find_folds(table(stack(2))) == []


def test_a_run_that_closes_its_parent_closes_its_branch():
    recs = stack(3)[:-1]                     # no head: the run is the root's last child
    text = grid_text(grid(table(recs)))
    assert "└─layers.0-2: Block x3 (each)" in text and "    └─fc: Linear" in text


def test_roles_group_repeated_layers():
    """Blocks with the same type and structure share roles; the numbered parts inside one block
    (a Sequential's 0 and 2) stay apart."""
    layers = [("", "Net"), ("layers", "ModuleList")]
    for b in range(3):
        layers += [(f"layers.{b}", "Block"), (f"layers.{b}.mlp", "Sequential"), (f"layers.{b}.mlp.0", "Linear"),
                   (f"layers.{b}.mlp.1", "GELU"), (f"layers.{b}.mlp.2", "Linear")]
    layers += [("head", "Linear"), ("extra", "ModuleList"), ("extra.0", "Linear"), ("extra.1", "Conv2d")]
    r = roles(layers)
    assert r["layers.2.mlp.2"] == "layers.*.mlp.2" and r["layers.0.mlp.0"] == "layers.*.mlp.0"
    assert r["layers.1"] == "layers.*" and r["head"] == "head"
    assert r["extra.0"] == "extra.0" and r["extra.1"] == "extra.1"     # different types: not a block run


# ---- fitting ------------------------------------------------------------------------------------

def test_names_shrink_before_columns_drop_and_numbers_are_never_cut():
    recs = stack(2)
    recs[1].path = "layers.0"
    recs.append(Rec(len(recs), "a_very_long_module_name_that_goes_on.and_on.projection", "VeryLongTypeName", 1, 0,
                    123_456_789, 10))
    g = grid(table(recs), fold=False)
    wide = sum(g.widths) + 2 * (len(g.widths) - 1)
    narrow = fit(g, wide - 12)
    assert narrow.dropped == () and max(len(r[0]) for r in narrow.body) < max(len(r[0]) for r in g.body)
    assert [r[1:] for r in narrow.body] == [r[1:] for r in g.body]        # every number whole
    tight = fit(g, 30)
    assert tight.dropped == ("Peak",) and [r[1] for r in tight.body] == [r[1] for r in g.body]
    assert all(len(line) <= 30 for line in grid_text(tight).splitlines()[1:3])


def test_shortened_names_keep_what_says_which_layer_it_is():
    assert shorten_name("blocks.0-3: _Block x4 (each)", 20) == "blocks.0-3 x4 (each)"
    assert shorten_name("attn: GPT2Attention", 14) == "attn: GPT2Att…"
    assert shorten_name("qkv: Linear", 40) == "qkv: Linear"
    assert shorten("encoder.layer.11.attention.output.dense", 24) == "encoder…ion.output.dense"


def test_flat_tables_keep_the_stage_first():
    @dataclass
    class St:
        index: int
        label: str
        flops: int

    t = flat_table("p", "plan", None, [St(0, "0: model.embed_tokens .. model.layers.9", 5), St(1, "1: lm_head", 3)],
                   (Column("flops", "FLOPs", "count", lambda s, p: s.flops),), name=lambda s: s.label)
    g = fit(grid(t), 30)
    # 23 characters: too few for the last unit whole beside 3 of the first's; both keep their ends
    # (issue 58: the first unit was cut to "…s", at 80 columns to nothing)
    assert g.body[0][0] == "0: …ens .. …el.layers.9" and len(g.body[0][0]) == 30 - 2 - 5


def test_column_choice_by_key_or_alias():
    cols = (Column("output_shape", "Output shape", "shape", lambda r, p: None, aliases=("output_size",)),
            Column("macs", "MACs", "count", lambda r, p: 0, default=False))
    assert [c.key for c in select_columns(cols, None, ValueError)] == ["output_shape"]
    assert [c.key for c in select_columns(cols, "output_size,macs", ValueError)] == ["output_shape", "macs"]
    with pytest.raises(ValueError, match="unknown column 'bogus'"):
        select_columns(cols, ["bogus"], ValueError)
