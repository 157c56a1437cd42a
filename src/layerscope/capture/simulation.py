"""What a simulated step (fake tensors, no values) must do so that it takes the real step's path and
sizes the real kernels' outputs, and the record of every value it had to invent.

Two steps, used only in a simulation and only around the model's forward, loss and backward. The op
recorder takes both itself (``OpRecorder(cap, kernels, reads)``: one dispatch mode instead of three on
every op); where nothing is recorded they are dispatch modes of their own, placed as described:

* ``SimulationKernels`` sits below the op recorder (the recorder sees what it returns):
  - a random draw of at most one element (``torch.rand([]) < p`` in LayerDrop) gets a value: the
    draw's median (0.5 for ``rand``, the mean for ``randn``/``normal``, the middle of ``randint``'s
    range, the more likely outcome for ``bernoulli``). It is attached as the fake tensor's constant,
    so FakeTensorMode computes what follows from it (the comparison, ``bool()``) exactly, and a test
    ``draw < p`` takes its more likely side, as most real steps do. No generator is used: the user's
    RNG state is never read or advanced.
  - ``nonzero`` of a tensor without values (also inside a boolean-mask index) finds every element
    nonzero (the rule the rest of the simulation follows: values read as 1), and says so; in the
    forward only for a masked assignment, whose output shape does not depend on the mask.
  - kernels whose fake (meta) implementation sizes an output differently from the real kernel
    (oneDNN's LSTM workspace, ``mkldnn_rnn_layer``: 0 bytes on fake, tens of KiB to MiB real;
    cuDNN's RNN reserve space), or that allocate scratch inside themselves (oneDNN convolutions,
    ``mm``, CPU flash attention), are run once for real on zero-filled tensors of the same shapes on
    the simulated device: the fake outputs get the real sizes, and on CPU the most the kernel held
    above its inputs and outputs (the profiler's allocation events) becomes a temporary block alive
    during that op. Cached per shape within one simulation; skipped (and said at every call) where
    the real call would need more than ``PROBE_LIMIT`` bytes or ``PROBE_MACS``. The same scratch is
    added to a tracked real step (``simulate=False``), so real tracking and simulation still agree.
    Limits: the scratch is the one at this machine's thread count; on CUDA only output sizes are
    corrected (cuDNN's RNN reserve: untested here, no GPU), scratch is not measured.
* ``ValueReads`` sits above the recorder and notes every value read back from a tensor that has
  none (``.item()``, ``bool(t)``, ``torch.unique``), which the recorder answers with 1.

Both keep their records in a ``SimulationLog`` that the memory report turns into notes.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch

from .._compat import dispatch_mode, disable_current_modes, no_dispatch, profiler_enabled, tree_leaves, \
    tree_map_only
from ..trace import BACKWARD, FORWARD
from .notes import Note

__all__ = ["META_READS", "note_meta_read", "Note", "word_note", "SimulationLog", "SimulationKernels", "ValueReads", "PROBE_LIMIT", "eager_paths"]

PROBE_LIMIT = 256 * 2 ** 20   # bytes of real tensors a kernel probe may allocate
PROBE_MACS = 500_000_000      # and the work it may do (multiply-accumulates, by layerscope's formulas):
                              # a tenth of a second or so on a CPU core; a planning run of a model that
                              # fits nowhere (Llama-70B on meta) sizes none of its large kernels

aten = torch.ops.aten
_LOCAL_SCALAR = aten._local_scalar_dense.default
_UNIQUE2 = aten._unique2.default
_NONZERO = aten.nonzero.default
# kernels whose meta/fake output sizes differ from the real kernel's (checked against real CPU runs)
# or whose real kernels allocate scratch inside themselves (CPU flash attention: per-thread buffers)
_PROBED = {getattr(aten, name).default for name in ("mkldnn_rnn_layer", "mkldnn_rnn_layer_backward",
                                                     "_cudnn_rnn", "_cudnn_rnn_backward",
                                                     "_scaled_dot_product_flash_attention_for_cpu",
                                                     "_scaled_dot_product_flash_attention_for_cpu_backward", "mm",
                                                     "convolution", "convolution_backward")
           if hasattr(aten, name)}


def _times(n: int) -> str:
    """'1 time', '1,350 times'."""
    return f"{n:,} time{'' if n == 1 else 's'}"


def _unknown(t) -> bool:
    return getattr(t, "fake_mode", None) is not None and getattr(t, "constant", None) is None


@dataclass
class SimulationLog:
    """What the simulation made up: (kind, what, layer path) in order, counted when rendered."""

    events: list[tuple[str, str, str]] = field(default_factory=list)
    probes: dict = field(default_factory=dict)
    # size kernels by a real call on the simulated device: only when that is the device predicted for
    probe: bool = True
    real: bool = False      # a tracked real step (simulate=False): only the kernels' scratch is added
    # the op clock when each event was added (capture/compose.py places them): ``clock()`` if given
    clock: Callable[[], int] | None = None
    ticks: list[int] = field(default_factory=list)

    def add(self, kind: str, what: str, where: str) -> None:
        self.events.append((kind, what, where))
        self.ticks.append(self.clock() if self.clock is not None else -1)

    def records(self, skip=(), remedy: str | None = None) -> list[Note]:
        """The log as notes: one record per kind and thing made up, with its count and places (in the
        order first seen; a place's count where it is more than one); ``remedy``: what the caller offers
        instead of ``simulate=False`` (parallel(): ``--run``)."""
        groups: dict[tuple[str, str], Counter] = {}
        for kind, what, where in self.events:
            if kind in skip:
                continue
            groups.setdefault((kind, what), Counter())[where or "(root)"] += 1
        return [Note(f"simulation-{kind}", {"kind": kind, "what": what, "times": sum(where.values()),
                                             "places": tuple(where.items()), "remedy": remedy})
                for (kind, what), where in groups.items()]

    def notes(self, skip=(), remedy: str | None = None) -> list[str]:
        """The records worded (``word_note``); ``remedy``: what the caller offers instead of
        ``simulate=False`` (parallel(): ``--run``)."""
        return [word_note(n) for n in self.records(skip, remedy)]


def word_note(note: Note, remedy: str | None = None) -> str:
    """A SimulationLog record in words (reports/notes.py words every other code). ``remedy`` (or the
    record's own) replaces the advice to track the step for real with ``simulate=False``."""
    d = note.data
    remedy = remedy or d.get("remedy")
    kind, what, n, where = d["kind"], d["what"], d["times"], d["places"]
    places = ", ".join(f"{p} (x{c})" if c > 1 else p for p, c in where[:4])
    if len(where) > 4:
        places += f" and {len(where) - 4} more layers"
    if kind == "random":
        return (f"the simulation drew {what} {_times(n)}, in {places}: a test against it takes "
                f"its more likely side (e.g. LayerDrop keeps every layer); a real step may "
                f"not. {remedy or 'Use simulate=False to track a real step'}")
    if kind == "read":
        return (f"the simulation had to invent {what} {_times(n)}, in {places}: it read it "
                f"as 1 (True), so a branch on it may not be the real step's. "
                f"{remedy or 'Use simulate=False to track the real step'}")
    if kind == "nonzero":
        # nonzero's output size is a count of values, which a simulated tensor (shapes only) lacks
        return (f"nonzero ran {_times(n)} on tensors without values, in {places}: the size of its "
                f"output is the count of nonzero elements, which the simulation cannot know, so every "
                f"element was taken as nonzero (its index tensors at their largest; a boolean-mask "
                f"assignment, like tensor parallel's embedding zeroing other ranks' token ids, keeps "
                f"its shape either way). {remedy or 'Use simulate=False to track the real step'}")
    if kind == "meta":
        # an analysis on meta tensors (``what``: what had no values, and the rule that stood in)
        return (f"on meta tensors {what[0]} had no values ({_times(n)}, in {places}): {what[1]}. "
                f"Analyze on the CPU (device='cpu'), or pass the inputs whose values decide "
                f"it, for the real run's")
    return f"{what} ({_times(n)}, in {places})"


# what a meta run reads without values, and the rule the recorder follows (capture/recorder.py)
META_READS = {
    "item": ("a tensor's value (.item(), bool(tensor), int(tensor))", "read as 1 (True), so a branch on "
             "it may not be the real run's"),
    "nonzero": ("nonzero", "every element counted nonzero (index tensors at their largest)"),
    "mask": ("a boolean mask", "every element selected"),
    "repeats": ("repeat_interleave's counts", "each read as 1"),
    "unique": ("torch.unique's values", "read as one value"),
}


def note_meta_read(cap, key: str) -> None:
    """A meta run read what it has no values for (``key`` in META_READS): noted on the session's log."""
    if cap.meta_log is None:
        cap.meta_log = SimulationLog()
    cap.meta_log.add("meta", META_READS[key], _where(cap))


def _where(cap) -> str:
    if cap.phase is FORWARD:
        i = cap.stack[-1] if cap.stack else None
    elif cap.phase is BACKWARD:
        i = cap._backward_layer()
    else:
        return cap.phase
    if i is None or i >= len(cap.calls):
        return ""
    return cap.calls[i].path + (" (backward)" if cap.phase is BACKWARD else "")


def _median(func, args, kwargs):
    """The draw's median (None: not a draw this module knows how to make)."""
    name = func._opname.rstrip("_")          # uniform_ draws as uniform
    if name in ("rand_like", "randn_like"):
        return (0.5, "torch.rand_like as its median") if name == "rand_like" else \
            (0.0, "torch.randn_like as its mean")
    if name in ("rand", "uniform"):
        lo = kwargs.get("from", args[1] if name == "uniform" and len(args) > 1 else 0.0)
        hi = kwargs.get("to", args[2] if name == "uniform" and len(args) > 2 else 1.0)
        return (lo + hi) / 2, f"torch.{name} as its median"
    if name in ("randn", "normal"):
        if name == "normal" and func._overloadname == "default":
            mean = kwargs.get("mean", args[1] if len(args) > 1 else 0.0)
        elif name == "normal":
            mean = args[0] if not isinstance(args[0], torch.Tensor) else None
        else:
            mean = 0.0
        return (None, None) if mean is None else (mean, f"torch.{name} as its mean")
    if name == "randint":
        ints = [a for a in args if isinstance(a, int)]
        shape_first = isinstance(args[0], (list, tuple)) if args else False
        if shape_first:
            return None, None
        lo, hi = (0, ints[0]) if len(ints) == 1 or isinstance(args[1], (list, tuple)) else (ints[0], ints[1])
        return lo + (hi - lo - 1) // 2, "torch.randint as the middle of its range"
    if name == "bernoulli" and len(args) > 1 and isinstance(args[1], float):
        return float(args[1] >= 0.5), "torch.bernoulli as its likelier outcome"
    if name == "bernoulli" and isinstance(args[0], torch.Tensor) and not _unknown(args[0]):
        p = float(args[0].constant.reshape(-1)[0]) if args[0].numel() else 0.0
        return float(p >= 0.5), "torch.bernoulli as its likelier outcome"
    return None, None


_INDEX = aten.index.Tensor
_INDEXING = {getattr(aten, n).default if n != "index" else aten.index.Tensor
             for n in ("index", "index_put", "index_put_", "_index_put_impl_")}


def _unknown_mask(i) -> bool:
    return isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) and _unknown(i)


def _all_selected(indices):
    """Boolean masks as the long indices of every element (one index tensor per mask dim)."""
    out = []
    for i in indices:
        if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8):
            out.extend(torch.empty(i.numel(), dtype=torch.long, device=i.device) for _ in range(i.dim()))
        else:
            out.append(i)
    return out


