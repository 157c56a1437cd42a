"""Planning: how a model too big for one device is trained, and what each plan costs.

Sub-packages by job (docs/architecture.md has the map):
- ``config``: the configuration (ParallelConfig, PartitionOptions) and the one table of pipeline schedules;
- ``apply``: torch's parallelisms applied to a model (FSDP2, tensor parallel, checkpointing), shared by
  the simulation and real runs;
- ``split``: split units, the optimal split into pipeline stages, its memory model, runnable stages;
- ``simulate``: every rank of a configuration simulated on fake tensors;
- ``steptime``: the step-time model (pipeline schedules, sharded steps, measured unit and rank times);
- ``search``: bounds and the search over configurations;
- ``real``: real runs under torchrun (what a rank does, the launcher's process plumbing).
"""
