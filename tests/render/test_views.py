"""The report objects users receive: one class per kind, complete in layerscope.reports (issue 59,
item 4; issue 32's step 4 had made them render's subclasses of the records).

The reports never import render: their views ask for render's functions by name
(``reports.base.RENDERERS``), which importing layerscope.render fills, once; every kind is a rich
renderable (``Console().print(report)`` prints the table ``rich_table()`` draws at the console's width).
"""

from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest
import torch
from rich.console import Console
from torch import nn

import layerscope as ls
from layerscope.render import views
from layerscope.reports import base, summary
from tests.reports.test_goldens import hand_made_latency

REPORTS = Path(views.__file__).parent.parent / "reports"


def _console(width: int) -> Console:
    return Console(width=width, record=True, file=io.StringIO(), color_system=None, force_terminal=False)


@pytest.fixture(scope="module")
def kinds():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(4, 8)
    rep = ls.analyze(m, x)
    return {"summary": rep, "memory": ls.memory(m, x), "latency": hand_made_latency(),
            "stage_plan": ls.partition(m, x, stages=2), "comparison": ls.compare(rep, rep)}


@pytest.mark.parametrize("kind", ["summary", "memory", "latency", "stage_plan", "comparison"])
def test_every_kind_prints_on_a_rich_console(kinds, kind):
    rep = kinds[kind]
    assert isinstance(rep, base.Views)
    printed, drawn = _console(100), _console(100)
    printed.print(rep)
    drawn.print(rep.rich_table(width=100))
    text = printed.export_text()
    assert text == drawn.export_text() and text.strip()
    assert max(len(line) for line in text.splitlines()) <= 100


def test_the_reports_never_import_render():
    for path in REPORTS.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert "render" not in (node.module or "").split("."), f"{path.name} imports render"
            if isinstance(node, ast.Import):
                assert not any("render" in a.name.split(".") for a in node.names), f"{path.name} imports render"


def test_render_fills_every_view_once():
    # importing layerscope (its root imports render) registered a function for every view, and a
    # second, different one for a view is refused rather than silently swapped in
    assert set(base.RENDERERS) == set(base.VIEWS)
    assert base.RENDERERS["text"] is views.table_text
    base.register(text=views.table_text)                         # the same function again: nothing changes
    with pytest.raises(ls.LayerscopeError, match="registered already"):
        base.register(text=lambda *a: "")
    with pytest.raises(ls.LayerscopeError, match="no report view named nope"):
        base.register(nope=views.table_text)
    assert base.RENDERERS["text"] is views.table_text


def test_a_view_without_render_says_so(kinds, monkeypatch):
    monkeypatch.delitem(base.RENDERERS, "csv")
    with pytest.raises(ls.LayerscopeError, match="'csv' view needs layerscope.render"):
        kinds["summary"].to_csv()


def test_each_kind_is_one_class_users_receive(kinds):
    rep = kinds["summary"]
    record = summary.Report(rep.trace)          # built the way the entry points build it
    assert type(record) is ls.Report and type(rep) is ls.Report
    assert record.to_dict() == rep.to_dict() and record.table() == rep.table()
    # the old homes still name the same classes
    for name in ("Report", "MemoryReport", "LatencyReport", "StagePlan", "Comparison", "ParallelReport"):
        assert getattr(views, name) is getattr(ls, name)
    for kind, cls in (("memory", ls.MemoryReport), ("latency", ls.LatencyReport), ("stage_plan", ls.StagePlan),
                      ("comparison", ls.Comparison)):
        assert type(kinds[kind]) is cls and cls.__module__.startswith("layerscope.reports.")


def test_a_comparison_has_no_html_page_and_says_so():
    # it raised "TypeError: page_data() got an unexpected keyword argument 'comparison'" (found while
    # capturing the goldens of issue 32); save_html goes through to_html
    import pytest
    import torch

    import layerscope as ls
    a = ls.analyze(torch.nn.Linear(3, 2), torch.randn(1, 3))
    c = ls.compare(a, a)
    for call in (c.to_html, lambda: c.save_html("unused.html")):
        with pytest.raises(ls.InputError, match="a comparison has no HTML page"):
            call()


def test_the_entry_points_build_the_reports_without_render():
    # issue 59: all nine api modules imported render to build the view classes; they now build the
    # reports/ classes themselves (the package root imports render, which draws them)
    api = REPORTS.parent / "api"
    for path in sorted(api.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            assert not any("render" in n.split(".") for n in names), f"api/{path.name} imports render"
