"""The main loops of vpg.py, a2c.py, trpo.py and ppo.py feed their math correctly.

Each test runs one iteration of a file's main block in-process, in a copy of its namespace where the environment,
the agent, compute_gae, the optimiser and (for TRPO) conjugate_gradient / kl_divergence are wrapped to record
what they saw. The expected numbers come from those records and from formulas written out here, never from the
code under test:
- the rollout storage: what compute_gae receives is what the environment returned (the reward of a time-limit cut
  plus γ·V(final observation), eq. (80)-(81): common/EQUATIONS.md#eq-80), the sampled action is stored and its
  log-prob used, the environment gets the clipped one (Box spaces);
- every optimiser step's gradient is the gradient of the file's loss written out here on the kept samples
  (autoreset steps dropped, advantages normalised), at the parameters of that step, with the global-norm clip;
- TRPO's step: direction from conjugate gradient, scale sqrt(2δ / sᵀ(F + λI)s) (eq. 74), backtracking by ξ^i until
  the surrogate improves and the exact mean KL is within δ; a step that breaks the KL bound or does not improve
  is rejected;
- PPO's --target-kl stops the epochs after the one whose KL estimate mean((r − 1) − log r) passed it.
"""

import ast
import copy
import importlib
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import CLASSIC

FILES = CLASSIC
MODULES = {name: importlib.import_module(name) for name in FILES}


class _Walk(gym.Env):
    """A point on a line, pushed by a continuous action clipped to [-1, 1]; reward depends on the position;
    terminates beyond |x| > 1.5 and is cut by the time limit after 4 steps: terminations and truncations both occur."""

    observation_space = gym.spaces.Box(-10, 10, (2,))
    action_space = gym.spaces.Box(-1.0, 1.0, (1,))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = float(self.np_random.uniform(-0.5, 0.5)), 0
        return np.array([self.x, 0.0], np.float32), {}

    def step(self, action):
        assert -1.0 <= float(action[0]) <= 1.0, "the env must get the clipped action"
        self.x += float(action[0])
        self.t += 1
        return np.array([self.x, self.t], np.float32), 1.0 - self.x ** 2, abs(self.x) > 1.5, False, {}


gym.register("TestWalk-v0", entry_point=_Walk, max_episode_steps=4)


def run_main(name, argv, monkeypatch, tmp_path, **overrides):
    """Execute `name`.py's main block in a copy of its namespace with recording wrappers; returns the records."""
    module = MODULES[name]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    threads, validate = torch.get_num_threads(), torch.distributions.Distribution._validate_args
    rec = dict(agents=[], sampled=[], stored=[], env_actions=[], steps=[], resets=[], gae=[], adam=[])

    class Agent(module.Agent):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            rec["agents"].append(self)

        def get_dist(self, obs):
            dist = super().get_dist(obs)
            sample, log_prob = dist.sample, dist.log_prob

            def recording_sample(*a):
                action = sample(*a)
                rec["sampled"].append(action.clone())
                return action

            def recording_log_prob(actions):
                if actions.dim() == 3:  # the whole rollout's storage, [num_steps, num_envs, action_dim]
                    rec["stored"].append(actions.clone())
                return log_prob(actions)

            dist.sample, dist.log_prob = recording_sample, recording_log_prob
            return dist

    def make_envs(args):
        envs = module.make_envs(args)
        reset, step = envs.reset, envs.step

        def recording_reset(**kwargs):
            obs, info = reset(**kwargs)
            rec["resets"].append(obs.copy())
            return obs, info

        def recording_step(actions):
            rec["env_actions"].append(np.array(actions, copy=True))
            out = step(actions)
            rec["steps"].append(tuple(np.array(x, copy=True) for x in out[:4]))
            return out

        envs.reset, envs.step = recording_reset, recording_step
        return envs

    def compute_gae(*args):
        agent = rec["agents"][0]
        rec["gae"].append(dict(args=args, agent=copy.deepcopy(agent)))  # the agent as it sampled
        return module.compute_gae(*args)

    class Adam(module.Adam):
        fresh = False  # zero_grad() was called since the last step: this step's gradient is its own

        def zero_grad(self):
            super().zero_grad()
            self.fresh = True

        def step(self):
            rec["adam"].append(dict(optimizer=self, params=[p.detach().clone() for p in self.params],
                                    grads=[p.grad.clone() for p in self.params], fresh=self.fresh))
            self.fresh = False
            super().step()

    namespace = dict(vars(module), __name__="__main__", Agent=Agent, make_envs=make_envs, compute_gae=compute_gae,
                     Adam=Adam, **overrides)
    tree = ast.parse(open(module.__file__, encoding="utf-8").read())
    (main,) = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    try:
        exec(compile(ast.Module(body=main.body, type_ignores=[]), module.__file__, "exec"), namespace)
    finally:
        torch.set_num_threads(threads)
        torch.distributions.Distribution.set_default_validate_args(validate)
    rec["agent"] = rec["agents"][0]
    return rec


