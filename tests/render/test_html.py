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
    data = json.loads(blob)
    assert {"summary", "memory", "latency", "plan", "context", "charts", "tree"} <= set(data)
    # the tree holds the terminal's cells (same columns, units, folding); the charts group roles
    assert [r[1] for r in data["tree"]["folded"]][:2] == ["TinyGPT", "├─tok: Embedding"]
    assert data["tree"]["headers"][:3] == ["Layer (type)", "Output shape", "Params"]
    assert any(b["label"] == "blocks.*.mlp.0 x2" for b in data["charts"][0][1]["bars"])
    assert ["Inputs", "[2, 16] int64"] in data["context"] and "TinyGPT" in page
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
    # the layer tree has one row per layer call (two blocks do not fold), and every chart has its bars
    assert len(re.findall(r'<tr data-depth="\d+"', dom)) == len(rep.layers)
    bars = [int(n) for n in re.findall(r'class="chart[^"]*"[^>]*data-bars="(\d+)"', dom)]
    assert len(bars) == 7 and all(b > 0 for b in bars)
    # the page's own check: no chart text leaves its chart, no two chart texts overlap
    assert 'data-clipped="0"' in dom and 'data-overlaps="0"' in dom
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
        # a profile's title ends with a warning where its real timings spread widely (issue 58)
        assert html.startswith("<div><b>layerscope") and "<script" not in html
        assert "TinyGPT</b><table>" in html or "TinyGPT -- UNRELIABLE TIMES: " in html
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


@pytest.fixture(scope="module")
def llama70b_page(tmp_path_factory):
    """The page of Llama-2-70B (the preset, on meta: nothing allocated), its summary and an 8-stage
    plan made from it."""
    from layerscope.specs import build_model
    built = build_model("hf:llama-2-70b", "meta")
    args, kwargs = built.default_inputs(torch.device("meta"))
    rep = ls.analyze(built.model, *args, **kwargs)
    plan = ls.partition(rep, stages=8)
    path = tmp_path_factory.mktemp("llama") / "llama-2-70b.html"
    rep.save_html(str(path), plan=plan)
    return rep, path


