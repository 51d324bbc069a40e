import torch
from torch.cuda.amp import GradScaler, autocast

model = build_model().cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
scaler = GradScaler()
for epoch in range(3):
    for batch in loader:
        batch = {k: v.cuda() for k, v in batch.items()}
        with autocast():
            outputs = model(**batch)
            loss = outputs.loss
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        for batch in val_loader:
            print(model(**batch).loss.item())
    model.train()
    torch.save(model.state_dict(), f"ckpt{epoch}.pt")
