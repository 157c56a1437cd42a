"""Pipeline split: split units, the exact min-max partition, runnable stages, torchrun runs."""

from __future__ import annotations

import itertools
import json
import random
import warnings

import pytest
import torch

import layerscope as ls
from layerscope.examples import small_cnn, tiny_gpt
from layerscope.planning.split import SplitUnits, Tie, Unit, held_microbatches, stage_memory
from layerscope.planning.split.partition import solve
from layerscope.planning.split.runnable import verify_chain
from layerscope.reports.plan_build import build_plan
from layerscope.trace import Costs

from ...helpers import assert_unchanged, snapshot

transformers = pytest.importorskip("transformers")
warnings.filterwarnings("ignore", category=UserWarning)


def _unit(i, flops=0, state=0, saved=0, inb=0, outb=0, grads=0, work=0):
    return Unit(index=i, name=f"u{i}", paths=(f"u{i}",), type="X", params=state, param_bytes=state,
                grad_bytes=grads, optimizer_bytes=0, saved_bytes=saved, input_bytes=inb, output_bytes=outb,
                forward=Costs(flops=flops), backward=Costs(), work_bytes=work)


def _random_units(n, rng):
    us = tuple(_unit(i, rng.randint(0, 1000), rng.randint(0, 100), rng.randint(0, 50), rng.randint(0, 20),
                     rng.randint(0, 20), grads=rng.choice([0, rng.randint(0, 60)]),
                     work=rng.choice([0, rng.randint(0, 80)])) for i in range(n))
    ties = ()
    if n >= 2 and rng.random() < 0.3:
        a, b = sorted(rng.sample(range(n), 2))
        ties = (Tie(names=("w",), units=(a, b), state_bytes=min(us[a].param_bytes, us[b].param_bytes)),)
    loss = rng.choice([0, rng.randint(0, 100)])
    return SplitUnits("m", us, ties, loss_bytes=loss, loss_saved_bytes=rng.choice([0, rng.randint(0, 30)]))


def _brute(units, k, schedule, m, limits):
    n, best = len(units.units), None
    for cuts in itertools.combinations(range(1, n), k - 1):
        b = (0,) + cuts + (n,)
        mems = [stage_memory(units, b[s], b[s + 1], s, k, schedule, m)["total"] for s in range(k)]
        if limits and any(x > lim for x, lim in zip(mems, limits)):
            continue
        bott = max(sum(u.flops for u in units.units[b[s]:b[s + 1]]) for s in range(k))
        best = bott if best is None or bott < best else best
    return best


@pytest.mark.slow
def test_partition_equals_brute_force_on_1000_random_instances():
    rng = random.Random(0)
    infeasible = 0
    for _ in range(1000):
        n = rng.randint(1, 12)
        k = rng.randint(1, min(5, n))
        m = rng.randint(1, 6)
        schedule = rng.choice(["gpipe", "1f1b"])
        units = _random_units(n, rng)
        limits = None if rng.random() < 0.3 else [rng.randint(50, 600)] * k
        got = solve(units, k, "flops", limits, schedule, m)
        want = _brute(units, k, schedule, m, limits)
        assert (None if got is None else got[1]) == want
        infeasible += got is None
    assert 100 < infeasible < 900      # the limits bind in a good share of the instances


def test_in_flight_peak_is_the_largest_backward():
    # the solver only evaluates the backwards that can be the peak; every backward j gives the same
    from layerscope.planning.split.stage_memory import _in_flight_parts, flight_counts
    rng = random.Random(2)
    for _ in range(2000):
        a, o, grads, inb = (rng.randint(0, 50) for _ in range(4))
        m, k = rng.randint(1, 9), rng.randint(1, 6)
        s, schedule = rng.randrange(k), rng.choice(["gpipe", "1f1b"])
        held = held_microbatches(schedule, k, m, s)
        first, last = s == 0, s == k - 1
        kept_out = not last and (schedule == "gpipe" or held == 2)
        every = [acts * a + outs * o + sends * inb - (min(a if kept_out else a + o, grads) if j == 0 else 0)
                 for j, (acts, outs, sends) in enumerate(flight_counts(schedule, held, m, first, last))]
        p = _in_flight_parts(a, o, grads, inb, held, m, schedule, first, last)
        assert p["activations"] + p["outputs"] + p["sends"] + p["grad_overlap"] == max(every)


def test_partition_with_what_the_step_keeps_equals_brute_force():
    # the same brute force with step(return_outputs=True)'s kept outputs, the batch's inputs on the
    # first stage and its targets on the last, over GPipe, 1F1B and interleaved (2 stages per rank)
    import dataclasses
    rng = random.Random(3)
    infeasible = 0
    for _ in range(600):
        n = rng.randint(1, 12)
        schedule = rng.choice(["gpipe", "1f1b", "interleaved"])
        k = rng.choice([2, 4]) if schedule == "interleaved" else rng.randint(1, 5)
        if k > n:
            continue
        m = rng.randint(1, 6)
        units = dataclasses.replace(_random_units(n, rng), kept_outputs=rng.random() < 0.7,
                                    input_batch_bytes=rng.choice([0, rng.randint(0, 90)]),
                                    target_bytes=rng.choice([0, rng.randint(0, 90)]))
        limits = None if rng.random() < 0.3 else [rng.randint(50, 700)] * k
        got = solve(units, k, "flops", limits, schedule, m)
        want = _brute(units, k, schedule, m, limits)
        assert (None if got is None else got[1]) == want
        infeasible += got is None
    assert 50 < infeasible < 500


