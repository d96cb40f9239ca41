"""A2C: synchronous advantage actor-critic (Mnih et al. 2016, A3C's synchronous form, arXiv 1602.01783).

Equations: common/EQUATIONS.md#sec-a2c. `num_envs` environments step in lockstep (one vectorised env); after every
`num_steps` steps the agent takes ONE gradient step, actor and critic together, on

    loss = -mean(log pi(a_t|s_t) A_t) + c1 * mean((V(s_t) - G_t)^2) / 2 - c2 * entropy

The actor term is the advantage policy gradient of eq. (47) with A_t = G_t - V(s_t) (eq. 46); the
critic regresses on G_t, the n-step return bootstrapped from the critic at the end of the rollout
(G_t = r_t + gamma r_{t+1} + ... + gamma^(n-t) V(s_n)), a multi-step form of the TD target of
eq. (44)-(45). Both come from compute_gae with lambda = 1 over the rollout (eq. 80-81).

A3C (common/EQUATIONS.md#sec-a3c) computes the same gradient, but in asynchronous workers that each hold a copy
of the parameters, act in their own env and push gradients to a shared model whenever they finish
a rollout, so updates are computed from slightly stale parameters. A2C waits for all envs and takes
one synchronous step: simpler, deterministic, and as fast on one machine. A3C is not implemented.
(The A3C paper used RMSprop; this file uses Adam, like its siblings.)

Compared with its siblings:
  - ppo.py reuses each rollout for several epochs of minibatch steps; that needs the probability
    ratio and its clip (eq. 76-79), as A2C's loss is only the policy gradient at the sampling policy;
  - vpg.py uses Monte-Carlo returns of whole batches of episodes (the critic is only a baseline)
    and fits its critic in separate steps; trpo.py takes a KL-bounded natural-gradient step.
`diff vpg.py a2c.py` and `diff a2c.py ppo.py` show exactly those differences.

Defaults are tuned for CartPole-v1; the flags for the others: common/results/classic.md#flags-per-environment.
Run: python a2c.py --help
"""

import atexit
import difflib
import os
import random
import signal
import time
from collections import deque
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions import Categorical, Independent, Normal


@dataclass
class Args:
    env_id: str = "CartPole-v1"
    """gymnasium environment id (Discrete or Box action space)"""
    total_timesteps: int = 200_000
    """environment steps to train for, summed over all parallel envs (rounded down to whole rollouts)"""
    num_envs: int = 8
    """number of parallel environments (one vectorised env)"""
    num_steps: int = 8
    """steps per env per rollout (the n of the n-step return); the batch is num_envs * num_steps"""
    learning_rate: float = 1e-3
    """Adam step size for actor and critic"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over the run"""
    gamma: float = 0.98
    """discount factor"""
    gae_lambda: float = 1.0
    """GAE lambda (eq. 80): 1 = n-step returns over the rollout (A2C), < 1 = GAE"""
    norm_adv: bool = True
    """normalise advantages to zero mean, unit std over the batch"""
    ent_coef: float = 0.0
    """entropy bonus coefficient c2 (eq. 85)"""
    vf_coef: float = 0.5
    """value loss coefficient c1 (eq. 85)"""
    max_grad_norm: float = 0.5
    """clip the global gradient norm to this value"""
    norm_obs: bool = False
    """normalise observations with running mean/std (gymnasium NormalizeObservation)"""
    norm_reward: bool = False
    """scale rewards by a running std of the discounted return (gymnasium NormalizeReward)"""
    seed: int = 1
    """seed of random, numpy, torch and the environments"""
    save_model: bool = False
    """save the trained agent to runs/{run_name}/"""


