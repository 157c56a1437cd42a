"""What only a GPU can show: layerscope's predictions against the CUDA allocator and kernels.

  python bench/bench_gpu.py [--out DIR] [--only memory,sdpa,fsdp,stages,time,fractions] [--model NAME]   # a CUDA GPU

Nothing here runs in the suite (CI has no GPU). Six parts, each a table; the figures of the last run
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
5. time: the step-time model (planning/steptime/sharded_time.py) for an H100 against rank 0's steps on this GPU, its
   collectives on the fake backend (so the GPU runs the rank's compute alone), and the profiler's kernel
   time by op class against the model's own split (matmul, attention, memory).
6. fractions: what single kernels (bf16 GEMMs, SDPA forward and backward, elementwise adds, a tiny op's
   launch) reach here, against the step-time model's table of fractions.
7. kernels: the raw seconds of a grid of single kernels (SDPA by head dim, length and mask; GEMMs by size;
   elementwise ops, norms and casts by size), read where the step-time model's table is set.

Part 5 can measure on the GPU alone (``--measure-only``) and be priced on any machine later
(``--predict bench_gpu.json``: fake tensors, no GPU), so a lent GPU's minutes go to measuring.
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

ROWS: dict[str, list] = {"memory": [], "sdpa": [], "fsdp": [], "stages": [], "time": [], "fractions": [],
                         "kernels": []}


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
    # GPT-2's Conv1D with the fused QKV, tensor parallel by layerscope's own plan (planning/apply.py)
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
    from layerscope.planning.config import ParallelConfig

    name, kw = case
    spec, over = FSDP_MODELS[name]
    vocab = over.get("vocab_size")
    g = torch.Generator().manual_seed(0)
    b, s = FSDP_BATCH
    ids, labels = torch.randint(0, vocab, (b, s), generator=g), torch.randint(0, vocab, (b, s), generator=g)
    return name, spec, over, ParallelConfig(**kw), ids, labels


def one_fsdp(i: int) -> dict:
    from layerscope.planning.real.sharded_run import measure_one_rank
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
    from layerscope.planning.real.sharded_run import measure_stage_rank
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


# 5. time: the step-time model (planning/steptime/sharded_time.py) against the steps themselves. A 0.5B Llama (the size a
# GPU runs near its roofline) in five configurations, and the smaller Llama and GPT-2 of parts 3-4 (where
# launches and the host count). The fake backend's collectives move nothing, so what the GPU runs is the
# rank's compute: it is checked against the model's compute (forward + backward + optimizer), and the
# step with NVLink's communication is printed beside it.
_LLAMA_05B = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 8, "num_attention_heads": 16,
              "num_key_value_heads": 8, "vocab_size": 32000}
TIME_MODELS = {
    "Llama-0.5B": ("hf:LlamaConfig", _LLAMA_05B),
    **FSDP_MODELS,
    # held out: measured only after the fractions and host costs were set from the rows above
    "Llama-0.5B S4096": ("hf:LlamaConfig", _LLAMA_05B),
    "Llama-1B": ("hf:LlamaConfig", {**_LLAMA_05B, "num_hidden_layers": 16, "hidden_size": 2560,
                                    "intermediate_size": 6912, "num_attention_heads": 20, "num_key_value_heads": 4}),
    "GPT-2 large": ("hf:GPT2Config", {"n_layer": 12, "n_embd": 1280, "n_head": 20, "vocab_size": 50304,
                                      "n_positions": 1024}),
    # held out from the head-dim and memory-class corrections (2026-11-26 evening): heads of 64 and 96
    "Llama d64": ("hf:LlamaConfig", {**_LLAMA_05B, "hidden_size": 1024, "intermediate_size": 2816,
                                     "num_hidden_layers": 12}),
    "Llama d96": ("hf:LlamaConfig", {**_LLAMA_05B, "hidden_size": 1536, "intermediate_size": 4096}),
}
TIME_BATCH = {"Llama-0.5B": (4, 2048), "Llama": FSDP_BATCH, "GPT-2": FSDP_BATCH, "Llama-0.5B S4096": (2, 4096),
              "Llama-1B": (2, 2048), "GPT-2 large": (8, 1024), "Llama d64": (8, 2048), "Llama d96": (4, 2048)}
TIME_CONFIGS = [("Llama-0.5B", dict(gpus=8)), ("Llama-0.5B", dict(gpus=8, ac="full")),
                ("Llama-0.5B", dict(gpus=8, ac="selective-op")), ("Llama-0.5B", dict(gpus=8, tp=2)),
                ("Llama-0.5B", dict(gpus=8, mixed_precision="off")),
                ("Llama", dict(gpus=8)), ("GPT-2", dict(gpus=8)), ("GPT-2", dict(gpus=8, tp=2)),
                ("Llama-0.5B S4096", dict(gpus=8)), ("Llama-0.5B S4096", dict(gpus=8, tp=2, ac="full")),
                ("Llama-1B", dict(gpus=8, ac="full")), ("Llama-1B", dict(gpus=8, ac="selective-op")),
                ("GPT-2 large", dict(gpus=8)), ("GPT-2 large", dict(gpus=8, ac="full")),
                ("Llama d64", dict(gpus=8)), ("Llama d64", dict(gpus=8, ac="full")), ("Llama d96", dict(gpus=8))]
MEASURE_ONLY = False        # --measure-only: part 5 measures on the GPU; --predict FILE prices its rows later
TIME_STEPS = (3, 10)        # warm-up steps, timed steps
_MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmv", "aten::mv", "aten::matmul",
               "aten::linear", "aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::_scaled_mm")


def _measured_class(name: str) -> str:
    """The class (planning/steptime/sharded_time.py's op_class) of the ATen op that launched a kernel, by its name."""
    if "attention" in name or "flash" in name or "cudnn_attention" in name:
        return "attention"
    return "matmul" if name in _MATMUL_OPS else "memory"


def _predicted(runs, config) -> tuple[dict, list]:
    """Rank 0's last step priced by the step-time model for an H100: its compute seconds by op class
    (with "ops", how many), and (op, count, seconds) by op name, dearest first."""
    from layerscope.costs.gpus import GPUS
    from layerscope.planning.simulate.results import COLLECTIVES
    from layerscope.planning.steptime.sharded_time import FRACTIONS, _compute_dtype, op_class, op_seconds

    run = runs[0].run
    last = max(p.step for p in run.passes)
    classes = dict.fromkeys(("matmul", "attention", "memory"), 0.0)
    agg: dict = {}
    n = 0
    for p in (p for p in run.passes if p.step == last):
        for op in p.trace.ops:
            k = op_class(op)
            if op.op in COLLECTIVES or k == "free":
                continue
            sec = op_seconds(op, GPUS["H100"], _compute_dtype(config), FRACTIONS)
            classes[k] += sec
            count, total = agg.get(op.op, (0, 0.0))
            agg[op.op] = (count + 1, total + sec)
            n += 1
    classes["ops"] = n
    return classes, sorted(((k, c, t) for k, (c, t) in agg.items()), key=lambda x: -x[2])


def time_one_rank(build, config, ids, labels, device: str):
    """Rank 0 of ``config`` trained on this device, collectives on the fake backend: the median of the timed
    steps (each synchronized), and one more step under the profiler: the kernels' own time by class."""
    from torch.profiler import ProfilerActivity, profile

    from layerscope.planning.apply import amp_context, build_mesh, loss_context, parallelize
    from layerscope.planning.blocks import no_kv_cache
    from layerscope.planning.real.sharded_run import _optimizer, training_loss
    from layerscope.planning.simulate.sharded_rank import fake_world

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with fake_world(0, config.world):
        torch.manual_seed(0)
        model = build()
        no_kv_cache(model)
        model.train()
        dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
        model.to(dev)
        ids, labels = ids.to(dev), labels.to(dev)
        parallelize(model, config, build_mesh(config, device))
        opt = _optimizer("adamw", [p for p in model.parameters() if p.requires_grad], 1e-4)

        def step():
            with loss_context(config), amp_context(config, device):
                loss = training_loss(model, ids, labels)
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        warm, timed = TIME_STEPS
        for _ in range(warm):
            step()
        sync()
        times = []
        for _ in range(timed):
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
        host = []                   # the host's time to issue a step (the GPU may still be running it)
        for _ in range(5):
            t0 = time.perf_counter()
            step()
            host.append(time.perf_counter() - t0)
            sync()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=acts, acc_events=True) as prof:
            step()
            sync()
        # a kernel's time is its own entry's (device type CUDA) and, once more, the self time of the ATen op
        # that launched it (device type CPU): the classes from the ops, the total from the kernels. A
        # record_function range (the optimizer's step, FSDP's all-gathers) also has a device entry, which
        # spans the kernels in it: counted, the total held those kernels twice (13 ms of 88 on the 0.5B Llama)
        kernels = dict.fromkeys(("matmul", "attention", "memory"), 0.0)
        ops, total, launched, cpu_ops = [], 0.0, 0, 0
        averages = prof.key_averages()
        cpu_keys = {e.key for e in averages if str(e.device_type).endswith("CPU")}
        for e in averages:
            us = getattr(e, "self_device_time_total", None)
            if us is None:
                us = getattr(e, "self_cuda_time_total", 0)
            if str(e.device_type).endswith("CPU"):
                cpu_ops += e.count
                if us:
                    kernels[_measured_class(e.key)] += us * 1e-6
                    ops.append((e.key, e.count, us))
            elif e.key not in cpu_keys and not getattr(e, "is_user_annotation", False):
                total += us * 1e-6
                launched += e.count
        ops.sort(key=lambda x: -x[2])
        peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return dict(times=times, host=host, kernels=kernels, kernel_total=total, kernel_count=launched, cpu_ops=cpu_ops,
                top_ops=ops, peak=peak)


