"""What a pipeline stage holds, per the schedule that runs it: the memory model the split honours.

Memory of stage s over units [x, y), per the schedule:

    state (params + grads + optimizer state, tied weights once per stage)
    + in flight: the most that is held during the backward of any micro-batch j = 0 .. M-1, of
        a = one micro-batch's saved activations, less what the stage's first unit saves of its own
            inputs (those are the receive buffers) and what its last unit saves of its output (that
            is o); on the last stage plus what the loss saves
        o = one micro-batch's output, kept for its backward
        g = one micro-batch's input gradient (s > 0), kept while the schedule waits on its send
      counted as torch.distributed.pipelining's schedules keep them (``flight_counts``). GPipe:
      (M - j) × a, the outputs of all M (the forward sends are never dropped; M - j on the last
      stage) and j × g. 1F1B, W = held(s) = min(K - s, M) warm-up forwards: (min(W + j, M) - j) ×
      (a + o), one g (j >= 1), and with W >= 2 one more o while the warm-up's send work holds it.
      At j = 0 the gradients appear as that micro-batch is freed: min(freed, gradients) less.
    + boundary buffers: M received inputs (s > 0) and M received output gradients (s < K - 1),
      which is how torch.distributed.pipelining allocates its receive buffers (one per micro-batch);
      none across a boundary between two stages on one rank (zbv's V; ``local_neighbours``)
    + working memory: the largest transient of one unit's forward or backward (a range maximum),
      and on the last stage at least the loss's forward and backward working memory
    + what the caller of ``schedule.step()`` keeps (``SplitUnits.kept_outputs``, ``input_batch_bytes``,
      ``target_bytes``): with ``return_outputs=True`` (torch's default) the last stage keeps the output
      of every micro-batch whose backward is done (detached, its data alive until the next step) and
      at the end of the step returns them concatenated: j more outputs at backward j, 2·M outputs at
      the end; the whole batch's inputs on the first stage and its targets on the last

held(s): GPipe keeps all M micro-batches; 1F1B keeps min(K - s, M); interleaved 1F1B with v stages per
rank keeps, on rank r of p, min(M, ceil(((p - r - 1)·2 + (v - 1)·p + 1) / v)) per stage (Megatron's
warm-up count spread over the rank's stages); zero bubble (zb, zbv) keeps a micro-batch from its
forward to its W (the weights' gradients need what the forward saved), the most at once in torch's
order. The runtime schedules (interleaved, zb, zbv) keep every send's work to the end of the step.
"""

from __future__ import annotations

import torch

from ..config import schedule_of
from ..orders import weight_counts
from ..steptime.schedule import stage_ranks
from .units import SplitUnits

__all__ = ["held_microbatches", "zb_pending", "local_neighbours", "multi_stage", "stage_memory", "stage_total",
           "rank_memory", "flight_counts", "in_flight"]


def held_microbatches(schedule: str, stages: int, microbatches: int, stage: int,
                      stages_per_rank: int = 2) -> int:
    """The micro-batches ``stage`` holds at once under ``schedule`` (the entry's ``held``)."""
    kind = schedule_of(schedule)
    return kind.held(kind, stages, microbatches, stage, stages_per_rank)


def zb_pending(schedule: str, stages: int, microbatches: int, stage: int, stages_per_rank: int = 2) -> int:
    """Zero bubble: the most micro-batches of ``stage`` between their I and their W at once (0 on
    the first stage, whose I torch skips: its W runs the whole backward; 0 for other schedules)."""
    kind = schedule_of(schedule)
    if not kind.zero_bubble or stage == 0:
        return 0
    return weight_counts(kind, stages, microbatches, stages_per_rank)[1][stage]


def local_neighbours(schedule: str, stages: int, stage: int, stages_per_rank: int = 2) -> tuple[bool, bool]:
    """Whether the stage before and the one after ``stage`` run on its own rank (zbv's V, or a
    runtime schedule on one rank). torch passes tensors between such stages directly: the receiving
    stage's buffer becomes the sender's output (or input gradient), already counted on the sender,
    so neither side holds receive buffers for that boundary."""
    if not multi_stage(schedule):
        return False, False
    ranks = stage_ranks(schedule, stages, stages_per_rank)
    return (stage > 0 and ranks[stage - 1] == ranks[stage],
            stage < stages - 1 and ranks[stage + 1] == ranks[stage])


