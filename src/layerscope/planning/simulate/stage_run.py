"""What one simulated pipeline stage does for each action of its rank's schedule, as torch's
``PipelineStage`` does it: its receive buffers, the forward and the loss, the full backward or zero
bubble's I and W, what it sends back and how long that is kept, FSDP's deferred reduction; and the
rank's ``PipelinePass`` over its stages (planning/simulate/pipeline_rank.py's docstring)."""

from __future__ import annotations

import torch

from ... import _compat
from ...capture.loss import StepLoss, default_loss
from ...capture.spec import PipelinePass
from ...capture.storage import StorageTracker
from ...errors import InputError
from ..config import ParallelConfig, schedule_of
from ..blocks import local_tensor as _local
from .sharded_rank import PIPELINE
from .uniform_stages import split_micro

__all__ = []


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
        self.kind = schedule_of(config.schedule)
        self.zero_bubble = self.kind.zero_bubble
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
        # a schedule whose send ops each action replaces (Schedule1F1B) keeps a micro-batch's sent input
        # gradient referenced until the next backward has run; one that keeps its sends (ScheduleGPipe)
        # until the step's end
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
            elif not self.kind.keeps_sends:
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
