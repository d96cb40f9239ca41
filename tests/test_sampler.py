"""When the sampler is not the trainer (common/sampling.py: Sampler, correct; common/EQUATIONS.md, eq. 124-128):
the weights that sample at iteration n are those of iteration n − k, a copy in another dtype follows every update,
each correction's weights and masks are those of its formula written out here token by token (every group file's
loss takes them where its method says: tests/test_group_update.py), and the default sampler changes no number."""

import math
import types

import pytest
import torch

import grpo
from common import sampling
from fixed_rollouts import as_samples, draw_epochs, fixed_rollout, forward_of, tiny_gpt2, update_args
from test_group_runs import FLAGS, scalars

# ---------------------------------------------------------------- the weights that sample

def set_weights(model, value: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)


@pytest.mark.parametrize("lag", [0, 1, 3])
def test_a_lagging_sampler_samples_with_the_weights_of_k_updates_ago(lag):
    """Iteration n's weights are v_n (the policy's after n − 1 updates): the sampler holds v_max(1, n − k), and its
    saved state brings them back in a new sampler."""
    policy = tiny_gpt2()
    set_weights(policy, 1.0)
    sampler = sampling.Sampler(policy, lag=lag)
    assert (sampler.model is policy) == (lag == 0)
    for n in range(1, 7):
        expected = float(max(1, n - lag))
        assert all(torch.all(p == expected) for p in sampler.model.parameters()), (n, lag)
        if n == 4:  # a checkpoint: a fresh sampler of the same policy picks the run up
            again = sampling.Sampler(policy, lag=lag)
            again.load_state_dict(sampler.state_dict())
            assert all(torch.equal(a, b) for a, b in zip(again.model.parameters(), sampler.model.parameters()))
            if lag:  # a checkpoint written when the history held the copy's version first
                state = sampler.state_dict()
                older = sampling.Sampler(policy, lag=lag)
                older.load_state_dict({"history": [state["copy"], *state["history"]]})
                assert all(torch.all(p == expected) for p in older.model.parameters())
                assert [v["transformer.wte.weight"][0, 0].item() for v in older.history] == list(range(
                    int(expected) + 1, n + 1))
        set_weights(policy, n + 1.0)  # the update of iteration n
        sampler.refresh()
    assert all(p.requires_grad for p in policy.parameters())  # the copy is frozen, the policy is not


@pytest.mark.parametrize("dtype, lag", [("bfloat16", 0), (None, 2), ("bfloat16", 3), ("float16", 1)])
def test_the_sampler_holds_k_versions_in_its_dtype_as_its_bytes_count(dtype, lag):
    """At lag k the copy holds the oldest version and the history the k newer ones, in the copy's dtype; at lag 0 no
    version is kept: Sampler.bytes, counted before the copy exists, is what the copy and its full history hold."""
    policy = tiny_gpt2()
    sampler = sampling.Sampler(policy, dtype, lag)
    for n in range(lag + 2):
        set_weights(policy, n + 2.0)
        sampler.refresh()
    def held(tensors):
        return sum(t.numel() * t.element_size() for t in tensors)
    weights = sum(p.numel() for p in policy.parameters())
    size = {"bfloat16": 2, "float16": 2, None: 4}[dtype]
    assert len(sampler.history) == lag and all(t.dtype == sampler.copy.lm_head.weight.dtype
                                               for version in sampler.history for t in version.values())
    assert held(sampler.copy.parameters()) == weights * size
    assert held(t for version in sampler.history for t in version.values()) == lag * weights * size
    assert sampling.Sampler.bytes(policy, dtype, lag) == (weights * size, lag * weights * size)
    assert sampling.Sampler.bytes(policy, "float32", 0) == (0, 0)
    state = sampler.state_dict()  # loaded back after two more updates: those versions are gone
    for n in range(2):
        set_weights(policy, 10.0 + n)
        sampler.refresh()
    sampler.load_state_dict(state)
    assert len(sampler.history) == lag and all(
        torch.equal(a, b) for now, then in zip(sampler.history, state.get("history", [])) for a, b in
        zip(now.values(), then.values()))


