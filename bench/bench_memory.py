"""Memory simulation: accuracy against the allocator, and the cost of planning a 70B training step.

  python bench/bench_memory.py            # both parts (about a minute on 2 cores)
  python bench/bench_memory.py --llama    # only the Llama-2-70B part
  python bench/bench_memory.py --no-llama # only the accuracy table
  python bench/bench_memory.py --only GPT,CNN --pairs 3   # a subset of the models; pairs for the timing

Part 1, accuracy on CPU. For each model, one training step twice over (optimizer state exists from
the first step on):
  predicted  layerscope.memory on fake tensors (nothing computed)
  tracked    the same tracker on the real step (simulate=False): must equal the prediction
  meta       the model moved to meta first: must equal the prediction
  allocator  the real step measured by the CPU allocator (torch.profiler, profile_memory=True),
             which also sees workspace that kernels allocate and free inside themselves
  time       memory(steps=1)'s time over one real training step of a copy of the model, the two
             alternating in pairs (bench/_timing.py): median [min-max], UNTRUSTED when the pairs
             spread too wide. A ratio, so that load on a shared machine cancels.
Part 2: Llama-2-70B (hidden 8192, 80 layers, 64 heads, 8 KV heads, intermediate 28672, vocab 32000),
batch 1, seq 2048, AdamW, bf16 autocast, predicted for CUDA, model built on meta; wall time and the
peak RSS of a fresh process. Its time is one run with nothing to pair it with, so the process's CPU
time (user + system) is printed next to the wall time: under load the wall time grows, the CPU time
much less.
"""

from __future__ import annotations

import copy
import functools
import os
import resource
import subprocess
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from zoo.models import UNet  # noqa: E402  (shared with tests/analyses/test_memory_trust.py)

import layerscope as ls
from layerscope.options import iec

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import paired_ratios  # noqa: E402  (bench/ is not a package)


def _ids(b, s, vocab):
    return torch.randint(0, vocab, (b, s), generator=torch.Generator().manual_seed(0))


def gpt2():
    import transformers as tf
    cfg = tf.GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=2000, n_positions=256,
                        bos_token_id=0, eos_token_id=0)
    return tf.GPT2LMHeadModel(cfg), (), {"input_ids": _ids(4, 128, 2000)}, \
        dict(optimizer=torch.optim.AdamW)


def bn_cnn():
    m = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                      nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                      nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    return m, (torch.randn(16, 3, 32, 32),), {}, \
        dict(optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9))


def bert_bf16():
    import transformers as tf
    cfg = tf.BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                        vocab_size=2000, max_position_embeddings=256)
    return tf.BertForMaskedLM(cfg), (), {"input_ids": _ids(4, 128, 2000)}, \
        dict(optimizer=torch.optim.Adam, autocast_dtype=torch.bfloat16)


class _Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln(x))))


class FrozenCheckpointed(nn.Module):
    def __init__(self, d=256, vocab=2000):
        super().__init__()
        self.emb = nn.Embedding(vocab, d).requires_grad_(False)
        self.blocks = nn.ModuleList(_Block(d) for _ in range(4))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False)
        return self.head(x)


def frozen_ckpt():
    return FrozenCheckpointed(), (_ids(4, 128, 2000),), {}, dict(optimizer=torch.optim.AdamW)


def _hf(model_cls, cfg_cls, inputs, opt=torch.optim.AdamW, **cfg):
    import transformers as tf

    def make():
        model = getattr(tf, model_cls)(getattr(tf, cfg_cls)(**cfg))
        return model, (), inputs(), dict(optimizer=opt)
    return make


_TXT = lambda: {"input_ids": _ids(2, 64, 512)}  # noqa: E731
_S2S = lambda: {"input_ids": _ids(2, 64, 512), "decoder_input_ids": _ids(2, 32, 512)}  # noqa: E731
_DEC = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=512, max_position_embeddings=256, use_cache=False)


class LSTMLM(nn.Module):
    def __init__(self, vocab=512, d=128):
        super().__init__()
        self.emb, self.rnn, self.head = nn.Embedding(vocab, d), nn.LSTM(d, d, 2, batch_first=True), nn.Linear(d, vocab)

    def forward(self, ids):
        return self.head(self.rnn(self.emb(ids))[0])


