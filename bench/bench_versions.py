"""Is this checkout's analyze() as fast as another commit's? Prints paired ratios new/old; asserts nothing.

  python bench/bench_versions.py [--ref main~1] [--pairs 9] [--only mlp,gpt2,resnet] [--threads N]

The other commit's package is taken with ``git archive REF src/layerscope`` into a temporary folder and
imported under another name (``layerscope_ref``; every import inside the package is relative), so both
versions run in ONE process on the same models, alternating (A B, B A, ...; bench/_timing.py): a machine
whose speed drifts by tens of percent within minutes moves both sides of each pair alike. Each row is the
median of the per-pair ratios time(this checkout) / time(REF), with their min and max.

Models, as in bench_analyze.py: the deep MLP of 4,000 64-wide blocks (12,001 module calls), GPT-2 small
(seq 128) and HF ResNet-50 (224), batch 1, real CPU weights. Target of issue 32: median <= 1.03 on each.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tempfile

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import paired_ratios  # noqa: E402  (bench/ is not a package)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_ref(ref: str, into: str):
    """The package as it was at ``ref``, imported as ``layerscope_ref``."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", ref, "src/layerscope"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    os.rename(os.path.join(into, "src", "layerscope"), os.path.join(into, "layerscope_ref"))
    sys.path.insert(0, into)
    return importlib.import_module("layerscope_ref")


def models(only):
    import transformers as T
    torch.manual_seed(0)
    table = {
        "mlp": lambda: (nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(4000)]),
                        torch.randn(1, 64)),
        "gpt2": lambda: (T.GPT2Model(T.GPT2Config()), torch.randint(0, 50257, (1, 128))),
        "resnet": lambda: (T.ResNetModel(T.ResNetConfig()), torch.randn(1, 3, 224, 224)),
    }
    for name, make in table.items():
        if only is None or name in only:
            model, x = make()
            yield name, model.eval(), x


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref", default="main", help="the commit to compare with (default: main)")
    p.add_argument("--pairs", type=int, default=9)
    p.add_argument("--only", help="comma-separated: mlp, gpt2, resnet")
    p.add_argument("--threads", type=int, help="torch threads (default: every core)")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    import layerscope as new
    with tempfile.TemporaryDirectory() as tmp:
        old = load_ref(a.ref, tmp)
        print(f"this checkout ({new.__file__}) against {a.ref}; {a.pairs} pairs each, "
              f"{torch.get_num_threads()} threads", flush=True)
        for name, model, x in models(a.only.split(",") if a.only else None):
            assert new.analyze(model, x).totals.macs == old.analyze(model, x).totals.macs, name
            r = paired_ratios(lambda: old.analyze(model, x), lambda: new.analyze(model, x), pairs=a.pairs,
                              warmup=1)
            print(f"{name:<8} {a.ref} {r.a_median * 1e3:8.1f} ms   this {r.b_median * 1e3:8.1f} ms   "
                  f"new/old {r.describe()}", flush=True)


if __name__ == "__main__":
    main()
