"""How much slower is layerscope.analyze() than a plain forward pass? Prints ratios; asserts nothing.

  python bench/bench_analyze.py [--quick] [--only gpt2,mlp,...] [--pairs N] [--threads N] [--no-flop]

Each ratio is the median of per-pair ratios, the plain forward and analyze() alternating (A B, B A,
...; bench/_timing.py), with their min and max; "UNTRUSTED" marks one whose spread is too wide.
torch.utils.flop_counter.FlopCounterMode (the closest thing torch has) is timed the same way
alongside, in pairs of its own with the plain forward (--no-flop leaves it out).

1. analyze() time / plain no-grad forward time, batch 1, real CPU weights: GPT-2 small (seq 128),
   ViT-B/16 (224), HF ResNet-50 (224). Target (issue 24): <= 1.15x on GPT-2 and ResNet-50, and
   below FlopCounterMode's ratio.
2. A deep MLP of 64-wide blocks (Linear + ReLU in a Sequential: 3 module calls and 3 ops each) at
   250, 1,000, 4,000 and 16,000 blocks: analyze()'s extra time per module call, (analyze - forward)
   / calls from the medians, and the paired ratio. Target: <= 20 us extra per call, flat within
   1.2x from 250 to 16,000 blocks. Beside it, torch's own floor for a tool built on module hooks
   and a dispatch mode: empty hooks on every module and an empty TorchDispatchMode, nothing else.
3. Llama-2-70B shape on meta (hidden 8192, 80 layers, 64 heads, 8 KV heads, intermediate 28672,
   vocab 32000, seq 2048): wall time and peak RSS of a fresh process. Target <= 10 s, <= 1.5 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
from torch import nn

import layerscope as ls

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import no_grad, paired_ratios  # noqa: E402  (bench/ is not a package)

FLOP = True   # time FlopCounterMode alongside (main() sets it from --no-flop)


def _flop_counter(fn):
    """``fn`` (a no-grad forward) under torch's FlopCounterMode, the peer analyze() is held against."""
    from torch.utils.flop_counter import FlopCounterMode

    def run():
        with FlopCounterMode(display=False):
            fn()
    return run


def _flop_row(fwd, pairs: int, calls: int | None = None) -> tuple[dict, str]:
    """FlopCounterMode / the forward, paired; the row's fields and a few words to print."""
    if not FLOP:
        return {}, ""
    f = paired_ratios(fwd, _flop_counter(fwd), pairs=pairs, warmup=1)
    row = {"flop_s": f.b_median, **f.as_row("flop_ratio")}
    text = f"   FlopCounterMode {f.describe()}"
    if calls:
        row["flop_extra_us"] = (f.b_median - f.a_median) / calls * 1e6
        text += f" ({row['flop_extra_us']:.1f} us extra per call)"
    return row, text


def _ratio(name: str, model: nn.Module, args: tuple, kwargs: dict, pairs: int) -> dict:
    model.eval()
    fwd = no_grad(lambda: model(*args, **kwargs))
    r = paired_ratios(fwd, lambda: ls.analyze(model, *args, **kwargs), pairs=pairs, warmup=1)
    rep = ls.analyze(model, *args, **kwargs)
    row = {"model": name, "forward_s": r.a_median, "analyze_s": r.b_median, **r.as_row(),
           "gmacs": rep.totals.macs / 1e9, "ops": len(rep.trace.ops), "calls": len(rep.layers)}
    flop, flop_text = _flop_row(fwd, pairs)
    row.update(flop)
    f = paired_ratios(fwd, _torch_floor(model, fwd), pairs=pairs, warmup=1)
    row.update(f.as_row("floor_ratio"))
    flop_text += f"   torch's empty hooks + dispatch mode {f.describe()}"
    print(f"{name:<14} forward {r.a_median * 1e3:8.1f} ms   analyze {r.b_median * 1e3:8.1f} ms   "
          f"ratio {r.describe()}{flop_text}   {row['gmacs']:.2f} GMACs, {row['ops']} ops, "
          f"{row['calls']} module calls", flush=True)
    return row


def real_models(pairs: int, only=None) -> list[dict]:
    import transformers as T
    torch.manual_seed(0)
    rows = []
    for name, make, x in (("gpt2-small", lambda: T.GPT2Model(T.GPT2Config()),
                           lambda: torch.randint(0, 50257, (1, 128))),
                          ("vit-b16", lambda: T.ViTModel(T.ViTConfig()), lambda: torch.randn(1, 3, 224, 224)),
                          ("resnet50-hf", lambda: T.ResNetModel(T.ResNetConfig()),  # defaults are ResNet-50
                           lambda: torch.randn(1, 3, 224, 224))):
        if only is None or any(name.startswith(o) for o in only):
            model = make()
            rows.append(_ratio(name, model, (x(),), {}, pairs))
            del model
    return rows


