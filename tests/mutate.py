"""Mutation testing of the nine algorithm files, the runtime of common/ and the tasks' verifiers: break the math on
purpose, one place at a time, and check that the test suite notices.

    python -m tests.mutate                          # every file: several hours on 2 cores (README)
    python -m tests.mutate --files dapo.py trpo.py  # some files
    python -m tests.mutate --list                   # the mutants, without running anything
    python -m tests.mutate --only dapo.py:12 ...    # some mutants (ids as --list prints them)

Each mutant is one small edit of one algorithm file. The tree is copied once per worker to a temporary
folder; for each mutant the worker writes the edited file there, runs pytest -x -q on the test files of that
algorithm file, and puts the original back. A mutant is *killed* when a test fails (or the edited file no
longer imports), *survived* when every test passes, *timeout* when the tests run past the limit. Not part of
CI (too slow); the README's testing section gives the command.

What is mutated (REGIONS below): the code that carries math and normalisation, or decides a figure. Group files:
the advantages, the KL estimator, the loss and its aggregation, log-probs at the temperature, the response mask,
scoring under π_θold and π_ref, the update loop (micro-batch weights, DAPO's whole-step normaliser and skipped
steps, gradient clipping), and DAPO's overlong penalty, dynamic sampling and loss mask. In the classic files:
compute_gae, normalize, the losses, TRPO's conjugate gradient, step size and line search, and the main loop from
the rollout storage to the optimiser steps. In common/'s runtime (COMMON_FUNCTIONS): the minibatches and
reductions across processes, the run's folder, the logged rollout statistics and what each iteration logs
(rates, ETA, peak memory, the perf line), the sampler gap, pass@k and the held-out figures, the prompts' text,
their tokens and the check of their length, reading prompts once, where a stop string cuts a response, the
padding of DAPO's rounds, the sampler's copies, its corrections and their defaults, the decoding steps, the perf
line, what each process holds, the memory of a pass and its budget (CPU and card) with the refusal of what does
not fit, the defaults per model and machine, what loading turns on (one thread, LoRA, gradient checkpointing,
the frozen base in bfloat16), dropout off, the float32 output layer, what a checkpoint writes and restores (the
weights, Adam's state, every random state), and when one is written or a stop is said. In common/tasks/: every
function (the questions drawn, the splits, how an answer is read, the Countdown parser), each entry of the
tables an answer is read with (TABLES: operators, words, units, invisible characters, LaTeX) and each member of
their patterns' character classes ([...]), against tests/test_tasks.py. Not mutated: argument checks, the rest
of loading and saving, generation, logging and what only feeds it (clip fractions, the lines under `with
torch.no_grad()` that fill `stats`), printing; each has its own tests, and a mutant there tells nothing about
the math.

Two more restrictions keep the run shorter: a line that a sibling shares with grpo.py (group) or
ppo.py (classic), comments aside, is mutated in grpo.py / ppo.py only (the tests that pin it are parametrized over
the files, and tests/test_classic_losses.py checks the shared helpers verbatim; --all-copies mutates every copy),
and shape arguments (dim=, .view(-1), .unsqueeze(1)) are left alone (a wrong one is a shape error).
Tests run cheapest first (tests/test_group_update.py, tests/test_classic_update.py) with -x, so most mutants die in
seconds; each worker imports torch and transformers once and forks a child per mutant.

The mutants come from two sources:
1. Rules applied to every node of a region's syntax tree: + ↔ −, * ↔ /, < ↔ <=, > ↔ >=, == ↔ !=,
   and ↔ or, min ↔ max, mean ↔ sum, clamp(min=) ↔ clamp(max=), a unary minus, ~ or `not` dropped,
   a numeric constant changed (0 → 1, 1 → 0 and 2, c → 0 and 2c), a name replaced by another of its kind
   (clip_eps_low ↔ clip_eps_high, logprobs ↔ old_logprobs ↔ ref_logprobs, model ↔ ref_model, ...),
   a keyword argument dropped (the callee's default then applies), and a statement deleted (an update
   `x = x - ...`, an augmented assignment, a call statement, an `if`, `break`, `continue`).
2. SEMANTIC: hand-written mutants of the kinds of breakage a review found passing (the wrong KL sign,
   direction or aggregation, micro-batch weights, DAPO's normaliser per micro-batch, filler groups in the
   loss, overlong filtering without effect, log-probs without the temperature, π_ref = π_θ, TRPO's line
   search without one of its tests, the step scale without its factor 2, the clipped action stored).

A surviving mutant is a missing test, unless it is equivalent (the program computes the same thing) or
harmless: EQUIVALENT lists those, with the reason, and the report marks them.
"""

import argparse
import ast
import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GROUP = ["grpo.py", "dr_grpo.py", "dapo.py", "gspo.py", "sapo.py"]
CLASSIC = ["vpg.py", "a2c.py", "trpo.py", "ppo.py"]

# ---------------------------------------------------------------- what is mutated, and which tests run

# A region is a function (by name, nested ones too) or, in the main block, the lines from the first line that
# contains `start` up to the line before the next one that contains `end`. `skip` ranges inside are left alone.
GROUP_FUNCTIONS = ["compute_advantages", "kl_penalty", "masked_mean_per_response", "policy_loss", "response_logits",
                   "token_logprobs", "logprobs_of", "response_mask", "sample_token", "sample", "score_responses",
                   "update_policy", "reference_model", "reference_scoring"]
GROUP_SKIP = []  # the logged statistics are mutated too: their definitions are tested (tests/test_group_update.py)
# The runtime of common/ whose code carries numbers or decides them: the minibatches and reductions across processes,
# the logged statistics, reading prompts once, the decoding steps, the perf line, memory, the defaults (docstring).
COMMON_FUNCTIONS = {
    "common/processes.py": ["draw_minibatches", "_reduce", "global_mean", "global_fraction", "global_max"],
    "common/runs.py": ["folder", "rollout_stats", "sampler_gap", "pass_at_k", "held_out", "end_iteration",
                       "warn_if_never_right"],
    "common/sampling.py": ["position_ids", "holds_stop", "shared_head", "read_prompts", "embed", "correct", "bytes",
                           "refresh", "state_dict", "load_state_dict", "stop_mask", "_stop_string", "pad_cat",
                           "sampler_differs", "resolve_correction", "_default_few_shot", "texts", "check_lengths",
                           "decode", "__init__", "token_ids", "encode", "model", "trained", "_sample_with"],
    "common/decoding.py": ["resolve_compiling", "__init__", "step", "asks", "finished", "compiled_step",
                           "decoding_step", "autocast_dtype", "own_dtype_autocast", "cast_weights", "decoding_model",
                           "casting_update", "cast_and_update", "output_layer_precision", "grouped_attention",
                           "decoding_cache"],
    "common/perf.py": ["work", "__init__", "figures", "line"],
    "common/policy.py": ["model_folder", "is_embedded", "resolve_defaults", "load", "checkpoint_activations", "forward",
                         "float32_output_layer", "frozen_weights_to_bfloat16", "disable_dropout", "add_lora"],
    "common/checkpoints.py": ["save", "restore", "stopped", "after"],
    "common/memory.py": ["response_bytes", "gathered_weights", "training_state", "state_bytes", "state_parts",
                         "pass_budget", "pass_size", "what_helps", "refuse_what_does_not_fit", "responses_per_pass"],
}
COMMON = list(COMMON_FUNCTIONS)
# The verifiers, every function of them: each result rests on their rewards (tests/test_tasks.py, values by hand).
TASKS = [f"common/tasks/{name}.py" for name in ("splits", "answers", "arithmetic", "countdown", "reverse", "files")]
# ... and their tables: each entry dropped in turn (an operator that no longer joins, a unit no longer read).
TABLES = {
    "common/tasks/answers.py": ["_UNITS", "_MINUS_SIGNS", "_JOINS_BEFORE", "_WORDS_BEFORE", "_JOINS_AFTER",
                                "_WORDS_AFTER", "_PUNCTUATION", "INVISIBLE", "_LATEX_PLAIN"],
    "common/tasks/countdown.py": ["_LATEX", "_EMOJI_PARTS", "_OPERATORS"],
}
CLASSIC_FUNCTIONS = ["compute_gae", "normalize", "policy_loss", "surrogate", "conjugate_gradient", "fvp"]
CLASSIC_BLOCKS = [("# 1. Sampling", 'if "episode" in infos'), ("# 2. ", "sps = ")]
CLASSIC_SKIP = [("clipfracs.append", "pg_loss = policy_loss")]  # ppo: the clip fraction is only logged
REGIONS = {
    **{f: dict(functions=GROUP_FUNCTIONS, blocks=[("# 4. Rewards", "# Log-probs of the sampled tokens")],
               skip=GROUP_SKIP) for f in GROUP},
    "dapo.py": dict(functions=GROUP_FUNCTIONS + ["overlong_penalty", "has_mixed_answers", "fill_batch",
                                                 "dynamic_sampling"],
                    blocks=[("# Groups without mixed answers", "# Log-probs of the sampled tokens")],
                    skip=GROUP_SKIP),
    **{f: dict(functions=functions, blocks=[], skip=[]) for f, functions in COMMON_FUNCTIONS.items()},
    # the barriers between the processes' writes, process 0's run name sent to the others: races, which no test
    # run on one machine can pin
    "common/checkpoints.py": dict(functions=COMMON_FUNCTIONS["common/checkpoints.py"], blocks=[],
                                  skip=[("if distributed:", "if ")]),
    "common/runs.py": dict(functions=COMMON_FUNCTIONS["common/runs.py"], blocks=[],
                           skip=[("if torch.distributed.is_initialized():  # the processes may straddle", "return ")]),
    **{f: dict(functions=None, blocks=[], skip=[]) for f in TASKS},  # None: every function
    **{f: dict(functions=CLASSIC_FUNCTIONS, blocks=CLASSIC_BLOCKS, skip=CLASSIC_SKIP) for f in CLASSIC},
}