def test_a_sampler_copy_in_another_dtype_follows_every_update():
    policy = tiny_gpt2()
    sampler = sampling.Sampler(policy, dtype="bfloat16")
    assert sampler.model is not policy and all(p.dtype == torch.bfloat16 for p in sampler.model.parameters())
    set_weights(policy, 0.5)
    sampler.refresh()
    assert all(torch.all(p == 0.5) for p in sampler.model.parameters())
    assert sampler.state_dict() == {}  # nothing to save: the copy is rebuilt from the policy's weights
    set_weights(policy, 0.25)
    sampler.load_state_dict({})  # as after a resume
    assert all(torch.all(p == 0.25) for p in sampler.model.parameters())


def test_the_default_sampler_is_the_policy_and_no_correction_touches_the_rollout(in_process):
    """A float32 sampler at lag 0 is the trainer itself (no copy, no correction, no gap on the console), and `correct`
    with no correction hands the update its rollout as it was: every logged number of a run with those flags typed is
    the default run's."""
    assert sampling.Sampler(tiny_gpt2(), dtype="float32").copy is None
    rollout, sampler, _ = hand_batch()
    same, _ = sampling.correct(rollout, sampler, "none", 2.0)
    assert same.mask is rollout.mask and same.weights is None
    flags = FLAGS[:-2] + ["--beta", "0"]
    default, _ = in_process("grpo", flags, subdir="default")
    typed, out = in_process("grpo", flags + ["--sampler-dtype", "float32", "--sampler-lag", "0", "--correction",
                                             "none"], subdir="typed")
    assert "sampler-gap" not in out and "ρ-max" not in out  # no other sampler: nothing said
    assert "the sampler is not the trainer" not in out
    expected, actual = scalars(default), scalars(typed)
    assert actual == expected and len(expected) > 40


# ---------------------------------------------------------------- the corrections, by their formulas

def hand_batch():
    """3 responses of up to 4 tokens (the last token of row 1 is padding), π_θold and μ chosen so that each
    correction acts: ratios far above and below the bands, and one response without signal (Â = 0)."""
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    sampler = torch.full((3, 4), -1.0)
    log_rho = torch.tensor([[0.0, 1.5, -1.0, 0.2], [0.01, -0.02, 0.005, 9.0], [0.5, 0.5, 0.0, 0.0]])
    old = sampler + log_rho
    return as_rollout(mask, old, advantages=torch.tensor([1.0, -0.5, 0.0])), sampler, log_rho


def as_rollout(mask, old_logprobs, advantages):
    """What `correct` reads of the update's rollout, and its NamedTuple's _replace."""
    rollout = types.SimpleNamespace(mask=mask, old_logprobs=old_logprobs, advantages=advantages, weights=None)
    rollout._replace = lambda **kw: types.SimpleNamespace(**{**vars(rollout), **kw})
    return rollout


def test_truncated_importance_sampling_weighs_each_token_by_its_ratio_up_to_the_cap():
    rollout, sampler, log_rho = hand_batch()
    corrected, figures = sampling.correct(rollout, sampler, "token-tis", 2.0)
    for i in range(3):
        for t in range(4):
            if rollout.mask[i, t]:
                assert corrected.weights[i, t].item() == pytest.approx(min(math.exp(log_rho[i, t].item()), 2.0))
    assert torch.equal(corrected.mask, rollout.mask)  # truncation keeps every token
    # the figures: over the 7 tokens of the two responses with signal
    ratios = [math.exp(x) for x in (0.0, 1.5, -1.0, 0.2, 0.01, -0.02, 0.005)]
    assert figures["charts/is_ratio_mean"] == pytest.approx(sum(ratios) / 7)
    assert figures["charts/is_ratio_max"] == pytest.approx(max(ratios))
    assert figures["charts/is_ratio_min"] == pytest.approx(min(ratios))
    assert figures["charts/is_truncated_fraction"] == pytest.approx(1 / 7)  # e^1.5 > 2
    assert figures["charts/is_masked_fraction"] == 0.0


