"""torchscan 0.2's compare_reports and measure_peak_memory (layerscope.compat.torchscan)."""

from __future__ import annotations

import copy
import json
import threading

import pytest
import torch

from layerscope.compat.torchscan import compare_reports, metric_result
from layerscope.compat.torchscan.process import measure_peak_memory
from layerscope.compat.torchscan.process import memory as process_memory


# --- compare_reports ---------------------------------------------------------------------------------

def _count(value, status="complete", unit="count", method="aten"):
    return metric_result(status=status, unit=unit, scope="forward", method=method,
                         value=value if status == "complete" else None,
                         known_value=value if status == "partial" else None)


def _layer(path, call_index, **metrics):
    return {"path": path, "call_index": call_index, "metrics": metrics}


def _report(totals, layers):
    return {"schema_version": 1, "context": {}, "inputs": {}, "layers": layers, "operator_flops": {},
            "totals": totals, "diagnostics": []}


def test_compare_reports_literal_deltas_and_layer_changes():
    before = _report(
        {"flops": _count(100), "macs": _count(40, "partial"), "params": _count(7)},
        [_layer("features.0", 0, flops=_count(10)), _layer("features.0", 1, flops=_count(10)),
         _layer("head", 0, flops=_count(5))])
    after = _report(
        {"flops": _count(150), "macs": _count(60), "params": _count(7)},
        [_layer("features.0", 1, flops=_count(10)), _layer("features.0", 0, flops=_count(12)),
         _layer("features.0", 2, flops=_count(3))])
    kept = copy.deepcopy((before, after))

    diff = compare_reports(before, after)

    assert json.loads(json.dumps(diff)) == diff
    assert (before, after) == kept
    totals = diff["totals"]
    assert list(totals) == ["flops", "macs", "params"]
    assert (totals["flops"]["status"], totals["flops"]["delta"]) == ("complete", 50)    # 150 - 100
    assert (totals["params"]["status"], totals["params"]["delta"]) == ("complete", 0)   # 7 - 7
    # partial before: no delta, the known lower bound kept
    assert (totals["macs"]["status"], totals["macs"]["delta"]) == ("partial", None)
    assert totals["macs"]["before"]["known_value"] == 40
    layers = diff["layers"]
    assert [(x["path"], x["call_index"]) for x in layers["added"]] == [("features.0", 2)]
    assert [(x["path"], x["call_index"]) for x in layers["removed"]] == [("head", 0)]
    # features.0's second call (index 1) is unchanged and left out; its first: 12 - 10 = 2
    assert [(x["path"], x["call_index"]) for x in layers["changed"]] == [("features.0", 0)]
    assert layers["changed"][0]["metrics"]["flops"]["delta"] == 2
    # the result is a copy: changing it leaves the reports as they were
    diff["layers"]["removed"][0]["metrics"]["flops"]["value"] = -1
    totals["flops"]["after"]["value"] = -1
    assert (before, after) == kept


def test_compare_reports_metric_missing_on_one_side_is_unavailable():
    diff = compare_reports(_report({"flops": _count(3)}, []), _report({"flops": _count(3, "unavailable")}, []))
    assert diff["totals"]["flops"] == {"status": "unavailable", "delta": None, "before": _count(3),
                                       "after": _count(3, "unavailable")}
    diff = compare_reports(_report({"flops": _count(3)}, []), _report({}, []))
    assert diff["totals"]["flops"]["after"] is None and diff["totals"]["flops"]["status"] == "unavailable"


def test_compare_reports_rejects_what_cannot_be_compared():
    with pytest.raises(ValueError, match="metric 'flops' has incompatible unit"):
        compare_reports(_report({"flops": _count(1)}, []), _report({"flops": _count(1, unit="GFLOP")}, []))
    with pytest.raises(ValueError, match="metric 'flops' has incompatible method"):
        compare_reports(_report({}, [_layer("a", 0, flops=_count(1))]),
                        _report({}, [_layer("a", 0, flops=_count(2, method="module"))]))
    with pytest.raises(ValueError, match=r"after contains duplicate layer call \('a', 0\)"):
        compare_reports(_report({}, []), _report({}, [_layer("a", 0), _layer("a", 0)]))
    newer = dict(_report({}, []), schema_version=2)
    with pytest.raises(ValueError, match="schema versions differ: 1 != 2"):
        compare_reports(_report({}, []), newer)
    with pytest.raises(ValueError, match="unsupported schema version: 2"):
        compare_reports(newer, newer)


# --- measure_peak_memory on CPU: the profiler's memory timeline --------------------------------------

