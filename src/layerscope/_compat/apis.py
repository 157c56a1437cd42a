"""The private torch APIs layerscope uses, one entry each: what it is in torch's words, the first torch
release known to have it, and the resolver that finds it (``_API``). The package (``layerscope._compat``)
resolves an entry on first use and caches it; a resolver raises AttributeError or ImportError where this
torch lacks the API, and tests replace resolvers to play an older torch."""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

__all__ = ["_API", "_HOOK_DICTS"]


def _module(name: str):
    return importlib.import_module(name)


def _event_tree():
    # an unbound method: called on ``prof.profiler.kineto_results``
    return torch._C._autograd._ProfilerResult.experimental_event_tree


# name -> (the private API in torch's words, first torch release known to have it, resolver).
# A resolver raises AttributeError or ImportError where this torch lacks the API; tests replace
# resolvers to play an older torch.
_API: dict[str, tuple[str, str, Callable[[], Any]]] = {
    "TorchDispatchMode": ("torch.utils._python_dispatch.TorchDispatchMode", "2.4",
                          lambda: _module("torch.utils._python_dispatch").TorchDispatchMode),
    "dispatch_mode_stack": ("torch.utils._python_dispatch._get_current_dispatch_mode_stack", "2.4",
                            lambda: _module("torch.utils._python_dispatch")._get_current_dispatch_mode_stack),
    "disable_current_modes": ("torch.utils._python_dispatch._disable_current_modes", "2.4",
                              lambda: _module("torch.utils._python_dispatch")._disable_current_modes),
    "no_dispatch": ("torch.utils._mode_utils.no_dispatch", "2.4", lambda: _module("torch.utils._mode_utils").no_dispatch),
    "pytree": ("torch.utils._pytree", "2.4", lambda: _module("torch.utils._pytree")),
    "sequence_nr": ("torch._C._autograd._get_sequence_nr", "2.4", lambda: torch._C._autograd._get_sequence_nr),
    "current_autograd_node": ("torch._C._current_autograd_node", "2.4", lambda: torch._C._current_autograd_node),
    "composite_implicit_key": ("torch._C.DispatchKey.CompositeImplicitAutograd", "2.4",
                               lambda: torch._C.DispatchKey.CompositeImplicitAutograd),
    "dispatch_has_kernel": ("torch._C._dispatch_has_kernel_for_dispatch_key", "2.4",
                            lambda: torch._C._dispatch_has_kernel_for_dispatch_key),
    "parse_schema": ("torch._C.parse_schema", "2.4", lambda: torch._C.parse_schema),
    "jit_pass_inline": ("torch._C._jit_pass_inline", "2.4", lambda: torch._C._jit_pass_inline),
    "profiler_enabled": ("torch.autograd._profiler_enabled", "2.4", lambda: torch.autograd._profiler_enabled),
    "event_tree": ("torch._C._autograd._ProfilerResult.experimental_event_tree (kineto's event tree)", "2.4",
                   _event_tree),
    "reparametrize_module": ("torch.nn.utils.stateless._reparametrize_module", "2.4",
                             lambda: _module("torch.nn.utils.stateless")._reparametrize_module),
    "OpOverload": ("torch._ops.OpOverload", "2.4", lambda: torch._ops.OpOverload),
    "OpOverloadPacket": ("torch._ops.OpOverloadPacket", "2.4", lambda: torch._ops.OpOverloadPacket),
    "HigherOrderOperator": ("torch._ops.HigherOrderOperator", "2.4", lambda: torch._ops.HigherOrderOperator),
    "FakeTensor": ("torch._subclasses.fake_tensor.FakeTensor", "2.4",
                   lambda: _module("torch._subclasses.fake_tensor").FakeTensor),
    "FakeTensorMode": ("torch._subclasses.fake_tensor.FakeTensorMode", "2.4",
                       lambda: _module("torch._subclasses.fake_tensor").FakeTensorMode),
    "engine_run_backward": ("torch.autograd.graph._engine_run_backward", "2.4",
                            lambda: _module("torch.autograd.graph")._engine_run_backward),
    "make_grads": ("torch.autograd._make_grads", "2.4", lambda: torch.autograd._make_grads),
    # planning (pipeline stages): torch's zero-bubble backward, split in the input's gradient and the weights'
    "stage_backward_input": ("torch.distributed.pipelining._backward.stage_backward_input", "2.6",
                             lambda: _module("torch.distributed.pipelining._backward").stage_backward_input),
    "stage_backward_weight": ("torch.distributed.pipelining._backward.stage_backward_weight", "2.6",
                              lambda: _module("torch.distributed.pipelining._backward").stage_backward_weight),
    "stage_backward": ("torch.distributed.pipelining._backward.stage_backward", "2.6",
                       lambda: _module("torch.distributed.pipelining._backward").stage_backward),
    "queue_callback": ("torch.autograd.Variable._execution_engine.queue_callback", "2.4",
                       lambda: torch.autograd.Variable._execution_engine.queue_callback),
    "grouped_mm": ("torch.ops.aten._grouped_mm", "2.8", lambda: torch.ops.aten._grouped_mm.default),
    "top_saved_tensors_hooks": ("torch._C._autograd._top_saved_tensors_default_hooks", "2.4",
                                lambda: torch._C._autograd._top_saved_tensors_default_hooks),
    # planning (simulation): FSDP2's per-module state
    "fsdp_state": ("torch.distributed.fsdp.FSDPModule._get_fsdp_state (its _fsdp_param_group)", "2.6",
                   lambda: _module("torch.distributed.fsdp").FSDPModule._get_fsdp_state),
    "interleaved_rank_ops": ("torch.distributed.pipelining.schedules.ScheduleInterleaved1F1B."
                             "_calculate_single_rank_operations", "2.6",
                             lambda: _module("torch.distributed.pipelining.schedules")
                             .ScheduleInterleaved1F1B._calculate_single_rank_operations),
    "zb_rank_ops": ("torch.distributed.pipelining.schedules.ScheduleInterleavedZeroBubble."
                    "_calculate_single_rank_operations and _add_bubbles_to_actions", "2.6",
                    lambda: _module("torch.distributed.pipelining.schedules").ScheduleInterleavedZeroBubble),
    "add_unshard_reshard": ("torch.distributed.pipelining.schedules._add_unshard_reshard", "2.6",
                            lambda: _module("torch.distributed.pipelining.schedules")._add_unshard_reshard),
    "add_reduce_grad": ("torch.distributed.pipelining.schedules._add_reduce_grad", "2.6",
                        lambda: _module("torch.distributed.pipelining.schedules")._add_reduce_grad),
    "zbv_rank_ops": ("torch.distributed.pipelining.schedules.ScheduleZBVZeroBubble."
                     "_calculate_single_rank_operations", "2.6",
                     lambda: _module("torch.distributed.pipelining.schedules")
                     .ScheduleZBVZeroBubble._calculate_single_rank_operations),
    # planning (applying the parallelisms)
    # expert parallel's token dispatch (planning/expert_parallel.py), as torchtitan calls them
    "all_to_all_single_autograd": ("torch.distributed._functional_collectives.all_to_all_single_autograd", "2.4",
                                   lambda: _module("torch.distributed._functional_collectives")
                                   .all_to_all_single_autograd),
    "all_to_all_single": ("torch.distributed._functional_collectives.all_to_all_single", "2.4",
                          lambda: _module("torch.distributed._functional_collectives").all_to_all_single),
    "wait_tensor": ("torch.distributed._functional_collectives.wait_tensor", "2.4",
                    lambda: _module("torch.distributed._functional_collectives").wait_tensor),
    "FakeStore": ("torch.testing._internal.distributed.fake_pg.FakeStore (importing it registers the 'fake' "
                  "process-group backend)", "2.4",
                  lambda: _module("torch.testing._internal.distributed.fake_pg").FakeStore),
    "checkpoint_wrapper": ("torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper", "2.4",
                           lambda: _module("torch.distributed.algorithms._checkpoint.checkpoint_wrapper")
                           .checkpoint_wrapper),
    "checkpoint_prefix": ("torch.distributed.algorithms._checkpoint.checkpoint_wrapper._CHECKPOINT_PREFIX", "2.4",
                          lambda: _module("torch.distributed.algorithms._checkpoint.checkpoint_wrapper")
                          ._CHECKPOINT_PREFIX),
    # DTensor's process-wide random-op state: made by the first random op on a CUDA mesh, kept for the
    # process's life; a simulation (on its CPU mesh) and a measured run must not meet another run's
    "dtensor_random": ("torch.distributed.tensor._random (its _rng_tracker)", "2.5",
                       lambda: _module("torch.distributed.tensor._random")),
    # DTensor's caches of sharding propagation and redistribution plans, keyed by device meshes that compare
    # equal across process groups (same shape, names, ranks): a mesh of a group destroyed since answers
    # for a new one ("Could not resolve the process group"); a simulation clears them when its world
    # begins and ends
    "dtensor_mesh_caches": ("DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear (and "
                            "torch._C._clear_DTensor_sharding_propagator_cache, "
                            "torch.distributed.tensor._redistribute.clear_redistribute_planner_cache where they "
                            "exist)", "2.5",
                            lambda: _dtensor_mesh_caches()),
    # planning (context parallel): torch's ring attention (the SDPA handlers DTensor's dispatcher calls, its
    # options, the head-tail load balancer) and DeviceMesh's flattening of two dimensions into one (FSDP over
    # dp_shard x cp, as torchtitan's mesh)
    "context_parallel": ("torch.distributed.tensor.experimental._context_parallel._attention", "2.9",
                         lambda: _module("torch.distributed.tensor.experimental._context_parallel._attention")),
    "head_tail_balancer": ("torch.distributed.tensor.experimental._context_parallel._load_balancer"
                           "._HeadTailLoadBalancer", "2.9",
                           lambda: _module("torch.distributed.tensor.experimental._context_parallel._load_balancer")
                           ._HeadTailLoadBalancer),
    "mesh_flatten": ("torch.distributed.device_mesh.DeviceMesh._flatten", "2.6",
                     lambda: _module("torch.distributed.device_mesh").DeviceMesh._flatten),
    "c10d_reduce_scatter": ("torch.ops._c10d_functional.reduce_scatter_tensor", "2.4",
                            lambda: torch.ops._c10d_functional.reduce_scatter_tensor.default),
    "c10d_all_to_all": ("torch.ops._c10d_functional.all_to_all_single", "2.4",
                        lambda: torch.ops._c10d_functional.all_to_all_single.default),
    "flex_attention_hop": ("torch._higher_order_ops.flex_attention", "2.5",
                           lambda: _module("torch._higher_order_ops").flex_attention),
    # capture.measure: a measured CUDA step makes cuBLAS's workspaces itself, as a training job's first step
    # (a build without CUDA has no cuBLAS: nothing to give back)
    "clear_cublas_workspaces": ("torch._C._cuda_clearCublasWorkspaces", "2.4",
                                lambda: torch._C._cuda_clearCublasWorkspaces if torch.version.cuda else (lambda: None)),
    "c10_cpu_report_flags": ("libc10's FLAGS_caffe2_report_cpu_memory_usage and FLAGS_caffe2_log_level (the CPU "
                             "allocator's own count of every thread's allocations, logged)", "2.4",
                             lambda: _c10_cpu_report_flags()),
    "module_hook_dicts": ("torch.nn.Module's forward hook dicts (_forward_pre_hooks, _forward_hooks and their "
                          "_with_kwargs / _always_called companions)", "2.4", lambda: _module_hook_dicts()),
    # planning/tp_styles: transformers' packed_colwise shards a fused [gate | up] weight as torch's strided shard
    "StridedShard": ("torch.distributed.tensor.placement_types._StridedShard", "2.5",
                     lambda: _module("torch.distributed.tensor.placement_types")._StridedShard),
}

