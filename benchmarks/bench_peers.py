"""fedsim against peer FL frameworks: the same FedAvg run, each framework in its own process.

The run: scikit-learn's digits (pixels / 16; fedsim's stratified 75/25 train/test split) split
IID over 100 devices, logistic regression 64 -> 10 with softmax cross-entropy, devices sampled
uniformly without replacement each round, 5 local SGD steps on minibatches of 32 drawn with
replacement from the device's data (as fedsim draws them), lr 0.1, server model = plain mean
of the client models; test accuracy every rounds/10 rounds and at the end. Two settings:

    small   10 of 100 devices per round,  100 rounds
    large  100 of 100 devices per round, 1000 rounds

fedsim runs `python -m fedsim run CONFIG --quiet` on a TOML config; each peer (FLGo, BlazeFL,
pfl-research, Flower) runs a driver that this script writes to a temp file and starts with
the peer's interpreter. A peer that is not installed there is skipped (and said so in the
table). Runs are interleaved: for each setting, for each repeat, every framework once, in an
order rotated by one each repeat (Flower's runs, which leave the page cache cold for whatever
follows, come last), each once the CPU is idle again (at most --settle seconds).

Times, in seconds:
    whole-process  the parent's time.perf_counter() around the subprocess (interpreter start,
                   imports, data, setup, rounds, evaluation, output)
    rounds-only    time in the rounds, evaluation excluded: for fedsim the sum of `wall_s` in
                   rounds.parquet; for a peer the time of its round loop less the time its
                   driver spent evaluating (each driver prints this as one JSON line)

    python benchmarks/bench_peers.py [--repeats 3] [--setting small|large|both] [--load K]
        [--peer-python /tmp/peers-venv/bin/python] [--python-blazefl PATH] [--json FILE]

--load K starts K CPU-burning processes beside the runs (killed at the end) and adds a row
for fedsim with OMP_NUM_THREADS=1. benchmarks/PEERS.md says how the peers were installed and
where each driver differs from the fedsim run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench_engine import machine

RUN = {"clients": 100, "local_steps": 5, "batch_size": 32, "lr": 0.1, "seed": 0}
SETTINGS = {"small": {"per_round": 10, "rounds": 100}, "large": {"per_round": 100, "rounds": 1000}}

FEDSIM_TOML = """\
[run]
name = "peer"
out = {out}
rounds = {rounds}
eval_every = {eval_every}
progress = false

[data]
dataset = "digits"
clients = {clients}
partition = "iid"

[model]
name = "logreg"

[trace]
source = "always"

[server]
timing = "ideal"
clients_per_round = {per_round}

[client]
local_steps = {local_steps}
batch_size = {batch_size}
lr = {lr}