def check_args(args: Args) -> None:
    """Exit with one clear line if an argument is out of range, before any env is built."""
    if args.env_id not in gym.envs.registry:
        close = difflib.get_close_matches(args.env_id, gym.envs.registry.keys(), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "e.g. CartPole-v1, Acrobot-v1, Pendulum-v1"
        raise SystemExit(f"error: --env-id {args.env_id!r} is not a registered gymnasium environment ({hint})")
    positive = [
        ("--total-timesteps", args.total_timesteps),
        ("--num-envs", args.num_envs),
        ("--num-steps", args.num_steps),
        ("--learning-rate", args.learning_rate),
        ("--max-grad-norm", args.max_grad_norm),
    ]
    for flag, value in positive:
        if not value > 0:
            raise SystemExit(f"error: {flag} must be > 0 (got {value})")
    if args.num_steps < 2:  # a 1-step rollout can hold only an autoreset step (see make_envs): no sample
        raise SystemExit(f"error: --num-steps must be >= 2 (got {args.num_steps})")
    batch_size = args.num_envs * args.num_steps
    if args.total_timesteps < batch_size:
        raise SystemExit(f"error: --total-timesteps must be >= num_envs*num_steps = {batch_size} "
                         f"(got {args.total_timesteps})")
    for flag, value in [("--gamma", args.gamma), ("--gae-lambda", args.gae_lambda)]:
        if not 0.0 <= value <= 1.0:
            raise SystemExit(f"error: {flag} must be in [0, 1] (got {value})")
    if not 0 <= args.seed < 2**32:  # numpy's and gymnasium's seeds are 32-bit, unsigned
        raise SystemExit(f"error: --seed must be in [0, 2**32) (got {args.seed})")
    for flag, value in [("--ent-coef", args.ent_coef), ("--vf-coef", args.vf_coef)]:
        if not value >= 0:
            raise SystemExit(f"error: {flag} must be >= 0 (got {value})")


def make_envs(args: Args) -> gym.vector.VectorEnv:
    """The vectorised env: gymnasium's native vector implementation if the env has one, else sync."""
    # make_vec picks the env's own vectorised class when it registers one (CartPole does: the
    # physics of all envs is stepped as one numpy array), else a SyncVectorEnv of single envs.
    try:
        envs = gym.make_vec(args.env_id, num_envs=args.num_envs)
    except (gym.error.DependencyNotInstalled, ImportError) as e:  # e.g. LunarLander-v3 without box2d
        raise SystemExit(f"error: --env-id {args.env_id} needs a package that is not installed: "
                         f"{' '.join(str(e).split())}") from None
    # Both use the default NEXT_STEP autoreset: the step that returns terminated/truncated also
    # returns the episode's FINAL observation; the next step() ignores its action and resets.
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)  # innermost: logs raw returns
    if args.norm_reward:
        envs = gym.wrappers.vector.NormalizeReward(envs, gamma=args.gamma)
    if args.norm_obs:  # outermost, so that envs.obs_rms is the running mean/var to save
        envs = gym.wrappers.vector.NormalizeObservation(envs)
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    if not (isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1):
        envs.close()
        raise SystemExit(f"error: --env-id {args.env_id}: observation space {obs_space} is not supported "
                         "(allowed: a flat Box)")
    if not (isinstance(act_space, gym.spaces.Discrete)
            or (isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1)):
        envs.close()
        raise SystemExit(f"error: --env-id {args.env_id}: action space {act_space} is not supported "
                         "(allowed: Discrete, or a flat Box)")
    return envs


def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """Generalised advantage estimation, eq. (80), and the value targets of eq. (81).

    rewards, values, dones: [T, N] tensors (time-major, one column per env); next_value, next_done:
    [N], for the observation that follows the last step. dones[t] = 1 means obs[t] arrived with
    terminated or truncated, i.e. the episode ended at step t-1: nothing flows back across it.
    Time-limit truncation is NOT a termination: the caller has already added gamma * V(final obs)
    to the reward of a truncated step, so cutting there still bootstraps.
    """
    values = torch.cat([values, next_value[None]])
    dones = torch.cat([dones, next_done[None]])
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        nonterminal = 1.0 - dones[t + 1]
        delta = rewards[t] + gamma * values[t + 1] * nonterminal - values[t]  # TD error, eq. (44)
        lastgaelam = delta + gamma * gae_lambda * nonterminal * lastgaelam  # eq. (80)
        advantages[t] = lastgaelam
    returns = advantages + values[:-1]  # V_targ = A + V_old, eq. (81)
    return advantages, returns


def normalize(x):
    """Zero mean, unit std; a batch with zero spread (or one element) gives zeros, never NaN."""
    return (x - x.mean()) / (x.std(correction=0) + 1e-8)


