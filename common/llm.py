"""What every group file (grpo.py, dr_grpo.py, dapo.py, gspo.py, sapo.py) needs and none of them is about.

The algorithm files keep the method whole: the math, how responses are sampled from π_θold and
scored, the update phase and the main loop. This module holds the rest, once, taking plain values:

1. the flags that are not the method (`ModelArgs`), their checks, and the defaults that depend on
   the model's scale and where it runs (an embedded toy model, a real LLM on a GPU or on a CPU);
2. loading a model: a hub id (cached, offline errors in one line), a local folder or a .gguf file;
   dropout off; LoRA adapters;
3. what the model reads and where its answer ends: chat template or few-shot examples, the stop cut;
4. memory: the responses of one forward/backward pass, sized to a budget;
5. several processes under torchrun: process group, gradient sync, cross-process means;
6. the statistics of a rollout and the update's minibatches. A run's timings, console, TensorBoard, evaluations
   and checkpoints are in common/runs.py.
"""

import contextlib
import importlib
import json
import os
import random
import shutil
import warnings
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from common.tasks import EVAL_SEED, get_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOGITS_PER_CHUNK = 2**24  # log-probs and draws read ~16M logits (64 MB in float32) at a time, not [N, T, vocab]


# ---------------------------------------------------------------- the flags that are not the method

@dataclass
class ModelArgs:
    """Model, prompts, memory, evaluation and bookkeeping: the flags of every group file that are not its method
    (each file's `Args` adds its own). A field left at None is resolved per model by `resolve_defaults`."""

    # Model and task
    model: str = "common/models/tiny_model"
    """Hugging Face causal LM: a hub id (e.g. gpt2), a local folder, a .gguf file or a saved run's model folder"""
    task: Optional[str] = None
    """addition, addition2, subtraction, multiplication, countdown, reverse, a .jsonl or .py file; None: addition (a real model on a CPU: addition2)"""  # noqa: E501
    eval_task: Optional[str] = None
    """a .jsonl file of held-out questions (a dataset's test file) instead of 10 % of --task's file"""
    few_shot: Optional[int] = None
    """solved examples before each question; None: the task's for a base model, 0 for a chat or embedded model (3 on a CPU)"""  # noqa: E501
    system_prompt: Optional[str] = None
    """chat models: a system turn before each question (the answer format is stated in the user turn)"""
    # Memory: models that do not fit with full fine-tuning
    lora_rank: int = 0
    """LoRA rank r: train adapters on every linear layer of attention and MLP; 0 trains every weight"""
    lora_alpha: float = 32.0
    """LoRA scale α: the adapter's update is (α / r) B A"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass: less memory, a second forward pass in the update"""
    fsdp: bool = False
    """under torchrun: shard the weights, gradients and Adam's state over the processes (FSDP2), not a copy in each"""
    # Evaluation and bookkeeping
    eval_every: Optional[int] = None
    """evaluate on the held-out questions every this many iterations (and at the start and the end); None: 10 (6 on a CPU)"""  # noqa: E501
    eval_size: Optional[int] = None
    """held-out questions per evaluation; None: 200 for the embedded models, 100 for a real model (64 on a CPU)"""
    eval_samples: int = 1
    """responses sampled per held-out question; k > 1 also logs pass@1 and pass@k"""
    seed: int = 1
    """seed of random, numpy and torch; process k of torchrun uses seed + k"""
    cuda: bool = True
    """use the GPU when there is one (bfloat16 autocast, frozen weights in bfloat16)"""
    float32_logits: bool = True
    """the output layer in float32 under bfloat16 autocast, so that the first ratio is 1 (off: to measure it)"""
    save_model: bool = False
    """save the trained model (with LoRA: the adapter) and tokenizer under runs/{run_name}/model"""
    save_every: int = 0
    """write a checkpoint every this many iterations; 0: only when Ctrl-C or SIGTERM stops the run"""
    resume: Optional[str] = None
    """a run's folder: resume it from its checkpoint; only --num-iterations, --save-every, --eval-*, --cuda may change"""  # noqa: E501
    exp_name: Optional[str] = None
    """a name of your own for the run, added to its folder's name after the method's"""


def local_folder(model: str) -> Optional[str]:
    """The folder a --model names on this machine (relative to the current folder or, for the embedded models, to
    the repository), or None for a hub id or a .gguf file."""
    for folder in (model, os.path.join(ROOT, model)):
        if os.path.isdir(folder):
            return folder
    return None


def is_embedded(model: str) -> bool:
    """True for the toy models of common/models/ and the models trained from them: their config.json says so
    (`embedded_toy_model`, which save_pretrained keeps), or a saved LoRA adapter's base model's does. They keep the
    defaults they were tuned with, wherever they live."""
    folder = local_folder(model)
    if folder is None:
        return False
    if os.path.exists(os.path.join(folder, "adapter_config.json")):
        with open(os.path.join(folder, "adapter_config.json")) as f:
            return is_embedded(json.load(f).get("base_model_name_or_path") or "")
    try:
        with open(os.path.join(folder, "config.json")) as f:
            return bool(json.load(f).get("embedded_toy_model", False))
    except (OSError, ValueError):
        return False


