"""Where an ``hf:`` spec's configuration comes from. ``hf:NAME[@REVISION][:ModelClass]`` is resolved
in this order (the first that matches wins):

  1. a shipped preset (``layerscope list-presets``): a directory of ``hf_presets/`` holding the model's
     ``config.json`` (transformers' own format) and ``layerscope.json`` (layerscope's metadata beside it:
     description, the parameter count the config builds, the published figure and its source, default
     inputs);
  2. a transformers config class (``hf:LlamaConfig``): its defaults (handled by ``specs``);
  3. an existing path: a directory holding ``config.json`` (a ``layerscope.json`` beside it gives the
     default inputs, as a preset's does), or a config file itself;
  4. a Hub id ``ORG/NAME``, optionally ``@REVISION`` (a branch, tag or commit): ONLY its ``config.json`` is
     read, through transformers' ``AutoConfig`` machinery (the Hugging Face cache, ``HF_HUB_OFFLINE``,
     ``HF_HUB_CACHE``/``HF_HOME`` and the login token or ``HF_TOKEN`` honoured); never any weights.

A config that names code of its own (``auto_map``) runs it only when the caller passes
``trust_remote_code`` (the CLI's ``--trust-remote-code``); without it a config whose ``model_type``
transformers knows is built with transformers' own classes (as ``AutoConfig`` does), any other is
refused in one line. The config's ``torch_dtype``/``dtype`` is not applied: every ``hf:`` model is built
in fp32 unless the caller asks for a dtype (``--model-dtype``), so a Hub id and the preset it equals give
the same figures.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SpecError

__all__ = ["HEADS", "SIDECAR", "HfTarget", "auto_class_for", "load_config", "model_builder", "presets", "resolve",
           "settings_with", "split_nested", "sub_config_class"]

PRESET_DIR = Path(__file__).with_name("hf_presets")
SIDECAR = "layerscope.json"
CONFIG = "config.json"
# a Hub repository id: ORG/NAME (the Hub's own rule: letters, digits, '-', '_', '.'; no leading '.' or '-').
# A bare NAME is not tried on the Hub: a typo of a preset or config class would otherwise go to the network.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9_][\w.-]*$")
# the config keys naming the weights' dtype: not applied (see the module docstring)
_DTYPE_KEYS = ("torch_dtype", "dtype")

HEADS = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "seq-cls": "AutoModelForSequenceClassification",
    "token-cls": "AutoModelForTokenClassification",
    "image-cls": "AutoModelForImageClassification",
}


@dataclass(frozen=True)
class HfTarget:
    """An ``hf:`` spec resolved: ``kind`` is preset, path or hub; ``where`` the directory, file or repo id."""

    kind: str
    where: str
    revision: str | None = None
    cls_name: str = ""
    meta: dict = field(default_factory=dict)       # layerscope.json beside the config, when there is one


def _natural(name: str) -> list:
    # natural order: gpt2 before gpt2-medium, llama-2-7b before llama-2-13b, llama-3-8b before llama-3.1-8b
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _read_json(path: Path, spec: str = "") -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SpecError(f"{spec or path}: cannot read {path} as JSON ({type(e).__name__}: {e})") from e
    if not isinstance(data, dict):
        raise SpecError(f"{spec or path}: {path} does not hold a JSON object")
    return data


def presets() -> dict[str, dict]:
    """The architectures shipped as config files (``hf:NAME``): name -> {description, model (the
    config's first ``architectures`` entry), model_type, params (the count the config builds; a test
    builds each and checks it, and the published figure in ``published``), inputs, source, path}."""
    out = {}
    for d in sorted((p for p in PRESET_DIR.iterdir() if (p / SIDECAR).is_file()), key=lambda p: _natural(p.name)):
        cfg, meta = _read_json(d / CONFIG), _read_json(d / SIDECAR)
        out[d.name] = {**meta, "model": (cfg.get("architectures") or [""])[0], "model_type": cfg.get("model_type"),
                       "path": str(d)}
    return out


def resolve(spec: str, rest: str, is_config_class) -> HfTarget | None:
    """``rest`` (what follows ``hf:``) resolved in the module docstring's order; None for a transformers
    config class (``is_config_class(name)``), which the caller builds from its defaults."""
    target, _, cls_name = rest.partition(":")
    if "/" not in target and os.sep not in target and target not in ("", ".", "..") \
            and (PRESET_DIR / target / SIDECAR).is_file():
        return HfTarget("preset", str(PRESET_DIR / target), None, cls_name, _read_json(PRESET_DIR / target / SIDECAR))
    if is_config_class(target):
        return None
    path = Path(os.path.expanduser(target))
    if path.exists():
        if path.is_dir() and not (path / CONFIG).is_file():
            raise SpecError(f"{spec}: the directory {target} holds no {CONFIG}")
        side = (path if path.is_dir() else path.parent) / SIDECAR
        meta = _read_json(side, spec) if side.is_file() and (path.is_dir() or path.name == CONFIG) else {}
        return HfTarget("path", str(path), None, cls_name, meta)
    repo, at, revision = target.partition("@")
    if _HUB_ID.match(repo) and not repo.endswith((".json", "/")) and (not at or revision):
        return HfTarget("hub", repo, revision or None, cls_name)
    if target.startswith((".", "/", "~")) or target.endswith(".json") or os.sep in target and not _HUB_ID.match(repo):
        raise SpecError(f"{spec}: no such file or directory {target!r}")
    raise SpecError(f"{spec}: {target!r} is neither a preset (layerscope list-presets) nor a transformers config "
                    f"class, an existing path or a Hub id ORG/NAME[@REVISION] (e.g. hf:gpt2, hf:GPT2Config, "
                    f"hf:path/to/config.json, hf:meta-llama/Llama-3.1-8B){_near(target)}")


def _near(name: str) -> str:
    import difflib
    near = difflib.get_close_matches(name, sorted(p.name for p in PRESET_DIR.iterdir() if p.is_dir()), n=1,
                                     cutoff=0.75)
    return f" (did you mean the preset {near[0]!r}?)" if near else ""


def load_config(spec: str, target: HfTarget, trust_remote_code: bool) -> tuple[type, dict, list[str]]:
    """The config class and the config's dict (as in its file, dtype keys removed) of a preset, path or
    Hub id, with notes on what was not applied. Only ``config.json`` is read (the Hub's through its cache)."""
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    kwargs = {"revision": target.revision} if target.revision else {}
    try:
        with _quiet_retries():
            data, _ = PretrainedConfig.get_config_dict(target.where, **kwargs)
    except Exception as e:  # noqa: BLE001 - every failure of the Hub or a file becomes one line
        raise SpecError(_read_error(spec, target, e)) from e
    notes = []
    model_type = data.get("model_type")
    remote = isinstance(data.get("auto_map"), dict) and "AutoConfig" in data["auto_map"]
    known = model_type in CONFIG_MAPPING
    if remote and not trust_remote_code and not known:
        raise SpecError(f"{spec}: its config needs code of its own ({data['auto_map']['AutoConfig']}), which "
                        "layerscope runs only with --trust-remote-code (that RUNS Python from the repository: only "
                        "for repositories you trust)")
    if not remote and not known:
        import transformers
        raise SpecError(f"{spec}: transformers {transformers.__version__} does not know model_type "
                        f"{model_type!r}" if model_type else f"{spec}: its {CONFIG} has no model_type")
    if remote and not trust_remote_code:
        notes.append(f"its config names code of its own ({data['auto_map']['AutoConfig']}): built with transformers' "
                     f"{CONFIG_MAPPING[model_type].__name__} (--trust-remote-code runs the repository's code)")
    try:
        cls = type(AutoConfig.from_pretrained(target.where, trust_remote_code=trust_remote_code, **kwargs))
    except Exception as e:  # noqa: BLE001
        raise SpecError(_read_error(spec, target, e)) from e
    quant = data.pop("quantization_config", None)
    if isinstance(quant, dict):
        notes.append(f"the config's quantization_config ({quant.get('quant_method', '?')}) is not applied: the "
                     "weights are built unquantized, in --model-dtype")
    dtypes = [value for value in (data.pop(key, None) for key in _DTYPE_KEYS) if value is not None]
    if dtypes:
        notes.append(f"the config's dtype {dtypes[0]} is not applied: weights are fp32 unless --model-dtype "
                     "(build_model(dtype=...)) says otherwise")
    return cls, data, notes


@contextlib.contextmanager
def _quiet_retries():
    """huggingface_hub logs a warning at each retry of a request that failed ("... thrown while
    requesting HEAD ..."): when every retry fails, the one-line error says why; when one succeeds, the
    config was read. Dropped for this thread's records only, on the one logger that logs them."""
    me = threading.get_ident()
    log = logging.getLogger("huggingface_hub.utils._http")

    def keep(record) -> bool:
        return not (record.thread == me and "thrown while requesting" in record.getMessage())
    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)


