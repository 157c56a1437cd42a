"""Every model class transformers can build from a config, shrunk, through analyze() on CPU and on
meta and a backward on CPU. Prints a table of architecture -> pass / fail / skip with reasons and
the pass rate; asserts nothing.

  python bench/sweep_transformers.py [--mapping base|all] [--only TYPE,...] [--limit N]
                                      [--csv out.csv] [--seconds 60]

A class is *skipped* when transformers cannot build it from its default config shrunk to tiny sizes,
or when its own forward fails on the example inputs made for it (token ids, pixel values, audio
features, decoder inputs): then there is nothing for layerscope to analyse. It *passes* when
analyze() on CPU, analyze(device="meta") and analyze(backward=True) (eval mode, as the model's own
forward ran) all return a report (complete,
or with its uncounted ops listed). It *fails* otherwise; a failure that is a LayerscopeError naming
the layer is told apart from an internal crash.
"""

from __future__ import annotations

import argparse
import csv
import gc
import os
import inspect
import signal
import tempfile
import sys
import time
import traceback
import warnings

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


def one(model_type: str, cls_name: str, seconds: int) -> tuple[str, str]:
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
        notes = [] if has_output else ["no tensor output: backward not run"]
        for label, kw in steps:
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


def classes(mapping: str) -> list[tuple[str, str]]:
    import transformers.models.auto.modeling_auto as ma
    tables = ["MODEL_MAPPING_NAMES"] if mapping == "base" else \
        [n for n in dir(ma) if n.startswith("MODEL") and n.endswith("_MAPPING_NAMES")]
    pairs: dict[tuple[str, str], None] = {}
    for n in tables:
        for k, v in getattr(ma, n).items():
            for c in (v if isinstance(v, (list, tuple)) else [v]):
                pairs[(k, c)] = None
    return sorted(pairs)


def _init_worker() -> None:
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()


def _one_row(pair: tuple[str, str], seconds: int) -> tuple[str, str, str, str]:
    status, why = one(*pair, seconds)
    gc.collect()
    return (*pair, status, why)


def _run_all(todo: list[tuple[str, str]], seconds: int):
    """Each class in a worker process, a fresh worker every 20 classes: what a model leaves behind
    (caches, leaked references) cannot pile up, and a worker the kernel kills for memory costs only
    the class it was running, reported as a fail."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    i = 0
    while i < len(todo):
        with ProcessPoolExecutor(1, initializer=_init_worker, max_tasks_per_child=20) as pool:
            try:
                for pair in todo[i:]:
                    row = pool.submit(_one_row, pair, seconds).result()
                    i += 1
                    yield row
            except BrokenProcessPool:
                try:
                    with open(_STAGE) as f:
                        stage = f.read()
                except OSError:
                    stage = "analyze"
                # killed while the model itself was built or ran: its own forward does not fit here
                yield (*todo[i], *(("skip", "own: the process was killed (out of memory) building or running "
                                   "it") if stage == "build" else
                                  ("fail", "the worker process died during the analysis (killed for memory?)")))
                i += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mapping", choices=("base", "all"), default="base",
                    help="base: one class per architecture (MODEL_MAPPING); all: every head too")
    ap.add_argument("--only", help="comma-separated model types")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--csv", help="write the rows here as they come")
    ap.add_argument("--resume", metavar="CSV", help="keep the rows of an earlier --csv and run the rest")
    ap.add_argument("--shard", metavar="K/N", help="run only every N-th class from the K-th (0-based): N "
                                                   "processes share the work; merge their --csv files")
    ap.add_argument("--seconds", type=int, default=60, help="per class")
    ns = ap.parse_args()
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()
    todo = classes(ns.mapping)
    if ns.only:
        keep = set(ns.only.split(","))
        todo = [p for p in todo if p[0] in keep]
    if ns.limit:
        todo = todo[:ns.limit]
    rows, done = [], set()
    if ns.resume and os.path.exists(ns.resume):
        with open(ns.resume, newline="") as f:
            rows = [tuple(r) for r in csv.reader(f)][1:]
        done = {(r[0], r[1]) for r in rows}
    out = open(ns.csv or os.devnull, "w", newline="")
    writer = csv.writer(out)
    writer.writerow(["model_type", "class", "status", "reason"])
    writer.writerows(rows)
    t0 = time.time()
    left = [p for p in todo if p not in done]
    if ns.shard:
        k, n = (int(v) for v in ns.shard.split("/"))
        left = left[k::n]
        torch.set_num_threads(1)           # the shards share the cores
    for i, row in enumerate(_run_all(left, ns.seconds)):
        rows.append(row)
        writer.writerow(row)
        out.flush()
        print(f"[{len(done) + i + 1}/{len(todo)}] {row[2]:<4} {row[0]:<28} {row[1]:<44} {row[3]}", flush=True)
    out.close()
    passed = sum(r[2] == "pass" for r in rows)
    failed = [r for r in rows if r[2] == "fail"]
    crashes = [r for r in failed if "CRASH" in r[3]]
    runnable = passed + len(failed)
    print(f"\n{len(rows)} classes in {time.time() - t0:.0f} s: {passed} pass, {len(failed)} fail "
          f"({len(crashes)} internal crashes), {len(rows) - runnable} skip (their own forward does not run "
          f"on tiny inputs); pass rate of runnable {100 * passed / max(runnable, 1):.1f}%")
    for r in failed:
        print(f"  FAIL {r[0]} {r[1]}: {r[3]}")
    sys.exit(0)


if __name__ == "__main__":
    main()