# Defaults that depend on the model's scale and on where it runs: (the embedded toy models, a real LLM on a GPU, a real
# LLM on a CPU, why the GPU value). The embedded models keep the values they were tuned with (common/results/group.md).
# A real model on a GPU gets a practitioner's values (not measured here: this repo has had no GPU). On a CPU it gets the
# recipe measured to learn there within minutes (common/results/smollm2.md): a short cap, few prompts, a higher rate.
SCALE_DEFAULTS = {
    "task": ("addition", "addition", "addition2", "1-3 digit sums"),
    "prompts_per_iteration": (32, 32, 8, "256 responses an iteration, in 4 optimiser steps"),
    "num_iterations": (150, 150, 24, "8,192 prompts"),
    "max_new_tokens": (8, 256, 16, "TRL's GRPOConfig max_completion_length"),
    "learning_rate": (3e-4, 1e-6, 1e-5, "TRL's GRPOConfig and DeepSeekMath's GRPO"),
    "eval_every": (10, 10, 6, "an evaluation every 10 iterations"),
    "eval_size": (200, 100, 64, "held-out prompts, sampled and greedy: 200 generations per evaluation"),
    # left unset only by grpo.py (its siblings' β is 0); on a CPU no reference model is run, as in the recipe
    "beta": (0.04, 0.04, 0.0, "DeepSeekMath's GRPO"),
}
LORA_LEARNING_RATE = (1e-5, 2e-4)  # a real model's with LoRA: on a GPU ~10× full fine-tuning's; on a CPU measured
CPU_RECIPE = "CPU recipe, measured to learn: common/results/smollm2.md"


def on_gpu(args) -> bool:
    return args.cuda and torch.cuda.is_available()


def resolve_defaults(args) -> list[str]:
    """Fill the scale-dependent fields the user left at None (a typed flag always wins); returns one line per
    field filled, for the console, with the value and why. The embedded models keep the values they were tuned with.
    A value out of range is left for check_args to refuse in one line."""
    embedded, gpu = is_embedded(args.model), on_gpu(args)
    lines = []
    for name, (toy, real_gpu, real_cpu, source) in SCALE_DEFAULTS.items():
        if getattr(args, name, 0) is not None:
            continue
        value = toy if embedded else real_gpu if gpu else real_cpu
        if name == "learning_rate" and not embedded and args.lora_rank > 0:
            value = LORA_LEARNING_RATE[0 if gpu else 1]
        setattr(args, name, value)
        why = "the embedded models" if embedded else f"a real model on a GPU: {source}" if gpu else CPU_RECIPE
        lines.append(f"--{name.replace('_', '-')} {value}  ({why})")
    if args.few_shot is None and (embedded or not gpu):
        # the embedded models were trained on bare questions; on a CPU the recipe shows a real model 3 solved examples
        args.few_shot = 0 if embedded else 3
        lines.append(f"--few-shot {args.few_shot}  ({'the embedded models' if embedded else CPU_RECIPE})")
    return lines


def refuse_bad_args(args: ModelArgs, method_checks: list[tuple[bool, str]]) -> None:
    """Refuse bad input with one clear line, before anything heavy is loaded: the shared flags, then the method's."""
    checks = [
        (args.few_shot is None or args.few_shot >= 0, f"--few-shot must be >= 0, got {args.few_shot}"),
        *method_checks,
        (args.lora_rank >= 0, f"--lora-rank must be >= 0 (0 = full fine-tuning), got {args.lora_rank}"),
        (args.lora_alpha > 0, f"--lora-alpha must be > 0, got {args.lora_alpha}"),
        (args.eval_every >= 1, f"--eval-every must be >= 1, got {args.eval_every}"),
        (args.eval_size is None or args.eval_size >= 1, f"--eval-size must be >= 1, got {args.eval_size}"),
        (args.eval_samples >= 1, f"--eval-samples must be >= 1, got {args.eval_samples}"),
        (args.save_every >= 0, f"--save-every must be >= 0 (0: only when stopped), got {args.save_every}"),
        (not args.fsdp or int(os.environ.get("WORLD_SIZE", "1")) > 1,
         "--fsdp shards the model over the processes of torchrun: run it with torchrun --nproc_per_node N (N >= 2)"),
        (not args.fsdp or args.lora_rank == 0,
         "--fsdp with --lora-rank: LoRA's trained state is already small; train the adapters with DDP (no --fsdp)"),
    ]
    for ok, message in checks:
        if not ok:
            raise SystemExit(f"error: {message}")
    try:
        get_task(args.task, args.eval_task)  # names a malformed .jsonl line before the model loads
    except ValueError as e:
        raise SystemExit(f"error: {e}")


# ---------------------------------------------------------------- the model: finding it, loading it, dropout, LoRA

def resolve_model_path(model: str) -> str:
    """A folder or .gguf file (the embedded models are named relative to the repo), or a hub id found in the
    local cache or on the hub.

    Checked before anything heavy: without network, a hub id that is not cached gets one line within seconds,
    not a minute of download retries.
    """
    if not os.path.isabs(model) and os.path.exists(os.path.join(ROOT, model)):
        model = os.path.join(ROOT, model)  # the embedded models, named relative to the repository
    if model.endswith(".gguf"):
        if not os.path.isfile(model):
            raise SystemExit(f"error: --model {model!r}: no such .gguf file")
        return model
    if os.path.isdir(model):
        return model
    if model.startswith((".", "/", "~")) or model.count("/") > 1 or os.sep in model.replace("/", "", 1):
        raise SystemExit(f"error: --model {model!r}: no such folder (and not a hub id like 'gpt2' or 'org/name')")
    from huggingface_hub import model_info, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError

    cached_config = try_to_load_from_cache(model, "config.json")
    if isinstance(cached_config, str):
        return os.path.dirname(cached_config)  # the cached snapshot: loads without asking the network
    download = f"download it once where there is network (`hf download {model}`) or pass a local folder"
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("0", "false", ""):
        raise SystemExit(f"error: --model {model!r} is not in the local Hugging Face cache "
                         f"and HF_HUB_OFFLINE is set: {download}")
    try:
        model_info(model, timeout=10)
    except RepositoryNotFoundError:
        raise SystemExit(f"error: --model {model!r} is not a model on the Hugging Face hub "
                         "(a typo? a private model needs `hf auth login`)")
    except Exception as e:  # no network, DNS failure, time-out, proxy: whatever stops the download
        raise SystemExit(f"error: --model {model!r} is not in the local cache and the hub cannot be reached "
                         f"({type(e).__name__}): {download}")
    return model


