"""The runtime of common/ (policy.py, memory.py, sampling.py, processes.py, runs.py): the defaults that depend on the
model and the machine, what loading turns on, what each process holds and the memory a pass may take, the refusal
of what does not fit, the prompt format's default, the statistics every group file logs, and the draw of a token
(grpo.py's sample_token, the same in every group file)."""
import os
import re
import shutil
import sys
import types

import pytest
import torch
import tyro

import dapo
import grpo
from common import memory, policy, processes, runs, sampling
from conftest import ROOT


def resolved(module, **fields):
    """Args as the main block sees them after `defaults = resolve_defaults(args, beta=BETA)`, with its lines."""
    args = module.Args(**fields)
    return args, policy.resolve_defaults(args, beta=module.BETA)


def test_embedded_models_keep_the_values_they_were_tuned_with(monkeypatch):
    for gpu in (False, True):  # wherever they run
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
        for model in ("common/models/tiny_model", "common/models/long_model"):
            args, lines = resolved(grpo, model=model)
            assert (args.task, args.prompts_per_iteration, args.num_iterations, args.learning_rate, args.max_new_tokens,
                    args.eval_every, args.eval_size) == ("addition", 32, 150, 3e-4, 8, 10, 200)
    assert policy.is_embedded(policy.resolve_model_path("common/models/tiny_model"))  # also as the absolute path


