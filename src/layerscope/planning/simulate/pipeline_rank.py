"""One rank of a pipeline-parallel configuration (``pp`` > 1, alone or mixed with FSDP2 and TP),
simulated with torch's own code on fake tensors, as planning/simulate/sharded_rank.py does for one stage;
``layerscope.parallel`` runs it for each stage's first rank.

Checked against the CPU allocator (tests/planning/sharded/test_against_allocator.py, docs/benchmarks.md): the
same rank's stage run by torch's ``PipelineStage`` and schedule on the fake backend
(``real.measure_stage_rank``), a shrunk transformers Llama, GPipe and 1F1B, with FSDP, TP, autocast
and full checkpointing, and interleaved 1F1B: within -0.64% .. +0.41% over 30 stage ranks; on an H100 against
``torch.cuda.max_memory_allocated``, 16 stage ranks of a 0.16B Llama and a 0.15B GPT-2 within -1.99% ..
-0.32% (the caching allocator's blocks larger than the requests; docs/benchmarks.md); under torchrun
(gloo), every rank of 36 PP, FSDP x PP and TP x PP runs within 1.2% of the predicted band. The
recording forward runs under a simulated recorder that knows the micro-batch's values (transformers'
mask checks read them); a stage keeps each micro-batch's output until its backward, the last stage's
beside its loss, as torch's forward cache does.

The stages. The cuts are the uniform split of the model's repeated blocks (``apply.find_blocks``)
into ``pp`` contiguous groups, the first stages taking one more block where ``pp`` does not divide
their number (torchtitan's even split of the layers); the first stage also owns every module with
parameters registered before the block list (the embeddings), the last stage every one registered
after it (the final norm and the head) and the loss. Registration order stands for execution order,
as in transformers' models. (The cost-balanced ``pipeline.partition()`` split is not used: it needs
a captured trace of the whole model, the uniform split none.) A stage is a module-ownership stage
(planning/split/runnable.py ``build_stage_module``): the model's own forward, every module another stage
owns replaced by a stub; the stubs' zeros of the recorded shapes are simulated like any tensor.

The rank. Mesh ``[pp, dp_replicate, dp_shard, tp]``: the ranks on one ``pp`` coordinate own the same
stage. Its stage module is parallelized with ``apply.parallelize`` on the mesh without its ``pp``
dimension (a configuration whose ``pp`` is 1), materialised as fake tensors, then trained ``steps``
steps: each step runs the rank's actions of the schedule (``pipeline.schedule.rank_orders``: GPipe all
forwards then all backwards; 1F1B ``P - s`` warm-up forwards on stage s; interleaved 1F1B, where the
rank holds ``stages_per_rank`` stages of the ``pp x stages_per_rank`` (stage s on rank s % pp, each its
own module, parallelized on its own), torch's own order of (stage, micro-batch) actions), what torch's
``PipelineStage`` does for each:

* the forward of micro-batch m: on the first stage its slice of the local batch (split along dim 0
  into ``config.microbatches``, as torch's schedule splits it); on the others, the activation
  received into the stage's receive buffer of micro-batch m. Its output (the last stage: its loss,
  ``loss_fn(output)``, or ``loss_fn(output, target_m)`` with ``target``) and autograd graph stay
  alive until the micro-batch's backward;
* the backward: the last stage from its loss, the others from the gradient received into the grad
  receive buffer of micro-batch m (a fake gradient of the stage output's shape). The gradient of
  the received activation, sent back, accumulates on the receive buffer (torch's
  ``stage_backward``) and stays until the next step clears it (``clear_runtime_states``) under GPipe;
  under 1F1B until the next backward has run, as Schedule1F1B's send ops keep it (measured: its last
  stage's peak equal to the allocator's to the byte so, 16 KB over when kept to the step's end); under
  the interleaved schedule, and with TP, it is let go of once sent (torch's
  ``stage_backward`` sets the input's ``.grad`` to None; the gradient lives in the stage's ``bwd_cache``
  until its send: measured, the interleaved stages' peaks equal the allocator's to the byte so, and sat
  (2M - 3) gradients over it when they were kept);
* the last stage's loss of every micro-batch stays until the step ends (the schedule's
  ``_internal_losses``);
* with FSDP2, every backward runs with gradient sync and resharding off, and after the last one
  the gradients accumulated over the micro-batches are reduce-scattered and the parameters
  resharded (torch's ``perform_reduce_grad``); gradients are divided by the number of micro-batches
  (``scale_grads``); then the optimizer step.

The receive buffers (one per micro-batch for the activations, one per micro-batch for the
gradients, made once as torch's stage makes them) and the input gradients sent back are the part
"communication buffers" of the breakdown. What a real run adds and this does not: the P2P
transfers' own buffers of the backend (NCCL's, gloo's), and the last stage's outputs kept by
``step(return_outputs=True)`` (torchtitan steps with ``return_outputs=False``, as here).

Zero bubble (``zb``, ``zbv``): each backward is two actions, I and W, run with torch's own
``stage_backward_input`` and ``stage_backward_weight`` (the first stage's W: ``stage_backward``), what I
keeps (the retained graph, the detached outputs, the parameter groups, the checkpointed blocks' generator
states) held until W; the input's gradient stays on the receive buffer to the next step (with TP on the
DTensor torch wraps the buffer in, let go of at W). Under the V (``zbv``) the two stages on one rank hand
activations and gradients over on it (torch's ``set_local_fwd_input`` / ``set_local_bwd_input``).
torch's runtime schedules (interleaved and zero bubble) all-gather an FSDP stage ahead of its actions,
reshard it after, and reduce each stage's gradients right after its last backward, in the order torch's
own lowering gives (``_compat.runtime_lowered``). Measured on the fake backend: 16 zero-bubble stage ranks
within -0.52% .. +0.08% (docs/benchmarks.md); on an H100, 8 within -2.23% .. -0.21%.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass

import torch
from torch import nn

from ... import _compat
from ...capture.inputs import map_tensors
from ...capture.loss import StepLoss, default_loss
from ...capture.simulation import eager_paths
from ...capture.state import empty_like_on
from ...capture.step import PipelinePass
from ...capture.storage import StorageTracker
from ...errors import InputError
from ..config import ParallelConfig, schedule_of
from ..steptime.schedule import ZERO_BUBBLE, rank_orders, stage_ranks
from ..split.runnable import build_stage_module
from ..split.units import owner_of
from ..apply import (canonical_name, checkpoint_blocks, find_blocks, local_tensor as _local, no_kv_cache, parallelize)
from .sharded_rank import (PIPELINE, RankRun, RankStep, RankTracker, fake_world, meta_copy, param_layouts, prepare_offload, simulation_warnings, train_fake, watch_checkpoint_rng, watch_fsdp)

__all__ = ["stage_blocks", "stage_plan", "stage_ties", "stage_module", "parallelize_stage", "stage_config",
           "split_micro", "simulate_stage_rank", "stage_coords", "rank_stages", "as_module", "model_name",
           "SIMULATED_SCHEDULES"]

# one stage per rank (GPipe, 1F1B) or several (interleaved 1F1B, zero bubble: each backward split in I and W)
SIMULATED_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb", "zbv")


def stage_coords(config: ParallelConfig) -> list[int]:
    """The pp coordinate of each pipeline stage (several stages per rank: stage s on s % pp under interleaved
    and zb, in a V under zbv: rank r holds stages r and 2 pp - 1 - r)."""
    return stage_ranks(config.schedule, config.stages, schedule_of(config.schedule).per_rank(config.stages_per_rank))


def rank_stages(config: ParallelConfig, coord: int) -> list[int]:
    """The pipeline stages of the ranks at pp coordinate ``coord``, in order."""
    return [s for s, c in enumerate(stage_coords(config)) if c == coord]


def as_module(mods: list[nn.Module]) -> nn.Module:
    """A rank's stage modules as one module: its one stage's, or a list of them (trained together)."""
    return mods[0] if len(mods) == 1 else nn.ModuleList(mods)


_STAGE_PREFIX = re.compile(r"^(\d+\.)?model\.")


def model_name(name: str) -> str:
    """A name inside a rank's stage module (or list of them: "0.model.") as in the model the stages cut."""
    return _STAGE_PREFIX.sub("", name)


