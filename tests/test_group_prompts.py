"""Prompts that fit the model (the group files' format_prompts / answer_stop / stop_mask), and a short run of every
task on a random base model, a random chat model and, where it applies, the embedded model."""

import json
import os
import random
import types

import pytest
import torch

import grpo
from common import policy, sampling
from common.tasks import EVAL_SEED, TASKS, get_task
from conftest import ROOT
from hub_like_models import make_model_folder

EXAMPLE = os.path.join(ROOT, "common", "data", "example.jsonl")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompt_models")
    return {arch: make_model_folder(arch, root / arch) for arch in ("gpt2", "qwen3")}


def tokenizer_of(folder):
    tokenizer, _ = policy.load_policy(folder, torch.device("cpu"), path=folder)
    return tokenizer


def test_chat_model_gets_its_template_the_answer_format_and_the_system_prompt(folders):
    tokenizer = tokenizer_of(folders["qwen3"])
    task = TASKS["countdown"]
    (text,) = sampling.PromptFormat(tokenizer, task, 0, "Be brief.").texts(["Using the numbers 1, 2, 3, make 6"])
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        f"<|im_start|>user\nUsing the numbers 1, 2, 3, make 6\n{task.instruction}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert sampling.PromptFormat(tokenizer, task).texts(["q"]) == sampling.PromptFormat(tokenizer, task, 0).texts(["q"])
    assert sampling.PromptFormat(tokenizer, task, 3).stop is None  # a chat model ends its turn itself


def test_a_system_prompt_for_a_base_model_is_one_line(folders):
    """A base model has no turns: --system-prompt would be dropped without a word, so it is refused."""
    with pytest.raises(SystemExit) as e:
        sampling.PromptFormat(tokenizer_of(folders["gpt2"]), TASKS["addition"], 0, "Be brief.")
    assert str(e.value).startswith("error: --system-prompt needs a chat model") and "\n" not in str(e.value)
    assert sampling.PromptFormat(tokenizer_of(folders["gpt2"]), TASKS["addition"], 0, None).system_prompt is None


def test_chat_model_reads_its_examples_as_earlier_turns(folders):
    tokenizer = tokenizer_of(folders["qwen3"])
    task = TASKS["addition"]
    (text,) = sampling.PromptFormat(tokenizer, task, 2).texts(["12+30="])
    (first, first_answer), (second, second_answer) = task.examples(2, random.Random(EVAL_SEED))
    turn = "<|im_start|>user\n{}\n" + task.instruction + "<|im_end|>\n"
    assert text == (turn.format(first) + f"<|im_start|>assistant\n{first_answer}<|im_end|>\n"
                    + turn.format(second) + f"<|im_start|>assistant\n{second_answer}<|im_end|>\n"
                    + turn.format("12+30=") + "<|im_start|>assistant\n")
    assert "Question:" not in text


@pytest.mark.parametrize("arch", ["gpt2", "qwen3"])
def test_a_prompt_holds_one_bos_whether_the_tokenizer_or_the_chat_template_writes_it(arch, folders):
    """A tokenizer that adds <s> to what it encodes (as Llama's does): a base model's prompt starts with it; a chat
    template that writes it itself (as Llama 3's does) is not given a second one."""
    from tokenizers.processors import TemplateProcessing

    tokenizer = tokenizer_of(folders[arch])
    bos = tokenizer.convert_tokens_to_ids("<s>")
    tokenizer.bos_token = "<s>"
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    if tokenizer.chat_template:
        tokenizer.chat_template = "{{ bos_token }}" + tokenizer.chat_template
    prompt_format = sampling.PromptFormat(tokenizer, TASKS["addition"], 0)
    ids, mask = prompt_format.encode(["1+2=", "10+20="], "cpu")  # the prompts that sample
    prompts = [row[row_mask.bool()].tolist() for row, row_mask in zip(ids, mask)]
    prompts += prompt_format.token_ids(prompt_format.texts(["1+2="]))  # the lengths checked against the positions
    for prompt in prompts:
        assert prompt[0] == bos and prompt.count(bos) == 1


@pytest.mark.parametrize("task_name, stop", [("addition", "\n"), ("countdown", "\n"), (EXAMPLE, "\n\n")])
def test_base_model_gets_solved_training_examples_and_stops_where_the_answer_ends(folders, task_name, stop):
    tokenizer = tokenizer_of(folders["gpt2"])
    task = get_task(task_name)
    question, _ = task.prompts(1, random.Random(0), split="test")[0]
    (text,) = sampling.PromptFormat(tokenizer, task, 2).texts([question])
    blocks = text.split("\n\n")
    assert len(blocks) == 3 and blocks[-1] == f"Question: {question}\nAnswer:"
    for (shot_question, solution), block in zip(task.examples(2, random.Random(EVAL_SEED)), blocks):
        assert block == f"Question: {shot_question}\nAnswer: {solution}"
    assert sampling.PromptFormat(tokenizer, task, 2).stop == stop
    assert sampling.PromptFormat(tokenizer, task, 0).texts([question]) == [question]  # bare question
    assert sampling.PromptFormat(tokenizer, task, 0).stop is None
    # by default a base model gets the task's number of examples
    by_default = sampling.PromptFormat(tokenizer, task).texts([question])
    assert by_default == sampling.PromptFormat(tokenizer, task, task.default_few_shot).texts([question])


