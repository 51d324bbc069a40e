"""Shape: a Hugging Face example script without accelerate (issue 10, shapes 6, 7 and 8).

The batches are dicts fed as ``model(**batch)``; the model returns an output object whose
``.loss`` is divided by ``gradient_accumulation_steps``; the parameters are grouped by name
into decay/no-decay (``"bias"``, ``"LayerNorm.weight"``); a warm-up/linear ``LambdaLR`` steps
with the optimizer when ``step % gradient_accumulation_steps == 0 or step == len(train_dataloader)
- 1``, and ``completed_steps`` counts the updates. Every ``eval_steps`` updates an evaluation
loop runs mid-epoch (``model.eval()``, ``torch.no_grad()``, accuracy from ``outputs.logits``)
and switches back with ``model.train()``; the running loss is summed from ``loss.detach()``.
Hard: keyword inputs, an output object, an update condition that also fires on the last
batch, and evaluation between updates.
"""

import argparse

import torch

from modeling import TinyEncoderForSequenceClassification


def get_linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    def lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        return max(0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


def make_dataloader(n, batch_size, seed):
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        input_ids = torch.randint(0, 50, (batch_size, 7), generator=gen)
        attention_mask = (torch.rand(batch_size, 7, generator=gen) > 0.2).long()
        attention_mask[:, 0] = 1
        labels = torch.randint(0, 3, (batch_size,), generator=gen)
        batches.append({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels})
    return batches


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--learning_rate", type=float, default=5e-3)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--num_train_epochs", type=int, default=2)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--num_warmup_steps", type=int, default=1)
    parser.add_argument("--eval_steps", type=int, default=2)
    parser.add_argument("--max_grad_norm", type=float, default=1.0)
    parser.add_argument("--fp16", action=argparse.BooleanOptionalAction, default=True)
    return parser.parse_args()


def main():
    args = parse_args()
    torch.manual_seed(42)
    model = TinyEncoderForSequenceClassification()
    train_dataloader = make_dataloader(5, 4, seed=0)
    eval_dataloader = make_dataloader(2, 4, seed=1)

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
    num_update_steps_per_epoch = -(-len(train_dataloader) // args.gradient_accumulation_steps)
    max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, args.num_warmup_steps, max_train_steps)
    scaler = torch.amp.GradScaler("cpu", enabled=args.fp16, init_scale=1024.0, growth_interval=2)

    completed_steps = 0
    for epoch in range(args.num_train_epochs):
        model.train()
        total_loss = 0.0
        for step, batch in enumerate(train_dataloader):
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

                if completed_steps % args.eval_steps == 0:
                    model.eval()
                    correct, seen = 0, 0
                    for eval_batch in eval_dataloader:
                        with torch.no_grad():
                            eval_outputs = model(**eval_batch)
                        predictions = eval_outputs.logits.argmax(dim=-1)
                        correct += (predictions == eval_batch["labels"]).sum().item()
                        seen += predictions.numel()
                    print(f"eval step {completed_steps} accuracy {correct / seen!r}")
                    model.train()
        print(f"epoch {epoch} train_loss {(total_loss / len(train_dataloader)).item()!r}")
    state = model.state_dict()
    print(f"saved {sorted(state)[:2]!r}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
