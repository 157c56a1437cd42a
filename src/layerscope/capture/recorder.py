"""The op recorder: a TorchDispatchMode that sees every aten op after autograd has decomposed
composite ops, and hands it (with its inputs and outputs) to the Session that prices it and
attributes it to the innermost running module call. On meta and fake tensors, which have no values,
it gives ops whose result depends on values the rule that values read as 1."""

from __future__ import annotations

import sys

import torch

from .. import _compat
from ..trace import FORWARD
from .known_ops import SHAPED_OPS, carry_values, shaped_outputs
from .simulation import note_meta_read

__all__ = ["OpRecorder", "unknown_value", "FAKE_SIZE_FIXES"]


@_compat.dispatch_mode
class OpRecorder:
    """THE op recorder: a dispatch mode that sees every aten op of a run, gives values to what
    meta and fake tensors cannot compute (values read as 1), and hands each op to its Session."""

    def __init__(self, cap, kernels=None, reads=None) -> None:
        """``cap``: the run's Session (capture/session.py; not imported here, which imports this)."""
        super().__init__()
        self.cap = cap
        # A simulation's own steps (capture/simulation.py), taken inside this one mode rather than
        # as two more modes around it (each mode is a Python frame and a re-dispatch on every op,
        # prim.device queries included): ``kernels`` (a SimulationKernels) runs each op in place of
        # ``func(...)``, so the recorder sees what it returns, as from a mode below; ``reads`` (a
        # ValueReads) notes a value read before the recorder answers it, as from a mode above.
        self.kernels = kernels
        self.reads = reads
        # the plain ops the kernels act on; every other op they act on is special here (below)
        self._watch = kernels.watch if kernels is not None else frozenset()
        self._nested = 0    # inside a composite op's decomposition (a mode above would not see it)
        # DTensor (when torch.distributed.tensor is in use): its ops are recorded as the local ops its
        # dispatch runs on each rank's shard, not as one op of the global tensor (see _dtensor_op)
        mod = sys.modules.get("torch.distributed.tensor")
        self._dtensor = getattr(mod, "DTensor", None) if mod is not None else None
        self._in_dtensor = 0    # inside a DTensor op's own dispatch
        self._passing = False   # this recorder pushed again around a DTensor op: let DTensor take it
        # the plain op class, whose __call__ only calls ._op (resolved here, not at import: None
        # where absent, and every op takes the public call)
        self._overload = _compat.get("OpOverload")
        # Outputs of meta ops by what fixes them (see _meta_call): a run that tracks nothing about
        # storages (no memory tracking, no simulation kernels, no fake tensors) and so needs of an
        # output only its shape, strides and dtype. One per recorder, dropped with it.
        self._meta_outs: dict | None = {} if kernels is None and cap.storage is None and \
            not cap.simulated else None

    def _meta_call(self, func, args, kwargs):
        """``func(*args, **kwargs)`` for an op whose first argument is a meta tensor. On meta nothing is
        computed, yet many ops' meta kernels are Python (torch._refs / _prims: type promotion,
        broadcasting, strides), hundreds of microseconds each: most of a meta run's time, and a deep
        model repeats the same few calls in every block (Llama-2-70B: 80 blocks of the same ops). A
        meta kernel's output is a function of the inputs' metadata and the other arguments alone (there
        are no values to read; the ops whose outputs depend on values are special above), so an op that
        creates new tensors (no alias or mutation in its schema) and ran once with these shapes,
        strides, dtypes and arguments is answered with new empty tensors of the outputs' shapes,
        strides and dtypes, as its kernel made them. Anything else runs its kernel as always."""
        outs = self._meta_outs
        key = _meta_key(func, args, kwargs)
        if key is None:
            return _meta_run(func, args, kwargs)
        spec = outs.get(key, _MISSING)
        if spec is _MISSING:
            out = func(*args, **kwargs)
            outs[key] = _meta_spec(out, args)
            return out
        if spec is None:             # seen, and its outputs cannot be remade (see _meta_spec)
            return func(*args, **kwargs)
        many, specs = spec
        made = [_empty_strided(shape, stride, dtype=dtype, device=_META) for shape, stride, dtype in specs]
        return tuple(made) if many else made[0]

    def _call(self, func, args, kwargs):
        kernels = self.kernels
        if self.cap.known is not None:
            args = _beside_meta(func, args) or args
        return func(*args, **kwargs) if kernels is None else kernels.call(func, args, kwargs)

    def _dtensor_op(self, func, args, kwargs):
        """A DTensor op, run by DTensor's own dispatch with this recorder pushed again, so that what it
        runs on the rank's local shards is what is recorded: the local compute (at the shard's shape:
        a rank's own MACs), the collectives of an implicit redistribution, and every temporary the
        sharded kernel makes (loss_parallel's backward holds two more vocabulary-sized tensors than
        its inputs and output show). The op itself is not recorded (its shapes are global). DTensor's
        sharding propagation runs the op on fake (or meta) tensors of the global shape to learn the
        output's metadata: those ops (called from ``_propagate_tensor_meta*``) are not part of the rank's
        step and are not recorded either."""
        self._passing = True
        self._in_dtensor += 1
        try:
            with self:
                return func(*args, **kwargs)
        finally:
            self._in_dtensor -= 1
            self._passing = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dt = self._dtensor
        if dt is not None:
            if dt in types:
                # pushed again around this very op (or a DTensor op its dispatch makes): DTensor's turn
                return NotImplemented if self._passing else self._dtensor_op(func, args, kwargs)
            if self._in_dtensor and _propagating():
                return func(*args, **kwargs)    # DTensor's sharding propagation (global shapes)
        # by id (see _KIND_BY_ID), as Session.on_op's cost cache
        e = _KIND_BY_ID.get(id(func))
        kind = e[1] if e is not None and e[0] is func else _kind(func)
        if kind == _PLAIN:
            # the common op: no special case below applies (one dict lookup instead of a dozen tests)
            cap = self.cap
            seq = cap.next_seq() if cap.track_seq and cap.phase is FORWARD else 0
            a0 = args[0] if args else None
            if type(a0) is list and a0:      # cat, stack, ...: their first tensor
                a0 = a0[0]
            run = args
            if cap.known is not None:
                # a run without values: CPU floats beside meta tensors run as meta ones (_beside_meta)
                run = _beside_meta(func, args) or args
            if self._meta_outs is not None and type(a0) in _PLAIN_TENSORS and a0.is_meta:
                out = self._meta_call(func, run, kwargs)
            elif self._watch and func in self._watch:
                out = self.kernels.call(func, run, kwargs)
            elif type(func) is self._overload:
                out = func._op(*run, **kwargs)    # what OpOverload.__call__ runs, one Python frame less
            else:
                out = func(*run, **kwargs)
            if not cap.paused:
                cap.on_op(func, args, kwargs, out, seq)
            known = cap.known
            if known is not None:
                carry_values(known, func, args, kwargs, out)
            return out
        if kind == _PRIM_KIND:
            # prim.device / prim.layout: metadata queries that only tensor subclasses (fake tensors)
            # route through dispatch, thousands per step (autograd asks every gradient's device).
            # Not recorded (a fake run would differ from a real one), nothing to decide
            return func(*args, **kwargs)
        known = self.cap.known
        if self.reads is not None and not self._nested and not (
                known is not None and func in (_LOCAL_SCALAR, _UNIQUE2) and known.has(args[0])):
            self.reads.note(func, args)
        if kind & _COMPOSITE_KIND and (torch.is_inference_mode_enabled() or
                                       any(isinstance(a, torch.Tensor) and a.is_inference() for a in args)):
            # A composite op (conv2d, linear, matmul, sdpa, ...) reaches a dispatch mode whole when
            # autograd is not in the way (inference mode kept for a model holding inference
            # tensors): run its C++ decomposition -- the kernel the Autograd key runs in grad mode
            # and under no_grad -- with the recorder pushed again, so its parts are priced as in
            # any other grad mode. Inference tensors skip autograd in any mode, so they bring
            # composite ops whole too. Only there: otherwise a composite op that arrives whole comes
            # from a tensor subclass's own dispatch (nested tensors), whose decomposition would
            # dispatch back to it endlessly.
            self._nested += 1
            try:
                with self:
                    return func._op_dk(_compat.composite_implicit_key(), *args, **kwargs)
            finally:
                self._nested -= 1
        cap = self.cap
        seq = cap.next_seq() if cap.track_seq and cap.phase is FORWARD else 0
        shaped = shaped_outputs(known, func, args, kwargs) if known is not None and func in SHAPED_OPS else None
        if shaped is not None:
            # the values read are known (capture/known.py): the output at its real shape
            out = shaped
        elif func is _LOCAL_SCALAR and known is not None and known.has(args[0]):
            out = known.item(args[0])
        elif func is _LOCAL_SCALAR and (cap.simulated and unknown_value(args[0]) or args[0].is_meta):
            # A simulation or a meta run has no values: a value read back (.item(), bool(t)) reads
            # as 1, so data-dependent branches take their "nonzero" side. (A simulation's reads are
            # noted by its ValueReads, a meta run's here: the report says what was read so.)
            if args[0].is_meta:
                note_meta_read(cap, "item")
            out = _one_of(args[0].dtype)
        elif func is _REPEAT_INTERLEAVE and args[0].is_meta and kwargs.get("output_size") is None:
            # values read as 1 on meta: every repeat count is 1, so the output has one per count
            note_meta_read(cap, "repeats")
            out = self._call(func, args, {**kwargs, "output_size": args[0].numel()})
        elif func is _NONZERO and args[0].is_meta:
            # values read as 1 on meta: every element is nonzero (what torch's meta kernel assumes
            # under a process-wide config flag, which another thread would see flipped)
            note_meta_read(cap, "nonzero")
            out = torch.empty((args[0].numel(), args[0].dim()), dtype=torch.long, device="meta")
        elif func in _BOOL_INDEXED and args[0].is_meta and _has_mask(args[1]):
            # a boolean mask selects every element (values read as 1): its positions as index tensors
            note_meta_read(cap, "mask")
            out = self._call(func, (args[0], _mask_positions(args[1]), *args[2:]), kwargs)
        elif func is _UNIQUE2 and (args[0].is_meta or cap.simulated and unknown_value(args[0])):
            # values read as 1 (meta, simulation): every element is the same: one unique value
            if args[0].is_meta:
                note_meta_read(cap, "unique")
            out = _unique2_of_ones(args[0], *args[1:], **kwargs)
        elif func is _compat.get("grouped_mm") and (args[0].is_meta or cap.simulated) and \
                _grouped_mm_shape(args):
            # the meta kernel of _grouped_mm insists on bf16 and 16-byte strides (the CUDA kernel's
            # rules) though CPU runs float32 at any size: the output, by the op's shape rule
            out = torch.empty(_grouped_mm_shape(args), dtype=kwargs.get("out_dtype") or args[0].dtype,
                              device=args[0].device)
        elif _SEEDED in func.tags and not cap.simulated:
            if self.kernels is None:
                out = cap.rng.call(func, args, kwargs)
            else:
                # every op the private generator's call makes reaches the kernels, as below the
                # recorder (a tracked real step's CPU flash attention is seeded and probed)
                with self.kernels:
                    out = cap.rng.call(func, args, kwargs)
        else:
            out = self._call(func, args, kwargs)
        # a prim op that is also composite or special (none in torch today) is not recorded either
        if not cap.paused and not kind & _PRIM_KIND:
            cap.on_op(func, args, kwargs, out, seq)
        if known is not None and shaped is None and func is not _LOCAL_SCALAR:
            carry_values(known, func, args, kwargs, out)
        return out


