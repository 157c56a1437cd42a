"""Sharded training: FSDP2, tensor parallel, pipeline stages and activation checkpointing, applied with
torch's own code (apply.py), simulated per rank on a fake process group (simulate.py), run for real
under torchrun (the launcher in layerscope.torchrun)."""
