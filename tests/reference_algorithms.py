"""Tiny, independent numpy versions of ALGORITHMS.md §1 on the quadratic task.

Written from the spec alone, with plain loops over rounds and devices, so that the engine's
vectorised torch implementations can be checked against them. Every function takes

* ``U`` [N, d]: client targets, f_i(x) = ½‖x − u_i‖² (exact gradients);
* ``avail`` [R, N] bool: who is available in each round (all of them are invited unless the
  algorithm selects itself);
* ``x0`` [d], ``lr(t)`` the client lr of (1-based) update round t, ``steps`` local steps,
  ``server_lr`` η_g (or, where taken, a server ``optimizer``);

and returns the final evaluated model (float64).
"""

from __future__ import annotations

import math

import numpy as np


def local_sgd(w, u, steps, lr, mu=0.0, g=0.0):
    """``steps`` exact gradient steps on ½‖w − u‖² (+ mu/2 ‖w − w_start‖² + <g, w>)."""
    anchor = np.array(w, dtype=np.float64)
    w = anchor.copy()
    for _ in range(steps):
        w = w - lr * ((w - u) + mu * (w - anchor) + g)
    return w


def online(avail, t):
    return [i for i in range(avail.shape[1]) if avail[t, i]]


class ServerOptimizer:
    """The server optimizers on g = −Δ (Reddi et al. 2021, Algorithm 2: FedAdam, FedAdagrad, FedYogi
    without bias correction, v from 0)."""

    def __init__(self, kind, lr=1.0, momentum=0.9, beta1=0.9, beta2=0.99, eps=1e-3):
        self.kind, self.lr, self.mu, self.b1, self.b2, self.eps = kind, lr, momentum, beta1, beta2, eps
        self.m = self.v = 0.0

    def new_x(self, x, delta):
        g = -delta
        if self.kind == "sgd":
            return x - self.lr * g
        if self.kind == "momentum":
            self.m = self.mu * self.m + g
            return x - self.lr * self.m
        self.m = self.b1 * self.m + (1 - self.b1) * g
        if self.kind == "adam":
            self.v = self.b2 * self.v + (1 - self.b2) * g * g
        elif self.kind == "adagrad":
            self.v = self.v + g * g
        else:  # yogi
            self.v = self.v - (1 - self.b2) * g * g * np.sign(self.v - g * g)
        return x - self.lr * self.m / (np.sqrt(self.v) + self.eps)


def fedavg(U, avail, x0, lr, steps, server_lr=1.0, mu=0.0, optimizer=None):
    """``optimizer``: a ServerOptimizer (FedAvgM, FedAdam); default sgd at ``server_lr``."""
    optimizer = optimizer or ServerOptimizer("sgd", server_lr)
    x = np.array(x0, dtype=np.float64)
    for t in range(avail.shape[0]):
        A = online(avail, t)
        if A:
            deltas = [local_sgd(x, U[i], steps, lr(t + 1), mu) - x for i in A]
            x = optimizer.new_x(x, sum(deltas) / len(A))
    return x


def fedavg_all(U, avail, x0, lr, steps, server_lr=1.0):
    N = U.shape[0]
    x = np.array(x0, dtype=np.float64)
    for t in range(avail.shape[0]):
        total = np.zeros_like(x)
        for i in online(avail, t):
            total += local_sgd(x, U[i], steps, lr(t + 1)) - x
        x = x + server_lr * total / N
    return x


def fedavg_known_p(U, avail, x0, lr, steps, p, server_lr=1.0):
    """``p`` [R, N]: the true availability probabilities."""
    N = U.shape[0]
    x = np.array(x0, dtype=np.float64)
    for t in range(avail.shape[0]):
        total = np.zeros_like(x)
        for i in online(avail, t):
            total += (local_sgd(x, U[i], steps, lr(t + 1)) - x) / p[t, i]
        x = x + server_lr * total / N
    return x


