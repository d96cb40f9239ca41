"""The decoding steps (common/decoding.py): compiled, they draw eager decoding's tokens; the host, asked every few
tokens, drops the steps taken after every response had ended; the decoding model multiplies what autocast would;
grouped key/value heads are read in place; the cache holds the dtype attention reads. And the perf line's
arithmetic (common/perf.py) against torch's own FLOP counter."""
import random
import types

import pytest
import torch

import grpo
from common import decoding, perf, policy, processes, runs, sampling
from common.tasks import get_task
from hub_like_models import make_model_folder

CPU = torch.device("cpu")
BF16 = torch.autocast("cpu", dtype=torch.bfloat16)
PROMPTS = ["7+5=", "123+45=", "9+9=", "58+601="]


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    """A tiny Qwen2 (grouped-query attention: 4 query heads on 2 key/value heads), float32, in eval mode."""
    folder = make_model_folder("qwen2", tmp_path_factory.mktemp("qwen2") / "qwen2", dropout=0.0)
    tokenizer, model = policy.load_policy("qwen2", CPU, path=folder)
    return tokenizer, model.eval()


@pytest.fixture(scope="module")
def qwen2_49k(tmp_path_factory):
    """The tiny Qwen2 with SmolLM2's vocabulary (49,152 entries): the draw's sums and the output layer run over a
    real model's length, where a compiler splits its reductions and their rounding order changes."""
    folder = make_model_folder("qwen2", tmp_path_factory.mktemp("qwen2_49k") / "qwen2", dropout=0.0, vocab_size=49152)
    tokenizer, model = policy.load_policy("qwen2", CPU, path=folder)
    return tokenizer, model.eval()


def draw(model, tokenizer, compiled: bool, autocast=None, max_new_tokens=10, greedy=(True, False, False, False),
         prompts=PROMPTS, prompt_format=None):
    prompt_format = prompt_format or sampling.PromptFormat(tokenizer, get_task("addition"), 0, model=model)
    args = grpo.Args(max_new_tokens=max_new_tokens, few_shot=0, temperature=1.5, compile_decoding=compiled)
    torch.manual_seed(5)
    with torch.no_grad(), autocast or torch.autocast("cpu", enabled=False):
        return grpo.sample(model, prompt_format, prompts, args, CPU, num_samples=len(greedy), greedy=list(greedy))


@pytest.mark.parametrize("compiled, new_tokens, columns", [(False, 10, 7 + 10), (True, 10, 64), (True, 60, 128)])
def test_the_cache_and_its_mask_hold_the_prompts_and_the_responses(qwen2, compiled, new_tokens, columns):
    """Eager: the prompts' columns and a column per new token. Compiled: that rounded up to a multiple of
    COMPILED_COLUMNS (64), so that nearby lengths share a compiled step. The mask is as wide as the cache: 1 on the
    prompts' tokens, 0 on the columns the steps write."""
    tokenizer, model = qwen2
    prompt_ids, prompt_mask = sampling.PromptFormat(tokenizer, get_task("addition"), 0, model=model).encode(PROMPTS,
                                                                                                           CPU)
    prompt_columns = prompt_ids.shape[1]
    assert prompt_columns == 7  # "58+601=", the longest prompt, in this tokenizer's tokens
    with torch.no_grad():
        decoder = decoding.Decoder(model, prompt_ids, prompt_mask, repeats=2, new_tokens=new_tokens,
                                   draw=grpo.sample_token, compiled=compiled)
    assert decoder.cache.layers[0].keys.shape[2] == decoder.attention_mask.shape[1] == columns
    assert torch.equal(decoder.attention_mask[:, :prompt_columns], prompt_mask.repeat_interleave(2, dim=0))
    assert not decoder.attention_mask[:, prompt_columns:].any()


@pytest.mark.parametrize("before", [False, True])
def test_the_output_layer_multiplies_in_tf32_only_when_asked_and_the_flag_is_put_back(before):
    """The compiled step's output layer: TF32 for OUTPUT_LAYER "tf32", IEEE float32 for "float32" and "bfloat16"
    (whose product is not float32), whatever the flag was; the caller's flag back afterwards."""
    suite = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = before
    try:
        for output_layer, tf32 in (("tf32", True), ("float32", False), ("bfloat16", False)):
            with decoding.output_layer_precision(output_layer):
                assert torch.backends.cuda.matmul.allow_tf32 is tf32
            assert torch.backends.cuda.matmul.allow_tf32 is before
    finally:
        torch.backends.cuda.matmul.allow_tf32 = suite


