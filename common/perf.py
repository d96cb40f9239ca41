"""The perf line: each phase of an iteration against the machine's ceilings, on any device.

1. `work`: what one iteration computes, from its shapes: the tokens and attention pairs of its
   scoring passes, and the rows, columns and steps of its decoding.
2. `Roofline`: the model's FLOPs for scoring and the update (MFU: over the seconds and the peak) and
   the bytes a decoding step must move (over the seconds and a copy's bandwidth).
3. `machine_ceilings`: the peak and the bandwidth, measured once on the device.

common/runs.py logs them every iteration (perf/*) and prints the line at each evaluation.
"""

import functools
import time

import torch
from torch import Tensor

from common.sampling import shared_head


def work(prompt_ids: Tensor, prompt_mask: Tensor, responses: Tensor, passes: list[Tensor]) -> dict:
    """What one iteration computes, as its shapes run (padding included): the tokens its scoring
    passes read (per pass the head its prompts share once, each prompt's tail once, each response's
    tokens), the (query, key) pairs their attention multiplies and the tokens whose logits they
    compute; and sampling's decoding steps, their rows and the columns of their cache. `passes`:
    the responses of each scoring pass."""
    (P, T), H = (prompt_ids.shape[1], responses.shape[1]), shared_head(prompt_ids, prompt_mask)
    G = len(responses) // len(prompt_ids)
    n = sum(len(inds) for inds in passes)  # responses scored
    b = sum(len(torch.unique(torch.div(inds, G, rounding_mode="floor"))) for inds in passes)  # prompts
    # a token at position j attends to j + 1 keys: the head's, a tail's after the head, a response's
    pairs = len(passes) * H * (H + 1) + b * (P - H) * (P + H + 1) + n * T * (2 * P + T + 1)
    return {"perf/pass_tokens": len(passes) * H + b * (P - H) + n * T,
            "perf/pass_attention_pairs": pairs / 2,
            "perf/pass_logit_tokens": n * T,
            "perf/decoding_steps": T, "perf/decoding_rows": len(responses),
            "perf/decoding_columns": P + T}


class Roofline:
    """The model's work against the machine's ceilings (measured once, machine_ceilings):
    - scoring and the update: FLOPs of a forward pass, 2 per multiply-add: every weight matrix once a
      token, the output layer once a token with logits, attention's two products per (query, key)
      pair and layer. The update's backward costs twice the forward (6N a token, as usual; with LoRA
      once: no gradient of the frozen weights), recomputed activations not counted. MFU: the FLOPs
      over the seconds and the peak;
    - generation: the fewest bytes a decoding step moves (the weights, the whole static cache, the
      logits written and read), over the seconds and a copy's bandwidth.
    """

    def __init__(self, model, args, cuda: bool):
        from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers

        head = model.get_output_embeddings()
        self.blocks = sum(m.weight.numel() for m in model.modules()
                          if isinstance(m, (torch.nn.Linear, Conv1D)) and m is not head)
        self.head = head.weight.numel()
        text = model.config.get_text_config()
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        self.attention = text.num_hidden_layers * text.num_attention_heads * head_dim  # a pair's width
        kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        # a token's keys and values, in bfloat16 on a GPU
        self.kv_bytes = text.num_hidden_layers * 2 * kv_heads * head_dim * (2 if cuda else 4)
        self.vocab, self.cuda = text.vocab_size, cuda
        # π_θold scores unless the sampler's log-probs stand in (--old-logprobs sampler); π_ref too when β > 0
        self.scorers = (getattr(args, "old_logprobs", None) != "sampler") + ((getattr(args, "beta", 0) or 0) > 0)
        self.update_passes = args.update_epochs * (2 if args.lora_rank > 0 else 3)
        self.flops_peak, self.bytes_peak = machine_ceilings(next(model.parameters()).device)

    def figures(self, logged: dict) -> dict:
        """MFU of scoring and of the update, and generation's bytes per second and their share of a
        copy's, from `logged`'s work and seconds (perf/*)."""
        forward = 2 * (self.blocks * logged["perf/pass_tokens"]
                       + self.head * logged["perf/pass_logit_tokens"]
                       + 2 * self.attention * logged["perf/pass_attention_pairs"])
        cache = logged["perf/decoding_columns"] * self.kv_bytes
        step_bytes = (self.blocks * (2 if self.cuda else 4) + self.head * 4
                      + logged["perf/decoding_rows"] * (cache + 2 * self.vocab * 4))
        figures = {}
        for phase, flops in (("logprob", forward * self.scorers),
                             ("update", forward * self.update_passes)):
            if logged.get(f"perf/{phase}_seconds") and flops > 0:
                figures[f"perf/{phase}_mfu"] = flops / logged[f"perf/{phase}_seconds"] / self.flops_peak
        if logged.get("perf/generate_seconds"):
            bandwidth = step_bytes * logged["perf/decoding_steps"] / logged["perf/generate_seconds"]
            figures["perf/generate_bytes_per_second"] = bandwidth
            figures["perf/generate_bandwidth_share"] = bandwidth / self.bytes_peak
        return figures

    def line(self, logged: dict) -> str:
        """The perf line: the seconds of each phase, with what each achieves."""
        parts = []
        if "perf/generate_bytes_per_second" in logged:
            parts.append(f"generate {logged['perf/generate_seconds']:.3g} s "
                         f"({logged['perf/generate_bytes_per_second'] / 1e9:,.0f} GB/s, "
                         f"{logged['perf/generate_bandwidth_share']:.0%} of a copy's)")
        for phase, name in (("logprob", "log-probs"), ("update", "update")):
            if f"perf/{phase}_mfu" in logged:
                parts.append(f"{name} {logged[f'perf/{phase}_seconds']:.3g} s "
                             f"({100 * logged[f'perf/{phase}_mfu']:.2g}% MFU)")
        return "perf: " + ", ".join(parts)


@functools.cache
def machine_ceilings(device: torch.device) -> tuple[float, float]:
    """FLOP/s of a matrix product in the dtype the passes multiply in (bfloat16 on a GPU, float32 on
    a CPU), and bytes/s of a copy (read and written): the best of 5, on data past the caches."""
    cuda = device.type == "cuda"
    n, dtype = (4096, torch.bfloat16) if cuda else (512, torch.float32)
    generator = torch.Generator(device).manual_seed(0)  # its own: the run's random numbers stay its
    a, b = (torch.randn(n, n, device=device, dtype=dtype, generator=generator) for _ in range(2))
    source = torch.randn(2**26 if cuda else 2**23, device=device, generator=generator)  # 256, 32 MiB
    target = torch.empty_like(source)

    def best(run) -> float:
        seconds = []
        for _ in range(6):  # the first warms up
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            run()
            if cuda:
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        return min(seconds[1:])

    ceilings = 2 * n**3 / best(lambda: a @ b), 2 * source.numel() * 4 / best(lambda: target.copy_(source))
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)  # the run's peak is its own
    return ceilings
