"""grpo.py side by side with Hugging Face TRL's GRPOTrainer: same model, task, batch and hyperparameters.

    python -m common.tools.compare_trl                                   # seeds 1-3, ~15 minutes on one core
    python -m common.tools.compare_trl --settings                        # only the two resolved configurations
    python -m common.tools.compare_trl --seeds 1 --num-iterations 20     # a quick look
    python -m common.tools.compare_trl --out common/results/trl.md       # also write the tables to a file
    python -m common.tools.compare_trl --variants grpo trl --seeds 1 --cores 0 1 --num-iterations 16 --threshold 0.5 \
        -- --model runs/SmolLM2-135M-Instruct --task addition2 --few-shot 3 --learning-rate 1e-5 ...   # a real model

Flags after `--` are grpo.py's, given to both sides (the TRL side reads them as grpo.py's Args, so the
resolved defaults, the prompts and the evaluation are the same). With several --cores the variants of a
seed run at the same time, one per core, and each run's peak RSS is read from the kernel when it ends.

Three variants, each run as its own subprocess pinned to one core (OMP_NUM_THREADS=1), the way
common/tools/benchmark.py runs the scripts, and interleaved by seed (grpo seed 1, trl seed 1, trl-hook
seed 1, grpo seed 2, ...) so that whatever else loads the machine hits all three alike:
  grpo      `python grpo.py --seed N` with its defaults;
  trl       GRPOTrainer configured to match those defaults as closely as TRL allows (`trl_config`);
  trl-hook  the same, plus a forward pre-hook that gives the model position ids (`add_position_ids`).

Why the hook. The embedded model is a GPT-2: absolute position embeddings. Prompts of different lengths
are left-padded into one batch, so a row with k pad tokens must see positions 0, 1, ... from its first
real token on: position_ids = cumsum(attention_mask) − 1. `generate` does that; TRL's log-prob passes
call the model without position_ids, so GPT-2 numbers every row from the first pad token and scores
the left-padded rows (most of a batch) under another distribution than the one that sampled them. The
worker measures that gap before training and logs it (`scoring_gap`).

Both sides are measured the same way: a held-out evaluation (grpo.py's own `evaluate`: --eval-size test
prompts, sampled at temperature 1 and greedy) at the start, every --eval-every iterations and at the end, written to
TensorBoard with the tags grpo.py uses, then read back from the event files. An iteration is one
sampled batch of B prompts × G responses and the --num-minibatches optimiser steps on it: as many TRL
`global_step`s. A chat model's prompts reach TRL as the text grpo.py's chat template writes (few-shot turns
included); a base model with --few-shot is refused (TRL has no stop string: it would score the question the
model goes on to write). SmolLM2 is a Llama, whose rotary positions make a shift of all positions harmless:
the position-id hook is for the GPT-2 only.

What could not be aligned is listed in DIFFERENCES and printed with the tables.

trl, datasets and accelerate are optional dependencies of this tool only (not in requirements.txt):
    pip install trl==1.16.0 datasets accelerate
"""

import argparse
import concurrent.futures
import glob
import importlib.util
import math
import os
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # grpo.py is imported by the worker

from common.tools.benchmark import (  # noqa: E402  (stdlib + tensorboard)
    fmt,
    launch,
    median_row,
    read_scalars,
    refuse_missing_folder,
    stderr_tail,
)

VARIANTS = ("grpo", "trl", "trl-hook")
OPTIONAL = ("trl", "datasets", "accelerate")  # imported only by the TRL side
TRL_TESTED = "1.16.0"  # the version whose defaults and internals this file was written against
INSTALL = f"pip install trl=={TRL_TESTED} datasets accelerate"

