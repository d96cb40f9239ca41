"""Prompts in: what the group files' `sample` and `response_logits` read, and the weights that sample.

1. `PromptFormat`: what the model reads (a chat template, or solved examples as text), the tokens
   and the stop string where its answer ends, and the answer's text.
2. Reading prompts once: `shared_head` finds the tokens every prompt of a batch begins with,
   `read_prompts` runs that head once and each prompt's tail after it into a KV cache (the
   tokens the caller runs next looked up with them). Sampling's decoding steps continue from
   it: common/decoding.py.
3. When the sampler is not the trainer: `Sampler` holds the weights that sample (the policy, or a
   copy in another dtype, or weights k updates old), and `correct` weighs or masks the update's
   tokens for it (common/EQUATIONS.md: the sampler is not π_θold).

The draw of a token and the decoding loop are in the group files: they define π_θold.
"""

import collections
import contextlib
import copy
import math
import random
from typing import Literal, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from common.processes import global_fraction, global_max, in_lockstep
from common.tasks import EVAL_SEED, TASKS

# ---------------------------------------------------------------- what the model reads, and where its answer ends

CPU_RECIPE = "CPU recipe, measured to learn: common/results/smollm2.md"
CPU_FEW_SHOT = 3  # the CPU recipe's solved examples, for the tasks of this repository


