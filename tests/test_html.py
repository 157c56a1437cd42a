"""The HTML report: one self-contained file whose charts render in a real browser (headless
Chromium, installed by `make test`), with nothing logged to the console; and the notebook tables."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess

import pytest
import torch

import layerscope as ls
from layerscope.render.columns import footer_lines
from layerscope.examples import tiny_gpt

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
                None)


@pytest.fixture(scope="module")
def reports():
    m = tiny_gpt()
    x = torch.randint(0, 100, (2, 16))
    return (ls.analyze(m, x, backward=True), ls.memory(m, x, optimizer="adamw"),
            ls.profile(m, x, warmup=0, repeats=2, backward=True), ls.partition(m, x, stages=2))


def _browser(path: pathlib.Path, *flags: str, fragment: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--enable-logging=stderr", "--v=0", *flags, path.as_uri() + fragment],
                          capture_output=True, text=True, timeout=120)


def test_page_is_self_contained(reports, tmp_path):
    rep, mem, lat, plan = reports
    page = rep.to_html(memory=mem, latency=lat, plan=plan)
    # nothing fetched at view time: no src/href attributes at all, no URL but the SVG namespace
    assert not re.search(r"\s(src|href)\s*=", page)
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) == {"http://www.w3.org/2000/svg"}
    # every report's data is in it, and "</" inside the JSON cannot close the script early
    assert page.count("</script>") == 2
    blob = page.split('id="layerscope-data">', 1)[1].split("</script>", 1)[0]
    assert set(json.loads(blob)) == {"summary", "memory", "latency", "plan", "context", "colors", "tree", "charts"}
    assert "TinyGPT" in page and "blocks.0.mlp.0" in page
    out = tmp_path / "r.html"
    assert rep.save_html(str(out), memory=mem) == out.read_text()


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (make test installs Debian's chromium)")
def test_charts_render_in_chromium_without_console_errors(reports, tmp_path):
    rep, mem, lat, plan = reports
    path = tmp_path / "report.html"
    rep.save_html(str(path), memory=mem, latency=lat, plan=plan)
    res = _browser(path, "--dump-dom")
    dom = res.stdout
    # 4 per-layer charts (MACs, params, memory, latency) + the memory timeline + 2 stage charts
    assert 'data-rendered="7"' in dom, res.stderr[-2000:]
    assert "data-errors" not in dom
    console = [line for line in res.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console
    # the layer tree has one row per layer call, and every chart has its bars
    assert len(re.findall(r'<tr data-i="\d+"', dom)) == len(rep.layers)
    bars = [int(n) for n in re.findall(r'class="chart[^"]*"[^>]*data-bars="(\d+)"', dom)]
    assert len(bars) == 7 and all(b > 0 for b in bars)
    shot = tmp_path / "report.png"
    _browser(path, f"--screenshot={shot}", "--window-size=1400,2600")
    assert shot.stat().st_size > 20_000          # a page with charts, not a blank one
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (make test installs Debian's chromium)")
def test_each_report_alone_renders(reports, tmp_path):
    for i, r in enumerate(reports):
        path = tmp_path / f"{i}.html"
        r.save_html(str(path))
        res = _browser(path, "--dump-dom")
        assert re.search(r'data-rendered="[1-9]', res.stdout), (type(r).__name__, res.stderr[-1500:])
        assert "data-errors" not in res.stdout
        assert [line for line in res.stderr.splitlines() if "CONSOLE" in line] == []


def test_timeline_keeps_the_peak():
    from layerscope.render.html import MAX_POINTS, _slim_timeline
    n = 10 * MAX_POINTS + 7
    tl = {"categories": ["parameter", "activation", "temporary"], "step": [0] * n, "phase": ["forward"] * n,
          "markers": [], "bytes": {"parameter": [100] * n, "activation": [i % 97 for i in range(n)],
                                   "temporary": [0] * n}}
    tl["bytes"]["activation"][12_345] = 10_000          # the peak, at op 12,345
    slim = _slim_timeline(tl)
    assert len(slim["x"]) <= MAX_POINTS and 12_345 in slim["x"]
    assert slim["categories"] == ["parameter", "activation"]   # an all-zero category is left out
    assert max(a + p for a, p in zip(slim["bytes"]["activation"], slim["bytes"]["parameter"])) == 10_100


def test_notebook_tables(reports):
    for r in reports:
        html = r._repr_html_()
        assert html.startswith("<div><b>layerscope: TinyGPT</b><table>") and "<script" not in html
    rep = reports[0]
    # one body row per layer shown at depth 3, the footer's lines after them
    assert rep._repr_html_().count("<tr>") == 1 + len([r for r in rep.layers if r.depth <= 3]) + \
        len(footer_lines(rep))


def test_dataframes_when_pandas_is_there(reports):
    pd = pytest.importorskip("pandas")
    rep, mem, lat, plan = reports
    df = rep.to_dataframe()
    assert isinstance(df, pd.DataFrame) and len(df) == len(rep.layers)
    assert len(mem.to_dataframe()) == len(mem.layers) and len(plan.to_dataframe()) == 2


# ---- a model of repeated blocks, folded and charted by role -------------------------------------

class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.act, self.down = torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class _Stack(torch.nn.Module):
    def __init__(self, n: int = 6):
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block() for _ in range(n))
        self.head = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return self.head(x)


@pytest.fixture(scope="module")
def stack():
    m, x = _Stack(), torch.randn(2, 8)
    return m, x, ls.analyze(m, x)


def test_page_data_folds_repeated_blocks_for_reports_and_their_json(stack):
    from layerscope.render.html import page_data, visible_rows
    _, _, rep = stack
    data = page_data(summary=rep)
    tree = data["tree"]
    assert len(tree["rows"]) == len(rep.layers)
    (fold,) = tree["folds"]
    assert (fold["label"], fold["count"], fold["type"]) == ("layers.0-5", 6, "_Block")
    assert [tree["rows"][b]["path"] for b in fold["blocks"]] == [f"layers.{i}" for i in range(6)]
    # the first block's 4 rows stay, the other 5 blocks' 20 rows are hidden until unfolded
    assert visible_rows(tree) == len(rep.layers) - 5 * 4
    # saved JSON gives the same page data as the report object
    assert json.loads(json.dumps(page_data(summary=json.loads(rep.to_json())))) == json.loads(json.dumps(data))


def test_charts_sum_the_copies_of_a_role(stack):
    from layerscope.render.html import page_data
    _, _, rep = stack
    macs = page_data(summary=rep)["charts"][0]
    bars = {b["label"]: b for b in macs["bars"]}
    up = next(r for r in rep.layers if r.path == "layers.0.up").forward.macs
    assert bars["layers.*.up"]["count"] == 6 and bars["layers.*.up"]["each"] == up
    assert bars["layers.*.up"]["value"] == 6 * up
    # a Sequential of different layers keeps their numbers: head.0 and head.2 are two bars
    assert {"head.0", "head.2"} <= set(bars) and "head.*" not in bars
    assert "other" not in macs
    assert sum(b["value"] for b in macs["bars"]) == sum(r.forward.macs for r in rep.layers if not r.children)


def test_role_chart_keeps_the_rest_out_of_the_bars():
    from layerscope.render.html import TOP, chart_role, role_chart
    items = [(f"net.fc{i}", "Linear", 1000 - i) for i in range(TOP + 10)] + [("net.zero", "Linear", 0)]
    chart = role_chart("t", "count", items)
    assert len(chart["bars"]) == TOP and chart["bars"][0] == {"label": "net.fc0", "type": "Linear", "value": 1000,
                                                              "count": 1, "each": 1000}
    assert chart["other"] == {"roles": 10, "layers": 10, "value": sum(1000 - i for i in range(TOP, TOP + 10))}
    assert chart_role("model.layers.3.mlp.down_proj", {"model.layers"}) == "model.layers.*.mlp.down_proj"
    assert chart_role("blocks.1.mlp.2", {"blocks"}) == "blocks.*.mlp.2"
    assert chart_role("features.4", set()) == "features.4"


def test_a_timing_does_not_stop_a_fold_and_the_fold_shows_its_highest(stack):
    from layerscope.render.html import page_data
    m, x, rep = stack
    lat = ls.profile(m, x, warmup=0, repeats=2)
    tree = page_data(summary=rep, latency=lat)["tree"]
    (fold,) = tree["folds"]
    j = [c["key"] for c in tree["columns"]].index("fwd_self")
    assert tree["columns"][j]["fold"] is False
    assert fold["max"][str(j)] == max(tree["rows"][b]["v"][j] for b in fold["blocks"])


def test_first_card_and_fixed_colours(reports):
    from layerscope.capture.storage import CATEGORIES
    from layerscope.render.html import COLORS, page_data
    rep, mem, lat, plan = reports
    data = page_data(summary=rep, memory=mem, plan=plan)
    facts = dict(data["context"])
    assert facts["Inputs"] == "[2, 16] int64"
    assert facts["Optimizer"] == "AdamW" and facts["Device"] == "cpu"
    assert facts["Schedule"].startswith("1f1b, 1 micro-batch(es)") and "2 stages by flops" in facts["Schedule"]
    assert facts["Weights"] == "4 bytes per parameter"
    # one colour per category, whatever categories a run has
    assert list(data["colors"]) == list(CATEGORIES) == list(COLORS)
    assert page_data(memory=mem)["colors"] == data["colors"] and len(set(COLORS.values())) == len(CATEGORIES)


# ---- the 70B preset in a browser ---------------------------------------------------------------

@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (make test installs Debian's chromium)")
def test_llama_70b_report_is_folded_in_chromium(tmp_path):
    from layerscope.render.html import html_page
    from layerscope.specs import build_model
    built = build_model("hf:llama-2-70b", "meta", dtype="bf16")
    args, kwargs = built.default_inputs(torch.device("meta"))
    m = built.model
    summary = ls.analyze(m, *args, device="meta", **kwargs)
    mem = ls.memory(m, *args, optimizer="adamw", steps=1, **kwargs)
    plan = ls.partition(m, *args, stages=8, **kwargs)
    path = tmp_path / "llama.html"
    path.write_text(html_page(None, summary=summary, memory=mem, plan=plan))
    res = _browser(path, "--dump-dom")
    dom = res.stdout
    # 3 per-layer charts (MACs, params, memory) + the memory timeline + 2 stage charts
    assert 'data-rendered="6"' in dom, res.stderr[-2000:]
    assert "data-errors" not in dom
    assert [line for line in res.stderr.splitlines() if "CONSOLE" in line] == []
    # no chart text leaves its chart, no two labels overlap (y axis, phases, legend, bars)
    assert 'data-clipped="0"' in dom and 'data-overlaps="0"' in dom
    # the tree: a folded row, not 80 decoder rows (layer 0 keeps its own row where its memory differs)
    fold = re.search(r'<tr data-i="\d+" data-fold="(\d+)" class="fold">(.*?)</tr>', dom)
    assert fold and int(fold.group(1)) >= 79 and "LlamaDecoderLayer" in fold.group(2)
    assert re.search(r"layers\.\d-79: ", fold.group(2)) and f"x{fold.group(1)} (each)" in fold.group(2)
    rows = re.findall(r'<tr data-i="\d+"[^>]*>(.*?)</tr>', dom)
    assert len(rows) < 60 and sum("LlamaDecoderLayer" in r for r in rows) <= 2
    # charts show roles with their copies
    assert "model.layers.*.mlp.down_proj x80" in dom and "model.layers.*.self_attn.q_proj x80" in dom
    assert "other (" not in dom and "Stage 0: model.embed_tokens" in dom
    # unfolded (report.html#unfold): every decoder layer has its row
    unfolded = _browser(path, "--dump-dom", fragment="#unfold").stdout
    assert 'data-fold="' not in unfolded and 'data-errors' not in unfolded
    assert sum("LlamaDecoderLayer" in r for r in re.findall(r'<tr data-i="\d+"[^>]*>(.*?)</tr>', unfolded)) == 80
