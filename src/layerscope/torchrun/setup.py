"""What every rank of a run and its single-process reference build alike, from the spec: the
model, its batch, the target and the plan (``partition()``)."""

from __future__ import annotations

import dataclasses

import torch

from ..planning.config import PartitionOptions
from ..planning.real.pipeline_run import Setup, pipeline_loss
from ..planning.split.runnable import main_tensor

__all__ = ["build_setup"]


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.rsplit(".", 1)[-1])


def build_setup(spec: str, opts: PartitionOptions) -> Setup:
    """What every rank and the single-process reference build alike: the model (same seed), the
    whole batch (the command line's inputs at ``batch_size``, fresh values in every row), one
    micro-batch of it, the target and the plan."""
    from ..api import partition
    from ..capture.inputs import map_tensors
    from ..capture.prepare import micro_batch, rebatch
    from ..specs import build_model, command_inputs

    torch.manual_seed(opts.seed)
    built = build_model(spec, "cpu", opts.overrides or {}, opts.head,   # real weights
                        allow_pickle=opts.allow_pickle, dtype=opts.model_dtype)
    model = built.model
    dtypes = [_dtype(str(d)) for d in opts.dtypes] if opts.dtypes else None
    sizes = [tuple(x) for x in opts.input_size] if opts.input_size else None
    args, kwargs = command_inputs(spec, model, built.default_inputs, torch.device("cpu"), sizes, dtypes,
                                  list(opts.input_ids) if opts.input_ids else None)
    args, kwargs = rebatch(args, kwargs, 0, opts.batch_size)
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)

    def fresh(t: torch.Tensor) -> torch.Tensor:   # distinct samples in every row of the batch
        if t.is_floating_point():
            return torch.randn(t.shape, dtype=t.dtype)
        return torch.randint(0, int(vocab or (int(t.max()) + 1)), t.shape, dtype=t.dtype)

    args, kwargs = map_tensors(args, fresh), map_tensors(kwargs, fresh)
    model.train()
    mb_args, mb_kwargs, _ = micro_batch(args, kwargs, opts.microbatches)
    rng = torch.get_rng_state()
    with torch.no_grad():
        out = main_tensor(model(*mb_args, **mb_kwargs))
    torch.set_rng_state(rng)
    g = torch.Generator().manual_seed(opts.seed + 1)
    target = torch.randn((out.shape[0] * opts.microbatches,) + tuple(out.shape[1:]), generator=g)
    del out
    device = opts.device or "cpu"
    # the loss's working memory is planned with a stand-in target (a view of the output: no
    # allocation, as the run's target, which exists before the step); the plan counts what the
    # ranks hand to schedule.step(): the batch on rank 0, the targets on the last rank, and with
    # return_outputs (torch's default) the outputs the last stage keeps
    plan_opts = dataclasses.replace(
        opts, device=None if torch.device(device).type == "cpu" else device, count_inputs=True,
        loss_fn=lambda o: pipeline_loss(main_tensor(o), main_tensor(o).detach()),
        target_bytes=target.numel() * target.element_size())
    plan = partition(model, *args, options=plan_opts, forward_kwargs=kwargs)
    return Setup(model, args, kwargs, mb_args, mb_kwargs, plan, target)
