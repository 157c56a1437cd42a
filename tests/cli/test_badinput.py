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