def test_compiled_steps_draw_the_tokens_eager_steps_draw_with_grouped_heads(qwen2_49k):
    """In float32 the compiled steps (grouped attention, the draw inside the step, the host asked every 8 tokens)
    write eager decoding's tokens for the same random numbers over a 49,152-token vocabulary, up to the step where
    every response had ended; a second sampling of the same shape reuses the cache the first allocated (CUDA graphs
    need its addresses)."""
    tokenizer, model = qwen2_49k
    eager = draw(model, tokenizer, compiled=False)
    compiled = draw(model, tokenizer, compiled=True)
    assert torch.equal(eager.responses, compiled.responses) and torch.equal(eager.mask, compiled.mask)
    # up to float32's rounding of a sum over V = 49,152 terms in another order: about √V · 2⁻²⁴ = 1.3e-5 of log V
    torch.testing.assert_close(compiled.logprobs, eager.logprobs, atol=5e-5, rtol=0)
    torch.testing.assert_close(compiled.entropies, eager.entropies, atol=5e-5, rtol=0)
    (decoder_model, _), = [value for key, value in decoding._decoding_models.items() if key is model]
    caches = dict(decoding._caches[decoder_model])
    others = ["58+601=", "9+9=", "7+5=", "123+45="]  # other prompts of the same width: the cache emptied, refilled
    again = draw(model, tokenizer, compiled=True, prompts=others)
    assert torch.equal(again.responses, draw(model, tokenizer, compiled=False, prompts=others).responses)
    assert not torch.equal(again.responses, compiled.responses)
    assert dict(decoding._caches[decoder_model]) == caches  # the same cache objects
    # fewer responses, the same columns: a cache of its own, and eager's tokens again
    fewer = {"greedy": (True, False), "prompts": ["123+45=", "58+601="]}
    assert torch.equal(draw(model, tokenizer, compiled=True, **fewer).responses,
                       draw(model, tokenizer, compiled=False, **fewer).responses)
    assert len(decoding._caches[decoder_model]) == len(caches) + 1


def test_responses_that_all_end_early_keep_eagers_width(monkeypatch):
    """The embedded model's answers end within a few tokens: eager stops at the step where the last one ended;
    compiled, the host learns it up to 7 steps later and those steps are dropped. CI is set as a CI machine sets
    it: inductor then refuses a fallback it was not told to allow (the step compiles anew: its cache is cleared)."""
    import os

    from conftest import ROOT

    monkeypatch.setenv("CI", "true")
    decoding.compiled_step.cache_clear()
    tokenizer, model = policy.load_policy("embedded", CPU, path=os.path.join(ROOT, "common", "models", "tiny_model"))
    eager = draw(model.eval(), tokenizer, compiled=False, max_new_tokens=16)
    compiled = draw(model, tokenizer, compiled=True, max_new_tokens=16)
    assert eager.responses.shape[1] < 8, "the test needs responses that end before the first check"
    assert torch.equal(eager.responses, compiled.responses) and torch.equal(eager.truncated, compiled.truncated)