def test_a_real_model_on_a_gpu_gets_a_practitioners_values_and_a_typed_flag_wins(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    args, lines = resolved(grpo, model="Qwen/Qwen2.5-0.5B-Instruct")  # resolved from the name alone: nothing is loaded
    assert (args.task, args.prompts_per_iteration, args.num_iterations, args.learning_rate, args.max_new_tokens,
            args.eval_every, args.eval_size) == ("addition", 32, 150, 1e-6, 256, 10, 128)
    assert args.few_shot is None  # decided by the model's kind once it is loaded: sampling.PromptFormat
    assert args.beta == 0.04 and resolved(dapo, model="gpt2")[0].beta == 0.0  # the method's own β on a GPU
    assert "--learning-rate 1e-06  (a real model on a GPU: TRL's GRPOConfig and DeepSeekMath's GRPO)" in lines
    assert resolved(grpo, model="gpt2", lora_rank=16)[0].learning_rate == 1e-5  # LoRA: ~10x full fine-tuning's rate
    typed, lines = resolved(grpo, model="gpt2", learning_rate=3e-5, max_new_tokens=100)
    assert (typed.learning_rate, typed.max_new_tokens) == (3e-5, 100)
    assert not any(line.startswith(("--learning-rate", "--max-new-tokens")) for line in lines)
    assert any(line.startswith("--eval-size 128") for line in lines)
    # an evaluation decodes a sampled and a greedy response a question: an iteration's B × G rows, so that on a
    # GPU the compiled decoding step of the iteration serves it too, not a second compile
    assert 2 * args.eval_size == args.prompts_per_iteration * grpo.Args().group_size
    assert grpo.Args().learning_rate is None  # building Args resolves nothing: the main block's call does


def test_a_real_model_on_a_cpu_gets_the_recipe_measured_to_learn_there(monkeypatch):
    """The quick start's typed recipe, measured on SmolLM2 (common/results/smollm2.md), is the CPU's default."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args, lines = resolved(grpo, model="gpt2")
    assert (args.task, args.prompts_per_iteration, args.num_iterations, args.learning_rate, args.max_new_tokens,
            args.eval_every, args.eval_size, args.beta) == ("addition2", 8, 24, 1e-5, 16, 6, 64, 0.0)
    assert len(lines) == 8 and all(line.endswith(f"({policy.CPU_RECIPE})") for line in lines)
    assert resolved(grpo, model="gpt2", lora_rank=16)[0].learning_rate == 2e-4  # measured with LoRA r16
    assert resolved(grpo, model="gpt2", lora_rank=1)[0].learning_rate == 2e-4  # any rank is LoRA
    assert args.few_shot is None  # decided once the model is loaded: sampling.PromptFormat
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolved(grpo, model="gpt2", cuda=False)[0].max_new_tokens == 16  # --no-cuda: the CPU's
    assert resolved(grpo, model="gpt2")[0].max_new_tokens == 256


def test_the_command_line_resolves_the_same_way(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    args = tyro.cli(grpo.Args, args=["--model", "gpt2", "--max-new-tokens", "64"])
    lines = policy.resolve_defaults(args, beta=grpo.BETA)
    assert (args.learning_rate, args.max_new_tokens) == (1e-6, 64)
    assert any(line.startswith("--learning-rate 1e-06  (a real model on a GPU: TRL's GRPOConfig") for line in lines)
    grpo.check_args(args)  # resolved values pass the checks


class Config:
    """The sizes response_bytes reads, as a transformers config offers them."""

    def __init__(self, vocab_size, num_hidden_layers, hidden_size):
        self.vocab_size, self.num_hidden_layers, self.hidden_size = vocab_size, num_hidden_layers, hidden_size

    def get_text_config(self):
        return self


def test_a_response_costs_its_logits_and_activations_by_hand():
    # 16 response tokens × vocabulary 1,000 × 4 bytes × 6 copies; (16 + 40 / 8) tokens × 2 layers × width 10 × 20 × 4
    assert memory.response_bytes(16, 40, 8, Config(1000, 2, 10), 4) == 16 * 1000 * 4 * 6 + 21 * 2 * 10 * 20 * 4
    assert memory.response_bytes(16, 40, 8, Config(1000, 2, 10), 2) == 16 * 1000 * 4 * 6 + 21 * 2 * 10 * 20 * 2


@pytest.mark.parametrize("minibatch, group_size, per_response, budget, expected", [
    (64, 8, 1.0, 64.0, 64),  # everything fits: the whole minibatch in one pass, as before
    (64, 8, 1.0, 63.0, 32),  # the most whole groups that divide the minibatch and fit
    (64, 8, 1.0, 20.0, 16),
    (64, 8, 1.0, 7.0, 4),  # less than a group: a divisor of the minibatch
    (64, 8, 1.0, 0.5, 1),  # not even one response: one at a time
    (48, 8, 1.0, 40.0, 24),  # 24 = 3 groups divides 48; 32 would not
    (12, 6, 1.0, 5.0, 4),
])
def test_the_pass_size_is_the_most_that_divides_the_minibatch_and_fits(minibatch, group_size, per_response, budget,
                                                                        expected):
    assert memory.pass_size(minibatch, group_size, per_response, budget) == expected


def test_load_gives_an_embedded_model_one_thread_and_turns_on_what_the_flags_say(monkeypatch, tmp_path):
    """policy.load: an embedded model on a CPU runs on one thread, as its results were measured, unless
    OMP_NUM_THREADS is set; another model keeps torch's threads. --gradient-checkpointing and LoRA (of rank 1 too)
    are on the model it returns; on a card LoRA's frozen base is stored in bfloat16 (loaded here on the CPU)."""
    from peft import PeftModel

    from hub_like_models import make_model_folder

    real = make_model_folder("gpt2", tmp_path / "gpt2")
    threads = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        for model, env, expected in (("common/models/tiny_model", None, 1), (real, None, 2),
                                     ("common/models/tiny_model", "2", 2)):
            if env:
                monkeypatch.setenv("OMP_NUM_THREADS", env)
            torch.set_num_threads(2)
            policy.load(resolved(grpo, model=model, cuda=False)[0], torch.device("cpu"))
            assert torch.get_num_threads() == expected, model
    finally:
        torch.set_num_threads(threads)
    for flags in (dict(), dict(gradient_checkpointing=True, lora_rank=1)):
        _, model = policy.load(resolved(grpo, model=real, cuda=False, **flags)[0], torch.device("cpu"))
        checkpointed = [getattr(m, "gradient_checkpointing", False) is True for m in model.modules()]
        assert any(checkpointed) == bool(flags) and isinstance(model, PeftModel) == bool(flags)
    # LoRA's α: 32 unless typed (the adapters' scale α / r)
    for typed, alpha in (dict(), 32.0), (dict(lora_alpha=8.0), 8.0):
        _, model = policy.load(resolved(grpo, model=real, cuda=False, lora_rank=4, **typed)[0], torch.device("cpu"))
        assert model.peft_config["default"].lora_alpha == alpha

    def frozen_base(device):
        _, model = policy.load(resolved(grpo, model=real, cuda=False, lora_rank=1)[0], torch.device(device))
        return {p.dtype for name, p in model.named_parameters() if name.endswith("base_layer.weight")}

    assert frozen_base("cpu") == {torch.float32}
    on_the_cpu = policy.load_policy
    monkeypatch.setattr(policy, "load_policy", lambda name, device, *rest: on_the_cpu(name, torch.device("cpu"), *rest))
    assert frozen_base("cuda") == {torch.bfloat16}


def a_machine_of(gib: float, monkeypatch) -> None:
    """os.sysconf as the CPU's pass budget reads it, on a machine of `gib` GiB of pages of 4 KiB."""
    monkeypatch.setattr(memory.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096,
                                                            "SC_PHYS_PAGES": int(gib * 2**30) // 4096}[name])


def test_the_cpu_pass_budget_is_2_gib_or_an_eighth_of_a_smaller_machine(monkeypatch):
    a_machine_of(64, monkeypatch)
    assert memory.pass_budget(None, None) == 2 * 2**30 == memory.CPU_PASS_BUDGET
    a_machine_of(8, monkeypatch)
    assert memory.pass_budget(None, None) == 2**30  # 8 GiB / 8


def test_a_real_model_on_a_cpu_gets_a_pass_size_within_the_budget(monkeypatch):
    """SmolLM2's shape, the CPU recipe's minibatch (2 groups of 8 responses of 16 tokens after 158 prompt tokens)
    fits whole; a GPT-2-124M shape with 256 tokens does not, and its passes are cut to fit."""
    a_machine_of(24, monkeypatch)
    args, _ = resolved(grpo, model="gpt2", cuda=False)
    smollm2 = type("Model", (), {"config": Config(49152, 30, 576), "parameters": lambda self: iter([torch.zeros(1)])})()
    size, line = memory.responses_per_pass(args, smollm2, None, 158)
    # 16 × 49,152 × 4 × 6 bytes of logits + (16 + 158 / 8) × 30 × 576 × 20 × 4 of activations = 65.1 MiB
    assert (size, line) == (16, ["--micro-batch-size 16  (responses per pass: the most of the minibatch of 16 "
                                 "within 2.0 GiB, at an estimated 65 MiB each for 16 + 158/8 tokens; "
                                 "common/results/memory.md)"])
    assert args.micro_batch_size is None  # the flag stays as typed: the run's start-up holds the size
    args, _ = resolved(grpo, model="gpt2", cuda=False, max_new_tokens=256)
    gpt2 = type("Model", (), {"config": Config(50257, 12, 768), "parameters": lambda self: iter([torch.zeros(1)])})()
    size, _ = memory.responses_per_pass(args, gpt2, None, 60)
    per_response = memory.response_bytes(256, 60, 8, gpt2.config, 4)
    assert size * per_response <= memory.CPU_PASS_BUDGET < 2 * size * per_response
    typed, _ = resolved(grpo, model="gpt2", cuda=False, micro_batch_size=4)
    assert memory.responses_per_pass(typed, gpt2, None, 60) == (4, [])  # typed: as typed


class Weight:
    """A parameter as the memory estimate reads it, on a GPU and without its values."""

    def __init__(self, numel: int, requires_grad: bool = True, element_size: int = 4):
        self.numel, self.requires_grad = lambda: numel, requires_grad
        self.element_size, self.device = lambda: element_size, torch.device("cuda")


def on_a_card(parameters: int, config, gib: float, monkeypatch):
    """A fully trained model of `parameters` weights on a card of `gib` GiB, as responses_per_pass sees it."""
    weight = Weight(parameters)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(
        total_memory=gib * 2**30))
    return type("Model", (), {"config": config, "parameters": lambda self: iter([weight])})()


def test_a_model_that_does_not_fit_is_refused_typed_micro_batch_or_not_with_flags_that_help(monkeypatch):
    """14.8B weights fully trained hold 16 bytes each, 221 GiB, on an 80 GiB card: refused whether or not
    --micro-batch-size is typed, with advice that would shrink the state from where the run stands."""
    model = on_a_card(14_800_000_000, Config(152064, 48, 5120), 80, monkeypatch)
    for typed in (None, 4):
        args, _ = resolved(grpo, model="gpt2", micro_batch_size=typed)
        with pytest.raises(SystemExit) as e:
            memory.responses_per_pass(args, model, None, 64)
        # 16 × 152,064 × 4 × 6 bytes of logits + (16 + 64 / 8) × 48 × 5,120 × 20 × 2 (bfloat16) = 0.27 GiB
        assert str(e.value).startswith("error: the training state (220.5 GiB) leaves less than a pass of one response "
                                       "(an estimated 0.3 GiB, twice over: sampling) in 90 % of the card's 80 GiB: ")
        assert str(e.value).endswith(": train LoRA adapters (--lora-rank 16), shard over cards (torchrun "
                                     "--nproc_per_node N, --fsdp), lower --max-new-tokens")
    under_fsdp = types.SimpleNamespace(fsdp=True, lora_rank=0, sampler_dtype=None, sampler_lag=0,
                                       compile_decoding=False)
    assert memory.what_helps(under_fsdp) == "shard over more cards (torchrun --nproc_per_node), lower --max-new-tokens"
    lora_lagging = types.SimpleNamespace(fsdp=False, lora_rank=16, sampler_dtype="bfloat16", sampler_lag=0,
                                         compile_decoding=True)
    assert memory.what_helps(lora_lagging) == ("sample with the policy itself (no --sampler-dtype, --sampler-lag 0), "
                                               "decode eagerly (--no-compile-decoding: no bfloat16 copy of the "
                                               "weights), lower --max-new-tokens")
    small = on_a_card(100_000_000, Config(152064, 48, 5120), 80, monkeypatch)  # 1.5 GiB of state: fits
    assert memory.responses_per_pass(resolved(grpo, model="gpt2", micro_batch_size=4)[0], small, None, 64) == (4, [])


def test_a_pass_on_a_card_fills_half_of_what_90_percent_of_it_leaves_by_hand(monkeypatch):
    """On a 10 GiB card, 2^27 weights fully trained hold 16 bytes each, 2 GiB: the passes get (0.9 × 10 − 2) / 2 =
    3.5 GiB. A response of 256 tokens after a prompt of 64 (groups of 8), a vocabulary of 2^15, 4 layers of width
    1,024: 256 × 2^15 × 4 × 6 bytes of logits (192 MiB) and (256 + 64 / 8) × 4 × 1,024 × 20 values of 2 bytes
    (41.25 MiB), 233.25 MiB: 15 would fit, so 8 (a group) of the minibatch of 64. A bfloat16 reference model of
    2^29 weights (1 GiB) leaves (9 − 3) / 2 = 3 GiB: 13 would fit, still 8."""
    model = on_a_card(2**27, Config(2**15, 4, 1024), 10, monkeypatch)
    args, _ = resolved(grpo, model="gpt2", max_new_tokens=256, prompts_per_iteration=32, num_minibatches=4)
    line = ("--micro-batch-size 8  (responses per pass: the most of the minibatch of 64 within {} GiB, at an "
            "estimated 233 MiB each for 256 + 64/8 tokens; common/results/memory.md)")
    assert memory.responses_per_pass(args, model, None, 64) == (8, [line.format("3.5")])
    reference = type("Model", (), {"parameters": lambda self: iter([Weight(2**29, False, element_size=2)])})()
    assert memory.responses_per_pass(args, model, reference, 64) == (8, [line.format("3.0")])


def test_a_budget_of_exactly_one_response_is_not_refused():
    memory.refuse_what_does_not_fit(2**30, 2**30, 0.0, 4 * 2**30, "")  # one response fits, exactly


def test_the_state_by_part_counts_every_copy_of_the_weights_by_hand(monkeypatch):
    """P weights fully trained: 4 bytes each, their gradients 4, Adam 8; DDP's buckets 4 on several processes; a
    bfloat16 sampler at lag 3: a copy (2 bytes a weight) and 3 versions of the trained weights (2 each); a float32
    one: 4 and 3 × 4; the compiled steps' bfloat16 weights (cast_weights: counted in tests/test_decoding.py), 2
    bytes a weight for the policy's decoding copy, with which the evaluations decode whatever samples, and 2 more
    for a float32 sampler copy's (a 16-bit copy is cast already)."""
    P = 1000
    model = type("Model", (), {"parameters": lambda self: iter([Weight(P)])})()
    monkeypatch.setattr(memory, "cast_weights", lambda m: [torch.zeros(P)] if m is model else [])
    args = types.SimpleNamespace(sampler_dtype="bfloat16", sampler_lag=3, compile_decoding=True)
    assert memory.state_parts(model, None, args, processes=2, cuda=True) == {
        "the policy's weights": 4 * P, "their gradients": 4 * P, "Adam's moments": 8 * P,
        "DDP's gradient buckets": 4 * P, "the sampler's bfloat16 copy": 2 * P,
        "the 3 newer versions of its lag": 3 * 2 * P, "the compiled steps' bfloat16 weights": 2 * P}
    args.sampler_dtype = None
    assert memory.state_parts(model, None, args, processes=1, cuda=True) == {
        "the policy's weights": 4 * P, "their gradients": 4 * P, "Adam's moments": 8 * P,
        "the sampler's float32 copy": 4 * P, "the 3 newer versions of its lag": 3 * 4 * P,
        "the compiled steps' bfloat16 weights": 2 * 2 * P}
    args.sampler_lag = 0  # float32 at lag 0 is the policy itself: one decoding copy
    assert memory.state_parts(model, None, args, processes=1, cuda=True) == {
        "the policy's weights": 4 * P, "their gradients": 4 * P, "Adam's moments": 8 * P,
        "the compiled steps' bfloat16 weights": 2 * P}
    # a reference model that is another model counts
    reference = type("Model", (), {"parameters": lambda self: iter([Weight(P, False, element_size=2)])})()
    assert memory.state_parts(model, reference, args, processes=1, cuda=False) == {
        "the policy's weights": 4 * P, "their gradients": 4 * P, "Adam's moments": 8 * P, "the reference model": 2 * P}
    # --fsdp on 4 processes: a quarter of the 16 bytes, and in float32 what is gathered at once (gathered_weights:
    # by hand in tests/test_scale.py)
    monkeypatch.setattr(memory, "is_sharded", lambda m: m is model)
    monkeypatch.setattr(memory, "gathered_weights", lambda m: 300 if m is model else 0)
    assert memory.state_parts(model, reference, args, processes=4, cuda=False) == {
        "the policy's weights": P, "their gradients": P, "Adam's moments": 2 * P,
        "the weights FSDP gathers at once": 4 * 300, "the reference model": 2 * P}


def test_the_few_shot_default_is_decided_in_one_place_once_the_model_is_loaded(tmp_path):
    from types import SimpleNamespace as Model

    from common.tasks import get_task

    class Tokenizer:
        chat_template = None

        eos_token_id, pad_token_id = 0, 0

    def line(task, device="cuda", typed=None, embedded=False):
        config = Model(embedded_toy_model=True) if embedded else Model()
        model = Model(config=config, device=torch.device(device), generation_config=Model(eos_token_id=None))
        return sampling.PromptFormat(Tokenizer(), task, typed, model=model).default_line()

    shutil.copy(os.path.join(ROOT, "common", "data", "example.jsonl"), tmp_path / "addition2.jsonl")
    task, mine = get_task("addition2"), get_task(str(tmp_path / "addition2.jsonl"))  # a file of a task's name
    base = "a base model: the task's solved examples show the format"
    assert line(task) == [f"--few-shot {task.default_few_shot}  ({base})"]
    assert line(task, "cpu", embedded=True) == ["--few-shot 0  (the embedded models)"]  # trained on bare questions
    assert line(task, "cuda", embedded=True) == ["--few-shot 0  (the embedded models)"]  # wherever they run
    # the CPU recipe's examples were measured on this repository's tasks: a file of the user's keeps its model's rule
    assert line(task, "cpu") == [f"--few-shot 3  ({sampling.CPU_RECIPE})"]
    assert line(mine, "cpu") == [f"--few-shot {mine.default_few_shot}  ({base})"]
    Tokenizer.chat_template = "{{ messages }}"
    assert line(task) == ["--few-shot 0  (a chat model: its user turn states the format)"]
    assert line(task, "cpu") == [f"--few-shot 3  ({sampling.CPU_RECIPE})"]  # SmolLM2's recipe
    assert line(mine, "cpu") == ["--few-shot 0  (a chat model: its user turn states the format)"]
    assert line(task, typed=2) == line(task, "cpu", typed=2) == []  # typed: nothing to state


def test_a_bad_task_is_named_by_the_checks_not_by_the_defaults():
    args, _ = resolved(grpo, model="gpt2", task="no-such-task")  # resolving the defaults must not raise
    with pytest.raises(SystemExit, match="error: .*no-such-task"):
        grpo.check_args(args)


def samples_of(mask, truncated, entropies, group_size):
    """What rollout_stats reads of a Samples: B = N / G prompts, each response's mask, cut flag and entropies."""
    import types

    responses = torch.zeros(mask.shape, dtype=torch.long)
    prompt_ids = torch.zeros(len(mask) // group_size, 1, dtype=torch.long)
    return types.SimpleNamespace(prompt_ids=prompt_ids, prompt_mask=torch.ones_like(prompt_ids), responses=responses,
                                 mask=mask, truncated=truncated, entropies=entropies)


def test_rollout_stats_by_hand():
    # three groups of two: rewards (1, 0), (1, 1), (0, 0); lengths 3, 5, 2, 4, 1, 1; the second response was cut
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    advantages = torch.tensor([1.0, -1.0, 0.0, 0.0, 0.0, 0.0])
    lengths = torch.tensor([3, 5, 2, 4, 1, 1])
    mask = (torch.arange(5).unsqueeze(0) < lengths.unsqueeze(1)).float()
    truncated = torch.tensor([False, True, False, False, False, False])
    entropies = torch.full((6, 5), 7.0)
    entropies[mask.bool()] = 0.5  # padding carries junk the statistic must not see
    samples = samples_of(mask, truncated, entropies, group_size=2)
    stats = runs.rollout_stats(samples, rewards, advantages, accuracies=rewards)
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
    dapo_stats = runs.rollout_stats(samples, shaped, dapo_advantages, accuracies=rewards)
    assert dapo_stats["charts/zero_signal_fraction"] == pytest.approx(1 / 3)
    assert dapo_stats["charts/train_accuracy"] == pytest.approx(3 / 6)
    assert dapo_stats["charts/right_response_length"] == pytest.approx(3.0)
    assert dapo_stats["charts/reward"] == pytest.approx((1 - 1.5 + 0.8 + 1 - 1.1 - 1) / 6)


def test_lengths_of_right_and_wrong_responses_with_one_or_none_of_a_kind():
    lengths = torch.tensor([3, 5, 1])
    mask = (torch.arange(5).unsqueeze(0) < lengths.unsqueeze(1)).float()
    zeros, entropies = torch.zeros(3), torch.zeros(3, 5)
    one_right = torch.tensor([1.0, 0.0, 0.0])
    samples = samples_of(mask, zeros.bool(), entropies, group_size=3)
    stats = runs.rollout_stats(samples, one_right, zeros, accuracies=one_right)
    assert (stats["charts/right_response_length"], stats["charts/wrong_response_length"]) == (3.0, 3.0)
    one_wrong = 1 - one_right
    stats = runs.rollout_stats(samples, one_wrong, zeros, accuracies=one_wrong)
    assert (stats["charts/right_response_length"], stats["charts/wrong_response_length"]) == (3.0, 3.0)
    for accuracies, empty in ((zeros, "charts/right_response_length"), (torch.ones(3), "charts/wrong_response_length")):
        stats = runs.rollout_stats(samples, accuracies, zeros, accuracies=accuracies)
        assert stats[empty] == 0.0  # none of that kind: 0, not NaN
    for tokens, expected in ((1, 0.7), (0, 0.0)):  # the entropy of a single token; of none: 0, not NaN
        one_token = (torch.arange(5).unsqueeze(0) < torch.tensor([[tokens], [0], [0]])).float()
        stats = runs.rollout_stats(samples_of(one_token, zeros.bool(), entropies + 0.7, 3), zeros, zeros, zeros)
        assert stats["losses/entropy"] == pytest.approx(expected)


def test_figures_per_right_answer_or_per_token_are_the_whole_batchs_under_two_processes(monkeypatch):
    """Under torchrun every logged figure is averaged over the processes (runs.end_iteration). That is the batch's
    figure when each process holds as many responses and groups, but not for a length per right answer or an
    entropy per token: process 0 below has 3 right answers, process 1 one. Those are reduced with global_fraction.
    Process 1's share is recorded first, then brought into process 0's reductions."""
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0])  # 4 groups of 2: process 0 has the first two
    lengths = torch.tensor([2, 2, 2, 6, 9, 1, 3, 3])
    mask = (torch.arange(9).unsqueeze(0) < lengths.unsqueeze(1)).float()
    truncated = torch.tensor([False, False, False, False, True, False, False, False])
    entropies = torch.arange(1.0, 9.0).unsqueeze(1) * mask  # response i: entropy i + 1 at each of its tokens
    advantages = rewards - rewards.view(-1, 2).mean(dim=1).repeat_interleave(2)

    def stats_of(rows):
        return runs.rollout_stats(samples_of(mask[rows], truncated[rows], entropies[rows], 2), rewards[rows],
                                  advantages[rows], accuracies=rewards[rows])

    whole = stats_of(slice(0, 8))  # one process
    own = [stats_of(slice(0, 4)), stats_of(slice(4, 8))]
    fractions = ["charts/right_response_length", "charts/wrong_response_length", "losses/entropy"]
    for tag in fractions:  # the data tells the two reductions apart
        assert (own[0][tag] + own[1][tag]) / 2 != pytest.approx(whole[tag]), tag
    tags = {tag for tag in whole if tag.startswith(("charts/", "losses/"))}  # perf/: each process's own work
    for tag in tags - set(fractions):  # the others: a plain mean of the two processes' figures is the batch's
        assert (own[0][tag] + own[1][tag]) / 2 == pytest.approx(whole[tag]), tag
    brought = []
    monkeypatch.setattr(runs, "global_fraction", lambda part, whole: brought.append((part, whole)) or 0.0)
    stats_of(slice(4, 8))  # process 1
    shares = iter(brought)

    def with_process_1(part, whole):
        other_part, other_whole = next(shares)
        return (part + other_part) / (whole + other_whole)

    monkeypatch.setattr(runs, "global_fraction", with_process_1)
    process_0 = stats_of(slice(0, 4))
    for tag in fractions:
        assert process_0[tag] == pytest.approx(whole[tag]), tag


