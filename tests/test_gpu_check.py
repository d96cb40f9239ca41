"""The GPU check's dry run (common/tools/gpu_check.py): tiny shapes on the CPU, so that the tool a lent GPU runs
once, without a second try, works before a GPU is there. The steps run here in the test's process (the
tool runs each in its own); the tool's own orchestration runs its cheapest step."""

import os
import re
import subprocess
import sys

import pytest
import torch

from common.tools import gpu_check
from common.tools.scale import build_model, scalars
from conftest import ROOT

SHAPES = gpu_check.SHAPES["dry"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    built = {}
    for name in (SHAPES["model"], SHAPES["card"]):
        built[name] = str(tmp_path_factory.mktemp("models") / name)
        build_model(name, built[name])
    gpu_check.make_peaky(built[SHAPES["model"]])
    return built


@pytest.fixture
def options(tmp_path):
    return gpu_check.parse_args(["--dry-run", "--work", str(tmp_path), "--profiles", str(tmp_path)])


def rows(table: list[str]) -> list[list[str]]:
    """The cells of a markdown table's body rows."""
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table if line.startswith("| ")][1:]


def test_the_peaky_model_has_a_trained_models_entropy(folders):
    """make_peaky scales the final norm until the next token's entropy is SmolLM2's (0.7 nats), where the random
    model's is near the uniform's (log of the vocabulary)."""
    from common import policy, sampling
    from common.tasks import get_task

    tokenizer, model = policy.load_policy("peaky", torch.device("cpu"), path=folders[SHAPES["model"]])
    ids, mask = sampling.PromptFormat(tokenizer, get_task("addition"), 0, model=model).encode(["1+2=", "40+3="], "cpu")
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=1).logits[:, -1]
    entropy = torch.special.entr(torch.softmax(logits, dim=-1)).sum(dim=-1).mean()
    assert 0.3 < float(entropy) < 1.2


def test_numerics_of_the_recipe_against_float32_for_every_file(folders, options):
    """Under bfloat16 autocast with the float32 output layer: the first step's ratio is 1 exactly in every file,
    the sampler gap is bfloat16's rounding (small, not 0), the step close to float32's."""
    table = rows(gpu_check.step_numerics(SHAPES, folders, options))
    assert [row[0] for row in table] == [f"{name}.py" for name in gpu_check.MODULES]
    for name, log_ratio, gap_mean, gap_max, relative in table:
        assert float(log_ratio) == 0.0, name
        assert 0 < float(gap_mean) <= float(gap_max) < 1, name
        assert 0 < float(relative) < 0.2, name


def test_the_generation_step_sets_compiled_decoding_beside_eager(folders, options, monkeypatch, tmp_path):
    """Eager, then compiled, with the file's draw and with blocked_draw, then --before's code (the card's first call
    runs it on card_prep's commit, whose common/ this file's helpers must still read): the compiled responses are
    eager's (float32 on the CPU), each with its figures and the top of its profile, the profiles' tables written
    beside the report."""
    import grpo

    from common import decoding
    from common.tools import card_prep

    card_prep.check_out_before(str(tmp_path / "before"))
    options.before, options.folders = str(tmp_path / "before"), ";".join(f"{k}={v}" for k, v in folders.items())
    # The draw each compiled sampling is given, counted outside the compiled step: a count inside it would be
    # traced, and the step recompiled at every call.
    drawn, own_init = [], decoding.Decoder.__init__

    def init(self, *args, **kwargs):
        if kwargs["compiled"]:
            drawn.append(kwargs["draw"])
        own_init(self, *args, **kwargs)

    monkeypatch.setattr(decoding.Decoder, "__init__", init)
    table = rows(gpu_check.step_generation(SHAPES, folders, options))
    assert drawn.count(gpu_check.blocked_draw) >= 5 and drawn.count(grpo.sample_token) >= 5  # 1st, 3 timed, profile
    eager, compiled, compiled_top, blocked, blocked_top, older, older_top = table
    assert eager[0] == "sample, eager" and float(eager[1]) > 0 and float(eager[6]) < 1e-4
    assert compiled[0] == "sample, compiled, float32 output layer" and compiled[5] == "100%"
    assert compiled[4].endswith(" s") and float(compiled[6]) < 1e-4
    # the candidate draw inside the compiled step: eager's tokens too (the same draw), and the file's own draw back
    assert blocked[0] == "sample, compiled, float32 output layer, blocked_draw" and blocked[5] == "100%"
    assert grpo.sample_token.__module__ == "grpo"
    assert older[0] == "sample, eager (--before's code)" and older[5] == "100%"  # its compile: the card's alone
    assert all(top[0].startswith("↳ top kernels:") for top in (compiled_top, blocked_top, older_top))
    for name in ("profile_float32.txt", "profile_float32_blocked_draw.txt", "profile_before.txt"):
        assert os.path.isfile(os.path.join(options.profiles, name))