def _time_case(i: int):
    """Row ``i`` of TIME_CONFIGS: (name, keywords, spec, overrides, config, ids, labels), seeded."""
    from layerscope.planning.config import ParallelConfig
    name, kw = TIME_CONFIGS[i]
    spec, over = TIME_MODELS[name]
    b, s = TIME_BATCH[name]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, over["vocab_size"], (b, s), generator=g)
    labels = torch.randint(0, over["vocab_size"], (b, s), generator=g)
    return name, kw, spec, over, ParallelConfig(**kw), ids, labels


def predict_time(i: int) -> dict:
    """Row ``i``'s prediction for an H100: parallel()'s timing, the same ranks with communication free (what
    the fake backend runs), and the compute by class and by op. Runs on any machine (fake tensors)."""
    import layerscope.api._parallel as api_parallel
    from layerscope.costs.gpus import gpu
    from layerscope.planning.steptime.sharded_time import fractions, step_time
    from layerscope.specs import build_model

    name, kw, spec, over, config, ids, labels = _time_case(i)

    def loss_fn(out):
        return F.cross_entropy(out.logits.flatten(0, 1).float(), labels.to(out.logits.device).flatten(0, 1))
    seen = {}
    real_step_time = api_parallel.step_time

    def tap(runs, *a, **k):      # the simulated ranks the prediction priced, for the by-class split
        seen["runs"] = runs
        return real_step_time(runs, *a, **k)
    api_parallel.step_time = tap
    try:
        t0 = time.perf_counter()
        rep = ls.parallel(build_model(spec, "meta", over, "causal-lm").model, ids, config=config, device="cuda",
                          gpu="H100", backend="fake", steps=2, loss_fn=loss_fn)
        seconds = time.perf_counter() - t0
    finally:
        api_parallel.step_time = real_step_time
    plan = rep.plan
    # what the fake backend runs: the same ranks with communication free (NVLink unbounded, no latency)
    free = step_time(seen["runs"], config, gpu("H100", nvlink=1e18), tokens=None,
                     f=fractions({"nvlink_latency_s": 0})).to_dict()
    classes, top = _predicted(seen["runs"], config)
    # the optimizer is priced apart from the ops (its foreach updates stream memory): in the memory class
    classes["memory"] += plan.timing["compute"] - sum(classes[k] for k in ("matmul", "attention", "memory"))
    return dict(timing=plan.timing, no_comm=free, predicted_ops=top, predicted_peak=plan.ranks[0].peak_bytes,
                predicted_classes=classes, sim_seconds=seconds)