def test_a_categorical_draw_has_the_probabilities_of_the_softmax_and_never_a_token_of_probability_zero():
    """sample_token against the distribution it draws from and against torch.multinomial (the reference draw):
    200,000 draws of each of four rows, every token's frequency within 5 standard deviations of its probability,
    tokens of probability 0 (logit −inf) never drawn, at the first and the last place of the vocabulary too."""
    inf = float("inf")
    logits = torch.tensor([[0.0, 1.0, 2.0, -inf, 0.5, -1.0],
                           [-inf, 3.0, -inf, 3.0, 0.0, -inf],
                           [5.0, -2.0, -2.0, -2.0, -2.0, -2.0],
                           [-inf, -inf, -inf, -inf, -inf, 0.0]])
    probs = torch.softmax(logits.double(), -1)
    n = 200_000
    generator = torch.Generator().manual_seed(0)
    rows = logits.repeat_interleave(n, dim=0)
    u = torch.rand(len(rows), 1, dtype=torch.float64, generator=generator)
    ours = grpo.sample_token(rows, torch.zeros(len(rows), dtype=torch.bool), u)[0].view(4, n)
    reference = torch.multinomial(torch.softmax(rows, -1), 1, generator=generator).view(4, n)
    for draws in (ours, reference):
        frequency = torch.stack([torch.bincount(row, minlength=6) for row in draws]).double() / n
        assert ((frequency - probs).abs() <= 5 * (probs * (1 - probs) / n).sqrt()).all()
        assert frequency[probs == 0].sum() == 0
    u = torch.rand(3, 1, dtype=torch.float64, generator=generator)
    assert grpo.sample_token(torch.zeros(3, 1), torch.zeros(3, dtype=torch.bool), u)[0].tolist() == [0, 0, 0]  # 1 token
    # fewer rows than tokens
    assert grpo.sample_token(logits[3:], torch.zeros(1, dtype=torch.bool), u[:1])[0].tolist() == [5]