def stage_blocks(n: int, pp: int) -> list[range]:
    """Block indices per stage: ``n`` blocks in ``pp`` contiguous groups, the first ``n % pp`` one larger."""
    if n < pp:
        raise InputError(f"{pp} pipeline stages need at least {pp} blocks, the model has {n}")
    size, extra = divmod(n, pp)
    out, at = [], 0
    for s in range(pp):
        k = size + (1 if s < extra else 0)
        out.append(range(at, at + k))
        at += k
    return out


@dataclass(frozen=True)
class _Unit:
    index: int
    paths: tuple[str, ...]
    needs_inputs: bool = False


@dataclass(frozen=True)
class _Units:
    units: tuple[_Unit, ...]
    ties: tuple = ()


@dataclass(frozen=True)
class _Stage:
    index: int
    first: int
    last: int
    rank: int


@dataclass(frozen=True)
class _Plan:
    """What build_stage_module reads of a StagePlan."""

    units: _Units
    stages: tuple[_Stage, ...]
    schedule: str

    @property
    def num_stages(self) -> int:
        return len(self.stages)


def _outer_paths(model: nn.Module, list_path: str) -> tuple[list[str], list[str]]:
    """Modules with parameters outside the block list: those registered before it, and after it."""
    before: list[str] = []
    after: list[str] = []
    seen = False

    def walk(mod: nn.Module, prefix: str) -> None:
        nonlocal seen
        if any(True for _ in mod.parameters(recurse=False)):
            raise InputError(f"{prefix.rstrip('.') or type(model).__name__} holds parameters of its own beside the "
                             "block list: the pipeline's uniform split cannot give them to one stage")
        for name, child in mod.named_children():
            p = prefix + name
            if p == list_path:
                seen = True
            elif list_path.startswith(p + "."):
                walk(child, p + ".")
            elif any(True for _ in child.parameters()):
                (after if seen else before).append(p)
    walk(model, "")
    return before, after


