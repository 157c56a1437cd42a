"""The shipped presets (issue 60, item 5): config.json files in transformers' own format with
layerscope's metadata beside them (layerscope.json), each new one's parameter count checked against the
figure its model card (or paper, or torchtitan) publishes. Built on the meta device: nothing allocated."""

from __future__ import annotations

import json
import re

import pytest

from layerscope.specs import build_model, presets

# The 16 presets of issue 60 and the figure each source publishes (the source, with its wording, is in
# the preset's layerscope.json "published"). Tolerance: half a unit of the last digit the source gives
# ("8.03B": +-0.005e9, "671B": +-0.5e9), as each rounds its count; exact where it gives every digit.
#   llama-3.1-8b     8,030,261,248   8.03B    the Hub's count of the weights (card: "8B")
#   llama-3.1-70b   70,553,706,496   70.6B    the Hub's count (card: "70B")
#   llama-3.1-405b 405,853,388,800   406B     the Hub's count (card: "405B"); by hand: 2 x 128,256 x 16,384
#                  (embedding, head) + 126 x (2 x 16,384^2 + 2 x 16,384 x 1,024 (q,o; k,v with 8 KV heads)
#                  + 3 x 16,384 x 53,248 + 2 x 16,384 (norms)) + 16,384 = 405,853,388,800
#   llama-3.2-1b     1,235,814,400   1.23B    card: "1B (1.23B)", which cuts the count (1.2358B; the Hub page
#                                             shows 1.24B): checked as 1.23e9 <= n < 1.24e9; tied embeddings
#   llama-3.2-3b     3,212,749,824   3.21B    card: "3B (3.21B)"
#   qwen3-8b         8,190,735,360   8.2B     card
#   qwen3-32b       32,762,123,264   32.8B    card
#   qwen3-30b-a3b   30,532,122,624   30.5B    card (3.3B activated)
#   qwen3-235b-a22b 235,093,634,560  235B     card (22B activated)
#   deepseek-v3    671,026,404,352   671B     card (the Hub's 685B adds the 14B MTP module, not built); equal to
#                                             torchtitan b5bcd76's 671B built on meta: 671,026,404,352
#   deepseek-v3-16b 15,706,484,224   exact    torchtitan b5bcd76 _16b(): its get_nparams_and_flops on meta
#   gpt-oss-20b     20,914,757,184   20.91B   the gpt-oss model card, table 1
#   gpt-oss-120b   116,829,156,672   116.83B  the gpt-oss model card, table 1
#   mixtral-8x22b  140,630,071,296   141B     Mistral AI; by hand: 2 x 32,768 x 6,144 + 56 x (2 x 6,144^2 +
#                  2 x 6,144 x 1,024 + 8 x 3 x 6,144 x 16,384 + 6,144 x 8 (router) + 2 x 6,144) + 6,144
#   gemma-3-27b     27,009,346,304   25,600M non-embedding (Gemma 3 report, table 1): 27,009,346,304 -
#                                    262,208 x 5,376 (tied embedding) = 25,599,716,096
#   phi-4           14,659,507,200   14.7B    the Hub's count (card: "14B")
NEW = {"llama-3.1-8b": 8_030_261_248, "llama-3.1-70b": 70_553_706_496, "llama-3.1-405b": 405_853_388_800,
       "llama-3.2-1b": 1_235_814_400, "llama-3.2-3b": 3_212_749_824, "qwen3-8b": 8_190_735_360,
       "qwen3-32b": 32_762_123_264, "qwen3-30b-a3b": 30_532_122_624, "qwen3-235b-a22b": 235_093_634_560,
       "deepseek-v3": 671_026_404_352, "deepseek-v3-16b": 15_706_484_224, "gpt-oss-20b": 20_914_757_184,
       "gpt-oss-120b": 116_829_156_672, "mixtral-8x22b": 140_630_071_296, "gemma-3-27b": 27_009_346_304,
       "phi-4": 14_659_507_200}
TORCHTITAN = {"deepseek-v3-16b": 15_706_484_224, "deepseek-v3": 671_026_404_352}   # b5bcd76, built on meta


def published(text: str) -> tuple[float, float]:
    """'8.03B' -> (8.03e9, 0.005e9); '25,600M' -> (25.6e9, 0.5e6); '15,706,484,224' -> exact."""
    m = re.fullmatch(r"([\d,]+)(?:\.(\d+))?([BM]?)", text)
    assert m, text
    scale = {"B": 10 ** 9, "M": 10 ** 6, "": 1}[m.group(3)]
    decimals = len(m.group(2) or "")
    value = int(m.group(1).replace(",", "") + (m.group(2) or "")) * scale // 10 ** decimals   # exact
    return value, (0.0 if not m.group(3) else 0.5 * scale / 10 ** decimals)


def test_published_parser():
    assert published("8.03B") == (8.03e9, pytest.approx(0.005e9))
    assert published("671B") == (671e9, 0.5e9)
    assert published("25,600M") == (25_600e6, 0.5e6)
    assert published("15,706,484,224") == (15_706_484_224, 0.0)


def _count(model) -> int:
    return sum(t.numel() for t in {id(t): t for t in model.parameters()}.values())


@pytest.mark.parametrize("name", sorted(NEW))
def test_new_preset_matches_its_published_figure(name):
    p = presets()[name]
    if name == "deepseek-v3":
        # built once in the fast suite: tests/cli/test_ux.py builds every preset on meta and checks the count
        # equals layerscope.json's params, which equals NEW here (2-10 s to build 61 layers of 256 experts)
        n = p["params"]
    else:
        model = build_model(f"hf:{name}").model
        n = _count(model)
        assert all(t.device.type == "meta" for t in model.parameters())
    assert n == NEW[name] == p["params"]
    value, tol = published(p["published"]["params"])
    if p["published"].get("counts") == "non-embedding":
        n -= model.get_input_embeddings().weight.numel()      # tied with the head: counted once in n
        assert n == 27_009_346_304 - 262_208 * 5376
    if p["published"].get("rounding") == "truncated":
        assert value <= n < value + 2 * tol, (name, n, value)
    else:
        assert abs(n - value) <= tol, (name, n, value, tol)
    if name in TORCHTITAN:
        assert n == TORCHTITAN[name]
    assert p["published"]["source"] and p["source"].startswith("https://")


def test_every_preset_is_a_transformers_config_with_its_metadata_beside_it():
    from pathlib import Path
    import transformers
    for name, p in presets().items():
        d = Path(p["path"])
        cfg = json.loads((d / "config.json").read_text())
        side = json.loads((d / "layerscope.json").read_text())
        assert cfg["model_type"] and cfg["architectures"] == [p["model"]], name
        assert hasattr(transformers, p["model"]), name
        assert {"description", "params", "inputs", "source"} <= set(side), name
        # nothing of layerscope's own inside the config: transformers would keep it as an attribute
        assert not any(k.startswith("_layerscope") or k in ("description", "params", "inputs") for k in cfg), name


def test_preset_directory_is_read_as_hf_path_with_the_same_figures():
    # a preset is a directory hf:PATH reads the same way: same class, same count, same default inputs
    p = presets()["qwen3-30b-a3b"]
    a, b = build_model("hf:qwen3-30b-a3b"), build_model(f"hf:{p['path']}")
    assert type(a.model) is type(b.model) and _count(a.model) == _count(b.model) == 30_532_122_624
    import torch
    assert a.default_inputs(torch.device("meta"))[1]["input_ids"].shape == (1, 4096)
    assert b.default_inputs(torch.device("meta"))[1]["input_ids"].shape == (1, 4096)
