"""What a real sharded-training run under torchrun measured (``layerscope.torchrun.launch_parallel``):
per rank its peak memory per step (the CPU allocator's own events) and step times, the losses
against one process training the same model on the same data, and the first step's gradients."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ParallelRunResult"]


@dataclass(frozen=True)
class ParallelRunResult:
    config: object                       # the ParallelConfig run
    ranks: tuple[dict, ...]              # global-rank order: rank, coords {dim: index}, peak_bytes (per
    #                                      step, bytes), before_bytes (its shards, buffers and batch
    #                                      before the first step), times (seconds per step, timed
    #                                      without the profiler), local_params (elements it holds)
    losses: tuple[float, ...]            # per step: the mean over the data-parallel ranks' losses
    reference_losses: tuple[float, ...]  # one process, the whole global batch, same optimizer
    loss_rtol: float                     # the tolerance loss_equal uses (1e-5 fp32; larger for bf16)
    max_rel_grad_diff: float | None      # step 1: max over parameters of |g - g_ref| / |g_ref| (2-norms)

    @property
    def loss_equal(self) -> bool:
        return len(self.losses) == len(self.reference_losses) and all(
            abs(a - b) <= self.loss_rtol * abs(b) for a, b in zip(self.losses, self.reference_losses))

    @property
    def max_rel_loss_diff(self) -> float:
        return max((abs(a - b) / max(abs(b), 1e-30) for a, b in zip(self.losses, self.reference_losses)),
                   default=0.0)

    @property
    def step_time(self) -> float:
        """Seconds of one step: per step the slowest rank's, the median over the timed steps."""
        steps = min(len(r["times"]) for r in self.ranks)
        xs = sorted(max(r["times"][i] for r in self.ranks) for i in range(steps))
        return xs[len(xs) // 2] if xs else float("nan")

    @property
    def peak_bytes(self) -> tuple[int, ...]:
        """Per rank, its largest peak over the steps."""
        return tuple(max(r["peak_bytes"]) for r in self.ranks)
