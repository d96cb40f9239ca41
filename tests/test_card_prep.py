"""common/tools/card_prep.py: the calls it plans are ones the card accepts, and it makes each folder once."""

import shlex
import subprocess

from common.tools import card_prep, gpu_check
from conftest import ROOT


def test_the_planned_calls_fit_the_card(tmp_path):
    for command, carry, timeout in card_prep.CALLS:
        line = (card_prep.INSTALL if ".whl" in carry else "") + command
        assert len(line) <= 2000 and len(carry) <= 8 and timeout <= 600  # the device's limits on one call
    # SmolLM2's first half is kept before the check runs, its second half comes in the next call, which runs it
    (first, first_carry, _), (second, second_carry, _) = card_prep.CALLS
    assert first.startswith("python3 -m common.tools.smollm2_on_gpu keep; ") and ".smollm2-1/half" in first_carry
    assert ".smollm2_on_gpu run " in second and ".smollm2-2/half" in second_carry
    # what travels: this tree, the wheels (0.4 MiB; 1 allowed), the older checkout and a half of SmolLM2's wheel
    tree = card_prep.tree_bytes() + 2**20
    before = sum(int(line.split()[3]) for line in subprocess.run(
        ["git", "ls-tree", "-r", "-l", card_prep.BEFORE], cwd=ROOT, capture_output=True, text=True,
        check=True).stdout.splitlines() if line.split()[1] == "blob")
    half = 88.6 * 2**20 / 2
    assert tree + before + half <= card_prep.CARRY_LIMIT and tree + half <= card_prep.CARRY_LIMIT
    assert "the last has 180 s" in card_prep.plan()[-1]  # 900 - a start of 120 - 570 - 30 warm
    # each call's check parses, and the first's steps' limits leave the models' building (40 s) room in the call
    for i, (command, _, timeout) in enumerate(card_prep.CALLS):
        (check,) = [part for part in command.split("; ") if "common.tools.gpu_check" in part]
        words = shlex.split(check.replace("$OUT", str(tmp_path)))
        assert words[:3] == ["python3", "-m", "common.tools.gpu_check"]
        options = gpu_check.parse_args(words[3:])
        limits = dict(gpu_check.STEP_SECONDS, **{step: float(seconds) for step, seconds in
                                                 (limit.split("=") for limit in options.limits)})
        assert set(options.steps) <= set(limits)
        assert i > 0 or sum(limits[step] for step in options.steps) + 40 <= timeout
    # the commit --before reads: its grpo.py is there, common/decoding.py (the compiled step) not yet
    def exists(path):
        return subprocess.run(["git", "cat-file", "-e", f"{card_prep.BEFORE}:{path}"], cwd=ROOT).returncode == 0
    assert exists("grpo.py") and not exists("common/decoding.py")


def test_each_folder_is_made_once_and_ignored(tmp_path, monkeypatch):
    monkeypatch.setattr(card_prep, "ROOT", str(tmp_path))
    commands = []

    def run(command, **kwargs):
        commands.append(command)
        if command[:2] == ["git", "archive"]:
            return subprocess.CompletedProcess(command, 0, stdout=b"")
        if "download" in command:
            (tmp_path / ".whl").mkdir()
        if command[-1] == "split":
            for i in (1, 2):
                (tmp_path / f".smollm2-{i}").mkdir()
                (tmp_path / f".smollm2-{i}" / "half").write_bytes(b"x")
        return subprocess.CompletedProcess(command, 0)

    card_prep.make(run)
    assert commands[0] == ["git", "archive", card_prep.BEFORE] and commands[1][0] == "tar"
    download = commands[2]
    assert download[-len(card_prep.WHEELS):] == card_prep.WHEELS and "3.12" in download  # the card's Python
    assert commands[3][-2:] == ["common.tools.smollm2_on_gpu", "split"] and len(commands) == 4
    card_prep.make(run)  # everything is there: nothing is made again, nothing is added twice to the excludes
    assert len(commands) == 4
    excluded = (tmp_path / ".git" / "info" / "exclude").read_text().split()
    assert excluded == ["/.before/", "/.whl/", "/.smollm2-1/", "/.smollm2-2/"]
