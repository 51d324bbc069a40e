"""A tiny Tacotron-like model: ``parse_batch`` splits a batch into inputs and targets, the
forward returns mel outputs, postnet outputs and gate logits, and ``Tacotron2Loss`` sums the
two mel errors and the gate's binary cross-entropy."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Tacotron2(nn.Module):
    def __init__(self, n_symbols=10, n_mel=6, hidden=16):
        super().__init__()
        self.embedding = nn.Embedding(n_symbols, hidden)
        self.encoder = nn.Linear(hidden, hidden)
        self.decoder = nn.Linear(hidden, n_mel)
        self.postnet = nn.Linear(n_mel, n_mel)
        self.gate = nn.Linear(hidden, 1)

    def parse_batch(self, batch):
        text, mel, gate = batch
        return (text, mel), (mel, gate)

    def forward(self, inputs):
        text, _ = inputs
        memory = torch.tanh(self.encoder(self.embedding(text)))
        mel_out = self.decoder(memory)
        mel_post = mel_out + self.postnet(mel_out)
        return mel_out, mel_post, self.gate(memory).squeeze(-1)


class Tacotron2Loss(nn.Module):
    def forward(self, model_output, targets):
        mel_target, gate_target = targets
        mel_out, mel_post, gate_out = model_output
        mel_loss = F.mse_loss(mel_out.float(), mel_target) + F.mse_loss(mel_post.float(), mel_target)
        gate_loss = F.binary_cross_entropy_with_logits(gate_out.float(), gate_target)
        return mel_loss + gate_loss