def test_a_uniform_number_rounded_up_to_the_total_draws_the_last_token():
    """u = U · (the total probability), U < 1, can round up to the total (about one draw in 2^53): the first bound
    above u would then be one past the vocabulary. The draw takes the last token instead."""
    u = torch.ones(2, 1, dtype=torch.float64)
    assert grpo.sample_token(torch.zeros(2, 5), torch.zeros(2, dtype=torch.bool), u)[0].tolist() == [4, 4]


def test_the_shared_head_is_the_longest_prefix_of_every_left_padded_prompt_less_one_token():
    pad = 0
    ids = torch.tensor([[pad, pad, 5, 6, 7, 8],
                        [5, 6, 7, 9, 9, 9],
                        [pad, 5, 6, 7, 8, 1]])
    mask = (ids != pad).long()
    assert sampling.shared_head(ids, mask) == 3  # 5 6 7
    assert sampling.shared_head(ids[1:], mask[1:]) == 3
    assert sampling.shared_head(ids[:1], mask[:1]) == 3  # one prompt: all of it but its last token
    assert sampling.shared_head(ids[[0, 0]], mask[[0, 0]]) == 3  # equal prompts, the same
    other = torch.tensor([[pad, pad, 4, 6, 7, 8]])
    assert sampling.shared_head(torch.cat([ids, other]), torch.cat([mask, (other != pad).long()])) == 0
    two = torch.tensor([[pad, pad, pad, pad, 5, 1]])  # the shortest prompt has 2 tokens: a head of 1 at most
    assert sampling.shared_head(torch.cat([ids, two]), torch.cat([mask, (two != pad).long()])) == 1
    one = torch.tensor([[pad, pad, pad, pad, pad, 5]])
    assert sampling.shared_head(torch.cat([ids, one]), torch.cat([mask, (one != pad).long()])) == 0  # a 1-token prompt