# pytest arguments per file: the fast tests that can see a change of that file (no learning runs, no
# torchrun launch; the smoke runs of the CLI stay for the files whose main loop is mutated).
GROUP_TESTS = ["tests/test_group_update.py", "tests/test_group_crossfile.py", "tests/test_grpo.py",
               "tests/test_group_distributed.py", "-k",
               "not learns and not smoke and not real_model_code_path and not headroom and not two_processes "
               "and not torchrun"]
TESTS = {
    **{f: GROUP_TESTS for f in GROUP},
    **{f: GROUP_TESTS[:-2] + ["tests/test_sampler.py", "tests/test_common.py", "tests/test_group_prompts.py",
                              "tests/test_decoding.py",
                              "tests/test_group_real_models.py", "tests/test_group_bf16.py", "tests/test_scale.py",
                              "-k", GROUP_TESTS[-1]
                              + " and not end_to_end and not every_task and not embedded and not fills_a_row"]
       for f in COMMON},
    # The sampler and the run's figures: their own tests first (a mutant dies sooner), then the group files' that
    # call them, without the two-process launch (19 s a mutant; only the reductions of processes.py need it).
    "common/sampling.py": ["tests/test_sampler.py", "tests/test_common.py", "tests/test_group_prompts.py",
                           "tests/test_decoding.py", *GROUP_TESTS[:-2], "tests/test_group_real_models.py",
                           "tests/test_group_bf16.py", "tests/test_scale.py", "-k", GROUP_TESTS[-1]
                           + " and not end_to_end and not every_task and not embedded and not fills_a_row"
                           + " and not logged_fractions"],
    # pass@k and the held-out figures: their tests by hand and the console's evaluation line
    "common/runs.py": ["tests/test_common.py", "tests/test_group_runs.py", "tests/test_sampler.py", *GROUP_TESTS[:-2],
                       "-k", GROUP_TESTS[-1] + " and not end_to_end and not logged_fractions"],
    # the defaults per model and machine, the float32 output layer, the frozen weights in bfloat16, no dropout
    "common/policy.py": ["tests/test_common.py", "tests/test_sampler.py", "tests/test_group_bf16.py",
                         "tests/test_group_cli.py", "tests/test_group_real_models.py", "-k",
                         "not every_task and not fills_a_row and not learns and not smoke"],
    # what a checkpoint holds, when one is written and a stop is said: the runs stopped, resumed (sharded too) and
    # extended, a checkpoint saved and restored by hand
    "common/checkpoints.py": ["tests/test_group_runs.py", "tests/test_group_fsdp.py", "-k",
                              "stop or resume or extended or checkpoint"],
    # what each process holds and the pass sizes: their tests by hand, the holds line, the scale tool, the refusals
    "common/memory.py": ["tests/test_common.py", "tests/test_scale.py", "tests/test_gpu_check.py",
                         "tests/test_group_runs.py", "-k",
                         "state or refused or pass_size or budget or pass_on_a_card or response_costs or fit_table "
                         "or refusals or what_each_process_holds"],
    # the decoding steps and the perf line: their own tests, and the samplings that go through them (greedy against
    # Hugging Face's generate, the draw's frequencies at a temperature)
    **{f: ["tests/test_decoding.py", "tests/test_group_prompts.py", "tests/test_sampler.py", "tests/test_common.py",
           "tests/test_group_bf16.py", "tests/test_group_real_models.py", "-k",
           "not every_task and not fills_a_row and (not real_models or sampling_reads_each_prompt_once "
           "or architecture_left_padding)"]
       for f in ("common/decoding.py", "common/perf.py")},
    **{f: ["tests/test_tasks.py"] for f in TASKS},
    **{f: ["tests/test_classic_update.py", "tests/test_classic_losses.py", "tests/test_classic_cli.py",
           "tests/test_classic_rough_edges.py", "-k",
           "not smoke and not learns and not bad_argument and not unsupported_space and not missing and not lunar "
           f"and not readme and not console and ({f[:-3]} or not (vpg or a2c or trpo or ppo))"] for f in CLASSIC},
}

# Names that can stand in for one another: a mutant replaces one by another of its set.
SAME_KIND = [
    {"clip_eps_low", "clip_eps_high"}, {"tau_pos", "tau_neg"}, {"logprobs", "old_logprobs", "ref_logprobs"},
    {"model", "ref_model"}, {"mask", "loss_mask"}, {"rewards", "accuracies"}, {"max_new_tokens", "overlong_buffer"},
    {"batch_size", "minibatch_size", "micro_batch_size"}, {"gamma", "gae_lambda"}, {"dist", "old_dist"},
    {"surr", "surr_old"}, {"action", "env_action"}, {"obs", "next_obs"}, {"values", "returns"},
    {"b_advantages", "b_returns"}, {"terminations", "truncations"}, {"max_kl", "cg_damping"},
]
SWAPS = {"min": "max", "max": "min", "mean": "sum", "sum": "mean", "amin": "amax", "amax": "amin"}
BINOPS = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"), ast.Div: ("/", "*"), ast.Pow: ("**", "*")}
CMPOPS = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
          ast.Eq: ("==", "!="), ast.NotEq: ("!=", "==")}