def base_model_format(tokenizer, stop: str):
    """A base model's prompt format whose answers end at `stop` (an addition with examples: "\n")."""
    prompt_format = sampling.PromptFormat(tokenizer, TASKS["addition"], 2)
    prompt_format.stop = stop
    return prompt_format


def test_generation_stops_a_row_once_its_answer_has_ended(folders):
    """A few-shot base model's row stops when its response holds the stop string (sample() asks after every new
    token); the prompt's own newlines do not count, since only the response is read."""
    tokenizer = tokenizer_of(folders["gpt2"])
    responses = [" 2\nQuestion: 7", " 2 and some more", " 3\n"]
    rows = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in responses]
    width = max(map(len, rows))
    rows = torch.tensor([r + [tokenizer.eos_token_id] * (width - len(r)) for r in rows])
    first_stop = [None] * 3
    for t in range(1, width + 1):
        flags = base_model_format(tokenizer, "\n").holds_stop(rows[:, :t]).tolist()
        first_stop = [step if step is not None else (t if flag else None) for step, flag in zip(first_stop, flags)]
    expected = [next((t for t in range(1, len(r) + 1) if "\n" in tokenizer.decode(r[:t])), None) for r in rows.tolist()]
    assert first_stop == expected and expected[0] is not None and expected[1] is None and expected[2] is not None


def test_stop_mask_ends_at_the_token_that_completes_the_stop_string(folders):
    tokenizer = tokenizer_of(folders["gpt2"])
    # the last two hold the stop string in their first token
    texts = [" 85\nQuestion: 1+2=", " 7\n\n12+30=42", "no newline here 12", "\n", "\n\n7 and more"]
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, rows))
    responses = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1.0] * len(r) + [0.0] * (width - len(r)) for r in rows])
    for stop in ("\n", "\n\n"):
        cut, stopped = base_model_format(tokenizer, stop).stop_mask(responses, mask)
        assert stopped.tolist() == [stop in text for text in texts]
        for row, text, length in zip(rows, texts, cut.sum(dim=1).long().tolist()):
            if stop in text:  # the shortest prefix that holds the stop string, by its definition
                assert stop in tokenizer.decode(row[:length]) and stop not in tokenizer.decode(row[: length - 1])
            else:
                assert length == len(row)  # nothing to cut
        assert (cut <= mask).all()


@pytest.mark.parametrize("task_name", ["addition", "countdown", EXAMPLE])
@pytest.mark.parametrize("arch", ["gpt2", "qwen3"])
def test_every_task_runs_on_a_base_and_a_chat_model(arch, task_name, folders, tmp_path, in_process):
    flags = ["--model", folders[arch], "--task", task_name, "--num-iterations", "2", "--prompts-per-iteration", "2",
             "--group-size", "2", "--num-minibatches", "1", "--max-new-tokens", "12", "--eval-size", "4",
             "--few-shot", "1"]
    out = in_process("grpo.py", flags)[1]
    assert "iteration    2/2" in out
    seen = out.split("the model reads (first held-out prompt): ")[1].splitlines()[0]
    assert ("Question:" in seen) == (arch == "gpt2") and ("<|im_start|>" in seen) == (arch == "qwen3")
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith(f"{get_task(task_name).name}__grpo__")  # a path's slashes stay out of the run name


def test_embedded_model_keeps_its_bare_prompts(tmp_path, in_process):
    out = in_process("grpo.py", ["--num-iterations", "1", "--prompts-per-iteration", "2", "--num-minibatches", "2",
                                 "--eval-size", "4"])[1]
    assert "the model reads (first held-out prompt): '" in out
    seen = out.split("the model reads (first held-out prompt): ")[1].splitlines()[0]
    assert seen.endswith("='") and "Question" not in seen


