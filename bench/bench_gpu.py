"""What only a GPU can show: layerscope's predictions against the CUDA allocator and kernels.

  python bench/bench_gpu.py [--out DIR] [--only memory,sdpa,fsdp,stages] [--model Llama|GPT-2]   # with a CUDA GPU

Nothing here runs in the suite (CI has no GPU). Four parts, each a table; the figures of the last run
are in docs/benchmarks.md ("On a GPU").

1. memory: memory() of one training step twice over (the optimizer state exists from the first step
   on), predicted on fake tensors for the CUDA device the model is on, against the same steps run for
   real and measured by ``torch.cuda.max_memory_allocated`` (capture/measure.py, reset per step), for
   bench_memory.py's models and three larger ones (GPT-2 small and a 0.2B Llama in bf16 autocast, a
   ResNet-50 in fp32 where torchvision is installed). The measurement gives cuBLAS's workspaces back
   first, so that each model's steps make their own, as a training job's do.
2. sdpa: the kernel ``F.scaled_dot_product_attention`` runs (read from the profiler's ATen ops,
   forward and backward) against the one costs/sdpa.py predicts for this GPU's compute capability.
3. fsdp: rank 0 of an FSDP2 (and FSDP x TP) configuration of a Llama and a GPT-2 (``--model`` picks one)
   on this one GPU, its collectives on torch's
   ``fake`` backend (no data moves, no NCCL buffers), ``torch.cuda.max_memory_allocated`` per step
   (parallel.real.measure_one_rank) against parallel()'s prediction for a CUDA rank with backend
   "fake" (no NCCL buffers to estimate: the prediction is the simulation's alone).
4. stages: the same for pipeline stages (``pp`` 2, alone and with FSDP, GPipe and 1F1B, with full
   checkpointing): the first and the last stage's first rank run by torch's ``PipelineStage`` and
   schedule on this GPU (parallel.real.measure_stage_rank), P2P on the fake backend too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import layerscope as ls  # noqa: E402

ROWS: dict[str, list] = {"memory": [], "sdpa": [], "fsdp": [], "stages": []}


def _cuda(x):
    return ls.capture.map_tensors(x, lambda t: t.cuda())


def _hf(cls, cfg_cls, **cfg):
    import transformers as tf
    return getattr(tf, cls)(getattr(tf, cfg_cls)(**cfg))


def _ids(b, s, vocab):
    return torch.randint(0, vocab, (b, s), generator=torch.Generator().manual_seed(0))


def larger_cases():
    cases = [("GPT-2 small 8x512, bf16 autocast + AdamW",
              lambda: (_hf("GPT2LMHeadModel", "GPT2Config", bos_token_id=0, eos_token_id=0), (),
                       {"input_ids": _ids(8, 512, 50257)},
                       dict(optimizer=torch.optim.AdamW, autocast_dtype=torch.bfloat16))),
             ("Llama 0.2B 4x1024, bf16 autocast + AdamW",
              lambda: (_hf("LlamaForCausalLM", "LlamaConfig", hidden_size=1024, intermediate_size=2816,
                           num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=8, vocab_size=32000,
                           use_cache=False), (), {"input_ids": _ids(4, 1024, 32000)},
                       dict(optimizer=torch.optim.AdamW, autocast_dtype=torch.bfloat16)))]
    try:
        import torchvision
        cases.append(("ResNet-50 32x224, fp32 + SGD momentum",
                      lambda: (torchvision.models.resnet50(), (torch.randn(32, 3, 224, 224),), {},
                               dict(optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)))))
    except Exception as e:  # noqa: BLE001 - a missing torchvision skips one row
        print(f"  (ResNet-50 skipped: {type(e).__name__}: {e})")
    return cases


def memory_cases():
    import bench_memory
    return [*bench_memory.CASES, *larger_cases()]


def one_memory(i: int) -> dict:
    name, make = memory_cases()[i]
    torch.manual_seed(0)
    model, args, kwargs, kw = make()
    model = model.cuda()
    args, kwargs = _cuda(args), _cuda(kwargs)
    t0 = time.perf_counter()
    rep = ls.memory(model, *args, measure=True, **kw, **kwargs)
    seconds = time.perf_counter() - t0
    return dict(model=name, seconds=seconds, reserved=rep.measured.reserved_bytes, context=rep.measured.context_bytes,
                steps=[dict(step=i + 1, predicted=s.peak_bytes, measured=rep.measured.step_peaks[i],
                            breakdown=dict(s.breakdown)) for i, s in enumerate(rep.steps)])


def part_memory() -> None:
    print("\n1. memory(): predicted for the model's CUDA device vs torch.cuda.max_memory_allocated")
    print(f"{'model':52} {'step':>4} {'predicted':>14} {'measured':>14} {'diff':>8}")
    for i in range(len(memory_cases())):
        r = _case(one_memory, i)
        name = r.get("model", str(i))
        if "error" in r:
            ROWS["memory"].append(r)
            print(f"{name[:52]:52} FAILED {r['error'][:300]}")
            continue
        for st in r["steps"]:
            d = 100.0 * (st["predicted"] - st["measured"]) / st["measured"]
            ROWS["memory"].append(dict(model=name, **st, diff=d, seconds=r["seconds"]))
            print(f"{name[:52]:52} {st['step']:>4} {st['predicted']:>14,} {st['measured']:>14,} {d:>+7.2f}%")


def _case(fn, i: int) -> dict:
    """One case, its failure a row of its own; the allocator's cache emptied after it."""
    try:
        return fn(i)
    except Exception as e:  # noqa: BLE001 - one failing row must not lose the others
        traceback.print_exc(limit=6)
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        torch.cuda.empty_cache()