def test_a_stop_string_is_looked_for_when_the_host_asks_and_ends_the_answers_eager_ends(monkeypatch):
    """A base model's answer ends at its stop string, found by decoding the tokens on the host (holds_stop): a wait
    for the device at every step. Compiled, it is looked for only when the host asks whether all have ended (every 8
    tokens, and the last). In float32 the answers, their masks and which were cut are eager's, the columns after
    the last answer's end aside (padding, masked). Here the stop string is the digit 1, which many answers hold;
    the shapes are the test above's, whose compiled step serves."""
    import os

    from conftest import ROOT

    tokenizer, model = policy.load_policy("embedded", CPU, path=os.path.join(ROOT, "common", "models", "tiny_model"))
    prompt_format = sampling.PromptFormat(tokenizer, get_task("addition"), 0, model=model.eval())
    prompt_format.stop = "1"
    looks, holds_stop = [], prompt_format.holds_stop
    monkeypatch.setattr(prompt_format, "holds_stop", lambda tokens: looks.append(tokens.shape[1]) or holds_stop(tokens))
    eager = draw(model, tokenizer, compiled=False, max_new_tokens=16, prompt_format=prompt_format)
    eager_looks = list(looks)
    looks.clear()
    compiled = draw(model, tokenizer, compiled=True, max_new_tokens=16, prompt_format=prompt_format)
    width = eager.mask.shape[1]
    assert eager_looks == list(range(1, width + 1)) and looks == [8]  # every step; every 8th (all ended by 8)
    assert torch.equal(compiled.mask[:, :width], eager.mask) and not compiled.mask[:, width:].any()
    real = eager.mask.bool()
    assert torch.equal(compiled.responses[:, :width][real], eager.responses[real])
    assert torch.equal(compiled.truncated, eager.truncated)
    ends_with_1 = [text.endswith("1") for text in prompt_format.decode(eager.responses, eager.mask)]
    assert 0 < sum(ends_with_1) < len(ends_with_1)  # answers stopped by the string, and others by their EOS


def test_a_stop_string_split_across_two_looks_is_found():
    """Compiled decoding looks for the stop string every 8 tokens: "\n\n" drawn as the 8th and 9th tokens is only
    whole at the look after token 16, so holds_stop reads the last 16 tokens, not the last 8."""
    prompt_format = sampling.PromptFormat.__new__(sampling.PromptFormat)  # holds_stop needs a tokenizer, a stop
    prompt_format.stop = "\n\n"
    prompt_format.tokenizer = types.SimpleNamespace(batch_decode=lambda rows: ["".join(
        "\n" if token == 0 else "7" for token in row.tolist()) for row in rows])
    responses = torch.ones(2, 16, dtype=torch.long)
    responses[0, 7:9] = 0  # tokens 8 and 9: a newline each
    responses[1, [3, 12]] = 0  # two newlines, apart
    assert prompt_format.holds_stop(responses).tolist() == [True, False]


class Steps:
    """Decoder.finished without a model: the steps drawn and the [N] ended flags after each."""

    def __init__(self, compiled: bool, new_tokens: int):
        self.decoder = decoding.Decoder.__new__(decoding.Decoder)
        self.decoder.compiled, self.decoder.new_tokens, self.decoder.steps, self.decoder.pending = (
            compiled, new_tokens, 0, [])

    def run(self, ends: list[int]) -> tuple[int, int]:
        """Steps until finished() says so (or the cap), when response i ends at step ends[i]: (the step at which the
        loop stopped, the steps kept)."""
        for step in range(1, self.decoder.new_tokens + 1):
            self.decoder.steps += 1
            if self.decoder.finished(torch.tensor([step >= end for end in ends])):
                return step, self.decoder.steps
        return self.decoder.new_tokens, self.decoder.steps


def test_the_host_asks_every_few_steps_and_drops_the_steps_past_the_last_end():
    assert Steps(compiled=False, new_tokens=20).run([3, 5]) == (5, 5)  # eager: asked at every step
    assert Steps(compiled=True, new_tokens=20).run([3, 5]) == (8, 5)  # asked at step 8: steps 6-8 dropped
    assert Steps(compiled=True, new_tokens=20).run([3, 8]) == (8, 8)  # ended at the very step asked
    assert Steps(compiled=True, new_tokens=20).run([3, 9]) == (16, 9)
    assert Steps(compiled=True, new_tokens=12).run([3, 11]) == (12, 11)  # the last step is always asked
    assert Steps(compiled=True, new_tokens=12).run([3, 99]) == (12, 12)  # cut at the cap: every step kept


