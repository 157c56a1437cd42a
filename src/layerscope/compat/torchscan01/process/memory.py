"""torchscan's ``get_process_gpu_ram``."""

from __future__ import annotations

import os
import shutil
import subprocess
import warnings

import torch

__all__ = ["get_process_gpu_ram"]


def _nvidia_smi(pid: int) -> float | None:
    """The MiB that nvidia-smi lists for ``pid`` (summed over GPUs), None when it cannot say. Its
    output is captured, never shown."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    used = None
    for line in res.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            try:
                used = (used or 0.0) + float(parts[1])
            except ValueError:
                continue
    return used


def get_process_gpu_ram(pid: int) -> float:
    """GPU memory used by process ``pid``, in MiB. Without CUDA (a CPU machine): 0.0 and a UserWarning
    ("CUDA is unavailable to PyTorch."), as torchscan. With CUDA: what nvidia-smi lists for that
    process; where it cannot be read, this process's CUDA allocator reservation for ``pid`` =
    os.getpid() (a lower bound: the CUDA context is not in it), else 0.0."""
    if not torch.cuda.is_available():
        warnings.warn("CUDA is unavailable to PyTorch.", UserWarning, stacklevel=2)
        return 0.0
    used = _nvidia_smi(pid)
    if used is not None:
        return used
    if pid == os.getpid():
        return sum(torch.cuda.memory_reserved(i) for i in range(torch.cuda.device_count())) / 1024**2
    return 0.0
