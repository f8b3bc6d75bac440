#!/bin/sh
# Makes the run directories of one past release that tests/test_past_runs.py resumes.
#   git archive SHA | tar -x -C /tmp/old-SHA
#   sh tests/past_runs/make.sh SHA /tmp/old-SHA
# writes tests/past_runs/SHA/{single,comparison,study,async}: quadratic runs of 4 rounds
# (plots off, so that they stay a few KB), which a later release resumes to more rounds.
set -e
sha=$1; code=$2
here=$(cd "$(dirname "$0")" && pwd)
out=$here/$sha
work=$(mktemp -d)
rm -rf "$out"; mkdir -p "$out"
cat > "$work/single.toml" <<'TOML'
[run]
name = "single"
rounds = 4
eval_every = 2
progress = false
plots = false
[data]
dataset = "quadratic"
clients = 4
targets = [[1.0, 0.0], [0.0, 2.0], [3.0, 1.0], [-1.0, 1.0]]
[client]
batch_size = 0
local_steps = 1
lr = 0.1
[server]
timing = "ideal"
round_duration = 1.0
[trace]
source = "bernoulli"
p = 0.7
[algorithm]
name = "fedavg"
TOML
sed -e 's/name = "single"/name = "comparison"\nalgorithms = ["fedavg", "mifa"]/' "$work/single.toml" > "$work/comparison.toml"
sed -e 's/name = "single"/name = "async"/' -e 's/timing = "ideal"/timing = "model"\nmode = "async"\nbuffer = 2\nconcurrency = 3/' \
    "$work/single.toml" > "$work/async.toml"
cat > "$work/study.toml" <<'TOML'
base = "single.toml"
[run]
name = "study"
[sweep]
"client.lr" = [0.1, 0.2]
TOML
cd "$work"
PYTHONPATH=$code python -m fedsim run single.toml --set run.out=runs --quiet
PYTHONPATH=$code python -m fedsim run comparison.toml --set run.out=runs --quiet
PYTHONPATH=$code python -m fedsim run async.toml --set run.out=runs --quiet
PYTHONPATH=$code python -m fedsim sweep study.toml --set run.out=runs --yes --quiet
for kind in single comparison async study; do
    cp -r "runs/$kind" "$out/$kind"
done
find "$out" \( -name '*.lock' -o -name '.lock' -o -name '*.png' \) -delete
rm -rf "$work"
du -sh "$out"
