"""The harness of the transformers sweep: shrink a config, build its model class with example inputs
made for its forward, and run analyze() on CPU, on meta and with a backward (``one``). Shared by
bench/sweep_transformers.py (every class) and tests/test_sweep_subset.py (a subset in CI): tests
never import bench/; the benchmark imports this."""

from __future__ import annotations

import inspect
import os
import signal
import tempfile
import traceback

import torch

import layerscope as ls
from layerscope.capture.inputs import iter_tensors

SMALL = {
    # widths
    "hidden_size": 32, "d_model": 32, "n_embd": 32, "embed_dim": 32, "dim": 32, "hidden_dim": 64,
    "intermediate_size": 64, "ffn_dim": 64, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "d_ff": 64,
    "n_inner": 64, "d_kv": 16, "head_dim": 16, "projection_dim": 32, "text_embed_dim": 32,
    "vision_embed_dim": 32,
    # depth
    "num_hidden_layers": 2, "n_layer": 2, "n_layers": 2, "num_layers": 2, "encoder_layers": 1,
    "decoder_layers": 1, "num_decoder_layers": 1, "num_encoder_layers": 1,
    # heads
    "num_attention_heads": 2, "n_head": 2, "n_heads": 2, "num_heads": 2, "encoder_attention_heads": 2,
    "decoder_attention_heads": 2, "num_key_value_heads": 2,
    # experts
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    # sizes of inputs
    "image_size": 32, "patch_size": 8, "max_position_embeddings": 128, "num_mel_bins": 16,
    "max_source_positions": 32,
    # what a part sees of another part's width (a Q-Former reading the vision tower)
    "encoder_hidden_size": 32,
    # sub-widths of attention that must stay within the head (rotary parts, latent attention)
    "rotary_dim": 8, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "kv_lora_rank": 32,
    "q_lora_rank": 32, "index_head_dim": 16,
}


MAX_PARAMS = 1_500_000_000      # the depth-only tier builds nothing larger (6 GB of float32)


class _Timeout(BaseException):
    """A BaseException, like KeyboardInterrupt, so that no `except Exception` on the way swallows it."""


DEPTH_ONLY = {k: v for k, v in SMALL.items()
              if k.startswith(("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers",
                               "num_decoder_layers", "num_encoder_layers", "num_experts", "num_local_experts",
                               "n_routed_experts"))}
SUB_CONFIGS = ("text_config", "vision_config", "audio_config", "encoder", "decoder", "qformer_config",
               "speech_config", "backbone_config")


