"""Plain, frozen records of one captured run: a tree of LayerRecord and a list of OpEvent.

Records hold numbers and shapes, never formatted strings and never nn.Module references, so a Trace
can come from a PyTorch run, an ONNX graph or a TorchScript graph alike.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

__all__ = [
    "Costs", "TensorSpec", "ParamSpec", "Window", "AttentionShape", "ReceptiveField", "OpEvent",
    "LayerRecord", "UncountedOp", "Coverage", "Totals", "Trace", "FORWARD", "BACKWARD",
    "PRODUCER_INPUT", "PRODUCER_STATE", "PRODUCER_UNKNOWN", "LOSS", "OPTIMIZER",
]

FORWARD = "forward"
BACKWARD = "backward"
# phases of a training step that run outside the model (memory simulation only)
LOSS = "loss"
OPTIMIZER = "optimizer"

# Producer codes for op inputs that no recorded op produced.
PRODUCER_INPUT = -1     # an example input handed to the model
PRODUCER_STATE = -2     # a parameter or buffer of the model
PRODUCER_UNKNOWN = -3   # a constant or a tensor created outside the recorded run


def _quick_init(cls):
    """Give a frozen, slotted record class a faster ``__init__``, the same in what it takes and sets.

    A frozen dataclass's generated ``__init__`` writes each field through ``object.__setattr__``
    (plain assignment is what frozen forbids), looked up again for every field. This one writes
    the same slots through their descriptors, bound once here: about 40% less time per record,
    and analyze() makes a few of them per op and per module call. Classes with anything beyond
    plain positional fields (a default factory, init=False, keyword-only) keep their own.
    """
    ns: dict = {}
    params, body = [], []
    for i, f in enumerate(fields(cls)):
        if not f.init or f.kw_only or f.default_factory is not MISSING:
            return cls
        if f.default is MISSING:
            params.append(f.name)
        else:
            ns[f"_d{i}"] = f.default
            params.append(f"{f.name}=_d{i}")
        ns[f"_s{i}"] = cls.__dict__[f.name].__set__
        body.append(f"    _s{i}(self, {f.name})\n")
    exec(f"def __init__(self, {', '.join(params)}):\n" + "".join(body), ns)
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init
    return cls


@_quick_init
@dataclass(frozen=True, slots=True)
class Costs:
    """Arithmetic and traffic of one op or a group of ops (see layerscope.costs for the conventions)."""

    macs: int = 0
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    def __add__(self, other: "Costs") -> "Costs":
        return Costs(self.macs + other.macs, self.flops + other.flops,
                     self.bytes_read + other.bytes_read, self.bytes_written + other.bytes_written)

    @property
    def bytes_moved(self) -> int:
        return self.bytes_read + self.bytes_written


@_quick_init
@dataclass(frozen=True, slots=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@_quick_init
@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One parameter or buffer held directly by a module."""

    name: str
    shape: tuple[int, ...]
    numel: int
    nbytes: int
    trainable: bool
    shared: bool  # the same tensor is also held by another module or under another name


@_quick_init
@dataclass(frozen=True, slots=True)
class Window:
    """Sliding-window geometry of an op, per spatial dim (conv, pooling, resize, global reduce)."""

    kind: str                      # "conv", "tconv" (transposed), "resize", "global"
    kernel: tuple[int, ...]
    stride: tuple[float, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]


@_quick_init
@dataclass(frozen=True, slots=True)
class AttentionShape:
    """What a fused attention kernel's speed depends on beyond its FLOPs: its query rows (batch and heads
    included), the head dims of Q/K and of V, whether it is the backward, whether a mask (causal, a
    window) makes it skip tiles and run diagonal ones whole, and whether it drops out (a random number
    per score). Set by the attention cost formulas (costs/attention.py), read by the step-time model
    (planning/steptime/sharded_time.py)."""

    rows: int
    head_dim: int
    value_dim: int
    backward: bool
    masked: bool = False
    dropout: bool = False


@_quick_init
@dataclass(frozen=True, slots=True)
class ReceptiveField:
    """Spatial receptive field of a tensor w.r.t. the model input, per spatial dim."""

    size: tuple[float, ...]
    stride: tuple[float, ...]      # effective stride (jump) in input pixels
    padding: tuple[float, ...]     # effective padding in input pixels


@_quick_init
@dataclass(frozen=True, slots=True)
class OpEvent:
    index: int
    op: str                        # "aten.addmm", ...
    layer: int                     # index of the LayerRecord (module call) it ran in
    phase: str                     # FORWARD or BACKWARD (LOSS, OPTIMIZER in a training step)
    status: str                    # "counted", "free" or "uncounted"
    costs: Costs
    producers: tuple[int, ...]     # per tensor input: index of the op that produced it, or PRODUCER_*
    window: Window | None = None
    executed: float = 1.0          # the share of costs.flops a masked-work-skipping kernel runs (OpCost.executed)
    attention: AttentionShape | None = None     # a fused attention kernel's shape (OpCost.attention)


@_quick_init
@dataclass(frozen=True, slots=True)
class LayerRecord:
    """One call of one module. A module called three times has three records."""

    index: int
    path: str                      # "" for the root module
    type: str                      # class name
    depth: int
    call_index: int
    parent: int | None
    children: tuple[int, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    params: tuple[ParamSpec, ...]  # held directly by this module
    buffers: tuple[ParamSpec, ...]
    num_params: int                # params counted at this record (first call of first owner)
    trainable_params: int
    subtree_params: int            # unique params of the module's whole subtree
    kernel_size: tuple[int, ...] | None
    forward: Costs = Costs()       # ops that ran directly in this call (self)
    backward: Costs = Costs()
    forward_total: Costs = Costs()  # this call and every call nested in it
    backward_total: Costs = Costs()
    uncounted_ops: int = 0         # ops in this call's subtree with no cost formula
    receptive_field: ReceptiveField | None = None

    @property
    def name(self) -> str:
        return self.path or "(root)"

    @property
    def macs(self) -> int:
        """Forward MACs of this call's subtree."""
        return self.forward_total.macs

    @property
    def flops(self) -> int:
        """Forward FLOPs of this call's subtree."""
        return self.forward_total.flops

    @property
    def is_leaf(self) -> bool:
        return not self.children


@dataclass(frozen=True, slots=True)
class UncountedOp:
    op: str
    count: int
    layers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Coverage:
    uncounted: tuple[UncountedOp, ...] = ()
    uncalled_modules: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return not self.uncounted


@dataclass(frozen=True, slots=True)
class Totals:
    params: int
    trainable_params: int
    frozen_params: int
    shared_params: int             # params held by more than one module/name (counted once in params)
    param_bytes: int
    buffers: int
    buffer_bytes: int
    input_bytes: int
    output_bytes: int
    forward: Costs
    backward: Costs
    complete: bool

    @property
    def macs(self) -> int:
        return self.forward.macs

    @property
    def flops(self) -> int:
        return self.forward.flops


@dataclass(frozen=True, slots=True)
class Trace:
    """Everything one capture saw. Analyses are pure functions of this."""

    model_name: str
    layers: tuple[LayerRecord, ...]
    ops: tuple[OpEvent, ...]
    layer_outputs: tuple[tuple[int, ...], ...]   # per layer: producers of its output tensors
    param_numel: int
    trainable_numel: int
    shared_numel: int
    param_bytes: int
    buffer_numel: int
    buffer_bytes: int
    input_bytes: int
    output_bytes: int
    uncalled_modules: tuple[str, ...] = ()
    backward: bool = False
    options: dict = field(default_factory=dict)
