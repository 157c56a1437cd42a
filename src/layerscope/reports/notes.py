"""Every note a report carries, worded in one place: a table from a note's code to the function that
words its data (``WORDING``). Producers below (capture, analyses, planning, api) return
``capture.notes.Note`` records; a report keeps them and gives users the sentences (``NotesField``).

A code's wording is plain text from its data and never changes the data (``Note.data`` is read-only).
The simulation's codes are worded by capture/simulation.py's ``word_note``, which capture's own error
text uses too (capture cannot import this layer); the table names it, so every code is still found here.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from ..capture.notes import Note
from ..capture.simulation import word_note

__all__ = ["Note", "WORDING", "word", "worded", "NotesField"]


def _times(n: int) -> str:
    return f"{n:,} time{'' if n == 1 else 's'}"


def _simulation(d: Mapping[str, Any]) -> str:
    return word_note(Note("simulation-" + d["kind"], d))


def _loss_chosen(d: Mapping[str, Any]) -> str:
    """Which loss the step ran (capture/loss.py ``StepLoss.describe``)."""
    used, kind, asked = d["used"], d["kind"], d["asked"]
    parts = []
    if "model" in used:
        parts.append("the model's own (its forward given labels, a copy of the token ids, as a training loop "
                     "passes them)" if d["labels"] else "the model's own (the labels given to its forward)")
    if "stage" in used:
        parts.append("on the last pipeline stage, per micro-batch, the next-token cross-entropy of the logits "
                     "in fp32 (labels: the token ids shifted by one)" + (
                         ", the model's own loss as torchtitan's pipeline takes it: a stage takes no labels"
                         if kind == "model" else ""))
    if "cross-entropy" in used:
        parts.append("the next-token cross-entropy of the logits in fp32 (labels: the token ids shifted by "
                     "one), as transformers' causal-LM loss and torchtitan's train step take it")
    if "sum" in used:
        why = " (the output's own .loss where labels were given)" if asked == "sum" else \
            " (" + ("no language-model logits over the token ids in the output" if d["fallback"]
                    else "no token ids in the inputs" if not d["ids"] else
                    "no language-model loss to take") + ")"
        parts.append("the sum of the output" + why)
    said = "" if asked == "auto" else f" (loss={asked!r})"
    return "loss" + said + ": " + "; ".join(parts) + \
        ("" if asked != "auto" else "; loss= / --loss chooses another (model, cross-entropy, sum)")


def _loss_given(d: Mapping[str, Any]) -> str:
    return "loss: the given loss_fn" + (f" ({d['doc']})" if d["doc"] else "")


def _attention(d: Mapping[str, Any]) -> str:
    """How an SDPA kernel priced the attention calls (capture/attention.py ``SdpaRouter.notes``)."""
    n, each = d["calls"], d["per_forward"]
    how = "as forced" if d["forced"] else \
        f"the kernel {d['rules']} CUDA rules pick on the {d['gpu']} (sm {d['capability'][0]}.{d['capability'][1]})"
    line = f"attention: {n:,} SDPA call{'s' if n != 1 else ''}{' per forward' if each else ''} priced as " \
           f"{d['kernel']}, {how}, for {d['example']}"
    return line + (f" (passed over {d['passed_over']})" if d["passed_over"] is not None else "")


def _index_bounds(d: Mapping[str, Any]) -> str:
    n = sum(v for _, v in d["ops"])
    ops = ", ".join(f"{k} ×{v:,}" if v > 1 else k for k, v in d["ops"])
    return (f"index bounds not checked: {n:,} index op call(s) ({ops}) read indices made from values too "
            f"large to carry beside the meta/fake run, with no range known for them; an index out of "
            f"range there fails the real run but not this one")


def _roles(d: Mapping[str, Any]) -> str:
    ranks = ", ".join(str(r) for r in d["roles"])
    if d["pp"] > 1:
        return (f"{len(d['roles'])} roles (the pipeline stages of each of the {d['pp']} pipeline ranks, the "
                "uniform split of the blocks, and within them ranks whose shards differ in size): ranks "
                + ranks + " were simulated")
    if d.get("cp", 1) > 1:
        return (f"{len(d['roles'])} roles (each place in context parallel's ring of {d['cp']}, which sets the "
                "halves of its chunks each ring step attends, and ranks whose shards differ in size): ranks "
                + ranks + " were simulated")
    return (f"{len(d['roles'])} roles (ranks whose shards differ in size, where a dimension does not "
            "divide evenly): ranks " + ranks + " were simulated")


def _context_parallel(d: Mapping[str, Any]) -> str:
    return (f"context parallel {d['cp']}: each sequence of {d['seq']:,} tokens in {2 * d['cp']} chunks, rank r "
            f"holding chunks r and {2 * d['cp'] - 1}-r (torch's head-tail load balancing: {d['seq'] // d['cp']:,} "
            "tokens a rank); attention as torch's ring (torch 2.13's context_parallel, rotation all-gather: "
            "each layer's K and V gathered whole, forward and backward, and the K/V gradients passed round in "
            "fp32), assuming causal attention with no mask tensor, position ids of the rank's own tokens "
            "(their bytes; the simulation makes none) and labels sharded as the ids; the ring's collectives "
            "are priced on the critical path, with no overlap credited; FSDP shards over fsdp x cp; "
            f"{d['calls']} ring call(s) per forward")


def _offload(d: Mapping[str, Any]) -> str:
    if not d["cuda"]:
        return "CPU offload changes nothing on CPU ranks: the host's memory is their device's"
    return (f"CPU offload: the sharded parameters, their reduced gradients and the optimizer's step and "
            f"state live in the host's memory, {d['host_bytes']:,} B per rank at most, not in the peak")


def _searched(d: Mapping[str, Any]) -> str:
    """What a search did (api/_search.py)."""
    passes, most = d["passes"], d["max_passes"]
    return (f"searched {d['candidates']} configurations of {d['gpus']} GPUs for a global batch of "
            f"{d['global_batch']} in {d['seconds']:.0f} s: simulated {d['simulated']}, each on copies of the model "
            f"with {d['blocks'][0]} and {d['blocks'][1]} blocks per pipeline stage, every figure extended linearly "
            f"to its blocks"
            + (f" (and {d['for_bounds']} on two blocks for the lower bounds)" if d["for_bounds"] else "")
            + f": {passes:,} pass{'es' if passes != 1 else ''} of a micro-batch through a stage"
            + (f" of the {most:,} the search's limit allows (--search-limit)" if most is not None else "") + "; "
            + ", ".join(f"{n} {k}" for k, n in d["counts"]))


def _one_device(d: Mapping[str, Any]) -> str:
    return ("every degree is 1: one device, no sharding; these are memory()'s figures"
            + (f" with the blocks checkpointed ({d['ac']})" if d["ac"] != "none" else "")
            + (" (mixed precision bf16 as autocast over fp32 weights)" if d["bf16"] else ""))


def _ep_routing(d: Mapping[str, Any]) -> str:
    how = ("even: every expert receives the same number of a rank's top-k choices (within one)" if d["skew"] == 1
           else f"skew:{d['skew']:g}: the hottest expert receives {d['skew']:g} times its even share of every "
                "rank's top-k choices (capped at one per token), the other experts the rest evenly")
    return (f"expert parallel (ep {d['ep']}): the router's choices depend on the data; the tokens dispatched "
            f"with all-to-all follow the routing assumption, {how}. The rank simulated holds the hottest expert "
            "and receives the most tokens: its figures (the worst rank's) stand for every rank; --run measures "
            "the real routing")


WORDING: dict[str, Callable[[Mapping[str, Any]], str]] = {
    # what a simulation made up (capture/simulation.py SimulationLog.records; its kinds)
    **{f"simulation-{kind}": _simulation for kind in ("random", "read", "nonzero", "meta", "size")},
    # the step's loss (capture/loss.py)
    "loss-chosen": _loss_chosen,
    "loss-given": _loss_given,
    # values a run without them had to assume (capture/known.py)
    "known-assumed-spread": lambda d: (
        f"{d['count']} choice(s) made from scores without values (an MoE router's top-k or "
        "argmax, on meta/fake tensors) were assumed to spread evenly over the options: every "
        "expert gets the same number of tokens (within one), so none is over its capacity"),
    "known-cast-ones": lambda d: (
        f"{d['count']} integer tensor(s) cast from floats without values (durations or "
        "counts the model predicts, on meta/fake tensors) were read as all ones"),
    "known-index-bounds": _index_bounds,
    # how attention was priced (capture/attention.py)
    "attention-kernel": _attention,
    "attention-math-on-meta": lambda d: (
        f"attention: {d['calls']:,} SDPA call{'s' if d['calls'] != 1 else ''} priced as the math kernel, which a "
        f"meta run runs; gpu='H100' (--gpu) prices the kernel torch would pick on that GPU (flash, "
        f"memory-efficient, cuDNN), attention= forces one"),
    # where a memory step ran and what its tracker could not follow (analyses/memory_step.py)
    "memory-meta-as-cpu": lambda d: "simulated as a CPU step (autocast follows CPU rules)",
    "memory-no-cuda": lambda d: (
        "no CUDA here: simulated with fake CPU tensors and CUDA's 512-byte allocation "
        "blocks; autocast follows CPU rules, and the optimizer's foreach default is CUDA's; "
        "cuBLAS's two workspaces are counted, scratch that other CUDA kernels (cuDNN convolution "
        "and RNN, attention) allocate inside themselves is not"),
    "memory-cuda-workspaces": lambda d: (
        "cuBLAS's two workspaces are counted, scratch that other CUDA kernels (cuDNN, attention) "
        "allocate inside themselves is not; measure=True shows the allocator's peak beside the prediction"),
    "memory-untracked": lambda d: (
        f"{d['count']} tensors without a plain storage (sparse, nested) were not tracked"),
    # a simulated world (api/_parallel.py)
    # expert parallel's routing assumption (planning/expert_parallel.py)
    "ep-routing": _ep_routing,
    "ep-routing-unused": lambda d: (
        f"routing {d['routing']}: without expert parallel no figure depends on the routing (transformers' "
        "grouped_mm experts compute every token's choices in one grouped matmul, whatever experts they pick)"),
    "world-one-role": lambda d: (
        f"every rank holds the same shard sizes: rank 0 was simulated for all {d['world']}"),
    "world-roles": _roles,
    "world-context-parallel": _context_parallel,
    "world-no-gpu-named": lambda d: (
        f"no GPU named: attention is priced with the {d['gpu']}'s rules and there is no "
        "memory limit to fit (give gpu= / --gpu, or memory_limit=)"),
    "world-cuda-allocator": lambda d: (
        "the CUDA caching allocator's fragmentation is not estimated (its 512-byte rounding is "
        "simulated); NCCL's buffers are an estimate, on a line of its own"),
    "world-offload": _offload,
    "world-tp-plan": lambda d: f"tensor parallel: the plan {d['plan']}",
    "world-gloo-late": lambda d: (
        f"gloo's reduce-scatter all-reduces a clone of its input that its worker thread may free "
        f"after the step has gone on: up to {d['bytes']:,} B more, an estimate on a line of its own"),
    "world-uncounted-ops": lambda d: (
        f"step time: {d['ops']} op(s) of a rank's step have no cost formula and are priced at "
        f"one kernel launch ({d['launch_us']:g} us) each"),
    "world-one-device": _one_device,
    # a rank composed from five of its blocks, or simulated whole (planning/simulate/composed_rank.py)
    "world-composed": lambda d: (
        f"rank {d['rank']} was composed from {d['ran']} of its {d['blocks']} identical blocks (equal to its whole "
        "simulation: the middle blocks left the same record)"),
    "world-composed-refused": lambda d: (
        f"rank {d['rank']} was simulated whole, not composed from its blocks: {d['why']}"),
    # what a search did and chose (api/_search.py)
    "search-searched": _searched,
    "search-composed": lambda d: (
        f"candidates simulated: {d['composed']} composed from five blocks of the whole model (equal to "
        f"its whole simulation), {d['copies']} on copies of fewer blocks extended linearly (pipelines, and where "
        f"the composition refused), {d['whole']} simulated whole"),
    "search-none-fits": lambda d: "NO configuration fits: the plan shown is the nearest miss",
    "search-chosen": lambda d: (
        f"chosen: {d['label']}; simulate it whole with: layerscope parallel ... --gpus {d['gpus']} {d['command']}"),
    # what max_batch_size's answer rests on (api/_batch.py)
    "batch-not-checked": lambda d: (
        f"the simulation's answer, not checked by a real step: {d['why']}; scratch that "
        "kernels allocate inside themselves (oneDNN convolution workspace) is not in the "
        "simulation, so the largest batch that really fits may be smaller"),
    "batch-not-run": lambda d: (
        f"{d['why']}, so it was not run"
        + (f"; {d['more']} more batches below it were not run either" if d["more"] > 0 else "")
        + ", and the answer may be smaller than the largest batch that fits"),
    # what a split assumed (planning/split/planner.py)
    "split-stage-share": lambda d: (
        f"{d['schedule']}: each stage is held to 1/{d['stages_per_rank']} of the device's memory limit "
        f"(a rank holds {d['stages_per_rank']} stages; sufficient, not necessary: the rank's own "
        "peak is in Rank memory)"),
    "split-zero-bubble": lambda d: (
        "zero bubble: each unit's backward is split into the input's gradient (I) and the "
        "weights' (W) " + ("as measured (below)" if d["measured"] else
                           "by FLOPs (a weight gradient costs the forward FLOPs of the ops "
                           "that read the weight)")
        + "; the first stage's whole backward is W, as torch runs it"),
    "split-descent": lambda d: (
        "step time: the best split a descent from the min-max splits found (too many splits to simulate every one)"),
    "split-sends-unpriced": lambda d: "step time: sends across cuts not priced (give link_bandwidth, bytes/s)",
    "split-optimizer-unpriced": lambda d: (
        "step time: the optimizer step not priced (give optimizer_bandwidth, bytes/s)"),
    # what a Profiler's report rests on (profiler.py)
    "profiler-warmup-included": lambda d: (
        f"only {d['recorded']} step(s) recorded: the {d['skip']} warm-up step(s) are included"),
    "profiler-counting-in-forward": lambda d: (
        "the forward times include the counting of every op's FLOPs for DeepSpeed's getters (a "
        "dispatch mode on each op, tens of microseconds each); Profiler(..., costs=False) times "
        "the forwards without it"),
    "profiler-no-costs": lambda d: (
        f"no costs (FLOPs, bytes): the analysis of the first step's inputs failed: {d['error']}"),
    # what a partition's plan was made from (api/_partition.py)
    "partition-from-report": lambda d: (
        "planned from a Report: activations and optimizer state are not counted "
        "(pass the model, or a MemoryReport, for memory-aware plans)"),
    "partition-working-measured": lambda d: (
        f"working memory: the larger of simulated and measured on {d['device']}"),
    "partition-weight-shares": lambda d: (
        "zero bubble: each unit's weights' share of its backward (W) measured: its backward "
        "timed again with the parameters frozen, the input gradients (I) alone"),
    "partition-roofline": lambda d: (
        f"times predicted by a roofline ({d['name']}): {d['peak_flops'] / 1e12:.3g} TFLOP/s, "
        f"{d['peak_bandwidth'] / 1e9:.3g} GB/s ({d['source']})"),
}


def word(note: Note | str) -> str:
    """A note in words (a string, from a producer not yet turned into records, as it is)."""
    if isinstance(note, str):
        return note
    return WORDING[note.code](note.data)


def worded(notes: Iterable[Note | str]) -> tuple[str, ...]:
    return tuple(word(n) for n in notes)


class NotesField:
    """A report's ``notes``: kept as given (records, or strings), read as sentences."""

    @property
    def notes(self) -> tuple[str, ...]:
        return worded(self._notes)

    @notes.setter
    def notes(self, notes: Iterable[Note | str]) -> None:
        self._notes = tuple(notes)

    def add_notes(self, *notes: Note | str) -> None:
        """More notes after the report is built (the entry point's own, e.g. the loss a search's steps took)."""
        self._notes = (*self._notes, *notes)

    @property
    def note_items(self) -> tuple[Note | str, ...]:
        """The notes as given: records, and the sentences of producers that give text."""
        return self._notes

    @property
    def note_records(self) -> tuple[Note, ...]:
        """The notes that are records (code and data), for a caller that reads them as data."""
        return tuple(n for n in self._notes if isinstance(n, Note))