DIFFERENCES = [
    "Advantage scale: TRL divides by the sample standard deviation (Bessel, n − 1) plus 1e-4 outside the root; "
    "grpo.py by the population standard deviation with 1e-6 inside it (eq. 91). With G = 8, TRL's advantages are "
    "√(7/8) ≈ 0.94 of grpo.py's. Not a GRPOConfig option.",
    "Learning-rate decay: both linear to 0, but TRL's scheduler steps once per optimiser step (4 per iteration), "
    "grpo.py once per iteration. Alignable only by handing TRL a scheduler object of one's own, which a GRPOConfig "
    "cannot say.",
    "Random streams: the prompts are the same and in the same order (drawn as grpo.py draws them, shuffle_dataset "
    "off), the seeds are the same, but the two programs consume the torch generator in different orders, so the "
    "sampled responses differ from the first iteration on.",
    "Log-ratio clamp: grpo.py clamps log π_θ − log π_θold (and the KL's log-ratio) to ±20 before exp; TRL does not. "
    "No effect unless a ratio is astronomically off.",
    "Entropy: TRL computes the per-token entropy in every loss pass (for its logs); grpo.py while it samples, from the "
    "logits it samples from. A cost, not a change of the update.",
]


def trl_version() -> str:
    from importlib.metadata import version

    return version("trl")