def multi_stage(schedule: str) -> bool:
    """Whether the schedule puts several stages on each rank (torch's runtime schedules)."""
    return schedule_of(schedule).multi


def stage_memory(units: SplitUnits, x: int, y: int, stage: int, stages: int, schedule: str,
                 microbatches: int, stages_per_rank: int = 2) -> dict:
    """Breakdown of one stage's memory (bytes): state, activations, boundary, total."""
    us = units.units[x:y]
    held = held_microbatches(schedule, stages, microbatches, stage, stages_per_rank)
    pending = zb_pending(schedule, stages, microbatches, stage, stages_per_rank)
    dup = 0
    for tie in units.ties:
        c = sum(1 for i in tie.units if x <= i < y)
        dup += max(c - 1, 0) * tie.state_bytes
    params = sum(u.param_bytes for u in us)
    grads = sum(u.grad_bytes for u in us)
    opt = sum(u.optimizer_bytes for u in us)
    last = stage == stages - 1
    loss_saved = units.loss_saved_bytes if last else 0
    recv = min(us[0].received_saved_bytes, us[0].input_bytes) if stage > 0 else 0
    a = sum(u.saved_bytes for u in us) - recv - min(us[-1].output_saved_bytes, us[-1].output_bytes) \
        + loss_saved
    o = us[-1].output_bytes
    parts = _in_flight_parts(a, o, grads, us[0].input_bytes, held, microbatches, schedule, stage == 0,
                             last, kept=units.kept_outputs)
    local = local_neighbours(schedule, stages, stage, stages_per_rank)
    boundary = (microbatches * us[0].input_bytes if stage > 0 and not local[0] else 0) + \
        (microbatches * us[-1].output_bytes if not last and not local[1] else 0)
    work = max(u.work_bytes for u in us)
    if last:
        work = max(work, units.loss_bytes)
    state = params + grads + opt - dup
    dup, state = int(dup), int(state)
    flight = parts["activations"] + parts["outputs"] + parts["grad_overlap"] + parts["sends"] + \
        parts["kept_outputs"]
    inputs = units.input_batch_bytes if stage == 0 else 0
    targets = units.target_bytes if last else 0
    # the step's own keys only where the plan counts them (a plan without them reads as before)
    if not units.kept_outputs:
        del parts["kept_outputs"]
    step = {"inputs": inputs, "targets": targets} if units.input_batch_bytes or units.target_bytes else {}
    ws = {"workspace": units.workspace_bytes} if units.workspace_bytes else {}
    # zero bubble: the output gradients each I keeps for its W, for the micro-batches between them
    deferred = pending * sum(u.deferred_bytes for u in us)
    zb = {"deferred": deferred, "pending_microbatches": pending} if schedule_of(schedule).zero_bubble else {}
    return {"params": params, "grads": grads, "optimizer": opt, "tied_dedup": dup, "state": state,
            "held_microbatches": held, **parts, **zb, "boundary": boundary, "working": work, **step, **ws,
            "total": state + flight + deferred + boundary + work + inputs + targets + units.workspace_bytes}


def stage_total(units, x, y, s, stages, schedule, microbatches, stages_per_rank) -> float:
    return float(stage_memory(units, x, y, s, stages, schedule, microbatches, stages_per_rank)["total"])


def _stage_sizes(units: SplitUnits, x: int, y: int, stage: int, stages: int) -> tuple[int, int, int, int, int]:
    """(a, o, grads, inb, deferred) of the stage over units [x, y): per micro-batch activations (as
    in ``stage_memory``), output and input-gradient bytes, its gradients, and what zero bubble's I
    keeps for the W per micro-batch (none on the first stage)."""
    us = units.units[x:y]
    last = stage == stages - 1
    recv = min(us[0].received_saved_bytes, us[0].input_bytes) if stage > 0 else 0
    a = sum(u.saved_bytes for u in us) - recv - min(us[-1].output_saved_bytes, us[-1].output_bytes) \
        + (units.loss_saved_bytes if last else 0)
    return a, us[-1].output_bytes, sum(u.grad_bytes for u in us), us[0].input_bytes, \
        (sum(u.deferred_bytes for u in us) if stage > 0 else 0)


