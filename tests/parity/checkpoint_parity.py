"""Activation checkpointing parity: torch.utils.checkpoint (use_reentrant=False) here against
amp::checkpoint (checkpoint_parity_driver.cpp).

Usage: checkpoint_parity.py SCENARIO DRIVER WORKDIR [DEVICE]
A small network whose middle is a checkpointed function with dropout, two outputs and a
non-tensor argument (optionally with a nested checkpoint inside), under autocast on DEVICE (cpu,
the default, or cuda: 77 without a GPU) or not, is
trained for a few SGD steps from the same weights and seed on both sides; the loss, every
gradient and every parameter after every step must be bit-identical.
"""
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from scaler_parity import DTYPES, same_bits, scenario_config

DEFAULTS = dict(device="cpu", steps=4, autocast="none", nested=0, preserve_rng_state=1,
                early_stop=1, lr=0.05, scale=0.5, seed=3)
SCENARIOS = {
    "fp32": dict(),
    "bf16_autocast": dict(autocast="bfloat16"),
    "fp16_autocast": dict(autocast="float16"),
    "nested_bf16_autocast": dict(autocast="bfloat16", nested=1),
    "rng_not_preserved": dict(preserve_rng_state=0),
    "no_early_stop_nested": dict(nested=1, early_stop=0),
}
IN, HIDDEN, BATCH = 16, 32, 8


def make_inputs(config):
    gen = torch.Generator().manual_seed(99)
    shapes = [(HIDDEN, IN), (HIDDEN,), (IN, HIDDEN), (IN,), (IN, IN), (IN,)]
    weights = [torch.randn(s, generator=gen) * 0.3 for s in shapes]
    xs = [torch.randn(BATCH, IN, generator=gen) for _ in range(config["steps"])]
    ys = [torch.randn(BATCH, IN, generator=gen) for _ in range(config["steps"])]
    return weights, xs, ys


def run_reference(config, weights, xs, ys):
    torch.set_num_threads(1)
    torch.manual_seed(config["seed"])
    device = config["device"]
    p = [w.to(device, copy=True).requires_grad_(True) for w in weights]
    xs = [x.to(device) for x in xs]
    ys = [y.to(device) for y in ys]
    options = dict(use_reentrant=False, preserve_rng_state=bool(config["preserve_rng_state"]),
                   early_stop=bool(config["early_stop"]))

    def inner(h):
        return F.gelu(F.linear(h, p[2], p[3]))

    def outer(x, scale):
        h = F.dropout(F.linear(x, p[0], p[1]), 0.25, training=True)
        h = checkpoint(inner, h, **options) if config["nested"] else inner(h)
        return h * scale, h.relu().mean()

    out = {}
    for step in range(config["steps"]):
        for w in p:
            w.grad = None
        with torch.autocast(device, dtype=DTYPES.get(config["autocast"], torch.bfloat16),
                            enabled=config["autocast"] != "none"):
            a, m = checkpoint(outer, xs[step], config["scale"], **options)
            y = F.linear(a, p[4], p[5])
            loss = F.mse_loss(y.float(), ys[step]) + m.float()
        loss.backward()
        out[f"{step}/loss"] = loss.detach().cpu()
        with torch.no_grad():
            for i, w in enumerate(p):
                out[f"{step}/grad/{i}"] = w.grad.cpu().clone()
                w.sub_(w.grad * config["lr"])
                out[f"{step}/param/{i}"] = w.detach().cpu().clone()
    return out


def main(scenario, driver, workdir, device="cpu"):
    config = scenario_config(DEFAULTS, SCENARIOS, scenario, workdir, device)
    weights, xs, ys = make_inputs(config)
    expected = run_reference(config, weights, xs, ys)
    inputs_path = os.path.join(workdir, "inputs.pt")
    torch.save(dict(config, weights=weights, xs=xs, ys=ys), inputs_path)
    actual_path = os.path.join(workdir, "actual.pt")
    subprocess.run([driver, inputs_path, actual_path], check=True)
    actual = torch.load(actual_path, weights_only=False)
    failures = [f"{key}: only in {'python' if key in expected else 'c++'}"
                for key in sorted(expected.keys() ^ actual.keys())]
    for key in sorted(expected.keys() & actual.keys()):
        if os.environ.get("AMP_PARITY_MUTATE") == "1" and key == "1/grad/0":
            expected[key] = expected[key].clone()
            expected[key].view(-1)[0] = torch.nextafter(expected[key].view(-1)[0],
                                                        torch.tensor(float("inf")))
        if not same_bits(expected[key], actual[key]):
            diff = (expected[key].double() - actual[key].double()).abs().max().item()
            failures.append(f"{key}: differs ({diff})")
    print(f"{scenario}: {len(expected)} tensors over {config['steps']} steps compared")
    if failures:
        print("MISMATCH\n" + "\n".join(failures[:40]))
        sys.exit(1)
    print("identical")


if __name__ == "__main__":
    main(*sys.argv[1:5])
