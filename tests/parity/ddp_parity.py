"""Data-parallel parity: PyTorch's DistributedDataParallel against amp::distributed, bit for bit.

Usage: ddp_parity.py WORKER WORKDIR COMM
Two ranks train Linear(32, 10) under fp16 CPU autocast with a GradScaler (initial scale 2^20,
growth interval 2) and SGD, each on its own batches, for 8 steps: here with
torch.nn.parallel.DistributedDataParallel on Gloo (COMM "fp16"/"bf16": DDP's fp16/bf16
compression hook), and with WORKER (amp_distributed_worker's ddp_parity scenario: amp's
GradientAllReduce with comm_dtype, GradScaler with found_inf_sync) on the same weights and data,
started as torchrun starts ranks. The scale and the parameters after every step must be equal
bit for bit on every rank (two ranks: each sum has one order, so the results are exact).
"""
import os
import socket
import struct
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

WORLD, STEPS, BATCH, IN, OUT = 2, 8, 16, 32, 10


def hexes(t):
    return ",".join("%08x" % struct.unpack("<I", struct.pack("<f", v))[0]
                    for v in t.detach().float().reshape(-1).tolist())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_rank(rank, port, workdir, comm, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    model = torch.nn.Linear(IN, OUT)
    with torch.no_grad():
        model.weight.copy_(torch.from_file(f"{workdir}/weight.bin", size=OUT * IN).view(OUT, IN))
        model.bias.copy_(torch.from_file(f"{workdir}/bias.bin", size=OUT))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if comm == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif comm == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    xs = torch.from_file(f"{workdir}/rank{rank}_x.bin", size=STEPS * BATCH * IN).view(STEPS, BATCH, IN)
    ys = torch.from_file(f"{workdir}/rank{rank}_y.bin", size=STEPS * BATCH,
                         dtype=torch.int64).view(STEPS, BATCH)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 20, growth_interval=2)
    lines = []
    for step in range(STEPS):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(ddp(xs[step]), ys[step])
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        lines.append((f"step{step}.scale", hexes(scaler._scale)))
        lines.append((f"step{step}.params", hexes(torch.cat([model.weight.reshape(-1), model.bias]))))
    results[rank] = dict(lines)
    dist.destroy_process_group()


def amp_ranks(worker, workdir, comm):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
                   TORCHELASTIC_USE_AGENT_STORE="True", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([worker, "ddp_parity", workdir, comm], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            sys.exit(f"amp rank {rank} did not finish within 120 s")
        if p.returncode != 0:
            sys.exit(f"amp rank {rank} exited {p.returncode}:\n{out}{err}")
        results.append(dict(line.split(" ", 1) for line in out.splitlines() if " " in line))
    return results


def main():
    worker, workdir, comm = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(workdir, exist_ok=True)
    gen = torch.Generator().manual_seed(20261203)
    (torch.randn(OUT, IN, generator=gen) * 0.2).numpy().tofile(f"{workdir}/weight.bin")
    (torch.randn(OUT, generator=gen) * 0.1).numpy().tofile(f"{workdir}/bias.bin")
    for rank in range(WORLD):
        (torch.randn(STEPS, BATCH, IN, generator=gen) * (1 + rank)).numpy().tofile(
            f"{workdir}/rank{rank}_x.bin")
        torch.randint(OUT, (STEPS, BATCH), generator=gen).numpy().tofile(f"{workdir}/rank{rank}_y.bin")

    results = mp.Manager().dict()
    mp.spawn(ddp_rank, args=(free_port(), workdir, comm, results), nprocs=WORLD, join=True)
    reference = [results[r] for r in range(WORLD)]
    amp_results = amp_ranks(worker, workdir, comm)

    failures = 0
    scales = []
    for rank in range(WORLD):
        for key, expected in reference[rank].items():
            got = amp_results[rank].get(key)
            if got != expected:
                failures += 1
                print(f"rank {rank} {key}: amp {str(got)[:80]} != DDP {expected[:80]}")
        scales = [reference[0][f"step{s}.scale"] for s in range(STEPS)]
    skipped = sum(1 for a, b in zip(scales, scales[1:]) if int(b, 16) < int(a, 16))
    print(f"comm {comm}: {WORLD} ranks x {STEPS} steps, scales {[struct.unpack('<f', bytes.fromhex(s)[::-1])[0] for s in scales]}, "
          f"{skipped} back-offs after the first step; {failures} mismatches")
    if reference[0] != reference[1]:
        print("the DDP ranks themselves differ")
        failures += 1
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
