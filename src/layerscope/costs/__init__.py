"""Cost conventions and the registry of per-op cost formulas.

MACs: multiply-accumulates of contractions only (conv, matmul family, attention, recurrent matmuls).
FLOPs: 2 x MACs plus the documented arithmetic of every other op (see each formula module).
Bytes: per op, every tensor input read once and every output written once (no cache reuse); views and
metadata-only ops move nothing. Counts are per batch.

An analysis may bring its own registry (``default_registry().copy()`` changed with ``register`` /
``override``; ``analyze(..., costs=reg)``); the default one is read-only. ONNX op types are priced by
the same formulas (costs/onnx.py) in the registry's ``onnx`` namespace (``reg.onnx.override("Softmax",
fn)``; ``analyze_onnx(path, costs=reg)``).
"""

from . import attention, collectives, conv, elementwise, matmul, movement, norm, onnx, pool, rnn, spectral  # noqa: F401 (registers)
from .registry import (FREE, CostOptions, CostRegistry, NodeCall, OnnxOps, OpCall, OpCost, ShapeUnknown,
                       default_registry, lookup, register, register_free, registered_names)

__all__ = ["FREE", "CostOptions", "CostRegistry", "NodeCall", "OnnxOps", "OpCall", "OpCost", "ShapeUnknown",
           "default_registry", "lookup", "register", "register_free", "registered_names"]