def test_token_rejection_drops_the_tokens_outside_the_band():
    """verl's token rejection (rollout_rs token_k1): the kept tokens weigh 1."""
    rollout, sampler, log_rho = hand_batch()
    corrected, figures = sampling.correct(rollout, sampler, "token-reject", 2.0)
    expected = rollout.mask * ((log_rho >= -math.log(2.0)) & (log_rho <= math.log(2.0)))
    assert torch.equal(corrected.mask, expected) and corrected.weights is None
    assert corrected.mask[0].tolist() == [1.0, 0.0, 0.0, 1.0]  # ratios e^1.5 and e^-1 are outside [1/2, 2]
    assert figures["charts/is_masked_fraction"] == pytest.approx(2 / 7)
    assert figures["charts/is_masked_response_fraction"] == 0.0  # no response lost every token
    # the band is closed: a token whose ratio is exactly C or 1/C stays (log C as float32 rounds it)
    at_the_bounds = torch.tensor([[0.0, math.log(2.0), -math.log(2.0), 0.0]])
    edge = as_rollout(torch.ones(1, 4), at_the_bounds, advantages=torch.ones(1))
    assert sampling.correct(edge, torch.zeros(1, 4), "token-reject", 2.0)[0].mask.tolist() == [[1.0] * 4]


