"""mnist_ddp started as a two-node job: two torchrun agents on this machine, one process each,
meeting at a c10d rendezvous, as users start jobs on two hosts.

Usage: check_ddp_multinode.py TORCHRUN PROGRAM PROGRAM-ARGS...
Runs `torchrun --nnodes 2 --node-rank K --nproc-per-node 1 --rdzv-backend c10d
--rdzv-endpoint 127.0.0.1:PORT --no-python PROGRAM ...` for K = 0 and 1 at once and checks that
both agents exit 0, that the job had 2 ranks on Gloo, and that both ranks end with the same
parameter fingerprint (bit-identical parameters).
"""
import re
import socket
import subprocess
import sys
import tempfile


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    torchrun, program, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    port = free_port()
    agents = []
    for node in (0, 1):
        command = [torchrun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                   "--rdzv-id", "amp-multinode-test", "--no-python", program] + args
        print("$ " + " ".join(command), flush=True)
        log = tempfile.TemporaryFile("w+")
        agents.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log))
    outputs, failed = [], False
    for node, (agent, log) in enumerate(agents):
        try:
            agent.wait(timeout=240)
        except subprocess.TimeoutExpired:
            for other, _ in agents:
                other.kill()
            sys.exit(f"node {node}'s agent did not finish within 240 s")
        log.seek(0)
        output = log.read()
        outputs.append(output)
        print(f"--- node {node} (exit code {agent.returncode})\n{output}")
        failed |= agent.returncode != 0
    if failed:
        sys.exit("an agent failed")
    everything = "".join(outputs)
    if not re.search(r"mnist_ddp: 2 ranks \(gloo\)", everything):
        sys.exit("rank 0 did not report 2 ranks on gloo")
    prints = re.findall(r"rank ([01]) parameters: fingerprint ([0-9a-f]+)", everything)
    if sorted(rank for rank, _ in prints) != ["0", "1"]:
        sys.exit(f"expected a fingerprint from ranks 0 and 1, found {prints}")
    if prints[0][1] != prints[1][1]:
        sys.exit(f"the two nodes' parameters differ: {prints}")
    print(f"two nodes, one rank each: equal fingerprints {prints[0][1]}")


if __name__ == "__main__":
    main()