# Hand-written mutants: (file, exact text, replacement, what it breaks). The text must occur exactly once.
LOSS_KL_GROUP = "per_token = per_token - beta * kl_penalty(logprobs, ref_logprobs, kl_estimator)"
SEMANTIC = [
    *[(f, LOSS_KL_GROUP, LOSS_KL_GROUP.replace("- beta", "+ beta"), "KL term with the wrong sign")
      for f in ("grpo.py", "dr_grpo.py", "dapo.py", "sapo.py")],
    *[(f, LOSS_KL_GROUP, LOSS_KL_GROUP.replace("(logprobs, ref_logprobs", "(ref_logprobs, logprobs"),
       "KL in the wrong direction: KL(π_ref ‖ π_θ)") for f in ("grpo.py", "dr_grpo.py", "dapo.py", "sapo.py")],
    ("dr_grpo.py", LOSS_KL_GROUP,
     "per_token = per_token - beta * kl_penalty(logprobs, ref_logprobs, kl_estimator) * max_new_tokens"
     " / mask.sum(1, keepdim=True).clamp(min=1)",
     "KL averaged per response (GRPO's aggregation) instead of summed / T_max"),
    ("dapo.py", LOSS_KL_GROUP,
     "per_token = per_token - beta * kl_penalty(logprobs, ref_logprobs, kl_estimator) * mask.sum() / mask.shape[0]"
     " / mask.sum(1, keepdim=True).clamp(min=1)",
     "KL averaged per response (GRPO's aggregation) instead of over all tokens"),
    ("grpo.py", LOSS_KL_GROUP,
     "per_token = per_token - beta * kl_penalty(logprobs, ref_logprobs, kl_estimator) * mask.sum(1, keepdim=True)"
     " * mask.shape[0] / mask.sum().clamp(min=1)",
     "KL averaged over the batch's tokens (DAPO's aggregation) instead of per response"),
    ("sapo.py", LOSS_KL_GROUP,
     "per_token = per_token - beta * kl_penalty(logprobs, ref_logprobs, kl_estimator) * mask.sum(1, keepdim=True)"
     " * mask.shape[0] / mask.sum().clamp(min=1)",
     "KL averaged over the batch's tokens instead of per response"),
    ("gspo.py", "per_response = per_response - beta * kl", "per_response = per_response + beta * kl",
     "KL term with the wrong sign"),
    ("gspo.py", "kl_penalty(logprobs, ref_logprobs, kl_estimator), mask)",
     "kl_penalty(ref_logprobs, logprobs, kl_estimator), mask)",
     "KL in the wrong direction"),
    ("gspo.py", "kl = masked_mean_per_response(kl_penalty(logprobs, ref_logprobs, kl_estimator), mask)",
     "kl = (kl_penalty(logprobs, ref_logprobs, kl_estimator) * mask).sum(1)",
     "KL summed over tokens instead of averaged"),
    *[(f, "loss = loss * len(inds) / len(minibatch.rows)\n", "",
       "pass losses not weighted by their share of the minibatch (over-weighted)") for f in GROUP if f != "dapo.py"],
    *[(f, "loss = loss * len(inds) / len(minibatch.rows)", "loss = loss / len(minibatch.rows)",
       "pass weight 1/minibatch instead of its share") for f in GROUP if f != "dapo.py"],
    ("dapo.py", "                        num_active_tokens=num_active_tokens,\n", "",
     "DAPO's normaliser per micro-batch instead of the whole step"),
    ("dapo.py", "                    loss.backward()\n",
     "                    loss = loss * len(inds) / len(minibatch.rows)\n"
     "                    loss.backward()\n", "DAPO's passes weighted like GRPO's"),
    ("dapo.py", "num_active_tokens = processes.global_mean(rollout.mask[minibatch.rows].sum().item())",
     "num_active_tokens = processes.global_mean(rollout.mask[minibatch.passes[0] if minibatch.passes "
     "else minibatch.rows].sum().item())",
     "DAPO's token count of the first pass, not of the whole minibatch"),
    ("dapo.py", "loss_mask = samples.mask * mixed.unsqueeze(1)", "loss_mask = samples.mask",
     "filler groups enter the loss mask"),
    ("dapo.py", "advantages = compute_advantages(rewards, args.group_size) * mixed",
     "advantages = compute_advantages(rewards, args.group_size)",
     "filler groups keep their (length-shaped) advantages"),
    ("dapo.py", "loss_mask = loss_mask * (~samples.truncated).unsqueeze(1)", "loss_mask = loss_mask",
     "--overlong-filtering without effect"),
    ("dapo.py", "rounds.append((samples, accuracies, rewards, has_mixed_answers(accuracies, args.group_size)))",
     "rounds.append((samples, accuracies, rewards, has_mixed_answers(rewards, args.group_size)))",
     "dynamic sampling filters on the shaped reward, not on accuracy"),
    ("dapo.py", "rewards = 2 * accuracies - 1 + penalty", "rewards = accuracies + penalty",
     "a 0/1 reward under the overlong penalty (a right answer cut at the cap scores as a wrong one)"),
    *[(f, "for inds in [inds for minibatch in first_epoch for inds in minibatch.passes]:",
       "for inds in [torch.arange(len(samples.responses))]:",
       "pi_old scored on the whole batch, not in the first epoch's passes (ratio not exactly 1)") for f in GROUP],
    *[(f, "cache.reorder_cache(prompt_index)", "cache.reorder_cache(prompt_index.flip(0))",
       "responses attend to another prompt's cache") for f in GROUP],
    *[("common/decoding.py", f"filled.{kv}.repeat_interleave(repeats, dim=0)", f"filled.{kv}.repeat(repeats, 1, 1, 1)",
       f"sampling: the prompts' cached {kv} repeated in the wrong order (a group's copies not next to each other)")
      for kv in ("keys", "values")],
    *[(f, "return logits.float().div_(temperature)", "return logits.float()", "log-probs ignore --temperature")
      for f in GROUP],
    *[(f, "ref_logprobs[inds] = logprobs_of(ref_model, samples, inds, args, forward)",
       "ref_logprobs[inds] = logprobs_of(model, samples, inds, args, forward)",
       "reference log-probs taken from the current policy") for f in GROUP],
    *[(f, "with ref_model.disable_adapter() if args.lora_rank > 0 else contextlib.nullcontext():",
       "with contextlib.nullcontext():", "LoRA: reference log-probs with the adapters on (= π_θ)") for f in GROUP],
    ("trpo.py", "if surr >= surr_old and approx_kl <= args.max_kl:", "if surr >= surr_old:",
     "line search without its KL test"),
    ("trpo.py", "if surr >= surr_old and approx_kl <= args.max_kl:", "if approx_kl <= args.max_kl:",
     "line search without its improvement test"),
    ("trpo.py", "torch.sqrt(2 * args.max_kl", "torch.sqrt(args.max_kl", "step scale without its factor 2"),
]
SEMANTIC += [
    (f, "            env_action = action.numpy()\n"
        "            if agent.continuous:  # the Gaussian is unbounded; the env gets the clipped action\n"
        "                env_action = np.clip(env_action, envs.single_action_space.low, "
        "envs.single_action_space.high)\n",
     "            env_action = action.numpy()\n"
     "            if agent.continuous:  # the Gaussian is unbounded; the env gets the clipped action\n"
     "                env_action = np.clip(env_action, envs.single_action_space.low, envs.single_action_space.high)\n"
     "                actions[step] = torch.as_tensor(env_action, dtype=torch.float32)\n",
     "the clipped action stored instead of the sampled one") for f in CLASSIC
]