def require_optional() -> None:
    """One line saying what to install when TRL or its companions are missing (before any heavy import)."""
    missing = [name for name in OPTIONAL if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(
            f"error: python -m common.tools.compare_trl needs {', '.join(missing)}, optional dependencies of this tool "
            f"only (not in requirements.txt): {INSTALL}"
        )


# ---------------------------------------------------------------- TRL configured like grpo.py

def trl_config(g, output_dir: str):
    """GRPOConfig matching grpo.Args `g`. Every value is set explicitly: TRL's defaults differ (see `settings`)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir,
        seed=g.seed,
        use_cpu=True,  # grpo.py's numbers on this machine are CPU numbers
        # Batch: one generation of B prompts × G responses, then num_minibatches optimiser steps on it.
        num_generations=g.group_size,
        per_device_train_batch_size=g.prompts_per_iteration * g.group_size // g.num_minibatches,  # the minibatch
        steps_per_generation=g.num_minibatches,  # TRL default: gradient_accumulation_steps (1)
        gradient_accumulation_steps=1,
        num_iterations=g.update_epochs,  # TRL's μ: passes over each generation
        max_steps=g.num_iterations * g.num_minibatches,
        shuffle_dataset=False,  # the dataset is grpo.py's prompt stream, in its order
        # Sampling: the policy itself, no truncation of the distribution.
        max_completion_length=g.max_new_tokens,  # TRL default 512
        temperature=g.temperature,
        top_k=0,
        top_p=1.0,
        min_p=None,
        repetition_penalty=1.0,
        # Optimisation: Adam (AdamW with no weight decay), linear decay to 0, no warm-up, global norm clip.
        learning_rate=g.learning_rate,  # TRL default 1e-6
        optim="adamw_torch",
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        lr_scheduler_type="linear",
        warmup_steps=0,
        max_grad_norm=g.max_grad_norm,
        # The objective.
        loss_type="grpo",  # mean over each response's tokens, then over responses (eq. 97); TRL default "dapo"
        scale_rewards="group",
        beta=g.beta,  # TRL default 0: no KL term, no reference model
        use_bias_correction_kl=False,  # TRL default True multiplies the k3 KL by the ratio; grpo.py does not
        epsilon=g.clip_eps,
        epsilon_high=None,  # = epsilon: a symmetric clip
        importance_sampling_level="token",
        mask_truncated_completions=False,
        top_entropy_quantile=1.0,
        entropy_coef=0.0,
        # Numerics: float32 throughout, as grpo.py on a CPU.
        bf16=False,  # TRL default True
        fp16=False,
        gradient_checkpointing=False,  # TRL default True
        disable_dropout=True,  # grpo.py sets every dropout to 0 at load (the embedded model has none)
        # Bookkeeping: no checkpoints, no external loggers, one log line per iteration.
        save_strategy="no",
        report_to="none",
        logging_steps=g.num_minibatches,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def settings(g, config, default) -> list[tuple[str, str, str, str]]:
    """(setting, grpo.py, TRL as configured here, TRL's default) for the side-by-side printout."""
    def name(value):  # TrainingArguments turns some strings into enums
        return getattr(value, "value", value)

    sched = "linear to 0 per optimiser step, warm-up {}"
    return [
        ("responses per prompt", f"group_size {g.group_size}", f"num_generations {config.num_generations}",
         str(default.num_generations)),
        ("responses sampled per iteration", f"{g.prompts_per_iteration} × {g.group_size}",
         f"generation_batch_size {config.generation_batch_size}", str(default.generation_batch_size)),
        ("optimiser steps per sampled batch", f"num_minibatches {g.num_minibatches}",
         f"steps_per_generation {config.steps_per_generation}", str(default.steps_per_generation)),
        ("responses per optimiser step", str(g.prompts_per_iteration * g.group_size // g.num_minibatches),
         f"per_device_train_batch_size {config.per_device_train_batch_size}", str(default.per_device_train_batch_size)),
        ("passes over each batch", f"update_epochs {g.update_epochs}", f"num_iterations {config.num_iterations}",
         str(default.num_iterations)),
        ("length of the run", f"num_iterations {g.num_iterations}", f"max_steps {config.max_steps}",
         f"{default.max_steps} (epochs {default.num_train_epochs:g})"),
        ("prompt order", "task stream, seeded", f"same stream, shuffle_dataset {config.shuffle_dataset}",
         str(default.shuffle_dataset)),
        ("max response tokens", f"max_new_tokens {g.max_new_tokens}",
         f"max_completion_length {config.max_completion_length}", str(default.max_completion_length)),
        ("temperature", f"{g.temperature:g}", f"{config.temperature:g}", f"{default.temperature:g}"),
        ("top_k / top_p / min_p", "0 / 1 / none", f"{config.top_k} / {config.top_p:g} / {config.min_p}",
         f"{default.top_k} / {default.top_p:g} / {default.min_p}"),
        ("learning rate", f"{g.learning_rate:g}", f"{config.learning_rate:g}", f"{default.learning_rate:g}"),
        ("schedule", "linear to 0 per iteration", sched.format(config.warmup_steps),
         f"{name(default.lr_scheduler_type)} per optimiser step, warm-up {default.warmup_steps}"),
        ("optimiser", "Adam (0.9, 0.999, 1e-8)",
         f"{name(config.optim)}, weight decay {config.weight_decay:g}",
         f"{name(default.optim)}, weight decay {default.weight_decay:g}"),
        ("gradient-norm clip", f"{g.max_grad_norm:g}", f"{config.max_grad_norm:g}", f"{default.max_grad_norm:g}"),
        ("loss aggregation", "token mean per response, then mean (eq. 97)", f"loss_type {config.loss_type}",
         default.loss_type),
        ("advantage", "(R − mean) / √(pop. var + 1e-6)",
         f"scale_rewards {config.scale_rewards}: (R − mean) / (std + 1e-4)", default.scale_rewards),
        ("clip ε (low / high)", f"{g.clip_eps:g} / {g.clip_eps:g}",
         f"{config.epsilon:g} / {config.epsilon_high or config.epsilon:g}",
         f"{default.epsilon:g} / {default.epsilon_high or default.epsilon:g}"),
        ("KL weight β", f"{g.beta:g}", f"{config.beta:g}", f"{default.beta:g}"),
        ("KL estimator", f"{g.kl_estimator}, not weighted by the ratio",
         f"k3, use_bias_correction_kl {config.use_bias_correction_kl}", f"k3, {default.use_bias_correction_kl}"),
        ("dtype", "float32 (CPU)", f"bf16 {config.bf16}", f"bf16 {default.bf16}"),
        ("gradient checkpointing", str(g.gradient_checkpointing), str(config.gradient_checkpointing),
         str(default.gradient_checkpointing)),
        ("dropout off", "yes", str(config.disable_dropout), str(default.disable_dropout)),
        ("held-out evaluation", f"every {g.eval_every} iterations, {g.eval_size} prompts",
         "the same, grpo.py's evaluate() in a TrainerCallback", "none"),
    ]


def settings_markdown(g) -> str:
    """The side-by-side table of both resolved configurations (builds two GRPOConfigs; imports trl)."""
    from trl import GRPOConfig

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated")  # transformers' rename
        config = trl_config(g, tmp)
        default = GRPOConfig(output_dir=tmp, use_cpu=True)
    rows = settings(g, config, default)
    lines = [f"Settings (TRL {trl_version()}):", "", "| setting | grpo.py | TRL as configured | TRL default |",
             "|---|---|---|---|"]
    lines += [f"| {name} | {ours} | {theirs} | {default_value} |" for name, ours, theirs, default_value in rows]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the position-id fix, and the gap it closes

def add_position_ids(model):
    """Forward pre-hook: position_ids = cumsum(attention_mask) − 1 whenever a full sequence comes without them.

    Generation steps with a KV cache feed one token against the whole mask (shapes differ) and bring their
    own position ids: those calls are left alone.
    """

    def hook(module, args, kwargs):
        input_ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        if (kwargs.get("position_ids") is None and input_ids is not None and mask is not None
                and mask.shape == input_ids.shape):
            kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
        return args, kwargs

    return model.register_forward_pre_hook(hook, with_kwargs=True)


def scoring_gap(trainer, tokenizer, prompts: list[str], g) -> tuple[float, float]:
    """Mean |log π as TRL scores it − log π of the sampler| per response token of the left-padded rows, and the
    share of rows that are left-padded, on one batch sampled from the starting model. The torch generator
    is restored afterwards, so the measurement does not move the run's random stream."""
    import torch

    rng_state = torch.get_rng_state()
    model = trainer.model
    enc = tokenizer(prompts, return_tensors="pt", padding=True)  # left padding, as TRL and grpo.py
    prompt_ids = enc["input_ids"].repeat_interleave(g.group_size, dim=0)  # [N, P]
    prompt_mask = enc["attention_mask"].repeat_interleave(g.group_size, dim=0)
    with torch.no_grad():
        sequences = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            max_new_tokens=g.max_new_tokens,
            do_sample=True,
            temperature=g.temperature,
            top_k=0,
            top_p=1.0,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=trainer.eos_token_ids,
        )
        responses = sequences[:, prompt_ids.shape[1]:]  # [N, T]
        is_eos = torch.isin(responses, torch.tensor(trainer.eos_token_ids))
        first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), responses.shape[1] - 1)
        mask = torch.arange(responses.shape[1]).unsqueeze(0) <= first_eos.unsqueeze(1)  # [N, T], EOS included
        attention_mask = torch.cat([prompt_mask, mask.long()], dim=1)  # [N, P+T]
        # The sampler's log-probs: the model with the positions generate() gave it.
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=sequences, attention_mask=attention_mask, position_ids=position_ids).logits
        logits = logits[:, prompt_ids.shape[1] - 1 : -1].float() / g.temperature  # [N, T, vocab]
        sampler = logits.gather(-1, responses.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
        # TRL's own log-prob function, exactly as its loss and its old/ref log-prob passes call it.
        scored, _, _ = trainer._get_per_token_logps_and_entropies(model, sequences, attention_mask, responses.shape[1])
    torch.set_rng_state(rng_state)
    padded = (prompt_mask == 0).any(dim=1)  # [N]
    tokens = mask & padded.unsqueeze(1)
    gap = ((scored - sampler).abs() * tokens).sum() / tokens.sum().clamp(min=1)
    return gap.item(), padded.float().mean().item()


# ---------------------------------------------------------------- the worker: one TRL run (a subprocess)

def grpo_args(flags: list[str], **fields):
    """grpo.py's Args as grpo.py itself would read `flags` (its defaults resolved per model), then `fields` set."""
    import tyro

    import grpo
    from common.policy import resolve_defaults

    args = tyro.cli(grpo.Args, args=flags + [f"--{k.replace('_', '-')}={v}" for k, v in fields.items()])
    resolve_defaults(args, beta=grpo.BETA)
    return args


def trl_worker(seed: int, num_iterations: int, hook: bool, flags: list[str]) -> None:
    """Train with GRPOTrainer on grpo.py's settings; log to runs/<run_name> with grpo.py's TensorBoard tags."""
    require_optional()
    import numpy as np
    import torch
    from datasets import Dataset
    from torch.utils.tensorboard import SummaryWriter
    from transformers import TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOTrainer

    import grpo
    from common import policy, sampling
    from common.tasks import EVAL_SEED, get_task

    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated")  # transformers' rename, not ours
    g = grpo_args(flags, seed=seed, num_iterations=num_iterations)
    name = "trl-hook" if hook else "trl"
    run_name = f"{g.task}__{name}__{seed}__{int(time.time())}"
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    device = torch.device("cpu")
    model_path = policy.resolve_model_path(g.model)
    tokenizer, model = policy.load_policy(model_path, device)  # named by its path: TRL reloads it for β > 0
    task = get_task(g.task, g.eval_task)
    # grpo.py draws B prompts per iteration from random.Random(seed): the same stream, all at once, and the
    # same text: a chat model's template with its few-shot turns (TRL tokenizes a text prompt as it is).
    pairs = task.prompts(g.prompts_per_iteration * g.num_iterations, random.Random(seed))
    prompt_format = sampling.PromptFormat(tokenizer, task, g.few_shot, g.system_prompt, model=model)
    texts = prompt_format.texts([p for p, _ in pairs])
    if tokenizer(texts[0])["input_ids"] != tokenizer(texts[0], add_special_tokens=False)["input_ids"]:
        raise SystemExit("error: this tokenizer adds special tokens to a text prompt (TRL would read another prompt)")
    if prompt_format.stop is not None:
        raise SystemExit("error: a base model with --few-shot ends its answer at a stop string, "
                         "which TRL does not have: use a chat model, or --few-shot 0")
    dataset = Dataset.from_dict({"prompt": texts, "target": [t for _, t in pairs]})
    eval_prompts = task.prompts(g.eval_size, random.Random(EVAL_SEED), split="test")
    writer = SummaryWriter(os.path.join("runs", run_name))
    rewards = []  # of the latest generation

    def reward(prompts, completions, target, **kwargs):
        """The task's verifier on the decoded response (up to its EOS), as grpo.py scores it."""
        rewards[:] = [task.reward(text, answer) for text, answer in zip(completions, target)]
        return rewards

    class HeldOut(TrainerCallback):
        """grpo.py's held-out evaluation and its per-iteration log, at iteration boundaries (every 4 steps)."""

        def evaluate(self, model, iteration):
            forward = grpo.Forward(torch.autocast("cpu", enabled=False), share_prompt=True)
            sampled, greedy = grpo.evaluate(model, prompt_format, task, eval_prompts, g, device, forward)
            accuracy, greedy_accuracy = sampled.mean().item(), greedy.mean().item()
            model.train()  # evaluate() leaves eval mode; the trainer trains in train mode
            writer.add_scalar("charts/accuracy", accuracy, iteration)
            writer.add_scalar("charts/greedy_accuracy", greedy_accuracy, iteration)
            print(f"iteration {iteration:4d}  held-out accuracy {accuracy:.3f} (greedy {greedy_accuracy:.3f})",
                  flush=True)

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.evaluate(model, 0)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % g.num_minibatches:
                return
            iteration = state.global_step // g.num_minibatches
            writer.add_scalar("charts/reward", sum(rewards) / max(len(rewards), 1), iteration)
            if iteration % g.eval_every == 0 or iteration == g.num_iterations:
                self.evaluate(model, iteration)

        def on_log(self, args, state, control, logs=None, **kwargs):
            iteration = state.global_step // g.num_minibatches
            for key, tag in (("kl", "losses/kl_ref"), ("clip_ratio/region_mean", "losses/clipfrac"),
                             ("entropy", "losses/entropy"), ("completions/mean_length", "charts/response_length")):
                if key in (logs or {}):
                    writer.add_scalar(tag, logs[key], iteration)

    with tempfile.TemporaryDirectory() as output_dir:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=trl_config(g, output_dir),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[HeldOut()],
        )
        if hook:  # the policy and the reference model: TRL scores with both
            for scorer in (trainer.model, trainer.ref_model):
                if scorer is not None:
                    add_position_ids(scorer)
        gap, padded = scoring_gap(trainer, tokenizer, texts[: g.prompts_per_iteration], g)
        writer.add_scalar("diagnostics/scoring_gap_nats", gap, 0)
        writer.add_scalar("diagnostics/padded_rows", padded, 0)
        print(f"{run_name}: left-padded rows {padded:.0%}, scored {gap:.3f} nats/token away from the sampler",
              flush=True)
        trainer.train()
    writer.close()


