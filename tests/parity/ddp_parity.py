"""Data-parallel parity: PyTorch's DistributedDataParallel against amp's, bit for bit.

Usage: ddp_parity.py WORKER WORKDIR SCENARIO [--flip]
For 2 and then 3 Gloo ranks, a small MLP (fc1 -> relu -> fc2, plus a side head) trains with
torch.amp.GradScaler (growth interval 2) and SGD with momentum, each rank on its own batches and
starting from its own weights (DDP broadcasts rank 0's): here with
torch.nn.parallel.DistributedDataParallel, and with WORKER (amp_distributed_worker's ddp_parity
scenario: amp::distributed::DistributedDataParallel, amp::GradScaler with found_inf_sync) on the
same weights and data, started as torchrun starts ranks. The scale and every parameter after every
step must be equal bit for bit on every rank. With --flip the worker flips one bit of one weight
on rank 0 after step 2, and the run must then report mismatches (the comparison can fail).

A scenario with a move_step K also moves the run between the languages at step K, both ways:
PyTorch's ranks stop after K steps and rank 0 saves {"model": ddp.state_dict(), "optimizer",
"scaler", "step"} with torch.save, and amp's ranks resume from that file; then amp's ranks stop
and save the same dict (amp::save_pickled), and PyTorch's ranks resume from it. Steps K and after
of each resumed run must equal, on every rank, those of PyTorch's ranks resumed from PyTorch's
own file. (Not its uninterrupted run's: at 3 ranks PyTorch's resumed run itself differs from
its uninterrupted run in the last bits of the parameters; the script prints how many lines
agree.)
"""
import os
import socket
import struct
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from worker_ranks import count_mismatches, run_worker_ranks, write_rank_weights

STEPS, BATCH, IN, HIDDEN, OUT = 6, 16, 32, 64, 10
BASE = dict(hook="none", autocast="none", accumulate="1", unused="0", bucket_cap_mb="default",
            init_scale=str(2.0 ** 16), static_graph="0", inf_at="none", bad_value="inf",
            bucket_view="0", batch_norm="0", move_step="none", save="none", resume="none")
SCENARIOS = {
    "plain": dict(init_scale="1024"),
    "fp16_autocast": dict(autocast="fp16"),
    "fp16_hook": dict(hook="fp16", autocast="fp16"),
    "bf16_hook": dict(hook="bf16", autocast="fp16"),
    # Three micro-batches per step, the first two under no_sync().
    "no_sync": dict(accumulate="3", autocast="fp16"),
    # The side head is used on even steps only: find_unused_parameters, and on odd steps its
    # gradients stay None, so momentum SGD leaves it alone.
    "unused": dict(unused="1"),
    "unused_no_sync": dict(unused="1", accumulate="2", hook="bf16"),
    # Buckets of ~4 KiB: several all-reduces per backward.
    "buckets": dict(bucket_cap_mb="0.004", autocast="fp16"),
    # Rank 1's input holds an inf at step 3: every rank skips and backs off.
    "inf_one_rank": dict(autocast="fp16", inf_at="1:3"),
    # The same with the fp16 hook.
    "fp16_hook_inf_one_rank": dict(hook="fp16", autocast="fp16", inf_at="1:3"),
    # Accumulation over 3 micro-batches with a NaN in rank 0's first (no_sync) micro-batch of
    # step 2: it reaches the reduced gradients, and every rank skips.
    "no_sync_nan": dict(accumulate="3", autocast="fp16", inf_at="0:2", bad_value="nan"),
    # Scale 2^24 with float16 transfer: the all-reduced gradients overflow on every rank.
    "fp16_overflow": dict(hook="fp16", init_scale=str(2.0 ** 24)),
    "static_graph": dict(static_graph="1", autocast="fp16"),
    # Gradients as views into the buckets, several buckets.
    "bucket_view": dict(bucket_view="1", bucket_cap_mb="0.004", autocast="fp16"),
    # A BatchNorm1d after fc1: its running statistics are broadcast from rank 0 before every
    # forward (broadcast_buffers), then updated by each rank's own batch; compared every step.
    "buffers": dict(batch_norm="1"),
    # Moved between the languages after step 3 (the scale has grown at steps 1 and 3); rank 1's
    # inf at step 4 makes the resumed runs skip and back off.
    "moved_between_languages": dict(autocast="fp16", inf_at="1:4", move_step="3"),
}


