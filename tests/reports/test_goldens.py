"""Every report kind in every text format against its golden: the terminal at 80 and 120 columns,
plain text, CSV, JSON, the DataFrame (columns, dtypes and values), the data the HTML page embeds
(not the page, whose template may change) and the memory timeline
(tests/goldens/<kind>/<case>.<format>). A missing golden fails; write it with
``pytest --update-goldens`` and read the diff before committing it. A golden may change only with a
schema-version bump, noted.

The terminal goldens are the proof that numbers are never cut: every line fits the width, and every
number of the plain text (which is never narrowed) appears whole in the terminal views.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import torch
from rich.console import Console
from torch import nn

import layerscope as ls
from layerscope.analyses.latency import LatencyLayer, Timing
from layerscope.examples import SmallCNN, TinyGPT

# the probed kernels' scratch differs from CPU to CPU: goldens count it 0 (conftest.py)
pytestmark = pytest.mark.usefixtures("machine_independent_kernels")

GOLDENS = Path(__file__).parent.parent / "goldens"


def check_golden(name: str, text: str, update: bool) -> None:
    path = GOLDENS / name
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    if not path.exists():
        pytest.fail(f"no golden {path.relative_to(GOLDENS.parent)}: run pytest --update-goldens and review it")
    assert text == path.read_text(encoding="utf-8"), f"{name} differs from its golden"


def terminal(rep, width: int, **view) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None, force_terminal=False)
    console.print(rep.rich_table(width=width, **view))
    return console.export_text()


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(4))
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


def _t(ms: float) -> Timing:
    s = ms / 1e3
    return Timing(median=s, p25=0.9 * s, p75=1.1 * s, min=0.8 * s, max=1.3 * s)


def hand_made_latency() -> ls.LatencyReport:
    """A profile with known times (no timing run): a root, four identical blocks with one child
    each (times differ a little, so a fold shows their median), and a head."""
    rows = [("", "Net", 0, None, (1, 3, 5, 7, 9, 10), 9.0, 0.5, 4096)]
    for b, ms in enumerate((2.0, 2.2, 1.8, 2.1)):
        rows.append((f"blocks.{b}", "Block", 1, 0, (2 + 2 * b,), ms, 0.2, 1024))
        rows.append((f"blocks.{b}.fc", "Linear", 2, 1 + 2 * b, (), ms - 0.2, ms - 0.2, 1024))
    rows.append(("head", "Linear", 1, 0, (), 0.4, 0.4, 512))
    layers = []
    for i, (path, typ, depth, parent, children, inc, own, params) in enumerate(rows):
        layers.append(LatencyLayer(
            index=i, path=path, type=typ, depth=depth, call_index=0, parent=parent,
            children=tuple(c for c in children if c < len(rows)), params=params,
            input_shapes=((8, 32),), output_shapes=((8, 32),), forward=_t(inc), forward_self=_t(own),
            backward=None, backward_self=None, flops=2 * 8 * params, bytes_moved=4 * (params + 512)))
    totals = {"runs": 5, "forward_instrumented": 9.0e-3, "forward_self_sum": 9.0e-3, "forward_spread": 0.05,
              "forward_plain": 8.5e-3, "forward_overhead": 0.0588}
    return ls.LatencyReport(model_name="Net", device="cpu",
                            options={"warmup": 2, "repeats": 5, "backward": False, "unit": "repeat"},
                            layers=tuple(layers), totals=totals)


@pytest.fixture(scope="module")
def reports():
    torch.manual_seed(0)
    gpt = TinyGPT(layers=4)
    ids = torch.randint(0, 1000, (2, 32), generator=torch.Generator().manual_seed(0))
    summary = ls.analyze(gpt, ids, backward=True)
    torch.manual_seed(0)
    small = ls.analyze(SmallCNN(), input_size=(1, 3, 32, 32))
    mlp = _MLP()
    memory = ls.memory(mlp, torch.randn(8, 16), optimizer="adamw")
    plan = ls.partition(gpt, ids, stages=2, microbatches=2, optimizer="adamw")
    other = ls.analyze(TinyGPT(layers=3), ids)
    comparison = ls.compare(summary, other, names=("tiny_gpt_4", "tiny_gpt_3"))
    return {"summary": summary, "summary_cnn": small, "memory": memory, "latency": hand_made_latency(),
            "stage_plan": plan, "comparison": comparison}


VIEWS = {
    "summary": {"columns": "input_shape,output_shape,params,macs,flops,backward_macs"},
    "summary_cnn": {"columns": "input_shape,output_shape,params,params_percent,kernel,macs,flops,bytes_read,"
                               "bytes_written,trainable,receptive_field"},
}
KINDS = ["summary", "summary_cnn", "memory", "latency", "stage_plan", "comparison"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("width", [80, 120])
def test_terminal(reports, kind, width, update_goldens):
    rep = reports[kind]
    text = terminal(rep, width, **VIEWS.get(kind, {}))
    check_golden(f"{kind}/terminal_{width}.txt", text, update_goldens)
    assert max(len(line) for line in text.splitlines()) <= width
    for cells in number_cells(text):
        assert not any("…" in c for c in cells), f"a number was cut: {cells}"


@pytest.mark.parametrize("kind", KINDS)
def test_text(reports, kind, update_goldens):
    check_golden(f"{kind}/table.txt", reports[kind].table(**VIEWS.get(kind, {})), update_goldens)


@pytest.mark.parametrize("kind", KINDS)
def test_csv(reports, kind, update_goldens):
    check_golden(f"{kind}/table.csv", reports[kind].to_csv(), update_goldens)


@pytest.mark.parametrize("kind", KINDS)
def test_json(reports, kind, update_goldens):
    rep = reports[kind]
    d = rep.to_dict(timeline=False) if kind == "memory" else rep.to_dict()
    check_golden(f"{kind}/report.json", json.dumps(d, indent=1, sort_keys=True) + "\n", update_goldens)


def test_onnx_nodes(update_goldens, tmp_path):
    pytest.importorskip("onnx")
    torch.manual_seed(0)
    path = tmp_path / "cnn.onnx"
    with torch.no_grad():
        torch.onnx.export(SmallCNN().eval(), (torch.randn(1, 3, 32, 32),), dynamo=True).save(str(path))
    graph = ls.analyze_onnx(str(path)).graph
    check_golden("onnx_nodes/table.txt", graph.table(), update_goldens)
    check_golden("onnx_nodes/table.csv", graph.to_csv(), update_goldens)


def dataframe_text(df) -> str:
    """A DataFrame as its golden sees it: every column's dtype, then every value (CSV)."""
    return "dtypes:\n" + df.dtypes.to_string() + "\n\n" + df.to_csv()


