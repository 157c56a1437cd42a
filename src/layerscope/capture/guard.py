"""What every entry point that runs a model holds while it runs: one analysis at a time per model,
outside ``torch.inference_mode``, and the cyclic garbage collector paused where that is safe."""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import weakref

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from .inputs import iter_tensors, map_tensors
from .shadow import attributes_of, live_module, shadow_tree, write_back

__all__ = ["exclusive", "analysing", "gc_paused", "holds_inference_tensors", "any_held", "normal_tensors"]


# One lock per model object: an analysis sets a model's flags (eval/train) and swaps its tensors
# while it runs, so two threads analysing the same model take turns; different models run at once.
_MODEL_LOCKS: "weakref.WeakKeyDictionary[nn.Module, threading.RLock]" = weakref.WeakKeyDictionary()


_LOCKS_GUARD = threading.Lock()

# how many analyses this thread is inside (an entry point that calls another counts twice)
_RUNNING = threading.local()


def analysing() -> bool:
    """Whether this thread is inside one of layerscope's analyses: a forward it runs is the analysis's,
    not the user's (a profiler counting the user's forwards leaves it out)."""
    return getattr(_RUNNING, "depth", 0) > 0


def exclusive(fn=None, *, paused: bool = False):
    """Every public entry point that runs a model: one analysis at a time per model, outside
    ``torch.inference_mode`` (see ``normal_tensors``), and on a structural copy of the model
    (capture/shadow.py), so that another thread calling the model meanwhile sees none of the
    analysis's mode flips, hooks and swapped tensors (issue 58). A report hands back the user's
    modules (``shadow.live_module``).

    ``paused`` (``@exclusive(paused=True)``: analyze()): the cyclic garbage collector stays paused
    (``gc_paused``) from the copy to its release, not only while the copy and the records are made.
    Each collection that ran between (as the inputs were prepared, after the report, as the copy's
    attributes were written back) walked every object the analysis had made and still held, the
    copy of the tree among them (a 1,000-block MLP: 3,001 modules, 24,000 containers): 355 ms with a
    generation-1 collection after it against 282 ms paused throughout. The copy is freed by reference
    counting before the collector resumes."""
    if fn is None:
        return functools.partial(exclusive, paused=paused)

    @functools.wraps(fn)
    def wrapper(model, *args, **kwargs):
        # Under inference_mode autograd does not decompose composite ops (aten.conv2d, aten.linear,
        # aten.scaled_dot_product_attention arrive whole), and nothing can be saved for a backward:
        # every analysis runs as in grad/no_grad mode, so the numbers do not depend on the caller's
        # mode. The switch is thread-local (InferenceMode is a per-thread guard).
        # A model that holds inference tensors (built under inference mode) stays in it: outside,
        # its buffers could not be updated or restored in place; the recorder decomposes
        # composite ops itself, so forward counts are the same (a backward cannot run for it).
        if not isinstance(model, nn.Module):
            with torch.inference_mode(False):
                args, kwargs = normal_tensors(args, kwargs)
                return fn(model, *args, **kwargs)
        live = live_module(model)      # an entry point given a copy (a front end's): the user's lock
        with _LOCKS_GUARD:
            lock = _MODEL_LOCKS.get(live)
            if lock is None:
                lock = _MODEL_LOCKS[live] = threading.RLock()
        with lock:
            _RUNNING.depth = getattr(_RUNNING, "depth", 0) + 1
            try:
                with gc_paused() if paused else contextlib.nullcontext():
                    with gc_paused():     # (a copy of a large tree: many containers at once)
                        # the copy's walk says whether the model holds inference tensors (one walk, not two)
                        work, pairs, inference = shadow_tree(model, leave_inference=True)
                        if inference is None:     # no copy made: the model itself, looked at
                            inference = holds_inference_tensors(model)
                        before = attributes_of(work, pairs)
                    leave = not inference
                    with torch.inference_mode(False) if leave else contextlib.nullcontext():
                        args, kwargs = normal_tensors(args, kwargs) if leave else (args, kwargs)
                        try:
                            return fn(work, *args, **kwargs)
                        finally:      # what the forward assigned on self reaches the user's modules
                            write_back(work, before)
                            del work, pairs, before     # the copy goes now (paused: not walked first)
            finally:
                _RUNNING.depth -= 1
    return wrapper


def any_held(model: nn.Module, test) -> bool:
    """Whether ``test(t)`` holds for a parameter or buffer of ``model``: every module's own slots, as
    model.parameters() and .buffers() would reach them, in one walk without their generators and
    named_modules' path strings (16 ms against about 10 on a model of 12,001 modules; a tensor met
    twice is tested twice)."""
    seen: set[int] = set()
    todo = [model]
    while todo:
        m = todo.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        todo.extend(c for c in m._modules.values() if c is not None)
        for t in m._parameters.values():
            if t is not None and test(t):
                return True
        for t in m._buffers.values():
            if t is not None and test(t):
                return True
    return False


def _inference(t) -> bool:
    return not is_lazy(t) and t.is_inference()      # a lazy tensor has no is_inference yet


def holds_inference_tensors(model: nn.Module) -> bool:
    return any_held(model, _inference)


def normal_tensors(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Inputs made under ``torch.inference_mode`` as normal tensors (clones): outside inference mode
    an inference tensor cannot be saved for backward nor updated in place. The caller's tensors are
    never touched; nothing is copied when no input is an inference tensor."""
    if not any(t.is_inference() for t in iter_tensors((args, kwargs))):
        return args, kwargs
    fix = lambda t: t.clone() if t.is_inference() else t  # noqa: E731
    return map_tensors(tuple(args), fix), map_tensors(dict(kwargs), fix)


@contextlib.contextmanager
def gc_paused():
    """Pause the cyclic garbage collector while records are built: its full passes over a large heap
    made per-module time grow with model size (4,000 blocks: 117 us per call with it, 71 without).
    Restored on exit; the run's garbage is freed by reference counting or the next collection.
    The switch is process-wide, so it is only thrown while the calling thread is the only Python
    thread: with other threads running, their collections go on and the analysis runs slower."""
    was_enabled = gc.isenabled()
    if not was_enabled or threading.active_count() > 1:
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