# ---------------------------------------------------------------- the comparison: run, read back, tabulate

def command(variant: str, seed: int, num_iterations: int, flags: list[str]) -> list[str]:
    if variant == "grpo":
        return [sys.executable, os.path.join(ROOT, "grpo.py"), *flags, "--seed", str(seed),
                "--num-iterations", str(num_iterations), "--no-cuda"]
    return [sys.executable, "-m", "common.tools.compare_trl", "--worker", variant, "--seed", str(seed),
            "--num-iterations", str(num_iterations), "--", *flags]


def run_one(variant: str, seed: int, num_iterations: int, flags: list[str], pin, keep: bool):
    """One run in a fresh working directory; (scalars, launch time, run seconds, peak RSS in GiB),
    or None if it failed."""
    cmd = command(variant, seed, num_iterations, flags)
    if pin is not None:
        cmd = ["taskset", "-c", str(pin)] + cmd
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    workdir = tempfile.mkdtemp(prefix=f"compare_{variant}_{seed}_")
    print(f"[compare_trl] {shlex.join(cmd)}   (in {workdir})", file=sys.stderr, flush=True)
    returncode, launch_time, run_seconds, peak_gb = launch(cmd, workdir, env)
    run_dirs = [os.path.dirname(p) for p in glob.glob(os.path.join(workdir, "runs", "*", "events.out.tfevents.*"))]
    if returncode != 0 or len(run_dirs) != 1:
        print(f"[compare_trl] {variant} seed {seed} FAILED (exit code {returncode}, output kept in {workdir}):\n"
              f"{stderr_tail(workdir)}",
              file=sys.stderr, flush=True)
        return None
    scalars = read_scalars(run_dirs[0])
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return scalars, launch_time, run_seconds, peak_gb


