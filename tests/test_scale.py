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
    (["--micro-batch-size", "0"], "error: --micro-batch-size must be >= 1, got 0"),
    (["--micro-batch-size", "-16"], "error: --micro-batch-size must be >= 1, got -16"),
    (["--threads", "0"], "error: --threads must be >= 1, got 0"),
])
def test_bad_arguments_give_one_line(flags, message):
    result = scale(*flags)
    assert result.returncode != 0 and result.stderr.strip() == message


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_of_the_plan_prints_the_usage_not_an_error(flag):
    result = subprocess.run([sys.executable, "-m", "common.tools.scale", flag], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "python -m common.tools.scale run" in result.stdout and "scale run --help" in result.stdout


def test_tiny_run_fills_a_row(monkeypatch, capsys):
    """`python -m common.tools.scale run` in this process (its argument checks run from the command line above); the
    run it measures is a process of its own, as always."""
    from common.tools import scale as tool

    monkeypatch.setattr(sys, "argv", ["scale.py", "run", "--configs", "gpt2-tiny", "--variants", "lora+gc",
                                      "--iterations", "1", "--prompts", "2", "--group-size", "2", "--max-new-tokens",
                                      "4", "--micro-batch-size", "4"])
    tool.main()
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| gpt2-tiny | lora+gc |")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    seconds = [float(cell) for cell in cells[2:6]]
    assert all(s >= 0 for s in seconds) and abs(seconds[3] - sum(seconds[:3])) < 0.02
    assert cells[6].endswith("%") and 0 < float(cells[6][:-1]) <= 100  # generation's share of the iteration
    assert float(cells[7]) > 0 and cells[8].endswith(" GiB RSS")
    assert float(cells[9]) == 0.0  # one step per iteration, at ratio 1: nothing clipped on a CPU


def test_the_plan_sizes_passes_as_a_run_does(monkeypatch, capsys):
    """The plan's rows come from the functions a run calls: SmolLM2 on a CPU keeps its whole minibatch of 16 (the
    recipe's passes), no GPU row's estimate exceeds 90 % of the card, and a 7B model sharded over 8 cards (--fsdp)
    charges each process its share of the training state, not the whole model's. `python -m common.tools.scale` in
    this process (its command line runs above, with --help)."""
    from common import memory
    from common.tools import scale as tool

    monkeypatch.setattr(sys, "argv", ["scale.py"])
    tool.main()
    stdout = capsys.readouterr().out
    cells = [[c.strip() for c in line.strip("|").split("|")]
             for line in stdout.split("\nState per process")[0].splitlines()
             if line.startswith("| ") and "---" not in line][1:]  # the rows under the header
    rows = {f"{row[0]} {row[3]}": row for row in cells}  # model and what is trained
    assert rows["smollm2-135m all"][7] == "16 of 16"
    assert rows["smollm2-135m all"][5].startswith("65 MiB (")  # / 2**20: MiB, not MB
    (fsdp,) = [row for name, row in rows.items() if row[3] == "FSDP"]  # 7B on 8 cards, each holding an 8th
    assert float(fsdp[6].split()[0]) > 0 and int(fsdp[7].split()[0]) >= 4  # not 1 response in a budget < 0
    assert len(rows) == len(tool.PLAN)
    for name, where, _, trained, *_ in tool.PLAN:
        if where != "cpu":
            assert float(rows[f"{name} {trained}"][8].split()[0]) * 2**30 <= 0.9 * tool.GPU_MEMORY
    assert memory.pass_size(16, 8, 65 * 2**20, memory.CPU_PASS_BUDGET) == 16


def test_the_fit_table_counts_each_strategy_by_hand_and_only_fsdp_or_lora_fits_a_7b_model(capsys):
    import torch

    from common import memory
    from common.tools import scale as S

    # 8 blocks of 100 weights and 200 outside them (embeddings, final norm): P = 1000
    model = torch.nn.Sequential(torch.nn.ModuleList(torch.nn.Linear(10, 10, bias=False) for _ in range(8)),
                                torch.nn.ModuleList([torch.nn.Linear(20, 10, bias=False)]))  # not the blocks
    P, L = 1000, 10
    assert sum(p.numel() for p in model.parameters()) == P and memory.gathered_weights(model) == 200 + 2 * 100
    assert S.fit_state_bytes("DDP", model, L, 1) == 16 * P and S.fit_state_bytes("DDP", model, L, 4) == 20 * P
    assert S.fit_state_bytes("DDP + LoRA r16", model, L, 8) == 2 * P + 20 * L
    # a quarter of 16 bytes, and in float32 what FSDP gathers at once: the root's weights and two blocks
    assert S.fit_state_bytes("FSDP", model, L, 4) == 4 * P + 4 * 400
    # a reference copy (β > 0) is made before the sharding: whole on every card, in both layouts
    assert memory.state_bytes(P, 0, 4, gathered=400, reference=2 * P) == 4 * P + 4 * 400 + 2 * P
    assert memory.state_bytes(P, 0, 1, reference=2 * P) == 16 * P + 2 * P
    assert memory.state_bytes(P, 0, 2) == 20 * P  # DDP's buckets from the second process on
    S.fit()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| qwen")}
    ddp, lora, fsdp = rows["qwen2.5-7b"][2:5], rows["qwen2.5-7b"][5:8], rows["qwen2.5-7b"][8:11]
    assert all(cell.endswith("✗") for cell in ddp)  # 16 bytes a parameter: 113 GiB before any activation
    assert all(cell.endswith("✓") for cell in lora)
    assert fsdp[0].startswith("(shards") and all(cell.rstrip(" |").endswith("✓") for cell in fsdp[1:])
    assert all(cell.rstrip(" |").endswith("✓") for cell in rows["qwen2.5-0.5b"][2:4])


def test_the_tools_frozen_copy_is_what_policy_stores_on_a_gpu():
    """A frozen copy on a GPU (LoRA's base, a reference model) holds its linear layers in bfloat16 and its embeddings,
    norms and output layer in float32 (common/policy.py: frozen_weights_to_bfloat16 beside the float32 output
    layer): the tool's frozen_bytes counts those bytes, tied embeddings once, not 2 bytes for every parameter."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from common import policy
    from common.tools import scale as S

    for tied in (True, False):
        config = AutoConfig.for_model("qwen2", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=500,
                                      tie_word_embeddings=tied)
        model = AutoModelForCausalLM.from_config(config)
        counted = S.frozen_bytes(model)
        policy.float32_output_layer(model)
        model.requires_grad_(False)
        policy.frozen_weights_to_bfloat16(model)
        stored = sum(p.numel() * p.element_size() for p in model.parameters())
        assert counted == stored and stored > 2 * sum(p.numel() for p in model.parameters())


def test_the_plans_cpu_rows_hold_the_reference_model_the_command_they_plan_holds():
    """The CPU rows plan grpo.py's no-flag command of a real model, which resolves β to 0 on a CPU: no reference
    model. At β = 0.04 the plan charged SmolLM2 a reference copy it never holds (2.5 GiB of state, not 2.0)."""
    import grpo
    from common import policy
    from common.tools import scale as S

    args = grpo.Args(model="HuggingFaceTB/SmolLM2-135M-Instruct", cuda=False)  # a real model: nothing is loaded
    policy.resolve_defaults(args, beta=grpo.BETA)
    assert [row[4] for row in S.PLAN if row[1] == "cpu"] == [args.beta, args.beta]


def test_the_variants_hold_a_reference_model_unless_a_beta_is_typed():
    """The variants measure the reference copy (β = 0.04): a real model on a CPU resolves β to 0 when none is typed,
    so without the flag `full` measured no reference at all. A --beta after -- is the user's and wins alone."""
    import argparse

    from common.tools import scale as S

    args = argparse.Namespace(iterations=3, prompts=8, group_size=8, max_new_tokens=64, micro_batch_size=16, extra=[])
    flags = S.script_flags("folder", "full", args)
    assert flags[flags.index("--beta") + 1] == "0.04"
    for extra in (["--beta", "0.1"], ["--beta=0.1"]):
        flags = S.script_flags("folder", "lora", argparse.Namespace(**{**vars(args), "extra": extra}))
        assert [flag for flag in flags if flag.startswith("--beta")] == extra[:1] and flags[-len(extra):] == extra


def test_a_card_of_80_gb_is_what_torch_reports_for_one_and_14b_fits_four_with_fsdp(capsys):
    """An "80 GB" A100 or H100 reports 79.1-79.3 GiB as total_memory, what a run budgets from; 80e9 bytes (74.5 GiB)
    left 4.6 GiB out of every plan, enough to refuse Qwen2.5-14B with FSDP on 4 cards."""
    from common.tools import scale as S

    assert 79.0 <= S.GPU_MEMORY / 2**30 <= 79.3
    S.fit()
    (row,) = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| qwen2.5-14b")]
    assert row[9:11] == ["63 GiB ✓", "35 GiB ✓ |"]  # FSDP on 4 and on 8 cards