def split_nested(overrides: dict) -> tuple[dict, dict[str, dict]]:
    """``--set text_config.num_hidden_layers=2`` (a key of a sub-configuration: a multimodal model's text
    or vision config) apart from the top-level keys: (top-level, {sub-config name: its keys})."""
    flat: dict = {}
    nested: dict[str, dict] = {}
    for key, value in overrides.items():
        head, dot, rest = key.partition(".")
        if dot:
            nested.setdefault(head, {})[rest] = value
        else:
            flat[key] = value
    return flat, nested


def sub_config_class(cfg_cls: type, head: str, data: dict) -> type | None:
    """The config class of ``cfg_cls``'s sub-configuration ``head`` (transformers' ``sub_configs``; an
    AutoConfig entry resolved by the file's model_type, else by the class's default), None if none."""
    sub = (getattr(cfg_cls, "sub_configs", None) or {}).get(head)
    if sub is None or sub.__name__ != "AutoConfig":
        return sub
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    given = data.get(head)
    if isinstance(given, dict) and given.get("model_type") in CONFIG_MAPPING:
        return CONFIG_MAPPING[given["model_type"]]
    try:
        return type(getattr(cfg_cls(), head))
    except Exception:  # noqa: BLE001 - a config that needs arguments: its sub-config's keys cannot be checked
        return None