def test_70b_page_is_folded_and_grouped(llama70b_page):
    """Issue 19: the tree folds the 80 decoder layers as the terminal does, and the charts sum the 80
    copies of each role instead of ranking 560 near-identical leaves."""
    rep, path = llama70b_page
    data = json.loads(path.read_text().split('id="layerscope-data">', 1)[1].split("</script>", 1)[0])
    folded = [r[1] for r in data["tree"]["folded"]]
    assert "│   ├─layers.0-79: LlamaDecoderLayer x80 (each)" in folded
    assert sum("LlamaDecoderLayer" in n for n in folded) == 1 and len(folded) < 40
    assert len(data["tree"]["full"]) == len(rep.layers) > 900
    # the same cells as the terminal's table at the same columns
    text = rep.table()
    assert all(cell in text for row in data["tree"]["folded"][:8] for cell in row[2:])
    macs = data["charts"][0][1]["bars"]
    assert macs[0]["label"].endswith("x80") and len(macs) <= 20 and data["charts"][0][1]["rest"] is None
    assert ["Inputs", "[1, 4096] int64"] in data["context"] and ["Model dtype", "float32"] in data["context"]
    assert data["plan"]["bars"][0]["label"].startswith("stage 0: ")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (make test installs Debian's chromium)")
def test_70b_page_renders_in_chromium(llama70b_page):
    rep, path = llama70b_page
    res = _browser(path, "--dump-dom")
    dom = res.stdout
    assert re.search(r'data-rendered="[1-9]', dom) and "data-errors" not in dom, res.stderr[-1500:]
    assert [line for line in res.stderr.splitlines() if "CONSOLE" in line] == []
    names = re.findall(r'<td class="name">([^<]*)</td>', dom)       # the rows drawn
    assert [n for n in names if "LlamaDecoderLayer" in n] == ["│   ├─layers.0-79: LlamaDecoderLayer x80 (each)"]
    assert re.search(r"<text[^>]*>model.layers.\*.mlp.down_proj x80</text>", dom)
    assert 'data-clipped="0"' in dom and 'data-overlaps="0"' in dom
    # report.html#unfold: every block has its row, the first unfolded like the others
    full = _browser(path, "--dump-dom", fragment="#unfold").stdout
    assert "data-errors" not in full and "Fold repeated blocks" in full
    names = re.findall(r'<td class="name">([^<]*)</td>', full)
    assert sum(n.endswith(": LlamaDecoderLayer") for n in names) == 80 and not any("(each)" in n for n in names)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (make test installs Debian's chromium)")
@pytest.mark.slow
def test_70b_training_memory_page_in_chromium(tmp_path):
    """Issue 19: the memory timeline of a 70B training step: its y labels are not clipped, its phase
    labels do not overlap and none is lost (the one-op loss phase does not hide backward)."""
    from layerscope.specs import build_model
    # use_cache off, as a training loop runs it: the blocks then compose (capture/blocks.py) and the step
    # is simulated in about 1 s, not 7 (each block writing its own cache slot is simulated block by block)
    built = build_model("hf:llama-2-70b", "meta", dtype="bf16", overrides={"use_cache": False})
    args, kwargs = built.default_inputs(torch.device("meta"))
    rep = ls.analyze(built.model, *args, **kwargs)
    mem = ls.memory(built.model, *args, optimizer="adamw", steps=1, **kwargs)
    path = tmp_path / "llama-2-70b-memory.html"
    rep.save_html(str(path), memory=mem)
    res = _browser(path, "--dump-dom")
    dom = res.stdout
    assert 'data-rendered="4"' in dom and "data-errors" not in dom, res.stderr[-1500:]
    assert [line for line in res.stderr.splitlines() if "CONSOLE" in line] == []
    assert 'data-clipped="0"' in dom and 'data-overlaps="0"' in dom
    phases = re.findall(r'<text[^>]*class="muted phase"[^>]*>([^<]*)</text>', dom)
    assert phases == ["forward", "loss", "backward", "optimizer"]
    axis = re.findall(r'<text[^>]*class="muted axis"[^>]*>([^<]*)</text>', dom)
    assert len(axis) == 5 and all(re.fullmatch(r"\d+(\.\d\d)? (B|KiB|MiB|GiB|TiB)", a) for a in axis), axis
    # one colour per category, the same as on every page
    fills = dict(re.findall(r'<path d="[^"]*" fill="(#[0-9a-f]{6})"[^>]*data-category="(\w+)"', dom))
    cats = {c: f for f, c in fills.items()}
    assert cats["parameter"] == _category_colors()["parameter"] and len(set(cats.values())) == len(cats)
    # the tree is folded (layer 0 keeps its own row where its memory differs from the others')
    names = re.findall(r'<td class="name">([^<]*)</td>', dom)
    assert len(names) < 60 and any(re.search(r"layers\.[01]-79: LlamaDecoderLayer x(79|80) \(each\)", n) for n in names)


def _category_colors() -> dict[str, str]:
    from importlib import resources
    page = resources.files("layerscope.render.html").joinpath("report.html").read_text()
    body = re.search(r"var CATEGORY_COLORS = \{(.*?)\};", page, re.S).group(1)
    return dict(re.findall(r'(\w+): "(#[0-9a-f]{6})"', body))


def test_every_memory_category_has_its_own_fixed_colour():
    from layerscope.capture.storage import CATEGORIES
    colors = _category_colors()
    assert set(CATEGORIES) <= set(colors) and len(set(colors.values())) == len(colors)


# ---- page_data without a browser: folding and roles on a small model of repeated blocks ----------

class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.act, self.down = torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class _Stack(torch.nn.Module):
    """6 identical blocks, a Sequential of different layers, and 24 differently named heads."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block() for _ in range(6))
        self.mix = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8))
        self.heads = torch.nn.ModuleDict({f"h{i}": torch.nn.Linear(8, i + 1) for i in range(24)})

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        x = self.mix(x)
        return [h(x) for h in self.heads.values()]


@pytest.fixture(scope="module")
def stack():
    return ls.analyze(_Stack(), torch.randn(2, 8))


def test_page_data_folds_blocks_and_sums_roles(stack):
    from layerscope.render.html import TOP, page_data
    data = page_data(summary=stack)
    names = [r[1] for r in data["tree"]["folded"]]
    assert sum("layers.0-5: _Block x6 (each)" in n for n in names) == 1
    assert not any(n.endswith("layers.1: _Block") for n in names)
    assert len(data["tree"]["full"]) == len(stack.layers) == len(names) + 5 * 4
    chart = data["charts"][0][1]                                    # forward MACs per role
    bars = {b["label"]: b["value"] for b in chart["bars"]}
    up = next(r for r in stack.layers if r.path == "layers.0.up").forward.macs
    assert bars["layers.*.up x6"] == 6 * up
    # a Sequential's different layers are not one role
    assert "mix.0" in bars and "mix.2" in bars and not any(k.startswith("mix.*") for k in bars)
    # 24 heads + 2 block roles + 2 mix layers: the 20 largest are bars, the rest a note, not a bar
    assert len(chart["bars"]) == TOP and chart["rest"]["roles"] == 28 - TOP and chart["rest"]["layers"] == 28 - TOP
    assert not any("other" in b["label"] for b in chart["bars"])
    drawn = sum(b["value"] for b in chart["bars"])
    assert drawn < sum(r.forward.macs for r in stack.layers if not r.children)


def test_page_data_is_the_same_from_a_report_and_its_saved_json(stack):
    from layerscope.render.html import page_data
    assert page_data(summary=json.loads(stack.to_json())) == page_data(summary=stack)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (make test installs Debian's chromium)")
def test_plan_schedule_timeline_renders(tmp_path):
    # interleaved, 4 stages on 2 ranks, 4 micro-batches: 2 x 4 x 4 = 32 forward and backward blocks
    m = tiny_gpt()
    plan = ls.partition(m, torch.randint(0, 1000, (8, 32)), stages=4, microbatches=4, by="roofline",
                        roofline=(1e11, 1e10), schedule="interleaved")
    path = tmp_path / "plan.html"
    plan.save_html(str(path))
    res = _browser(path, "--dump-dom")
    dom = res.stdout
    assert re.search(r'class="chart schedule"[^>]*data-blocks="32"', dom), res.stderr[-1500:]
    assert len(re.findall(r'data-kind="F"', dom)) == 16 and len(re.findall(r'data-kind="B"', dom)) == 16
    assert "rank 1 (stages 1,3)" in dom and "Step time" in dom
    assert "data-errors" not in dom and 'data-clipped="0"' in dom and 'data-overlaps="0"' in dom
    assert [line for line in res.stderr.splitlines() if "CONSOLE" in line] == []


@pytest.fixture(scope="module")
def searched():
    """A search on 2 H100s (tp 1, the checkpointing modes) with a limit between the plans: fsdp 2 with full
    or selective-op checkpointing at micro-batch 2 fits (136,871,424 B at its peak, the whole simulation's,
    parallel() without the search; the search's copies had extended it to 136,792,576, and selective-op's
    to 136,817,152, which the limit of 136,810,000 once split: its candidates are composed since issue 61,
    exact), no checkpointing does not (137,547,264 B), nor context parallel 2 (137,617,920 B)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    with torch.device("meta"):
        m = LlamaForCausalLM(cfg)
    ids = torch.zeros((1, 32), dtype=torch.long, device="meta")
    return ls.parallel(m, ids, gpus=2, gpu="H100", memory_limit=137_000_000, search=True, global_batch=4, pp=1,
                       tp=1, search_limit=None)


@pytest.mark.slow
def test_parallel_page_data(searched):
    """The sharded-training section reads the report's JSON: the same from the report and its saved
    file; the chosen plan's roles with their parts, the step's parts, the plans fitting first."""
    from layerscope.render.html import page_data
    data = page_data(parallel=searched)
    assert page_data(parallel=json.loads(searched.to_json())) == data
    q, p = data["parallel"], searched.plan
    assert q["heading"] == "Sharded training: 2 GPUs: " + p.label
    # each role's parts are the simulated rank's breakdown, adding up to its peak
    (role,) = q["roles"]
    assert role["label"] == "ranks 0-1" and sum(role["parts"].values()) == role["value"] == p.peak_bytes
    # the step's parts are timing's, in the order the step sums them: compute, the host's wait,
    # TP's collectives, the exposed data-parallel communication (no pipeline here: nothing left over)
    t = p.timing
    want = [(name, t[k]) for k, name in (("compute", "compute"), ("host_wait", "GPU waiting for the host"),
                                         ("tp_comm", "TP communication"),
                                         ("exposed_comm", "exposed data-parallel/pipeline communication")) if t[k]]
    assert [(x["label"], x["value"]) for x in q["step"]["parts"]] == want
    assert sum(x["value"] for x in q["step"]["parts"]) == pytest.approx(p.step_time, rel=1e-12)
    # the plans: those that fit by step time, then the misses by their excess; the first is the chosen
    rows = q["plans"]["rows"]
    fits = [r for r in rows if r["fits"]]
    assert rows[:len(fits)] == fits and fits[0]["label"] == searched.search["candidates"][0]["label"]
    assert fits[0]["step"] == p.step_time
    assert [r["step"] for r in fits] == sorted(r["step"] for r in fits)
    misses = [r for r in rows if not r["fits"]]
    assert misses and all(r["label"].startswith("tp 1") and "ac full, mbs 2 x 1 acc" not in r["label"]
                          for r in misses)
    assert all(r["over"] > 0 and r["status"].startswith("over by") for r in misses)
    assert q["limit"] == 137_000_000 and any(c[0] == "Plans that fit" for c in data["cards"])
    # after --run, the run's own figures under the prediction
    d = json.loads(searched.to_json())
    d["plans"][0]["measured"] = {"loss_equal": True, "max_rel_loss_diff": 2e-4, "step_time": 0.0123,
                                 "ranks": [{"peak_bytes": 3 << 20}, {"peak_bytes": 5 << 19}]}
    assert page_data(parallel=d)["parallel"]["measured"] == (
        "Run for real: losses equal one process (largest relative difference 2.0e-04); step 12.30 ms; "
        "peaks rank 0 3.00 MiB, rank 1 2.50 MiB.")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (make test installs Debian's chromium)")
@pytest.mark.slow
def test_parallel_page_renders_in_chromium(searched, tmp_path):
    """`parallel --format html` and `report` of its saved JSON: the plans, the chosen plan's ranks and
    its step drawn, every chart text inside its chart and none over another."""
    from layerscope.cli import main
    path = tmp_path / "parallel.html"
    searched.save_html(str(path))
    res = _browser(path, "--dump-dom")
    dom = res.stdout
    assert 'data-rendered="3"' in dom, res.stderr[-1500:]
    assert re.search(r'class="chart plans"[^>]*data-bars="\d+"', dom) and 'class="chart ranks"' in dom
    assert "data-errors" not in dom and 'data-clipped="0"' in dom and 'data-overlaps="0"' in dom
    assert [line for line in res.stderr.splitlines() if "CONSOLE" in line] == []
    saved = tmp_path / "p.json"
    searched.to_json(str(saved))
    out = tmp_path / "again.html"
    assert main(["report", str(saved), "-o", str(out)]) == 0
    assert out.read_text() == path.read_text()
