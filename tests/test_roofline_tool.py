"""common/tools/roofline.py: its argument checks, and on an embedded model that the FLOPs it counts add up: the
update runs the passes scoring runs, forward and backward (about 3× the forward's FLOPs), the iteration is the sum of
its phases, every share of the peak lies between 0 and 1, and the split of the seconds adds up."""
import pytest

from common.tasks import TASKS
from common.tools import roofline as R


@pytest.mark.parametrize("argv, message", [
    (["--group-size", "1"], "error: --group-size must be >= 2, got 1"),
    (["--repeats", "0"], "error: --repeats must be >= 1, got 0"),
    (["--ops", "-1"], "error: --ops must be >= 0, got -1"),
    (["--few-shot", "-1"], "error: --few-shot values must be >= 0, got [-1]"),
    (["--prompts", "6"], "error: --num-minibatches must divide --prompts, and --micro-batch-size the responses of a "
                         "minibatch, got 4 and 16"),
    (["--root", "common"], "error: --root common: no grpo.py there"),
])
def test_bad_arguments_give_one_line(argv, message):
    with pytest.raises(SystemExit) as e:
        R.parse_args(["--model", "common/models/tiny_model", *argv])
    assert str(e.value) == message


def test_an_unknown_task_is_one_line_before_the_model_loads():
    with pytest.raises(SystemExit) as e:  # was a ValueError's traceback after the model and the matmul peak
        R.main(["--model", "common/models/tiny_model", "--task", "nope"])
    assert str(e.value) == (f"error: --task must be one of {', '.join(TASKS)}, the path of a .jsonl file or of a .py "
                            "file of your own, got 'nope'")


def test_the_flops_of_the_phases_add_up_on_the_embedded_model(capsys):
    R.main(["--model", "common/models/long_model", "--task", "reverse", "--few-shot", "1", "--prompts", "4",
            "--num-minibatches", "2", "--micro-batch-size", "8", "--group-size", "4", "--max-new-tokens", "6",
            "--repeats", "1"])
    rows = [line.strip("| ").split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and "---" not in line and not line.startswith("| few-shot")]
    assert [row[3] for row in rows] == ["generation", "scoring", "update", "iteration"]
    flops = {row[3]: float(row[4]) for row in rows}
    seconds = {row[3]: float(row[5]) for row in rows}
    assert 2.5 < flops["update"] / flops["scoring"] < 3.5  # the same passes, with a backward pass of ~2× the forward
    assert flops["iteration"] == pytest.approx(flops["generation"] + flops["scoring"] + flops["update"], abs=0.15)
    assert seconds["iteration"] == pytest.approx(seconds["generation"] + seconds["scoring"] + seconds["update"],
                                                 rel=0.02)
    for row in rows:
        assert 0 < float(row[7].rstrip("%")) <= 100
        shares = [float(cell.rstrip("%")) for cell in row[9:12]]  # in matmuls, in other ops, in Python
        assert all(0 <= share <= 100 for share in shares) and shares[0] > 0 and shares[1] > 0


def test_the_operation_timer_sorts_matmuls_from_the_rest_and_sees_the_backward_pass():
    import torch

    a = torch.randn(64, 64, requires_grad=True)
    product = (a @ a).sum()  # built outside the timer: only its backward pass (two products) runs inside
    assert R.matmul_and_other(R.op_seconds(product.backward))[0] > 0
    ops = R.op_seconds(lambda: torch.randn(64, 64).softmax(-1).exp())
    assert {"randn", "_softmax", "exp"} <= set(ops)
    matmul, other = R.matmul_and_other(ops)
    assert matmul == 0 and other > 0


def test_attention_on_a_cpu_is_counted_as_the_gpus_kernels_are():
    """The CPU's attention kernel has no formula in torch's FLOP counter: without one its products counted 0."""
    import torch

    b, h, t, d = 2, 3, 16, 8
    query = torch.randn(b, h, t, d, requires_grad=True)
    key, value = torch.randn(b, 1, t, d), torch.randn(b, 1, t, d)  # grouped-query: one key/value head for three

    def attend():
        attention = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)
        attention.sum().backward()

    product = 2 * b * h * t * t * d  # one [t, d] × [d, t] product per head, a multiply-add = 2 FLOPs
    # forward: scores and their weighted sum; backward: the scores again and four gradient products
    assert R.measure(attend, repeats=1)["flops"] == 2 * product + 5 * product
