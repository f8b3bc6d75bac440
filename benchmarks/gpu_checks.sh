#!/usr/bin/env bash
# The checks that need a GPU, in stages, each under its own time limit, for a session that has
# a GPU machine for a few minutes. Logs and JSON go to $WORK (default: /tmp/gpu-work), packed
# after each stage into $OUT/gpu_results.tgz (default OUT: ./gpu-out).
#
#   bash benchmarks/gpu_checks.sh tests published cohort paper study
#
# Stages: tests (the tests that skip without CUDA: graphs, CUDA vs CPU, clock independence), published
# (benchmarks/bench_published.py: FEMNIST, Shakespeare and ResNet-18-GN exact, 20-150 rounds each,
# extrapolated), published-more (FEMNIST and ResNet-18 with cuDNN's fastest kernels and TF32,
# BlazeFL's CIFAR-10, Shakespeare unfused, ResNet-18 on the loop),
# cohort (bench_cohort's GPU rows: resnet18-gn at FLUTE's round, module vs built-in, graphs vs
# eager), paper (bench_paper_scale on CUDA), study (bench_study: 32 runs in lockstep vs one
# after another; study-profile: the same under cProfile, the whole profile in study32.prof), plane (bench_plane:
# the same 32 runs per run-round, lockstep against one after another, and the torch ops a run-round outside
# the training each run's way and the group receive's), workers (bench_plane: the same 32 runs as `fedsim sweep --processes 1, 2, 4`
# on the GPU: whether lockstep shares in worker processes should share one GPU; auto keeps one),
# rules3 (bench_rules3 --steps: the MLP's step by reverse mode and in closed form on CUDA),
# modules (bench_modules on CUDA: issue 38's table, fedsim against a plain GPU loop of the same steps,
# the user modules at 10 and 100 devices; modules-1000 at 1000; modules-kernels: the modules
# that training rules 8-10 put on fedsim's kernels, an ELU MLP, a residual MLP and a BatchNorm MLP,
# at 10 and 100; rows are written as they finish), dropout (bench_dropout on CUDA at 10 and 100 devices: the
# keyed dropout's share of a transformer's round, issue 38's <= 10 %, against torch's own in a plain GPU loop).
# With PYTHONPATH holding the repository, so a checkout runs without being installed.
set -uo pipefail
OUT=${OUT:-gpu-out}
RESULTS=$(realpath -m "$OUT")
OUT=${WORK:-/tmp/gpu-work}
mkdir -p "$OUT" "$RESULTS"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
B=benchmarks
M="python3 $B/bench_modules.py --device cuda --settings steps --models user-mlp,user-lenet5,user-resnet-gn,user-transformer"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/machine.txt"

