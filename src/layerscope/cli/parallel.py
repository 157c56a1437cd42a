"""`layerscope parallel`: per-rank memory of a sharded-training configuration."""

from __future__ import annotations

import argparse

from ..errors import InputError
from .common import build_spec, emit, live, status
from .flags import given, searched


def run_parallel(ns: argparse.Namespace) -> int:
    from ..api import parallel
    from ..options import ParallelOptions
    from ..planning.config import ParallelConfig

    # the configuration first: a bad one is refused before the model is built
    if ns.memory_limit is not None:
        from ..options import parse_bytes
        parse_bytes(ns.memory_limit)
    fractions = _fractions(ns.fractions)
    if ns.run and ns.steps is not None and ns.steps < 3:
        raise InputError(f"--run needs --steps of at least 3 (the first two steps are not measured: the first's "
                         f"gradients are gathered for the comparison, the second warms up), got --steps {ns.steps}")
    if ns.time_budget is not None:
        raise InputError("--time-budget was replaced by --search-limit PASSES (a count of simulation passes, not "
                         "seconds, so the search's answer does not depend on the machine's speed; default 40)")
    if ns.run and ns.loss not in ("auto", "cross-entropy"):
        raise InputError(f"--run trains on the next-token cross-entropy of the logits, which the simulation takes "
                         f"too: leave out --loss {ns.loss}")
    if ns.run and ns.head is None and ns.spec.startswith("hf:") and ":" not in ns.spec[3:]:
        # a config alone builds the bare model, whose output has no logits: the run trains the causal LM,
        # and the simulation builds the same (a named class, or a spec's own model, is taken as it is)
        ns.head = "causal-lm"
    # every flag given, as the fields of the configuration and of parallel()'s options (cli/flags.py): a
    # flag not given is None and leaves the field's own default
    config_flags = given(ns, ParallelConfig)
    run = {**given(ns, ParallelOptions), "fractions": fractions}
    if ns.search:
        if ns.run and (ns.input_ids is None or len(ns.input_ids) != 2):
            raise InputError("--run needs --input-ids B,S (token ids: the run draws its own of that shape)")
        model, args, kwargs = build_spec(ns, "meta")
        # the search's dimensions given are held fixed; the others are the configuration's and run's options
        rep = parallel(model, *args, forward_kwargs=kwargs, progress=live(ns), **config_flags, **run)
        if ns.run:
            rep = _run_chosen(ns, model, rep, fractions)
        return emit(ns, rep)
    # --input-ids B,S: B is the local batch, checked against --microbatches before the model is built
    config = ParallelConfig(**config_flags, local_batch=ns.input_ids[0] if ns.input_ids else None)
    model, args, kwargs = build_spec(ns, "meta")      # the simulation never needs the weights
    if ns.run:
        loss_fn, target = _check_run(ns, args, kwargs)
        run = {**{k: v for k, v in run.items() if k != "loss"}, "loss_fn": loss_fn, "target": target}
    with status(f"simulating {config.world} rank(s)", ns):
        rep = parallel(model, *args, config=config, forward_kwargs=kwargs, **run)
    if ns.run:
        rep = _run(ns, rep, config)
    return emit(ns, rep)


def _fractions(items: list[str] | None) -> dict | None:
    """--fraction NAME=V, repeatable: the step-time model's overrides (checked by parallel())."""
    if not items:
        return None
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise InputError(f"--fraction takes NAME=NUMBER (matmul=0.6), got {item!r}") from None
        if not eq:
            raise InputError(f"--fraction takes NAME=NUMBER (matmul=0.6), got {item!r}")
    return out


def _check_run(ns: argparse.Namespace, args, kwargs):
    """--run trains the configuration for real under torchrun here (gloo, CPU ranks): the prediction it
    is compared with is for CPU ranks, with the run's loss (fp32 next-token cross-entropy on the logits;
    a pipeline's last stage takes it per micro-batch, the labels split alike). Returns (loss_fn, target)."""
    import torch.nn.functional as F

    if ns.device != "cpu":
        raise InputError("--run trains on this machine's CPU ranks (gloo): add --device cpu")
    if ns.input_ids is None or len(ns.input_ids) != 2:
        raise InputError("--run needs --input-ids B,S (token ids: the run draws its own of that shape)")
    import torch
    labels = torch.zeros(tuple(ns.input_ids), dtype=torch.long)      # shapes only: the values do not matter

    def loss_fn(out, target):   # what the real run computes (parallel.real.training_loss)
        """the next-token cross-entropy of the logits in fp32 that --run trains with"""
        logits = getattr(out, "logits", out[0] if isinstance(out, (tuple, list)) else out)
        return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(0, 1))
    return loss_fn, labels


def _run_chosen(ns: argparse.Namespace, model, found, fractions):
    """--search --run: the chosen configuration simulated for this machine's CPU ranks (gloo) and trained
    for real under torchrun, the search's ranking kept beside it. The memory compared is the CPU ranks'
    (the search's is the GPU's); the step time measured here is the CPU's, which the GPU model does not
    predict."""
    import torch

    from ..api import parallel
    from ..options import ParallelOptions
    from ..planning.config import ParallelConfig
    best = next((r for r in found.search["candidates"] if r["status"] == "fits"), None)
    if best is None:
        raise InputError("--run: no configuration the search found fits, so there is none to run")
    c = best["config"]
    chosen = found.plan
    # the flags given, with the search's dimensions as it chose them
    config = ParallelConfig(**given(ns, ParallelConfig, searched=False),
                            **{f: c[f] for f in searched(ParallelConfig) if f != "global_batch"},
                            global_batch=chosen.global_batch)
    ns.input_ids = [c["local_batch"], ns.input_ids[1]]
    ns.device = "cpu"
    loss_fn, target = _check_run(ns, None, None)
    ids = torch.zeros(tuple(ns.input_ids), dtype=torch.long, device="meta")
    with status("simulating the chosen configuration on CPU ranks", ns):
        run = {k: v for k, v in given(ns, ParallelOptions).items() if k in ("optimizer", "steps")}
        rep = parallel(model, ids, config=config, device="cpu", loss_fn=loss_fn, target=target, fractions=fractions,
                       **run)
    rep = _run(ns, rep, config)
    rep.search = found.search
    rep.notes = (f"--search chose this configuration for {found.options.get('gpu')} GPUs ({chosen.step_time * 1e3:,.1f} "
                 "ms a step predicted there); --run trained it here on CPU ranks (gloo): the memory above is "
                 "predicted for CPU ranks, beside what each rank measured",) + tuple(rep.notes)
    return rep


def _run(ns: argparse.Namespace, rep, config):
    """The configuration trained for real; the report gets the run's figures (``plans[0].measured``)."""
    import dataclasses

    from ..planning.simulate.results import measured_figures
    from ..specs import parse_overrides
    from ..torchrun import launch_parallel
    b, s = ns.input_ids
    with status(f"running {config.world} rank(s) under torchrun", ns):
        real = launch_parallel(ns.spec, dataclasses.replace(config, local_batch=None),
                               input_ids=(b * config.dp * config.accumulation, s), steps=ns.steps or 4,
                               optimizer=ns.optimizer, overrides=parse_overrides(ns.set), head=ns.head)
    plan = dataclasses.replace(rep.plan, measured=measured_figures(real))
    rep.plans = (plan,) + tuple(rep.plans[1:])
    return rep
