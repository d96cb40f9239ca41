"""Shared pytest setup: the repository root importable (tests import the algorithm files), the lists of
algorithm files, the order of the files under xdist, and one fixture that runs a script's main block in this
process. Under pytest-xdist (`-n 2`, the README's command) each worker and the processes it starts compute on one
thread: two workers of two threads each on two cores ran slower than one worker."""
import gc
import os
import runpy
import sys

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported here, and for every subprocess

import pytest  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
CLASSIC = ["vpg", "a2c", "trpo", "ppo"]
GROUP = ["grpo", "dr_grpo", "dapo", "gspo", "sapo"]


# The slowest files (11-58 s each in a run of the suite on 2 cores, 2026-11-29), slowest first but the two that launch
# torchrun (both cores busy) apart. Under xdist each worker takes the next file when nearly done with its own, in the
# order of the collection (loadscopereorder off below): the long files start early and the two workers end close
# together, not one waiting for a long file begun last. Every other file follows, in its usual order.
SLOWEST_FIRST = ["test_gpu_check.py", "test_classic_cli.py", "test_group_distributed.py", "test_group_real_models.py",
                 "test_group_runs.py", "test_group_fsdp.py", "test_lab.py", "test_grpo.py", "test_group_update.py",
                 "test_decoding.py", "test_classic_rough_edges.py", "test_scale.py"]


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # xdist's own order is by number of tests: fast files first
        config.option.loadscopereorder = False
    # torch's own: inductor imports torch.utils.mkldnn, which still uses what torch 2.13 deprecates (nothing here does)
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


def pytest_collection_modifyitems(items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process (tests.mutate's -x runs): the files in the order given
        return
    rank = {name: place for place, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's tests in their order


def pytest_collection_finish(session):
    """Python's full garbage collections walk every object alive, and once the tests are collected those are
    millions: torch's, transformers' and the test modules'. Frozen (they live until the end anyway), they are left
    out of the walks. Measured on a loaded machine, a worker's full collections took 19-21 s before, 9-16 s after."""
    gc.freeze()


@pytest.fixture
def in_process(monkeypatch, tmp_path, capsys):
    """`run(name, argv, subdir=".") -> (run_dir, stdout)`: `name`.py's main block in this process, from the folder
    tmp_path/subdir (no subprocess: torch and transformers are imported once for the whole suite). run_dir is the
    run's log folder under runs/ (None unless there is exactly one). A run stopped by a signal returns too, its exit
    status (130, 143) in run.exit_code (0 otherwise). Restores the torch globals and the signal handlers a script
    sets."""
    import signal

    import torch

    threads, validate = torch.get_num_threads(), torch.distributions.Distribution._validate_args
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}  # a run sets its own

    def run(name, argv, subdir="."):
        name = name.removesuffix(".py")
        cwd = tmp_path / subdir
        cwd.mkdir(exist_ok=True)
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
        capsys.readouterr()
        run.exit_code = 0
        try:
            runpy.run_path(os.path.join(ROOT, f"{name}.py"), run_name="__main__")
        except SystemExit as e:
            if e.code not in (130, 143):  # a run stopped by SIGINT or SIGTERM: its exit code is kept in run.exit_code
                raise
            run.exit_code = e.code
        runs = list((cwd / "runs").iterdir()) if (cwd / "runs").is_dir() else []
        return (runs[0] if len(runs) == 1 else None), capsys.readouterr().out

    yield run
    for number, handler in handlers.items():
        signal.signal(number, handler)
    torch.set_num_threads(threads)
    torch.distributions.Distribution.set_default_validate_args(validate)
