"""bench/_timing.py, the paired-timing helper of the benchmarks (issue 24, item 4: speed.py once printed
FlopCounterMode at 0.54x a plain forward under load). Tests do not import bench/, so the helper's own
self-test runs in a subprocess: alternation order A B / B A, ratios B / A with a fake clock (1 s and 2 s
give exactly 2.0), a one-pair load burst (ratio 8 among 2s: median 2, flagged at max/min 4 > 1.5), a 10%
per-call drift cancelled to within 1% by the flipping order, and the IQR limit (derivations beside each
case in bench/_timing.py). No wall-clock time is asserted."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_paired_timing_selftest():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "_timing.py"), "--selftest"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "selftest ok"