def test_the_decoding_model_multiplies_what_autocast_would_and_follows_the_weights(qwen2):
    """Under bfloat16 autocast the decoding model holds the linear layers' weights in bfloat16 (cast once, where
    autocast casts at every step), shares every other parameter with the policy (the float32 embedding, tied to the
    float32 output layer, too), and computes the policy's logits bit for bit; a changed weight is cast anew."""
    tokenizer, model = qwen2
    decoding._decoding_models.pop(model, None)
    ids, mask = sampling.PromptFormat(tokenizer, get_task("addition"), 0, model=model).encode(PROMPTS, CPU)
    with torch.no_grad(), BF16:
        copy = decoding.decoding_model(model)
        assert copy.config._attn_implementation == decoding.GROUPED_ATTENTION
        assert model.config._attn_implementation != decoding.GROUPED_ATTENTION  # the policy's own is untouched
        casts = {id(p) for p in decoding.cast_weights(model)}
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied
        assert id(model.get_output_embeddings().weight) not in casts
        for (name, p), (_, q) in zip(model.named_parameters(), copy.named_parameters()):
            assert (q.dtype, q is p) == ((torch.bfloat16, False) if id(p) in casts else (torch.float32, True)), name
        assert len(casts) == 7 * model.config.num_hidden_layers  # q, k, v, o, gate, up, down
        torch.testing.assert_close(copy(input_ids=ids, attention_mask=mask).logits,
                                   model(input_ids=ids, attention_mask=mask).logits, rtol=0, atol=0)
        weight = model.model.layers[0].mlp.up_proj.weight
        weight.add_(0.25)
        copy = decoding.decoding_model(model)
        assert torch.equal(copy.model.layers[0].mlp.up_proj.weight, weight.to(torch.bfloat16))
        weight.sub_(0.25)
    decoding._decoding_models.pop(model)


