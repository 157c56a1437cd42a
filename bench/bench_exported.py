"""Exported models give the PyTorch numbers: ONNX (torch.onnx.export, dynamo), TorchScript
(torch.jit.trace) and torch.export (.pt2, saved and loaded) of the same models, analysed and compared with analyze(). Prints; asserts nothing.

  python bench/bench_exported.py [--quick]

Models: GPT-2 shrunk (exported with a dynamic sequence length, so the exporter cannot fold the
position embedding into a constant), HF ResNet-50 and HF ViT-B/16 at 224. Parameters get a little
noise first: the ONNX exporter merges initializers with equal values, and a fresh LayerNorm's are
all ones. Per model and format: MACs against analyze() (target within 0.1%), parameters against
analyze() less the BatchNorm scales the ONNX exporter folds into convolutions (a BatchNorm's shift
becomes the conv's bias), and the time the analysis takes. Then the AlexNet classifier (9216 -> 4096 -> 4096 -> 1000) tiled in 64x64x64
blocks and compared with the original in onnxruntime (target MSE < 1e-10).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

import torch
from torch import nn

import layerscope as ls


def _models(quick: bool):
    import transformers as T
    torch.manual_seed(0)
    yield ("gpt2-shrunk", T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256,
                                                         n_positions=32, use_cache=False)),
           torch.randint(0, 256, (1, 16)), {1: "seq"})
    if not quick:
        yield "resnet-50", T.ResNetForImageClassification(T.ResNetConfig()), torch.randn(1, 3, 224, 224), None
        yield "vit-b16", T.ViTForImageClassification(T.ViTConfig()), torch.randn(1, 3, 224, 224), None


def _bn_params(m: nn.Module) -> int:
    return sum(p.numel() for mod in m.modules() if isinstance(mod, nn.modules.batchnorm._BatchNorm)
               for p in mod.parameters(recurse=False))


def compare(name, model, x, dynamic, folder) -> None:
    model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    ref = ls.analyze(model, x)
    onnx_path = os.path.join(folder, f"{name}.onnx")
    shapes = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = {"dynamic_shapes": ({k: torch.export.Dim(v, max=32) for k, v in dynamic.items()},)} if dynamic else {}
        torch.onnx.export(model, (x,), dynamo=True, **kw).save(onnx_path)
        if dynamic:
            shapes = {v: x.shape[k] for k, v in dynamic.items()}
        model.config.torchscript = True
        ts = torch.jit.trace(model, (x,), strict=False)
        model.config.torchscript = False
        # torch.export (.pt2, issue 22): saved and loaded back the way a user would get it
        pt2_path = os.path.join(folder, f"{name}.pt2")
        torch.export.save(torch.export.export(model, (x,), **kw), pt2_path)
    t = time.perf_counter()
    e = ls.analyze_exported(pt2_path, x)
    t_pt2 = time.perf_counter() - t
    t = time.perf_counter()
    o = ls.analyze_onnx(onnx_path, shapes)
    t_onnx = time.perf_counter() - t
    t = time.perf_counter()
    s = ls.analyze_torchscript(ts, x)
    t_ts = time.perf_counter() - t
    # folding a BatchNorm into the conv before it absorbs its scale into the conv's weight; its shift
    # becomes the conv's bias (same count): C fewer parameters per BatchNorm of C channels
    bn = _bn_params(model) // 2
    for fmt, rep, secs, expect in (("onnx", o, t_onnx, ref.totals.params - bn), ("torchscript", s, t_ts, ref.totals.params),
                                   ("pt2", e, t_pt2, ref.totals.params)):
        d = 100 * (rep.totals.macs / ref.totals.macs - 1)
        print(f"{name:<12} {fmt:<11} MACs {rep.totals.macs:>15,} vs {ref.totals.macs:>15,} ({d:+.4f}%)  params "
              f"{rep.totals.params:>11,} vs {expect:>11,}{' (BN scales folded: ' + format(bn, ',') + ')' if fmt == 'onnx' and bn else ''}"
              f"  {'equal' if rep.totals.params == expect else 'DIFFERENT'}  coverage "
              f"{'complete' if rep.totals.complete else str(sum(u.count for u in rep.coverage.uncounted)) + ' nodes uncounted'}"
              f"  {secs:.2f} s", flush=True)


def tiling(folder: str, quick: bool) -> None:
    from layerscope.formats.onnx_rewrite import verify_tiling
    torch.manual_seed(0)
    dims = [576, 256, 256, 100] if quick else [9216, 4096, 4096, 1000]
    layers: list[nn.Module] = []
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    m = nn.Sequential(*layers[:-1]).eval()
    path = os.path.join(folder, "classifier.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.randn(1, dims[0]),), dynamo=True).save(path)
    t = time.perf_counter()
    res = ls.onnx_tile(path, block=(64, 64, 64))
    t_tile = time.perf_counter() - t
    v = verify_tiling(path, res)
    a, b = ls.analyze_onnx(path), ls.analyze_onnx(res.model)
    print(f"\ntiling {'->'.join(map(str, dims))} in 64x64x64: {res.blocks:,} blocks in {t_tile:.1f} s; onnxruntime "
          f"max abs error {v['max_abs_error']:.2e}, MSE {v['mse']:.2e}; MACs {a.totals.macs:,} -> {b.totals.macs:,}; "
          f"FLOPs +{b.totals.flops - a.totals.flops:,} (the Sums)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="GPT-2 shrunk and a small classifier only")
    ns = ap.parse_args()
    print(f"torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as folder:
        for name, model, x, dynamic in _models(ns.quick):
            compare(name, model, x, dynamic, folder)
        tiling(folder, ns.quick)


if __name__ == "__main__":
    main()
