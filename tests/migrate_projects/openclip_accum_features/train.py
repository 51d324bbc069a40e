"""OpenCLIP-style ``train_one_epoch``: cached-feature accumulation and a backward helper."""

import math

import torch

from precision import get_autocast


def unwrap_model(model):
    """The module under a data-parallel wrapper, or the model itself."""
    return model.module if hasattr(model, "module") else model


def backward(total_loss, scaler):
    if scaler is not None:
        scaler.scale(total_loss).backward()
    else:
        total_loss.backward()


def train_one_epoch(model, data, loss, epoch, optimizer, scaler, scheduler, args):
    autocast = get_autocast(args.precision)
    model.train()
    num_batches_per_epoch = len(data) // args.accum_freq
    if args.accum_freq > 1:
        accum_images, accum_texts, accum_features = [], [], {}
    for i, batch in enumerate(data):
        i_accum = i // args.accum_freq
        step = num_batches_per_epoch * epoch + i_accum
        if not args.skip_scheduler:
            scheduler(step)
        images, texts = batch
        optimizer.zero_grad()
        if args.accum_freq == 1:
            with autocast():
                model_out = model(images, texts)
                logit_scale = model_out["logit_scale"]
                losses = loss(**model_out, output_dict=True)
                total_loss = sum(losses.values())
                losses["loss"] = total_loss
            backward(total_loss, scaler)
        else:
            # Features of every batch of the window, computed once without gradients.
            with torch.no_grad():
                with autocast():
                    model_out = model(images, texts)
                    model_out.pop("logit_scale")
                    for key, val in model_out.items():
                        accum_features.setdefault(key, []).append(val)
                accum_images.append(images)
                accum_texts.append(texts)
            if (i + 1) % args.accum_freq > 0:
                continue
            optimizer.zero_grad()
            for j in range(args.accum_freq):
                with autocast():
                    model_out = model(accum_images[j], accum_texts[j])
                    logit_scale = model_out.pop("logit_scale")
                    inputs = {}
                    for key, cached in accum_features.items():
                        inputs[key] = torch.cat(cached[:j] + [model_out[key]] + cached[j + 1 :])
                    losses = loss(**inputs, logit_scale=logit_scale, output_dict=True)
                    del inputs
                    total_loss = sum(losses.values())
                    losses["loss"] = total_loss
                backward(total_loss, scaler)

        if scaler is not None:
            if args.grad_clip_norm is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip_norm, norm_type=2.0)
            scaler.step(optimizer)
            scaler.update()
        else:
            if args.grad_clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip_norm, norm_type=2.0)
            optimizer.step()

        if args.accum_freq > 1:
            accum_images, accum_texts, accum_features = [], [], {}

        # The temperature stays below ln(100), as in the CLIP paper.
        with torch.no_grad():
            unwrap_model(model).logit_scale.clamp_(0, math.log(100))

        if i_accum % args.log_every_n_steps == 0:
            logit_scale_scalar = logit_scale.item()
            print(f"step {step} loss {losses['loss'].item()!r} logit_scale {logit_scale_scalar!r}")
