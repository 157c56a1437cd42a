"""Derived TP plans trained for real: ``layerscope parallel hf:<Config> --gpus 4 --tp 2 --run`` (FSDP 2 x TP 2 on 4
gloo ranks, this machine's CPU, fp32, 3 AdamW steps on a global batch of 4 x 16 tokens) against one process
training the same model: the losses within 1e-5 relative (FP32_LOSS_RTOL, inside the issue's 1e-4), the first
step's gradients within 1e-5, and each rank's peak (the CPU allocator's own count, not layerscope's tracker)
within 5% of the predicted band (issue 35's rule: from the simulated peak to it plus the reduce-scatter clone
gloo's worker may free late). Each launch costs 40-90 s on 2 cores: every one is slow, and the suite runs
four of the sixteen (IN_SUITE); bench/bench_tp_derived.py runs them all.

Measured 2026-11-29 (loss rel. error of the 3 steps' worst; rank peak against the band's low end, all 4 ranks
alike): Qwen3 2.0e-7, +0.11%; Qwen2 0, +0.12%; Mistral 1.1e-7, +0.12%; Gemma 0, +0.12%; Gemma2 1.1e-7, +0.11%;
Gemma3 text 1.1e-7, +0.11%; Phi3 0, -1.37%; Olmo2 1.0e-7, +0.10%; Granite 1.0e-7, +0.12%; Cohere 9.8e-8,
+1.09%; SmolLM3 1.0e-7, +0.12%; Starcoder2 1.0e-7, +0.16% (docs/benchmarks.md)."""

import json

import pytest

pytest.importorskip("transformers")

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128)
# what each config needs beyond BASE: head_dim where the config's default is not hidden / heads, a pad token
# inside the shrunk vocabulary, dropout off (a run and one process would draw different masks)
ARCH = {
    "Qwen3Config": dict(head_dim=16), "Qwen2Config": {}, "MistralConfig": {}, "GemmaConfig": dict(head_dim=16),
    "Gemma2Config": dict(head_dim=16), "Gemma3TextConfig": dict(head_dim=16), "Phi3Config": dict(pad_token_id=0),
    "Olmo2Config": dict(pad_token_id=0), "GraniteConfig": {}, "CohereConfig": dict(pad_token_id=0),
    "SmolLM3Config": dict(pad_token_id=0),
    "Starcoder2Config": dict(residual_dropout=0.0, embedding_dropout=0.0, attention_dropout=0.0),
    "MixtralConfig": dict(num_local_experts=4),
    "Qwen3MoeConfig": dict(num_experts=4, moe_intermediate_size=32, num_experts_per_tok=2),
}


def run_plan(capsys, cfg_name: str, ac: str = "none") -> dict:
    from layerscope.cli import main
    sets = [x for k, v in {**BASE, **ARCH[cfg_name]}.items() for x in ("--set", f"{k}={v}")]
    argv = ["parallel", f"hf:{cfg_name}", "--head", "causal-lm", *sets, "--input-ids", "4,16", "--gpus", "4",
            "--tp", "2", "--device", "cpu", "--mixed-precision", "off", "--ac", ac, "--run", "--steps", "3", "-q", "--format",
            "json"]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)["plans"][0]


# every architecture, and two with full checkpointing: bench/bench_tp_derived.py runs them all (16 torchrun
# launches, 40-90 s each on 2 cores); the suite the four whose styles the others reuse: Qwen3 (q/k norms
# replicated, sequence parallel), Phi3 (fused qkv and gate_up), Mixtral and Qwen3-MoE (packed expert weights)
SWEEP = [(n, "none") for n in ARCH] + [("MixtralConfig", "full"), ("Qwen3Config", "full")]
IN_SUITE = ("Qwen3Config", "Phi3Config", "MixtralConfig", "Qwen3MoeConfig")


@pytest.mark.slow
@pytest.mark.sweep
@pytest.mark.parametrize("cfg_name, ac", [c for c in SWEEP if c[1] == "none" and c[0] in IN_SUITE],
                         ids=[n for n, a in SWEEP if a == "none" and n in IN_SUITE])
def test_derived_plan_trains_as_one_process_under_fsdp_x_tp(capsys, cfg_name, ac):
    # with full checkpointing (measured 2026-11-29): the experts' and the replicated norms' local-parameter swaps
    # run again in the recompute; Mixtral +0.06% (one rank +0.99%), Qwen3 +0.77% of the band's low end
    plan = run_plan(capsys, cfg_name, ac)
    m = plan["measured"]
    assert m["loss_equal"] and m["max_rel_loss_diff"] <= 1e-4, m
    assert all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(m["losses"], m["reference_losses"])), m
    assert m["max_rel_grad_diff"] < 1e-5, m
    assert len(m["ranks"]) == 4
    for want, got in zip(plan["ranks"], m["ranks"]):
        assert 0.95 * want["simulated_peak_bytes"] <= got["peak_bytes"] <= 1.05 * want["peak_bytes"], (want, got)
