"""Sharded-optimizer parity: PyTorch's ZeroRedundancyOptimizer against amp's, bit for bit.

Usage: zero_parity.py WORKER WORKDIR SCENARIO [--flip]
       zero_parity.py --reference-only WORKDIR SCENARIO|all

A small MLP (fc1 in->hidden, relu, fc2 hidden->hidden, relu, then fc3 hidden->out plus a side head
hidden->out, summed; cross-entropy, one forward per step) trains on Gloo ranks (2 and then 3; the
reshard scenario 2 then 3 and 3 then 2), each rank on its own batches and from its own weights
(DDP broadcasts rank 0's): here with torch.nn.parallel.DistributedDataParallel,
torch.distributed.optim.ZeroRedundancyOptimizer around the scenario's optimizer,
torch.amp.GradScaler("cpu") and scaler.step(zero); and with WORKER (amp_distributed_worker's
zero_parity scenario) on the same weights and data, started as torchrun starts ranks. Every line
below must be equal bit for bit on every rank. With --flip the worker flips one bit of one weight on
rank 0 after step 2, and the run must then report mismatches (the comparison can fail).

With --reference-only no worker runs: the PyTorch ranks run twice, sharded (ZeRO) and unsharded
(DDP with the plain optimizer, the same param groups), and the script checks that all ranks agree
and that ZeRO's scales, parameters, consolidated state and param groups equal the unsharded run's.

The protocol with the worker
----------------------------
Invocation, rank r of W, environment RANK=r LOCAL_RANK=r WORLD_SIZE=W MASTER_ADDR=127.0.0.1
MASTER_PORT=<port of a TCPStore this script hosts> TORCHELASTIC_USE_AGENT_STORE=True
OMP_NUM_THREADS=1 (and AMP_TEST_FLIP_BIT=1 with --flip):
    WORKER zero_parity WORKDIR key=value ...
The keys: every key of the scenario config (BASE below, overridden by SCENARIOS[name]) and
steps=, batch=, in=, hidden=, out=, world= (W), phase= (all, first or second). The config keys:
    optim=adamw|sgd, lr=, weight_decay=, momentum= (sgd; "none" otherwise): the optimizer-wide
        options (ZeroRedundancyOptimizer's **defaults); fused=1: built with fused=True (amp's
        FusedAdamW/FusedSGD), fused=0: with foreach=False, the per-parameter loop (amp::optim::AdamW,
        LibTorch's SGD).
    bucket_view=0|1: parameters_as_bucket_view.
    groups=0|1: 0, one group of model.parameters(); 1, group 0 = fc1.weight, fc1.bias, fc2.weight,
        fc2.bias with the optimizer-wide options, group 1 = fc3.weight, fc3.bias with
        lr=group1_lr and weight_decay=group1_weight_decay given explicitly; side.* joins at step
        add_group_at with lr=side_lr only. ("none" where unused.)
    frozen=none|<param name>: that parameter's requires_grad is false (set before DDP is built);
        it stays in the optimizer.
    autocast=none|bf16; init_scale=, growth_interval=: GradScaler("cpu", init_scale=..,
        growth_interval=..), other options default.
    inf_at=none|R:K: rank R's input x[K][0][0] is +inf (already in the file; for information).
    bucket_cap_mb=: DDP's bucket_cap_mb. reshard=0|1: the scenario runs as phases first, second.
    ckpt=own|swapped: phase second resumes from its own language's checkpoint, or from the other
        language's (amp from this script's torch_ckpt.pt, read with amp::load_pickled and loaded
        with amp::load_state_dict / load_optimizer_state_dict; this script from the
        amp_python_ckpt.pt rank 0 of the worker's phase first writes with amp::save_pickled: the
        same dict, {"model", "optim": the consolidated state_dict(), "scaler"}).

Input files in WORKDIR, raw little-endian, C order:
    rank{r}_{name}.bin   float32 initial value of parameter `name` (fc1.weight, fc1.bias, ...,
                         side.bias) on rank r; phases all and first only (second starts from the
                         checkpoint).
    rank{r}_x.bin        float32 [steps, batch, in], rank r's inputs (phases all and first)
    rank{r}_y.bin        int64 [steps, batch], rank r's targets (phases all and first)
    second_rank{r}_x.bin, second_rank{r}_y.bin   the same for phase second, for its W ranks.
The worker keeps its own checkpoint in WORKDIR/ckpt (phase first writes it, second reads it); this
script's own checkpoint is WORKDIR/torch_ckpt.pt (and, with ckpt=swapped, amp's twin of it
WORKDIR/amp_python_ckpt.pt).

Each step: every model gradient is set to undefined (model.zero_grad(set_to_none=True), so the side
head's gradients do not accumulate while it is outside the optimizer), the forward runs through DDP
(under bf16 CPU autocast if autocast=bf16), loss = cross_entropy(out.float(), y),
scaler.scale(loss).backward(), scaler.step(zero), scaler.update(). In scenario groups the side head
is added with zero.add_param_group({params: [side.weight, side.bias], lr: side_lr}) at the start
of step add_group_at, before its forward.

Output, one "key value" line each on stdout:
    partition <owner rank of each parameter, comma-separated>   every rank, once after the
        optimizer is built (before any load_state_dict); parameters in global order: param groups
        in order, params in order within a group, frozen ones included.
    partition.after_add <the same>   every rank, right after the add_param_group (groups only).
    step{k}.scale <hex>              every rank, after scaler.update() of step k.
    step{k}.params <hex>             every rank, all model parameters concatenated in
        model.parameters() order (fc1.weight, fc1.bias, fc2.*, fc3.*, side.*), after step k.
    Rank 0 only, at the end of each phase, from consolidate_state_dict(to=0) (all ranks) then
    state_dict():
    state.{i}.{key} <hex>            one per tensor of the state of the parameter with global index
        i (exp_avg, exp_avg_sq, step for AdamW; momentum_buffer for SGD); step as the float32 hex
        of its value.
    group{g} <i,j,...>;lr=..;weight_decay=..;<GROUP_KEYS[optim] after those>   one per param
        group: the global indices of its params, then the hyperparameters as Python's repr() of
        the float (shortest round trip: 0.01, 0.999, 1e-08, 0.0).
<hex> is comma-separated 8-digit lowercase hex of each float32's bits (ddp_parity.py's encoding).
Step numbering: phase all runs steps 0..steps-1; first the same; second continues, k = steps ..
2*steps-1 (both phases run `steps` steps). With AMP_TEST_FLIP_BIT=1 the worker flips the lowest bit
of fc1.weight[0][0] on rank 0 right after step 2's update, before printing step 2's lines.
"""
import os
import socket
import struct
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer

from worker_ranks import count_mismatches, run_worker_ranks, write_rank_weights

STEPS, BATCH, IN, HIDDEN, OUT = 6, 16, 64, 64, 10
# IN == HIDDEN: fc1.weight and fc2.weight have the same size, as have fc3/side and fc1/fc2's
# biases, so the partition exercises its tie-breaking (stable sort, lowest rank on equal totals).
BASE = dict(optim="adamw", lr="0.01", weight_decay="0.1", momentum="none", fused="1",
            bucket_view="0", groups="0", group1_lr="none", group1_weight_decay="none",
            side_lr="none", add_group_at="none", frozen="none", autocast="none",
            init_scale=str(2.0 ** 16), growth_interval="2", inf_at="none",
            bucket_cap_mb="0.004", reshard="0", ckpt="own")
SCENARIOS = {
    # fused=1: the inner optimizer is built with fused=True; fused=0 with foreach=False.
    "adamw_fused": dict(),
    # Python's default AdamW path against amp::optim::AdamW (LibTorch's class, Python's ops).
    "adamw_unfused": dict(fused="0"),
    "sgd_momentum": dict(optim="sgd", lr="0.1", weight_decay="0.0", momentum="0.9", fused="0"),
    # Each rank's parameters live in one flat bucket per rank (params' data are views into it);
    # the broadcast after the step sends whole buckets.
    "bucket_view": dict(bucket_view="1"),
    # Group 0 = fc1.*, fc2.* with the optimizer-wide lr/weight_decay; group 1 = fc3.* with its own
    # lr and weight_decay explicitly 1e-2 (AdamW's own default, which must not be mistaken for
    # "unset" and replaced by the optimizer-wide 0.1); the side head joins at step 2 with only its
    # lr given (weight_decay comes from the optimizer-wide defaults, 0.1). The partition is
    # recomputed over all groups then.
    "groups": dict(groups="1", group1_lr="0.003", group1_weight_decay="0.01", side_lr="0.02",
                   add_group_at="2"),
    # fc1.bias does not require grad but is in the optimizer: it is partitioned (and counted in
    # the sizes) like any other, never updated, never gets state.
    "frozen": dict(frozen="fc1.bias"),
    # Rank 1's input holds an inf at step 3: the all-reduced gradients are non-finite on every
    # rank, so every rank skips the step and backs off the scale.
    "bf16_inf": dict(autocast="bf16", inf_at="1:3"),
    # 3 steps at one world size, consolidate and save, 3 more steps at the other.
    "reshard": dict(reshard="1"),
    # The same, each language resuming from the other's file (torch.save's dict of Python's
    # state_dict()s), under bf16 autocast with an inf after the move; PyTorch resumed from amp's
    # file must also equal PyTorch resumed from its own.
    "reshard_between_languages": dict(reshard="1", ckpt="swapped", autocast="bf16",
                                      inf_at="1:4"),
    # The features together: bucket views rebuilt by an add_param_group, a frozen parameter in
    # a bucket, bf16 autocast with an inf on one rank.
    "together": dict(bucket_view="1", groups="1", group1_lr="0.003", group1_weight_decay="0.01",
                     side_lr="0.02", add_group_at="2", frozen="fc1.bias", autocast="bf16",
                     inf_at="1:4"),
}
# Hyperparameters printed in the group lines, after the param indices, in this order.
GROUP_KEYS = {
    "adamw": [("lr", lambda g: g["lr"]), ("weight_decay", lambda g: g["weight_decay"]),
              ("beta1", lambda g: g["betas"][0]), ("beta2", lambda g: g["betas"][1]),
              ("eps", lambda g: g["eps"])],
    "sgd": [("lr", lambda g: g["lr"]), ("weight_decay", lambda g: g["weight_decay"]),
            ("momentum", lambda g: g["momentum"]), ("dampening", lambda g: g["dampening"])],
}
WORKER_TIMEOUT_S = 120


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(IN, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, HIDDEN)
        self.fc3 = torch.nn.Linear(HIDDEN, OUT)
        self.side = torch.nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        h = torch.relu(self.fc2(torch.relu(self.fc1(x))))
        return self.fc3(h) + self.side(h)


