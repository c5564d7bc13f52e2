import torch
import torch.nn as nn


class Model(nn.Module):
    """A strided, padded conv (its output size is (H + 2 - 3) // 2 + 1) then BatchNorm in train
    mode (it normalises by the batch and updates its running statistics)."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        return self.bn(self.conv(x))


batch_size = 4
in_channels = 3
out_channels = 8
height, width = 20, 33


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