[algorithm]
name = "fedavg"
"""


# ---------------------------------------------------------------------------------------------
# Peer drivers: COMMON + one framework's part + MAIN, run as `PYTHON driver.py run.json`.
# ---------------------------------------------------------------------------------------------

COMMON = '''
import json, os, sys, time
import numpy as np
import torch
import torch.nn.functional as F

CFG = json.load(open(sys.argv[1]))  # the run (clients, per_round, rounds, ...) and the data path
torch.manual_seed(CFG["seed"])


class Data:
    """The parent's split: train/test tensors and each client's sample indices."""

    def __init__(self):
        d = np.load(CFG["data"])
        self.x_train, self.y_train = torch.from_numpy(d["x_train"]), torch.from_numpy(d["y_train"])
        self.x_test, self.y_test = torch.from_numpy(d["x_test"]), torch.from_numpy(d["y_test"])
        self.parts = [torch.from_numpy(np.flatnonzero(d["owner"] == c)) for c in range(CFG["clients"])]

    def client(self, cid):
        return self.x_train[self.parts[cid]], self.y_train[self.parts[cid]]


def make_model():
    return torch.nn.Linear(64, 10)


def draw(n, rng):
    """Positions of one local training's minibatches, [local_steps, batch_size], drawn
    uniformly with replacement from [0, n) as fedsim draws them."""
    return torch.from_numpy(rng.integers(0, n, size=(CFG["local_steps"], CFG["batch_size"])))


def local_sgd(model, x, y, rng):
    """Plain local SGD, for frameworks that leave the training loop to the user."""
    opt = torch.optim.SGD(model.parameters(), lr=CFG["lr"])
    for idx in draw(len(x), rng):
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()


class Evaluator:
    """Test accuracy of the global model; the time spent here is kept apart."""

    def __init__(self, data):
        self.x, self.y = data.x_test, data.y_test
        self.seconds, self.curve = 0.0, []

    @staticmethod
    def due(rnd):
        return rnd > 0 and (rnd % CFG["eval_every"] == 0 or rnd == CFG["rounds"])

    @torch.no_grad()
    def __call__(self, model, rnd):
        t0 = time.perf_counter()
        acc = (model(self.x).argmax(1) == self.y).float().mean().item()
        self.curve.append([rnd, acc])
        self.seconds += time.perf_counter() - t0
        return acc


def report(loop_s, evaluator, **extra):
    """The result line the parent reads: rounds-only = round loop less evaluation."""
    print(json.dumps({"rounds_s": loop_s - evaluator.seconds, "loop_s": loop_s,
                      "eval_s": evaluator.seconds, "acc": evaluator.curve[-1][1],
                      "curve": evaluator.curve, **extra}), flush=True)
'''

MAIN = '''
if __name__ == "__main__":
    main()
'''


def flgo_driver() -> str:
    """FLGo: a 'direct' task (pre-split client datasets given in a config module), its own
    fedavg Server/Client and training loop; the config's DataLoader hook gives fedsim's
    minibatches, the Logger hook does the evaluation."""
    return '''
import flgo
import flgo.algorithm.fedavg as fedavg
from flgo.experiment.logger import BasicLogger
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

FLGO_CONFIG = """
import sys
driver = sys.modules["__main__"]
train_data = driver.client_datasets()
val_data = test_data = None
get_model = driver.make_model
data_to_device = driver.to_device
compute_loss = driver.compute_loss
eval = None  # no server test set: the Logger evaluates
DataLoader = driver.with_replacement_loader
"""


def client_datasets():
    data = Data()
    return [TensorDataset(*data.client(c)) for c in range(CFG["clients"])]


def to_device(batch, device):
    return tuple(t.to(device) for t in batch)


def compute_loss(model, batch, device):
    x, y = to_device(batch, device)
    return {"loss": F.cross_entropy(model(x), y)}


def with_replacement_loader(dataset, batch_size, collate_fn=None, **kwargs):
    """FLGo draws local_steps batches from this loader per local training."""
    sampler = RandomSampler(dataset, replacement=True, num_samples=CFG["local_steps"] * int(batch_size))
    return DataLoader(dataset, batch_size=int(batch_size), sampler=sampler, collate_fn=collate_fn)


def main():
    evaluator = Evaluator(Data())

    class Logger(BasicLogger):
        def log_once(self, *args, **kwargs):  # called before round 1 and every eval_interval rounds
            rnd = self.coordinator.current_round if self.output.get("evaluated") else 0
            self.output["evaluated"] = [True]
            if Evaluator.due(rnd):
                evaluator(self.coordinator.model, rnd)

        def save_output_as_json(self, *args, **kwargs):
            pass

    sys.path.insert(0, os.getcwd())  # FLGo imports the task as a module relative to the cwd
    with open("digits_config.py", "w") as f:
        f.write(FLGO_CONFIG)
    task = flgo.gen_direct_task_from_file("digits_task", "digits_config.py", target_path=".")
    option = {"num_rounds": CFG["rounds"], "proportion": CFG["per_round"] / CFG["clients"],
              "sample": "uniform", "aggregate": "uniform", "num_steps": CFG["local_steps"],
              "batch_size": CFG["batch_size"], "learning_rate": CFG["lr"], "train_holdout": 0.0,
              "eval_interval": CFG["eval_every"], "seed": CFG["seed"], "gpu": [],
              "no_tqdm": True, "no_log_console": True}
    runner = flgo.init(task, fedavg, option=option, Logger=Logger)
    t0 = time.perf_counter()
    runner.run()
    report(time.perf_counter() - t0, evaluator, threads=torch.get_num_threads())
'''


def blazefl_driver() -> str:
    """BlazeFL: its contrib FedAvg server handler and client trainer (execution mode from
    --blazefl-mode), the round loop of its quickstart example; a PartitionedDataset whose
    train loaders give fedsim's minibatches."""
    return '''
from pathlib import Path
from torch.utils.data import DataLoader, RandomSampler, TensorDataset
from blazefl.contrib import (FedAvgBaseClientTrainer, FedAvgBaseServerHandler,
                             FedAvgProcessPoolClientTrainer, FedAvgThreadPoolClientTrainer)
from blazefl.contrib.fedavg import FedAvgPartitionType
from blazefl.core import IPCMode


class Digits:  # blazefl.core.PartitionedDataset
    def __init__(self, data):
        self.data = data

    def get_dataset(self, type_, cid):
        if type_ == FedAvgPartitionType.TRAIN:
            return TensorDataset(*self.data.client(cid))
        return TensorDataset(self.data.x_test, self.data.y_test)

    def set_dataset(self, type_, cid, dataset):
        pass

    def get_dataloader(self, type_, cid, batch_size, generator):
        dataset = self.get_dataset(type_, cid)
        if type_ != FedAvgPartitionType.TRAIN:
            return DataLoader(dataset, batch_size=len(dataset))
        sampler = RandomSampler(dataset, replacement=True, generator=generator,
                                num_samples=CFG["local_steps"] * batch_size)
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler)  # 1 epoch = local_steps


class Selector:  # blazefl.core.ModelSelector
    def select_model(self, model_name):
        return make_model()


def main():
    data = Data()
    evaluator = Evaluator(data)
    common = dict(model_selector=Selector(), model_name="logreg", dataset=Digits(data), device="cpu",
                  batch_size=CFG["batch_size"], seed=CFG["seed"], num_clients=CFG["clients"])
    # weights = samples trained on = local_steps * batch_size for everyone: a plain mean
    handler = FedAvgBaseServerHandler(global_round=CFG["rounds"], sample_ratio=CFG["per_round"] / CFG["clients"],
                                      **common)
    mode = CFG["blazefl_mode"]
    trainer_args = dict(common, epochs=1, lr=CFG["lr"])
    if mode == "single-threaded":
        trainer = FedAvgBaseClientTrainer(**trainer_args)
    elif mode == "multi-threaded":
        trainer = FedAvgThreadPoolClientTrainer(**trainer_args, num_parallels=os.cpu_count())
    else:  # a new process pool each round; with fork it hangs in round 2 here, so spawn,
        torch.multiprocessing.set_start_method("spawn")  # as BlazeFL's quickstart does
        trainer = FedAvgProcessPoolClientTrainer(**trainer_args, num_parallels=os.cpu_count(),
                                                 share_dir=Path("share"), state_dir=Path("state"),
                                                 ipc_mode=IPCMode.SHARED_MEMORY)
    t0 = time.perf_counter()
    while not handler.if_stop():
        clients = handler.sample_clients()
        trainer.local_process(handler.downlink_package(), clients)
        for package in trainer.uplink_package():
            handler.load(package)
        if Evaluator.due(handler.round):
            evaluator(handler.model, handler.round)
    report(time.perf_counter() - t0, evaluator, mode=mode)
'''


