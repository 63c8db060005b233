"""A training run moved between Python and C++ mid-run: the same model (Linear, ReLU, Linear) under
bf16 autocast with a GradScaler (growth every 2 steps, an inf step in each half) trains 2k steps.
One side trains the first k steps and saves the AMP recipe's checkpoint {"model", "optimizer",
"scaler", "step"} with torch.save / amp::save_pickled; the other loads it and trains the last k.
The final model, optimizer state and scaler state must equal the uninterrupted run's, bit for bit.

Scenarios "<optimizer>_python_to_cpp" and "<optimizer>_cpp_to_python", optimizer one of
adamw_fused (torch.optim.AdamW(fused=True) / amp::optim::FusedAdamW), adamw (AdamW's default
unfused path / amp::optim::AdamW), sgd_fused (SGD(fused=True) / FusedSGD) and sgd (SGD(foreach=False)
/ LibTorch's torch::optim::SGD), momentum and weight decay each; "one_flipped_bit_is_caught" is the control. The C++ side is
resume_parity_driver.cpp.
"""
import os
import subprocess
import sys

import torch

K = 4


def make_inputs(device):
    gen = torch.Generator().manual_seed(77)
    xs = [torch.randn(6, 8, generator=gen) for _ in range(2 * K)]
    ys = [torch.randn(6, 4, generator=gen) for _ in range(2 * K)]
    xs[1][0, 0] = float("inf")  # a skipped step before the move
    xs[K + 1][2, 3] = float("inf")  # and one after it
    return [x.to(device) for x in xs], [y.to(device) for y in ys]


def make_model(device):
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4)).to(device)


def make_optimizer(kind, params):
    if kind in ("adamw_fused", "adamw"):
        return torch.optim.AdamW(params, lr=0.01, betas=(0.9, 0.99), weight_decay=0.01,
                                 fused=kind == "adamw_fused", foreach=False)
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=0.01,
                           fused=kind == "sgd_fused", foreach=False)


def train(model, opt, scaler, xs, ys, first, last, device):
    for step in range(first, last):
        opt.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16):
            out = model(xs[step])
        loss = ((out.float() - ys[step]) ** 2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()


def same_bits(a, b):
    def raw(t):
        return t.detach().cpu().contiguous().view(-1).view(torch.uint8)

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(raw(a), raw(b))


def compare(expected, actual):
    """Every model entry, optimizer state tensor and scaler entry of two final checkpoints."""
    mismatches = []
    for key, t in expected["model"].items():
        if key not in actual["model"] or not same_bits(t, actual["model"][key]):
            mismatches.append(f"model.{key}")
    for index, entries in expected["optimizer"]["state"].items():
        for key, t in entries.items():
            theirs = actual["optimizer"]["state"].get(index, {}).get(key)
            if isinstance(t, torch.Tensor) and (theirs is None or not same_bits(t, theirs)):
                mismatches.append(f"optimizer.state.{index}.{key}")
    for key, value in expected["scaler"].items():
        if actual["scaler"].get(key) != value:
            mismatches.append(f"scaler.{key}: {value!r} != {actual['scaler'].get(key)!r}")
    return mismatches


def main(scenario, driver, workdir, device="cpu"):
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit(77)
    # The control: a run whose C++ result gets one flipped bit must be reported.
    flip = scenario == "one_flipped_bit_is_caught"
    if flip:
        scenario = "adamw_fused_python_to_cpp"
    kind = scenario.replace("_python_to_cpp", "").replace("_cpp_to_python", "")
    python_first = scenario.endswith("_python_to_cpp")
    os.makedirs(workdir, exist_ok=True)
    xs, ys = make_inputs(device)
    inputs = os.path.join(workdir, "inputs.pt")
    torch.save({"xs": [x.cpu() for x in xs], "ys": [y.cpu() for y in ys], "k": K}, inputs)
    checkpoint = os.path.join(workdir, "checkpoint.pt")
    cpp_final = os.path.join(workdir, "cpp_final.pt")

    model = make_model(device)
    opt = make_optimizer(kind, model.parameters())
    scaler = torch.amp.GradScaler(device, init_scale=1024.0, growth_interval=2)
    if python_first:
        train(model, opt, scaler, xs, ys, 0, K, device)
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "scaler": scaler.state_dict(), "step": K}, checkpoint)
        train(model, opt, scaler, xs, ys, K, 2 * K, device)
        subprocess.run([driver, "resume", kind, device, inputs, checkpoint, cpp_final], check=True)
    else:
        subprocess.run([driver, "start", kind, device, inputs, checkpoint, cpp_final], check=True)
        saved = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        scaler.load_state_dict(saved["scaler"])
        assert saved["step"] == K
        train(model, opt, scaler, xs, ys, K, 2 * K, device)
    python_final = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "scaler": scaler.state_dict()}
    cpp = torch.load(cpp_final, weights_only=True)
    if flip:
        weight = cpp["model"]["2.weight"]
        weight.view(-1).view(torch.int32)[3] ^= 1
    mismatches = compare(python_final, cpp)
    if flip:
        print(f"one flipped bit: {mismatches}")
        sys.exit(0 if mismatches == ["model.2.weight"] else 1)
    print(f"{scenario}: scale {scaler.get_scale()} (C++ {cpp['scaler']['scale']}), "
          f"{len(mismatches)} mismatches")
    for m in mismatches:
        print("  mismatch:", m)
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main(*sys.argv[1:])
