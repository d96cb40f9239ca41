"""common/tools/shared_prompt.py: its argument checks, and on the embedded model that the shared and the plain
passes it times compute the same log-probabilities and gradient (the figures it prints next to the timings)."""
import pytest

from common.tasks import TASKS
from common.tools import shared_prompt as S


@pytest.mark.parametrize("argv, message", [
    (["--group-size", "1"], "error: --group-size must be >= 2, got 1"),
    (["--repeats", "0"], "error: --repeats must be >= 1, got 0"),
    (["--few-shot", "-1"], "error: --few-shot values must be >= 0, got [-1]"),
    (["--task", "nope"], f"error: --task must be one of {', '.join(TASKS)}, the path of a .jsonl file or of a .py "
                         "file of your own, got 'nope'"),  # was a ValueError's traceback after the model loaded
])
def test_bad_arguments_give_one_line(argv, message):
    with pytest.raises(SystemExit) as e:
        S.parse_args(["--model", "common/models/tiny_model", *argv])
    assert str(e.value) == message


def test_shared_and_plain_passes_agree_on_the_embedded_model(capsys):
    S.main(["--model", "common/models/long_model", "--task", "reverse", "--few-shot", "0", "1", "--prompts", "2",
            "--group-size", "4", "--max-new-tokens", "6", "--repeats", "1"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and "---" not in line]
    rows = [row for row in rows if row[0] != "| few-shot"]
    assert [(row[0], row[3]) for row in rows] == [("| 0", "scoring"), ("| 0", "update"),
                                                  ("| 1", "scoring"), ("| 1", "update")]
    assert int(rows[2][1]) > int(rows[0][1])  # examples make the prompt longer
    for row in rows:
        assert float(row[7]) < 1e-4 and float(row[8].rstrip(" |")) < 1e-4  # the same log-probs and gradient
