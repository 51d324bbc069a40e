"""Shape: YOLOX's ``Trainer`` (held-out round; the iteration split over hook methods).

``exp.Exp`` builds and caches the model (``get_model``), the SGD optimizer over three groups
(norm weights, other weights with weight decay, biases; two added with ``add_param_group``
while walking ``named_modules``) and a warm-up/cosine ``LRScheduler`` whose ``update_lr``
only computes a value. ``trainer.Trainer`` holds ``self.scaler = GradScaler(enabled=
args.fp16)``; ``before_train`` fetches model and optimizer from the experiment and builds a
``ModelEMA`` (a deep copy); ``train_one_iter`` runs the forward under ``autocast(enabled=
self.amp_training)``, zeroes, scales and backpropagates the dict's ``total_loss``, steps and
updates, then updates the EMA from the model's ``state_dict`` and writes every group's lr
by hand; ``after_iter`` logs, ``after_epoch`` checkpoints and evaluates the EMA model.
Hard: the model and the optimizer come from another object's cache, the EMA reads the
weights right after the step, the lr write follows the step on the main thread.
"""

import argparse

from exp import Exp
from trainer import Trainer


def make_parser():
    parser = argparse.ArgumentParser("YOLOX train parser")
    parser.add_argument("-b", "--batch-size", type=int, default=8)
    parser.add_argument("--fp16", action=argparse.BooleanOptionalAction, default=True)
    return parser


def main(exp, args):
    trainer = Trainer(exp, args)
    trainer.train()


if __name__ == "__main__":
    args = make_parser().parse_args()
    exp = Exp()
    main(exp, args)
