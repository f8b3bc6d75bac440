"""`resnet18-gn`: ResNet-18 with GroupNorm and the CIFAR stem, an ordinary nn.Module.

The standard model of federated image benchmarks since Hsieh et al. 2020 ("The non-IID data
quagmire", whose GroupNorm uses 2 groups per layer) and FLUTE's Fed-CIFAR100: torchvision's
resnet18 with BatchNorm replaced by GroupNorm(2, C) and the ImageNet stem (7x7 stride-2
convolution, max-pool) replaced by one 3x3 stride-1 convolution for 32x32 images: 11,173,962
parameters for 10 classes. GroupNorm rather than BatchNorm because its statistics are per
sample: nothing to average across devices whose data differ (docs/extending.md).
"""

from __future__ import annotations

from torch import Tensor, nn

GROUPS = 2


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.GroupNorm(GROUPS, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.GroupNorm(GROUPS, c_out)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.GroupNorm(GROUPS, c_out))

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet18GN(nn.Module):
    """torchvision's resnet18 layout and parameter names (conv1, bn1, layer1-4, fc)."""

    def __init__(self, channels: int, n_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.GroupNorm(GROUPS, 64)
        self.relu = nn.ReLU()
        widths, c_in = [64, 128, 256, 512], 64
        for i, width in enumerate(widths):
            stride = 1 if i == 0 else 2
            setattr(self, f"layer{i + 1}", nn.Sequential(BasicBlock(c_in, width, stride), BasicBlock(width, width, 1)))
            c_in = width
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, n_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet18_gn(in_shape, n_classes, cfg) -> ResNet18GN:
    return ResNet18GN(in_shape[0], n_classes)