def test_grouped_attention_reads_the_key_value_heads_in_place(monkeypatch):
    """One new token per row: the g query heads of a key/value head read it as g rows of one query, with the result
    of transformers' SDPA attention, which copies each key/value head g times; other shapes are that attention."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    queries, sdpa = [], torch.nn.functional.scaled_dot_product_attention  # the shapes of the queries SDPA reads

    def spy(query, *args, **kwargs):
        queries.append(tuple(query.shape))
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    from transformers.integrations import sdpa_attention

    delegated = []  # the calls grouped_attention hands to transformers' own attention
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward",
                        lambda *args, **kwargs: delegated.append(1) or sdpa_attention_forward(*args, **kwargs))
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(5, 6, 1, 8, generator=generator)  # [B, H = 2 × 3, 1, d]
    key, value = torch.randn(2, 5, 2, 11, 8, generator=generator)  # [B, H_kv, S, d]
    attention_mask = torch.rand(5, 1, 1, 11, generator=generator) > 0.3
    attention_mask[:, :, :, 0] = True  # every row sees a key
    grouped, _ = decoding.grouped_attention(module, query, key, value, attention_mask, scaling=0.3)
    assert queries == [(5, 2, 3, 8)]  # [B, H_kv, g, d]: the key/value heads as they are
    reference, _ = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=0.3)
    assert grouped.shape == reference.shape == (5, 1, 6, 8)
    torch.testing.assert_close(grouped, reference, rtol=0, atol=1e-6)
    pairs = torch.randn(5, 4, 1, 8, generator=generator)  # 2 query heads a key/value head
    decoding.grouped_attention(module, pairs, key, value, attention_mask, scaling=0.3)
    assert queries[-1] == (5, 2, 2, 8) and delegated == []
    whole = torch.randn(5, 6, 4, 8, generator=generator)  # 4 tokens: transformers' path itself
    assert torch.equal(decoding.grouped_attention(module, whole, key, value, None, scaling=0.3)[0],
                       sdpa_attention_forward(module, whole, key, value, None, scaling=0.3)[0])
    assert delegated == [1]


def test_under_autocast_the_cache_holds_what_attention_reads(qwen2, monkeypatch):
    """Under bfloat16 autocast the cache is bfloat16: attention casts its keys and values to it anyway, so eager
    sampling draws and logs exactly what it did with a float32 cache."""
    tokenizer, model = qwen2
    bf16 = draw(model, tokenizer, compiled=False, autocast=BF16)
    built = decoding.decoding_cache

    def float32_cache(model, prefill_cache, repeats, columns, dtype=None, reuse=False):
        cache = built(model, prefill_cache, repeats, columns, None, reuse)  # the prefill's dtype, float32
        for layer in cache.layers:  # a step's bfloat16 values cast up to it
            layer.update = decoding.casting_update(layer.update, torch.float32)
        assert cache.layers[0].keys.dtype == torch.float32
        return cache

    monkeypatch.setattr(decoding, "decoding_cache", float32_cache)
    float32 = draw(model, tokenizer, compiled=False, autocast=BF16)
    monkeypatch.undo()
    for field in ("responses", "logprobs", "entropies"):
        assert torch.equal(getattr(bf16, field), getattr(float32, field)), field
    prompt_format = sampling.PromptFormat(tokenizer, get_task("addition"), 0, model=model)
    prompt_ids, prompt_mask = prompt_format.encode(PROMPTS, CPU)
    with torch.no_grad(), BF16:
        decoder = decoding.Decoder(model, prompt_ids, prompt_mask, repeats=2, new_tokens=4, draw=grpo.sample_token)
    assert decoder.cache.layers[0].keys.dtype == torch.bfloat16


def counted_and_estimated(model, tokenizer, few_shot: int):
    """FLOPs of a real scoring pass and update as torch's FLOP counter counts them, and as the perf line estimates
    them from the shapes (common/perf.py: work, Roofline). The weights' products only (aten.mm): the counter has no
    formula for the CPU's fused attention (under transformers 5.17 it sees bmm there), so attention's FLOPs (from
    the pairs counted by hand below) are left out of both."""
    from torch.utils.flop_counter import FlopCounterMode

    prompt_format = sampling.PromptFormat(tokenizer, get_task("addition"), few_shot, model=model)
    questions = [question for question, _ in get_task("addition").prompts(4, random.Random(0))]
    args = grpo.Args(max_new_tokens=12, group_size=4, temperature=1.0, beta=0.0, update_epochs=1, lora_rank=0)
    torch.manual_seed(0)
    samples = grpo.sample(model.eval(), prompt_format, questions, args, CPU, 4)
    advantages = torch.tensor([1.0, -1.0]).repeat(8)
    epochs = [processes.draw_minibatches(advantages, 4, num_minibatches=2, micro_batch_size=4, skip_no_signal=True)]
    forward = grpo.Forward(torch.autocast("cpu", enabled=False), share_prompt=True)
    roofline = perf.Roofline(model, args, cuda=False)
    roofline.attention = 0
    stats = runs.rollout_stats(samples, advantages, advantages, advantages, first_epoch=epochs[0])
    estimated = roofline.figures({**stats, "perf/logprob_seconds": 1.0, "perf/update_seconds": 1.0})
    scoring, update = FlopCounterMode(display=False), FlopCounterMode(display=False)
    with scoring:
        old_logprobs, _ = grpo.score_responses(model, None, samples, epochs[0], args, forward)
    rollout = grpo.Rollout(samples.prompt_ids, samples.prompt_mask, samples.responses, samples.mask, advantages,
                           old_logprobs, None)
    with update:
        grpo.update_policy(model, torch.optim.SGD(model.parameters(), lr=0.0), rollout, epochs, args, forward)
    for counter in (scoring, update):
        assert set(counter.get_flop_counts()["Global"]) <= {torch.ops.aten.mm, torch.ops.aten.bmm}
    peak = perf.machine_ceilings(CPU)[0]
    return ((scoring.get_flop_counts()["Global"][torch.ops.aten.mm], estimated["perf/logprob_mfu"] * peak),
            (update.get_flop_counts()["Global"][torch.ops.aten.mm], estimated["perf/update_mfu"] * peak), samples)


def test_the_perf_lines_flops_are_those_torch_counts(tmp_path):
    """Scoring, with a chat template's head shared by the prompts: within 5 % of torch's count. The update, whose
    backward pass the perf line counts as twice the forward (the usual 6N a token): within 10 % where the prompts
    are short (a prompt token's backward stops short of the last layer's query, output and MLP products, which on
    this 2-layer model is half of them)."""
    chat_model = make_model_folder("qwen3", tmp_path / "qwen3", dropout=0.0)  # a chat template: a shared head
    tokenizer, model = policy.load_policy("qwen3", CPU, path=chat_model)
    (counted, estimated), _, samples = counted_and_estimated(model, tokenizer, few_shot=2)
    assert sampling.shared_head(samples.prompt_ids, samples.prompt_mask) > 10
    assert estimated == pytest.approx(counted, rel=0.05)
    base_model = make_model_folder("llama", tmp_path / "llama", dropout=0.0)
    tokenizer, model = policy.load_policy("llama", CPU, path=base_model)
    _, (counted, estimated), _ = counted_and_estimated(model, tokenizer, few_shot=0)
    assert estimated == pytest.approx(counted, rel=0.1)


def test_the_work_of_an_iteration_by_hand():
    """Two prompts of 5 tokens sharing their first 3, two responses each of 3 tokens, scored in two passes of one
    group: per pass the head once (3 tokens), each prompt's tail (2), each response (3)."""
    prompt_ids = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 6, 7]])
    responses = torch.zeros(4, 3, dtype=torch.long)
    work = perf.work(prompt_ids, torch.ones_like(prompt_ids), responses, [torch.tensor([0, 1]), torch.tensor([2, 3])])
    assert work["perf/pass_tokens"] == 2 * 3 + 2 * 2 + 4 * 3
    # keys seen: head tokens 1 + 2 + 3, tail tokens 4 + 5, response tokens 6 + 7 + 8
    assert work["perf/pass_attention_pairs"] == 2 * (1 + 2 + 3) + 2 * (4 + 5) + 4 * (6 + 7 + 8)
    assert work["perf/pass_logit_tokens"] == 4 * 3
    assert (work["perf/decoding_steps"], work["perf/decoding_rows"], work["perf/decoding_columns"]) == (3, 4, 8)
    nothing = perf.work(prompt_ids, torch.ones_like(prompt_ids), responses, [])  # no group with signal: no pass
    assert nothing["perf/pass_tokens"] == nothing["perf/pass_attention_pairs"] == 0


