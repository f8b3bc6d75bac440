from torch import nn


def make(in_shape, n_classes, cfg):
    """A user's MLP with a GELU and dropout, as an nn.Sequential."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, n_classes))