# Surviving mutants that are equivalent or harmless: (file, text of the mutated line, mutation) -> why.
EQUIVALENT: dict[tuple[str, str, str], str] = {
    **{(file, line, '< → <='): 'equivalent: a hash lands exactly on the held-out fraction once in 2^64 draws'
       for file, line in (
           ('common/tasks/countdown.py',
            'return hash_unit(" ".join(map(str, sorted(numbers))) + f"={target}") < TEST_FRACTION'),
           ('common/tasks/reverse.py', 'if (hash_unit("reverse " + digits) < TEST_FRACTION) == (split == "test"):'),
           ('common/tasks/files.py', 'split = "test" if hash_unit(question) < TEST_FRACTION else "train"'))},
    **{('common/tasks/answers.py', '_LATEX_COMMAND_AT_END = re.compile(r"\\\\[A-Za-z]+[{(]?$")',
        f"drop {c!r} of [{{(]"):
       'equivalent: a word that ends in "{" or "(" joins the number after it by that character already'
       for c in "{("},
    **{('common/tasks/answers.py',
        '_LATEX_TEXT = re.compile(r"\\\\(?:text|textrm|textbf|mathrm|mbox)\\{([^{}]*)\\}")', f"drop {c!r} of [^{{}}]"):
       'harmless: differs only when a \\text{...} argument holds a brace group of its own, rare in an answer'
       for c in "{"},
    **{('common/tasks/countdown.py',
        'if label and not WORDS_BEFORE.intersection(re.findall(r"[^\\W\\d_]+", label.group().lower())):',
        f"drop {c!r} of [^\\W\\d_]"):
       'equivalent: a label holds words of letters only (LABEL), so no digit or underscore is there to split on'
       for c in ("\\d", "_")},
    **{('common/tasks/files.py', '_CALCULATOR_NOTE = re.compile(r"<<[^<>]*>>")', f"drop {c!r} of [^<>]"):
       'equivalent on GSM8K: its calculator notes hold no "<" or ">", and a match ends at the first ">>"'
       for c in "<>"},
    ('common/tasks/arithmetic.py', 'return h < TEST_FRACTION * 2**32', '< → <='):
        'equivalent: h is an integer and 0.1 × 2^32 is not',
    ('common/tasks/arithmetic.py',
     '(prompt, f"{prompt[:-1].replace(self.op, f\' {self.op} \', 1)} = {target}")', '1 → 2'):
        'equivalent: a prompt holds its operator once (the operands are never negative)',
    ('common/tasks/answers.py', 'return words[-1].start(), words[-1].group()', '-1 → 0'):
        'equivalent where it mutates the start: the word before the sign was checked not to join (or is a line\'s '
        'start), so the number stands alone from the sign or from the text\'s start alike',
    ('common/tasks/countdown.py', 'items = [(number, str(number), 3) for number in numbers]', '3 → 6'):
        'equivalent: an atom only needs a precedence above both operators\' (1 and 2)',
    ('common/tasks/countdown.py', 'if 1 <= target <= self.max_target:', '1 → 0'):
        'equivalent: every intermediate result is a positive integer by construction, so no target is 0',
    ('common/tasks/files.py', 'final = answer.rsplit("####", 1)[-1].strip()', '1 → 2'):
        'equivalent: the last piece of a split at "####" is the same however many splits are made',
    **{('common/tasks/files.py', 'pairs = self.module.prompts(2, random.Random(0), split)', mutation):
       'harmless: a first look at the shape of prompts()\'s pairs; another seed or 4 pairs checks the same'
       for mutation in ('0 → 1', '2 → 4')},
    ('common/decoding.py', 'self.attention_mask[:, self.prefilled + column - 1] = 1', '1 → 2'):
        'equivalent where it mutates the value written: any nonzero mask entry is a column attention reads',
    ('common/decoding.py', 'if not self.compiled:', 'delete the if'):
        'harmless on a CPU: a CUDA graph\'s outputs are copied and its step marked; eager outputs copied are equal',
    ('common/decoding.py', 'if not self.compiled:', 'drop the unary not'):
        'harmless on a CPU: without CUDA graphs, copying a step\'s outputs or not gives equal tensors',
    ('common/decoding.py',
     'torch.compiler.cudagraph_mark_step_begin()  # a graph\'s outputs live until its next replay',
     'delete the statement'):
        'harmless on a CPU: it marks a step for CUDA graphs only (results/gpu.md\'s H200 runs had it)',
    ('common/decoding.py',
     'if len(self.pending) < (CHECK_EVERY if self.compiled else 1) and self.steps < self.new_tokens:', '1 → 0'):
        'equivalent: pending holds at least the step just appended, so < 1 and < 0 are both false',
    ('common/decoding.py', 'return draw(logits[:, -1].float() / temperature, greedy, u)', '-1 → 0'):
        'equivalent: a decoding step reads one token per row, so its logits have one position',
    ('common/decoding.py', 'if tokens != 1 or groups == 1:', '1 → 0'):
        'equivalent where it mutates groups == 1: one group read as the rows of one query is the same attention',
    ('common/decoding.py', 'rows = sum(len(layer.keys) for layer in prefill_cache.layers[:1]) * repeats', '1 → 2'):
        'equivalent: rows only keys the reused caches, and doubling every key keeps them apart',
    ('common/perf.py', 'if logged.get(f"perf/{phase}_seconds") and flops > 0:', '0 → 1'):
        'equivalent: a pass runs thousands of FLOPs or none',
    ('grpo.py', 'log_r = (ref_logprobs - logprobs).clamp(-20.0, 20.0)', '-20.0 → -40.0'):
        'harmless: the clamp only keeps exp finite; ±40 does too in float32 (the no-NaN tests pin finiteness)',
    ('grpo.py', 'log_r = (ref_logprobs - logprobs).clamp(-20.0, 20.0)', '20.0 → 40.0'):
        'harmless: the clamp only keeps exp finite; ±40 does too in float32 (the no-NaN tests pin finiteness)',
    ('grpo.py', 'if ref_logprobs is not None and beta > 0:', '> → >='):
        'equivalent: at β = 0 the KL term adds 0 × a finite number',
    ('grpo.py', 'first_eos = torch.where(truncated, responses.shape[1] - 1, is_eos.int().argmax(dim=1))', '- → +'):
        'equivalent: for a cut response any end ≥ T − 1 gives the same all-ones mask',
    ('grpo.py', 'first_eos = torch.where(truncated, responses.shape[1] - 1, is_eos.int().argmax(dim=1))', '1 → 0'):
        'equivalent: for a cut response any end ≥ T − 1 gives the same all-ones mask',
    ('grpo.py', 'model.eval()', 'delete the statement'):
        'equivalent: dropout is 0 (disable_dropout), so train/eval mode changes no number '
        '(it only switches gradient checkpointing, memory)',
    ('grpo.py', 'model.train()  # dropout is off (disable_dropout); train mode only enables gradient checkpointing',
     'delete the statement'):
        'equivalent: dropout is 0 (disable_dropout), so train/eval mode changes no number '
        '(it only switches gradient checkpointing, memory)',
    ('grpo.py', 'with reference_scoring(ref_model, args), autocast:', 'ref_model → model'):
        'equivalent: with LoRA ref_model is model; without, reference_scoring is a no-op',
    ('dapo.py', 'return ((max_new_tokens - overlong_buffer - lengths) / overlong_buffer).clamp(min=-1.0, max=0.0)',
     '-1.0 → -2.0'):
        'equivalent: lengths never exceed max_new_tokens, so the penalty never falls below −1',
    ('dapo.py', 'return ((max_new_tokens - overlong_buffer - lengths) / overlong_buffer).clamp(min=-1.0, max=0.0)',
     'drop min='):
        'equivalent: lengths never exceed max_new_tokens, so the penalty never falls below −1',
    ('dapo.py', 'return -(per_token * mask).sum() / max(float(num_active_tokens), 1e-6)', '1e-06 → 2e-06'):
        'equivalent: the floor acts only on a batch without real tokens, whose sum is 0',
    ('dapo.py', 'model.eval()', 'delete the statement'):
        'equivalent: dropout is 0 (disable_dropout), so train/eval mode changes no number '
        '(it only switches gradient checkpointing, memory)',
    ('dapo.py', 'generate_seconds = time.time() - iteration_start', '- → +'):
        'harmless: a duration that is only logged (perf/generate_seconds)',
    ('sapo.py', 'tau = torch.where(adv > 0, adv.new_tensor(tau_pos), adv.new_tensor(tau_neg))', '> → >='):
        "equivalent: at Â = 0 the token's term and its gradient are 0 whatever τ",
    ('vpg.py', 'logratio = agent.get_dist(b_obs).log_prob(b_actions) - b_logprobs', '- → +'):
        'harmless: only logged (losses/approx_kl after the step)',
    ('a2c.py', 'logratio = agent.get_dist(b_obs).log_prob(b_actions) - b_logprobs', '- → +'):
        'harmless: only logged (losses/approx_kl after the step)',
    ('trpo.py',
     'ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))  # eq. (76); the clamp keeps exp finite',
     '-20.0 → -40.0'):
        'harmless: the clamp only keeps exp finite; ±40 does too in float32 '
        '(tests/test_classic_losses.py pins finiteness)',
    ('trpo.py',
     'ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))  # eq. (76); the clamp keeps exp finite',
     '20.0 → 40.0'):
        'harmless: the clamp only keeps exp finite; ±40 does too in float32 '
        '(tests/test_classic_losses.py pins finiteness)',
    ('ppo.py',
     'ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))  # eq. (76); the clamp keeps exp finite',
     '-20.0 → -40.0'):
        'harmless: the clamp only keeps exp finite; ±40 does too in float32 '
        '(tests/test_classic_losses.py pins finiteness)',
    ('ppo.py',
     'ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))  # eq. (76); the clamp keeps exp finite',
     '20.0 → 40.0'):
        'harmless: the clamp only keeps exp finite; ±40 does too in float32 '
        '(tests/test_classic_losses.py pins finiteness)',
    ('trpo.py', 'if rr < 1e-10:', '1e-10 → 2e-10'):
        "harmless: conjugate gradient's early-exit tolerance on the squared residual; 1e-10 vs 2e-10 (or < vs <=) "
        "moves the answer by far less than its iteration error",
    ('trpo.py', 'if rr < 1e-10:', '< → <='):
        "harmless: conjugate gradient's early-exit tolerance on the squared residual; 1e-10 vs 2e-10 (or < vs <=) "
        "moves the answer by far less than its iteration error",
    ('trpo.py', 'beta = torch.sqrt(2 * args.max_kl / (step_dir @ fvp(step_dir) + 1e-12))  # eq. (74)', '+ → -'):
        'harmless: a guard against 0 / 0; sᵀ(F + λI)s ≥ λ|s|² is never near 1e-12 with --cg-damping > 0 '
        '(with λ = 0 and g = 0 the step is 0 anyway)',
    ('trpo.py', 'beta = torch.sqrt(2 * args.max_kl / (step_dir @ fvp(step_dir) + 1e-12))  # eq. (74)', '1e-12 → 0.0'):
        'harmless: a guard against 0 / 0; sᵀ(F + λI)s ≥ λ|s|² is never near 1e-12 with --cg-damping > 0 '
        '(with λ = 0 and g = 0 the step is 0 anyway)',
    ('trpo.py', 'beta = torch.sqrt(2 * args.max_kl / (step_dir @ fvp(step_dir) + 1e-12))  # eq. (74)', '1e-12 → 2e-12'):
        'harmless: a guard against 0 / 0; sᵀ(F + λI)s ≥ λ|s|² is never near 1e-12 with --cg-damping > 0 '
        '(with λ = 0 and g = 0 the step is 0 anyway)',
    ('trpo.py', 'if surr >= surr_old and approx_kl <= args.max_kl:', '<= → <'):
        'equivalent: differs only when the mean KL equals δ exactly',
    ('trpo.py', 'if surr >= surr_old and approx_kl <= args.max_kl:', '>= → >'):
        'equivalent: surr = surr_old exactly only for a null step (g = 0), and refusing a null step leaves π_old too',
    ('trpo.py', 'dist, surr, approx_kl = old_dist, surr_old, torch.zeros(())', 'old_dist → dist'):
        'harmless: after a refused step dist only feeds the logged entropy',
    ('trpo.py', 'dist, surr, approx_kl = old_dist, surr_old, torch.zeros(())', 'surr_old → surr'):
        'harmless: after a refused step surr only feeds the logged policy loss',
    ('trpo.py', 'pg_loss = -surr', 'drop the unary -'):
        "harmless: TRPO's pg_loss is only logged (losses/policy_loss)",
    ('trpo.py', 'pg_loss = -surr', 'surr → surr_old'):
        "harmless: TRPO's pg_loss is only logged (losses/policy_loss)",
    ('ppo.py', 'global_step += args.num_envs', '+= → -='):
        'harmless: the step counter is the x axis of the logs and the console line',
    ('ppo.py', 'global_step += args.num_envs', 'delete the statement'):
        'harmless: the step counter is the x axis of the logs and the console line',
    ('ppo.py', 'env_action = np.clip(env_action, envs.single_action_space.low, envs.single_action_space.high)',
     'env_action → action'):
        'equivalent: np.clip of the action tensor gives the same array as np.clip of its numpy copy',
    ('ppo.py', 'if args.target_kl is not None and approx_kl > args.target_kl:', '> → >='):
        'equivalent: differs only when the KL estimate equals --target-kl exactly',
    **{('grpo.py', 'ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))', mutation):
       'harmless: this ratio only feeds the logged clip fraction; ±40 keeps exp finite in float32 too'
       for mutation in ('-20.0 → -40.0', '20.0 → 40.0')},
    ('grpo.py', 'clipped = ((ratio - 1).abs() > args.clip_eps).float()', '> → >='):
        'equivalent: differs only for a ratio of exactly 1 ± ε, and only in the logged clip fraction',
    **{('dapo.py', 'skip_no_signal=args.beta == 0,', mutation):
       'equivalent in numbers: the groups without signal add exactly 0 when run (tested), and after dynamic '
       'sampling the batch holds them only as fillers; the skip saves their cost'
       for mutation in ('0 → 1', '== → !=')},
    ('gspo.py', 'return -(per_response * (mask.sum(dim=1) > 0)).mean()', '.sum → .mean'):
        'equivalent: a mask of 0s and 1s has a positive mean exactly where it has a positive sum',
    ('dapo.py', 'sampling.pad_cat([s.entropies for s in sampled], 0, left=False)[rows],', '0 → 1'):
        'equivalent: padding positions are masked out of the logged entropy',
    ('dapo.py', 'sampling.pad_cat([s.logprobs for s in sampled], 0, left=False)[rows],', '0 → 1'):
        'equivalent: padding positions are masked out of every use of the sampler\'s log-probs (π_θold with '
        '--old-logprobs sampler, the sampler gap, the corrections\' ratios)',
    **{(file, 'clipped = ((ratio < 1 - args.clip_eps_low) | (ratio > 1 + args.clip_eps_high)).float()' + tail,
        mutation):
       'equivalent: differs only for a ratio of exactly 1 − ε_low or 1 + ε_high, and only in the logged clip fraction'
       for file, tail in (('dapo.py', ''), ('gspo.py', '.unsqueeze(1)')) for mutation in ('< → <=', '> → >=')},
    **{('gspo.py', 'ratio = torch.exp(masked_mean_per_response(logprobs - old_logprobs, mask).clamp(-20.0, 20.0))',
        mutation): 'harmless: this ratio only feeds the logged clip fraction; ±40 keeps exp finite in float32 too'
       for mutation in ('-20.0 → -40.0', '20.0 → 40.0')},
    ('sapo.py', 'tau = torch.where(rollout.advantages[inds].unsqueeze(1) > 0, args.tau_pos, args.tau_neg)', '> → >='):
        'equivalent: tokens with Â = 0 are not among the logged gate\'s tokens (those with signal)',
    **{('common/sampling.py', 'tails = self.tokenizer.batch_decode(responses[:, -16:])', mutation):
       'equivalent: a look comes at least every 8 tokens (compiled: CHECK_EVERY), so a stop string of a token or '
       'two is whole within the last 16 when it is first looked at; a longer tail (0: the whole response) finds '
       'nothing sooner'
       for mutation in ('-16 → -32', '-16 → 0')},
    **{('grpo.py', line, mutation):
       'equivalent: the chunk size only bounds memory; every chunk of >= 1 position (row) gives the same numbers, '
       'and the uniform numbers of the draws come from the generator in the same order (0 rows only for a '
       'vocabulary over 2^24)'
       for line in ('positions = max(1, LOGITS_PER_CHUNK // logits.shape[-1])',
                    'rows = max(1, LOGITS_PER_CHUNK // logits.shape[-1])')
       for mutation in ('-1 → -2', '-1 → 0', '1 → 0', '1 → 2', 'max → min')},
    **{('grpo.py', 'if len(logits) > rows:  # a few rows at a time: temporaries of [rows, vocab]', mutation):
       'equivalent: the chunks only bound memory (a batch of exactly one chunk, or any batch, drawn whole)'
       for mutation in ('> → >=', 'delete the if')},
    ('grpo.py', 'drawn = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1)', '* → /'):
        'equivalent within rounding: the total of a softmax is 1 to float32 precision, so U · total and U / total '
        'differ by ~1e-7 of U; the product is what keeps u below the total, and the clamp after it is tested',
    **{('common/sampling.py', 'log_rho = (rollout.old_logprobs - sampler_logprobs).clamp(-20.0, 20.0) * (mask > 0)',
        mutation):
       'harmless: the clamp only keeps exp finite; ±40 does too in float32, and every weight or mask it feeds is '
       'capped or banded far inside e^±20' for mutation in ('-20.0 → -40.0', '20.0 → 40.0')},
    ('common/sampling.py', 'geometric = log_rho.sum(dim=1) / (mask > 0).sum(dim=1).clamp(min=1)', '1 → 0'):
        'equivalent: the floor acts only on a response with no token in the loss, which keeps none either way '
        '(its NaN mean gives a False band test, times a mask of 0)',
    ('common/sampling.py', 'dropped = responses & ~(kept * signal > 0).any(dim=1)', '* → /'):
        'equivalent: in a response with signal, signal is True on every token of the mask and kept is 0 off it, '
        'where 0/0 is NaN and NaN > 0 is False as 0 > 0 is; a response without signal is never counted',
    ('common/sampling.py', '"charts/is_truncated_fraction": global_fraction((rho > cap).sum().item(), tokens),',
     '> → >='):
        'harmless: a ratio exactly at C counts as truncated or not in a logged figure; min(ρ, C) weighs it alike',
    ('common/sampling.py', 'if correction == "none" or global_max(tokens) == 0:', '0 → 1'):
        'harmless: the rollout is corrected before; only the logged figures of a batch with one token of signal go',
    **{('common/sampling.py', 'logits_to_keep=1,', mutation):
       'harmless: only the head\'s keys and values are used; its logits (of 1, 2 or all positions) never are'
       for mutation in ('1 → 0', '1 → 2')},
    **{('common/sampling.py', 'if width <= 0:', mutation):
       'equivalent: a width of 0 gathers an empty head, whose length is 0 too (a negative width, a prompt of no '
       'token, cannot occur)'
       for mutation in ('<= → <', 'delete the if')},
    **{('common/processes.py', line, mutation):
       'equivalent in one process (the code runs only under torchrun): killed by tests/test_group_distributed.py '
       '(unequal signal per process; whole-batch statistics), whose torchrun launch the mutation run leaves out'
       for line, mutation in (('if torch.distributed.is_initialized():', 'delete the if'),
                              ('torch.distributed.all_reduce(total, op=op)', 'delete the statement'))},
    ('common/sampling.py', 'kept = mask * (product <= bound)', '<= → <'):
        'equivalent in practice: a response whose log Π ρ equals log C to the last float32 bit (kept at C, as TRL '
        'keeps it, or masked) has measure zero',
    ('common/memory.py', 'sizes = [n for n in range(1, minibatch + 1)', '1 → 2'):
        'equivalent: either bound of the range moved by one changes nothing: a size of 1 is the default when no '
        'size fits, and minibatch + 1 never divides the minibatch',
    ('common/memory.py', 'if minibatch % n == 0 and (n % group_size == 0 or n < group_size)]', '< → <='):
        'equivalent: n = G is a whole group, let in by n % G == 0 already',
    ('common/sampling.py', 'low, high = 1, n', '1 → 0'):
        'equivalent: the empty prefix decodes to "", which never holds a stop string; the search never ends at 0',
    ('common/sampling.py', 'training = [question for question, _ in self.task.prompts(1000, random.Random(EVAL_SEED))]',
     '1000 → 2000'):
        'harmless: a larger sample of a generator\'s questions, alike in length, is checked',
    ('common/runs.py', 'self.never_right = self.never_right + 1 if never else -1', '-1 → -2'):
        'equivalent: any negative count means "right once": it never reaches 3 again',
    ('common/checkpoints.py', 'set_state_dict(self.model, self.optimizer, model_state_dict=weights, '
     'optim_state_dict=optimizer)', 'delete the statement'):
        'equivalent with torch 2.13: dcp.load writes in place into the tensors get_state_dict returned (the shards '
        'of the weights and of Adam\'s state), and the sharded run resumes bit for bit without it '
        '(tests/test_group_fsdp.py); kept as torch\'s documented round trip',
    ('common/policy.py', 'model.gradient_checkpointing_enable()', 'delete the statement'):
        'equivalent under the pinned transformers 5.23, which has activation_checkpointing_enable: the branch of '
        'transformers 5.17 (the GPU machine\'s), where the same test kills it',
    **{('common/policy.py', f'warnings.filterwarnings("ignore", message="{message}")', 'delete the statement'):
       'harmless: a warning of peft\'s left on the console, nothing computed otherwise'
       for message in ('fan_in_fan_out', '`is_gradient_checkpointing` is deprecated')},
    ('common/decoding.py', 'self.logits = output.logits[:, -1].float().repeat_interleave(repeats, dim=0)', '-1 → 0'):
        'equivalent: read_prompts keeps the logits of the last position alone (logits_to_keep=1)',
    ('common/decoding.py', 'make_fallback(torch.ops.aten.cumsum, warn=False)', 'delete the statement'):
        'harmless on a CPU, where inductor\'s C++ compiles the scan; the fallback is for Triton on a GPU, which '
        'common/tools/gpu_check.py runs',
    ('common/runs.py', 'if not self.is_main:', 'delete the if'):
        'untested here, under torchrun only: one process is always process 0. The two-process launch of '
        'tests/test_group_distributed.py kills it (a full run at ea3d81b); it is left out of runs.py\'s tests, 19 s '
        'a mutant',
    ('common/processes.py', 'total = total.to("cuda" if nccl else "cpu")', 'delete the statement'):
        'harmless on gloo (the tensor is already on the CPU); NCCL refuses a CPU tensor at once, loudly',
}