def test_in_flight_peak_with_kept_outputs_is_the_largest_backward_or_the_end():
    # interleaved: torch's runtime schedule keeps every send's work to the end of the step. With
    # return_outputs=True the last stage also holds, at backward j, the j outputs whose backward
    # is done, and at the end of the step all M and their concatenation (M more)
    from layerscope.planning.split.stage_memory import _in_flight_parts, flight_counts
    rng = random.Random(4)
    for _ in range(2000):
        a, o, grads, inb = (rng.randint(0, 50) for _ in range(4))
        schedule = rng.choice(["gpipe", "1f1b", "interleaved"])
        m, k = rng.randint(1, 9), rng.choice([2, 4, 6]) if schedule == "interleaved" else rng.randint(1, 6)
        s, kept = rng.randrange(k), rng.random() < 0.7
        held = held_microbatches(schedule, k, m, s)
        first, last = s == 0, s == k - 1
        keeps = kept and last
        kept_out = keeps or (not last and (schedule != "1f1b" or held == 2))
        counts = flight_counts(schedule, held, m, first, last)
        every = [acts * a + outs * o + sends * inb + (j * o if keeps else 0)
                 - (min(a if kept_out else a + o, grads) if j == 0 else 0)
                 for j, (acts, outs, sends) in enumerate(counts)]
        # the end of the step: interleaved holds every sent output and input gradient until then
        if keeps or schedule == "interleaved":
            every.append((counts[-1][2] if schedule == "1f1b" else (0 if first else m)) * inb
                         + (m * o if schedule == "interleaved" and not last else 0) + (2 * m * o if keeps else 0))
        p = _in_flight_parts(a, o, grads, inb, held, m, schedule, first, last, kept=kept)
        assert p["activations"] + p["outputs"] + p["sends"] + p["grad_overlap"] + p["kept_outputs"] == max(every)


def test_hand_derived_kept_outputs_inputs_and_targets():
    import dataclasses
    # the units of test_hand_derived_working_memory_loss_and_gradient_overlap, M = 2, 2 1F1B stages,
    # with return_outputs=True, a 6-byte input batch and a 4-byte target batch. Stage 0: as before
    # 36, + inputs 6 = 42. Stage 1 (last): backward 0: 9 - min(3 + 4 = 7 freed, the output is kept,
    # 10) = 2; backward 1: 9 + input gradient 2 + kept output of micro-batch 0: 2 = 13; end of step:
    # 2 outputs kept + their concatenation 2 x 2 = 8, + the last input gradient 2 = 10 -> 13.
    # State 20 + 13 + received 4 + working 9 + targets 4 = 50 (44 without them)
    units = SplitUnits("m", (_unit(0, 1, state=10, saved=3, inb=2, outb=2, grads=10, work=5),
                             _unit(1, 1, state=10, saved=3, inb=2, outb=2, grads=10, work=7)),
                       loss_bytes=9, loss_saved_bytes=4, kept_outputs=True, input_batch_bytes=6, target_bytes=4)
    plan = build_plan(units, stages=2, by="flops", memory_limit=None, schedule="1f1b", microbatches=2)
    assert [s.memory_bytes for s in plan.stages] == [42, 50]
    last = plan.stages[1].memory
    assert (last["kept_outputs"], last["peak_backward"], last["targets"], last["inputs"]) == (2, 1, 4, 0)
    # one GPipe stage: with M = 2 the end of the step holds 2 x 2 outputs + 2 x 2 concatenated = 8,
    # less than backward 0's 24 - min(12 - 2, 20) = 14 or backward 1's 12 + 2 = 14 (-> 14)
    m = stage_memory(dataclasses.replace(units, input_batch_bytes=0, target_bytes=0), 0, 2, 0, 1, "gpipe", 2)
    assert (m["activations"], m["outputs"], m["kept_outputs"], m["grad_overlap"]) == (20, 4, 0, -10)


def test_hand_derived_rank_memory_of_two_interleaved_stages():
    from layerscope.planning.split.stage_memory import rank_memory
    # 4 units of 10 B parameters and 8 B gradients, saving 3 B, receiving and sending 2 B per
    # micro-batch; 4 stages on 2 ranks, M = 2. Rank 0 holds stages 0 and 2 and runs (torch's order:
    # 4 warm-up forwards) F0 F0 F2 F2 B2 B2 B0 B0. Constant: state 2 x 18 + boundary (stage 0: 2 x 2
    # gradient buffers; stage 2: 2 x 2 received + 2 x 2) 12 = 48. In flight, gradients absent until
    # a stage's first backward: after the forwards 20 - 16 = 4; B2 (0): stage 0 10 - 8, stage 2
    # 10 - min(3, 8) -> 9; B2 (1): 2 + 3 + 2 x 2 sent outputs + 2 sent gradient = 11; B0 (0): 10 - 3
    # + stage 2's 2 x 2 + 2 x 2 = 15; B0 (1): 3 + 4 + 8 = 15; the end 4 + 8 = 12 -> 48 + 15 = 63.
    # Each stage's own peak (stage 0: 18 + 7 + 4 = 29 at its backwards; stage 2: 18 + 9 + 8 = 35 at
    # its backward 1) summed: 64 -- the stages peak at different times
    units = SplitUnits("m", tuple(_unit(i, 1, state=10, saved=3, inb=2, outb=2, grads=8) for i in range(4)))
    plan = build_plan(units, stages=4, by="flops", memory_limit=None, schedule="interleaved", microbatches=2)
    assert [s.rank for s in plan.stages] == [0, 1, 0, 1]
    order = [(0, "F"), (0, "F"), (2, "F"), (2, "F"), (2, "B"), (2, "B"), (0, "B"), (0, "B")]
    assert rank_memory(units, [plan.stages[0], plan.stages[2]], 4, order, 2) == 63
    assert (plan.stages[0].memory_bytes, plan.stages[2].memory_bytes) == (29, 35)


