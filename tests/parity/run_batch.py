"""Runs many scenarios of one parity script in one Python process, so that torch (and torchao)
are imported once per suite instead of once per scenario, and records each scenario's outcome
for its own ctest test (scenario_result.py reads it back).

Usage: run_batch.py SCRIPT DRIVER WORKROOT DEVICE SCENARIO...
Each scenario runs as `SCRIPT`'s main(scenario, DRIVER, WORKROOT/<scenario>, DEVICE) would in a
process of its own; its exit code (0 identical, 1 mismatch, 77 skipped) and everything it
printed land in WORKROOT/<scenario>/result.txt. The batch itself fails only when it cannot run.
"""
import contextlib
import importlib.util
import io
import os
import sys
import traceback


def load(script):
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    spec = importlib.util.spec_from_file_location("parity_script", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_one(module, scenario, driver, workdir, device):
    out = io.StringIO()
    code = 0
    sys.stdout.flush()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            module.main(scenario, driver, workdir, device)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code)
        except Exception:  # a crash of the reference or the comparison fails this scenario only
            traceback.print_exc(file=out)
            code = 1
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "result.txt"), "w") as f:
        f.write(f"{code}\n{out.getvalue()}")
    return code


def main():
    script, driver, root, device, *scenarios = sys.argv[1:]
    module = load(script)
    for scenario in scenarios:
        code = run_one(module, scenario, driver, os.path.join(root, scenario), device)
        print(f"{scenario}: {'identical' if code == 0 else 'skipped' if code == 77 else 'FAILED'}")


if __name__ == "__main__":
    main()
