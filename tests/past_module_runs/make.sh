#!/bin/sh
# Makes the run of a user's nn.Sequential (or of MODEL, a built-in) that tests/test_past_runs.py
# resumes under the training rules it started with (fedsim/training/rules.py), and the same run
# uninterrupted:
#   git archive SHA | tar -x -C /tmp/old-SHA
#   sh tests/past_module_runs/make.sh SHA /tmp/old-SHA [MODEL] [CLIENT (a [client] line)] [DATA]
# writes tests/past_module_runs/SHA/{the module's file (seqnet.py, gnnet.py, attnnet.py, vitnet.py,
# gelunet.py, resnet.py, bnnet.py),
# module (3 rounds), whole (5 rounds)}; digits, or with DATA = images random 16x16 grey images in
# a Parquet file (SHA/images/train.parquet).
# 9cd3e24 (rules 1) is the nn.Sequential; c977a51 (rules 2) is mlp; f999e93 (rules 3) is
# gnnet:make (a class with GroupNorm) with CLIENT = 'trainer = "loop"'; 0a75614 (rules 4) is
# attnnet:make (a transformer layer with dropout, batched); 1c5672e (rules 5) is vitnet:make (a
# vision transformer with a convolution as its patch embedding, on the loop) with DATA = images;
# 04db67b (rules 6) is gelunet:make (an MLP with a GELU and dropout, batched through torch.func);
# 7294324 (rules 7) is resnet:make (a class with a residual block and ELUs) with CLIENT = 'trainer = "loop"';
# cde3baa (rules 8) is the same; c4bbafa (rules 9) is bnnet:make (an MLP with BatchNorm, batched through torch.func);
# e25266b (rules 11) is attnnet:make with CLIENT = 'trainer = "batched"<newline>local_epochs = 1' (its devices of 113
# samples end an epoch with a minibatch of 1, padded to 8).
set -e
sha=$1; code=$2; model=${3:-seqnet:make}; client=${4:-}; data=${5:-digits}
here=$(cd "$(dirname "$0")" && pwd)
out=$here/$sha
rm -rf "$out"; mkdir -p "$out"
cat > "$out/seqnet.py" <<'PY'
from torch import nn


def make(in_shape, n_classes, cfg):
    """A user's MLP as an nn.Sequential of layers fedsim has kernels for, with dropout."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, n_classes))
PY
cat > "$out/gnnet.py" <<'PY'
from torch import nn


class GroupNormNet(nn.Module):
    """A user's small convolutional network with GroupNorm, written as a class."""

    def __init__(self, n_classes):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(1, 8, 3, padding=1), nn.GroupNorm(2, 8)
        self.fc = nn.Linear(8 * 4 * 4, n_classes)

    def forward(self, x):
        return self.fc(nn.functional.max_pool2d(self.norm(self.conv(x)).relu(), 2).flatten(1))


def make(in_shape, n_classes, cfg):
    return GroupNormNet(n_classes)
PY
cat > "$out/attnnet.py" <<'PY'
import torch
from torch import nn


class RowAttention(nn.Module):
    """A user's transformer encoder layer with dropout, reading digits' 8 rows as 8 tokens."""

    def __init__(self, n_classes):
        super().__init__()
        self.read_in, self.position = nn.Linear(8, 16), nn.Parameter(torch.zeros(8, 16))
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
        self.fc = nn.Linear(16, n_classes)

    def forward(self, x):
        return self.fc(self.layer(self.read_in(x[:, 0]) + self.position).mean(dim=1))


def make(in_shape, n_classes, cfg):
    return RowAttention(n_classes)
PY
cat > "$out/gelunet.py" <<'PY'
from torch import nn


def make(in_shape, n_classes, cfg):
    """A user's MLP with a GELU and dropout, as an nn.Sequential."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, n_classes))
PY
cat > "$out/resnet.py" <<'PY'
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
PY
cat > "$out/bnnet.py" <<'PY'
from torch import nn


def make(in_shape, n_classes, cfg):
    """A user's MLP with BatchNorm, as an nn.Sequential (through torch.func before training rules 10)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, n_classes))
PY
cat > "$out/vitnet.py" <<'PY'
import torch
from torch import nn


class PatchNet(nn.Module):
    """A user's small vision transformer: 4x4 patches of 16x16 images embedded by a strided
    convolution (9 % of its multiply-adds), one encoder layer with dropout."""

    def __init__(self, n_classes):
        super().__init__()
        self.patch, self.position = nn.Conv2d(1, 16, 4, stride=4), nn.Parameter(torch.zeros(16, 16))
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
        self.fc = nn.Linear(16, n_classes)

    def forward(self, x):
        return self.fc(self.layer(self.patch(x).flatten(2).transpose(1, 2) + self.position).mean(dim=1))


def make(in_shape, n_classes, cfg):
    return PatchNet(n_classes)
PY
if [ "$data" = images ]; then
  PYTHONPATH="$here/..:$code" python -c "from pathlib import Path; from leaf_files import write_image_parquet; \
write_image_parquet(Path('$out/images/train.parquet'), [10] * 12, (16, 16), 4, distinct=32)"
  data_keys='dataset = "parquet"
root = "images"
client_column = "client"
label_column = "label"
feature_column = "image"
test_fraction = 0.2'
else
  data_keys='dataset = "digits"'
fi
for file in seqnet gnnet attnnet vitnet gelunet resnet bnnet; do  # only the module the run trains
  [ "${model%%:*}" = "$file" ] || rm "$out/$file.py"
done
cat > "$out/module.toml" <<TOML
[run]
name = "module"
rounds = 3
eval_every = 1
progress = false
plots = false
[data]
$data_keys
clients = 12
[model]
name = "$model"
[client]
$client
batch_size = 8
local_steps = 3
lr = 0.1
[server]
timing = "ideal"
clients_per_round = 6
TOML
sed -e 's/name = "module"/name = "whole"/' -e 's/rounds = 3/rounds = 5/' "$out/module.toml" > "$out/whole.toml"
cd "$out"
for kind in module whole; do
  PYTHONPATH="$code:$out" python -m fedsim run "$kind.toml" --set "run.out='$out'" --quiet > /dev/null
  rm "$kind.toml"
done
rm -rf "$out/__pycache__" "$out"/*/.lock "$out/images/.fedsim-cache"
