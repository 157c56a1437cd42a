"""The hand-derived references of bench/peers.py (tests/zoo/peer_models.py) hold for layerscope: the models the peers are
measured on, counted here without the peers (they are not test dependencies)."""

from __future__ import annotations


import pytest

import layerscope as ls

from .zoo import peer_models as peers


@pytest.mark.parametrize("name", ["CNN + ConvTranspose", "LSTM (T=20)", "tied + reused",
                                  "Llama shrunk (4x512, S=128)", "HF ResNet-50 (224)"])
def test_layerscope_matches_the_reference(name):
    if name.startswith(("Llama", "HF")):
        pytest.importorskip("transformers")
    model, x, ref_macs, ref_params = peers.MODELS[name]()
    rep = ls.analyze(model, x, device="meta")
    assert (rep.totals.macs, rep.totals.params) == (ref_macs, ref_params)
    assert rep.coverage.complete


def test_resnet50_reference_is_the_published_figure():
    # torchvision's published 4.09 GFLOPS for ResNet-50 are MACs; the per-conv sum plus the classifier
    assert peers._resnet50_macs() == 4_089_184_256