def one_time(i: int, device: str = "cuda") -> dict:
    from layerscope.specs import build_model
    name, kw, spec, over, config, ids, labels = _time_case(i)
    pred = {} if MEASURE_ONLY else predict_time(i)
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    m = time_one_rank(lambda: build_model(spec, "cpu", over, "causal-lm").model, config, ids, labels, device)
    if device == "cuda":
        torch.cuda.empty_cache()
    return dict(index=i, model=name, config=config.label(), kw=kw, tokens=ids.numel(), **pred, **m)


def _time_row(name: str, kw: dict, r: dict) -> None:
    """One row of part 5's table (the measured figures alone where there is no prediction yet)."""
    import statistics
    measured = statistics.median(r["times"])
    kern = r["kernel_total"]
    r.update(measured=measured, kernel_seconds=kern, host_median=statistics.median(r["host"]))
    label = f"{name} " + r["config"].replace(", pp 1", "") + (" (mp off)" if "mixed_precision" in kw else "")
    kc = r["kernels"]
    if "no_comm" not in r:
        print(f"{label[:40]:40} {'':>9} {measured * 1e3:8.2f}ms {'':>7} {kern * 1e3:8.2f}ms   kernels (ms): "
              + ", ".join(f"{kc[k] * 1e3:.1f}" for k in ("matmul", "attention", "memory"))
              + f"  ({r['kernel_count']} kernels, {r['cpu_ops']} CPU ops, host {r['host_median'] * 1e3:.1f} ms; "
              f"peak {r['peak'] or 0:,} B)", flush=True)
        return
    t, pc = r["timing"], r["predicted_classes"]
    d = 100.0 * (r["no_comm"]["step_time"] - measured) / measured
    r["diff"] = d
    split = ", ".join(f"{pc[k] * 1e3:.1f}/{kc[k] * 1e3:.1f}" for k in ("matmul", "attention", "memory"))
    print(f"{label[:40]:40} {r['no_comm']['step_time'] * 1e3:8.2f}ms {measured * 1e3:8.2f}ms {d:+6.1f}% "
          f"{kern * 1e3:8.2f}ms "
          f"{t['step_time'] * 1e3:8.2f}ms   {split}  ({pc['ops']} ops predicted, {r['kernel_count']} kernels, "
          f"{r['cpu_ops']} CPU ops, host {r['host_median'] * 1e3:.1f} ms, predicted host wait "
          f"{r['no_comm']['host_wait'] * 1e3:.1f} ms; peak {r['predicted_peak']:,} / {r['peak'] or 0:,} B)", flush=True)


