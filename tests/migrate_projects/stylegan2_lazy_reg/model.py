"""A tiny generator (a mapping network from noise to a style, then a synthesis layer) and a
discriminator on 4x4 single-channel images."""

import torch
import torch.nn as nn


class Generator(nn.Module):
    def __init__(self, style_dim=8, size=4):
        super().__init__()
        self.style_dim = style_dim
        self.size = size
        self.style = nn.Sequential(nn.Linear(style_dim, style_dim), nn.LeakyReLU(0.2), nn.Linear(style_dim, style_dim))
        self.synthesis = nn.Linear(style_dim, size * size)

    def forward(self, styles):
        latent = self.style(styles[0])
        return torch.tanh(self.synthesis(latent)).view(-1, 1, self.size, self.size), latent


class Discriminator(nn.Module):
    def __init__(self, size=4):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(size * size, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)
