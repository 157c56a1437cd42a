"""``max_batch_size()``: the largest batch whose simulated training step fits a memory limit."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from ..capture.guard import exclusive
from ..capture.prepare import is_fake_model
from ..capture import model_device
from ..capture.measure import state_bytes
from ..capture.notes import Note
from ..errors import InputError
from ..progress import ProgressBar
from ..options import MemoryOptions, entry_options
from ..options import iec, parse_bytes
from ..analyses.memory_step import host_shortfall, memory_step
from ..reports.memory import MemoryReport
from ..reports.notes import NotesField

__all__ = ["BatchFit", "max_batch_size", "real_step_bound"]


def memory_with(model: nn.Module, args: tuple, kwargs: dict, opts: MemoryOptions) -> MemoryReport:
    """One step's MemoryReport at ``opts.batch_size`` (analyses/memory_step.py; the tests replace this
    function to count the steps)."""
    return MemoryReport(**memory_step(model, args, kwargs, opts))


class BatchFit(NotesField):
    """Result of max_batch_size: the largest batch whose predicted peak fits the limit."""

    def __init__(self, batch_size: int, peak_bytes: int | None, limit_bytes: int, samples, report):
        self.batch_size = batch_size
        self.peak_bytes = peak_bytes
        self.limit_bytes = limit_bytes
        self.samples = tuple(samples)   # (batch size, predicted peak) for every simulated batch
        self.report = report            # the MemoryReport at batch_size (None when nothing fits)
        # (batch size, measured peak) of the real steps that checked the answer (none: not checked)
        self.measured: tuple[tuple[int, int], ...] = ()
        # what the answer rests on where it is not what it seems (a real step the host could not hold)
        self.notes = ()
        # the answer is the search's ceiling (max_batch): the largest batch that fits may be larger
        self.capped = False

    @property
    def real_steps(self) -> int:
        """How many real (measured) steps the answer took: at most ``real_step_bound`` of the
        predicted answer (0: not checked by a real step)."""
        return len(self.measured)

    def __repr__(self) -> str:
        peak = iec(self.peak_bytes) if self.peak_bytes is not None else "--"
        return (f"<BatchFit batch_size={self.batch_size} peak={peak} limit={iec(self.limit_bytes)} "
                f"simulations={len(self.samples)} real_steps={self.real_steps}>")


@exclusive
def max_batch_size(model: nn.Module, *args: Any, limit, batch_dim: int = 0, max_batch: int = 1 << 20,
                   options: MemoryOptions | None = None, forward_kwargs: dict | None = None,
                   **kwargs: Any) -> BatchFit:
    """The largest batch size whose predicted peak (``memory(...)`` with the same arguments) fits
    ``limit`` (bytes, or a string such as "80GiB"). Peaks at batch 1 and 2 give a line; the batch it
    predicts and the one above are simulated, which proves the answer where the peak is affine in the
    batch size (4 simulations); elsewhere a line through neighbouring batches predicts again, then
    bisection brackets it. The result is always verified by a simulation at that batch and one above
    it (``BatchFit.samples``: every batch simulated). With real weights on the device planned for, one real
    step at the answer is then measured with the allocator (``BatchFit.measured``); where it does not
    fit, real steps bisect below it (at most ceil(log2(answer)) + 2 of them, ``BatchFit.real_steps``),
    so scratch the simulation cannot see (oneDNN convolution workspace) never makes the answer too
    large. A real step runs only where its simulated peak, less the weights held, with
    ``capture.measure.REAL_STEP_MARGIN`` fits in the memory the device has available; above that the
    answer is the simulation's and ``BatchFit.notes`` says so (issue 58: the host was asked for 80 GiB
    and the kernel killed the process). ``progress=True`` shows a bar on stderr for those real steps.

    The steps are ``memory()``'s: its options as keywords (``optimizer=``, ``training=``, ...) or in
    ``options=MemoryOptions(...)``, not both ways; ``batch_dim`` is the dimension the batch is resized
    along (a ``batch_dim`` in ``options`` must agree with it), and ``batch_size`` is what this searches."""
    opts, kwargs = entry_options(MemoryOptions, options, kwargs, forward_kwargs)
    if opts.batch_dim not in (None, batch_dim) and batch_dim != 0:
        raise InputError(f"batch_dim={batch_dim} disagrees with options.batch_dim={opts.batch_dim}")
    if opts.batch_size is not None:
        raise InputError("max_batch_size() searches the batch size: leave batch_size unset")
    # progress=True: one bar for the real steps that check the answer (the simulations show none)
    progress = opts.progress
    opts = dataclasses.replace(opts, batch_dim=batch_dim if opts.batch_dim is None else opts.batch_dim,
                               progress=False)
    return _Search(model, args, kwargs, opts, parse_bytes(limit), max_batch, progress).run()


class _Search:
    """max_batch_size()'s simulated search: every batch simulated (``reports``), the largest known to fit
    (``lo``) and the smallest known not to (``hi``; None: none yet), then the real steps that check it."""

    def __init__(self, model: nn.Module, args: tuple, kwargs: dict, opts: MemoryOptions, limit_bytes: int,
                 max_batch: int, progress: bool):
        self.model, self.args, self.kwargs, self.opts = model, args, kwargs, opts
        self.limit_bytes, self.max_batch, self.progress = limit_bytes, max_batch, progress
        self.reports: dict[int, Any] = {}
        self.lo, self.hi = 2, None

    def run(self) -> BatchFit:
        peak, limit_bytes = self.peak, self.limit_bytes
        if peak(1) > limit_bytes:
            return self.done(0)
        slope = peak(2) - peak(1)
        if peak(2) > limit_bytes:
            return self.done(1)
        if slope <= 0:
            raise InputError("the predicted peak does not grow with the batch size; check batch_dim")
        if self.max_batch <= 2:
            return self.done(self.max_batch)
        # The answer is the largest batch that fits, once one that fits (lo) and the next that does not
        # (hi = lo + 1) are both simulated, or lo reaches max_batch. Where the peak is affine in the
        # batch size, the line through batches 1 and 2 predicts the answer exactly: it and one above are
        # simulated to prove it (4 simulations in all). Where it is not (the peak moves from one phase
        # to another as activations grow, or allocation blocks round), the line through the last two
        # batches simulated, next to each other, predicts again; then doubling and bisection, as before.
        self._follow_lines(min(self.max_batch, max(3, 1 + (limit_bytes - peak(1)) // slope)))
        if self.settled():
            return self.done(self.lo)
        return self._bracket()

    def peak(self, b: int) -> int:
        if b not in self.reports:
            # simulated only: the real steps are _checked's, each within what the host can hold
            self.reports[b] = memory_with(self.model, self.args, self.kwargs,
                                          dataclasses.replace(self.opts, batch_size=b, measure=False))
        return self.reports[b].peak_bytes

    def done(self, b: int) -> BatchFit:
        """The answer ``b``, checked by real steps where the model allows (``_checked``)."""
        reports = self.reports
        samples = sorted((k, r.peak_bytes) for k, r in reports.items())
        fit = BatchFit(b, reports[b].peak_bytes if b else None, self.limit_bytes, samples, reports.get(b))
        fit.capped = b >= self.max_batch
        return _checked(fit, self.model, self.args, self.kwargs, self.opts, self.limit_bytes, reports,
                        self.progress)

    def settled(self) -> bool:
        return self.lo >= self.max_batch or self.hi == self.lo + 1

    def fits(self, b: int) -> bool:
        ok = self.peak(b) <= self.limit_bytes
        if ok:
            self.lo = max(self.lo, b)
        else:
            self.hi = b if self.hi is None else min(self.hi, b)
        return ok

    def _follow_lines(self, b: int) -> None:
        """Up to three predictions, each from the line through the last two neighbouring batches simulated,
        starting from ``b``: the prediction, and its neighbour on the side that would prove it."""
        reports, peak = self.reports, self.peak
        for _ in range(3):
            near = b + 1 if self.fits(b) else b - 1
            if self.settled():
                return
            if self.lo < near < (self.hi if self.hi is not None else self.max_batch + 1):
                self.fits(near)
                if self.settled():
                    return
            a, z = min(b, near), max(b, near)
            local = peak(z) - peak(a) if (a in reports and z in reports and z == a + 1) else 0
            if local <= 0:
                return
            b = a + (self.limit_bytes - peak(a)) // local      # the last batch on the local line that fits
            b = min(self.max_batch, max(self.lo + 1, b if self.hi is None else min(b, self.hi - 1)))
            if b in reports:
                return

    def _bracket(self) -> BatchFit:
        """Doubling from lo until a batch fails (or max_batch fits), then bisection."""
        b = self.lo
        while self.hi is None:  # doubling until one fails
            b = min(self.max_batch, b * 2)
            if self.fits(b) and b >= self.max_batch:
                return self.done(b)
        while self.hi - self.lo > 1:
            mid = (self.lo + self.hi) // 2
            self.fits(mid)
        return self.done(self.lo)


def real_step_bound(batch: int) -> int:
    """The most real steps ``_checked`` takes for a predicted answer ``batch``: ceil(log2(batch)) + 2
    (the step at the answer, one spare for a prediction, then what bisection of 1..batch needs)."""
    return 0 if batch < 1 else (batch - 1).bit_length() + 2


def _clog2(n: int) -> int:
    """Bisection steps that narrow ``n`` candidates' gap (hi - lo = n) to 1: ceil(log2(n))."""
    return (n - 1).bit_length() if n > 1 else 0