def shrink(config, sizes: dict = SMALL) -> None:
    """Set the small sizes on every attribute the config has, in it and in its sub-configs."""
    for sub_name in SUB_CONFIGS:
        sub = getattr(config, sub_name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            shrink(sub, sizes)
    for k, v in sizes.items():
        cur = getattr(config, k, None)
        if isinstance(cur, int) and not isinstance(cur, bool) and cur > v:
            try:
                setattr(config, k, v)
            except Exception:
                pass
    if hasattr(config, "vocab_size") and isinstance(config.vocab_size, int) and config.vocab_size > 512:
        ids = [getattr(config, n, None) for n in ("pad_token_id", "bos_token_id", "eos_token_id",
                                                   "decoder_start_token_id")]
        need = max([i for i in ids if isinstance(i, int)] + [0]) + 1
        if need <= 512:
            config.vocab_size = 512


def _sub(config, name: str):
    sub = getattr(config, name, None)
    return sub if sub is not None and hasattr(sub, "to_dict") else config


def _vocab(config) -> int:
    for c in (config, _sub(config, "text_config"), _sub(config, "decoder")):
        v = getattr(c, "vocab_size", None)
        if isinstance(v, int) and v > 0:
            return min(v, 512)
    return 128


def _pixels(config) -> torch.Tensor:
    vc = _sub(config, "vision_config")
    size = getattr(vc, "image_size", None) or getattr(config, "image_size", None) or 32
    if isinstance(size, dict):
        size = [size.get("height", 32), size.get("width", 32)]
    h, w = (size[0], size[-1]) if isinstance(size, (list, tuple)) else (size, size)
    channels = getattr(vc, "num_channels", None) or 3
    frames = getattr(vc, "num_frames", None)
    shape = (1, frames, channels, h, w) if isinstance(frames, int) and frames > 0 else (1, channels, h, w)
    return torch.randn(*shape)


def _features(config) -> torch.Tensor:
    ac = _sub(config, "audio_config")
    frames = 2 * (getattr(ac, "max_source_positions", None) or 32)    # Whisper's conv stem halves it
    return torch.randn(1, getattr(ac, "num_mel_bins", None) or 16, frames)


def _boxes(config) -> torch.Tensor:
    return torch.tensor([[0, 0, 1, 1]] * 8).unsqueeze(0)              # LayoutLM: x0 <= x1, y0 <= y1


MAKERS = {
    "input_ids": lambda c: torch.randint(0, _vocab(c), (1, 8)),
    "decoder_input_ids": lambda c: torch.randint(0, _vocab(c), (1, 4)),
    "pixel_values": _pixels,
    "input_features": _features,
    "input_values": lambda c: torch.randn(1, 1600),
    "bbox": _boxes,
}


def input_candidates(model, config) -> list[dict]:
    """Example inputs to try, in order: the main input alone (plus decoder ids for an encoder-decoder),
    then every input of forward() we know how to make that is required or that a multimodal model
    needs (token ids with pixel values, boxes for layout models)."""
    main = getattr(model, "main_input_name", "input_ids")
    if main not in MAKERS:
        raise RuntimeError(f"main input {main!r}")
    first = {main: MAKERS[main](config)}
    if getattr(config, "is_encoder_decoder", False):
        first["decoder_input_ids"] = MAKERS["decoder_input_ids"](config)
    out = [first]
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return out
    wide = dict(first)
    for name, p in params.items():
        required = p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        wanted = required or name in ("input_ids", "pixel_values", "bbox", "decoder_input_ids")
        if name in MAKERS and name not in wide and wanted:
            wide[name] = MAKERS[name](config)
    if wide.keys() != first.keys():
        out.append(wide)
    return out


def inputs_for(model, config) -> dict:
    return input_candidates(model, config)[0]


def build(model_type: str, cls_name: str):
    """The model, in eval mode, and inputs its own forward runs on: the config shrunk to tiny sizes
    first; when that model does not run (shrinking can break a config's own consistency: heads that
    no longer divide the width, a projection sized for the original width), only its depth and vocab
    shrunk. When nothing runs, raises the error of the widest inputs on the first tier."""
    import transformers as T
    cls = getattr(T, cls_name)
    first_error = None
    for tier, sizes in enumerate((SMALL, DEPTH_ONLY)):
        try:
            config = T.AutoConfig.for_model(model_type)
            shrink(config, sizes)
            if tier:
                # full widths can mean billions of parameters: count them on meta first
                with torch.device("meta"):
                    n = sum(p.numel() for p in cls(config).parameters())
                if n > MAX_PARAMS:
                    break
            torch.manual_seed(0)
            model = cls(config).eval()
            for kwargs in input_candidates(model, config):
                try:
                    with torch.no_grad():
                        own = model(**kwargs)
                    return model, kwargs, own
                except Exception as e:
                    first_error = e if tier == 0 else first_error
        except _Timeout:
            raise
        except Exception as e:
            first_error = first_error or e
    raise first_error


def _own_backward(model, kwargs) -> str | None:
    """Run the model's own forward and backward (eval mode, no layerscope). None when it works, else
    the error: some models refuse a backward in eval mode (Reformer asserts model.train()) and
    cannot run one in train mode on short inputs."""
    try:
        out = model(**kwargs)
        ts = [t for t in iter_tensors(out) if t.requires_grad]
        torch.autograd.backward(ts, [torch.ones_like(t) for t in ts])
        return None
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
    finally:
        model.zero_grad(set_to_none=True)


# where the worker is, for the parent to read when the kernel kills it: building and running the
# model's own forward ("build") or analysing it ("analyze")
# (the parent names the file; its spawned workers inherit the name through the environment)
_STAGE = os.environ.setdefault("LAYERSCOPE_SWEEP_STAGE",
                               os.path.join(tempfile.gettempdir(), f"layerscope-sweep-{os.getpid()}.stage"))


def _stage(what: str) -> None:
    with open(_STAGE, "w") as f:
        f.write(what)


def _alarm(signum, frame):
    raise _Timeout()


def one(model_type: str, cls_name: str, seconds: int, gpu: str | None = None) -> tuple[str, str]:
    """One class through analyze(): CPU, meta and a backward on CPU; with ``gpu``, also a meta forward
    and backward with SDPA priced as that GPU runs it (bench/sweep_transformers.py --gpu)."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        try:
            _stage("build")
            model, kwargs, own = build(model_type, cls_name)
            _stage("analyze")
        except _Timeout:
            return "skip", "timeout building or running its own forward"
        except Exception as e:
            return "skip", f"own: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        steps = [("cpu", {}), ("meta", {"device": "meta"})]
        # a backbone with no out_features chosen returns no tensor: there is nothing to differentiate
        has_output = any(t.is_floating_point() for t in iter_tensors(own))
        if any(p.requires_grad for p in model.parameters()) and has_output:
            # backward in eval mode, as the model's own forward ran: train-only behaviour (BatchNorm
            # over one value, SpecAugment masks longer than a tiny input) is the model's, not ours
            steps.append(("backward", {"backward": True, "mode": "eval"}))
        if gpu:
            # forward and backward on meta, SDPA priced for the GPU (the backward only where the CPU one
            # ran: a model whose own backward fails in eval mode has none to count)
            steps.append(("gpu", {"device": "meta", "gpu": gpu, "mode": "eval",
                                  "backward": any(label == "backward" for label, _ in steps)}))
        notes = [] if has_output else ["no tensor output: backward not run"]
        for label, kw in steps:
            if label == "gpu" and any(n.startswith("backward not run") for n in notes):
                kw = {**kw, "backward": False}
            try:
                try:
                    rep = ls.analyze(model, **kw, **kwargs)
                except ls.ForwardError:
                    if label != "backward":
                        raise
                    own = _own_backward(model, kwargs)
                    if own is not None:
                        # the model cannot do it either: nothing for layerscope to count
                        notes.append(f"backward not run: the model's own fails ({own})")
                        continue
                    raise
            except ls.LayerscopeError as e:
                return "fail", f"{label}: LayerscopeError: {str(e).splitlines()[0][:160]}"
            except _Timeout:
                return "fail", f"{label}: timeout"
            except Exception as e:
                tb = traceback.extract_tb(e.__traceback__)[-1]
                return "fail", (f"{label}: CRASH {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
                                f" at {tb.filename.rsplit('/', 1)[-1]}:{tb.lineno}")
            if not rep.coverage.complete and label == "cpu":
                notes.append("uncounted: " + ", ".join(f"{u.op} x{u.count}" for u in rep.coverage.uncounted[:4]))
        return "pass", "; ".join(notes)
    finally:
        signal.alarm(0)