def test_cpu_one_float32_tensor_of_n_elements():
    n = 1000
    stats = measure_peak_memory(lambda: torch.empty(n), device="cpu")
    # nothing existed before that the workload used: baseline 0; one tensor of 1000 float32 = 4 x 1000 bytes
    assert stats == {"device": "cpu", "metric": "pytorch_tensor_bytes", "baseline_bytes": 0,
                     "peak_bytes": 4 * n, "delta_bytes": 4 * n}


def test_cpu_peak_is_the_most_alive_at_once():
    def workload():
        a = torch.empty(1000)        # 4,000 bytes
        b = torch.empty(500)         # + 2,000 = 6,000 alive: the peak
        del a                        # 2,000
        c = torch.empty(250)         # + 1,000 = 3,000
        return b, c

    stats = measure_peak_memory(workload, device="cpu:0")
    assert stats["device"] == "cpu"
    assert (stats["baseline_bytes"], stats["peak_bytes"], stats["delta_bytes"]) == (0, 6000, 6000)


def test_cpu_baseline_is_the_tensors_used_that_existed_before():
    torch.manual_seed(0)
    layer = torch.nn.Linear(10, 20)
    stats = measure_peak_memory(lambda: layer(torch.ones(3, 10)), device="cpu")
    # before: weight 20 x 10 + bias 20 = 220 float32 = 880 bytes; during: the input 3 x 10 (120 bytes) and
    # the output 3 x 20 (240 bytes) = 360 bytes more
    assert (stats["baseline_bytes"], stats["peak_bytes"], stats["delta_bytes"]) == (880, 1240, 360)


def test_cpu_prints_nothing_and_leaves_no_file(capfd, monkeypatch, tmp_path):
    monkeypatch.setattr(process_memory.tempfile, "tempdir", str(tmp_path))
    measure_peak_memory(lambda: torch.empty(10), device="cpu")
    assert capfd.readouterr() == ("", "")        # the profiler's start/stop lines are held back
    assert list(tmp_path.iterdir()) == []

    error = ValueError("workload failed")

    def failing():
        torch.empty(10)
        raise error

    with pytest.raises(ValueError) as caught:
        measure_peak_memory(failing, device="cpu")
    assert caught.value is error
    assert list(tmp_path.iterdir()) == []
    # the profiler was stopped: the next measurement starts one
    assert measure_peak_memory(lambda: torch.empty(10), device="cpu")["delta_bytes"] == 40


def test_cpu_inside_another_profiler_is_one_clear_error():
    ran = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        with pytest.raises(RuntimeError, match="another profiler is running"):
            measure_peak_memory(lambda: ran.append(1), device="cpu")
    assert ran == []


def test_one_measurement_at_a_time():
    results, inside = [], []

    def workload():
        inside.append(threading.current_thread().name)
        torch.empty(250)             # 1,000 bytes
        inside.append(threading.current_thread().name)

    threads = [threading.Thread(target=lambda: results.append(measure_peak_memory(workload, device="cpu")),
                                name=f"t{i}") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r["delta_bytes"] for r in results] == [1000, 1000]
    assert inside[0] == inside[1] and inside[2] == inside[3]      # one ran to its end before the other began

    with pytest.raises(RuntimeError, match="cannot measure inside a workload it is measuring"):
        measure_peak_memory(lambda: measure_peak_memory(lambda: None, device="cpu"), device="cpu")


# --- CUDA through the caching allocator's counters (faked here: no GPU needed) -----------------------

def test_cuda_reads_the_allocator_around_one_call(monkeypatch):
    calls = []
    counters = {"memory_reserved": 2048, "max_memory_reserved": 6144, "max_memory_allocated": 5000}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append("reset"))
    for name, value in counters.items():
        monkeypatch.setattr(torch.cuda, name, lambda device, name=name, value=value: calls.append(name) or value)

    stats = measure_peak_memory(lambda: calls.append("workload"), device="cuda:0")
    # reserved 2,048 before, 6,144 at the peak: 4,096 more
    assert stats == {"device": "cuda:0", "metric": "pytorch_reserved_bytes", "baseline_bytes": 2048,
                     "peak_bytes": 6144, "delta_bytes": 4096, "allocated_peak_bytes": 5000}
    assert calls == ["synchronize", "memory_reserved", "reset", "workload", "synchronize",
                     "max_memory_reserved", "max_memory_allocated"]


def test_unavailable_or_unsupported_devices_do_not_run_the_workload(monkeypatch):
    ran = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA device 'cuda:0' is unavailable"):
        measure_peak_memory(lambda: ran.append(1), device="cuda:0")
    with pytest.raises(RuntimeError, match="MPS device 'mps:1' is unavailable"):
        measure_peak_memory(lambda: ran.append(1), device="mps:1")
    with pytest.raises(NotImplementedError, match="not implemented for 'meta'"):
        measure_peak_memory(lambda: ran.append(1), device="meta")
    assert ran == []