def summarise(scalars: dict, launch: float, run_seconds: float, peak_gb: float, threshold: float) -> dict:
    """One row of a run's numbers (NaN where missing). Training starts when the iteration-0 evaluation is logged.

    s/iter is the mean wall time between consecutive iterations' logs, leaving out the first iteration (warm-up)
    and each interval in which a held-out evaluation was logged: grpo.py evaluates before it logs iteration 10,
    TRL's callback after, so the interval is found by the evaluation's own time, not by its iteration.
    """
    nan = float("nan")
    accuracy = scalars.get("charts/accuracy", [])
    greedy = scalars.get("charts/greedy_accuracy", [])
    start = accuracy[0][0] if accuracy and accuracy[0][1] == 0 else nan
    row = {"startup": start - launch, "acc0": accuracy[0][2] if accuracy else nan, "x_to": nan, "s_to": nan,
           "final": statistics.mean(v for _, _, v in accuracy[-3:]) if accuracy else nan,
           "final_greedy": statistics.mean(v for _, _, v in greedy[-3:]) if greedy else nan,
           "run_s": run_seconds, "rss": peak_gb}
    for wall, step, value in accuracy:
        if value >= threshold:
            row["x_to"], row["s_to"] = step, wall - start
            break
    walls = {step: wall for wall, step, _ in scalars.get("charts/reward", [])}
    evaluated = [wall for wall, _, _ in accuracy]
    gaps = [walls[i] - walls[i - 1] for i in walls if i - 1 in walls and i - 1 >= 1
            and not any(walls[i - 1] < wall <= walls[i] for wall in evaluated)]
    row["s_iter"] = statistics.mean(gaps) if gaps else nan
    gap = scalars.get("diagnostics/scoring_gap_nats", [])
    row["gap"] = gap[0][2] if gap else nan
    return row


