"""The built-in GPU table: name, memory, compute capability, dense peak FLOP/s per dtype, HBM bandwidth,
and the links a GPU talks to its peers over.

One row per GPU, from NVIDIA's datasheets (dense peaks, no sparsity; ``tf32`` is float32 matmul with
TF32 allowed). ``nvlink``: bytes/s one way from one GPU to the others of its node (NVLink, or
PCIe where a card has none); ``network``: bytes/s one way from one GPU off its node (the usual
one NIC per GPU of that generation's training clusters: 100 Gb/s EDR for V100, 200 Gb/s HDR for
A100, 400 Gb/s NDR for H100/H200; L4 and the PCIe H100, 200 Gb/s). It lives low (costs) so that the analyses (roofline) and later the attention-kernel
choice and the sharded-training estimates read one table. ``gpu(name, **overrides)`` returns a row
with any figure replaced; ``peaks()`` gives roofline's ``{name: {"bandwidth": .., dtype: ..}}`` view.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType

from ..errors import InputError

__all__ = ["DEFAULT_GPU", "DTYPES", "GPU", "GPUS", "gpu", "peaks"]


@dataclass(frozen=True, slots=True)
class GPU:
    name: str
    memory: int                 # bytes of device memory
    capability: tuple[int, int]  # CUDA compute capability (sm major, minor)
    bandwidth: float            # HBM/GDDR bytes/s
    flops: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # dtype name -> FLOP/s
    nvlink: float = 0.0         # bytes/s one way to a GPU of the same node
    network: float = 0.0        # bytes/s one way to a GPU of another node

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for a dtype name (``float32``, ``tf32``, ``bfloat16``, ``float16``);
        float32's when the table has none for it."""
        return self.flops.get(dtype) or self.flops["float32"]


def _row(name, memory_gib, cap, bw, links, **flops) -> GPU:
    return GPU(name, memory_gib << 30, cap, bw, MappingProxyType(flops), *links)


GPUS: MappingProxyType = MappingProxyType({g.name: g for g in (
    _row("V100", 32, (7, 0), 900e9, (150e9, 12.5e9), float32=15.7e12, float16=125e12),
    _row("A100", 80, (8, 0), 2.039e12, (300e9, 25e9), float32=19.5e12, tf32=156e12, bfloat16=312e12, float16=312e12),
    _row("A100-40GB", 40, (8, 0), 1.555e12, (300e9, 25e9), float32=19.5e12, tf32=156e12, bfloat16=312e12,
         float16=312e12),
    _row("L4", 24, (8, 9), 300e9, (32e9, 25e9), float32=30.3e12, tf32=60e12, bfloat16=121e12, float16=121e12),
    _row("H100", 80, (9, 0), 3.35e12, (450e9, 50e9), float32=67e12, tf32=494.7e12, bfloat16=989.4e12, float16=989.4e12),
    _row("H100-PCIE", 80, (9, 0), 2.0e12, (64e9, 25e9), float32=51e12, tf32=378e12, bfloat16=756e12, float16=756e12),
    _row("H200", 141, (9, 0), 4.8e12, (450e9, 50e9), float32=67e12, tf32=494.7e12, bfloat16=989.4e12, float16=989.4e12),
)})

# the dtypes a row has a peak for (``tf32``: float32 matmuls with TF32 allowed)
DTYPES = ("float32", "tf32", "bfloat16", "float16")

# The newest datacenter GPU in the table: its rules apply when no GPU is named.
DEFAULT_GPU = "H200"


def gpu(name: str | None = None, **overrides) -> GPU:
    """The table's row for ``name`` (case and spaces ignored; None: DEFAULT_GPU), with any field
    overridden (``memory=``, ``capability=``, ``bandwidth=``, ``nvlink=``, ``network=``, or a dtype's
    peak: ``bfloat16=``)."""
    key = (name or DEFAULT_GPU).upper().replace(" ", "-")
    if key not in GPUS:
        raise InputError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    row = GPUS[key]
    fields = {k: overrides.pop(k) for k in ("memory", "capability", "bandwidth", "nvlink", "network")
              if k in overrides}
    unknown = [k for k in overrides if k not in DTYPES]
    if unknown:
        raise InputError(f"GPU {key}: unknown figure {unknown[0]!r} (memory, capability, bandwidth, nvlink, network, "
                         f"{', '.join(DTYPES)})")
    cap = fields.get("capability", row.capability)
    if not (isinstance(cap, tuple) and len(cap) == 2 and all(isinstance(c, int) and c >= 0 for c in cap)):
        raise InputError(f"GPU {key}: capability must be (major, minor), got {cap!r}")
    for k, v in {**fields, **overrides}.items():
        if k != "capability" and (not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0):
            raise InputError(f"GPU {key}: {k} must be a positive number, got {v!r}")
    if overrides:
        fields["flops"] = MappingProxyType({**row.flops, **overrides})
    return replace(row, **fields) if fields else row


def peaks() -> dict[str, dict[str, float]]:
    """Roofline's view: ``{name: {"bandwidth": B/s, dtype: FLOP/s, ...}}``."""
    return {name: {"bandwidth": g.bandwidth, **g.flops} for name, g in GPUS.items()}
