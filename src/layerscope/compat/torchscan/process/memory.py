"""torchscan 0.2's ``measure_peak_memory(workload, *, device)``: the peak memory PyTorch's allocator
held while ``workload()`` ran once (a measurement of a real run, not one of layerscope's estimates).

* ``cpu`` (metric ``pytorch_tensor_bytes``): the profiler's memory timeline of the run (allocation
  events with ``profile_memory=True``; ``record_shapes`` and ``with_stack``, which the timeline
  needs, tell the tensors the workload used that existed before it, its parameters and inputs).
  ``baseline_bytes`` are those pre-existing tensors, ``peak_bytes`` the most bytes of tracked
  tensors alive at any moment of the run (baseline included), ``delta_bytes`` their difference.
  The timeline's raw events are read, so that an allocation at the run's first instant counts in
  the peak's growth (torchscan reads the coalesced timeline, whose first point already holds the
  first allocation when nothing pre-existed: a workload making one tensor of N float32 reads there
  baseline 4N and delta 0; here baseline 0 and delta 4N).
* ``cuda`` (metric ``pytorch_reserved_bytes``): the caching allocator's reserved bytes before, its
  peak reserved and peak allocated bytes during the run (``torch.cuda``), synchronized around it.
* ``mps``: the same through ``torch.accelerator.memory`` and ``torch.mps.synchronize``.

Any other device type raises ``NotImplementedError``, as does a torch without the needed APIs; an
unavailable device raises ``RuntimeError`` before the workload runs. One measurement runs at a time
(process-wide lock; a workload that measures itself again raises instead of waiting forever). Nothing
is printed (the profiler's own start/stop lines are held back) and no file is left behind, also when
the workload raises, whose exception comes through unchanged.

On CPU the timeline is used rather than ``layerscope.capture.measure.profile_events`` (the allocation
events alone): both see the same allocations, so the growth is the same, but only the timeline knows
the tensors the workload used that were there before it, torchscan's baseline. Its export is
deprecated in torch 2.13 (the warning is not passed on); a torch without it raises
``NotImplementedError``.
"""

from __future__ import annotations

import gzip
import json
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .... import _compat
from ....capture.measure import kineto_quiet

__all__ = ["measure_peak_memory"]

Stats = dict[str, "str | int"]

_LOCK = threading.Lock()
_HOLDER = threading.local()      # .busy: this thread is inside a measurement
_ALLOCATOR_APIS = ("memory_reserved", "reset_peak_memory_stats", "max_memory_reserved", "max_memory_allocated")


def _torch() -> str:
    return f"PyTorch {torch.__version__}"


def _unimplemented(device: torch.device, missing: list[str]) -> NotImplementedError:
    return NotImplementedError(f"Peak memory measurement for '{device}' is unavailable in {_torch()}; "
                               f"missing APIs: {', '.join(missing)}.")


# --- CPU ---------------------------------------------------------------------------------------------

def _timeline_peak(events: list[list[int]]) -> tuple[int, int]:
    """(baseline, peak) from the raw timeline: [time ns, action, signed bytes, category] per event, time
    -1 for tensors that existed before the run; events of one instant are applied together."""
    baseline = sum(int(e[2]) for e in events if e[0] < 0)
    live = peak = baseline
    instant = None
    for time_ns, _, nbytes, _ in sorted((e for e in events if e[0] >= 0), key=lambda e: e[0]):
        if instant is not None and time_ns != instant:
            peak = max(peak, live)
        instant = time_ns
        live += int(nbytes)
    return baseline, max(peak, live)


def _measure_cpu(workload: Callable[[], object], device: torch.device) -> Stats:
    if not callable(getattr(torch.profiler.profile, "export_memory_timeline", None)):
        raise _unimplemented(torch.device("cpu"), ["torch.profiler.profile.export_memory_timeline"])
    running = _compat.get("profiler_enabled")
    if running is not None and running():
        raise RuntimeError("measure_peak_memory on 'cpu' runs the PyTorch profiler, and another profiler is "
                           "running in this process (profilers do not nest); measure outside it.")
    # the timeline's file is made before the run: no writable temporary folder fails before the workload
    with tempfile.NamedTemporaryFile(prefix="layerscope-timeline-", suffix=".raw.json.gz", delete=False) as f:
        path = Path(f.name)
    try:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                      record_shapes=True, with_stack=True)
        with kineto_quiet():
            prof.__enter__()
        try:
            workload()
        finally:
            with kineto_quiet():
                prof.__exit__(None, None, None)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*export_memory_timeline.*deprecated", category=FutureWarning)
            prof.export_memory_timeline(str(path), device="cpu")
        with gzip.open(path, "rt", encoding="utf-8") as f:
            events = json.load(f)
    finally:
        path.unlink(missing_ok=True)
    if not events:
        raise RuntimeError(f"{_torch()} recorded no memory timeline points for 'cpu': the workload made and "
                           "used no PyTorch-tracked CPU tensors.")
    baseline, peak = _timeline_peak(events)
    return {"device": "cpu", "metric": "pytorch_tensor_bytes", "baseline_bytes": baseline, "peak_bytes": peak,
            "delta_bytes": peak - baseline}