def settings_with(data: dict, overrides: dict) -> dict:
    """The config's dict with the overrides on top (``a.b`` keys inside sub-configuration ``a``). A
    per-layer list (``layer_types``: sliding or full attention, layer by layer) written out in the file
    follows a --set of ``num_hidden_layers``: the pattern is kept from its first layer, cut or repeated
    to the new count (transformers refuses a list whose length is not the layer count)."""
    overrides, nested = split_nested(overrides)
    out = {**data, **overrides}
    for head, sub in nested.items():
        base = out.get(head)
        out[head] = settings_with(base if isinstance(base, dict) else {}, sub)
    n_old, n_new = data.get("num_hidden_layers"), overrides.get("num_hidden_layers")
    if isinstance(n_new, int) and n_new > 0 and n_new != n_old:
        for key, value in data.items():
            if key.endswith("layer_types") and key not in overrides and isinstance(value, list) and value \
                    and len(value) == n_old:
                out[key] = [value[i % len(value)] for i in range(n_new)]
    return out


def auto_class_for(config: Any, cls_name: str) -> str | None:
    """The Auto class whose entry of the config's ``auto_map`` names ``cls_name`` (remote code)."""
    for key, ref in (getattr(config, "auto_map", None) or {}).items():
        ref = ref[0] if isinstance(ref, (list, tuple)) else ref
        if isinstance(ref, str) and ref.rpartition(".")[2] == cls_name and key.startswith("AutoModel"):
            return key
    return None


def _chain(e: BaseException) -> list[BaseException]:
    seen = []
    while e is not None and e not in seen:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def _read_error(spec: str, target: HfTarget, e: BaseException) -> str:
    """One line for a config that could not be read: what happened and what the user can do."""
    if target.kind != "hub":
        why = " ".join(str(e).split())
        return f"{spec}: reading {target.where} failed: {type(e).__name__}: {why}"
    from huggingface_hub import constants
    names = {type(x).__name__ for x in _chain(e)}
    repo = target.where + (f"@{target.revision}" if target.revision else "")
    login = "log in (hf auth login) or set HF_TOKEN"
    if "GatedRepoError" in names:
        return (f"{spec}: {target.where} is gated: accept its terms on https://huggingface.co/{target.where}, "
                f"then {login}")
    if "RevisionNotFoundError" in names:
        return f"{spec}: {target.where} has no revision {target.revision!r}"
    if "RepositoryNotFoundError" in names:
        return f"{spec}: {target.where} is not a model on the Hub, or a private one: {login}"
    offline = constants.HF_HUB_OFFLINE
    if offline or names & {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectError", "ConnectionError",
                           "ConnectTimeout", "ReadTimeout", "TimeoutException", "NetworkError"} \
            or isinstance(e, OSError) and "couldn't connect" in str(e):
        where = "HF_HUB_OFFLINE is set" if offline else f"the Hub ({constants.ENDPOINT}) cannot be reached"
        return (f"{spec}: the config of {repo} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and "
                f"{where}: read it once where the Hub is reachable (it is cached), then run with HF_HUB_OFFLINE=1 "
                f"(HF_HUB_CACHE or HF_HOME naming that cache), or give a local config: hf:path/to/dir "
                f"(holding {CONFIG}) or hf:path/to/{CONFIG}")
    if "EntryNotFoundError" in names or isinstance(e, OSError) and "does not appear to have" in str(e):
        return f"{spec}: {repo} has no {CONFIG}"
    why = " ".join(str(e).split())
    return f"{spec}: reading the config of {repo} failed: {type(e).__name__}: {why}"


def model_builder(spec: str, config, cls_name: str, head: str | None, trust_remote_code: bool):
    """What builds the model of a config: the named class (``:ModelClass`` or the config's
    ``architectures``), else the Auto class of ``--head`` (AutoModel without one). A class of the
    repository's own code (named in the config's ``auto_map``) only with ``trust_remote_code``."""
    import transformers
    if cls_name and head:
        raise SpecError(f"{spec}: give a model class or --head, not both")
    if head and head not in HEADS:
        raise SpecError(f"unknown --head {head!r}; choose from {', '.join(HEADS)}")
    remote = {"trust_remote_code": True} if trust_remote_code else {}
    if cls_name and not head:
        builder = getattr(transformers, cls_name, None)
        if builder is not None:
            return lambda: builder(config)
        auto = auto_class_for(config, cls_name)
        if auto is None:
            raise SpecError(f"{spec}: transformers has no model class {cls_name!r}")
        if not trust_remote_code:
            raise SpecError(f"{spec}: {cls_name} is the repository's own code, which layerscope runs only with "
                            "--trust-remote-code (that RUNS Python from the repository: only for repositories you "
                            "trust), or give --head for transformers' own class")
        return lambda: getattr(transformers, auto).from_config(config, **remote)
    auto = getattr(transformers, HEADS.get(head or "", "AutoModel"))
    return lambda: auto.from_config(config, **remote)
