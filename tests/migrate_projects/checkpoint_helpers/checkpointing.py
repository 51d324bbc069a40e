"""Checkpoint helpers: they only save and load state, including the scaler's."""

import torch


def save_checkpoint(path, model, optimizer, scaler, epoch, best_metric=None):
    state = {"epoch": epoch, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    if best_metric is not None:
        state["best_metric"] = best_metric
    torch.save(state, path)


def resume_checkpoint(path, model, optimizer=None, scaler=None):
    checkpoint = torch.load(path, map_location="cpu")
    model.load_state_dict(checkpoint["state_dict"])
    if optimizer is not None and "optimizer" in checkpoint:
        optimizer.load_state_dict(checkpoint["optimizer"])
    if scaler is not None and "scaler" in checkpoint:
        scaler.load_state_dict(checkpoint["scaler"])
    return checkpoint["epoch"] + 1
