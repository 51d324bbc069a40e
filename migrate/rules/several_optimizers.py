"""Rule several_optimizers: GANs and other programs stepping several networks, with one scaler shared by their steps or one scaler each."""

from . import Example, Pattern, Rule

_SHARED_SCALER = """import torch


def train(netG, netD, batches, nz):
    criterion = torch.nn.BCEWithLogitsLoss()
    opt_d = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    scaler = torch.amp.GradScaler("cuda")
    for real in batches:
        noise = torch.randn(real.size(0), nz, device=real.device)
        ones = torch.ones(real.size(0), device=real.device)
        netD.zero_grad()
        with torch.autocast("cuda"):
            fake = netG(noise)
            loss_d = criterion(netD(real), ones) + criterion(netD(fake.detach()), 1 - ones)
        scaler.scale(loss_d).backward()
        scaler.step(opt_d)
        netG.zero_grad()  # the generator's own gradients, before its backward
        with torch.autocast("cuda"):
            loss_g = criterion(netD(fake), ones)
        scaler.scale(loss_g).backward()
        scaler.step(opt_g)
        scaler.update()  # once per iteration, after both steps
"""

_TWO_SCALERS = """import torch
import torch.nn.functional as F


def train(gen, disc, batches, z_dim):
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-4, betas=(0.0, 0.9))
    opt_d = torch.optim.Adam(disc.parameters(), lr=4e-4, betas=(0.0, 0.9))
    scaler_g = torch.amp.GradScaler("cuda")
    scaler_d = torch.amp.GradScaler("cuda")
    for real in batches:
        z = torch.randn(real.size(0), z_dim, device=real.device)
        opt_d.zero_grad(set_to_none=True)
        with torch.autocast("cuda"):
            fake = gen(z).detach()
            loss_d = F.relu(1.0 - disc(real)).mean() + F.relu(1.0 + disc(fake)).mean()
        scaler_d.scale(loss_d).backward()
        scaler_d.unscale_(opt_d)
        torch.nn.utils.clip_grad_norm_(disc.parameters(), 1.0)
        scaler_d.step(opt_d)
        scaler_d.update()
        opt_g.zero_grad(set_to_none=True)
        with torch.autocast("cuda"):
            loss_g = -disc(gen(z)).mean()
        scaler_g.scale(loss_g).backward()
        scaler_g.step(opt_g)
        scaler_g.update()
"""

# pytorch/examples' DCGAN: the discriminator's loss back-propagated in two parts, one step.
_TWO_BACKWARDS_ONE_STEP = _SHARED_SCALER.replace(
    "            loss_d = criterion(netD(real), ones) + criterion(netD(fake.detach()), 1 - ones)\n"
    "        scaler.scale(loss_d).backward()\n",
    "            loss_real = criterion(netD(real), ones)\n"
    "        scaler.scale(loss_real).backward()\n"
    '        with torch.autocast("cuda"):\n'
    "            loss_fake = criterion(netD(fake.detach()), 1 - ones)\n"
    "        scaler.scale(loss_fake).backward(retain_graph=True)\n",
)

# The generator's optimizer also trains an encoder: no one RoundPipe model owns its parameters.
_ONE_OPTIMIZER_TWO_MODELS = _SHARED_SCALER.replace(
    "    opt_g = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))\n",
    "    opt_g = torch.optim.Adam(list(netG.parameters()) + list(enc.parameters()), lr=2e-4)\n",
).replace("def train(netG, netD, batches, nz):", "def train(netG, netD, enc, batches, nz):")

# The shared scaler is updated only every other iteration: no update follows each step.
_UPDATE_UNDER_A_CONDITION = _SHARED_SCALER.replace(
    "    for real in batches:", "    for i, real in enumerate(batches):"
).replace(
    "        scaler.update()  # once per iteration, after both steps\n",
    "        if i % 2 == 0:\n            scaler.update()\n",
)

# One loss through an encoder and a decoder, both optimizers stepped after its one backward.
_TWO_STEPS_AFTER_ONE_BACKWARD = """import torch


def train(enc, dec, batches):
    opt_e = torch.optim.Adam(enc.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(dec.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    for x in batches:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.mse_loss(dec(enc(x)), x)
        scaler.scale(loss).backward()
        scaler.step(opt_e)
        scaler.step(opt_d)
        scaler.update()
        opt_e.zero_grad()
        opt_d.zero_grad()
"""