def test_the_sampler_gap_by_hand_over_the_tokens_scored():
    """|log π_sampler − log π_θold| over the tokens of the responses some first-epoch pass scored (the others keep
    old log-probs of 0, unscored), padding excluded: mean and max."""
    sampler = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0], [-5.0, -5.0, -5.0]])
    old = torch.tensor([[-1.5, -2.0, -9.0], [-1.0, -0.75, 0.0], [0.0, 0.0, 0.0]])  # row 2 unscored
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])  # row 0's last token is padding
    first_epoch = [processes.Minibatch(torch.tensor([0, 2]), [torch.tensor([0])]),
                   processes.Minibatch(torch.tensor([1]), [torch.tensor([1])])]
    gap = runs.sampler_gap(sampler, old, mask, first_epoch)
    assert gap["charts/sampler_gap_mean"] == pytest.approx((0.5 + 0 + 0 + 0.25 + 1.0) / 5)
    assert gap["charts/sampler_gap_max"] == pytest.approx(1.0)
    empty = torch.zeros(0, 3)  # a process without a response (nothing to compare): no figure, not an error
    assert runs.sampler_gap(empty, empty, empty, []) == {}
    nothing_scored = [processes.Minibatch(torch.tensor([0, 1, 2]), [])]  # no pass ran (β = 0, no signal)
    assert runs.sampler_gap(sampler, old, mask, nothing_scored) == {}  # not a gap of 0: that would read as agreement


