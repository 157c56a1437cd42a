"""Models from what users have (issue 60, item 5): hf:PATH (a directory holding config.json, or the
file), hf:ORG/NAME[@REVISION] read from a prepared Hugging Face cache (the hub cache layout, offline; no
network in any test here), the unreachable-Hub line, trust_remote_code behind its flag. A Hub id and a
config.json directory give the same figures as the preset they equal."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from layerscope.cli import main
from layerscope.errors import SpecError
from layerscope.specs import build_model, presets

REPO = "meta-llama/Llama-3.2-1B"
REV_A = "a" * 40            # refs/main: the preset's config, with the Hub's torch_dtype as published
REV_B = "b" * 40            # an older revision: 2 layers more


def _count(model) -> int:
    return sum(t.numel() for t in {id(t): t for t in model.parameters()}.values())


def _preset_config(name: str) -> dict:
    return json.loads((Path(presets()[name]["path"]) / "config.json").read_text())


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A Hugging Face cache as the Hub client lays it out (models--ORG--NAME/snapshots/<rev>/config.json,
    refs/main), HF_HOME and HF_HUB_CACHE pointed at it, offline. huggingface_hub reads these variables
    when it is imported, so its module constants are set too (the subprocess test below sets only the
    environment)."""
    from huggingface_hub import constants
    cache = tmp_path / "hf" / "hub"
    root = cache / ("models--" + REPO.replace("/", "--"))
    cfg = {**_preset_config("llama-3.2-1b"), "torch_dtype": "bfloat16"}
    for rev, layers in ((REV_A, 16), (REV_B, 18)):
        snap = root / "snapshots" / rev
        snap.mkdir(parents=True)
        (snap / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": layers}))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(REV_A)
    for key, value in (("HF_HOME", str(tmp_path / "hf")), ("HF_HUB_CACHE", str(cache)), ("HF_HUB_OFFLINE", "1")):
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_hub_id_from_the_cache_builds_the_preset_it_equals(hub):
    import torch
    built = build_model(f"hf:{REPO}")
    # the preset's count: 1,235,814,400 (tests/test_presets.py; the model card's 1.23B)
    assert _count(built.model) == _count(build_model("hf:llama-3.2-1b").model) == 1_235_814_400
    assert type(built.model).__name__ == "LlamaForCausalLM"            # from the config's architectures
    # the published torch_dtype (bfloat16) is not applied: fp32 as every hf: spec, said in a note
    assert {p.dtype for p in built.model.parameters()} == {torch.float32}
    assert any("bfloat16 is not applied" in n for n in built.notes)
    assert build_model(f"hf:{REPO}", dtype="bf16").model.model.embed_tokens.weight.dtype == torch.bfloat16


def test_cli_says_what_the_config_asked_for_and_was_not_applied(hub, capsys):
    assert main(["summary", f"hf:{REPO}", "--set", "num_hidden_layers=1", "--input-ids", "1,8", "--depth", "0",
                 "--format", "json"]) == 0
    err = capsys.readouterr().err
    assert err == (f"layerscope: note: hf:{REPO}: the config's dtype bfloat16 is not applied: weights are fp32 "
                   "unless --model-dtype (build_model(dtype=...)) says otherwise\n")
    assert main(["summary", "hf:llama-3.2-1b", "--set", "num_hidden_layers=1", "--input-ids", "1,8", "--depth", "0",
                 "--format", "json"]) == 0
    assert capsys.readouterr().err == ""              # a preset asks for nothing it does not get


def test_hub_revision_reads_that_snapshot(hub):
    # @REV_B has 18 layers: 2 more Llama 3.2 1B layers of 2 x 2048^2 + 2 x 2048 x 512 (q, o; k, v with 8
    # KV heads of 64) + 3 x 2048 x 8192 + 2 x 2048 (norms) = 60,821,504 each
    a = _count(build_model(f"hf:{REPO}@main").model)
    b = _count(build_model(f"hf:{REPO}@{REV_B}").model)
    assert a == 1_235_814_400 and b - a == 2 * 60_821_504
    with pytest.raises(SpecError, match="no revision|not in the Hugging Face cache") as e:
        build_model(f"hf:{REPO}@{'c' * 40}")
    assert "\n" not in str(e.value)


def test_unreachable_hub_is_one_line_naming_the_offline_options(hub):
    with pytest.raises(SpecError) as e:
        build_model("hf:someone/not-cached")
    msg = str(e.value)
    assert "\n" not in msg and "HF_HUB_OFFLINE=1" in msg and "hf:path/to/config.json" in msg
    assert "not in the Hugging Face cache" in msg


def test_set_applies_on_top_and_layer_types_follow_the_layer_count(hub, tmp_path):
    # a config that writes its per-layer attention pattern out (gpt-oss publishes layer_types) keeps it
    # from the first layer when --set num_hidden_layers cuts it: transformers refuses a mismatched list
    d = tmp_path / "gptoss"
    d.mkdir()
    cfg = _preset_config("gpt-oss-20b")
    assert len(cfg["layer_types"]) == 24
    (d / "config.json").write_text(json.dumps(cfg))
    model = build_model(f"hf:{d}", overrides={"num_hidden_layers": 3, "num_local_experts": 4}).model
    assert model.config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert len(model.model.layers) == 3 and model.model.layers[0].mlp.experts.gate_up_proj.shape[0] == 4
    with pytest.raises(SpecError, match="no such key"):
        build_model(f"hf:{REPO}", overrides={"num_hiden_layers": 2})


def test_local_directory_and_file_equal_the_preset(tmp_path, capsys):
    # config.json alone (no layerscope.json beside it): same class and count as the preset, and the same
    # summary (params, MACs, FLOPs) for the same inputs
    d = tmp_path / "qwen3moe"
    d.mkdir()
    shutil.copy(Path(presets()["qwen3-30b-a3b"]["path"]) / "config.json", d / "config.json")
    other = tmp_path / "my-model.json"
    shutil.copy(d / "config.json", other)
    totals = []
    for spec in ("hf:qwen3-30b-a3b", f"hf:{d}", f"hf:{d / 'config.json'}", f"hf:{other}"):
        assert main(["summary", spec, "--set", "num_hidden_layers=2", "--input-ids", "1,16", "--depth", "0",
                     "--format", "json"]) == 0, capsys.readouterr().err
        totals.append(json.loads(capsys.readouterr().out)["totals"])
    assert all(t == totals[0] for t in totals)
    # 2 layers of Qwen3-30B-A3B: embedding and head 2 x 151,936 x 2048 = 622,329,856; a layer: q, o 2 x 2048 x
    # 4096 + k, v 2 x 2048 x 512 (4 KV heads of 128) + q/k norms 2 x 128 = 18,874,624, 128 experts x 3 x 2048
    # x 768 = 603,979,776, router 2048 x 128 = 262,144, norms 2 x 2048: 623,120,640; + final norm 2048:
    # 622,329,856 + 2 x 623,120,640 + 2048 = 1,868,573,184
    assert totals[0]["params"] == 1_868_573_184


def test_bad_paths_and_names_are_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for spec, words in ((f"hf:{tmp_path / 'empty'}", "holds no config.json"),
                        ("hf:./nowhere/config.json", "no such file"),
                        ("hf:NoSuchConfig", "neither a preset"),
                        ("hf:llama-3.1-8", "did you mean the preset 'llama-3.1-8b'")):
        assert main(["summary", spec]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, (spec, err)


CONFIG_PY = '''
from transformers import PretrainedConfig
class TinyConfig(PretrainedConfig):
    model_type = "tiny-custom"
    def __init__(self, width=8, **kwargs):
        self.width = width
        super().__init__(**kwargs)
'''
MODEL_PY = '''
import torch
from transformers import PreTrainedModel
from .configuration_tiny import TinyConfig
class TinyModel(PreTrainedModel):
    config_class = TinyConfig
    def __init__(self, config):
        super().__init__(config)
        self.fc = torch.nn.Linear(config.width, config.width)
    def forward(self, x):
        return self.fc(x)
'''


@pytest.fixture
def custom(tmp_path, monkeypatch):
    """A directory whose config needs its own code (auto_map), as a trust_remote_code repository has."""
    import transformers.dynamic_module_utils as dyn
    monkeypatch.setattr(dyn, "HF_MODULES_CACHE", str(tmp_path / "modules"))   # where transformers copies it
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "configuration_tiny.py").write_text(CONFIG_PY)
    (d / "modeling_tiny.py").write_text(MODEL_PY)
    (d / "config.json").write_text(json.dumps({
        "model_type": "tiny-custom", "architectures": ["TinyModel"], "width": 8,
        "auto_map": {"AutoConfig": "configuration_tiny.TinyConfig", "AutoModel": "modeling_tiny.TinyModel"}}))
    return d


def test_remote_code_only_behind_the_flag(custom, capsys):
    assert main(["summary", f"hf:{custom}", "--input-size", "1,8"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--trust-remote-code" in err and "configuration_tiny.TinyConfig" in err
    with pytest.raises(SpecError, match="--trust-remote-code"):
        build_model(f"hf:{custom}")
    # with it: the directory's own classes, 8 x 8 + 8 = 72 parameters
    model = build_model(f"hf:{custom}", trust_remote_code=True).model
    assert type(model).__name__ == "TinyModel" and _count(model) == 72
    assert main(["summary", f"hf:{custom}", "--trust-remote-code", "--input-size", "1,8", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"]["params"] == 72
    with pytest.raises(SpecError, match="applies to hf: specs only"):
        build_model("layerscope.examples:small_cnn", trust_remote_code=True)


@pytest.mark.slow      # two fresh processes importing torch and transformers: 20-50 s on 2 shared cores
def test_cli_honours_the_environment_in_a_fresh_process(hub, tmp_path, capsys):
    # HF_HOME / HF_HUB_CACHE / HF_HUB_OFFLINE as a user sets them, read by huggingface_hub at import:
    # the Hub id gives the preset's summary totals
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src")] + sys.path),
           "OMP_NUM_THREADS": "1"}
    args = ["summary", "--set", "num_hidden_layers=2", "--input-ids", "1,16", "--depth", "0", "--format", "json"]
    out = subprocess.run([sys.executable, "-m", "layerscope.cli", *args[:1], f"hf:{REPO}", *args[1:]], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    hub_totals = json.loads(out.stdout)["totals"]
    assert main([*args[:1], "hf:llama-3.2-1b", *args[1:]]) == 0
    assert json.loads(capsys.readouterr().out)["totals"] == hub_totals
    # 2 layers of Llama 3.2 1B: 128,256 x 2048 (tied) = 262,668,288, + 2 x 60,821,504 + 2048 = 384,313,344
    assert hub_totals["params"] == 384_313_344
    env["HF_HUB_CACHE"] = str(tmp_path / "empty-cache")
    out = subprocess.run([sys.executable, "-m", "layerscope.cli", *args[:1], f"hf:{REPO}", *args[1:]], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "HF_HUB_OFFLINE is set" in out.stderr


def test_deepseek_v3_hub_config_as_published_gives_the_preset_figures(hub, capsys):
    # DeepSeek-V3's config.json as the Hub publishes it: its own code named in auto_map, fp8 weights
    # (quantization_config), bf16, one MTP layer (num_nextn_predict_layers, which transformers does not
    # build). Without --trust-remote-code it is built with transformers' DeepseekV3Config (the model_type
    # is known), neither the fp8 quantization nor the dtype applied: the preset's figures, shrunk alike.
    repo = "deepseek-ai/DeepSeek-V3"
    cfg = {**_preset_config("deepseek-v3"), "torch_dtype": "bfloat16", "num_nextn_predict_layers": 1,
           "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                        "AutoModel": "modeling_deepseek.DeepseekV3Model",
                        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
           "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                   "weight_block_size": [128, 128]}}
    root = hub / ("models--" + repo.replace("/", "--"))
    (root / "snapshots" / REV_A).mkdir(parents=True)
    (root / "snapshots" / REV_A / "config.json").write_text(json.dumps(cfg))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(REV_A)
    built = build_model(f"hf:{repo}", overrides={"num_hidden_layers": 4, "n_routed_experts": 16})
    assert any("fp8" in n for n in built.notes) and any("code of its own" in n for n in built.notes)
    totals = []
    for spec in (f"hf:{repo}", "hf:deepseek-v3"):
        assert main(["summary", spec, "--set", "num_hidden_layers=4", "--set", "n_routed_experts=16",
                     "--set", "vocab_size=1024",
                     "--input-ids", "1,16", "--depth", "0", "--format", "json"]) == 0, capsys.readouterr().err
        totals.append(json.loads(capsys.readouterr().out)["totals"])
    assert totals[0] == totals[1]
    # 4 layers (3 dense, 1 MoE of 16 experts + 1 shared: 8 groups of 2, top-4 groups, top-8), a vocabulary
    # of 1024, by hand: embedding and head 2 x 1024 x 7168 = 14,680,064; attention (MLA) a layer: q_a 7168
    # x 1536 + q norm 1536 + q_b 1536 x 128 x 192 + kv_a 7168 x 576 + kv norm 512 + kv_b 512 x 128 x 256 + o
    # 128 x 128 x 7168 = 187,107,328; dense MLP 3 x 7168
    # x 18432 = 396,361,728; MoE 17 experts x 3 x 7168 x 2048 + router 16 x 7168 = 748,797,952; 2 norms a
    # layer 14,336; final norm 7168: 14,680,064 + 4 x 187,107,328 + 3 x 396,361,728 + 748,797,952 +
    # 4 x 14,336 + 7168 = 2,701,057,024 (the router's e_score_correction_bias is a buffer)
    assert totals[0]["params"] == 2_701_057_024


def test_resolution_order_preset_then_path_then_hub(hub, tmp_path, monkeypatch):
    # an existing directory named like the Hub id wins over the Hub (the order --help states); a preset
    # name wins over a directory of that name
    local = tmp_path / "work" / REPO
    local.mkdir(parents=True)
    (local / "config.json").write_text(json.dumps({**_preset_config("llama-3.2-1b"), "num_hidden_layers": 1}))
    (tmp_path / "work" / "llama-3.2-1b").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    # 1 layer: 262,668,288 (tied embedding) + 60,821,504 + 2048; the cache's refs/main has 16 layers
    assert _count(build_model(f"hf:{REPO}").model) == 323_491_840
    assert _count(build_model("hf:llama-3.2-1b").model) == 1_235_814_400


@pytest.mark.slow      # huggingface_hub retries a refused connection with back-off: about 30 s
def test_hub_that_refuses_connections_is_one_line(hub, monkeypatch, caplog):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")     # nothing listens on port 9 (discard)
    with pytest.raises(SpecError) as e:
        build_model("hf:someone/not-cached")
    msg = str(e.value)
    assert "\n" not in msg and "cannot be reached" in msg and "HF_HUB_OFFLINE=1" in msg
    # each retry's warning is dropped: the one line says what happened
    assert not any("thrown while requesting" in r.getMessage() for r in caplog.records)
    # a cached config is still read when the Hub cannot be reached (transformers falls back to the cache)
    assert _count(build_model(f"hf:{REPO}").model) == 1_235_814_400


def test_set_reaches_a_sub_configuration(tmp_path):
    # a multimodal config (Gemma 3: text_config, vision_config) shrinks with dotted keys; the text
    # config's written-out layer_types follow its layer count, as at the top level
    text = {**_preset_config("gemma-3-27b"), "num_hidden_layers": 6,
            "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}
    for key in ("architectures", "model_type"):
        text.pop(key)
    d = tmp_path / "gemma3"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": {**text, "model_type": "gemma3_text"},
        "vision_config": {"model_type": "siglip_vision_model", "num_hidden_layers": 27, "hidden_size": 1152,
                          "intermediate_size": 4304, "num_attention_heads": 16, "image_size": 896, "patch_size": 14}}))
    model = build_model(f"hf:{d}", overrides={"text_config.num_hidden_layers": 2,
                                              "vision_config.num_hidden_layers": 1}).model
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    assert model.config.text_config.layer_types == ["sliding_attention"] * 2
    assert len(model.model.language_model.layers) == 2 and len(model.model.vision_tower.encoder.layers) == 1
    small = build_model("hf:Gemma3Config", overrides={"text_config.num_hidden_layers": 1}).model
    assert len(small.language_model.layers) == 1          # AutoModel: Gemma3Model
    for overrides, words in (({"text_config.num_hiden_layers": 2}, "did you mean 'num_hidden_layers'"),
                             ({"audio_config.num_hidden_layers": 2}, "no sub-configuration 'audio_config'"),
                             ({"text_config.num_hidden_layers": -1}, "cannot be negative")):
        with pytest.raises(SpecError, match=re.escape(words)):
            build_model(f"hf:{d}", overrides=overrides)
