"""What one step is (StepSpec), built once by each entry point from its options, and what watches one
run of it (StepWatch): capture's one step engine (capture/step.py ``run_steps``, and ``run_step``
where a run of identical blocks may be composed) takes these two objects, never the options unpacked.

Capture knows nothing of parallelism or pipeline schedules: a rank's placement is whatever the
planning layer hands it (its model already placed, and a context around the step), and a pipeline
rank's actions are plain data (kind, key) with the callables that run them (PipelinePass)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from ..costs import CostOptions

__all__ = ["StepSpec", "StepWatch", "PipelinePass"]


@dataclass
class PipelinePass:
    """One pass of a pipeline rank: instead of one forward, the loss and one backward, the rank's
    actions in its schedule's order (``("F", m)``: the forward of micro-batch m; ``("B", m)``: its
    backward; ``m`` may be any key, a (stage, micro-batch) pair where the rank holds several stages,
    and ``takes_loss(m)`` then says whose output is the model's). A forward's output, or on the last
    stage its loss, stays referenced, with its autograd graph, until the micro-batch's backward. The
    callables hold the stage's own machinery (received buffers, the gradients sent back, FSDP's
    deferred reduction): ``begin()`` before the pass, ``forward(m, args, kwargs)`` with the run's
    (whole) inputs, ``loss(m, output)`` on the last stage (None elsewhere), ``backward(m, held,
    engine)`` (``engine(loss)`` or ``engine(outputs, gradients)`` runs autograd's backward as the
    step's own backward does: routed SDPA stays routed in a checkpointed block's recompute), ``end()``
    after the last action (still the backward). A zero-bubble schedule splits a backward in two:
    ``("I", m)``, ``backward_input(m, held, routed)``, the gradient of the stage's input, then ``("W",
    m)``, ``backward_weight(m, routed)``, the weights' (``routed()``: the context the step's SDPA
    routing needs around their own autograd calls). Any other kind is the rank's own (``act(kind, m)``:
    a stage's UNSHARD, RESHARD and REDUCE_GRAD under torch's runtime schedules)."""

    actions: tuple
    forward: Callable[[int, tuple, dict], Any]
    backward: Callable[[int, Any, Callable], None]
    loss: Callable[[int, Any], torch.Tensor] | None = None
    begin: Callable[[], None] | None = None
    end: Callable[[], None] | None = None
    takes_loss: Callable[[Any], bool] | None = None
    backward_input: Callable[[Any, Any, Callable], None] | None = None
    backward_weight: Callable[[Any, Callable], None] | None = None
    act: Callable[[str, Any], None] | None = None


@dataclass(frozen=True)
class StepSpec:
    """One training step (or, ``training=False``, one no-grad forward), repeated ``steps`` times.

    ``model``, ``args``/``kwargs``: what runs and its inputs (the whole inputs; a pipeline rank splits
    them itself). ``optimizer``: a callable params -> Optimizer (None: no optimizer step).
    ``autocast_dtype``: forward and loss under torch.autocast. ``loss_fn``: ``output -> scalar``, or a
    StepLoss (capture/loss.py) bound to the run's own inputs; None: ``default_loss``. ``accumulation``:
    forward/backward passes per step. ``keep_output``: the output alive through the backward (False:
    let go once the loss is computed, torchtitan's ``del pred``).
    ``simulate``: on fake tensors claiming ``device`` (else the model's own tensors, on ``device``).
    ``foreach_default``: optimizers that leave ``foreach`` unset use it (as on CUDA).
    ``probe_kernels``: a simulation sizes kernels whose fake sizes are wrong by one real call on zeros.
    ``costs``: the cost options of the recorded passes (None: the defaults).
    ``placement``: this rank's parallel placement, applied by the planning layer before the step: the
    model is then a private copy whose state is already fake tensors of the active FakeTensorMode, run
    as it is; the callable returns the context the step runs in (tensor parallel's loss_parallel).
    ``pipeline``: each pass runs a pipeline rank's actions (PipelinePass) in place of one forward and
    backward. ``compose``: a simulation of a model with a run of identical blocks may run five of them
    and compose the rest (capture/composed.py; ``run_step`` falls back to the whole model).
    ``micro_inputs``: a measured run's inputs of each accumulation pass, ``(args, kwargs)`` pairs, one a
    pass in turn (a real pipeline run's reference, its micro-batches); None: ``args``/``kwargs`` every
    pass."""

    model: nn.Module
    args: tuple = ()
    kwargs: dict | None = None
    training: bool = True
    optimizer: Callable | None = None
    autocast_dtype: torch.dtype | None = None
    loss_fn: Callable | None = None
    steps: int = 1
    accumulation: int = 1
    keep_output: bool = True
    simulate: bool = True
    device: torch.device = torch.device("cpu")
    foreach_default: bool = False
    probe_kernels: bool = True
    costs: CostOptions | None = None
    placement: Callable[[], ContextManager] | None = None
    pipeline: PipelinePass | None = None
    compose: bool = False
    micro_inputs: tuple | None = None
    module_mode: bool | None = None     # the modules' train flag during the step (None: ``training``'s)

    @property
    def prepared(self) -> bool:
        """The model is placed already (its state fake tensors): it runs as it is, nothing swapped in."""
        return self.placement is not None


@dataclass
class StepWatch:
    """What watches one run of a step: the storage tracker (None: nothing recorded, the measured
    run), the SDPA router (capture/attention.py), ``on_step(step, "begin"|"end")`` around each step,
    ``close()`` once the run is over (a progress bar's), and ``modules(named)``: a context entered
    around the steps with the (name, module) pairs that run, for a caller's own module hooks
    (partition's marks where each unit's forward and backward begin, planning/steptime/unit_timing.py);
    ``on_grads(step)`` after a training step's last backward, before its optimizer step (the gradients
    as the step made them: a real run's reference keeps its first step's)."""

    tracker: Any = None
    attention: Any = None
    on_step: Callable[[int, str], None] | None = None
    close: Callable[[], None] | None = None
    modules: Callable[[list], ContextManager] | None = None
    on_grads: Callable[[int], None] | None = None

    def done(self) -> None:
        if self.close is not None:
            self.close()
