"""Reports one scenario of a parity batch (run_batch.py): prints what it printed and exits with
its code (0 identical, 1 mismatch, 77 skipped). No torch import: milliseconds.

Usage: scenario_result.py WORKDIR
"""
import os
import sys

path = os.path.join(sys.argv[1], "result.txt")
if not os.path.exists(path):
    print(f"{path} is missing: the suite's batch test did not run this scenario")
    sys.exit(1)
with open(path) as f:
    code = int(f.readline())
    sys.stdout.write(f.read())
sys.exit(code)