# --- CUDA and MPS: the caching allocator's own counters ---------------------------------------------

def _around(workload: Callable[[], object], device: torch.device, sync: Callable[[], object], api: Any,
            unsupported: NotImplementedError | None = None) -> Stats:
    """sync, reserved bytes, reset the peaks, run, sync, peak reserved, peak allocated: in that order.
    ``unsupported``: raised (the workload not run) when the first two reads say the allocator has no
    such statistics (MPS allocators without device statistics raise then)."""
    sync()
    try:
        baseline = int(api.memory_reserved(device))
        api.reset_peak_memory_stats(device)
    except (NotImplementedError, RuntimeError) as error:
        if unsupported is None:
            raise
        raise unsupported from error
    workload()
    sync()
    peak = int(api.max_memory_reserved(device))
    allocated = int(api.max_memory_allocated(device))
    return {"device": str(device), "metric": "pytorch_reserved_bytes", "baseline_bytes": baseline,
            "peak_bytes": peak, "delta_bytes": peak - baseline, "allocated_peak_bytes": allocated}


def _measure_cuda(workload: Callable[[], object], device: torch.device) -> Stats:
    cuda = torch.cuda
    if not cuda.is_available():
        raise RuntimeError(f"Requested CUDA device '{device}' is unavailable in {_torch()}; check that torch "
                           "was built with CUDA and that an NVIDIA driver and GPU are present.")
    count = cuda.device_count()
    index = cuda.current_device() if device.index is None else device.index
    device = torch.device("cuda", index)
    if index >= count:
        raise RuntimeError(f"Requested CUDA device '{device}' is unavailable in {_torch()}; it sees {count} "
                           "CUDA device(s).")
    missing = [f"torch.cuda.{name}" for name in ("synchronize", *_ALLOCATOR_APIS)
               if not callable(getattr(cuda, name, None))]
    if missing:
        raise _unimplemented(device, missing)
    return _around(workload, device, lambda: cuda.synchronize(device), cuda)


def _measure_mps(workload: Callable[[], object], device: torch.device) -> Stats:
    if device.index not in (None, 0):
        raise RuntimeError(f"Requested MPS device '{device}' is unavailable in {_torch()}; MPS has one device "
                           "('mps' or 'mps:0').")
    device = torch.device("mps")
    backend = getattr(torch.backends, "mps", None)
    if backend is None or not backend.is_available():
        raise RuntimeError(f"Requested MPS device '{device}' is unavailable in {_torch()}; it needs a torch "
                           "built with MPS on Apple hardware that supports it.")
    memory = getattr(getattr(torch, "accelerator", None), "memory", None)
    missing = [f"torch.accelerator.memory.{name}" for name in _ALLOCATOR_APIS
               if not callable(getattr(memory, name, None))]
    mps = getattr(torch, "mps", None)
    if not callable(getattr(mps, "synchronize", None)):
        missing.append("torch.mps.synchronize")
    if missing:
        raise _unimplemented(device, missing)

    names = ", ".join(f"torch.accelerator.memory.{name}" for name in _ALLOCATOR_APIS)
    unsupported = NotImplementedError(f"Peak memory measurement for '{device}' is unavailable in {_torch()}; "
                                      f"the MPS allocator does not implement {names}.")
    return _around(workload, device, mps.synchronize, memory, unsupported)


_BACKENDS: dict[str, Callable[[Callable[[], object], torch.device], Stats]] = {
    "cpu": _measure_cpu, "cuda": _measure_cuda, "mps": _measure_mps}


def measure_peak_memory(workload: Callable[[], object], *, device: str | torch.device) -> dict[str, str | int]:
    """Run ``workload()`` once on ``device`` (where its tensors already are) and return the allocator's
    figures in bytes, JSON-serializable: ``device``, ``metric``, ``baseline_bytes``, ``peak_bytes``,
    ``delta_bytes`` (peak - baseline), and on CUDA/MPS ``allocated_peak_bytes``.

    Raises ``NotImplementedError`` for a device type or a torch that cannot be measured, ``RuntimeError``
    for an unavailable device (the workload not run), and whatever the workload raises, unchanged."""
    if getattr(_HOLDER, "busy", False):
        raise RuntimeError("measure_peak_memory cannot measure inside a workload it is measuring.")
    with _LOCK:
        _HOLDER.busy = True
        try:
            target = torch.device(device)
            measure = _BACKENDS.get(target.type)
            if measure is None:
                raise NotImplementedError(f"Peak memory measurement is not implemented for '{target}' in "
                                          f"{_torch()}.")
            return measure(workload, target)
        finally:
            _HOLDER.busy = False
