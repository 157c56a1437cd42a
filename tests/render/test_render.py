"""JSON schema, CSV, rich (the goldens of every kind and format are in tests/reports/test_goldens.py)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import torch

import layerscope as ls
from layerscope.examples import SmallCNN, TinyGPT

@pytest.fixture(scope="module")
def cnn_report():
    torch.manual_seed(0)
    return ls.analyze(SmallCNN(), input_size=(1, 3, 32, 32))


def test_rich_table_renders(cnn_report):
    from rich.console import Console
    console = Console(record=True, width=160, file=io.StringIO())
    console.print(cnn_report.rich_table(depth=2))
    out = console.export_text()
    assert "SmallCNN" in out and "Total params" in out and "5,306" in out


def test_json_schema(cnn_report):
    data = json.loads(cnn_report.to_json())
    assert data["schema_version"] == "1.5"
    assert set(data) == {"schema_version", "kind", "model", "totals", "layers", "coverage", "context", "columns"}
    assert [c["key"] for c in data["columns"]][:3] == ["input_shape", "output_shape", "params"]
    assert data["context"][0] == {"label": "Inputs", "value": "[1, 3, 32, 32] float32", "unit": "text"}
    assert data["kind"] == "summary"  # every report kind names itself (memory, latency, stage_plan)
    for key in ("params", "trainable_params", "macs", "flops", "bytes_read", "bytes_written", "complete"):
        assert key in data["totals"]
    assert data["totals"]["macs"] == cnn_report.totals.macs
    assert len(data["layers"]) == len(cnn_report.layers)
    assert sum(layer["forward"]["macs"] for layer in data["layers"]) == data["totals"]["macs"]
    assert data["coverage"]["complete"] is True


def test_csv_rows(cnn_report, tmp_path):
    path = tmp_path / "layers.csv"
    text = cnn_report.to_csv(str(path))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(cnn_report.layers)
    assert sum(int(r["self_macs"]) for r in rows) == cnn_report.totals.macs
    assert path.read_text() == text


def test_unknown_column_is_a_clear_error(cnn_report):
    with pytest.raises(ls.InputError, match="unknown column"):
        cnn_report.table(columns="bogus")


def test_torchinfo_style_summary(capsys):
    rep = ls.summary(SmallCNN(), input_size=(1, 3, 32, 32), col_names=("input_size", "output_size",
                                                                       "num_params", "mult_adds"), depth=1)
    out = capsys.readouterr().out
    assert "Input shape" in out and "MACs" in out and "stem: Sequential" in out
    assert "0: Conv2d" not in out  # depth 1
    assert isinstance(rep, ls.Report)
    ls.summary(SmallCNN(), input_data=torch.randn(1, 3, 32, 32), verbose=0)
    assert capsys.readouterr().out == ""


def test_library_never_prints(capsys):
    ls.analyze(SmallCNN(), input_size=(1, 3, 32, 32), backward=True)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
