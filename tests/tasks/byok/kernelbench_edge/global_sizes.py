import torch
import torch.nn as nn

SCALE = 3.0


class Model(nn.Module):
    """A forward that reads a module-level constant (a plain-function rewrite would lose it)."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a * SCALE + b


n = 40
d0, d1 = 12, 12


def get_inputs():
    a = torch.rand(n, d0 * 2)
    return [a, torch.randn(n, d1 * 2)]


def get_init_inputs():
    return []
