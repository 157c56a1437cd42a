"""The search's worker processes (``jobs``, planning/search/pool.py): the answer is the serial search's
whatever the number of workers and the order their results come back in (the serial walk is what they
are checked against, the whole result compared), one job starts no process, and a worker's exception,
death or a Ctrl-C ends the search with no hang and no worker left."""

import os
import random
import re
import signal
import threading
import time
from types import SimpleNamespace

import pytest
import torch

import layerscope
from layerscope.errors import ForwardError, LayerscopeError
from layerscope.planning.config import ParallelConfig
from layerscope.planning.search import pool as pool_mod
from layerscope.planning.search.bounds import PipelineBounds
from layerscope.planning.search.candidates import label, space
from layerscope.planning.search.pool import SearchPool, search_pool
from layerscope.planning.search.walk import walk_space

from .test_search import _piped

def _world(seed: int, c: ParallelConfig) -> SimpleNamespace:
    """tests/planning/sharded/test_search.py's ``_piped`` world: memory grows with the micro-batch, a
    pipeline's step has a bubble and a cost per micro-batch."""
    return _piped(seed)(c)


class _Synthetic:
    """copies._Evaluator's contract on the synthetic world: ``ev(c)`` its plan, keeping a figure per tensor
    parallel degree (the first one of its key, as ``_keep_figures`` keeps them); ``bounds(c, simulate)``
    90% of the truth once its degree's figure is known, simulating a proxy for it first where asked (a
    proxy of tp 8 fails, as a configuration that cannot be built); ``fail``: labels whose simulation raises
    that exception. Each simulation sleeps a few ms (drawn per configuration), so that the workers' results
    come back in another order than they were asked."""

    def __init__(self, seed: int, fail: dict | None = None) -> None:
        self.seed, self.fail = seed, fail or {}
        self.figures: dict = {}
        self.remote = None
        self.proxies = 0

    def _nap(self, c) -> None:
        time.sleep(random.Random(label(c)).uniform(0, 0.004))

    def __call__(self, c):
        self._nap(c)
        if c.pp == 1 and self.figures.get(("fig", c.tp)) is None:
            self.figures[("fig", c.tp)] = f"from {label(c)}"        # which candidate kept it: path dependent
        if label(c) in self.fail:
            raise self.fail[label(c)]
        return _world(self.seed, c)

    def proxies_needed(self, c):
        if ("fig", c.tp) in self.figures:
            return []
        return [ParallelConfig(gpus=2 * c.tp, tp=c.tp, fsdp=2, local_batch=1)]

    def _proxy(self, q) -> None:
        if self.remote is not None:
            return self.remote.proxy(q)
        self._nap(q)
        if q.tp == 8:
            raise ForwardError("no such proxy")
        self.figures[("fig", q.tp)] = f"proxy {label(q)}"

    def bounds(self, c, simulate=True):
        for q in self.proxies_needed(c) if simulate else ():
            self.figures[("fig", q.tp)] = None
            try:
                self._proxy(q)
            except ForwardError:
                pass
            self.proxies += 1
        fig = self.figures.get(("fig", c.tp))
        if fig is None:
            return None
        t = _world(self.seed, c)
        # a bound that depends on which figure was kept: a merge in another order would change it
        return PipelineBounds(peak_bytes=0.9 * t.peak_bytes, step_time=(0.9 - 0.01 * len(fig) / 100) * t.step_time,
                              rank=0)


def _walk(cands, ev, jobs: int, max_passes, progress=False):
    pool = search_pool(ev, jobs)
    if pool is None:
        return walk_space(cands, ev, limit=60, params=0, bounds=ev.bounds, for_bounds=lambda: ev.proxies,
                          max_passes=max_passes, progress=progress), ev.figures
    with pool:
        return walk_space(cands, pool.evaluate, limit=60, params=0, bounds=ev.bounds, for_bounds=lambda: ev.proxies,
                          max_passes=max_passes, ahead=pool, progress=progress), ev.figures