def disable_dropout(model) -> None:
    """Every dropout probability of the model to 0 (hub configs have them: gpt2's are 0.1).

    Sampling and the old log-probs run in eval mode, the update in train mode. With dropout on, the
    first update would score the sampled tokens with another (random) function than the one that
    sampled them, and the ratio π_θ/π_θold would be noise instead of exactly 1.
    """
    for key, value in model.config.to_dict().items():
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
            setattr(model.config, key, 0.0)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float):  # e.g. Llama's attention_dropout, read at forward time
                setattr(module, name, 0.0)


def load_policy(name: str, model_path: str, device, float32_logits: bool = True):
    """Tokenizer and model from a hub id, a folder or a .gguf file, dropout off, ready for left-padded batched
    generation (and with `float32_logits`, its output layer in float32 under autocast)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # heavy, so after the argument checks
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()  # one console line per iteration, no loading bars
    folder, gguf, adapter = model_path, {}, None
    if os.path.exists(os.path.join(model_path, "adapter_config.json")):  # a saved LoRA adapter: its base model first
        with open(os.path.join(model_path, "adapter_config.json")) as f:
            folder, adapter = resolve_model_path(json.load(f)["base_model_name_or_path"]), model_path
    if folder.endswith(".gguf"):  # transformers reads the file and dequantises its weights to float32
        folder, gguf = os.path.dirname(folder), {"gguf_file": os.path.basename(folder)}
    try:
        tokenizer = AutoTokenizer.from_pretrained(adapter) if adapter else AutoTokenizer.from_pretrained(folder, **gguf)
        if tokenizer.eos_token_id is None:
            raise SystemExit(f"error: --model {name!r}: its tokenizer has no EOS token, so responses could never end")
        # Fails fast, without asking, on custom code.
        AutoConfig.from_pretrained(folder, trust_remote_code=False, **gguf)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **gguf)
    except (OSError, ValueError) as e:
        if "trust_remote_code" in str(e):
            raise SystemExit(f"error: --model {name!r} needs its own code from the hub (trust_remote_code); "
                             "this script runs only architectures that transformers ships")
        raise SystemExit(f"error: --model {name!r} could not be loaded: {str(e).splitlines()[0]}")
    if gguf:  # transformers dequantised the file; a model loaded so refuses save_pretrained, its copy does not
        plain = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
        plain.load_state_dict(model.state_dict())
        plain.generation_config, model = model.generation_config, plain
    if adapter:  # the adapter's update folded into the weights: the model that run saved, to train on from here
        from peft import PeftModel

        # peft calls the old name.
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload().requires_grad_(True)  # loaded frozen
    model = model.to(device)
    # A saved adapter (and tokenizer) names its base model as the user gave it:
    # the hub id, not this machine's cache folder.
    model.name_or_path = model.config._name_or_path = tokenizer.name_or_path = name
    for key in ("local_files_only", "is_local"):  # how this machine found the files: not for another machine
        tokenizer.init_kwargs.pop(key, None)
    disable_dropout(model)
    if float32_logits:
        float32_output_layer(model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # gpt2 has no pad token; the response mask does not rely on it
    tokenizer.padding_side = "left"  # generation appends at the right end of every row
    if device.type == "cpu":
        # Grouped-query attention (fewer key/value heads than query heads) in torch's own kernel: on a CPU it takes
        # the padding mask too, where transformers would otherwise copy every key and value head at every layer of
        # every decoding step (repeat_kv: 10 % of SmolLM2's sampling). On a GPU a mask would make it the slow kernel.
        os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")
    return tokenizer, model


class Float32OutputLayer(torch.nn.Linear):
    """The output layer computed in float32, also under bfloat16 autocast.

    Under autocast a linear layer runs in bfloat16, whose 8-bit mantissa rounds a logit of 10 by up to 0.03. The
    log-probs of π_θold (scored in one batch shape) and of π_θ at the first update (another shape, other GPU
    kernels) would then differ by far more than GSPO's clip range (3e-4) at a ratio that must be exactly 1."""

    def forward(self, hidden: Tensor) -> Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.float()
            return F.linear(hidden.float(), self.weight.float(), bias)


def float32_output_layer(model) -> None:
    """Make the model's output layer a Float32OutputLayer:
    the same module and weights (tied or not), another forward."""
    head = model.get_output_embeddings()
    if type(head) is torch.nn.Linear:  # GPT-2, Llama, Qwen, ... (a subclass keeps its own forward)
        head.__class__ = Float32OutputLayer


def frozen_weights_to_bfloat16(model) -> None:
    """The frozen weights that bfloat16 autocast would cast at every forward (and every decoding step) stored in
    bfloat16 once: those of linear layers (with LoRA, the base model's; a reference copy's). Trainable weights and
    Adam's state stay float32 (small steps would be lost to rounding); embeddings, norms and the float32 output
    layer keep their precision. Needs autocast on: a bfloat16 weight meets a float32 input only through it."""
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers

    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, Conv1D)) and not isinstance(module, Float32OutputLayer):
            for parameter in module.parameters(recurse=False):
                if not parameter.requires_grad:
                    parameter.data = parameter.data.to(torch.bfloat16)


