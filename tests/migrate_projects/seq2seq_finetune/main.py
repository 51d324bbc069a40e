"""Shape: a Whisper-style sequence-to-sequence fine-tune with a hand-written loop (held-out
round).

``modeling.TinySeq2Seq`` returns an output object (``.loss``, ``.logits``) from
``model(**batch)`` with ``labels`` padded by -100, and decodes with its own ``generate``.
``main`` optionally freezes the encoder (``model.freeze_encoder()``), builds AdamW over the
parameters that still require gradients, reads ``model.config`` for the collator after the
optimizer exists, and a linear warm-up/decay ``LambdaLR``. The loop divides the loss by
``gradient_accumulation_steps``, backpropagates through ``GradScaler(enabled=args.fp16)``,
and on update steps unscales, clips (the norm is logged), steps, updates, steps the
scheduler and zeroes the gradients with ``set_to_none=True``; every ``eval_steps`` updates
``evaluate`` switches to ``model.eval()``, decodes with ``model.generate`` and scores a token
error rate, then the loop switches back with ``model.train()``. The checkpoint holds the
model, the optimizer, the scheduler and the scaler. Hard: a method other than ``forward``
runs the wrapped model, ``model.config`` is read after the wrap, and frozen parameters are
filtered out of the optimizer.
"""

import argparse
import io

import torch

from modeling import Seq2SeqConfig, TinySeq2Seq


class DataCollatorSpeechSeq2SeqWithPadding:
    """Stacks the features and pads the label sequences with -100, dropping a leading
    decoder start token when every sequence has one."""

    def __init__(self, decoder_start_token_id):
        self.decoder_start_token_id = decoder_start_token_id

    def __call__(self, features):
        input_features = torch.stack([f["input_features"] for f in features])
        longest = max(len(f["labels"]) for f in features)
        labels = torch.full((len(features), longest), -100, dtype=torch.long)
        for row, f in enumerate(features):
            labels[row, : len(f["labels"])] = f["labels"]
        if (labels[:, 0] == self.decoder_start_token_id).all():
            labels = labels[:, 1:]
        return {"input_features": input_features, "labels": labels}


def get_linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    def lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        return max(0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


def make_examples(n, seed):
    gen = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(n):
        length = int(torch.randint(2, 5, (1,), generator=gen))
        tokens = torch.randint(3, 12, (length,), generator=gen)
        examples.append(
            {
                "input_features": torch.randn(5, 6, generator=gen),
                "labels": torch.cat([torch.tensor([1]), tokens, torch.tensor([2])]),
            }
        )
    return examples


def batches(examples, batch_size, collator):
    return [collator(examples[i : i + batch_size]) for i in range(0, len(examples), batch_size)]


def token_error_rate(predictions, labels):
    errors, total = 0, 0
    for pred, label in zip(predictions, labels):
        label = label[label != -100]
        pred = pred[: len(label)]
        errors += int((pred != label[: len(pred)]).sum()) + (len(label) - len(pred))
        total += len(label)
    return errors / max(total, 1)


def evaluate(model, eval_dataloader, args):
    model.eval()
    predictions, references = [], []
    for batch in eval_dataloader:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.fp16):
            generated = model.generate(batch["input_features"], max_length=args.generation_max_length)
        predictions.extend(generated)
        references.extend(batch["labels"])
    return {"ter": token_error_rate(predictions, references)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--freeze-encoder", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--learning-rate", type=float, default=5e-3)
    parser.add_argument("--batch-size", type=int, default=3)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=2)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--num-train-epochs", type=int, default=2)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--eval-steps", type=int, default=2)
    parser.add_argument("--generation-max-length", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(0)
    config = Seq2SeqConfig()
    model = TinySeq2Seq(config)
    if args.freeze_encoder:
        model.freeze_encoder()
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=args.learning_rate, weight_decay=0.01
    )
    collator = DataCollatorSpeechSeq2SeqWithPadding(decoder_start_token_id=model.config.decoder_start_token_id)
    train_dataloader = batches(make_examples(12, seed=4), args.batch_size, collator)
    eval_dataloader = batches(make_examples(4, seed=5), args.batch_size, collator)
    max_train_steps = args.num_train_epochs * len(train_dataloader) // args.gradient_accumulation_steps
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, args.warmup_steps, max_train_steps)
    scaler = torch.amp.GradScaler("cpu", enabled=args.fp16, init_scale=2.0**12, growth_interval=2)

    completed_steps = 0
    model.train()
    for epoch in range(args.num_train_epochs):
        for step, batch in enumerate(train_dataloader):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.fp16):
                outputs = model(**batch)
            loss = outputs.loss / args.gradient_accumulation_steps
            scaler.scale(loss).backward()
            if (step + 1) % args.gradient_accumulation_steps == 0:
                scaler.unscale_(optimizer)
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                scaler.step(optimizer)
                scaler.update()
                lr_scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                completed_steps += 1
                print(
                    f"step {completed_steps} loss {loss.item()!r} grad_norm {grad_norm.item()!r} lr {lr_scheduler.get_last_lr()[0]!r}"
                )
                if completed_steps % args.eval_steps == 0:
                    metrics = evaluate(model, eval_dataloader, args)
                    print(f"eval {completed_steps} ter {metrics['ter']!r}")
                    model.train()

    checkpoint = io.BytesIO()
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "lr_scheduler": lr_scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "epoch": epoch,
        },
        checkpoint,
    )
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