# One norm clipped over both networks: the clipping cannot be split between two steps.
_CLIPPED_TOGETHER = _TWO_STEPS_AFTER_ONE_BACKWARD.replace(
    "        scaler.step(opt_e)\n",
    "        scaler.unscale_(opt_e)\n        scaler.unscale_(opt_d)\n"
    "        torch.nn.utils.clip_grad_norm_([*enc.parameters(), *dec.parameters()], 1.0)\n"
    "        scaler.step(opt_e)\n",
)

# A trainer class: one scaler per network, a step method each on `self`.
_TRAINER_METHODS = """import torch
import torch.nn.functional as F


class GANTrainer:
    def __init__(self, z_dim):
        self.G = torch.nn.Sequential(torch.nn.Linear(z_dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
        self.D = torch.nn.Sequential(torch.nn.Linear(2, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.opt_g = torch.optim.Adam(self.G.parameters(), lr=1e-4)
        self.opt_d = torch.optim.Adam(self.D.parameters(), lr=4e-4)
        self.scaler_g = torch.amp.GradScaler("cuda")
        self.scaler_d = torch.amp.GradScaler("cuda")

    def d_step(self, real, z):
        self.opt_d.zero_grad()
        with torch.autocast("cuda"):
            fake = self.G(z).detach()
            loss_d = F.relu(1.0 - self.D(real)).mean() + F.relu(1.0 + self.D(fake)).mean()
        self.scaler_d.scale(loss_d).backward()
        self.scaler_d.step(self.opt_d)
        self.scaler_d.update()

    def g_step(self, z):
        self.opt_g.zero_grad()
        with torch.autocast("cuda"):
            loss_g = -self.D(self.G(z)).mean()
        self.scaler_g.scale(loss_g).backward()
        self.scaler_g.step(self.opt_g)
        self.scaler_g.update()
"""

# The discriminator's step runs through the generator with gradients, and the generator's
# gradients are zeroed only after its step: nothing drops what d_step leaves on them.
_TRAINER_REACHING = (
    _TRAINER_METHODS.replace("            fake = self.G(z).detach()\n", "            fake = self.G(z)\n")
    .replace("        self.opt_g.zero_grad()\n", "")
    .replace("        self.scaler_g.update()\n", "        self.scaler_g.update()\n        self.opt_g.zero_grad()\n")
)

_ALREADY_MIGRATED = """import roundpipe
import torch


def train(netG, netD, batches, nz):
    criterion = torch.nn.BCEWithLogitsLoss()
    opt_d = torch.optim.Adam(netD.optim_parameters(), lr=2e-4)
    opt_g = torch.optim.Adam(netG.optim_parameters(), lr=2e-4)
    scaler = roundpipe.GradScaler("cuda")
    for real in batches:
        ones = torch.ones(real.size(0), device=real.device)
        netD.zero_grad()
        with torch.autocast("cuda"):
            fake = netG(torch.randn(real.size(0), nz, device=real.device))
            loss_d = criterion(netD(real), ones) + criterion(netD(fake.detach()), 1 - ones)
        scaler.scale(loss_d).backward()

        def step_d():
            scaler.step(opt_d)
            opt_d.zero_grad()

        netD.step(step_d)
        netG.zero_grad()
        with torch.autocast("cuda"):
            loss_g = criterion(netD(fake), ones)
        scaler.scale(loss_g).backward()

        def step_g():
            scaler.step(opt_g)
            opt_g.zero_grad()

        netG.step(step_g)
        scaler.update()
"""