def policy_loss(logprobs, advantages):
    """Advantage policy gradient, eq. (47), as a loss: its gradient is -mean(A * grad log pi)."""
    return -(logprobs * advantages).mean()


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    """Orthogonal weights, constant bias: the standard init for PPO-family MLPs."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim, out_dim, out_std):
    """64-64 tanh MLP; out_std scales the last layer (0.01 for the actor: near-uniform start)."""
    return nn.Sequential(
        layer_init(nn.Linear(in_dim, 64)), nn.Tanh(),
        layer_init(nn.Linear(64, 64)), nn.Tanh(),
        layer_init(nn.Linear(64, out_dim), std=out_std),
    )


class Agent(nn.Module):
    """Separate actor (policy) and critic (value) networks.

    Discrete actions: the actor outputs logits of a Categorical. Box actions: the actor outputs the
    mean of a diagonal Gaussian whose log-std is a learned vector that does not depend on the state.
    """

    def __init__(self, obs_dim, action_space):
        super().__init__()
        self.critic = mlp(obs_dim, 1, out_std=1.0)
        self.continuous = isinstance(action_space, gym.spaces.Box)
        if self.continuous:
            self.actor = mlp(obs_dim, action_space.shape[0], out_std=0.01)
            self.actor_logstd = nn.Parameter(torch.zeros(action_space.shape[0]))
        else:
            self.actor = mlp(obs_dim, action_space.n, out_std=0.01)

    def get_value(self, obs):
        return self.critic(obs).squeeze(-1)

    def get_dist(self, obs):
        if self.continuous:
            mean = self.actor(obs)
            # Independent(..., 1) sums log-probs and entropies over action dimensions
            return Independent(Normal(mean, self.actor_logstd.exp().expand_as(mean)), 1)
        return Categorical(logits=self.actor(obs))


class Adam:
    """Adam (Kingma & Ba, 2015): the update of torch.optim.Adam, written out in a few lines.

    Why not torch.optim? Constructing any torch.optim optimizer imports torch._dynamo, a start-up cost
    that is a large share of the time ppo.py needs to solve CartPole (both measured in
    common/results/classic.md#how-ppopy-solves-cartpole-in-about-3-seconds). The update is the same
    (tests/test_classic_losses.py checks it).
    """

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-5):
        self.params, self.lr, self.betas, self.eps, self.t = list(params), lr, betas, eps, 0
        self.m = [torch.zeros_like(p) for p in self.params]  # running mean of the gradient
        self.v = [torch.zeros_like(p) for p in self.params]  # running mean of its square

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        self.t += 1
        beta1, beta2 = self.betas
        for p, m, v in zip(self.params, self.m, self.v):
            m.lerp_(p.grad, 1 - beta1)
            v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            m_hat, v_hat = m / (1 - beta1**self.t), v / (1 - beta2**self.t)  # bias correction
            p.sub_(self.lr * m_hat / (v_hat.sqrt() + self.eps))


if __name__ == "__main__":
    args = tyro.cli(Args)
    check_args(args)
    envs = make_envs(args)  # exits with one clear line if the env's spaces are not supported
    algo = os.path.basename(__file__)[: -len(".py")]
    run_name = f"{args.env_id}__{algo}__{args.seed}__{int(time.time())}"
    from torch.utils.tensorboard import SummaryWriter  # imported here: it is slow to import

    writer = SummaryWriter(f"runs/{run_name}")
    atexit.register(writer.close)  # a run stopped by a signal keeps what it logged
    table = "\n".join(f"|{k}|{v}|" for k, v in vars(args).items())
    writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")

    # Seeding: the same seed gives the same run twice on CPU.
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    # The networks are tiny: extra threads and argument validation cost more than they save.
    torch.set_num_threads(1)
    torch.distributions.Distribution.set_default_validate_args(False)

    obs_dim = envs.single_observation_space.shape[0]
    agent = Agent(obs_dim, envs.single_action_space)
    optimizer = Adam(agent.parameters(), lr=args.learning_rate)

    # Rollout storage, time-major: [num_steps, num_envs, ...]
    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim))
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape)
    rewards = torch.zeros((args.num_steps, args.num_envs))
    dones = torch.zeros((args.num_steps, args.num_envs))

    batch_size = args.num_envs * args.num_steps
    num_iterations = args.total_timesteps // batch_size
    total_steps = num_iterations * batch_size  # whole rollouts only
    print(f"{args.env_id}: {total_steps:,} env steps = {num_iterations} iterations x {args.num_envs} envs "
          f"x {args.num_steps} steps")
    if total_steps != args.total_timesteps:
        print(f"note: --total-timesteps {args.total_timesteps:,} is not a multiple of num_envs*num_steps = "
              f"{batch_size}: training {total_steps:,} steps")
    global_step = 0
    recent_returns = deque(maxlen=20)
    start_time = time.time()
    last_print = 0.0  # the console gets about one line per second, and always the last iteration

    def stop(number, frame):  # Ctrl-C or SIGTERM: one line, no traceback, status 128 + the signal's number
        print(f"\n{signal.Signals(number).name}: stopped at step {global_step:,} of {total_steps:,}; "
              f"the run so far: runs/{run_name}", flush=True)
        raise SystemExit(128 + number)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.tensor(next_obs, dtype=torch.float32)
    next_done = torch.zeros(args.num_envs)

    for iteration in range(1, num_iterations + 1):
        frac = 1.0 - (iteration - 1.0) / num_iterations  # 1 -> 0 over the run, for --anneal-lr
        if args.anneal_lr:
            optimizer.lr = args.learning_rate * frac

        # 1. Sampling: run the current policy pi_old for num_steps steps in every env.
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done
            with torch.no_grad():
                action = agent.get_dist(next_obs).sample()
            actions[step] = action
            env_action = action.numpy()
            if agent.continuous:  # the Gaussian is unbounded; the env gets the clipped action
                env_action = np.clip(env_action, envs.single_action_space.low, envs.single_action_space.high)
            else:  # Discrete(n, start=k) numbers its actions k..k+n-1; the Categorical samples 0..n-1
                env_action = env_action + envs.single_action_space.start
            next_obs, reward, terminations, truncations, infos = envs.step(env_action)
            next_obs = torch.tensor(next_obs, dtype=torch.float32)
            # Truncation is not termination: a time-limit cut stops the episode, not the return.
            # Bootstrap from the value of the final observation (which NEXT_STEP returns as next_obs).
            truncated = truncations & ~terminations
            if truncated.any():
                with torch.no_grad():
                    reward = reward + args.gamma * truncated * agent.get_value(next_obs).numpy()
            rewards[step] = torch.as_tensor(reward, dtype=torch.float32)
            next_done = torch.as_tensor(terminations | truncations, dtype=torch.float32)
            if "episode" in infos:  # RecordEpisodeStatistics: the envs whose episode ended at this step
                finished = infos["_episode"]
                for ret, length in zip(infos["episode"]["r"][finished], infos["episode"]["l"][finished]):
                    recent_returns.append(ret)
                    writer.add_scalar("charts/episodic_return", ret, global_step)
                    writer.add_scalar("charts/episodic_length", length, global_step)

        # 2. n-step returns and advantages from the critic: eq. (80)-(81) with lambda = 1.
        with torch.no_grad():
            # log pi_old(a|s) and V_old(s) of the whole rollout in one batched pass (cheaper than per step)
            logprobs = agent.get_dist(obs).log_prob(actions)
            values = agent.get_value(obs)
            next_value = agent.get_value(next_obs)
            advantages, returns = compute_gae(rewards, values, dones, next_value, next_done,
                                              args.gamma, args.gae_lambda)

        # Flatten the batch, dropping the autoreset steps: with NEXT_STEP autoreset, a step whose
        # obs is the final obs of an episode (dones == 1) only resets its env, it is no sample.
        keep = dones.reshape(-1) == 0
        b_obs = obs.reshape(-1, obs_dim)[keep]
        b_actions = actions.reshape((-1,) + envs.single_action_space.shape)[keep]
        b_logprobs = logprobs.reshape(-1)[keep]
        b_advantages = advantages.reshape(-1)[keep]
        b_returns = returns.reshape(-1)[keep]
        if args.norm_adv:
            b_advantages = normalize(b_advantages)

        # 3. One gradient step on the whole batch, actor and critic together: eq. (47) and (45).
        dist = agent.get_dist(b_obs)
        newlogprob = dist.log_prob(b_actions)
        entropy = dist.entropy().mean()
        pg_loss = policy_loss(newlogprob, b_advantages)
        v_loss = 0.5 * ((agent.get_value(b_obs) - b_returns) ** 2).mean()  # eq. (82), n-step targets (eq. 81, λ = 1)
        loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        with torch.no_grad():
            # how far the step moved the policy: KL(pi_old || pi) estimated by mean((r - 1) - log r)
            logratio = agent.get_dist(b_obs).log_prob(b_actions) - b_logprobs
            approx_kl = ((logratio.exp() - 1) - logratio).mean()

        sps = max(1, int(global_step / (time.time() - start_time)))
        writer.add_scalar("charts/learning_rate", optimizer.lr, global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
        writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
        writer.add_scalar("losses/entropy", entropy.item(), global_step)
        writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
        if time.time() - last_print >= 1.0 or iteration == num_iterations:
            last_print = time.time()
            mean_return = f"{np.mean(recent_returns):8.1f}" if recent_returns else "     n/a"
            print(f"step {global_step:>8d} | return {mean_return} | SPS {sps:>6d} | "
                  f"ETA {(total_steps - global_step) / sps:5.0f}s")

    if args.save_model:
        # Write to a temporary name, then rename: an interrupted save never leaves a broken file.
        path = f"runs/{run_name}/{algo}.pt"
        checkpoint = {"agent": agent.state_dict(), "args": vars(args)}
        if args.norm_obs:  # the agent only understands observations normalised with these statistics
            checkpoint["obs_mean"] = torch.tensor(envs.obs_rms.mean)
            checkpoint["obs_var"] = torch.tensor(envs.obs_rms.var)
        torch.save(checkpoint, path + ".tmp")
        os.replace(path + ".tmp", path)
        print(f"saved {path}")
    envs.close()
    writer.close()
    mean_return = f"{np.mean(recent_returns):.1f}" if recent_returns else "n/a"
    print(f"end: {global_step:,} env steps in {time.time() - start_time:.0f} s, return {mean_return} (the last "
          f"episodes'); curves: tensorboard --logdir runs (this run: runs/{run_name})")