def test_a_process_without_a_response_leaves_the_sampler_gap_to_the_others(monkeypatch):
    """Under torchrun a process with an empty batch still joins the reductions: what it brings to the max must not
    move it (another process's largest gap, 0.25 here, stays the figure)."""
    monkeypatch.setattr(runs, "global_mean", lambda value: value + 3.0)  # the other process scored 3 tokens
    monkeypatch.setattr(runs, "global_fraction", lambda part, whole: (part + 0.5) / (whole + 3.0))
    monkeypatch.setattr(runs, "global_max", lambda value: max(value, 0.25))
    empty = torch.zeros(0, 3)
    assert runs.sampler_gap(empty, empty, empty, []) == {"charts/sampler_gap_mean": pytest.approx(0.5 / 3),
                                                         "charts/sampler_gap_max": 0.25}


def test_a_draw_gives_the_log_prob_of_its_token_and_the_entropy_by_hand():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [2.0, 0.0, -1.0, 5.0], [1.0, 1.0, 3.0, -2.0],
                           [0.0, 9.0, 0.0, 0.0], [0.0, -float("inf"), 1.0, -float("inf")]])  # [5, vocab 4]
    p = torch.softmax(logits, dim=-1)
    expected = -(p * p.log()).nan_to_num().sum(-1)  # −Σ π log π, written out (0 log 0 = 0)
    greedy = torch.tensor([False, True, False, True, False])
    token, logprob, entropy = grpo.sample_token(logits, greedy, torch.rand(5, 1, dtype=torch.float64))
    assert torch.allclose(entropy, expected, atol=1e-6)
    assert entropy[0].item() == pytest.approx(float(torch.log(torch.tensor(4.0))))  # uniform: log |V|
    assert token[1] == 3 and token[3] == 1  # greedy rows: the most likely token
    assert token[4] in (0, 2)  # never a token of probability 0
    torch.testing.assert_close(logprob, p.log()[torch.arange(5), token])


