import pytest


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="rewrite tests/goldens/* from the current output instead of comparing")


@pytest.fixture
def update_goldens(request):
    return request.config.getoption("--update-goldens")