class Net(torch.nn.Module):
    def __init__(self, batch_norm=False):
        super().__init__()
        self.fc1 = torch.nn.Linear(IN, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, OUT)
        self.side = torch.nn.Linear(HIDDEN, OUT)
        self.bn = torch.nn.BatchNorm1d(HIDDEN) if batch_norm else None

    def forward(self, x, use_side):
        h = self.fc1(x)
        h = torch.relu(self.bn(h) if self.bn is not None else h)
        y = self.fc2(h)
        return y + self.side(h) if use_side else y


def hexes(t):
    return ",".join("%08x" % struct.unpack("<I", struct.pack("<f", v))[0]
                    for v in t.detach().float().reshape(-1).tolist())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load(path, like):
    return torch.from_file(path, size=like.numel()).view(like.shape)


def ddp_rank(rank, world, port, workdir, config, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    acc, unused = int(config["accumulate"]), config["unused"] == "1"
    model = Net(config["batch_norm"] == "1")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(load(f"{workdir}/rank{rank}_{name}.bin", p))
    checkpoint = None
    if config["resume"] != "none":
        # Every rank reads the file, and the model loads before DDP wraps it, as a Python loop
        # does; consume_prefix takes off a "module." that a ddp.state_dict() would have.
        checkpoint = torch.load(config["resume"], weights_only=True)
        consume_prefix_in_state_dict_if_present(checkpoint["model"], "module.")
        model.load_state_dict(checkpoint["model"])
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, find_unused_parameters=unused, static_graph=config["static_graph"] == "1",
        gradient_as_bucket_view=config["bucket_view"] == "1",
        bucket_cap_mb=None if config["bucket_cap_mb"] == "default" else float(config["bucket_cap_mb"]))
    if config["hook"] == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif config["hook"] == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    xs = torch.from_file(f"{workdir}/rank{rank}_x.bin", size=STEPS * acc * BATCH * IN).view(
        STEPS, acc, BATCH, IN)
    ys = torch.from_file(f"{workdir}/rank{rank}_y.bin", size=STEPS * acc * BATCH,
                         dtype=torch.int64).view(STEPS, acc, BATCH)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=float(config["init_scale"]), growth_interval=2)
    first = 0
    if checkpoint is not None:
        opt.load_state_dict(checkpoint["optimizer"])
        scaler.load_state_dict(checkpoint["scaler"])
        first = checkpoint["step"]
        assert first == int(config["move_step"]), "the checkpoint is not of move_step"
    lines = []
    for step in range(first, STEPS):
        opt.zero_grad()
        for micro in range(acc):
            def run():
                with torch.autocast("cpu", dtype=torch.float16,
                                    enabled=config["autocast"] == "fp16"):
                    out = ddp(xs[step][micro], not unused or step % 2 == 0)
                loss = F.cross_entropy(out.float(), ys[step][micro]) / acc
                scaler.scale(loss).backward()
            if micro + 1 < acc:
                with ddp.no_sync():
                    run()
            else:
                run()
        scaler.step(opt)
        scaler.update()
        lines.append((f"step{step}.scale", hexes(scaler._scale)))
        lines.append((f"step{step}.params",
                      hexes(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))))
        if model.bn is not None:
            lines.append((f"step{step}.buffers",
                          hexes(torch.cat([b.detach().float().reshape(-1) for b in model.buffers()]))))
        if config["save"] != "none" and step + 1 == int(config["move_step"]):
            if rank == 0:
                torch.save({"model": ddp.state_dict(), "optimizer": opt.state_dict(),
                            "scaler": scaler.state_dict(), "step": step + 1}, config["save"])
            break
    lines.append(("side.weight.grad", "undefined" if model.side.weight.grad is None else "defined"))
    results[rank] = dict(lines)
    dist.destroy_process_group()


def amp_ranks(worker, world, workdir, config, flip, label=""):
    args = [f"{k}={v}" for k, v in config.items()] + [
        f"steps={STEPS}", f"batch={BATCH}", f"in={IN}", f"hidden={HIDDEN}", f"out={OUT}"]
    return run_worker_ranks(worker, ["ddp_parity", workdir] + args, world, label, flip)


def ddp_ranks(world, workdir, config):
    """PyTorch's ranks: each rank's "key value" lines, as a list."""
    results = mp.Manager().dict()
    mp.spawn(ddp_rank, args=(world, free_port(), workdir, config, results), nprocs=world,
             join=True)
    return [results[r] for r in range(world)]


