"""Training rules: the versioned choices that decide a run's numbers beyond its config.

`[client] trainer = "auto"` and `[run] threads = "auto"` pick a path and a thread count by fixed
rules, and fedsim picks the code that computes a model; two choices agree only to float
rounding. So a change of such a rule is a new version here, recorded in every run's
checkpoint.pt and manifest.json (`rules`): a run resumes under the rules it started with, and
its numbers stay its own. A run of a release that recorded none started under version 1.

1. Users' modules train through torch.func (fedsim/training/modules.py); a CPU call of at
   least CROSSOVER_FLOPS multiply-adds takes every thread.
2. A user's nn.Sequential of layers fedsim has kernels for trains on the kernels, as the
   built-ins do (fedsim/training/kernels.py); a CPU call takes one thread below the crossover
   and for a module through torch.func, half the cores above it (one on two cores): a call
   whose threads outnumber the free cores waits for a core at every kernel, 2-50x slower beside
   other jobs (benchmarks/RESULTS.md, "Training rules 2"); the loop trainer computes an epoch's
   last, smaller minibatch without its padding (fedsim/training/loop.py).
3. In a batched training call each device's parameters start on a 64-byte boundary (`row_stride`):
   MKL computes a matrix product with a weight at another alignment in another order, so a
   device's numbers depended on its row in the call, and a lockstep study's points (whose
   devices are stacked run after run) differed from their runs alone by float rounding. A stack
   of dense layers with ReLUs (and dropout) between them, the MLP, has its gradient in closed form
   in a batched call (`kernels.dense_cohort_step`, as softmax regression always had) instead of
   by reverse mode: an mlp run 1.5x faster a round (benchmarks/RESULTS.md, "The MLP's gradient
   in closed form").
4. A user's module written as a class whose forward is a chain of layers fedsim has kernels for
   (a LeNet-5 with functional ReLUs and pools, read by torch.fx: `kernels.lower_traced`) trains on
   the kernels, as an nn.Sequential of them does from rules 2 (a class LeNet-5 on a CPU: 0.89-0.94x a
   plain loop's round, 1.01-1.17x through torch.func); dropout on images and log softmax have
   kernels (in an nn.Sequential too). One device's step of a module through
   torch.func (the loop trainer; a cohort of one) is differentiated by autograd instead of
   torch.func's `grad`: the same kernels for most modules (LeNet-5, a transformer, BatchNorm,
   tied weights: bit for bit), but torch.func decomposes some backwards (GroupNorm's), whose
   numbers then differ by float rounding; a step 1.2-1.7x faster (benchmarks/RESULTS.md, "A
   module written as a class"). On a CPU `auto` trains a module with convolutions over images
   of 16x16 pixels or more on the loop (`ModuleModel.cohort_slow_on_cpu`).
5. On a CPU, attention with dropout over fewer than 16 keys takes its softmax along the other
   dimension of the transposed scores (`modules._attention_weights`): torch's CPU softmax along a
   last dimension shorter than 16 is not vectorised, 3-4x the time forward and backward (a
   transformer reading digits' 8 rows as tokens: 12 % of its batched step); the same sums in
   another order, so the numbers differ by float rounding. On a CPU `auto` trains a module on the
   loop when vmap has no batching rule for one of its ops and runs it device by device behind the
   cohort's call (`ModuleModel.cohort_slow_on_cpu`; torch's LSTM: a 2-layer LSTM's round 2.4x a
   plain loop's batched, 1.1x on the loop).
6. On a CPU `auto` trains a module with convolutions over images of 16x16 pixels or more on the
   loop only where those convolutions are at least half of its forward's multiply-adds (CNNs:
   86-99 %): a vision transformer whose patch embedding is a convolution (7 %) trains batched,
   0.61-0.75x a plain loop's round against 0.81-1.01x on the loop (benchmarks/RESULTS.md,
   "Training rules 6").
7. The activations nn.GELU, nn.Tanh, nn.Sigmoid, nn.SiLU and nn.LeakyReLU (or their functional
   calls in a class's chain) and nn.LayerNorm on vectors have kernels, as nn.ReLU has from
   rules 2, so a module of them and the other layers fedsim has kernels for trains on the
   kernels instead of through torch.func, and a stack of dense layers with such activations
   (each after a LayerNorm or not) between them has its gradient in closed form in a batched
   call (`kernels.dense_cohort_step`), as the ReLU MLP has from rules 3. On a CPU `auto` trains a
   model of more than `task.CPU_LOOP_PARAMETERS` (2^18) parameters a device on the loop
   (`ClassificationTask.cohort_slow_on_cpu`: a batched step reads and writes every device's
   weights, where a loop keeps one device's in cache through its steps; char-lstm: 4.7x faster
   a round), and a batched call holds at most `cohort.CPU_CALL_PARAMETERS` (2^20) floats of the
   devices' parameters (more devices: more calls, each device's numbers the same).
8. The activations nn.ELU, nn.CELU, nn.SELU, nn.Softplus, nn.Mish, nn.Hardswish,
   nn.Hardsigmoid, nn.Hardtanh and nn.ReLU6 (not in place; or their functional calls in a
   class's chain) have kernels, as rules 7's have. A module through torch.func takes, one
   device at a time (the loop trainer), a plain PyTorch loop's step: the mean cross-entropy of
   the step's samples and torch.optim.SGD's update (`w.add_(grad, alpha=-lr)`, one fused
   multiply-add), where rules 4-7 summed the samples' losses weighted by 1 / the batch's size
   and updated `w - lr * grad` in two roundings (as the batched call still does: the two agree
   to float rounding); fewer kernels a step. On a CPU `auto` trains such a module of more than
   `task.CPU_FUNC_LOOP_PARAMETERS` (2^16) parameters a device on the loop: vmap's cohort call is
   slower there than a loop of plain steps (an MLP with a residual block, 118 k parameters:
   1.3-2.2x a plain loop's round batched, about 1.0x on the loop), and under local epochs any
   model of more than `task.CPU_EPOCHS_LOOP_PARAMETERS` (2^17): devices of unequal data take
   unequal steps, and a cohort's call steps each as long as its longest (MLPs of 159-235 k
   parameters on fedsim's kernels: 0.91-1.05x a plain loop's round batched, 0.71-0.84x on the
   loop).
9. A residual block in a class's chain, `h + block(h)` (either way round; `+`, `torch.add`,
   `.add`), whose block is a chain of layers fedsim has kernels for that keeps its input's
   shape, has a kernel (`kernels.Residual`), so such a module trains on the kernels instead of
   through torch.func: its loop step is autograd's kernels with rules 4-7's loss and update
   (the weighted sum, `w - lr * grad`), a rules-7 run's numbers again. On a CPU `auto` trains a
   model on the kernels whose cohort step is reverse mode over vectors (no closed form: residual
   blocks, a last log softmax) of more than `task.CPU_FUNC_LOOP_PARAMETERS` (2^16) parameters a
   device on the loop, as rules 8 do for torch.func (an MLP with a residual block, 118 k: 1.00-1.05x
   a plain loop's round under rules 8, 0.81-0.97x; benchmarks/RESULTS.md, "Training rules 9").
10. nn.BatchNorm1d on vectors and nn.BatchNorm2d on images (a weight and bias, running statistics
   updated with a momentum) have kernels (`kernels.BatchNorm`: aten's `native_batch_norm` and its
   backward on one device, each device's own statistics in a cohort's call), so a module with them
   and fedsim's other layers trains on the kernels instead of through torch.func; its running
   statistics are the model's buffers, as a module's are. An MLP with a BatchNorm1d (159 k
   parameters) trains on the loop on a CPU by rules 9's rule (0.98-1.02x a plain loop's round
   through torch.func, 0.72-0.77x), a CNN with BatchNorm2d 0.47x -> 0.40-0.42x
   (benchmarks/RESULTS.md, "Training rules 10").
11. A synchronous round that `[run] max_time` cuts short (devices with speeds and links: it had
   not closed when max_time came) does not count: the run ends with the rounds that closed by
   max_time, its model, state and simulated time those of the last of them, and a resume with a
   later max_time runs the cut round whole, as a run given that max_time from the start does
   (rules 10 and before closed the round at max_time with what had arrived, `close_reason =
   "max-time"`, and a resume went on after it). As an asynchronous run's aggregation that
   max_time cuts short always was, and a round whose deadline is max_time itself counts.
12. A module's keyed dropout in a batched call whose devices' samples are padded to the widest
   (local epochs' last, smaller minibatches; unequal full local data, batch_size = 0): each
   device's own samples take the numbers of a forward of them alone, as the loop trainer and a
   cohort without padding give them (`ModuleModel.own_positions`). Rules 11 and before gave
   every dropout call after the first (and a first whose batch is not its input's first
   dimension) the numbers of the padded forward's layout, so a device's masks depended on the
   cohort it trained in and the two trainers disagreed (a transformer layer: by 5-15 % of the
   model after 3 rounds).
"""

from __future__ import annotations

CURRENT = 12

ROW_FLOATS = 16  # 64 bytes of float32: a cache line, and the widest alignment a BLAS kernel asks


def row_stride(dim: int, rules: int) -> int:
    """The floats from one device's parameters to the next in a batched call: `dim` rounded up
    to `ROW_FLOATS` from rules 3 (every row aligned as the first is), `dim` before."""
    return dim if rules < 3 else -(-dim // ROW_FLOATS) * ROW_FLOATS