def _checked(fit: BatchFit, model, args, kwargs, opts: MemoryOptions, limit_bytes, reports,
             progress: bool = False) -> BatchFit:
    """Where the model has real weights on the device planned for, measure one real step at the
    answer (as partition() measures working memory); where its measured peak exceeds the limit,
    search below it with real steps: scratch that kernels allocate inside themselves (oneDNN
    convolutions) is invisible to the simulation, so a predicted fit is not proof. The answer is
    never a batch that did not fit.

    The search (issue 34: it used to step down one batch at a time, a real step each -- 13 minutes
    for small_cnn under 1 GiB on CPU) keeps lo, the largest batch measured to fit (0: none yet), and
    hi, the smallest measured not to fit, and measures the batch the measurements predict (see
    ``_predict``) where that keeps the worst case within budget, else the midpoint (bisection). At
    most ``real_step_bound(answer)`` real steps; where the measured peak grows with the batch, the
    answer a step down one at a time finds."""
    b = fit.batch_size
    if b < 1 or opts.simulate is False or opts.measure is False or is_fake_model(model):
        return fit
    here = model_device(model)
    device = opts.device
    if here.type not in ("cpu", "cuda") or (device is not None and torch.device(device) != here):
        return fit
    held = state_bytes([*model.parameters(), *model.buffers()])
    measured: dict[int, int] = {}
    refused: list[str] = []
    budget = real_step_bound(b)
    bar = ProgressBar(budget, f"measuring real steps below batch {b}") if progress else None

    def fits(k: int) -> bool:
        why = _host_room(k, reports, held, here)
        if why is not None:            # not run: counted as not shown to fit, so never the answer
            refused.append(why)
            return False
        rep = memory_with(model, args, kwargs, dataclasses.replace(opts, batch_size=k, measure=True))
        measured[k] = rep.measured.peak_bytes
        if bar is not None:
            bar.advance()
        if measured[k] <= limit_bytes:
            reports[k] = rep
            return True
        return False

    try:
        lo, hi = (b, b + 1) if fits(b) else (0, b)
        if refused:
            # the host cannot hold a real step at the answer: it is the simulation's (issue 58)
            fit.notes = (Note("batch-not-checked", {"why": refused[0]}),)
            return fit
        while hi - lo > 1:
            left = budget - len(measured)         # >= _clog2(hi - lo): bisection alone fits in it
            k = _predict(lo, hi, measured, reports, limit_bytes)
            if k is None or 1 + max(_clog2(k - lo), _clog2(hi - k)) > left:
                k = (lo + hi) // 2
            if fits(k):
                lo = k
            else:
                hi = k
    finally:
        if bar is not None:
            bar.close()
    samples = sorted((k, r.peak_bytes) for k, r in reports.items())
    out = BatchFit(lo, reports[lo].peak_bytes if lo else None, limit_bytes, samples, reports.get(lo))
    out.measured = tuple(sorted(measured.items()))
    out.capped = fit.capped and lo == fit.batch_size
    if refused:     # the first, and how many more (each lower batch was tried as bisection went on)
        out.notes = (Note("batch-not-run", {"why": refused[0], "more": len(refused) - 1}),)
    return out