_ATEN = {"aten::_scaled_dot_product_flash_attention": "flash",
         "aten::_scaled_dot_product_efficient_attention": "efficient",
         "aten::_scaled_dot_product_cudnn_attention": "cudnn",
         "aten::_scaled_dot_product_attention_math": "math"}


def part_sdpa() -> None:
    from torch.profiler import ProfilerActivity, profile

    from layerscope.costs.gpus import gpu
    from layerscope.costs.sdpa import choose
    cap = torch.cuda.get_device_capability()
    g = gpu("H100", capability=cap)
    print(f"\n2. SDPA kernel: costs/sdpa.py's choice for sm {cap[0]}.{cap[1]} vs the ATen op the profiler saw "
          f"(cuDNN {torch.backends.cudnn.version()})")
    cases = [  # (label, B, Hq, Hkv, Sq, Sk, D, dtype, mask, causal, gqa)
        ("bf16 causal D64", 4, 16, 16, 1024, 1024, 64, torch.bfloat16, False, True, False),
        ("bf16 D128", 2, 16, 16, 512, 512, 128, torch.bfloat16, False, False, False),
        ("fp16 D256 train", 2, 8, 8, 256, 256, 256, torch.float16, False, False, False),
        ("bf16 bool mask D64", 2, 8, 8, 256, 256, 64, torch.bfloat16, True, False, False),
        ("bf16 GQA 16/4 causal", 2, 16, 4, 512, 512, 64, torch.bfloat16, False, True, True),
        ("fp32 D64", 2, 8, 8, 256, 256, 64, torch.float32, False, False, False),
        ("fp32 D60 (unaligned)", 2, 8, 8, 256, 256, 60, torch.float32, False, False, False),
        ("bf16 decode Sq=1 D128", 8, 32, 32, 1, 2048, 128, torch.bfloat16, False, False, False),
    ]
    print(f"{'case':24} {'grad':>5} {'predicted':>10} {'ran':>10}")
    for label, b, hq, hkv, sq, sk, d, dt, masked, causal, gqa in cases:
        for grad in (False, True):
            try:
                q = torch.randn(b, hq, sq, d, device="cuda", dtype=dt, requires_grad=grad)
                k = torch.randn(b, hkv, sk, d, device="cuda", dtype=dt, requires_grad=grad)
                v = torch.randn(b, hkv, sk, d, device="cuda", dtype=dt, requires_grad=grad)
                mask = torch.ones(sq, sk, device="cuda", dtype=torch.bool).tril() if masked else None
                want, passed = choose(g, q, k, v, mask, 0.0, causal, gqa, grad)
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                         enable_gqa=gqa)
                    if grad:
                        out.sum().backward()
                    torch.cuda.synchronize()
                names = {e.name for e in prof.events()}
                ran = [k2 for a, k2 in _ATEN.items() if a in names]
                ran = ran[0] if ran else ("math" if "aten::bmm" in names or "aten::matmul" in names else "?")
                ok = ran == want
                ROWS["sdpa"].append(dict(case=label, grad=grad, predicted=want, ran=ran, equal=ok,
                                         passed_over=passed))
                print(f"{label:24} {str(grad):>5} {str(want):>10} {ran:>10}{'' if ok else '   DIFFERENT'}")
            except Exception as e:  # noqa: BLE001
                ROWS["sdpa"].append(dict(case=label, grad=grad, error=f"{type(e).__name__}: {e}"))
                print(f"{label:24} {str(grad):>5} FAILED {type(e).__name__}: {str(e)[:200]}")


