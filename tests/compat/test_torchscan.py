"""layerscope.compat.torchscan01: torchscan 0.1's crawl_module / summary (issue 21). Values by hand."""

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.compat.torchscan01 import aggregate_info, crawl_module, summary

from .models import same_state, state, vgg_like

LAYER_KEYS = {"name", "depth", "type", "input_shape", "output_shape", "grad_params", "nograd_params", "param_size",
              "num_buffers", "buffer_size", "flops", "macs", "dmas", "rf", "s", "p", "is_shared", "is_leaf"}


def test_crawl_module_docstring_example():
    # torchscan's docstring: crawl_module(nn.Conv2d(3, 8, 3), (3, 224, 224)); a batch of 1 is added.
    # 8 x 222 x 222 = 394,272 outputs x 27 = 10,645,344 MACs; FLOPs 2 x MACs + 394,272 bias adds
    # DMAs (float32 elements): input 150,528 + weight 216 + bias 8 + output 394,272 = 545,024
    info = crawl_module(nn.Conv2d(3, 8, 3), (3, 224, 224))
    assert set(info) == {"overheads", "layers", "overall"}
    (layer,) = info["layers"]
    assert set(layer) == LAYER_KEYS
    assert (layer["name"], layer["depth"], layer["type"]) == ("conv2d", 0, "Conv2d")
    assert (layer["input_shape"], layer["output_shape"]) == ((-1, 3, 224, 224), (-1, 8, 222, 222))
    assert (layer["macs"], layer["flops"], layer["dmas"]) == (10_645_344, 21_684_960, 545_024)
    assert (layer["grad_params"], layer["param_size"], layer["rf"], layer["s"], layer["p"]) == (224, 896, 3, 1, 0)
    assert info["overall"] == dict(grad_params=224, nograd_params=0, param_size=896, num_buffers=0, buffer_size=0)


# vgg_like on (3, 16, 16): conv 3->8 3x3 -> 8x14x14 (224 params, 1,568 x 27 = 42,336 MACs), relu,
# maxpool 2 -> 8x7x7, [conv 8->4 3x3 -> 4x5x5 (292 params, 100 x 72 = 7,200 MACs), relu], flatten,
# linear 100->10 (1,010 params, 1,000 MACs). Totals: 1,526 params, 50,536 MACs.
# Receptive field (size, stride): conv (3, 1), pool (3 + 1 = 4, 2), conv (4 + 2 x 2 = 8, 2).


def test_readme_example_with_receptive_field(capsys):
    m = vgg_like()
    before = state(m)
    summary(m, (3, 16, 16), receptive_field=True, max_depth=0)
    out = capsys.readouterr().out.splitlines()
    assert same_state(before, state(m))
    assert out[1].split() == ["Layer", "Type", "Output", "Shape", "Param", "#", "Receptive", "field"]
    assert out[3].split() == ["sequential", "Sequential", "(-1,", "10)", "1,526", "8"]
    assert out[0] == "_" * len(out[1].rstrip()) or set(out[0]) == {"_"}
    for line in ("Trainable params: 1,526", "Non-trainable params: 0", "Total params: 1,526",
                 "Model size (params + buffers): 0.01 Mb", "Framework & CUDA overhead: 0.00 Mb",
                 "Multiply-Accumulations on forward: 50.54 kMACs"):
        assert line in out


def test_layers_add_up_and_receptive_fields():
    info = crawl_module(vgg_like(), (3, 16, 16))
    rows = info["layers"]
    assert [r["name"] for r in rows] == ["sequential", "0", "1", "2", "3", "0", "1", "4", "5"]
    assert [r["depth"] for r in rows] == [0, 1, 1, 1, 1, 2, 2, 1, 1]
    assert [r["macs"] for r in rows] == [0, 42_336, 0, 0, 0, 7_200, 0, 0, 1_000]
    assert sum(r["grad_params"] for r in rows) == 1_526
    assert [(r["rf"], r["s"]) for r in rows[1:4]] == [(3, 1), (3, 1), (4, 2)] and rows[5]["rf"] == 8
    folded = aggregate_info(crawl_module(vgg_like(), (3, 16, 16)), 1)
    assert [r["name"] for r in folded["layers"]] == ["sequential", "0", "1", "2", "3", "4", "5"]
    assert folded["layers"][4]["macs"] == 7_200 and folded["layers"][4]["grad_params"] == 292
    with pytest.raises(ls.InputError, match="max_depth"):
        aggregate_info(crawl_module(vgg_like(), (3, 16, 16)), 5)


def test_bad_input_shape():
    for bad in ((3, -1), [3, 16, 16], "3,16,16"):
        with pytest.raises(ls.InputError, match="input_shape"):
            crawl_module(vgg_like(), bad)


def test_multiple_inputs_and_dtype():
    class Add(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, a, b):
            return self.fc(a + b)

    info = crawl_module(Add(), [(4,), (4,)], dtype=torch.float32)
    assert info["layers"][1]["macs"] == 8 and info["layers"][0]["input_shape"] == (-1, 4)