_PROPAGATION = frozenset(("_propagate_tensor_meta_non_cached", "_propagate_tensor_meta"))


def _propagating() -> bool:
    """Called from DTensor's sharding propagation, which runs the op once on fake tensors of the global
    shape (in the simulation's own FakeTensorMode, so on its device, not meta) to learn the output's
    metadata (torch/distributed/tensor/_sharding_prop.py)."""
    f = sys._getframe(2)
    for _ in range(12):
        if f is None:
            return False
        if f.f_code.co_name in _PROPAGATION:
            return True
        f = f.f_back
    return False


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_MISSING = object()
_META = torch.device("meta")
_empty_strided = torch.empty_strided
_STRIDED = torch.strided
_META_OK: dict = {}    # id(func) -> (func, whether its outputs are new tensors)
# argument types that fix themselves by value (their type goes into the key too: 1, 1.0 and True are
# equal as dict keys, but type promotion tells them apart)
_VALUE_TYPES = frozenset((int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format,
                          torch.layout))


def _beside_meta(func, args):
    """``args`` with each CPU floating tensor of one or more dims beside a meta tensor given as a meta
    tensor of its shape and strides; None where there is none to give. A kernel is picked by its
    arguments' devices, and CPU's ``bmm`` takes a meta tensor beside a CPU one: its output came back
    on the CPU, computed from no values, and autograd refused the gradient (torch's own FLOP-counter
    test model, ``bmm`` of a meta activation by ``torch.randn(7, 6, 7)`` made in ``forward``, raised
    "BmmBackward0 returned an invalid gradient at index 0 - expected device meta but got cpu" in
    its backward). A 0-dim CPU tensor is a scalar to every kernel, and integer CPU tensors (indices,
    the positions found from known values: capture/known.py) stay where they are, and so does every
    argument of an op that writes one (its written tensor must stay the one it returns)."""
    meta = cpu = False
    for a in args:
        if type(a) in _PLAIN_TENSORS:
            if a.is_meta:
                meta = True
            elif a.device.type == "cpu" and a.dim() and (a.is_floating_point() or a.is_complex()):
                cpu = True
    if not (meta and cpu) or getattr(getattr(func, "_schema", None), "is_mutable", True):
        return None
    return tuple(_empty_strided(tuple(a.shape), a.stride(), dtype=a.dtype, device=_META)
                 if type(a) in _PLAIN_TENSORS and not a.is_meta and a.device.type == "cpu" and a.dim() and
                 (a.is_floating_point() or a.is_complex()) else a for a in args)