def rank_memory(units: SplitUnits, plan_stages, num_stages: int, order, microbatches: int) -> int:
    """Memory of one rank holding several stages (interleaved 1F1B), from the order its schedule
    runs them: ``order`` is the rank's (stage index, "F", "B", "I" or "W") actions, as torch's
    runtime schedules list them (``pipeline_order[rank]``; zero bubble's W frees a micro-batch as a
    full backward does, its I frees nothing). The stages' state, boundary
    buffers, inputs and targets add up, working memory is the largest one's; what is in flight is
    counted after every forward, during every backward and at the end of the step, with each
    stage's counts so far (the runtime schedule keeps every send's work to the end: all outputs
    and input gradients sent so far; with kept outputs the last stage holds those of its finished
    backwards, and at the end their concatenation too, when no action's working memory is held); a
    stage's gradients exist from its first backward on. Summing each stage's own peak instead
    over-counts: they peak at different times."""
    m, last_index = microbatches, num_stages - 1
    info = {st.index: _stage_sizes(units, st.first, st.last + 1, st.index, num_stages) for st in plan_stages}
    const = sum(st.memory["state"] + st.memory["boundary"] + st.memory.get("inputs", 0)
                + st.memory.get("targets", 0) for st in plan_stages) + units.workspace_bytes   # one process
    work = max(st.memory["working"] for st in plan_stages)
    f = {t: 0 for t in info}
    b = dict(f)
    i = dict(f)         # zero bubble: I done (its W frees the micro-batch and what the I kept)

    def flight(doing: int | None) -> int:
        v = 0
        for t, (a, o, grads, inb, kept_for_w) in info.items():
            first, last = t == 0, t == last_index
            acts = f[t] - b[t]
            waiting = max(i[t] - b[t], 0) if not first else 0
            after_i = max(a - units.loss_saved_bytes, 0)     # the last stage's micro-batch after its I
            if last and waiting:
                # zero bubble's I on the last stage detaches the loss (and the output, when the step
                # does not keep it): what only they held goes, the loss's saved tensors with it; the
                # weight ops' saved inputs stay for the W (their nodes are held until it)
                acts -= waiting
                v += waiting * (after_i + (o if units.kept_outputs else 0))
            v += acts * a + (acts if last else f[t]) * o + (0 if first else b[t]) * inb
            v += waiting * kept_for_w
            if last and units.kept_outputs:
                v += b[t] * o
            if b[t] == 0:
                if t == doing:     # its gradients appear as this backward frees its micro-batch
                    freed = after_i + kept_for_w if last and waiting else \
                        a if (not last or units.kept_outputs) else a + o
                    v -= min(freed, grads)
                else:
                    v -= grads     # no backward yet: no gradients
        return v

    best = 0
    for t, kind in order:
        if t not in f:
            continue
        if kind in ("F", "I"):     # zero bubble's I: the micro-batch stays until its W
            best = max(best, flight(None))
            f[t] += kind == "F"
            i[t] += kind == "I"
            best = max(best, flight(None))
        else:
            best = max(best, flight(t))
            b[t] += 1
    # the end of the step: every action done (no working memory), the kept outputs concatenated
    merged = m * info[last_index][1] if last_index in info and units.kept_outputs else 0
    return int(const + max(best + work, flight(None) + merged))


def flight_counts(schedule: str, held: int, m: int, first: bool, last: bool) -> list[tuple[int, int, int]]:
    """For the backward of each micro-batch j = 0 .. M-1 on a stage: how many micro-batches'
    activations, outputs and input gradients are alive, as torch.distributed.pipelining's schedules
    keep them (a tensor handed to a send stays alive while the schedule holds the send's work or op
    list). The first entry is j = 0, when the gradients appear.

    GPipe: all M forwards run first; backward j holds M - j micro-batches' activations, and the
    outputs of all M on a stage that sends them (the forward sends' works are kept to the end), and j
    input gradients (the backward sends are waited on after the last backward).
    1F1B with W = held warm-up forwards: backward j comes after min(W + j, M) forwards, so
    min(W + j, M) - j micro-batches are in flight; the input gradient of backward j - 1 is still
    held (its op list is replaced after backward j); and with W >= 2 the warm-up's send work keeps
    the output of micro-batch W - 2 alive until the steady phase ends (backward M - W).
    Interleaved (torch's ScheduleInterleaved1F1B, a runtime schedule): ``held`` warm-up forwards
    from its own count; every send's work is kept until the step ends, so a stage that sends its
    outputs holds all it has sent (min(W + j, M) at backward j) and the j input gradients sent
    before backward j."""
    keeps_sends = schedule_of(schedule).keeps_sends
    out = []
    for j in range(m):
        acts = min(held + j, m) - j
        if keeps_sends:
            outs = acts if last else acts + j
            sends = j
        else:
            stale = not last and held >= 2 and held - 2 < j <= m - held
            outs = acts + stale
            sends = min(j, 1)
        out.append((acts, outs, 0 if first else sends))
    return out