def test_the_bytes_a_decoding_step_must_move_by_hand(qwen2):
    """Generation's bandwidth: per step the weights (the linear layers' in the step's dtype, the output layer's in
    float32), the whole static cache (each token's keys and values of every layer), the float32 logits written and
    read by the draw; times the steps, over the seconds, and over a copy's bytes per second. The tiny Qwen2: 2
    layers of width 32 (queries 4 × 8, keys and values 2 × 8, MLP 32 → 64 → 32), a tied output layer of 64 × 32."""
    _, model = qwen2
    blocks = 2 * (32 * 32 + 2 * (32 * 16) + 32 * 32 + 3 * 32 * 64)  # q, k and v, o, gate up down
    step = (4 * blocks + 4 * 64 * 32  # float32 on a CPU
            + 6 * (10 * 2 * 2 * 16 * 4  # 6 rows × 10 columns of keys and values, 2 layers, in float32
                   + 2 * 64 * 4))  # logits written and read
    roofline = perf.Roofline(model, grpo.Args(lora_rank=0), cuda=False)
    figures = roofline.figures({"perf/pass_tokens": 0, "perf/pass_logit_tokens": 0, "perf/pass_attention_pairs": 0,
                                "perf/decoding_rows": 6, "perf/decoding_columns": 10, "perf/decoding_steps": 7,
                                "perf/generate_seconds": 0.5})
    assert figures["perf/generate_bytes_per_second"] == pytest.approx(step * 7 / 0.5)
    assert figures["perf/generate_bandwidth_share"] == pytest.approx(step * 7 / 0.5 / roofline.bytes_peak)
    assert set(figures) == {"perf/generate_bytes_per_second", "perf/generate_bandwidth_share"}
    timed = {"perf/pass_tokens": 0, "perf/pass_logit_tokens": 0, "perf/pass_attention_pairs": 0,
             "perf/decoding_rows": 6, "perf/decoding_columns": 10, "perf/decoding_steps": 7,
             "perf/logprob_seconds": 0.1}
    assert "perf/logprob_mfu" not in roofline.figures(timed)  # no pass ran (no group with signal): no MFU
    # on a GPU the linear layers' weights and the cache are bfloat16, the output layer float32
    gpu_step = 2 * blocks + 4 * 64 * 32 + 6 * (10 * 2 * 2 * 16 * 2 + 2 * 64 * 4)
    gpu = perf.Roofline(model, grpo.Args(lora_rank=0), cuda=True).figures(
        {"perf/pass_tokens": 0, "perf/pass_logit_tokens": 0, "perf/pass_attention_pairs": 0, "perf/decoding_rows": 6,
         "perf/decoding_columns": 10, "perf/decoding_steps": 7, "perf/generate_seconds": 0.5})
    assert gpu["perf/generate_bytes_per_second"] == pytest.approx(gpu_step * 7 / 0.5)


