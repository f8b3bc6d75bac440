#!/bin/sh
# Makes a run that `[run] max_time` ended under training rules 10 or before (fedsim/training/rules.py:
# the round it cut short counted), and the same run resumed by that release with a later max_time,
# which tests/test_past_runs.py resumes today and compares:
#   git archive SHA | tar -x -C /tmp/old-SHA
#   sh tests/past_module_runs/make_max_time.sh SHA /tmp/old-SHA
# writes tests/past_module_runs/SHA/{cut (max_time 6 s), resumed (cut, resumed to 12 s)}.
# 9ba4dcd (rules 10) is mifa on digits over a churning trace, with devices of speeds and links.
set -e
sha=$1; code=$2
here=$(cd "$(dirname "$0")" && pwd)
out=$here/$sha
rm -rf "$out"; mkdir -p "$out"
cat > "$out/cut.toml" <<TOML
[run]
name = "cut"
rounds = 100
max_time = 6.0
eval_every = 2
progress = false
plots = false
[data]
dataset = "digits"
clients = 30
[model]
name = "logreg"
[client]
batch_size = 16
local_steps = 3
[server]
timing = "model"
clients_per_round = 6
overcommit = 0.5
deadline = 1.2
[devices]
model = "lognormal"
seconds_per_sample = 0.01
compute_sigma = 1.0
bandwidth_bps = 2e6
latency_s = 0.05
[trace]
source = "markov"
mean_on = 4.0
mean_off = 4.0
days = 0.01
[algorithm]
name = "mifa"
TOML
cd "$out"
PYTHONPATH="$code" python -m fedsim run cut.toml --set "run.out='$out'" --quiet > /dev/null
rm cut.toml
cp -r cut resumed
PYTHONPATH="$code" python -m fedsim run --resume resumed --set run.max_time=12 --quiet > /dev/null
rm -rf "$out"/*/.lock
