"""Classic control as a new user meets it: missing env packages, offset Discrete actions, the console,
the effective number of steps (none lost with the defaults), and loading a saved agent the way common/GUIDE.md shows.

Everything runs in-process (a new python process costs seconds): make_envs for the env errors, the
scripts' main loop through runpy for the rest.
"""
import atexit
import dataclasses
import importlib
import os
import re
import signal

import gymnasium as gym
import numpy as np
import pytest

from common.tools.benchmark import read_scalars
from conftest import CLASSIC, ROOT

FILES = CLASSIC
MODULES = {name: importlib.import_module(name) for name in FILES}


# ---------------------------------------------------------------------------------------------
# An env whose package is missing: one line naming --env-id and what to install


def _needs_a_missing_package(**kwargs):
    raise gym.error.DependencyNotInstalled('Foo is not installed, run `pip install "gymnasium[foo]"`')


def _needs_a_missing_module(**kwargs):
    import no_such_module_for_this_test  # noqa: F401  (a third-party env whose import fails)


gym.register("TestMissingPackage-v0", entry_point=_needs_a_missing_package)
gym.register("TestMissingModule-v0", entry_point=_needs_a_missing_module)


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("env_id,hint", [("TestMissingPackage-v0", 'pip install "gymnasium[foo]"'),
                                         ("TestMissingModule-v0", "no_such_module_for_this_test")])
def test_missing_env_package_is_one_line(name, env_id, hint):
    args = dataclasses.replace(MODULES[name].Args(), env_id=env_id)
    MODULES[name].check_args(args)  # registered: only building it fails
    with pytest.raises(SystemExit) as exc:
        MODULES[name].make_envs(args)
    msg = str(exc.value.code)
    assert msg.startswith(f"error: --env-id {env_id} needs a package") and hint in msg and "\n" not in msg, msg


def test_lunar_lander_without_box2d_names_the_extra():
    try:
        import Box2D  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("box2d is installed here")
    with pytest.raises(SystemExit) as exc:
        MODULES["ppo"].make_envs(dataclasses.replace(MODULES["ppo"].Args(), env_id="LunarLander-v3"))
    msg = str(exc.value.code)
    assert 'pip install "gymnasium[box2d]"' in msg and "\n" not in msg, msg


# ---------------------------------------------------------------------------------------------
# In-process runs of the main loop


class _OffsetDiscreteEnv(gym.Env):
    """Actions are -1, 0, 1 (Discrete(3, start=-1)); any other action is an error. Records what it got."""

    observation_space = gym.spaces.Box(-1, 1, (2,))
    action_space = gym.spaces.Discrete(3, start=-1)
    seen = set()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action} is not in {self.action_space}")
        _OffsetDiscreteEnv.seen.add(int(action))
        return np.zeros(2, np.float32), float(action), False, False, {}


gym.register("TestOffsetDiscrete-v0", entry_point=_OffsetDiscreteEnv, max_episode_steps=8)


@pytest.mark.parametrize("name", FILES)
def test_discrete_actions_with_a_start_offset(name, in_process):
    _OffsetDiscreteEnv.seen.clear()
    in_process(name, ["--env-id", "TestOffsetDiscrete-v0", "--total-timesteps", "512", "--num-envs", "2",
                      "--num-steps", "64"])
    assert _OffsetDiscreteEnv.seen == {-1, 0, 1}


@pytest.mark.parametrize("name", FILES)
def test_console_says_the_effective_steps_and_prints_about_once_a_second(name, in_process):
    # 1,000 steps in rollouts of 2 envs x 64 steps: 7 whole rollouts = 896 steps
    argv = ["--total-timesteps", "1000", "--num-envs", "2", "--num-steps", "64"]
    run_dir, out = in_process(name, argv)
    lines = out.splitlines()
    assert lines[0] == "CartPole-v1: 896 env steps = 7 iterations x 2 envs x 64 steps", lines[0]
    assert "--total-timesteps 1,000" in lines[1] and "training 896 steps" in lines[1], lines[1]
    progress = [line for line in lines if line.startswith("step ")]
    assert progress[-1].startswith("step      896 | return")  # the last iteration always prints
    # 7 iterations in well under a second: a line per iteration would be 7 lines, not 2
    sps_times = [w for w, _, _ in read_scalars(str(run_dir))["charts/SPS"]]
    wall = max(sps_times) - min(sps_times)
    assert len(progress) <= wall + 2, (len(progress), wall)


@pytest.mark.parametrize("name", FILES)
def test_defaults_train_whole_rollouts_so_a_plain_run_prints_no_note(name):
    # `python ppo.py` is the quick start's first command: it must not warn about its own defaults
    args = MODULES[name].Args()
    MODULES[name].check_args(args)
    batch_size = args.num_envs * args.num_steps
    whole = args.total_timesteps // batch_size * batch_size
    assert args.total_timesteps == whole, (f"{name}.py: the default --total-timesteps {args.total_timesteps:,} is not "
                                           f"a multiple of num_envs*num_steps = {batch_size}: use {whole:,}")


