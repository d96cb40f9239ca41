"""common/tools/sampler_gap.py: its argument checks, and on the embedded model a table whose float32 gap is float32
rounding, whose bfloat16 gaps are larger (the same weights, other arithmetic), and whose float16 copy's gap is
smaller than the bfloat16 copy's (10 bits of mantissa against 7: the FP16 paper's fix at the source)."""
import pytest

from common.tasks import TASKS
from common.tools import sampler_gap as G


@pytest.mark.parametrize("argv, message", [
    (["--group-size", "1"], "error: --group-size must be >= 2, got 1"),
    (["--few-shot", "-1"], "error: --few-shot must be >= 0, got -1"),
    (["--task", "nope"], f"error: --task must be one of {', '.join(TASKS)}, the path of a .jsonl file or of a .py "
                         "file of your own, got 'nope'"),  # was a ValueError's traceback after the model loaded
])
def test_bad_arguments_give_one_line(argv, message):
    with pytest.raises(SystemExit) as e:
        G.parse_args(["--model", "common/models/tiny_model", *argv])
    assert str(e.value) == message


def test_the_gap_is_float32_rounding_larger_under_bfloat16_and_smaller_in_float16(capsys):
    G.main(["--model", "common/models/long_model", "--task", "reverse", "--few-shot", "0", "--prompts", "2",
            "--group-size", "4", "--max-new-tokens", "6", "--micro-batch-size", "4", "--seeds", "1"])
    rows = [line.strip("| ").split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 ")]
    (float32,) = [row for row in rows if row[1] == "float32"]
    (bfloat16,) = [row for row in rows if row[1] == "bfloat16 autocast"]
    (bf16_copy,) = [row for row in rows if row[1] == "bfloat16 copy"]
    (fp16_copy,) = [row for row in rows if row[1] == "float16 copy"]
    assert float(float32[2]) < 1e-5 and float(float32[3]) < 1e-4
    assert float(bfloat16[2]) > float(float32[2]) and float(bf16_copy[2]) > float(float32[2])
    assert float(fp16_copy[2]) < float(bf16_copy[2])