def add_lora(model, rank: int, alpha: float):
    """LoRA (Hu et al. 2021, arXiv 2106.09685): freeze the model's weights W and learn W + (α/r) B A on every
    linear layer of attention and MLP (peft's "all-linear": all but the output head). B starts at 0, so the
    policy starts as the model itself. Adapter dropout is 0 for the same reason as in disable_dropout."""
    from peft import LoraConfig, get_peft_model

    warnings.filterwarnings("ignore", message="fan_in_fan_out")  # gpt2's Conv1D layers: peft handles them, and says so
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")  # peft calls the old name
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules="all-linear", lora_dropout=0.0)
    return get_peft_model(model, config)


def eos_token_ids(model, tokenizer) -> list[int]:
    """The tokens that end a response: the tokenizer's EOS and any end token of the model's generation config
    (a chat model's end of turn, e.g. Qwen's <|im_end|> next to <|endoftext|>)."""
    config_eos = model.generation_config.eos_token_id
    config_eos = [] if config_eos is None else config_eos if isinstance(config_eos, list) else [config_eos]
    return sorted({tokenizer.eos_token_id, *config_eos})


def save_model(model, tokenizer, folder: str, is_main: bool = True) -> None:
    """Write to a temporary folder, then put it in place of the folder (a run extended by --resume saves again), so
    an interrupted save never leaves a half-written model: the old one stays whole until the new one is.
    With LoRA this saves the adapter: PeftModel.from_pretrained(base, folder), .merge_and_unload() to merge.
    Under --fsdp every process sends its shards to process 0, which writes a plain Hugging Face folder."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from transformers import AutoModelForCausalLM

        weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if is_main:
            whole = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
            whole.load_state_dict(weights)
            whole.generation_config, model = model.generation_config, whole
    if not is_main:
        return
    tmp, old = folder + ".tmp", folder + ".old"
    shutil.rmtree(tmp, ignore_errors=True)  # left by a save that was killed
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if os.path.exists(folder):
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)
    print(f"saved to {folder}", flush=True)


# ---------------------------------------------------------------- memory: the responses of one forward/backward pass

# What one response costs in an update pass, measured on SmolLM2-135M (float32, one pass of 8 to 32 responses of 16
# and 64 tokens; common/results/memory.md): float32 [tokens, vocabulary] arrays alive at the peak (the logits, their
# gradient, log-softmax's temporaries), and values kept for the backward pass per token, layer and unit of width.
LOGIT_COPIES = 6
ACTIVATION_VALUES = 20
CPU_PASS_BUDGET = 2 * 2**30  # bytes: with the model, Adam and sampling, SmolLM2 stays under 6 GiB on a CPU


def response_bytes(response_tokens: int, prompt_tokens: int, group_size: int, config, activation_bytes: int) -> float:
    """Estimated memory of one response in an update pass: its logits and their copies, and the activations kept of
    its tokens and of its share of its group's prompt (read once per group)."""
    width, layers = config.get_text_config().hidden_size, config.get_text_config().num_hidden_layers
    logits = response_tokens * config.get_text_config().vocab_size * 4 * LOGIT_COPIES
    tokens = response_tokens + prompt_tokens / group_size
    return logits + tokens * layers * width * ACTIVATION_VALUES * activation_bytes


def training_state_bytes(model, ref_model, world_size: int) -> float:
    """What training holds on a GPU before any pass: float32 weights, gradients and Adam's two moments of the trained
    weights (16 bytes each; DDP's gradient buckets add 4), the frozen weights as they are stored, a reference copy."""
    trained = 16 + (4 if world_size > 1 else 0)
    state = sum(p.numel() * (trained if p.requires_grad else p.element_size()) for p in model.parameters())
    if ref_model is not None and ref_model is not model:
        state += sum(p.numel() * p.element_size() for p in ref_model.parameters())
    return state


def pass_budget(gpu_memory: Optional[int], state_bytes: float) -> float:
    """Bytes an update pass may take. On a CPU (gpu_memory None) a fixed budget, an eighth of the memory on a small
    machine. On a GPU, half of what 90 % of the card leaves after the training state: the other half is for
    sampling, the allocator's slack and what the estimate misses."""
    if gpu_memory is None:
        return min(CPU_PASS_BUDGET, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 8)
    return (0.9 * gpu_memory - state_bytes) / 2


def pass_size(minibatch: int, group_size: int, per_response: float, budget: float) -> int:
    """The most responses per pass whose estimate fits the budget, among the sizes that divide the minibatch (so
    that every pass is as large): whole groups where one fits, so that a pass reads each prompt once; at least 1."""
    sizes = [n for n in range(1, minibatch + 1) if minibatch % n == 0 and (n % group_size == 0 or n < group_size)]
    return max([n for n in sizes if n * per_response <= budget], default=1)


def resolve_pass_size(args, model, ref_model, prompt_tokens: int, device, world_size: int) -> list[str]:
    """--micro-batch-size left unset: the responses per pass that fit the memory budget (the step is the same at any
    size: gradient accumulation). Returns the console's line, with the arithmetic; none when the flag was typed."""
    if args.micro_batch_size is not None:
        return []
    minibatch = args.prompts_per_iteration // world_size // args.num_minibatches * args.group_size
    per_response = response_bytes(args.max_new_tokens, prompt_tokens, args.group_size, model.config,
                                  2 if device.type == "cuda" else 4)
    if device.type == "cuda":
        budget = pass_budget(torch.cuda.get_device_properties(device).total_memory,
                             training_state_bytes(model, ref_model, world_size))
    else:
        budget = pass_budget(None, 0.0)
    args.micro_batch_size = pass_size(minibatch, args.group_size, per_response, budget)
    return [f"--micro-batch-size {args.micro_batch_size}  (responses per pass: the most of the minibatch of "
            f"{minibatch} within {budget / 2**30:.1f} GiB, at an estimated {per_response / 2**20:,.0f} MB each for "
            f"{args.max_new_tokens} + {prompt_tokens}/{args.group_size} tokens; common/results/memory.md)"]


