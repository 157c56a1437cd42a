"""The CLI's listings and printed tables against their goldens (tests/goldens/cli/): ``list-presets``
in every format, and what ``summary`` and ``memory`` print off a terminal (plain text, no width),
limit line included. Captured before issue 32's restructuring, so they prove it changed nothing; a
missing golden fails (``pytest --update-goldens`` writes it)."""

from __future__ import annotations

import pytest

from layerscope.cli import main

from ..reports.test_goldens import check_golden

# the probed kernels' scratch differs from CPU to CPU: goldens count it 0 (conftest.py)
pytestmark = pytest.mark.usefixtures("machine_independent_kernels")

CASES = {
    "list_presets.txt": ["list-presets"],
    "list_presets.csv": ["list-presets", "--format", "csv"],
    "list_presets.json": ["list-presets", "--format", "json"],
    "summary_small_cnn.txt": ["summary", "layerscope.examples:small_cnn", "--depth", "1", "--columns",
                              "input_shape,output_shape,params,kernel,macs,flops"],
    "summary_tiny_gpt_meta.txt": ["summary", "layerscope.examples:tiny_gpt", "--device", "meta", "--backward"],
    "memory_small_cnn_limit.txt": ["memory", "layerscope.examples:small_cnn", "--batch-size", "2", "--steps", "1",
                                   "--limit", "512KiB"],
    "memory_small_cnn_infer.csv": ["memory", "layerscope.examples:small_cnn", "--infer", "--format", "csv"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cli_output(name, capsys, update_goldens):
    assert main(CASES[name]) == 0
    check_golden(f"cli/{name}", capsys.readouterr().out, update_goldens)
