"""common/tools/scale.py: the plan (pass sizes by arithmetic), the benchmark's argument checks, and one tiny run that
fills a row of its table."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT



def scale(*flags):
    return subprocess.run([sys.executable, "-m", "common.tools.scale", "run", *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("flags, message", [
    (["--micro-batch-size", "5"], "error: --micro-batch-size must divide --prompts × --group-size = 64"),
    (["--group-size", "1"], "error: --iterations, --prompts and --max-new-tokens must be >= 1, --group-size >= 2"),
])
def test_bad_arguments_give_one_line(flags, message):
    result = scale(*flags)
    assert result.returncode != 0 and result.stderr.strip() == message


def test_tiny_run_fills_a_row():
    result = scale("--configs", "gpt2-tiny", "--variants", "lora+gc", "--iterations", "1", "--prompts", "2",
                   "--group-size", "2", "--max-new-tokens", "4", "--micro-batch-size", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("| gpt2-tiny | lora+gc |")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    seconds = [float(cell) for cell in cells[2:6]]
    assert all(s >= 0 for s in seconds) and abs(seconds[3] - sum(seconds[:3])) < 0.02
    assert cells[6].endswith("%") and 0 < float(cells[6][:-1]) <= 100  # generation's share of the iteration
    assert float(cells[7]) > 0 and cells[8].endswith("GB RSS")
    assert float(cells[9]) == 0.0  # one step per iteration, at ratio 1: nothing clipped on a CPU


def test_the_plan_sizes_passes_as_a_run_does():
    """The plan's rows come from the functions a run calls: SmolLM2 on a CPU keeps its whole minibatch of 16 (the
    recipe's passes), and no GPU row's estimate exceeds 90 % of the card."""
    from common import llm
    from common.tools import scale as tool

    result = subprocess.run([sys.executable, "-m", "common.tools.scale"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in result.stdout.splitlines() if line.startswith("| ") and "---" not in line}
    assert set(tool.CONFIGS[name][0] for name, *_ in tool.PLAN) and len(rows) == len(tool.PLAN) + 1
    assert rows["smollm2-135m"][7] == "16 of 16"
    for name, where, *_ in tool.PLAN:
        if where != "cpu":
            assert float(rows[name][8].split()[0]) * 2**30 <= 0.9 * tool.GPU_MEMORY
    assert llm.pass_size(16, 8, 65 * 2**20, llm.CPU_PASS_BUDGET) == 16
