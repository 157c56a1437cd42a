"""Issue 18 item 10: the model dtype (`--model-dtype`, `build_model(dtype=...)`). hf: specs used to be
built in fp32 whatever the user meant (a 7B preset showed "Params size 25.10 GiB") and
`--set torch_dtype=bfloat16` was silently ignored."""

from __future__ import annotations

import json

import pytest
import torch

from layerscope.cli import main
from layerscope.errors import SpecError
from layerscope.specs import build_model, weight_bytes

# GPT-2 shrunk: n_layer=1, n_embd=64, n_head=2, vocab_size=100 (n_positions stays 1024). Its
# parameters, by hand: wte 100*64 = 6,400; wpe 1024*64 = 65,536; one block: ln_1 128, c_attn
# 64*192+192 = 12,480, attn c_proj 64*64+64 = 4,160, ln_2 128, c_fc 64*256+256 = 16,640, mlp c_proj
# 256*64+64 = 16,448 (49,984); ln_f 128. Total 122,048 parameters in 16 tensors.
SMALL = ["hf:GPT2Config", "--set", "n_layer=1", "--set", "n_embd=64", "--set", "n_head=2",
         "--set", "vocab_size=100"]
N_SMALL, TENSORS_SMALL = 122_048, 16


def _json(capsys, *argv) -> dict:
    assert main([*argv, "--format", "json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_llama_2_7b_bf16_params_size(capsys):
    # 6,738,415,616 params x 2 bytes = 13,476,831,232 B = 12.55 GiB (fp32: x 4 = 25.10 GiB); built on meta
    d = _json(capsys, "summary", "hf:llama-2-7b", "--model-dtype", "bf16", "--depth", "0")
    assert d["totals"]["params"] == 6_738_415_616
    assert d["totals"]["param_bytes"] == 13_476_831_232
    assert main(["summary", "hf:llama-2-7b", "--model-dtype", "bf16", "--depth", "0"]) == 0
    assert "12.55 GiB" in capsys.readouterr().out
    # the default stays fp32 (x 4 B), fp16 is 2 B (the builder only; the analysis above is the same)
    fp32 = build_model("hf:llama-2-7b").model
    assert sum(p.numel() * p.element_size() for p in fp32.parameters()) == 6_738_415_616 * 4
    fp16 = build_model("hf:llama-2-7b", dtype="fp16").model
    assert sum(p.numel() * p.element_size() for p in fp16.parameters()) == 13_476_831_232


def test_build_model_dtype_python():
    built = build_model("hf:llama-2-7b", dtype=torch.bfloat16)
    assert {p.dtype for p in built.model.parameters()} == {torch.bfloat16}
    assert all(p.device.type == "meta" for p in built.model.parameters())
    # + the two rotary buffers inv_freq and original_inv_freq, 64 elements each: 2 * 64 * 2 B = 256 B
    assert weight_bytes(built.model) == 13_476_831_232 + 256
    assert build_model("hf:gpt2", dtype="fp16").model.transformer.wte.weight.dtype == torch.float16
    with pytest.raises(SpecError, match="bf16, fp16 or fp32"):
        build_model("hf:gpt2", dtype="int8")
    with pytest.raises(SpecError, match="not a floating-point"):
        build_model("hf:gpt2", dtype=torch.int64)


def test_memory_bf16_parameter_gradient_optimizer_bytes(capsys):
    # parameters and gradients: 122,048 x 2 B = 244,096 B. AdamW state: torch allocates exp_avg and
    # exp_avg_sq with torch.zeros_like(param), i.e. in the parameter's dtype (bf16 here, NOT fp32), plus
    # one fp32 `step` scalar per parameter tensor: 2 x 244,096 + 16 x 4 = 488,256 B
    d = _json(capsys, "memory", *SMALL, "--input-ids", "2,16", "--optimizer", "adamw", "--model-dtype", "bf16")
    t = d["totals"]
    assert t["parameter_bytes"] == N_SMALL * 2 == 244_096
    assert t["gradient_bytes"] == 244_096
    assert t["optimizer_bytes"] == 2 * 244_096 + TENSORS_SMALL * 4 == 488_256


def test_adamw_state_dtype_matches_real_torch():
    # the independent measurement behind the expectation above: a real AdamW step on the same model
    # in bf16, summing the bytes of the state torch really allocated
    model = build_model(SMALL[0], "cpu", {"n_layer": 1, "n_embd": 64, "n_head": 2, "vocab_size": 100},
                        dtype="bf16").model
    opt = torch.optim.AdamW(model.parameters())
    model(input_ids=torch.zeros(2, 16, dtype=torch.long)).last_hidden_state.float().sum().backward()
    opt.step()
    states = [t for s in opt.state.values() for t in s.values()]
    assert {t.dtype for t in states} == {torch.bfloat16, torch.float32}
    assert sum(t.numel() * t.element_size() for t in states) == 488_256


def test_split_and_report_honour_model_dtype(capsys, tmp_path):
    d = _json(capsys, "split", *SMALL, "--set", "n_layer=2", "--input-ids", "2,16", "--stages", "2",
              "--model-dtype", "fp16")
    # two blocks now: 122,048 + 49,984 = 172,032 params, all of them in fp16 across the stages
    assert sum(s["params"] for s in d["stages"]) == 172_032
    out = tmp_path / "r.html"
    assert main(["report", *SMALL, "--input-ids", "1,8", "--model-dtype", "bf16", "-o", str(out), "-q"]) == 0
    assert out.stat().st_size > 0


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_set_torch_dtype_is_refused_with_a_pointer(key, capsys):
    # transformers reads torch_dtype only in from_pretrained: a model built from its config ignored it
    assert main(["summary", "hf:gpt2", "--set", f"{key}=bfloat16"]) == 1
    err = capsys.readouterr().err
    assert "--model-dtype" in err and err.count("\n") == 1


def test_set_takes_true_and_false_as_a_shell_user_writes_them():
    from layerscope.specs import parse_overrides
    assert parse_overrides(["use_cache=false", "tie_word_embeddings=True", "n_layer=2", "act=gelu"]) == \
        {"use_cache": False, "tie_word_embeddings": True, "n_layer": 2, "act": "gelu"}
