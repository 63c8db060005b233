"""GradScaler state-dict files between C++ and Python: read a C++ file, or write one for C++.

Usage:
  scaler_interop.py check PATH SCALE TRACKER GROWTH BACKOFF INTERVAL exact|extended
      exit 0 when Python reads those values; "exact": the file has exactly the keys of Python's
      own state_dict(), "extended": Python's keys plus amp's "_amp_*" keys
  scaler_interop.py write PATH       a Python scaler's state after a few steps (float values)
  scaler_interop.py write-ints PATH  a fresh GradScaler(init_scale=1024, growth_factor=3): ints
"""
import sys

import torch


def check(path, scale, tracker, growth, backoff, interval, keys):
    loaded = torch.load(path, weights_only=True)
    python_keys = set(torch.amp.GradScaler("cpu").state_dict())
    extra = set(loaded) - python_keys
    if not python_keys <= set(loaded):
        sys.exit(f"keys missing from the file: {sorted(python_keys - set(loaded))}")
    if keys == "exact" and extra:
        sys.exit(f"keys Python's state_dict() does not have: {sorted(extra)}")
    if keys == "extended" and (not extra or not all(k.startswith("_amp_") for k in extra)):
        sys.exit(f"expected extra '_amp_' keys, got {sorted(extra)}")
    scaler = torch.amp.GradScaler("cpu")
    scaler.load_state_dict(loaded)
    state = scaler.state_dict()
    expected = {"scale": float(scale), "_growth_tracker": int(tracker),
                "growth_factor": float(growth), "backoff_factor": float(backoff),
                "growth_interval": int(interval)}
    for key, value in expected.items():
        if type(state[key]) is not type(value) or state[key] != value:
            sys.exit(f"{key}: Python read {state[key]!r}, expected {value!r}")
    # The loaded state is live: the next update uses it (lazy init from the loaded values).
    scaler.scale(torch.ones(()))
    if scaler.get_scale() != float(scale):
        sys.exit(f"scale after lazy init {scaler.get_scale()} != {scale}")


def write(path):
    scaler = torch.amp.GradScaler("cpu", init_scale=512.0, growth_factor=4.0,
                                  backoff_factor=0.125, growth_interval=3)
    param = torch.ones(2, requires_grad=True)
    optimizer = torch.optim.SGD([param], lr=0.0)
    scaler.scale(torch.ones(()))
    for grad in (1.0, float("inf"), 1.0, 1.0):
        param.grad = torch.full((2,), grad)
        scaler.step(optimizer)
        scaler.update()
    # inf backs 512 off to 64; two clean steps leave the tracker at 2.
    torch.save(scaler.state_dict(), path)


def write_ints(path):
    scaler = torch.amp.GradScaler("cpu", init_scale=1024, growth_factor=3)
    state = scaler.state_dict()
    if type(state["scale"]) is not int or type(state["growth_factor"]) is not int:
        sys.exit(f"expected Python to keep the ints, got {state!r}")
    torch.save(state, path)


if __name__ == "__main__":
    if sys.argv[1] == "check":
        check(*sys.argv[2:9])
    elif sys.argv[1] == "write":
        write(sys.argv[2])
    elif sys.argv[1] == "write-ints":
        write_ints(sys.argv[2])
    else:
        sys.exit(f"unknown command {sys.argv[1]!r}")
