"""A tiny Whisper-like encoder-decoder: ``forward(input_features, labels=...)`` shifts the
labels right into decoder inputs and returns an output object with ``loss`` and ``logits``;
``generate`` decodes greedily; ``freeze_encoder`` stops the encoder's gradients."""

import dataclasses
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class Seq2SeqConfig:
    n_mels: int = 6
    vocab_size: int = 12
    d_model: int = 16
    pad_token_id: int = 0
    decoder_start_token_id: int = 1
    eos_token_id: int = 2


@dataclasses.dataclass
class Seq2SeqLMOutput:
    loss: Optional[torch.Tensor]
    logits: torch.Tensor


def shift_tokens_right(labels, pad_token_id, decoder_start_token_id):
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1].clone()
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


class TinySeq2Seq(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.encoder = nn.Sequential(nn.Linear(config.n_mels, config.d_model), nn.GELU())
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.decoder = nn.GRU(config.d_model, config.d_model, batch_first=True)
        self.proj_out = nn.Linear(config.d_model, config.vocab_size)

    def freeze_encoder(self):
        for param in self.encoder.parameters():
            param.requires_grad = False

    def _decode(self, memory, decoder_input_ids):
        hidden = self.embed_tokens(decoder_input_ids) + memory.mean(dim=1, keepdim=True)
        out, _ = self.decoder(hidden)
        return self.proj_out(out)

    def forward(self, input_features, labels=None, decoder_input_ids=None):
        if labels is not None and decoder_input_ids is None:
            decoder_input_ids = shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)
        logits = self._decode(self.encoder(input_features), decoder_input_ids)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits.float().reshape(-1, self.config.vocab_size), labels.reshape(-1), ignore_index=-100
            )
        return Seq2SeqLMOutput(loss=loss, logits=logits)

    @torch.no_grad()
    def generate(self, input_features, max_length=5):
        memory = self.encoder(input_features)
        tokens = torch.full((input_features.shape[0], 1), self.config.decoder_start_token_id, dtype=torch.long)
        for _ in range(max_length):
            next_token = self._decode(memory, tokens)[:, -1].argmax(dim=-1, keepdim=True)
            tokens = torch.cat([tokens, next_token], dim=1)
        return tokens[:, 1:]