def stage_plan(model: nn.Module, pp: int, schedule: str = "1f1b") -> _Plan:
    """The uniform split (module doc) as the plan build_stage_module takes: units [modules before the
    blocks], block 0, ..., block n-1, [modules after]."""
    blocks = find_blocks(model)
    list_path = blocks[0][0].rpartition(".")[0]
    before, after = _outer_paths(model, list_path)
    units: list[_Unit] = []
    if before:
        units.append(_Unit(0, tuple(before)))
    first_block = len(units)
    for _, (path, _) in enumerate(blocks):
        units.append(_Unit(len(units), (path,)))
    if after:
        units.append(_Unit(len(units), tuple(after)))
    stages = []
    for s, r in enumerate(stage_blocks(len(blocks), pp)):
        first = 0 if s == 0 else first_block + r.start
        last = len(units) - 1 if s == pp - 1 else first_block + r.stop - 1
        stages.append(_Stage(s, first, last, s))
    return _Plan(_Units(tuple(units)), tuple(stages), schedule)


def stage_ties(model: nn.Module, config: ParallelConfig) -> list[dict[int, str]]:
    """Weights tied across stages of the uniform split (one parameter under several names, e.g. GPT-2's
    embedding and head): for each, {stage: its name there} over the stages that hold a copy, when
    they are two or more. Each such stage keeps its own copy, whose gradients torch's pipelining does
    not sum; a run sums them (planning/real/sharded_run.py ``sum_tied_grads``, as Megatron-LM sums its embedding's
    gradients between the first and last stage), and the simulation lists that all-reduce."""
    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    ties = [ns for ns in names.values() if len(ns) > 1]
    if not ties:
        return []
    plan = stage_plan(model, config.stages, config.schedule)
    units = plan.units.units
    stage_at = {p: st.index for st in plan.stages for u in units[st.first:st.last + 1] for p in u.paths}
    out = []
    for tie in ties:
        held: dict[int, str] = {}
        for n in tie:
            stage = owner_of(n, stage_at)
            if stage is None:
                raise InputError(f"{n} belongs to no pipeline stage")
            held.setdefault(stage, n)
        if len(held) > 1:
            out.append(held)
    return out


