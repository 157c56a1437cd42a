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