def test_the_draw_step_sets_the_blocked_candidate_beside_sample_token(options):
    """Both draws compiled on one step's peaked logits: the candidate draws sample_token's tokens and neither draws a
    token of probability 0, a sixth of the vocabulary masked."""
    table = rows(gpu_check.step_draw(SHAPES, {}, options))
    assert [row[0] for row in table] == ["sample_token (torch's scan)", "blocked_draw"]
    for _, milliseconds, alike, zero in table:
        assert float(milliseconds) > 0 and alike == "100.00%" and zero == "0"


@pytest.mark.parametrize("vocab", [5000, 4096])  # the last block padded, or whole
def test_the_blocked_draw_is_sample_tokens_draw_and_never_of_probability_0(vocab):
    """blocked_draw (the draw step's candidate) draws the token sample_token draws for the same uniform, with its
    log-probability and entropy, and no token of probability 0: masked leading blocks, a block's masked last tokens,
    masked first tokens, u = 0 and u just under 1 (where the two sums may part by a rounding: any token of π > 0)."""
    import grpo

    generator = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(24, vocab, generator=generator)
    logits[:8, : 3 * 1024] = -float("inf")  # the first three blocks
    logits[8:16, 1000:1024] = logits[8:16, :3] = -float("inf")  # a block's last tokens, the first tokens
    logits[16:, :] = -float("inf")  # a few tokens of probability > 0, far apart
    logits[16:, [5, 2047, vocab - 1]] = torch.tensor([0.0, 1.0, 2.0])
    greedy = torch.zeros(24, dtype=torch.bool)
    greedy[-1] = True
    pi = torch.softmax(logits, dim=-1)
    for k in range(12):
        u = torch.rand(24, 1, generator=generator, dtype=torch.float64)
        token, logprob, entropy = gpu_check.blocked_draw(logits, greedy, u)
        expected = grpo.sample_token(logits, greedy, u)
        assert torch.equal(token, expected[0]), k
        torch.testing.assert_close((logprob, entropy), expected[1:], rtol=0, atol=0)
    one = torch.ones((), dtype=torch.float64)
    for u in (0 * one, torch.nextafter(one, 0 * one)):
        token = gpu_check.blocked_draw(logits, greedy, u.expand(24, 1))[0]
        assert (pi.gather(1, token.unsqueeze(1)) > 0).all()
    ends = gpu_check.blocked_draw(logits, torch.zeros_like(greedy), torch.tensor([[0.0], [1.0]]).double().repeat(12, 1))
    assert ends[0][16:].tolist() == [5, vocab - 1] * 4  # the first and the last token of π > 0


def test_the_runs_report_their_figures(folders, options, in_process, monkeypatch):
    """The embedded step runs grpo.py in a process of its own (run_script), as every run step does on the card; the
    scale and card steps read their runs alike, so here their scripts run in this process."""
    (embedded, cpu) = rows(gpu_check.step_embedded(SHAPES, folders, options))
    assert embedded[1] == "1" and float(embedded[2]) > 0 and 0 <= float(embedded[3].split()[0]) <= 1

    def run_here(script, flags, timeout):
        run_dir, console = in_process(script, flags, subdir=f"{script}_{len(flags)}")
        return console, scalars(str(run_dir))

    monkeypatch.setattr(gpu_check, "run_script", run_here)
    ((model, seconds, size, estimated, _, *phases),) = rows(gpu_check.step_scale(SHAPES, folders, options))
    assert model.startswith(SHAPES["scale"][0]) and int(size) >= 1 and estimated.endswith("(passes only)")
    assert float(seconds) > 0 and all(value.endswith("%") or float(value) >= 0 for value in phases)
    ((card, *_),) = rows(gpu_check.step_card(SHAPES, folders, options))
    assert card == f"gspo.py --model {SHAPES['card']} --group-size 8"
    compiled, generate = rows(gpu_check.step_hf(SHAPES, folders, options))
    assert generate[0] == "generate" and float(generate[1]) > 0 and compiled[1] == "not in the dry run"