def test_hand_derived_zero_bubble_last_stage_after_its_i():
    import dataclasses

    from layerscope.planning.split.stage_memory import rank_memory
    # 2 parameter-free units saving 3 B, receiving and sending 2 B; the loss saves 5 B; the last
    # stage's I keeps 4 B for its W (deferred). zb, 2 stages on one rank, M = 2, torch's order:
    # F0.0 F1.0 I1.0 W1.0 F0.1 I0.0 W0.0 F1.1 I1.1 W1.1 I0.1 W0.1. Per micro-batch: stage 0 a = 3,
    # o = 2; stage 1 a = 3 + 5 (the loss) = 8, o = 2. The last stage's I detaches the loss and the
    # output: after it a micro-batch holds 8 - 5 = 3 (the weight ops' saved inputs) + 4 deferred,
    # not 8 + 2 + 4. Constant: nothing (no state, no working memory, and no receive buffers: the
    # two stages share the rank, so torch hands the output and the input gradient over directly;
    # with one buffer per micro-batch each way it would be 2 x 2 + 2 x 2 = 8 more).
    # In flight: F1.0 -> 5 + 10 = 15; I1.0 -> 5 + 7 = 12; F0.1 -> 10 + 2 (a sent gradient) = 12;
    # W0.0 -> 7 + 2 = 9; F1.1 -> 7 + (10 + 2) = 19; I1.1 -> 7 + (3 + 4 + 2) = 16; then less.
    # Peak 19 (counting the loss and the output to the W: I1.1 -> 7 + 16 = 23).
    # With the outputs kept (return_outputs=True) the output stays: F1.1 -> 7 + (10 + 2 + 2 kept)
    # = 21, I1.1 -> 7 + (5 + 4 + 2 + 2) = 20, the end 4 + 8 + 4 merged = 16: 21.
    us = tuple(dataclasses.replace(_unit(i, 1, saved=3, inb=2, outb=2), deferred_bytes=4) for i in range(2))
    order = [(0, "F"), (1, "F"), (1, "I"), (1, "W"), (0, "F"), (0, "I"), (0, "W"), (1, "F"), (1, "I"),
             (1, "W"), (0, "I"), (0, "W")]
    for kept, want in ((False, 19), (True, 21)):
        units = SplitUnits("m", us, loss_saved_bytes=5, kept_outputs=kept)
        plan = build_plan(units, stages=2, by="flops", memory_limit=None, schedule="zb", microbatches=2)
        assert [s.rank for s in plan.stages] == [0, 0]
        assert rank_memory(units, plan.stages, 2, order, 2) == want
        assert [s.memory["boundary"] for s in plan.stages] == [0, 0]
    # The end of the step holds no action's working memory. The last unit's output 10 B, its working
    # memory 6 B, outputs kept: F1.0 -> 5 + 18 = 23; I1.0 -> 5 + (3 + 10 + 4) = 22; W1.0 -> 5 + (2 + 10)
    # = 17; F0.1 -> 10 + 12 = 22; W0.0 -> 7 + 12 = 19; F1.1 -> 7 + (8 + 10 + 2 + 10) = 37; I1.1 -> 7 +
    # (13 + 4 + 2 + 10) = 36; W1.1 -> 7 + 24 = 31; W0.1 -> 4 + 24 = 28 at the end, when the 2 kept
    # outputs are concatenated (20 more): max(37 + 6, 28 + 20) = 48 (not 6 + 48 = 54).
    us = (us[0], dataclasses.replace(us[1], output_bytes=10, work_bytes=6))
    units = SplitUnits("m", us, loss_saved_bytes=5, kept_outputs=True)
    plan = build_plan(units, stages=2, by="flops", memory_limit=None, schedule="zb", microbatches=2)
    assert rank_memory(units, plan.stages, 2, order, 2) == 48


def test_partition_1000_units_64_stages():
    rng = random.Random(1)
    units = SplitUnits("m", tuple(_unit(i, rng.randint(1, 1000)) for i in range(1000)))
    plan = build_plan(units, stages=64, by="flops", memory_limit=None, schedule="1f1b", microbatches=8)
    assert plan.num_stages == 64 and all(s.first <= s.last for s in plan.stages)
    assert plan.bottleneck >= plan.lower_bound
    assert plan.bottleneck == max(s.cost for s in plan.stages)