def _time_header() -> None:
    print("\n5. Step time: parallel()'s prediction for an H100 (planning/steptime/sharded_time.py, default fractions) vs rank 0 "
          "trained on this GPU, collectives on torch's fake backend (they move nothing: the GPU runs the rank's "
          f"compute). AdamW; {TIME_STEPS[0]} warm-up steps, median of {TIME_STEPS[1]} synchronized steps; "
          "'kernels': the sum of the CUDA kernels' own time in one profiled step; 'step': predicted with "
          "NVLink communication")
    for name, (spec, over) in TIME_MODELS.items():
        print(f"{name}: {over}, local batch {TIME_BATCH[name]}")
    print(f"{'configuration':40} {'predicted':>9} {'measured':>9} {'diff':>7} {'kernels':>9} {'NVLink':>9}   "
          "'predicted': compute + host wait, communication free; by class: predicted / kernels (ms) matmul, "
          "attention, memory")


def part_time(only: str | None = None, device: str = "cuda") -> None:
    _time_header()
    for name, kw, r in _run_cases(TIME_CONFIGS, lambda i: one_time(i, device), "time", only, 40):
        ROWS["time"].append(r)
        _time_row(name, kw, r)
        _save()


def predict_saved(path: str) -> None:
    """--predict FILE: part 5's rows measured on a GPU (``--measure-only``) priced here by today's model,
    the table printed and FILE's rows given their predictions (written to --out's bench_gpu.json)."""
    with open(path) as f:
        saved = json.load(f)
    ROWS.update({k: v for k, v in saved.items() if k in ROWS})
    _time_header()
    for r in ROWS["time"]:
        if "error" in r:
            continue
        name, kw = TIME_CONFIGS[r["index"]]
        if (name, kw) != (r["model"], r["kw"]):     # TIME_CONFIGS changed since the measurement
            sys.exit(f"row {r['index']} was measured as {r['model']} {r['kw']}; TIME_CONFIGS has {name} {kw} there")
        r.update(predict_time(r["index"]))
        _time_row(name, kw, r)
    _save(saved.get("device"), saved.get("torch"))


