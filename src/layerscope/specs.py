"""Model specs for the CLI: build a model (and default example inputs) from a short string.

  path/to/file.py:factory        runs the file (user code!) and calls factory()
  package.module:factory         imports the module and calls factory()
  hf:PRESET                      a well-known architecture shipped as a config file
                                 (hf_presets/NAME/config.json: gpt2, llama-3.1-8b, deepseek-v3, ...)
  hf:ConfigClass[:ModelClass]    a transformers config with its defaults (overrides via --set)
  hf:PATH[:ModelClass]           a directory holding config.json, or the config file itself
  hf:ORG/NAME[@REVISION][:ModelClass]
                                 a Hub id: only its config.json is read, through transformers' AutoConfig
                                 (the Hugging Face cache, HF_HUB_OFFLINE and the login token honoured)
                                 hf: names are resolved in that order: a shipped preset, a config class,
                                 an existing path, a Hub id (hf_sources). Built on meta unless a device
                                 is given, the model class from the config's ``architectures`` (or
                                 :ModelClass, or --head's Auto class; AutoModel for a bare config class);
                                 a config's own code (auto_map) only with trust_remote_code
  torchvision:name, timm:name    when those packages are installed
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from . import hf_sources
from ._transformers import quiet_token_ids
from .capture.inputs import check_shape, make_inputs
from .capture.measure import available_bytes
from .errors import SpecError
from .options import DTYPES

__all__ = ["BuiltModel", "build_model", "check_command_shapes", "parse_overrides", "token_ids", "HEADS", "presets", "model_dtype",
           "MODEL_DTYPES", "weight_bytes", "available_bytes", "check_fits"]

HEADS = hf_sources.HEADS


@dataclass
class BuiltModel:
    model: nn.Module
    # builds default example inputs (args, kwargs) on a device when the user gave none
    default_inputs: Callable[[torch.device], tuple[tuple, dict]] | None = None
    notes: list[str] = field(default_factory=list)


# --model-dtype / build_model(dtype=...): the dtype the model's floating-point weights are built in
MODEL_DTYPES = DTYPES

# config keys that name the weights' dtype: transformers reads them only in from_pretrained, so a
# --set of them would be silently ignored by a model built from its config
_DTYPE_KEYS = ("torch_dtype", "dtype")


def model_dtype(value: "str | torch.dtype | None") -> torch.dtype | None:
    """``bf16``/``fp16``/``fp32`` (or their torch names, or a torch.dtype) as a floating torch.dtype."""
    if value is None or isinstance(value, torch.dtype):
        if isinstance(value, torch.dtype) and not value.is_floating_point:
            raise SpecError(f"model dtype {value} is not a floating-point dtype (bf16, fp16, fp32)")
        return value
    dt = MODEL_DTYPES.get(str(value).lower().removeprefix("torch."))
    if dt is None:
        raise SpecError(f"unknown model dtype {value!r}: choose bf16, fp16 or fp32")
    return dt


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"--set takes key=value, got {item!r}")
        if key.strip() in _DTYPE_KEYS:
            raise SpecError(f"--set {key.strip()}=... does not change the weights' dtype of a model built from "
                            f"its config: use --model-dtype bf16|fp16|fp32 (build_model(dtype=...))")
        if value.strip().lower() in ("true", "false"):      # as a shell user writes a flag
            out[key.strip()] = value.strip().lower() == "true"
            continue
        try:
            out[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key.strip()] = value
    return out


def _device_ctx(device: str | None):
    return torch.device(device) if device else contextlib.nullcontext()


def _closest(key: str, known) -> str:
    import difflib
    near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
    return f" (did you mean {near[0]!r}?)" if near else ""


def _check_keys(spec: str, overrides: dict, known, what: str) -> None:
    """Refuse a --set key the target does not take: a silently ignored override is a wrong answer."""
    for key in overrides:
        if key not in known:
            raise SpecError(f"{spec}: --set {key}: {what} has no such key{_closest(key, known)}")


# a config's counts and sizes (n_layer, num_heads, hidden_size), and a factory's bare counts (n, depth)
_COUNT_KEY = re.compile(r"^(n|num)_|_(layers?|heads?|size|embd|experts|positions|ctx)$|^(n_layer|n_head)$"
                        r"|^(n|num|depth|width|layers|blocks|heads|channels|experts|hidden|size)$")


def _check_counts(spec: str, overrides: dict) -> None:
    """A negative count in a config (--set n_layer=-1) builds a model that fails later with a message about
    something else (meta tensors), and one given to a factory (--set n=-3) an empty model when the
    factory loops ``range(n)``: refuse it here, by name."""
    for key, value in overrides.items():
        if (isinstance(value, int) and not isinstance(value, bool) and value < 0
                and _COUNT_KEY.search(key)):
            raise SpecError(f"{spec}: --set {key}={value}: a count or size cannot be negative")


def _check_types(spec: str, overrides: dict, cfg_cls) -> dict:
    """A --set value that is text where the config's default is a number or a flag (--set n_layer=abc),
    or a fraction where it is an integer:
    one line naming the key and what it takes, not the config's validation dump. Lists, None and
    other defaults are left to the config. Returns the integers given for a float default as floats
    (--set layer_norm_epsilon=1: transformers' strict configs refuse the int)."""
    try:
        default = cfg_cls()
    except Exception:  # noqa: BLE001 - a config that needs arguments: nothing to compare with
        return {}
    floats = {}
    for key, value in overrides.items():
        d = getattr(default, key, None)
        if type(d) is float and type(value) is int:
            floats[key] = float(value)
        if not isinstance(value, str) and not (isinstance(value, float) and type(d) is int):
            continue
        want = ("true or false" if isinstance(d, bool) else "an integer" if isinstance(d, int)
                else "a number" if isinstance(d, float) else None)
        if want is not None:
            raise SpecError(f"{spec}: --set {key}={value}: expected {want} ({cfg_cls.__name__}'s {key} "
                            f"is {d!r} by default)")
    return floats


def _call_factory(fn: Any, spec: str, device: str | None, overrides: dict) -> BuiltModel:
    if not callable(fn):
        raise SpecError(f"{spec}: {fn!r} is not callable")
    if overrides:
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = None
        if params is not None and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            _check_keys(spec, overrides, [n for n, p in params.items()
                                          if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)],
                        f"the factory {getattr(fn, '__name__', 'factory')}()")
        _check_counts(spec, overrides)
    try:
        with _device_ctx(device):
            model = fn(**overrides)
    except Exception as e:
        raise SpecError(f"{spec}: the factory raised {type(e).__name__}: {e}") from e
    if not isinstance(model, nn.Module):
        raise SpecError(f"{spec}: the factory returned {type(model).__name__}, not a torch.nn.Module")
    size = getattr(fn, "input_size", None)
    if size is None:
        return BuiltModel(model)
    return BuiltModel(model, _sized_inputs(size, getattr(fn, "input_dtype", torch.float32)))


