"""Rule: statements the loss does not need stay on the main thread, in order.

The shape of torchvision's and NVIDIA's ImageNet reference trainers: accuracy and running
averages are computed between the loss and the backward, outside the autocast block. They
stay where they run (after `forward_backward`, which returns the outputs they read), and
`optimizer.zero_grad()` before the backward moves to the end of the step function.
"""

import roundpipe
import torch

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def accuracy(output, target, topk=(1,)):
    return [(output.argmax(1) == target).float().mean() * 100 for _ in topk]


def train(loader, model, criterion, optimizer, scaler, losses, top1):
    model.train()
    for i, (images, target) in enumerate(loader):
        with torch.autocast("cuda"):

            def _loss_fn(output, target):
                loss = criterion(output, target)
                _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
                return scaler.scale(loss) / NUM_MICROBATCH

            _losses = []
            output = model.forward_backward(
                input_args=(images,),
                label=target,
                loss_fn=_loss_fn,
                return_outputs=True,
            )[1]
            loss = sum(_losses)
        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        losses.append((loss.item(), images.size(0)))
        top1.append(acc1)

        def _step_fn():
            scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        scaler.update()


def main(loader):
    model = torch.nn.Linear(4, 3)
    criterion = torch.nn.CrossEntropyLoss()
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    scaler = roundpipe.GradScaler(enabled=torch.cuda.is_available())
    for epoch in range(3):
        train(loader, model, criterion, optimizer, scaler, [], [])
