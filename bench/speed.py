"""How fast is layerscope, and how fast are its peers, on the same models in one run.

  python bench/speed.py [--quick] [--no-setup] [--only MODEL,...] [--tools TOOL,...] [--sections S,...]

1. Analysis time / a plain no-grad forward, batch 1, real CPU weights, for layerscope and each peer:
   GPT-2 small, BERT base, a shrunk Llama, HF ViT-B/16, HF ResNet-50 (the models of bench/peers.py).
   The forward and the tool alternate (A B, B A, ...; bench/_timing.py); the ratio is the median of
   the per-pair ratios, with their min and max, and "UNTRUSTED" when they spread too wide. (Three
   forwards, then three tool runs, once gave FlopCounterMode 0.54x a forward under load: impossible.)
2. Module-count scaling: a deep MLP of 250 / 1,000 / 4,000 / 16,000 blocks (3 module calls each):
   time per module call, for each tool (a tool whose smaller run predicts over 90 s at the next
   size, or that fails or takes over 120 s, is not run larger).
3. Llama-2-70B on meta (seq 2048): wall time and peak RSS of a fresh process per tool (and the RSS
   the process had before the tool ran: importing torch and transformers and building the model on
   meta), every tool tried.
4. Memory simulation of a training step (AdamW): layerscope.memory() time on GPT-2 small next to the
   real step it predicts, and on Llama-2-70B on meta.

Sets up bench/.venv-peers like bench/peers.py and re-runs itself there. Writes its section of
docs/benchmarks.md and bench/results/speed.csv; prints the headline ratios at the end. A subset
(--only, --tools, --sections) prints only, leaving both files as they were.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (the models, tools and environment set-up are shared)
from _timing import no_grad, paired_ratios  # noqa: E402

RATIO_MODELS = ["GPT-2 small (S=128)", "BERT base (S=128)", "Llama shrunk (4x512, S=128)", "HF ViT-B/16 (224)",
                "HF ResNet-50 (224)"]


def ratios(pairs: int, models: list[str], tools: dict) -> list[dict]:
    rows = []
    for name in models:
        m, x, _, _ = peers.MODELS[name]()
        m.eval()
        fwd = no_grad(lambda: m(x))
        fwd()
        for tool, fn in tools.items():
            first = peers.run_one(fn, m, x)          # warm-up, and the error if it fails
            if first["error"]:
                rows.append({"section": "ratio", "model": name, "tool": tool, "seconds": None,
                             "forward_seconds": None, "ratio": None, "error": first["error"]})
                continue
            # each pair: a plain forward and one run of the tool, next to each other in time
            r = paired_ratios(fwd, lambda: peers.run_one(fn, m, x), pairs=pairs, warmup=0)
            rows.append({"section": "ratio", "model": name, "tool": tool, "seconds": r.b_median,
                         "forward_seconds": r.a_median, **r.as_row(), "error": ""})
            print(f"{name:<30} {tool:<18} {r.b_median * 1e3:9.1f} ms  {r.describe()} forward", flush=True)
    return rows


def scaling(sizes: list[int], tools: dict) -> list[dict]:
    import torch
    from torch import nn
    rows, stopped, last = [], set(), {}
    for blocks in sizes:
        torch.manual_seed(0)
        m = nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(blocks))).eval()
        x = torch.randn(8, 64)
        fwd_fn = no_grad(lambda: m(x))
        calls = 1 + 3 * blocks
        for tool, fn in tools.items():
            if tool in stopped:
                continue
            prev = sizes[sizes.index(blocks) - 1] if sizes.index(blocks) else blocks
            if last.get(tool, 0) * blocks / prev > 90:
                # at its pace on the smaller MLP this one would take over 90 s; the table says so
                rows.append({"section": "scaling", "model": f"MLP {blocks} blocks", "tool": tool, "seconds": None,
                             "forward_seconds": None, "ratio": None, "per_call_us": None,
                             "error": "not run: the smaller size predicts over 90 s"})
                stopped.add(tool)
                continue
            t = time.perf_counter()
            fwd_fn()
            fwd = time.perf_counter() - t
            r = peers.run_one(fn, m, x, seconds=120)   # guarded by the timeout; the error if it fails
            last[tool] = r["seconds"]
            if r["error"]:
                stopped.add(tool)
            secs, ratio, extra, said = r["seconds"], r["seconds"] / fwd, {}, ""
            if not r["error"] and r["seconds"] < 5:
                # cheap enough to pair three more times (forward and tool alternating); a slower tool keeps
                # its one run, next to the one forward just before it
                p = paired_ratios(fwd_fn, lambda: peers.run_one(fn, m, x, seconds=120), pairs=3, warmup=0)
                secs, fwd, ratio, extra, said = p.b_median, p.a_median, p.median, p.as_row(), p.describe()
            per = None if r["error"] else secs / calls
            rows.append({"section": "scaling", "model": f"MLP {blocks} blocks", "tool": tool,
                         "seconds": None if r["error"] else secs, "forward_seconds": fwd,
                         "ratio": None if r["error"] else ratio, **extra, "per_call_us": per and per * 1e6,
                         "error": r["error"]})
            print(f"MLP {blocks:>6} blocks {tool:<18} " + (f"{per * 1e6:8.1f} us per module call  "
                  f"{said or f'{ratio:.2f}x (1 run)'} forward" if per else r["error"]), flush=True)
    return rows


_META_CHILD = r"""
import json, sys, time, warnings, logging, io, contextlib
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
sys.path.insert(0, sys.argv[2])
import torch, peers, transformers as T
T.logging.set_verbosity_error()
cfg = T.LlamaConfig(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                    intermediate_size=28672, vocab_size=32000, max_position_embeddings=4096)
with torch.device("meta"):
    model = peers.wrap(T.LlamaForCausalLM(cfg), "input_ids", "logits")