def test_the_reference_scores_too_and_lora_has_no_weight_gradients(qwen2):
    """With β > 0 π_ref scores every response as well (a copy, or with LoRA the policy with its adapters off): twice
    the scoring FLOPs. LoRA's backward computes no gradient of the frozen weights: the update costs 2 forwards, not
    3; each epoch again."""
    _, model = qwen2
    work = {"perf/pass_tokens": 100, "perf/pass_logit_tokens": 40, "perf/pass_attention_pairs": 900,
            "perf/decoding_rows": 6, "perf/decoding_columns": 10, "perf/decoding_steps": 7,
            "perf/logprob_seconds": 1.0, "perf/update_seconds": 1.0}

    def mfu(**flags):
        figures = perf.Roofline(model, grpo.Args(**flags), cuda=False).figures(work)
        return figures.get("perf/logprob_mfu"), figures["perf/update_mfu"]

    scoring, update = mfu(lora_rank=0, beta=0.0)
    assert mfu(lora_rank=0, beta=0.04) == pytest.approx((2 * scoring, update))
    # μ's log-probs as π_old (--old-logprobs sampler): π_ref alone scores, or nothing does (no MFU to tell)
    assert mfu(lora_rank=0, beta=0.04, old_logprobs="sampler") == pytest.approx((scoring, update))
    assert mfu(lora_rank=0, beta=0.0, old_logprobs="sampler") == (None, pytest.approx(update))
    assert mfu(lora_rank=1, beta=0.04) == pytest.approx((2 * scoring, 2 / 3 * update))  # LoRA of any rank
    assert mfu(lora_rank=0, beta=0.0, update_epochs=2) == pytest.approx((scoring, 2 * update))
    # a pass measured on its own (common/tools/gpu_check.py: flags without β or --old-logprobs): π_θold alone scores
    alone = perf.Roofline(model, types.SimpleNamespace(update_epochs=1, lora_rank=0), cuda=False).figures(work)
    assert (alone["perf/logprob_mfu"], alone["perf/update_mfu"]) == pytest.approx((scoring, update))


def test_the_perf_line_by_hand(qwen2):
    """Each phase's seconds (3 significant digits) and what it achieves: generation's GB/s and share of a copy's,
    the passes' MFU (2 significant digits); a phase without its figure is left out."""
    _, model = qwen2
    line = perf.Roofline(model, grpo.Args(lora_rank=0), cuda=False).line
    generate = {"perf/generate_seconds": 1.2345, "perf/generate_bytes_per_second": 12.3e9,
                "perf/generate_bandwidth_share": 0.254}
    passes = {"perf/logprob_seconds": 0.5, "perf/logprob_mfu": 0.123, "perf/update_seconds": 2.0,
              "perf/update_mfu": 0.0456}
    assert line({**generate, **passes}) == ("perf: generate 1.23 s (12 GB/s, 25% of a copy's), log-probs 0.5 s "
                                            "(12% MFU), update 2 s (4.6% MFU)")
    assert line(generate) == "perf: generate 1.23 s (12 GB/s, 25% of a copy's)"
    assert line(passes) == "perf: log-probs 0.5 s (12% MFU), update 2 s (4.6% MFU)"


def test_compiling_is_the_default_on_a_gpu_for_long_responses():
    """--compile-decoding left unset: compiled on a GPU from 128 tokens (a shape's compile repays itself), eager
    below it, under --fsdp (refused with it) and on any CPU, where nothing is said; a typed value is kept."""

    def resolved(gpu, max_new_tokens, fsdp=False, typed=None):
        args = types.SimpleNamespace(compile_decoding=typed, max_new_tokens=max_new_tokens, fsdp=fsdp)
        lines = decoding.resolve_compiling(args, gpu)
        return args.compile_decoding, lines

    assert resolved(True, 128) == (True, ["--compile-decoding  (a GPU, responses of up to 128 tokens: "
                                          "common/GUIDE.md)"])
    assert resolved(True, 127) == (False, ["--no-compile-decoding  (a GPU, responses under 128 tokens: "
                                           "common/GUIDE.md)"])
    assert resolved(True, 256, fsdp=True) == (False, ["--no-compile-decoding  (a GPU, --fsdp: common/GUIDE.md)"])
    assert resolved(False, 256) == (False, [])
    assert resolved(True, 16, typed=True) == (True, []) and resolved(True, 256, typed=False) == (False, [])


