"""The result of a pipeline run under torchrun (``layerscope.torchrun.launch``): what every rank
measured, the losses against one process, the plan's prediction at the run's speed, and its table
(``run_table()``: the RunTable kind of reports.listings, which render draws like every kind)."""

from __future__ import annotations

from dataclasses import dataclass

from ..planning.config import schedule_of
from .listings import RankRun, RunTable

__all__ = ["RunResult"]


@dataclass(frozen=True)
class RunResult:
    plan: object
    ranks: tuple[dict, ...]        # per rank: its stages; seconds of every step ("times"), busy in it
    #                                ("busy"; "busy_per_stage": stage -> seconds per step, forward and
    #                                backward without the loss); peak bytes measured and predicted
    #                                (and the stages' parts), losses
    reference: tuple[float, ...]
    losses: tuple[float, ...]
    path: str
    grad_rel_diff: float | None = None   # first step: max over parameters of |g - g_ref| / |g_ref| (2-norms)
    return_outputs: bool = True

    @property
    def loss_rel_diff(self) -> float:
        return max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(self.losses, self.reference))

    @property
    def step_time(self) -> float:
        """Measured seconds of one step: per step the slowest rank's, the median over the steps
        after the first (the first alone with one step)."""
        steps = min(len(r["times"]) for r in self.ranks)
        return self.steady([max(r["times"][i] for r in self.ranks) for i in range(steps)])

    @property
    def corun(self) -> float:
        """How much slower a rank computed while every rank computed at once than alone, measured
        in the run before its steps (the median over the ranks; 1.0 on GPUs, one per rank)."""
        xs = sorted(float(r.get("corun", 1.0)) for r in self.ranks)
        return xs[len(xs) // 2]

    @property
    def timeline(self):
        """The plan's simulated step with the co-run slowdown measured in the run (None: the plan
        has no unit times)."""
        return self.predict(self.plan)

    def speed(self, plan) -> float | None:
        """How much slower this machine computed the whole model's micro-batch (forward and backward,
        alone, measured by each rank before its steps: the median over the ranks) than ``plan``'s
        unit times add up to: the machine's drift between timing the units and the run (a shared or
        virtual machine's speed moves by tens of percent over minutes). None: not measured (GPUs),
        or the plan has no unit times."""
        xs = sorted(float(r["alone_s"]) for r in self.ranks if r.get("alone_s"))
        units = plan.units.units if getattr(plan, "units", None) is not None else ()
        if not xs or not units or any(u.forward_time is None for u in units):
            return None
        total = sum(u.forward_time + u.backward_time for u in units)
        return xs[len(xs) // 2] / total if total > 0 else None

    def step_speed(self, plan) -> float | None:
        """How much longer the run's own steps took to compute than ``plan`` predicts: in the median
        step (the one ``replay`` takes), every rank's forward and backward actions added up, over the
        same sum in the plan's simulated step with this run's co-run slowdown (``predict(plan)``).
        Measured during the steps, so it holds the machine's speed at that moment; what it leaves to
        the prediction is how the work splits between the stages, the schedule, the ranks' sharing of
        the cores and the sends. None without per-action times or unit times."""
        if not all(r.get("blocks") for r in self.ranks):
            return None
        tl = self.predict(plan)
        if tl is None:
            return None
        i = self._median_step()
        measured = sum(b - a for r in self.ranks for *_, a, b in r["blocks"][i])
        predicted = sum(b.end - b.start for b in tl.blocks)
        return measured / predicted if predicted > 0 else None

    def _median_step(self) -> int:
        """The index of the median timed step (the slowest rank's seconds; after the first unless
        every step came after others)."""
        steps = min(len(r["blocks"]) for r in self.ranks)
        per_step = [max(r["times"][i] for r in self.ranks) for i in range(steps)]
        pool = list(range(steps)) if self.warm or steps == 1 else list(range(1, steps))
        return sorted(pool, key=lambda j: per_step[j])[len(pool) // 2]

    def predict(self, plan, at_run_speed: bool = False, at_step_speed: bool = False):
        """``plan``'s simulated step (a plan of these cuts with unit times, e.g. made before the
        run) with the co-run slowdown measured in this run; None where the plan has no times.
        ``at_run_speed``: its compute times also scaled by ``speed(plan)`` (the machine's speed
        when the run began, against when the units were timed). ``at_step_speed``: scaled instead by
        ``step_speed(plan)``, the speed the run's steps computed at."""
        if getattr(plan, "timeline", None) is None:
            return None
        from ..planning.steptime.schedule import simulate
        st = plan.stages
        k = (self.speed(plan) or 1.0) if at_run_speed else 1.0
        if at_step_speed:
            k = self.step_speed(plan) or 1.0
        w = [s.weight_time or 0.0 for s in plan.stages] if schedule_of(plan.schedule).zero_bubble else None
        return simulate(plan.schedule, [k * s.forward_time for s in st], [k * s.backward_time for s in st],
                        plan.microbatches, send=[s.send_time for s in st[:-1]],
                        optimizer=[k * s.optimizer_time if s.optimizer_time else s.optimizer_time for s in st],
                        stages_per_rank=plan.stages_per_rank, corun=self.corun,
                        weight=[k * x for x in w] if w else w)

    def replay(self) -> tuple[float, float] | None:
        """A check of the schedule model alone: the plan's schedule simulated with the durations the
        run itself measured for its actions (per stage and kind, the mean over the micro-batches of
        the median step), against that step's end of the last action. Returns (simulated, measured)
        seconds; None without per-action times."""
        if not all(r.get("blocks") for r in self.ranks):
            return None
        from ..planning.steptime.schedule import simulate
        i = self._median_step()
        durs: dict = {}
        for r in self.ranks:
            for st, kind, _, a, b in r["blocks"][i]:
                durs.setdefault((st, kind), []).append(b - a)
        k = self.plan.num_stages

        def mean(s, kind):
            v = durs.get((s, kind))
            return sum(v) / len(v) if v else 0.0
        f = [mean(s, "F") for s in range(k)]
        w = [mean(s, "W") for s in range(k)]                 # zero bubble: backward = I + W
        b = [mean(s, "B") + mean(s, "I") + w[s] for s in range(k)]
        tl = simulate(self.plan.schedule, f, b, self.plan.microbatches, stages_per_rank=self.plan.stages_per_rank,
                      weight=w if any(w) else None)
        return tl.pipeline_time, max(b for r in self.ranks for *_, b in r["blocks"][i])

    @property
    def warm(self) -> bool:
        """Whether every timed step came after others (CPU: timed after the memory-measured steps)."""
        return all(r.get("steady") for r in self.ranks)

    def steady(self, values: list) -> float:
        """The median of the timed steps in steady state: all of them when they came after the
        memory-measured steps, else those after the first (the first alone with one step)."""
        xs = sorted(values if self.warm else (values[1:] or values))
        return xs[len(xs) // 2]

    def table(self) -> str:
        """The run table as ``split --run`` prints it."""
        return self.run_table().table()

    def run_table(self):
        """The run as a report kind (reports.listings.RunTable: text, rich, JSON, CSV)."""
        one = all(len(r["times"]) == 1 for r in self.ranks) and not self.warm
        when = "first step" if one else "median"
        tl = self.timeline
        rows = tuple(RankRun(i, r["rank"], tuple(r.get("stages", [r["rank"]])), self.steady(r["times"]),
                             self.steady(r["busy"]) if r.get("busy") else None,
                             tl.busy[r["rank"]] if tl is not None else None, r["peak_bytes"], r["predicted_bytes"])
                     for i, r in enumerate(self.ranks))
        footer = [("Stages built by", "torch.export + pipeline()" if self.path == "export"
                   else f"module ownership ({self.plan.schedule} runs no other way here)"
                   if not schedule_of(self.plan.schedule).export_stages
                   else "module ownership (torch.export could not trace the model)"),
                  ("Step time", "the first step only (--steps 1): not steady state, it includes "
                                "warm-up (allocations, first sends)" if one else
                   (lambda n: f"median of {n} step{'s' if n > 1 else ''} timed after as many memory-measured "
                    "ones (steady state, without the profiler)")(len(self.ranks[0]["times"])) if self.warm else
                   "median of the steps after the first (the first is warm-up)"),
                  ("Step time predicted", f"{tl.step_time * 1e3:.1f} ms (the plan's simulation"
                   + (f", {self.plan.timeline.step_time * 1e3:.1f} ms with ranks that do not slow each other"
                      if self.corun != 1.0 else "")
                   + f"), measured {self.step_time * 1e3:.1f} ms (the slowest rank): predicted / measured "
                   f"{tl.step_time / self.step_time:.2f}" if tl is not None else
                   "-- (the plan has no unit times: --by latency measures them, --by roofline predicts them)"),
                  ("Outputs", "step(return_outputs=True) (torch's default): the last stage keeps every "
                              "micro-batch's output" if self.return_outputs else
                   "step(return_outputs=False): the last stage keeps no outputs"),
                  ("Loss per step", ", ".join(f"{x:.6g}" for x in self.losses)),
                  ("Single process", ", ".join(f"{x:.6g}" for x in self.reference)),
                  ("Max relative diff", f"{self.loss_rel_diff:.2e}")]
        check = self.replay()
        if check is not None:
            footer.insert(3, ("Schedule model", f"{check[0] * 1e3:.1f} ms simulated from the run's own action times, "
                              f"against {check[1] * 1e3:.1f} ms to the end of the last action "
                              f"({check[0] / check[1]:.2f}): what the prediction misses beyond this is in the "
                              "predicted action times, not the schedule"))
        speed = self.speed(self.plan) if tl is not None else None
        if speed is not None:
            at = self.predict(self.plan, at_run_speed=True).step_time
            footer.insert(3, ("Machine speed", f"x{speed:.2f}: the whole model's micro-batch took that much longer "
                              "alone, before the steps, than the plan's unit times add up to (a shared or virtual "
                              f"machine's speed moves); predicted at that speed {at * 1e3:.1f} ms "
                              f"({at / self.step_time:.2f} of measured)"))
        if self.corun != 1.0:
            footer.insert(3, ("Co-run slowdown", f"x{self.corun:.2f}: a rank's compute took {self.corun:.2f} times as long "
                              "while every rank computed at once as alone (measured before the steps: the ranks share "
                              "this machine's cores); the prediction slows ranks that compute together by it"))
        if self.grad_rel_diff is not None:
            footer.append(("Gradients", f"max relative diff {self.grad_rel_diff:.2e} against one process"))
        return RunTable(rows, when, tl is not None, tuple(footer))