# ---------------------------------------------------------------------------------------------
# The guide's snippet that loads a saved agent and runs evaluation episodes


def _readme_snippet():
    readme = open(os.path.join(ROOT, "common", "GUIDE.md")).read()
    section = readme.split("## Loading a saved classic agent", 1)[1]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


def test_readme_snippet_loads_a_saved_agent_and_matches_training(in_process, monkeypatch, capsys):
    # trained with --norm-obs, so the snippet must also apply the saved observation statistics (without
    # them this agent scores ~87 against ~448 with them and ~386 over its last 20 training episodes)
    run_dir, _ = in_process("ppo", ["--total-timesteps", "16384", "--norm-obs", "--save-model"])
    training = [v for _, _, v in read_scalars(str(run_dir))["charts/episodic_return"]][-20:]
    code = _readme_snippet()
    code, n = re.subn(r'^path = ".*"$', f'path = "{run_dir / "ppo.pt"}"', code, flags=re.M)
    assert n == 1, "the guide's snippet must set `path = \"...\"` on one line"
    monkeypatch.syspath_prepend(ROOT)
    namespace = {}
    exec(compile(code, "common/GUIDE.md", "exec"), namespace)
    returns = namespace["returns"]
    assert len(returns) == 10 and f"mean return over 10 episodes: {np.mean(returns):.1f}" in capsys.readouterr().out
    assert np.mean(training) > 200, training  # well above a random policy (~20)
    assert np.mean(returns) > 0.8 * np.mean(training), (returns, training)


# ---------------------------------------------------------------------------------------------
# A run stopped by Ctrl-C or SIGTERM: one line saying where it stopped and where it went, 128 + the signal


class _SignalledEnv(gym.Env):
    """Sends `number` to this process at the `at`-th step over all its instances, as Ctrl-C would mid-run."""

    observation_space = gym.spaces.Box(-1, 1, (2,))
    action_space = gym.spaces.Discrete(2)
    steps, at, number = 0, 150, None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        _SignalledEnv.steps += 1
        if _SignalledEnv.steps == _SignalledEnv.at:
            os.kill(os.getpid(), _SignalledEnv.number)
        return np.zeros(2, np.float32), 1.0, False, False, {}


gym.register("TestSignalled-v0", entry_point=_SignalledEnv, max_episode_steps=8)


@pytest.mark.parametrize("name, number", [("vpg", signal.SIGINT), ("a2c", signal.SIGTERM), ("trpo", signal.SIGINT),
                                          ("ppo", signal.SIGTERM)])
def test_a_stopped_run_says_where_it_stopped_and_keeps_its_logs(name, number, in_process, monkeypatch):
    _SignalledEnv.steps, _SignalledEnv.number = 0, number
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # unhandled, a KeyboardInterrupt: not pytest's end
    closers = []
    monkeypatch.setattr(atexit, "register", closers.append)  # what the script leaves for Python's exit
    try:
        run_dir, out = in_process(name, ["--env-id", "TestSignalled-v0", "--total-timesteps", "512", "--num-envs",
                                         "2", "--num-steps", "64"])
    except KeyboardInterrupt:
        pytest.fail("the signal ended the run in a KeyboardInterrupt traceback")
    assert in_process.exit_code == 128 + number
    # the signal came at the 150th env step, in the second rollout of 2 x 64 (steps 129-256; resets are steps too)
    last = out.rstrip("\n").splitlines()[-1]
    stopped = re.fullmatch(rf"{number.name}: stopped at step (\d+) of 512; the run so far: runs/{run_dir.name}", last)
    assert stopped and 128 < int(stopped.group(1)) <= 256, last
    for close in closers:  # as at exit: the writer flushes what the stopped run logged
        close()
    assert len(read_scalars(str(run_dir))["charts/SPS"]) == 1  # the first rollout's iteration


def test_the_classic_files_stay_on_one_thread_as_the_readme_says(in_process, monkeypatch):
    # the group files' embedded runs take OMP_NUM_THREADS (tests/test_group_runs.py); these files do not
    import torch

    readme = " ".join(open(os.path.join(ROOT, "README.md")).read().split())
    assert ("In the group files `OMP_NUM_THREADS=N` chooses the count; the classic files stay on one thread whatever "
            "it says") in readme
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    for name in FILES:
        torch.set_num_threads(2)  # the fixture puts back the suite's count
        in_process(name, ["--total-timesteps", "128", "--num-envs", "2", "--num-steps", "64"], subdir=name)
        assert torch.get_num_threads() == 1, name
