"""Aliased imports, an import inside a function and a try/except fallback."""
import torch
import torch.cuda.amp as A

try:
    from torch.amp import GradScaler
except ImportError:  # older torch
    from torch.cuda.amp import GradScaler


def run(model, batches, use_amp):
    from torch.amp import autocast as ac

    opt = torch.optim.Adam(model.parameters())
    scaler = GradScaler("cuda", enabled=use_amp)
    for batch in batches:
        inputs, labels = batch
        with ac("cuda", enabled=use_amp):
            logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(logits, labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    spare = A.GradScaler(enabled=False)  # the legacy alias, never stepped
    print(spare.get_scale())