def test_icepop_drops_the_tokens_outside_the_band_and_weighs_the_kept_ones_by_their_ratio():
    """IcePop (TRL's token_mask): the tokens token-reject keeps, each weighed by its ρ_t; by hand, row 0 keeps its
    first and last token (ratios 1 and e^0.2), row 1 its three real tokens."""
    rollout, sampler, log_rho = hand_batch()
    corrected, figures = sampling.correct(rollout, sampler, "token-icepop", 2.0)
    assert corrected.mask.tolist() == [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
    kept = corrected.mask.bool()
    expected = torch.tensor([[1.0, 0, 0, math.exp(0.2)], [math.exp(0.01), math.exp(-0.02), math.exp(0.005), 0],
                             [math.exp(0.5), math.exp(0.5), 0, 0]])
    torch.testing.assert_close(corrected.weights[kept], expected[kept])
    assert figures["charts/is_masked_fraction"] == pytest.approx(2 / 7)


def test_the_geometric_mean_rejection_drops_whole_responses_whose_mean_ratio_leaves_the_band():
    """verl's Geo-RS (rollout_rs seq_mean_k1): the kept responses weigh 1."""
    rollout, sampler, log_rho = hand_batch()
    # geometric means: row 0 exp(0.7 / 4), row 1 exp(-0.005 / 3) (its padding's 9.0 not counted), row 2 exp(0.5)
    corrected, figures = sampling.correct(rollout, sampler, "sequence-geo-reject", 1.03)
    assert corrected.weights is None
    assert corrected.mask[0].sum() == 0 and torch.equal(corrected.mask[1], rollout.mask[1])
    assert corrected.mask[2].sum() == 0
    assert figures["charts/is_masked_response_fraction"] == pytest.approx(1 / 2)  # of the 2 with signal
    assert figures["charts/is_masked_fraction"] == pytest.approx(4 / 7)
    wider, _ = sampling.correct(rollout, sampler, "sequence-geo-reject", math.exp(0.18))  # row 0's 0.175 fits now
    assert torch.equal(wider.mask[0], rollout.mask[0]) and wider.mask[2].sum() == 0


def test_sequence_mis_weighs_each_kept_response_by_its_product_ratio():
    """Sequence-level masked importance sampling (TRL's default, sequence_mask, with no lower bound): a response
    whose Π ρ = exp(Σ log ρ) is above C leaves the loss; every token of a kept one weighs its Π ρ. By hand at C = 2:
    row 0 has Σ = 0.7 (Π ρ 2.01, dropped), row 1 -0.005 (kept at 0.995; its padding's 9.0 not counted), row 2 1.0
    (dropped); at C = 3 rows 0 and 2 are kept, at e^0.7 and e^1, and a ratio far below 1 is kept, weighed by it."""
    rollout, sampler, log_rho = hand_batch()
    corrected, figures = sampling.correct(rollout, sampler, "sequence-mis", 2.0)
    assert corrected.mask.tolist() == [[0.0] * 4, [1.0, 1.0, 1.0, 0.0], [0.0] * 4]
    torch.testing.assert_close(corrected.weights[1, :3], torch.full((3,), math.exp(-0.005)))
    assert figures["charts/is_masked_response_fraction"] == pytest.approx(1 / 2)
    wider, _ = sampling.correct(rollout, sampler, "sequence-mis", 3.0)
    assert torch.equal(wider.mask, rollout.mask)
    torch.testing.assert_close(wider.weights[0], torch.full((4,), math.exp(0.7)))
    torch.testing.assert_close(wider.weights[2, :2], torch.full((2,), math.exp(1.0)))
    low = as_rollout(torch.ones(1, 2), torch.tensor([[-3.0, -2.0]]), advantages=torch.ones(1))
    corrected, _ = sampling.correct(low, torch.zeros(1, 2), "sequence-mis", 3.0)
    assert corrected.mask.tolist() == [[1.0, 1.0]]
    torch.testing.assert_close(corrected.weights, torch.full((1, 2), math.exp(-5.0)))


def test_the_geometric_mean_rejection_averages_over_each_responses_own_tokens():
    """ρ̄_i is the mean over response i's tokens (eq. 127), not over the batch's width nor over at least 2: a 1-token
    response with log ρ = 0.04 (ρ = 1.041) leaves [1/1.03, 1.03], though 0.04 / 4 columns or 0.04 / 2 would not."""
    mask = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    sampler = torch.full((2, 4), -1.0)
    log_rho = torch.tensor([[0.04, 0.0, 0.0, 0.0], [0.02, 0.02, 0.02, 0.02]])
    rollout = as_rollout(mask, sampler + log_rho, advantages=torch.tensor([1.0, -1.0]))
    corrected, _ = sampling.correct(rollout, sampler, "sequence-geo-reject", 1.03)
    assert corrected.mask[0].sum() == 0 and torch.equal(corrected.mask[1], mask[1])
    # the band is closed: a response whose mean ratio is exactly C or 1/C stays
    at_the_bounds = torch.tensor([[math.log(2.0), 0.0], [-math.log(2.0), 0.0]])
    edge = as_rollout(torch.tensor([[1.0, 0.0], [1.0, 0.0]]), at_the_bounds, advantages=torch.ones(2))
    assert sampling.correct(edge, torch.zeros(2, 2), "sequence-geo-reject", 2.0)[0].mask.tolist() == [[1.0, 0.0]] * 2


def test_a_process_without_signal_leaves_the_figures_to_the_others(monkeypatch):
    """Under torchrun a process whose groups all have Â = 0 still joins each reduction: what it brings must not
    move the figures of the process that has signal (its ratios all below 1 here, so a max taken with 1 would)."""
    mask, sampler = torch.ones(2, 3), torch.zeros(2, 3)
    with_signal = as_rollout(mask, torch.tensor([[-0.1, -0.2, -0.3], [-0.4, -0.5, -0.05]]), torch.tensor([1.0, -1.0]))
    brought = []  # what the process with signal brings to each reduction, in call order
    monkeypatch.setattr(sampling, "global_max", lambda value: brought.append(value) or value)
    monkeypatch.setattr(sampling, "global_fraction", lambda part, whole: brought.append((part, whole)) or (
        part / whole if whole > 0 else 0.0))
    _, alone = sampling.correct(with_signal, sampler, "token-reject", 1.2)
    others = iter(brought)  # the process without signal reduces with those, call by call
    monkeypatch.setattr(sampling, "global_max", lambda value: max(value, next(others)))

    def global_fraction(part, whole):
        other_part, other_whole = next(others)
        return (part + other_part) / (whole + other_whole) if whole + other_whole > 0 else 0.0

    monkeypatch.setattr(sampling, "global_fraction", global_fraction)
    without_signal = as_rollout(mask, torch.full((2, 3), 0.5), torch.zeros(2))
    _, together = sampling.correct(without_signal, sampler, "token-reject", 1.2)
    assert together == alone and alone["charts/is_ratio_max"] < 1 and alone["charts/is_masked_fraction"] > 0


def test_no_token_with_signal_anywhere_logs_no_figures_and_one_is_enough():
    """Every Â = 0 on every process: there is nothing to average (a 0/0, a ratio of ±inf), so nothing is logged,
    and the rollout is still corrected. A single token with signal gives the figures."""
    mask, sampler = torch.ones(2, 3), torch.zeros(2, 3)
    old = torch.tensor([[0.9, 0.0, 0.0], [0.0, 0.0, 0.0]])  # ρ = e^0.9 = 2.46 at one token: outside [1/2, 2]
    corrected, figures = sampling.correct(as_rollout(mask, old, torch.zeros(2)), sampler, "token-reject", 2.0)
    assert figures == {} and corrected.mask[0, 0] == 0 and corrected.mask.sum() == 5
    one = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    _, figures = sampling.correct(as_rollout(one, old, torch.tensor([1.0, 0.0])), sampler, "token-reject", 2.0)
    assert figures["charts/is_ratio_max"] == pytest.approx(math.exp(0.9))
    assert figures["charts/is_masked_fraction"] == figures["charts/is_masked_response_fraction"] == 1.0


def test_no_correction_changes_nothing_and_logs_nothing():
    rollout, sampler, _ = hand_batch()
    corrected, figures = sampling.correct(rollout, sampler, "none", 2.0)
    assert corrected.weights is None and torch.equal(corrected.mask, rollout.mask) and figures == {}


# ---------------------------------------------------------------- π_θold from the sampler ("bypass")

def test_with_the_samplers_log_probs_as_pi_old_no_scoring_pass_runs():
    model = tiny_gpt2()
    rollout = fixed_rollout(grpo, model)
    samples = as_samples(grpo, rollout)._replace(logprobs=rollout.old_logprobs)
    calls = []
    hook = model.register_forward_hook(lambda *a: calls.append(1))
    for source, scored in (("sampler", 0), ("trainer", 1)):
        calls.clear()
        args = update_args(grpo, beta=0.0, old_logprobs=source)
        old, _ = grpo.score_responses(model, None, samples, draw_epochs(rollout, args)[0], args,
                                      forward_of(grpo, args))
        assert (len(calls) > 0) == bool(scored)
        if source == "sampler":
            assert torch.equal(old, rollout.old_logprobs)  # μ itself
    hook.remove()


def test_with_the_samplers_log_probs_as_pi_old_no_sampler_gap_is_logged(in_process):
    """μ's log-probs are π_old's then: their gap would be 0 by construction and read as perfect agreement."""
    flags = FLAGS[:-2] + ["--beta", "0", "--num-iterations", "2", "--sampler-lag", "1"]
    bypass, out = in_process("grpo", flags, subdir="bypass")  # a lag's default: --old-logprobs sampler
    rescored, rescored_out = in_process("grpo", flags + ["--old-logprobs", "trainer"], subdir="rescored")
    assert not any(tag.startswith("charts/sampler_gap") for tag, _ in scalars(bypass)) and "sampler-gap" not in out
    assert {tag for tag, _ in scalars(rescored)} >= {"charts/sampler_gap_mean", "charts/sampler_gap_max"}
    assert "sampler-gap" in rescored_out


# ---------------------------------------------------------------- what the flags refuse, in one line

@pytest.mark.parametrize("fields, message", [
    (dict(sampler_lag=-1), "error: --sampler-lag must be >= 0"),
    (dict(sampler_lag=5, num_iterations=5), "error: --sampler-lag must be below --num-iterations (5): a longer lag "
                                            "samples every iteration with the starting weights, got 5"),
    (dict(correction_cap=1.0), "error: --correction-cap must be > 1"),
    (dict(correction_cap=5.0), "error: --correction-cap bounds a correction's ratios: give a --correction"),
    (dict(correction_cap=5.0, correction="none"), "error: --correction-cap bounds a correction's ratios"),
    (dict(old_logprobs="sampler", correction="token-tis"), "error: --correction token-tis with --old-logprobs"),
])
def test_bad_sampler_flags_give_one_line(fields, message):
    from common import policy

    args = grpo.Args(**fields)
    with pytest.raises(SystemExit) as e:
        policy.resolve_defaults(args, beta=grpo.BETA)
        grpo.check_args(args)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_the_correction_follows_the_kind_of_mismatch():
    """A copy of the current weights in another dtype: token-tis at C = 2 (the literature's fix for a bfloat16
    sampler); weights k updates old: μ itself as π_old, nothing to correct (the lab's best at lags 1 and 4,
    common/results/lab.md), or with π_θold rescored (typed), the geometric-mean rejection at 1.03; a typed
    correction rescores π_θold; a float32 "copy" at lag 0 is the trainer itself: nothing to correct."""
    from common import policy

    for fields, expected, cap, old in (
            (dict(), "none", None, "trainer"), (dict(sampler_lag=1), "none", None, "sampler"),
            (dict(sampler_lag=1, old_logprobs="trainer"), "sequence-geo-reject", 1.03, "trainer"),
            (dict(sampler_lag=4, correction="token-tis"), "token-tis", 2.0, "trainer"),
            (dict(sampler_dtype="bfloat16"), "token-tis", 2.0, "trainer"),
            (dict(sampler_dtype="float16", sampler_lag=2), "none", None, "sampler"),
            (dict(sampler_dtype="float32"), "none", None, "trainer"),
            (dict(sampler_lag=1, old_logprobs="sampler"), "none", None, "sampler"),
            (dict(correction="sequence-mis"), "sequence-mis", 3.0, "trainer"),
            (dict(correction="token-reject", correction_cap=1.5), "token-reject", 1.5, "trainer")):
        args = grpo.Args(**fields)
        lines = policy.resolve_defaults(args, beta=grpo.BETA)
        assert (args.correction, args.correction_cap, args.old_logprobs) == (expected, cap, old), fields
        said = [line for line in lines if line.startswith("--correction")]
        assert len(said) == (sampling.sampler_differs(args.sampler_dtype, args.sampler_lag)
                             and "correction" not in fields), fields
        said = [line for line in lines if line.startswith("--old-logprobs")]
        assert len(said) == (args.sampler_lag > 0 and "old_logprobs" not in fields), fields
    assert not sampling.sampler_differs("float32", 0) and sampling.sampler_differs("float32", 1)
    assert sampling.sampler_differs("bfloat16", 0) and not sampling.sampler_differs(None, 0)
    # the console's lines say why
    assert policy.resolve_defaults(grpo.Args(sampler_lag=2), beta=grpo.BETA)[-2:] == [
        "--old-logprobs sampler  (the sampler is not the trainer: weights 2 updates old)",
        "--correction none  (the sampler is not the trainer: weights 2 updates old)"]
    assert policy.resolve_defaults(grpo.Args(sampler_dtype="bfloat16"), beta=grpo.BETA)[-1] == (
        "--correction token-tis  (the sampler is not the trainer: a bfloat16 copy)")


def test_the_rounds_of_dynamic_sampling_are_padded_to_the_widest():
    one, two = torch.tensor([[1, 2]]), torch.tensor([[3, 4, 5], [6, 7, 8]])
    assert sampling.pad_cat([one, two], 0, left=False).tolist() == [[1, 2, 0], [3, 4, 5], [6, 7, 8]]
    assert sampling.pad_cat([two, one], 9, left=True).tolist() == [[3, 4, 5], [6, 7, 8], [9, 1, 2]]


def test_gspo_logs_the_loss_its_gradient_sees_when_a_correction_drops_a_response():
    """A response the correction left no token of adds nothing to GSPO's gradient, nor now to its logged loss (it
    added −Â/N: a ratio of 1 over no tokens), as in GRPO: at ratio 1, −(1 · 1 + 0) / 2."""
    import gspo

    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    advantages = torch.tensor([1.0, -1.0])
    for module in (gspo, grpo):
        loss = module.policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), advantages, mask, beta=0.0)
        assert loss.item() == pytest.approx(-0.5), module.__name__


def test_the_console_says_how_far_the_sampler_is_and_what_the_correction_left_out(in_process):
    """A lagging sampler with π_θold rescored: each iteration's line names the gap, the largest ratio and the shares
    of tokens and of responses the correction (sequence-geo-reject, the lag's then) left out of the loss."""
    import re

    _, out = in_process("grpo", FLAGS[:-2] + ["--sampler-lag", "1", "--old-logprobs", "trainer", "--num-iterations",
                                              "3"])
    lines = [line for line in out.splitlines() if line.startswith("iteration    3/3")]
    assert re.search(r"  sampler-gap [\d.e-]+  ρ-max [\d.e+]+  masked \d\.\d\d \(responses \d\.\d\d\)  ", lines[0])
