"""Python's side of tests/serialize/state_dict.tests.cpp: writes the state files Python writes and
reads the ones amp writes, printing what it saw as tab-separated lines.

  write MODEL PATH      torch.save(model.state_dict(), PATH) for MODEL (seeded); prints its rows
  read MODEL PATH       torch.load(PATH, weights_only=True), model.load_state_dict(strict=True);
                        prints the model's rows after the load
  optimizer PATH        torch.save(AdamW(...).state_dict()) after two steps; prints its rows
  optimizer-resume KIND PATH     two steps of KIND's optimizer over two seeded parameters in two
                        groups; saves {"params", "optimizer", "grad3"} to PATH; a third step
                        with grad3; prints the parameters' and the state's rows
  optimizer-continue KIND PATH  the same file (written by amp): the parameters and state loaded
                        into KIND's optimizer, a step with grad3; prints the same rows
  optimizer-roundtrip IN OUT HOW  amp's file IN ({"params", "optimizer"}) saved again to OUT,
                        untouched: loaded (HOW "file") or also loaded into torch.optim.AdamW
                        over IN's (bf16) parameters and taken back from it (HOW "optimizer"; with
                        keep_amp_state's hooks: HOW "optimizer-kept")
  ddp-write MODEL PATH  torch.save(DistributedDataParallel(MODEL).state_dict(), PATH), one rank;
                        prints its rows (names under "module.")
  checkpoint-write PATH two steps of a Linear-LayerNorm-Linear model with AdamW(fused=True) and
                        a GradScaler under CPU bf16 autocast; torch.save({"model", "optimizer",
                        "scaler", "step"}, PATH); prints the checkpoint's rows
  checkpoint-read PATH  the same objects built afresh, each loaded from PATH (weights_only=True);
                        prints the same rows
  shared PATH           torch.save of lists nested 60 deep, each holding the previous one twice
  values PATH           torch.load(PATH, weights_only=True) of a dict; prints a row per tensor
                        entry and `key, repr(value)` per other entry

A row: key, dtype, shape, the tensor's bytes in hex (C-contiguous).
"""
import sys

import torch
from lion_pytorch import Lion


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


def optimizer_for(kind, params):
    """KIND's optimizer over two groups (the second with its own options); amp's tests build the
    same in C++."""
    if kind in ("adamw_fused", "adamw", "adamw_libtorch", "adam_fused"):
        groups = [{"params": [params[0]]}, {"params": [params[1]], "lr": 0.5, "weight_decay": 0.0}]
        if kind == "adam_fused":
            return torch.optim.Adam(groups, lr=0.01, betas=(0.8, 0.95), weight_decay=0.01,
                                    amsgrad=True, fused=True)
        return torch.optim.AdamW(groups, lr=0.01, betas=(0.8, 0.95), weight_decay=0.01,
                                 fused=kind == "adamw_fused", foreach=False)
    if kind in ("sgd_fused", "sgd"):
        groups = [{"params": [params[0]]}, {"params": [params[1]], "lr": 0.5, "momentum": 0.5}]
        return torch.optim.SGD(groups, lr=0.1, momentum=0.9, weight_decay=0.01,
                               fused=kind == "sgd_fused", foreach=False)
    if kind == "lion":
        groups = [{"params": [params[0]]}, {"params": [params[1]], "lr": 0.5, "weight_decay": 0.0}]
        return Lion(groups, lr=0.01, betas=(0.8, 0.95), weight_decay=0.01)
    raise SystemExit(f"unknown optimizer kind {kind}")


def keep_amp_state(optimizer):
    """The GUIDE's recipe: Python's load_state_dict casts every state tensor but "step" to its
    parameter's dtype, which would round amp's float32 master weights of bf16 parameters; these
    hooks put amp's entries back as they were in the file."""
    kept = {}

    def before(opt, state_dict):
        kept.clear()
        for index, entry in state_dict["state"].items():
            for key in ("master_weight", "kahan_comp"):
                if key in entry:
                    kept[index, key] = entry[key]

    def after(opt):
        params = [p for group in opt.param_groups for p in group["params"]]
        for (index, key), value in kept.items():
            opt.state[params[index]][key] = value.to(params[index].device)

    optimizer.register_load_state_dict_pre_hook(before)
    optimizer.register_load_state_dict_post_hook(after)


