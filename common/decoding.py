"""The decoding steps: what the group files' `sample` runs after the prefill, a token of every
response a step.

`Decoder` reads the prompts once (common/sampling.py: read_prompts) into a static cache; each
`step` then runs the model on the last token of every response and draws the next with the group
file's draw (sample_token: it defines π_θold). Eager: the model as it is. Compiled
(--compile-decoding, the GPU's default for long responses), the way gpt-fast decodes, with torch
alone:
- the weights and the cache in the dtype the step computes in (`decoding_model`, `decoding_cache`);
- attention that reads grouped key/value heads in place (`grouped_attention`);
- the forward and the draw in one compiled step (`decoding_step`; CUDA graphs on a GPU);
- the host asked every few tokens whether every response has ended.
The figures, and where the step's time goes: common/results/gpu.md.
"""

import contextlib
import copy
import functools
import math
import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from common.sampling import read_prompts

COMPILE_FROM_TOKENS = 128  # a GPU compiles the steps for responses this long: it repays the compile
COMPILED_COLUMNS = 64  # a compiled step's cache width is a multiple of it: few shapes, few compiles
CHECK_EVERY = 8  # compiled, the host asks whether every response has ended once in this many tokens
GROUPED_ATTENTION = "grouped_decoding"  # grouped_attention's name among transformers' attentions
OUTPUT_LAYER = "float32"  # the compiled steps' output layer: float32 (as the trainer's), tf32, bfloat16


def resolve_compiling(args, gpu: bool) -> list[str]:
    """--compile-decoding left unset: on a GPU (not under --fsdp) for responses of at least
    COMPILE_FROM_TOKENS, where a shape's compile (29-38 s on an H200) repays itself within a few iterations.
    A CPU decodes eagerly: its float32 products are the cost, not the launches. The console's line
    on a GPU."""
    if args.compile_decoding is not None:
        return []
    args.compile_decoding = gpu and not args.fsdp and args.max_new_tokens >= COMPILE_FROM_TOKENS
    why = (f"responses of up to {args.max_new_tokens} tokens" if args.compile_decoding else
           "--fsdp" if args.fsdp else f"responses under {COMPILE_FROM_TOKENS} tokens")
    flag = f"--{'' if args.compile_decoding else 'no-'}compile-decoding"
    return [f"{flag}  (a GPU, {why}: common/GUIDE.md)"] if gpu else []


class Decoder:
    """Sampling after its prefill: `step` runs the model on each response's last token (its keys and
    values written into the cache) and draws the next token with `draw`.

    Eager: the model itself, one step after the other, the host asking at every token whether every
    response has ended. Compiled:
    - the weights in the dtype the step computes in (decoding_model): under bfloat16 autocast the
      linear layers' weights in bfloat16, cast once per sampling where autocast casts every step;
    - the static cache in that dtype too, allocated once per shape and reused: CUDA graphs read
      fixed addresses;
    - attention that reads the grouped key/value heads in place (grouped_attention);
    - the forward and the draw in one compiled step (CUDA graphs on a GPU: one launch a token);
    - the host asks every CHECK_EVERY tokens whether every response has ended, so that a GPU never
      waits for it; the steps taken past that point are dropped (`steps` counts those kept).
    """

    def __init__(self, model, prompt_ids: Tensor, prompt_mask: Tensor, repeats: int,
                 new_tokens: int, draw, compiled: bool = False):
        self.draw, self.compiled, self.new_tokens = draw, compiled, new_tokens
        # a 16-bit copy (--sampler-dtype) computes in its own dtype, whatever autocast the caller runs
        self.autocast = own_dtype_autocast(model, prompt_ids.device.type)
        with self.autocast:
            self.model = decoding_model(model) if compiled else model
            output, attention_mask, _ = read_prompts(self.model, prompt_ids, prompt_mask)
            dtype = autocast_dtype(prompt_ids.device.type)
        self.prefilled = attention_mask.shape[1]  # the prompts' columns: step s fills prefilled + s
        columns = self.prefilled + new_tokens
        if compiled:
            columns = math.ceil(columns / COMPILED_COLUMNS) * COMPILED_COLUMNS
        self.cache = decoding_cache(self.model, output.past_key_values, repeats, columns, dtype,
                                    reuse=compiled)
        self.logits = output.logits[:, -1].float().repeat_interleave(repeats, dim=0)  # 1st token's
        # [B * repeats, the cache's columns]: 1 on the prompts' tokens, 0 where the steps write
        attention_mask = F.pad(attention_mask, (0, columns - self.prefilled), value=0)
        self.attention_mask = attention_mask.repeat_interleave(repeats, dim=0)
        self.next_position = self.attention_mask.sum(dim=1, keepdim=True)  # [N, 1]
        self.forward = compiled_step(prompt_ids.is_cuda) if compiled else decoding_step
        self.steps, self.pending = 0, []  # tokens drawn; whether all had ended, not yet asked

    def step(self, previous: Optional[Tensor], greedy: Tensor, u: Tensor, temperature: float):
        """The next token of every response, its log-probability and the entropy it was drawn
        from: from the prefill's logits first, then from the model run on `previous`, the tokens
        of the step before."""
        column, self.steps = self.steps, self.steps + 1
        if previous is None:
            return self.draw(self.logits / temperature, greedy, u)
        self.attention_mask[:, self.prefilled + column - 1] = 1
        arguments = (self.model, self.draw, previous, greedy, u, temperature, self.attention_mask,
                     self.next_position + column - 1, self.cache)
        if not self.compiled:
            with self.autocast:
                return self.forward(*arguments)
        torch.compiler.cudagraph_mark_step_begin()  # a graph's outputs live until its next replay
        with self.autocast, output_layer_precision(OUTPUT_LAYER):
            return tuple(value.clone() for value in self.forward(*arguments))

    def asks(self) -> bool:
        """Whether `finished` reads the device at this step: then the caller reads the tokens too
        (a base model's stop string: common/sampling.py, holds_stop). At the last step it need not:
        sampling ends, and the answers' stop strings are found after (stop_mask)."""
        return not self.compiled or len(self.pending) + 1 >= CHECK_EVERY

    def finished(self, ended: Tensor) -> bool:
        """Whether every response has ended ([N] `ended` after this step): asked of the device at
        every step (eager), or at every CHECK_EVERY-th and the last (compiled); `steps` then counts
        the steps up to the one at which they all had."""
        self.pending.append(ended.all())
        if len(self.pending) < (CHECK_EVERY if self.compiled else 1) and self.steps < self.new_tokens:
            return False
        done = torch.stack(self.pending).tolist()  # the host reads the device: the one wait for it
        self.pending.clear()
        if True in done:
            self.steps -= len(done) - 1 - done.index(True)  # the steps after every response ended
        return True in done


