import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm over a last dim that is twice the input's width: the width and the features
    cannot vary apart from the file's values (KernelBench has such problems)."""

    def __init__(self, features):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x):
        return self.norm(x.repeat_interleave(2, dim=-1))


batch_size = 6
height = 10
width = 32
features = 64


def get_inputs():
    return [torch.rand(batch_size, height, width)]


def get_init_inputs():
    return [features]
