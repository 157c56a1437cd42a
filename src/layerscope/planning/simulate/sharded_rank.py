"""One rank of a sharded training step, simulated with torch's own distributed code on fake tensors.

How: torch's ``fake`` process-group backend (collectives that return at once, no peers) stands in for
the configuration's world, so ``fully_shard``, DTensor's ``parallelize_module`` and the checkpoint
wrappers (planning/apply.py) run their real code: the mesh is made and the model sharded on the meta
device, then materialised as fake tensors inside a FakeTensorMode and trained for ``steps`` steps by
the same step loop memory() uses (capture/step.py), with the same storage tracker. So every storage
the rank would hold -- its parameter shards, the parameters FSDP2 gathers for a block and frees after
it, gradients before and after their reduce-scatter, optimizer state, activations, a checkpointed
block's recompute, the collectives' buffers -- is recorded with its lifetime, nothing is computed and
nothing is allocated.

What the tracker cannot see by itself, and how it is seen:
* FSDP2 frees and re-allocates the gathered parameters with ``UntypedStorage.resize_``, which no
  dispatch mode sees. The parameter groups of the private copy (only those) get their
  ``alloc_all_gather_outputs``/``free_unsharded_param`` wrapped on the instance, which tell the
  tracker (``StorageTracker.resized``); torch's own FSDPMemTracker patches ``resize_`` for the
  whole process instead, which other threads would observe.
* A DTensor op's own dispatch (its sharding propagation, a redistribution its sharding needs, the
  local kernel and its temporaries) runs below a dispatch mode; the recorder lets it run under itself
  and records the local ops on the rank's shard (capture/recorder.py ``_dtensor_op``).

Ranks whose shards have the same sizes hold the same storages and are simulated once
(results.roles: torch's chunking of every sharded dimension, per rank); where a dimension does not
divide evenly, each distinct rank is simulated (FSDP2 pads every parameter shard's storage to the same
size, but the optimizer's state follows the unpadded shard).

Deliberate departures from "no process-wide switch": the process group is process-wide state in torch
(``torch.distributed``'s default group), so the simulation creates the fake one only when none exists,
holds a lock while it lives, and destroys it after, whatever happens (inside a job that already has a
process group it refuses); and the three torch warnings about the simulation's own CPU mesh and
saved-tensor hook are filtered with ``warnings.catch_warnings`` while it runs, which Python keeps
process-wide.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ... import _compat
from ...capture import hooks
from ...capture.simulation import eager_paths
from ...capture.spec import StepSpec, StepWatch
from ...capture.step import StepRun, run_steps
from ...capture.storage import CATEGORIES, SAVED, StorageTracker
from ...costs import CostOptions, default_registry
from ...costs.cuda_scratch import CudaKernels
from ...costs.movement import move
from ...errors import InputError
from ..config import ParallelConfig
from ...trace import OPTIMIZER
from ..apply import build_mesh, loss_context, parallelize
from ..blocks import no_kv_cache
from ..context_parallel import RingCount, check_context_parallel, check_ring, ring_attention, shard_sequence

__all__ = ["RankRun", "RankTracker", "simulate_rank", "PARTS", "HOST_PART", "COMM_OPS", "PIPELINE", "meta_copy",
           "fake_world", "param_layouts", "cost_registry", "watch_fsdp", "prepare_offload", "train_fake", "RankStep"]

# the breakdown of a rank's memory, in the order reports show it
PARTS = ("sharded parameters", "gathered parameters", "gradients", "optimizer state", "activations",
         "recompute", "communication buffers", "inputs, outputs and buffers", "workspaces", "temporary")
# what a rank holds in the host's memory with FSDP2's CPU offload, outside its device's peak (RankRun.part)
HOST_PART = "host memory (CPU offload)"
HOST = "host"
# ops whose outputs are the collectives' own buffers (FSDP2's flat all-gather input/output and its
# reduce-scatter input; the functional collectives' outputs)
COMM_OPS = frozenset({"fsdp.all_gather_copy_in", "fsdp.chunk_cat", "_c10d_functional.all_gather_into_tensor",
                      "_c10d_functional.reduce_scatter_tensor", "_c10d_functional.all_reduce",
                      "_c10d_functional.all_to_all_single"})
_FSDP_COPIES = ("fsdp::all_gather_copy_in", "fsdp::split_with_sizes_copy", "fsdp::chunk_cat")
_WORLD_LOCK = threading.Lock()
_GATHERED, _UNREDUCED, _COMM = "gathered", "unreduced", "comm"
# a pipeline stage's receive buffers and the input gradients it sends back (planning/simulate/pipeline_rank.py)
PIPELINE = "pipeline"
# collectives whose tensors are communication buffers (FSDP2's flat all-gather output, its reduce-scatter
# input that chunk_cat fills and the reduce-scatter's output) unless a role says more (a reduce-scatter
# output that becomes the sharded gradients is a gradient)
_COMM_TENSOR_OPS = frozenset({"fsdp.all_gather_copy_in", "fsdp.chunk_cat", "c10d._allgather_base_",
                              "c10d._reduce_scatter_base_", "c10d.allreduce_"})


@contextlib.contextmanager
def fake_world(rank: int, world: int):
    """torch's default process group as the ``fake`` backend (rank ``rank`` of ``world``) while the
    context lasts, with DTensor's random-op state of its own: the state a real DTensor run made earlier
    in the process (a CUDA mesh's RNG tracker) is put aside and given back afterwards, so that the
    simulation's dropout on its CPU mesh does not drive a CUDA generator from fake tensors; and
    ``sys.excepthook`` as it was (torch's init_process_group leaves one of its own that prefixes every
    later traceback of the process with "[rank0]: ", once per simulation); DTensor's caches that hold
    device meshes emptied when it begins and ends (a mesh equals one of another world with the same
    shape, and its cached plans name that world's process groups)."""
    import torch.distributed as dist
    if not dist.is_available():
        raise InputError("this torch has no torch.distributed: sharded training cannot be simulated")
    with _WORLD_LOCK:
        if dist.is_initialized():
            raise InputError("a process group is already initialised in this process: simulate the configuration "
                             "outside the distributed job (one process, no torchrun)")
        hook = sys.excepthook       # init_process_group chains a "[rankN]: " prefixing hook in and leaves it there
        clear = _compat.get("dtensor_mesh_caches", lambda: None)
        clear()                     # no mesh of an earlier world answers for this one's
        dist.init_process_group("fake", rank=rank, world_size=world, store=_compat.fake_store())
        rnd = _compat.get("dtensor_random")
        tracker = getattr(rnd, "_rng_tracker", None)
        if rnd is not None:
            rnd._rng_tracker = None
        try:
            yield
        finally:
            if rnd is not None:
                rnd._rng_tracker = tracker
            dist.destroy_process_group()
            sys.excepthook = hook
            clear()                 # nor one of this world for a later one's (a user's real run)


@contextlib.contextmanager
def simulation_warnings():
    """While a rank is simulated (a stage's too), torch's warnings about the simulation's own machinery,
    not about the user's model, filtered (the module docstring's departure)."""
    with warnings.catch_warnings():
        # the simulation's own CPU mesh
        warnings.filterwarnings("ignore", message="DTensor random operators may not have complete support")
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        # HSDP x cp: FSDP's 2-D mesh (dp_replicate, dp_shard_cp) sliced from the root (context_parallel.fsdp_mesh)
        warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh")
        # torch 2.14: the simulation's own saved-tensor hook (it marks what autograd saves) around a
        # selective-checkpoint region
        warnings.filterwarnings("ignore", message="A saved_tensors_hooks context .* selective activation checkpoint")
        yield


def meta_copy(model: nn.Module, dtype: torch.dtype | None) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are on the meta device (nothing copied), floating
    ones cast to ``dtype``; ties and requires_grad kept. The user's model is never touched."""
    memo: dict[int, Any] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if id(t) in memo:
            continue
        d = dtype if dtype is not None and t.is_floating_point() else t.dtype
        e = torch.empty(t.shape, dtype=d, device="meta")
        memo[id(t)] = nn.Parameter(e, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else e
    return copy.deepcopy(model, memo)


@dataclass
class RankRun:
    """What one simulated rank held: the step run (traces, storage blocks, phases) and the blocks'
    parts of the breakdown."""

    rank: int
    run: StepRun
    tracker: StorageTracker
    # per sharded parameter: (global shape, ((mesh dimension, tensor dimension), ...))
    layouts: list = field(default_factory=list)
    # a pipeline rank's point-to-point transfers per step: (bytes sent, bytes received, transfers each way)
    p2p: tuple | None = None
    # a pipeline rank's weights tied across stages: (bytes of its gradient's local shard, stages holding a
    # copy) each, summed by one all-reduce per step
    ties: tuple = ()
    # FSDP2's CPU offload onto a device rank: what lives in the host's memory is HOST_PART, not the device's
    offload: bool = False
    # context parallel: what torch's ring ran (planning/context_parallel.py RingCount)
    ring: Any = None
    notes: tuple = ()       # Notes on how it was simulated (composed from its blocks: planning/simulate/composed_rank.py)

    def part(self, b) -> str:
        """The breakdown part a storage block belongs to (``HOST_PART``: not on the device; with CPU
        offload, the sharded parameters, their gradients once copied out, and all the optimizer step
        makes, which runs on the host)."""
        if self.offload and (b.tag == HOST or b.phase == OPTIMIZER):
            return HOST_PART
        if b.tag == _GATHERED:
            return "gathered parameters"
        if b.tag == _UNREDUCED:
            return "gradients"
        if b.tag == PIPELINE:
            return "communication buffers"
        c = CATEGORIES[b.category]
        if c == "parameter":
            return "sharded parameters"
        if c == "gradient":
            return "gradients"
        if c == "optimizer_state":
            return "optimizer state"
        if b.tag == "recompute":
            return "recompute"
        if b.tag == _COMM or b.op in COMM_OPS:
            return "communication buffers"
        if c == "activation":
            return "activations"
        if c in ("input", "output", "buffer"):
            return "inputs, outputs and buffers"
        if c == "workspace":
            return "workspaces"
        return "temporary"


# What ProcessGroupGloo allocates itself while a collective runs, and frees before it returns (measured:
# torchrun, 2 ranks, the CPU allocator's own count of every thread, capture.measure.count_cpu_allocations;
# its source says the same): an all-gather copies through a flat buffer of the gathered bytes (its worker
# thread makes it, twice in a row for all_gather_into_tensor, never both at once); a reduce-scatter is an
# all-reduce of a clone of its input, the rank's chunk copied out after. NCCL does neither. op -> which of
# the op's tensors has the buffer's size ("in": its first tensor argument, "out": its first output).
_GLOO_BUFFERS = {"c10d._allgather_base_": ("in", 0), "_c10d_functional.all_gather_into_tensor": ("out", 0),
                 "c10d._reduce_scatter_base_": ("in", 1), "_c10d_functional.reduce_scatter_tensor": ("in", 0)}


class RankTracker(StorageTracker):
    """The storage tracker of one simulated rank: the collectives' tensors are communication buffers,
    and on gloo (CPU ranks) each all-gather and reduce-scatter also holds gloo's own buffer
    (``_GLOO_BUFFERS``) while it runs."""

    def __init__(self, block_size=None, gloo: bool = False, workspace=None, cuda: bool = False) -> None:
        super().__init__(block_size, workspace, kernels=CudaKernels() if cuda else None)
        self.gloo = gloo
        self.gloo_late_bytes = 0     # the largest reduce-scatter clone (results.ESTIMATES' gloo line)
        # while a zero-bubble schedule's I runs: where the holds its checkpointed blocks end go instead, to be
        # let go of when the micro-batch's W has run (watch_checkpoint_rng)
        self.deferred: list | None = None
        # context parallel: while torch's ring runs (in_ring), the op clock of each collective it issues: the
        # cp group's, not tensor parallel's (the same functional ops)
        self.in_ring = False
        self.ring_ops: set[int] = set()

    def on_op(self, ins, outs, sizes=None) -> None:
        name = self.op_name
        where = _GLOO_BUFFERS.get(name) if self.gloo else None
        if where is not None:
            side, i = where
            tensors = ins if side == "in" else outs
            if len(tensors) > i and isinstance(tensors[i], torch.Tensor):
                nbytes = int(tensors[i].numel()) * tensors[i].element_size()
                self.transient(nbytes, tag=_COMM)
                if "reduce_scatter" in name:
                    self.gloo_late_bytes = max(self.gloo_late_bytes, nbytes)
        super().on_op(ins, outs, sizes)
        if self.in_ring and name in COMM_OPS:
            self.ring_ops.add(self.clock)
        if name in _COMM_TENSOR_OPS:
            for t in (*ins, *outs):
                b = self.block_of(t) if isinstance(t, torch.Tensor) else None
                if b is not None and b.tag is None:
                    b.tag = _COMM


def param_layouts(model: nn.Module) -> list:
    """Each DTensor parameter's global shape and where it is sharded (mesh dimension name, tensor dim)."""
    out = []
    for p in model.parameters():
        mesh = getattr(p, "device_mesh", None)
        if mesh is None:
            continue
        names = mesh.mesh_dim_names or tuple(str(i) for i in range(mesh.ndim))
        shards = tuple((names[i], pl.dim) for i, pl in enumerate(p.placements) if pl.is_shard())
        out.append((tuple(p.shape), shards))
    return out


def watch_fsdp(model: nn.Module, tracker: StorageTracker, *, host: bool = False) -> None:
    """Tell the tracker when FSDP2 resizes the gathered parameters' storages, and mark the gradients
    FSDP2 reduces (the unsharded ones) as gradients. ``host``: CPU offload onto a device rank
    (``prepare_offload``): the sharded parameters are the host's, and each reduced gradient is copied to
    the host at the end of its group's post-backward, where a GPU rank lets go of the reduce-scatter's
    output (FSDP2's ``foreach_reduce``: ``new_sharded_grad.to("cpu")``, a no-op on the simulation's CPU)."""
    for group in _compat.fsdp_param_groups(model):
        for fp in group.fsdp_params:
            _wrap_param(fp, tracker)
            if host:
                _tag_host(tracker, fp)
        post = group.post_backward

        def post_backward(*a, _post=post, _group=group, **kw):
            for fp in _group.fsdp_params:
                for g in (getattr(fp, "unsharded_accumulated_grad", None),
                          getattr(fp.unsharded_param, "grad", None) if hasattr(fp, "_unsharded_param") else None):
                    if g is not None:
                        b = tracker.block_of(g)
                        if b is not None and b.tag is None:
                            b.tag = _UNREDUCED
            out = _post(*a, **kw)
            if host:
                for fp in _group.fsdp_params:
                    g = fp.sharded_param.grad
                    b = tracker.block_of(g) if g is not None else None
                    if b is not None and b.tag != HOST:    # the group's grads share one reduce output: once
                        tracker.moved(g, HOST)
            return out
        group.post_backward = post_backward


def _tag_host(tracker: StorageTracker, fp) -> None:
    b = tracker.block_of(fp._sharded_param_data)
    if b is not None:
        b.tag = HOST


def prepare_offload(model: nn.Module, tracker: StorageTracker, *, host: bool) -> None:
    """FSDP2's CPU offload (``CPUOffloadPolicy``) on a sharded private copy, before it is materialised:
    no pinning (fake tensors have no pinned memory; pinning changes where the host's bytes come from,
    not how many). ``host`` (the ranks are GPUs): each all-gather first copies the rank's host shard of
    every parameter to the device (FSDP2's ``FSDPParam.all_gather_inputs``:
    ``sharded_param_data.to(device)``, then the cast to the compute dtype), which the simulation's one
    device would skip as a no-op; here the parameter's class gains an ``all_gather_inputs`` that makes
    the copy (a device tensor the all-gather's copy-in reads and lets go of), the rest being torch's."""
    classes: dict[type, type] = {}
    for group in _compat.fsdp_param_groups(model):
        for fp in group.fsdp_params:
            fp.pin_memory = False
            if host:
                base = type(fp)
                if base not in classes:
                    classes[base] = _offloaded_class(base, tracker)
                fp.__class__ = classes[base]


def _offloaded_class(base: type, tracker: StorageTracker) -> type:
    class OffloadedParam(base):
        @property
        def all_gather_inputs(self):
            if getattr(self.sharded_state, "name", "") != "SHARDED" or \
                    hasattr(self._sharded_local_tensor, "fsdp_pre_all_gather"):
                return base.all_gather_inputs.fget(self)
            _tag_host(tracker, self)
            data = self._sharded_param_data.clone()       # the host-to-device copy
            dtype = self.param_dtype
            return [data.to(dtype) if dtype is not None and data.dtype != dtype else data]
    OffloadedParam.__name__ = OffloadedParam.__qualname__ = base.__name__
    return OffloadedParam


def watch_checkpoint_rng(model: nn.Module, tracker: StorageTracker, nbytes: int) -> None:
    """Each checkpointed block (torch's checkpoint wrapper, ``preserve_rng_state``) keeps a copy of the
    CPU generator's state (``torch.get_rng_state()``: ``nbytes``, 5,056 B) from its forward until its
    backward has run, for the recompute to draw the same random numbers; torch makes it outside the
    dispatcher, so the run never sees it. Held here from the block's forward until the gradient of its
    input is computed (the end of the block's backward). Measured on the fake backend (a shrunk Llama,
    FSDP 4, full checkpointing): the allocator's peak was 5,056 B above the simulation without it; with
    it, equal to the byte (and equal with ``preserve_rng_state=False`` in both). On a CUDA rank the
    copies are host memory: ``nbytes`` 0 there. Under a zero-bubble schedule the block's input gradient
    is computed by the stage's I, whose retained graph keeps the checkpoint (and the copy) until its W
    has run: a RankTracker's ``deferred`` list, while I runs, takes the hold for W to let go of
    (measured: the allocator's peak 2-3 copies above the simulation when it let go of them at I)."""
    if nbytes <= 0:
        return
    for mod in model.modules():
        fn = getattr(mod, "checkpoint_fn", None)
        # FSDP2 gives a module it shards a class of its own (FSDPCheckpointWrapper): the wrapper is in its bases
        wrapper = any(c.__name__ == "CheckpointWrapper" for c in type(mod).__mro__)
        if not wrapper or not getattr(fn, "keywords", {}).get("preserve_rng_state", True):
            continue

        def held(module, args, kwargs, output):
            first = next((t for t in _compat.tree_leaves((args, kwargs))
                          if isinstance(t, torch.Tensor) and t.requires_grad), None)
            if first is None or not torch.is_grad_enabled():
                return
            b = tracker.hold(nbytes)
            b.roles |= SAVED
            b.saved_by = (tracker.pass_index, tracker.layer)

            deferred = []

            def done(grad):
                if getattr(tracker, "deferred", None) is not None:
                    tracker.deferred.append(b)
                    deferred.append(b)
                elif not deferred:
                    tracker.release(b)
            first.register_hook(done)
        hooks.forward_hook(mod, held, with_kwargs=True)


def _wrap_param(fp, tracker: StorageTracker) -> None:
    alloc, free = fp.alloc_all_gather_outputs, fp.free_unsharded_param

    def tag_gathered():
        for t in fp.all_gather_outputs:
            b = tracker.resized(t)
            if b is not None:
                b.tag = _GATHERED

    def alloc_all_gather_outputs():
        alloc()
        tag_gathered()

    def free_unsharded_param():
        free()
        for t in itertools.chain(fp.all_gather_outputs, getattr(fp, "_unsharded_inner_tensors", ())):
            tracker.resized(t)
    fp.alloc_all_gather_outputs = alloc_all_gather_outputs
    fp.free_unsharded_param = free_unsharded_param
    # the first gather allocates with torch.empty (seen by the recorder): tag it when it is copied out
    init = fp.init_all_gather_outputs

    def init_all_gather_outputs(*a, **kw):
        init(*a, **kw)
        tag_gathered()
    fp.init_all_gather_outputs = init_all_gather_outputs


def cost_registry():
    """The default formulas, plus FSDP2's own copy ops (registered by torch when FSDP2 is imported) as
    data movement."""
    reg = default_registry().copy("parallel")
    for name in _FSDP_COPIES:
        ns, _, op = name.partition("::")
        if hasattr(getattr(torch.ops, ns), op) and name not in reg:
            reg.register(name, move)
    return reg


@dataclass(frozen=True)
class RankStep:
    """How one rank's step runs (what simulate_rank, simulate_stage_rank and train_fake take as one object):
    ``optimizer`` (params -> Optimizer, or None), ``steps``, ``loss_fn`` (a callable or a StepLoss);
    ``block_size``: the allocator's rounding (CUDA ranks: 512); ``foreach_default``: optimizers default to
    foreach (CUDA tensors); ``attention``: the rank's SdpaRouter; ``gloo``: gloo's collectives' own
    buffers; ``probe``: size the scratch of kernels that allocate inside themselves by one real call
    (memory()'s probes), when the ranks run this machine's kernels (CPU); ``workspace``: the tracker's rule
    for libraries' persistent workspaces (CUDA ranks: cuBLAS's, costs/cublas.py); ``rng_state``: bytes of
    the generator state each checkpointed block keeps in the rank's memory (``watch_checkpoint_rng``; CPU
    ranks); ``device_type``: the ranks' device; ``on_step(step, "begin"|"end")``; ``target``: a tensor of the
    local batch for ``loss_fn(output, target)`` (a pipeline's last stage)."""

    optimizer: Callable | None = None
    steps: int = 1
    loss_fn: Callable | None = None
    block_size: int | None = None
    foreach_default: bool = False
    attention: Any = None
    gloo: bool = False
    probe: bool = False
    workspace: Any = None
    rng_state: int = 0
    device_type: str = "cpu"
    on_step: Callable[[int, str], None] | None = None
    target: Any = None


def train_fake(model: nn.Module, args: tuple, kwargs: dict, config: ParallelConfig, tracker: StorageTracker, device,
               step: RankStep, pipeline=None) -> StepRun:
    """``steps`` training steps of a sharded private copy already materialised as fake tensors (in the
    active FakeTensorMode), through memory()'s step loop: the loss under torch's loss_parallel when
    tensor parallel shards the vocabulary, bf16 compute without FSDP as autocast (apply.amp_context's
    rule), the output let go of before the backward as torchtitan's train step does (``del pred``).
    ``pipeline``: a pipeline rank's actions (planning/simulate/pipeline_rank.py)."""
    amp = config.param_dtype if config.mixed_precision == "bf16" and config.dp * config.cp == 1 else None
    spec = StepSpec(model, args, kwargs, optimizer=step.optimizer, autocast_dtype=amp, loss_fn=step.loss_fn,
                    steps=step.steps, accumulation=config.accumulation, keep_output=False, device=device,
                    foreach_default=step.foreach_default, probe_kernels=step.probe,
                    costs=CostOptions(registry=cost_registry()), placement=lambda: loss_context(config),
                    pipeline=pipeline)
    return run_steps(spec, StepWatch(tracker=tracker, attention=step.attention, on_step=step.on_step))


def simulate_rank(model: nn.Module, args: tuple, kwargs: dict, config: ParallelConfig, rank: int,
                  step: RankStep) -> RankRun:
    """Simulate global rank ``rank`` of ``config`` training ``model`` on ``args``/``kwargs`` (one
    data-parallel rank's local batch), run as ``step`` (RankStep) says. ``step.device_type``: the ranks'
    device; with CPU offload on "cuda" what lives on the host is kept apart from the device's peak
    (``RankRun.offload``); on "cpu" the host is the device, and offload changes nothing there."""
    block_size, gloo, workspace, rng_state, device_type = (step.block_size, step.gloo, step.workspace,
                                                           step.rng_state, step.device_type)
    import torch.distributed.fsdp  # noqa: F401  (registers FSDP2's ops before the registry is copied)
    check_context_parallel(model, args, kwargs, config, device_type if step.attention is not None else "cpu")
    dtype = torch.float32 if config.mixed_precision == "bf16" else config.model_dtype
    device = torch.device("cpu")
    host = config.offload and device_type != "cpu"
    tracker = RankTracker(block_size, gloo=gloo, workspace=workspace, cuda=device_type == "cuda")
    with fake_world(rank, config.world), simulation_warnings():
        private = meta_copy(model, dtype)
        no_kv_cache(private)                  # as training runs (and as the real runs do)
        mesh = build_mesh(config, device.type)
        parallelize(private, config, mesh)
        ring = RingCount(tracker)
        args, kwargs = shard_sequence(private, args, kwargs, mesh, config)
        if config.offload:
            prepare_offload(private, tracker, host=host)
        fake_mode = _compat.new_fake_mode(allow_non_fake_inputs=True)
        with fake_mode, eager_paths(fake_mode):
            private.to_empty(device=device)
            watch_fsdp(private, tracker, host=host)
            watch_checkpoint_rng(private, tracker, rng_state)
            with ring_attention(mesh, config, ring, step.attention):
                run = train_fake(private, args, kwargs, config, tracker, device, step)
            layouts = param_layouts(private)
    check_ring(ring, config, step.attention)
    return RankRun(rank, run, tracker, layouts=layouts, offload=host, ring=ring if config.cp > 1 else None)
