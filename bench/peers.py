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


# ---- models and their hand-derived references: tests/zoo/peer_models.py (the tests check them) -----

sys.path.insert(0, str(ROOT / "tests"))
from zoo.peer_models import MODELS, tied, wrap  # noqa: E402,F401  (wrap: bench/speed.py's child process)

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