@pytest.mark.parametrize("kind", KINDS)
def test_dataframe(reports, kind, update_goldens):
    pytest.importorskip("pandas")
    check_golden(f"{kind}/dataframe.txt", dataframe_text(reports[kind].to_dataframe()), update_goldens)


_DATA = re.compile(r'<script type="application/json" id="layerscope-data">(.*?)</script>', re.S)


def html_data(page: str) -> str:
    """The JSON the page embeds (what its script draws from), indented, keys sorted."""
    found = _DATA.findall(page)
    assert len(found) == 1, "the page embeds its data once"
    return json.dumps(json.loads(found[0]), indent=1, sort_keys=True) + "\n"


# the kinds that have an HTML page (a comparison has none)
HTML_KINDS = ["summary", "summary_cnn", "memory", "latency", "stage_plan"]


@pytest.mark.parametrize("kind", HTML_KINDS)
def test_html_data(reports, kind, update_goldens):
    check_golden(f"{kind}/html_data.json", html_data(reports[kind].to_html()), update_goldens)


def test_html_data_of_one_page_with_every_part(reports, update_goldens):
    """Summary, memory, latency and stage plan on one page (the context card, the shared tree with
    one column per part, every chart), as ``layerscope report`` builds it; the latency's layers do
    not match the summary's, so its column shows ``--``."""
    page = reports["summary"].to_html(memory=reports["memory"], latency=reports["latency"],
                                      plan=reports["stage_plan"], title="every part")
    check_golden("page/html_data.json", html_data(page), update_goldens)


def test_html_data_from_saved_json(reports, update_goldens, tmp_path, capsys):
    """``layerscope report a.json b.json -o page.html``: the page built from saved JSON reports embeds
    the same data as one built from the report objects."""
    from layerscope.cli import main
    paths = []
    for kind in ("summary_cnn", "memory"):
        paths.append(str(tmp_path / f"{kind}.json"))
        reports[kind].to_json(paths[-1])
    out = tmp_path / "page.html"
    assert main(["report", *paths, "-o", str(out)]) == 0
    text = html_data(out.read_text(encoding="utf-8"))
    check_golden("page/html_data_saved.json", text, update_goldens)
    assert text == html_data(reports["summary_cnn"].to_html(memory=reports["memory"]))


def test_html_memory_timeline_is_cut_keeping_the_peaks(reports, update_goldens, tmp_path):
    """A saved memory report whose timeline has more points than the page keeps (5,000 ops, made up
    from the real one's categories): the page's timeline is cut to its buckets' highest points."""
    from layerscope.cli import main
    d = reports["memory"].to_dict(timeline=True)
    tl = d["timeline"]
    n = 5000
    tl["bytes"] = {c: [(i * (7 + k) * 7919) % 100_003 if k % 2 == 0 else 0 for i in range(n)]
                   for k, c in enumerate(tl["categories"])}
    tl["step"] = [1 + 2 * i // n for i in range(n)]
    tl["phase"] = [("forward", "backward", "optimizer")[(3 * i // n)] for i in range(n)]
    src = tmp_path / "memory.json"
    src.write_text(json.dumps(d), encoding="utf-8")
    out = tmp_path / "page.html"
    assert main(["report", str(src), "-o", str(out)]) == 0
    page = json.loads(html_data(out.read_text(encoding="utf-8")))
    check_golden("memory/html_timeline_cut.json", json.dumps(page["memory"]["timeline"], sort_keys=True) + "\n",
                 update_goldens)


def test_memory_timeline(reports, update_goldens):
    """The memory timeline of the training step (every op's live bytes per category, the phases and
    step markers) as the JSON carries it."""
    d = reports["memory"].to_dict(timeline=True)
    check_golden("memory/timeline.json", json.dumps(d["timeline"], indent=1, sort_keys=True) + "\n",
                 update_goldens)


def number_cells(text: str):
    """The cells right of the name column, per table row of a terminal view (from the right: as many
    as the header has columns after the first)."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if "━" in line)
    n = len(re.split(r"\s{2,}", lines[rule - 1].strip())) - 1
    for line in lines[rule + 1:]:
        if not line.strip():
            break
        yield re.split(r"\s{2,}", line.strip())[-n:]


def test_every_number_of_the_text_is_whole_at_80_columns(reports):
    """What the 80-column terminal shows of each row, it shows whole: each of its cells is a cell
    of the unnarrowed plain text."""
    for kind in KINDS:
        rep = reports[kind]
        wide = rep.table(**VIEWS.get(kind, {}))
        cells = {c.strip() for line in wide.splitlines() for c in re.split(r"\s{2,}", line) if c.strip()}
        for row in number_cells(terminal(rep, 80, **VIEWS.get(kind, {}))):
            for cell in row:
                assert cell in cells, (kind, cell, row)