def test_bad_task_and_few_shot_give_one_clear_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1?", "answer": "2"}\nnot json\n')
    for fields, start in [(dict(task="poetry"), "error: --task must be one of"),
                          (dict(few_shot=-1), "error: --few-shot"),
                          (dict(task=str(bad)), f"error: {bad}, line 2"),
                          (dict(task="missing.jsonl"), "error: --task file not found"),
                          (dict(task=EXAMPLE, eval_task=str(bad)), f"error: {bad}, line 2"),
                          (dict(eval_task=EXAMPLE), "error: --eval-task needs --task to be a .jsonl file")]:
        with pytest.raises(SystemExit) as e:
            args = grpo.Args(**fields)
            policy.resolve_defaults(args, beta=grpo.BETA)  # as the main block does, before the checks
            grpo.check_args(args)
        assert str(e.value).startswith(start) and "\n" not in str(e.value), str(e.value)


def test_eval_task_file_is_the_held_out_set(tmp_path, in_process):
    # the embedded model trained on the example file, evaluated on a file of its own: the first held-out prompt
    # the run prints is one of that file's questions
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(f'{{"question": "{a}+{a}=", "answer": {2 * a}}}\n' for a in range(10, 40)))
    test.write_text('{"question": "9+9=", "answer": 18}\n')
    flags = ["--task", str(train), "--eval-task", str(test), "--num-iterations", "1", "--prompts-per-iteration", "2",
             "--num-minibatches", "1"]
    out = in_process("grpo.py", flags)[1]
    assert "the model reads (first held-out prompt): '9+9='" in out and "iteration    1/1" in out


def test_prompts_longer_than_the_model_positions_give_one_clear_line(folders, in_process):
    flags = ["--model", folders["gpt2"], "--task", "countdown", "--few-shot", "12", "--max-new-tokens", "64"]
    with pytest.raises(SystemExit) as e:
        in_process("grpo.py", flags)[1]
    message = str(e.value)
    assert message.startswith("error: the prompt of the question 'Using the numbers ") and " tokens long: with " \
        "--max-new-tokens 64 it exceeds the model's 512 positions; lower --few-shot" in message, message


def test_a_task_of_your_own_and_text_answers_train_end_to_end(tmp_path, in_process):
    """--task my_task.py (a reward of one's own) and a .jsonl file of text answers, on the embedded model."""
    (tmp_path / "my_task.py").write_text(
        "def prompts(n, rng, split='train'):\n"
        "    pairs = [(f'{a}+{a}=', str(2 * a)) for a in range(10, 50)]\n"
        "    return [rng.choice(pairs[:36] if split == 'train' else pairs[36:]) for _ in range(n)]\n"
        "def reward(response_text, target):\n"
        "    return float(response_text.strip() == target)\n")
    flags = ["--num-iterations", "2", "--prompts-per-iteration", "2", "--num-minibatches", "1", "--eval-size", "4"]
    out = in_process("grpo.py", ["--task", str(tmp_path / "my_task.py"), *flags])[1]
    assert "iteration    2/2" in out and "the model reads (first held-out prompt): '4" in out
    words = tmp_path / "words.jsonl"
    words.write_text("".join(f'{{"question": "{a}+{a}=", "answer": "twice {a}"}}\n' for a in range(10, 50)))
    out = in_process("grpo.py", ["--task", str(words), *flags])[1]
    assert "iteration    2/2" in out and "accuracy 0.000" in out  # digits are never the text "twice 12"


class ScriptedModel(torch.nn.Module):
    """A stand-in for a causal LM in `sample`, for one prompt: every row writes its scripted tokens (after a first
    token shared by the group, as the prefill gives one distribution per prompt), then `filler` (greedy decoding picks
    them). It keeps no keys and values: its cache is empty, and a one-layer config sizes the decoding cache."""

    def __init__(self, first: int, rows: list[list[int]], vocab: int, filler: int, eos: int):
        from transformers import GPT2Config

        super().__init__()
        self.first, self.rows, self.vocab, self.filler, self.step = first, rows, vocab, filler, 0
        self.generation_config = type("GenerationConfig", (), {"eos_token_id": eos})()
        self.config = GPT2Config(n_layer=1)

    def forward(self, input_ids, **kwargs):
        if len(input_ids) == 1:  # the prefill of the one prompt (its head, then its tail)
            chosen = [self.first]
        else:  # a decoding step of the group
            chosen = [row[self.step] if self.step < len(row) else self.filler for row in self.rows]
            self.step += 1
        logits = torch.nn.functional.one_hot(torch.tensor(chosen), self.vocab).float().unsqueeze(1)
        cache = type("Cache", (), {"batch_repeat_interleave": lambda self, n: None, "get_seq_length": lambda self: 0,
                                   "layers": []})()
        return type("Output", (), {"logits": logits, "past_key_values": cache})()


