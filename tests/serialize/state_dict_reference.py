"""Python's side of tests/serialize/state_dict.tests.cpp: writes the state files Python writes and
reads the ones amp writes, printing what it saw as tab-separated lines.

  write MODEL PATH      torch.save(model.state_dict(), PATH) for MODEL (seeded); prints its rows
  read MODEL PATH       torch.load(PATH, weights_only=True), model.load_state_dict(strict=True);
                        prints the model's rows after the load
  optimizer PATH        torch.save(AdamW(...).state_dict()) after two steps; prints its rows
  values PATH           torch.load(PATH, weights_only=True) of a dict; prints a row per tensor
                        entry and `key, repr(value)` per other entry

A row: key, dtype, shape, the tensor's bytes in hex (C-contiguous).
"""
import sys

import torch


def model(name):
    torch.manual_seed(3)
    if name == "mlp":
        # Linear, LayerNorm (bf16 weights), Linear, BatchNorm (int64 counter), a float8 and an
        # fp16 buffer on the Sequential itself.
        m = torch.nn.Sequential(
            torch.nn.Linear(4, 8),
            torch.nn.LayerNorm(8),
            torch.nn.Linear(8, 3),
            torch.nn.BatchNorm1d(3),
        )
        m[1].to(torch.bfloat16)
        m.register_buffer("history", torch.randn(5).to(torch.float8_e4m3fn))
        m.register_buffer("half_buffer", torch.randn(2, 3).half())
        with torch.no_grad():
            m[3].running_mean.uniform_()
            m[3].running_var.uniform_(1, 2)
            m[3].num_batches_tracked.fill_(7)
        return m
    if name == "other":
        m = torch.nn.Sequential(torch.nn.Linear(4, 8))
        m.register_buffer("extra", torch.zeros(2))
        return m
    raise SystemExit(f"unknown model {name}")


def row(key, t):
    shape = "x".join(str(s) for s in t.shape)
    data = t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes().hex()
    print(f"{key}\t{str(t.dtype).removeprefix('torch.')}\t{shape}\t{data}")


def main():
    command, *args = sys.argv[1:]
    if command == "write":
        m = model(args[0])
        torch.save(m.state_dict(), args[1])
        for key, t in m.state_dict().items():
            row(key, t)
    elif command == "read":
        m = model(args[0])
        state = torch.load(args[1], weights_only=True)
        m.load_state_dict(state, strict=True)
        for key, t in m.state_dict().items():
            row(key, t)
    elif command == "optimizer":
        torch.manual_seed(5)
        params = [torch.randn(3, 2, requires_grad=True), torch.randn(4, requires_grad=True)]
        opt = torch.optim.AdamW(
            [{"params": [params[0]]}, {"params": [params[1]], "lr": 0.5, "weight_decay": 0.0}],
            lr=0.01,
            betas=(0.8, 0.95),
        )
        for _ in range(2):
            for p in params:
                p.grad = torch.randn_like(p)
            opt.step()
        torch.save(opt.state_dict(), args[0])
        state = opt.state_dict()
        for index, entries in state["state"].items():
            for key, t in entries.items():
                row(f"state.{index}.{key}", t)
        for g, group in enumerate(state["param_groups"]):
            for key, value in group.items():
                print(f"group.{g}.{key}\t{value!r}")
    elif command == "values":
        for key, value in torch.load(args[0], weights_only=True).items():
            if isinstance(value, torch.Tensor):
                row(key, value)
            else:
                print(f"{key}\t{value!r}")
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