# ---------------------------------------------------------------- what the model reads, and where its answer ends

def num_examples(tokenizer, task, few_shot: Optional[int]) -> int:
    """--few-shot, or by default: the task's number for a base model (without examples it does not answer in the
    format the reward reads), none for a chat model (the user turn states the format)."""
    if few_shot is not None:
        return few_shot
    return 0 if tokenizer.chat_template is not None else task.default_few_shot


def few_shot_line(tokenizer, task, few_shot: Optional[int]) -> list[str]:
    """The console's line for --few-shot when the user left it unset: a real model's count depends on its kind,
    known once its tokenizer is loaded (the other scale defaults are resolved with the flags)."""
    if few_shot is not None:
        return []
    kind = "a chat model: its user turn states the format" if tokenizer.chat_template is not None else (
        "a base model: the task's solved examples show the format")
    return [f"--few-shot {num_examples(tokenizer, task, None)}  ({kind})"]


def format_prompts(tokenizer, task, prompts: list[str], few_shot: Optional[int],
                   system_prompt: Optional[str]) -> list[str]:
    """What the model reads. A chat model: its chat template, with the question and the task's answer format in the
    user turn (after the system prompt), after `few_shot` solved examples as earlier user and assistant turns. A base
    model: `few_shot` solved examples as text, then the question, so that it answers in the format the reward reads;
    0 examples: the bare question. The examples come from the training split, the same for every prompt."""
    k = num_examples(tokenizer, task, few_shot)
    examples = task.examples(k, random.Random(EVAL_SEED)) if k else []
    if tokenizer.chat_template is not None:
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        shots = []
        for question, answer in examples:
            shots += [{"role": "user", "content": f"{question}\n{task.instruction}"},
                      {"role": "assistant", "content": answer}]
        return [
            tokenizer.apply_chat_template(
                system + shots + [{"role": "user", "content": f"{p}\n{task.instruction}"}], tokenize=False,
                add_generation_prompt=True,
            )
            for p in prompts
        ]
    if not examples:
        return prompts
    shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in examples)
    return [f"{shots}Question: {p}\nAnswer:" for p in prompts]


def answer_stop(tokenizer, task, few_shot: Optional[int]) -> Optional[str]:
    """Where a few-shot base model's answer ends: at the first newline, or at the blank line that separates the
    examples when their answers span lines. Without the cut it would run on into a question of its own, and
    the reward would read the wrong number. Chat models and bare questions end at an EOS token."""
    k = num_examples(tokenizer, task, few_shot)
    if tokenizer.chat_template is not None or not k:
        return None
    multi_line = any("\n" in a for _, a in task.examples(k, random.Random(EVAL_SEED)))
    return "\n\n" if multi_line else "\n"


def holds_stop(tokenizer, responses: Tensor, stop: str) -> Tensor:
    """[N] True where the response so far holds `stop` (a few-shot base model's answer has ended): it then ends,
    instead of writing --max-new-tokens tokens of a question of its own that stop_mask throws away. Only the last 8
    tokens are decoded (a stop string is a newline or two)."""
    tails = tokenizer.batch_decode(responses[:, -8:])
    return torch.tensor([stop in tail for tail in tails], device=responses.device)


def stop_mask(tokenizer, responses: Tensor, mask: Tensor, stop: str) -> tuple[Tensor, Tensor]:
    """mask [N, T] ended at the token that completes the first `stop` string (the token included, like an EOS):
    the shortest prefix whose text holds it, found by bisection, since one token may hold several characters;
    and [N] True where the answer ended so."""
    lengths, stopped = [], []
    for row, n in zip(responses.tolist(), mask.sum(dim=1).long().tolist()):
        low, high = 1, n
        stopped.append(stop in tokenizer.decode(row[:n]))
        if stopped[-1]:
            while low < high:
                middle = (low + high) // 2
                if stop in tokenizer.decode(row[:middle]):
                    high = middle
                else:
                    low = middle + 1
        lengths.append(high)
    positions = torch.arange(responses.shape[1], device=responses.device)
    cut = (positions.unsqueeze(0) < torch.tensor(lengths, device=responses.device).unsqueeze(1)).float()
    return cut, torch.tensor(stopped, dtype=torch.bool, device=responses.device)


def decode(tokenizer, responses: Tensor, mask: Tensor) -> list[str]:
    """Response text after the prompt, up to the first EOS."""
    lengths = mask.sum(dim=1).long().tolist()
    return tokenizer.batch_decode([row[:n] for row, n in zip(responses.tolist(), lengths)], skip_special_tokens=True)


