"""The GPU path, run on a CPU: bfloat16 autocast with the output layer in float32, log-probs and entropies computed a
few rows at a time, and the frozen weights (LoRA's base model, the reference copy) stored in bfloat16.

A CPU cannot show the GPU's batch-shape-dependent rounding itself; what it can show is that the code takes the
same path (autocast on, float32 logits, bfloat16 frozen weights) and that, on that path, the ratio at the first
update is exactly 1 for every file, so that GSPO's clip range of 3e-4 sees no noise."""
import copy

import pytest
import torch
import torch.nn.functional as F

import dapo
import dr_grpo
import grpo
import gspo
import sapo
from common import policy, sampling
from common.tasks import TASKS
from fixed_rollouts import as_samples, draw_epochs, fixed_rollout, tiny_gpt2, update, update_args
from hub_like_models import make_model_folder

MODULES = {"grpo": grpo, "dr_grpo": dr_grpo, "dapo": dapo, "gspo": gspo, "sapo": sapo}
CPU = torch.device("cpu")
BF16 = torch.autocast("cpu", dtype=torch.bfloat16)
BF16_PASSES = grpo.Forward(BF16, share_prompt=True)  # the passes of a GPU run
FLOAT32 = grpo.Forward(torch.autocast("cpu", enabled=False), share_prompt=True)
ARCHITECTURES = ["gpt2", "llama", "qwen2"]
TASK = TASKS["addition"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16_models")
    return {arch: make_model_folder(arch, root / arch, dropout=0.0) for arch in ARCHITECTURES}


def batch(tokenizer, seed=0, n=8, width=20, prompt_len=6, group_size=4):
    """Random prompts (one per group of 4) and responses:
    prompt_ids, prompt_mask, prompt index of each row, responses."""
    torch.manual_seed(seed)
    prompt_ids = torch.randint(3, len(tokenizer) - 1, (n // group_size, prompt_len))
    responses = torch.randint(3, len(tokenizer) - 1, (n, width - prompt_len))
    return prompt_ids, torch.ones_like(prompt_ids), torch.arange(n) // group_size, responses


def logprobs(model, tokens, temperature):
    prompt_ids, prompt_mask, index, responses = tokens
    return grpo.token_logprobs(grpo.response_logits(model, prompt_ids, prompt_mask, index, responses, temperature),
                               responses)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_output_layer_runs_in_float32_under_autocast(arch, folders):
    """Under bfloat16 autocast the logits equal the float32 product of the last hidden state and the output weights,
    bit for bit; a plain output layer (float32_logits off) rounds them to bfloat16."""
    for float32_logits in (True, False):
        tokenizer, model = policy.load_policy(arch, CPU, path=folders[arch], float32_logits=float32_logits)
        head = model.get_output_embeddings()
        seen = {}
        head.register_forward_hook(lambda module, inputs, output: seen.update(hidden=inputs[0], logits=output))
        prompt_ids, prompt_mask, _, _ = batch(tokenizer)
        with torch.no_grad(), BF16:
            model(input_ids=prompt_ids, attention_mask=prompt_mask)
        exact = F.linear(seen["hidden"].float(), head.weight.float())
        if float32_logits:
            assert seen["logits"].dtype == torch.float32 and torch.equal(seen["logits"], exact)
        else:
            assert seen["logits"].dtype == torch.bfloat16 and not torch.equal(seen["logits"].float(), exact)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_logprobs_under_bf16_autocast_are_within_1e_3_of_float32(arch, folders):
    """The rest of the network still runs in bfloat16: token log-probs stay within 1e-3 of the float32 ones on these
    models (measured: at most 5.3e-4; with a bfloat16 output layer up to 2.7e-3)."""
    tokenizer, model = policy.load_policy(arch, CPU, path=folders[arch])
    tokens = batch(tokenizer)
    with torch.no_grad():
        exact = logprobs(model, tokens, 0.7)
        with BF16:
            rounded = logprobs(model, tokens, 0.7)
    assert rounded.dtype == torch.float32
    assert (rounded - exact).abs().max() < 1e-3


@pytest.mark.parametrize("name", list(MODULES))
def test_first_minibatch_ratio_is_one_under_bf16_autocast(name):
    """π_θold scored under autocast in the update's batch shape, then the first of 4 minibatch steps: every ratio is
    exactly 1, so nothing is clipped (GSPO's ±3e-4 included) and SAPO's gate is exactly 1."""
    module = MODULES[name]
    model = tiny_gpt2()
    policy.float32_output_layer(model)
    rollout = fixed_rollout(module, model, num_groups=4)
    args = update_args(module, num_minibatches=4, beta=0.0)
    epochs = draw_epochs(rollout, args)
    samples = as_samples(module, rollout)
    old, _ = module.score_responses(model, None, samples, epochs[0], args, BF16_PASSES)
    rollout = rollout._replace(old_logprobs=old, ref_logprobs=None)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    first = epochs[0][:1]  # the first step alone: its ratio against π_θold is 1 exactly, where nothing moved yet
    stats = module.update_policy(model, optimizer, rollout, [first], args, BF16_PASSES)
    if name == "sapo":
        assert stats["gate"][0] == 1.0
    else:
        assert stats["clipfrac"][0] == 0.0
    assert stats["policy_loss"][0] != 0.0  # the minibatch carried signal


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_lora_base_weights_in_bf16_adapters_and_adam_in_float32(arch, folders):
    tokenizer, model = policy.load_policy(arch, CPU, path=folders[arch])
    embeddings_before = model.get_input_embeddings().weight.detach().clone()
    model = policy.add_lora(model, 4, 8.0)
    policy.frozen_weights_to_bfloat16(model)
    frozen_linear, trainable = [], []
    for parameter_name, parameter in model.named_parameters():
        if parameter.requires_grad:
            trainable.append(parameter)
            assert parameter.dtype == torch.float32, parameter_name
            assert "lora_" in parameter_name, parameter_name
        elif "base_layer" in parameter_name:
            frozen_linear.append(parameter)
            assert parameter.dtype == torch.bfloat16, parameter_name
    assert frozen_linear and trainable
    assert model.get_input_embeddings().weight.dtype == torch.float32  # read by index, never recast by autocast
    assert model.get_output_embeddings().weight.dtype == torch.float32  # the float32 output layer
    assert torch.equal(model.get_input_embeddings().weight, embeddings_before)
    # one update step on the autocast path: the adapters move, Adam's moments are float32, the base stays
    tokens = batch(tokenizer, n=8)
    prompt_ids, prompt_mask, _, responses = tokens
    mask = torch.ones(responses.shape)
    advantages = grpo.compute_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0] * 2), 4)
    with torch.no_grad(), BF16:
        old = logprobs(model, tokens, 1.0)
    rollout = grpo.Rollout(prompt_ids, prompt_mask, responses, mask, advantages, old, None)
    base_before = [p.detach().clone() for p in frozen_linear]
    optimizer = torch.optim.Adam(trainable, lr=1e-2)
    update(grpo, model, optimizer, rollout, update_args(grpo, group_size=4, beta=0.0, temperature=1.0), BF16)
    assert all(torch.equal(p, q) for p, q in zip(frozen_linear, base_before))
    assert all(state["exp_avg"].dtype == torch.float32 for state in optimizer.state.values()) and optimizer.state