def decoding_step(model, draw, previous: Tensor, greedy: Tensor, u: Tensor, temperature: float,
                  attention_mask: Tensor, position_ids: Tensor, cache):
    """One step: the model reads the last token of every response and writes its keys and values
    into the cache; the next token is drawn from its logits (float32) at the temperature."""
    logits = model(input_ids=previous.unsqueeze(1), attention_mask=attention_mask,
                   position_ids=position_ids, past_key_values=cache, use_cache=True).logits
    return draw(logits[:, -1].float() / temperature, greedy, u)


@functools.cache
def compiled_step(cuda: bool):
    """decoding_step compiled (CUDA graphs on a GPU), at its first call and again for each new
    number of responses or cache width.

    The draw's cumulative sum runs torch's own kernel inside the graph: over a vocabulary this long
    inductor splits a scan across blocks, then fails to fuse it with the draw's reductions (torch
    2.11 on an H200: "NYI TritonSplitDimKernel reductions"). warn=False: with CI set in the
    environment, inductor otherwise refuses a fallback for an op it could decompose."""
    from torch._inductor.lowering import make_fallback

    make_fallback(torch.ops.aten.cumsum, warn=False)
    return torch.compile(decoding_step, mode="reduce-overhead" if cuda else None, dynamic=False)


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype autocast computes in on this device, or None when it is off."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def own_dtype_autocast(model, device_type: str):
    """Autocast in the model's own dtype where its weights are 16-bit floats and autocast runs in
    another: a float16 sampler copy under a GPU's bfloat16 computes in float16, as an engine of
    that dtype does (norms and softmax still in float32); else nothing changes."""
    dtype = next((p.dtype for p in model.parameters()), None)
    if dtype in (torch.float16, torch.bfloat16) and autocast_dtype(device_type) not in (None, dtype):
        return torch.autocast(device_type, dtype=dtype)
    return contextlib.nullcontext()


def cast_weights(model) -> list[torch.nn.Parameter]:
    """The weights the compiled steps keep a copy of under autocast, 2 bytes each (common/policy.py
    counts them): every float32 weight of a linear layer, the output layer's with OUTPUT_LAYER
    bfloat16."""
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers

    head = model.get_output_embeddings()
    linear = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, Conv1D))
              and (m is not head or OUTPUT_LAYER == "bfloat16")]
    return list({id(m.weight): m.weight for m in linear if m.weight.dtype == torch.float32}.values())


_decoding_models = weakref.WeakKeyDictionary()  # model -> (its decoding model, [(weight, cast)])