def compare_moves(world, config, flip, worker, workdir, reference):
    """The run moved at move_step, Python to C++ and C++ to Python; returns the mismatches against
    PyTorch's own run resumed from PyTorch's file (the bits a Python user resuming gets)."""
    move = int(config["move_step"])
    from_python, from_cpp = f"{workdir}/moved_from_python.pt", f"{workdir}/moved_from_cpp.pt"
    ddp_ranks(world, workdir, dict(config, save=from_python))
    expected = ddp_ranks(world, workdir, dict(config, resume=from_python))
    amp_resumed = amp_ranks(worker, world, workdir, dict(config, resume=from_python), flip,
                            "resumed_")
    failures = count_mismatches(("amp resumed from Python's file", "DDP resumed"), expected,
                                amp_resumed, world)
    amp_ranks(worker, world, workdir, dict(config, save=from_cpp), flip, "saving_")
    python_resumed = ddp_ranks(world, workdir, dict(config, resume=from_cpp))
    failures += count_mismatches(("DDP resumed from amp's file", "DDP resumed"), expected,
                                 python_resumed, world)
    # Each resumed run printed the steps after the move only, and each of them.
    for lines in expected + amp_resumed + python_resumed:
        if "step0.params" in lines or f"step{move}.params" not in lines:
            print("  a resumed run did not start at the move")
            failures += 1
    unchanged = sum(expected[r][k] == reference[r][k] for r in range(world)
                    for k in expected[r] if k.startswith("step"))
    print(f"{world} ranks, moved after step {move} both ways: {failures} mismatches; PyTorch's "
          f"resumed run equals its uninterrupted one on {unchanged} of "
          f"{sum(k.startswith('step') for r in expected for k in r)} lines")
    return failures


def write_inputs(workdir, world, config):
    acc = int(config["accumulate"])
    gen = torch.Generator().manual_seed(20261204)
    write_rank_weights(workdir, Net(config["batch_norm"] == "1"), world, gen)
    for rank in range(world):
        x = torch.randn(STEPS, acc, BATCH, IN, generator=gen) * (1 + rank)
        if config["inf_at"] != "none":
            inf_rank, inf_step = map(int, config["inf_at"].split(":"))
            if rank == inf_rank:
                x[inf_step, 0, 0, 0] = float(config["bad_value"])
        x.numpy().tofile(f"{workdir}/rank{rank}_x.bin")
        torch.randint(OUT, (STEPS, acc, BATCH), generator=gen).numpy().tofile(
            f"{workdir}/rank{rank}_y.bin")


def compare(world, config, flip, worker, workdir):
    os.makedirs(workdir, exist_ok=True)
    write_inputs(workdir, world, config)
    reference = ddp_ranks(world, workdir, config)
    amp_results = amp_ranks(worker, world, workdir, config, flip)
    failures = count_mismatches(("amp", "DDP"), reference, amp_results, world)
    scales = [struct.unpack(">f", bytes.fromhex(reference[0][f"step{s}.scale"]))[0]
              for s in range(STEPS)]
    print(f"{world} ranks x {STEPS} steps: scales {scales}, side head grad "
          f"{reference[0]['side.weight.grad']}, amp buckets {amp_results[0].get('buckets')}; "
          f"{failures} mismatches")
    # Parameters and scales agree across ranks; buffers need not (each rank's batch updates the
    # running statistics after rank 0's were broadcast).
    shared = [k for k in reference[0] if not k.endswith(".buffers")]
    if any(r[k] != reference[0][k] for r in reference[1:] for k in shared):
        print("  the DDP ranks themselves differ")
        failures += 1
    if config["batch_norm"] == "1" and reference[0]["step5.buffers"] == reference[1]["step5.buffers"]:
        print("  the ranks' running statistics are equal: the scenario does not test the broadcast")
        failures += 1
    if config["move_step"] != "none":
        failures += compare_moves(world, config, flip, worker, workdir, reference)
    return failures, amp_results


def main():
    worker, workdir, scenario = sys.argv[1], sys.argv[2], sys.argv[3]
    flip = "--flip" in sys.argv[4:]
    config = dict(BASE, **SCENARIOS[scenario])
    total = 0
    for world in (2, 3):
        failures, amp_results = compare(world, config, flip, worker, f"{workdir}/{world}")
        total += failures
        if scenario == "buckets" and int(amp_results[0]["buckets"]) < 3:
            print(f"  expected several buckets, amp has {amp_results[0]['buckets']}")
            total += 1
    print(f"scenario {scenario}: {total} mismatches")
    if flip:
        # The flipped bit must be seen, on rank 0 at least.
        sys.exit(0 if total > 0 else 1)
    sys.exit(1 if total else 0)


if __name__ == "__main__":
    main()
