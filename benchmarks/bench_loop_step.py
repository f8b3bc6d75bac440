"""One device's training step on one thread: the loop trainer's step against torch's autograd.

For each built-in (on Fashion-MNIST-sized images, minibatches of 16) three ways to the same
gradients, alternated, each the median microseconds of `--steps` steps over `--repeat` rounds:

* module: torch's autograd through the built-in nn.Module itself (conv, ReLU, max pool in the
  module's order, `F.cross_entropy`): what a plain PyTorch loop computes;
* autograd: autograd through fedsim's kernels (`autograd_step`: the pool before its ReLU, the
  pool on a channels-last copy), the loop's step before reverse mode was written out;
* written out: the loop's step today (`reverse_step`: no graph, the same kernels).

The three give the same gradients bit for bit (checked on the step's inputs before timing).
`--pools` also times 2x2 max pooling forward and backward alone, torch's `max_pool2d` in the
default layout against the channels-last copy training uses (`max_pool_2x2`), at the shapes of
cnn-fmnist's and LeNet-5's pools.

    python benchmarks/bench_loop_step.py [--models lenet5,cnn-fmnist,mlp,logreg] [--batch 16]
                                         [--steps 50] [--repeat 7] [--pools] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from bench_cohort import machine  # noqa: E402

from fedsim.config import ModelConfig  # noqa: E402
from fedsim.config.catalog import MODELS  # noqa: E402
from fedsim.training.kernels import autograd_step, max_pool_2x2  # noqa: E402
from fedsim.training.losses import weighted_cross_entropy  # noqa: E402
from fedsim.training.models import build_model  # noqa: E402

SHAPE = (1, 28, 28)
STEPPED = ("lenet5", "cnn-fmnist", "mlp", "logreg")  # built-ins whose loop step is written out, on 28x28 images
POOLS = [(16, 32, 28, 28), (16, 32, 14, 14), (16, 6, 28, 28), (16, 16, 10, 10)]


def ways(name: str, batch: int):
    """The three step functions of `name`, each a no-argument call, after checking that they agree."""
    cfg = ModelConfig(name=name)
    model = build_model(cfg, SHAPE, 10, "fashion-mnist", seed=0)
    torch.manual_seed(0)
    module = MODELS.lookup(name, "name")(SHAPE, 10, cfg)
    g = torch.Generator().manual_seed(1)
    x = torch.rand(batch, *SHAPE, generator=g)
    x[x < 0.5] = 0.0  # blank pixels, as in Fashion-MNIST
    y, weight = torch.randint(0, 10, (batch,), generator=g), torch.full((batch,), 1.0 / batch)
    tensors, u = model.split(model.init(0)), torch.empty(batch, 0)
    kernels = autograd_step(lambda ps, x, u: model.forward(ps, x, None), weighted_cross_entropy)
    written = model.step_fn(weighted_cross_entropy, batched=False)
    params = list(module.parameters())

    def through_module():
        loss = (F.cross_entropy(module(x), y, reduction="none") * weight).sum()
        return torch.autograd.grad(loss, params), loss.detach()

    steps = {"module": through_module, "autograd": lambda: kernels(tensors, x, y, weight, u),
             "written out": lambda: written(tensors, x, y, weight, u)}
    results = [f() for f in steps.values()]
    for grads, loss in results[1:]:
        assert torch.equal(loss, results[0][1]) and all(torch.equal(a, b) for a, b in zip(grads, results[0][0]))
    return steps


def median_us(calls: dict, steps: int, repeat: int) -> dict[str, float]:
    """Median microseconds a call of each of `calls`, alternated round by round."""
    times: dict[str, list[float]] = {k: [] for k in calls}
    for f in calls.values():
        f()
    for _ in range(repeat):
        for k, f in calls.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                f()
            times[k].append((time.perf_counter() - t0) / steps * 1e6)
    return {k: round(statistics.median(v), 1) for k, v in times.items()}


def pool_calls(shape: tuple[int, ...]) -> dict:
    g = torch.Generator().manual_seed(2)
    x = torch.relu(torch.randn(*shape, generator=g)).requires_grad_()
    grad = torch.randn(*shape[:2], shape[2] // 2, shape[3] // 2, generator=g)
    return {"max_pool2d": lambda: torch.autograd.grad(F.max_pool2d(x, 2), x, grad),
            "channels-last": lambda: torch.autograd.grad(max_pool_2x2(x), x, grad)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(STEPPED), help="comma-separated subset of " + ", ".join(STEPPED))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--pools", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    for name in args.models.split(","):
        if name not in STEPPED:
            parser.exit(2, f"error: --models: unknown name '{name}'; choose from {', '.join(STEPPED)}\n")
    torch.set_num_threads(1)
    record = {"machine": machine(), "load_before": os.getloadavg(), "batch": args.batch, "steps": [], "pools": []}
    print(f"{record['machine']}; load {record['load_before'][0]:.2f}; one thread; minibatch {args.batch}")
    print(f"{'model':<12} {'module us':>10} {'autograd us':>12} {'written us':>11} {'module/written':>15}")
    for name in args.models.split(","):
        us = median_us(ways(name, args.batch), args.steps, args.repeat)
        record["steps"].append({"model": name, **us})
        print(f"{name:<12} {us['module']:>10.0f} {us['autograd']:>12.0f} {us['written out']:>11.0f} "
              f"{us['module'] / us['written out']:>14.2f}x")
    if args.pools:
        print(f"{'pool shape':<18} {'max_pool2d us':>14} {'channels-last us':>17}")
        for shape in POOLS:
            us = median_us(pool_calls(shape), args.steps, args.repeat)
            record["pools"].append({"shape": shape, **us})
            print(f"{str(shape):<18} {us['max_pool2d']:>14.0f} {us['channels-last']:>17.0f}")
    record["load_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