def _sized_inputs(size, dtype):
    """Default inputs of a fixed size, built on whatever device the model runs on."""
    def build(dev: torch.device):
        return tuple(make_inputs(size, dtype, None, dev)), {}
    return build


def _from_file(spec: str, path: str, attr: str, device, overrides) -> BuiltModel:
    if not os.path.isfile(path):
        raise SpecError(f"{spec}: no such file {path!r}")
    name = "_layerscope_user_" + os.path.splitext(os.path.basename(path))[0]
    mod_spec = importlib.util.spec_from_file_location(name, path)
    if mod_spec is None or mod_spec.loader is None:
        raise SpecError(f"{spec}: cannot load {path!r} as Python")
    module = importlib.util.module_from_spec(mod_spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        mod_spec.loader.exec_module(module)
    except Exception as e:
        raise SpecError(f"{spec}: running {path} raised {type(e).__name__}: {e}") from e
    finally:
        sys.path.pop(0)
    if not hasattr(module, attr):
        raise SpecError(f"{spec}: {path} has no {attr!r}")
    return _call_factory(getattr(module, attr), spec, device, overrides)


def _from_module(spec: str, modname: str, attr: str, device, overrides) -> BuiltModel:
    try:
        module = importlib.import_module(modname)
    except ImportError as e:
        raise SpecError(f"{spec}: cannot import {modname!r} ({e})") from e
    if not hasattr(module, attr):
        raise SpecError(f"{spec}: module {modname!r} has no {attr!r}")
    return _call_factory(getattr(module, attr), spec, device, overrides)


def _hf_inputs(model: nn.Module, config: Any):
    params = set(inspect.signature(model.forward).parameters)
    vocab = getattr(config, "vocab_size", None)
    n_pos = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    image = getattr(config, "image_size", None)
    channels = getattr(config, "num_channels", 3)

    def build(dev: torch.device, seq: int | None = None, batch: int = 1):
        kwargs: dict[str, Any] = {}
        if "input_ids" in params and vocab:
            s = seq or min(128, n_pos or 128)
            kwargs["input_ids"] = token_ids((batch, s), vocab, dev)
            if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
                kwargs["decoder_input_ids"] = token_ids((batch, s), vocab, dev)
        elif "input_features" in params and getattr(config, "num_mel_bins", None):
            # speech encoders (Whisper): log-mel features, 2 frames per encoder position
            frames = 2 * (getattr(config, "max_source_positions", 1500) or 1500)
            shape = (batch, config.num_mel_bins, frames)
            kwargs["input_features"] = make_inputs(shape, None, None, dev)[0]
            if "decoder_input_ids" in params and vocab:
                kwargs["decoder_input_ids"] = token_ids((batch, seq or 16), vocab, dev)
        elif "pixel_values" in params:
            side = image if isinstance(image, int) else (image[0] if image else 224)
            shape = (batch, channels, side, side)
            kwargs["pixel_values"] = make_inputs(shape, None, None, dev)[0]
        else:
            raise SpecError("cannot guess inputs for this model; give --input-size or --input-ids")
        return (), kwargs

    return build


def token_ids(shape, vocab: int, dev: torch.device) -> torch.Tensor:
    """Token ids in [0, vocab) from a private generator (the global RNG is untouched); empty on meta."""
    check_shape(tuple(shape), "input ids")
    if dev.type == "meta":
        return torch.empty(shape, dtype=torch.long, device=dev)
    return torch.randint(0, vocab, shape, device=dev, generator=torch.Generator(dev).manual_seed(0))


def check_command_shapes(input_size=None, input_ids=None) -> None:
    """The command line's --input-size shapes and --input-ids B,S, checked before the model is built
    (a zero dimension is refused with the same line whichever option gave it)."""
    from .errors import InputError
    for shape in input_size or ():
        check_shape(tuple(shape))
    if input_ids:
        if len(input_ids) != 2:
            raise InputError("--input-ids takes B,S")
        check_shape(tuple(input_ids), "input ids")


def command_inputs(spec: str, model: nn.Module, default_inputs, dev: torch.device, input_size=None,
                   dtypes=None, input_ids=None) -> tuple[tuple, dict]:
    """The example inputs a command line asks for: ``input_size`` shapes (with ``dtypes``, one for all
    or one each), ``input_ids`` B,S (the ``input_ids`` keyword of a transformers model, also its
    ``decoder_input_ids`` for an encoder-decoder; else one more positional input), or the spec's
    default inputs. Shared by the CLI and the ranks of ``split --run``, which build the same inputs."""
    from .errors import InputError
    check_command_shapes(input_size, input_ids)
    args: tuple = ()
    kwargs: dict = {}
    if input_size:
        dts = list(dtypes) if dtypes else None
        if dts is not None and len(dts) == 1 and len(input_size) > 1:
            dts = dts * len(input_size)
        args = tuple(make_inputs(input_size, dts, None, dev))
    elif dtypes:
        raise InputError("--dtype applies to --input-size inputs")
    if input_ids:
        vocab = getattr(getattr(model, "config", None), "vocab_size", None) or 2
        ids = token_ids(tuple(input_ids), vocab, dev)
        if hasattr(model, "config"):
            kwargs["input_ids"] = ids
            if getattr(model.config, "is_encoder_decoder", False):
                kwargs["decoder_input_ids"] = ids      # an encoder-decoder (T5) needs both
        else:
            args = args + (ids,)
    if not args and not kwargs:
        if default_inputs is None:
            raise InputError(f"no inputs for {spec}: give --input-size (or --input-ids)")
        args, kwargs = default_inputs(dev)
    return args, kwargs


def presets() -> dict[str, dict]:
    """The architectures shipped as config files (``hf:NAME``, ``hf_presets/NAME/config.json`` with
    ``layerscope.json`` beside it): name -> {description, model, model_type, params (the count the config
    builds; a test builds each and checks it), published (the model card's figure and its source), inputs,
    source, path}."""
    return hf_sources.presets()


def _preset_inputs(shapes: dict[str, list[int]], vocab: int | None):
    """Default inputs of a preset: token ids (in [0, vocab)) or pixel values of the shapes it names."""
    def build(dev: torch.device):
        kwargs = {k: token_ids(tuple(v), vocab or 2, dev) if k.endswith("input_ids")
                  else make_inputs(tuple(v), None, None, dev)[0] for k, v in shapes.items()}
        return (), kwargs
    return build


def _from_hf(spec: str, rest: str, device, overrides, head: str | None,
             trust_remote_code: bool = False) -> BuiltModel:
    try:
        import transformers
    except ImportError as e:
        raise SpecError(f"{spec}: the transformers package is not installed (pip install transformers)") from e
    target = hf_sources.resolve(spec, rest, lambda name: isinstance(getattr(transformers, name, None), type)
                                and name.endswith("Config"))
    user_keys = dict(overrides)
    if target is None:                                  # hf:ConfigClass[:ModelClass]: its defaults
        cfg_name, _, cls_name = rest.partition(":")
        cfg_cls, data, notes = getattr(transformers, cfg_name), {}, []
    else:
        cfg_cls, data, notes = hf_sources.load_config(spec, target, trust_remote_code)
        cfg_name = cfg_cls.__name__
        cls_name = target.cls_name or ("" if head else (data.get("architectures") or [""])[0])
    flat, nested = hf_sources.split_nested(user_keys)
    _check_keys(spec, flat, _config_keys(cfg_cls), cfg_name)
    _check_counts(spec, user_keys)
    floats = _check_types(spec, flat, cfg_cls)
    for part, sub in nested.items():         # --set text_config.num_hidden_layers=2
        sub_cls = hf_sources.sub_config_class(cfg_cls, part, data)
        if sub_cls is None:
            raise SpecError(f"{spec}: --set {part}.{next(iter(sub))}: {cfg_name} has no sub-configuration {part!r}")
        _check_keys(spec, sub, _config_keys(sub_cls), f"{cfg_name}'s {part} ({sub_cls.__name__})")
        floats.update({f"{part}.{k}": v for k, v in _check_types(spec, sub, sub_cls).items()})
    overrides = hf_sources.settings_with(data, {**overrides, **floats})
    try:
        with quiet_token_ids(user_keys):
            config = cfg_cls.from_dict(overrides) if target is not None else cfg_cls(**overrides)
        if target is not None:      # where a config's own code (auto_map) is found, as from_pretrained sets it
            config._name_or_path = target.where
    except Exception as e:
        # one line: transformers' strict dataclass validation says it in several
        why = " ".join(str(e).split())
        shown = user_keys if target is not None else overrides
        raise SpecError(f"{spec}: {cfg_name}({shown}) failed: {type(e).__name__}: {why}") from e
    make = hf_sources.model_builder(spec, config, cls_name, head, trust_remote_code)
    try:
        with _device_ctx(device or "meta"), quiet_token_ids(user_keys):
            model = make()
    except Exception as e:
        raise SpecError(f"{spec}: building the model failed: {type(e).__name__}: {e}") from e
    inputs = (target.meta.get("inputs") if target is not None else None)
    if inputs:
        return BuiltModel(model, _preset_inputs(inputs, getattr(config, "vocab_size", None)), notes)
    return BuiltModel(model, _hf_inputs(model, config), notes)


def _config_keys(cfg_cls) -> set[str]:
    """The keys a transformers config knows: its defaults, its aliases (hidden_size for GPT-2's n_embd)
    and its constructor's arguments. A PretrainedConfig stores any other keyword as an attribute
    nothing reads, so an unknown key would be silently ignored."""
    import transformers
    keys = set()
    for cls in (cfg_cls, transformers.PretrainedConfig):
        keys |= set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    keys |= {"num_labels"}       # PretrainedConfig pops it from **kwargs (it sets id2label)
    try:
        default = cfg_cls()
        keys |= set(default.to_dict()) | set(getattr(default, "attribute_map", {}) or {})
    except Exception:  # noqa: BLE001 - a config that needs arguments: its signature is all we know
        pass
    return keys - set(_DTYPE_KEYS)


def _from_zoo(spec: str, kind: str, name: str, device, overrides) -> BuiltModel:
    try:
        lib = importlib.import_module(kind)
    except Exception as e:
        raise SpecError(f"{spec}: {kind} is not installed or does not load here ({type(e).__name__}); "
                        f"install {kind} to use {kind}: specs") from e
    try:
        with _device_ctx(device):
            if kind == "torchvision":
                model = lib.models.get_model(name, weights=None, **overrides)
            else:
                model = lib.create_model(name, pretrained=False, **overrides)
    except Exception as e:
        raise SpecError(f"{spec}: building {name!r} failed: {type(e).__name__}: {e}") from e

    return BuiltModel(model, _sized_inputs((1, 3, 224, 224), torch.float32))


_TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript")


def build_model(spec: str, device: str | None = None, overrides: dict | None = None,
                head: str | None = None, allow_pickle: bool = False,
                dtype: "str | torch.dtype | None" = None, trust_remote_code: bool = False) -> BuiltModel:
    """The model a spec names. ``dtype`` (bf16, fp16, fp32 or a torch.dtype): the dtype of its
    floating-point parameters and buffers (``Module.to(dtype)`` after building; integer buffers keep
    theirs). None keeps what the spec builds (fp32 for hf: specs). On meta the cast is free; on a real
    device the model is built in its own dtype first, then cast. ``trust_remote_code``: an ``hf:`` config
    that names code of its own (``auto_map``) may run it (hf_sources); refused without it."""
    overrides = overrides or {}
    dt = model_dtype(dtype)
    for key in _DTYPE_KEYS:
        if key in overrides:
            raise SpecError(f"--set {key}=... does not change the weights' dtype: use --model-dtype "
                            "bf16|fp16|fp32 (build_model(dtype=...))")
    built = _build_spec(spec, device, overrides, head, allow_pickle, trust_remote_code)
    if dt is not None:
        if isinstance(built.model, torch.jit.ScriptModule):
            raise SpecError("--model-dtype does not apply to a TorchScript file (its weights are saved in it)")
        built.model.to(dt)
        if built.default_inputs is not None:
            built.default_inputs = _cast_inputs(built.default_inputs, dt)
    return built


def _cast_inputs(build, dt: torch.dtype):
    """Default floating inputs in the model's dtype (a bf16 model takes bf16 pixel values)."""
    def cast(dev: torch.device):
        args, kwargs = build(dev)
        c = lambda t: t.to(dt) if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
        return tuple(c(a) for a in args), {k: c(v) for k, v in kwargs.items()}
    return cast


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers (shared tensors once), as allocated on a device."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = (t.untyped_storage().data_ptr(), t.shape, t.dtype) if t.device.type != "meta" else id(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def check_fits(need: int, device: "str | torch.device", what: str, hint: str) -> None:
    """Refuse before allocating ``need`` bytes on ``device`` when it has less available."""
    free = available_bytes(device)
    if free is not None and need > free:
        from .options import iec
        raise SpecError(f"{what} needs {iec(need)} on {torch.device(device)}, which has {iec(free)} available: "
                        f"{hint}")


def _build_spec(spec, device, overrides, head, allow_pickle, trust_remote_code=False) -> BuiltModel:
    if spec.endswith(_TORCHSCRIPT_SUFFIXES) and ":" not in os.path.basename(spec):
        if overrides or head:
            raise SpecError("--set and --head do not apply to a saved model file")
        from .formats.torchscript import load_saved_model
        return BuiltModel(load_saved_model(spec, allow_pickle))
    if spec.startswith("hf:"):
        return _from_hf(spec, spec[3:], device, overrides, head, trust_remote_code)
    if head:
        raise SpecError("--head applies to hf: specs only")
    if trust_remote_code:
        raise SpecError("--trust-remote-code applies to hf: specs only")
    for kind in ("torchvision", "timm"):
        if spec.startswith(kind + ":"):
            return _from_zoo(spec, kind, spec[len(kind) + 1:], device, overrides)
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise SpecError(f"model spec {spec!r} is not one of path/to/file.py:factory, package.module:factory, "
                        "hf:PRESET, hf:ConfigClass, hf:path/to/config.json, hf:ORG/NAME, torchvision:name, "
                        "timm:name, model.onnx, model.pt")
    if target.endswith(".py") or os.sep in target:
        return _from_file(spec, target, attr, device, overrides)
    return _from_module(spec, target, attr, device, overrides)
