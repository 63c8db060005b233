"""GradScaler parity: the same scripted training with torch.amp (here) and amp (C++ driver).

Usage: scaler_parity.py SCENARIO DRIVER WORKDIR [DEVICE]
Generates initial weights and data, runs the reference training with torch.amp.GradScaler and
torch.autocast on DEVICE ("cpu", the default, or "cuda"), runs DRIVER (the C++ twin) on the same
inputs and device, and compares exactly: scale and growth tracker after every step, which steps
were skipped, each step's loss, final parameters. With "cuda" and no usable GPU it exits 77
(CTest's skip code) without running anything.
"""
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

# Every scenario: overrides of the defaults below. The C++ driver reads the same dict.
DEFAULTS = dict(device="cpu", dtype="float16", steps=10, init_scale=65536.0, growth_factor=2.0,
                backoff_factor=0.5, growth_interval=2000, optimizer="sgd", accumulate=1,
                clip=0.0, two_models=0, new_scale_at=-1, new_scale=0.0, new_scale_tensor_at=-1,
                new_scale_tensor=0.0, resume_at=-1, data_scale=1.0, inject=[])
SCENARIOS = {
    "fp16_autocast": dict(dtype="float16", steps=12, growth_interval=4),
    "bf16_autocast": dict(dtype="bfloat16", steps=12, growth_interval=4),
    "inf_and_nan_injected": dict(steps=12, init_scale=256.0, growth_interval=3,
                                 inject=[[2, 0], [6, 1], [7, 0], [11, 1]]),
    "growth_across_intervals": dict(steps=14, init_scale=1.0, growth_interval=2),
    "unscale_clip_step": dict(steps=10, init_scale=1024.0, growth_interval=3, clip=0.05,
                              inject=[[4, 0]]),
    "gradient_accumulation": dict(steps=8, init_scale=512.0, growth_interval=2, accumulate=3,
                                  inject=[[3, 1]]),
    "two_models_two_optimizers": dict(steps=10, init_scale=1024.0, growth_interval=3,
                                      two_models=1, inject=[[4, 0]]),
    "update_new_scale_midrun": dict(steps=10, init_scale=1024.0, growth_interval=2,
                                    new_scale_at=3, new_scale=300.0, new_scale_tensor_at=6,
                                    new_scale_tensor=77.0),
    "state_dict_resume_midrun": dict(steps=12, init_scale=2048.0, growth_interval=3,
                                     resume_at=4, inject=[[6, 0]]),
    "growth_from_1e38_stays_finite": dict(dtype="float32", steps=6, init_scale=1e38,
                                          growth_interval=1, data_scale=1e-6),
}
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
BATCH, IN, HIDDEN, OUT = 6, 8, 16, 4


def make_inputs(config):
    gen = torch.Generator().manual_seed(1234)
    models = 2 if config["two_models"] else 1
    weights = []
    for _ in range(models):
        weights += [torch.randn(HIDDEN, IN, generator=gen) * 0.3, torch.randn(HIDDEN, generator=gen) * 0.1,
                    torch.randn(OUT, HIDDEN, generator=gen) * 0.3, torch.randn(OUT, generator=gen) * 0.1]
    batches = config["steps"] * config["accumulate"]
    xs = [torch.randn(BATCH, IN, generator=gen) * config["data_scale"] for _ in range(batches)]
    ys = [torch.randn(BATCH, OUT, generator=gen) * config["data_scale"] for _ in range(batches)]
    return weights, xs, ys


def forward(p, x):
    return F.linear(F.linear(x, p[0], p[1]).relu(), p[2], p[3])


# SGD only: LibTorch's Adam updates exp_avg with mul_+add_ where Python's uses lerp_, so their
# parameters differ in the last bit whatever the scaler does (the driver still offers "adam").
def make_optimizer(config, params):
    if config["optimizer"] == "adam":
        return torch.optim.Adam(params, lr=0.01, foreach=False)
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, foreach=False)


def make_scaler(config):
    return torch.amp.GradScaler(config["device"], init_scale=config["init_scale"],
                                growth_factor=config["growth_factor"],
                                backoff_factor=config["backoff_factor"],
                                growth_interval=config["growth_interval"])