def _meta_run(func, args, kwargs):
    """``func(*args, **kwargs)`` on meta tensors. A 0-dim CPU tensor beside them is a scalar to real
    kernels (``x.masked_fill(mask, torch.tensor(-inf))`` runs on CUDA), and integer inputs and the
    positions found from their known values stay CPU tensors on meta (capture/known.py); a meta kernel
    that refuses a CPU tensor ("Expected `value` to be on same device", index_add's index) gets it as
    a meta tensor of the same shape (a meta kernel reads no values)."""
    try:
        return func(*args, **kwargs)
    except RuntimeError as e:
        if "device" not in str(e):
            raise
        moved = tuple(torch.empty_like(a, device=_META) if type(a) in _PLAIN_TENSORS and a.device.type == "cpu"
                      else a for a in args)
        if all(m is a for m, a in zip(moved, args)):
            raise
        return func(*moved, **kwargs)


def _meta_ok(func) -> bool:
    """Whether ``func``'s outputs are new tensors: a plain OpOverload whose schema neither mutates
    nor aliases anything and returns one or more plain Tensors. Cached per op: schemas never change."""
    e = _META_OK.get(id(func))        # by id, holding the op (see _KIND_BY_ID)
    if e is not None and e[0] is func:
        return e[1]
    s = func._schema
    ok = type(func) is _compat.get("OpOverload") and not s.is_mutable and bool(s.returns) and \
        all(str(r.type) == "Tensor" and r.alias_info is None for r in s.returns) and \
        all(a.alias_info is None for a in s.arguments)
    _META_OK[id(func)] = (func, ok)
    return ok


