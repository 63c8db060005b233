"""FusedLion parity: the lion-pytorch package (here) against amp::optim::FusedLion (C++).

Usage: lion_parity.py SCENARIO DRIVER WORKDIR [DEVICE]
Trains the same float32 model on the same data with lion_pytorch.Lion (with torch.amp.GradScaler
and torch.autocast where the scenario says) and with amp::optim::FusedLion (amp::GradScaler,
amp::AutocastGuard), and compares exactly after every step: loss, scale, growth tracker, flag,
every parameter and the momentum. lion-pytorch computes x.add(y, alpha=a) with ATen, which fuses
the multiply-add on the CPU (AVX2/AVX-512 builds) and on CUDA; amp's rule does the same. The
step count (amp's state; stochastic rounding's bits are drawn per step) is counted here too.
"""
import os
import sys

import torch
from lion_pytorch import Lion

from optim_parity import run_parity

DEFAULTS = dict(device="cpu", optimizer="lion", steps=10, autocast="none", param_dtype="float32",
                scaler="none", init_scale=1024.0, growth_interval=3, lr=1e-3, lr2=-1.0,
                beta1=0.9, beta2=0.99, eps=0.0, weight_decay=0.0, amsgrad=0, momentum=0.0,
                dampening=0.0, nesterov=0, clip=0.0, lr_changes=[], inject=[],
                zero_skipped_first_buffers=0, resume_at=-1)
SCENARIOS = {
    "lion_fp32": dict(),
    "lion_fp32_weight_decay": dict(weight_decay=0.1, beta1=0.95, beta2=0.98, steps=12),
    "lion_fp16_autocast_scaled_skips": dict(autocast="float16", scaler="enabled",
                                            weight_decay=0.01, steps=12,
                                            inject=[[2, 0], [6, 1]]),
    "lion_two_groups_lr_change": dict(lr2=3e-4, lr_changes=[[4, 0, 5e-4], [7, 1, 2e-3]],
                                      weight_decay=0.05),
    "lion_resume": dict(steps=12, resume_at=5, weight_decay=0.02),
}


def unfused_update(p, grad, exp_avg, lr, wd, beta1, beta2):
    """lion-pytorch's update_fn with each multiply-add rounded twice (a test of the test: the
    comparison must see the difference)."""
    p.data.mul_(1.0 - lr * wd)
    update = (exp_avg.clone().mul_(beta1) + grad * (1.0 - beta1)).sgn_()
    p.add_(update, alpha=-lr)
    exp_avg.mul_(beta2).add_(grad * (1.0 - beta2))


class CountingLion(Lion):
    """lion_pytorch.Lion, plus a float32 step count per parameter (amp keeps one)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if os.environ.get("AMP_PARITY_MUTATE") == "1":
            self.update_fn = unfused_update

    @torch.no_grad()
    def step(self, closure=None):
        loss = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    state = self.state[p]
                    state["step"] = state.get("step", torch.zeros((), dtype=torch.float32)) + 1
        return loss


def make_optimizer(config, params):
    groups = ([dict(params=params[:2]), dict(params=params[2:], lr=config["lr2"])]
              if config["lr2"] > 0 else [dict(params=params)])
    return CountingLion(groups, lr=config["lr"], betas=(config["beta1"], config["beta2"]),
                        weight_decay=config["weight_decay"])


def main(scenario, driver, workdir, device="cpu"):
    run_parity(DEFAULTS, SCENARIOS, scenario, driver, workdir, device, make_optimizer)


if __name__ == "__main__":
    main(*sys.argv[1:5])
