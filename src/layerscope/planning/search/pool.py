"""``jobs`` worker processes that simulate the search's candidates ahead of its walk, so that independent
candidates run at once while the answer stays the serial search's, whatever ``jobs`` is.

The walk (planning/search/walk.py) stays the one decision maker, serial and in its own order: each
candidate it decides to simulate it asks of ``SearchPool.evaluate`` (each copy for the bounds, of
``SearchPool.proxy``, through copies._Evaluator._proxy), which hands back the worker's result, waiting for
it, or first handing the candidate to a free worker. Meanwhile the free workers simulate what the walk may
ask next (planning/search/ahead.py): a guess, which only decides what is ready early. Where the walk
asks for what no worker runs while every one runs a guess, its own process runs it (as the serial search
would), rather than wait for a guess to end. The passes the search's limit counts are the walk's alone.

Each worker is a fork of this process taken before the walk starts (the evaluator, the model and its
shrunk copies inherited, nothing pickled but configurations and results; no process group is held at the
fork: the simulations create and destroy theirs, and none runs then). A simulation is self-contained and
deterministic: the one state it leaves, the block figures the bounds read (copies._Evaluator.figures), is
reset in the worker before each job and sent back with the result; the walk's process merges it when the
walk asks for that result, as the serial simulation would have kept it then (the figures a simulation
keeps are those of the first configuration of their key, set once). An exception comes back with the
figures kept before it, and is raised where the walk asked, as the serial simulation would have raised
it; a worker that dies (killed) ends the search with one line. The workers ignore SIGINT (Ctrl-C reaches
the walk's process, which kills them); every exit kills them.

Where ``fork`` is not a start method (Windows), or this process has initialised CUDA (which a forked child
cannot use), the search runs serially: a fork is what shares the model and the copies without pickling
them."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import traceback
from multiprocessing.connection import wait
from typing import Any

import torch

from ...errors import LayerscopeError
from ..config import ParallelConfig
from .ahead import upcoming
from .walk import _rules_out

__all__ = ["SearchPool", "default_jobs", "search_pool"]

def default_jobs() -> int:
    """The cores this process may run on (its affinity; a container's CPU set)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:        # no sched_getaffinity (macOS)
        return os.cpu_count() or 1


def search_pool(ev, jobs: int | None) -> "SearchPool | None":
    """A pool of ``jobs`` workers for the evaluator ``ev`` (None: ``default_jobs()``); None, and no process,
    for one job or where processes cannot be forked."""
    n = default_jobs() if jobs is None else jobs
    if n <= 1 or "fork" not in multiprocessing.get_all_start_methods() or torch.cuda.is_initialized():
        # a forked child cannot use the CUDA its parent initialised (the user's model on a GPU, say): were a
        # simulation to touch it, it would fail there; serial then
        return None
    return SearchPool(ev, n)


def _run(ev, job: tuple[str, ParallelConfig]) -> tuple[Any, dict, BaseException | None, dict]:
    """One job in a worker: (the plan or None, the block figures it kept, the exception it raised, how it
    was evaluated: the evaluator's ``used`` counts of this job alone, which the search's notes add up)."""
    kind, c = job
    ev.figures, ev.remote = {}, None
    ev.used = {"composed": 0, "copies": 0, "whole": 0}
    out, exc = None, None
    try:
        if kind == "eval":
            out = ev(c)
        else:
            ev._proxy(c)
    except Exception as e:  # noqa: BLE001 - raised where the walk asks, as the serial search raises it
        exc = e
        if not isinstance(e, LayerscopeError):
            e.add_note("in a search worker process:\n" + "".join(traceback.format_exception(e)))
    return out, {k: f for k, f in ev.figures.items() if f is not None}, exc, dict(ev.used)


def _serve(ev, conn, inherited) -> None:
    """A worker: jobs from ``conn`` until it closes, each answered with ``_run``'s triple; ``ev``, the
    evaluator, inherited by the fork (a forked process's arguments are not pickled)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)       # Ctrl-C is the walk's process's: it kills the workers
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    for other in inherited:                            # the other workers' pipes, inherited by the fork
        other.close()
    torch.set_num_threads(1)                           # one core a worker: jobs workers use jobs cores
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):          # the search's process closed the pipe, or is gone
            return
        got = _run(ev, job)
        try:
            data = pickle.dumps(got)
        except Exception as e:  # noqa: BLE001 - an exception that does not pickle: its words do
            data = pickle.dumps((None, got[1], RuntimeError(f"{type(got[2] or e).__name__}: {got[2] or e}"), got[3]))
        try:
            conn.send_bytes(data)
        except OSError:
            return


def _forked_autograd(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is torch's refusal of autograd in a forked child."""
    seen = 0
    while exc is not None and seen < 8:
        if "Autograd-and-Fork" in str(exc) or "fork-based multiprocessing" in str(exc):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class SearchPool:
    """``jobs`` forked workers simulating for one search (module docstring); a context manager that kills
    them on exit."""

    def __init__(self, ev, jobs: int) -> None:
        self.ev, self.jobs = ev, jobs
        self.workers: list[tuple[Any, Any]] = []       # (process, the walk's end of its pipe)
        self.busy: dict[Any, tuple] = {}                # pipe -> the job its worker runs
        self.done: dict[tuple, tuple] = {}              # job -> its worker's answer, not yet asked for
        self.walk = None
        self._bounds: dict[int, tuple[int, Any]] = {}   # id(config) -> (figures known, its bounds then)
        self._dry: int | None = None    # figures known when the guesses last gave no new job

    def __enter__(self) -> "SearchPool":
        ctx = multiprocessing.get_context("fork")
        # SIGINT blocked across the forks: a worker ignores it before it can arrive
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for _ in range(self.jobs):
                mine, theirs = ctx.Pipe()
                p = ctx.Process(target=_serve, args=(self.ev, theirs, [w for _, w in self.workers] + [mine]), daemon=True,
                                name="layerscope-search")
                p.start()
                theirs.close()
                self.workers.append((p, mine))
        except BaseException:
            self.close()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        self.ev.remote = self
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Every worker killed (what they still run is not needed) and waited for."""
        self.ev.remote = None
        for p, conn in self.workers:
            if p.is_alive():
                p.kill()
        for p, conn in self.workers:
            p.join()
            conn.close()
        self.workers, self.busy = [], {}

    # --- what the walk asks -------------------------------------------------------------------
    def evaluate(self, c: ParallelConfig):
        """``c``'s plan, as the evaluator's ``ev(c)`` (its figures merged, its exception raised)."""
        return self._answer(("eval", c))

    def proxy(self, q: ParallelConfig) -> None:
        """``q`` simulated for the bounds, as the evaluator's own ``_proxy(q)``."""
        self._answer(("proxy", q))

    def follow(self, walk) -> None:
        """After the walk decided a candidate: answers collected, free workers given what it may ask next."""
        self.walk = walk
        self._collect(block=False)
        self._fill()

    def _answer(self, job: tuple):
        if not self.workers:                   # closed (below): the serial search's own runs
            return self._here(job)
        while job not in self.done:
            self._collect(block=False)
            if job in self.done:
                break
            if job not in self.busy.values():
                if not self._idle():
                    return self._here(job)         # every worker on a guess: this process runs it
                self._send(job)
            self._fill()
            self._collect(block=True)
        out, figures, exc, used = self.done.pop(job)
        if exc is not None and _forked_autograd(exc):
            # torch (2.14) refuses autograd in a child forked after the parent's autograd engine started its
            # threads: the workers cannot simulate, so none is used from here on and this process runs every
            # job itself, as the serial search does (the answer is the same; only the speed is lost)
            self.close()
            return self._here(job)
        for k, f in figures.items():       # as the serial simulation keeps them: the first of a key
            if self.ev.figures.get(k) is None:
                self.ev.figures[k] = f
        mine = self.ev.__dict__.setdefault("used", {"composed": 0, "copies": 0, "whole": 0})
        for k, v in used.items():          # counted when the walk takes the answer, as the serial search counts
            mine[k] = mine.get(k, 0) + v
        if exc is not None:
            raise exc
        return out

    def _here(self, job: tuple):
        """``job`` run in the walk's own process, as the serial search runs it (its figures kept, its
        exception raised, here), rather than after a guess a worker has begun."""
        kind, c = job
        self.ev.remote = None
        try:
            return self.ev(c) if kind == "eval" else self.ev._proxy(c)
        finally:
            self.ev.remote = self

    # --- the workers ----------------------------------------------------------------------------
    def _idle(self) -> list:
        return [conn for _, conn in self.workers if conn not in self.busy]

    def _send(self, job: tuple) -> None:
        conn = self._idle()[0]
        try:
            conn.send(job)
        except OSError:               # its worker died (a broken pipe is not the CLI's closed stdout)
            self._died(next(p for p, w in self.workers if w is conn))
        self.busy[conn] = job

    @staticmethod
    def _died(p) -> None:
        p.join()                      # its exit code
        raise LayerscopeError(f"a search worker process ended unexpectedly (exit code {p.exitcode}, killed for "
                              "memory?); jobs=1 (--jobs 1) searches in this process alone")

    def _collect(self, block: bool) -> None:
        """The answers ready (waiting for one where ``block``); a worker that died: the search ends."""
        if not self.busy:
            return
        sentinels = {p.sentinel: p for p, _ in self.workers}
        for r in wait(list(self.busy) + list(sentinels), timeout=None if block else 0):
            if r in sentinels:
                self._died(sentinels[r])
            if r in self.busy:
                try:
                    data = r.recv_bytes()
                except (EOFError, OSError):
                    continue           # its process died: its sentinel says so
                self.done[self.busy.pop(r)] = pickle.loads(data)

    def _fill(self) -> None:
        """Each free worker given the next job the walk may ask for (planning/search/ahead.py): for a
        candidate whose bounds need copies simulated first, those copies; else, unless its bounds rule it
        out now, the candidate."""
        if self.walk is None or not self._idle() or self._dry == self._known():
            # no new job since, until new figures come: what the walk may ask only shrinks as it decides
            # (planning/search/ahead.py), save the candidates whose bounds wait for figures
            return
        taken = set(self.done) | set(self.busy.values())
        for job in self._guesses():
            if job in taken:
                continue
            self._send(job)
            taken.add(job)
            if not self._idle():
                return
        self._dry = self._known()

    def _known(self) -> int:
        return sum(f is not None for f in self.ev.figures.values())

    def _guesses(self):
        walk, ev = self.walk, self.ev
        for c in upcoming(walk):
            if walk.bounds is not None:
                # the walk's order: the bounds from what is known (without figures where none are), then
                # the stand-ins it would make for the rest
                b = self._bounds_of(c)
                if _rules_out(b, walk.limit, walk.best.plan.step_time if walk.best is not None else None):
                    continue
                left = walk._left()
                need = ev.proxies_needed(c)
                if need:
                    if left is None or left >= 2:       # the walk makes them only with room for both
                        yield from (("proxy", q) for q in need)
                    continue
            yield ("eval", c)

    def _bounds_of(self, c: ParallelConfig):
        """``c``'s bounds from the figures known (none simulated), kept while no new figures come."""
        known = self._known()
        got = self._bounds.get(id(c))
        if got is None or got[0] != known:
            got = (known, self.ev.bounds(c, False))
            self._bounds[id(c)] = got
        return got[1]
