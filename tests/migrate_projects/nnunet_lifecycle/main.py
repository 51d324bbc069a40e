"""Shape: nnU-Net's ``nnUNetTrainer`` life cycle (held-out round).

``trainer.nnUNetTrainer.__init__`` only sets hyper-parameters and ``self.grad_scaler =
GradScaler(...) if use_amp else None``; the network, the SGD optimizer and a
``PolyLRScheduler`` (which writes every group's lr in its own ``step``) are built by
``initialize()`` through ``configure_optimizers()`` (returning both), called from
``on_train_start`` and from ``load_checkpoint``. ``on_train_epoch_start`` steps the scheduler
with the epoch number; ``train_step`` enters ``autocast(...) if use_amp else
dummy_context()``, computes a deep-supervision loss over a list of outputs and targets,
takes the scaler or the plain path (both clip to 12) and returns a dict of numpy values;
validation runs under ``no_grad``; checkpoints carry ``grad_scaler_state`` (None without
AMP). ``main`` trains, then resumes a fresh trainer from the checkpoint for one more epoch.
Hard: the objects are built outside ``__init__`` by a method called from hooks, the
scheduler writes lrs before the epoch's steps, the scaler may be None.
"""

import argparse

from trainer import nnUNetTrainer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--disable-amp", action="store_true")
    args = parser.parse_args()
    trainer = nnUNetTrainer(use_amp=not args.disable_amp, num_epochs=2)
    trainer.run_training()
    resumed = nnUNetTrainer(use_amp=not args.disable_amp, num_epochs=3)
    resumed.load_checkpoint(trainer.checkpoint)
    resumed.run_training()
    scaler = resumed.grad_scaler
    print(f"final scale {scaler.get_scale() if scaler is not None else None!r}")


if __name__ == "__main__":
    main()
