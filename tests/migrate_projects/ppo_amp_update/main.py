"""Shape: a CleanRL-style PPO loop with AMP (held-out round, reinforcement learning).

Each iteration anneals the learning rate by writing ``optimizer.param_groups[0]["lr"]``,
collects a rollout under ``torch.no_grad()`` by calling the agent's methods
(``agent.get_action_and_value``, ``agent.get_value``; the agent's ``forward`` is never
used), computes GAE advantages, then runs ``update_epochs`` passes over shuffled
minibatches: the new log-probabilities, entropy and values come from
``agent.get_action_and_value(obs, actions)`` under autocast, the clipped policy loss, the
value loss and the entropy bonus are summed, ``approx_kl`` and the clip fraction are
measured under ``no_grad`` before the backward, and the step unscales, clips and steps
through the scaler. A KL above ``target_kl`` ends the update epochs early (``break``).
Hard: the model is called through methods, not ``forward``, the policy that collects the
next rollout must see the parameters of the last step, and the loop's exit depends on a
value computed from the forward.
"""

import argparse

import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical


class Agent(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(obs_dim, 16), nn.Tanh(), nn.Linear(16, 1))
        self.actor = nn.Sequential(nn.Linear(obs_dim, 16), nn.Tanh(), nn.Linear(16, n_actions))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None, gen=None):
        logits = self.actor(x).float()
        probs = Categorical(logits=logits)
        if action is None:
            action = torch.multinomial(probs.probs, 1, generator=gen).squeeze(-1)
        return action, probs.log_prob(action), probs.entropy(), self.critic(x).float()


class ToyEnv:
    """A batch of one-step bandits: the reward is 1 when the action matches the sign pattern."""

    def __init__(self, num_envs, obs_dim, gen):
        self.num_envs, self.obs_dim, self.gen = num_envs, obs_dim, gen
        self.obs = torch.randn(num_envs, obs_dim, generator=gen)

    def step(self, action):
        target = (self.obs[:, 0] > 0).long() + (self.obs[:, 1] > 0).long()
        reward = (action == target).float()
        self.obs = torch.randn(self.num_envs, self.obs_dim, generator=self.gen)
        done = torch.zeros(self.num_envs)
        return self.obs, reward, done


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--num-steps", type=int, default=8)
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--update-epochs", type=int, default=3)
    parser.add_argument("--num-minibatches", type=int, default=2)
    parser.add_argument("--target-kl", type=float, default=0.004)
    parser.add_argument("--clip-coef", type=float, default=0.2)
    parser.add_argument("--ent-coef", type=float, default=0.01)
    parser.add_argument("--vf-coef", type=float, default=0.5)
    parser.add_argument("--max-grad-norm", type=float, default=0.5)
    parser.add_argument("--learning-rate", type=float, default=2.5e-2)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--gae-lambda", type=float, default=0.95)
    args = parser.parse_args()
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(5)
    env = ToyEnv(args.num_envs, 3, gen)
    agent = Agent(3, 3)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=4)

    obs = torch.zeros(args.num_steps, args.num_envs, 3)
    actions = torch.zeros(args.num_steps, args.num_envs, dtype=torch.long)
    logprobs = torch.zeros(args.num_steps, args.num_envs)
    rewards = torch.zeros(args.num_steps, args.num_envs)
    dones = torch.zeros(args.num_steps, args.num_envs)
    values = torch.zeros(args.num_steps, args.num_envs)

    next_obs, next_done = env.obs, torch.zeros(args.num_envs)
    global_step = 0
    for iteration in range(1, args.iterations + 1):
        frac = 1.0 - (iteration - 1.0) / args.iterations
        optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        for step in range(args.num_steps):
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs, gen=gen)
                values[step] = value.flatten()
            actions[step], logprobs[step] = action, logprob
            next_obs, reward, next_done = env.step(action)
            rewards[step] = reward

        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                nextnonterminal = 1.0 - (next_done if t == args.num_steps - 1 else dones[t + 1])
                nextvalues = next_value if t == args.num_steps - 1 else values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        b_obs, b_actions = obs.reshape(-1, 3), actions.reshape(-1)
        b_logprobs, b_advantages = logprobs.reshape(-1), advantages.reshape(-1)
        b_returns, b_values = returns.reshape(-1), values.reshape(-1)

        clipfracs = []
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, generator=gen)
            for start in range(0, batch_size, minibatch_size):
                mb_inds = b_inds[start : start + minibatch_size]
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())

                mb_advantages = b_advantages[mb_inds]
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()
                v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb_inds]) ** 2).mean()
                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                scaler.step(optimizer)
                scaler.update()
                print(f"step {global_step} loss {loss.item()!r} kl {approx_kl.item()!r}")
                global_step += 1

            if args.target_kl is not None and approx_kl > args.target_kl:
                print(f"early stop at epoch {epoch}")
                break
        print(f"iteration {iteration} reward {rewards.mean().item()!r} clipfrac {sum(clipfracs) / len(clipfracs)!r}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