# What nn.Module.register_forward_pre_hook(with_kwargs=True) and register_forward_hook(with_kwargs=True,
# always_call=True) write, hook dict first: the module tracker writes the same entries itself, as
# those methods do without their RemovableHandle (two Python objects and five weak references per
# module, most of the cost of hooking a deep model).
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


def _dtensor_mesh_caches():
    """A function that empties DTensor's caches that hold device meshes (see the API's entry)."""
    from torch.distributed.tensor import DTensor
    clears = [DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear]
    native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)   # the C++ fast path's own
    if native is not None:
        clears.append(native)
    planner = getattr(_module("torch.distributed.tensor._redistribute"), "clear_redistribute_planner_cache", None)
    if planner is not None:
        clears.append(planner)

    def clear() -> None:
        for fn in clears:
            fn()
    return clear


def _c10_cpu_report_flags():
    """(report, log_level): ctypes views of two of libc10's command-line flags. With the first set,
    the CPU allocator's reporter (c10's ProfiledCPUMemoryReporter) keeps the size of every block and
    its running total for every thread, and logs each allocation and free with that total at INFO
    level, which the second (c10's minimum level, 0 = INFO) lets through."""
    import ctypes
    import glob
    import os

    libs = sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "*c10.*")))
    libs = [p for p in libs if os.path.basename(p).split(".")[0] in ("libc10", "c10")]
    if not libs:
        raise ImportError("no libc10 beside torch")
    try:
        lib = ctypes.CDLL(libs[0])
        return (ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage"),
                ctypes.c_int32.in_dll(lib, "FLAGS_caffe2_log_level"))
    except (OSError, ValueError) as e:    # not loadable, or a build without the flags
        raise ImportError(str(e)) from e


def _module_hook_dicts() -> tuple[str, ...]:
    m = torch.nn.Module()
    for name in _HOOK_DICTS:
        if not isinstance(m.__dict__.get(name), dict):
            raise AttributeError(name)
    return _HOOK_DICTS
