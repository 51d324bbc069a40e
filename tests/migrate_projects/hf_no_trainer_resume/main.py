"""Shape: a Hugging Face ``run_*_no_trainer.py`` loop without accelerate (held-out round 2;
resume, scheduler by name, checkpoints inside the loop).

``optimization.get_scheduler(name, optimizer=..., num_warmup_steps=..., num_training_steps=...)``
picks a ``LambdaLR`` factory from a dict by name; ``checkpointing.save_state`` stores the
model, optimizer, scheduler and scaler state every ``checkpointing_steps`` updates, from
inside the loop; ``load_state`` restores them. ``main`` trains once, then trains a fresh
model resumed from the stored state: ``starting_epoch``/``resume_step`` are computed from
``completed_steps`` and the first resumed epoch skips the batches already seen
(``continue``). Each iteration sums ``loss.detach().float()`` into ``total_loss`` before
dividing by ``gradient_accumulation_steps``, backpropagates the scaled loss, and on update
steps (``step % gas == 0 or step == len(train_dataloader) - 1``) unscales, clips, steps,
updates, steps the scheduler and zeroes; ``completed_steps >= max_train_steps`` ends
training by ``break``. Evaluation per epoch reads ``outputs.logits`` under ``no_grad``. Hard:
checkpoints that read optimizer and scheduler state between updates, a resumed run whose
optimizer state is loaded after the wrap, batches skipped with ``continue``, an early
``break``.
"""

import argparse
import math

import torch

from checkpointing import load_state, save_state
from modeling import TinyForSequenceClassification
from optimization import get_scheduler


def make_dataloader(n, batch_size, seed):
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        input_ids = torch.randint(0, 16, (batch_size, 6), generator=gen)
        attention_mask = (torch.rand(batch_size, 6, generator=gen) > 0.2).long()
        attention_mask[:, 0] = 1
        batches.append({"input_ids": input_ids, "attention_mask": attention_mask, "labels": input_ids[:, 0] % 3})
    return batches


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--learning_rate", type=float, default=5e-3)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--num_train_epochs", type=int, default=3)
    parser.add_argument("--max_train_steps", type=int, default=None)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--lr_scheduler_type", default="linear", choices=["linear", "cosine"])
    parser.add_argument("--num_warmup_steps", type=int, default=1)
    parser.add_argument("--checkpointing_steps", type=int, default=2)
    parser.add_argument("--max_grad_norm", type=float, default=1.0)
    parser.add_argument("--fp16", action=argparse.BooleanOptionalAction, default=True)
    return parser.parse_args(argv)


def train(args, store, resume):
    torch.manual_seed(0)
    model = TinyForSequenceClassification()
    train_dataloader = make_dataloader(5, 4, seed=21)
    eval_dataloader = make_dataloader(2, 4, seed=22)

    no_decay = ["bias", "LayerNorm.weight"]
    optimizer_grouped_parameters = [
        {
            "params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
            "weight_decay": args.weight_decay,
        },
        {
            "params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
            "weight_decay": 0.0,
        },
    ]
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate)

    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    max_train_steps = args.max_train_steps or args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_scheduler(
        name=args.lr_scheduler_type,
        optimizer=optimizer,
        num_warmup_steps=args.num_warmup_steps,
        num_training_steps=max_train_steps,
    )
    scaler = torch.amp.GradScaler("cpu", enabled=args.fp16, init_scale=2.0**7, growth_interval=2)

    completed_steps = 0
    starting_epoch = 0
    resume_step = 0
    if resume:
        completed_steps = load_state(store, model, optimizer, lr_scheduler, scaler)
        starting_epoch = completed_steps // num_update_steps_per_epoch
        resume_step = (completed_steps % num_update_steps_per_epoch) * args.gradient_accumulation_steps

    for epoch in range(starting_epoch, args.num_train_epochs):
        model.train()
        total_loss = 0
        for step, batch in enumerate(train_dataloader):
            if resume and epoch == starting_epoch and step < resume_step:
                continue
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.fp16):
                outputs = model(**batch)
                loss = outputs.loss
            total_loss += loss.detach().float()
            loss = loss / args.gradient_accumulation_steps
            scaler.scale(loss).backward()
            if step % args.gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                scaler.step(optimizer)
                scaler.update()
                lr_scheduler.step()
                optimizer.zero_grad()
                completed_steps += 1
                print(f"step {completed_steps} loss {loss.item()!r} lr {lr_scheduler.get_last_lr()[0]!r}")
                if completed_steps % args.checkpointing_steps == 0 and not resume:
                    save_state(store, model, optimizer, lr_scheduler, scaler, completed_steps)
            if completed_steps >= max_train_steps:
                break

        model.eval()
        correct = 0
        for batch in eval_dataloader:
            with torch.no_grad():
                outputs = model(**batch)
            correct += (outputs.logits.argmax(dim=-1) == batch["labels"]).sum().item()
        print(f"epoch {epoch} eval_accuracy {correct!r} train_loss {float(total_loss)!r}")
    return scaler


def main():
    args = parse_args()
    store = {}
    train(args, store, resume=False)
    scaler = train(args, store, resume=True)
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