def test_a_bfloat16_output_layer_is_a_cast_of_its_own(qwen2, monkeypatch):
    """OUTPUT_LAYER bfloat16 (one of the check's variants): the decoding model's output layer is a plain linear layer
    of a bfloat16 copy of the weights (multiplied under autocast, bfloat16 logits), while the tied input embedding
    stays the policy's float32 parameter; the copy counts in cast_weights."""
    tokenizer, model = qwen2
    monkeypatch.setattr(decoding, "OUTPUT_LAYER", "bfloat16")
    decoding._decoding_models.pop(model, None)
    with torch.no_grad(), BF16:
        copy = decoding.decoding_model(model)
        head = copy.get_output_embeddings()
        assert type(head) is torch.nn.Linear and head.weight.dtype == torch.bfloat16
        assert copy.get_input_embeddings().weight is model.get_input_embeddings().weight  # float32, shared
        assert torch.equal(head.weight, model.get_output_embeddings().weight.to(torch.bfloat16))
        ids = torch.tensor([[5, 6, 7]])
        assert copy(input_ids=ids).logits.dtype == torch.bfloat16
    assert any(p is model.get_output_embeddings().weight for p in decoding.cast_weights(model))
    decoding._decoding_models.pop(model)


def test_the_flops_of_a_pass_by_hand(qwen2):
    """A forward pass's FLOPs on the tiny Qwen2, written out: 2 per multiply-add, every weight of the blocks once a
    token (2 layers of q, k, v, o: 32 × (32 + 16 + 16 + 32), and gate, up, down: 3 × 32 × 64, so 2 × 18,432 a token),
    the output layer (64 × 32) once a token with logits, and per (query, key) pair and layer the two products of
    attention, 4 heads × 8 wide each (2 layers: 2 × 2 × 2 × 32 = 256 a pair)."""
    _, model = qwen2
    roofline = perf.Roofline(model, grpo.Args(lora_rank=0, beta=0.0), cuda=False)
    work = {"perf/pass_tokens": 10, "perf/pass_logit_tokens": 4, "perf/pass_attention_pairs": 30,
            "perf/decoding_rows": 1, "perf/decoding_columns": 1, "perf/decoding_steps": 1,
            "perf/logprob_seconds": 0.5, "perf/update_seconds": 2.0}
    flops = 2 * 18432 * 10 + 2 * 64 * 32 * 4 + 256 * 30
    figures = roofline.figures(work)
    assert figures["perf/logprob_mfu"] * roofline.flops_peak == pytest.approx(flops / 0.5)
    assert figures["perf/update_mfu"] * roofline.flops_peak == pytest.approx(3 * flops / 2.0)
    del work["perf/update_seconds"]  # a phase not timed has no MFU
    assert "perf/update_mfu" not in roofline.figures(work) and "perf/logprob_mfu" in roofline.figures(work)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_16_bit_sampler_copy_computes_in_its_own_dtype_under_the_callers_autocast(dtype):
    """--sampler-dtype float16 on a GPU: the group files sample under bfloat16 autocast, which would recast the copy's
    products to bfloat16; the decoding steps run it under autocast in its own dtype (a bfloat16 copy: as before).
    Every linear layer's output, in the prefill and a step, is in the copy's dtype."""
    from fixed_rollouts import tiny_gpt2

    copy = sampling.Sampler(tiny_gpt2(), dtype=str(dtype).removeprefix("torch.")).model
    seen = []
    for module in copy.modules():
        if type(module).__name__ in ("Conv1D", "Linear"):
            module.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    prompt_ids, prompt_mask = torch.tensor([[5, 6, 7], [0, 8, 9]]), torch.tensor([[1, 1, 1], [0, 1, 1]])
    with torch.no_grad(), BF16:
        decoder = decoding.Decoder(copy, prompt_ids, prompt_mask, repeats=2, new_tokens=3, draw=grpo.sample_token)
        token, _, _ = decoder.step(None, torch.zeros(4, dtype=torch.bool), torch.full((4, 1), 0.5), 1.0)
        decoder.step(token, torch.zeros(4, dtype=torch.bool), torch.full((4, 1), 0.5), 1.0)
    assert len(seen) > 8 and set(seen) == {dtype}
