"""The report objects users receive: each kind's record plus render's views (issue 32, step 4).

No module-level renderer: the records in layerscope.reports never reach render (no import, no
registered object), and every kind is a rich renderable (``Console().print(report)`` prints the
table ``rich_table()`` draws at the console's width).
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
    assert isinstance(rep, views.Views)
    printed, drawn = _console(100), _console(100)
    printed.print(rep)
    drawn.print(rep.rich_table(width=100))
    text = printed.export_text()
    assert text == drawn.export_text() and text.strip()
    assert max(len(line) for line in text.splitlines()) <= 100


def test_no_renderer_is_registered_anywhere():
    # the seam that importing layerscope.render used to fill
    assert not hasattr(base, "_RENDERER") and not hasattr(base, "renderer") and not hasattr(base, "use_renderer")
    for path in REPORTS.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert "render" not in (node.module or "").split("."), f"{path.name} imports render"


def test_a_record_becomes_the_report_users_receive(kinds):
    rep = kinds["summary"]
    record = summary.Report(rep.trace)
    assert not hasattr(record, "to_json")
    shown = views.view(record)
    assert type(shown) is ls.Report and shown.to_dict() == rep.to_dict() and shown.table() == rep.table()
    assert views.view(rep) is rep and views.view(3) == 3


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