def _tensor_key(t):
    if type(t) not in _PLAIN_TENSORS or not t.is_meta or t.layout is not _STRIDED or t.is_complex():
        return None
    return (t.shape, t.stride(), t.storage_offset(), t.dtype)


def _arg_key(a):
    """What fixes an argument's effect on a meta kernel: a tensor's shape, strides, offset and
    dtype; a plain value's type and value; a list or tuple of those. None where it is anything else
    (a symbolic size, a tensor of another kind or device, an object)."""
    if isinstance(a, torch.Tensor):
        return _tensor_key(a)
    cls = type(a)
    if cls in _VALUE_TYPES:
        return (cls, a)
    if cls is list or cls is tuple:
        parts = []
        for x in a:
            k = _arg_key(x)
            if k is None:
                return None
            parts.append(k)
        return (cls, tuple(parts))
    return None


def _meta_key(func, args, kwargs):
    """The cache key of a meta op call, or None where it cannot have one. The default dtype is in it:
    a float scalar promotes an integer tensor to it."""
    if not _meta_ok(func):
        return None
    parts = [func, torch.get_default_dtype()]
    for a in args:
        k = _arg_key(a)
        if k is None:
            return None
        parts.append(k)
    if kwargs:
        for name, v in kwargs.items():
            k = _arg_key(v)
            if k is None:
                return None
            parts.append((name, k))
    return tuple(parts)


def _meta_spec(out, args):
    """(whether the op returned a tuple, per output (shape, strides, dtype)), or None where an output
    is not a new plain strided meta tensor at offset 0 (one empty_strided could not make again)."""
    many = type(out) is tuple
    outs = out if many else (out,)
    specs = []
    for o in outs:
        if type(o) is not torch.Tensor or not o.is_meta or o.layout is not _STRIDED or o.is_complex() or \
                o.storage_offset() != 0 or o.requires_grad:
            return None
        if any(o is a for a in args):
            return None
        specs.append((tuple(o.shape), o.stride(), o.dtype))
    if many and len({id(o) for o in outs}) != len(outs):   # one tensor returned twice
        return None
    return many, tuple(specs)


_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default
_COMPOSITE: dict = {}

# per op, what __torch_dispatch__ must look at (bits); _PLAIN: none of it, the fast path
_PLAIN, _COMPOSITE_KIND, _SPECIAL_KIND, _PRIM_KIND = 0, 1, 2, 4
# id(func) -> (func, its bits), keyed by id: an OpOverload's __hash__ is a Python method, one more
# frame per lookup. The entry holds the op, so the id stays that op's.
_KIND_BY_ID: dict = {}


