"""``apex.parallel`` stand-in for one process: SyncBN conversion keeps the module (there is
nothing to synchronise with), and DistributedDataParallel needs a process group."""

import torch


def convert_syncbn_model(module, process_group=None, channel_last=False):
    return module


class DistributedDataParallel(torch.nn.Module):
    def __init__(self, module, delay_allreduce=False, **_):
        if not torch.distributed.is_initialized():
            raise RuntimeError("apex.parallel.DistributedDataParallel needs an initialised process group")
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)
