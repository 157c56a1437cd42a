"""Issue 34 item 5: input that was accepted silently, or refused with a message about something else, is
refused with one line naming the problem (library: InputError/SpecError; CLI: exit 1, one stderr line)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerscope
from layerscope import specs
from layerscope.capture.inputs import make_inputs
from layerscope.cli import main
from layerscope.errors import InputError, LayerscopeError
from layerscope.formats.exported import load_exported
from layerscope.formats.onnx_load import load_onnx
from layerscope.options import parse_bytes


def _one_line(capsys, needle: str) -> None:
    cap = capsys.readouterr()
    assert cap.err.count("\n") == 1 and needle in cap.err, cap.err
    assert "Traceback" not in cap.err and "W1" not in cap.err


def test_zero_input_dimension_is_refused():
    # before: a batch of 0 ran and every MAC/param-byte count of the table was 0
    with pytest.raises(InputError, match=r"\(0, 3, 32, 32\) has a zero dimension"):
        make_inputs((0, 3, 32, 32))
    with pytest.raises(InputError, match="zero dimension"):
        layerscope.analyze(nn.Conv2d(3, 8, 3), input_size=(0, 3, 32, 32))


def test_zero_input_dimension_cli(capsys):
    assert main(["summary", "layerscope.examples:small_cnn", "--input-size", "0,3,32,32", "-q"]) == 1
    _one_line(capsys, "has a zero dimension")


def test_empty_and_foreign_onnx_are_refused(tmp_path, capsys):
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    # before: an empty graph, "Coverage complete"
    with pytest.raises(InputError, match=r"is empty \(0 bytes\)"):
        load_onnx(str(empty))
    assert main(["summary", str(empty), "-q"]) == 1
    _one_line(capsys, "is empty (0 bytes), not an ONNX model")


def test_text_pt2_is_refused_without_torch_warnings(tmp_path, capsys):
    bad = tmp_path / "bad.pt2"
    bad.write_text("hello\n")
    with pytest.raises(InputError, match="not a torch.export program"):
        load_exported(str(bad))
    # before: 12 lines of torch warnings on stderr, then the error line
    assert main(["summary", str(bad), "-q"]) == 1
    _one_line(capsys, "a .pt2 file is a zip archive")


def test_negative_count_in_set_is_refused(capsys):
    # before: "forward failed ... on meta, tensors have shapes but no values" (the blame on meta tensors)
    with pytest.raises(LayerscopeError, match="n_layer=-1: a count or size cannot be negative"):
        specs.build_model("hf:gpt2", overrides={"n_layer": -1})
    assert main(["summary", "hf:gpt2", "--set", "n_layer=-1", "-q"]) == 1
    _one_line(capsys, "--set n_layer=-1: a count or size cannot be negative")


@pytest.mark.parametrize("text", ["0GiB", "-5GiB", "0", "-1"])
def test_non_positive_memory_size(text):
    # before: "0GiB" read "expected a memory size" (it is one, just not a positive one)
    with pytest.raises(InputError, match="a memory size must be positive"):
        parse_bytes(text)


def test_bad_memory_size_still_says_expected():
    with pytest.raises(InputError, match="expected a memory size"):
        parse_bytes("lots")
    assert parse_bytes("1.5KiB") == 1536          # 1.5 x 1024


@pytest.mark.parametrize("limit", ["0GiB", "-5GiB"])
def test_non_positive_limit_cli(limit, capsys):
    # before: -5GiB was an argparse usage error ("expected one argument"), 0GiB "expected a memory size"
    assert main(["memory", "layerscope.examples:small_cnn", "--limit", limit, "-q"]) == 1
    _one_line(capsys, f"a memory size must be positive, got '{limit}'")


def test_report_says_where_it_wrote(tmp_path, capsys):
    # issue 34 item 7: `report` printed nothing on success
    out = tmp_path / "r.html"
    assert main(["report", "layerscope.examples:small_cnn", "-o", str(out), "-q"]) == 0
    line = capsys.readouterr().out
    assert line.startswith(f"wrote {out} (") and line.count("\n") == 1 and out.stat().st_size > 0


def test_memory_footer_says_what_total_sums_when_it_exceeds_the_peak():
    # issue 34 item 7: a root Total larger than the peak read as a contradiction. The footer line appears
    # only then: here the real report (peak above Total) has none, and the same report with its peak put
    # below the root's Total has it.
    from layerscope.reports.memory import memory_footer
    m = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    rep = layerscope.memory(m, torch.randn(8, 64), optimizer="adamw")
    root = next(r for r in rep.layers if r.depth == 0)
    assert root.total < rep.peak_bytes
    assert "Total column" not in [f.label for f in memory_footer(rep)]

    class Lower:                       # the report with a smaller peak, everything else as it is
        peak_bytes = root.total - 1

        def __getattr__(self, name):
            return getattr(rep, name)
    facts = {f.label: f for f in memory_footer(Lower())}
    assert "not a peak" in str(facts["Total column"].value)


def test_a_reader_that_closed_the_pipe_is_not_an_internal_error():
    """`layerscope ... | true`: the reader is gone before the report is written. Like cat or grep,
    nothing on stderr and the status a shell gives a program SIGPIPE ended (128 + 13), not "internal
    error"."""
    import os
    import subprocess
    import sys
    r, w = os.pipe()
    os.close(r)                                 # nobody will read
    with open(w, "wb") as out:
        done = subprocess.run([sys.executable, "-m", "layerscope.cli", "summary", "layerscope.examples:small_cnn", "-q"],
                              stdout=out, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 141 and done.stderr == "", done.stderr


# ---- issue 58 item 6: one clear line for what still got torch's words, a dump, or nothing ----------


@pytest.mark.parametrize("argv", [["hf:gpt2", "--input-ids", "0,128"], ["hf:gpt2", "--input-ids", "1,0"],
                                  ["layerscope.examples:tiny_gpt", "--input-ids", "0,16"],
                                  ["layerscope.examples:tiny_gpt", "--input-size", "1,16", "--dtype", "int64",
                                   "--input-ids", "1,0"]])
def test_zero_input_ids_get_the_zero_dimension_line(argv, capsys):
    # before: torch's "cannot reshape tensor of 0 elements" and a hint about meta tensors having no values
    assert main(["summary", *argv, "-q"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has a zero dimension: every count would be 0" in err, err
    assert "on meta" not in err and "Traceback" not in err


def test_zero_input_ids_refused_before_the_model_is_built(monkeypatch, capsys):
    def build(*a, **k):
        raise AssertionError("the model was built")
    monkeypatch.setattr(specs, "build_model", build)
    assert main(["summary", "hf:gpt2", "--input-ids", "0,128", "-q"]) == 1
    _one_line(capsys, "input ids (0, 128) has a zero dimension")


def test_random_bytes_as_pt_are_not_a_torch_file(tmp_path, capsys):
    # before: torch's weights_only text cut mid-sentence ("Re-running `torch.load` with `weights_only` set
    # to `False`"): advice to unpickle a file that is no model at all
    bad = tmp_path / "noise.pt"
    bad.write_bytes(bytes(range(256)) * 4)
    assert main(["summary", str(bad), "-q"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a TorchScript or torch.save file" in err, err
    assert "weights_only" not in err and "Traceback" not in err
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    assert main(["summary", str(empty), "-q"]) == 1
    _one_line(capsys, "is empty (0 bytes), not a TorchScript or torch.save file")


@pytest.mark.parametrize("value, want", [("abc", "an integer"), ("1.5", "an integer")])
def test_set_value_of_the_wrong_type_is_one_line(value, want, capsys):
    # before: two lines of transformers' StrictDataclassFieldValidationError
    assert main(["summary", "hf:gpt2", "--set", f"n_layer={value}", "-q"]) == 1
    _one_line(capsys, f"--set n_layer={value}: expected {want} (GPT2Config's n_layer is 12 by default)")


def test_set_integer_for_a_float_config_key_is_taken():
    # transformers' strict configs refused an int for a float field (--set layer_norm_epsilon=1)
    built = specs.build_model("hf:gpt2", overrides={"layer_norm_epsilon": 1, "n_layer": 1})
    assert built.model.config.layer_norm_epsilon == 1.0


def test_negative_count_for_a_user_factory_is_refused(tmp_path, capsys):
    # before: `--set n=-3` built nn.Sequential() with nothing in it and printed a table of zeros
    f = tmp_path / "fac.py"
    f.write_text("from torch import nn\n\ndef make(n=2):\n    return nn.Sequential(*[nn.Linear(4, 4) for _ in range(n)])\n"
                 "make.input_size = (1, 4)\n")
    assert main(["summary", f"{f}:make", "--set", "n=-3", "-q"]) == 1
    _one_line(capsys, f"{f}:make: --set n=-3: a count or size cannot be negative")
    assert main(["summary", f"{f}:make", "--set", "n=1", "-q"]) == 0


@pytest.mark.parametrize("argv, needle", [
    (["summary", "--columns", "params,bogus"], "unknown column 'bogus'; choose from input_shape"),
    (["memory", "--columns", "params"], "unknown column 'params'; choose from input_bytes"),
    (["profile", "--columns", "backward"], "unknown column 'backward'"),     # backward columns need --backward
    (["memory", "--limit", "abc"], "expected a memory size such as 80GiB, 40GB or 512MiB, got 'abc'"),
    (["split", "--stages", "2", "--memory-limit", "abc"], "expected a memory size such as 80GiB"),
])
def test_view_options_are_refused_before_the_model_is_built(argv, needle, monkeypatch, capsys):
    # before: refused when the report was rendered, after building and analysing the model (16 s for
    # `summary hf:gpt2-large --columns params,bogus` here, against 7 s for the interpreter's start)
    def build(*a, **k):
        raise AssertionError("the model was built")
    monkeypatch.setattr(specs, "build_model", build)
    assert main([argv[0], "layerscope.examples:small_cnn", *argv[1:], "-q"]) == 1
    _one_line(capsys, needle)


def test_interrupt_while_starting_is_one_line(monkeypatch, capsys):
    # before: a Ctrl-C while the parser was built (or torch imported) printed a KeyboardInterrupt traceback
    import layerscope.cli as cli

    def interrupted():
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert main(["summary", "layerscope.examples:small_cnn", "-q"]) == 130
    _one_line(capsys, "layerscope: interrupted")


def test_interrupt_while_importing_torch_is_one_line():
    """The console script's module (src/_layerscope_cli.py) catches a Ctrl-C while `import layerscope`
    imports torch: simulated by an import hook that raises KeyboardInterrupt at `import torch`."""
    import os
    import subprocess
    import sys
    code = ("import sys\n"
            "class Interrupt:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Interrupt())\n"
            "sys.argv = ['layerscope', 'summary', 'layerscope.examples:small_cnn', '-q']\n"
            "import _layerscope_cli\n"
            "sys.exit(_layerscope_cli.main())\n")
    src = os.path.dirname(os.path.dirname(os.path.abspath(layerscope.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 130 and done.stderr == "layerscope: interrupted\n", done.stderr