def test_hand_derived_split_and_memory():
    # costs 4,1,1,4 into 2 stages: [4,1] | [1,4] -> bottleneck 5 (any other cut gives 6, 9 or 4+1+1=6)
    units = SplitUnits("m", tuple(_unit(i, c, state=10, saved=3, inb=2, outb=2)
                                  for i, c in enumerate((4, 1, 1, 4))))
    plan = build_plan(units, stages=2, by="flops", memory_limit=None, schedule="1f1b", microbatches=4)
    assert [(s.first, s.last) for s in plan.stages] == [(0, 1), (2, 3)]
    assert plan.bottleneck == 5 and plan.lower_bound == 5 and plan.imbalance == 1.0
    # stage 0 of 2 under 1F1B warms up with min(2 - 0, 4) = 2 micro-batches; at its second backward
    # (j = 1) it holds min(2 + 1, 4) - 1 = 2 micro-batches' saved 2 x 6 = 12 and outputs 2 x 2 = 4,
    # plus micro-batch 0's output 2 that the warm-up's send work still holds (W - 2 = 0 < j = 1 <=
    # M - W = 2): state 20 + 18 + gradient buffers for 4 micro-batches 4 x 2 = 8 -> 46 (j = 0: 16 < 18).
    # Stage 1 holds min(1 + j, 4) - j = 1: at j >= 1 saved 6 + output 2 + the previous backward's
    # input gradient 2 waiting to be sent = 10; + 20 + received inputs 4 x 2 = 8 -> 38.
    assert [s.memory_bytes for s in plan.stages] == [46, 38]
    assert held_microbatches("gpipe", 4, 8, 3) == 8
    assert [held_microbatches("1f1b", 4, 8, s) for s in range(4)] == [4, 3, 2, 1]
    # per-device limits 40 and 52 bytes rule out stage 0 = [0, 1] (46). [4] | [1, 1, 4]: stage 0 =
    # 10 + (2 x 3 + 3 x 2 = 12 at j = 1, as above) + 4 x 2 = 30 <= 40; stage 1 = 30 + 1 x 9 + 1 x 2
    # + input gradient 2 + 4 x 2 = 51 <= 52 -> bottleneck 6
    plan = build_plan(units, stages=2, by="flops", memory_limit=[40, 52], schedule="1f1b", microbatches=4)
    assert [(s.first, s.last) for s in plan.stages] == [(0, 0), (1, 3)] and plan.bottleneck == 6


def test_hand_derived_working_memory_loss_and_gradient_overlap():
    # two units: parameters 10 B + gradients 10 B each, saving 3 B per micro-batch, 2 B in and out,
    # working memory 5 B and 7 B; the loss saves 4 B per micro-batch and works with 9 B more
    units = SplitUnits("m", (_unit(0, 1, state=10, saved=3, inb=2, outb=2, grads=10, work=5),
                             _unit(1, 1, state=10, saved=3, inb=2, outb=2, grads=10, work=7)),
                       loss_bytes=9, loss_saved_bytes=4)
    # one GPipe stage, M = 2: state 2 x 20 = 40; per micro-batch saved 6 + output 2 + loss 4 = 12,
    # held 2 -> 24; all M in flight, so the first backward frees one micro-batch's 12 while the
    # gradients (20) appear: -min(12, 20) = -12; no boundary; working max(5, 7, loss 9) = 9 -> 61
    m = stage_memory(units, 0, 2, 0, 1, "gpipe", 2)
    assert (m["activations"], m["outputs"], m["grad_overlap"], m["working"], m["total"]) == (20, 4, -12, 9, 61)
    # two 1F1B stages, M = 2. Stage 0 warms up with min(2, 2) = 2 = M: at backward 0 it holds
    # 2 x (3 + 2) = 10; that backward frees micro-batch 0's saved 3 but not its output (the warm-up's
    # send work holds it, W = 2) while the gradients appear: - min(3, 10) -> 7 (backward 1: 3 + 2 = 5);
    # state 20 + 7 + gradient buffers 2 x 2 = 4 + working 5 -> 36. Stage 1 warms up with 1 < M: at
    # backward 1 it holds 1 x (3 + 2 + 4) = 9 and backward 0's input gradient 2 waiting to be sent
    # (backward 0: 9 - min(9, 10) = 0); state 20 + 11 + received inputs 2 x 2 = 4 + working
    # max(7, 9) = 9 -> 44
    plan = build_plan(units, stages=2, by="flops", memory_limit=None, schedule="1f1b", microbatches=2)
    assert [s.memory_bytes for s in plan.stages] == [36, 44]


def test_infeasible_says_what_would_work():
    units = SplitUnits("m", tuple(_unit(i, 1, state=100) for i in range(4)))
    with pytest.raises(ls.PlanError) as e:
        build_plan(units, stages=2, by="flops", memory_limit=150, schedule="gpipe", microbatches=1)
    # two stages need 200 bytes each at best; 4 stages of 100 fit the 150-byte limit
    assert e.value.min_memory == 200 and e.value.min_stages == 4
    assert "200 B" in str(e.value) and "4" in str(e.value)
    with pytest.raises(ls.PlanError, match="only 4 split units"):
        build_plan(units, stages=5, by="flops", memory_limit=None, schedule="gpipe", microbatches=1)
    with pytest.raises(ls.InputError, match="schedule"):
        build_plan(units, stages=2, by="flops", memory_limit=None, schedule="dualpipev", microbatches=1)


def _gpt2(layers=4, train=False, cache=False):
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=64, n_head=4, vocab_size=500, n_positions=64,
                                  use_cache=cache, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    m = transformers.GPT2LMHeadModel(cfg)
    return m.train() if train else m.eval()


def _llama():
    cfg = transformers.LlamaConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=128, vocab_size=500, use_cache=False)
    return transformers.LlamaForCausalLM(cfg)


