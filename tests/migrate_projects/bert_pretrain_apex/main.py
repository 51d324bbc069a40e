"""Shape: NVIDIA's BERT ``run_pretraining.py`` (held-out round; apex O2, fused optimizer).

``prepare_model_and_optimizer`` groups ``named_parameters()`` into decay/no-decay by name
(``bias``, ``gamma``, ``beta``, ``LayerNorm``), builds apex's ``FusedAdam`` and a
``PolyWarmUpScheduler`` (a scheduler subclass writing every group's lr), then under
``if args.fp16`` calls ``amp.initialize(..., opt_level="O2", loss_scale="dynamic",
cast_model_outputs=torch.float16)`` and sets the initial loss scale through
``amp._amp_state.loss_scalers[0]._loss_scale``; it returns model, optimizer, scheduler and
criterion. The loop divides the loss by ``gradient_accumulation_steps``, backpropagates
through ``amp.scale_loss`` or plainly, sums ``loss.item()`` into ``average_loss``, and every
``gradient_accumulation_steps`` micro-steps steps the scheduler first, then
``take_optimizer_step`` (``optimizer.step()``, then ``param.grad = None`` over the model's
parameters, ``global_step + 1``). Hard: apex internals set the scale, the step and the
gradient reset live in a helper, and the scheduler steps before the optimizer.
"""

import argparse

import torch
from apex import amp
from apex.optimizers import FusedAdam

from modeling import BertForPreTraining, BertPretrainingCriterion
from schedulers import PolyWarmUpScheduler


def prepare_model_and_optimizer(args):
    torch.manual_seed(0)
    model = BertForPreTraining(vocab_size=args.vocab_size)
    param_optimizer = list(model.named_parameters())
    no_decay = ["bias", "gamma", "beta", "LayerNorm"]
    optimizer_grouped_parameters = [
        {"params": [p for n, p in param_optimizer if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
        {"params": [p for n, p in param_optimizer if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = FusedAdam(optimizer_grouped_parameters, lr=args.learning_rate)
    lr_scheduler = PolyWarmUpScheduler(optimizer, warmup=args.warmup_proportion, total_steps=args.max_steps)
    if args.fp16:
        model, optimizer = amp.initialize(
            model, optimizer, opt_level="O2", loss_scale="dynamic", cast_model_outputs=torch.float16, verbosity=0
        )
        amp._amp_state.loss_scalers[0]._loss_scale = args.init_loss_scale
    criterion = BertPretrainingCriterion(args.vocab_size)
    return model, optimizer, lr_scheduler, criterion


def take_optimizer_step(args, optimizer, model, global_step):
    optimizer.step()
    for param in model.parameters():
        param.grad = None
    return global_step + 1


def make_batches(n, args, seed):
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        input_ids = torch.randint(1, args.vocab_size, (4, 8), generator=gen)
        segment_ids = (torch.arange(8) >= 4).long().expand(4, 8)
        input_mask = torch.ones(4, 8, dtype=torch.long)
        masked_lm_labels = torch.where(torch.rand(4, 8, generator=gen) < 0.3, input_ids, torch.full_like(input_ids, -1))
        next_sentence_labels = torch.randint(0, 2, (4,), generator=gen)
        batches.append((input_ids, segment_ids, input_mask, masked_lm_labels, next_sentence_labels))
    return batches


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--learning-rate", type=float, default=6e-3)
    parser.add_argument("--warmup-proportion", type=float, default=0.25)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=2)
    parser.add_argument("--init-loss-scale", type=float, default=2.0**10)
    parser.add_argument("--log-freq", type=int, default=1)
    parser.add_argument("--vocab-size", type=int, default=16)
    args = parser.parse_args()

    model, optimizer, lr_scheduler, criterion = prepare_model_and_optimizer(args)
    model.train()
    global_step = 0
    training_steps = 0
    average_loss = 0.0
    for batch in make_batches(args.max_steps * args.gradient_accumulation_steps, args, seed=7):
        training_steps += 1
        input_ids, segment_ids, input_mask, masked_lm_labels, next_sentence_labels = batch
        prediction_scores, seq_relationship_score = model(
            input_ids=input_ids, token_type_ids=segment_ids, attention_mask=input_mask
        )
        loss = criterion(prediction_scores, seq_relationship_score, masked_lm_labels, next_sentence_labels)
        divisor = args.gradient_accumulation_steps
        if args.gradient_accumulation_steps > 1:
            loss = loss / args.gradient_accumulation_steps
            divisor = 1.0
        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        average_loss += loss.item()

        if training_steps % args.gradient_accumulation_steps == 0:
            lr_scheduler.step()
            global_step = take_optimizer_step(args, optimizer, model, global_step)

        if training_steps % (args.log_freq * args.gradient_accumulation_steps) == 0:
            lr = optimizer.param_groups[0]["lr"]
            print(f"step {global_step} loss {average_loss / (args.log_freq * divisor)!r} lr {lr!r}")
            average_loss = 0.0
    final_scale = amp.state_dict()["loss_scaler0"]["loss_scale"] if args.fp16 else 1.0
    print(f"final scale {final_scale!r}")


if __name__ == "__main__":
    main()