def part_fractions() -> None:
    """The fraction of the H100's peaks single kernels reach here, against the table's (FRACTIONS)."""
    from layerscope.costs.gpus import GPUS
    from layerscope.planning.steptime.sharded_time import FRACTIONS
    gpu = GPUS["H100"]
    print("\n6. What single kernels reach on this GPU, as fractions of the table's H100 peaks "
          f"(bf16 {gpu.peak('bfloat16') / 1e12:.0f} TFLOP/s, {gpu.bandwidth / 1e12:.2f} TB/s), against FRACTIONS")

    bf = torch.bfloat16
    rows = []
    for m, k, n in ((8192, 8192, 8192), (8192, 2048, 5632), (8192, 5632, 2048), (8192, 2048, 2048),
                    (8192, 2048, 32000), (4096, 1024, 2816)):
        a = torch.randn(m, k, device="cuda", dtype=bf)
        b = torch.randn(k, n, device="cuda", dtype=bf)
        s = _bench(lambda: a @ b)
        rows.append(("matmul", f"{m}x{k} @ {k}x{n}", 2 * m * k * n / s / gpu.peak("bfloat16"), FRACTIONS["matmul"]))
    for bsz, h, sq, d in ((4, 16, 2048, 128), (4, 16, 1024, 64)):
        q, k_, v = (torch.randn(bsz, h, sq, d, device="cuda", dtype=bf, requires_grad=True) for _ in range(3))
        fl = 4 * bsz * h * sq * sq * d / 2          # causal: half the score matrix
        s = _bench(lambda: F.scaled_dot_product_attention(q, k_, v, is_causal=True))
        rows.append(("attention", f"SDPA fwd causal {bsz}x{h}x{sq}x{d}", fl / s / gpu.peak("bfloat16"),
                     FRACTIONS["attention"]))
        o = F.scaled_dot_product_attention(q, k_, v, is_causal=True)
        go = torch.randn_like(o)
        s = _bench(lambda: torch.autograd.grad(o, (q, k_, v), go, retain_graph=True))
        rows.append(("attention", f"SDPA bwd causal {bsz}x{h}x{sq}x{d}", 2.5 * fl / s / gpu.peak("bfloat16"),
                     FRACTIONS["attention"]))
    for numel, dt in ((1 << 28, bf), (1 << 26, torch.float32), (1 << 20, bf)):
        x = torch.randn(numel, device="cuda", dtype=dt)
        y = torch.randn(numel, device="cuda", dtype=dt)
        s = _bench(lambda: x + y)
        rows.append(("memory", f"add {numel:,} {str(dt)[6:]}", 3 * numel * x.element_size() / s / gpu.bandwidth,
                     FRACTIONS["memory"]))
    x = torch.randn(1, device="cuda")
    s = _bench(lambda: x.add_(1), n=2000)
    rows.append(("launch_s", "x.add_(1), eager, 2,000 in a row (s per op)", s, FRACTIONS["launch_s"]))
    for kind, what, got, table in rows:
        print(f"  {kind:9} {what:44} {got:8.3g}  (table {table:g})")
        ROWS["fractions"].append(dict(kind=kind, what=what, measured=got, table=table))