def test_reference_copy_in_bf16_scores_exactly_like_the_policy_under_autocast(folders):
    """Autocast casts the policy's float32 linear weights to bfloat16 at every forward: a copy stored in bfloat16
    computes the very same log-probs, at half the memory of its linear layers."""
    tokenizer, model = policy.load_policy("qwen2", CPU, path=folders["qwen2"])
    args = grpo.Args(beta=0.04)
    ref_model = grpo.reference_model(model, args, bf16=True)
    assert grpo.reference_model(model, args).get_input_embeddings().weight.dtype == torch.float32  # CPU: float32 copy
    linear = [m for m in ref_model.modules() if type(m) is torch.nn.Linear]
    assert linear and all(m.weight.dtype == torch.bfloat16 for m in linear)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the policy is untouched
    assert ref_model.get_output_embeddings().weight.dtype == torch.float32
    tokens = batch(tokenizer)
    with torch.no_grad(), BF16:
        trained, reference = logprobs(model, tokens, 1.0), logprobs(ref_model, tokens, 1.0)
    assert torch.equal(trained, reference)


@pytest.mark.parametrize("name", list(MODULES))
def test_chunked_logprobs_and_entropy_equal_the_whole_formulas(name, monkeypatch):
    """A few positions at a time (here 5, 10, or all) gives what the formulas give on the whole [N, T, vocab]: the
    log-probs of the update, and the draw's log-probs and entropies (the same tokens, whatever the chunks)."""
    module = MODULES[name]
    generator = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(6, 5, 50, generator=generator)
    tokens = torch.randint(0, 50, (6, 5), generator=generator)
    whole_logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    probs = torch.softmax(logits, dim=-1)
    whole_entropy = -(probs * torch.log_softmax(logits, dim=-1)).sum(-1)
    draws = []
    for per_chunk in (3 * 50, 5 * 50, 2 * 5 * 50, 10**9):  # 5 positions (a row), 10 (two rows), everything at once
        monkeypatch.setattr(module, "LOGITS_PER_CHUNK", per_chunk)
        torch.testing.assert_close(module.token_logprobs(logits, tokens), whole_logprobs, rtol=0, atol=1e-5)
        flat, no_greedy = logits.view(-1, 50), torch.zeros(30, dtype=torch.bool)
        u = torch.rand(30, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        token, logprob, entropy = module.sample_token(flat, no_greedy, u)
        torch.testing.assert_close(entropy, whole_entropy.view(-1), rtol=0, atol=1e-5)
        torch.testing.assert_close(logprob, torch.log_softmax(flat, -1)[torch.arange(30), token], rtol=0, atol=1e-5)
        draws.append(token)
    assert all(torch.equal(d, draws[0]) for d in draws)  # each row its own random number, any chunks
    monkeypatch.setattr(module, "LOGITS_PER_CHUNK", 5 * 50)
    one_row = module.token_logprobs(logits, tokens)
    monkeypatch.setattr(module, "LOGITS_PER_CHUNK", 10**9)
    # positions are independent: chunks change nothing
    assert torch.equal(one_row, module.token_logprobs(logits, tokens))
    # and the gradient flows through the chunks as through the whole
    logits.requires_grad_(True)
    monkeypatch.setattr(module, "LOGITS_PER_CHUNK", 5 * 50)
    (grad,) = torch.autograd.grad(module.token_logprobs(logits, tokens).sum(), logits)
    (whole_grad,) = torch.autograd.grad(torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).sum(), logits)
    torch.testing.assert_close(grad, whole_grad, rtol=0, atol=1e-6)


