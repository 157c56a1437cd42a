"""Measure a real step with the allocator, independently of storage tracking.

* CPU: the profiler's allocation events (``profile_memory=True``): every allocation and free of the
  CPU allocator with its size, so the running sum is the memory the step added. The profiler records
  the thread it was started on; where other threads allocate and free a step's tensors (a collective
  backend's workers), the allocator's own count of every thread (``count_cpu_allocations``) is read
  instead.
* CUDA: ``torch.cuda.max_memory_allocated`` per step, the allocator's reserved bytes, and the process
  overhead outside the allocator (device memory used per NVML minus reserved: mostly the CUDA context).
  Given the step's own bytes before it (``before``), a step's peak is those plus the largest growth
  over what the device held when the run began, so that other tensors of the process (an earlier
  model, a cache) stay out of it. cuBLAS's workspaces, which a thread's first matrix product makes
  and the process keeps, are given back first, so that the measured steps make their own.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import Callable

import torch

from .. import _compat
from .._compat import profiler_event_tree
from ..errors import InputError

__all__ = ["Measured", "measure_cpu", "measure_cuda", "state_bytes", "profile_events", "count_cpu_allocations",
           "read_counted", "kineto_quiet", "available_bytes", "real_step_need", "REAL_STEP_MARGIN"]

# A real step runs only where what it adds to the process, with this margin, fits in what the device
# has available (issue 58: a measured search at --limit 80gib grew the process to 22 GB and the kernel
# killed it). Measured on small_cnn (CPU, batches 256 and 1,024): the allocator's peak is 12% above the
# simulated one (oneDNN convolution scratch the simulation cannot see), the process's resident memory
# grows 18% above it, plus ~170 MiB once (the profiler, oneDNN's kernels) -- 25% + 512 MiB covers both,
# and leaves the rest of the host some room, as MemAvailable is itself an estimate.
REAL_STEP_MARGIN = (0.25, 512 * 2 ** 20)


def available_bytes(device: "str | torch.device") -> int | None:
    """Memory free for new allocations on ``device``: MemAvailable from /proc/meminfo for the CPU,
    torch.cuda.mem_get_info for a GPU; None where it cannot be read (other systems, meta)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(dev)[0])
        except Exception:  # noqa: BLE001 - no driver: nothing to compare with
            return None
    if dev.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def real_step_need(added: int) -> int:
    """What a real step that adds ``added`` bytes (its simulated peak less what is already held) is
    allowed to need of the available memory: ``added`` with ``REAL_STEP_MARGIN``."""
    ratio, fixed = REAL_STEP_MARGIN
    return int(max(0, added) * (1 + ratio)) + fixed


@dataclass(frozen=True, slots=True)
class Measured:
    """A real run of the same step, measured by the allocator rather than by storage tracking."""

    method: str
    device: str
    peak_bytes: int                # before_bytes + the largest growth during the run
    before_bytes: int              # what the step's own tensors held before it began
    step_peaks: tuple[int, ...]
    reserved_bytes: int | None = None    # CUDA: allocator reserved at the peak
    context_bytes: int | None = None     # CUDA: process memory (NVML) minus reserved
    notes: tuple[str, ...] = ()



def state_bytes(tensors, device: torch.device | None = None, block=None) -> int:
    """Bytes of the distinct storages behind these tensors (what exists before a step begins); with
    ``device``, only those there, each rounded by ``block`` (the CUDA allocator's 512-byte blocks:
    what its counters read)."""
    seen, total = set(), 0
    for t in tensors:
        st = t.untyped_storage()
        if device is not None and st.device != device:
            continue
        key = (st.data_ptr(), st.device)
        if key not in seen:
            seen.add(key)
            total += block(st.nbytes()) if block is not None else st.nbytes()
    return total


_SAFE_THREADS: set[int] = set()    # idents of threads whose stderr output may be held back and passed on


