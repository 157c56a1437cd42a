"""layerscope next to the tools people use, on the same models, in one run: params, MACs, FLOPs,
seconds and errors, against references derived by hand.

  python bench/peers.py [--only MODEL,...] [--tools TOOL,...] [--no-setup]

Sets up its own environment first (bench/.venv-peers: torch 2.13.0 CPU, the peers pinned in
bench/requirements-peers.txt, this package) and re-runs itself there. Writes docs/benchmarks.md and
bench/results/peers.csv, and prints the headline at the end.

Every tool gets the same module: a wrapper that takes one tensor and returns one tensor (the HF
models' logits or last hidden state), so the differences below are in counting, not in calling.
A tool's "MACs" is what it reports as multiply-accumulates (fvcore's "flops" and thop's "ops" are
MACs by their own documentation; FlopCounterMode reports FLOPs = 2 x MACs of the contractions only).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import datetime
import io
import os
import pathlib
import platform
import signal
import subprocess
import sys
import time
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]
VENV = ROOT / "bench" / ".venv-peers"
REQS = ROOT / "bench" / "requirements-peers.txt"


def setup_and_reexec(script: str = __file__) -> None:
    """Build bench/.venv-peers once (again when the requirements change), then run ``script`` in it."""
    py = VENV / "bin" / "python"
    stamp = VENV / ".installed"
    want = REQS.read_text()
    if not (stamp.exists() and stamp.read_text() == want):
        print(f"setting up {VENV.relative_to(ROOT)} (torch 2.13.0 CPU + peers); once", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run(pip + ["torch==2.13.0"], check=True)
        subprocess.run(pip + ["-r", str(REQS), "-e", str(ROOT)], check=True)
        stamp.write_text(want)
    os.execv(str(py), [str(py), script, "--no-setup", *sys.argv[1:]])


# ---- models and their hand-derived references ---------------------------------------------------

def _hf(config_cls, model_cls, **cfg):
    import transformers as T
    return getattr(T, model_cls)(getattr(T, config_cls)(**cfg)).eval()


def wrap(model, key: str, out: str):
    """One tensor in, one tensor out, for every tool alike (torch is imported late: this file first
    runs outside the benchmark environment, to set it up)."""
    import torch.nn as nn

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return getattr(self.model(**{key: x}), out)

    return Wrapped()


def gpt2():
    import torch
    m = wrap(_hf("GPT2Config", "GPT2LMHeadModel"), "input_ids", "logits")
    # S = 128 tokens. Per layer: qkv 768*2304 + proj 768*768 + fc 768*3072 + proj 3072*768
    # = 7,077,888 MACs per token; attention Q.K^T and P.V: 2 * S^2 * 768. The LM head: S * 768 * 50,257.
    # 12 * (128 * 7,077,888 + 2 * 128^2 * 768) + 128 * 38,597,376 = 11,173,625,856 + 4,940,464,128
    return m, torch.randint(0, 50257, (1, 128)), 16_114_089_984, 124_439_808


def bert():
    import torch
    m = wrap(_hf("BertConfig", "BertModel"), "input_ids", "last_hidden_state")
    # S = 128: 12 * (128 * (4 * 768^2 + 2 * 768 * 3072) + 2 * 128^2 * 768) + pooler 768^2 (one token)
    # = 12 * (905,969,664 + 25,165,824) + 589,824; params as published for bert-base-uncased
    return m, torch.randint(0, 30522, (1, 128)), 11_174_215_680, 109_482_240


def llama():
    import torch
    m = wrap(_hf("LlamaConfig", "LlamaForCausalLM", hidden_size=512, intermediate_size=1376,
                 num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8, vocab_size=32000,
                 tie_word_embeddings=False), "input_ids", "logits")
    # S = 128, h = 512, I = 1376: per layer q,k,v,o 4 * 512^2 + MLP 3 * 512 * 1376 = 3,162,112 per
    # token, attention 2 * S^2 * 512; head S * 512 * 32,000.
    # 4 * (128 * 3,162,112 + 2 * 16,384 * 512) + 128 * 16,384,000 = 1,686,110,208 + 2,097,152,000
    # params: 2 * 32,000 * 512 + 4 * (4 * 512^2 + 3 * 512 * 1376 + 2 * 512) + 512 = 45,421,056
    return m, torch.randint(0, 32000, (1, 128)), 3_783_262_208, 45_421_056


def vit():
    import torch
    m = wrap(_hf("ViTConfig", "ViTForImageClassification", num_labels=1000), "pixel_values", "logits")
    # 196 patches of 3*16*16 -> 768: 196 * 768 * 768 = 115,605,504; S = 197 tokens, per layer
    # 197 * 7,077,888 + 2 * 197^2 * 768 = 1,453,954,560, x 12 = 17,447,454,720; classifier on the
    # class token 768 * 1000 = 768,000. Total 17,563,828,224; params 86,567,656 (google/vit-base-patch16-224)
    return m, torch.randn(1, 3, 224, 224), 17_563_828_224, 86_567_656


def _resnet50_macs() -> int:
    # every conv's Cout * Cin * k * k * Hout * Wout, at 224 x 224: stem 7x7/2 to 112, pool to 56
    macs = 64 * 3 * 49 * 112 * 112
    cin, hw = 64, 56
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            s = stride if b == 0 else 1
            out_hw = hw // s
            macs += width * cin * hw * hw                          # 1x1 reduce (HF: stride on the 3x3)
            macs += width * width * 9 * out_hw * out_hw            # 3x3
            macs += 4 * width * width * out_hw * out_hw            # 1x1 expand
            if b == 0:
                macs += 4 * width * cin * out_hw * out_hw          # projection shortcut
            cin, hw = 4 * width, out_hw
    return macs + 2048 * 1000                                     # classifier


def resnet():
    import torch
    m = wrap(_hf("ResNetConfig", "ResNetForImageClassification", num_labels=1000), "pixel_values", "logits")
    return m, torch.randn(1, 3, 224, 224), _resnet50_macs(), 25_557_032


def cnn_transpose():
    import torch
    import torch.nn as nn
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1),
                      nn.ReLU(), nn.Conv2d(8, 3, 3, padding=1))
    # conv 16*3*9 * 32^2 = 442,368; transposed conv Cin*Cout*k^2 per input pixel 16*8*16 * 32^2 =
    # 2,097,152; conv 3*8*9 * 64^2 = 884,736. Params 448 + 2,056 + 219
    return m, torch.randn(1, 3, 32, 32), 3_424_256, 2_723


def _lstm_net():
    import torch.nn as nn

    class LSTMNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(32, 64, batch_first=True)
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            return self.fc(self.lstm(x)[0][:, -1])
    return LSTMNet()


def lstm():
    import torch
    # per step 4 gates * 64 * (32 + 64) = 24,576, x 20 steps = 491,520; fc 640.
    # params 4*64*(32+64) + 2*4*64 (two biases) + 650 = 24,576 + 512 + 650
    return _lstm_net(), torch.randn(1, 20, 32), 492_160, 25_738


def _tied_net():
    import torch.nn as nn

    class TiedReused(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 32)
            self.mix = nn.Linear(32, 32)
            self.head = nn.Linear(32, 100)
            self.head.weight = self.emb.weight              # tied

        def forward(self, ids):
            return self.head(self.mix(self.mix(self.emb(ids))))   # mix reused
    return TiedReused()


def tied():
    import torch
    # 16 tokens: mix twice 2 * 16*32*32 = 32,768; head 16*32*100 = 51,200.
    # params: embedding 3,200 (the head's weight is the same tensor) + mix 1,056 + head bias 100
    return _tied_net(), torch.randint(0, 100, (1, 16)), 83_968, 4_356


MODELS = {"GPT-2 small (S=128)": gpt2, "BERT base (S=128)": bert, "Llama shrunk (4x512, S=128)": llama,
          "HF ViT-B/16 (224)": vit, "HF ResNet-50 (224)": resnet, "CNN + ConvTranspose": cnn_transpose,
          "LSTM (T=20)": lstm, "tied + reused": tied}


# ---- tools: each returns (params, macs, flops) with None where the tool does not say --------------

def t_layerscope(m, x):
    import layerscope as ls
    r = ls.analyze(m, x)
    return r.totals.params, r.totals.macs, r.totals.flops


def t_torchinfo(m, x):
    import torchinfo
    s = torchinfo.summary(m, input_data=[x], verbose=0)
    return s.total_params, s.total_mult_adds, None


def t_fvcore(m, x):
    from fvcore.nn import FlopCountAnalysis, parameter_count
    fca = FlopCountAnalysis(m, (x,))
    fca.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    return parameter_count(m)[""], int(fca.total()), None


def _ptflops(backend):
    def run(m, x):
        from ptflops import get_model_complexity_info
        macs, params = get_model_complexity_info(m, tuple(x.shape), input_constructor=lambda _: x,
                                                 as_strings=False, print_per_layer_stat=False,
                                                 backend=backend)
        return params, macs, None
    return run


def t_thop(m, x):
    from thop import profile
    macs, params = profile(copy.deepcopy(m), inputs=(x,), verbose=False)   # thop adds buffers to the model
    return int(params), int(macs), None


def t_calflops(m, x):
    from calflops import calculate_flops
    flops, macs, params = calculate_flops(m, args=[x], print_results=False, print_detailed=False,
                                          output_as_string=False)
    return params, macs, flops


def t_deepspeed(m, x):
    from deepspeed.profiling.flops_profiler import get_model_profile
    flops, macs, params = get_model_profile(m, args=[x], print_profile=False, as_string=False)
    return params, macs, flops


def t_flopcounter(m, x):
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as f:
        m(x)
    flops = f.get_total_flops()
    return None, flops // 2, flops


TOOLS = {"layerscope": t_layerscope, "torchinfo": t_torchinfo, "fvcore": t_fvcore,
         "ptflops (pytorch)": _ptflops("pytorch"), "ptflops (aten)": _ptflops("aten"), "thop": t_thop,
         "calflops": t_calflops, "DeepSpeed": t_deepspeed, "FlopCounterMode": t_flopcounter}


class _Timeout(BaseException):
    pass


def _alarm(*_):
    raise _Timeout()


def run_one(tool, m, x, seconds=300):
    import torch
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    try:
        with torch.no_grad(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            params, macs, flops = tool(m, x)
        said = [ln for ln in (out.getvalue() + err.getvalue()).splitlines() if ln.strip()]
        # ptflops catches its own failures, prints them and returns None
        error = "" if macs is not None else "returned no count" + (f": {said[-1][:80]}" if said else "")
        return {"params": params, "macs": macs, "flops": flops, "seconds": time.perf_counter() - t0, "error": error}
    except _Timeout:
        return {"params": None, "macs": None, "flops": None, "seconds": seconds, "error": "timeout"}
    except Exception as e:
        msg = str(e).splitlines()[0][:100] if str(e) else ""
        return {"params": None, "macs": None, "flops": None, "seconds": time.perf_counter() - t0,
                "error": f"{type(e).__name__}: {msg}"}
    finally:
        signal.alarm(0)


def _g(v, digits=3):
    if v is None:
        return "--"
    for unit, k in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(v) >= k:
            return f"{v / k:.{digits}g} {unit}" if v / k < 1000 else f"{v / k:.0f} {unit}"
    return str(int(v))


def _err(v, ref):
    if v is None or not ref:
        return "--"
    e = 100.0 * (v - ref) / ref
    return "exact" if v == ref else f"{e:+.2f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated model names (prefixes)")
    ap.add_argument("--tools", help="comma-separated tool names")
    ap.add_argument("--no-setup", action="store_true", help="run in the current environment")
    ns = ap.parse_args()
    if not ns.no_setup:
        setup_and_reexec()
    warnings.filterwarnings("ignore")
    import logging
    logging.disable(logging.WARNING)
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    models = {k: v for k, v in MODELS.items() if not ns.only or any(k.startswith(o) for o in ns.only.split(","))}
    tools = {k: v for k, v in TOOLS.items() if not ns.tools or k in ns.tools.split(",")}
    warm_m, warm_x, _, _ = tied()
    for fn in tools.values():               # imports and first-call setup are not what is timed
        run_one(fn, warm_m, warm_x)
    rows = []
    t_all = time.time()
    for name, make in models.items():
        m, x, ref_macs, ref_params = make()
        m.eval()
        with torch.no_grad():
            m(x)
            t0 = time.perf_counter()
            m(x)
            plain = time.perf_counter() - t0
        for tool, fn in tools.items():
            r = run_one(fn, m, x)
            rows.append({"model": name, "tool": tool, **r, "ref_macs": ref_macs, "ref_params": ref_params,
                         "forward_seconds": plain})
            print(f"{name:<30} {tool:<18} params {_g(r['params']):>9} MACs {_g(r['macs']):>9} "
                  f"({_err(r['macs'], ref_macs):>8}) {r['seconds']:7.2f} s {r['error'][:60]}", flush=True)
    if ns.only or ns.tools:
        # a subset would overwrite the published tables with part of them
        headline(rows, tools, written=False)
        return
    out_csv = ROOT / "bench" / "results" / "peers.csv"
    out_csv.parent.mkdir(exist_ok=True)
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    write_markdown(rows, models, tools, time.time() - t_all)
    headline(rows, tools)


def _versions(tools) -> str:
    from importlib import metadata
    names = {"torchinfo": "torchinfo", "fvcore": "fvcore", "ptflops (pytorch)": "ptflops", "thop": "thop",
             "calflops": "calflops", "DeepSpeed": "deepspeed", "layerscope": "layerscope"}
    out = []
    for t in tools:
        if t in names:
            try:
                out.append(f"{names[t]} {metadata.version(names[t])}")
            except metadata.PackageNotFoundError:
                pass
    return ", ".join(out)


def write_markdown(rows, models, tools, seconds) -> None:
    import torch
    lines = ["## Accuracy: layerscope next to its peers", "",
             f"Produced by `python bench/peers.py` on {datetime.date.today().isoformat()}: "
             f"{os.cpu_count()} CPU cores ({platform.machine()}), torch {torch.__version__}, Python "
             f"{platform.python_version()}; {_versions(tools)}. The run took {seconds:.0f} s. Raw rows: "
             "`bench/results/peers.csv`.", "",
             "Every tool got the same module (one tensor in, one tensor out) at batch 1. **MACs** is what each "
             "tool reports as multiply-accumulates (FlopCounterMode's FLOPs / 2); the reference is derived by "
             "hand in `bench/peers.py`, next to each model. An error is the tool's exception.", ""]
    for name in models:
        sub = [r for r in rows if r["model"] == name]
        ref_m, ref_p = sub[0]["ref_macs"], sub[0]["ref_params"]
        lines += [f"### {name}", "", f"Reference: **{ref_m:,} MACs**, **{ref_p:,} parameters**; a plain "
                  f"forward takes {sub[0]['forward_seconds'] * 1e3:.1f} ms.", "",
                  "| tool | params | vs ref | MACs | vs ref | FLOPs | seconds | error |",
                  "|---|---:|---:|---:|---:|---:|---:|---|"]
        for r in sub:
            params = "--" if r["params"] is None else f"{r['params']:,}"
            lines.append(f"| {r['tool']} | {params} | "
                         f"{_err(r['params'], ref_p)} | {_g(r['macs'], 4)} | {_err(r['macs'], ref_m)} | "
                         f"{_g(r['flops'], 4)} | {r['seconds']:.2f} | {r['error']} |")
        lines.append("")
    lines += ["### Headline", "", "| tool | MACs exact (of models) | MACs within 1% | params exact | errors | "
              "median seconds |", "|---|---:|---:|---:|---:|---:|"]
    for t, exact, close, pexact, errors, med in _scores(rows, tools):
        lines.append(f"| {t} | {exact} | {close} | {pexact} | {errors} | {med:.2f} |")
    write_section("peers", lines)


def write_section(name: str, lines: list[str]) -> None:
    """Replace this script's part of docs/benchmarks.md (between its markers), keeping the others."""
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = begin + "\n" + "\n".join(lines) + "\n" + end
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def _scores(rows, tools):
    import statistics
    out = []
    for t in tools:
        sub = [r for r in rows if r["tool"] == t]
        exact = sum(r["macs"] == r["ref_macs"] for r in sub)
        close = sum(r["macs"] is not None and abs(r["macs"] - r["ref_macs"]) <= 0.01 * r["ref_macs"] for r in sub)
        pexact = sum(r["params"] == r["ref_params"] for r in sub)
        errors = sum(bool(r["error"]) for r in sub)
        med = statistics.median(r["seconds"] for r in sub) if sub else 0.0
        out.append((t, f"{exact}/{len(sub)}", f"{close}/{len(sub)}", f"{pexact}/{len(sub)}", errors, med))
    return out


def headline(rows, tools, written: bool = True) -> None:
    print("\nheadline (MACs exact / within 1% / params exact / errors / median seconds):")
    for t, exact, close, pexact, errors, med in _scores(rows, tools):
        print(f"  {t:<18} {exact:>5} {close:>5} {pexact:>5} {errors:>3} {med:8.2f} s")
    print("written: docs/benchmarks.md, bench/results/peers.csv" if written else
          "a subset (--only/--tools): docs/benchmarks.md and bench/results/peers.csv left as they were")


if __name__ == "__main__":
    main()
