"""GradScaler state files as Python's torch.save writes them: seeds for the state_file fuzzer and
fixtures for tests/serialize/state_file.tests.cpp.

    .venv/bin/python tests/fuzz/make_state_file_corpus.py write [DIR]   # (re)writes the seeds
    .venv/bin/python tests/fuzz/make_state_file_corpus.py dump FILE...  # what torch.load reads
    .venv/bin/python tests/fuzz/make_state_file_corpus.py zip FILE       # what zipfile reads

`dump` prints one line per key, "FILE<TAB>KEY<TAB>float|int|bool<TAB>VALUE" (floats as
float.hex(), exact), so the C++ tests compare the reader with torch.load, not with themselves.
`zip` prints one line per entry, "NAME<TAB>DATA_OFFSET<TAB>SIZE<TAB>METHOD<TAB>CRC32" (decimal).
The seed amp_writer.pt comes from amp's C++ GradScaler::save_state_dict (LibTorch's Pickler and
PyTorchStreamWriter), which this script cannot run; the C++ tests write such a file themselves.
The files named by a SHA-1 are inputs the fuzzer found (scripts/fuzz), reduced to a small set
that reaches every code edge the whole fuzzing corpus reached; this script leaves them alone.
"""
import math
import os
import struct
import sys
import warnings
import zipfile

import torch

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "state_file")


def trained_scaler_state():
    """A CPU scaler after skipped and clean steps: a non-default scale and a growth tracker > 0."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_factor=3.0,
                                  backoff_factor=0.25, growth_interval=7)
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([param], lr=0.0)
    for grad in (float("inf"), 1.0, 1.0):
        optimizer.zero_grad()
        scaler.scale(param.sum()).backward()
        param.grad.fill_(grad)
        scaler.step(optimizer)
        scaler.update()
    state = scaler.state_dict()
    assert isinstance(state["scale"], float) and state["_growth_tracker"] == 2, state
    return state


def amp_style_state():
    """The keys amp's GradScaler adds with its extensions, with ints wide enough for LONG1."""
    state = trained_scaler_state()
    state.update({
        "_amp_format_version": 1,
        "_amp_hysteresis": 3,
        "_amp_consecutive_hysteresis": True,
        "_amp_hysteresis_remaining": 2,
        "_amp_min_scale": 1.0,
        "_amp_max_scale": 2.0**24,
        "_amp_steps_taken": 2**40 + 3,          # LONG1, 6 bytes
        "_amp_steps_skipped": 70000,            # BININT
        "_amp_consecutive_skips": 0,
    })
    return state


def seeds():
    """(file name, dict, pickle protocol) of every seed."""
    untrained_int = torch.amp.GradScaler("cpu", init_scale=1024).state_dict()
    assert isinstance(untrained_int["scale"], int), untrained_int
    # Not scaler states, but shapes a state file's pickle may take: one entry (SETITEM instead
    # of MARK ... SETITEMS) and the extremes of the accepted value types.
    extremes = {"int64_min": -2**63, "int64_max": 2**63 - 1, "minus_one": -1, "no": False,
                "nan": math.nan, "inf": -math.inf, "zero": -0.0, "key é": 255}
    return [
        ("py_float_scale_p2.pt", trained_scaler_state(), 2),
        ("py_int_scale_p2.pt", untrained_int, 2),
        ("py_float_scale_p4.pt", trained_scaler_state(), 4),
        ("py_int_scale_p5.pt", untrained_int, 5),
        ("py_amp_keys_p2.pt", amp_style_state(), 2),
        ("py_amp_keys_p5.pt", amp_style_state(), 5),
        ("py_one_entry_p2.pt", {"scale": 65536.0}, 2),
        ("py_extremes_p4.pt", extremes, 4),
    ]


def write(directory):
    os.makedirs(directory, exist_ok=True)
    for name, state, protocol in seeds():
        torch.save(state, os.path.join(directory, name), pickle_protocol=protocol)


def dump(paths):
    for path in paths:
        # torch.load's weights-only unpickler lacks FRAME (protocols 4, 5); these files are ours.
        state = torch.load(path, weights_only=False)
        for key, value in state.items():
            if isinstance(value, bool):
                kind, text = "bool", str(value)
            elif isinstance(value, int):
                kind, text = "int", str(value)
            else:
                kind, text = "float", float(value).hex()
            print(f"{path}\t{key}\t{kind}\t{text}")


def dump_zip(path):
    with open(path, "rb") as f:
        data = f.read()
    for info in zipfile.ZipFile(path).infolist():
        # The data starts after the local header (30 bytes), its name and its own extra field.
        name_length, extra_length = struct.unpack_from("<HH", data, info.header_offset + 26)
        offset = info.header_offset + 30 + name_length + extra_length
        print(f"{info.filename}\t{offset}\t{info.file_size}\t{info.compress_type}\t{info.CRC}")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "write":
        write(sys.argv[2] if len(sys.argv) > 2 else HERE)
    elif len(sys.argv) >= 3 and sys.argv[1] == "dump":
        warnings.filterwarnings("ignore", message="Detected pickle protocol")
        dump(sys.argv[2:])
    elif len(sys.argv) == 3 and sys.argv[1] == "zip":
        dump_zip(sys.argv[2])
    else:
        sys.exit(__doc__)