def pfl_driver() -> str:
    """pfl-research: FederatedAveraging on its SimulatedBackend with a PyTorchModel; a user
    sampler that draws each cohort without replacement, user datasets that are the round's
    fedsim-style minibatches (one epoch of local_steps batches), a callback that evaluates."""
    return '''
from pfl.aggregate.simulate import SimulatedBackend
from pfl.algorithm.base import NNAlgorithmParams
from pfl.algorithm.federated_averaging import FederatedAveraging
from pfl.callback.base import TrainingProcessCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.hyperparam.base import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel


class Net(torch.nn.Module):  # pfl wants loss() and metrics() on the module
    def __init__(self):
        super().__init__()
        self.linear = make_model()

    def forward(self, x):
        return self.linear(x)

    def loss(self, x, y, eval=False):
        self.eval() if eval else self.train()
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x, y, eval=True):
        logits = self(x)
        return {"loss": Weighted(F.cross_entropy(logits, y, reduction="sum").item(), len(y)),
                "accuracy": Weighted((logits.argmax(1) == y).sum().item(), len(y))}


class CohortSampler:
    """pfl asks for one user at a time; hand out each round's cohort drawn without replacement."""

    def __init__(self, rng):
        self.rng, self.queue = rng, []

    def __call__(self):
        if not self.queue:
            self.queue = self.rng.choice(CFG["clients"], CFG["per_round"], replace=False).tolist()
        return self.queue.pop()


class Evaluate(TrainingProcessCallback):
    def __init__(self, evaluator, net):
        self.evaluator, self.net = evaluator, net

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        rnd = central_iteration + 1
        if Evaluator.due(rnd):
            self.evaluator(self.net, rnd)
        return False, Metrics()


def main():
    data = Data()
    rng = np.random.default_rng(CFG["seed"])

    def make_user(cid):  # called each time the user is sampled: this round's minibatches
        x, y = data.client(cid)
        idx = draw(len(x), rng).reshape(-1)
        return Dataset(raw_data=[x[idx], y[idx]], user_id=cid)

    net = Net()
    model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    backend = SimulatedBackend(training_data=FederatedDataset(make_user, CohortSampler(rng)),
                               val_data=None)
    params = NNAlgorithmParams(central_num_iterations=CFG["rounds"], evaluation_frequency=CFG["eval_every"],
                               train_cohort_size=CFG["per_round"], val_cohort_size=0)
    train = NNTrainHyperParams(local_num_epochs=1, local_learning_rate=CFG["lr"],
                               local_batch_size=CFG["batch_size"])
    evaluator = Evaluator(data)
    t0 = time.perf_counter()
    FederatedAveraging().run(backend=backend, model=model, algorithm_params=params,
                             model_train_params=train,
                             model_eval_params=NNEvalHyperParams(local_batch_size=None),
                             callbacks=[Evaluate(evaluator, net)])
    report(time.perf_counter() - t0, evaluator)
'''