def test_float32_output_layer_upcasts_a_bfloat16_input():
    # a model whose residual stream is bfloat16 hands the output layer bfloat16 hidden states: still float32 logits
    head = torch.nn.Linear(16, 40, bias=False)
    float32_head = copy.deepcopy(head)
    float32_head.__class__ = policy.Float32OutputLayer
    hidden = torch.randn(3, 16).to(torch.bfloat16)
    with BF16:
        logits = float32_head(hidden)
    assert logits.dtype == torch.float32 and torch.equal(logits, F.linear(hidden.float(), head.weight))


@pytest.mark.parametrize("micro_batch_size", [None, 2, 8])
@pytest.mark.parametrize("name", list(MODULES))
def test_old_logprobs_are_scored_in_the_passes_of_the_first_epoch(name, micro_batch_size, monkeypatch):
    """On a GPU the kernels round differently for other batch shapes: π_θold is scored in the very passes (the same
    responses, in the same order and shapes) that the first epoch of the update runs, not on the whole rollout."""
    module = MODULES[name]
    model = tiny_gpt2()
    rollout = fixed_rollout(module, model, num_groups=4, no_signal=(2,))  # 16 responses
    calls, real = [], module.response_logits
    monkeypatch.setattr(module, "response_logits", lambda model, prompt_ids, prompt_mask, index, responses, *rest:
                        calls.append((index.tolist(), responses.tolist())) or real(model, prompt_ids, prompt_mask,
                                                                                     index, responses, *rest))
    args = update_args(module, micro_batch_size=micro_batch_size, num_minibatches=2, beta=0.0)
    epochs = draw_epochs(rollout, args)
    samples = as_samples(module, rollout)
    module.score_responses(model, None, samples, epochs[0], args, FLOAT32)
    scoring = list(calls)
    calls.clear()
    module.update_policy(model, torch.optim.SGD(model.parameters(), lr=0.0), rollout, epochs, args, FLOAT32)
    assert scoring == calls and len(calls) >= 2
    assert sum(len(index) for index, _ in scoring) == 12  # the group without signal is neither scored nor run


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_sampling_runs_under_autocast_and_its_log_probs_are_the_updates_within_bfloat16(arch, folders):
    """The GPU's sampling path: prefill and decoding under bfloat16 autocast (a step's keys and values may come in
    another dtype than the prefill's; the decoding cache takes them), with the sampler's log-probs those the update
    scores under the same autocast up to bfloat16 rounding (the sampler/trainer gap: its mean well under 0.1)."""
    tokenizer, model = policy.load_policy(arch, CPU, path=folders[arch])
    args = grpo.Args(max_new_tokens=6, few_shot=0, temperature=1.0)
    torch.manual_seed(0)
    with BF16:
        prompt_format = sampling.PromptFormat(tokenizer, TASK, 0, model=model)
        samples = grpo.sample(model, prompt_format, ["7+5=", "123+45=", "9="], args, CPU, num_samples=4)
    assert samples.responses.shape[0] == 12
    index = torch.arange(12) // 4
    with torch.no_grad(), BF16:
        logits = grpo.response_logits(model, samples.prompt_ids, samples.prompt_mask, index, samples.responses, 1.0)
    scored = grpo.token_logprobs(logits, samples.responses)
    gap = (samples.logprobs - scored)[samples.mask.bool()].abs()
    assert gap.mean() < 0.1 and torch.isfinite(gap).all()
