"""Rule method_forward: a model trained through a method of its own, not its forward, refuses
the file (RoundPipe runs a model only through ``model(...)``)."""

from . import Example, Pattern, Rule

_PPO = (
    "import torch\n\n\n"
    "def update(agent, batches):\n"
    "    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3)\n"
    '    scaler = torch.amp.GradScaler("cuda")\n'
    "    for obs, actions, advantages in batches:\n"
    "{rollout}"
    '        with torch.autocast("cuda"):\n'
    "            logprob = {forward}\n"
    "        loss = -(logprob * advantages).mean()\n"
    "        optimizer.zero_grad()\n"
    "        scaler.scale(loss).backward()\n"
    "        scaler.step(optimizer)\n"
    "        scaler.update()\n"
)
_ROLLOUT = "        with torch.no_grad():\n            value = agent.get_value(obs)\n"

RULE = Rule(
    name="method_forward",
    order=76,
    description="a model trained through a method of its own, not its forward, refuses the file",
    codes=("RPM147",),
    implemented_in=("method_forward.py", "model_uses.py"),
    patterns=(
        Pattern(
            "the wrapped model called, with gradients, through a method of its own in the function of its "
            "step (`agent.get_action_and_value(obs, actions)`, CleanRL's PPO agents)",
            "refused (RPM147): RoundPipe runs a model only through `model(...)`; the methods of `nn.Module`, "
            "DDP and RoundPipe (`parameters()`, `no_sync()`, `train()`) and calls under `torch.no_grad()` "
            "are not training runs and stay as they are",
            "在其步骤所在的函数中，带梯度地通过模型自己的方法调用被包装的模型"
            "（`agent.get_action_and_value(obs, actions)`，CleanRL 的 PPO 智能体）",
            "拒绝（RPM147）：RoundPipe 只通过 `model(...)` 运行模型；`nn.Module`、DDP 与 RoundPipe 的方法"
            "（`parameters()`、`no_sync()`、`train()`）以及 `torch.no_grad()` 下的调用不算训练运行，保持原样",
        ),
    ),
    examples=(
        Example(_PPO.format(rollout=_ROLLOUT, forward="agent.log_prob(obs, actions)"), codes=("RPM147",)),
        Example(  # the forward through `agent(...)`; the no_grad method call stays as it is
            _PPO.format(rollout=_ROLLOUT, forward="agent(obs).log_softmax(-1).gather(1, actions)"),
            expect=(_ROLLOUT, "        agent.step(_step_fn)\n"),
        ),
        Example(  # near-miss: a method call with no scaler step in the file
            "import torch\n\n\ndef act(agent, obs):\n    # GradScaler is not used here\n"
            "    return agent.get_action_and_value(obs)\n"
        ),
    ),
)
