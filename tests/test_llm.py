"""common/llm.py: the defaults that depend on the model's scale, the statistics every group file logs, and the
per-iteration log (schedule of evaluations, one console line per iteration)."""
import os
import re
import sys

import pytest
import torch
import tyro

import grpo
from common import llm, runs
from conftest import ROOT


def resolved(module, **fields):
    """Args as the main block sees them after `defaults = resolve_defaults(args)`, with the lines it prints."""
    args = module.Args(**fields)
    return args, llm.resolve_defaults(args)


def test_embedded_models_keep_the_values_they_were_tuned_with():
    for model in ("common/models/tiny_model", "common/models/long_model"):
        args, lines = resolved(grpo, model=model)
        assert (args.learning_rate, args.max_new_tokens, args.eval_size, args.few_shot) == (3e-4, 8, 200, 0)
        assert "--few-shot 0  (the embedded models)" in lines
    assert llm.is_embedded(llm.resolve_model_path("common/models/tiny_model"))  # also as the absolute path


def test_a_real_model_gets_real_llm_defaults_and_a_typed_flag_wins():
    args, lines = resolved(grpo, model="Qwen/Qwen2.5-0.5B-Instruct")  # resolved from the name alone: nothing is loaded
    assert (args.learning_rate, args.max_new_tokens, args.eval_size) == (1e-6, 256, 100)
    assert args.few_shot is None  # decided by the model's kind once it is loaded: llm.num_examples
    assert resolved(grpo, model="gpt2", lora_rank=16)[0].learning_rate == 1e-5  # LoRA: ~10x full fine-tuning's rate
    typed, lines = resolved(grpo, model="gpt2", learning_rate=3e-5, max_new_tokens=100)
    assert (typed.learning_rate, typed.max_new_tokens) == (3e-5, 100)
    assert not any(line.startswith(("--learning-rate", "--max-new-tokens")) for line in lines)
    assert any(line.startswith("--eval-size 100") for line in lines)
    assert grpo.Args().learning_rate is None  # building Args resolves nothing: the main block's call does


