"""common/tools/generation.py: its argument checks, and on the embedded model that a static KV cache samples the
same responses as today's dynamic one (the exactness the tool reports for each generate option)."""
import pytest

from common.tools import generation as G


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--variants", "beam"], "error: --variants: 'beam' is not one of dynamic, static, static+compile, chunks=K "
                                 "(K a positive multiple of --group-size 8)"),
        (["--variants", "chunks=12"], "error: --variants: 'chunks=12' is not one of dynamic, static, static+compile, "
                                      "chunks=K (K a positive multiple of --group-size 8)"),
        (["--repeats", "0"], "error: --repeats must be >= 1, got 0"),
    ],
)
def test_bad_arguments_give_one_line(argv, message):
    with pytest.raises(SystemExit) as e:
        G.parse_args(argv)
    assert str(e.value) == message


def test_dynamic_is_always_the_baseline():
    assert G.parse_args(["--variants", "static"]).variants == ["dynamic", "static"]


def test_static_cache_and_chunks_on_the_embedded_model(capsys):
    G.main(["--model", "common/models/tiny_model", "--task", "addition", "--few-shot", "0", "--prompts", "2",
            "--group-size", "4", "--max-new-tokens", "4", "--variants", "dynamic", "static", "chunks=4", "--repeats", "1"])
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and not line.startswith("| variant")}
    assert rows["static"][4] == "100%" and float(rows["static"][5].strip(" |")) < 1e-4  # the same samples
    assert float(rows["chunks=4"][5].strip(" |")) < 1e-4  # other shapes, the same greedy log-probs
    assert float(rows["dynamic"][3]) == 1.0
