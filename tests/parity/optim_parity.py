"""Fused optimizer parity: torch.optim's fused Adam/AdamW/SGD (here) against amp::optim (C++).

Usage: optim_parity.py SCENARIO DRIVER WORKDIR [DEVICE]
Trains the same model on the same data with injected inf/NaN gradients in Python
(torch.optim.*(fused=True), torch.amp.GradScaler, torch.autocast) and in C++ (amp::optim::Fused*,
amp::GradScaler, amp::AutocastGuard) on DEVICE ("cpu", the default, or "cuda"), and compares
exactly after every step: loss, scale, growth tracker, inf/NaN flag, every parameter and every
optimizer state tensor (step, exp_avg, exp_avg_sq, max_exp_avg_sq, momentum_buffer). With "cuda"
and no usable GPU it exits 77 (CTest's skip code) without running anything.
"""
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

from scaler_parity import DTYPES, forward, make_inputs, same_bits, scenario_config

# autocast: "none" or the autocast dtype. param_dtype: the model weights' dtype (inputs follow).
# scaler: "enabled", "disabled" (GradScaler(enabled=False)) or "none" (plain backward and step).
# lr2 > 0 puts the second layer in a second param group with that lr. lr_changes: [step, group,
# lr] applied before that step. inject: [step, 0 for inf / 1 for NaN] into w1's gradient.
DEFAULTS = dict(device="cpu", optimizer="adamw", steps=10, autocast="float16",
                param_dtype="float32", scaler="enabled", init_scale=1024.0, growth_interval=3,
                lr=0.01, lr2=-1.0, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, amsgrad=0,
                momentum=0.0, dampening=0.0, nesterov=0, clip=0.0, lr_changes=[], inject=[],
                zero_skipped_first_buffers=0)
SCENARIOS = {
    "adamw_fp16_inf_nan": dict(steps=12, init_scale=256.0,
                               inject=[[2, 0], [5, 1], [6, 0], [10, 1]]),
    "adam_amsgrad_weight_decay": dict(optimizer="adam", steps=12, weight_decay=0.05, amsgrad=1,
                                      inject=[[4, 0], [8, 1]]),
    "sgd_nesterov_weight_decay": dict(optimizer="sgd", lr=0.05, momentum=0.9, nesterov=1,
                                      weight_decay=1e-3, inject=[[3, 0], [7, 1]]),
    "sgd_momentum_dampening": dict(optimizer="sgd", lr=0.05, momentum=0.8, dampening=0.3,
                                   inject=[[4, 1]]),
    # Python's fused SGD leaves a first step's momentum buffers uninitialised (torch.empty_like)
    # when found_inf skips that step, and the next step computes with them; amp starts them at
    # zeros. The reference zeroes its buffers after the skipped step (so Python's leftover memory
    # is never compared): amp's buffers must be exactly zero there, and the steps after it must
    # equal Python's fused SGD continuing from zero buffers.
    "sgd_first_step_skipped": dict(optimizer="sgd", lr=0.05, momentum=0.9, inject=[[0, 0]],
                                   zero_skipped_first_buffers=1),
    "sgd_first_step_skipped_dampening": dict(optimizer="sgd", lr=0.05, momentum=0.9,
                                             dampening=0.25, inject=[[0, 1], [4, 0]],
                                             zero_skipped_first_buffers=1),
    "two_param_groups": dict(lr=0.01, lr2=0.002, inject=[[3, 0]]),
    "lr_change_midrun": dict(steps=12, lr2=0.002, lr_changes=[[4, 0, 0.003], [7, 1, 0.02]],
                             inject=[[5, 0]]),
    "sgd_lr_change_midrun": dict(optimizer="sgd", lr=0.05, momentum=0.9, lr_changes=[[3, 0, 0.1]],
                                 inject=[[6, 1]]),
    "unscale_clip_step": dict(clip=0.05, inject=[[4, 0]]),
    "fp32_params_scaled": dict(autocast="none", inject=[[3, 1]]),
    "bf16_params_unscaled": dict(autocast="none", param_dtype="bfloat16", scaler="none"),
    "bf16_params_scaled": dict(autocast="none", param_dtype="bfloat16", inject=[[3, 0]]),
    "fp16_params_scaled": dict(optimizer="adam", autocast="none", param_dtype="float16",
                               init_scale=64.0, inject=[[3, 0]]),
    "sgd_fp16_autocast_scaled": dict(optimizer="sgd", lr=0.05, steps=12, init_scale=1.0,
                                     growth_interval=2),
    "bf16_autocast_scaler_disabled": dict(autocast="bfloat16", scaler="disabled"),
}


