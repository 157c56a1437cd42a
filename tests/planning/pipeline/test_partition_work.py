"""partition()'s repeated work (issue 24, item 3): one simulated step, and on CPU one real step for
the measured working memory, with the same units as before (two of each)."""

from __future__ import annotations

import importlib

import torch

import layerscope as ls

# partition() looks memory() up in its own module, layerscope.api._partition
api = importlib.import_module("layerscope.api._partition")
from layerscope.examples import small_cnn, tiny_gpt
from layerscope.planning.steptime import unit_timing as units_mod
from layerscope.planning.split.units import units_from_memory


def test_one_simulated_step_gives_the_units_of_two():
    # partition() simulates one step: the units keep only live-bytes differences of the last pass
    # and the optimizer's state, which the first step() creates; a second step adds that state
    # under every difference and changes none of them
    cases = [(tiny_gpt(), torch.randint(0, 1000, (2, 32)), "adamw"),
             (small_cnn(), torch.randn(2, 3, 32, 32), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))]
    for m, x, opt in cases:
        one = units_from_memory(ls.memory(m, x, optimizer=opt, steps=1), m, micro=2)
        two = units_from_memory(ls.memory(m, x, optimizer=opt, steps=2), m, micro=2)
        assert one == two
        assert sum(u.optimizer_bytes for u in one.units) > 0


def test_partition_simulates_one_step(monkeypatch):
    seen = []
    real = api.memory_step       # memory()'s step, below the entry point (issue 59: no entry point calls another)

    def spy(model, args, kwargs, opts):
        seen.append(opts.steps)
        return real(model, args, kwargs, opts)
    monkeypatch.setattr(api, "memory_step", spy)
    ls.partition(small_cnn(), torch.randn(4, 3, 32, 32), stages=2, microbatches=2, optimizer="adamw",
                 measure_working=False)
    assert seen == [1]


def test_working_memory_on_cpu_needs_no_warm_up_step():
    # an input size no other test uses, so the first step meets oneDNN's convolutions for these
    # shapes cold: the first measurement equals the next one (warmed up by the first)
    m, x = small_cnn(), torch.randn(3, 3, 29, 31)
    units = units_from_memory(ls.memory(m, x, optimizer="adamw", steps=1), m, micro=3)
    calls = []
    h = m.register_forward_pre_hook(lambda mod, a: calls.append(1))
    try:
        cold = units_mod.unit_work_bytes(m, units, (x,), {})
        assert len(calls) == 1                  # one real step: no warm-up on CPU
        warm = units_mod.unit_work_bytes(m, units, (x,), {})
    finally:
        h.remove()
    assert cold == warm and any(cold.values())


def _allocations(fn) -> list[int]:
    """The sizes of the CPU allocations ``fn`` made, in order, from torch's profiler alone."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return [e.cpu_memory_usage for e in prof.events() if e.name == "[memory]" and e.cpu_memory_usage > 0]


def test_unit_marks_leave_the_steps_allocations_as_they_are():
    """The measured working memory is that of the step as it runs without layerscope: the marks of
    each unit's forward and backward come from the module tracker (forward hooks, autograd node
    pre-hooks), which allocate nothing in the step. Full backward hooks, which marked backward
    before, wrap each module's inputs and outputs in nodes of their own: 4 more allocations and
    32,768 more bytes on this model (8,192 per block: the 124,928 the goldens held against 116,736)."""
    from layerscope.planning.steptime.unit_timing import _hooked_steps
    m, x = tiny_gpt(), torch.randint(0, 1000, (1, 32), generator=torch.Generator().manual_seed(0))
    units = units_from_memory(ls.memory(m, x, optimizer="adamw", steps=1), m, micro=1)

    def plain():
        for p in m.parameters():
            p.grad = None
        m(x).sum().backward()       # layerscope's default loss on a tensor output

    def marked():
        _hooked_steps(m, units, (x,), {}, lambda *a: None, 1)
    for f in (plain, marked):       # a first pass of each: gradients exist before both measured ones
        f()
    rng_state = torch.get_rng_state().numel()       # the StateGuard's copy of the CPU generator's state
    assert _allocations(marked) == [rng_state] + _allocations(plain)