def test_an_answer_that_ends_at_its_stop_string_is_never_truncated(folders):
    """A base model's answers end at the few-shot stop string ("\\n"): decoding stops once every one has, so the longest
    answer's stop string sits in the last column. It ended: not truncated, wherever the column. One answer that
    never writes the stop string within the cap is."""
    tokenizer = tokenizer_of(folders["gpt2"])
    task = TASKS["addition"]
    answers = ["12\n", "1\n", "1234\n", "1444\n"]
    rows = [tokenizer(answer, add_special_tokens=False)["input_ids"] for answer in answers]
    cap = max(map(len, rows)) + 1  # the shared first token, then the longest answer fills the cap
    (space,) = tokenizer(" ", add_special_tokens=False)["input_ids"]
    (digit,) = tokenizer("7", add_special_tokens=False)["input_ids"]
    args = grpo.Args(few_shot=3, max_new_tokens=cap, temperature=1.0)
    model = ScriptedModel(space, rows, len(tokenizer), filler=digit, eos=tokenizer.eos_token_id)
    prompt_format = sampling.PromptFormat(tokenizer, task, 3, model=model)
    assert prompt_format.stop == "\n"
    samples = grpo.sample(model, prompt_format, ["1+2="], args, torch.device("cpu"), num_samples=4, greedy=True)
    texts = prompt_format.decode(samples.responses, samples.mask)
    assert texts == [" " + answer for answer in answers]
    assert samples.truncated.tolist() == [False] * 4
    never_ends = ScriptedModel(space, rows[:3] + [[digit] * cap], len(tokenizer), filler=digit,
                               eos=tokenizer.eos_token_id)
    samples = grpo.sample(never_ends, prompt_format, ["1+2="], args, torch.device("cpu"), num_samples=4, greedy=True)
    assert samples.truncated.tolist() == [False, False, False, True]


def test_every_training_prompt_is_checked_against_the_model_positions(tmp_path, in_process):
    """A .jsonl task with one training question too long for the embedded model's positions: one line naming it,
    before any training (the held-out questions alone were checked before)."""
    task_file = tmp_path / "long.jsonl"
    short = [{"question": f"{a}+{a}=", "answer": 2 * a} for a in range(1, 200)]
    long_question = next(q for q in (f"{'1+' * 40}{n}=" for n in range(100))
                         if get_task_split(q) == "train")
    task_file.write_text("\n".join(json.dumps(r) for r in short + [{"question": long_question, "answer": 1}]))
    with pytest.raises(SystemExit) as e:
        in_process("grpo", ["--task", str(task_file), "--num-iterations", "1"])
    assert str(e.value).startswith(f"error: the prompt of the question {long_question[:57] + '...'!r} is ")
    assert "exceeds the model's 64 positions" in str(e.value) and "\n" not in str(e.value)


def test_a_prompt_and_its_response_may_fill_the_positions_exactly(folders):
    """check_lengths: the longest prompt, training questions drawn from a generator too, against the positions;
    a response that fills them exactly fits, one token more is refused, naming the question (whole up to 60
    characters, else its first 57 and "...")."""
    tokenizer = tokenizer_of(folders["gpt2"])
    for question in ("1+" * 29 + "=", "1+" * 29 + "1=", "1+" * 29 + "12=", "1+" * 29 + "123="):  # 59 to 62 chars
        task = types.SimpleNamespace(name="long", prompts=lambda n, rng, q=question: [(q, "1")] * n)
        prompt_format = sampling.PromptFormat(tokenizer, task, few_shot=0)
        prompt_format.positions = 100
        length = len(tokenizer(question)["input_ids"])
        assert prompt_format.check_lengths(["1+1="], 100 - length) == length  # the held-out question is short
        with pytest.raises(SystemExit) as e:
            prompt_format.check_lengths(["1+1="], 101 - length)
        shown = question if len(question) <= 60 else question[:57] + "..."
        assert str(e.value).startswith(f"error: the prompt of the question {shown!r} is {length} tokens long")


def get_task_split(question: str) -> str:
    from common.tasks.splits import TEST_FRACTION, hash_unit

    return "test" if hash_unit(question) < TEST_FRACTION else "train"


def test_dapo_overlong_buffer_default_follows_a_typed_cap(in_process):
    """DAPO's L_cache default follows --max-new-tokens: a small cap is not refused for a flag the user never set."""
    _, out = in_process("dapo", ["--max-new-tokens", "3", "--num-iterations", "1", "--prompts-per-iteration", "2",
                                 "--group-size", "2", "--num-minibatches", "1", "--eval-size", "4"])
    assert "default --overlong-buffer 1  (DAPO's L_cache: a fifth of the cap; 3/8 of it for the embedded models)" in out
    refused = r"^error: --overlong-buffer must be in \[0, max-new-tokens\) = \[0, 3\), got 3"  # typed: refused
    with pytest.raises(SystemExit, match=refused):
        in_process("dapo", ["--max-new-tokens", "3", "--overlong-buffer", "3"])