def fedavg_wait(U, avail, x0, lr, steps, draw, server_lr=1.0):
    """``draw(t)``: the S devices drawn at the start of round t (a new wait)."""
    x = np.array(x0, dtype=np.float64)
    sample, seen = None, None
    for t in range(avail.shape[0]):
        if sample is None:
            sample, drawn_at = list(draw(t)), t
            seen = set()
        seen |= {i for i in sample if avail[t, i]}
        if len(seen) == len(sample):
            deltas = [local_sgd(x, U[i], steps, lr(drawn_at + 1)) - x for i in sample]
            x = x + server_lr * sum(deltas) / len(sample)
            sample = None
    return x


def fedlaavg(U, avail, x0, lr, steps, beta, server_lr=1.0):
    N = U.shape[0]
    K = int(math.floor(beta * N + 0.5))
    x = np.array(x0, dtype=np.float64)
    last = [-1] * N
    G_last = np.zeros_like(U, dtype=np.float64)
    G_bar = np.zeros_like(x)
    for t in range(avail.shape[0]):
        chosen = sorted(online(avail, t), key=lambda i: (last[i], i))[:K]
        for i in chosen:
            G = (x - local_sgd(x, U[i], steps, lr(t + 1))) / lr(t + 1)
            G_bar = G_bar + (G - G_last[i]) / N
            G_last[i] = G
            last[i] = t
        x = x - server_lr * lr(t + 1) * G_bar
    return x


def mifa(U, avail, x0, lr, steps, warmup=False, server_lr=1.0):
    N = U.shape[0]
    x = np.array(x0, dtype=np.float64)
    G = np.zeros_like(U, dtype=np.float64)
    ever = [False] * N
    updates = 0
    for t in range(avail.shape[0]):
        A = online(avail, t)
        if warmup and not all(ever):
            for i in A:
                ever[i] = True
            if not all(ever):
                continue
            A = list(range(N))
        lr_t = lr(updates + 1)
        for i in A:
            G[i] = (x - local_sgd(x, U[i], steps, lr_t)) / lr_t
        updates += 1
        x = x - server_lr * lr_t * G.mean(0)
    return x


def fedawe(U, avail, x0, lr, steps, clip=0.0, server_lr=1.0, echoes=None):
    """``echoes``: optional dict filled with {device: [echo factors used, in order]}."""
    N = U.shape[0]
    xs = [np.array(x0, dtype=np.float64) for _ in range(N)]
    tau = [-1] * N
    for t in range(avail.shape[0]):
        A = online(avail, t)
        if not A:
            continue
        mean_start = sum(xs[i] for i in A) / len(A)
        echoed = np.zeros_like(mean_start)
        for i in A:
            G = xs[i] - local_sgd(xs[i], U[i], steps, lr(t + 1))
            echoed += -server_lr * (t - tau[i]) * G / len(A)
            if echoes is not None:
                echoes.setdefault(i, []).append(t - tau[i])
            tau[i] = t
        norm = np.linalg.norm(echoed)
        if clip > 0 and norm > clip:
            echoed = echoed * clip / norm
        for i in A:
            xs[i] = mean_start + echoed
    return sum(xs) / N


def amplified(U, avail, x0, lr, steps, period, eta, server_lr=1.0):
    x = np.array(x0, dtype=np.float64)
    u = np.zeros_like(x)
    t0 = 0
    for t in range(avail.shape[0]):
        A = online(avail, t)
        if A:
            step = server_lr * sum(local_sgd(x, U[i], steps, lr(t + 1)) - x for i in A) / len(A)
            x = x + step
            u = u + step
        if t + 1 - t0 == period:
            x = x + (eta - 1) * u
            t0 = t + 1
            u = np.zeros_like(x)
    return x


def fedau(U, avail, x0, lr, steps, cutoff, server_lr=1.0):
    N = U.shape[0]
    x = np.array(x0, dtype=np.float64)
    c = [0] * N
    recorded = [[] for _ in range(N)]
    for t in range(avail.shape[0]):
        A = online(avail, t)
        total = np.zeros_like(x)
        for i in range(N):
            if i in A:
                omega = np.mean(recorded[i]) if recorded[i] else 1.0
                total += omega * (local_sgd(x, U[i], steps, lr(t + 1)) - x)
                recorded[i].append(c[i] + 1)
                c[i] = 0
            else:
                c[i] += 1
                if c[i] >= cutoff:
                    recorded[i].append(cutoff)
                    c[i] = 0
        x = x + server_lr * total / N
    return x