def position_ids(attention_mask: Tensor) -> Tensor:
    """Each token's position among the real tokens of its row, so that left padding shifts nothing (gpt2 has
    absolute positions): [N, width]."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def draw(logits: Tensor, greedy: Tensor, generator: Optional[torch.Generator] = None) -> tuple[Tensor, Tensor, Tensor]:
    """A token for each row of logits [N, vocab] (already ÷ temperature), its log-probability and the row's entropy,
    from one log-softmax. Rows flagged in `greedy` [N] take the most likely token; the others draw exactly from
    softmax(logits) with one uniform number each: the first token whose cumulative probability exceeds it (the
    inverse of the distribution function). That is torch.multinomial's distribution without its one exponential
    number per vocabulary entry, which on a CPU costs more than a decoding step's matrix products. A few rows at a
    time, so that the temporaries are [rows, vocab] (LOGITS_PER_CHUNK), not [N, vocab]."""
    rows = max(1, LOGITS_PER_CHUNK // logits.shape[-1])
    if len(logits) > rows:
        parts = [draw(chunk, flags, generator) for chunk, flags in zip(logits.split(rows), greedy.split(rows))]
        return tuple(torch.cat(part) for part in zip(*parts))
    log_pi = torch.log_softmax(logits, dim=-1)
    pi = log_pi.exp()
    cdf = pi.cumsum(dim=-1, dtype=torch.float64)  # [N, vocab], non-decreasing
    u = torch.rand(len(logits), 1, dtype=torch.float64, device=logits.device, generator=generator) * cdf[:, -1:]
    # how many bounds are <= u: a token of probability 0 (a bound equal to the one before) is never drawn, and a u
    # rounded up to the total (one draw in ~2^53) falls to the last token
    drawn = torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=logits.shape[-1] - 1)
    token = torch.where(greedy, logits.argmax(dim=-1), drawn)
    return token, log_pi.gather(1, token.unsqueeze(1)).squeeze(1), torch.special.entr(pi).sum(dim=-1)


def shared_head(prompt_ids: Tensor, prompt_mask: Tensor) -> int:
    """H: how many leading tokens every left-padded prompt of [B, P] shares (a chat template, a system turn, solved
    examples), at most the shortest prompt's length − 1, so that each prompt keeps a token of its own."""
    lengths = prompt_mask.sum(dim=1)
    width = int(lengths.min()) - 1
    if width <= 0:
        return 0
    starts = prompt_ids.shape[1] - lengths  # left padding: prompt b begins at column P − length_b
    heads = prompt_ids.gather(1, starts.unsqueeze(1) + torch.arange(width, device=prompt_ids.device))  # [B, width]
    return int((heads == heads[:1]).all(dim=0).int().cumprod(dim=0).sum())


def read_prompts(model, prompt_ids: Tensor, prompt_mask: Tensor, logits_to_keep: int = 1,
                 prompt_embeds: Optional[Tensor] = None):
    """Left-padded prompts [B, P] through the model into a KV cache, the head they all share computed once.

    The H tokens every prompt begins with (shared_head) run as a batch of one; their keys and values are copied B
    times, and each prompt's own tail continues from them. Exact: every token attends to the keys and values it
    would see in its whole prompt, at the same positions. The cache's columns then hold the head, then each tail
    left-padded. Returns the model's output (the cache, the logits of the last `logits_to_keep` positions) and the
    attention mask of those columns, [B, H + the longest tail]. `prompt_embeds` [B, P, d]: the prompts' input
    embeddings, when the caller looked them up (see `embed`); the model looks them up otherwise.
    """
    head = shared_head(prompt_ids, prompt_mask)
    lengths = prompt_mask.sum(dim=1, keepdim=True)  # [B, 1]
    width = int(lengths.max()) - head  # the longest tail
    columns = torch.arange(width, device=prompt_mask.device)
    tail_mask = (columns >= width - (lengths - head)).to(prompt_mask.dtype)  # [B, width], each tail at the right
    attention_mask = torch.cat([prompt_mask.new_ones(len(prompt_mask), head), tail_mask], dim=1)
    # the tokens, as their ids or as the embeddings the caller looked up: [B, P] or [B, P, d], sliced alike
    key, inputs = ("input_ids", prompt_ids) if prompt_embeds is None else ("inputs_embeds", prompt_embeds)
    cache = None
    if head > 0:
        start = prompt_ids.shape[1] - int(lengths[0])
        cache = model(**{key: inputs[:1, start : start + head]}, attention_mask=attention_mask[:1, :head],
                      position_ids=torch.arange(head, device=prompt_ids.device).unsqueeze(0), use_cache=True,
                      logits_to_keep=1).past_key_values  # the head, [1, H]
        cache.batch_repeat_interleave(len(prompt_ids))  # [1, ...] -> [B, ...]
    output = model(**{key: inputs[:, prompt_ids.shape[1] - width :]}, attention_mask=attention_mask,
                   position_ids=position_ids(attention_mask)[:, head:], past_key_values=cache, use_cache=True,
                   logits_to_keep=logits_to_keep)
    return output, attention_mask


def embed(model, *token_ids: Tensor) -> list[Tensor]:
    """The input embeddings of each tensor of token ids [..] -> [.., d], from one lookup. A model called on each in
    turn looks its tokens up in every call, and each lookup gives the embedding matrix [vocab, d] a gradient of
    its own, a dense tensor of its size, which the backward pass then adds up: one lookup gives it one. `model`
    may be wrapped in DDP."""
    lookup = getattr(model, "module", model).get_input_embeddings()
    embeds = lookup(torch.cat([ids.flatten() for ids in token_ids]))
    return [part.view(*ids.shape, -1) for part, ids in zip(embeds.split([ids.numel() for ids in token_ids]), token_ids)]


def decoding_cache(model, prefill_cache, repeats: int, new_tokens: int):
    """The prefill's keys and values, each row `repeats` times, in a cache allocated once with room for `new_tokens`
    more columns (transformers' StaticCache): a decoding step writes its token's keys and values in place, where a
    growing cache (DynamicCache) copies itself whole at every step. Its unwritten columns are masked. Under bfloat16
    autocast (a GPU) a step's keys and values need not have the prefill's dtype, which a StaticCache cannot take in
    place: there the growing cache promotes them as they come."""
    from transformers import StaticCache

    if torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu"):
        prefill_cache.batch_repeat_interleave(repeats)
        return prefill_cache
    cache = StaticCache(config=model.config, max_cache_len=prefill_cache.get_seq_length() + new_tokens)
    for layer, filled in zip(cache.layers, prefill_cache.layers):
        layer.update(filled.keys.repeat_interleave(repeats, dim=0), filled.values.repeat_interleave(repeats, dim=0))
    return cache


