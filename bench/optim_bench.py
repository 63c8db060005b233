# Python twin of amp_optim_bench (bench/optim_bench.cpp): torch.optim.AdamW(fused=True) on the CPU,
# on the same shapes, the same variants' Python counterparts and the same statistics.
#
# Usage: optim_bench.py [--threads 1,2] [--warmup N] [--reps-mlp N] [--reps-small N]
#                       [--rounds-mlp N] [--rounds-small N] [--batch-mlp N] [--only step|train]
#
# Part 1, the optimizer step alone, on (a) the parameters of the MLP 784-4096-4096-10 and (b) 240
# small tensors of 64..4096 floats, with fixed gradients: AdamW(fused=True) against the
# single-tensor AdamW(foreach=False) (the loop LibTorch's C++ AdamW also runs), plus the same
# memory-bandwidth ceiling as the C++ bench. Part 2, a whole training step (zero_grad, fp16
# autocast forward, cross-entropy, backward, step) on the MLP (batch 256) and on Linear(784, 10)
# (batch 64): fused AdamW with torch.amp.GradScaler("cpu") (which hands the fused step the scale
# and the inf flag), for-loop AdamW with the scaler, and both without a scaler. Each round runs
# every variant once in an order rotated from round to round; medians and paired ratios with a
# distribution-free 95% interval. As for the C++ bench: on a CPU without AVX512-FP16 or AMX the
# fp16 MLP step takes about a minute; lower --rounds-mlp or --batch-mlp there.
import argparse
import copy
import math
import os
import platform
import time

import torch

LR = 1e-3
WEIGHT_DECAY = 1e-2
# Minimum traffic of one fused AdamW step per float32 element: reads param, grad, exp_avg and
# exp_avg_sq, writes param, exp_avg and exp_avg_sq (amsgrad off).
ADAM_BYTES_PER_ELEMENT = 7 * 4


def quantile(values, q):
    if not values:
        return 0.0
    v = sorted(values)
    i = int(q * (len(v) - 1) + 0.5)
    return v[min(i, len(v) - 1)]


def median(values):
    return quantile(values, 0.5)


def median_ci(values):
    """Distribution-free ~95% interval of the median (order statistics n/2 -+ 1.96 sqrt(n)/2)."""
    if not values:
        return 0.0, 0.0
    v = sorted(values)
    n = len(v)
    half = 0.98 * math.sqrt(n)
    lo = int(max(0.0, math.floor(n / 2 - half)))
    hi = int(min(n - 1, math.ceil(n / 2 + half)))
    return v[lo], v[hi]


def ratios(a, b):
    return [x / y for x, y in zip(a, b)]


def ratio_text(paired):
    lo, hi = median_ci(paired)
    return f"{median(paired):.3f}x [{lo:.3f}, {hi:.3f}]"


def interleave(variants, warmup, rounds):
    """Runs variants[v](round) round by round in an order rotated by one each round, `warmup`
    untimed rounds first; returns the seconds of every timed call per variant."""
    n = len(variants)
    seconds = [[] for _ in range(n)]
    for r in range(warmup + rounds):
        for k in range(n):
            v = (k + r) % n
            start = time.perf_counter()
            variants[v](r)
            if r >= warmup:
                seconds[v].append(time.perf_counter() - start)
    return seconds