@pytest.mark.parametrize("seed,max_passes", [(0, None), (1, None), (2, 40), (3, 12)])
def test_workers_give_the_serial_answer(seed, max_passes):
    """Every candidate's status, why, plan and bound, the families' lines, the simulations and the passes
    counted, and the figures the bounds read: the serial walk's, with 2 and 3 workers."""
    cands = space(16, 48, 64, gpus_per_node=8)
    fail = {label(c): ForwardError("cannot be built") for c in cands if c.tp == 2 and c.ac == "none"}
    serial = _walk(cands, _Synthetic(seed, fail), 1, max_passes)
    statuses = {c.status for c in serial[0][0]}
    assert {"fits", "slower"} <= statuses and ("error" in statuses or max_passes is not None)
    for jobs in (2, 3):
        assert _walk(cands, _Synthetic(seed, fail), jobs, max_passes) == serial


def _no_fork():
    raise AssertionError("a process was forked")


def test_progress_counts_what_the_walk_decided(monkeypatch):
    """The progress line: simulated, ruled out and left, and the best so far, each time a candidate is
    decided; at the end none left."""
    from layerscope.planning.search import walk as walk_mod
    lines = []

    class Bar:
        def __init__(self, total, text):
            lines.append((0, total, text))

        def update(self, done, text):
            lines.append((done, lines[0][1], text))

        def close(self):
            pass
    monkeypatch.setattr(walk_mod, "ProgressBar", Bar)
    cands = space(16, 48, 64, gpus_per_node=8)
    (ranked, _, count, _), _ = _walk(cands, _Synthetic(0), 2, None, progress=True)
    assert lines[0] == (0, len(cands), f"searching configurations: 0 simulated, 0 ruled out, {len(cands)} left")
    done, total, text = lines[-1]
    best = ranked[0]
    assert done == total == len(cands) and text == (
        f"searching configurations: {count} simulated, {len(cands) - count} ruled out, 0 left; best "
        f"{best.plan.step_time * 1e3:,.1f} ms ({label(best.config)})")


def test_one_job_starts_no_process(monkeypatch):
    monkeypatch.setattr(os, "fork", _no_fork)
    assert search_pool(_Synthetic(0), 1) is None
    assert _walk(space(16, 48, 64, gpus_per_node=8), _Synthetic(0), 1, None)[0][2] > 0


def test_bad_jobs_is_one_line(capsys):
    from layerscope.cli import main
    from layerscope.options import ParallelOptions
    for bad in (0, 1.5, True):
        with pytest.raises(layerscope.InputError, match="jobs is a count of worker processes"):
            ParallelOptions(jobs=bad)
    assert main(["parallel", "layerscope.examples:tiny_gpt", "--gpus", "2", "--gpu", "H100", "--search",
                 "--jobs", "0"]) != 0
    err = capsys.readouterr().err
    assert "--jobs: must be at least 1, got 0" in err and err.count("\n") == 1


class _Boom(Exception):
    pass


def _children() -> list:
    import multiprocessing
    return [p for p in multiprocessing.active_children() if p.name == "layerscope-search"]


def test_a_worker_exception_is_raised_where_the_walk_asks():
    """An unexpected exception in a worker: raised by the walk as the serial walk raises it, with the
    worker's traceback in its notes; the workers killed."""
    cands = space(16, 48, 64, gpus_per_node=8, fixed={"pp": 1})
    fail = {label(c): _Boom("boom") for c in cands}
    with pytest.raises(_Boom, match="boom") as serial:
        _walk(cands, _Synthetic(0, fail), 1, None)
    with pytest.raises(_Boom, match="boom") as got:
        _walk(cands, _Synthetic(0, fail), 2, None)
    assert not getattr(serial.value, "__notes__", None)
    assert any("in a search worker process" in n for n in got.value.__notes__)
    assert not _children()


class _Dies(_Synthetic):
    def __call__(self, c):
        os._exit(3)


def test_a_worker_that_dies_ends_the_search_in_one_line():
    cands = space(16, 48, 64, gpus_per_node=8, fixed={"pp": 1})
    t0 = time.monotonic()
    with pytest.raises(LayerscopeError, match=r"a search worker process ended unexpectedly \(exit code 3"):
        _walk(cands, _Dies(0), 2, None)
    assert time.monotonic() - t0 < 30 and not _children()


class _Slow(_Synthetic):
    def __call__(self, c):
        time.sleep(60)