def batch_of(rec, T=12, gamma=0.9, lam=0.7):
    """The training batch of one iteration rebuilt from the records: the kept steps (not autoreset steps), their
    sampled actions, advantages of eq. (80) normalised over the batch, returns of eq. (81)."""
    snapshot = rec["gae"][0]["agent"]
    obs = [torch.tensor(rec["resets"][0])] + [torch.tensor(s[0]) for s in rec["steps"][: T - 1]]
    raw = torch.tensor(np.array([s[1] for s in rec["steps"][:T]]), dtype=torch.float32)
    term = torch.tensor(np.array([s[2] for s in rec["steps"][:T]]))
    trunc = torch.tensor(np.array([s[3] for s in rec["steps"][:T]]))
    last_obs = torch.tensor(rec["steps"][T - 1][0])
    with torch.no_grad():
        v = torch.stack([snapshot.get_value(o) for o in obs + [last_obs]])
    done = (term | trunc).float()
    dones = torch.cat([torch.zeros(1, done.shape[1]), done[:-1]])
    rewards = raw + gamma * (trunc & ~term).float() * v[1:]
    adv, ret = hand_gae(rewards.double(), v[:T].double(), dones.double(), v[T].double(), done[-1].double(), gamma, lam)
    keep = dones.reshape(-1) == 0
    b_adv = adv.reshape(-1)[keep]
    b_adv = ((b_adv - b_adv.mean()) / (b_adv.std(correction=0) + 1e-8)).float()
    sampled = torch.stack(rec["sampled"][:T])
    return torch.stack(obs).reshape(-1, obs[0].shape[-1])[keep], sampled.reshape(-1, 1)[keep], b_adv, \
        ret.reshape(-1)[keep].float()


def hand_gae(rewards, values, dones, next_value, next_done, gamma, lam):
    """eq. (80)-(81), one env at a time:
    δ_t = r_t + γ V_{t+1} (1 − d_{t+1}) − V_t, A_t = δ_t + γλ (1 − d_{t+1}) A_{t+1}."""
    T, N = rewards.shape
    adv = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            v_next, d_next = (next_value[n], next_done[n]) if t == T - 1 else (values[t + 1, n], dones[t + 1, n])
            delta = rewards[t, n] + gamma * v_next * (1 - d_next) - values[t, n]
            running = delta + gamma * lam * (1 - d_next) * running
            adv[t, n] = running
    return adv, adv + values.double()


ARGV = ["--env-id", "TestWalk-v0", "--num-envs", "3", "--num-steps", "12", "--total-timesteps", "36", "--gamma", "0.9",
        "--gae-lambda", "0.7", "--seed", "5"]
