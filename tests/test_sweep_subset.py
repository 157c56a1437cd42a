"""The CI subset of bench/sweep_transformers.py (its harness: tests/zoo/hf_sweep.py): architectures of every family (encoder, decoder,
encoder-decoder, vision, audio, mixture-of-experts) through analyze() on CPU, on meta and with a
backward, built from their configs shrunk to tiny sizes; and on meta again with SDPA priced for an A100
(issue 34: each SDPA call routed to the kernel torch's CUDA rules pick, here memory-efficient or math for
fp32), forward and backward."""

from __future__ import annotations

import warnings

import pytest

from .zoo import hf_sweep as sweep

SUBSET = [("bert", "BertModel"), ("gpt2", "GPT2Model"), ("llama", "LlamaModel"), ("t5", "T5Model"),
          ("bart", "BartModel"), ("vit", "ViTModel"), ("resnet", "ResNetModel"), ("wav2vec2", "Wav2Vec2Model"),
          ("mixtral", "MixtralModel"), ("qwen3_moe", "Qwen3MoeModel"), ("whisper", "WhisperModel")]


@pytest.mark.parametrize("model_type, cls", SUBSET)
def test_architecture_passes(model_type, cls):
    import transformers
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        status, why = sweep.one(model_type, cls, 120, gpu="A100")
    assert status == "pass", why