@contextlib.contextmanager
def quiet_safe_threads(threads):
    """While inside: these threads (a caller's own spinner) do not stop the profiler's stderr
    hold-back; what they write to stderr meanwhile is passed on after it."""
    idents = {t.ident for t in threads if t.ident is not None}
    _SAFE_THREADS.update(idents)
    try:
        yield
    finally:
        _SAFE_THREADS.difference_update(idents)


@contextlib.contextmanager
def kineto_quiet():
    """Hold back what the profiler's C++ side writes to stderr as it starts and stops (torch 2.13's
    kineto logs "USDT: ... profiler_start" lines whatever the log level): fd 2 goes to a temporary
    file for the duration, and any other line written there is passed on. fd 2 is the process's:
    with other Python threads running (which could write to stderr meanwhile) nothing is held back,
    unless they are known to only draw a spinner (``quiet_safe_threads``)."""
    me = threading.current_thread()
    if any(t is not me and t.ident not in _SAFE_THREADS for t in threading.enumerate()):
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):    # no real fd 2 (embedded interpreters): nothing to hold back
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            rest = [ln for ln in tmp.read().decode(errors="replace").splitlines(keepends=True)
                    if "USDT:" not in ln and "ActivityProfilerHandler" not in ln]
            if rest:
                sys.stderr.write("".join(rest))


def profile_events(run: Callable, cuda: bool = False, prefix: str = "layerscope.", windows: dict | None = None,
                   ptrs: list | None = None):
    """Run ``run()`` under the profiler with allocation events. Returns (allocations, ranges):
    allocations as (time ns, +/- bytes, device, innermost enclosing range named ``prefix``... or
    None), and the ranges named ``prefix``... as (time ns, name). ``windows``, when given, is filled
    with each range's (start, end) in ns; ``ptrs`` with each allocation's address, in order."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities, profile_memory=True)
    with kineto_quiet():
        prof.__enter__()
    try:
        run()
    finally:
        with kineto_quiet():
            prof.__exit__(None, None, None)
    tree = profiler_event_tree(prof)   # kineto's event tree is not public API (_compat)
    allocations: list[tuple] = []
    ranges: list[tuple[int, str]] = []

    def walk(node, scope):
        name = getattr(node, "name", "")
        if name.startswith(prefix):
            ranges.append((node.start_time_ns, name))
            if windows is not None:
                windows[name] = (node.start_time_ns, getattr(node, "end_time_ns", node.start_time_ns))
            scope = name
        extra = getattr(node, "extra_fields", None)
        if type(extra).__name__ == "_ExtraFields_Allocation":
            allocations.append((node.start_time_ns, int(extra.alloc_size), extra.device, scope))
            if ptrs is not None:
                ptrs.append(int(extra.ptr))
        for child in node.children:
            walk(child, scope)

    for root in tree:
        walk(root, None)
    return allocations, ranges


def count_cpu_allocations(on: bool = True) -> bool:
    """From now on (``on=False``: no more), the CPU allocator keeps the size of every block any
    thread makes and their running total (libc10's memory reporter, the flag
    ``caffe2_report_cpu_memory_usage``; it logs at INFO level, which c10 does not print by default).
    ``measure_cpu(threads=True)`` then reads that count for every thread. Call it before the tensors
    a measured step will free are made: a block made before is freed without being counted. A
    process-wide switch: for a process of one's own (a torchrun rank), not a user's. Turned off, every
    allocation and free costs what it did before (a lock and a table lookup each while on). Returns
    whether this torch has it."""
    flags = _compat.get("c10_cpu_report_flags")
    if flags is None:
        return False
    flags[0].value = bool(on)
    return True


_C10_LINE = re.compile(rb"C10 (alloc|deleted) (\d+) bytes, total alloc (\d+) bytes")
_STEP_MARK = re.compile(rb"^layerscope\.step (\d+) (begin|end)$")
# c10's INFO lines (under torchrun prefixed with the rank): not printed unless c10's level is INFO
_C10_INFO = re.compile(rb"^(\[rank\d+\]:)?\[I\d")


def read_counted(log, steps: int) -> tuple[list[int], list[str]]:
    """From a file of the allocator's count (``_measure_counted``): each of the first ``steps`` steps'
    largest total less the total before the first event, and the file's other lines."""
    peaks, rest = [0] * steps, []
    base = total = step = None
    for line in log:
        line = line.rstrip(b"\n")
        hit = _C10_LINE.search(line)
        if hit is not None:
            size, total = int(hit.group(2)), int(hit.group(3))
            if base is None:     # the total when the run began: before its first event
                base = total - size if hit.group(1) == b"alloc" else total + size
            if step is not None and step < steps:
                peaks[step] = max(peaks[step], total - base)
            continue
        mark = _STEP_MARK.match(line)
        if mark is not None:
            step = int(mark.group(1)) if mark.group(2) == b"begin" else None
            if step is not None and step < steps and total is not None:
                peaks[step] = max(peaks[step], total - base)
        elif line and not _C10_INFO.match(line):
            rest.append(line.decode(errors="replace") + "\n")
    return peaks, rest


