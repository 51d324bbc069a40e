"""MoCo v3's model: a base encoder with a predictor, and a momentum encoder that follows the
base encoder inside ``forward`` (under ``torch.no_grad()``) before it encodes the keys."""

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp(in_dim, hidden, out_dim):
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, out_dim))


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=8, mlp_dim=16, T=1.0):
        super().__init__()
        self.T = T
        self.base_encoder = base_encoder(num_classes=mlp_dim)
        self.momentum_encoder = base_encoder(num_classes=mlp_dim)
        hidden_dim = self.base_encoder.fc.weight.shape[1]
        self.base_encoder.fc = mlp(hidden_dim, mlp_dim, dim)
        self.momentum_encoder.fc = mlp(hidden_dim, mlp_dim, dim)
        self.predictor = mlp(dim, mlp_dim, dim)
        for param_b, param_m in zip(self.base_encoder.parameters(), self.momentum_encoder.parameters()):
            param_m.data.copy_(param_b.data)
            param_m.requires_grad = False

    @torch.no_grad()
    def _update_momentum_encoder(self, m):
        """Momentum update of the momentum encoder from the base encoder's weights."""
        for param_b, param_m in zip(self.base_encoder.parameters(), self.momentum_encoder.parameters()):
            param_m.data = param_m.data * m + param_b.data * (1.0 - m)

    def contrastive_loss(self, q, k):
        q = F.normalize(q.float(), dim=1)
        k = F.normalize(k.float(), dim=1)
        logits = torch.einsum("nc,mc->nm", [q, k]) / self.T
        labels = torch.arange(logits.shape[0], dtype=torch.long)
        return nn.CrossEntropyLoss()(logits, labels) * (2 * self.T)

    def forward(self, x1, x2, m):
        q1 = self.predictor(self.base_encoder(x1))
        q2 = self.predictor(self.base_encoder(x2))
        with torch.no_grad():
            self._update_momentum_encoder(m)
            k1 = self.momentum_encoder(x1)
            k2 = self.momentum_encoder(x2)
        return self.contrastive_loss(q1, k2) + self.contrastive_loss(q2, k1)
