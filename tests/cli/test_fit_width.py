"""Issue 34, item 6: every view fits the terminal at 80 and 120 columns. Each command runs with a
terminal for its standard output (a text stream whose ``isatty()`` is true, COLUMNS set, as a
shell gives it) and no line it prints is wider than COLUMNS: each subcommand's ``--help``,
``list-presets``, the ``onnx`` tables, ``split``, ``compare``, ``summary``, ``memory``, ``profile`` and
``parallel``."""

from __future__ import annotations

import io
import re
import sys

import pytest

from layerscope.cli import main
from layerscope.render.layout import shorten_start, wrap_text

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def small_onnx(tmp_path_factory):
    """A two-node graph (Gemm, Relu) with static shapes: enough for both onnx tables."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np
    g = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["h"], transB=1, name="a_fairly_long_node_name/fc1/Gemm"),
         helper.make_node("Relu", ["h"], ["y"], name="a_fairly_long_node_name/act/Relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        initializer=[numpy_helper.from_array(np.zeros((4, 8), np.float32), "w")])
    path = tmp_path_factory.mktemp("onnx") / "small.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=10), str(path))
    return str(path)


COMMANDS = ["summary", "memory", "profile", "split", "onnx", "onnx-tile", "report", "compare", "list-presets",
            "parallel"]
VIEWS = {
    **{f"{c} --help": [c, "--help"] for c in COMMANDS},
    "--help": ["--help"],
    "list-presets": ["list-presets"],
    "onnx": ["onnx", "{onnx}"],
    "summary": ["summary", "layerscope.examples:tiny_gpt", "--device", "meta", "--backward"],
    "memory": ["memory", "layerscope.examples:small_cnn", "--steps", "1", "--limit", "512KiB"],
    "profile": ["profile", "layerscope.examples:small_cnn", "--repeats", "1", "--warmup", "0"],
    "split": ["split", "layerscope.examples:tiny_gpt", "--stages", "2", "--microbatches", "2", "--batch-size", "2",
              "--memory-limit", "64MiB"],
    "compare": ["compare", "layerscope.examples:tiny_gpt", "layerscope.examples:small_cnn", "--depth", "1"],
    "parallel": ["parallel", "layerscope.examples:tiny_gpt", "--gpus", "2", "--gpu", "H100"],
}


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_no_line_wider_than_the_terminal(view, columns, monkeypatch, request):
    argv = VIEWS[view]
    if "{onnx}" in argv:
        argv = [a.replace("{onnx}", request.getfixturevalue("small_onnx")) for a in argv]
    monkeypatch.setenv("COLUMNS", str(columns))
    out = _Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    try:
        assert main(argv) == 0
    except SystemExit as e:          # --help
        assert e.code in (0, None)
    lines = _ANSI.sub("", out.getvalue()).splitlines()
    assert len(lines) > 5, view
    wide = [line for line in lines if len(line) > columns]
    assert not wide, f"{view} at {columns} columns: {len(wide)} lines wider, e.g. {wide[0]!r}"


def test_wrap_text_keeps_listings_and_commands_usable():
    text = ("model spec, one of:\n"
            "  hf:PRESET    a shipped architecture (built on meta unless --device): gpt2,\n"
            "               bert-base, llama-2-70b\n"
            "examples:\n"
            "  layerscope summary hf:llama-2-70b --depth 2 --format json -o out.json   # on meta: nothing allocated")
    lines = wrap_text(text, 40)
    assert all(len(line) <= 40 for line in lines)
    # the hand-wrapped listing entry is one entry again, its continuation under its second column (15)
    assert lines[1] == "  hf:PRESET    a shipped architecture"
    assert lines[2].startswith(" " * 15 + "(built")
    # a command's comment goes above it; every line of the command but the last ends with " \"
    at = lines.index("  # on meta: nothing allocated")
    command = lines[at + 1:]
    assert command[0].startswith("  layerscope summary") and all(c.endswith(" \\") for c in command[:-1])
    assert " ".join(c.rstrip(" \\").strip() for c in command) == \
        "layerscope summary hf:llama-2-70b --depth 2 --format json -o out.json"


def test_shorten_start_keeps_the_stage_and_the_end():
    name = "0: model.embed_tokens .. model.layers.1"            # 39 characters
    assert shorten_start(name, 39) == name
    # 30 = "0: " (3) + first unit's end (23 - 4 - 14 = 9 with its "…") + " .. " (4) + "model.layers.1" (14)
    assert shorten_start(name, 30) == "0: …d_tokens .. model.layers.1"
    # too narrow for the last unit whole: both lose their start, the first down to "…" + 3 characters,
    # never to nothing (issue 58: "0: … .. blocks.1"); 18 = 3 + 4 + 4 + 7
    assert shorten_start(name, 18) == "0: …ens .. …yers.1"
    assert shorten_start("0: tok+pos .. blocks.1", 17) == "0: …pos .. …cks.1"
    # too narrow for even that: the range's end
    assert shorten_start(name, 12) == "0: …layers.1"
    assert shorten_start("node_Conv_54", 8) == "…Conv_54"


def test_split_at_80_columns_keeps_the_first_stage_s_first_unit(monkeypatch):
    """Issue 58, item 9: at 80 columns the first stage read "0: … .. blocks.1" (the name column cut
    to 17 characters, the first unit elided whole). A stage range keeps its first unit's end and its
    last unit whole before a column is dropped (a third of the width at most)."""
    monkeypatch.setenv("COLUMNS", "80")
    out = _Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["split", "layerscope.examples:tiny_gpt", "--stages", "2", "--device", "meta"]) == 0
    lines = _ANSI.sub("", out.getvalue()).splitlines()
    assert all(len(line) <= 80 for line in lines)
    rows = [line.strip() for line in lines if line.strip().startswith(("0: ", "1: "))]
    assert [r.split("  ")[0] for r in rows] == ["0: tok+pos .. blocks.1", "1: ln .. head"], rows