def test_units_of_decoders_and_their_sums():
    torch.manual_seed(0)
    m = _gpt2(3)
    ids = torch.randint(0, 500, (4, 16))
    plan = ls.partition(m, ids, stages=2, microbatches=2, optimizer="adamw")
    names = [u.name for u in plan.units.units]
    # dropout with p=0 runs no op, so the embeddings' sum reaches h.0 past it: drop joins them
    assert names == ["transformer.wte+transformer.wpe+transformer.drop", "transformer.h.0",
                     "transformer.h.1", "transformer.h.2", "transformer.ln_f", "lm_head"]
    # per-unit numbers add up to the model's: costs of the simulated step on one micro-batch
    rep = ls.Report(ls.memory(m, ids[:2], optimizer="adamw", steps=2, loss="sum").trace)   # partition()'s loss
    assert sum(u.forward.flops for u in plan.units.units) == rep.totals.forward.flops
    assert sum(u.backward.flops for u in plan.units.units) == rep.totals.backward.flops
    assert sum(s.flops for s in plan.stages) == rep.totals.forward.flops + rep.totals.backward.flops
    # the tied embedding / head weight is one tie across the first and the last unit
    assert [t.names for t in plan.units.ties] == [("transformer.wte.weight", "lm_head.weight")]
    llama = ls.partition(_llama(), input_ids=ids, stages=3, microbatches=2)
    assert [u.name for u in llama.units.units] == ["model.embed_tokens+model.rotary_emb", "model.layers.0",
                                                   "model.layers.1", "model.layers.2", "model.norm", "lm_head"]


def test_residual_blocks_are_not_cut_inside():
    torch.manual_seed(0)
    cfg = transformers.ResNetConfig(depths=[1, 1], hidden_sizes=[16, 32], embedding_size=8)
    m = transformers.ResNetForImageClassification(cfg).eval()
    plan = ls.partition(m, torch.randn(2, 3, 32, 32), stages=2)
    names = [u.name for u in plan.units.units]
    assert "resnet.encoder.stages.0.layers.0" in names           # the bottleneck block stays whole
    assert not any(n.startswith("resnet.encoder.stages.0.layers.0.") for n in names)


def test_stage_chain_reproduces_the_model_both_paths():
    torch.manual_seed(0)
    ids = torch.randint(0, 500, (4, 16))
    m = _gpt2().eval()
    before = snapshot(m)
    plan = ls.partition(m, ids, stages=3, microbatches=2)
    path, diff, why = verify_chain(m, plan, (ids[:2],), {})
    assert (path, diff, why) == ("export", 0.0, None)
    path, diff, _ = verify_chain(m, plan, (ids[:2],), {}, path="ownership")
    assert path == "ownership" and diff == 0.0
    assert_unchanged(before, m)
    # with use_cache on (GPT2Config's default) GPT-2 sends its causal mask expanded over the batch
    # (stride 0) to every stage: send/recv need contiguous tensors, so the export path is refused
    # and module ownership runs it
    t = _gpt2(train=True, cache=True)
    before = snapshot(t)
    plan = ls.partition(t, ids, stages=3, microbatches=2)
    path, diff, why = verify_chain(t, plan, (ids[:2],), {})
    assert path == "ownership" and diff == 0.0 and "not contiguous" in why
    assert_unchanged(before, t)
    # Llama: whether torch.export's pipeline() traces it depends on the transformers release (4.x
    # could not, 5.24 can); either way the chain reproduces the model, and where export is refused
    # the reason is given. The module-ownership path runs it exactly too.
    llama = _llama().eval()
    plan = ls.partition(llama, input_ids=ids, stages=3, microbatches=2)
    path, diff, why = verify_chain(llama, plan, (), {"input_ids": ids[:2]})
    assert (path, why is None) in (("export", True), ("ownership", False)) and diff < 1e-5
    path, diff, _ = verify_chain(llama, plan, (), {"input_ids": ids[:2]}, path="ownership")
    assert path == "ownership" and diff < 1e-5


def test_plan_renders_as_table_json_and_csv():
    m = tiny_gpt()
    plan = ls.partition(m, torch.randint(0, 1000, (8, 32)), stages=2, microbatches=4, optimizer="adamw")
    text = plan.table()
    assert "Bottleneck" in text and "Split points  ln" in text and "Tied weights" in text
    d = json.loads(plan.to_json())
    assert d["kind"] == "stage_plan" and d["split_points"] == ["ln"] and len(d["stages"]) == 2
    assert sum(u["forward"]["flops"] + u["backward"]["flops"] for u in d["units"]) == \
        sum(s["flops"] for s in d["stages"])
    assert plan.to_csv().splitlines()[0].startswith("stage,rank,first_unit,last_unit")


GPT2_RUN = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 300, "n_positions": 32,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}   # no dropout: losses comparable


@pytest.mark.parametrize("spec,overrides,schedule,path,stages", [
    ("hf:GPT2Config", GPT2_RUN, "1f1b", "ownership", 2),        # export refused: the mask boundary
    ("layerscope.examples:small_cnn", {}, "gpipe", "export", 2),
    # 4 stages on 2 ranks (0, 2 | 1, 3); the tied embedding and head on stages 0 and 3 (both ranks)
    ("hf:GPT2Config", GPT2_RUN, "interleaved", "ownership", 4),
    # zero bubble: backwards split into I and W; zbv's V puts stages 0, 3 on rank 0 (the tied
    # embedding and head on one rank) and 1, 2 on rank 1 (passed on without a send)
    ("layerscope.examples:small_cnn", {}, "zb", "export", 4),
    ("hf:GPT2Config", GPT2_RUN, "zbv", "ownership", 4)])