for stage in "$@"; do
  echo "=== $stage $(date +%T)"
  case $stage in
    tests)
      timeout 150 python3 -m pytest -p no:cacheprovider -q -rs tests/test_cuda_graphs.py tests/test_clock_independence.py \
        tests/test_training_task.py tests/test_lockstep_receive_together.py -k "cuda or gpu or graph" 2>&1 | tail -60 \
        | tee "$OUT/tests.log" ;;
    published)
      P="python3 $B/bench_published.py --device cuda --max-clients 500"
      timeout 70 $P --settings femnist-cnn --rounds 150 --json "$OUT/published_femnist.json" 2>&1 | tee "$OUT/published.log"
      timeout 80 $P --settings shakespeare-lstm --rounds 40 --json "$OUT/published_shakespeare.json" 2>&1 | tee -a "$OUT/published.log"
      timeout 80 $P --settings resnet18-cifar100 --rounds 20 --json "$OUT/published_resnet.json" 2>&1 | tee -a "$OUT/published.log" ;;
    published-more)
      P="timeout 70 python3 $B/bench_published.py --device cuda --max-clients 500"
      $P --settings femnist-cnn --rounds 150 --set run.deterministic=false --set run.tf32=true \
        --json "$OUT/published_femnist_fast.json" 2>&1 | tee "$OUT/published_more.log"
      $P --settings cifar10-blazefl --rounds 10 --json "$OUT/published_blazefl.json" 2>&1 | tee -a "$OUT/published_more.log"
      $P --settings resnet18-cifar100 --rounds 20 --set run.deterministic=false --set run.tf32=true \
        --json "$OUT/published_resnet_fast.json" 2>&1 | tee -a "$OUT/published_more.log"
      $P --settings shakespeare-lstm --rounds 15 --set client.compile=false \
        --json "$OUT/published_shakespeare_unfused.json" 2>&1 | tee -a "$OUT/published_more.log"
      $P --settings resnet18-cifar100 --rounds 20 --set client.trainer=loop \
        --json "$OUT/published_resnet_loop.json" 2>&1 | tee -a "$OUT/published_more.log" ;;
    cohort)
      timeout 60 python3 $B/bench_cohort.py --device cuda --models resnet18-gn --cohorts 10 --batch 50 \
        --trainers batched,eager,loop --budget 2 --json "$OUT/cohort_resnet.json" 2>&1 | tee "$OUT/cohort.log"
      timeout 60 python3 $B/bench_cohort.py --device cuda --models transformer,lenet5,lenet5-module \
        --cohorts 10,100,1000 --trainers batched,eager --budget 1 --json "$OUT/cohort_modules.json" 2>&1 | tee -a "$OUT/cohort.log" ;;
    paper)
      timeout 100 python3 $B/bench_paper_scale.py --device cuda --only paper-wangji paper-fedawe --timed 10 \
        2>&1 | tee "$OUT/paper.log"; cp $B/results_paper_scale.json "$OUT/" ;;
    study)
      timeout 80 python3 $B/bench_study.py --device cuda --runs 32 --rounds 100 --json "$OUT/study32.json" \
        2>&1 | tee "$OUT/study.log" ;;
    study-profile)
      timeout 120 python3 $B/bench_study.py --device cuda --runs 32 --rounds 100 --profile \
        --profile-dump "$OUT/study32.prof" --json "$OUT/study32_profile.json" 2>&1 | tee "$OUT/study_profile.log" ;;
    plane)
      timeout 200 python3 $B/bench_plane.py --device cuda --runs 32 --rounds 60 --short 10 --repeat 1 --sequential \
        --ops --json "$OUT/plane32.json" 2>&1 | tee "$OUT/plane.log" ;;
    workers)
      timeout 240 python3 $B/bench_plane.py --device cuda --runs 32 --rounds 110 --short 10 --repeat 1 \
        --processes 1 2 4 --json "$OUT/workers32.json" 2>&1 | tee "$OUT/workers.log" ;;
    rules3)
      timeout 60 python3 $B/bench_rules3.py --steps --device cuda --json "$OUT/rules3_steps.json" \
        2>&1 | tee "$OUT/rules3.log" ;;
    modules)
      timeout 100 $M --devices 10,100 --repeats 2 --out "$OUT/modules_cuda.json" 2>&1 | tee "$OUT/modules.log" ;;
    modules-kernels)
      timeout 100 python3 $B/bench_modules.py --device cuda --settings steps --devices 10,100 --repeats 2 \
        --models user-elu-mlp,user-residual-mlp,user-bn-mlp --out "$OUT/modules_cuda_kernels.json" 2>&1 \
        | tee "$OUT/modules_kernels.log" ;;
    dropout)
      for n in 10 100; do
        timeout 60 python3 $B/bench_dropout.py --device cuda --devices $n --repeats 5 \
          --out "$OUT/dropout_cuda_$n.json" 2>&1 | tee -a "$OUT/dropout.log"
      done ;;
    modules-1000)
      timeout 150 $M --devices 1000 --repeats 1 --out "$OUT/modules_cuda_1000.json" 2>&1 | tee -a "$OUT/modules.log" ;;
    *) echo "unknown stage $stage" ;;
  esac
  tar -czf "$RESULTS/gpu_results.tgz" -C "$OUT" .
done
echo "=== done $(date +%T)"