def _real_like(t: torch.Tensor, device) -> torch.Tensor:
    return torch.zeros_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=device) \
        if hasattr(torch, "zeros_strided") else \
        torch.zeros(tuple(t.shape), dtype=t.dtype, device=device).as_strided(tuple(t.shape), tuple(t.stride()))


def _macs(func, args, kwargs, out) -> int:
    """The op's multiply-accumulates by layerscope's own formula (0 where it has none)."""
    from ..costs import FREE, CostOptions, OpCall, lookup
    fn = lookup(func)
    if fn is None or fn is FREE:
        return 0
    try:
        return int(fn(OpCall(func, args, kwargs, out, CostOptions())).macs)
    except Exception:  # a formula that cannot read these arguments: judge by bytes alone
        return 0


def _probe_real(func, args, kwargs, device):
    """Run ``func`` for real on zero-filled tensors shaped like ``args`` (in the caller's grad mode:
    oneDNN's LSTM keeps no workspace under no_grad). Returns (output sizes, scratch): each output's
    (shape, stride, dtype), and the most bytes the kernel held above its outputs while it ran, from
    the profiler's allocation events (0 where a profiler is already running: it cannot nest)."""
    from .measure import profile_events

    result = []

    def run():
        # tensors inside lists too (cuDNN's RNN takes its weights as a list)
        real_args = tree_map_only(torch.Tensor, lambda a: _real_like(a, device), list(args))
        real = func(*real_args, **kwargs)
        reals = real if isinstance(real, (tuple, list)) else (real,)
        result.append([(tuple(r.shape), tuple(r.stride()), r.dtype) if isinstance(r, torch.Tensor) else None
                       for r in reals])
        result.append(sum(r.untyped_storage().nbytes() for r in reals if isinstance(r, torch.Tensor)))

    with disable_current_modes():
        if profiler_enabled() or device.type != "cpu":
            run()
            return result[0], 0
        allocations, _ = profile_events(run)
    running = peak = 0
    for _, size, _, _ in sorted(allocations, key=lambda e: e[0]):
        running += size
        peak = max(peak, running)
    # the inputs were allocated inside run() too and are freed with it: only the peak above the
    # inputs and outputs counts as the kernel's own scratch
    inputs = sum(a.numel() * a.element_size() for a in tree_leaves(list(args)) if isinstance(a, torch.Tensor))
    return result[0], max(0, peak - inputs - result[1])


