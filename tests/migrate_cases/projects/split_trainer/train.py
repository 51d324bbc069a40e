"""Project rule: a trainer split over two files migrates; the model class stays in
models.py, the model object is built and trained here."""

import torch

from models import Regressor


def main():
    torch.manual_seed(0)
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    batches = [(torch.randn(16, 8), torch.randn(16, 1)) for _ in range(8)]
    for step, (x, y) in enumerate(batches):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.6f} scale {scaler.get_scale()}")


if __name__ == "__main__":
    main()