def make_optimizer(config, params):
    if config["lr2"] > 0:
        groups = [dict(params=params[:2]), dict(params=params[2:], lr=config["lr2"])]
    else:
        groups = [dict(params=params)]
    if config["optimizer"] == "sgd":
        return torch.optim.SGD(groups, lr=config["lr"], momentum=config["momentum"],
                               dampening=config["dampening"], weight_decay=config["weight_decay"],
                               nesterov=bool(config["nesterov"]), fused=True)
    kind = torch.optim.Adam if config["optimizer"] == "adam" else torch.optim.AdamW
    return kind(groups, lr=config["lr"], betas=(config["beta1"], config["beta2"]),
                eps=config["eps"], weight_decay=config["weight_decay"],
                amsgrad=bool(config["amsgrad"]), fused=True)


def record(out, step, params, optimizer):
    for i, p in enumerate(params):
        out[f"{step}/param/{i}"] = p.detach().cpu().clone()
        for name, value in optimizer.state.get(p, {}).items():
            if torch.is_tensor(value):
                out[f"{step}/{name}/{i}"] = value.detach().cpu().clone()


def run_reference(config, weights, xs, ys, optimizer_factory=None):
    """The scenario's training in Python; `optimizer_factory(config, params)` builds the
    optimizer (default: torch.optim's fused one)."""
    torch.set_num_threads(1)
    device = config["device"]
    params = [w.to(device, copy=True).requires_grad_(True) for w in weights]
    xs = [x.to(device) for x in xs]
    ys = [y.to(device) for y in ys]
    optimizer = (optimizer_factory or make_optimizer)(config, params)
    mode = config["scaler"]
    scaler = torch.amp.GradScaler(device, init_scale=config["init_scale"],
                                  growth_interval=config["growth_interval"],
                                  enabled=mode == "enabled")
    autocast_dtype = DTYPES.get(config["autocast"], torch.float16)
    inject = {step: kind for step, kind in config["inject"]}
    out = {}
    for step in range(config["steps"]):
        for at, group, lr in config["lr_changes"]:
            if at == step:
                optimizer.param_groups[int(group)]["lr"] = lr
        optimizer.zero_grad()
        with torch.autocast(device, dtype=autocast_dtype, enabled=config["autocast"] != "none"):
            loss = F.mse_loss(forward(params, xs[step]), ys[step])
        (loss if mode == "none" else scaler.scale(loss)).backward()
        if step in inject:
            with torch.no_grad():
                params[0].grad[0, 0] = math.inf if inject[step] == 0 else math.nan
        if config["clip"] > 0:
            if mode != "none":
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, config["clip"], foreach=False)
        if mode == "none":
            optimizer.step()
        else:
            scaler.step(optimizer)
            if mode == "enabled":
                flags = scaler._found_inf_per_device(optimizer).values()
                out[f"{step}/found_inf"] = sum(flags).cpu()
            scaler.update()
            if mode == "enabled":
                out[f"{step}/scale"] = scaler._scale.cpu().clone()
                out[f"{step}/tracker"] = scaler._growth_tracker.cpu().clone()
        # Uninitialised memory in Python, zeros in amp (see "sgd_first_step_skipped").
        if step == 0 and step in inject and config["zero_skipped_first_buffers"]:
            for p in params:
                optimizer.state[p]["momentum_buffer"].zero_()
        out[f"{step}/loss"] = loss.detach().float().cpu()
        record(out, step, params, optimizer)
    return out


