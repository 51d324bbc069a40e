"""ESPnet-style ``Trainer``: class methods only, every object handed in as a parameter."""

import dataclasses
import logging
from contextlib import contextmanager

import torch


@contextmanager
def autocast(enabled=True):
    if enabled:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield
    else:
        yield


@dataclasses.dataclass
class TrainerOptions:
    accum_grad: int
    grad_clip: float
    grad_clip_type: float
    max_epoch: int
    use_amp: bool


class Reporter:
    def __init__(self):
        self.stats = {}

    def register(self, stats):
        for k, v in stats.items():
            self.stats.setdefault(k, []).append(float(v))


class Trainer:
    """Never instantiated: ``run`` and ``train_one_epoch`` are class methods."""

    def __init__(self):
        raise RuntimeError("This class can't be instantiated.")

    @classmethod
    def build_options(cls, args):
        return TrainerOptions(args.accum_grad, args.grad_clip, 2.0, args.max_epoch, args.use_amp)

    @classmethod
    def run(cls, model, optimizers, schedulers, train_iter, trainer_options):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**7, growth_interval=2) if trainer_options.use_amp else None
        reporter = Reporter()
        for iepoch in range(1, trainer_options.max_epoch + 1):
            all_steps_are_invalid = cls.train_one_epoch(
                model=model,
                optimizers=optimizers,
                schedulers=schedulers,
                iterator=train_iter,
                reporter=reporter,
                scaler=scaler,
                options=trainer_options,
                iepoch=iepoch,
            )
            for scheduler in schedulers:
                if scheduler is not None and not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
                    scheduler.step()
            print(f"epoch {iepoch} invalid {all_steps_are_invalid} lr {optimizers[0].param_groups[0]['lr']!r}")
            checkpoint = {
                "model": model.state_dict(),
                "reporter": reporter.stats,
                "optimizers": [o.state_dict() for o in optimizers],
                "scaler": scaler.state_dict() if scaler is not None else None,
            }
        print(f"final scale {checkpoint['scaler']['scale'] if scaler is not None else None!r}")

    @classmethod
    def train_one_epoch(cls, model, iterator, optimizers, schedulers, scaler, reporter, options, iepoch):
        accum_grad = options.accum_grad
        grad_clip = options.grad_clip
        model.train()
        all_steps_are_invalid = True
        for iiter, batch in enumerate(iterator, 1):
            with autocast(scaler is not None):
                retval = model(**batch)
                if isinstance(retval, dict):
                    loss = retval["loss"]
                    stats = retval["stats"]
                else:
                    loss, stats = retval
                loss = loss / accum_grad
            reporter.register(stats)

            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()

            if iiter % accum_grad == 0:
                if scaler is not None:
                    for optimizer in optimizers:
                        scaler.unscale_(optimizer)
                grad_norm = torch.nn.utils.clip_grad_norm_(
                    model.parameters(), max_norm=grad_clip, norm_type=options.grad_clip_type
                )
                if not torch.isfinite(grad_norm):
                    logging.warning(f"The grad norm is {grad_norm}. Skipping updating the model.")
                    if scaler is not None:
                        for optimizer in optimizers:
                            scaler.step(optimizer)
                            scaler.update()
                else:
                    all_steps_are_invalid = False
                    for optimizer, scheduler in zip(optimizers, schedulers):
                        if scaler is not None:
                            scaler.step(optimizer)
                            scaler.update()
                        else:
                            optimizer.step()
                        if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
                            scheduler.step()
                for optimizer in optimizers:
                    optimizer.zero_grad()
                step = (iepoch - 1) * (len(iterator) // accum_grad) + iiter // accum_grad
                print(f"step {step} loss {reporter.stats['loss'][-1]!r} grad_norm {float(grad_norm)!r}")
        return all_steps_are_invalid