x = torch.empty(1, 2048, dtype=torch.long, device="meta")
def hwm():   # this process's peak RSS (VmHWM belongs to the address space exec made: no parent in it)
    line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024
before = hwm()
r = peers.run_one(peers.TOOLS[sys.argv[1]], model, x, seconds=300)
r["rss_before"], r["peak_rss"] = before, hwm()
print(json.dumps(r))
"""


def meta_llama(tools: dict) -> list[dict]:
    rows = []
    here = os.path.dirname(os.path.abspath(__file__))
    for tool in tools:
        p = subprocess.Popen([sys.executable, "-c", _META_CHILD, tool, here], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
        out, _ = p.communicate()
        try:
            r = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            r = {"seconds": None, "macs": None, "error": f"process exited with status {p.returncode}"}
        rss = r.get("peak_rss")
        rows.append({"section": "meta-70b", "model": "Llama-2-70B on meta (S=2048)", "tool": tool,
                     "seconds": None if r["error"] else r["seconds"], "peak_rss": rss,
                     "rss_before": r.get("rss_before"), "macs": r.get("macs"), "error": r["error"]})
        print(f"llama-2-70b meta  {tool:<18} " + (f"{r['seconds']:7.2f} s  peak RSS {rss / 2**30:5.2f} GiB "
              f"(before the tool {r['rss_before'] / 2**30:.2f})  MACs {peers._g(r['macs'], 4)}"
              if not r["error"] else r["error"][:90]), flush=True)
    return rows


def memory_sim() -> list[dict]:
    import torch

    import layerscope as ls
    rows = []
    m, x, _, _ = peers.MODELS["GPT-2 small (S=128)"]()
    m.train()
    opt = torch.optim.AdamW(m.parameters())

    def real_step():
        out = m(x)
        out.float().sum().backward()
        opt.step()
        opt.zero_grad()
    r = paired_ratios(real_step, lambda: ls.memory(m, x, optimizer="adamw", steps=1), pairs=3, warmup=1)
    sim, step = r.b_median, r.a_median
    rows.append({"section": "memory", "model": "GPT-2 small (S=128), AdamW step", "tool": "layerscope",
                 "seconds": sim, "forward_seconds": step, **r.as_row(), "error": ""})
    print(f"memory() GPT-2 small training step: {sim:.2f} s simulated vs {step:.2f} s real step "
          f"({r.describe()})", flush=True)

    import transformers as T
    cfg = T.LlamaConfig(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                        intermediate_size=28672, vocab_size=32000, max_position_embeddings=4096)
    with torch.device("meta"):
        big = T.LlamaForCausalLM(cfg)
    ids = torch.empty(1, 2048, dtype=torch.long, device="meta")
    t = time.perf_counter()
    rep = ls.memory(big, input_ids=ids, optimizer="adamw", steps=1)
    secs = time.perf_counter() - t
    rows.append({"section": "memory", "model": "Llama-2-70B on meta (S=2048), AdamW step", "tool": "layerscope",
                 "seconds": secs, "forward_seconds": None, "ratio": None, "error": "",
                 "peak_bytes": rep.peak_bytes})
    print(f"memory() Llama-2-70B on meta, AdamW step: {secs:.2f} s, predicted peak {rep.peak_bytes / 2**30:.1f} GiB",
          flush=True)
    return rows


def write(rows: list[dict], seconds: float, command: str) -> None:
    import torch
    out = peers.ROOT / "bench" / "results" / "speed.csv"
    out.parent.mkdir(exist_ok=True)
    fields = sorted({k for r in rows for k in r}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    tools = list(peers.TOOLS)
    lines = ["## Speed", "", f"Produced by `{command}` on {datetime.date.today().isoformat()}: {os.cpu_count()} CPU "
             f"cores ({platform.machine()}), torch {torch.__version__}, {torch.get_num_threads()} threads; the run "
             f"took {seconds:.0f} s. Raw rows: `bench/results/speed.csv`.", "",
             "### Analysis time / a plain forward (batch 1, real weights)", "",
             "Median of the per-pair ratios, the forward and the tool alternating (`bench/_timing.py`); "
             "\"?\" marks a ratio whose pairs spread too wide to trust (max/min over 1.5 or IQR over 20%).", "",
             "| model | forward | " + " | ".join(tools) + " |", "|---|---:|" + "---:|" * len(tools)]
    for name in RATIO_MODELS:
        sub = {r["tool"]: r for r in rows if r["section"] == "ratio" and r["model"] == name}
        if not sub:
            continue
        fwd = next(iter(sub.values()))["forward_seconds"]
        cells = [f"{sub[t]['ratio']:.2f}x" + ("" if sub[t].get("ratio_trustworthy", True) else "?")
                 if t in sub and sub[t]["ratio"] else "error" for t in tools]
        lines.append(f"| {name} | {fwd * 1e3:.1f} ms | " + " | ".join(cells) + " |")
    lines += ["", "### Time per module call, deep MLP (µs; 3 module calls per block)", "",
              "| blocks | " + " | ".join(tools) + " |", "|---:|" + "---:|" * len(tools)]
    for size in sorted({r["model"] for r in rows if r["section"] == "scaling"}, key=lambda s: int(s.split()[1])):
        sub = {r["tool"]: r for r in rows if r["section"] == "scaling" and r["model"] == size}
        cells = [f"{sub[t]['per_call_us']:.1f}" if t in sub and sub[t]["per_call_us"] else
                 ("not run" if t in sub and sub[t]["error"].startswith("not run") else
                  "error" if t in sub else "--") for t in tools]
        lines.append(f"| {size.split()[1]} | " + " | ".join(cells) + " |")
    lines += ["", "### Llama-2-70B on meta (S = 2048), a fresh process per tool", "",
              "| tool | seconds | peak RSS | RSS before the tool | MACs | error |", "|---|---:|---:|---:|---:|---|"]
    for r in (r for r in rows if r["section"] == "meta-70b"):
        secs = "--" if r["seconds"] is None else f"{r['seconds']:.2f}"
        before = "--" if r.get("rss_before") is None else f"{r['rss_before'] / 2**30:.2f} GiB"
        peak = "--" if r.get("peak_rss") is None else f"{r['peak_rss'] / 2**30:.2f} GiB"
        lines.append(f"| {r['tool']} | {secs} | {peak} | {before} | "
                     f"{peers._g(r['macs'], 4)} | {r['error'][:80]} |")
    lines += ["", "### Memory simulation of a training step (AdamW)", ""]
    for r in (r for r in rows if r["section"] == "memory"):
        extra = f" ({r['ratio']:.2f}x the real step's {r['forward_seconds']:.2f} s)" if r.get("ratio") else \
            (f", predicted peak {r['peak_bytes'] / 2**30:.1f} GiB" if r.get("peak_bytes") else "")
        lines.append(f"- {r['model']}: {r['seconds']:.2f} s{extra}")
    peers.write_section("speed", lines)


def headline(rows: list[dict], tools: dict, written: bool = True) -> None:
    print("\nheadline:")
    for tool in tools:
        rs = [r["ratio"] for r in rows if r["section"] == "ratio" and r["tool"] == tool and r["ratio"]]
        meta = next((r for r in rows if r["section"] == "meta-70b" and r["tool"] == tool), None)
        sc = [r for r in rows if r["section"] == "scaling" and r["tool"] == tool and r["per_call_us"]]
        m = f"meta 70B {meta['seconds']:.1f} s / {meta['peak_rss'] / 2**30:.2f} GiB" if meta and meta["seconds"] \
            else ("meta 70B: fails" if meta else "")
        s = f"{sc[-1]['per_call_us']:.0f} us/call at {sc[-1]['model'].split()[1]} blocks" if sc else ""
        untrusted = sum(1 for r in rows if r["section"] == "ratio" and r["tool"] == tool and r["ratio"]
                        and not r.get("ratio_trustworthy", True))
        flag = f" ({untrusted} of {len(rs)} untrusted)" if untrusted else ""
        print(f"  {tool:<18} median {statistics.median(rs):5.2f}x forward{flag}  {s:<28} {m}" if rs else
              f"  {tool:<18} (no ratio)  {m}")
    print("written: docs/benchmarks.md (speed section), bench/results/speed.csv" if written else
          "a subset (--only/--tools/--sections): docs/benchmarks.md and bench/results/speed.csv left as they were")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repeat, MLPs up to 1,000 blocks, no 70B")
    ap.add_argument("--no-setup", action="store_true", help="run in the current environment")
    ap.add_argument("--only", help="comma-separated models of part 1 (name prefixes)")
    ap.add_argument("--tools", help="comma-separated tool names")
    ap.add_argument("--sections", help="comma-separated parts: ratio, scaling, meta, memory")
    ap.add_argument("--pairs", type=int, help="forward/tool pairs per ratio (default 5, 3 with --quick)")
    ns = ap.parse_args()
    if not ns.no_setup:
        peers.setup_and_reexec(os.path.abspath(__file__))
    warnings.filterwarnings("ignore")
    import logging
    logging.disable(logging.WARNING)
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    t0 = time.time()
    tools = {k: v for k, v in peers.TOOLS.items() if not ns.tools or k in ns.tools.split(",")}
    models = [k for k in RATIO_MODELS if not ns.only or any(k.startswith(o) for o in ns.only.split(","))]
    sections = ns.sections.split(",") if ns.sections else ["ratio", "scaling", "meta", "memory"]
    warm_m, warm_x, _, _ = peers.tied()
    for fn in tools.values():
        peers.run_one(fn, warm_m, warm_x)
    rows = []
    if "ratio" in sections:
        rows += ratios(ns.pairs or (3 if ns.quick else 5), models, tools)
    if "scaling" in sections:
        rows += scaling([250, 1000] if ns.quick else [250, 1000, 4000, 16000], tools)
    if "meta" in sections and not ns.quick:
        rows += meta_llama(tools)
    if "memory" in sections and not ns.quick:
        rows += memory_sim()
    if ns.only or ns.tools or ns.sections:
        headline(rows, tools, written=False)    # a subset would overwrite the published tables with part of them
        return
    write(rows, time.time() - t0, "python bench/speed.py" + (" --quick" if ns.quick else ""))
    headline(rows, tools)


if __name__ == "__main__":
    main()