CASES = [("GPT-2 shrunk + AdamW", gpt2), ("CNN + BatchNorm + SGD momentum", bn_cnn),
         ("BERT shrunk + Adam, bf16 autocast", bert_bf16),
         ("frozen embeddings + checkpointed blocks + AdamW", frozen_ckpt),
         ("T5 shrunk + AdamW", _hf("T5ForConditionalGeneration", "T5Config", _S2S, num_layers=2, d_model=64,
                                   d_kv=16, d_ff=128, num_heads=4, vocab_size=512)),
         ("BART shrunk + AdamW", _hf("BartForConditionalGeneration", "BartConfig", _S2S, encoder_layers=2,
                                     decoder_layers=2, d_model=64, encoder_attention_heads=4,
                                     decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                     vocab_size=512, max_position_embeddings=128)),
         ("ViT shrunk + SGD", _hf("ViTForImageClassification", "ViTConfig",
                                  lambda: {"pixel_values": torch.randn(2, 3, 32, 32)}, torch.optim.SGD,
                                  image_size=32, patch_size=4, num_hidden_layers=2, hidden_size=64,
                                  num_attention_heads=4, intermediate_size=128)),
         ("Whisper shrunk + AdamW", _hf("WhisperForConditionalGeneration", "WhisperConfig",
                                        lambda: {"input_features": torch.randn(2, 16, 64),
                                                 "decoder_input_ids": _ids(2, 16, 512)},
                                        num_mel_bins=16, encoder_layers=2, decoder_layers=2, d_model=64,
                                        encoder_attention_heads=4, decoder_attention_heads=4,
                                        encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=512,
                                        max_source_positions=32, max_target_positions=64,
                                        pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                        decoder_start_token_id=1)),
         ("Wav2Vec2 shrunk, layerdrop 0.1 + AdamW", _hf("Wav2Vec2ForCTC", "Wav2Vec2Config",
                                                         lambda: {"input_values": torch.randn(2, 4000)},
                                                         hidden_size=64, num_hidden_layers=2,
                                                         num_attention_heads=4, intermediate_size=128,
                                                         conv_dim=(32, 32), conv_stride=(5, 2),
                                                         conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                                         num_conv_pos_embedding_groups=4, vocab_size=32,
                                                         layerdrop=0.1)),
         ("Wav2Vec2-CTC shrunk with labels (CTC loss) + AdamW",
          _hf("Wav2Vec2ForCTC", "Wav2Vec2Config",
              lambda: {"input_values": torch.randn(2, 4000),
                       "labels": torch.tensor([[5, 9, 2, 7, 3, 11, 4, 8], [6, 1, 9, 3, -100, -100, -100, -100]])},
              hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
              conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
              num_conv_pos_embedding_groups=4, vocab_size=32, layerdrop=0.0, mask_time_prob=0.0)),
         ("Mistral shrunk (GQA) + AdamW", _hf("MistralForCausalLM", "MistralConfig", _TXT, **_DEC)),
         ("Qwen2 shrunk (GQA) + AdamW", _hf("Qwen2ForCausalLM", "Qwen2Config", _TXT, **_DEC)),
         ("DistilBERT shrunk + SGD", _hf("DistilBertForMaskedLM", "DistilBertConfig", _TXT, torch.optim.SGD,
                                         n_layers=2, dim=64, n_heads=4, hidden_dim=128, vocab_size=512)),
         ("LSTM language model + AdamW", lambda: (LSTMLM(), (_ids(4, 32, 512),), {},
                                                 dict(optimizer=torch.optim.AdamW))),
         ("U-Net (ConvTranspose, GroupNorm) + AdamW", lambda: (UNet(16), (torch.randn(4, 3, 32, 32),), {},
                                                             dict(optimizer=torch.optim.AdamW)))]


def _to_meta(model, args, kwargs):
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    meta = copy.deepcopy(model).to("meta")
    for names in groups.values():  # Module._apply unties shared weights when the device changes
        for name in names[1:]:
            owner, _, attr = name.rpartition(".")
            setattr(meta.get_submodule(owner), attr, meta.get_parameter(names[0]))
    # integer inputs (ids, labels) stay real: their values go along the simulation (capture/known.py)
    move = lambda t: t.to("meta") if t.is_floating_point() else t  # noqa: E731
    return meta, ls.capture.map_tensors(args, move), ls.capture.map_tensors(kwargs, move)


def _step_vs_memory(model, args, kwargs, kw, pairs: int):
    """memory() (nothing computed) against one real training step of a copy, alternating in pairs."""
    real = copy.deepcopy(model)
    opt = kw["optimizer"](real.parameters())
    dtype = kw.get("autocast_dtype")

    def step():
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = real(*args, **kwargs)
        out = out.logits if hasattr(out, "logits") else out[0] if isinstance(out, (tuple, list)) else out
        out.float().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    # one simulated step against one real step (memory() simulates two by default)
    return paired_ratios(step, lambda: ls.memory(model, *args, steps=1, **kw, **kwargs), pairs=pairs, warmup=1)


