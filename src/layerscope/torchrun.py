"""Run a StagePlan as a real pipeline: torchrun, one process per rank, gloo on CPU (NCCL on GPU).

``launch()`` (the CLI's ``split --run``) writes the run's settings to a JSON file and starts
``torchrun --nproc_per_node P -m layerscope.torchrun FILE``. Every rank builds the model from
the same spec and seed, computes the same plan, builds its own stage (export path when torch.export
traces the model, module ownership otherwise), trains ``steps`` steps with the schedule and writes
its measured step time, peak memory (the stage's parameters and buffers plus the CPU allocator's
events from the first step on, peak taken in the last step; CUDA: max_memory_allocated in the last
step) and, on the last rank, the losses.
The launcher trains the same model in one process with the same micro-batches (gradient
accumulation) and compares the losses.

``layerscope.pipeline.stages.pipeline_stage(plan, model, rank, args, kwargs)`` gives a user the
PipelineStage for their rank, for their own training loop. This module sits above the api (it builds
models from specs and plans them with ``partition()``), outside ``pipeline/``, which the api uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

from .errors import InputError
from .pipeline.stages import flat_inputs, main_tensor, pipeline_stage

__all__ = ["launch", "RunResult", "reference_losses"]


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    # the mean squared error, written out: F.mse_loss's scalar result shares the storage of an
    # output-sized buffer (torch 2.13, CPU), so every loss the schedule keeps until the step ends
    # would hold a copy of the stage's output alive
    return (out.float() - target.float()).pow(2).mean()


def _setup(cfg: dict):
    from .api import partition
    from .capture.prepare import micro_batch, rebatch
    from .capture.inputs import map_tensors
    from .specs import build_model

    torch.manual_seed(cfg["seed"])
    built = build_model(cfg["spec"], "cpu", cfg.get("overrides") or {})   # real weights to train
    model = built.model
    if built.default_inputs is None:
        raise InputError(f"{cfg['spec']} gives no default inputs to run a pipeline with")
    args, kwargs = built.default_inputs(torch.device("cpu"))
    args, kwargs = rebatch(args, kwargs, 0, cfg["batch_size"])
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)

    def fresh(t: torch.Tensor) -> torch.Tensor:   # distinct samples in every row of the batch
        if t.is_floating_point():
            return torch.randn(t.shape, dtype=t.dtype)
        return torch.randint(0, int(vocab or (int(t.max()) + 1)), t.shape, dtype=t.dtype)

    args, kwargs = map_tensors(args, fresh), map_tensors(kwargs, fresh)
    model.train() if cfg.get("train_mode", True) else model.eval()
    # the loss's working memory is planned with a stand-in target (a view of the output: no
    # allocation, as the run's target, which exists before the step)
    plan = partition(model, *args, stages=cfg["stages"], by=cfg["by"], schedule=cfg["schedule"],
                     microbatches=cfg["microbatches"], optimizer=cfg["optimizer"],
                     loss_fn=lambda o: _loss(main_tensor(o), main_tensor(o).detach()), **kwargs)
    mb_args, mb_kwargs, _ = micro_batch(args, kwargs, cfg["microbatches"])
    with torch.no_grad():
        out = main_tensor(model(*mb_args, **mb_kwargs))
    g = torch.Generator().manual_seed(cfg["seed"] + 1)
    target = torch.randn((out.shape[0] * cfg["microbatches"],) + tuple(out.shape[1:]), generator=g)
    return model, args, kwargs, mb_args, mb_kwargs, plan, target


def _optimizer(name: str, params):
    from .options import optimizer_factory
    return optimizer_factory(name)(params)


def reference_losses(cfg: dict):
    """Single-process training with the same micro-batches, loss and optimizer: (losses, plan)."""
    model, args, kwargs, _, _, plan, target = _setup(cfg)
    tensors, rebuild = flat_inputs(args, kwargs)
    m = cfg["microbatches"]
    chunks = list(zip(*[t.chunk(m) for t in tensors]))
    targets = target.chunk(m)
    opt = _optimizer(cfg["optimizer"], [p for p in model.parameters() if p.requires_grad])
    losses = []
    for _ in range(cfg["steps"]):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for c, t in zip(chunks, targets):
            a, k = rebuild(c)
            loss = _loss(main_tensor(model(*a, **k)), t)
            (loss / m).backward()
            total += loss.item()
        opt.step()
        losses.append(total / m)
    return losses, plan


def worker(cfg_path: str) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    from .capture.measure import measure_cpu, state_bytes

    with open(cfg_path) as f:
        cfg = json.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available() and cfg.get("device", "cpu") != "cpu"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    try:
        model, args, kwargs, mb_args, mb_kwargs, plan, target = _setup(cfg)
        if plan.num_stages != world:
            raise InputError(f"the plan has {plan.num_stages} stages for {world} ranks")
        stage, sync, path = pipeline_stage(plan, model, rank, mb_args, mb_kwargs, device=device,
                                           path=cfg.get("path", "auto"))
        params = [p for p in stage.submod.parameters() if p.requires_grad]
        opt = _optimizer(cfg["optimizer"], params)
        cls = ScheduleGPipe if cfg["schedule"] == "gpipe" else Schedule1F1B
        sched = cls(stage, n_microbatches=cfg["microbatches"], loss_fn=_loss)
        tensors, _ = flat_inputs(args, kwargs)
        tensors = [t.to(device) for t in tensors]
        times, losses = [], []

        def one_step():
            opt.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            mb_losses: list = []
            if rank == 0:
                sched.step(*tensors, target=target.to(device) if world == 1 else None,
                           losses=mb_losses if world == 1 else None, return_outputs=False)
            elif rank == world - 1:
                sched.step(target=target.to(device), losses=mb_losses, return_outputs=False)
            else:
                sched.step(return_outputs=False)
            sync()
            opt.step()
            times.append(time.perf_counter() - t0)
            if mb_losses:
                losses.append(sum(x.item() for x in mb_losses) / len(mb_losses))

        steps = cfg["steps"]
        # live tensor bytes of this rank from here on: the stage's parameters and buffers (alive now)
        # plus every allocation from the first step on (optimizer state, the schedule's receive
        # buffers, gradients, activations); the peak is taken in the last step (steady state)
        before = state_bytes([*stage.submod.parameters(), *stage.submod.buffers()])

        def all_steps(on_step):
            for i in range(steps):
                on_step(i, "begin")
                one_step()
                on_step(i, "end")

        if device.type == "cpu":
            measured = measure_cpu(all_steps, before, steps)
            peak = measured.step_peaks[-1]
        else:
            all_steps(lambda i, when: torch.cuda.reset_peak_memory_stats(device)
                      if when == "begin" and i == steps - 1 else None)
            peak = torch.cuda.max_memory_allocated(device)
        out = {"rank": rank, "path": path, "times": times, "losses": losses, "peak_bytes": peak,
               "predicted_bytes": plan.stages[rank].memory_bytes,
               "params": sum(p.numel() for p in stage.submod.parameters())}
        with open(os.path.join(cfg["out"], f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True)
class RunResult:
    plan: object
    ranks: tuple[dict, ...]
    reference: tuple[float, ...]
    losses: tuple[float, ...]
    path: str

    @property
    def loss_rel_diff(self) -> float:
        return max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(self.losses, self.reference))

    def table(self) -> str:
        from .render.text import text_table
        from .render.units import iec
        header = ["Stage", "Step time (median)", "Peak measured", "Peak predicted", "Error"]
        body = []
        for r in self.ranks:
            ts = sorted(r["times"][1:] or r["times"])
            err = (r["predicted_bytes"] - r["peak_bytes"]) / r["peak_bytes"] if r["peak_bytes"] else 0.0
            body.append([str(r["rank"]), f"{ts[len(ts) // 2] * 1e3:.1f} ms", iec(r["peak_bytes"]),
                         iec(r["predicted_bytes"]), f"{100 * err:+.1f}%"])
        footer = [("Stages built by", "torch.export + pipeline()" if self.path == "export"
                   else "module ownership (torch.export could not trace the model)"),
                  ("Loss per step", ", ".join(f"{x:.6g}" for x in self.losses)),
                  ("Single process", ", ".join(f"{x:.6g}" for x in self.reference)),
                  ("Max relative diff", f"{self.loss_rel_diff:.2e}")]
        return text_table(header, body, footer)


def launch(spec: str, *, overrides: dict | None = None, stages: int, by: str = "flops", schedule: str = "1f1b", microbatches: int = 4,
           batch_size: int = 8, steps: int = 3, optimizer: str = "sgd", seed: int = 0, path: str = "auto",
           device: str = "cpu", timeout: float = 600.0) -> RunResult:
    """Train ``steps`` steps of the split model under torchrun and compare with one process."""
    if schedule == "interleaved":
        raise InputError("--run supports the gpipe and 1f1b schedules")
    with tempfile.TemporaryDirectory(prefix="layerscope-run-") as tmp:
        cfg = {"spec": spec, "overrides": overrides or {}, "stages": stages, "by": by, "schedule": schedule,
               "microbatches": microbatches, "batch_size": batch_size, "steps": steps,
               "optimizer": optimizer, "seed": seed, "out": tmp, "path": path, "device": device}
        cfg_path = os.path.join(tmp, "run.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(stages),
               "--master_port", str(_free_port()), "-m", "layerscope.torchrun", cfg_path]
        env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // stages)))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0:
            raise InputError(f"the pipeline run failed (torchrun exit {proc.returncode}):\n"
                             + _worker_error(proc.stderr or proc.stdout or ""))
        ranks = []
        for r in range(stages):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
        ref, plan = reference_losses(cfg)   # the plan every rank computed, from the same setup
    return RunResult(plan=plan, ranks=tuple(ranks), reference=tuple(ref), losses=tuple(ranks[-1]["losses"]),
                     path=ranks[0]["path"])


def _worker_error(text: str) -> str:
    """The workers' own exceptions (torchrun's summary at the end of stderr says only 'exit 1')."""
    import re
    errs = []
    for line in text.splitlines():
        m = re.match(r"\[rank(\d+)\]: ([\w.]*(?:Error|Exception)\b.*)", line)
        if m and "Connection closed by peer" not in m.group(2):
            errs.append(f"rank {m.group(1)}: {m.group(2)}")
    return "\n".join(dict.fromkeys(errs)) if errs else "\n".join(text.strip().splitlines()[-15:])


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    worker(sys.argv[1])