def stage_config(config: ParallelConfig) -> ParallelConfig:
    """The configuration a stage is parallelized with: the same, its ``pp`` 1 (the mesh without ``pp``)."""
    return dataclasses.replace(config, pp=1, gpus=config.world // config.pp, global_batch=None)


def _sub_mesh(mesh):
    """The mesh without its ``pp`` dimension (None when nothing is left)."""
    if mesh is None:
        return None
    names = tuple(n for n in (mesh.mesh_dim_names or ()) if n != "pp")
    return mesh[names] if names else None


def split_micro(args: tuple, kwargs: dict, m: int, microbatches: int) -> tuple[tuple, dict]:
    """Micro-batch ``m`` of ``microbatches``: every tensor with a dimension split along dim 0 (views,
    as torch's schedule splits the batch), everything else as it is."""
    def one(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0:
            return t
        if t.shape[0] % microbatches:
            raise InputError(f"the local batch ({t.shape[0]}) does not split into {microbatches} micro-batches evenly")
        return t.tensor_split(microbatches)[m]
    return map_tensors((tuple(args), dict(kwargs)), one)


def _value_reads(model: nn.Module, fakes, reals):
    """The recording forward's recorder: a simulated session whose known values are the real
    micro-batch's (token ids, masks), so that what a fake forward reads (transformers' mask checks,
    ``.item()``) is answered as the simulated step answers it."""
    from ...capture.inputs import iter_tensors
    from ...capture.known import KnownValues
    from ...capture.recorder import OpRecorder
    from ...capture.session import Session
    from ...costs import CostOptions
    known = KnownValues()
    known.seed_pairs(iter_tensors(fakes), iter_tensors(reals))
    return OpRecorder(Session(model, CostOptions(), track_seq=False, simulated=True, known=known))


def stage_module(model: nn.Module, config: ParallelConfig, stage: int, micro_args: tuple, micro_kwargs: dict,
                 record_on: nn.Module | None = None, record_context=None):
    """``model`` cut down in place to ``stage`` of the uniform split (a StageModule wrapping it whose
    last stage returns the model's whole output), the recording forward run on ``record_on`` (default
    ``model``) with one micro-batch ``micro_args``/``micro_kwargs``. Returns (stage module, its own
    blocks as (path in the stage module, module)): ``parallelize_stage`` takes both."""
    plan = stage_plan(model, config.stages, config.schedule)
    blocks = find_blocks(model)
    own = [blocks[i] for i in stage_blocks(len(blocks), config.stages)[stage]]
    mod = build_stage_module(model, plan, stage, micro_args, micro_kwargs, copy_model=False, record_on=record_on,
                             record_context=record_context)
    mod.full_output = True
    return mod, [(f"model.{p}", m) for p, m in own]


def parallelize_stage(mod: nn.Module, own: list, config: ParallelConfig, mesh) -> nn.Module:
    """The stage module parallelized with ``stage_config(config)`` on ``mesh`` (the whole mesh, from
    ``build_mesh(config)``) without its pp dimension; only checkpointing when that leaves one rank."""
    sub = stage_config(config)
    if sub.world == 1:
        checkpoint_blocks(mod, sub, blocks=own)
    else:
        parallelize(mod, sub, _sub_mesh(mesh), blocks=own, tp_root="model")
    return mod


def _recv_dtype(dtype: torch.dtype, config: ParallelConfig) -> torch.dtype:
    """What a boundary tensor arrives in: FSDP2's bf16 compute makes the blocks' outputs bf16; otherwise
    as recorded (autocast keeps a residual stream in the weights' dtype)."""
    if dtype.is_floating_point and config.mixed_precision == "bf16" and config.dp > 1:
        return config.param_dtype
    return dtype


class _Tp:
    """Between blocks, tensor parallel keeps the hidden states a DTensor (apply: sharded on the
    sequence with sequence parallel, else replicated): received buffers are its local shard, wrapped
    (torch's stage: ``DTensor.from_local``)."""

    def __init__(self, config: ParallelConfig, mesh) -> None:
        from torch.distributed.tensor import Replicate, Shard
        self.mesh = mesh["tp"]
        self.placement = Shard(1) if config.sequence_parallel else Replicate()
        self.tp, self.coord = config.tp, self.mesh.get_local_rank()

    def local_shape(self, shape: tuple) -> tuple:
        if not self.placement.is_shard() or len(shape) < 2:
            return shape
        chunk = -(-shape[1] // self.tp)
        return (shape[0], max(0, min(chunk, shape[1] - self.coord * chunk)), *shape[2:])

    def wrap(self, local: torch.Tensor, shape: tuple) -> torch.Tensor:
        from torch.distributed.tensor import DTensor
        return DTensor.from_local(local, self.mesh, [self.placement], shape=torch.Size(shape),
                                  stride=torch.empty(shape, device="meta").stride(), run_check=False)


class _StageRun:
    """A stage rank's PipelinePass: its receive buffers, what it sends back, FSDP's deferred reduction."""

    def __init__(self, mod, stage: int, config: ParallelConfig, tracker: StorageTracker, loss_fn, target, tp):
        self.mod, self.stage, self.config, self.tracker = mod, stage, config, tracker
        self.first, self.last = stage == 0, stage == config.stages - 1
        self.m = config.microbatches
        self.loss_fn, self.target, self.tp = loss_fn, target, tp
        self.zero_bubble = config.schedule in ZERO_BUBBLE
        # the neighbouring stages on this rank (the V-schedule's turn): handed over, not sent
        self.local_prev = self.local_next = False
        dev = torch.device("cpu")

        def buffers(metas):
            out = []
            for _ in range(self.m):
                row = []
                for shape, dtype in metas:
                    local = tp.local_shape(shape) if tp is not None else shape
                    t = torch.empty(local, dtype=_recv_dtype(dtype, config), device=dev)
                    b = tracker.block_of(t)
                    if b is not None:
                        b.tag = PIPELINE
                    row.append((t, shape))
                out.append(row)
            return out
        self.recv = buffers(mod.received_metas) if not self.first else []
        self.grad_recv = buffers(mod.sent_metas) if not self.last else []
        self.inputs: dict[int, list] = {}
        self._sent: list = []
        self._outputs: dict[int, tuple] = {}     # the last stage's outputs until I (zero bubble)
        self._pending: dict[int, tuple] = {}     # what I keeps for W (zero bubble)
        self._micro: dict[int, tuple] = {}       # the last stage's micro-batch inputs, for a StepLoss
        self._unshards: list = []                # FSDP's all-gathers an UNSHARD started
        self._reduced = False                    # this step's gradients reduced (REDUCE_GRAD) already
        from torch.distributed.fsdp import FSDPModule
        self.fsdp = isinstance(mod, FSDPModule)

    def p2p(self) -> tuple[int, int, int, int]:
        """The step's point-to-point transfers, as torch's stage makes them: per micro-batch the forward
        sends its output to the next stage and receives its input from the previous one; the backward
        sends the input's gradient back and receives the output's (bytes at the receive buffers' local
        shapes and dtypes). (bytes sent, bytes received, transfers each way): a stage receives in one
        pass what it sends in the other, so it sends as often as it receives."""
        act_in = sum(t.nbytes for t, _ in self.recv[0]) if self.recv else 0
        act_out = sum(t.nbytes for t, _ in self.grad_recv[0]) if self.grad_recv else 0
        m, to_next, to_prev = self.m, not self.last and not self.local_next, not self.first and not self.local_prev
        return m * (act_out * to_next + act_in * to_prev), m * (act_in * to_prev + act_out * to_next), \
            m * (to_next + to_prev)

    def begin(self) -> None:
        self._reduced = False
        # torch's clear_runtime_states at the start of step(): the input gradients of the last step go
        for row in self.recv:
            for t, _ in row:
                t.grad = None

    def forward(self, m: int, args: tuple, kwargs: dict):
        if self.last and isinstance(self.loss_fn, StepLoss):
            self._micro[m] = split_micro(args, kwargs, m, self.m)
        if self.first:
            a, k = split_micro(args, kwargs, m, self.m)
            from ..split.runnable import flat_inputs
            flat, _ = flat_inputs(a, k)
            self.inputs[m] = []
            return self.mod(*flat)
        acts = []
        for t, shape in self.recv[m]:
            if self.tp is not None:
                act = self.tp.wrap(t, shape).requires_grad_(t.is_floating_point())
            else:
                act = t.requires_grad_(t.is_floating_point())
            acts.append(act)
        self.inputs[m] = acts
        return self.mod(*acts)

    def loss(self, m: int, output):
        if self.zero_bubble:
            self._outputs[m] = output if isinstance(output, tuple) else (output,)
        if isinstance(self.loss_fn, StepLoss):
            # the next-token cross-entropy of this micro-batch's logits against its own token ids
            return self.loss_fn.bind(*self._micro.pop(m), stage=True)(output)
        if self.target is None:
            return (self.loss_fn or default_loss)(output)
        if self.loss_fn is None:
            raise InputError("a target needs a loss_fn(output, target)")
        tm = split_micro((self.target,), {}, m, self.m)[0][0]
        return self.loss_fn(output, tm)

    def _no_sync(self) -> None:
        # torch's backward_maybe_with_nosync: FSDP2 accumulates, reduces once after the last backward
        if self.fsdp:
            self.mod.set_is_last_backward(False)
            self.mod.set_reshard_after_backward(False)
            self.mod.set_requires_gradient_sync(False)

    def _seeds(self, m: int, held) -> tuple[list, list]:
        """A non-last stage's outputs of micro-batch m and the gradients received for them."""
        outs = [t for t in (held if isinstance(held, tuple) else (held,))[:len(self.grad_recv[m])]]
        grads = []
        for o, (g, shape) in zip(outs, self.grad_recv[m]):
            if self.tp is not None and hasattr(o, "placements"):
                from torch.distributed.tensor import DTensor
                g = DTensor.from_local(g, o.device_mesh, o.placements, shape=o.shape, stride=o.stride(),
                                       run_check=False)
            grads.append(g)
        return outs, grads

    def backward(self, m: int, held, engine) -> tuple:
        """The full backward of micro-batch m; returns the gradients of its received activations."""
        self._no_sync()
        if self.last:
            engine(held)
        else:
            outs, grads = self._seeds(m, held)
            pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
            engine([o for o, _ in pairs], [g for _, g in pairs])
        # Schedule1F1B keeps a micro-batch's sent input gradient referenced (its send ops) until the next
        # backward has run; ScheduleGPipe until the step's end
        for act in self._sent:
            act.grad = None
        self._sent = []
        acts = self.inputs.pop(m, [])
        sent = tuple(act.grad for act in acts)
        for act in acts:
            if act.grad is not None:
                b = self.tracker.block_of(act.grad)
                if b is not None:
                    b.tag = PIPELINE
            if self.tp is not None or self.config.stages > self.config.pp:
                # sent and dropped (torch's bwd_cache): a DTensor's gradient; and every one under a schedule
                # with several stages per rank
                act.grad = None
            elif self.config.schedule == "1f1b":
                self._sent.append(act)
        return sent

    def take_input(self, m: int, output) -> None:
        """The V-schedule's special case: the previous stage, on this rank, hands its output of micro-batch
        m over as this stage's input, detached (torch's ``set_local_fwd_input``): no transfer, and the
        receive buffer made for it is let go of; the output stays until the next step's forward replaces it."""
        outs = output if isinstance(output, tuple) else (output,)
        self.recv[m] = [(_local(o).detach(), shape) for o, (_, shape) in zip(outs, self.recv[m])]

    def take_grad(self, m: int, grads: tuple) -> None:
        """The backward's counterpart (torch's ``set_local_bwd_input``): the next stage's gradient of its
        input becomes this stage's received gradient of micro-batch m, kept until the next step's replaces it."""
        self.grad_recv[m] = [(_local(g), shape) if g is not None else (t.zero_(), shape)
                             for g, (t, shape) in zip(grads, self.grad_recv[m])]

    def backward_input(self, m: int, held, routed) -> tuple:
        """Zero bubble's I: what torch's ``backward_one_chunk(full_backward=False)`` does, with torch's own
        ``stage_backward_input``: the gradient of the received activation only, the graph kept, the
        gradients reaching the weights' side kept in its parameter groups (not on the first stage: its W
        runs the whole backward). The outputs (detached), inputs, groups and seeds stay until W."""
        self._no_sync()
        inputs = self.inputs.pop(m, [])
        if self.last:
            outs, grads = [held], None
        else:
            outs, grads = self._seeds(m, held)
        groups, sent, kept = None, (), []
        if not self.first:
            feature = "a zero-bubble schedule's backward"
            self.tracker.deferred = kept
            try:
                with routed():
                    sent, groups = _compat.need("stage_backward_input", feature)(list(outs), grads, inputs,
                                                                                 self.mod.parameters())
            finally:
                self.tracker.deferred = None
            for act in inputs:
                if act.grad is not None:
                    b = self.tracker.block_of(act.grad)
                    if b is not None:
                        b.tag = PIPELINE
        if self.last and not self.first:
            # the logits are no longer needed for the backward (torch detaches them in place)
            for t in self._outputs.pop(m, ()):
                if isinstance(t, torch.Tensor) and not t._is_view():
                    t.detach_()
        self._outputs.pop(m, None)
        self._pending[m] = (inputs, groups, outs, grads, kept)
        return tuple(sent)

    def backward_weight(self, m: int, routed) -> None:
        """Zero bubble's W: torch's ``stage_backward_weight`` from the groups I kept (the first stage: the
        whole backward, ``stage_backward``, as torch runs it there)."""
        self._no_sync()
        inputs, groups, outs, grads, kept = self._pending.pop(m)
        feature = "a zero-bubble schedule's backward"
        with routed():
            if not self.first:
                _compat.need("stage_backward_weight", feature)(self.mod.parameters(), groups)
            else:
                _compat.need("stage_backward", feature)(outs, grads, inputs)
        del inputs, groups, outs, grads
        for b in kept:      # the graph I kept is gone: its checkpointed blocks' generator states with it
            self.tracker.release(b)

    def act(self, kind: str) -> None:
        """torch's runtime schedule's UNSHARD (every FSDP module of the stage all-gathered, waited for
        before the stage's next compute), RESHARD, and REDUCE_GRAD (``perform_reduce_grad``: the stage's
        gradients reduced and scaled once its last backward has run, not at the step's end)."""
        from torch.distributed.fsdp import FSDPModule
        if kind == "REDUCE_GRAD":
            self._reduce()
            return
        if kind not in ("UNSHARD", "RESHARD"):
            raise InputError(f"a pipeline stage's own action is UNSHARD, RESHARD or REDUCE_GRAD, got {kind!r}")
        for sub in self.mod.modules():
            if isinstance(sub, FSDPModule):
                if kind == "UNSHARD":
                    self._unshards.append(sub.unshard(async_op=True))
                else:
                    sub.reshard()

    def wait_unshard(self) -> None:
        for h in self._unshards:
            if h is not None:
                h.wait()
        self._unshards = []

    def end(self) -> None:
        if not self._reduced:     # one stage per rank: torch reduces at the step's end
            self._reduce()

    def _reduce(self) -> None:
        self._reduced = True
        _compat.fsdp_reduce_grads(self.mod)
        if self.m != 1:
            with torch.no_grad():
                for p in self.mod.parameters():
                    if p.grad is not None:
                        p.grad.div_(self.m)


def _rank_pass(runners: dict, actions) -> PipelinePass:
    """The rank's PipelinePass over its stages (``runners``: stage -> _StageRun): each action's key is
    (stage, micro-batch), dispatched to that stage's runner (after the all-gathers an UNSHARD of the
    stage started, as torch's runtime waits for them); the loss only on the last stage. ``actions``:
    schedule.Action entries, and ("UNSHARD" | "RESHARD", stage) pairs."""
    def on(key):
        r = runners[key[0]]
        r.wait_unshard()
        return r

    def forward(key, args, kwargs):
        out = on(key).forward(key[1], args, kwargs)
        if key[0] + 1 in runners:        # the V-schedule's turn: handed over on this rank
            runners[key[0] + 1].take_input(key[1], out)
        return out

    def loss(key, output):
        return runners[key[0]].loss(key[1], output)

    def handed(key, grads):
        if key[0] - 1 in runners:
            runners[key[0] - 1].take_grad(key[1], grads)

    def backward(key, held, engine):
        handed(key, on(key).backward(key[1], held, engine))

    def backward_input(key, held, routed):
        handed(key, on(key).backward_input(key[1], held, routed))

    def backward_weight(key, routed):
        on(key).backward_weight(key[1], routed)

    def act(kind, key):
        runners[key[0]].act(kind)

    def begin():
        for r in runners.values():
            r.begin()

    def end():
        for r in runners.values():
            r.end()
    steps = tuple((a[0], (a[1], None)) if isinstance(a, tuple) else (a.kind, (a.stage, a.microbatch))
                  for a in actions)
    return PipelinePass(actions=steps, forward=forward, backward=backward,
                        loss=loss if any(r.last for r in runners.values()) else None, begin=begin, end=end,
                        takes_loss=lambda key: runners[key[0]].last, backward_input=backward_input,
                        backward_weight=backward_weight, act=act)


def simulate_stage_rank(model: nn.Module, args: tuple, kwargs: dict, config: ParallelConfig, rank: int,
                        step: RankStep) -> RankRun:
    """Simulate global rank ``rank`` of ``config`` (``pp`` > 1) training ``model``: its stages (one, or
    under a schedule with several per rank those ``stage_coords`` places on the rank's ``pp`` coordinate)
    on ``args``/``kwargs``, the rank's LOCAL batch (all micro-batches; split
    into ``config.microbatches`` along dim 0 here). ``loss_fn(output)`` on the last stage's output of
    each micro-batch (default: its ``loss``, or the sum of its outputs); with ``target`` (a tensor of
    the local batch, split alike) ``loss_fn(output, target_m)``, as torch's schedule calls it.
    Returns the RankRun rank_memory() reads (the receive buffers and the gradients sent back in the
    part "communication buffers"). ``device_type``: as simulate_rank's (CPU offload). Each stage is a
    module of its own, parallelized on its own (FSDP2 roots apart, as torchtitan shards each model part),
    all trained by one optimizer in the order torch's schedule runs their actions. ``step``: how the rank's
    step runs (RankStep; its ``loss_fn``, ``target`` and ``device_type`` as above)."""
    loss_fn, target, block_size, gloo, workspace, rng_state, device_type = (
        step.loss_fn, step.target, step.block_size, step.gloo, step.workspace, step.rng_state, step.device_type)
    import torch.distributed.fsdp  # noqa: F401  (registers FSDP2's ops before the registry is copied)
    from ..apply import build_mesh
    if config.pp < 2:
        raise InputError("simulate_stage_rank simulates a pipeline stage: pp must be 2 or more (simulate_rank "
                         "does pp = 1)")
    if config.schedule not in SIMULATED_SCHEDULES:
        raise InputError(f"the {config.schedule} schedule is not simulated per rank yet: "
                         f"{', '.join(SIMULATED_SCHEDULES)} are")
    if not 0 <= rank < config.world:
        raise InputError(f"rank {rank} is not in the configuration's {config.world} ranks")
    per_rank = schedule_of(config.schedule).per_rank(config.stages_per_rank)
    coord = rank // (config.world // config.pp)
    mine = rank_stages(config, coord)
    dtype = torch.float32 if config.mixed_precision == "bf16" else config.model_dtype
    device = torch.device("cpu")
    tracker = RankTracker(block_size, gloo=gloo, workspace=workspace, cuda=device_type == "cuda")
    actions = rank_orders(config.schedule, config.stages, config.microbatches, per_rank)[coord]
    if schedule_of(config.schedule).multi:
        # torch's runtime schedules all-gather an FSDP stage's parameters ahead (UNSHARD), reshard it after
        # (RESHARD) and reduce each stage's gradients right after its last backward (REDUCE_GRAD)
        actions = _compat.runtime_lowered(actions, config.microbatches)
    with fake_world(rank, config.world), simulation_warnings():
        privates = {}
        for stage in mine:
            privates[stage] = meta_copy(model, dtype)
            no_kv_cache(privates[stage])
        held = stage_ties(privates[mine[0]], config)
        # one all-reduce per tie over the ranks holding a copy (the copies on this rank summed on it first:
        # zbv's V puts the first and the last stage on one rank); none where this rank holds them all
        coords = stage_coords(config)
        ties = []
        for h in held:
            here, ranks = [s for s in mine if s in h], len({coords[s] for s in h})
            if here and ranks > 1:
                ties.append((h[here[0]], ranks, here[0]))
        probe_model = meta_copy(model, dtype)
        no_kv_cache(probe_model)
        ra, rk = split_micro(tuple(args), dict(kwargs), 0, config.microbatches)   # the real values
        mesh = build_mesh(config, device.type)
        fake_mode = _compat.new_fake_mode(allow_non_fake_inputs=True)
        built = {}
        with fake_mode, eager_paths(fake_mode):
            probe_model.to_empty(device=device)
            fa, fk = map_tensors((tuple(args), dict(kwargs)), lambda t: empty_like_on(t, device))
            ma, mk = split_micro(fa, fk, 0, config.microbatches)
            probe_model.train()
            for stage in mine:
                built[stage] = stage_module(privates[stage], config, stage, ma, mk, record_on=probe_model,
                                            record_context=functools.partial(_value_reads, probe_model, (ma, mk),
                                                                             (ra, rk)))
            del probe_model, fa, fk, ma, mk
        for mod, own in built.values():
            parallelize_stage(mod, own, config, mesh)
        host = config.offload and device_type != "cpu"
        mods = {stage: mod for stage, (mod, _) in built.items()}
        whole = as_module([mods[s] for s in mine])
        if config.offload:
            prepare_offload(whole, tracker, host=host)
        with fake_mode, eager_paths(fake_mode):
            whole.to_empty(device=device)
            watch_fsdp(whole, tracker, host=host)
            watch_checkpoint_rng(whole, tracker, rng_state)
            tp = _Tp(config, mesh) if config.tp > 1 else None
            runners = {stage: _StageRun(mods[stage], stage, config, tracker, loss_fn, target, tp) for stage in mine}
            for stage, r in runners.items():
                r.local_prev, r.local_next = stage - 1 in runners, stage + 1 in runners
            run = train_fake(whole, args, kwargs, config, tracker, device, step, pipeline=_rank_pass(runners, actions))
            layouts = param_layouts(whole)
            tied = []
            for name, n, stage in ties:
                params = {canonical_name(k): v for k, v in mods[stage].named_parameters()}
                tied.append((_local_nbytes(params[f"model.{name}"]), n))
    p2p = [r.p2p() for r in runners.values()]
    return RankRun(rank, run, tracker, layouts=layouts, p2p=tuple(map(sum, zip(*p2p))), ties=tuple(tied),
                   offload=host)


def _local_nbytes(t: torch.Tensor) -> int:
    """Bytes of this rank's shard of a (DTensor) parameter: its gradient's, which has its dtype."""
    local = _local(t)
    return local.numel() * local.element_size()
