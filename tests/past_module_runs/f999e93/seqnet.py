from torch import nn


def make(in_shape, n_classes, cfg):
    """A user's MLP as an nn.Sequential of layers fedsim has kernels for, with dropout."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, n_classes))