# ---------------------------------------------------------------- generating mutants

@dataclass
class Mutant:
    file: str
    line: int  # 1-based line of the original file
    description: str
    source: str  # the whole mutated file
    original_line: str = ""
    id: str = ""


def line_offsets(data: bytes) -> list[int]:
    """Byte offset of the start of each line (index 1-based via offsets[lineno - 1]); ast columns are bytes."""
    offsets, position = [], 0
    for line in data.splitlines(keepends=True):
        offsets.append(position)
        position += len(line)
    offsets.append(position)
    return offsets


class Source:
    def __init__(self, text: str):
        self.text, self.data = text, text.encode()
        self.offsets = line_offsets(self.data)
        self.lines = text.splitlines()

    def span(self, node) -> tuple[int, int]:
        return self.offsets[node.lineno - 1] + node.col_offset, self.offsets[node.end_lineno - 1] + node.end_col_offset

    def segment(self, start: int, end: int) -> str:
        return self.data[start:end].decode()

    def replace(self, start: int, end: int, new: str) -> str:
        return (self.data[:start] + new.encode() + self.data[end:]).decode()


def region_lines(tree: ast.Module, src: Source, file: str, all_copies: bool) -> dict[int, set[str]]:
    """The lines to mutate, each with the names its region uses (a name is only replaced by one of those)."""
    spec, reference = REGIONS[file], reference_of(file)
    ref_src = Source(open(os.path.join(ROOT, reference), encoding="utf-8").read()) if reference else None
    ref_functions = functions_of(ast.parse(ref_src.text)) if reference else {}
    regions = []
    for node in ast.walk(tree):  # a method's name may recur in another class of the file
        if not isinstance(node, ast.FunctionDef):
            continue
        name = node.name
        if spec["functions"] is not None and name not in spec["functions"]:
            continue
        first = node.body[1 if is_docstring(node.body[0]) and len(node.body) > 1 else 0].lineno
        region = set(range(first, node.end_lineno + 1))
        if not all_copies and name in ref_functions:  # lines shared with the reference file's copy: mutated there
            ref = ref_functions[name]
            region -= shared_lines(src, region, ref_src, set(range(ref.lineno, ref.end_lineno + 1)))
        regions.append(region)
    for start, end in spec["blocks"]:
        block = anchored(src, start, end)
        if not all_copies and reference:
            block -= shared_lines(src, block, ref_src, anchored(ref_src, start, end))
        regions.append(block)
    skipped = set().union(*(anchored(src, start, end, every=True) for start, end in spec.get("skip", [])))
    lines: dict[int, set[str]] = {}
    for region in regions:
        names = {identifier(n) for n in ast.walk(tree) if getattr(n, "lineno", 0) in region} - {None}
        for line in region - skipped:
            lines[line] = names
    return lines