class PromptFormat:
    """What the model reads for a task's questions, and where its answers end.

    A chat model: its chat template, the task's answer format in the user turn (after the system
    prompt), solved examples as earlier turns. A base model: solved examples as text, then the
    question, so that it answers in the format the reward reads; its answer ends at a stop string.
    """

    def __init__(self, tokenizer, task, few_shot: Optional[int] = None, system_prompt: Optional[str] = None,
                 model=None):
        self.tokenizer, self.task, self.system_prompt = tokenizer, task, system_prompt
        self.chat = tokenizer.chat_template is not None
        if system_prompt and not self.chat:  # a base model reads text, with no turn to put it in
            raise SystemExit("error: --system-prompt needs a chat model, and this tokenizer has no chat "
                             "template: a base model learns the format from solved examples (--few-shot)")
        self.few_shot, self.why = (few_shot, None) if few_shot is not None else self._default_few_shot(model)
        self.examples = task.examples(self.few_shot, random.Random(EVAL_SEED)) if self.few_shot else []
        self.stop = None if self.chat or not self.examples else self._stop_string()
        self.pad_id = tokenizer.pad_token_id
        # the tokens that end a response: the tokenizer's EOS and the model's end of turn (Qwen's <|im_end|>)
        config_eos = [] if model is None else model.generation_config.eos_token_id
        config_eos = [] if config_eos is None else config_eos if isinstance(config_eos, list) else [config_eos]
        self.eos_ids = sorted({tokenizer.eos_token_id, *config_eos})
        self.positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)

    def _default_few_shot(self, model) -> tuple[int, str]:
        """--few-shot left unset (decided here alone, once the model's kind is known), and why."""
        if getattr(getattr(model, "config", None), "embedded_toy_model", False):
            return 0, "the embedded models"  # trained on bare questions
        if model is not None and model.device.type == "cpu" and TASKS.get(self.task.name) is self.task:
            return CPU_FEW_SHOT, CPU_RECIPE  # the examples the CPU recipe learned with
        if self.chat:
            return 0, "a chat model: its user turn states the format"
        return self.task.default_few_shot, "a base model: the task's solved examples show the format"

    def _stop_string(self) -> str:
        """Where a few-shot base model's answer ends: the first newline, or the blank line between
        examples whose answers span lines. Without it, it would write a question of its own."""
        return "\n\n" if any("\n" in answer for _, answer in self.examples) else "\n"

    def default_line(self) -> list[str]:
        """The console's line for --few-shot left unset."""
        return [] if self.why is None else [f"--few-shot {self.few_shot}  ({self.why})"]

    def texts(self, questions: list[str]) -> list[str]:
        """The prompts as the model reads them (the examples come from the training split)."""
        if self.chat:
            system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            shots = []
            for question, answer in self.examples:
                shots += [{"role": "user", "content": f"{question}\n{self.task.instruction}"},
                          {"role": "assistant", "content": answer}]
            return [self.tokenizer.apply_chat_template(
                system + shots + [{"role": "user", "content": f"{q}\n{self.task.instruction}"}],
                tokenize=False,
                add_generation_prompt=True,
            ) for q in questions]
        if not self.examples:
            return questions
        shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in self.examples)
        return [f"{shots}Question: {q}\nAnswer:" for q in questions]

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        # a chat template already holds its special tokens
        return self.tokenizer(texts, add_special_tokens=not self.chat)["input_ids"]

    def encode(self, questions: list[str], device) -> tuple[Tensor, Tensor]:
        """Token ids and attention mask of the prompts, left-padded: [B, P] each."""
        texts = self.texts(questions)
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=not self.chat)
        return enc["input_ids"].to(device), enc["attention_mask"].to(device)

    def check_lengths(self, eval_questions: list[str], max_new_tokens: int) -> int:
        """The longest prompt, held-out or training, in tokens; one line when one and a response
        would not fit the model's positions, naming the question."""
        splits = getattr(self.task, "splits", None)  # a file's questions: every one of them
        if splits is not None:
            training = [question for question, _, _ in splits["train"]]
        else:  # a generator's: a sample, drawn as training draws them (alike in length)
            training = [question for question, _ in self.task.prompts(1000, random.Random(EVAL_SEED))]
        questions = eval_questions + training
        lengths = [len(ids) for ids in self.token_ids(self.texts(questions))]
        longest = max(range(len(questions)), key=lengths.__getitem__)
        if self.positions is not None and lengths[longest] + max_new_tokens > self.positions:
            question = questions[longest] if len(questions[longest]) <= 60 else questions[longest][:57] + "..."
            raise SystemExit(f"error: the prompt of the question {question!r} is {lengths[longest]} tokens "
                             f"long: with --max-new-tokens {max_new_tokens} it exceeds the model's "
                             f"{self.positions} positions; lower --few-shot or --max-new-tokens, or leave "
                             "that question out")
        return lengths[longest]

    def holds_stop(self, responses: Tensor) -> Tensor:
        """[N] True where the response so far holds the stop string: the answer has ended.
        Only the last 16 tokens are decoded: a stop string is a newline or two, and compiled
        decoding looks every 8 tokens (common/decoding.py: CHECK_EVERY)."""
        tails = self.tokenizer.batch_decode(responses[:, -16:])
        return torch.tensor([self.stop in tail for tail in tails], device=responses.device)

    def stop_mask(self, responses: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """mask [N, T] ended at the token that completes the first stop string (included, like an
        EOS), and [N] True where the answer ended so. The shortest prefix whose text holds it is
        found by bisection, since one token may hold several characters."""
        lengths, stopped = [], []
        for row, n in zip(responses.tolist(), mask.sum(dim=1).long().tolist()):
            low, high = 1, n
            stopped.append(self.stop in self.tokenizer.decode(row[:n]))
            if stopped[-1]:
                while low < high:
                    middle = (low + high) // 2
                    if self.stop in self.tokenizer.decode(row[:middle]):
                        high = middle
                    else:
                        low = middle + 1
            lengths.append(high)
        positions = torch.arange(responses.shape[1], device=responses.device)
        cut = positions.unsqueeze(0) < torch.tensor(lengths, device=responses.device).unsqueeze(1)
        return cut.float(), torch.tensor(stopped, dtype=torch.bool, device=responses.device)

    def decode(self, responses: Tensor, mask: Tensor) -> list[str]:
        """Each response's text, up to the end of its answer."""
        lengths = mask.sum(dim=1).long().tolist()
        rows = [row[:n] for row, n in zip(responses.tolist(), lengths)]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)


# ---------------------------------------------------------------- reading prompts once

