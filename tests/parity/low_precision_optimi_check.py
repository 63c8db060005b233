"""The low-precision reference against torch-optimi 0.3.3 where the two algorithms coincide:
plain SGD (no momentum, no weight decay) with Kahan summation on bfloat16 parameters.

They coincide only when ATen computes optimi's `comp.add_(update, alpha=-lr)` in float32: on one
thread, over whole 32-element vectors (ATen's scalar tail rounds `alpha * g` to bfloat16 first),
and with a learning rate that bfloat16 represents (ATen casts alpha to bfloat16). Under those
conditions every parameter and compensation must agree bit for bit for 300 steps; with lr=0.01
(not a bfloat16 value) they must not, which shows the comparison can fail.
"""
import sys

import optimi
import torch

from low_precision_reference import LowPrecisionOptimizer


def mismatching_steps(lr, steps=300, size=4096):
    torch.manual_seed(0)
    start = torch.randn(size).to(torch.bfloat16)
    a = start.clone().requires_grad_(True)
    b = start.clone().requires_grad_(True)
    theirs = optimi.SGD([a], lr=lr, kahan_sum=True, foreach=False, triton=False)
    ours = LowPrecisionOptimizer([b], "sgd", "kahan", torch.bfloat16, lr=lr)
    bad = 0
    for _ in range(steps):
        g = (torch.randn(size) * 0.1).to(torch.bfloat16)
        a.grad, b.grad = g.clone(), g.clone()
        theirs.step()
        ours.step()
        same = torch.equal(a.view(torch.int16), b.view(torch.int16)) and torch.equal(
            theirs.state[a]["kahan_comp"].view(torch.int16),
            ours.state[b]["kahan_comp"].view(torch.int16))
        bad += not same
    return bad


def main():
    torch.set_num_threads(1)
    failures = []
    for lr in (0.01171875, 0.0078125):  # 3 * 2^-8 and 2^-7: bfloat16 values
        bad = mismatching_steps(lr)
        print(f"optimi {optimi.__version__} SGD(kahan_sum=True), lr={lr}: {bad} of 300 steps differ")
        if bad:
            failures.append(f"lr={lr}: {bad} steps differ from optimi")
    bad = mismatching_steps(0.01)
    print(f"lr=0.01 (rounded to bfloat16 by ATen inside optimi): {bad} of 300 steps differ")
    if bad == 0:
        failures.append("lr=0.01 agreed with optimi, so the comparison cannot tell them apart")
    if failures:
        print("FAILED\n" + "\n".join(failures))
        sys.exit(1)
    print("identical where the algorithms coincide")


if __name__ == "__main__":
    main()