def hexes(t):
    # The float32 bits as unsigned 32-bit hex, element by element; read through an int32 view so
    # that a NaN's payload is kept as stored.
    bits = t.detach().float().reshape(-1).contiguous().view(torch.int32).tolist()
    return ",".join("%08x" % (b & 0xFFFFFFFF) for b in bits)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_raw(path, shape, dtype=torch.float32):
    count = 1
    for n in shape:
        count *= n
    return torch.from_file(path, size=count, dtype=dtype).view(shape)


def phase_steps(config):
    return STEPS // 2 if config["reshard"] == "1" else STEPS


def first_step(config, phase):
    return phase_steps(config) if phase == "second" else 0


def input_prefix(phase):
    return "second_" if phase == "second" else ""


def build_param_groups(model, config):
    if config["groups"] != "1":
        return list(model.parameters())
    return [
        {"params": [model.fc1.weight, model.fc1.bias, model.fc2.weight, model.fc2.bias]},
        {"params": [model.fc3.weight, model.fc3.bias], "lr": float(config["group1_lr"]),
         "weight_decay": float(config["group1_weight_decay"])},
    ]


def build_optimizer(groups, config, sharded):
    kwargs = dict(lr=float(config["lr"]), weight_decay=float(config["weight_decay"]))
    if config["optim"] == "adamw":
        cls = torch.optim.AdamW
    else:
        cls = torch.optim.SGD
        kwargs["momentum"] = float(config["momentum"])
    if config["fused"] == "1":
        kwargs["fused"] = True
    else:
        kwargs["foreach"] = False
    if not sharded:
        return cls(groups, **kwargs)
    return ZeroRedundancyOptimizer(groups, optimizer_class=cls,
                                   parameters_as_bucket_view=config["bucket_view"] == "1",
                                   **kwargs)


def partition_line(zero):
    # ZeRO keeps the owner of each parameter in a private map; the global order is that of
    # state_dict()'s indices.
    owners = zero._param_to_rank
    return ",".join(str(owners[p]) for g in zero.param_groups for p in g["params"])


