"""Tiny, randomly initialised models of the architectures people run (GPT-2, Llama, Qwen2, Qwen3), saved as
Hugging Face folders with a BPE tokenizer trained on a few strings: the code path of `--model gpt2` or
`--model Qwen/Qwen3-0.6B` without a download. Used by the tests; not a test file itself.

What each one brings, as on the hub:
- gpt2: absolute positions (left padding needs position ids), dropout 0.1, no pad token, tied embeddings.
- llama: rotary positions, no pad token, untied embeddings, attention dropout (set to 0.1 here).
- qwen2: tied embeddings and pad = eos (a base model), grouped-query attention.
- qwen3: a chat template whose end-of-turn token <|im_end|> is in generation_config's EOS list next to
  the tokenizer's EOS <|endoftext|>, q/k norms.
- opt: learned positions with an offset of 2, a pad token of its own, tied embeddings.
- gpt_neox: rotary positions on a quarter of each head, parallel attention and MLP, untied embeddings.
"""

import os

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ARCHITECTURES = ["gpt2", "llama", "qwen2", "qwen3", "opt", "gpt_neox"]


def make_tokenizer(chat: bool, eos: str, pad: str | None):
    from tokenizers import Tokenizer, decoders, models, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [f"{a}+{b}={a + b}" for a in range(0, 200, 7) for b in range(0, 200, 11)]
    texts += ["user\nassistant\nsystem\n", "What is 12+30? Answer: 42\n"]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.decoder = decoders.Fuse()
    alphabet = sorted(set("".join(texts)))
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=64, special_tokens=["<unk>", *SPECIALS],
                                                       initial_alphabet=alphabet))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=eos, unk_token="<unk>", pad_token=pad)
    if chat:
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_model_folder(arch: str, folder, dropout: float = 0.1, seed: int = 0, vocab_size: int | None = None) -> str:
    """Save a random model of architecture `arch` with its tokenizer in `folder`; returns the folder. vocab_size:
    the tokenizer padded with tokens <t0>, <t1>, ... to a real model's vocabulary (a draw over 49,152 entries)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512)
    if arch == "gpt2":
        tokenizer = make_tokenizer(chat=False, eos="<|endoftext|>", pad=None)
        kwargs = dict(n_embd=32, n_layer=2, n_head=2, n_positions=512, resid_pdrop=dropout, embd_pdrop=dropout,
                      attn_pdrop=dropout)
    elif arch == "llama":
        tokenizer = make_tokenizer(chat=False, eos="</s>", pad=None)
        kwargs = dict(small, attention_dropout=dropout, tie_word_embeddings=False)
    elif arch == "qwen2":
        tokenizer = make_tokenizer(chat=False, eos="<|endoftext|>", pad="<|endoftext|>")
        kwargs = dict(small, attention_dropout=dropout, tie_word_embeddings=True)
    elif arch == "qwen3":
        tokenizer = make_tokenizer(chat=True, eos="<|endoftext|>", pad="<|endoftext|>")
        kwargs = dict(small, head_dim=8, attention_dropout=dropout, tie_word_embeddings=True)
    elif arch == "opt":
        tokenizer = make_tokenizer(chat=False, eos="</s>", pad="<unk>")
        kwargs = dict(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                      max_position_embeddings=512, word_embed_proj_dim=32, dropout=dropout, attention_dropout=dropout,
                      activation_dropout=dropout, pad_token_id=tokenizer.pad_token_id)
    elif arch == "gpt_neox":
        tokenizer = make_tokenizer(chat=False, eos="<|endoftext|>", pad=None)
        kwargs = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      max_position_embeddings=512, rotary_pct=0.25, attention_dropout=dropout, hidden_dropout=dropout)
    else:
        raise ValueError(arch)
    if vocab_size is not None:
        tokenizer.add_tokens([f"<t{i}>" for i in range(vocab_size - len(tokenizer))])
    eos_id = tokenizer.eos_token_id
    config = AutoConfig.for_model(arch, vocab_size=len(tokenizer), bos_token_id=eos_id, eos_token_id=eos_id, **kwargs)
    model = AutoModelForCausalLM.from_config(config)
    if arch == "qwen3":  # a chat model ends its turn with <|im_end|>: generation stops at either token
        model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids("<|im_end|>"), eos_id]
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return os.fspath(folder)