def flower_driver() -> str:
    """Flower: simulation mode (run_simulation, Ray backend, one virtual SuperNode per device),
    its message-API FedAvg strategy weighted by a constant (= plain mean), no federated
    evaluation, the evaluation in the strategy's evaluate_fn; the ClientApp trains with
    local_sgd (Flower leaves training to the user)."""
    return '''
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation

DATA = Data()
client_app, server_app, RESULT = ClientApp(), ServerApp(), {}


@client_app.train()
def train(msg, context):
    model = make_model()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = DATA.client(int(context.node_config["partition-id"]))
    local_sgd(model, x, y, np.random.default_rng())
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord({"weight": 1})})
    return Message(content=content, reply_to=msg)


@server_app.main()
def serve(grid, context):
    model, evaluator = make_model(), Evaluator(DATA)

    def evaluate(rnd, arrays):
        if not Evaluator.due(rnd):
            return None
        model.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord({"accuracy": evaluator(model, rnd)})

    strategy = FedAvg(fraction_train=CFG["per_round"] / CFG["clients"], fraction_evaluate=0.0,
                      min_train_nodes=CFG["per_round"], min_available_nodes=CFG["clients"],
                      weighted_by_key="weight")
    t0 = time.perf_counter()
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                   num_rounds=CFG["rounds"], evaluate_fn=evaluate)
    RESULT.update(loop_s=time.perf_counter() - t0, evaluator=evaluator)


def main():
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=CFG["clients"],
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    report(RESULT["loop_s"], RESULT["evaluator"])
'''