def _kind(func) -> int:
    """The bits of ``func``: composite (may arrive whole), special (a value or shape rule below, or a
    seeded random op), prim (a metadata query, not recorded). Cached per op: they never change."""
    kind = _COMPOSITE_KIND if _composite(func) else _PLAIN
    if func in _SPECIAL_OPS or func is _compat.get("grouped_mm") or _SEEDED in func.tags:
        kind |= _SPECIAL_KIND
    if func.namespace == "prim":
        kind |= _PRIM_KIND
    _KIND_BY_ID[id(func)] = (func, kind)
    return kind


def _composite(func) -> bool:
    """Whether ``func`` has a CompositeImplicitAutograd kernel (it decomposes above autograd)."""
    known = _COMPOSITE.get(func)
    if known is None:
        try:
            known = _compat.has_composite_kernel(func.name())
        except RuntimeError:   # an op the C++ dispatcher does not know (prim.device, a Python op)
            known = False
        _COMPOSITE[func] = known
    return known
_SEEDED = torch.Tag.nondeterministic_seeded
_REPEAT_INTERLEAVE = torch.ops.aten.repeat_interleave.Tensor


_UNIQUE2 = torch.ops.aten._unique2.default
_NONZERO = torch.ops.aten.nonzero.default
_BOOL_INDEXED = (torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default,
                 torch.ops.aten._index_put_impl_.default)
# ops whose output shape depends on values (with the values known, capture/known.py, the real shape)
_SPECIAL_OPS = frozenset((_LOCAL_SCALAR, _REPEAT_INTERLEAVE, _UNIQUE2, _NONZERO) + _BOOL_INDEXED) | SHAPED_OPS


def _has_mask(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


def _mask_positions(indices) -> list:
    """Index tensors for ``indices`` with each boolean mask read as all true: a mask of k dims over
    n elements becomes k index vectors of length n (as ``mask.nonzero(as_tuple=True)`` would)."""
    out: list = []
    for i in indices:
        if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8):
            out += [torch.empty((i.numel(),), dtype=torch.long, device=i.device)] * max(i.dim(), 1)
        else:
            out.append(i)
    return out


def _unique2_of_ones(x, sorted=True, return_inverse=False, return_counts=False):
    """torch.unique's outputs when every value is 1: one unique value (none for an empty input),
    every inverse index 0, one count of all elements; an output not asked for is empty, as on CPU."""
    n = 1 if x.numel() else 0
    long = dict(dtype=torch.long, device=x.device)
    return (torch.empty(n, dtype=x.dtype, device=x.device),
            torch.empty(tuple(x.shape) if return_inverse else (0,), **long),
            torch.empty(n if return_counts else 0, **long))


def _grouped_mm_shape(args) -> tuple[int, ...] | None:
    """_grouped_mm's output shape: a[M,K] @ b[G,K,N] -> [M,N]; a[G,M,K] @ b[G,K,N] -> [G,M,N];
    a[M,K] @ b[K,N] grouped over K by offs[G] -> [G,M,N]; None for another layout."""
    a, b = args[0], args[1]
    offs = args[2] if len(args) > 2 else None
    if a.dim() == 2 and b.dim() == 3:
        return (a.shape[0], b.shape[2])
    if a.dim() == 3 and b.dim() == 3:
        return (a.shape[0], a.shape[1], b.shape[2])
    if a.dim() == 2 and b.dim() == 2 and isinstance(offs, torch.Tensor):
        return (offs.shape[0], a.shape[0], b.shape[1])
    return None


def _layer_norm_stats(args, outs):
    """CPU's native_layer_norm returns mean and rstd in float32 for a bf16/fp16 input; its fake
    (meta) version returns them in the input's dtype. Size them as the real kernel allocates them."""
    x = args[0]
    if x.device.type != "cpu" or x.dtype not in (torch.bfloat16, torch.float16):
        return None
    return {i: outs[i].numel() * 4 for i in (1, 2) if i < len(outs)}


# per op: the output sizes (by output index) a real kernel allocates where a fake run differs
FAKE_SIZE_FIXES = {torch.ops.aten.native_layer_norm.default: _layer_norm_stats}


def unknown_value(t) -> bool:
    return getattr(t, "fake_mode", None) is not None and getattr(t, "constant", None) is None


def _one_of(dtype: torch.dtype):
    if dtype == torch.bool:
        return True
    return 1.0 if dtype.is_floating_point or dtype.is_complex else 1
