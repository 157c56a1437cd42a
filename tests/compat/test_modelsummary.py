"""layerscope.compat.modelsummary: torchModelSummary's Statistics (issue 21). Values by hand."""

import pytest
import torch

import layerscope as ls
from layerscope.compat.modelsummary import Statistics

from .models import TinyResNet, same_state, state

ATTRS = ("layer_id", "module", "class_name", "inner_layers", "depth", "depth_index", "executed", "parent_info",
         "trainable", "is_recursive", "input_size", "output_size", "kernel_size", "num_params", "macs",
         "input_bytes", "output_bytes", "params_bytes", "size_bytes")
MB = 1024 ** 2
# TinyResNet on (1, 3, 8, 8): 1,022 params and 62,248 MACs (derived in test_torchinfo.py).


def test_readme_example():
    m = TinyResNet()
    before = state(m)
    stats = Statistics(model=m, input_data=torch.rand(1, 3, 8, 8))
    assert same_state(before, state(m))
    # the submodules only, torchinfo-style depth-index names
    assert repr(stats.summary_list[:9]) == ("[Conv2d: 1-1, ReLU: 1-2, Sequential: 1-3, Block: 2-1, Conv2d: 3-1, "
                                            "ReLU: 3-2, Conv2d: 3-3, ReLU: 3-4, Block: 2-2]")
    conv = stats.summary_list[0]
    for a in ATTRS:
        assert hasattr(conv, a), a
    assert (conv.module, conv.layer_id, conv.kernel_size, conv.trainable) == (m.conv1, id(m.conv1), [3, 3], True)
    assert (conv.input_size, conv.output_size, conv.num_params, conv.macs) == ([1, 3, 8, 8], [1, 4, 8, 8], 108, 6_912)
    # this call's own tensors, MB of 1024**2: input 3*64*4 = 768 B, output 4*64*4 = 1,024 B, weight 108*4 = 432 B
    assert (conv.input_bytes, conv.output_bytes, conv.params_bytes) == (768 / MB, 1024 / MB, 432 / MB)
    assert conv.size_bytes == (768 + 1024 + 432) / MB
    assert stats.summary_list[3].parent_info is stats.summary_list[2]
    assert (stats.total_params, stats.trainable_params, stats.total_mult_adds) == (1_022, 1_022, 62_248)
    assert stats.total_input == 192 and stats.total_params_bytes == 4 * 1_022 / MB
    assert stats.depth == 3 and isinstance(stats.report, ls.Report)
    text = repr(stats)
    assert "Total # of Params: 1022" in text and "Total mult-adds (M): 0.06" in text
    assert "Forward & Backward Size (MB)" in text and "Conv2d: 1-1" in text


def test_sizes_without_batch_get_a_batch_of_two():
    stats = Statistics(TinyResNet(), (3, 8, 8))
    assert stats.input_size == [[2, 3, 8, 8]] and stats.total_mult_adds == 2 * 62_248
    assert stats.total_input == 384


def test_without_input_and_bad_input():
    stats = Statistics(TinyResNet())
    assert stats.summary_list[0].class_name == "Conv2d" and not stats.summary_list[0].executed
    assert stats.total_params == 1_022 and stats.total_mult_adds == 0 and stats.report is None
    with pytest.raises(ls.InputError, match="input_data"):
        Statistics(TinyResNet(), "3,8,8")
