"""Rule: statements the loss does not need stay on the main thread, in order.

The shape of torchvision's and NVIDIA's ImageNet reference trainers: accuracy and running
averages are computed between the loss and the backward, outside the autocast block. They
stay where they run (after `forward_backward`, which returns the outputs they read), and
`optimizer.zero_grad()` before the backward moves to the end of the step function.
"""

import torch


def accuracy(output, target, topk=(1,)):
    return [(output.argmax(1) == target).float().mean() * 100 for _ in topk]


def train(loader, model, criterion, optimizer, scaler, losses, top1):
    model.train()
    for i, (images, target) in enumerate(loader):
        with torch.autocast("cuda"):
            output = model(images)
            loss = criterion(output, target)
        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        losses.append((loss.item(), images.size(0)))
        top1.append(acc1)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()


def main(loader):
    model = torch.nn.Linear(4, 3)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for epoch in range(3):
        train(loader, model, criterion, optimizer, scaler, [], [])