def reference_of(file: str) -> Optional[str]:
    """grpo.py for the group files, ppo.py for the classic ones; none for those two themselves."""
    if file not in GROUP + CLASSIC:
        return None  # common/: one copy
    reference = "grpo.py" if file in GROUP else "ppo.py"
    return None if file == reference else reference


def functions_of(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def shared_lines(src: Source, lines: set[int], ref_src: Source, ref_lines: set[int]) -> set[int]:
    """The lines whose code (comments aside) also stands in the reference's region."""
    def code(source, i):
        return re.sub(r"\s*#.*$", "", source.lines[i - 1]).strip()

    reference = {code(ref_src, i) for i in ref_lines}
    return {i for i in lines if code(src, i) in reference}


def identifier(node) -> Optional[str]:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def anchored(src: Source, start: str, end: str, every: bool = False) -> set[int]:
    """Lines from each line containing `start` (the first only, unless every) to before the next containing `end`."""
    lines: set[int] = set()
    for i, line in enumerate(src.lines):
        if start in line:
            j = next((k for k in range(i + 1, len(src.lines)) if end in src.lines[k]), len(src.lines))
            lines |= set(range(i + 1, j + 1))
            if not every:
                break
    return lines


def is_docstring(node) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def gap_swap(src: Source, left, right, old: str, new: str) -> Optional[str]:
    """Replace the operator `old` that sits between two nodes (only parentheses and spaces around it)."""
    start, end = src.span(left)[1], src.span(right)[0]
    gap = src.segment(start, end)
    if gap.strip("() \n\\") != old:
        return None
    return src.replace(start, end, gap.replace(old, new, 1))


def names_read(node) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def targets_of(stmt) -> set[str]:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def rule_mutants(src: Source, node, parents: dict, scope: set[str], local: set[str]) -> list[tuple[str, str]]:
    """(description, mutated source) for every rule that applies to this node."""
    out = []
    if isinstance(node, ast.BinOp) and type(node.op) in BINOPS:
        old, new = BINOPS[type(node.op)]
        mutated = gap_swap(src, node.left, node.right, old, new)
        if mutated:
            out.append((f"{old} → {new}", mutated))
    elif isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            if type(op) in CMPOPS:
                old, new = CMPOPS[type(op)]
                mutated = gap_swap(src, operands[i], operands[i + 1], old, new)
                if mutated:
                    out.append((f"{old} → {new}", mutated))
    elif isinstance(node, ast.BoolOp):
        old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        for left, right in zip(node.values, node.values[1:]):
            mutated = gap_swap(src, left, right, old, new)
            if mutated:
                out.append((f"{old} → {new}", mutated))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Invert, ast.Not)) \
            and not isinstance(node.operand, ast.Constant):
        operand_start = src.span(node.operand)[0]
        start, end = src.span(node)
        prefix = src.segment(start, operand_start)
        if prefix.strip("( ") in ("-", "~", "not"):
            out.append((f"drop the unary {prefix.strip('( ')}",
                        src.replace(start, end, prefix.replace(prefix.strip("( "), "", 1).lstrip()
                                    + src.segment(operand_start, end))))
    elif (isinstance(node, ast.Constant) and type(node.value) in (int, float)
          and not isinstance(parents.get(node), ast.UnaryOp) and not is_shape_argument(node, parents)):
        value = node.value
        for new in ([1] if value == 0 else [0, 2] if value == 1 else [0, value * 2]):
            new = type(value)(new)
            out.append((f"{value!r} → {new!r}", src.replace(*src.span(node), repr(new))))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and type(node.operand.value) in (int, float) and not is_shape_argument(node, parents):
        value = -node.operand.value
        for new in [0, value * 2]:
            out.append((f"{value!r} → {type(value)(new)!r}", src.replace(*src.span(node), repr(type(value)(new)))))
    if isinstance(node, ast.Attribute) and node.attr in SWAPS and isinstance(parents.get(node), ast.Call) \
            and parents[node].func is node:
        start, end = src.span(node)
        out.append((f".{node.attr} → .{SWAPS[node.attr]}", src.replace(end - len(node.attr), end, SWAPS[node.attr])))
    if isinstance(node, ast.Name) and node.id in ("min", "max") and isinstance(parents.get(node), ast.Call):
        out.append((f"{node.id} → {SWAPS[node.id]}", src.replace(*src.span(node), SWAPS[node.id])))
    if isinstance(node, ast.keyword) and node.arg in ("min", "max") and node.lineno:
        start, _ = src.span(node)
        out.append((f"{node.arg}= → {SWAPS[node.arg]}=", src.replace(start, start + len(node.arg), SWAPS[node.arg])))
    # a name (or attribute) replaced by another of its kind, where it is read
    name = identifier(node)
    if name and isinstance(node.ctx, ast.Load):
        for group in SAME_KIND:
            if name in group:
                start, end = src.span(node)
                for other in sorted(group & scope - {name}):
                    out.append((f"{name} → {other}", src.replace(end - len(name), end, other)))
    # a keyword argument of a function of this file or of clamp dropped: the default applies
    call = parents.get(node)
    if (isinstance(node, ast.keyword) and node.arg and isinstance(call, ast.Call)
            and identifier(call.func) in local | {"clamp"}):
        kept = [kw for kw in call.keywords if kw is not node]
        out.append((f"drop {node.arg}=",
                    src.replace(*src.span(call), ast.unparse(ast.Call(call.func, call.args, kept)))))
    # a statement deleted
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        if isinstance(node, ast.AugAssign) or targets_of(node) & names_read(node.value):
            out.append(("delete the statement", src.replace(*src.span(node), "pass")))
        if isinstance(node, ast.AugAssign) and type(node.op) in (ast.Add, ast.Sub):
            old, new = ("+=", "-=") if isinstance(node.op, ast.Add) else ("-=", "+=")
            mutated = gap_swap(src, node.target, node.value, old, new)
            if mutated:
                out.append((f"{old} → {new}", mutated))
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        out.append(("delete the statement", src.replace(*src.span(node), "pass")))
    elif isinstance(node, (ast.Break, ast.Continue, ast.If)):
        out.append((f"delete the {type(node).__name__.lower()}", src.replace(*src.span(node), "pass")))
    return out