COLUMNS = [  # (header, key, format)
    ("iterations to {t}", "x_to", "{:.0f}"),
    ("training seconds to {t}", "s_to", "{:.1f}"),
    ("accuracy at start", "acc0", "{:.3f}"),
    ("final accuracy (last 3 evals)", "final", "{:.3f}"),
    ("final greedy", "final_greedy", "{:.3f}"),
    ("s/iter", "s_iter", "{:.3f}"),
    ("start-up s", "startup", "{:.1f}"),
    ("run seconds", "run_s", "{:.1f}"),
    ("peak RSS GiB", "rss", "{:.2f}"),
    ("log-prob gap at start, nats/token", "gap", "{:.2f}"),
]


def markdown(results: dict, threshold: float) -> str:
    """results: {variant: [(seed, row or None), ...]} -> the medians table, then the per-seed table."""
    t = f"{threshold:g}"
    headers = [h.format(t=t) for h, _, _ in COLUMNS]
    lines = ["| variant | reached | " + " | ".join("median " + h for h in headers) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]
    for variant, runs in results.items():
        rows = [row for _, row in runs if row is not None]
        failed = len(runs) - len(rows)
        reached = sum(not math.isnan(r["x_to"]) for r in rows)
        med = median_row(rows) if rows else {}
        note = f" ({failed} failed)" if failed else ""
        lines.append(f"| {variant} | {reached}/{len(runs)}{note} | "
                     + " | ".join(fmt(med, k, s) for _, k, s in COLUMNS) + " |")
    lines += ["", "| variant | seed | " + " | ".join(headers) + " |", "|---|---|" + "---|" * len(COLUMNS)]
    for variant, runs in results.items():
        for seed, row in runs:
            cells = " | ".join(fmt(row, k, s) for _, k, s in COLUMNS) if row else " | ".join(["failed"] * len(COLUMNS))
            lines.append(f"| {variant} | {seed} | {cells} |")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    """The tool's own flags, and grpo.py's flags (after `--`)."""
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m common.tools.compare_trl", description=__doc__.split("\n\n")[0],
                                epilog="Arguments after -- are grpo.py's flags, given to both sides (e.g. --model).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                   help="what to run: grpo.py, TRL as configured, TRL with the position-id hook")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3],
                   help="seeds; the variants of a seed run back to back")
    p.add_argument("--num-iterations", type=int, default=150, help="iterations of every run (grpo.py's default: 150)")
    p.add_argument("--threshold", type=float, default=0.9, help="held-out accuracy that counts as reached")
    p.add_argument("--cores", type=int, nargs="+", default=[0],
                   help="CPU cores to pin runs to with taskset, one run per core: with two or more, the variants of a "
                        "seed run at the same time")
    p.add_argument("--no-pin", action="store_true", help="do not pin runs with taskset")
    p.add_argument("--out", default=None,
                   help="also write the tables (with the settings and the differences) to this file")
    p.add_argument("--keep", action="store_true", help="keep each run's temporary working directory")
    p.add_argument("--settings", action="store_true",
                   help="print the two resolved configurations side by side and exit")
    p.add_argument("--worker", choices=("trl", "trl-hook"), default=None, help=argparse.SUPPRESS)  # one TRL run
    p.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)  # the worker's seed
    args = p.parse_args(argv)
    checks = [
        (args.num_iterations >= 1, f"--num-iterations must be >= 1, got {args.num_iterations}"),
        (0 < args.threshold <= 1, f"--threshold must be a held-out accuracy in (0, 1], got {args.threshold:g}"),
        (min(args.cores) >= 0 and len(set(args.cores)) == len(args.cores),
         f"--cores must be distinct cores >= 0, got {' '.join(map(str, args.cores))}"),
        (not any(f.startswith("--lora-rank") for f in flags), "--lora-rank: the TRL side here trains all weights"),
        (len(set(args.seeds)) == len(args.seeds),
         f"--seeds must not repeat a seed, got {' '.join(map(str, args.seeds))}"),
        (len(set(args.variants)) == len(args.variants), f"--variants must not repeat, got {' '.join(args.variants)}"),
    ]
    for ok, message in checks:
        if not ok:
            raise SystemExit(f"error: {message}")
    if args.out is not None:
        refuse_missing_folder("--out", args.out)
    args.flags = flags
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        trl_worker(args.seed, args.num_iterations, hook=args.worker == "trl-hook", flags=args.flags)
        return
    require_optional()  # before any run: the TRL side would fail later, and the settings need trl now
    import grpo

    if trl_version() != TRL_TESTED:
        print(f"warning: TRL {trl_version()} is not the {TRL_TESTED} this tool was written against: "
              "its defaults, and the log-prob function the gap measurement calls, may have moved", file=sys.stderr)
    g = grpo_args(args.flags, num_iterations=args.num_iterations)  # tyro refuses unknown flags
    grpo.check_args(g)  # and grpo.py's checks a bad value, in one line, before TRL sees it
    setting_text = settings_markdown(g)
    print(setting_text, flush=True)
    if args.settings:
        return
    cores = [None] if args.no_pin else args.cores
    if cores[0] is not None and shutil.which("taskset") is None:
        print("warning: taskset not found, runs are not pinned to a core", file=sys.stderr)
        cores = [None] * len(args.cores)
    if cores[0] is not None:
        print(f"[compare_trl] runs pinned to cores {' '.join(map(str, cores))} (--cores to choose, --no-pin for none)",
              file=sys.stderr)

    results = {variant: [] for variant in args.variants}
    jobs = [(seed, variant) for seed in args.seeds for variant in args.variants]  # interleaved: load hits all alike
    for start in range(0, len(jobs), len(cores)):  # as many runs at a time as cores, each on its own
        batch = jobs[start : start + len(cores)]
        with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
            runs = list(pool.map(lambda job_core: run_one(job_core[0][1], job_core[0][0], args.num_iterations,
                                                          args.flags, job_core[1], args.keep), zip(batch, cores)))
        for (seed, variant), run in zip(batch, runs):
            row = None if run is None else summarise(*run, args.threshold)
            results[variant].append((seed, row))
            if row is not None:
                print(f"[compare_trl] {variant} seed {seed}: {row['run_s']:.0f} s, "
                      f"{fmt(row, 's_iter', '{:.3f}')} s/iter, "
                      f"iterations to {args.threshold:g}: {fmt(row, 'x_to', '{:.0f}')}, final {row['final']:.3f}",
                      file=sys.stderr, flush=True)

    cmd = shlex.join(["python", "-m", "common.tools.compare_trl"] + argv)
    text = (f"`{cmd}`\n\nTRL {trl_version()}, one core per run (taskset, OMP_NUM_THREADS=1), seeds "
            f"{' '.join(map(str, args.seeds))} interleaved. Held-out accuracy on {g.eval_size} test prompts, "
            f"sampled at temperature 1; "
            f"'training seconds' count from the end of the iteration-0 evaluation; "
            f"'start-up' from process launch to it.\n\n"
            + markdown(results, args.threshold)
            + "\nDifferences that could not be aligned:\n\n" + "".join(f"- {d}\n" for d in DIFFERENCES))
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n" + setting_text)


if __name__ == "__main__":
    main()