def make_mlp(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def arch_name(widths):
    return "-".join(str(w) for w in widths)


def small_shapes():
    """The 240 small tensors: 64..4096 floats each, spread by a fixed stride (as the C++ bench)."""
    return [(64 + (i * 997) % 4033,) for i in range(240)]


def mlp_shapes(widths):
    shapes = []
    for i in range(len(widths) - 1):
        shapes += [(widths[i + 1], widths[i]), (widths[i + 1],)]
    return shapes


def params_with_grads(shapes):
    params = []
    for shape in shapes:
        p = torch.randn(shape).requires_grad_(True)
        p.grad = torch.randn(shape) * 1e-2
        params.append(p)
    return params


def copies_of(params):
    out = []
    for p in params:
        c = p.detach().clone().requires_grad_(True)
        c.grad = p.grad.clone()
        out.append(c)
    return out


def step_case(name, shapes, warmup, reps):
    torch.manual_seed(0)
    fused_params = params_with_grads(shapes)
    loop_params = copies_of(fused_params)
    fused = torch.optim.AdamW(fused_params, lr=LR, weight_decay=WEIGHT_DECAY, fused=True)
    loop = torch.optim.AdamW(loop_params, lr=LR, weight_decay=WEIGHT_DECAY, foreach=False)
    elements = sum(p.numel() for p in fused_params)
    nbytes = ADAM_BYTES_PER_ELEMENT * elements
    # An in-place mul_ reads and writes each element: half the bytes, in float32 elements.
    flat = torch.randn(nbytes // 2 // 4)
    flip = [False]

    def ceiling(_):
        flat.mul_(2.0 if flip[0] else 0.5)  # exact: the values stay bounded
        flip[0] = not flip[0]

    seconds = interleave([ceiling, lambda _: fused.step(), lambda _: loop.step()], warmup, reps)
    print(
        f"\n-- step alone: {name}: {len(shapes)} tensors, {elements} elements; minimum traffic "
        f"of a fused step {nbytes / 1e6:.2f} MB ({ADAM_BYTES_PER_ELEMENT} B per element); "
        f"{warmup} warm-up + {reps} reps --"
    )
    print(
        f"{'variant':<40} {'median ms':>10} {'p10 ms':>10} {'p90 ms':>10} {'GB/s':>9} "
        f"{'frac':>9}  paired time / AdamW(fused=True) [95% CI]"
    )
    names = [
        "ceiling: flat in-place mul_, same bytes",
        "torch.optim.AdamW(fused=True)",
        "torch.optim.AdamW(foreach=False)",
    ]
    top = median(seconds[0])
    for v, s in enumerate(seconds):
        m = median(s)
        print(
            f"{names[v]:<40} {1e3 * m:10.4f} {1e3 * quantile(s, 0.1):10.4f} "
            f"{1e3 * quantile(s, 0.9):10.4f} {nbytes / m / 1e9:9.2f} {top / m:9.2f}  "
            f"{ratio_text(ratios(s, seconds[1]))}"
        )
    print(
        "(GB/s: the fused step's minimum traffic over the median time, for every row; frac: "
        "ceiling time / row time)",
        flush=True,
    )


VARIANTS = [
    ("fp16 + GradScaler + fused AdamW", True, True),
    ("fp16 + GradScaler + loop AdamW", False, True),
    ("fp16, no scaler, fused AdamW", True, False),
    ("fp16, no scaler, loop AdamW", False, False),
]


class Trainer:
    """One variant's model, optimizer, optional scaler and optimizer-part timings."""

    def __init__(self, variant, initial):
        self.name, fused, scaled = variant
        self.model = copy.deepcopy(initial)
        if fused:
            self.optimizer = torch.optim.AdamW(
                self.model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, fused=True
            )
        else:
            self.optimizer = torch.optim.AdamW(
                self.model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, foreach=False
            )
        self.scaler = torch.amp.GradScaler("cpu") if scaled else None
        self.steps = []

    def step(self, x, y, record):
        self.optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        step_start = time.perf_counter()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if record:
            self.steps.append(time.perf_counter() - step_start)


def train_case(name, widths, batch, warmup, rounds):
    torch.manual_seed(0)
    initial = make_mlp(widths)
    batches = 4
    xs = [torch.rand(batch, widths[0]) for _ in range(batches)]
    ys = [torch.randint(0, widths[-1], (batch,)) for _ in range(batches)]
    trainers = [Trainer(v, initial) for v in VARIANTS]

    def runner(t):
        return lambda r: t.step(xs[r % batches], ys[r % batches], r >= warmup)

    wall_start = time.perf_counter()
    totals = interleave([runner(t) for t in trainers], warmup, rounds)
    wall = time.perf_counter() - wall_start
    # Without a skipped step the scale doubled every growth interval (2000 clean steps).
    clean_scale = 65536.0 * 2.0 ** ((warmup + rounds) // 2000)

    params = sum(p.numel() for p in initial.parameters())
    print(
        f"\n-- training step: {name}: {arch_name(widths)}, {params} parameters, batch {batch}, "
        f"AdamW lr {LR:g} weight decay {WEIGHT_DECAY:g}, {warmup} warm-up + {rounds} rounds "
        f"({wall:.1f} s) --"
    )
    print(
        f"{'variant':<34} {'median ms':>10} {'p10 ms':>10} {'p90 ms':>10} {'step+update ms':>14}"
        f"  {'paired time / fused+scaler':<30} skipped steps"
    )
    for v, t in enumerate(trainers):
        skipped = "-"
        if t.scaler is not None:
            scale = t.scaler.get_scale()
            skipped = f"{'none' if scale == clean_scale else 'SOME'} (scale {scale:g})"
        print(
            f"{t.name:<34} {1e3 * median(totals[v]):10.4f} {1e3 * quantile(totals[v], 0.1):10.4f} "
            f"{1e3 * quantile(totals[v], 0.9):10.4f} {1e3 * median(t.steps):14.4f}  "
            f"{ratio_text(ratios(totals[v], totals[0])):<30} {skipped}"
        )
    print("GradScaler overhead (paired median [95% CI]):")
    for scaled, plain in ((0, 2), (1, 3)):
        paired = ratios(totals[scaled], totals[plain])
        lo, hi = median_ci(paired)
        print(
            f"  {trainers[scaled].name:<30} vs {trainers[plain].name:<30}: "
            f"{100 * (median(paired) - 1):+.2f}% [{100 * (lo - 1):+.2f}%, {100 * (hi - 1):+.2f}%]"
        )
    print(
        f"optimizer traffic per step (minimum, fp32 state): fused AdamW "
        f"{ADAM_BYTES_PER_ELEMENT * params / 1e6:.2f} MB; under the scaler +{4 * params / 1e6:.2f} "
        "MB for its inf check of the gradients (the fused step unscales inside its own pass)"
    )
    print(
        f"(skipped steps: none when the scale ended at {clean_scale:g}, its value without a "
        "skipped step; SOME: the timed steps include skipped ones)",
        flush=True,
    )


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average():
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def thread_list(text):
    try:
        threads = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--threads takes a list such as 1,2; got '{text}'")
    if not threads or min(threads) < 1:
        raise argparse.ArgumentTypeError(f"--threads takes counts of 1 or more; got '{text}'")
    return threads


def positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more; got '{text}'")
    return value


def main():
    parser = argparse.ArgumentParser(
        description="Fused AdamW on the CPU: the optimizer step alone and the fp16 training step."
    )
    parser.add_argument("--threads", type=thread_list, default=[1, 2])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps-mlp", type=positive, default=40)
    parser.add_argument("--reps-small", type=positive, default=2000)
    parser.add_argument("--rounds-mlp", type=positive, default=40)
    parser.add_argument("--rounds-small", type=positive, default=2000)
    parser.add_argument("--batch-mlp", type=positive, default=256)
    parser.add_argument("--only", choices=["step", "train"])
    args = parser.parse_args()

    mlp = [784, 4096, 4096, 10]
    linear = [784, 10]
    print("optim_bench.py: CPU, torch.optim.AdamW(fused=True)")
    print(
        f"cpu: {cpu_model()}, {os.cpu_count()} logical CPUs online, load average at start "
        f"{load_average()}"
    )
    print(f"torch {torch.__version__}, ATen CPU capability {torch.backends.cpu.get_cpu_capability()}")
    torch.set_num_interop_threads(1)
    for t in args.threads:
        # Pinned so every variant runs with the same parallelism.
        torch.set_num_threads(t)
        print(f"\n==== threads {t} (torch.get_num_threads() = {torch.get_num_threads()}) ====")
        if args.only != "train":
            step_case(f"mlp {arch_name(mlp)}", mlp_shapes(mlp), args.warmup, args.reps_mlp)
            step_case(
                "240 small tensors (64..4096 floats)", small_shapes(), args.warmup, args.reps_small
            )
        if args.only != "step":
            train_case("mlp", mlp, args.batch_mlp, args.warmup, args.rounds_mlp)
            train_case("example", linear, 64, args.warmup, args.rounds_small)
    print(f"\nload average at end {load_average()}")


if __name__ == "__main__":
    main()
