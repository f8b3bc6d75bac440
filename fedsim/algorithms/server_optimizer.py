"""Server optimizers: how an algorithm's aggregated update reaches the global model.

An algorithm computes its update Delta (what plain FedAvg would add to the model); the server
optimizer turns it into the step actually taken, treating g = -Delta as a gradient (Reddi et
al. 2021, "Adaptive Federated Optimization"):

    sgd       x <- x - lr * g
    momentum  m <- momentum * m + g;                          x <- x - lr * m
    adam      m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2;                x <- x - lr * m / (sqrt(v) + eps)
    adagrad   m <- b1 m + (1 - b1) g;  v <- v + g^2;                            (the same step)
    yogi      m <- b1 m + (1 - b1) g;  v <- v - (1 - b2) g^2 sign(v - g^2);     (the same step)

(the paper's Algorithm 2: FedAdam, FedAdagrad, FedYogi; no bias correction; eps is its tau.)
m and v start at 0 for all three: the paper allows any v_{-1} >= tau^2, and 0 is what fedsim's
adam has always done (its runs keep their numbers). So FedAvgM is fedavg + momentum, FedAdam
fedavg + adam, and every other algorithm can use them too. With sgd and lr = 1 the step is
Delta itself, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

ADAPTIVE = ("adam", "adagrad", "yogi")  # m and v, one step rule
SERVER_OPTIMIZERS = ("sgd", "momentum", *ADAPTIVE)


@dataclass(frozen=True)
class ServerOptimizerConfig:
    name: str = "sgd"
    lr: float = 1.0
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-3


class ServerOptimizer:
    """The optimizer's state (momentum: m; adam, adagrad, yogi: m and v, each like the model)
    and its rule."""

    def __init__(self, cfg: ServerOptimizerConfig, like: Tensor):
        self.cfg = cfg
        self.m = torch.zeros_like(like) if cfg.name in ("momentum", *ADAPTIVE) else None
        self.v = torch.zeros_like(like) if cfg.name in ADAPTIVE else None

    def step(self, delta: Tensor) -> Tensor:
        """The change to add to the model for the algorithm's update `delta` [d]."""
        cfg = self.cfg
        if cfg.name == "sgd":
            return cfg.lr * delta  # = -lr * g, exactly
        g = -delta
        if cfg.name == "momentum":
            self.m = cfg.momentum * self.m + g
            return -cfg.lr * self.m
        self.m = cfg.beta1 * self.m + (1 - cfg.beta1) * g
        if cfg.name == "adam":
            self.v = cfg.beta2 * self.v + (1 - cfg.beta2) * g * g
        elif cfg.name == "adagrad":
            self.v = self.v + g * g
        else:  # yogi: v moves by (1 - b2) g^2 towards g^2 (it stays >= 0)
            g2 = g * g
            self.v = self.v - (1 - cfg.beta2) * g2 * torch.sign(self.v - g2)
        return -cfg.lr * self.m / (self.v.sqrt() + cfg.eps)

    def state_dict(self) -> dict:
        return {"m": self.m, "v": self.v}

    def load_state_dict(self, sd: dict, device: torch.device) -> None:
        self.m, self.v = (None if sd[k] is None else sd[k].to(device) for k in ("m", "v"))

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.m, self.v) if t is not None)