def grads_of_step(params, step):
    torch.manual_seed(100 + step)
    return [torch.randn(p.shape) for p in params]


def print_optimizer_rows(params, opt):
    for i, p in enumerate(params):
        row(f"param.{i}", p)
    for index, entries in opt.state_dict()["state"].items():
        for key, t in entries.items():
            if isinstance(t, torch.Tensor):
                row(f"state.{index}.{key}", t)


def checkpoint_objects():
    torch.manual_seed(8)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8),
                                torch.nn.Linear(8, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.95), fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    return model, opt, scaler


def print_checkpoint_rows(model, opt, scaler, step):
    for key, t in model.state_dict().items():
        row(f"model.{key}", t)
    state = opt.state_dict()
    for index, entries in state["state"].items():
        for key, t in entries.items():
            row(f"optimizer.{index}.{key}", t)
    for g, group in enumerate(state["param_groups"]):
        for key in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "fused", "params"):
            print(f"group.{g}.{key}\t{group[key]!r}")
    for key, value in scaler.state_dict().items():
        print(f"scaler.{key}\t{value!r}")
    print(f"step\t{step!r}")


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
    elif command == "ddp-write":
        # What a data-parallel Python run saves: DistributedDataParallel's state_dict names
        # every entry under "module." (a one-rank Gloo group).
        import torch.distributed as dist
        dist.init_process_group("gloo", store=dist.FileStore(args[1] + ".store", 1), rank=0,
                                world_size=1)
        ddp = torch.nn.parallel.DistributedDataParallel(model(args[0]))
        torch.save(ddp.state_dict(), args[1])
        for key, t in ddp.state_dict().items():
            row(key, t)
        dist.destroy_process_group()
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
    elif command == "optimizer-resume":
        kind, path = args
        torch.manual_seed(5)
        params = [torch.randn(3, 2, requires_grad=True), torch.randn(4, requires_grad=True)]
        opt = optimizer_for(kind, params)
        for step in (1, 2):
            for p, g in zip(params, grads_of_step(params, step)):
                p.grad = g
            opt.step()
        grad3 = grads_of_step(params, 3)
        torch.save({"params": [p.detach() for p in params], "optimizer": opt.state_dict(),
                    "grad3": grad3}, path)
        for p, g in zip(params, grad3):
            p.grad = g
        opt.step()
        print_optimizer_rows(params, opt)
    elif command == "optimizer-continue":
        kind, path = args
        saved = torch.load(path, weights_only=True)
        params = [p.clone().requires_grad_(True) for p in saved["params"]]
        opt = optimizer_for(kind, params)
        opt.load_state_dict(saved["optimizer"])
        for p, g in zip(params, saved["grad3"]):
            p.grad = g
        opt.step()
        print_optimizer_rows(params, opt)
    elif command == "optimizer-roundtrip":
        saved = torch.load(args[0], weights_only=True)
        if args[2] in ("optimizer", "optimizer-kept"):
            params = [p.clone().requires_grad_(True) for p in saved["params"]]
            opt = torch.optim.AdamW(params)
            if args[2] == "optimizer-kept":
                keep_amp_state(opt)
            opt.load_state_dict(saved["optimizer"])
            saved = {"params": params, "optimizer": opt.state_dict()}
        torch.save(saved, args[1])
    elif command == "checkpoint-write":
        net, opt, scaler = checkpoint_objects()
        for step in range(2):
            torch.manual_seed(40 + step)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = net(torch.randn(5, 4)).float().square().mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(),
                    "scaler": scaler.state_dict(), "step": 7}, args[0])
        print_checkpoint_rows(net, opt, scaler, 7)
    elif command == "checkpoint-read":
        net, opt, scaler = checkpoint_objects()
        saved = torch.load(args[0], weights_only=True)
        net.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        scaler.load_state_dict(saved["scaler"])
        print_checkpoint_rows(net, opt, scaler, saved["step"])
    elif command == "shared":
        nested = [torch.ones(2)]
        for _ in range(60):
            nested = [nested, nested]  # the pickle holds each list once and refers to it twice
        torch.save(nested, args[0])
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
