"""The life of a run (common/runs.py), through the group files' own main blocks on the embedded model:
a run stopped by SIGTERM and resumed is the uninterrupted run, bit for bit (every logged number, the final
weights), in all five files, with full fine-tuning and with LoRA; a checkpoint restores the weights, Adam's state
and every random state; a resumed run refuses a changed method flag; a checkpoint interrupted while written or
before it is named the latest leaves the previous one whole; one-line errors (out of GPU memory, an
unwritable folder, no checkpoint); the status line of a long phase; pass@k; the run's name; the warning when
nothing is ever right. The two-process resume is in tests/test_group_distributed.py."""

import glob
import io
import os
import random
import re
import signal
import threading
import types

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from common import checkpoints, policy, runs
from conftest import GROUP, ROOT

FLAGS = ["--num-iterations", "4", "--eval-every", "2", "--eval-size", "8", "--prompts-per-iteration", "4",
         "--num-minibatches", "2", "--group-size", "4", "--save-model", "--beta", "0.01"]
# figures of time, not of the run
TIMING = ("perf/", "charts/tokens_per_second", "charts/samples_per_second")


def scalars(run_dir) -> dict:
    """Every logged number of a run, by (tag, step), read back from all its TensorBoard files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {(tag, e.step): e.value for tag in acc.Tags()["scalars"] if not tag.startswith(TIMING)
            for e in acc.Scalars(tag)}


def weights(run_dir) -> dict:
    folder = run_dir / "model"
    file = folder / ("adapter_model.safetensors" if (folder / "adapter_model.safetensors").exists()
                     else "model.safetensors")
    return load_file(str(file))


@pytest.fixture
def stop_after(monkeypatch):
    """stop_after(k): the run gets a SIGTERM at the end of iteration k, as from a scheduler."""
    def arm(k):
        real = runs.IterationLog.end_iteration

        def end_iteration(self, iteration, *rest):
            real(self, iteration, *rest)
            if iteration == k:
                os.kill(os.getpid(), signal.SIGTERM)
        monkeypatch.setattr(runs.IterationLog, "end_iteration", end_iteration)
    yield arm
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


# The shared plumbing once each: LoRA, a sampler 2 updates behind (its weights travel in the checkpoint), a bfloat16
# sampler (its copy rebuilt from the restored weights).
EXTRA = {"lora": ["--lora-rank", "2", "--learning-rate", "1e-3"], "lag": ["--sampler-lag", "2"],
         "bf16": ["--sampler-dtype", "bfloat16"]}


@pytest.mark.parametrize("name, extra", [(name, None) for name in GROUP] + [("grpo", "lora"), ("grpo", "lag"),
                                                                            ("dapo", "bf16")])
def test_a_run_stopped_and_resumed_is_the_uninterrupted_run(name, extra, in_process, stop_after):
    flags = FLAGS + EXTRA.get(extra, [])
    straight, out = in_process(name, flags, subdir="straight")
    assert "stopped" not in out  # nothing to say of a stop that was not asked
    stop_after(2)
    stopped, out = in_process(name, flags, subdir="stopped")
    assert "stopped after iteration 2; resume with: python" in out and f"--resume runs/{stopped.name}" in out
    assert not (stopped / "model").exists()  # a stopped run saves no final model
    resumed, out = in_process(name, ["--resume", f"runs/{stopped.name}"], subdir="stopped")
    assert f"resumed runs/{stopped.name} after iteration 2" in out and "iteration    3/4" in out
    assert "iteration    0" not in out  # the starting model was evaluated by the first part
    expected, actual = scalars(straight), scalars(resumed)
    assert {step for _, step in expected} == {0, 1, 2, 3, 4} and actual.keys() == expected.keys()
    assert actual == expected  # every logged number, exactly
    expected_weights, actual_weights = weights(straight), weights(resumed)
    assert expected_weights.keys() == actual_weights.keys()
    for key in expected_weights:
        assert torch.equal(actual_weights[key], expected_weights[key]), key


def test_a_resumed_run_keeps_its_flags_refuses_a_changed_one_and_may_be_extended(in_process, stop_after):
    stop_after(1)
    stopped, _ = in_process("dapo", FLAGS + ["--clip-eps-high", "0.3"])
    assert in_process.exit_code == 143  # SIGTERM's status: a stopped run is not a finished one
    folder = f"runs/{stopped.name}"
    with pytest.raises(SystemExit) as e:
        in_process("dapo", ["--resume", folder, "--clip-eps-high", "0.28"])
    assert str(e.value).startswith("error: --resume: --clip-eps-high 0.28 differs from the run's --clip-eps-high 0.3;")
    assert "\n" not in str(e.value) and "--num-iterations" in str(e.value)
    _, out = in_process("dapo", ["--resume", folder, "--num-iterations", "5"])  # typed: extends the run
    assert "iteration    5/5" in out and "iteration    2/5" in out and in_process.exit_code == 0


def test_a_finished_run_is_extended_and_says_when_nothing_is_left(in_process):
    """A finished run with --save-every and --save-model: its last iteration's checkpoint is written, --resume with
    more iterations trains on and replaces the saved model, and a resume with nothing left says so in one line."""
    flags = FLAGS[:1] + ["2"] + FLAGS[2:] + ["--save-every", "5"]  # 2 iterations: the last one is checkpointed too
    run, out = in_process("grpo", flags)
    assert open(run / "latest").read() == "checkpoint-2" and (run / "model" / "model.safetensors").exists()
    before = weights(run)
    _, out = in_process("grpo", ["--resume", f"runs/{run.name}", "--num-iterations", "3"])
    assert "iteration    3/3" in out and f"saved to runs/{run.name}/model" in out
    # no model.tmp or model.old left behind
    assert sorted(f for f in os.listdir(run) if not f.startswith("events")) == ["checkpoint-3", "latest", "model"]
    assert not all(torch.equal(before[key], value) for key, value in weights(run).items())  # the model replaced
    _, out = in_process("grpo", ["--resume", f"runs/{run.name}"])
    assert "nothing left to do: the run has done its 3 iterations" in out and "iteration    " not in out
    assert in_process.exit_code == 0
    with pytest.raises(SystemExit) as e:  # fewer iterations than done: refused before the model loads
        in_process("grpo", ["--resume", f"runs/{run.name}", "--num-iterations", "2"])
    assert str(e.value) == ("error: --resume: --num-iterations 2 is below the checkpoint's iteration 3: a resumed "
                            "run goes on from there (--num-iterations 3 or more)")


@pytest.mark.parametrize("number, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_during_the_first_evaluation_starts_no_iteration(number, status, in_process, monkeypatch):
    real = runs.IterationLog.held_out

    def held_out(self, iteration):  # the signal arrives while the starting model is evaluated
        os.kill(os.getpid(), number)
        return real(self, iteration)
    monkeypatch.setattr(runs.IterationLog, "held_out", held_out)
    run, out = in_process("grpo", FLAGS)
    assert in_process.exit_code == status
    assert "iteration    0  held-out" in out and "iteration    1/" not in out
    assert "stopped before iteration 1; no checkpoint was written, so there is nothing to resume" in out
    assert not (run / "latest").exists() and not (run / "model").exists()


@pytest.mark.parametrize("number, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_while_the_model_loads_is_one_line(number, status, in_process, monkeypatch):
    real = policy.load_policy

    def load_policy(*args, **kwargs):  # Ctrl-C (or a scheduler's SIGTERM) before training has begun
        os.kill(os.getpid(), number)
        return real(*args, **kwargs)
    monkeypatch.setattr(policy, "load_policy", load_policy)
    _, out = in_process("grpo", FLAGS)  # (a traceback would be an exception, not an exit status)
    assert in_process.exit_code == status
    assert f"{signal.Signals(number).name}: stopped before training began; nothing was trained or saved" in out


# The signal arrives while numpy, the first heavy import, loads: before any of the program's own handlers. The
# process first takes SIGINT as one started from a terminal does (KeyboardInterrupt): a suite started in the
# background (`nohup ... &`) hands its processes SIGINT ignored, and Python keeps that.
SIGINT_AT_NUMPY = """import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
class SignalAtNumpy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            os.kill(os.getpid(), signal.SIGINT)
sys.meta_path.insert(0, SignalAtNumpy())
"""


@pytest.mark.parametrize("method", GROUP)
def test_a_ctrl_c_while_torch_loads_is_one_line_and_status_130(method, tmp_path):
    import subprocess
    import sys

    (tmp_path / "sitecustomize.py").write_text(SIGINT_AT_NUMPY)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    done = subprocess.run([sys.executable, os.path.join(ROOT, f"{method}.py")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGINT  # what the shell shows as 130
    assert done.stderr.strip() == "SIGINT: stopped before training began; nothing was trained or saved"
    assert done.stdout == ""


def test_a_ctrl_c_in_a_tool_keeps_pythons_traceback(tmp_path):
    import subprocess
    import sys

    # the lab or a tool may have written results: "nothing was trained or saved" is not theirs to say
    done = subprocess.run([sys.executable, "-c", "import common; raise KeyboardInterrupt"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGINT and "Traceback" in done.stderr and "nothing was" not in done.stderr


def test_a_second_signal_stops_at_once_and_offers_a_resume_only_with_a_checkpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(checkpoints.sys, "argv", ["grpo.py"])
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    os.makedirs("runs/run")
    stops = checkpoints.Checkpoints("runs/run", model=None, optimizer=None, rng=None, args=None)
    try:
        stops._ask_to_stop(signal.SIGINT, None)
        assert capsys.readouterr().out == "\nSIGINT: stopping after iteration 1 with a checkpoint (again to stop at " \
                                          "once, without one)\n"
        stops.first_signal -= 3  # the second comes later than torchrun's echo of the first
        with pytest.raises(SystemExit) as e:
            stops._ask_to_stop(signal.SIGINT, None)
        assert e.value.code == 130
        assert "stopped at once during iteration 1, without a checkpoint; no checkpoint was written, so there is " \
               "nothing to resume" in capsys.readouterr().err
        (tmp_path / "runs" / "run" / "latest").write_text("checkpoint-1")
        with pytest.raises(SystemExit):
            stops._ask_to_stop(signal.SIGINT, None)
        assert "resume with: python grpo.py --resume runs/run" in capsys.readouterr().err
        # the script as typed, from where the user is (the run's folder is from there too), and its launcher
        monkeypatch.setattr(checkpoints.sys, "argv", ["../repo/grpo.py"])
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert stops.how_to_resume() == "resume with: torchrun --nproc_per_node 2 ../repo/grpo.py --resume runs/run"
        # torchrun, signalled itself, kills the processes after its --shutdown-timeout: the stop line says so
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
        torchrun = checkpoints.Checkpoints("runs/run", model=None, optimizer=None, rng=None, args=None)
        torchrun._ask_to_stop(signal.SIGTERM, None)
        assert "torchrun, if it was signalled too, kills the processes after its --shutdown-timeout (30 s by " \
               "default" in capsys.readouterr().out
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)


def test_a_checkpoint_restores_the_weights_adam_and_every_random_state(tmp_path, monkeypatch, capsys):
    """Without a run: save, draw from every generator and take a step, restore. The weights, Adam's moments and
    every generator (Python's, NumPy's, torch's, the prompt sampler's, a card's) are back as saved; the iteration
    after the saved one is next. 2^18 float32 weights and Adam's two moments: 3 MiB on disk."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(checkpoints.sys, "argv", ["grpo.py"])
    card = {"saved": [torch.tensor([7])], "restored": []}  # a card's generators, as torch.cuda keeps them
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: card["saved"])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", card["restored"].append)
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    model = torch.nn.Linear(512, 512, bias=False)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 512)).sum().backward()
    optimizer.step()
    os.makedirs("runs/run")
    stops = checkpoints.Checkpoints("runs/run", model, optimizer, random.Random(3), types.SimpleNamespace(
        num_iterations=9))
    try:
        stops.save(4)
        assert capsys.readouterr().out == "checkpoint of iteration 4: runs/run/checkpoint-4 (3 MiB)\n"

        def draws():
            return (random.random(), np.random.rand(), torch.rand(1).item(), stops.rng.random())

        saved = (model.weight.clone(), {k: v.clone() for k, v in optimizer.state[model.weight].items()}, draws())
        model(torch.randn(2, 512)).sum().backward()
        optimizer.step()  # the weights, the moments and the generators move on
        assert stops.restore() == 5
        assert torch.equal(model.weight, saved[0])
        assert all(torch.equal(optimizer.state[model.weight][k], v) for k, v in saved[1].items())
        assert draws() == saved[2]
        assert card["restored"] == [card["saved"]]
        card["saved"] = None  # saved on a CPU, resumed on a card: its generators are left alone
        stops.save(5)
        stops.restore()
        assert card["restored"] == [[torch.tensor([7])]]
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)


