import pytest


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="rewrite tests/goldens/* from the current output instead of comparing")


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
    the output sizes, its scratch counts 0. Module-scoped, so module fixtures built under it see it."""
    from layerscope.capture import simulation

    real = simulation._probe_real

    def sizes_only(func, args, kwargs, device):
        sizes, _ = real(func, args, kwargs, device)
        return sizes, 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(simulation, "_probe_real", sizes_only)
        yield