def pad_cat(tensors: list[Tensor], value: int, left: bool) -> Tensor:
    """Stack [n_k, width_k] tensors of several sampling rounds, padding each to the widest one."""
    width = max(t.shape[1] for t in tensors)
    return torch.cat([F.pad(t, (width - t.shape[1], 0) if left else (0, width - t.shape[1]), value=value)
                      for t in tensors])


def training_questions(task, sample_size: int = 1000) -> list[str]:
    """The training questions to check before training: every one of a file's; of a generated task (or a plug-in),
    a sample drawn as training draws them (a generator's questions are alike in length)."""
    splits = getattr(task, "splits", None)
    if splits is not None:
        return [question for question, _, _ in splits["train"]]
    return [question for question, _ in task.prompts(sample_size, random.Random(EVAL_SEED))]


def check_prompt_length(tokenizer, model, task, eval_prompts: list[tuple[str, str]], few_shot: Optional[int],
                        system_prompt: Optional[str], max_new_tokens: int) -> int:
    """One line, before training, when the longest prompt + a response would not fit in the model's positions,
    naming that question; the prompts are the held-out ones and the training ones (training_questions), as the
    model reads them. Returns the length of the longest, in tokens."""
    questions = [question for question, _ in eval_prompts] + training_questions(task)
    texts = format_prompts(tokenizer, task, questions, few_shot, system_prompt)
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=tokenizer.chat_template is None)["input_ids"]]
    longest = max(range(len(texts)), key=lengths.__getitem__)
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and lengths[longest] + max_new_tokens > limit:
        question = questions[longest] if len(questions[longest]) <= 60 else questions[longest][:57] + "..."
        raise SystemExit(f"error: the prompt of the question {question!r} is {lengths[longest]} tokens long: with "
                         f"--max-new-tokens {max_new_tokens} it exceeds the model's {limit} positions; lower "
                         "--few-shot or --max-new-tokens, or leave that question out")
    return lengths[longest]


# ---------------------------------------------------------------- several processes (torchrun): data parallel

def init_distributed(use_cuda: bool) -> tuple[int, int, torch.device]:
    """rank, number of processes, device. Under torchrun (WORLD_SIZE > 1) join the process group: NCCL
    between GPUs, gloo between CPU processes. A plain `python grpo.py` is process 0 of 1 and joins nothing."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = use_cuda and torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if world_size == 1:
        return 0, 1, device
    if cuda:
        torch.cuda.set_device(device)
    # DDP imports torch.distributed.nn, whose functions take `group=group.WORLD` as a default argument, read once at
    # import: imported after the group exists, it would hold the group past destroy_process_group (finish_distributed)
    importlib.import_module("torch.distributed.nn")
    torch.distributed.init_process_group("nccl" if cuda else "gloo")
    return torch.distributed.get_rank(), world_size, device


def finish_distributed() -> None:
    """Leave the process group at the end of a run, every process together; the caller has dropped its DDP wrapper.

    Process 1 reaches the end as soon as its last all-reduce returns; process 0 still evaluates and saves. The barrier
    holds every process until process 0 is done. destroy_process_group then drops the last reference to the group,
    whose destructor releases the GIL and joins gloo's worker threads. Otherwise (the group kept alive by DDP, or by
    torch.distributed.nn: init_distributed) those threads outlive the script: one still freeing the last all-reduce's
    tensor asks the finalising interpreter for the GIL, is ended inside a noexcept destructor, and the process aborts
    (`terminate called without an active exception`, SIGABRT; torchrun then kills process 0 mid-evaluation).
    The wait has the group's timeout, as the wait for every earlier evaluation had. One process: nothing to leave."""
    if not torch.distributed.is_initialized():
        return
    nccl = torch.distributed.get_backend() == "nccl"
    torch.distributed.barrier(device_ids=[torch.cuda.current_device()] if nccl else None)
    torch.distributed.destroy_process_group()


def distribute(model, fsdp: bool, world_size: int):
    """The model the update runs. One process: the model. Under torchrun, by default, DDP: a wrapper around a whole
    copy in every process, which averages the gradients of the processes in backward(). With --fsdp, the model
    itself, sharded by torch's FSDP2: each decoder block, then the rest (embeddings, final norm, output layer), split
    over the processes, so that each holds 1/N of the weights, of their gradients and of Adam's state. A pass gathers
    each block's weights just before it runs and frees them after; backward() gathers them again and reduces each
    gradient to its shard. The optimiser is built afterwards, on the shards."""
    if world_size == 1:
        return model
    if not fsdp:
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    blocks = max((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), key=len)  # the decoder blocks
    for block in blocks:
        fully_shard(block)
    fully_shard(model, reshard_after_forward=False)  # the root's weights: needed again at once, by the backward pass
    return model


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def whole_weights(model):
    """Sampling and evaluation under --fsdp: every block's weights gathered once, before, and kept until after. A
    sampler stops when its own responses have ended, after other numbers of steps on each process: gathering block by
    block at each step, a process would wait in a collective that the others never join. Nothing without --fsdp."""
    if not is_sharded(model):
        yield
        return
    blocks = [m for m in model.modules() if is_sharded(m) and m is not model]
    for block in blocks:
        block.set_reshard_after_forward(False, recurse=False)
    for block in [model, *blocks]:
        block.unshard()
    try:
        yield
    finally:
        for block in [model, *blocks]:
            block.reshard()
        for block in blocks:
            block.set_reshard_after_forward(True, recurse=False)


