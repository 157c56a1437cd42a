"""What every subcommand shares: writing its output, the status spinner, the device and memory
checks, building the model from a spec, and emitting a report in the format asked for."""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch


def write_output(ns: argparse.Namespace, text: str) -> int:
    if ns.output:
        from ..errors import InputError
        try:
            with open(ns.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise InputError(f"cannot write {ns.output}: {e.strerror}") from e
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def say(text: str) -> None:
    """A line of text after a table: on a terminal wrapped to its width (render.layout.wrap_text),
    as it is to a file or a pipe."""
    if sys.stdout.isatty():
        import shutil

        from ..render.layout import wrap_text
        text = "\n".join(wrap_text(text, shutil.get_terminal_size().columns))
    sys.stdout.write(text + "\n")


def live(ns: argparse.Namespace) -> bool:
    """Spinners and progress bars: only on a terminal, and not with --quiet."""
    return sys.stderr.isatty() and not getattr(ns, "quiet", False)


def status(text: str, ns: argparse.Namespace | None = None):
    """A spinner on stderr while work runs, only when stderr is a terminal (and not --quiet)."""
    if not sys.stderr.isatty() or getattr(ns, "quiet", False):
        return contextlib.nullcontext()
    return _spinner(text)


@contextlib.contextmanager
def _spinner(text: str):
    """rich's status spinner, with its refresh thread made known to the profiler's stderr
    hold-back (capture/measure.py): that thread only draws the spinner, so kineto's start and stop
    lines can still be held back while it runs (what it draws meanwhile is passed on)."""
    import threading

    from rich.console import Console

    from ..capture.measure import quiet_safe_threads
    before = set(threading.enumerate())
    with Console(stderr=True).status(text):
        mine = [t for t in threading.enumerate() if t not in before]
        with quiet_safe_threads(mine):
            yield


# What each saved-model format supports, for the commands that need a PyTorch module to run.
_FILE_SUPPORT = {
    "pt2": "a torch.export program (.pt2) supports `summary` only (its graph runs forward as exported, on "
           "CPU or --device meta): memory, profile, split, report and compare need the Python model "
           "(path/to/file.py:factory, package.module:factory or hf:...)",
    "onnx": "an ONNX file supports `summary` and `layerscope onnx`/`onnx-tile` (a graph: no training "
            "step, timing or stage split)",
    "torchscript": "a TorchScript file supports `summary` only (forward, on CPU, with --input-size): "
                   "memory, profile, split, report and compare need the Python model (path/to/file.py:"
                   "factory, package.module:factory or hf:...)",
}


def check_device(device: str | None) -> None:
    """A device the command will allocate on must exist here: one line instead of torch's
    `AssertionError: Torch not compiled with CUDA enabled` from inside the model's factory."""
    from ..errors import InputError
    if not device:
        return
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch has no CUDA build" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise InputError(f"--device {device}: {why}; use --device cpu, or --device meta to count "
                             "without allocating")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"--device {device}: there are {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type not in ("cpu", "meta"):
        try:
            torch.empty(0, device=dev)
        except Exception as e:  # noqa: BLE001 - any backend's "not available" message
            raise InputError(f"--device {device} is not usable here ({type(e).__name__})") from None


def _input_bytes(ns: argparse.Namespace) -> int:
    """Bytes the example inputs given on the command line will take (before allocating them)."""
    import math
    total = 0
    dtypes = list(ns.dtype or [])
    for i, shape in enumerate(ns.input_size or []):
        dt = dtypes[i] if i < len(dtypes) else (dtypes[0] if len(dtypes) == 1 else torch.float32)
        total += math.prod(shape) * (torch.empty(0, dtype=dt).element_size())
    if ns.input_ids:
        total += 2 * math.prod(ns.input_ids) * 8      # input ids, and decoder ids for an encoder-decoder
    return total


