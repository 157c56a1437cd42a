"""Run under torchrun with 2 processes: the seconds to send a tensor from rank 0 to rank 1 over gloo
and back (as a pipeline's activation and its gradient travel), for several sizes; rank 0 prints
one JSON line {bytes: seconds one way}. bench/bench_split.py uses it to price sends."""

import json
import os
import statistics
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.set_num_threads(1)
rank = dist.get_rank()
out = {}
for n in (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24):
    t = torch.zeros(n // 4)
    times = []
    for i in range(7):
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(t, 1)
            dist.recv(t, 1)
        else:
            dist.recv(t, 0)
            dist.send(t, 0)
        times.append((time.perf_counter() - t0) / 2)
    out[n] = statistics.median(times[1:])
if rank == 0:
    print(json.dumps(out), flush=True)
dist.destroy_process_group()
os._exit(0)
