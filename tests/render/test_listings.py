"""The listings as report kinds (issue 32, step 4): the presets and a pipeline run's table print
exactly what the CLI and ``RunResult.table()`` print today, and export like every kind."""

from __future__ import annotations

import io
import json

import pytest
import torch
from rich.console import Console
from torch import nn

import layerscope as ls
from layerscope.render import text as text_mod
from layerscope.reports.listings import PresetList, RunTable
from layerscope.render.units import si
from layerscope.reports.listings import RankRun
from layerscope.specs import presets
from layerscope.torchrun import RunResult


def test_presets_print_what_list_presets_prints():
    rows = presets()
    body = [[f"hf:{k}", v["model"], si(v["params"]), ", ".join(f"{n}={'x'.join(map(str, s))}"
                                                               for n, s in v["inputs"].items()), v["description"]]
            for k, v in rows.items()]
    footer = [("Presets", f"{len(body)}, built on meta by default (nothing allocated); --set changes any "
                          "config field, --input-ids the sequence")]
    listing = PresetList(rows)
    assert listing.table() == text_mod.text_table(["Spec", "Model", "Params", "Default inputs", "Description"],
                                                  body, footer)
    d = json.loads(listing.to_json())
    assert d["kind"] == "presets" and [p["name"] for p in d["presets"]] == [f"hf:{k}" for k in rows]
    assert listing.to_csv().splitlines()[0] == "index,model,params,default_inputs,description"
    console = Console(width=250, record=True, file=io.StringIO(), color_system=None)
    console.print(listing)
    assert "hf:" in console.export_text()


@pytest.fixture(scope="module")
def run():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    plan = ls.partition(m, torch.randn(4, 8), stages=2, microbatches=2)
    ranks = tuple({"rank": r, "stages": [r], "times": [1.2e-3, 1.0e-3, 1.1e-3], "busy": [0.5e-3, 0.4e-3, 0.6e-3],
                   "peak_bytes": 3_000_000 + 250_000 * r, "predicted_bytes": 2_900_000 + 310_000 * r}
                  for r in range(2))
    return RunResult(plan=plan, ranks=ranks, reference=(1.5, 1.4), losses=(1.5, 1.4000001), path="export")


def test_run_table_prints_what_the_run_prints(run):
    # RunResult.table() is the RunTable kind's text (tests/goldens/run_table holds main's bytes)
    table = run.run_table()
    assert isinstance(table, RunTable) and table.table() == run.table()
    assert [r.rank for r in table.ranks] == [0, 1] and table.when == "median"
    d = table.to_dict()
    assert d["kind"] == "run" and d["ranks"][1]["error"] == pytest.approx(3_210_000 / 3_250_000 - 1)