SHAPE_METHODS = {"view", "reshape", "unsqueeze", "squeeze", "cumsum", "gather", "logsumexp", "softmax", "log_softmax",
                 "repeat_interleave", "cat", "stack", "split", "argmax", "any", "all", "isin", "expand"}


def is_shape_argument(node, parents) -> bool:
    """A dimension or view argument (dim=1, .view(-1), .unsqueeze(1)):
    a wrong one is a shape error, seen by every test."""
    parent = parents.get(node)
    if isinstance(parent, ast.keyword):
        return parent.arg in ("dim", "keepdim")
    return isinstance(parent, ast.Call) and identifier(parent.func) in SHAPE_METHODS


def mutants_for(file: str, all_copies: bool = False) -> list[Mutant]:
    text = open(os.path.join(ROOT, file), encoding="utf-8").read()
    src, tree = Source(text), ast.parse(text)
    lines = region_lines(tree, src, file, all_copies)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    local = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    found, seen = [], {text}
    for node in ast.walk(tree):
        if not hasattr(node, "lineno") or node.lineno not in lines or in_docstring(node, parents):
            continue
        for description, mutated in rule_mutants(src, node, parents, lines[node.lineno], local):
            if mutated in seen:
                continue
            seen.add(mutated)
            found.append(Mutant(file, node.lineno, description, mutated))
    found += table_mutants(file, src, tree) + pattern_mutants(file, src, tree)
    for target, old, new, description in SEMANTIC:
        if target != file or not description:
            continue
        count = text.count(old)
        if count != 1:
            print(f"warning: {file}: semantic mutant {description!r} does not apply ({count} matches of its text)",
                  file=sys.stderr)
            continue
        found.append(Mutant(file, text[: text.index(old)].count("\n") + 1, f"[semantic] {description}",
                            text.replace(old, new)))
    valid = []
    for mutant in sorted(found, key=lambda m: (m.line, m.description)):
        try:
            ast.parse(mutant.source)
        except SyntaxError:
            continue
        mutant.original_line = src.lines[mutant.line - 1].strip()
        mutant.id = f"{file}:{len(valid) + 1}"
        valid.append(mutant)
    return valid


def table_mutants(file: str, src: Source, tree: ast.Module) -> list[Mutant]:
    """Each entry of the file's TABLES dropped in turn: a character of a string or of set("..."), an item of a
    tuple, a set, a list ("|".join([...])) or a dict."""
    found = []
    for node in tree.body:
        if not isinstance(node, ast.Assign) or ast.unparse(node.targets[0]) not in TABLES.get(file, []):
            continue
        value = node.value
        if isinstance(value, ast.Call) and isinstance(value.args[0], ast.List):  # "|".join([...])
            value = value.args[0]
        elif isinstance(value, ast.Call):  # set("...")
            value = value.args[0]
        if isinstance(value, ast.Constant):  # the characters of a string
            start, end = src.span(value)
            found += [Mutant(file, node.lineno, f"drop {char!r} of {ast.unparse(node.targets[0])}",
                             src.replace(start, end, repr(value.value.replace(char, ""))))
                      for char in dict.fromkeys(value.value)]
            continue
        items = list(zip(value.keys, value.values)) if isinstance(value, ast.Dict) else [(e, e) for e in value.elts]
        for first, last in items:
            start, end = src.span(first)[0], src.span(last)[1]
            if src.data[end:end + 1] == b",":
                end += 1
            description = f"drop {ast.literal_eval(first)!r} of {ast.unparse(node.targets[0])}"
            found.append(Mutant(file, first.lineno, description, src.replace(start, end, "")))
    return found


def pattern_mutants(file: str, src: Source, tree: ast.Module) -> list[Mutant]:
    """In the verifiers (TASKS), each member of each character class [...] of a raw-string pattern dropped in turn
    (a quote no longer taken off, a digit no longer read)."""
    if file not in TASKS:
        return []
    found, seen = [], set()
    parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Constant, ast.JoinedStr)) or id(node) in parts:
            continue
        start, end = src.span(node)
        literal = src.segment(start, end)
        if not literal.lower().startswith(("r'", 'r"', "rf", "fr")):
            continue
        for group in re.finditer(r"\[\^?((?:\\.|[^\]\\])+)\]", literal):
            members = re.findall(r"\\.|.", group.group(1))
            offset = group.start(1)
            for i, member in enumerate(members):
                if len(members) == 1:
                    break
                cut = offset + sum(map(len, members[:i]))
                mutated = src.replace(start, end, literal[:cut] + literal[cut + len(member):])
                if mutated not in seen:
                    seen.add(mutated)
                    found.append(Mutant(file, node.lineno, f"drop {member!r} of {group.group(0)}", mutated))
    return found


