"""Roofline: a device's peak compute and memory bandwidth, and where a layer stands under them.

A layer of arithmetic intensity I (FLOPs per byte moved) can reach at most
``min(peak_flops, I * peak_bandwidth)`` FLOP/s: below the ridge ``peak_flops / peak_bandwidth`` it is
memory-bound, above it compute-bound. Its distance from the roof is its achieved FLOP/s over that
attainable figure.

Peaks come from a built-in table of vendor datasheet figures (dense, no sparsity), from a short
microbenchmark on the spot (a large matmul for compute, a large copy for bandwidth: what this
library's kernels can actually reach, so on CPU it is the useful roof), or from the user.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

import torch

from ..costs.gpus import peaks

__all__ = ["Roofline", "PEAKS", "roofline_for", "measure_roofline"]


@dataclass(frozen=True, slots=True)
class Roofline:
    name: str
    peak_flops: float          # FLOP/s
    peak_bandwidth: float      # bytes/s
    source: str                # "table", "measured" or "given"

    @property
    def ridge(self) -> float:
        """The intensity (FLOP/B) where the memory roof meets the compute roof."""
        return self.peak_flops / self.peak_bandwidth

    def attainable(self, intensity: float) -> float:
        return min(self.peak_flops, intensity * self.peak_bandwidth)

    def bound(self, intensity: float) -> str:
        return "compute" if intensity >= self.ridge else "memory"

    def fraction(self, flops: float, bytes_moved: float, seconds: float) -> float | None:
        """Achieved FLOP/s over the attainable FLOP/s at this intensity (1.0 = on the roof)."""
        if not flops or not bytes_moved or seconds <= 0:
            return None
        return (flops / seconds) / self.attainable(flops / bytes_moved)

    def to_dict(self) -> dict:
        return {"name": self.name, "peak_flops": self.peak_flops, "peak_bandwidth": self.peak_bandwidth,
                "ridge": self.ridge, "source": self.source}


# Dense peaks from the built-in GPU table (costs/gpus.py), memory bandwidth in bytes/s.
PEAKS: dict[str, dict[str, float]] = peaks()


def _dtype_key(dtype: torch.dtype, device: torch.device) -> str:
    if dtype == torch.float32 and device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "float32")


def _table(name: str, dtype: torch.dtype, device: torch.device) -> Roofline:
    from ..errors import InputError
    key = name.upper().replace(" ", "-")
    if key not in PEAKS:
        raise InputError(f"no built-in peaks for {name!r}; known: {', '.join(PEAKS)} (or give "
                         "'FLOPS,BYTES_PER_S', or 'measure')")
    row, d = PEAKS[key], _dtype_key(dtype, device)
    flops = row.get(d) or row["float32"]
    return Roofline(f"{key} ({d if d in row else 'float32'})", flops, row["bandwidth"], "table")


def _best_seconds(fn, repeats: int, sync) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best


def measure_roofline(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                     repeats: int = 5) -> Roofline:
    """Peak FLOP/s from a square matmul (n = 1024 on CPU, 8192 on CUDA) and bandwidth from copying
    a 128 MiB (CPU) or 1 GiB (CUDA) tensor, best of ``repeats``: about half a second on a 2-core
    CPU. The global RNG is not touched (tensors are filled with a constant)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    n = 8192 if cuda else 1024
    flops = 2 * n ** 3 / _best_seconds(partial(torch.mm, torch.full((n, n), 0.5, dtype=dtype, device=device),
                                               torch.full((n, n), 0.25, dtype=dtype, device=device)),
                                       repeats, sync)
    numel = (1 << 30 if cuda else 128 << 20) // 4
    src = torch.full((numel,), 1.0, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    bw = 2 * src.numel() * 4 / _best_seconds(lambda: dst.copy_(src), repeats, sync)   # read + write
    name = torch.cuda.get_device_name(device) if cuda else f"{device.type} ({torch.get_num_threads()} threads)"
    return Roofline(f"measured {name} ({str(dtype).replace('torch.', '')})", flops, bw, "measured")


def roofline_for(spec, device: torch.device, dtype: torch.dtype) -> Roofline | None:
    """``spec``: None (no roofline), a Roofline, ``(peak_flops, peak_bytes_per_s)``, ``"FLOPS,BW"``,
    ``"measure"``, a name from the table (``"H100"``), or ``"auto"`` (the table entry for this CUDA
    device when it is known, else measured)."""
    from ..errors import InputError
    if spec is None or isinstance(spec, Roofline):
        return spec
    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        flops, bw = (float(v) for v in spec)
    elif isinstance(spec, str) and "," in spec:
        try:
            flops, bw = (float(v) for v in spec.split(","))
        except ValueError:
            raise InputError(f"roofline {spec!r}: expected 'PEAK_FLOPS,PEAK_BYTES_PER_S', e.g. '989e12,3.35e12'") \
                from None
    elif spec == "measure":
        return measure_roofline(device, dtype)
    elif spec == "auto":
        if device.type == "cuda":
            gpu = torch.cuda.get_device_name(device).upper()
            for key in sorted(PEAKS, key=len, reverse=True):
                if key.replace("-", " ") in gpu.replace("-", " "):
                    return _table(key, dtype, device)
        return measure_roofline(device, dtype)
    elif isinstance(spec, str):
        return _table(spec, dtype, device)
    else:
        raise InputError(f"roofline must be a device name, 'measure', 'auto' or (peak_flops, "
                         f"peak_bytes_per_s); got {spec!r}")
    if flops <= 0 or bw <= 0:
        raise InputError(f"roofline peaks must be positive, got {flops} FLOP/s and {bw} B/s")
    return Roofline("given", flops, bw, "given")