def fedvarp(U, avail, x0, lr, steps, server_lr=1.0, optimizer=None):
    optimizer = optimizer or ServerOptimizer("sgd", server_lr)
    x = np.array(x0, dtype=np.float64)
    y = np.zeros_like(U, dtype=np.float64)
    for t in range(avail.shape[0]):
        A = online(avail, t)
        if not A:
            continue
        v = y.mean(0)
        new = {i: local_sgd(x, U[i], steps, lr(t + 1)) - x for i in A}
        for i in A:
            v = v + (new[i] - y[i]) / len(A)
        x = optimizer.new_x(x, v)
        for i in A:
            y[i] = new[i]
    return x


def fednova(U, avail, x0, lr, steps, server_lr=1.0):
    """``steps`` [N]: each device's local steps τ_i. x += η_g τ_eff Σ p_i Δ_i / τ_i, p_i = 1/|A|."""
    x = np.array(x0, dtype=np.float64)
    for t in range(avail.shape[0]):
        A = online(avail, t)
        if A:
            tau_eff = sum(steps[i] for i in A) / len(A)
            normalised = sum((local_sgd(x, U[i], steps[i], lr(t + 1)) - x) / steps[i] for i in A) / len(A)
            x = x + server_lr * tau_eff * normalised
    return x


def sequential_sgd(U, avail, x0, lr, steps, server_lr=1.0):
    """SGD on the pooled objective (1/N) Σ f_i, as many steps per round as the cohort takes."""
    x = np.array(x0, dtype=np.float64)
    center = U.mean(0)
    for t in range(avail.shape[0]):
        start = x.copy()
        end = local_sgd(start, center, steps * len(online(avail, t)), lr(t + 1))
        x = start + server_lr * (end - start)
    return x



def fedasync(U, avail, x0, lr, steps, alpha, server_lr=1.0):
    """FedAsync driven in rounds (every arrival started from the round's model, staleness 0):
    the arrivals mixed in one after another, x <- x + server_lr·alpha·(x_t + Δ_i − x)."""
    x = np.array(x0, dtype=np.float64)
    for t in range(avail.shape[0]):
        start = x.copy()
        for i in online(avail, t):
            x = x + server_lr * alpha * (local_sgd(start, U[i], steps, lr(t + 1)) - x)
    return x


def scaffold(U, avail, x0, lr, steps, server_lr=1.0):
    """Option II with the server's c kept as its own vector (the engine keeps c = mean c_i);
    ``steps`` an int or each device's [N]."""
    N = U.shape[0]
    K = np.broadcast_to(steps, (N,))
    x = np.array(x0, dtype=np.float64)
    c, ci = np.zeros_like(x), np.zeros_like(U, dtype=np.float64)
    for t in range(avail.shape[0]):
        A = online(avail, t)
        if not A:
            continue
        lr_t = lr(t + 1)
        y = {i: local_sgd(x, U[i], K[i], lr_t, g=c - ci[i]) for i in A}
        fresh = {i: ci[i] - c + (x - y[i]) / (K[i] * lr_t) for i in A}
        x = x + server_lr * sum(y[i] - x for i in A) / len(A)
        c = c + sum(fresh[i] - ci[i] for i in A) / N
        for i in A:
            ci[i] = fresh[i]
    return x


def feddyn(U, avail, x0, lr, steps, alpha, server_lr=1.0):
    """Acar et al. Algorithm 1 with local SGD steps for the device's minimisation; ``steps`` an
    int or each device's [N]."""
    N = U.shape[0]
    K = np.broadcast_to(steps, (N,))
    x = np.array(x0, dtype=np.float64)
    h, hi = np.zeros_like(x), np.zeros_like(U, dtype=np.float64)
    for t in range(avail.shape[0]):
        A = online(avail, t)
        if not A:
            continue
        y = {i: local_sgd(x, U[i], K[i], lr(t + 1), mu=alpha, g=-hi[i]) for i in A}
        for i in A:
            hi[i] = hi[i] - alpha * (y[i] - x)
        h = h - alpha * sum(y[i] - x for i in A) / N
        x = x + server_lr * (sum(y[i] for i in A) / len(A) - h / alpha - x)
    return x
