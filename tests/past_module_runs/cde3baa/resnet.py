import torch.nn.functional as F
from torch import nn


class ResidualNet(nn.Module):
    """A user's MLP with a residual block and ELUs, written as a class (through torch.func)."""

    def __init__(self, n_classes):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(64, 32), nn.Linear(32, 32), nn.Linear(32, n_classes)

    def forward(self, x):
        h = F.elu(self.fc1(x.flatten(1)))
        return self.fc3(h + F.elu(self.fc2(h)))


def make(in_shape, n_classes, cfg):
    return ResidualNet(n_classes)
