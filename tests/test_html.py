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
from layerscope.examples import tiny_gpt

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
                None)


@pytest.fixture(scope="module")
def reports():
    m = tiny_gpt()
    x = torch.randint(0, 100, (2, 16))
    return (ls.analyze(m, x, backward=True), ls.memory(m, x, optimizer="adamw"),
            ls.profile(m, x, warmup=0, repeats=2, backward=True), ls.partition(m, x, stages=2))


def _browser(path: pathlib.Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--enable-logging=stderr", "--v=0", *flags, path.as_uri()],
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
    assert set(json.loads(blob)) == {"summary", "memory", "latency", "plan"}
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
        assert html.startswith("<div><b>layerscope") and "TinyGPT</b><table>" in html and "<script" not in html
    rep = reports[0]
    # one body row per layer shown at depth 3, the context's and the footer's lines around them
    t = rep.table_model(3)
    assert rep._repr_html_().count("<tr>") == 1 + len([r for r in rep.layers if r.depth <= 3]) + \
        len(t.footer) + len(t.context)


def test_dataframes_when_pandas_is_there(reports):
    pd = pytest.importorskip("pandas")
    rep, mem, lat, plan = reports
    df = rep.to_dataframe()
    assert isinstance(df, pd.DataFrame) and len(df) == len(rep.layers)
    assert len(mem.to_dataframe()) == len(mem.layers) and len(plan.to_dataframe()) == 2
