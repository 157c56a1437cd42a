"""The parallel report in every text format against its goldens (tests/goldens/parallel/): the terminal at
80 and 120 columns (every line fits), plain text, CSV and JSON. The numbers come from the simulation of
test_simulate.py's Net on 4 fake ranks (the hand derivations are there)."""

from __future__ import annotations

import pytest
import torch

import layerscope as ls

from ...reports.test_goldens import check_golden, terminal
from .test_simulate import Net


@pytest.fixture(scope="module")
def rep():
    torch.manual_seed(0)
    return ls.parallel(Net(), torch.randn(8, 64), gpus=4, mixed_precision="off", gpu="H100", memory_limit="1MiB")


def test_parallel_goldens(rep, update_goldens):
    check_golden("parallel/table.txt", rep.table(), update_goldens)
    check_golden("parallel/table.csv", rep.to_csv(), update_goldens)
    check_golden("parallel/report.json", rep.to_json(), update_goldens)
    for width in (80, 120):
        text = terminal(rep, width)
        assert max(len(line) for line in text.splitlines()) <= width
        check_golden(f"parallel/terminal_{width}.txt", text, update_goldens)
