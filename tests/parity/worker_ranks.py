"""What the data-parallel parity scripts share (ddp_parity.py, zero_parity.py): ranks of
amp_distributed_worker started as torchrun starts them, and each rank's starting weights.

write_rank_weights(workdir, model, world, gen) writes rank{r}_{name}.bin for every parameter: one
random draw per parameter, offset by 0.01 * r on rank r, so that the ranks start from different
weights and the broadcast at construction must make them equal. count_mismatches compares the
ranks' lines with a reference's.

run_worker_ranks(worker, scenario_args, world, label, flip, timeout_s) runs `worker
scenario_args...` as ranks 0..world-1 against a TCPStore hosted here, and returns each rank's
"key value" lines as a dict; a rank that fails or outlives `timeout_s` ends the script with its
error. A worker that does not know the scenario (exit 64 with its usage) is named as such.
"""
import os
import subprocess
import sys

import torch
import torch.distributed as dist


def write_rank_weights(workdir, model, world, gen):
    for name, p in model.named_parameters():
        init = torch.randn(p.shape, generator=gen) * 0.2
        for rank in range(world):
            (init + 0.01 * rank).numpy().tofile(f"{workdir}/rank{rank}_{name}.bin")


def run_worker_ranks(worker, scenario_args, world, label, flip=False, timeout_s=120):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    workdir = scenario_args[1]
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
                   TORCHELASTIC_USE_AGENT_STORE="True", OMP_NUM_THREADS="1")
        if flip:
            env["AMP_TEST_FLIP_BIT"] = "1"
        # Files, not pipes: a rank blocked on a full pipe would stall the others' collectives.
        out = open(f"{workdir}/amp_{label}rank{rank}.out", "w+")
        err = open(f"{workdir}/amp_{label}rank{rank}.err", "w+")
        procs.append((subprocess.Popen([worker] + scenario_args, env=env, stdout=out, stderr=err),
                      out, err))
    results, errors, usage = [], [], False
    for rank, (p, out_file, err_file) in enumerate(procs):
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q, _, _ in procs:
                q.kill()
            sys.exit(f"amp rank {rank} did not finish within {timeout_s} s ({label}{world} ranks)")
        out_file.seek(0)
        err_file.seek(0)
        out, err = out_file.read(), err_file.read()
        if p.returncode != 0:
            # amp_distributed_worker answers a scenario it does not know with its usage and 64.
            usage = usage or (p.returncode == 64 and "usage:" in err)
            errors.append(f"amp rank {rank} exited {p.returncode}: {err[-2000:]}")
        results.append(dict(line.split(" ", 1) for line in out.splitlines() if " " in line))
    if usage:
        sys.exit(f"{worker} has no {scenario_args[0]} scenario (it exited 64 with its usage)")
    if errors:
        sys.exit("\n".join(errors))
    return results


def count_mismatches(label, expected, got, world):
    """Counts the keys of `expected` (one dict per rank) that `got` lacks or differs on, printing
    the first six as "<world> ranks, rank r key: <label[0]> got != <label[1]> expected"."""
    failures = 0
    for rank in range(world):
        for key, value in expected[rank].items():
            other = got[rank].get(key)
            if other != value:
                failures += 1
                if failures <= 6:
                    print(f"  {world} ranks, rank {rank} {key}: {label[0]} {str(other)[:60]} != "
                          f"{label[1]} {value[:60]}")
    return failures
