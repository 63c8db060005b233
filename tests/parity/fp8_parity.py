"""FP8 training parity: a two-layer MLP converted to float8 by torchao 0.18
(convert_to_float8_training with a recipe) or by fp8_delayed_reference.py (Transformer Engine's
delayed scaling), against the same MLP converted by amp::fp8 in C++ (fp8_parity_driver), trained
with SGD from the same weights and data and compared bit for bit every step: loss, output,
grad_input, every parameter's gradient and every parameter after the step (and, for the delayed
recipe, the amax histories and scales).

Usage: fp8_parity.py SCENARIO DRIVER WORKDIR [DEVICE]
AMP_PARITY_MUTATE=1 flips the lowest bit of the Python side's first weight gradient in step 2, so
that a scenario must fail: the suite runs that to show the comparison can fail.
"""
import copy
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

from fp8_delayed_reference import DelayedFloat8Linear
from scaler_parity import DTYPES, same_bits, scenario_config

# recipe: a torchao recipe name or "delayed". dtype: the parameters' and inputs' dtype. shape:
# the input's leading dims (their product a multiple of 16 but in the odd-dims scenarios, which
# CUDA cannot run). inject: [step, "zero" | "inf" | "nan"] written into that step's input.
# scaler: init scale of a torch.amp.GradScaler (0: none). autocast: "none" or the CPU autocast
# dtype.
DEFAULTS = dict(device="cpu", recipe="tensorwise", dtype="float32", bias=1, shape=[16],
                in_features=32, hidden=48, out_features=16, steps=5, lr=0.05, inject=[],
                scaler=0.0, autocast="none", history_len=16, algo="max", margin=0,
                fp8_format="hybrid", data_scale=1.0)
SCENARIOS = {
    "tensorwise_fp32": dict(),
    "tensorwise_fp32_nobias_3d": dict(bias=0, shape=[2, 8]),
    "tensorwise_bf16": dict(dtype="bfloat16"),
    "tensorwise_bf16_3d": dict(dtype="bfloat16", shape=[2, 8]),
    "rowwise_fp32": dict(recipe="rowwise"),
    "rowwise_fp32_nobias_3d": dict(recipe="rowwise", bias=0, shape=[4, 4]),
    "rowwise_bf16": dict(recipe="rowwise", dtype="bfloat16"),
    "rowwise_bf16_3d": dict(recipe="rowwise", dtype="bfloat16", shape=[2, 8]),
    "rowwise_with_gw_hp_fp32": dict(recipe="rowwise_with_gw_hp"),
    "rowwise_with_gw_hp_fp32_nobias_3d": dict(recipe="rowwise_with_gw_hp", bias=0, shape=[2, 8]),
    "rowwise_with_gw_hp_bf16": dict(recipe="rowwise_with_gw_hp", dtype="bfloat16"),
    "rowwise_with_gw_hp_bf16_3d": dict(recipe="rowwise_with_gw_hp", dtype="bfloat16",
                                       shape=[2, 8]),
    "tensorwise_odd_dims": dict(in_features=30, hidden=20, out_features=10, shape=[5]),
    "rowwise_odd_dims": dict(recipe="rowwise", in_features=30, hidden=20, out_features=10,
                             shape=[5]),
    "tensorwise_bf16_autocast": dict(autocast="bfloat16"),
    "rowwise_bf16_autocast_3d": dict(recipe="rowwise", autocast="bfloat16", shape=[2, 8]),
    "tensorwise_zero_inf_nan_inputs": dict(inject=[[1, "zero"], [2, "inf"], [3, "nan"]], steps=4),
    "rowwise_zero_inf_nan_inputs": dict(recipe="rowwise", inject=[[1, "zero"], [2, "inf"],
                                                                  [3, "nan"]], steps=4),
    "tensorwise_scaler_skips": dict(scaler=2.0 ** 16, inject=[[2, "inf"]], steps=6),
    "rowwise_scaler": dict(recipe="rowwise", scaler=1024.0, steps=4),
    "delayed_hybrid_max": dict(recipe="delayed", steps=8, history_len=4),
    "delayed_most_recent_margin": dict(recipe="delayed", algo="most_recent", margin=2, steps=6),
    "delayed_e4m3_bf16_3d": dict(recipe="delayed", fp8_format="e4m3", dtype="bfloat16",
                                 shape=[4, 4], steps=5, history_len=3),
    "delayed_history_1_inf_zero_nan": dict(recipe="delayed", history_len=1, steps=6,
                                           inject=[[1, "zero"], [2, "inf"], [4, "nan"]]),
}


def cpu_takes_rowwise():
    """Whether this torch's CPU _scaled_mm takes rowwise scales (2.14's does, 2.11's not)."""
    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(a, a.t(), torch.ones(16, 1), torch.ones(1, 16), out_dtype=torch.bfloat16)
    except RuntimeError:
        return False
    return True


def make_inputs(config):
    gen = torch.Generator().manual_seed(2024)
    i, h, o = config["in_features"], config["hidden"], config["out_features"]
    weights = [torch.randn(h, i, generator=gen) * 0.2, torch.randn(h, generator=gen) * 0.1,
               torch.randn(o, h, generator=gen) * 0.2, torch.randn(o, generator=gen) * 0.1]
    shape = config["shape"]
    xs = [torch.randn(*shape, i, generator=gen) * config["data_scale"]
          for _ in range(config["steps"])]
    ys = [torch.randn(*shape, o, generator=gen) for _ in range(config["steps"])]
    for step, kind in config["inject"]:
        x = xs[step]
        if kind == "zero":
            x.zero_()
        else:
            x.view(-1, i)[1, 3] = float("inf") if kind == "inf" else float("nan")
    return weights, xs, ys