def test_a_fraction_of_the_whole_batch_in_one_process():
    assert processes.global_fraction(1.0, 4.0) == 0.25
    assert processes.global_fraction(1.0, 1.0) == 1.0  # a single token counts
    assert processes.global_fraction(0.0, 0.0) == 0.0  # nothing to count (no token with signal): 0, not NaN
    assert processes.global_fraction(-1.0, 4.0) == -0.25  # a mean of signed terms (the k1 KL estimate) keeps its sign


def test_a_gguf_file_that_does_not_exist_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="error: --model .*no such .gguf file"):
        policy.resolve_model_path(str(tmp_path / "model.gguf"))


def test_a_folder_without_a_model_or_a_file_that_is_none_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    run = tmp_path / "runs" / "addition__grpo__tiny_model__1__1"
    (run / "model").mkdir(parents=True)  # a saved run: its model is in model/
    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / "smol.gguf").write_bytes(b"")
    (tmp_path / "notes.md").write_text("no model")
    cases = {"empty": f"no config.json in {tmp_path / 'empty'}, so no model; a saved run's model is <run>/model",
             str(run): f"a saved run's model is its model/ folder: {run / 'model'}",
             "gguf": f"give the .gguf file itself: {tmp_path / 'gguf' / 'smol.gguf'}",
             "notes.md": "is a file, not a model folder or a .gguf file"}
    for model, message in cases.items():
        with pytest.raises(SystemExit) as e:
            policy.resolve_model_path(model)
        assert str(e.value).startswith(f"error: --model {model!r}") and message in str(e.value), str(e.value)
        assert "\n" not in str(e.value)


