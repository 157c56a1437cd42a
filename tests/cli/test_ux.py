"""CLI and readability: presets, folded blocks, shortened names, compare, report, formats."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.cli import main


def run(*argv):
    return main(list(argv))
from layerscope.render.layout import shorten

pytest.importorskip("transformers")

# Published parameter counts, derived by hand (tied embeddings counted once; V vocab, h width, L
# layers, I MLP width, kv the width of K and V under grouped-query attention):
#   gpt2:  wte 50257*768 + wpe 1024*768 + 12 * (2 LN 2*1536 + qkv 768*2304+2304 + proj 768*768+768
#          + fc 768*3072+3072 + proj 3072*768+768 = 7,087,872) + ln_f 1536               = 124,439,808
#   llama-2-7b: 2 * 32000*4096 (embed, head) + 32 * (4*4096^2 + 3*4096*11008 + 2*4096) + 4096
#               = 262,144,000 + 32 * 202,383,360 + 4096                                  = 6,738,415,616
#   llama-2-70b: 2*32000*8192 + 80 * (2*8192^2 + 2*8192*1024 + 3*8192*28672 + 2*8192) + 8192
#               = 524,288,000 + 80 * 855,654,400 + 8192                                  = 68,976,648,192
#   llama-3-8b: 2*128256*4096 + 32 * (2*4096^2 + 2*4096*1024 + 3*4096*14336 + 2*4096) + 4096
#               = 1,050,673,152 + 32 * 218,112,000 + 4096                                = 8,030,261,248
#   mixtral-8x7b: 2*32000*4096 + 32 * (41,943,040 attn + 8*176,160,768 experts + 4096*8 gate
#               + 2*4096) + 4096                                                         = 46,702,792,704
# and the others as published (bert-base 109,482,240 with its pooler; t5-base 222,903,552;
# vit-base/16 86,567,656 with a 1000-class head).
HAND = {"gpt2": 124_439_808, "llama-2-7b": 6_738_415_616, "llama-2-70b": 68_976_648_192,
        "llama-3-8b": 8_030_261_248, "mixtral-8x7b": 46_702_792_704}


def test_every_preset_builds_on_meta_with_its_published_parameter_count():
    from layerscope.specs import build_model
    names = list(ls.presets())
    assert len(names) >= 16 and {"gpt2-xl", "bert-large", "vit-large", "llama-3-70b", "mistral-7b"} <= set(names)
    for name, p in ls.presets().items():
        model = build_model(f"hf:{name}").model
        params = {id(t): t.numel() for t in model.parameters()}
        assert sum(params.values()) == p["params"], name
        assert all(t.device.type == "meta" for t in model.parameters())
    for name, n in HAND.items():
        assert ls.presets()[name]["params"] == n


def test_preset_summary_folds_the_decoder_layers(capsys):
    assert run("summary", "hf:llama-2-70b", "--depth", "2", "--input-ids", "1,128") == 0
    out = capsys.readouterr().out
    assert "layers.0-79: LlamaDecoderLayer x80 (each)" in out and "68,976,648,192" in out
    assert "layers.1:" not in out
    assert run("summary", "hf:gpt2", "--set", "n_layer=3", "--depth", "2", "--expand", "--input-ids", "1,8") == 0
    out = capsys.readouterr().out
    assert "0: GPT2Block" in out and "2: GPT2Block" in out and "x3" not in out
    # an encoder-decoder preset with --input-ids gets decoder ids of the same shape
    assert run("summary", "hf:t5-base", "--input-ids", "1,8", "--depth", "1", "--format", "json") == 0
    assert json.loads(capsys.readouterr().out)["totals"]["params"] == 222_903_552


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x))


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(5)])
        self.odd = nn.ModuleList([Block() for _ in range(3)])
        self.tail = nn.ModuleList([Block() for _ in range(3)])

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        x = self.odd[0](x)
        x = self.odd[1](x[:1])       # a different shape breaks the run: nothing folds
        x = self.odd[2](x)
        for b in self.tail:
            x = b(x)
        return x


def test_fold_only_what_renders_the_same():
    rep = ls.analyze(Stack(), torch.randn(2, 8))
    text = rep.table()
    # layers.0-4 are identical: one row (Linear(8, 8) on 2 rows: 128 MACs each), then block 0's rows
    assert "├─layers.0-4: Block x5 (each)" in text and "layers.1" not in text
    assert text.count("fc: Linear") == 1 + 3 + 1       # the folded run, odd.0-2 unfolded, the tail run
    assert "odd.0: Block" in text and "odd.1: Block" in text
    # the last run closes the root's branch: its row and its children's indent close with it
    assert "└─tail.0-2: Block x3 (each)" in text and "    ├─fc: Linear" in text
    assert "x5" not in rep.table(fold=False) and rep.table(fold=False).count("fc: Linear") == 11
    # the memory table folds the same way
    mem = ls.memory(Stack(), torch.randn(2, 8))
    assert "layers.0-4: Block x5 (each)" in mem.table() and "x5" not in mem.table(fold=False)


def test_long_names_keep_their_start_and_end():
    name = "encoder.very_long_submodule_name.another_level.attention.q_proj"
    short = shorten(name)
    assert len(short) == 40 and short.startswith("encoder…") and short.endswith("attention.q_proj")
    assert shorten("fc") == "fc"


def test_compare_models_and_saved_reports(tmp_path, capsys):
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    x = torch.randn(2, 8)
    m1, m2 = Stack(), Stack()
    m2.tail[2] = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8))
    ls.analyze(m1, x).to_json(str(a))
    ls.analyze(m2, x).to_json(str(b))
    assert run("compare", str(a), str(b), "--changed", "--depth", "3") == 0
    out = capsys.readouterr().out
    # tail.2 runs on the one row odd.1 kept: Block (8*8+8 = 72 params, 1*8*8 = 64 MACs) became
    # Sequential (8*16+16 + 16*8+8 = 280 params, 1*8*16 + 1*16*8 = 256 MACs): +208 params (+288.9%)
    # and +192 MACs (+300.0%), in the row and in the totals
    assert "tail.2: Block -> Sequential" in out and "+208 (+288.9%)" in out and "+192 (+300.0%)" in out
    assert "layers.0" not in out                          # unchanged rows left out with --changed
    diff = ls.compare(ls.analyze(m1, x), ls.analyze(m2, x))
    assert diff.totals[1]["params"] - diff.totals[0]["params"] == 208
    assert json.loads(diff.to_json())["kind"] == "comparison"
    # two specs with --memory: the summary and the training step's memory, each compared
    assert run("compare", "layerscope.examples:tiny_gpt", "layerscope.examples:tiny_gpt", "--memory",
               "--format", "json") == 0
    both = json.loads(capsys.readouterr().out)
    assert [d["compared"] for d in both] == ["summary", "memory"]
    assert all(r["memory_delta"] == 0 for r in both[1]["layers"])
    with pytest.raises(ls.InputError, match="cannot compare a summary report with a memory"):
        ls.compare(ls.analyze(m1, x), ls.memory(m1, x))


def test_cli_formats_and_report(tmp_path, capsys):
    page = tmp_path / "s.html"
    assert run("summary", "layerscope.examples:small_cnn", "--format", "html", "-o", str(page)) == 0
    assert page.read_text().startswith("<!DOCTYPE html>")
    saved = tmp_path / "cnn.json"
    mem = tmp_path / "mem.json"
    assert run("summary", "layerscope.examples:small_cnn", "--format", "json", "-o", str(saved)) == 0
    assert run("memory", "layerscope.examples:small_cnn", "--format", "json", "-o", str(mem)) == 0
    out = tmp_path / "both.html"
    assert run("report", str(saved), str(mem), "-o", str(out)) == 0
    text = out.read_text()
    assert '"summary":' in text and '"memory":' in text
    assert run("report", "layerscope.examples:tiny_gpt", "-o", str(out), "--stages", "2", "--no-memory") == 0
    assert '"plan":' in out.read_text() and '"memory":' not in out.read_text()
    assert run("report", str(saved), str(saved), "-o", str(out)) == 1
    assert "already on the page" in capsys.readouterr().err


def test_list_presets_and_help_examples(capsys):
    assert run("list-presets") == 0
    out = capsys.readouterr().out
    assert "hf:llama-2-70b" in out and "68.98 G" in out
    assert run("list-presets", "--format", "json") == 0
    assert len(json.loads(capsys.readouterr().out)) == len(ls.presets())
    for cmd in ("summary", "memory", "profile", "split", "onnx", "onnx-tile", "report", "compare", "list-presets"):
        with pytest.raises(SystemExit):
            run(cmd, "--help")
        assert "examples:" in capsys.readouterr().out, cmd