FSDP_MODELS = {
    "Llama": ("hf:LlamaConfig", {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
                                 "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 32000}),
    # GPT-2's Conv1D with the fused QKV, tensor parallel by layerscope's own plan (parallel/apply.py)
    "GPT-2": ("hf:GPT2Config", {"n_layer": 8, "n_embd": 1024, "n_head": 16, "vocab_size": 50304, "n_positions": 1024}),
}
FSDP_BATCH = (4, 1024)
FSDP_CONFIGS = [("Llama", dict(gpus=8)), ("Llama", dict(gpus=8, ac="full")), ("Llama", dict(gpus=8, ac="selective-op")),
                ("Llama", dict(gpus=8, mixed_precision="off")), ("Llama", dict(gpus=8, reshard_after_forward=False)),
                ("Llama", dict(gpus=8, tp=2, ac="selective-op")), ("Llama", dict(gpus=8, tp=2, mixed_precision="off")),
                ("Llama", dict(gpus=8, tp=2, ac="full")), ("GPT-2", dict(gpus=8)), ("GPT-2", dict(gpus=8, tp=2)),
                ("GPT-2", dict(gpus=8, tp=2, ac="full")),
                # FSDP2's CPU offload: the rank's shards, reduced gradients and AdamW on the host; the device
                # holds the gathered blocks, the shards' copies to it and the reduce-scatter's output
                ("Llama", dict(gpus=8, offload=True)), ("Llama", dict(gpus=8, offload=True, ac="full")),
                ("Llama", dict(gpus=8, offload=True, mixed_precision="off")),
                ("Llama", dict(gpus=8, tp=2, offload=True)), ("GPT-2", dict(gpus=8, offload=True))]


def _sharded_case(case):
    """(model name, spec, overrides, ParallelConfig, ids, labels) of a (model name, config keywords) case:
    random token ids and labels of the local batch FSDP_BATCH, seeded."""
    from layerscope.options import ParallelConfig

    name, kw = case
    spec, over = FSDP_MODELS[name]
    vocab = over.get("vocab_size")
    g = torch.Generator().manual_seed(0)
    b, s = FSDP_BATCH
    ids, labels = torch.randint(0, vocab, (b, s), generator=g), torch.randint(0, vocab, (b, s), generator=g)
    return name, spec, over, ParallelConfig(**kw), ids, labels


def one_fsdp(i: int) -> dict:
    from layerscope.parallel.real import measure_one_rank
    from layerscope.specs import build_model

    name, spec, over, config, ids, labels = _sharded_case(FSDP_CONFIGS[i])

    def loss_fn(out):   # the simulation's logits are fake CPU tensors: the labels go where they are
        return F.cross_entropy(out.logits.flatten(0, 1).float(), labels.to(out.logits.device).flatten(0, 1))
    t0 = time.perf_counter()
    rep = ls.parallel(build_model(spec, "meta", over, "causal-lm").model, ids, config=config, device="cuda",
                      gpu="H100", backend="fake", steps=3, loss_fn=loss_fn)
    seconds = time.perf_counter() - t0
    r0 = rep.plan.ranks[0]
    host = r0.host_bytes
    m = measure_one_rank(lambda: build_model(spec, "cpu", over, "causal-lm").model, config, 0, ids, labels, steps=3,
                         device="cuda")
    return dict(model=name, config=config.label(), predicted=r0.peak_bytes, breakdown=dict(r0.breakdown),
                phase=r0.peak_phase, seconds=seconds, step_peaks=list(m.step_peaks), notes=list(m.notes),
                host_bytes=host)


def _run_cases(configs, fn, part: str, only: str | None, width: int):
    """Each (model name, keywords) case of ``configs`` (``only``: that model's, or with "offload" the
    CPU-offload ones, with "zero-bubble" the zb and zbv ones) run by ``fn(i)``: a failure is a row of its
    own in ``ROWS[part]``, printed; yields (name, keywords, result) of the others."""
    picks = {"offload": lambda kw: kw.get("offload"), "zero-bubble": lambda kw: kw.get("schedule") in ("zb", "zbv")}
    for i, (name, kw) in enumerate(configs):
        if only in picks and not picks[only](kw) or only and only not in picks and name != only:
            continue
        r = _case(fn, i)
        if "error" in r:
            ROWS[part].append(dict(config=f"{name} {kw}", **r))
            print(f"{name} {str(kw)[:width]:{width}} FAILED {r['error'][:300]}", flush=True)
            continue
        yield name, kw, r


def part_fsdp(only: str | None = None) -> None:
    print("\n3. One rank on this GPU, collectives on torch's fake backend: "
          "parallel(device='cuda', backend='fake') vs torch.cuda.max_memory_allocated")
    for name, (spec, over) in FSDP_MODELS.items():
        print(f"{name}: {over}")
    print(f"local batch {FSDP_BATCH[0]}x{FSDP_BATCH[1]}, AdamW, 3 steps (the peak of steps 2-3); the fake backend "
          "has no NCCL buffers to estimate")
    print(f"{'configuration':48} {'predicted':>14} {'measured':>14} {'diff':>8}")
    for name, kw, r in _run_cases(FSDP_CONFIGS, one_fsdp, "fsdp", only, 40):
        measured = max(r["step_peaks"][1:])
        d = 100.0 * (r["predicted"] - measured) / measured
        ROWS["fsdp"].append(dict(r, measured=measured, diff=d))
        label = f"{name} " + r["config"].replace(", pp 1", "") + (" (mp off)" if "mixed_precision" in kw else "") + \
            (" (no reshard)" if "reshard_after_forward" in kw else "")
        label = label.replace(", CPU offload", " +offload")
        print(f"{label[:48]:48} {r['predicted']:>14,} {measured:>14,} {d:>+7.2f}%   ({r['phase']}, sim {r['seconds']:.1f} s)")


STAGE_CONFIGS = [("Llama", dict(gpus=2, pp=2, fsdp=1, microbatches=4, schedule="gpipe")),
                 ("Llama", dict(gpus=2, pp=2, fsdp=1, microbatches=4, schedule="gpipe", mixed_precision="off")),
                 ("Llama", dict(gpus=8, pp=2, microbatches=4, schedule="1f1b")),
                 ("Llama", dict(gpus=8, pp=2, microbatches=4, schedule="1f1b", ac="full")),
                 ("Llama", dict(gpus=8, pp=2, microbatches=4, schedule="gpipe", ac="selective-op")),
                 ("GPT-2", dict(gpus=8, pp=2, microbatches=4, schedule="1f1b")),
                 ("Llama", dict(gpus=8, pp=2, microbatches=4, schedule="1f1b", offload=True)),
                 # zero bubble (each backward in I and W; zbv's V: the middle rank's two stages hand over on it)
                 ("Llama", dict(gpus=2, pp=2, fsdp=1, microbatches=4, schedule="zbv")),
                 ("Llama", dict(gpus=8, pp=2, microbatches=4, schedule="zb", reshard_after_forward=False)),
                 ("Llama", dict(gpus=8, pp=2, microbatches=4, schedule="zbv", reshard_after_forward=False, ac="full")),
                 ("GPT-2", dict(gpus=8, pp=2, microbatches=4, schedule="zbv", reshard_after_forward=False))]


def one_stage(i: int) -> dict:
    from layerscope.parallel.real import measure_stage_rank
    from layerscope.specs import build_model

    name, spec, over, config, ids, labels = _sharded_case(STAGE_CONFIGS[i])

    def loss_fn(out, target):   # measure_stage_rank's loss, per micro-batch
        return F.cross_entropy(out.logits.flatten(0, 1).float(), target.to(out.logits.device).flatten(0, 1))
    t0 = time.perf_counter()
    rep = ls.parallel(build_model(spec, "meta", over, "causal-lm").model, ids, config=config, device="cuda",
                      gpu="H100", backend="fake", steps=3, loss_fn=loss_fn, target=labels)
    seconds = time.perf_counter() - t0
    out = []
    for rank in (0, config.world - 1):          # the first and the last stage
        r = rep.plan.ranks[rank]
        m = measure_stage_rank(lambda: build_model(spec, "cpu", over, "causal-lm").model, config, rank, ids,
                               labels, steps=3, device="cuda")
        torch.cuda.empty_cache()
        out.append(dict(rank=rank, predicted=r.peak_bytes, breakdown=dict(r.breakdown), phase=r.peak_phase,
                        step_peaks=list(m.step_peaks), notes=list(m.notes)))
    return dict(model=name, config=config.label(), schedule=config.schedule, microbatches=config.microbatches,
                seconds=seconds, ranks=out)


def part_stages(only: str | None = None) -> None:
    print("\n4. Pipeline stages on this GPU (the first and the last stage's first rank), torch's PipelineStage and "
          "schedule, collectives and P2P on torch's fake backend: parallel(device='cuda', backend='fake') vs "
          "torch.cuda.max_memory_allocated")
    print(f"{'configuration':56} {'rank':>4} {'predicted':>14} {'measured':>14} {'diff':>8}")
    for name, kw, r in _run_cases(STAGE_CONFIGS, one_stage, "stages", only, 50):
        for x in r["ranks"]:
            x["measured"] = measured = max(x["step_peaks"][1:])
            x["diff"] = d = 100.0 * (x["predicted"] - measured) / measured
            label = f"{name} {r['config']}, {r['schedule']} x{r['microbatches']}" + \
                (" (mp off)" if "mixed_precision" in kw else "")
            print(f"{label[:56]:56} {x['rank']:>4} {x['predicted']:>14,} {measured:>14,} {d:>+7.2f}%   ({x['phase']})",
                  flush=True)
        ROWS["stages"].append(r)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--only", default="memory,sdpa,fsdp,stages")
    ap.add_argument("--model", help="parts 3 and 4: only this model's configurations (Llama, GPT-2), or with "
                                    "'offload' the CPU-offload ones, with 'zero-bubble' part 4's zb and zbv ones")
    ns = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gpu.py needs a CUDA GPU")
    import transformers
    print(f"{torch.cuda.get_device_name()} sm {torch.cuda.get_device_capability()}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, cuDNN {torch.backends.cudnn.version()}")
    parts = {"memory": part_memory, "sdpa": part_sdpa, "fsdp": part_fsdp, "stages": part_stages}
    for name in ns.only.split(","):
        t0 = time.perf_counter()
        parts[name](ns.model) if name in ("fsdp", "stages") else parts[name]()
        print(f"  ({name}: {time.perf_counter() - t0:.0f} s)")
        with open(os.path.join(ns.out, "bench_gpu.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, **ROWS}, f, indent=1,
                      default=str)


if __name__ == "__main__":
    main()