def build_model(config, weights, device):
    dtype = DTYPES[config["dtype"]]
    bias = bool(config["bias"])
    i, h, o = config["in_features"], config["hidden"], config["out_features"]
    model = torch.nn.Sequential(torch.nn.Linear(i, h, bias=bias), torch.nn.ReLU(),
                                torch.nn.Linear(h, o, bias=bias))
    with torch.no_grad():
        model[0].weight.copy_(weights[0])
        model[2].weight.copy_(weights[2])
        if bias:
            model[0].bias.copy_(weights[1])
            model[2].bias.copy_(weights[3])
    model = model.to(device=device, dtype=dtype)
    if config["recipe"] == "delayed":
        for index in (0, 2):
            model[index] = DelayedFloat8Linear(model[index], config["history_len"],
                                               config["algo"], config["margin"],
                                               config["fp8_format"])
    else:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        convert_to_float8_training(model,
                                   config=Float8LinearConfig.from_recipe_name(config["recipe"]))
    return model


def run_reference(config, weights, xs, ys):
    device = config["device"]
    dtype = DTYPES[config["dtype"]]
    model = build_model(config, weights, device)
    params = [p for p in model.parameters()]
    optimizer = torch.optim.SGD(params, lr=config["lr"], foreach=False)
    scaler = (torch.amp.GradScaler(device, init_scale=config["scaler"], growth_interval=2)
              if config["scaler"] else None)
    record = {}
    mutate = os.environ.get("AMP_PARITY_MUTATE") == "1"
    for step in range(config["steps"]):
        x = xs[step].to(device=device, dtype=dtype).requires_grad_(True)
        y = ys[step].to(device)
        optimizer.zero_grad(set_to_none=True)
        if config["autocast"] != "none":
            with torch.autocast(device, dtype=DTYPES[config["autocast"]]):
                out = model(x)
        else:
            out = model(x)
        loss = F.mse_loss(out.float(), y)
        (scaler.scale(loss) if scaler else loss).backward()
        if mutate and step == 2:
            params[0].grad.view(torch.int16 if params[0].grad.element_size() == 2
                                else torch.int32)[0, 0] ^= 1
        record[f"{step}/loss"] = loss.detach()
        record[f"{step}/output"] = out.detach()
        record[f"{step}/grad_input"] = x.grad
        for index, p in enumerate(params):
            record[f"{step}/grad{index}"] = p.grad.clone()
        if scaler:
            scaler.step(optimizer)
            scaler.update()
            record[f"{step}/scale"] = scaler._scale.clone()
        else:
            optimizer.step()
        for index, p in enumerate(params):
            record[f"{step}/param{index}"] = p.detach().clone()
        if config["recipe"] == "delayed":
            for layer, index in ((0, 0), (1, 2)):
                for role, state in zip(("input", "weight", "grad_output"),
                                       model[index].states):
                    record[f"{step}/layer{layer}/amax_history_{role}"] = state.history.clone()
                    record[f"{step}/layer{layer}/scale_{role}"] = state.scale.clone()
    return {k: v.detach().cpu() for k, v in record.items()}


def main(scenario, driver, workdir, device="cpu"):
    config = scenario_config(DEFAULTS, SCENARIOS, scenario, workdir, device)
    rows = 1
    for size in config["shape"]:
        rows *= size
    dims = (rows, config["in_features"], config["hidden"], config["out_features"])
    if device == "cuda" and any(d % 16 for d in dims):
        print(f"skipped: at::_scaled_mm on CUDA needs dims divisible by 16, and {scenario} has "
              f"{dims} (rows, in, hidden, out): it is a CPU scenario")
        sys.exit(77)
    if device == "cpu" and config["recipe"].startswith("rowwise") and not cpu_takes_rowwise():
        print(f"skipped: torch {torch.__version__}'s CPU _scaled_mm takes tensorwise scales only")
        sys.exit(77)
    weights, xs, ys = make_inputs(config)
    expected = run_reference(config, weights, xs, ys)

    inputs = {k: v for k, v in config.items() if k not in ("inject", "shape")}
    inputs.update(weights=weights, xs=xs, ys=ys)
    inputs_path = os.path.join(workdir, "inputs.pt")
    torch.save(inputs, inputs_path)
    actual_path = os.path.join(workdir, "actual.pt")
    subprocess.run([driver, inputs_path, actual_path], check=True)
    actual = torch.load(actual_path, weights_only=False)

    failures = [f"{key}: only in {'python' if key in expected else 'c++'}"
                for key in sorted(expected.keys() ^ actual.keys())]
    for key in sorted(expected.keys() & actual.keys(), key=lambda k: (int(k.split('/')[0]), k)):
        e, a = expected[key], actual[key]
        if not same_bits(e, a):
            detail = (f"max |diff| {(e.double() - a.double()).abs().max().item():.3g}"
                      if e.shape == a.shape and e.dtype == a.dtype
                      else f"{e.dtype}{list(e.shape)} vs {a.dtype}{list(a.shape)}")
            failures.append(f"{key}: {detail}")
    if failures:
        print(f"MISMATCH in {scenario} ({len(failures)} entries); first ones:")
        print("\n".join(failures[:12]))
        sys.exit(1)
    print(f"{scenario}: {len(expected)} tensors over {config['steps']} steps bit-identical")


if __name__ == "__main__":
    main(*sys.argv[1:])