def _torch_floor(model: nn.Module, fn):
    """``fn`` with what any hook-and-dispatch tool pays before doing anything: an empty forward pre-hook
    and forward hook on every module (installed and removed per run, as analyze() does) and an empty
    TorchDispatchMode that passes every op through."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Empty(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def pre(mod, args):
        return None

    def post(mod, args, out):
        return None

    def run():
        handles = []
        for m in model.modules():
            handles.append(m.register_forward_pre_hook(pre))
            handles.append(m.register_forward_hook(post))
        try:
            with Empty():
                fn()
        finally:
            for h in handles:
                h.remove()
    return run


def deep_mlp(blocks_list: list[int], pairs: int) -> list[dict]:
    rows = []
    for blocks in blocks_list:
        torch.manual_seed(0)
        model = nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(blocks)))
        x = torch.randn(8, 64)
        plain = no_grad(lambda: model(x))
        r = paired_ratios(plain, lambda: ls.analyze(model, x), pairs=pairs, warmup=1)
        fwd, ana = r.a_median, r.b_median
        calls = 1 + 3 * blocks
        extra = (ana - fwd) / calls * 1e6
        flop, flop_text = _flop_row(plain, pairs, calls)
        # torch's own floor for any tool built on module hooks and a dispatch mode
        f = paired_ratios(plain, _torch_floor(model, plain), pairs=pairs, warmup=1)
        floor = (f.b_median - f.a_median) / calls * 1e6
        flop_text += f"   torch's empty hooks + dispatch mode {f.describe()} ({floor:.1f} us extra per call)"
        rows.append({"blocks": blocks, "forward_s": fwd, "analyze_s": ana, "per_call_us": ana / calls * 1e6,
                     "extra_per_call_us": extra, **r.as_row(), **flop, "floor_extra_us": floor,
                     **f.as_row("floor_ratio")})
        print(f"mlp {blocks:>5} blocks  forward {fwd * 1e3:8.1f} ms   analyze {ana * 1e3:8.1f} ms   "
              f"{extra:6.1f} us extra per module call (target <= 20)   ratio {r.describe()}{flop_text}", flush=True)
        del model
    first, last = rows[0]["extra_per_call_us"], rows[-1]["extra_per_call_us"]
    # the sizes ran at different times, so this quotient of medians is not paired; the ratio to the forward
    # (which grows linearly with the blocks too) is, and tells the same story with the load divided out
    print(f"extra time per call {blocks_list[-1]} vs {blocks_list[0]} blocks: {last / first:.2f}x (target <= 1.2x); "
          f"analyze/forward {rows[-1]['ratio'] / rows[0]['ratio']:.2f}x")
    return rows


_LLAMA_CHILD = r"""
import json, resource, sys, time, torch
import transformers as T
import layerscope as ls
cfg = T.LlamaConfig(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                    intermediate_size=28672, vocab_size=32000, max_position_embeddings=4096)
t0 = time.perf_counter()
with torch.device("meta"):
    model = T.LlamaForCausalLM(cfg)
t1 = time.perf_counter()
rep = ls.analyze(model, torch.empty(1, 2048, dtype=torch.long, device="meta"))
t2 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"build_s": t1 - t0, "analyze_s": t2 - t1, "peak_rss": rss, "params": rep.totals.params,
                  "tmacs": rep.totals.macs / 1e12, "complete": rep.totals.complete}))
"""


def llama70b() -> dict:
    out = subprocess.run([sys.executable, "-c", _LLAMA_CHILD], capture_output=True, text=True, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"llama-2-70b meta  build {row['build_s']:.2f} s   analyze {row['analyze_s']:.2f} s   peak RSS "
          f"{row['peak_rss'] / 2**30:.2f} GiB (whole process)   {row['params'] / 1e9:.2f} B params   "
          f"{row['tmacs']:.1f} TMACs   complete={row['complete']}", flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer pairs, smaller MLPs")
    p.add_argument("--pairs", type=int, help="forward/analyze pairs per ratio (default 5, 3 with --quick)")
    p.add_argument("--only", help="comma-separated parts: gpt2, vit, resnet, mlp, llama")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--threads", type=int, help="torch threads (default: every core). On a shared machine 1 "
                   "keeps a busy neighbour from stalling the kernels' thread pool, which no ratio survives")
    p.add_argument("--no-flop", action="store_true", help="leave FlopCounterMode out")
    ns = p.parse_args()
    global FLOP
    FLOP = not ns.no_flop
    torch.set_num_threads(ns.threads or max(1, os.cpu_count() or 1))
    pairs = ns.pairs or (3 if ns.quick else 5)
    only = ns.only.split(",") if ns.only else None
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {pairs} pairs per ratio")
    real = [o for o in only if o not in ("mlp", "llama")] if only else None
    results = {"real": real_models(pairs, real) if real is None or real else [],
               "mlp": deep_mlp([250, 1000] if ns.quick else [250, 1000, 4000, 16000], pairs)
               if only is None or "mlp" in only else [],
               "llama70b": llama70b() if only is None or "llama" in only else None}
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
