import pytest
import torch


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="rewrite tests/goldens/* from the current output instead of comparing")


def pytest_collection_modifyitems(config, items):
    """``LAYERSCOPE_SWEEP_SHARD=K/N``: of the tests marked ``sweep`` (one torchrun launch per architecture or
    configuration, 40-90 s each on 2 cores), only the K-th of every N, in collection order; the others are
    deselected. Unset (the default, and `make test-slow` run by hand): all of them. .ci/run gives each of its
    two sides one half, so that every sweep test runs once in CI without either side running them all."""
    import os
    shard = os.environ.get("LAYERSCOPE_SWEEP_SHARD")
    if not shard:
        return
    k, _, n = shard.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise pytest.UsageError(f"LAYERSCOPE_SWEEP_SHARD must be K/N with 1 <= K <= N, got {shard!r}")
    k, n = int(k), int(n)
    sweep = [it for it in items if it.get_closest_marker("sweep") is not None]
    drop = {id(it) for i, it in enumerate(sweep) if i % n != k - 1}
    if drop:
        config.hook.pytest_deselected(items=[it for it in items if id(it) in drop])
        items[:] = [it for it in items if id(it) not in drop]


@pytest.fixture
def update_goldens(request):
    return request.config.getoption("--update-goldens")


@pytest.fixture(autouse=True)
def _every_report_adds_up(monkeypatch):
    """Invariant on every model in the tests: per-layer sums equal the totals (see helpers.assert_sums
    and helpers.assert_memory_sums)."""
    from layerscope.reports.summary import Report

    from tests.helpers import assert_sums

    original = Report.__init__

    def checked(self, *args, **kwargs):
        original(self, *args, **kwargs)
        assert_sums(self)

    monkeypatch.setattr(Report, "__init__", checked)

    from layerscope.reports.memory import MemoryReport

    from tests.helpers import assert_memory_sums

    original_mem = MemoryReport.__init__

    def checked_mem(self, *args, **kwargs):
        original_mem(self, *args, **kwargs)
        assert_memory_sums(self)

    monkeypatch.setattr(MemoryReport, "__init__", checked_mem)


@pytest.fixture(scope="module")
def machine_independent_kernels():
    """For goldens: the simulation sizes kernels by a real call on this machine (capture/simulation.py
    ``_probe_real``), and the scratch a kernel allocates inside itself depends on the CPU (oneDNN's
    convolution backward took 657.20 KiB on an AVX-512 machine, 640.01 KiB on an AMD EPYC without
    it, for the same small CNN). Goldens must be the same on every machine: the real call still gives
    the output sizes, its scratch counts 0. Module-scoped, so module fixtures built under it see it.
    torch's thread count is pinned to 2 as well: a measured real step's kernels keep per-thread scratch
    (a LayerNorm's backward in the stage plan's golden: 9,728 B of working memory on 2 threads, 9,216 B
    on 1, under OMP_NUM_THREADS=1)."""
    from layerscope.capture import simulation

    real = simulation._probe_real

    def sizes_only(func, args, kwargs, device):
        sizes, _ = real(func, args, kwargs, device)
        return sizes, 0
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(simulation, "_probe_real", sizes_only)
            yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _torchrun_only_in_the_slow_suite(request, monkeypatch):
    """The marking policy, checked: a test that starts torchrun (several processes, 6-25 s a launch on 2
    cores) is marked ``slow``, so that ``make test`` stays under 5 minutes; ``make test-slow`` runs it. An
    unmarked test fails at the launch (every launcher goes through subprocess.Popen)."""
    if request.node.get_closest_marker("slow") is not None:
        return
    import subprocess

    class Unmarked(subprocess.Popen):
        def __init__(self, args, *rest, **kwargs):
            words = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
            if "torch.distributed.run" in words or (words and words[0].endswith("torchrun")):
                pytest.fail(f"{request.node.nodeid} starts torchrun: mark it @pytest.mark.slow", pytrace=False)
            super().__init__(args, *rest, **kwargs)
    monkeypatch.setattr(subprocess, "Popen", Unmarked)