@dispatch_mode
class SimulationKernels:
    """Below the recorder: random draws get their median, nonzero its largest size, and kernels whose
    fake output sizes are wrong the real sizes."""

    def __init__(self, cap, log: SimulationLog) -> None:
        super().__init__()
        self.cap = cap
        self.log = log
        # The ops ``call`` does more than run that the op recorder otherwise runs without a second
        # look (it runs this in place of them, capture/recorder.py): the probed kernels. nonzero,
        # boolean-mask indexing and random ops are special cases there already.
        self.watch = frozenset(_PROBED) if log.probe else frozenset()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.call(func, args, kwargs or {})

    def call(self, func, args, kwargs):
        """Run ``func``, as a mode below the recorder would (the recorder calls it directly)."""
        if self.log.real:   # a tracked real step: outputs are real, only the kernels' scratch is added
            out = func(*args, **kwargs)
            if func in _PROBED and self.log.probe:
                self._probe(func, args, kwargs, out, fix=False)
            return out
        if func is _NONZERO and _unknown(args[0]) and self.cap.phase is BACKWARD:
            self.log.add("nonzero", "nonzero", _where(self.cap))
            x = args[0]
            return torch.empty((x.numel(), x.dim()), dtype=torch.long, device=x.device)
        if func in _INDEXING and (func is not _INDEX or self.cap.phase is BACKWARD) and len(args) > 1 \
                and isinstance(args[1], (list, tuple)) and any(_unknown_mask(i) for i in args[1]):
            # a boolean mask without values (fake kernels call nonzero on it inside themselves):
            # every element selected, as nonzero above. Only where the shapes that follow do not
            # depend on it (a masked assignment), or in backward (the gathered gradient is transient);
            # a forward whose shapes depend on values still fails and says to use simulate=False.
            self.log.add("nonzero", "nonzero", _where(self.cap))
            args = (args[0], _all_selected(args[1]), *args[2:])
        out = func(*args, **kwargs)
        if torch.Tag.nondeterministic_seeded in func.tags and isinstance(out, torch.Tensor) \
                and out.numel() == 1 and getattr(out, "fake_mode", None) is not None:
            self._draw(func, args, kwargs, out)
        elif func in _PROBED and self.log.probe:
            out = self._probe(func, args, kwargs, out)
        return out

    def _draw(self, func, args, kwargs, out) -> None:
        try:
            value, what = _median(func, args, kwargs)
        except (IndexError, TypeError, ValueError):
            value = None
        if value is None or out.device.type not in ("cpu", "cuda") or \
                out.device.type == "cuda" and not torch.cuda.is_available():
            return      # left without a value: a read of it is noted by ValueReads
        with no_dispatch():
            const = torch.full(tuple(out.shape), value, dtype=out.dtype, device=out.device)
        out.constant = const
        with contextlib.suppress(Exception):   # lets FakeTensorMode drop the constant if it is written to
            out.fake_mode.fake_tensor_converter.add_constant_storage_mapping(out)
        self.log.add("random", what, _where(self.cap))

    def _probe(self, func, args, kwargs, out, fix: bool = True):
        """``out``: the outputs; with ``fix``, fake ones given the real sizes (a real step: scratch only)."""
        outs = out if isinstance(out, (tuple, list)) else (out,)
        flat = [a for a in tree_leaves(list(args)) if isinstance(a, torch.Tensor)]
        device = next((t.device for t in flat), None)
        if device is None or device.type not in ("cpu", "cuda") or \
                device.type == "cuda" and not torch.cuda.is_available():
            self.log.add("size", f"{func._opname} could not be sized by a real call here (no {device} "
                         f"to run it on): scratch the kernel allocates inside itself is not counted",
                         _where(self.cap))
            return out
        key = (func, tuple((tuple(a.shape), tuple(a.stride()), a.dtype) if isinstance(a, torch.Tensor) else repr(a)
                           for a in tree_leaves(list(args))))
        sizes = self.log.probes.get(key)
        if sizes is None:
            # the zero-filled inputs and the outputs
            need = sum(t.numel() * t.element_size() for t in flat) + \
                sum(t.numel() * t.element_size() for t in outs if isinstance(t, torch.Tensor))
            if need > PROBE_LIMIT or _macs(func, args, kwargs, out) > PROBE_MACS:
                sizes = (f"{func._opname} was not sized by a real call (it would need over "
                         f"{PROBE_LIMIT >> 20} MiB or {PROBE_MACS / 1e9:g} GMACs): scratch the kernel "
                         f"allocates inside itself is not counted")
            else:
                try:
                    sizes = _probe_real(func, args, kwargs, device)
                except Exception as e:  # the real kernel refuses these arguments: keep the fake sizes
                    sizes = (f"{func._opname} could not be sized by a real call ({type(e).__name__}): "
                             f"counted as the fake kernel's")
            self.log.probes[key] = sizes
        if isinstance(sizes, str):      # not sized: say so at every call
            self.log.add("size", sizes, _where(self.cap))
            return out
        sizes, scratch = sizes
        if scratch and self.cap.storage is not None:
            self.cap.storage.transient(scratch)     # alive during this op only
        if not fix:
            return out
        fixed = list(outs)
        for i, (o, s) in enumerate(zip(outs, sizes)):
            if isinstance(o, torch.Tensor) and s is not None and tuple(o.shape) != s[0] and o.dtype == s[2]:
                fixed[i] = torch.empty_strided(s[0], s[1], dtype=s[2], device=o.device)
        return type(out)(fixed) if isinstance(out, (tuple, list)) else fixed[0]