@pytest.mark.slow
def test_torchrun_training_matches_one_process(spec, overrides, schedule, path, stages):
    from layerscope.torchrun import launch
    res = launch(spec, overrides=overrides, stages=stages, schedule=schedule, microbatches=2, batch_size=4,
                 steps=2, optimizer="sgd", compare_grads=True)
    assert len(res.losses) == 2 and res.loss_rel_diff < 1e-5 and res.path == path
    assert all(r["peak_bytes"] > 0 and r["predicted_bytes"] > 0 for r in res.ranks)
    # losses of both steps and every parameter's gradient (first step) as one process computes them
    assert res.loss_rel_diff < 1e-6 and res.grad_rel_diff < 1e-6
    assert len(res.ranks) == 2 and [r["stages"] for r in res.ranks] == \
        {"interleaved": [[0, 2], [1, 3]], "zb": [[0, 2], [1, 3]], "zbv": [[0, 3], [1, 2]]}.get(schedule, [[0], [1]])
    # every step's time and busy seconds (forward, backward, loss), busy within the step
    assert all(len(r["times"]) == len(r["busy"]) == 2 and 0 < r["busy"][1] < r["times"][1] for r in res.ranks)
    # each step's actions as run: every stage's forward and backward of both micro-batches, inside
    # the step; the last stage's forward block runs on to the end of its loss, so the blocks hold
    # at least the busy time
    kinds = "FIW" if schedule in ("zb", "zbv") else "FB"
    from layerscope.planning.steptime.schedule import rank_orders
    orders = rank_orders(schedule, stages, 2, 2)
    for r in res.ranks:
        for step, blocks, busy in zip(r["times"], r["blocks"], r["busy"]):
            assert sorted((s, k, mb) for s, k, mb, _, _ in blocks) == \
                sorted((s, k, mb) for s in r["stages"] for k in kinds for mb in range(2))
            # in the order the simulation takes from torch's order builders
            assert [(s, k, mb) for s, k, mb, _, _ in sorted(blocks, key=lambda x: x[3])] == \
                [(a.stage, a.kind, a.microbatch) for a in orders[r["rank"]]]
            assert all(0 <= a <= b <= step for _, _, _, a, b in blocks)
            assert busy - 1e-6 <= sum(b - a for *_, a, b in blocks) <= step
    # the co-run slowdown was measured (before the steps: the losses and gradients above match),
    # and the whole model's time alone with it
    assert all(r["corun"] > 0 and r["alone_s"] > 0 for r in res.ranks) and res.corun > 0
    # the schedule replayed with the run's own action times (means per stage and kind): a plumbing
    # check only; on a model this small the run's sends and waits take longer than its actions
    sim, last_end = res.replay()
    assert 0 < sim < 1.25 * last_end


def test_run_speed_scales_the_prediction():
    import dataclasses

    from layerscope.torchrun import RunResult
    # two units of 1 s forward and 2 s backward per micro-batch: the whole model takes 6 s in the
    # plan's times; the ranks timed it alone at 9 s and 12 s before their steps (the median of two:
    # the upper, 12 s), so the machine ran 2.0x slower than when the units were timed, and the
    # prediction at the run's speed is the same schedule with every compute time doubled
    us = tuple(dataclasses.replace(_unit(i, 1), latency=3.0, forward_time=1.0, backward_time=2.0) for i in range(2))
    plan = build_plan(SplitUnits("m", us), stages=2, by="latency", memory_limit=None, schedule="1f1b",
                      microbatches=2)
    ranks = tuple({"rank": i, "stages": [i], "alone_s": a, "corun": 1.0, "times": [20.0], "busy": [12.0],
                   "steady": True, "peak_bytes": 1, "predicted_bytes": 1} for i, a in enumerate((9.0, 12.0)))
    res = RunResult(plan=plan, ranks=ranks, reference=(1.0,), losses=(1.0,), path="ownership")
    assert res.speed(plan) == 2.0
    assert res.predict(plan, at_run_speed=True).pipeline_time == 2 * res.predict(plan).pipeline_time
    assert "Machine speed" in res.table() and "x2.00" in res.table()
    # not measured (GPU runs): no speed, the plain prediction
    gpu = dataclasses.replace(res, ranks=tuple({k: v for k, v in r.items() if k != "alone_s"} for r in ranks))
    assert gpu.speed(plan) is None
    assert gpu.predict(plan, at_run_speed=True).pipeline_time == res.predict(plan).pipeline_time
    assert "Machine speed" not in gpu.table()


def test_step_speed_is_the_steps_own_compute_against_the_plans():
    import dataclasses

    from layerscope.torchrun import RunResult
    # the plan above: 2 stages of one unit each, 1 s forward and 2 s backward per micro-batch, 2
    # micro-batches: 2 x 2 x (1 + 2) = 12 s of actions in a step. The run's median step (of steps 2-4,
    # after the first: 30, 20 and 25 s, so step 4) has every action twice as long: 24 s, a speed of
    # 2.0, taken from that step alone (steps 2 and 3, 3x and 1.5x, do not count)
    us = tuple(dataclasses.replace(_unit(i, 1), latency=3.0, forward_time=1.0, backward_time=2.0) for i in range(2))
    plan = build_plan(SplitUnits("m", us), stages=2, by="latency", memory_limit=None, schedule="1f1b",
                      microbatches=2)

    def blocks(stage, k):
        return [[stage, kind, mb, 0.0, k * t] for kind, t in (("F", 1.0), ("B", 2.0)) for mb in range(2)]
    ranks = tuple({"rank": i, "stages": [i], "corun": 1.0, "times": [9.0, 30.0, 20.0, 25.0], "busy": [1.0] * 4,
                   "blocks": [blocks(i, k) for k in (1.0, 3.0, 1.5, 2.0)], "steady": False,
                   "peak_bytes": 1, "predicted_bytes": 1} for i in range(2))
    res = RunResult(plan=plan, ranks=ranks, reference=(1.0,), losses=(1.0,), path="ownership")
    assert res.step_speed(plan) == 2.0
    assert res.predict(plan, at_step_speed=True).pipeline_time == 2 * res.predict(plan).pipeline_time
    # no per-action times: none
    bare = dataclasses.replace(res, ranks=tuple({k: v for k, v in r.items() if k != "blocks"} for r in ranks))
    assert bare.step_speed(plan) is None


