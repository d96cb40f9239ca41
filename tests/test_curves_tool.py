"""common/tools/curves.py: held-out accuracy against minutes, read back from a run's TensorBoard log."""
import pytest

from common.tools import curves as C


def test_curves_of_a_run_and_bad_arguments(in_process, tmp_path, capsys):
    run_dir, _ = in_process("grpo", ["--num-iterations", "2", "--eval-every", "1", "--prompts-per-iteration", "2",
                                     "--num-minibatches", "1", "--eval-size", "4"])
    data = C.curves(str(run_dir), "iterations")
    assert data["charts/accuracy"][0] == [0, 1, 2] and len(data["charts/greedy_accuracy"][1]) == 3
    minutes = C.curves(str(run_dir), "minutes")["charts/accuracy"][0]
    assert minutes[0] == 0 and minutes == sorted(minutes)  # from the end of the first evaluation
    C.main([str(run_dir), "--labels", "grpo", "--out", str(tmp_path / "c.png")])
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    for argv, message in (([str(run_dir), "--labels", "a", "b"], "one label per run"),
                          ([str(tmp_path / "nothing")], "no such run folder")):
        with pytest.raises(SystemExit):
            C.main(argv)
        assert message in capsys.readouterr().err
