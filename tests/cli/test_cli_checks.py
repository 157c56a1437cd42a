"""Issue 21: the CLI checks its inputs before it runs anything — memory before allocating, devices,
argparse errors in one line, --version, split --run options, torch's missing-numpy warning."""

from __future__ import annotations

import subprocess
import sys

import pytest

import layerscope
from layerscope import specs
from layerscope.cli import main


def test_weights_too_big_are_refused_before_allocating(monkeypatch, capsys):
    # gpt2-large: 774,030,080 params x 4 B (fp32) = 3,096,120,320 B = 2.88 GiB, counted on meta; with
    # 1 GiB available `profile` (which needs real weights) must refuse before building on cpu
    monkeypatch.setattr(specs, "available_bytes", lambda device: 2 ** 30)
    built = []
    real = specs.build_model
    monkeypatch.setattr(specs, "build_model", lambda spec, device=None, *a, **k: built.append(device)
                        or real(spec, device, *a, **k))
    assert main(["profile", "hf:gpt2-large"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs 2.88 GiB on cpu, which has 1.00 GiB available" in err
    assert "--model-dtype bf16" in err and "smaller preset" in err
    assert built == ["meta"]                      # only the meta count ran: nothing was allocated
    # bf16 halves it: 1,548,060,160 B = 1.44 GiB, still more than 1 GiB
    assert main(["profile", "hf:gpt2-large", "--model-dtype", "bf16"]) == 1
    assert "needs 1.44 GiB" in capsys.readouterr().err


def test_inputs_too_big_are_refused(monkeypatch, capsys):
    # 600,000 x 3 x 1000 x 100 float32 = 720,000,000,000 B = 670.55 GiB: a raw allocator error before
    monkeypatch.setattr(specs, "available_bytes", lambda device: 8 * 2 ** 30)
    assert main(["summary", "layerscope.examples:small_cnn", "--input-size", "600000,3,1000,100"]) == 1
    err = capsys.readouterr().err
    assert "needs 670.55 GiB on cpu, which has 8.00 GiB available" in err and err.count("\n") == 1 and "smaller inputs" in err


def test_meta_is_never_refused(monkeypatch, capsys):
    monkeypatch.setattr(specs, "available_bytes", lambda device: 1)
    assert main(["summary", "hf:gpt2-large", "--depth", "0", "--set", "n_layer=1"]) == 0
    capsys.readouterr()


def test_available_bytes_reads_meminfo():
    free = specs.available_bytes("cpu")
    with open("/proc/meminfo") as f:
        line = next(l for l in f if l.startswith("MemAvailable:"))
    # the kernel's figure, within what other processes allocate meanwhile
    assert abs(free - int(line.split()[1]) * 1024) < 2 ** 30
    assert specs.available_bytes("meta") is None


def test_version_and_one_line_usage_errors(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"layerscope {layerscope.__version__} (torch " \
        f"{__import__('torch').__version__})"
    assert main(["split", "layerscope.examples:tiny_gpt", "--stages", "2", "--microbatches", "0"]) == 1
    err = capsys.readouterr().err
    assert err == ("layerscope: error: argument --microbatches: must be at least 1, got 0 "
                   "(see `layerscope split --help`)\n")


def test_split_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["split", "--help"])
    out = capsys.readouterr().out
    assert "(default 8" in out and "(default 4)" in out and "(default 1f1b)" in out


def test_split_run_passes_the_device(monkeypatch, capsys):
    import layerscope.torchrun as run
    seen = {}

    def stub(spec, **kw):
        seen.update(kw)
        raise layerscope.InputError("stubbed")
    monkeypatch.setattr(run, "launch", stub)
    assert main(["split", "layerscope.examples:tiny_gpt", "--stages", "2", "--run", "--device", "cpu"]) == 1
    assert seen["device"] == "cpu" and seen["microbatches"] == 4 and seen["batch_size"] == 8
    capsys.readouterr()


def test_no_numpy_warning_at_import():
    # torch warns "Failed to initialize NumPy: No module named 'numpy'" while it is imported without
    # numpy; `make demo` printed it before every table. numpy is hidden here (None in sys.modules) and
    # every warning is an error: importing layerscope (and torch with it) must stay silent.
    code = ("import sys, warnings; sys.modules['numpy'] = None; warnings.simplefilter('error'); "
            "import layerscope.cli")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0 and res.stderr == "", res.stderr