def _host_room(k: int, reports: dict, held: int, device: torch.device) -> str | None:
    """Why a real step at batch ``k`` must not run (None: it may): its simulated peak (that of the
    smallest batch simulated at or above ``k``: the peak grows with the batch), less ``held`` (the
    weights, already allocated), with its margin, is more than ``device`` has available
    (``host_shortfall``). Nothing simulated at or above ``k``: None (``memory_with`` refuses the
    step itself)."""
    above = [b for b in reports if b >= k]
    if not above:
        return None
    return host_shortfall(reports[min(above)].peak_bytes - held, device, f"batch {k}'s real step")


def _predict(lo: int, hi: int, measured: dict, reports: dict, limit: int) -> int | None:
    """The largest batch strictly between lo and hi that the measurements predict fits, on a line
    through measured peaks: those at lo and hi where both are measured; else (nothing measured to
    fit yet) the two smallest batches measured not to fit; else the one at hi with the simulation's
    slope (batches 1 and 2), which kernel scratch growing with the batch makes an underestimate of
    the answer, so it tends to bracket it. None: no line to predict from."""
    fails = sorted(k for k in measured if k >= hi)
    if hi not in measured and len(fails) < 2:
        return None                   # hi was not run (the host could not hold it): no line through it
    if lo in measured and hi in measured:
        (a, pa), (z, pz) = (lo, measured[lo]), (hi, measured[hi])
    elif len(fails) >= 2:
        (a, pa), (z, pz) = (fails[0], measured[fails[0]]), (fails[1], measured[fails[1]])
    elif 1 in reports and 2 in reports:
        z, pz = hi, measured[hi]
        a, pa = hi - 1, pz - (reports[2].peak_bytes - reports[1].peak_bytes)
    else:
        return None
    if pz <= pa:
        return None
    k = a + (limit - pa) * (z - a) // (pz - pa)
    return min(hi - 1, max(lo + 1, k))