def in_flight(a, o, grads, inb, held: int, m: int, schedule: str, first: bool, last: bool,
              kept: bool = False):
    """Bytes a stage holds for micro-batches in flight at its peak: the largest over its backwards
    (``flight_counts``) of ``a`` activations and ``o`` output per micro-batch and ``inb`` bytes per
    input gradient waiting to be sent; during the first backward the gradients appear as that
    micro-batch's activations (and its output, when nothing else holds it) are freed, so that
    backward counts min(freed, gradients) less. ``kept`` (step(return_outputs=True)): the last stage
    also holds the outputs it keeps to return (``_candidates``). On the solver's tensor grids."""
    best = None
    for j, acts, outs, sends, nkept, freed in _candidates(a, o, held, m, schedule, first, last, kept):
        v = acts * a + outs * o + sends * inb + nkept * o
        if freed is not None:
            v = v - torch.minimum(freed, grads)
        best = v if best is None else torch.maximum(best, v)
    return best


def _candidates(a, o, held, m, schedule, first, last, kept: bool = False):
    """(j, activations, outputs, input gradients, kept outputs, what backward 0 frees or None) for
    the backwards that can be the peak: counts are non-negative multipliers of non-negative sizes, so
    a backward whose counts are all at most another's (j = 0 included: it also subtracts) cannot be;
    under GPipe the counts are linear in j >= 1, so the peak is at j = 0, 1 or M - 1.
    With ``kept`` on the last stage, backward j also holds the j outputs of the micro-batches whose
    backward is done (the stage keeps them to return), and j = M is the end of the step: those M
    outputs and their concatenation (M more), with the input gradients still held (the last one
    under 1F1B, all M under GPipe and interleaved). Interleaved has that end too (every sent output
    and input gradient is held until it)."""
    keeps = kept and last
    kind = schedule_of(schedule)
    counts = [(*c, j if keeps else 0) for j, c in enumerate(flight_counts(schedule, held, m, first, last))]
    # every micro-batch held and every send kept: the counts are linear in j >= 1 (M - j activations, j
    # input gradients, the outputs constant), so the peak is at j = 0, 1 or M - 1
    js = sorted({0, min(1, m - 1), m - 1}) if kind.keeps_sends and held >= m else list(range(m))
    if keeps or kind.multi:
        end_sends = (0 if first else m) if kind.keeps_sends else counts[-1][2]
        counts.append((0, m if kind.multi and not last else 0, end_sends, 2 * m if keeps else 0))
        js.append(m)

    def covered(j: int, i: int) -> bool:   # backward i holds at least what backward j does
        ci, cj = counts[i], counts[j]
        return all(x <= y for x, y in zip(cj, ci)) and (cj != ci or i < j or j == 0)

    keep = [j for j in js if not any(covered(j, i) for i in js if i not in (0, j))]
    # micro-batch 0's output outlives its backward when a pending forward send holds it
    # (the kept output is micro-batch 0's on the last stage, when the step keeps it to return)
    kept_out = keeps or (not last and (kind.keeps_sends or held == 2))
    for j in keep:
        yield (j, *counts[j], (a if kept_out else a + o) if j == 0 else None)


def _in_flight_parts(a: int, o: int, grads: int, inb: int, held, m, schedule, first, last,
                     kept: bool = False) -> dict:
    """``in_flight`` on numbers, with the parts of the backward where it peaks (``peak_backward``
    M: the end of the step, with kept outputs)."""
    best = None
    for j, acts, outs, sends, nkept, freed in _candidates(a, o, held, m, schedule, first, last, kept):
        overlap = -min(freed, grads) if freed is not None else 0
        parts = {"peak_backward": j, "activations": acts * a, "outputs": outs * o,
                 "grad_overlap": overlap, "sends": sends * inb, "kept_outputs": nkept * o}
        v = acts * a + outs * o + sends * inb + nkept * o + overlap
        if best is None or v > best[0]:
            best = (v, parts)
    return best[1]