@dataclass
class Peer:
    name: str  # as shown in the table
    key: str  # in options: --python-KEY, --peers
    dist: str  # distribution name on PyPI (for its version)
    driver: callable


PEERS = [Peer("FLGo", "flgo", "flgo", flgo_driver), Peer("BlazeFL", "blazefl", "blazefl", blazefl_driver),
         Peer("pfl-research", "pfl", "pfl", pfl_driver), Peer("Flower", "flower", "flwr", flower_driver)]


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------

@dataclass
class Runner:
    """One table row's framework: how to start a run, and what it needs."""
    label: str
    version: str
    python: str
    run: callable  # (runner, setting, workdir) -> dict
    env: dict = field(default_factory=dict)
    driver: Path | None = None


def write_data(path: Path, seed: int) -> None:
    """fedsim's own digits split (its loader: stratified 75/25 with seed 0), pixels / 16,
    flattened, and an IID partition: a random permutation cut into equal parts."""
    import numpy as np

    from fedsim.config import DataConfig
    from fedsim.data.datasets import load_dataset

    ds = load_dataset(DataConfig(dataset="digits", test_fraction=0.25), seed=0)
    flat = lambda x: (x.reshape(len(x), -1) * ds.scale).astype(np.float32)  # noqa: E731
    owner = np.empty(len(ds.y_train), dtype=np.int64)
    owner[np.random.default_rng(seed).permutation(len(ds.y_train))] = np.arange(len(ds.y_train)) % RUN["clients"]
    np.savez(path, x_train=flat(ds.x_train), y_train=ds.y_train, x_test=flat(ds.x_test),
             y_test=ds.y_test, owner=owner)


