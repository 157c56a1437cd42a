"""Issue 21: a catalogue of bad inputs across every subcommand and the Python entry points. Each one
must end in one line on stderr that names the problem and exit 1 (also for a command line argparse
itself refuses: a malformed option value, an unknown option, a missing argument), never a
traceback or "internal error", and — for the Python entry points — leave the model exactly as it was.

The CLI cases run in-process (``layerscope.cli.main``) on meta or small models so that the whole
catalogue stays fast."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.cli import main
from layerscope.specs import build_model

CNN = "layerscope.examples:small_cnn"
GPT = "layerscope.examples:tiny_gpt"
HF = ["hf:GPT2Config", "--set", "n_layer=1", "--set", "n_embd=32", "--set", "n_head=2",
      "--set", "vocab_size=64", "--set", "n_positions=64"]


@pytest.fixture(autouse=True)
def _at_most_8_gib(monkeypatch):
    # the too-big cases (a 70B model's weights, a 670 GiB input) must be refused on any machine, also
    # one with more memory than they need: the memory check sees at most 8 GiB available here
    from layerscope import specs
    real = specs.available_bytes
    monkeypatch.setattr(specs, "available_bytes",
                        lambda device: None if real(device) is None else min(real(device), 8 * 2 ** 30))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cat")
    ts = d / "scripted.pt"
    torch.jit.script(nn.Sequential(nn.Linear(4, 2))).save(str(ts))
    sd = d / "weights.pt"
    torch.save(nn.Linear(4, 2).state_dict(), str(sd))
    (d / "garbage.onnx").write_bytes(b"not an onnx file")
    (d / "garbage.pt").write_bytes(b"not a torch file")
    (d / "bad.json").write_text("{not json")
    (d / "other.json").write_text('{"a": 1}')
    (d / "boom.py").write_text("raise RuntimeError('boom at import')\n")
    (d / "notmodel.py").write_text("def f():\n    return 42\n")
    (d / "net.py").write_text("import torch\ndef build(width=4):\n    return torch.nn.Linear(width, 2)\n")
    return d


# (argv, a piece of the one-line message). {d} is the fixture folder.
CLI_CASES = [
    # --- specs ---
    (["summary", "justaword"], "model spec"),
    (["summary", "nope:x"], "cannot import"),
    (["summary", "layerscope.examples:nope"], "has no 'nope'"),
    (["summary", "hf:NotAConfig"], "neither a preset"),
    (["summary", "hf:gpt2:NotAModel"], "no model class"),
    (["summary", "torchvisionx:resnet"], "cannot import"),
    (["summary", "{d}/missing.py:build"], "no such file"),
    (["summary", "{d}/boom.py:f"], "boom at import"),
    (["summary", "{d}/notmodel.py:f"], "not a torch.nn.Module"),
    (["summary", "{d}/missing.pt"], "no model file"),
    (["summary", "{d}/garbage.pt"], "not a TorchScript or torch.save file"),
    (["summary", "{d}/weights.pt"], "state dict"),
    (["summary", "{d}/missing.json"], "model spec"),
    # --- --set ---
    (["summary", "hf:gpt2", "--set", "n_layers=2"], "did you mean 'n_layer'"),
    (["summary", "hf:GPT2Config", "--set", "not_a_key=1"], "no such key"),
    (["summary", "hf:llama-2-7b", "--set", "num_layers=2"], "no such key"),
    (["summary", "hf:gpt2", "--set", "n_layer"], "key=value"),
    (["summary", "hf:gpt2", "--set", "=3"], "key=value"),
    (["summary", "hf:gpt2", "--set", "torch_dtype=bfloat16"], "--model-dtype"),
    (["summary", "hf:gpt2", "--set", "dtype=float16"], "--model-dtype"),
    (["summary", "{d}/net.py:build", "--set", "widht=8"], "did you mean 'width'"),
    (["summary", GPT, "--set", "layers=2"], "no such key"),
    (["summary", "hf:GPT2Config", "--set", "n_head=5"], "failed"),
    (["summary", "{d}/scripted.pt", "--set", "a=1"], "do not apply to a saved model file"),
    # --- heads ---
    (["summary", "hf:GPT2Config", "--head", "bogus"], "unknown --head"),
    (["summary", CNN, "--head", "causal-lm"], "hf: specs only"),
    (["summary", "hf:gpt2:GPT2Model", "--head", "causal-lm"], "not both"),
    # --- input sizes and dtypes ---
    (["summary", CNN, "--input-size", "1,3,x,32"], "comma-separated integers"),
    (["summary", CNN, "--input-size", "1,3,,32"], "comma-separated integers"),
    (["summary", CNN, "--input-size", "a,b"], "comma-separated integers"),
    (["summary", CNN, "--input-size", "1,-3,32,32"], "non-negative"),
    (["summary", CNN, "--input-size", ""], "comma-separated integers"),
    (["summary", CNN, "--input-size", "1,3.5,32,32"], "comma-separated integers"),
    (["summary", CNN, "--input-size", "1,3,16"], "forward failed"),
    (["summary", CNN, "--input-size", "1,4,32,32"], "forward failed"),
    (["summary", CNN, "--input-size", "600000,3,1000,100"], "available"),
    (["summary", CNN, "--input-size", "1,3,32,32", "--dtype", "floaty"], "unknown dtype"),
    (["summary", CNN, "--input-size", "1,3,32,32", "--dtype", "int64"], "forward failed"),
    (["summary", CNN, "--dtype", "float16"], "--dtype applies to --input-size"),
    (["summary", GPT, "--input-ids", "1,2,3"], "B,S"),
    (["summary", GPT, "--input-ids", "1"], "B,S"),
    (["summary", GPT, "--input-ids", "x"], "comma-separated integers"),
    (["summary", "hf:gpt2", "--input-ids", "1000000,100000", "--device", "cpu"], "available"),
    (["summary", "{d}/scripted.pt"], "no inputs"),
    (["summary", "{d}/scripted.pt", "--input-size", "2,4", "--backward"], "TorchScript"),
    (["summary", "{d}/scripted.pt", "--input-size", "2,4", "--model-dtype", "bf16"], "TorchScript"),
    (["summary", "{d}/garbage.onnx", "--input-size", "1,3"], "ONNX"),
    (["summary", "{d}/garbage.onnx"], "ONNX"),
    # --- devices ---
    (["summary", CNN, "--device", "nonsense"], "unknown device"),
    (["summary", CNN, "--device", "cuda:x"], "unknown device"),
    (["memory", CNN, "--device", "tpu"], "unknown device"),
    (["profile", CNN, "--device", "bogus"], "unknown device"),
    (["split", CNN, "--stages", "2", "--device", "nope"], "unknown device"),
    (["report", CNN, "-o", "{d}/r.html", "--device", "nope"], "unknown device"),
    (["compare", CNN, GPT, "--device", "nope"], "unknown device"),
    # --- output options, columns, depth ---
    (["summary", CNN, "--columns", "bogus"], "unknown column"),
    (["summary", CNN, "--columns", "params,nonsense"], "unknown column"),
    (["summary", CNN, "--format", "xml"], "invalid choice"),
    (["summary", CNN, "--depth", "-1"], "at least 0"),
    (["summary", CNN, "--depth", "two"], "expected an integer"),
    (["summary", CNN, "--mode", "bogus"], "invalid choice"),
    (["summary", CNN, "--causal", "bogus"], "invalid choice"),
    (["summary", CNN, "-o", "/nonexistent-dir/x.txt"], "cannot write"),
    (["summary", CNN, "--model-dtype", "int8"], "invalid choice"),
    (["summary", CNN, "--bogus-flag"], "unrecognized arguments"),
    (["summary"], "required"),
    (["nosuchcommand"], "invalid choice"),
    ([], "required"),
    # --- memory ---
    (["memory", CNN, "--optimizer", "nope"], "unknown optimizer"),
    (["memory", CNN, "--momentum", "0.9"], "--momentum applies to --optimizer sgd"),
    (["memory", CNN, "--limit", "lots"], "memory size"),
    (["memory", CNN, "--limit=-5GiB"], "memory size"),
    (["memory", CNN, "--batch-size", "0"], "at least 1"),
    (["memory", CNN, "--batch-size", "-4"], "at least 1"),
    (["memory", CNN, "--steps", "0"], "at least 1"),
    (["memory", CNN, "--accumulation", "0"], "at least 1"),
    (["memory", CNN, "--autocast", "int8"], "invalid choice"),
    (["memory", CNN, "--infer", "--optimizer", "adamw"], "optimizer only applies"),
    (["memory", CNN, "--train", "--infer"], "not allowed with"),
    (["memory", CNN, "--input-size", "1,3,7"], "forward failed"),
    (["memory", "{d}/garbage.onnx"], "ONNX file supports `summary`"),
    (["memory", "{d}/scripted.pt", "--input-size", "2,4"], "TorchScript file supports `summary` only"),
    (["memory", CNN, "--measure", "--device", "cuda"], "CUDA"),
    # --- profile ---
    (["profile", CNN, "--repeats", "0"], "at least 1"),
    (["profile", CNN, "--warmup", "-1"], "at least 0"),
    (["profile", CNN, "--top", "-2"], "at least 0"),
    (["profile", CNN, "--roofline", "bogus"], "no built-in peaks"),
    (["profile", CNN, "--device", "cuda"], "CUDA"),
    (["profile", "hf:llama-2-70b"], "available"),
    (["profile", "hf:llama-2-70b", "--model-dtype", "bf16"], "available"),
    (["profile", "{d}/garbage.onnx"], "ONNX file supports `summary`"),
    (["profile", "{d}/scripted.pt", "--input-size", "2,4"], "TorchScript file supports `summary` only"),
    (["profile", CNN, "--input-size", "1,3,7,7,7"], "forward failed"),
    # --- split ---
    (["split", CNN], "--stages"),
    (["split", CNN, "--stages", "0"], "at least 1"),
    (["split", CNN, "--stages", "-2"], "at least 1"),
    (["split", CNN, "--stages", "two"], "expected an integer"),
    (["split", CNN, "--stages", "99"], "cannot be cut into 99 stages"),
    (["split", CNN, "--stages", "2", "--microbatches", "0"], "at least 1"),
    (["split", CNN, "--stages", "2", "--microbatches", "-1"], "at least 1"),
    (["split", CNN, "--stages", "2", "--microbatches", "3"], "micro-batches"),
    (["split", CNN, "--stages", "2", "--batch-size", "0"], "at least 1"),
    (["split", CNN, "--stages", "2", "--by", "bogus"], "invalid choice"),
    (["split", CNN, "--stages", "2", "--schedule", "bogus"], "invalid choice"),
    (["split", GPT, "--stages", "3", "--schedule", "interleaved"], "interleaved"),
    (["split", CNN, "--stages", "2", "--memory-limit", "abc"], "memory size"),
    (["split", CNN, "--stages", "2", "--memory-limit", "1B"], "no split"),
    (["split", CNN, "--stages", "2", "--optimizer", "nope"], "unknown optimizer"),
    (["split", CNN, "--stages", "2", "--run", "--memory-limit", "1B"], "no split"),   # planned before torchrun
    (["split", CNN, "--stages", "2", "--run", "--device", "cuda"], "CUDA"),
    (["split", CNN, "--stages", "3", "--run", "--schedule", "interleaved"], "multiple of it"),
    (["split", CNN, "--stages", "4", "--run", "--schedule", "interleaved", "--microbatches", "5"],
     "multiple of its rounds"),
    (["split", CNN, "--stages", "2", "--steps", "0"], "at least 1"),
    (["split", "{d}/garbage.onnx", "--stages", "2"], "ONNX file supports `summary`"),
    (["split", "{d}/scripted.pt", "--stages", "2", "--input-size", "2,4"], "TorchScript file supports"),
    # --- report ---
    (["report", CNN], "--output"),
    (["report", CNN, GPT, "-o", "{d}/r.html"], "one model spec"),
    (["report", "{d}/bad.json", "-o", "{d}/r.html"], "not JSON"),
    (["report", "{d}/other.json", "-o", "{d}/r.html"], "not a layerscope report"),
    (["report", "{d}/missing.json", "-o", "{d}/r.html"], "cannot read"),
    (["report", CNN, "-o", "{d}/r.html", "--stages", "0"], "at least 1"),
    (["report", CNN, "-o", "{d}/r.html", "--repeats", "0"], "at least 1"),
    (["report", CNN, "-o", "{d}/r.html", "--optimizer", "nope"], "unknown optimizer"),
    (["report", CNN, "-o", "/nonexistent-dir/r.html", "--no-memory"], "cannot write"),
    (["report", "{d}/garbage.onnx", "-o", "{d}/r.html"], "ONNX file supports `summary`"),
    (["report", "{d}/scripted.pt", "-o", "{d}/r.html", "--input-size", "2,4"], "TorchScript file supports"),
    (["report", CNN, "-o", "{d}/r.html", "--device", "cuda"], "CUDA"),
    # --- compare ---
    (["compare", CNN], "required"),
    (["compare", CNN, "{d}/bad.json"], "not JSON"),
    (["compare", CNN, "nope:x"], "cannot import"),
    (["compare", "{d}/garbage.onnx", CNN], "ONNX file supports `summary`"),
    (["compare", "{d}/scripted.pt", CNN, "--input-size", "2,4"], "TorchScript file supports"),
    (["compare", CNN, GPT, "--depth", "-3"], "at least 0"),
    (["compare", CNN, GPT, "--format", "html"], "invalid choice"),
    # --- onnx / onnx-tile ---
    (["onnx", "{d}/missing.onnx"], "no ONNX file"),
    (["onnx", "{d}/garbage.onnx"], "not a readable ONNX model"),
    (["onnx", "{d}/garbage.onnx", "--top", "0"], "at least 1"),
    (["onnx", "{d}/garbage.onnx", "--sort", "bogus"], "invalid choice"),
    (["onnx", "{d}/missing.onnx", "--input", "nonsense"], "NAME=DIMS"),
    (["onnx-tile", "{d}/missing.onnx", "{d}/t.onnx"], "no ONNX file"),
    (["onnx-tile", "{d}/garbage.onnx", "{d}/t.onnx", "--block", "64,64"], "three sizes"),
    (["onnx-tile", "{d}/garbage.onnx", "{d}/t.onnx", "--block", "a,b,c"], "comma-separated integers"),
    # --- list-presets ---
    (["list-presets", "--format", "html"], "invalid choice"),
    (["list-presets", "extra"], "unrecognized arguments"),
]


@pytest.mark.parametrize("argv,message", CLI_CASES, ids=[" ".join(a)[:70] for a, _ in CLI_CASES])
def test_cli_bad_input_is_one_line(argv, message, files, capsys):
    argv = [a.replace("{d}", str(files)) for a in argv]
    code = main(argv)
    out = capsys.readouterr()
    err = out.err
    assert code == 1, (code, err)
    assert err.startswith("layerscope: error:"), err
    assert err.count("\n") == 1, err             # one line
    assert "internal error" not in err and "Traceback" not in err
    assert message in err, err


# --- the Python entry points: a LayerscopeError with one line, and the model as it was ----------------

def _state(model: nn.Module):
    return ({k: v.clone() for k, v in model.state_dict().items()}, model.training,
            [p.requires_grad for p in model.parameters()], [p.grad for p in model.parameters()],
            [(m._forward_hooks.copy(), m._forward_pre_hooks.copy(), m._backward_hooks.copy())
             for m in model.modules()])


def _same(a, b) -> bool:
    return (a[0].keys() == b[0].keys() and all(torch.equal(a[0][k], b[0][k]) for k in a[0])
            and a[1:4] == b[1:4] and [tuple(map(len, h)) for h in a[4]] == [tuple(map(len, h)) for h in b[4]])


M = lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))  # noqa: E731
X = torch.randn(3, 4)

PY_CASES = {
    "analyze wrong shape": lambda m: ls.analyze(m, torch.randn(3, 5)),
    "analyze int input": lambda m: ls.analyze(m, torch.ones(3, 4, dtype=torch.long)),
    "analyze unknown device": lambda m: ls.analyze(m, X, device="nonsense"),
    "analyze device not the model's": lambda m: ls.analyze(m, X, device="cuda"),
    "analyze no input": lambda m: ls.analyze(m),
    "analyze bad mode": lambda m: ls.analyze(m, X, mode="bogus"),
    "analyze bad causal": lambda m: ls.analyze(m, X, causal="bogus"),
    "summary bad input_size": lambda m: ls.summary(m, input_size=(3, "x")),
    "summary negative input_size": lambda m: ls.summary(m, input_size=(3, -4)),
    "summary bad dtypes": lambda m: ls.summary(m, input_size=(3, 4), dtypes=["float"]),
    "table unknown column": lambda m: ls.analyze(m, X).table(columns="bogus"),
    "memory unknown optimizer": lambda m: ls.memory(m, X, optimizer="nope"),
    "memory batch 0": lambda m: ls.memory(m, X, batch_size=0),
    "memory batch -1": lambda m: ls.memory(m, X, batch_size=-1),
    "memory bad limit": lambda m: ls.memory(m, X, limit="lots"),
    "memory negative limit": lambda m: ls.memory(m, X, limit="-1GiB"),
    "memory steps 0": lambda m: ls.memory(m, X, steps=0),
    "memory accumulation 0": lambda m: ls.memory(m, X, accumulation=0),
    "memory autocast int8": lambda m: ls.memory(m, X, autocast_dtype="int8"),
    "memory unknown device": lambda m: ls.memory(m, X, device="tpu"),
    "memory wrong shape": lambda m: ls.memory(m, torch.randn(3, 5)),
    "max_batch_size bad limit": lambda m: ls.max_batch_size(m, X, limit="abc"),
    "partition stages 0": lambda m: ls.partition(m, X, stages=0),
    "partition stages -1": lambda m: ls.partition(m, X, stages=-1),
    "partition stages 100": lambda m: ls.partition(m, X, stages=100),
    "partition microbatches 0": lambda m: ls.partition(m, X, stages=2, microbatches=0),
    "partition microbatches -1": lambda m: ls.partition(m, X, stages=2, microbatches=-1),
    "partition microbatches 5 of 3": lambda m: ls.partition(m, X, stages=2, microbatches=5),
    "partition by bogus": lambda m: ls.partition(m, X, stages=2, by="bogus"),
    "partition schedule bogus": lambda m: ls.partition(m, X, stages=2, schedule="bogus"),
    "partition memory limit bad": lambda m: ls.partition(m, X, stages=2, memory_limit="abc"),
    "partition optimizer bad": lambda m: ls.partition(m, X, stages=2, optimizer="nope"),
    "profile repeats 0": lambda m: ls.profile(m, X, repeats=0),
    "profile warmup -1": lambda m: ls.profile(m, X, warmup=-1),
    "profile roofline bad": lambda m: ls.profile(m, X, roofline="bogus", repeats=1, warmup=0),
    "profile wrong shape": lambda m: ls.profile(m, torch.randn(3, 5), repeats=1, warmup=0),
    "build_model bad spec": lambda m: build_model("nope"),
    "build_model bad hf": lambda m: build_model("hf:NotAConfig"),
    "build_model unknown key": lambda m: build_model("hf:gpt2", overrides={"n_layers": 2}),
    "build_model torch_dtype key": lambda m: build_model("hf:gpt2", overrides={"torch_dtype": "bfloat16"}),
    "build_model dtype int8": lambda m: build_model("hf:gpt2", dtype="int8"),
    "build_model missing file": lambda m: build_model("/nope/x.py:f"),
    "analyze_onnx missing": lambda m: ls.analyze_onnx("/nope/x.onnx"),
}


@pytest.mark.parametrize("name", list(PY_CASES))
def test_python_bad_input_is_one_line_and_model_unchanged(name):
    model = M()
    before = _state(model)
    with pytest.raises(ls.LayerscopeError) as e:
        PY_CASES[name](model)
    assert "\n" not in str(e.value) and str(e.value)
    assert _same(before, _state(model)), name


def test_catalogue_size():
    assert len(CLI_CASES) + len(PY_CASES) >= 100
