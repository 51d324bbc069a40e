"""A tiny token classifier returning an output object, as ``transformers`` models do."""

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn


@dataclass
class SequenceClassifierOutput:
    loss: Optional[torch.Tensor]
    logits: torch.Tensor


class TinyForSequenceClassification(nn.Module):
    def __init__(self, vocab_size=16, hidden=12, num_labels=3):
        super().__init__()
        self.embeddings = nn.Embedding(vocab_size, hidden)
        self.LayerNorm = nn.LayerNorm(hidden)
        self.dense = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, input_ids, attention_mask, labels=None):
        hidden = self.LayerNorm(self.embeddings(input_ids))
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1)
        logits = self.classifier(torch.tanh(self.dense(pooled)))
        loss = nn.functional.cross_entropy(logits.float(), labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits)
