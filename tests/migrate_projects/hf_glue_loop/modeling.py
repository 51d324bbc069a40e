"""A tiny sequence classifier with a Hugging Face-style interface: keyword inputs, an output
object carrying ``loss`` (when labels are given) and ``logits``."""

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class SequenceClassifierOutput:
    loss: Optional[torch.Tensor]
    logits: torch.Tensor


class TinyEncoderForSequenceClassification(nn.Module):
    def __init__(self, vocab_size=50, hidden=16, num_labels=3):
        super().__init__()
        self.embeddings = nn.Embedding(vocab_size, hidden)
        self.LayerNorm = nn.LayerNorm(hidden)
        self.dense = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, num_labels)
        self.num_labels = num_labels

    def forward(self, input_ids, attention_mask, labels=None):
        h = self.LayerNorm(self.embeddings(input_ids))
        mask = attention_mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * mask).sum(1) / mask.sum(1)
        logits = self.classifier(torch.tanh(self.dense(pooled)))
        loss = (
            F.cross_entropy(logits.float().view(-1, self.num_labels), labels.view(-1)) if labels is not None else None
        )
        return SequenceClassifierOutput(loss=loss, logits=logits)
