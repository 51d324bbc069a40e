"""Rule loss_scaler_wrapper: an MAE-style loss-scaler wrapper (grad norm returned, update_grad
flag) built and called in one file; the wrapper steps its RoundPipe model in the autograd form."""

import roundpipe
import torch

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def get_grad_norm_(parameters, norm_type=2.0):
    parameters = [p for p in parameters if p.grad is not None]
    return torch.norm(torch.stack([torch.norm(p.grad.detach(), norm_type) for p in parameters]), norm_type)


class NativeScalerWithGradNormCount:
    state_dict_key = "amp_scaler"

    def __init__(self, *, model):
        self._model = model
        self._scaler = roundpipe.GradScaler(enabled=torch.cuda.is_available())

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, create_graph=False, update_grad=True):
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if update_grad:

            def _step_fn():
                nonlocal norm
                if clip_grad is not None:
                    assert parameters is not None
                    self._scaler.unscale_(optimizer)  # unscale the gradients in place
                    norm = torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
                else:
                    self._scaler.unscale_(optimizer)
                    norm = get_grad_norm_(parameters)
                self._scaler.step(optimizer)

            self._model.step(_step_fn, is_async=False)
            self._scaler.update()
        else:
            norm = None
        return norm

    def state_dict(self):
        return self._scaler.state_dict()

    def load_state_dict(self, state_dict):
        self._scaler.load_state_dict(state_dict)


def main(model, loader, accum_iter):
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=1e-3)
    loss_scaler = NativeScalerWithGradNormCount(model=model)
    for step, (x, y) in enumerate(loader):
        with torch.autocast("cuda"):
            loss = torch.nn.functional.cross_entropy(model(x), y) / accum_iter
        update = (step + 1) % accum_iter == 0
        norm = loss_scaler(loss, optimizer, parameters=model.optim_parameters(), update_grad=update)
        model.synchronize()
        if update:
            optimizer.zero_grad()
            model.zero_grad()
            print(norm.item())
    model.synchronize()
    torch.save({"model": model.model.state_dict(), loss_scaler.state_dict_key: loss_scaler.state_dict()}, "ckpt.pth")