def gradient_sync(model, last: bool):
    """DDP all-reduces gradients in every backward pass;
    within one optimiser step only the last micro-batch needs it."""
    if last or not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()


def collective_device() -> str:
    """Where a tensor must live to be all-reduced: NCCL reduces GPU tensors only, gloo CPU ones."""
    return "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"


def global_mean(value: float) -> float:
    """Mean of a per-process number over all processes (itself in one process):
    what rank 0 logs is the whole batch's."""
    if not torch.distributed.is_initialized():
        return value
    total = torch.tensor([value], dtype=torch.float64, device=collective_device())
    torch.distributed.all_reduce(total)
    return total.item() / torch.distributed.get_world_size()


def global_fraction(part: float, whole: float) -> float:
    """Σ part / Σ whole over all processes (itself in one process); 0 when the whole is 0."""
    total = torch.tensor([part, whole], dtype=torch.float64)
    if torch.distributed.is_initialized():
        total = total.to(collective_device())
        torch.distributed.all_reduce(total)
    return (total[0] / total[1]).item() if total[1] > 0 else 0.0


# ---------------------------------------------------------------- the update's minibatches

class Minibatch(NamedTuple):
    """One optimiser step: the responses it holds, and the passes (micro-batches) that run them through the model."""

    rows: Tensor  # [minibatch size] indices of its responses
    passes: list[Tensor]  # indices of at most --micro-batch-size responses each; with β = 0 only groups with signal


def draw_minibatches(advantages: Tensor, group_size: int, num_minibatches: int, micro_batch_size: Optional[int],
                     skip_no_signal: bool) -> list[Minibatch]:
    """One epoch's minibatches, of whole groups drawn at random.

    A group stays whole because its responses share their prompt: a pass then reads it once. With skip_no_signal
    (β = 0), the groups whose advantages are all 0 run no pass: every term of every group objective is multiplied
    by Â, so they add exactly 0 to the loss and the gradient. DDP's backward is collective, so every process runs
    as many groups: the most of any process, topped up with groups without signal (they still add 0).
    """
    groups = advantages.view(-1, group_size)  # [B, G]
    has_signal = (groups != 0).any(dim=1)  # [B]
    offsets = torch.arange(group_size, device=advantages.device)
    minibatches = []
    for chosen in torch.randperm(len(groups), device=advantages.device).chunk(num_minibatches):
        run = chosen
        if skip_no_signal:
            count = torch.tensor([int(has_signal[chosen].sum())])
            if torch.distributed.is_initialized():
                count = count.to(collective_device())
                torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
            run = chosen[torch.argsort((~has_signal[chosen]).int(), stable=True)][: int(count.item())]  # signal first
        rows, run_rows = ((g.unsqueeze(1) * group_size + offsets).flatten() for g in (chosen, run))  # [groups * G]
        passes = list(run_rows.split(micro_batch_size or len(rows))) if len(run_rows) else []
        minibatches.append(Minibatch(rows, passes))
    return minibatches


# ---------------------------------------------------------------- the bookkeeping of an iteration

def rollout_stats(rewards: Tensor, accuracies: Tensor, advantages: Tensor, mask: Tensor, truncated: Tensor,
                  entropies: Tensor, group_size: int) -> dict:
    """What one iteration's samples look like (this process's share): the tags every group file logs.
    `accuracies` is the task's reward (1 = right); `rewards` are what the advantages are computed from (DAPO's
    differ); `entropies` are those of π_θold where each token was sampled."""
    lengths, right = mask.sum(dim=1).float(), (accuracies == 1).float()
    return {
        "charts/reward": rewards.mean().item(),
        "charts/train_accuracy": right.mean().item(),
        "charts/response_length": lengths.mean().item(),
        "charts/right_response_length": ((lengths * right).sum() / right.sum().clamp(min=1)).item(),  # 0 if none
        "charts/wrong_response_length": ((lengths * (1 - right)).sum() / (1 - right).sum().clamp(min=1)).item(),
        # a group whose advantages are all 0 teaches nothing (the update skips it with β = 0)
        "charts/zero_signal_fraction": (advantages.view(-1, group_size) == 0).all(dim=1).float().mean().item(),
        "charts/truncated_fraction": truncated.float().mean().item(),
        "losses/entropy": ((entropies * mask).sum() / mask.sum().clamp(min=1)).item(),
    }


def sampler_gap(sampler_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, first_epoch: list[Minibatch]) -> dict:
    """How far the policy that sampled is from π_θold as the update scores it: |log π_sampler − log π_θold| over the
    response tokens scored (those of the first epoch's passes), its mean and its max, over all processes. The same
    weights, not the same arithmetic: a cache and one token at a time against whole passes, and bfloat16 on a GPU.
    Logged, not corrected: the figure says whether an importance-sampling correction would be needed."""
    scored = torch.zeros(len(mask), dtype=torch.bool, device=mask.device)
    for minibatch in first_epoch:
        for inds in minibatch.passes:
            scored[inds] = True
    tokens = mask * scored.unsqueeze(1)
    gap = (sampler_logprobs - old_logprobs).abs() * tokens
    largest = gap.max().reshape(1).double() if gap.numel() else torch.zeros(1, dtype=torch.float64)
    if torch.distributed.is_initialized():
        largest = largest.to(collective_device())
        torch.distributed.all_reduce(largest, op=torch.distributed.ReduceOp.MAX)
    return {"charts/sampler_gap_mean": global_fraction(gap.sum().item(), tokens.sum().item()),
            "charts/sampler_gap_max": largest.item()}