def accuracy(only=None, pairs: int = 3) -> list[tuple]:
    rows = []
    for name, make in CASES:
        if only and not any(name.startswith(o) for o in only):
            continue
        torch.manual_seed(0)
        model, args, kwargs, kw = make()
        t0 = time.perf_counter()
        pred = ls.memory(model, *args, measure=True, **kw, **kwargs)
        seconds = time.perf_counter() - t0  # includes the measured real step
        tracked = ls.memory(model, *args, simulate=False, **kw, **kwargs)
        m_model, m_args, m_kwargs = _to_meta(model, args, kwargs)
        meta = ls.memory(m_model, *m_args, **kw, **m_kwargs)
        same_tracked = [s.peak_bytes for s in pred.steps] == [s.peak_bytes for s in tracked.steps] \
            and pred.breakdown == tracked.breakdown
        same_meta = [s.peak_bytes for s in pred.steps] == [s.peak_bytes for s in meta.steps] \
            and pred.breakdown == meta.breakdown and pred.totals == meta.totals
        timing = _step_vs_memory(model, args, kwargs, kw, pairs) if pairs else None
        for i, s in enumerate(pred.steps):
            measured = pred.measured.step_peaks[i]
            print(f"  {name} step {i + 1}: {100.0 * (s.peak_bytes - measured) / measured:+.2f}%", file=sys.stderr)
            rows.append((name, i + 1, s.peak_bytes, tracked.steps[i].peak_bytes, measured,
                         100.0 * (s.peak_bytes - measured) / measured, same_tracked, same_meta, seconds,
                         timing if i == 0 else None))
    return rows


def llama70b() -> None:
    import transformers as tf
    cfg = tf.LlamaConfig(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                         intermediate_size=28672, vocab_size=32000, use_cache=False)
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = tf.LlamaForCausalLM(cfg)
    build = time.perf_counter() - t0
    ids = torch.zeros(1, 2048, dtype=torch.long, device="meta")
    t0, c0 = time.perf_counter(), time.process_time()
    rep = ls.memory(model, input_ids=ids, optimizer=torch.optim.AdamW, autocast_dtype=torch.bfloat16,
                    device="cuda")
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB -> GiB
    print(rep.table(depth=1))
    print(f"Llama-2-70B training step (batch 1, seq 2048, AdamW, bf16 autocast, predicted for CUDA): "
          f"memory() {seconds:.1f} s wall, {cpu:.1f} s CPU (target <= 60 s), model build on meta {build:.1f} s, "
          f"peak RSS of the process {rss:.2f} GiB (target <= 2 GiB), {len(rep.timeline):,} ops tracked")
    for s in rep.steps:
        parts = ", ".join(f"{k} {iec(v)}" for k, v in s.breakdown.items() if v)
        print(f"  step {s.step + 1}: peak {iec(s.peak_bytes)} in {s.peak_phase}: {parts}")


def main() -> None:
    if "--llama" in sys.argv:
        llama70b()
        return
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
    pairs = int(sys.argv[sys.argv.index("--pairs") + 1]) if "--pairs" in sys.argv else 3
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    rows = accuracy(only, pairs)
    head = f"{'model':<48} {'step':>4} {'predicted':>12} {'tracked':>12} {'allocator':>12} {'vs alloc':>9}  " \
           f"{'=tracked':>8} {'=meta':>6}  time (memory() / real step)"
    print(head)
    print("-" * len(head))
    for name, step, pred, tracked, measured, err, st, sm, _, timing in rows:
        print(f"{name:<48} {step:>4} {pred:>12,} {tracked:>12,} {measured:>12,} {err:>+8.2f}%  "
              f"{str(st):>8} {str(sm):>6}  {timing.describe() if timing else ''}")
    print("\n(allocator = real CPU step measured by torch.profiler allocation events; it includes the scratch "
          "that kernels allocate and free inside themselves (oneDNN convolutions and RNNs, mm, CPU flash "
          "attention), which the prediction sizes by one real call of each such kernel on zeros)\n")
    sys.stdout.flush()
    if "--no-llama" in sys.argv or only:
        return
    # a fresh process, so its peak RSS is the 70B simulation's alone
    subprocess.run([sys.executable, __file__, "--llama"], check=True)


if __name__ == "__main__":
    main()
