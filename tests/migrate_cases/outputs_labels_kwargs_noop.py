import torch
import torch.nn.functional as F


def fit(model, batches, device):
    # Mentions GradScaler only in this comment: nothing to migrate.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step, (x, mask, y, w) in enumerate(batches):
        logits = model(x, attention_mask=mask)
        loss = F.cross_entropy(logits, y, reduction="sum") * w.mean()
        loss.backward()
        optimizer.step()
        model.zero_grad(set_to_none=True)