def test_on_a_cpu_the_real_model_defaults_say_they_are_a_gpus_with_the_measured_alternative(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    lines = resolved(grpo, model="gpt2")[1]
    assert lines[-1] == llm.CPU_NOTE and "--learning-rate 1e-5" in llm.CPU_NOTE
    assert llm.CPU_NOTE not in resolved(grpo, model="common/models/tiny_model")[1]  # the embedded models learn
    typed = dict(learning_rate=1e-5, max_new_tokens=16, eval_size=64)
    assert resolved(grpo, model="gpt2", **typed)[1] == []  # nothing left to a default: nothing to warn about
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert llm.CPU_NOTE not in resolved(grpo, model="gpt2")[1]  # a GPU: the values are its own
    assert llm.CPU_NOTE in resolved(grpo, model="gpt2", cuda=False)[1]  # --no-cuda: the CPU again


def test_the_command_line_resolves_the_same_way():
    args = tyro.cli(grpo.Args, args=["--model", "gpt2", "--max-new-tokens", "64"])
    lines = llm.resolve_defaults(args)
    assert (args.learning_rate, args.max_new_tokens) == (1e-6, 64)
    assert lines[0].startswith("--learning-rate 1e-06  (TRL's GRPOConfig")
    grpo.check_args(args)  # resolved values pass the checks


def test_the_few_shot_default_is_stated_once_the_tokenizer_says_what_kind_of_model_it_is():
    from common.tasks import get_task

    class Tokenizer:
        chat_template = None

    task = get_task("addition2")
    assert llm.few_shot_line(Tokenizer(), task, None) == [
        f"--few-shot {task.default_few_shot}  (a base model: the task's solved examples show the format)"]
    Tokenizer.chat_template = "{{ messages }}"
    assert llm.few_shot_line(Tokenizer(), task, None) == [
        "--few-shot 0  (a chat model: its user turn states the format)"]
    assert llm.few_shot_line(Tokenizer(), task, 3) == []  # typed: nothing to state


def test_a_bad_task_is_named_by_the_checks_not_by_the_defaults():
    args = grpo.Args(model="gpt2", task="no-such-task")  # building Args must not raise
    with pytest.raises(SystemExit, match="error: .*no-such-task"):
        grpo.check_args(args)


def test_rollout_stats_by_hand():
    # three groups of two: rewards (1, 0), (1, 1), (0, 0); lengths 3, 5, 2, 4, 1, 1; the second response was cut
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    advantages = torch.tensor([1.0, -1.0, 0.0, 0.0, 0.0, 0.0])
    lengths = torch.tensor([3, 5, 2, 4, 1, 1])
    mask = (torch.arange(5).unsqueeze(0) < lengths.unsqueeze(1)).float()
    truncated = torch.tensor([False, True, False, False, False, False])
    entropies = torch.full((6, 5), 7.0)
    entropies[mask.bool()] = 0.5  # padding carries junk the statistic must not see
    stats = llm.rollout_stats(rewards, rewards, advantages, mask, truncated, entropies, group_size=2)
    assert stats["charts/reward"] == pytest.approx(3 / 6)
    assert stats["charts/train_accuracy"] == pytest.approx(3 / 6)
    assert stats["charts/response_length"] == pytest.approx(16 / 6)
    assert stats["charts/right_response_length"] == pytest.approx((3 + 2 + 4) / 3)
    assert stats["charts/wrong_response_length"] == pytest.approx((5 + 1 + 1) / 3)
    assert stats["charts/zero_signal_fraction"] == pytest.approx(2 / 3)  # all right, or all wrong: Â = 0
    assert stats["charts/truncated_fraction"] == pytest.approx(1 / 6)
    assert stats["losses/entropy"] == 0.5
    # DAPO: its own reward is logged, rightness from the task's accuracy, and signal from the advantages
    shaped = 2 * rewards - 1 - torch.tensor([0.0, 0.5, 0.2, 0.0, 0.1, 0.0])
    dapo_advantages = torch.tensor([1.0, -1.0, 0.0, 0.0, 0.3, -0.3])  # the last group's lengths differ
    dapo_stats = llm.rollout_stats(shaped, rewards, dapo_advantages, mask, truncated, entropies, group_size=2)
    assert dapo_stats["charts/zero_signal_fraction"] == pytest.approx(1 / 3)
    assert dapo_stats["charts/train_accuracy"] == pytest.approx(3 / 6)
    assert dapo_stats["charts/right_response_length"] == pytest.approx(3.0)
    assert dapo_stats["charts/reward"] == pytest.approx((1 - 1.5 + 0.8 + 1 - 1.1 - 1) / 6)


def test_lengths_of_right_and_wrong_responses_with_one_or_none_of_a_kind():
    lengths = torch.tensor([3, 5, 1])
    mask = (torch.arange(5).unsqueeze(0) < lengths.unsqueeze(1)).float()
    zeros, entropies = torch.zeros(3), torch.zeros(3, 5)
    one_right = torch.tensor([1.0, 0.0, 0.0])
    stats = llm.rollout_stats(one_right, one_right, zeros, mask, zeros.bool(), entropies, group_size=3)
    assert (stats["charts/right_response_length"], stats["charts/wrong_response_length"]) == (3.0, 3.0)
    one_wrong = 1 - one_right
    stats = llm.rollout_stats(one_wrong, one_wrong, zeros, mask, zeros.bool(), entropies, group_size=3)
    assert (stats["charts/right_response_length"], stats["charts/wrong_response_length"]) == (3.0, 3.0)
    for accuracies, empty in ((zeros, "charts/right_response_length"), (torch.ones(3), "charts/wrong_response_length")):
        stats = llm.rollout_stats(accuracies, accuracies, zeros, mask, zeros.bool(), entropies, group_size=3)
        assert stats[empty] == 0.0  # none of that kind: 0, not NaN
    for tokens, expected in ((1, 0.7), (0, 0.0)):  # the entropy of a single token; of none: 0, not NaN
        one_token = (torch.arange(5).unsqueeze(0) < torch.tensor([[tokens], [0], [0]])).float()
        stats = llm.rollout_stats(zeros, zeros, zeros, one_token, zeros.bool(), entropies + 0.7, group_size=3)
        assert stats["losses/entropy"] == pytest.approx(expected)


def test_entropy_by_hand():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [2.0, 0.0, -1.0, 5.0]],
                           [[1.0, 1.0, 3.0, -2.0], [0.0, 9.0, 0.0, 0.0]]])  # [2, 2, vocab 4]
    p = torch.softmax(logits, dim=-1)
    expected = -(p * p.log()).sum(-1)  # −Σ π log π, written out
    assert torch.allclose(llm.entropy(logits), expected, atol=1e-6)
    assert llm.entropy(logits)[0, 0].item() == pytest.approx(float(torch.log(torch.tensor(4.0))))  # uniform: log |V|