@pytest.mark.slow
def test_torchrun_honours_head_input_ids_and_memory_limit():
    from layerscope.torchrun import launch
    cfg = {k: v for k, v in GPT2_RUN.items()}
    res = launch("hf:GPT2Config", overrides=cfg, head="causal-lm", input_ids=(4, 12), memory_limit="64MiB",
                 stages=2, microbatches=2, batch_size=4, steps=1, optimizer="sgd", return_outputs=False)
    plan = res.plan
    # the head reached the ranks (GPT2LMHeadModel: the last unit is lm_head), the input ids of
    # shape 4 x 12 the first rank, the limit the plan every rank made
    assert plan.units.units[-1].name == "lm_head" and res.ranks[0]["inputs"] == [[4, 12]]
    assert all(s.limit == 64 * 2**20 and s.memory_bytes <= s.limit for s in plan.stages)
    assert plan.options.get("return_outputs") is not True and "kept_outputs" not in plan.stages[-1].memory
    # on CPU the one timed step comes after the memory-measured one, without the profiler: steady
    assert res.warm and "median of 1 step timed after as many memory-measured ones" in res.table()


def test_cli_split_run_passes_every_option(monkeypatch, capsys):
    import layerscope.torchrun as run
    from layerscope.cli import main
    seen = {}

    def stub(spec, **kw):
        seen.update(kw)
        raise ls.InputError("stubbed")
    monkeypatch.setattr(run, "launch", stub)
    assert main(["split", "hf:GPT2Config", "--set", "n_layer=2", "--head", "causal-lm", "--input-ids", "4,12",
                 "--memory-limit", "1GiB", "--stages", "4", "--schedule", "interleaved", "--model-dtype", "fp32",
                 "--microbatches", "2", "--batch-size", "4", "--by", "params", "--optimizer", "sgd",
                 "--no-return-outputs", "--run", "--steps", "1"]) == 1
    assert (seen["head"], seen["input_ids"], seen["memory_limit"], seen["schedule"], seen["stages_per_rank"],
            seen["model_dtype"], seen["by"], seen["return_outputs"], seen["overrides"]) == \
        ("causal-lm", (4, 12), "1GiB", "interleaved", 2, "fp32", "params", False, {"n_layer": 2})
    main(["split", "layerscope.examples:small_cnn", "--stages", "2", "--input-size", "4,3,32,32", "--run"])
    assert seen["input_size"] == [(4, 3, 32, 32)] and seen["return_outputs"] is True
    capsys.readouterr()


def test_export_stages_drop_a_tied_weight_they_do_not_use():
    from layerscope.planning.split.runnable import drop_unused_params, export_stages
    m = tiny_gpt()
    ids = torch.randint(0, 1000, (4, 32))
    before = snapshot(m)
    plan = ls.partition(m, ids, stages=2, microbatches=2)
    pipe, _ = export_stages(m, plan, (ids[:2],), {})
    first = pipe.get_stage_module(0)
    # pipeline() puts the output head's weight (tied to the token embedding) on stage 0 too
    assert "model.head.weight" in dict(first.named_parameters())
    assert drop_unused_params(first) == ["model.head.weight"]
    assert "model.tok.weight" in dict(first.named_parameters())
    assert drop_unused_params(pipe.get_stage_module(1)) == []
    assert_unchanged(before, m)


def test_worker_errors_are_named():
    from layerscope.planning.real.procs import _worker_error
    text = ("[rank1]: Traceback (most recent call last):\n[rank1]:   File x\n"
            "[rank1]: RuntimeError: input tensor has to be contiguous\n"
            "[rank0]: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n")
    assert _worker_error(text) == "rank 1: RuntimeError: input tensor has to be contiguous"
    # a rank killed by SIGABRT (an uncaught C++ exception in a worker thread) names what it threw; torchrun's
    # summary at the end says only the signal
    text = ("[rank1]: terminate called after throwing an instance of 'gloo::IoException'\n"
            "[rank1]:   what():  [../gloo/transport/tcp/pair.cc:598] Read error\nx\n" + "torchrun summary\n" * 20)
    assert _worker_error(text) == ("rank 1: terminate called after throwing an instance of 'gloo::IoException'\n"
                                   "rank 1: what():  [../gloo/transport/tcp/pair.cc:598] Read error")