def test_damaged_missing_moved_and_foreign_checkpoints_are_one_line(in_process, tmp_path, stop_after):
    stop_after(1)
    run, _ = in_process("grpo", FLAGS, subdir="a")
    state = run / "checkpoint-1" / "state.pt"
    good = state.read_bytes()

    def refusal(name, argv, subdir="a"):
        with pytest.raises(SystemExit) as e:
            in_process(name, argv, subdir=subdir)
        assert "\n" not in str(e.value)
        return str(e.value)

    # from another folder: the path as given, not runs/<its name>
    _, out = in_process("grpo", ["--resume", f"../a/runs/{run.name}", "--num-iterations", "2"], subdir="b")
    assert f"resumed ../a/runs/{run.name} after iteration 1" in out and "iteration    2/2" in out
    folder = f"runs/{run.name}"
    assert refusal("dapo", ["--resume", folder]) == (  # grpo.py next to dapo.py as typed (here, where runpy ran it)
        f"error: --resume {folder}: a run of grpo.py, not of dapo.py; resume it with: python "
        f"{os.path.join(ROOT, 'grpo.py')} --resume {folder}")
    state.write_bytes(good[: len(good) // 2])
    assert refusal("grpo", ["--resume", folder]) == (
        f"error: --resume {folder}: {folder}/checkpoint-1/state.pt cannot be read, the checkpoint is damaged "
        "(RuntimeError)")
    state.write_bytes(os.urandom(4096))
    assert refusal("grpo", ["--resume", folder]).startswith(f"error: --resume {folder}: {folder}/checkpoint-1/state.pt "
                                                            "cannot be read, the checkpoint is damaged (")
    saved = torch.load(io.BytesIO(good), weights_only=False)
    torch.save({**saved, "processes": 2}, state)  # as a torchrun run of 2 processes writes it
    assert refusal("grpo", ["--resume", folder]) == (
        f"error: --resume {folder}: a run of 2 processes, here 1; resume it with torchrun --nproc_per_node 2")
    state.write_bytes(good)
    (run / "checkpoint-1" / "random-0.pt").write_bytes(b"not a checkpoint")
    assert "random-0.pt cannot be read, the checkpoint is damaged" in refusal("grpo", ["--resume", folder])
    (run / "checkpoint-1" / "random-0.pt").unlink()
    assert refusal("grpo", ["--resume", folder]) == (
        f"error: --resume {folder}: {folder}/checkpoint-1/random-0.pt is missing")
    (run / "latest").write_text("checkpoint-7")
    assert refusal("grpo", ["--resume", folder]) == (
        f"error: --resume {folder}: {folder}/latest names 'checkpoint-7', which is not there (removed or moved?)")
    assert refusal("grpo", ["--resume", "runs/nothing"]).startswith("error: --resume runs/nothing: no such folder")
    os.makedirs(tmp_path / "a" / "runs" / "empty")
    assert refusal("grpo", ["--resume", "runs/empty"]).startswith("error: --resume runs/empty: no checkpoint there")


def test_no_evaluation_flag_changes_a_number_of_training(in_process):
    """Evaluations draw their own random numbers: runs that differ only in when, how many and how often they
    evaluate train alike, every training number and the final weights equal."""
    flags = FLAGS[:2] + ["--prompts-per-iteration", "4", "--num-minibatches", "2", "--group-size", "4",
                         "--save-model"]
    evaluation = ("charts/accuracy", "charts/greedy_accuracy", "charts/pass@1", "charts/pass@k")
    settings = [["--eval-every", "2"], ["--eval-every", "3", "--eval-samples", "4"],
                ["--eval-every", "1", "--eval-size", "5"]]
    runs_ = [in_process("grpo", flags + extra, subdir=str(index))[0] for index, extra in enumerate(settings)]
    logged = [{key: value for key, value in scalars(run).items() if key[0] not in evaluation} for run in runs_]
    assert logged[0] and logged[1] == logged[0] and logged[2] == logged[0]
    for run in runs_[1:]:
        assert all(torch.equal(weights(run)[key], value) for key, value in weights(runs_[0]).items())


@pytest.mark.parametrize("killed", ["writing", "naming"])
def test_a_checkpoint_interrupted_while_written_leaves_the_previous_one_whole(killed, in_process, monkeypatch):
    """--save-every 1: the checkpoint of iteration 1 is whole; writing iteration 2's is killed half way (after its
    state, before the random states), or once written, before `latest` names it: `latest` still names iteration
    1's, which is complete and resumes, and the resumed run writes iteration 2's again over what was left."""
    real = (torch.save, os.replace)

    def save(obj, path, *a, **k):
        if killed == "writing" and "checkpoint-2" in str(path) and "random-" in str(path):
            raise KeyboardInterrupt  # as a kill mid-write would, the interpreter gone
        return real[0](obj, path, *a, **k)

    def replace(source, destination):
        if killed == "naming" and str(destination).endswith("latest") and "checkpoint-2" in open(source).read():
            raise KeyboardInterrupt
        return real[1](source, destination)

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        in_process("grpo", FLAGS + ["--save-every", "1"])
    monkeypatch.setattr(torch, "save", real[0])
    monkeypatch.setattr(os, "replace", real[1])
    (name,) = os.listdir("runs")
    folder = os.path.join("runs", name)
    assert open(os.path.join(folder, "latest")).read() == "checkpoint-1"
    assert sorted(os.listdir(os.path.join(folder, "checkpoint-1"))) == ["random-0.pt", "state.pt"]
    left = "checkpoint-2.tmp" if killed == "writing" else "checkpoint-2"
    assert left in os.listdir(folder)
    _, out = in_process("grpo", ["--resume", folder])
    assert f"resumed {folder} after iteration 1" in out and "iteration    4/4" in out
    assert open(os.path.join(folder, "latest")).read() == "checkpoint-4"


def log_of(run_dir: str, num_iterations: int = 5, eval_every: int = 2, evaluate=lambda: None):
    """An IterationLog of a run of 4 responses per iteration, without a model (nothing to gather, nothing to say of
    its size)."""
    args = types.SimpleNamespace(num_iterations=num_iterations, eval_every=eval_every, prompts_per_iteration=1,
                                 group_size=4, gradient_checkpointing=False)
    return runs.IterationLog(run_dir, args, evaluate)


def test_out_of_gpu_memory_names_the_phase_and_the_flags_that_cut_memory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    log = log_of("runs/run")
    with pytest.raises(SystemExit) as e:
        with log.phase("update"):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    message = str(e.value)
    assert message.startswith("error: the GPU ran out of memory in the update phase:") and "\n" not in message
    for flag in ("--micro-batch-size", "--gradient-checkpointing", "--lora-rank", "--max-new-tokens"):
        assert flag in message
    log.close()


def test_an_unwritable_run_folder_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("a file where the runs folder should be")
    with pytest.raises(SystemExit) as e:
        log_of("runs/run")
    assert str(e.value).startswith("error: cannot write the run's folder runs/run") and "\n" not in str(e.value)


def test_a_long_phase_shows_where_it_stands(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runs, "STATUS_EVERY", 0.05)
    log = log_of("runs/run")
    log.begin_iteration(3)
    with log.phase("generate"):
        threading.Event().wait(0.3)
    with log.phase("update"):  # a short phase says nothing
        pass
    log.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("end: iteration 3/5")  # the closing line
    lines = lines[:-1]
    assert len(lines) >= 3 and all(line == lines[0][: len(line)] or "generate..." in line for line in lines)
    assert lines[0].startswith("iteration    3/5  generate... ") and not any("update" in line for line in lines)


def test_pass_at_k_unbiased_estimator_by_hand():
    # n = 4 samples, c = 1 right: pass@1 = 1/4; pass@2 = 1 − C(3, 2)/C(4, 2) = 1 − 3/6; pass@4 = 1
    assert runs.pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert runs.pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert runs.pass_at_k(4, 1, 4) == 1.0 and runs.pass_at_k(4, 0, 4) == 0.0
    assert runs.pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # C(7, 5) = 21, C(10, 5) = 252


@pytest.mark.parametrize("sampled, line", [
    # 3 prompts, 4 samples each: right 3, 0 and 4 times (a reward of 0.5 is not a right answer); held-out is the
    # mean reward, (3 + 0.5 + 4) / 12; pass@1 = (3/4 + 0 + 1) / 3; pass@4 = (1 + 0 + 1) / 3
    ([[1.0, 0, 1, 1], [0, 0, 0, 0.5], [1, 1, 1, 1]], "held-out 0.625 (greedy 0.333, pass@1 0.583, pass@4 0.667)"),
    # 2 samples, right 1, 0 and 2 times: pass@1 = (1/2 + 0 + 1) / 3, pass@2 = (1 + 0 + 1) / 3
    ([[0.0, 1], [0, 0], [1, 1]], "held-out 0.500 (greedy 0.333, pass@1 0.500, pass@2 0.667)"),
    ([[1.0], [0], [0]], "held-out 0.333 (greedy 0.333)  (log: "),  # one sample: no pass@k to tell
])
def test_held_out_figures_and_the_console(sampled, line, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    greedy = torch.tensor([[1.0], [0], [0]])  # right on the first prompt only
    log = log_of("runs/run", evaluate=lambda: (torch.tensor(sampled), greedy))
    log.begin()
    log.close()
    assert capsys.readouterr().out.startswith(f"iteration    0  {line}")


def test_each_iteration_logs_its_rates_its_loss_means_and_an_eta(tmp_path, monkeypatch, capsys):
    """On a clock the test sets: a run resumed after iteration 2, of 4 responses of 3 tokens per iteration."""
    monkeypatch.chdir(tmp_path)
    now = [100.0]  # the run starts at 100 s
    monkeypatch.setattr(runs.time, "time", lambda: now[0])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 3 * 2**30)
    args = types.SimpleNamespace(num_iterations=6, eval_every=100, prompts_per_iteration=1, group_size=4,
                                 gradient_checkpointing=False)
    log = runs.IterationLog("runs/run", args, evaluate=None, first_iteration=3)
    log.cuda = True
    written = []
    monkeypatch.setattr(log.board, "write", lambda figures, iteration: written.append(figures))
    scalars = {"charts/train_accuracy": 0.5, "charts/response_length": 3.0, "charts/truncated_fraction": 0.0,
               "charts/zero_signal_fraction": 0.0}
    for iteration, start, end in ((3, 100.0, 104.0), (4, 104.0, 110.0)):
        now[0] = start
        log.begin_iteration(iteration)
        now[0] = end
        log.end_iteration(iteration, scalars, {"policy_loss": [0.1, 0.3], "clipfrac": []}, learning_rate=1e-3)
    log.close()
    first, second = written
    assert first["losses/policy_loss"] == pytest.approx(0.2) and "losses/clipfrac" not in first  # means; none
    assert (first["perf/iteration_seconds"], second["perf/iteration_seconds"]) == (4.0, 6.0)
    assert (first["charts/tokens_per_second"], second["charts/tokens_per_second"]) == (3.0, 2.0)  # 3 × 4 / s
    assert (first["charts/samples_per_second"], second["charts/samples_per_second"]) == (1.0, 4 / 6)
    assert first["perf/peak_gpu_memory_gb"] == 3.0 and first["charts/learning_rate"] == 1e-3
    # the ETA: the mean seconds of the iterations this run did, times those left: 4 × 3, then 10 / 2 × 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("ETA 12s") and lines[1].endswith("ETA 10s"), lines


def test_every_logged_figure_is_the_mean_over_the_processes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runs, "global_mean", lambda value: value + 1000.0)  # as if another process logged more
    log = log_of("runs/run", num_iterations=5, eval_every=100)
    written = []
    monkeypatch.setattr(log.board, "write", lambda figures, iteration: written.append(figures))
    log.begin_iteration(1)
    log.end_iteration(1, {"charts/train_accuracy": 0.5, "charts/response_length": 3.0,
                          "charts/truncated_fraction": 0.0, "charts/zero_signal_fraction": 0.0},
                      {"policy_loss": [0.5]}, learning_rate=1e-3)
    log.close()
    (figures,) = written
    assert len(figures) > 5 and all(value >= 1000 for tag, value in figures.items() if tag != "charts/learning_rate")


def test_the_perf_line_follows_the_first_iteration_and_each_evaluation(in_process):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, out = in_process("grpo", FLAGS)  # 4 iterations, evaluated at 2 and 4
    lines = out.splitlines()
    perf = [(lines[i - 1][:14], line) for i, line in enumerate(lines) if line.startswith("perf: ")]
    assert [after for after, _ in perf] == ["iteration    1", "iteration    2", "iteration    4"], out
    for _, line in perf:
        assert re.fullmatch(r"perf: generate \S+ s \(\S+ GB/s, \d+% of a copy's\), log-probs \S+ s \(\S+% MFU\), "
                            r"update \S+ s \(\S+% MFU\)", line), line
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    for tag in ("perf/generate_bytes_per_second", "perf/logprob_mfu", "perf/update_mfu"):
        assert [e.step for e in events.Scalars(tag)] == [1, 2, 3, 4], tag


def test_the_run_name_tells_runs_apart(tmp_path, monkeypatch):
    import grpo

    monkeypatch.chdir(tmp_path)
    args = grpo.Args(model="runs/SmolLM2-135M-Instruct/model.gguf", exp_name="lr1e-5", seed=3)
    first = runs.folder(args, "addition2", "/repo/grpo.py")
    assert first.startswith("runs/addition2__grpo-lr1e-5__model__3__")  # a .gguf file: its name without the suffix
    (tmp_path / first).mkdir(parents=True)
    monkeypatch.setattr(runs.time, "time", lambda: float(first.split("__")[-1]))  # the same second
    assert runs.folder(args, "addition2", "/repo/grpo.py") == first + "-2"
    (tmp_path / f"{first}-2").mkdir()  # a third in that second
    assert runs.folder(args, "addition2", "/repo/grpo.py") == first + "-3"
    assert runs.folder(grpo.Args(model="gpt2", seed=3), "addition2", "/repo/grpo.py") == (
        first.replace("grpo-lr1e-5__model", "grpo__gpt2"))  # no --exp-name; a hub id
    assert runs.folder(grpo.Args(resume=f"{first}/"), "addition2", "grpo.py") == first
    assert runs.folder(grpo.Args(resume=f"../elsewhere/{first}/"), "addition2", "grpo.py") == f"../elsewhere/{first}"


def test_a_run_that_is_never_right_says_so_once(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    log = log_of("runs/run", num_iterations=10, eval_every=100)
    scalars = {"charts/train_accuracy": 0.0, "charts/response_length": 3.0, "charts/truncated_fraction": 0.75,
               "charts/zero_signal_fraction": 1.0}
    for iteration in range(1, 6):
        log.begin_iteration(iteration)
        log.end_iteration(iteration, scalars, {"policy_loss": [0.0]}, 1e-3)
    log.close()
    out = capsys.readouterr().out
    assert out.count("no sampled response has been right in 3 iterations") == 1 and "truncated 0.75" in out
    log = log_of("runs/run2", num_iterations=10, eval_every=100)
    for iteration, accuracy in enumerate((0.0, 0.25, 0.0, 0.0, 0.0), start=1):  # right once: no warning later
        log.begin_iteration(iteration)
        log.end_iteration(iteration, {**scalars, "charts/train_accuracy": accuracy}, {"policy_loss": [0.0]}, 1e-3)
    log.close()
    assert "no sampled response" not in capsys.readouterr().out


def test_the_log_evaluates_on_schedule_and_prints_one_line_per_iteration(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    evaluations = []

    def evaluate():
        evaluations.append(len(evaluations))
        return torch.tensor([[0.5]]), torch.tensor([[0.75]])

    log = log_of("runs/run", evaluate=evaluate)
    log.begin()
    scalars = {"charts/reward": -0.5, "charts/train_accuracy": 0.25, "charts/response_length": 3.0,
               "charts/truncated_fraction": 0.5, "charts/zero_signal_fraction": 0.125}
    for iteration in range(1, 6):
        log.begin_iteration(iteration)
        with log.phase("generate"):
            pass
        log.end_iteration(iteration, scalars, {"clipfrac": [0.2], "policy_loss": [0.1, 0.3]}, learning_rate=1e-3)
    log.close()
    lines = capsys.readouterr().out.splitlines()
    assert len(evaluations) == 4  # at the start, at 2 and 4, and at the end (5)
    assert lines[0].startswith("iteration    0  held-out 0.500 (greedy 0.750)") and "runs/run" in lines[0]
    assert len(lines) == 7
    # the closing line: from the first evaluation to the last (the fake evaluation's figures never change)
    assert lines[6].startswith("end: iteration 5/5 after ") and lines[6].endswith(
        "of training; held-out 0.500 (iteration 0) → 0.500 (iteration 5), greedy 0.750 → 0.750; curves: "
        "tensorboard --logdir runs (this run: runs/run)")
    assert lines[1].startswith("iteration    1/5  accuracy 0.250  length 3.0  truncated 0.50  no-signal 0.12  "
                               "clipfrac 0.200  ")
    assert " s/it  " in lines[1] and " tok/s  ETA " in lines[1]
    assert "held-out" not in lines[1] and "held-out 0.500" in lines[2] and "held-out" not in lines[3]
    assert "held-out" in lines[5]
    assert (tmp_path / "runs" / "run").is_dir()


@pytest.mark.parametrize("extra", [[], ["--lora-rank", "4"], ["--sampler-dtype", "bfloat16", "--sampler-lag", "3"]],
                         ids=["full", "lora", "bf16-lag3"])
def test_the_first_lines_say_what_each_process_holds(extra, in_process):
    """The memory of the training state, by hand from the embedded model: its float32 weights; gradients and Adam's
    two moments of the weights it trains (with LoRA: the adapters only, over a base model that is all held); the
    reference model; a bfloat16 sampler's copy (2 bytes a weight) and the 3 versions of its lag. The parts add up."""
    from transformers import AutoModelForCausalLM

    flags = ["--num-iterations", "4", "--prompts-per-iteration", "4", "--eval-size", "4", "--group-size", "2"]
    _, out = in_process("grpo", flags + extra)
    line = next(line for line in out.splitlines() if line.startswith("each process holds"))
    named = re.findall(r"(?:, | and |holds )([^(,]+) \(([\d,.]+) MiB\)", line)
    parts = {name: float(size.replace(",", "")) for name, size in named}
    total = float(re.search(r": ([\d,.]+) MiB before any activation", line).group(1).replace(",", ""))
    base = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(os.path.join(ROOT, "common", "models",
                                                                                "tiny_model")).parameters())
    weights, gradients, adam = (parts.pop(name) for name in ("the policy's weights", "their gradients",
                                                              "Adam's moments"))
    if extra[:1] == ["--lora-rank"]:
        assert weights > base * 4 / 2**20 and 0 < gradients < weights / 5  # base + adapters; adapters only trained
    else:
        assert weights == pytest.approx(base * 4 / 2**20, abs=0.06) and gradients == weights
    assert adam == pytest.approx(2 * gradients, abs=0.15)
    # β = 0.04: a float32 copy on a CPU, but LoRA's reference is its own base (the adapters switched off)
    expected = {} if extra[:1] == ["--lora-rank"] else {"the reference model": base * 4 / 2**20}
    if extra[:1] == ["--sampler-dtype"]:
        expected.update({"the sampler's bfloat16 copy": base * 2 / 2**20, "the 3 newer versions of its lag":
                         3 * base * 2 / 2**20})
    assert parts == pytest.approx(expected, abs=0.06)
    assert total == pytest.approx(weights + gradients + adam + sum(parts.values()), abs=0.15)


def test_track_logs_the_scalars_and_the_flags_to_weights_and_biases_offline(in_process, monkeypatch):
    """CleanRL's --track: W&B mirrors the TensorBoard scalars and records the run's flags (WANDB_MODE=offline: the
    run is written to ./wandb for a later `wandb sync`, nothing leaves the machine). W&B's folder is not inside the
    run's, which holds its one event file as TensorBoard expects: no copies of copies."""
    pytest.importorskip("wandb")  # requirements.txt installs it; a user without it gets the line below
    import time

    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.tensorboard.patch()  # as a tracked run before it in this process leaves TensorBoard
    run_dir, _ = in_process("grpo", ["--num-iterations", "2", "--eval-size", "4", "--track",
                                     "--wandb-project-name", "pg-test-project"])
    wandb.tensorboard.unpatch()
    tree = [os.path.relpath(os.path.join(d, f), run_dir) for d, _, files in os.walk(run_dir) for f in files]
    assert len(tree) == 1 and "tfevents" in tree[0], tree
    (offline,) = glob.glob(os.path.join(os.path.dirname(os.path.dirname(run_dir)), "wandb", "offline-run-*",
                                        "run-*.wandb"))
    tags = (b"charts/reward", b"charts/sampler_gap_mean", b"losses/policy_loss")
    deadline = time.time() + 60  # on a loaded machine W&B's service may still be writing the file
    while not all(tag in open(offline, "rb").read() for tag in tags) and time.time() < deadline:
        time.sleep(0.5)
    data = open(offline, "rb").read()
    assert b"pg-test-project" in data and b"wandb_project_name" in data  # the project, and the flags as config
    for tag in tags:
        assert tag in data, tag
    # the event file mirrored once (not a copy of a copy), at the top of W&B's files: the run's folder is named as
    # TensorBoard's root (else W&B's reader waits 10 s at the end of the run for a second folder to infer one from)
    (mirrored,) = glob.glob(os.path.join(os.path.dirname(offline), "**", "*tfevents*"), recursive=True)
    assert os.path.basename(os.path.dirname(mirrored)) == "files", mirrored


def test_track_without_wandb_installed_is_one_line(in_process, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    with pytest.raises(SystemExit) as e:
        in_process("grpo", ["--track"])
    assert str(e.value) == "error: --track logs to Weights & Biases, an optional install: pip install wandb==0.31.0"


def test_track_without_a_login_is_one_line_before_the_model_loads(in_process, monkeypatch, tmp_path):
    pytest.importorskip("wandb")
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # where `wandb login` writes the key
    monkeypatch.setattr("sys.stdin", io.StringIO())  # no terminal: W&B cannot ask for a key
    monkeypatch.setattr(policy, "load_policy", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(SystemExit) as e:
        in_process("grpo", ["--track"])
    assert str(e.value) == ("error: --track needs a Weights & Biases login: run `wandb login`, set WANDB_API_KEY, or "
                            "set WANDB_MODE=offline (and `wandb sync` later)")
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "0" * 40 + "\n")
    assert runs.wandb_can_log_in()  # logged in
    (tmp_path / "netrc").unlink()
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert runs.wandb_can_log_in()  # offline: nothing to log in to


def test_track_refused_by_weights_and_biases_is_one_line(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    asked = []

    def refuse(**kwargs):
        asked.append(kwargs)
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")
    monkeypatch.setattr(wandb, "init", refuse)
    args = types.SimpleNamespace(track=True, wandb_project_name=None, wandb_entity=None)
    with pytest.raises(SystemExit) as e:
        runs.Board(str(tmp_path / "run"), args, first_iteration=1)
    assert asked[0]["project"] == "policy-gradients"  # the default project
    assert str(e.value).startswith("error: --track: Weights & Biases refused the run (No API key configured.")
    assert "WANDB_MODE=offline" in str(e.value) and "\n" not in str(e.value)


def test_the_embedded_models_run_on_one_thread_as_their_results_were_measured(in_process, monkeypatch):
    """Torch's default (a thread per core) ran the quick start 2.8 times slower on a busy machine; every results
    page measured one thread. OMP_NUM_THREADS, when set, is the user's choice and stays."""
    import torch

    flags = ["--num-iterations", "1", "--eval-size", "4", "--prompts-per-iteration", "4"]
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)  # the fixture puts back the suite's count
    in_process("grpo", flags)
    assert torch.get_num_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    in_process("grpo", flags, subdir="typed")
    assert torch.get_num_threads() == 2