def _measure_counted(run: Callable, before: int, steps: int, level, log_path: str | None = None) -> Measured:
    """The peaks from the CPU allocator's own running total (``count_cpu_allocations``), which every
    thread's allocations and frees move: c10 logs each with the total after it; for the run, fd 2 goes
    to a file (``log_path``, kept if the process dies meanwhile, so that what it wrote is not lost; a
    temporary file without it), c10's level to INFO, and each step's begin and end are written between
    the lines. A step's peak is the largest total logged within it, less the total when the run
    began; the file's other lines (a warning, an error) are passed on to stderr after it, also when
    the run raises."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        raise InputError("measuring every thread's allocations needs the process's stderr (fd 2)") from None

    def on_step(step: int, when: str) -> None:
        os.write(2, f"\nlayerscope.step {step} {when}\n".encode())

    rest: list[str] = []
    with (open(log_path, "w+b") if log_path else tempfile.TemporaryFile()) as log:
        try:
            os.dup2(log.fileno(), 2)
            old = level.value
            level.value = 0
            try:
                run(on_step)
            finally:
                level.value = old
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
        finally:
            log.seek(0)
            peaks, rest = read_counted(log, steps)
            if rest:
                sys.stderr.write("".join(rest))
    if log_path:
        os.remove(log_path)
    peaks = [before + p for p in peaks]
    return Measured(method="the CPU allocator's own running total of every thread's blocks (libc10's memory "
                    "reporter)", device="cpu", peak_bytes=max(peaks, default=before), before_bytes=before,
                    step_peaks=tuple(peaks))


def measure_cpu(run: Callable, before: int, steps: int, threads: bool = False, log_path: str | None = None) -> Measured:
    """``run(on_step)`` runs the step; allocations inside each step's profiler range are summed.
    ``threads``: every thread's allocations and frees count, in time order, also those between steps,
    and a step's peak is the most bytes live within its time window: a collective backend's worker
    threads allocate buffers of their own, and may free a step's tensors after the step ended (counting
    only what is nested in the step's range on its own thread would never see those frees, and drift
    up from step to step). With ``count_cpu_allocations()`` called first, that is the allocator's own
    count; without it (a torch without the reporter's flags), the profiler's events of the thread it
    runs on, frees elsewhere inferred when an address is handed out again (an upper bound).
    ``log_path``: where the allocator's count is written meanwhile (see ``_measure_counted``)."""
    from torch.autograd.profiler import record_function

    gc.collect()     # an earlier run's cycles freed now, not inside a measured step's window
    flags = _compat.get("c10_cpu_report_flags") if threads else None
    if flags is not None and flags[0].value:
        return _measure_counted(run, before, steps, flags[1], log_path)
    ranges: list = []

    def on_step(step: int, when: str) -> None:
        if when == "begin":
            ranges.append(record_function(f"layerscope.step.{step}"))
            ranges[-1].__enter__()
        else:
            ranges[-1].__exit__(None, None, None)

    windows: dict = {}
    ptrs: list = []
    allocations, _ = profile_events(lambda: run(on_step), prefix="layerscope.step.", windows=windows, ptrs=ptrs)
    if threads:
        # every event of every thread in time order, in a step or between steps (a worker thread may
        # free a step's tensor after the step ended); each step's peak is the most within its window.
        # A free on a thread the profiler does not record is still seen when its address is handed
        # out again: malloc never returns a live address, so the block it held was freed by then.
        spans = sorted((a, b, int(name.rsplit(".", 1)[1])) for name, (a, b) in windows.items())
        running, peaks = 0, [0] * steps
        live: dict[int, int] = {}
        for (t, size, _, _), ptr in sorted(zip(allocations, ptrs), key=lambda x: x[0][0]):
            if size > 0:
                running += size - live.pop(ptr, 0)
                live[ptr] = size
            else:
                live.pop(ptr, None)
                running += size
            for a, b, step in spans:
                if a <= t <= b:
                    peaks[step] = max(peaks[step], running)
                    break
    else:
        events = sorted((t, size, int(scope.rsplit(".", 1)[1])) for t, size, _, scope in allocations
                        if scope is not None)   # (time, bytes, step)
        running, peaks = 0, [0] * steps
        for _, size, step in events:
            running += size
            peaks[step] = max(peaks[step], running)
    peaks = [before + p for p in peaks]
    return Measured(method="torch.profiler CPU allocator events (profile_memory=True)", device="cpu",
                    peak_bytes=max(peaks, default=before), before_bytes=before, step_peaks=tuple(peaks))


def measure_cuda(run: Callable, device: torch.device, steps: int, before: int | None = None) -> Measured:
    torch.cuda.synchronize(device)
    # cuBLAS's workspaces (one per thread and stream, kept for the process's life) made by anything
    # before, a simulation's kernel probes included, go back to the allocator's cache: the measured
    # steps make theirs as a training job's first step does (the next GEMM anywhere makes them again)
    clear = _compat.get("clear_cublas_workspaces")
    if clear is not None:
        clear()
    # what the process no longer references but a reference cycle still holds (an earlier model) is
    # collected now, not in the middle of a measured step where its free would lower the peak
    gc.collect()
    start = torch.cuda.memory_allocated(device)
    foreign = 0 if before is None else start - before     # the process's other tensors
    before = start if before is None else before
    peaks: list[int] = []
    reserved = [0]

    def on_step(step: int, when: str) -> None:
        torch.cuda.synchronize(device)
        if when == "begin":
            torch.cuda.reset_peak_memory_stats(device)
        else:
            peaks.append(torch.cuda.max_memory_allocated(device) - foreign)
            reserved[0] = max(reserved[0], torch.cuda.max_memory_reserved(device))

    run(on_step)
    notes = []
    if foreign > 0:
        notes.append(f"{foreign:,} bytes the process held beside the step's own tensors when it began are "
                     "left out of the peaks")
    context = None
    try:
        used = torch.cuda.device_memory_used(device)  # NVML: the whole device, every process
        context = int(used) - torch.cuda.memory_reserved(device)
        notes.append("context_bytes = device memory used (NVML, all processes) minus this process's "
                     "reserved bytes")
    except Exception as e:  # no NVML: leave it unknown rather than guess
        notes.append(f"CUDA context size unknown ({type(e).__name__}: {e})")
    return Measured(method="torch.cuda.max_memory_allocated", device=str(device),
                    peak_bytes=max(peaks, default=before), before_bytes=before, step_peaks=tuple(peaks),
                    reserved_bytes=reserved[0], context_bytes=context, notes=tuple(notes))
