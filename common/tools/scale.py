"""Scale: what the defaults choose for a real model's memory, and a benchmark of a group script on a randomly
initialised model of a real configuration.

    python -m common.tools.scale                         # the plan: pass sizes and memory, by arithmetic, at once
    python -m common.tools.scale run                     # GPT-2 124M, the four variants, on CPU
    python -m common.tools.scale run --configs qwen2.5-0.5b --prompts 2 --group-size 4 --max-new-tokens 32
    python -m common.tools.scale run --configs qwen2.5-0.5b qwen2.5-1.5b --script gspo.py \
        --variants full lora full+bf16-logits --prompts 32 --max-new-tokens 256 --micro-batch-size 32   # on a GPU box

The plan prints, for SmolLM2-135M and a GPT-2-124M shape on a CPU and the README's GPU models on an 80 GB card, the
responses per forward/backward pass that the defaults choose (common/memory.py: response_bytes, state_bytes,
pass_budget, pass_size; the same functions a run calls) and the memory that is estimated to need: the training
state and one pass. Then,
for each README GPU model, which of DDP, DDP + LoRA and FSDP (--fsdp) fits on 1, 4 and 8 cards, with the state each
process holds (fit_state_bytes says how it is counted).

No weights are downloaded: the model is built from its configuration (the real layer count, widths,
heads and vocabulary) with random weights, next to a small BPE tokenizer, and saved to a temporary
folder; its cost per iteration is that of the real model (random weights only change what is said).
Each variant runs `python <script> --model <folder> ...` as a subprocess, like common/tools/benchmark.py, and
reads back its TensorBoard log:

    seconds per iteration, split generation / log-probs (policy + reference) / update,
    generated tokens per second, and peak memory: the process's peak RSS on CPU, or
    torch.cuda.max_memory_allocated on a GPU (logged by the script as perf/peak_gpu_memory_gb).

Variants: full (full fine-tuning, β = 0.04: a frozen reference copy), lora (--lora-rank 16: the
reference is the same model with adapters off), either with +gc (--gradient-checkpointing), and
either with +bf16-logits (--no-float32-logits: the output layer in bfloat16 under autocast, as it
would be without the float32 output layer; on a CPU there is no autocast and nothing changes).
The first iteration warms caches up; the figures are medians over the iterations after it.

Each run takes one optimiser step per iteration (--num-minibatches 1), so every step is taken at
π_θ = π_θold, where every ratio is 1 in exact arithmetic: the clip fraction logged there (the table's
"clipped at ratio 1") is numerical noise alone. With gspo.py (clip range 3e-4 / 4e-4 per response) it
is the test of whether the log-probs of sampling-time scoring and of the update agree.
"""

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The real configurations (from their config.json on the hub), with which AutoConfig.for_model builds them.
CONFIGS = {
    "gpt2-tiny": ("gpt2", dict(n_embd=32, n_layer=2, n_head=2, n_positions=256, vocab_size=1000)),  # for a quick try
    "qwen2.5-tiny": ("qwen2", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=1000, max_position_embeddings=2048,
                                   tie_word_embeddings=True)),  # the GPU check's dry run
    "gpt2-124m": ("gpt2", dict(n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=50257)),
    "qwen2.5-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2,
                                   vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True,
                                   rope_theta=1000000.0, rms_norm_eps=1e-6)),
    "qwen2.5-1.5b": ("qwen2", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                   num_attention_heads=12, num_key_value_heads=2,
                                   vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True,
                                   rope_theta=1000000.0, rms_norm_eps=1e-6)),
    "qwen2.5-3b": ("qwen2", dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                                 num_attention_heads=16, num_key_value_heads=2,
                                 vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True,
                                 rope_theta=1000000.0, rms_norm_eps=1e-6)),
    "qwen2.5-7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                 num_attention_heads=28, num_key_value_heads=4,
                                 vocab_size=152064, max_position_embeddings=32768, tie_word_embeddings=False,
                                 rope_theta=1000000.0, rms_norm_eps=1e-6)),
    "qwen2.5-14b": ("qwen2", dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
                                  num_attention_heads=40, num_key_value_heads=8,
                                  vocab_size=152064, max_position_embeddings=131072, tie_word_embeddings=False,
                                  rope_theta=1000000.0, rms_norm_eps=1e-5)),  # the GPU check: too big for one card
    "smollm2-135m": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                   max_position_embeddings=8192, tie_word_embeddings=True)),
}
# The plan's rows: (config, where, processes, what is trained, beta, prompt tokens). The CPU rows are the no-flag
# command of a real model (common/policy.py's CPU recipe; SmolLM2's 3-shot chat prompt is 159 tokens, GPT-2's
# 3-shot text ~60) with every response at the cap, the worst case; the GPU rows are the README's examples, with a
# chat prompt of ~64 tokens.
PLAN = [
    ("smollm2-135m", "cpu", 1, "all", 0.0, 159),  # β = 0: the CPU recipe runs no reference model (resolve_defaults)
    ("gpt2-124m", "cpu", 1, "all", 0.0, 60),
    ("qwen2.5-0.5b", "80 GB GPU", 1, "all", 0.04, 64),
    ("qwen2.5-3b", "80 GB GPU", 4, "all", 0.0, 64),
    ("qwen2.5-7b", "80 GB GPU", 1, "LoRA r16", 0.0, 64),
    ("qwen2.5-7b", "80 GB GPU", 8, "FSDP", 0.0, 64),
]
# What a run on an "80 GB" card (A100, H100) reads as torch.cuda.get_device_properties().total_memory, the size
# common/memory.py budgets from: 79.1-79.3 GiB (the driver keeps the rest), not 80e9 bytes (74.5 GiB). The lowest,
# so that what fits here fits there.
GPU_MEMORY = int(79.1 * 2**30)
VARIANTS = {
    "full": [],
    "lora": ["--lora-rank", "16"],
    "full+gc": ["--gradient-checkpointing"],
    "lora+gc": ["--lora-rank", "16", "--gradient-checkpointing"],
    "full+bf16-logits": ["--no-float32-logits"],
    "lora+bf16-logits": ["--lora-rank", "16", "--no-float32-logits"],
}


