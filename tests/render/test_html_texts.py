"""The HTML page formats no number in its script: the shown texts (cards, the memory timeline's
axis and sentence, the pipeline's texts, coverage lines) come written by render/units.py, the
terminal's styles, in the page's data (page_schema 2)."""

from __future__ import annotations

import re
from importlib import resources

from layerscope.render.html import PAGE_SCHEMA, page_data
from layerscope.render.html.texts import cards, coverage_texts, memory_axis, memory_sentence, plan_texts
from layerscope.render.units import decimals, fmt, percent


def test_the_script_formats_no_number():
    js = resources.files("layerscope.render.html").joinpath("report.html").read_text(encoding="utf-8")
    for name in ("toFixed", "toLocaleString", "toPrecision", "toExponential", "Intl.", "Math.round"):
        assert name not in js, name
    # the old formatters (si, iec, ms, count) are gone, and no other function is defined in their place
    assert not re.search(r"function\s+(si|iec|ms|count|fmt|format\w*)\s*\(", js)


def test_units_percent_and_decimals():
    # 0.175 -> 17.5 (one decimal, the terminal's bubble); 1.162715 -> 1.163 (three, its imbalance)
    assert percent(0.175, 1) == "17.5%" and percent(None) == "--"
    assert decimals(1.162715003226802, 3) == "1.163" and decimals(None, 3) == "--"
    assert fmt("percent", 0.0123) == "1.23%"          # the "percent" unit as before: two decimals


def _memory(peak, breakdown, training=True, steps=2):
    return {"peak_bytes": peak, "breakdown": breakdown, "steps": [{}] * steps,
            "model": {"options": {"training": training}}}


def test_cards_as_the_terminal_writes_them():
    summary = {"totals": {"params": 1_234_567, "shared_params": 1000, "macs": 999, "flops": 2_500_000_000,
                          "backward": {"macs": 0, "flops": 0}, "bytes_read": 1024, "bytes_written": 512}}
    latency = {"totals": {"runs": 5, "forward_instrumented": 0.009, "forward_plain": 0.0085}}
    plan = {"stages": [{}, {}, {}], "imbalance": 1.0625, "by": "flops", "schedule": "1f1b",
            "timeline": {"step_time": 1.5, "bubble": 0.25}}
    got = cards(summary, _memory(3 * 2 ** 30, {}), latency, plan)
    assert got == [
        # 1,234,567 / 1e6 = 1.23 M; every digit with separators under it; 1,000 shared
        ["Parameters", "1.23 M", "1,234,567 (1,000 shared)"],
        # 999 stays 999 (below 1 K); 2.5e9 / 1e9 = 2.50 G; no backward card when its MACs are 0
        ["Forward MACs", "999", "FLOPs 2.50 G"],
        # 1024 + 512 = 1536 B = 1.50 KiB
        ["Bytes moved", "1.50 KiB", "read 1.00 KiB, written 512 B"],
        ["Peak memory", "3.00 GiB", "2 step(s), training"],
        # the uninstrumented time where there is one: 0.0085 s = 8.50 ms
        ["Forward time", "8.50 ms", "median of 5 repeats"],
        ["Stages", "3", "bottleneck / ideal 1.062"],       # 1.0625 is a tie: Python rounds it to even
        ["Step time", "1.50 s", "predicted, 1f1b, bubble 25.0%"]]
    # a backward run: its time under the forward's
    both = {"totals": {"runs": 2, "forward_instrumented": 2e-4, "backward_instrumented": 2.5}}
    assert cards(None, None, both, None) == [["Forward time", "200.0 us", "backward 2.50 s"]]


def test_memory_axis_and_sentence():
    # stacked per point: 1024+3072 = 4096 is the highest; ticks at 0, 1/4 .. 1 of 4096 B = 0 .. 4 KiB
    tl = {"x": [0, 5], "categories": ["parameter", "activation"], "ops": 9,
          "bytes": {"parameter": [1024, 1024], "activation": [0, 3072]}}
    assert memory_axis(tl) == {"top": 4096, "ticks": ["0 B", "1.00 KiB", "2.00 KiB", "3.00 KiB", "4.00 KiB"]}
    assert memory_axis({"x": [0], "categories": ["parameter"], "bytes": {"parameter": [0]}})["top"] == 1
    # 8320 B = 8.125 KiB exactly: "8.12 KiB", as the terminal's "At the peak" line writes it (the
    # old script's toFixed wrote 8.13); zero categories left out, underscores as spaces
    mem = _memory(12416, {"parameter": 4096, "buffer": 0, "optimizer_state": 8320})
    assert memory_sentence(mem, tl) == ("Peak 12.12 KiB (parameter 4.00 KiB, optimizer state 8.12 KiB); 9 ops, "
                                        "2 points drawn (the highest of each bucket kept).")


def test_plan_texts():
    plan = {"schedule": "interleaved", "microbatches": 4, "by": "roofline",
            "timeline": {"step_time": 2.17e-3, "pipeline_time": 2.0e-3, "busy": [1.53e-3, 2.06e-3], "bubble": 0.175,
                         "blocks": [[0, 0, "F", 0, 0, 1], [0, 2, "F", 0, 1, 2], [1, 1, "F", 0, 1, 2],
                                    [1, 3, "B", 0, 2, 3]]}}
    got = plan_texts(plan)
    assert got["heading"] == "Pipeline stages (interleaved, 4 micro-batches, by roofline)"
    assert got["timeline_text"] == {
        "step": "2.17 ms", "pipeline": "2.00 ms", "busy": ["1.53 ms", "2.06 ms"],
        "ranks": ["rank 0 (stages 0,2)", "rank 1 (stages 1,3)"],
        "sentence": "Step time 2.17 ms predicted: pipeline 2.00 ms, bubble 17.5%; busy per rank 1.53 ms, 2.06 ms."}
    assert "timeline_text" not in plan_texts({**plan, "timeline": None})


def test_coverage_texts():
    cov = {"uncounted": [{"op": "aten.foo", "count": 3, "layers": ["a", "b"]}, {"op": "aten.bar", "count": 1}],
           "uncalled_modules": ["x", "y"]}
    assert coverage_texts(cov) == {"uncounted": ["aten.foo \u00d73 in a, b", "aten.bar \u00d71"],
                                   "uncalled": "Modules never called (2): x, y"}
    assert coverage_texts({"uncounted": [], "uncalled_modules": []}) == {"uncounted": [], "uncalled": None}


def test_page_data_is_versioned():
    data = page_data(latency={"model": {"name": "m", "options": {}}, "totals": {"runs": 1}, "notes": [],
                              "layers": [], "context": []})
    assert data["page_schema"] == PAGE_SCHEMA == 3
    assert data["cards"] == [["Forward time", "--", "median of 1 repeats"]]
