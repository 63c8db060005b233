"""Low-precision optimizer parity: amp's fused optimizers with bf16/fp16 parameters and
master_weights, kahan_summation, stochastic_rounding or state_dtype (C++) against
low_precision_reference.py (PyTorch's Adam/AdamW/SGD arithmetic in float32 plus the write-back),
with torch.amp.GradScaler and autocast, compared bit for bit after every step: loss, scale,
tracker, inf flag, parameters, moments, master copies, compensation and step counts.

Usage: low_precision_parity.py SCENARIO DRIVER WORKDIR [DEVICE]
AMP_PARITY_MUTATE=1 drops one operation of the reference's Kahan update, so that a Kahan scenario
must fail: the suite runs that to show the comparison can fail.
"""
import os
import sys

import torch

from low_precision_reference import LowPrecisionOptimizer
from optim_parity import run_parity
from scaler_parity import DTYPES

# mode: nearest, master, kahan or sr. state_dtype: "" (the default: float32) or a dtype name.
# resume_at: the C++ run saves its optimizer
# before that step and continues in a new one loaded from the checkpoint.
DEFAULTS = dict(device="cpu", optimizer="adamw", steps=10, autocast="none",
                param_dtype="bfloat16", scaler="none", init_scale=1024.0, growth_interval=3,
                lr=0.01, lr2=-1.0, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, amsgrad=0,
                momentum=0.0, dampening=0.0, nesterov=0, clip=0.0, lr_changes=[], inject=[],
                zero_skipped_first_buffers=0, mode="kahan", state_dtype="", seed=0,
                resume_at=-1)
SCENARIOS = {
    "adamw_bf16_master": dict(mode="master"),
    "adamw_bf16_kahan": dict(mode="kahan", steps=12),
    "adamw_bf16_sr": dict(mode="sr", seed=7),
    "adamw_bf16_kahan_bf16_state": dict(mode="kahan", state_dtype="bfloat16", steps=12),
    "sgd_bf16_sr_bf16_state": dict(optimizer="sgd", mode="sr", lr=0.05, momentum=0.9,
                                   state_dtype="bfloat16", seed=5),
    "adamw_bf16_nearest_fp32_state": dict(mode="nearest", state_dtype="float32"),
    "adam_amsgrad_bf16_kahan_fp32_state": dict(optimizer="adam", mode="kahan",
                                               state_dtype="float32", amsgrad=1,
                                               weight_decay=0.05),
    "adamw_fp16_master_scaled_skips": dict(mode="master", param_dtype="float16",
                                           scaler="enabled", steps=12, init_scale=256.0,
                                           inject=[[2, 0], [5, 1], [9, 0]]),
    "adam_fp16_kahan_scaled_skips": dict(optimizer="adam", mode="kahan", param_dtype="float16",
                                         scaler="enabled", init_scale=64.0, weight_decay=0.0,
                                         inject=[[0, 0], [4, 1]]),
    "sgd_nesterov_bf16_master": dict(optimizer="sgd", mode="master", lr=0.05, momentum=0.9,
                                     nesterov=1, weight_decay=1e-3),
    "sgd_dampening_bf16_kahan_skips": dict(optimizer="sgd", mode="kahan", lr=0.05,
                                           momentum=0.8, dampening=0.3, weight_decay=0.0,
                                           scaler="enabled", inject=[[0, 1], [5, 0]]),
    "sgd_bf16_sr_scaled_skips": dict(optimizer="sgd", mode="sr", lr=0.05, momentum=0.9,
                                     weight_decay=0.0, scaler="enabled", seed=3,
                                     inject=[[3, 0]]),
    "adamw_bf16_autocast_master": dict(mode="master", autocast="bfloat16"),
    "adamw_bf16_sr_resume": dict(mode="sr", seed=11, steps=12, resume_at=5, inject=[[7, 0]],
                                 scaler="enabled"),
    "adam_bf16_kahan_resume": dict(optimizer="adam", mode="kahan", steps=12, resume_at=6,
                                   weight_decay=0.02),
    "lion_bf16_kahan": dict(optimizer="lion", mode="kahan", lr=1e-3, beta2=0.99,
                            weight_decay=0.05, steps=12),
    "lion_bf16_sr_scaled_skips": dict(optimizer="lion", mode="sr", lr=1e-3, beta2=0.99, seed=9,
                                      weight_decay=0.0, scaler="enabled", inject=[[3, 1]]),
    "lion_fp16_master_resume": dict(optimizer="lion", mode="master", param_dtype="float16",
                                    lr=1e-3, beta2=0.99, scaler="enabled", init_scale=64.0,
                                    steps=12, resume_at=5, inject=[[7, 0]]),
    "lion_bf16_nearest_bf16_state": dict(optimizer="lion", mode="nearest", lr=1e-3, beta2=0.99,
                                         state_dtype="bfloat16"),
    "sgd_bf16_master_resume_unscale_clip": dict(optimizer="sgd", mode="master",
                                                lr=0.05, momentum=0.9,
                                                scaler="enabled", clip=0.05, resume_at=4,
                                                weight_decay=0.0, inject=[[6, 1]]),
}


def make_optimizer(config, params):
    assert config["lr2"] <= 0, "one param group in these scenarios"
    state_dtype = DTYPES.get(config["state_dtype"])
    if state_dtype is None:
        state_dtype = torch.float32
    return LowPrecisionOptimizer(
        params, config["optimizer"], config["mode"], state_dtype, lr=config["lr"],
        betas=(config["beta1"], config["beta2"]), eps=config["eps"],
        weight_decay=config["weight_decay"], amsgrad=bool(config["amsgrad"]),
        momentum=config["momentum"], dampening=config["dampening"],
        nesterov=bool(config["nesterov"]), seed=config["seed"],
        mutate=os.environ.get("AMP_PARITY_MUTATE") == "1")


def main(scenario, driver, workdir, device="cpu"):
    run_parity(DEFAULTS, SCENARIOS, scenario, driver, workdir, device, make_optimizer)


if __name__ == "__main__":
    main(*sys.argv[1:5])