def position_ids(attention_mask: Tensor) -> Tensor:
    """Each token's position among the real tokens of its row (gpt2 has absolute positions)."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def shared_head(prompt_ids: Tensor, prompt_mask: Tensor) -> int:
    """H: how many leading tokens every left-padded prompt of [B, P] shares (a chat template, a
    system turn, solved examples), at most the shortest prompt's length − 1."""
    lengths = prompt_mask.sum(dim=1)
    width = int(lengths.min()) - 1
    if width <= 0:
        return 0
    starts = prompt_ids.shape[1] - lengths  # left padding: prompt b begins at column P − length_b
    columns = starts.unsqueeze(1) + torch.arange(width, device=prompt_ids.device)
    heads = prompt_ids.gather(1, columns)  # [B, width]
    return int((heads == heads[:1]).all(dim=0).int().cumprod(dim=0).sum())


def read_prompts(model, prompt_ids: Tensor, prompt_mask: Tensor, then: Optional[Tensor] = None):
    """Left-padded prompts [B, P] through the model into a KV cache, their shared head run once.

    The H tokens every prompt begins with (shared_head) run as a batch of one; their keys and
    values are copied B times, and each prompt's tail continues from them: every token sees what it
    would see in its whole prompt, at the same positions. Returns the model's output (the cache,
    the last position's logits), the cache's attention mask [B, H + the longest tail] (1 on the
    head, then each tail right-aligned after its left padding, 0), and the input embeddings of
    `then`, the token ids the caller runs next: looked up with the prompts' (see `embed`), or None.
    """
    head = shared_head(prompt_ids, prompt_mask)
    lengths = prompt_mask.sum(dim=1, keepdim=True)  # [B, 1]
    width = int(lengths.max()) - head  # the longest tail
    columns = torch.arange(width, device=prompt_mask.device)
    tail_mask = (columns >= width - (lengths - head)).to(prompt_mask.dtype)  # [B, width]
    attention_mask = torch.cat([prompt_mask.new_ones(len(prompt_mask), head), tail_mask], dim=1)
    # the tokens, as ids [B, P] or as embeddings [B, P, d] looked up with `then`'s, sliced alike
    key, inputs, then_embeds = "input_ids", prompt_ids, None
    if then is not None:
        key, (inputs, then_embeds) = "inputs_embeds", embed(model, prompt_ids, then)
    cache = None
    if head > 0:
        start = prompt_ids.shape[1] - int(lengths[0])
        cache = model(
            **{key: inputs[:1, start : start + head]},
            attention_mask=attention_mask[:1, :head],
            position_ids=torch.arange(head, device=prompt_ids.device).unsqueeze(0),
            use_cache=True,
            logits_to_keep=1,
        ).past_key_values  # the head, [1, H]
        cache.batch_repeat_interleave(len(prompt_ids))  # [1, ...] -> [B, ...]
    output = model(
        **{key: inputs[:, prompt_ids.shape[1] - width :]},
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask)[:, head:],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return output, attention_mask, then_embeds


def embed(model, *token_ids: Tensor) -> list[Tensor]:
    """The input embeddings of each tensor of token ids [..] -> [.., d], from one lookup.

    Each lookup gives the embedding matrix [vocab, d] a dense gradient of its own, which backward
    then adds up: one lookup per pass gives it one. `model` may be wrapped in DDP.
    """
    lookup = getattr(model, "module", model).get_input_embeddings()
    embeds = lookup(torch.cat([ids.flatten() for ids in token_ids]))
    parts = embeds.split([ids.numel() for ids in token_ids])
    return [part.view(*ids.shape, -1) for part, ids in zip(parts, token_ids)]


def pad_cat(tensors: list[Tensor], value: int, left: bool) -> Tensor:
    """Stack [n_k, width_k] tensors of several sampling rounds, padding each to the widest."""
    width = max(t.shape[1] for t in tensors)
    return torch.cat([F.pad(t, (width - t.shape[1], 0) if left else (0, width - t.shape[1]), value=value)
                      for t in tensors])


# ---------------------------------------------------------------- when the sampler is not the trainer

