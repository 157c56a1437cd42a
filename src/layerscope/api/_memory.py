"""``memory()``: one training step (or no-grad forward) simulated on fake tensors, or tracked on the
real ones, per category, over time and per layer."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..analyses.memory_step import memory_step
from ..capture.guard import exclusive
from ..options import MemoryOptions, entry_options
from ..reports.memory import MemoryReport

__all__ = ["memory"]


@exclusive
def memory(model: nn.Module, *args: Any, optimizer=None, training: bool = True, device=None, input_size=None,
           batch_size: int | None = None, limit=None, options: MemoryOptions | None = None,
           forward_kwargs: dict | None = None, **kwargs: Any) -> MemoryReport:
    """Memory of a training step (or, with ``training=False``, a no-grad forward), per category, over
    time and per layer. Returns a MemoryReport.

    The step is simulated on fake tensors: the model's own forward, autograd's backward and the
    optimizer's real ``step()`` run without computing or allocating, and every storage they create or
    free is recorded, so a model that fits nowhere can be planned anywhere. ``device`` is where the
    memory is predicted for (default: where the model is; "cuda" rounds every storage to the CUDA
    allocator's 512-byte blocks). ``optimizer`` is a torch.optim class, a factory taking the
    parameters, an instance (its class and defaults are used) or a name like "adamw". ``progress=True``
    shows a bar on stderr, one tick per step. ``steps``
    training steps are run (optimizer state exists from the first step on); ``accumulation`` runs that
    many forward/backward passes per step. ``loss`` is the step's loss: "auto" (the default) the model's
    own where its forward takes labels and it has a language-model head (given labels, a copy of the
    token ids, as a training loop does), else the next-token cross-entropy in fp32 where the output is
    logits over the token ids, else the sum of the output; "model", "cross-entropy" or "sum" choose one
    (a ``loss_fn(output) -> scalar`` instead is the loss); the notes say which ran. ``autocast_dtype``
    (torch.bfloat16/float16 or "bf16"/"fp16")
    runs forward and loss under torch.autocast. ``batch_size`` re-sizes the inputs along
    ``batch_dim`` (default 0). ``simulate=False`` tracks the real step on the model's own tensors
    instead (everything is restored afterwards). ``measure=True`` also runs the real step and measures
    it with the allocator (default on for CUDA models). Like every entry point, this runs a copy of the
    module tree (capture/shadow.py): another thread calling the model meanwhile sees no mode, hook or
    tensor change; a real step on a CPU model updates clones of the weights, but on a CUDA model it
    updates the model's own weights in place until they are put back (a second copy on the device
    could not fit), which another thread's forward would see. ``limit`` (bytes or "80GiB") is shown
    against the peak. What the simulation had to make up (random draws taken at their median, values
    read back from tensors that have none, kernels it could not size) is listed in ``notes``.
    ``gpu`` (a name of ``layerscope.GPUS`` or ``layerscope.gpu(...)``) predicts for that CUDA GPU: each
    ``scaled_dot_product_attention`` call runs, and saves for backward, what the kernel torch's CUDA
    rules pick there saves (flash: q, k, v, the output and a log-sum-exp; math: the probabilities);
    a CUDA prediction without one uses the H200's rules, and ``attention`` forces a kernel. A CUDA
    prediction holds cuBLAS's two persistent workspaces (the forward's thread and the backward's;
    32 MiB each on Hopper and Blackwell, costs/cublas.py) in the ``workspace`` category.
    ``keep_output=False`` lets go of the model's output once the loss is computed (a loop that
    deletes it before ``loss.backward()``, as torchtitan's does); by default it lives through the
    backward, as ``outputs = model(...)`` held until the next step does.

    Options: the named keywords above, or any other field of ``layerscope.MemoryOptions``
    (``autocast_dtype``, ``batch_dim``, ``dtypes``, ``loss``, ``loss_fn``, ``steps``, ``accumulation``,
    ``simulate``, ``measure``, ``progress``, ``gpu``, ``attention``, ``keep_output``) as a keyword, or all of them in
    ``options=MemoryOptions(...)``; an option given both in ``options=`` and as a keyword (a named one
    away from its default) is an InputError. A forward argument named like an option goes in
    ``forward_kwargs``.
    """
    opts, kwargs = entry_options(MemoryOptions, options, kwargs, forward_kwargs, optimizer=optimizer,
                                 training=training, device=device, input_size=input_size, batch_size=batch_size,
                                 limit=limit)
    return MemoryReport(**memory_step(model, args, kwargs, opts))
