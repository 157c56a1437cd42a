"""`layerscope split`: the optimal pipeline stages, and with --run their training under torchrun."""

from __future__ import annotations

import argparse

from .common import build_spec, check_device, emit, status, write_output
from .flags import given


def _split_options(ns: argparse.Namespace) -> dict:
    """split's options by their PartitionOptions names, for partition() and for every rank of a --run:
    each flag's field at its value, given (cli/flags.py) or its default (None defaults left out), so a
    --run hands the ranks every option as partition() takes it; the launcher's own (--batch-size,
    --steps) it takes apart."""
    import dataclasses

    from ..options import flag_fields
    from ..planning.config import LAUNCHER_FIELDS, PartitionOptions
    defaults = {f.name: f.default for f in flag_fields(PartitionOptions)
                if f.default is not dataclasses.MISSING and f.default is not None}
    return {k: v for k, v in {**defaults, **given(ns, PartitionOptions)}.items() if k not in LAUNCHER_FIELDS}


def run_split(ns: argparse.Namespace) -> int:
    from ..api import partition
    from ..capture.prepare import rebatch
    from ..planning.config import SCHEDULES, PartitionOptions
    from ..specs import parse_overrides

    if ns.run:
        from ..torchrun import launch
        # every rank rebuilds the model and its inputs from these options (specs.command_inputs)
        check_device(ns.device)
        procs = SCHEDULES[ns.schedule].ranks(ns.stages, ns.stages_per_rank)
        with status(f"training {ns.stages} stages on {procs} ranks under torchrun", ns):
            res = launch(ns.spec, overrides=parse_overrides(ns.set), batch_size=ns.batch_size, steps=ns.steps,
                         head=ns.head, input_size=ns.input_size, dtypes=ns.dtype, input_ids=ns.input_ids,
                         model_dtype=ns.model_dtype, allow_pickle=ns.allow_pickle,
                         **{**_split_options(ns), "device": ns.device or "cpu"})
        text = res.plan.table() + "\n" + res.table()
        return write_output(ns, text)
    model, args, kwargs = build_spec(ns, None if ns.device == "cuda" else ns.device)
    args, kwargs = rebatch(args, kwargs, 0, ns.batch_size)
    with status("planning", ns):
        plan = partition(model, *args, options=PartitionOptions(**_split_options(ns)), **kwargs)
    return emit(ns, plan)