class Sampler:
    """The weights that sample: the policy itself (by default), or a copy of it in another dtype (an
    inference engine's bfloat16), or with the weights of `lag` updates ago (an asynchronous pipeline).

    The copy follows the policy: `refresh()` after every update. With a lag k the copy holds the
    weights of k updates ago and `history` the k - 1 newer versions and the current one, in the
    copy's dtype (the copy casts them anyway): what a checkpoint holds (state_dict).
    """

    def __init__(self, policy, dtype: Optional[str] = None, lag: int = 0):
        self.policy, self.lag = policy, lag
        self.copy = None
        self.history = collections.deque()  # trained weights of the k updates after the copy's, oldest first
        if not sampler_differs(dtype, lag):
            return  # the sampler is the trainer
        self.copy = copy.deepcopy(policy).eval().requires_grad_(False)
        if dtype is not None:
            self.copy.to(getattr(torch, dtype))

    @staticmethod
    def bytes(policy, dtype: Optional[str], lag: int) -> tuple[float, float]:
        """The bytes of the copy and of its history that Sampler(policy, dtype, lag) holds (0, 0:
        none), counted before they are made (common/memory.py)."""
        if not sampler_differs(dtype, lag):
            return 0.0, 0.0
        size = getattr(torch, dtype or "float32").itemsize
        parameters = list(policy.parameters())
        return (sum(p.numel() for p in parameters) * size,
                lag * sum(p.numel() for p in parameters if p.requires_grad) * size)

    @property
    def model(self):
        return self.policy if self.copy is None else self.copy

    @contextlib.contextmanager
    def ready(self):
        """The model that samples, in eval mode; under --fsdp the policy, sharded, its forward passes
        in lockstep with the other processes' (common/processes.py)."""
        with in_lockstep(self.policy):  # nothing without --fsdp (which refuses a copy)
            self.model.eval()
            yield self.model

    def trained(self) -> dict:
        return {name: p.detach() for name, p in self.policy.named_parameters() if p.requires_grad}

    def refresh(self) -> None:
        """After an update: the copy takes the weights of `lag` updates ago (the new ones at lag 0)."""
        if self.copy is None:
            return
        if self.lag == 0:
            self._sample_with(self.trained())
            return
        if len(self.history) == self.lag:  # the oldest version is now lag updates old
            self._sample_with(self.history.popleft())
        dtype = next(self.copy.parameters()).dtype
        self.history.append({name: p.to(dtype, copy=True) for name, p in self.trained().items()})

    @torch.no_grad()
    def _sample_with(self, weights: dict) -> None:
        for name, p in self.copy.named_parameters():
            if name in weights:
                p.copy_(weights[name])  # cast to the copy's dtype

    def state_dict(self) -> dict:
        """With a lag: the copy's trained weights and the history (at lag 0 the policy's are the copy's)."""
        if self.lag == 0:
            return {}
        return {"copy": {name: p.detach().clone() for name, p in self.copy.named_parameters() if name in
                         self.trained()}, "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        """A resumed run's sampler: its saved weights, or (no lag) the policy's weights as restored."""
        if self.copy is None:
            return
        history = list(state.get("history", []))
        if history and "copy" not in state:  # written when the history held the copy's version first
            state = {"copy": history.pop(0)}
        self.history.clear()
        self.history.extend(history)
        self._sample_with(state.get("copy") or self.trained())
def sampler_differs(dtype: Optional[str], lag: int) -> bool:
    """Whether the weights that sample are not π_θold's: another dtype than float32 (the trainer's
    own, under a GPU's autocast too), or the weights of an earlier update."""
    return dtype not in (None, "float32") or lag > 0


Correction = Literal["none", "token-tis", "token-reject", "token-icepop", "sequence-geo-reject", "sequence-mis"]
# Left unset, by the kind of mismatch (common/EQUATIONS.md (124)-(128); common/results/lab.md, the sampler is
# not π_θold). Weights k updates old: μ itself as π_old (--old-logprobs sampler), which learned best at lags 1
# and 4 and keeps every response; rescored (--old-logprobs trainer), the geometric-mean rejection, the best
# correction 4 updates stale. A copy of the current weights in another dtype: token-level TIS, the fix the
# literature on bfloat16 samplers uses (Yao et al. 2025; in the lab every correction is within noise there).
CORRECTION = {"dtype": "token-tis", "lag": "sequence-geo-reject"}
CAPS = {"sequence-geo-reject": 1.03, "sequence-mis": 3.0}  # C by mode; 2 for the others


def resolve_correction(args) -> list[str]:
    """--old-logprobs, --correction and its cap left unset, by the kind of mismatch (see CORRECTION):
    nothing when the sampler is the trainer."""
    lines, differs = [], sampler_differs(args.sampler_dtype, args.sampler_lag)
    kind = "lag" if args.sampler_lag > 0 else "dtype"
    why = f"weights {args.sampler_lag} updates old" if kind == "lag" else f"a {args.sampler_dtype} copy"
    if args.old_logprobs is None:  # a typed --correction needs π_θold rescored
        args.old_logprobs = "sampler" if kind == "lag" and args.correction is None else "trainer"
        if kind == "lag":
            lines.append(f"--old-logprobs {args.old_logprobs}  (the sampler is not the trainer: {why})")
    if args.correction is None:
        args.correction = CORRECTION[kind] if differs and args.old_logprobs == "trainer" else "none"
        if differs:
            lines.append(f"--correction {args.correction}  (the sampler is not the trainer: {why})")
    if args.correction_cap is None and args.correction != "none":
        args.correction_cap = CAPS.get(args.correction, 2.0)
    return lines


def correct(rollout, sampler_logprobs: Tensor, correction: str, cap: float):
    """The update's rollout for a sampler μ that is not π_θold, and the figures to log.

    ρ_t = π_θold(y_t) / μ(y_t) per token (eq. 124). token-tis: each token's term weighed by
    min(ρ_t, C) (truncated importance sampling, eq. 125); token-reject: tokens with ρ_t outside
    [1/C, C] leave the loss, token-icepop: and the kept ones are weighed by ρ_t (eq. 126);
    sequence-geo-reject: responses whose geometric mean of ρ is outside [1/C, C] leave it;
    sequence-mis: responses whose product Π ρ is above C leave it, the kept ones weighed by it
    (eq. 127). The figures are over the tokens of responses with signal (Â ≠ 0), as the update's
    clip fraction is.
    """
    if correction == "none":  # μ is π_θold, or taken as it
        return rollout, {}
    mask = rollout.mask
    log_rho = (rollout.old_logprobs - sampler_logprobs).clamp(-20.0, 20.0) * (mask > 0)  # [N, T]
    bound = math.log(cap)
    weights, kept = None, mask
    if correction == "token-tis":
        weights = log_rho.exp().clamp(max=cap)
    elif correction in ("token-reject", "token-icepop"):
        kept = mask * (log_rho.abs() <= bound)
        weights = log_rho.exp() if correction == "token-icepop" else None
    elif correction == "sequence-geo-reject":
        geometric = log_rho.sum(dim=1) / (mask > 0).sum(dim=1).clamp(min=1)  # mean log ρ of each response
        kept = mask * (geometric.abs() <= bound).unsqueeze(1)
    elif correction == "sequence-mis":
        product = log_rho.sum(dim=1, keepdim=True)  # log Π ρ of each response: [N, 1]
        kept = mask * (product <= bound)
        weights = product.clamp(max=bound).exp().expand_as(mask)  # every token its response's Π ρ
    rollout = rollout._replace(mask=kept, weights=weights)
    signal = (mask > 0) & (rollout.advantages != 0).unsqueeze(1)  # [N, T]
    tokens = signal.sum().item()
    if global_max(tokens) == 0:
        return rollout, {}
    rho = log_rho.exp()[signal]  # the ratios of the tokens with signal, on this process
    responses = signal.any(dim=1)
    dropped = responses & ~(kept * signal > 0).any(dim=1)  # every token of the response left out
    return rollout, {
        "charts/is_ratio_mean": global_fraction(rho.sum().item(), tokens),
        "charts/is_ratio_min": -global_max(-rho.min().item() if tokens else -math.inf),
        "charts/is_ratio_max": global_max(rho.max().item() if tokens else 0.0),
        "charts/is_truncated_fraction": global_fraction((rho > cap).sum().item(), tokens),
        "charts/is_masked_fraction": global_fraction(((kept == 0) & signal).sum().item(), tokens),
        "charts/is_masked_response_fraction": global_fraction(dropped.sum().item(), responses.sum().item()),
    }