def run_config(setting: str, data: Path, extra: dict) -> dict:
    s = SETTINGS[setting]
    return {**RUN, **s, "eval_every": s["rounds"] // 10, "data": str(data), **extra}


def timed(cmd: list[str], cwd: Path, env: dict, timeout: float) -> tuple[subprocess.CompletedProcess | None, float]:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - t0
    return proc, time.perf_counter() - t0


def failure(proc: subprocess.CompletedProcess | None, whole: float, why: str = "") -> dict:
    if proc is None:
        return {"ok": False, "whole_s": whole, "error": "timeout"}
    tail = (proc.stderr or "")[-3000:] + (proc.stdout or "")[-1000:]
    return {"ok": False, "whole_s": whole, "error": why or f"exit {proc.returncode}", "output_tail": tail}


def run_order(runners: list, repeats: int) -> list[tuple[int, object]]:
    """(repeat, runner) in the order to run: the light frameworks interleaved, rotated by one each
    repeat, then Flower's runs together at the end. Whatever runs right after Flower starts
    ~0.5 s slower (Ray's memory churn leaves the page cache cold), so nothing else follows it."""
    light = [r for r in runners if r.label != "Flower"]
    heavy = [r for r in runners if r.label == "Flower"]
    order = [(rep, r) for rep in range(repeats)
             for r in light[rep % len(light):] + light[:rep % len(light)]]
    return order + [(rep, r) for rep in range(repeats) for r in heavy]


def busy_fraction(interval: float = 0.5) -> float:
    """Share of the machine's CPU time spent busy over `interval` seconds (/proc/stat)."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    total0, idle0 = sample()
    time.sleep(interval)
    total1, idle1 = sample()
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def wait_for_idle(limit: float, threshold: float = 0.1) -> None:
    """Wait (up to `limit` s) until the CPU is idle: a framework's leftovers (Ray's workers and
    daemons shut down seconds after Flower exits) must not slow down the next run."""
    deadline = time.perf_counter() + limit
    while time.perf_counter() < deadline:
        try:
            if busy_fraction() < threshold:
                return
        except OSError:  # no /proc/stat: just wait the limit
            time.sleep(limit)
            return


def run_fedsim(runner: Runner, cfg: dict, workdir: Path, timeout: float) -> dict:
    import polars as pl

    config = workdir / "fedsim.toml"
    config.write_text(FEDSIM_TOML.format(out=json.dumps(str(workdir / "runs")), **cfg))
    proc, whole = timed([runner.python, "-m", "fedsim", "run", str(config), "--quiet"], workdir,
                        runner.env, timeout)
    if proc is None or proc.returncode != 0:
        return failure(proc, whole)
    last = proc.stdout.strip().splitlines()[-1]
    if not last.startswith("results: "):
        return failure(proc, whole, "no 'results: PATH' line")
    rounds = pl.read_parquet(Path(last.removeprefix("results: ").strip()) / "rounds.parquet")
    curve = rounds.filter(pl.col("test_acc").is_not_null()).select("round", "test_acc").rows()
    return {"ok": True, "whole_s": whole, "rounds_s": float(rounds["wall_s"].sum()),
            "acc": curve[-1][1], "curve": [[r + 1, a] for r, a in curve]}


def run_peer(runner: Runner, cfg: dict, workdir: Path, timeout: float) -> dict:
    (workdir / "run.json").write_text(json.dumps(cfg))
    proc, whole = timed([runner.python, str(runner.driver), str(workdir / "run.json")], workdir,
                        runner.env, timeout)
    if proc is None or proc.returncode != 0:
        return failure(proc, whole)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith('{"rounds_s"'):
            return {"ok": True, "whole_s": whole, **json.loads(line)}
    return failure(proc, whole, "no result line")


def installed_version(python: str, dist: str) -> str | None:
    """The distribution's version in that interpreter, None if it is not there."""
    code = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
    try:
        proc = subprocess.run([python, "-c", code, dist], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def fedsim_version(python: str) -> str:
    version = installed_version(python, "fedsim") or "?"
    repo = Path(__file__).resolve().parent.parent
    rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return f"{version} ({rev.stdout.strip()})" if rev.returncode == 0 else version


def start_load(k: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def summarize(records: list[dict], runners: list[Runner], skipped: dict[str, str], settings: list[str],
              load: int) -> list[dict]:
    rows = []
    for setting in settings:
        for r in runners:
            runs = [x for x in records if x["framework"] == r.label and x["setting"] == setting]
            ok = [x for x in runs if x["ok"]]
            row = {"framework": r.label, "version": r.version, "setting": setting, "load": load,
                   "runs": len(runs), "ok": len(ok)}
            if ok:
                whole = [x["whole_s"] for x in ok]
                accs = [x["acc"] for x in ok]
                row.update(whole_median=statistics.median(whole), whole_min=min(whole),
                           rounds_median=statistics.median(x["rounds_s"] for x in ok),
                           acc_median=statistics.median(accs), acc_min=min(accs), acc_max=max(accs))
            else:
                row["error"] = runs[0].get("error", "?") if runs else "?"
            rows.append(row)
        for label, why in skipped.items():
            rows.append({"framework": label, "version": why, "setting": setting, "load": load, "runs": 0, "ok": 0})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| framework | version | setting | load | whole-process s (median, min) | rounds-only s (median) | final accuracy |",
             "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        if "whole_median" in r:
            acc = f"{100 * r['acc_median']:.2f}%"
            if r["acc_max"] - r["acc_min"] > 1e-9:
                acc += f" ({100 * r['acc_min']:.2f}-{100 * r['acc_max']:.2f})"
            failed = f" ({r['runs'] - r['ok']} of {r['runs']} failed)" if r["ok"] < r["runs"] else ""
            cells = [f"{r['whole_median']:.2f}, {r['whole_min']:.2f}{failed}", f"{r['rounds_median']:.2f}", acc]
        elif r["runs"]:
            cells = [f"failed: {r['error']}", "-", "-"]
        else:
            cells = ["skipped", "-", "-"]
        lines.append(f"| {r['framework']} | {r['version']} | {r['setting']} | {r['load']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--setting", choices=["small", "large", "both"], default="small")
    parser.add_argument("--load", type=int, default=0, metavar="K",
                        help="CPU-burning processes beside the runs (adds a fedsim OMP_NUM_THREADS=1 row)")
    parser.add_argument("--json", type=Path, help="write every run's numbers here")
    parser.add_argument("--settle", type=float, default=30.0,
                        help="wait up to this many seconds before each run for the CPU to be idle (default 30)")
    parser.add_argument("--peer-python", default=sys.executable,
                        help="interpreter for the peers (default: this one)")
    parser.add_argument("--python-fedsim", default=sys.executable)
    for p in PEERS:
        parser.add_argument(f"--python-{p.key}", help=f"interpreter for {p.name} (default: --peer-python)")
    parser.add_argument("--peers", default=",".join(p.key for p in PEERS),
                        help="comma-separated subset of: " + ", ".join(p.key for p in PEERS))
    parser.add_argument("--blazefl-mode", choices=["single-threaded", "multi-threaded", "multi-process"],
                        default="single-threaded", help="BlazeFL's client trainer")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds per run (then: failed)")
    args = parser.parse_args()
    settings = ["small", "large"] if args.setting == "both" else [args.setting]
    wanted = set(args.peers.split(",")) - {""}
    if unknown := wanted - {p.key for p in PEERS}:
        parser.error(f"--peers: unknown {', '.join(sorted(unknown))}")

    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        tmp = Path(tmp)
        data = tmp / "digits.npz"
        write_data(data, RUN["seed"])

        version = fedsim_version(args.python_fedsim)
        runners = [Runner("fedsim", version, args.python_fedsim, run_fedsim)]
        if args.load:
            runners.append(Runner("fedsim OMP_NUM_THREADS=1", version, args.python_fedsim, run_fedsim,
                                  env={"OMP_NUM_THREADS": "1"}))
        skipped = {}
        for p in PEERS:
            if p.key not in wanted:
                continue
            python = getattr(args, f"python_{p.key}") or args.peer_python
            found = installed_version(python, p.dist)
            if found is None:
                skipped[p.name] = f"not installed in {python}"
                print(f"skipping {p.name}: `{p.dist}` is not installed in {python}", file=sys.stderr)
                continue
            driver = tmp / f"driver_{p.key}.py"
            driver.write_text(COMMON + textwrap.dedent(p.driver()) + MAIN)
            runners.append(Runner(p.name, found, python, run_peer, driver=driver))

        load = start_load(args.load)
        records = []
        try:
            for setting in settings:
                for rep, r in run_order(runners, args.repeats):
                    # what the last run left (Ray's workers) winds down first; a loaded
                    # machine is never idle, so there a pause stands in
                    wait_for_idle(args.settle) if not args.load else time.sleep(3)
                    workdir = Path(tempfile.mkdtemp(dir=tmp, prefix=f"{r.label.split()[0]}-{setting}-{rep}-"))
                    cfg = run_config(setting, data, {"blazefl_mode": args.blazefl_mode})
                    result = r.run(r, cfg, workdir, args.timeout)
                    records.append({"framework": r.label, "version": r.version, "python": r.python,
                                    "setting": setting, "load": args.load, "repeat": rep, **result})
                    shown = (f"whole {result['whole_s']:.2f}s, rounds {result['rounds_s']:.2f}s, "
                             f"acc {100 * result['acc']:.2f}%") if result["ok"] else result["error"]
                    print(f"[{setting} {rep + 1}/{args.repeats}] {r.label}: {shown}", file=sys.stderr)
                    if not result["ok"]:
                        print(textwrap.indent(result.get("output_tail", "")[-2000:], "    "), file=sys.stderr)
        finally:
            stop_load(load)

    rows = summarize(records, runners, skipped, settings, args.load)
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps({
            "machine": machine(), "python": sys.version.split()[0], "run": RUN, "settings": SETTINGS,
            "repeats": args.repeats, "load": args.load, "blazefl_mode": args.blazefl_mode,
            "summary": rows, "runs": records}, indent=1) + "\n")


if __name__ == "__main__":
    main()