RULE = Rule(
    name="several_optimizers",
    order=57,
    description="GANs and other programs stepping several networks, with one scaler shared by "
    "their steps or one scaler each",
    codes=("RPM107", "RPM108"),
    implemented_in=("multi_step.py", "joint_steps.py", "reached_models.py", "rules/step_function.py"),
    patterns=(
        Pattern(
            "several networks, each with its own optimizer and backward (a GAN's discriminator step, then its generator step through the discriminator), with one scaler shared by the steps (`scaler.step(opt_d)` after the first backward, `scaler.step(opt_g)` and the one `scaler.update()` after the second) or one scaler each",
            "each network wrapped in `roundpipe.RoundPipe`, its optimizer built on its `optim_parameters()`; every step in the autograd form (the backward may reach another network, so forwards and backwards stay as written) with its own `_step_fn` for that network's `model.step`; `scaler.update()` stays where it was, once; a `zero_grad()` before a backward stays in place on the model (`opt_d.zero_grad()` becomes `netD.zero_grad()`: it drops what the other backward left there) and `_step_fn` also zeroes the optimizer; an optimizer over several networks' parameters refuses the file (RPM108), as does a step without a later `scaler.update()` in its block (RPM107); a backward whose next scaler use is another `scaler.scale(...).backward()` (DCGAN's discriminator loss back-propagated in two parts) stays as written and is stepped with it; `backward(retain_graph=True)` is kept, in the autograd form",
            "多个网络各有自己的优化器和反向（GAN 先更新判别器，再通过判别器更新生成器），多个步骤共用一个 scaler（第一次反向后 `scaler.step(opt_d)`，第二次反向后 `scaler.step(opt_g)` 和唯一的 `scaler.update()`），或每个网络一个 scaler",
            "每个网络都用 `roundpipe.RoundPipe` 包装，其优化器基于各自的 `optim_parameters()` 构建；每个步骤都采用 autograd 形式（反向可能经过另一个网络，因此前向和反向保持原样），并有自己的 `_step_fn` 交给该网络的 `model.step`；`scaler.update()` 留在原处，只调用一次；反向之前的 `zero_grad()` 留在原处并作用于模型（`opt_d.zero_grad()` 变为 `netD.zero_grad()`：丢弃另一次反向留下的梯度），`_step_fn` 同时清零优化器；一个优化器覆盖多个网络的参数时拒绝迁移该文件（RPM108），某个步骤之后在同一代码块中没有 `scaler.update()` 时也拒绝（RPM107）；若某次反向之后对 scaler 的下一次使用是另一个 `scaler.scale(...).backward()`（DCGAN 的判别器损失分两部分反向传播），该反向保持原样，其梯度由下一次反向之后的步骤一并更新；`backward(retain_graph=True)` 保持原样，采用 autograd 形式",
        ),
        Pattern(
            "a trainer class stepping each network in its own method (`d_step`/`g_step` on `self.G`, `self.D`, one scaler each or shared), each method calling both models",
            "as for functions, on the instance attributes; a method's call of the other network with gradients is accepted when its backward cannot reach that network (`self.G(z).detach()`, or the call under `torch.no_grad()`) or when that network's own step zeroes its gradients on the model before its backward (`self.opt_d.zero_grad()` first, kept in place as `self.D.zero_grad()`), which drops what the other backward left; otherwise the file is refused (RPM107, naming the call)",
            "训练器类在各自的方法中更新每个网络（`self.G`、`self.D` 上的 `d_step`/`g_step`，每个网络一个 scaler 或共用一个），每个方法都调用两个模型",
            "与函数形式相同，作用于实例属性；方法中带梯度地调用另一个网络时，若其反向无法到达该网络（`self.G(z).detach()`，或在 `torch.no_grad()` 下调用），或该网络自己的步骤在其反向之前就在模型上清零梯度（先调用 `self.opt_d.zero_grad()`，原位保留为 `self.D.zero_grad()`），从而丢弃另一次反向留下的梯度，则接受；否则拒绝迁移该文件（RPM107，并指出该调用）",
        ),
        Pattern(
            "several optimizers stepped after one backward (one loss through an encoder and a decoder: `scaler.step(opt_enc); scaler.step(opt_dec); scaler.update()`), each optimizer on its own network",
            "each network wrapped, and the step group cut into one contiguous segment per optimizer (its unscale, clipping, step, zeroing, scheduler statements), each the `_step_fn` of that network's `model.step`, in the original order; `scaler.update()` after the last; a later statement of an earlier optimizer stays on the main thread (after `model.synchronize()` in the asynchronous form); a statement naming several of the networks (one clipping norm over both) refuses the step (RPM107)",
            "一次反向之后更新多个优化器（一个损失经过编码器和解码器：`scaler.step(opt_enc); scaler.step(opt_dec); scaler.update()`），每个优化器对应自己的网络",
            "每个网络都被包装，步骤语句按优化器切分为连续的片段（各自的 unscale、裁剪、step、清零、调度器语句），每段成为该网络 `model.step` 的 `_step_fn`，保持原有顺序；`scaler.update()` 放在最后一个之后；较早优化器的语句若出现在后面，则留在主线程（异步形式下在 `model.synchronize()` 之后）；同时涉及多个网络的语句（对两个网络一起裁剪范数）会拒绝迁移该步骤（RPM107）",
        ),
    ),
    examples=(
        Example(
            _SHARED_SCALER,
            expect=(
                "    netD = roundpipe.RoundPipe(netD, model_run_config=",
                "    opt_d = torch.optim.Adam(netD.optim_parameters(), lr=2e-4, betas=(0.5, 0.999))\n"
                "    netG = roundpipe.RoundPipe(netG, model_run_config=",
                '        netD.zero_grad()\n        with torch.autocast("cuda"):\n            fake = netG(noise)\n',
                "        scaler.scale(loss_d).backward()\n\n        def _step_fn():\n"
                "            scaler.step(opt_d)\n            opt_d.zero_grad()\n\n        netD.step(_step_fn)\n"
                "        netG.zero_grad()  # the generator's own gradients, before its backward\n",
                "        scaler.scale(loss_g).backward()\n\n        def _step_fn_2():\n"
                "            scaler.step(opt_g)\n            opt_g.zero_grad()\n\n        netG.step(_step_fn_2)\n"
                "        scaler.update()  # once per iteration, after both steps\n",
            ),
        ),
        Example(
            _TWO_SCALERS,
            expect=(
                '        disc.zero_grad(set_to_none=True)\n        with torch.autocast("cuda"):\n',
                "        scaler_d.scale(loss_d).backward()\n\n        def _step_fn_2():\n"
                "            scaler_d.unscale_(opt_d)\n"
                "            torch.nn.utils.clip_grad_norm_(disc.optim_parameters(), 1.0)\n"
                "            scaler_d.step(opt_d)\n            opt_d.zero_grad(set_to_none=True)\n"
                "\n        disc.step(_step_fn_2)\n        scaler_d.update()\n        gen.zero_grad(set_to_none=True)\n",
                "        scaler_g.scale(loss_g).backward()\n\n        def _step_fn():\n"
                "            scaler_g.step(opt_g)\n            opt_g.zero_grad(set_to_none=True)\n"
                "\n        gen.step(_step_fn)\n        scaler_g.update()\n",
            ),
        ),
        Example(
            _TWO_BACKWARDS_ONE_STEP,
            expect=(
                "        scaler.scale(loss_real).backward()\n        with torch.autocast",
                "        scaler.scale(loss_fake).backward(retain_graph=True)\n\n        def _step_fn():\n"
                "            scaler.step(opt_d)\n            opt_d.zero_grad()\n\n        netD.step(_step_fn)\n",
            ),
        ),
        Example(_ONE_OPTIMIZER_TWO_MODELS, codes=("RPM108",)),
        Example(_UPDATE_UNDER_A_CONDITION, codes=("RPM107", "RPM107")),
        Example(
            _TWO_STEPS_AFTER_ONE_BACKWARD,
            expect=(
                "        def _step_fn():\n            scaler.step(opt_e)\n\n        enc.step(_step_fn)\n"
                "\n        def _step_fn_2():\n            scaler.step(opt_d)\n\n        dec.step(_step_fn_2)\n"
                "        scaler.update()\n        enc.synchronize()\n        opt_e.zero_grad()\n        enc.zero_grad()\n"
                "        dec.synchronize()\n        opt_d.zero_grad()\n        dec.zero_grad()\n",
            ),
        ),
        Example(_CLIPPED_TOGETHER, codes=("RPM107",)),
        Example(
            _TRAINER_METHODS,
            expect=(
                "        self.G = roundpipe.RoundPipe(",
                "        self.opt_d = torch.optim.Adam(self.D.optim_parameters(), lr=4e-4)\n",
                "        self.D.zero_grad()\n",
                "            self.scaler_d.step(self.opt_d)\n            self.opt_d.zero_grad()\n\n"
                "        self.D.step(_step_fn",
                "        self.G.zero_grad()\n",
            ),
        ),
        Example(_TRAINER_REACHING, codes=("RPM107",)),
        Example(_ALREADY_MIGRATED),
    ),
)