@torch.no_grad()
def decoding_model(model):
    """`model` as the compiled steps run it: its modules and parameters, but its attention
    grouped_attention and, under autocast, cast_weights in the autocast dtype, cast here once per
    sampling where autocast casts them at every step (the same products). Made at the first call;
    its casts follow the weights at every call."""
    if model not in _decoding_models:
        dtype = autocast_dtype(next(model.parameters()).device.type)
        head = model.get_output_embeddings()
        casts = {id(p): torch.nn.Parameter(p.to(dtype), requires_grad=False)
                 for p in (cast_weights(model) if dtype is not None else [])}
        # every other parameter shared; a tied input embedding stays float32
        shared = {id(p): p for p in model.parameters() if id(p) not in casts or p is head.weight}
        decoding = copy.deepcopy(model, memo={**casts, **shared})
        if id(head.weight) in casts:  # OUTPUT_LAYER bfloat16: a plain linear layer, cast
            decoding.get_output_embeddings().__class__ = torch.nn.Linear
            decoding.get_output_embeddings().weight = casts[id(head.weight)]
        register_grouped_attention()
        decoding.config._attn_implementation = GROUPED_ATTENTION
        weights = {id(p): p for p in model.parameters()}
        _decoding_models[model] = decoding, [(weights[key], cast) for key, cast in casts.items()]
    decoding, pairs = _decoding_models[model]
    for weight, cast in pairs:  # the weights as they are now
        cast.copy_(weight)
    return decoding.eval()


def grouped_attention(module, query: Tensor, key: Tensor, value: Tensor,
                      attention_mask: Optional[Tensor], scaling: Optional[float] = None,
                      dropout: float = 0.0, **kwargs):
    """Attention of one new token per row that reads grouped key/value heads (GQA) in place: the g
    query heads of each key/value head become g rows of one query, [B, H, 1, d] -> [B, H_kv, g, d].
    Transformers' SDPA attention, compiled, copies the keys and values to every query head
    (repeat_kv: 7 times the cache's bytes a step for Qwen2.5-0.5B). Other shapes go to it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, tokens, dim = query.shape
    groups = heads // key.shape[1]
    if tokens != 1 or groups == 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    grouped = query.reshape(batch, key.shape[1], groups, dim)  # head k g + j reads key/value head k
    out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None  # [B, 1, H, d]


@functools.cache
def register_grouped_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GROUPED_ATTENTION, grouped_attention)
    AttentionMaskInterface.register(GROUPED_ATTENTION, sdpa_mask)  # the mask SDPA reads


_caches = weakref.WeakKeyDictionary()  # decoding model -> {(rows, columns): its static cache}


def decoding_cache(model, prefill_cache, repeats: int, columns: int,
                   dtype: Optional[torch.dtype] = None, reuse: bool = False):
    """The prefill's keys and values, each row `repeats` times, in a cache of `columns` columns
    allocated once (transformers' StaticCache): a step writes its keys and values in place, where a
    growing cache (DynamicCache) copies itself whole at every step. With `reuse`: the cache of the
    last sampling of this shape, emptied, at the addresses a CUDA graph was recorded with.

    `dtype`: the step's (autocast's), or None: the prefill's. Under autocast it is what attention
    reads (SDPA casts to it), so bfloat16 keys and values hold what a float32 cache would give
    attention; each layer casts what a step writes to it.
    """
    from transformers import StaticCache

    rows = sum(len(layer.keys) for layer in prefill_cache.layers[:1]) * repeats
    caches = _caches.setdefault(model, {}) if reuse else {}
    cache = caches.get((rows, columns))
    if cache is None:
        cache = caches[rows, columns] = StaticCache(config=model.config, max_cache_len=columns)
        for layer in cache.layers if dtype is not None else []:
            layer.update = casting_update(layer.update, dtype)
    else:
        cache.reset()
    for layer, filled in zip(cache.layers, prefill_cache.layers):
        layer.update(filled.keys.repeat_interleave(repeats, dim=0),
                     filled.values.repeat_interleave(repeats, dim=0))
    return cache


def casting_update(update, dtype: torch.dtype):
    """A static cache layer's update that first casts the keys and values to `dtype`."""
    def cast_and_update(keys: Tensor, values: Tensor, *args, **kwargs):
        return update(keys.to(dtype), values.to(dtype), *args, **kwargs)
    return cast_and_update


@contextlib.contextmanager
def output_layer_precision(output_layer: str):
    """TF32 for the float32 output layer's product with OUTPUT_LAYER tf32 (under autocast the only
    float32 product), IEEE float32 otherwise; with torch's older flag, which torch.compile reads."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = output_layer == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