SPECIFIC = {"vpg": ["--num-minibatches", "1", "--update-epochs", "3", "--max-grad-norm", "0.3"],
            "a2c": ["--ent-coef", "0.05", "--vf-coef", "0.7", "--max-grad-norm", "0.3"],
            "trpo": ["--num-minibatches", "1", "--update-epochs", "3", "--max-grad-norm", "0.3"],
            "ppo": ["--num-minibatches", "1", "--update-epochs", "3", "--ent-coef", "0.05", "--vf-coef", "0.7",
                    "--max-grad-norm", "0.3", "--clip-eps", "0.1"]}


@pytest.mark.parametrize("name", FILES)
def test_main_loop_feeds_gae_and_every_step_is_the_loss_gradient(name, monkeypatch, tmp_path):
    rec = run_main(name, ARGV + SPECIFIC[name], monkeypatch, tmp_path)
    (gae,) = rec["gae"]
    snapshot = gae["agent"]
    rewards_in, values_in, dones_in, next_value_in, next_done_in, gamma, lam = gae["args"]
    assert (gamma, lam) == (0.9, 0.7)

    # --- the rollout as the environment saw it
    T, N = 12, 3
    obs = [torch.tensor(rec["resets"][0])] + [torch.tensor(s[0]) for s in rec["steps"]]  # obs[t] before step t
    raw = torch.tensor(np.array([s[1] for s in rec["steps"]]), dtype=torch.float32)
    term = torch.tensor(np.array([s[2] for s in rec["steps"]]))
    trunc = torch.tensor(np.array([s[3] for s in rec["steps"]]))
    assert term.any() and (trunc & ~term).any(), "the rollout should hold terminations and time-limit cuts"
    with torch.no_grad():
        v = torch.stack([snapshot.get_value(o) for o in obs])  # [T + 1, N]
    done = (term | trunc).float()
    expected_rewards = raw + 0.9 * (trunc & ~term).float() * v[1:]  # a cut bootstraps from V(final observation)
    torch.testing.assert_close(rewards_in, expected_rewards, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(values_in, v[:T], atol=1e-6, rtol=0)
    torch.testing.assert_close(dones_in, torch.cat([torch.zeros(1, N), done[:-1]]))
    torch.testing.assert_close(next_value_in, v[T], atol=1e-6, rtol=0)
    torch.testing.assert_close(next_done_in, done[-1])

    # --- the sampled action is stored (its log-prob is π_old's), the env gets it clipped to the box
    sampled = torch.stack(rec["sampled"][:T])  # [T, N, 1]
    assert (sampled.abs() > 1).any(), "some sampled actions should fall outside the box"
    torch.testing.assert_close(rec["stored"][0], sampled)
    np.testing.assert_allclose(np.stack(rec["env_actions"][:T]), np.clip(sampled.numpy(), -1.0, 1.0), rtol=0, atol=0)

    # --- the batch: autoreset steps dropped, advantages of eq. (80) normalised
    b_obs, b_actions, b_adv, b_ret = batch_of(rec)

    def losses(agent):
        """The loss of each parameter group, written out (ratio 1 at the first step)."""
        dist = agent.get_dist(b_obs)
        logp = dist.log_prob(b_actions)
        with torch.no_grad():
            old = snapshot.get_dist(b_obs).log_prob(b_actions)
        value = 0.5 * ((agent.get_value(b_obs) - b_ret) ** 2).mean()
        if name in ("vpg", "trpo"):
            return dict(actor=-(logp * b_adv).mean(), critic=value)
        entropy = dist.entropy().mean()
        if name == "a2c":
            return dict(joint=-(logp * b_adv).mean() - 0.05 * entropy + 0.7 * value)
        ratio = torch.exp(logp - old)
        surrogate = torch.min(ratio * b_adv, torch.clamp(ratio, 0.9, 1.1) * b_adv).mean()
        return dict(joint=-surrogate - 0.05 * entropy + 0.7 * value)

    critic_ids = {id(p) for p in rec["agent"].critic.parameters()}
    expected_steps = {"vpg": 1 + 3, "a2c": 1, "trpo": 3, "ppo": 3}[name]
    assert len(rec["adam"]) == expected_steps
    clipped = False
    for step in rec["adam"]:
        agent = copy.deepcopy(snapshot)
        params = dict(agent.named_parameters())
        names = [n for n, p in rec["agent"].named_parameters() if any(p is q for q in step["optimizer"].params)]
        with torch.no_grad():
            for n, value in zip(names, step["params"]):
                params[n].copy_(value)
        is_critic = all(id(p) in critic_ids for p in step["optimizer"].params)
        kind = {"vpg": "critic" if is_critic else "actor", "trpo": "critic"}.get(name, "joint")
        grads = torch.autograd.grad(losses(agent)[kind], [params[n] for n in names], allow_unused=True)
        grads = [torch.zeros_like(params[n]) if g is None else g for n, g in zip(names, grads)]
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        scale = min(1.0, 0.3 / (float(norm) + 1e-6))  # the global-norm clip, --max-grad-norm 0.3
        clipped = clipped or scale < 1
        assert step["fresh"], "the gradients must be zeroed before each step, or they pile up over iterations"
        for n, g, actual in zip(names, grads, step["grads"]):
            torch.testing.assert_close(actual, g * scale, atol=1e-5, rtol=1e-4, msg=f"{name} {kind} {n}")
    assert clipped, "the gradient clip should act in some step"


# ---------------------------------------------------------------- TRPO's step: direction, scale, line search

def actor_vector(agent):
    return torch.cat([p.detach().reshape(-1) for n, p in agent.named_parameters() if not n.startswith("critic.")])


@pytest.mark.parametrize("scenario", ["kl_bound", "improvement"])
def test_trpo_step_scale_and_line_search(scenario, monkeypatch, tmp_path):
    """The step is θ_old + ξ^i β s with s from conjugate gradient on g = ∇L (eq. 71, 73), β = sqrt(2δ / sᵀ(F + λI)s)
    (eq. 74), and i the first shrink whose surrogate improves and whose exact mean KL(π_old ‖ π) is within δ.
    "kl_bound": the full step improves the surrogate but breaks the bound (the quadratic model underestimates the
    KL of the Gaussian's log-std), so it is shrunk until it fits. "improvement": conjugate gradient's answer is
    negated, every candidate lowers the surrogate (some within δ), and the step must be refused: π stays π_old."""
    trpo = MODULES["trpo"]
    sign, directions = (-1.0 if scenario == "improvement" else 1.0), []

    def conjugate_gradient(fvp, b, iters):
        s = trpo.conjugate_gradient(fvp, b, iters)
        directions.append(dict(fvp=fvp, b=b.detach().clone(), s=s.detach().clone()))
        return sign * s

    argv = ARGV + ["--num-minibatches", "1", "--update-epochs", "1", "--max-kl", "0.02", "--cg-damping", "0.1"]
    rec = run_main("trpo", argv, monkeypatch, tmp_path, conjugate_gradient=conjugate_gradient)
    (direction,) = directions
    snapshot = rec["gae"][0]["agent"]
    b_obs, b_actions, b_adv, _ = batch_of(rec)
    actor = [p for n, p in snapshot.named_parameters() if not n.startswith("critic.")]
    with torch.no_grad():
        old_dist = snapshot.get_dist(b_obs)
        old_logp = old_dist.log_prob(b_actions)

    # g and the Fisher-vector product that conjugate gradient was given
    g = torch.autograd.grad((torch.exp(snapshot.get_dist(b_obs).log_prob(b_actions) - old_logp) * b_adv).mean(), actor)
    torch.testing.assert_close(direction["b"], torch.cat([x.reshape(-1) for x in g]), atol=1e-6, rtol=1e-5)
    kl = torch.distributions.kl_divergence(old_dist, snapshot.get_dist(b_obs)).mean()
    grad_kl = torch.cat([x.reshape(-1) for x in torch.autograd.grad(kl, actor, create_graph=True)])

    def fisher(v):  # (F + λI) v, F the Hessian of the mean KL at θ_old (eq. 72)
        return torch.cat([x.reshape(-1) for x in torch.autograd.grad(grad_kl @ v, actor, retain_graph=True)]) + 0.1 * v

    v = torch.randn(grad_kl.numel(), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(direction["fvp"](v), fisher(v), atol=1e-6, rtol=1e-5)

    # the line search, written out
    s = sign * direction["s"]
    beta = torch.sqrt(2 * 0.02 / (direction["s"] @ fisher(direction["s"])))
    theta_old = actor_vector(snapshot)
    surr_old = (torch.exp(old_logp - old_logp) * b_adv).mean()
    expected, tried = theta_old, []
    for i in range(10):
        candidate = copy.deepcopy(snapshot)
        torch.nn.utils.vector_to_parameters(theta_old + 0.8 ** i * beta * s,
                                            [p for n, p in candidate.named_parameters() if not n.startswith("critic.")])
        with torch.no_grad():
            dist = candidate.get_dist(b_obs)
            surr = (torch.exp(dist.log_prob(b_actions) - old_logp) * b_adv).mean()
            kl_i = torch.distributions.kl_divergence(old_dist, dist).mean()
        tried.append((bool(surr >= surr_old), bool(kl_i <= 0.02)))
        if surr >= surr_old and kl_i <= 0.02:
            expected = actor_vector(candidate)
            break
    if scenario == "kl_bound":  # the full step improves but breaks δ; a shorter one is taken
        assert tried[0] == (True, False) and len(tried) > 1 and tried[-1] == (True, True)
    else:  # every candidate lowers the surrogate, some are within δ
        assert not any(t[0] for t in tried) and any(t[1] for t in tried)
    torch.testing.assert_close(actor_vector(rec["agent"]), expected, atol=1e-6, rtol=0)
    assert torch.equal(actor_vector(rec["agent"]), theta_old) == (scenario == "improvement")


# ---------------------------------------------------------------- PPO's early stop on the KL estimate

def test_ppo_target_kl_stops_after_the_epoch_that_passed_it(monkeypatch, tmp_path):
    """--target-kl: each epoch ends by comparing mean((r − 1) − log r) of its last minibatch (before its step) with
    the target, and stops the epochs once it is larger. With one minibatch per epoch the estimate of epoch e is
    that of the parameters after e − 1 steps: the target set between epochs 2 and 3's estimates stops after 3."""
    argv = ARGV + ["--num-minibatches", "1", "--update-epochs", "4"]
    rec = run_main("ppo", argv, monkeypatch, (tmp_path / "a").mkdir() or tmp_path / "a")
    assert len(rec["adam"]) == 4
    snapshot = rec["gae"][0]["agent"]
    b_obs, b_actions, _, _ = batch_of(rec)
    with torch.no_grad():
        old_logp = snapshot.get_dist(b_obs).log_prob(b_actions)
    estimates = []
    for step in rec["adam"]:
        agent = copy.deepcopy(snapshot)
        with torch.no_grad():
            for p, value in zip(agent.parameters(), step["params"]):
                p.copy_(value)
            log_ratio = agent.get_dist(b_obs).log_prob(b_actions) - old_logp
        estimates.append(float(((log_ratio.exp() - 1) - log_ratio).mean()))
    assert estimates[0] < 1e-9 < estimates[1] < estimates[2]
    target = (estimates[1] + estimates[2]) / 2
    assert target < len(b_obs) * estimates[1]  # a sum instead of a mean would stop one epoch early
    rec = run_main("ppo", argv + ["--target-kl", str(target)], monkeypatch, (tmp_path / "b").mkdir() or tmp_path / "b")
    assert len(rec["adam"]) == 3
