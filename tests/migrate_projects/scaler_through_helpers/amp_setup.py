"""Everything precision-related, built from the config in one place."""

import torch


def setup_amp(cfg):
    """Return (autocast context factory, scaler) for the configured precision."""
    scaler = torch.amp.GradScaler("cpu", init_scale=cfg["init_scale"], growth_interval=cfg["growth_interval"])

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16)

    return autocast, scaler