def in_docstring(node, parents) -> bool:
    while node in parents:
        if is_docstring(node):
            return True
        node = parents[node]
    return False


# ---------------------------------------------------------------- running them

def copy_tree(destination: str) -> None:
    ignore = shutil.ignore_patterns(".git", "runs", "__pycache__", ".pytest_cache", "*.pyc")
    shutil.copytree(ROOT, destination, ignore=ignore, dirs_exist_ok=True)


def serve(workdir: str) -> None:
    """A worker (python -m tests.mutate --serve DIR): imports torch and transformers once, then for each request
    line [file, timeout] forks a child that runs pytest on DIR as it is now, and answers 'passed', 'failed' or
    'timeout' and the seconds. Forking saves the ~5 s of imports that a fresh pytest process pays per mutant."""
    os.chdir(workdir)
    sys.path.insert(0, workdir)
    import gymnasium, pytest, torch, transformers, tyro  # noqa: F401,E401  the heavy imports, paid once
    from transformers import AutoModelForCausalLM, GPT2LMHeadModel  # noqa: F401
    from torch.utils.tensorboard import SummaryWriter  # noqa: F401

    for request in sys.stdin:
        file, timeout = json.loads(request)
        start = time.time()
        pid = os.fork()
        if pid == 0:  # the child: its own process group (so a timeout kills its subprocesses too), its output
            os.setsid()  # in DIR.log, beside the tree: read when the unmutated tests fail
            log = os.open(workdir + ".log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            tests = [a for a in TESTS[file] if not a.endswith(".py") or os.path.exists(a)]  # test files not written yet
            os._exit(int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", *tests])))
        outcome = "timeout"
        while time.time() - start < timeout:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                outcome = "passed" if os.waitstatus_to_exitcode(status) == 0 else "failed"
                break
            time.sleep(0.05)
        else:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        end_leftovers(workdir)
        print(json.dumps([outcome, time.time() - start]), flush=True)


def end_leftovers(workdir: str) -> None:
    """torchrun starts its workers in sessions of their own, which killpg does not reach: a mutant that hangs them
    would leave them waiting forever. End every process still running a file of this tree."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                arguments = f.read().decode(errors="replace").split("\0")
        except OSError:  # ended meanwhile
            continue
        if any(a.startswith(workdir + os.sep) for a in arguments):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


class Worker:
    """One copy of the tree and the server process that runs the tests in it."""

    def __init__(self, folder: str):
        self.folder = folder
        copy_tree(folder)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}  # no stale bytecode of a mutant
        self.process = subprocess.Popen([sys.executable, "-m", "tests.mutate", "--serve", folder], cwd=ROOT, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, file: str, source: Optional[str], timeout: float) -> tuple[str, float]:
        path = os.path.join(self.folder, file)
        original = open(path, encoding="utf-8").read()
        try:
            if source is not None:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(source)
            self.process.stdin.write(json.dumps([file, timeout]) + "\n")
            self.process.stdin.flush()
            outcome, seconds = json.loads(self.process.stdout.readline())
        finally:
            with open(path, "w", encoding="utf-8") as f:
                f.write(original)
        return outcome, seconds

    def output(self, lines: int = 40) -> str:
        """The end of what pytest printed in the last run."""
        with open(self.folder + ".log", encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", nargs="+", default=GROUP + CLASSIC + COMMON + TASKS,
                        choices=GROUP + CLASSIC + COMMON + TASKS)
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("--only", nargs="+", default=None, help="run only these mutant ids (file.py:N)")
    parser.add_argument("--all-copies", action="store_true",
                        help="also mutate the code a file shares verbatim with grpo.py / ppo.py "
                             "(mutated there by default)")
    parser.add_argument("--workers", type=int, default=2, help="mutants run in parallel (at most 2 on this machine)")
    parser.add_argument("--timeout-factor", type=float, default=3.0,
                        help="a mutant times out after this many times the unmutated tests' duration, + 30 s")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve)

    mutants = {file: mutants_for(file, args.all_copies) for file in args.files}
    if args.only:
        mutants = {file: [m for m in ms if m.id in args.only] for file, ms in mutants.items()}
        mutants = {file: ms for file, ms in mutants.items() if ms}
    if args.list:
        for file, ms in mutants.items():
            for m in ms:
                print(f"{m.id:14s} line {m.line:4d}  {m.description:45s}  {m.original_line[:90]}")
        print(f"{sum(map(len, mutants.values()))} mutants: " + ", ".join(f"{f} {len(ms)}" for f, ms in mutants.items()))
        return

    tmp = tempfile.mkdtemp(prefix="mutate-")
    workers: queue.Queue = queue.Queue()
    for i in range(max(1, min(args.workers, 2))):
        workers.put(Worker(os.path.join(tmp, f"w{i}")))
    lock, results = threading.Lock(), {}
    try:
        # The unmutated tests must pass; their duration sets each file's time limit.
        limits = {}
        for file in mutants:
            worker = workers.get()
            outcome, seconds = worker.run(file, None, timeout=1800)
            workers.put(worker)
            if outcome != "passed":
                verb = {"failed": "fail", "timeout": "hang"}[outcome]
                raise SystemExit(f"{worker.output()}\nerror: the tests of {file} {verb} without any mutant (pytest's "
                                 "last lines above): fix them first")
            limits[file] = args.timeout_factor * seconds + 30
            print(f"{file}: {len(mutants[file])} mutants; unmutated tests {seconds:.0f} s", flush=True)

        def run_one(m: Mutant) -> None:
            worker = workers.get()
            try:
                outcome, seconds = worker.run(m.file, m.source, limits[m.file])
            finally:
                workers.put(worker)
            status = {"failed": "killed", "passed": "survived", "timeout": "timeout"}[outcome]
            with lock:
                results[m.id] = status
                print(f"{m.id:14s} {status:9s} {seconds:5.1f} s  line {m.line}: {m.description}  |  "
                      f"{m.original_line[:80]}", flush=True)

        with ThreadPoolExecutor(max_workers=workers.qsize()) as pool:
            list(pool.map(run_one, [m for ms in mutants.values() for m in ms]))
    finally:
        while not workers.empty():
            workers.get().close()
        shutil.rmtree(tmp, ignore_errors=True)
    report(mutants, results)


def report(mutants: dict, results: dict) -> None:
    print("\nfile          mutants  killed  survived  timeout  equivalent  kill rate (non-equivalent)")
    print("(equivalent: surviving mutants listed in EQUIVALENT as equivalent or harmless; timeouts count as killed)")
    totals = [0, 0, 0, 0, 0]
    survivors = []
    for file, ms in mutants.items():
        counts = [len(ms), 0, 0, 0, 0]
        for m in ms:
            status = results[m.id]
            reason = equivalent_reason(m)
            if status == "survived" and reason:
                counts[4] += 1
            else:
                counts[{"killed": 1, "survived": 2, "timeout": 3}[status]] += 1
            if status == "survived":
                survivors.append((m, reason))
        totals = [a + b for a, b in zip(totals, counts)]
        print(row(file, counts))
    print(row("all", totals))
    if survivors:
        print("\nsurvivors:")
        for m, reason in survivors:
            print(f"  {m.file}:{m.line}  {m.description}  |  {m.original_line[:90]}"
                  + (f"\n      {reason}" if reason else ""))


def equivalent_reason(m: Mutant) -> Optional[str]:
    """The EQUIVALENT entry of a mutant, matched on its file, the code of its line (comments aside) and the mutation."""
    def code(line):
        return re.sub(r"\s*#.*$", "", line).strip()

    return next((why for (file, line, description), why in EQUIVALENT.items()
                 if file == m.file and code(line) == code(m.original_line) and description == m.description), None)


def row(name: str, counts: list[int]) -> str:
    total, killed, survived, timeout, equivalent = counts
    relevant = total - equivalent
    rate = f"{100 * (killed + timeout) / relevant:.1f} %" if relevant else "-"
    return f"{name:12s} {total:8d} {killed:7d} {survived:9d} {timeout:8d} {equivalent:11d}  {rate}"


if __name__ == "__main__":
    main()