def test_embedded_is_what_the_model_is_not_where_it_lives(tmp_path, in_process):
    """The embedded models' config says so; a copy elsewhere, a model trained from them and saved, and a LoRA
    adapter trained on them keep their defaults; --model takes a saved adapter folder (its base with the adapter
    merged in) as readily as a saved full model."""
    import shutil

    tiny = os.path.join(ROOT, "common", "models", "tiny_model")
    shutil.copytree(tiny, tmp_path / "my_copy")
    assert policy.is_embedded(str(tmp_path / "my_copy")) and policy.is_embedded("common/models/long_model")
    assert not policy.is_embedded("gpt2") and not policy.is_embedded(str(tmp_path))
    flags = ["--num-iterations", "1", "--prompts-per-iteration", "2", "--num-minibatches", "1", "--eval-size", "4",
             "--save-model"]
    lora_run, _ = in_process("grpo", [*flags, "--lora-rank", "2"], subdir="lora")
    full_run, _ = in_process("grpo", flags, subdir="full")
    for run_dir in (lora_run, full_run):
        assert policy.is_embedded(str(run_dir / "model"))
        _, out = in_process("grpo", ["--model", str(run_dir / "model"), *flags[:-1]], subdir="again")
        assert "default --learning-rate 0.0003  (the embedded models)" in out and "iteration    1/1" in out


@pytest.mark.parametrize("argv, message", [
    (["--learning-rate", "abc"], "error: --learning-rate must be a number, got 'abc'"),
    (["--seed", "1.5"], "error: --seed must be an integer, got '1.5'"),
    (["--kl-estimator", "k4"],
     "error: invalid choice 'k4' for argument '--kl-estimator'. Expected one of ('k1', 'k2', 'k3')"),
    (["--group-size"], "error: Missing value for argument '--group-size'. Expected 1 values"),
    (["--groupsize", "4"], "error: unrecognized option --groupsize (perhaps --group-size?); --help lists them all"),
    (["--group-szie", "8", "--lerning-rate=3", "--xyz"], "error: unrecognized options --group-szie (perhaps "
     "--group-size?), --lerning-rate (perhaps --learning-rate?), --xyz; --help lists them all"),
    (["--no-trak"], "error: unrecognized option --no-trak (perhaps --no-track?); --help lists them all"),
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
