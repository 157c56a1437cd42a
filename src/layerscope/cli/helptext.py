"""Help text shared by several subcommands: what a model spec may be, and each command's examples."""

from __future__ import annotations

import argparse
import shutil


class HelpFormatter(argparse.RawTextHelpFormatter):
    """The help laid out as written (listings, examples), in the terminal's width: a line that does
    not fit wraps (render.layout.wrap_text), so no line of any ``--help`` is wider than the terminal
    (shutil.get_terminal_size: COLUMNS when set, else the terminal, else 80)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        width = width if width is not None else max(shutil.get_terminal_size().columns - 2, 40)
        super().__init__(prog, indent_increment, min(max_help_position, width // 3), width)

    def _split_lines(self, text: str, width: int) -> list[str]:
        from ..render.layout import wrap_text
        return wrap_text(text, max(width, 12))

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        from ..render.layout import wrap_text
        return "\n".join(indent + line for line in wrap_text(text, max(width - len(indent), 12)))


_SPEC_HELP = """model spec, one of:
  path/to/file.py:factory   imports and RUNS that file (it is your code: only use files you trust),
                            then calls factory()
  package.module:factory    e.g. layerscope.examples:small_cnn
  hf:PRESET                 a shipped architecture (a config.json): gpt2, llama-3.1-8b,
                            qwen3-30b-a3b, deepseek-v3, gpt-oss-120b, ... (layerscope list-presets)
  hf:ConfigClass[:Model]    a transformers config with defaults, e.g. hf:GPT2Config,
                            hf:BertConfig:BertForMaskedLM
  hf:PATH[:Model]           a directory holding config.json, or the config file itself
  hf:ORG/NAME[@REV][:Model] a Hub id: ONLY its config.json is read, through transformers'
                            AutoConfig (the Hugging Face cache, HF_HUB_OFFLINE=1 and the login
                            token or HF_TOKEN honoured; never weights), e.g. hf:Qwen/Qwen3-8B
                            hf: names resolve in this order: a shipped preset, a config class,
                            an existing path, a Hub id. Built on meta unless --device, in fp32
                            unless --model-dtype (a config's torch_dtype is not applied); the
                            model class from the config's architectures, or :Model, or --head;
                            a config needing its repository's own code only with
                            --trust-remote-code
  torchvision:name          e.g. torchvision:resnet50 (needs torchvision)
  timm:name                 e.g. timm:vit_base_patch16_224 (needs timm)
  model.onnx                an ONNX model (summary; `layerscope onnx` for its node table)
  model.pt                  a TorchScript archive (torch.jit.load; summary only; give --input-size);
                            a pickled nn.Module only with --allow-pickle (that runs code from the file)"""


_EXAMPLES = {
    "summary": """examples:
  layerscope summary layerscope.examples:small_cnn --columns input_shape,output_shape,params,kernel,macs
  layerscope summary hf:llama-2-70b --depth 2                  # on meta: nothing is allocated
  layerscope summary hf:llama-2-7b --model-dtype bf16 --depth 1   # weights in bf16: Params size 12.55 GiB
  layerscope summary hf:gpt2 --input-ids 4,512 --backward --format json -o gpt2.json
  layerscope summary hf:llama-3.2-1b --input-ids 1,2048 --depth 1   # a preset: hf_presets/llama-3.2-1b/config.json
  # the same from the Hub's config.json (or its cached copy, HF_HUB_OFFLINE=1): hf:meta-llama/Llama-3.2-1B;
  # from a directory holding config.json: hf:path/to/dir
  layerscope summary path/to/net.py:build --input-size 1,3,224,224 --format html -o net.html""",
    "memory": """examples:
  layerscope memory hf:gpt2 --input-ids 8,1024 --optimizer adamw --autocast bf16
  layerscope memory hf:llama-2-70b --input-ids 1,4096 --optimizer adamw --device cuda --limit 80GiB
  layerscope memory layerscope.examples:small_cnn --infer --batch-size 64""",
    "parallel": """examples:
  layerscope parallel hf:LlamaConfig --head causal-lm --input-ids 2,4096 --gpus 64 --tp 8 --ac full --gpu H100
  layerscope parallel hf:llama-2-70b --input-ids 1,4096 --gpus 64 --replicate 8 --ac selective-op --format json
  layerscope parallel hf:GPT2Config --head causal-lm --input-ids 8,1024 --gpus 8 --mixed-precision off
  layerscope parallel hf:llama-2-13b --input-ids 1,4096 --gpus 16 --gpu H100 --search --pp 1""",
    "profile": """examples:
  layerscope profile layerscope.examples:tiny_gpt --backward --repeats 50
  layerscope profile hf:GPT2Config --set n_layer=2 --input-ids 1,128 --roofline measure --trace gpt2.json""",
    "split": """examples:
  layerscope split hf:GPT2Config --head causal-lm --set n_layer=4 --input-ids 8,64 --stages 2
  layerscope split layerscope.examples:tiny_gpt --stages 2 --by roofline --roofline 1e11,1e10
  layerscope split layerscope.examples:tiny_gpt --stages 2 --schedule gpipe --microbatches 4 --run
  layerscope split hf:llama-2-70b --model-dtype bf16 --input-ids 8,1024 --stages 16 --memory-limit 80GiB --device cuda

--run starts torchrun with one process per stage (the model is rebuilt in each from SPEC and --set).""",
    "onnx": """examples:
  layerscope onnx model.onnx --input batch=1 --sort bytes --top 20
  layerscope onnx model.onnx --input input_ids=1,128 --format json -o report.json""",
    "onnx-tile": """examples:
  layerscope onnx-tile model.onnx tiled.onnx --block 64,64,64 --verify
  layerscope onnx-tile model.onnx tiled.onnx --nodes /fc1/Gemm,/fc2/Gemm --block 128,128,128""",
    "report": """examples:
  layerscope report layerscope.examples:tiny_gpt -o report.html --profile --stages 2
  layerscope report hf:llama-3-8b --input-ids 1,2048 --stages 4 -o llama3.html
  layerscope report gpt2.json gpt2-memory.json -o gpt2.html      # saved JSON reports, on one page""",
    "compare": """examples:
  layerscope compare hf:gpt2 hf:gpt2-medium --depth 1
  layerscope compare before.json after.json --changed               # saved JSON reports
  layerscope compare hf:llama-2-7b hf:mistral-7b --input-ids 1,1024 --format csv -o diff.csv""",
    "list-presets": """examples:
  layerscope list-presets
  layerscope summary hf:mixtral-8x7b --depth 2""",
}