@dispatch_mode
class ValueReads:
    """Above the recorder: notes each value read back from a tensor that has none."""

    def __init__(self, cap, log: SimulationLog) -> None:
        super().__init__()
        self.cap = cap
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.note(func, args)
        return func(*args, **(kwargs or {}))

    def note(self, func, args) -> None:
        """Note ``func`` if it reads a value that is not there (the recorder calls this directly)."""
        if func is _LOCAL_SCALAR and _unknown(args[0]):
            self.log.add("read", "a tensor's value (.item(), bool(tensor), int(tensor))", _where(self.cap))
        elif func is _UNIQUE2 and _unknown(args[0]):
            self.log.add("read", "torch.unique's values", _where(self.cap))


# ---- third-party checks for fake tensors -------------------------------------------------------------
# transformers asks "is this tensor fake?" to decide whether it is being traced (torch.export,
# torch.compile), and if so takes its trace-safe path: an explicit causal mask where the real eager
# step passes is_causal=True to SDPA and builds none (+6 to +7% on a shrunk Llama/Mistral/Qwen2).
# A simulation is not a trace: the real step's path is the one to take. While a simulation runs,
# transformers' is_fake_tensor answers False for the tensors of layerscope's own FakeTensorMode
# only; every other tensor (another thread's, a user's own FakeTensorMode) gets the original answer.
# The function is swapped back when the last simulation ends.
_OURS: "set[int]" = set()
_PATCH_LOCK = threading.Lock()
_ORIGINAL: list = []


def _is_fake_tensor_but_ours(x) -> bool:
    return _ORIGINAL[0](x) and id(getattr(x, "fake_mode", None)) not in _OURS


@contextlib.contextmanager
def eager_paths(fake_mode):
    """For the duration, third-party code that checks for fake tensors sees this mode's tensors as
    real ones (see above). Does nothing unless transformers is already imported."""
    utils = sys.modules.get("transformers.utils.import_utils")
    if utils is None or not callable(getattr(utils, "is_fake_tensor", None)):
        yield
        return
    key = id(fake_mode)
    with _PATCH_LOCK:
        if not _OURS:
            _ORIGINAL[:] = [utils.is_fake_tensor]
            utils.is_fake_tensor = _is_fake_tensor_but_ours
        _OURS.add(key)
    try:
        yield
    finally:
        with _PATCH_LOCK:
            _OURS.discard(key)
            if not _OURS and _ORIGINAL:
                if utils.is_fake_tensor is _is_fake_tensor_but_ours:
                    utils.is_fake_tensor = _ORIGINAL[0]
                _ORIGINAL.clear()