def state_lines(state_dict, config):
    lines = {}
    for index, entry in state_dict["state"].items():
        if entry is None:
            # ZeroRedundancyOptimizer.load_state_dict leaves None for parameters another rank
            # owns; state_dict() overwrites them with the owners' state. A None left here would
            # be a PyTorch quirk the worker need not copy: made visible, not hidden.
            lines[f"state.{index}"] = "none"
            continue
        for key, value in entry.items():
            if not torch.is_tensor(value):
                value = torch.tensor(float(value))
            lines[f"state.{index}.{key}"] = hexes(value)
    for g, group in enumerate(state_dict["param_groups"]):
        fields = [",".join(str(i) for i in group["params"])]
        fields += [f"{name}={float(get(group))!r}" for name, get in GROUP_KEYS[config["optim"]]]
        lines[f"group{g}"] = ";".join(fields)
    return lines


def checkpoint_path(workdir, sharded):
    return f"{workdir}/torch_ckpt.pt" if sharded else f"{workdir}/torch_ckpt_unsharded.pt"


def torch_rank(rank, world, port, workdir, config, phase, sharded, results):
    """One PyTorch rank of one phase: ZeRO when sharded, else the plain optimizer (same groups)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    steps, start = phase_steps(config), first_step(config, phase)
    model = Net()
    checkpoint = None
    if phase == "second":
        # Each rank reads its own copy: ZeRO's load_state_dict writes into the dict it is given.
        path = checkpoint_path(workdir, sharded)
        if config["ckpt"] == "swapped":
            path = f"{workdir}/amp_python_ckpt.pt"
        checkpoint = torch.load(path, weights_only=config["ckpt"] == "swapped")
        model.load_state_dict(checkpoint["model"])
    else:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(read_raw(f"{workdir}/rank{rank}_{name}.bin", p.shape))
    if config["frozen"] != "none":
        model.get_parameter(config["frozen"]).requires_grad_(False)
    ddp = torch.nn.parallel.DistributedDataParallel(model,
                                                    bucket_cap_mb=float(config["bucket_cap_mb"]))
    opt = build_optimizer(build_param_groups(model, config), config, sharded)
    lines, facts = {}, {}
    if sharded:
        lines["partition"] = partition_line(opt)
        facts["amp_scaling_hook"] = getattr(opt, "_step_supports_amp_scaling", False)
        if opt.parameters_as_bucket_view:
            facts["zero_buckets"] = [b.numel() for b in opt._buckets[0]]
            # Every trainable parameter of the optimizer (the side head of `groups` joins later)
            # must now be a view into its owner's bucket.
            storages = {b.untyped_storage().data_ptr() for b in opt._buckets[0]}
            facts["params_in_buckets"] = all(p.untyped_storage().data_ptr() in storages
                                             for g in opt.param_groups for p in g["params"]
                                             if p.requires_grad)
    scaler = torch.amp.GradScaler("cpu", init_scale=float(config["init_scale"]),
                                  growth_interval=int(config["growth_interval"]))
    if checkpoint is not None:
        opt.load_state_dict(checkpoint["optim"])
        scaler.load_state_dict(checkpoint["scaler"])
    prefix = f"{workdir}/{input_prefix(phase)}rank{rank}"
    xs = read_raw(f"{prefix}_x.bin", (steps, BATCH, IN))
    ys = read_raw(f"{prefix}_y.bin", (steps, BATCH), torch.int64)
    bf16 = config["autocast"] == "bf16"
    for i in range(steps):
        k = start + i
        if config["add_group_at"] != "none" and k == int(config["add_group_at"]):
            opt.add_param_group({"params": [model.side.weight, model.side.bias],
                                 "lr": float(config["side_lr"])})
            if sharded:
                lines["partition.after_add"] = partition_line(opt)
        # Through the model, not the optimizer: the side head is outside the optimizer until it
        # is added, and its gradients must not pile up meanwhile.
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = ddp(xs[i])
        loss = F.cross_entropy(out.float(), ys[i])
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        lines[f"step{k}.scale"] = hexes(scaler._scale)
        lines[f"step{k}.params"] = hexes(torch.cat([p.detach().reshape(-1)
                                                    for p in model.parameters()]))
    if sharded:
        opt.consolidate_state_dict(to=0)  # a collective: every rank takes part
    if rank == 0:
        state_dict = opt.state_dict()
        lines.update(state_lines(state_dict, config))
        if phase == "first":
            torch.save({"model": model.state_dict(), "optim": state_dict,
                        "scaler": scaler.state_dict()}, checkpoint_path(workdir, sharded))
    # DDP's buckets after its rebuild (the layout used from the second step on): their sizes in
    # bytes and, per bucket, the indices of their parameters among those requiring grad.
    logging_data = ddp._get_ddp_logging_data()
    facts["ddp_buckets"] = (f"{logging_data.get('rebuilt_bucket_sizes')} (params "
                            f"{logging_data.get('rebuilt_per_bucket_param_indices')})")
    results[rank] = (lines, facts)
    dist.destroy_process_group()


def run_torch(world, workdir, config, phase, sharded):
    results = mp.Manager().dict()
    mp.spawn(torch_rank, args=(world, free_port(), workdir, config, phase, sharded, results),
             nprocs=world, join=True)
    return [results[r] for r in range(world)]


def check_worker(worker):
    if not (os.path.isfile(worker) and os.access(worker, os.X_OK)):
        sys.exit(f"zero_parity: the worker {worker!r} is not an executable file; build "
                 "amp_distributed_worker (tests/distributed/worker.cpp), or run with "
                 "--reference-only to check the PyTorch side alone")


def amp_ranks(worker, world, workdir, config, phase, flip):
    args = [f"{k}={v}" for k, v in config.items()] + [
        f"steps={phase_steps(config)}", f"batch={BATCH}", f"in={IN}", f"hidden={HIDDEN}",
        f"out={OUT}", f"world={world}", f"phase={phase}"]
    return run_worker_ranks(worker, ["zero_parity", workdir] + args, world, f"{phase}_", flip,
                            WORKER_TIMEOUT_S)


def write_inputs(workdir, phases, config):
    """Weights for the first phase's ranks, batches for every phase's ranks."""
    gen = torch.Generator().manual_seed(20261205)
    write_rank_weights(workdir, Net(), phases[0][1], gen)
    steps = phase_steps(config)
    for phase, world in phases:
        start = first_step(config, phase)
        for rank in range(world):
            x = torch.randn(steps, BATCH, IN, generator=gen) * (1 + rank)
            if config["inf_at"] != "none":
                inf_rank, inf_step = map(int, config["inf_at"].split(":"))
                if rank == inf_rank and start <= inf_step < start + steps:
                    x[inf_step - start, 0, 0] = float("inf")
            x.numpy().tofile(f"{workdir}/{input_prefix(phase)}rank{rank}_x.bin")
            torch.randint(OUT, (steps, BATCH), generator=gen).numpy().tofile(
                f"{workdir}/{input_prefix(phase)}rank{rank}_y.bin")


def to_float(hex_word):
    return struct.unpack(">f", bytes.fromhex(hex_word))[0]


def sanity(lines, facts, config, phase, world):
    """The ranks agree, and the scenario exercises what it claims; returns failures."""
    failures = 0
    per_rank_keys = [k for k in lines[0] if not k.startswith(("state.", "group"))]
    if any(r.get(k) != lines[0][k] for r in lines[1:] for k in per_rank_keys):
        print(f"  the PyTorch ranks themselves differ ({world} ranks, phase {phase})")
        failures += 1
    start, steps = first_step(config, phase), phase_steps(config)
    if config["inf_at"] != "none":
        s = int(config["inf_at"].split(":")[1])
        if start < s < start + steps:
            skipped = lines[0][f"step{s}.params"] == lines[0][f"step{s - 1}.params"]
            halved = (to_float(lines[0][f"step{s}.scale"])
                      == 0.5 * to_float(lines[0][f"step{s - 1}.scale"]))
            if not (skipped and halved):
                print(f"  step {s} was not skipped with the scale halved: the inf did not bite")
                failures += 1
    if config["add_group_at"] != "none" and "partition" in lines[0]:
        if "partition.after_add" not in lines[0] or "group2" not in lines[0]:
            print("  no add_param_group seen")
            failures += 1
    if config["frozen"] != "none":
        index = [name for name, _ in Net().named_parameters()].index(config["frozen"])
        if any(k.startswith(f"state.{index}.") for k in lines[0]):
            print(f"  the frozen {config['frozen']} has optimizer state")
            failures += 1
    if config["bucket_view"] == "1" and "params_in_buckets" in facts[0]:
        if not all(f["params_in_buckets"] for f in facts):
            print("  parameters_as_bucket_view: some parameter is not a view into a bucket")
            failures += 1
    if "partition" in lines[0] and len(set(lines[0]["partition"].split(","))) < 2:
        print("  a trivial partition: one rank owns everything")
        failures += 1
    return failures


def summary(world, phase, lines, facts, compared, failures):
    scales = [to_float(lines[0][k]) for k in lines[0] if k.endswith(".scale")]
    extra = f", ZeRO buckets {facts[0]['zero_buckets']}" if "zero_buckets" in facts[0] else ""
    after = (f", after add {lines[0]['partition.after_add']}"
             if "partition.after_add" in lines[0] else "")
    print(f"{world} ranks, phase {phase}: partition {lines[0].get('partition')}{after}; "
          f"scales {scales}; DDP buckets (bytes) {facts[0]['ddp_buckets']}{extra}; "
          f"{compared} lines compared, {failures} mismatches")


def cases(config):
    """(directory name, [(phase, world), ...]) for each run of a scenario."""
    if config["reshard"] == "1":
        return [("2to3", [("first", 2), ("second", 3)]), ("3to2", [("first", 3), ("second", 2)])]
    return [("2", [("all", 2)]), ("3", [("all", 3)])]


def run_scenario(scenario, workdir, worker, flip):
    config = dict(BASE, **SCENARIOS[scenario])
    total = 0
    for name, phases in cases(config):
        casedir = f"{workdir}/{name}"
        os.makedirs(casedir, exist_ok=True)
        write_inputs(casedir, phases, config)
        for phase, world in phases:
            zero = run_torch(world, casedir, config, phase, sharded=True)
            lines, facts = [z[0] for z in zero], [z[1] for z in zero]
            failures = sanity(lines, facts, config, phase, world)
            if worker is None:
                # The unsharded twin: the same DDP run with the plain optimizer. Its lines lack
                # the partitions; everything else must be equal.
                plain = [p[0] for p in run_torch(world, casedir, config, phase, sharded=False)]
                failures += sanity(plain, [p[1] for p in zero], config, phase, world)
                failures += count_mismatches(("ZeRO", "unsharded"), plain, lines, world)
                compared = sum(len(p) for p in plain)
                if facts[0]["amp_scaling_hook"]:
                    print("  GradScaler sees _step_supports_amp_scaling on ZeRO")
                    failures += 1
            else:
                got = amp_ranks(worker, world, casedir, config, phase, flip)
                failures += count_mismatches(("amp", "ZeRO"), lines, got, world)
                compared = sum(len(z) for z in lines)
                if phase == "second" and config["ckpt"] == "swapped":
                    # Resuming from amp's file gives what resuming from PyTorch's own gives.
                    own = run_torch(world, casedir, dict(config, ckpt="own"), phase, True)
                    failures += count_mismatches(("ZeRO from amp's file", "ZeRO from its own"),
                                                 [o[0] for o in own], lines, world)
                    compared += sum(len(o[0]) for o in own)
            summary(world, phase, lines, facts, compared, failures)
            total += failures
    print(f"scenario {scenario}: {total} mismatches")
    return total


def main():
    reference_only = "--reference-only" in sys.argv[1:]
    flip = "--flip" in sys.argv[1:]
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if reference_only:
        if len(args) != 2:
            sys.exit(__doc__)
        worker, (workdir, scenario) = None, args
    else:
        if len(args) != 3:
            sys.exit(__doc__)
        worker, workdir, scenario = args
        check_worker(worker)
    names = list(SCENARIOS) if reference_only and scenario == "all" else [scenario]
    if any(n not in SCENARIOS for n in names):
        sys.exit(f"unknown scenario {scenario}; one of {', '.join(SCENARIOS)}")
    total = sum(run_scenario(n, f"{workdir}/{n}", worker, flip) for n in names)
    if flip:
        # The flipped bit must be seen, on rank 0 at least.
        sys.exit(0 if total > 0 else 1)
    sys.exit(1 if total else 0)


if __name__ == "__main__":
    main()
