"""The command line: specs, formats, and one-line errors with a non-zero exit (never a traceback)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from layerscope.cli import main


def run(*argv):
    return main(list(argv))


def test_summary_example_table(capsys):
    assert run("summary", "layerscope.examples:small_cnn", "--depth", "1") == 0
    out = capsys.readouterr().out
    assert "SmallCNN" in out and "Forward MACs" in out and "5.16 M" in out


def test_summary_json_and_output_file(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert run("summary", "layerscope.examples:tiny_gpt", "--format", "json", "--output", str(out)) == 0
    data = json.loads(out.read_text())
    assert data["totals"]["params"] == 168_192
    assert capsys.readouterr().out == ""


def test_summary_csv_input_size(capsys):
    assert run("summary", "layerscope.examples:small_cnn", "--input-size", "2,3,16,16", "--format", "csv") == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("index,path,type")
    assert "2x3x16x16" in lines[1]


def test_file_factory(tmp_path, capsys):
    f = tmp_path / "net.py"
    f.write_text("import torch.nn as nn\ndef build(width=4):\n    return nn.Linear(3, width)\n")
    assert run("summary", f"{f}:build", "--input-size", "2,3", "--set", "width=5", "--columns", "macs") == 0
    assert "30" in capsys.readouterr().out  # 2 * 3 * 5 MACs


def test_hf_config_on_meta(capsys):
    pytest.importorskip("transformers")
    assert run("summary", "hf:GPT2Config", "--set", "n_layer=1", "--head", "causal-lm",
               "--input-ids", "1,16", "--depth", "1", "--columns", "params,macs") == 0
    out = capsys.readouterr().out
    assert "GPT2LMHeadModel" in out


def test_hf_model_past_its_positions_on_meta_fails_like_cpu(capsys):
    # GPT2Config's n_positions is 1,024: position ids 1,024 .. 2,047 (from arange, known on meta)
    # are past the table, as the CPU run finds (issue 34)
    pytest.importorskip("transformers")
    assert run("summary", "hf:GPT2Config", "--set", "n_layer=1", "--set", "n_embd=32", "--set", "n_head=2",
               "--input-ids", "1,2048",
               "--device", "meta") == 1
    err = capsys.readouterr().err
    assert "layer 'wpe'" in err and "IndexError: index out of range" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv, message", [
    (("summary", "no_such_module:thing"), "cannot import"),
    (("summary", "hf:NoSuchConfig"), "neither a preset"),
    (("summary", "layerscope.examples:small_cnn", "--input-size", "1,5,32,32"), "stem.0"),
    (("summary", "layerscope.examples:nope"), "has no 'nope'"),
    (("summary", "justaword"), "model spec"),
    (("summary", "layerscope.examples:small_cnn", "--columns", "bogus"), "unknown column"),
])
def test_errors_are_one_line(argv, message, capsys):
    assert run(*argv) != 0
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert err.count("\n") == 1


def test_torchvision_spec_summary_or_one_line_error(capsys):
    """`torchvision:` specs build the model where torchvision loads (the torch 2.14.1 + torchvision 0.29.1
    environment) and fail in one line where it is absent or built for another torch (the 2.13.0 one)."""
    try:
        import torchvision  # noqa: F401
        loads = True
    except Exception:  # noqa: BLE001 - a torchvision built for another torch fails with any error
        loads = False
    code = run("summary", "torchvision:resnet50", "--device", "meta", "--depth", "1", "--columns", "params,macs")
    out, err = capsys.readouterr()
    if loads:
        assert code == 0 and err == ""
        assert "ResNet" in out and "25,557,032" in out and "4.09 G" in out   # torchvision's published figures
    else:
        assert code != 0 and "torchvision" in err
        assert "Traceback" not in err and err.count("\n") == 1


def test_entry_point_subprocess():
    res = subprocess.run([sys.executable, "-m", "layerscope.cli", "summary", "nope:x"], capture_output=True,
                         text=True)
    assert res.returncode == 1
    assert res.stderr.startswith("layerscope: error:") and "Traceback" not in res.stderr


def test_memory_training_step_with_limit(capsys):
    assert run("memory", "layerscope.examples:tiny_gpt", "--optimizer", "adamw", "--autocast", "bf16",
               "--limit", "20MiB", "--depth", "1") == 0
    out = capsys.readouterr().out
    assert "Saved for bwd" in out and "optimizer AdamW, autocast bfloat16" in out
    assert "20.00 MiB: fits" in out and "largest batch that fits 20.00 MiB:" in out


def test_memory_json_inference_and_cuda_rounding(capsys):
    assert run("memory", "layerscope.examples:small_cnn", "--infer", "--batch-size", "4", "--format", "json",
               "--device", "cuda") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "memory" and data["model"]["options"]["training"] is False
    assert data["model"]["options"]["allocation_block"] == 512
    assert all(v % 512 == 0 for v in data["breakdown"].values())


def test_memory_errors_are_one_line(capsys):
    assert run("memory", "layerscope.examples:small_cnn", "--optimizer", "nope") == 1
    assert "unknown optimizer 'nope'" in capsys.readouterr().err
    assert run("memory", "layerscope.examples:small_cnn", "--optimizer", "adam", "--momentum", "0.9") == 1
    assert "--momentum applies to --optimizer sgd" in capsys.readouterr().err