def test_a_fraction_of_the_whole_batch_in_one_process():
    assert llm.global_fraction(1.0, 4.0) == 0.25
    assert llm.global_fraction(1.0, 1.0) == 1.0  # a single token counts
    assert llm.global_fraction(0.0, 0.0) == 0.0  # nothing to count (no token with signal): 0, not NaN


def test_a_gguf_file_that_does_not_exist_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="error: --model .*no such .gguf file"):
        llm.resolve_model_path(str(tmp_path / "model.gguf"))


def test_embedded_is_what_the_model_is_not_where_it_lives(tmp_path, in_process):
    """The embedded models' config says so; a copy elsewhere, a model trained from them and saved, and a LoRA
    adapter trained on them keep their defaults; --model takes a saved adapter folder (its base with the adapter
    merged in) as readily as a saved full model."""
    import shutil

    tiny = os.path.join(ROOT, "common", "models", "tiny_model")
    shutil.copytree(tiny, tmp_path / "my_copy")
    assert llm.is_embedded(str(tmp_path / "my_copy")) and llm.is_embedded("common/models/long_model")
    assert not llm.is_embedded("gpt2") and not llm.is_embedded(str(tmp_path))
    flags = ["--num-iterations", "1", "--prompts-per-iteration", "2", "--num-minibatches", "1", "--eval-size", "4",
             "--save-model"]
    lora_run, _ = in_process("grpo", [*flags, "--lora-rank", "2"], subdir="lora")
    full_run, _ = in_process("grpo", flags, subdir="full")
    for run_dir in (lora_run, full_run):
        assert llm.is_embedded(str(run_dir / "model"))
        _, out = in_process("grpo", ["--model", str(run_dir / "model"), *flags[:-1]], subdir="again")
        assert "default --learning-rate 0.0003  (the embedded models)" in out and "iteration    1/1" in out


@pytest.mark.parametrize("argv, message", [
    (["--learning-rate", "abc"], "error: --learning-rate must be a number, got 'abc'"),
    (["--seed", "1.5"], "error: --seed must be an integer, got '1.5'"),
    (["--kl-estimator", "k4"],
     "error: invalid choice 'k4' for argument '--kl-estimator'. Expected one of ('k1', 'k2', 'k3')"),
    (["--group-size"], "error: Missing value for argument '--group-size'. Expected 1 values"),
    (["--groupsize", "4"], "error: Unrecognized options: --groupsize, 4"),
])
def test_a_value_the_parser_cannot_read_is_one_line_too(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["grpo.py", *argv])
    with pytest.raises(SystemExit) as e:
        runs.parse_args(grpo.Args)
    assert str(e.value) == message
    assert capsys.readouterr().err == ""  # tyro's box is not shown


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "dapo", "gspo", "sapo"])
def test_help_lists_choices_and_one_line_per_flag(name, monkeypatch, capsys):
    import importlib

    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--help"])
    monkeypatch.setenv("COLUMNS", "250")
    with pytest.raises(SystemExit) as e:
        runs.parse_args(importlib.import_module(name).Args)
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--kl-estimator {k1,k2,k3}" in out and "{None}" not in out
    entries, current = {}, None  # flag -> the lines of its help; wide enough for each to fit on one
    for line in out.splitlines():
        text = line.strip("│╭╮╰╯─ ")
        if text.startswith("--"):  # "--flag METAVAR  help", or the help on the next line
            current, *help_text = re.split(r"\s{2,}", text, maxsplit=1)
            entries[current] = help_text
        elif current and text:
            entries[current].append(text)
    assert len(entries) > 30 and "--learning-rate FLOAT" in entries
    for flag, lines in entries.items():  # a docstring's line break would leave a second line
        assert len(lines) == 1, (flag, lines)
