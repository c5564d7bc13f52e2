import torch


def scaled_residual_gelu(x, residual, weight, alpha=0.5):
    """y = gelu(x * weight) + alpha * residual, over the last dim."""
    return torch.nn.functional.gelu(x * weight, approximate="tanh") + alpha * residual