def test_ctrl_c_kills_the_workers():
    """SIGINT reaches the walk's process (the workers ignore it): KeyboardInterrupt there, at once, and the
    workers killed (the CLI then says "layerscope: interrupted")."""
    cands = space(16, 48, 64, gpus_per_node=8, fixed={"pp": 1})
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            _walk(cands, _Slow(0), 2, None)
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 30 and not _children()


def _llama(layers=4):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    with torch.device("meta"):
        return LlamaForCausalLM(cfg)


def _without_seconds(rep) -> tuple:
    s = dict(rep.search)
    s.pop("seconds")
    # the notes with the search's seconds left out ("... for a global batch of 8 in 17 s: ...")
    notes = [re.sub(r" in [0-9.,]+ s:", " in - s:", str(n)) for n in rep.notes]
    return s, rep.plan, notes, str(rep).count("\n")


@pytest.mark.slow      # two searches of 2 simulations and 2 copies each: 20 s at a load of 3 on 2 cores
def test_a_llama_search_with_workers_is_the_serial_one(monkeypatch):
    """A shrunk Llama (4 blocks, hidden 64) on 8 simulated ranks: the search with 2 workers has the serial
    search's report, every candidate's row, the chosen plan's figures, the counts and passes (the seconds
    aside); the workers simulated both the candidates and a copy for the bounds. With jobs=1, no process."""
    m = _llama()
    ids = torch.zeros((1, 32), dtype=torch.long, device="meta")
    kw = dict(gpus=8, gpu="H100", search=True, tp=1, cp=1, ac="full", memory_limit=140_000_000)
    monkeypatch.setattr(os, "fork", _no_fork)
    serial = layerscope.parallel(m, ids, jobs=1, **kw)
    monkeypatch.undo()
    asked = []
    for name in ("evaluate", "proxy"):
        real = getattr(SearchPool, name)
        monkeypatch.setattr(SearchPool, name, lambda self, c, real=real, name=name: (asked.append(name),
                                                                                     real(self, c))[1])
    par = layerscope.parallel(m, ids, jobs=2, **kw)
    assert set(asked) == {"evaluate", "proxy"}
    assert _without_seconds(par) == _without_seconds(serial)
    s = serial.search
    # what the comparison covers: a plan that fits, candidates ruled out by the bounds, pipelines among them
    assert s["counts"]["fits"] >= 1 and s["counts"]["oom-bound"] >= 1 and s["simulated_for_bounds"] >= 1
    assert any(r["config"]["pp"] > 1 for r in s["candidates"])
    assert not _children()


def test_a_worker_dead_before_its_job_ends_the_search_in_one_line():
    """A worker that died while idle (killed): the job sent to it fails on a broken pipe, which the search
    reports as the worker's end (the CLI would take a BrokenPipeError for its own closed output)."""
    cands = space(16, 48, 64, gpus_per_node=8, fixed={"pp": 1})
    with SearchPool(_Synthetic(0), 2) as pool:
        for p, _ in pool.workers:
            p.kill()
            p.join()
        with pytest.raises(LayerscopeError, match=r"ended unexpectedly \(exit code -9"):
            pool.evaluate(cands[0])
    assert not _children()


def test_torchs_refusal_of_autograd_after_fork_is_recognised():
    # torch 2.14 raises this in a forked child once the parent's autograd engine has its threads; the pool
    # then closes its workers and runs every job in the search's process (pool.SearchPool._answer), as the
    # serial search does; the message reaches the pool wrapped in the simulation's ForwardError
    from layerscope.errors import ForwardError
    from layerscope.planning.search.pool import _forked_autograd
    torch_says = RuntimeError("Unable to handle autograd's threading in combination with fork-based "
                              "multiprocessing. See https://github.com/pytorch/pytorch/wiki/Autograd-and-Fork")
    try:
        try:
            raise torch_says
        except RuntimeError as e:
            raise ForwardError("the forward failed (simulating rank 0 of fsdp 16, tp 1, pp 1, ac none)") from e
    except ForwardError as wrapped:
        assert _forked_autograd(wrapped)
    assert not _forked_autograd(ForwardError("mat1 and mat2 shapes cannot be multiplied"))
