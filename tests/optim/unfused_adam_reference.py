"""Python's side of unfused_adam.tests.cpp: torch.optim.Adam and AdamW on their unfused paths over
the test's parameters and gradients, printed as rows (key, dtype, shape, bytes in hex).

  unfused_adam_reference.py AMSGRAD
      AMSGRAD 0 or 1: for each of AdamW single-tensor, Adam single-tensor and AdamW foreach
      (run names adamw, adam, adamw_foreach), five steps, then every parameter and state tensor
      by Python's state_dict index, each row's key prefixed with "<run>/"
"""
import sys

import torch


def params():
    """float32, complex64 and bfloat16 parameters, as the C++ test makes them (same seeds)."""
    torch.manual_seed(5)
    return [torch.randn(3, 4), torch.randn(5, dtype=torch.complex64),
            torch.randn(6).to(torch.bfloat16)]


def grads(step, ps):
    """Step `step`'s gradients; the complex parameter has none at step 3."""
    torch.manual_seed(100 + step)
    out = [torch.randn(p.shape, dtype=p.dtype) if p.dtype != torch.bfloat16
           else torch.randn(p.shape).to(torch.bfloat16) for p in ps]
    if step == 3:
        out[1] = None
    return out


def row(key, t):
    shape = "x".join(str(s) for s in t.shape)
    data = t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes().hex()
    print(f"{key}\t{str(t.dtype).removeprefix('torch.')}\t{shape}\t{data}")


def run(name, kind, amsgrad, foreach):
    ps = [p.requires_grad_(True) for p in params()]
    groups = [{"params": ps[:2]}, {"params": ps[2:], "lr": 0.05, "weight_decay": 0.2}]
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    opt = cls(groups, lr=0.01, betas=(0.8, 0.95), weight_decay=0.1, amsgrad=amsgrad,
              foreach=foreach)
    for step in range(1, 6):
        for p, g in zip(ps, grads(step, ps)):
            p.grad = g
        opt.step()
    for i, p in enumerate(ps):
        row(f"{name}/param.{i}", p)
    for index, entries in opt.state_dict()["state"].items():
        for key, t in entries.items():
            row(f"{name}/state.{index}.{key}", t)


def main(amsgrad):
    for name, kind, foreach in (("adamw", "adamw", False), ("adam", "adam", False),
                                ("adamw_foreach", "adamw", True)):
        run(name, kind, amsgrad == "1", foreach)


if __name__ == "__main__":
    main(*sys.argv[1:])