def build_model(name: str, folder: str) -> None:
    """Random weights in the real configuration, and a BPE tokenizer of a few strings (its ids are a small
    part of the vocabulary; sampling may pick any id of the model's vocabulary, which decodes to nothing)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, trainers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    model_type, fields = CONFIGS[name]
    texts = [f"{a}+{b}={a + b}" for a in range(100) for b in range(0, 100, 7)]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.decoder = decoders.Fuse()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<|endoftext|>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", unk_token="<unk>")
    config = AutoConfig.for_model(model_type, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
                                  **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters", flush=True)


def plan() -> None:
    """The pass size the defaults choose for each row of PLAN, and the memory estimated for it (no weights: the
    parameters are counted on the meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from common import memory, policy

    print("| model | where | processes | trained | state per process | per response | budget | pass size | "
          "estimated peak |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, where, processes, trained_kind, beta, prompt_tokens in PLAN:
        model_type, fields = CONFIGS[name]
        config = AutoConfig.for_model(model_type, **fields)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        gpu = where != "cpu"
        real = {key: values[1 if gpu else 2] for key, values in policy.SCALE_DEFAULTS.items()}
        parameters = sum(p.numel() for p in model.parameters())
        frozen = frozen_bytes(model) if gpu else parameters * 4  # LoRA's base, or the reference model
        reference = frozen if beta > 0 else 0
        if trained_kind.startswith("LoRA"):  # r (in + out) trained values per linear layer of attention and MLP
            trained = sum(16 * (m.in_features + m.out_features) for n, m in model.named_modules()
                          if isinstance(m, torch.nn.Linear) and "lm_head" not in n)
            state = memory.state_bytes(trained, frozen, processes)
        else:  # every weight trained, in a whole copy per process (DDP) or sharded (FSDP)
            gathered = memory.gathered_weights(model) if trained_kind == "FSDP" else None
            state = memory.state_bytes(parameters, 0, processes, gathered, reference)
        per_response = memory.response_bytes(real["max_new_tokens"], prompt_tokens, 8, config, 2 if gpu else 4)
        budget = memory.pass_budget(GPU_MEMORY if gpu else None, state)
        minibatch = real["prompts_per_iteration"] // processes // 4 * 8
        size = memory.pass_size(minibatch, 8, per_response, budget)
        print(f"| {name} | {where} | {processes} | {trained_kind} | "
              f"{state / 2**30:.1f} GiB | {per_response / 2**20:,.0f} MiB "
              f"({real['max_new_tokens']} + {prompt_tokens}/8 tokens) | {budget / 2**30:.1f} GiB | "
              f"{size} of {minibatch} | "
              f"{(state + size * per_response) / 2**30:.1f} GiB |")


# The fit table: the README's GPU models and Qwen2.5-14B, each way to spread training over cards of 80 GB.
FIT_MODELS = ["qwen2.5-0.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b"]
FIT_CARDS = [1, 4, 8]


def frozen_bytes(model) -> int:
    """A frozen copy of the weights on a GPU (LoRA's base, a reference model) as common/policy.py's
    frozen_weights_to_bfloat16 stores it: the linear layers in bfloat16; the embeddings, the norms and the
    output layer in float32."""
    import torch

    linear = sum(p.numel() for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
                 and "lm_head" not in name for p in m.parameters(recurse=False))
    return 2 * linear + 4 * (sum(p.numel() for p in model.parameters()) - linear)


def fit_state_bytes(strategy: str, model, adapters: int, cards: int) -> float:
    """What each process holds before any pass, β = 0, by the rule a run sizes its passes with (common/memory.py:
    training_state). DDP: 16 bytes a parameter (+ 4 for DDP's buckets on several cards); DDP + LoRA: the base as
    frozen_bytes stores it, the adapters' 16 (+ 4); FSDP: a 1/N shard of the 16, and in float32 (4) what is
    gathered at once: the weights outside the decoder blocks and two blocks."""
    from common import memory

    parameters = sum(p.numel() for p in model.parameters())
    if strategy == "DDP":
        return memory.state_bytes(parameters, 0, cards)
    if strategy == "DDP + LoRA r16":
        return memory.state_bytes(adapters, frozen_bytes(model), cards)
    return memory.state_bytes(parameters, 0, cards, gathered=memory.gathered_weights(model))


def fit() -> None:
    """Which of DDP, DDP + LoRA and FSDP fits each model of FIT_MODELS on 1, 4 and 8 cards of 80 GB: the state per
    process, and whether what 90 % of a card leaves holds a pass of at least one response (common/memory.py's rule:
    half of it for the pass) of 256 tokens after a 64-token prompt."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from common import memory

    print("\nState per process, and whether a pass of one response fits (✓) on cards of 80 GB; β = 0 (β > 0 adds a "
          "reference copy, its linear layers in bfloat16, except with LoRA):\n")
    columns = [f"{strategy}, {cards} card{'s' * (cards > 1)}" for strategy in ("DDP", "DDP + LoRA r16", "FSDP")
               for cards in FIT_CARDS]
    print("| model | parameters | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * 3 * len(FIT_CARDS))
    for name in FIT_MODELS:
        model_type, fields = CONFIGS[name]
        config = AutoConfig.for_model(model_type, **fields)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        parameters = sum(p.numel() for p in model.parameters())
        adapters = sum(16 * (m.in_features + m.out_features) for n, m in model.named_modules()
                       if isinstance(m, torch.nn.Linear) and "lm_head" not in n)
        per_response = memory.response_bytes(256, 64, 8, config, 2)
        cells = []
        for strategy in ("DDP", "DDP + LoRA r16", "FSDP"):
            for cards in FIT_CARDS:
                if strategy == "FSDP" and cards == 1:
                    cells.append("(shards over 2+)")
                    continue
                state = fit_state_bytes(strategy, model, adapters, cards)
                fits = memory.pass_budget(GPU_MEMORY, state) >= per_response
                cells.append(f"{state / 2**30:.0f} GiB {'✓' if fits else '✗'}")
        print(f"| {name} | {parameters / 1e9:.2f}B | " + " | ".join(cells) + " |")


def scalars(run_dir: str) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [e.value for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def script_flags(folder: str, variant: str, args) -> list[str]:
    """The script's flags for one variant. β = 0.04 unless typed after --: the variants measure the reference
    copy's cost, which a real model on a CPU (β = 0 by default there) and gspo.py (its own β = 0) would skip."""
    beta = [] if any(flag.split("=")[0] == "--beta" for flag in args.extra) else ["--beta", "0.04"]
    return ["--model", folder, "--num-iterations", str(args.iterations), "--prompts-per-iteration", str(args.prompts),
            "--group-size", str(args.group_size), "--max-new-tokens", str(args.max_new_tokens), "--eval-size", "1",
            "--eval-every", str(args.iterations + 1), "--micro-batch-size", str(args.micro_batch_size),
            "--num-minibatches", "1", "--learning-rate", "1e-6", *beta, *VARIANTS[variant], *args.extra]


def run_variant(script: str, folder: str, variant: str, args) -> dict:
    """One subprocess; its peak RSS comes back through a tiny wrapper process that waits for it alone."""
    command = [sys.executable, os.path.join(ROOT, script), *script_flags(folder, variant, args)]
    if args.core is not None:
        command = ["taskset", "-c", str(args.core), *command]
    wrapper = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
               "print('peak_rss_kb', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")
    with tempfile.TemporaryDirectory() as cwd:
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        result = subprocess.run([sys.executable, "-c", wrapper, *command], cwd=cwd, env=env, capture_output=True,
                                text=True)
        if result.returncode != 0:
            raise SystemExit(f"error: {variant} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
        (run_dir,) = glob.glob(os.path.join(cwd, "runs", "*"))
        values = scalars(run_dir)
    peak_rss_gb = int(result.stdout.split("peak_rss_kb")[1].split()[0]) / 2**20
    steady = slice(1, None) if args.iterations > 1 else slice(0, None)  # the first iteration warms up

    def median(tag):
        return statistics.median(values[tag][steady]) if tag in values else float("nan")

    gpu = values.get("perf/peak_gpu_memory_gb", [0.0])
    return dict(
        generate=median("perf/generate_seconds"),
        logprobs=median("perf/logprob_seconds"),
        update=median("perf/update_seconds"),
        tokens_per_second=median("charts/tokens_per_second"),
        clipped_at_one=median("losses/clipfrac"),  # sapo.py logs its gate instead: nan
        memory=f"{max(gpu):.1f} GiB GPU" if max(gpu) > 0 else f"{peak_rss_gb:.1f} GiB RSS",  # both / 2**30
    )


def main() -> None:
    if sys.argv[1:] in (["-h"], ["--help"]):  # the plan takes no flag: its help is this module's docstring
        print(__doc__.rstrip() + "\n\nThe benchmark's flags: python -m common.tools.scale run --help")
        return
    if sys.argv[1:2] != ["run"]:
        if sys.argv[1:] not in ([], ["plan"]):
            raise SystemExit("error: `python -m common.tools.scale` prints the plan; the benchmark is "
                             "`python -m common.tools.scale run [flags]` (--help there)")
        plan()
        return fit()
    del sys.argv[1]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["gpt2-124m"], choices=list(CONFIGS), help="default: gpt2-124m")
    parser.add_argument("--variants", nargs="+", default=["full", "lora", "full+gc", "lora+gc"], choices=list(VARIANTS),
                        help="default: full lora full+gc lora+gc")
    parser.add_argument("--script", default="grpo.py", help="the group script to run (default: grpo.py)")
    parser.add_argument("--iterations", type=int, default=3,
                        help="iterations per run; the first is warm-up (default: 3)")
    parser.add_argument("--prompts", type=int, default=8, help="B, prompts per iteration (default: 8)")
    parser.add_argument("--group-size", type=int, default=8, help="G, responses per prompt (default: 8)")
    parser.add_argument("--max-new-tokens", type=int, default=64,
                        help="response length; random weights rarely stop (default: 64)")
    parser.add_argument("--micro-batch-size", type=int, default=16,
                        help="responses per forward/backward pass (default: 16)")
    parser.add_argument("--core", type=int, default=None,
                        help="pin each run to this CPU core with taskset (default: no pinning)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run (default: 1)")
    parser.add_argument("extra", nargs="*", help="flags passed on to the script, after --")
    args = parser.parse_args()
    if args.iterations < 1 or args.prompts < 1 or args.group_size < 2 or args.max_new_tokens < 1:
        raise SystemExit("error: --iterations, --prompts and --max-new-tokens must be >= 1, --group-size >= 2")
    for flag, value in (("--micro-batch-size", args.micro_batch_size), ("--threads", args.threads)):
        if value < 1:  # 0 divided by zero below; OMP_NUM_THREADS=0 is refused by OpenMP, which takes every core
            raise SystemExit(f"error: {flag} must be >= 1, got {value}")
    if (args.prompts * args.group_size) % args.micro_batch_size:
        raise SystemExit("error: --micro-batch-size must divide --prompts × --group-size = "
                         f"{args.prompts * args.group_size}")

    rows = []
    for name in args.configs:
        with tempfile.TemporaryDirectory() as folder:
            build_model(name, folder)
            for variant in args.variants:
                start = time.time()
                row = run_variant(args.script, folder, variant, args)
                print(f"  {variant}: {row} ({time.time() - start:.0f} s)", flush=True)
                rows.append((name, variant, row))
    batch = (f"B = {args.prompts} × G = {args.group_size}, {args.max_new_tokens} new tokens, "
             f"micro-batch {args.micro_batch_size}")
    print(f"\n{args.script}, {batch}, {args.threads} thread(s); medians over iterations 2..{args.iterations}\n")
    print("| model | variant | generation s | log-probs s | update s | s / iteration | generation share | tokens/s "
          "| peak memory | clipped at ratio 1 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, variant, row in rows:
        total = row["generate"] + row["logprobs"] + row["update"]
        print(f"| {name} | {variant} | {row['generate']:.2f} | {row['logprobs']:.2f} | {row['update']:.2f} | "
              f"{total:.2f} | {row['generate'] / total:.0%} | {row['tokens_per_second']:.0f} | {row['memory']} | "
              f"{row['clipped_at_one']:.4f} |")


if __name__ == "__main__":
    main()
