"""The CPU allocator's own count of every thread's blocks (capture.measure.count_cpu_allocations), which
torchrun ranks read: gloo's worker threads make buffers and free a step's tensors, which the profiler's
events (the thread it runs on) never show. In a child process: the switch is process-wide."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import threading, torch
    from layerscope.capture.measure import count_cpu_allocations, measure_cpu
    assert count_cpu_allocations()
    box = []

    def run(on_step):
        for step in range(3):
            on_step(step, "begin")
            a = torch.empty(1 << 20, dtype=torch.uint8)                   # 1 MiB on this thread
            t = threading.Thread(target=lambda: box.append(torch.empty(1 << 19, dtype=torch.uint8)))
            t.start(); t.join()                                           # 512 KiB made by another thread
            del a
            t = threading.Thread(target=box.clear)
            t.start(); t.join()                                           # and freed by it
            on_step(step, "end")

    m = measure_cpu(run, 100, 3, threads=True)
    print(m.method)
    print(*m.step_peaks)
""")


def test_every_threads_blocks_counted():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    method, peaks = out.stdout.strip().splitlines()
    assert "own running total" in method
    # by hand: 100 B before + 1 MiB (this thread) + 512 KiB (the other thread, alive at once) = 1,572,964
    # each step, no drift: the other thread's free is counted (the profiler's events would read
    # 1,048,676: the worker's block is not on their thread)
    assert [int(p) for p in peaks.split()] == [100 + (1 << 20) + (1 << 19)] * 3
    # nothing of the allocator's log reaches stderr
    assert "C10 alloc" not in out.stderr and "layerscope.step" not in out.stderr


def test_a_rank_that_died_while_measured_is_not_silent(tmp_path):
    # what a rank wrote to stderr while its steps were measured (fd 2 on the count's file) reaches the
    # launcher's error line; the count's own lines and c10's INFO lines do not
    from layerscope.torchrun.parallel import _measured_stderr
    (tmp_path / "rank1.stderr.log").write_bytes(
        b"\nlayerscope.step 0 begin\n"
        b"[rank1]:[I1125 22:42:24.064980035 CPUAllocator.cpp:216] C10 alloc 4 bytes, total alloc 8 bytes.\n"
        b"[rank1]:[I1125 22:42:24.064980036 ProcessGroupGloo.cpp:1] some INFO line\n"
        b"terminate called after throwing an instance of 'gloo::IoException'\n")
    assert _measured_stderr(str(tmp_path)) == "\n[rank1]: terminate called after throwing an instance of 'gloo::IoException'"
