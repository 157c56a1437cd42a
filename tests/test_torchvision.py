"""torchvision's classification models against torchvision's own published figures.

torchvision's weights enums carry ``meta["_ops"]`` (the GFLOPS of its model tables: GMACs as it counts
them, rounded to 3 decimals) and ``meta["num_params"]``. layerscope's MACs must round to the same
number, its parameter count must equal theirs. Models are built with ``weights=None`` (never
downloaded) on the meta device where torchvision can build them there, so no memory is allocated.

These run only where torchvision loads: the project's own setup (torch 2.13.0 CPU) has none (PyPI's
torchvision does not load beside that build); the second CI environment (torch 2.14.1 +
torchvision 0.29.1, ``make test-torch214``) has it.
"""

from __future__ import annotations

import pytest
import torch

import layerscope as ls
from tests.helpers import assert_sums, assert_unchanged, snapshot

try:
    import torchvision
except Exception as e:  # noqa: BLE001 - absent, or a build for another torch (fails at import with any error)
    pytest.skip(f"torchvision does not load here ({type(e).__name__})", allow_module_level=True)

# one per family of ops layerscope must price: plain and residual convs, grouped and depthwise convs
# with squeeze-excitation, fire modules' concatenation, channel shuffle, a non-224 input (299),
# attention through nn.MultiheadAttention, windowed attention with relative-position bias
MODELS = ["resnet18", "regnet_y_400mf", "mobilenet_v3_small", "efficientnet_b0", "squeezenet1_1",
          "shufflenet_v2_x0_5", "inception_v3", "vit_b_16", "swin_t"]
# torchvision's RegNet computes its stage widths with tensor arithmetic (.item()), impossible on meta
_ON_CPU = {"regnet_y_400mf"}
# without weights torchvision warns that Inception's default initialisation will change: say which
_KWARGS = {"inception_v3": {"init_weights": False}}


def _published(name):
    """The first weights entry's published GMACs and parameter count, and the side of its centre crop."""
    weights = list(torchvision.models.get_model_weights(name))[0]
    crop = getattr(weights.transforms, "keywords", {}).get("crop_size", 224)
    return weights.meta["_ops"], weights.meta["num_params"], crop


@pytest.mark.parametrize("name", MODELS)
def test_macs_match_torchvisions_published_gflops(name):
    gmacs, params, crop = _published(name)
    with torch.device("cpu" if name in _ON_CPU else "meta"):
        model = torchvision.models.get_model(name, weights=None, **_KWARGS.get(name, {}))
    before = snapshot(model)
    rep = ls.analyze(model, input_size=(1, 3, crop, crop))
    assert rep.coverage.complete
    # published to 3 decimals: ours must round to the same thousandth of a GMAC
    assert rep.totals.macs / 1e9 == pytest.approx(gmacs, abs=5e-4), (rep.totals.macs, gmacs)
    assert rep.totals.params == params
    assert_sums(rep)
    assert_unchanged(before, model)