def skipped_steps_change_nothing(config, weights, actual):
    """Problems in amp's own record: a step whose flag is 1 must leave every parameter and state
    tensor (the step count included) as the step before left it; before the first step that is
    the initial weights and zero state, so a skipped first step of a momentum SGD leaves zero
    momentum buffers."""
    problems = []
    for step in range(config["steps"]):
        if actual.get(f"{step}/found_inf", torch.zeros(())).item() != 1:
            continue
        for key in (k for k in actual if k.startswith(f"{step}/") and k.count("/") == 2):
            name = key.split("/", 1)[1]
            kind, index = name.split("/")
            if step > 0:
                before = actual.get(f"{step - 1}/{name}")
            elif kind == "param":
                before = weights[int(index)]
            elif kind == "master_weight":  # a float32 copy of the parameter from the start
                before = weights[int(index)].float()
            else:
                before = torch.zeros_like(actual[key])
            if before is None or not same_bits(before, actual[key]):
                problems.append(f"{key}: a skipped step changed it")
    return problems


def run_parity(defaults, scenarios, scenario, driver, workdir, device, optimizer_factory=None):
    """One scenario of an optimizer parity suite: inputs in the parameters' dtype, the reference
    run with `optimizer_factory` (default: torch.optim's fused one), then the driver's, compared."""
    config = scenario_config(defaults, scenarios, scenario, workdir, device)
    weights, xs, ys = make_inputs(dict(config, two_models=0, accumulate=1, data_scale=1.0))
    dtype = DTYPES[config["param_dtype"]]
    weights, xs, ys = ([t.to(dtype) for t in ts] for ts in (weights, xs, ys))
    expected = run_reference(config, weights, xs, ys, optimizer_factory)
    compare_runs(scenario, config, weights, xs, ys, expected, driver, workdir)


def main(scenario, driver, workdir, device="cpu"):
    run_parity(DEFAULTS, SCENARIOS, scenario, driver, workdir, device)


def compare_runs(scenario, config, weights, xs, ys, expected, driver, workdir):
    """Runs the C++ driver on the same inputs and compares its record with `expected`; exits 1
    with the differences."""
    device = config["device"]
    inputs = dict(config, weights=weights, xs=xs, ys=ys,
                  inject=torch.tensor(config["inject"], dtype=torch.int64).reshape(-1, 2),
                  lr_changes=torch.tensor(config["lr_changes"], dtype=torch.float64).reshape(-1, 3))
    inputs_path = os.path.join(workdir, "inputs.pt")
    torch.save(inputs, inputs_path)

    actual_path = os.path.join(workdir, "actual.pt")
    subprocess.run([driver, inputs_path, actual_path], check=True)
    actual = torch.load(actual_path, weights_only=False)

    failures = []
    for key in sorted(expected.keys() ^ actual.keys()):
        failures.append(f"{key}: only in {'python' if key in expected else 'c++'}")
    for key in expected.keys() & actual.keys():
        e, a = expected[key], actual[key]
        if not same_bits(e, a):
            if e.shape == a.shape:
                diff = (e.double() - a.double()).abs().max().item()
            else:
                diff = f"{e.dtype}{list(e.shape)} vs {a.dtype}{list(a.shape)}"
            failures.append(f"{key}: differs ({diff})")
    # The injected steps must really have been skipped, or the scenario tests less than it says.
    if config["scaler"] == "enabled":
        for step, _ in config["inject"]:
            if expected[f"{step}/found_inf"].item() != 1:
                failures.append(f"step {step}: the injected inf/NaN did not skip it in Python")
    failures += skipped_steps_change_nothing(config, weights, actual)
    flags = [int(expected[f"{s}/found_inf"].item()) for s in range(config["steps"])
             if f"{s}/found_inf" in expected]
    print(f"{scenario} on {device}: {len(expected)} tensors per run, skipped {flags}")
    if failures:
        failures.sort(key=lambda f: (int(f.split("/")[0]) if f[0].isdigit() else -1, f))
        print("MISMATCH\n" + "\n".join(failures[:40]))
        sys.exit(1)
    print("identical")


if __name__ == "__main__":
    main(*sys.argv[1:5])