def test_cli_split(capsys):
    from layerscope.cli import main
    assert main(["split", "layerscope.examples:small_cnn", "--stages", "2", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kind"] == "stage_plan" and len(d["stages"]) == 2
    assert main(["split", "layerscope.examples:small_cnn", "--stages", "2", "--memory-limit", "1KiB"]) == 1
    assert "smallest per-stage limit" in capsys.readouterr().err


def test_small_cnn_units():
    plan = ls.partition(small_cnn(), torch.randn(4, 3, 32, 32), stages=2, microbatches=2)
    assert len(plan.units) >= 4


def test_saved_inputs_and_outputs_are_not_counted_twice():
    from layerscope.planning.split.units import units_from_memory
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    units = units_from_memory(ls.memory(m, torch.randn(3, 4), optimizer="sgd", steps=2), m)
    got = [(u.saved_bytes, u.received_saved_bytes, u.output_saved_bytes) for u in units.units]
    # batch 3 x 8 float32 = 96 B. Unit 0 saves only the model's input (an input, not an activation).
    # Unit 1 (Linear) saves its input, unit 0's output, which existed before it began: received 96.
    # Unit 2 (Tanh) saves its own output: output 96. Unit 3 (Linear) saves its input, the storage
    # Tanh already saved, counted once (at Tanh).
    assert got == [(0, 0, 0), (96, 96, 0), (96, 0, 96), (0, 0, 0)]
    # a middle stage of units 1..2 (1F1B, 3 stages, M = 1): per micro-batch saved 192 - received
    # input 96 (a receive buffer) - its saved output 96 (the output) = 0 activations; output 96
    mem = stage_memory(units, 1, 3, 1, 3, "1f1b", 1)
    assert (mem["activations"], mem["outputs"], mem["sends"]) == (0, 96, 0)


def test_working_memory_spans_from_timed_events():
    from layerscope.planning.steptime.unit_timing import _work_from_events
    ev = [(0, 0, "0.f"), (1, 1, 100), (2, 1, 50), (3, 1, -50), (4, 0, "1.f"), (5, 1, 30), (6, 1, -30),
          (7, 0, "end.f"), (8, 1, 10), (9, 0, "1.b"), (10, 1, 40), (11, 1, -40), (12, 1, 20),
          (13, 0, "0.b"), (14, 1, 60), (15, 1, -20)]
    # live bytes 0 -> 100 -> 150 -> 100 | 130 -> 100 | end 100 -> 110 | 150 -> 110 -> 130 | 190 -> 170
    # unit 0 forward: peak 150 - 100 at its end (unit 1's mark) = 50; unit 1 forward: 130 - 100 = 30;
    # unit 1 backward: from its mark (110) to unit 0's: peak 150 - 110 = 40; unit 0 backward: to the
    # end, including the weight gradient after its hook: 190 - 130 = 60
    assert _work_from_events(ev, ["a", "b"]) == {"a": 60, "b": 40}


def test_partition_measures_working_memory_and_leaves_the_model_alone():
    m, x = small_cnn(), torch.randn(4, 3, 32, 32)
    before = snapshot(m)
    simulated = ls.partition(m, x, stages=2, microbatches=2, optimizer="adamw", measure_working=False)
    measured = ls.partition(m, x, stages=2, microbatches=2, optimizer="adamw")
    assert_unchanged(before, m)
    assert any("measured" in n for n in measured.notes)
    pairs = [(a.work_bytes, b.work_bytes) for a, b in zip(simulated.units.units, measured.units.units)]
    assert all(b >= a for a, b in pairs) and any(b > a for a, b in pairs)
    with pytest.raises(ls.InputError, match="no data"):
        ls.partition(small_cnn().to("meta"), torch.randn(4, 3, 32, 32, device="meta"), stages=2,
                     optimizer="adamw", measure_working=True)


def test_zero_bubble_last_stage_output_view_does_not_pin_its_graph():
    """Torch's zero bubble runs the I with retain_graph=True; the W frees only the saved tensors of the
    ops it runs (those leading to a weight). The last stage's output, which step(return_outputs=True)
    keeps to the end of the step, is detached after the I, but torch skips a view: its grad_fn then
    keeps the rest of the micro-batch's graph alive (here GELU's saved input, an op that leads to no
    weight). Checked with torch's own stage_backward_input / stage_backward_weight: the stage module
    returns a copy of a view, and after its W nothing the forward saved is alive."""
    import gc
    import weakref

    from torch import nn
    bw = pytest.importorskip("torch.distributed.pipelining._backward")
    from layerscope.planning.split.runnable import build_stage_module

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32),
                          nn.Unflatten(1, (4, 8)))      # the output: a view
    x = torch.randn(4, 8)
    plan = ls.partition(model, x, stages=2, microbatches=2, schedule="zb", cuts=["2"])
    first = build_stage_module(model, plan, 0, (x[:2],), {})
    with torch.no_grad():
        sent = first(x[:2])
    sent = sent if isinstance(sent, tuple) else (sent,)

    def alive_after_w(own_outputs: bool) -> int:
        last = build_stage_module(model, plan, 1, (x[:2],), {})
        last.own_outputs = own_outputs
        inputs = [t.detach().requires_grad_() for t in sent]
        held = []

        def pack(t):
            h = t.detach()          # the graph node holds this object until it frees it
            held.append(weakref.ref(h))
            return h

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda h: h):
            out = last(*inputs)
        assert out._is_view() is not own_outputs
        loss = out.pow(2).sum()
        _, groups = bw.stage_backward_input([loss], None, inputs, last.parameters())
        if not out._is_view():      # torch's backward_one_chunk on the last stage
            out.detach_()
        bw.stage_backward_weight(last.parameters(), groups)
        del loss, groups
        gc.collect()
        n = sum(r() is not None for r in held)
        del out                     # the end of the step: the kept output goes
        return n

    assert alive_after_w(own_outputs=False) > 0     # torch's default with a view: GELU's inputs pinned
    assert alive_after_w(own_outputs=True) == 0


def test_a_run_past_its_timeout_leaves_no_process_behind(tmp_path):
    # torchrun's workers run in torchrun's session: past the timeout the whole session is killed (killing
    # torchrun alone left two ranks hung on a collective, running, after the launcher had given up)
    import os
    import subprocess
    import sys
    import time

    from layerscope.planning.real.procs import run_torchrun
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    parent = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"
    with pytest.raises(subprocess.TimeoutExpired):
        run_torchrun([sys.executable, "-c", parent], timeout=3, env=dict(os.environ))
    pid = int(pid_file.read_text())
    for _ in range(50):            # SIGKILL is delivered at once; the zombie goes when init reaps it
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    break
        except (ProcessLookupError, FileNotFoundError):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the grandchild {pid} outlived the timeout")