def reference(config, weights, xs, ys, workdir):
    torch.set_num_threads(1)
    device = config["device"]
    dtype = DTYPES[config["dtype"]]
    autocast = dtype != torch.float32
    params = [w.to(device, copy=True).requires_grad_(True) for w in weights]
    xs = [x.to(device) for x in xs]
    ys = [y.to(device) for y in ys]
    groups = [params[i:i + 4] for i in range(0, len(params), 4)]
    optimizers = [make_optimizer(config, g) for g in groups]
    scaler = make_scaler(config)
    inject = {step: kind for step, kind in config["inject"]}
    scales, trackers, skipped, losses = [], [], [], []
    acc = config["accumulate"]
    for step in range(config["steps"]):
        for opt in optimizers:
            opt.zero_grad()
        step_loss = torch.zeros((), device=device)
        for micro in range(acc):
            x, y = xs[step * acc + micro], ys[step * acc + micro]
            with torch.autocast(device, dtype=dtype, enabled=autocast):
                if config["two_models"]:
                    out0, out1 = forward(groups[0], x), forward(groups[1], x)
                    loss0 = F.mse_loss(2 * out0 + 3 * out1, y)
                    loss1 = F.mse_loss(3 * out0 - 5 * out1, y)
                else:
                    loss0 = F.mse_loss(forward(groups[0], x), y) / acc
            if config["two_models"]:
                scaler.scale(loss0).backward(retain_graph=True)
                scaler.scale(loss1).backward()
                step_loss = step_loss + loss0.detach().float() + loss1.detach().float()
            else:
                scaler.scale(loss0).backward()
                step_loss = step_loss + loss0.detach().float()
        if step in inject:
            with torch.no_grad():
                params[0].grad[0, 0] = math.inf if inject[step] == 0 else math.nan
        if config["clip"] > 0:
            scaler.unscale_(optimizers[0])
            torch.nn.utils.clip_grad_norm_(groups[0], config["clip"], foreach=False)
        if config["two_models"]:
            scaler.unscale_(optimizers[0])
        found = 0.0
        for opt in optimizers:
            scaler.step(opt)
            found += sum(v.item() for v in scaler._found_inf_per_device(opt).values())
        if step == config["new_scale_at"]:
            scaler.update(config["new_scale"])
        elif step == config["new_scale_tensor_at"]:
            scaler.update(torch.tensor(config["new_scale_tensor"], device=device))
        else:
            scaler.update()
        if step == config["resume_at"]:
            path = os.path.join(workdir, "python_resume.pt")
            torch.save(scaler.state_dict(), path)
            scaler = torch.amp.GradScaler(device, init_scale=1.0)
            scaler.load_state_dict(torch.load(path, weights_only=True))
        scales.append(scaler.get_scale())
        trackers.append(scaler._get_growth_tracker())
        skipped.append(found != 0)
        losses.append(step_loss)
    return dict(scales=torch.tensor(scales, dtype=torch.float64),
                trackers=torch.tensor(trackers, dtype=torch.int64),
                skipped=torch.tensor(skipped, dtype=torch.bool), losses=torch.stack(losses).cpu(),
                params=[p.detach().cpu() for p in params])


def same_bits(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        int_type = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
        return torch.equal(a.view(int_type), b.view(int_type))
    return torch.equal(a, b)


def scenario_config(defaults, scenarios, scenario, workdir, device):
    """The scenario's config (defaults, its overrides, the device) with WORKDIR created; with
    "cuda" and no usable GPU, exits 77 (CTest's skip code) first. Shared with optim_parity.py."""
    if device == "cuda" and not torch.cuda.is_available():
        print("skipped: the CUDA scenarios need a GPU and torch sees none")
        sys.exit(77)
    config = dict(defaults, **scenarios[scenario], device=device)
    if (device == "cuda" and config.get("param_dtype") == "bfloat16"
            and config.get("scaler") == "enabled" and not cuda_unscales_bfloat16()):
        print(f"skipped: torch {torch.__version__} has no bfloat16 CUDA kernel for GradScaler's "
              "unscale, so the Python reference cannot run this scenario on CUDA")
        sys.exit(77)
    os.makedirs(workdir, exist_ok=True)
    return config


def cuda_unscales_bfloat16():
    """Whether this torch's GradScaler can unscale bfloat16 gradients on CUDA (2.11's cannot)."""
    grads = [torch.ones(1, dtype=torch.bfloat16, device="cuda")]
    found, inv = torch.zeros(1, device="cuda"), torch.ones(1, device="cuda")
    try:
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
    except (NotImplementedError, RuntimeError):
        return False
    return True


def main(scenario, driver, workdir, device="cpu"):
    config = scenario_config(DEFAULTS, SCENARIOS, scenario, workdir, device)
    weights, xs, ys = make_inputs(config)
    inputs = dict(config, inject=torch.tensor(config["inject"], dtype=torch.int64).reshape(-1, 2),
                  weights=weights, xs=xs, ys=ys)
    inputs_path = os.path.join(workdir, "inputs.pt")
    torch.save(inputs, inputs_path)
    expected = reference(config, weights, xs, ys, workdir)
    if scenario == "growth_from_1e38_stays_finite":
        assert all(math.isfinite(s) for s in expected["scales"].tolist()), expected["scales"]
        assert expected["scales"].max().item() > 1e38, "the scenario never grew"

    actual_path = os.path.join(workdir, "actual.pt")
    subprocess.run([driver, inputs_path, actual_path, workdir], check=True)
    actual = torch.load(actual_path, weights_only=False)

    failures = []
    for key in ("scales", "trackers", "skipped", "losses"):
        if not same_bits(expected[key], actual[key]):
            failures.append(f"{key}: python {expected[key].tolist()} != c++ {actual[key].tolist()}")
    for i, (e, a) in enumerate(zip(expected["params"], actual["params"])):
        if not same_bits(e, a):
            failures.append(f"param {i}: max abs diff {(e - a).abs().max().item()}")
    if len(expected["params"]) != len(actual["params"]):
        failures.append("different number of parameters")
    print(f"{scenario} on {device}: scales {expected['scales'].tolist()}")
    print(f"{scenario} on {device}: skipped {expected['skipped'].int().tolist()}")
    if failures:
        print("MISMATCH\n" + "\n".join(failures))
        sys.exit(1)
    print("identical")


if __name__ == "__main__":
    main(*sys.argv[1:5])