def _bench(fn, n: int = 20) -> float:
    """Seconds a call of ``fn`` takes on the GPU: CUDA events around ``n`` calls in a row, after 3 warm-ups."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    z.record()
    torch.cuda.synchronize()
    return a.elapsed_time(z) / n * 1e-3


def part_kernels() -> None:
    """7. kernels: the raw seconds of a grid of single kernels, for the step-time model's table (what an
    op class reaches by size and shape): SDPA forward and backward by head dim (64-256), sequence length
    (512-4,096) and mask; bf16 GEMMs (F.linear, as a model's layers call it) of 1,024-16,384 rows and
    1,024-8,192 in and out features, two fp32 ones without TF32; elementwise ops, norms and casts of
    4 Ki-256 Mi elements. Each row keeps its shapes, so its FLOPs and bytes are counted where it is read."""
    from torch.profiler import ProfilerActivity, profile
    rows = ROWS["kernels"]
    bf = torch.bfloat16
    t0 = time.perf_counter()
    for causal in (True, False):
        for d in (64, 80, 96, 128, 256):
            for sq in (512, 1024, 2048, 4096):
                bsz, h = max(1, 8192 // sq), 16
                row = dict(kind="sdpa", b=bsz, h=h, s=sq, d=d, causal=causal)
                try:
                    q, k, v = (torch.randn(bsz, h, sq, d, device="cuda", dtype=bf, requires_grad=True)
                               for _ in range(3))
                    row["fwd"] = _bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    go = torch.randn_like(o)
                    row["bwd"] = _bench(lambda: torch.autograd.grad(o, (q, k, v), go, retain_graph=True))
                    if sq == 2048:
                        with profile(activities=[ProfilerActivity.CPU]) as prof:
                            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        row["kernel"] = next((_ATEN[e.key] for e in prof.key_averages() if e.key in _ATEN), None)
                except Exception as e:  # noqa: BLE001 - one shape no kernel takes must not lose the grid
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                rows.append(row)
                q = k = v = o = go = None
    print(f"  sdpa: {sum(r['kind'] == 'sdpa' for r in rows)} shapes, {time.perf_counter() - t0:.0f} s", flush=True)
    for m in (1024, 2048, 4096, 8192, 16384):
        for k in (1024, 2048, 4096, 8192):
            for n in (1024, 2048, 4096, 8192):
                x = torch.randn(m, k, device="cuda", dtype=bf)
                w = torch.randn(n, k, device="cuda", dtype=bf)
                rows.append(dict(kind="linear", m=m, k=k, n=n, dtype="bfloat16", seconds=_bench(lambda: F.linear(x, w))))
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    for m, k, n in ((4096, 4096, 4096), (8192, 2048, 5632)):
        x = torch.randn(m, k, device="cuda")
        w = torch.randn(n, k, device="cuda")
        rows.append(dict(kind="linear", m=m, k=k, n=n, dtype="float32", seconds=_bench(lambda: F.linear(x, w), 10)))
    del x, w
    print(f"  linear: {sum(r['kind'] == 'linear' for r in rows)} shapes, {time.perf_counter() - t0:.0f} s", flush=True)
    for e in range(12, 29, 2):
        n = 1 << e
        x, y = torch.randn(n, device="cuda", dtype=bf), torch.randn(n, device="cuda", dtype=bf)
        xf, yf = x.float(), y.float()
        rows2d = x.view(-1, 2048) if n >= 2048 else x.view(1, -1)
        wn = torch.ones(rows2d.shape[-1], device="cuda", dtype=bf)
        cases = {"add bf16": (lambda: x + y, 6 * n), "add fp32": (lambda: xf + yf, 12 * n),
                 "mul_ scalar bf16": (lambda: x.mul_(1.0), 4 * n), "copy_ bf16": (lambda: y.copy_(x), 4 * n),
                 "to fp32": (lambda: x.float(), 6 * n), "silu bf16": (lambda: F.silu(x), 4 * n),
                 "rms_norm bf16": (lambda: F.rms_norm(rows2d, (rows2d.shape[-1],), wn), 4 * n),
                 "softmax fp32": (lambda: torch.softmax(xf.view(rows2d.shape), -1), 8 * n)}
        for what, (fn, nbytes) in cases.items():
            rows.append(dict(kind="memory", op=what, numel=n, bytes=nbytes, seconds=_bench(fn, 50 if n < 1 << 22 else 20)))
        del x, y, xf, yf, rows2d
    print(f"  memory: {sum(r['kind'] == 'memory' for r in rows)} shapes, {time.perf_counter() - t0:.0f} s", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = tf32


OUT_DIR = "."


def _save(device: str | None = None, version: str | None = None) -> None:
    with open(os.path.join(OUT_DIR, "bench_gpu.json"), "w") as f:
        json.dump({"device": device or (torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"),
                   "torch": version or torch.__version__, **ROWS}, f, indent=1, default=str)


def main() -> None:
    global OUT_DIR
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--only", default="memory,sdpa,fsdp,stages,time,fractions,kernels")
    ap.add_argument("--measure-only", action="store_true", help="part 5: measure on the GPU, predict later")
    ap.add_argument("--predict", metavar="FILE", help="price the rows of a --measure-only run here (no GPU needed)")
    ap.add_argument("--model", help="parts 3 and 4: only this model's configurations (Llama, GPT-2), or with "
                                    "'offload' the CPU-offload ones, with 'zero-bubble' part 4's zb and zbv ones")
    ns = ap.parse_args()
    OUT_DIR = ns.out
    if ns.predict:
        return predict_saved(ns.predict)
    global MEASURE_ONLY
    MEASURE_ONLY = ns.measure_only
    if not torch.cuda.is_available():
        sys.exit("bench_gpu.py needs a CUDA GPU")
    import transformers
    print(f"{torch.cuda.get_device_name()} sm {torch.cuda.get_device_capability()}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, cuDNN {torch.backends.cudnn.version()}")
    parts = {"memory": part_memory, "sdpa": part_sdpa, "fsdp": part_fsdp, "stages": part_stages, "time": part_time,
             "fractions": part_fractions, "kernels": part_kernels}
    for name in ns.only.split(","):
        t0 = time.perf_counter()
        try:
            parts[name](ns.model) if name in ("fsdp", "stages", "time") else parts[name]()
        except Exception:  # noqa: BLE001 - one failing part must not lose the others
            traceback.print_exc(limit=8)
        print(f"  ({name}: {time.perf_counter() - t0:.0f} s)")
        _save()


if __name__ == "__main__":
    main()
