"""Mixed-precision classification where the logits are reused after the step.

The autocast outputs feed an accuracy metric once the optimizer has stepped,
so the forward results must stay available after backward.
"""

import roundpipe
import torch
import torch.nn as nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


class SmallClassifier(nn.Module):
    def __init__(self, in_features, hidden, num_classes):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.head(self.body(x))


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    num_classes = 4
    model = SmallClassifier(8, 32, num_classes).to(device)
    criterion = nn.CrossEntropyLoss()
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.Adam(model.optim_parameters(), lr=2e-2)
    scaler = roundpipe.GradScaler(enabled=device != "cuda" or torch.cuda.is_available())

    # A learnable synthetic task: the label is the argmax of a fixed projection.
    projection = torch.randn(8, num_classes)
    features = torch.randn(10, 64, 8)
    all_labels = (features @ projection).argmax(dim=-1)

    for step in range(10):
        inputs = features[step].to(device)
        labels = all_labels[step].to(device)

        with torch.autocast(device_type=device, dtype=torch.bfloat16):

            def _loss_fn(logits, labels):
                loss = criterion(logits, labels)
                _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
                return scaler.scale(loss) / NUM_MICROBATCH

            _losses = []
            logits = model.forward_backward(
                input_args=(inputs,),
                label=labels,
                loss_fn=_loss_fn,
                return_outputs=True,
            )[1]
            loss = sum(_losses)

        def _step_fn():
            scaler.step(optimizer)
            # Clear gradients through the module rather than the optimizer.
            optimizer.zero_grad(set_to_none=True)

        model.step(_step_fn)
        scaler.update()

        # The forward outputs are still valid here: use them for a metric.
        correct = (logits.argmax(dim=1) == labels).sum().item()
        acc = correct / labels.size(0)
        print(f"step {step} loss {loss.item():.6f} acc {acc:.4f}")


if __name__ == "__main__":
    main()
