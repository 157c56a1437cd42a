"""The ways torch.distributed.pipelining's schedules run, as the schedule table gives them to each entry
(``config.SCHEDULES``): how a rank orders its actions (``PipelineSchedule.order``) and how many
micro-batches a stage holds at once (``PipelineSchedule.held``). A function here is one behaviour,
named for what it does; the table says which schedule follows which, so the step-time model, the
stage memory and the simulated ranks never test a schedule's name.

An action is (stage, kind, micro-batch): kind "F" forward, "B" full backward, "I" the backward for the
stage's input only, "W" the backward for its weights (zero bubble splits each backward in I and W).
Every function takes the schedule's entry first (``kind``), then the stages, the micro-batches and the
stages per rank asked for (``kind.per_rank`` says what the schedule makes of it).
"""

from __future__ import annotations

import functools
import math

__all__ = ["forwards_then_backwards", "warmup_then_alternate", "torch_rank_order", "all_held", "warmup_held",
           "spread_warmup_held", "held_to_weight", "weight_counts"]


# --- how a rank orders its actions: per rank, its (stage, kind, micro-batch) actions in order ---------

def forwards_then_backwards(kind, stages: int, microbatches: int, stages_per_rank: int) -> list[list[tuple]]:
    """One stage per rank: all M forwards, then all M backwards (torch's ScheduleGPipe)."""
    m = microbatches
    return [[(s, "F", i) for i in range(m)] + [(s, "B", i) for i in range(m)] for s in range(stages)]


def warmup_then_alternate(kind, stages: int, microbatches: int, stages_per_rank: int) -> list[list[tuple]]:
    """One stage per rank: stage s runs W = min(M, K - s) warm-up forwards, then alternates one backward
    and one forward ("1B1F") until the forwards are done, then the remaining backwards (Schedule1F1B)."""
    k, m = stages, microbatches
    out = []
    for s in range(k):
        w = min(m, k - s)
        acts = [(s, "F", i) for i in range(w)]
        for j in range(m):
            acts.append((s, "B", j))
            if w + j < m:
                acts.append((s, "F", w + j))
        out.append(acts)
    return out


def torch_rank_order(kind, stages: int, microbatches: int, stages_per_rank: int) -> list[list[tuple]]:
    """Several stages per rank, in torch's own per-rank order (``kind.rank_order``: the order builder the
    entry's ``rank_ops`` names; torch's runtime schedules)."""
    v = kind.per_rank(stages_per_rank)
    p = stages // v
    return [list(kind.rank_order(r, v, p, microbatches)) for r in range(p)]


# --- how many micro-batches a stage holds at once (between a forward and the backward that frees it) ---

def all_held(kind, stages: int, microbatches: int, stage: int, stages_per_rank: int) -> int:
    """Every micro-batch: all the forwards run before the first backward."""
    return microbatches


def warmup_held(kind, stages: int, microbatches: int, stage: int, stages_per_rank: int) -> int:
    """The warm-up forwards of stage s: min(K - s, M)."""
    return min(stages - stage, microbatches)


def spread_warmup_held(kind, stages: int, microbatches: int, stage: int, stages_per_rank: int) -> int:
    """With v stages on each of p ranks, on rank r: min(M, ceil(((p - r - 1)·2 + (v - 1)·p + 1) / v)) per
    stage (Megatron's warm-up count of the interleaved schedule spread over the rank's stages)."""
    v = stages_per_rank
    p = stages // v
    r = stage % p
    return min(microbatches, math.ceil(((p - r - 1) * 2 + (v - 1) * p + 1) / v))


def held_to_weight(kind, stages: int, microbatches: int, stage: int, stages_per_rank: int) -> int:
    """The most micro-batches between their forward and their W at once, in the schedule's order (zero
    bubble: the weights' gradients need what the forward saved)."""
    return weight_counts(kind, stages, microbatches, stages_per_rank)[0][stage]


@functools.lru_cache(maxsize=64)
def weight_counts(kind, stages: int, microbatches: int, stages_per_rank: int):
    """Per stage, the most micro-batches at once between their forward and their W, and between their I
    and their W (the output gradients kept for the W: ``Unit.deferred_bytes``), in ``kind``'s order."""
    held, pending = [0] * stages, [0] * stages
    for order in kind.order(kind, stages, microbatches, stages_per_rank):
        live, wait = [0] * stages, [0] * stages
        for stage, what, _ in order:
            live[stage] += 1 if what == "F" else -1 if what == "W" else 0
            wait[stage] += 1 if what == "I" else -1 if what == "W" else 0
            held[stage] = max(held[stage], live[stage])
            pending[stage] = max(pending[stage], wait[stage])
    return tuple(held), tuple(pending)
