import torch
import torch.nn as nn


class Model(nn.Module):
    """Elementwise: a * scale + b."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * self.scale + b


batch_size = 16
dim = 96
scale = 0.5


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return [scale]
