"""OpenCLIP-style ``train_one_epoch`` of a fork that always trains with AMP."""

import torch

from precision import get_autocast


def train_one_epoch(model, data, loss, epoch, optimizer, scaler, scheduler, args):
    autocast = get_autocast(args.precision)
    model.train()
    num_batches_per_epoch = len(data)
    for i, batch in enumerate(data):
        step = num_batches_per_epoch * epoch + i
        if not args.skip_scheduler:
            scheduler(step)
        images, texts = batch
        optimizer.zero_grad()
        with autocast():
            model_out = model(images, texts)
            logit_scale = model_out["logit_scale"]
            losses = loss(**model_out, output_dict=True)
            total_loss = sum(losses.values())
            losses["loss"] = total_loss
        scaler.scale(total_loss).backward()

        if args.grad_clip_norm is not None:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip_norm, norm_type=2.0)
        scaler.step(optimizer)
        scaler.update()

        if i % args.log_every_n_steps == 0:
            logit_scale_scalar = logit_scale.item()
            print(f"step {step} loss {losses['loss'].item()!r} logit_scale {logit_scale_scalar!r}")