def test_the_refusals_are_one_line_each(folders, options):
    lines = gpu_check.step_refusals(SHAPES, folders, options)
    assert len(lines) == 5 and all(": error: " in line and "\n" not in line for line in lines)
    assert "--micro-batch-size must be >= 1 and divide the minibatch" in lines[0]
    # 7.6B and 14.8B parameters at 16 bytes each (float32 weights, gradients, Adam's two moments); compiled
    # decoding's copy adds 2 bytes for each of the 6.5B weights of 7B's linear layers but the output layer (12.1
    # GiB), a bfloat16 sampler's copy 2 bytes for every weight: 18 / 16 of 113.5 GiB
    assert "no compiled decoding: error: the training state (113.5 GiB) leaves less than a pass" in lines[1]
    assert ", compiled decoding: error: the training state (125.6 GiB)" in lines[2]
    assert "decode eagerly (--no-compile-decoding" in lines[2] and "--no-compile-decoding" not in lines[1]
    assert "--sampler-dtype bfloat16: error: the training state (127.7 GiB)" in lines[3]
    assert "sample with the policy itself (no --sampler-dtype, --sampler-lag 0)" in lines[3]
    assert "the training state (244.7 GiB) leaves less than a pass of one response" in lines[4]


def test_the_tool_runs_each_step_in_a_process_and_writes_the_tables(tmp_path):
    out = tmp_path / "gpu.md"
    result = subprocess.run([sys.executable, "-m", "common.tools.gpu_check", "--dry-run", "--steps", "machine",
                             "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    report = out.read_text()
    assert report.startswith("# The GPU check (dry run: tiny shapes on the CPU)")
    assert "## machine" in report and "| 2." in report and "failed" not in report
    # the step's own seconds (a process that imports torch: at least one), not the moment it began
    assert int(re.search(r"## machine \((\d+) s\)", report).group(1)) >= 1


def test_without_a_gpu_the_check_says_so_in_one_line(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["gpu_check"])
    with pytest.raises(SystemExit) as e:
        gpu_check.main()
    assert str(e.value) == ("error: no GPU here; `python -m common.tools.gpu_check --dry-run` runs tiny shapes on "
                            "the CPU")


def test_a_missing_requirement_is_named_before_any_step(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tyro" else find_spec(name, *a))
    monkeypatch.setattr(sys, "argv", ["gpu_check"])
    with pytest.raises(SystemExit) as e:
        gpu_check.main()
    assert str(e.value) == "error: tyro not installed: pip install -r requirements.txt first"


@pytest.mark.parametrize("limit", ["generation", "nosuch=3", "scale=-1", "scale=ten"])
def test_a_bad_step_limit_is_one_line(limit):
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--dry-run", "--limits", limit])
    assert str(e.value).startswith("error: --limits takes STEP=SECONDS") and limit in str(e.value)


def test_a_step_that_fails_or_runs_out_of_time_keeps_the_rows_it_said():
    """A step's process that said rows (say) and then failed, or ran past its limit, leaves those rows and one line
    on what happened: a compile failing after eager's row must not lose that row."""
    said = "print('@@ | eager | 8.1 |', flush=True); "
    failing = [sys.executable, "-c", said + "raise SystemExit('error: the compile failed')"]
    assert gpu_check.step_table(failing, 60) == ["| eager | 8.1 |", "failed: error: the compile failed"]
    slow = [sys.executable, "-c", said + "import time; time.sleep(30)"]
    assert gpu_check.step_table(slow, 2) == ["| eager | 8.1 |", "(ran out of its 2 s)"]
    done = [sys.executable, "-c", said + "print('@@table\\n| eager | 8.1 |\\n| compiled | 2.9 |')"]
    assert gpu_check.step_table(done, 60) == ["| eager | 8.1 |", "| compiled | 2.9 |"]


def test_the_guide_says_what_the_steps_limits_add_up_to():
    with open(os.path.join(ROOT, "common", "GUIDE.md")) as f:
        said = re.search(r"its steps' limits add up to (\d+) s", " ".join(f.read().split()))
    assert said and int(said.group(1)) == sum(gpu_check.STEP_SECONDS.values())