def _check_memory(ns: argparse.Namespace, device: str | None) -> None:
    """Refuse before allocating what cannot fit: the weights (counted on meta first, for the specs
    layerscope builds itself: hf:, torchvision:, timm:) and the command-line inputs, against the
    memory available on the device (MemAvailable; cuda: mem_get_info). User factories are not
    built twice: their code runs once, where they put it."""
    from ..specs import build_model, check_fits, parse_overrides, weight_bytes
    if device is None and ns.spec.startswith("hf:"):
        return                                   # hf: specs build on meta unless a device is given
    dev = device or "cpu"
    if torch.device(dev).type == "meta":
        return
    need = _input_bytes(ns)
    weights = 0
    if ns.spec.startswith(("hf:", "torchvision:", "timm:")):
        meta = build_model(ns.spec, "meta", parse_overrides(ns.set), ns.head, dtype=ns.model_dtype,
                           trust_remote_code=getattr(ns, "trust_remote_code", False))
        weights = weight_bytes(meta.model)
        del meta
    need += weights
    counts_on_meta = ns.command in ("summary", "memory", "split", "compare", "report") and not \
        getattr(ns, "profile", False) and not getattr(ns, "measure", False)
    fixes = (["count on meta instead (--device meta, nothing allocated)"] if counts_on_meta else []) + \
        (["a smaller preset (layerscope list-presets)", "fewer layers (--set num_hidden_layers=2)"]
         + (["--model-dtype bf16"] if ns.model_dtype in (None, "fp32") else []) if weights else []) + \
        (["smaller inputs"] if need > weights else [])
    hint = "; ".join(fixes)
    what = f"{ns.spec} ({'weights' if weights else ''}{' and ' if weights and need > weights else ''}" \
           f"{'inputs' if need > weights else ''})"
    check_fits(need, dev, what, hint)


def check_view_options(ns: argparse.Namespace) -> None:
    """What the command line says about the output, checked right after parsing, before any model is
    built (an unknown --columns key or a malformed --limit / --memory-limit used to be refused only
    once the model had been built and analysed): the same checks, and the same lines, as the report
    and the planner make later."""
    from ..errors import InputError
    from ..reports.table import select_columns
    columns = getattr(ns, "columns", None)
    known = _command_columns(ns) if columns is not None and columns != "all" else None
    if known is not None:
        select_columns(known, columns, InputError)
    for limit in (getattr(ns, "limit", None), getattr(ns, "memory_limit", None)):   # memory; split, parallel
        if limit is not None:
            from ..options import parse_bytes
            parse_bytes(limit)


def _command_columns(ns: argparse.Namespace):
    """Every column the command's report can show with these options."""
    import types
    if ns.command == "memory":
        from ..reports.memory import COLUMNS
        return COLUMNS
    if ns.command == "profile":     # backward and roofline columns only with their options, as the report
        from ..reports.latency import latency_columns
        try:
            return latency_columns(types.SimpleNamespace(layers=(), roofline=ns.roofline or None,
                                                         options={"backward": ns.backward}))
        except AttributeError:      # columns that need more of a report than this: the report checks them
            return None
    from ..reports.summary import COLUMNS
    return COLUMNS


def build_spec(ns: argparse.Namespace, device: str | None):
    """The model and example inputs a subcommand asked for: (model, args, kwargs)."""
    from ..capture import model_device
    from ..errors import InputError
    from ..specs import build_model, check_command_shapes, command_inputs, parse_overrides

    for ext in ("onnx", "pt2"):
        if ns.spec.endswith("." + ext):
            raise InputError(f"{ns.command} {ns.spec}: {_FILE_SUPPORT[ext]}")
    check_command_shapes(ns.input_size, ns.input_ids)     # before building: a large model takes a while
    check_device(device)
    _check_memory(ns, device)
    with status(f"building {ns.spec}", ns):
        built = build_model(ns.spec, device, parse_overrides(ns.set), ns.head,
                            allow_pickle=getattr(ns, "allow_pickle", False), dtype=ns.model_dtype,
                            trust_remote_code=getattr(ns, "trust_remote_code", False))
    for note in built.notes:     # what the config asked for and was not applied (hf_sources): said, not silent
        print(f"layerscope: note: {ns.spec}: {note}", file=sys.stderr)
    model = built.model
    if isinstance(model, torch.jit.ScriptModule) and ns.command != "summary":
        raise InputError(f"{ns.command} {ns.spec}: {_FILE_SUPPORT['torchscript']}")
    dev = torch.device(device) if device else model_device(model)
    args, kwargs = command_inputs(ns.spec, model, built.default_inputs, dev, ns.input_size, ns.dtype,
                                  ns.input_ids)
    return model, args, kwargs


def emit(ns: argparse.Namespace, rep) -> int:
    if ns.format == "json":
        text = rep.to_json()
    elif ns.format == "csv":
        text = rep.to_csv()
    elif ns.format == "html":
        text = rep.to_html()
    else:
        view = {"depth": ns.depth, **({"columns": ns.columns} if hasattr(ns, "columns") else {}),
                **({"top": ns.top} if hasattr(ns, "top") else {}),
                **({"fold": not ns.expand} if getattr(ns, "expand", None) is not None else {})}
        if ns.output is None:
            rep.print(**view)
            return 0
        text = rep.table(**view)
    return write_output(ns, text)
