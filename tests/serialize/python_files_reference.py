"""Python's side of tests/serialize/python_files.tests.cpp: files Python writes and loads that amp
must read, refuse with a sentence, or read as Python does. One start writes them all.

  write DIR     writes the files below into DIR and prints what Python's own loads make of them,
                as tab-separated rows:
                  load NAME ok|error FIRST-LINE   torch.load(weights_only=True) of each file
                  strict NAME ok|error FIRST-LINE model.load_state_dict(strict=True) of the
                                                  state-dict files into a fresh model whose
                                                  num_batches_tracked is 5
                  KEY DTYPE SHAPE HEX             the model's entries after the last such load

  Files:
    cycle_list.pt      {"w": tensor, "loop": l} with l.append(l)
    cycle_dict.pt      {"w": tensor, "me": d} with d["me"] = d
    cycle_tuple.pt     {"holder": h} with h.append((h,)) (a tuple inside the list it is in)
    bn_plain.pt        a Linear-BatchNorm1d state dict as a plain dict, without num_batches_tracked
    bn_v1.pt           the same as an OrderedDict whose _metadata gives BatchNorm version 1
    bn_v2.pt           the same with the _metadata torch.save writes today (version 2)
    in_plain.pt        a Linear-InstanceNorm1d(track_running_stats=False) state dict, plain, with
                       running statistics (what files from before 0.4 hold)
    keep_vars.pt       the Linear-BatchNorm1d model's state_dict(keep_vars=True): nn.Parameters
    parameter.pt       {"p": nn.Parameter(3 floats), "t": a tensor that does not require grad}
    adamw_lr_tensor.pt AdamW(lr=torch.tensor(0.01), foreach=False)'s state after two steps
    adamw_fused.pt     AdamW(fused=True)'s state after two steps
    sgd.pt             SGD(momentum=0.9)'s state after two steps
    two_storages.pt    {"a": 4 floats, "b": 4 floats}, for the test to damage
"""
import collections
import os
import sys

import torch


def row(key, t):
    t = t.detach().contiguous()
    shape = "x".join(str(d) for d in t.shape)
    return "\t".join([key, str(t.dtype).replace("torch.", ""), shape, t.numpy().tobytes().hex()])


def bn_model():
    torch.manual_seed(5)
    m = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    with torch.no_grad():
        m[1].running_mean.uniform_()
        m[1].running_var.uniform_(1, 2)
        m[1].num_batches_tracked.fill_(7)
    return m


def fresh_bn_model():
    torch.manual_seed(6)
    m = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    with torch.no_grad():
        m[1].num_batches_tracked.fill_(5)
    return m


def first_line(error):
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def optimizer_file(path, make):
    torch.manual_seed(8)
    p = torch.nn.Parameter(torch.randn(4))
    opt = make([p])
    for _ in range(2):
        p.grad = torch.randn(4)
        opt.step()
    torch.save(opt.state_dict(), path)


def write(out):
    def at(name):
        return os.path.join(out, name)

    w = torch.arange(3.0)
    loop = [w]
    loop.append(loop)
    torch.save({"w": w, "loop": loop}, at("cycle_list.pt"))
    me = {"w": w}
    me["me"] = me
    torch.save({"w": w, "me": me}, at("cycle_dict.pt"))
    holder = []
    holder.append((holder,))
    torch.save({"holder": holder}, at("cycle_tuple.pt"))

    sd = bn_model().state_dict()
    del sd["1.num_batches_tracked"]
    torch.save(dict(sd), at("bn_plain.pt"))
    v1 = collections.OrderedDict(sd)
    v1._metadata = collections.OrderedDict(
        [("", {"version": 1}), ("0", {"version": 1}), ("1", {"version": 1})])
    torch.save(v1, at("bn_v1.pt"))
    torch.save(sd, at("bn_v2.pt"))  # sd keeps state_dict()'s own _metadata (BatchNorm: 2)
    torch.manual_seed(5)
    instance = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.InstanceNorm1d(3))
    isd = dict(instance.state_dict())
    isd["1.running_mean"] = torch.zeros(3)
    isd["1.running_var"] = torch.ones(3)
    torch.save(isd, at("in_plain.pt"))
    torch.save(bn_model().state_dict(keep_vars=True), at("keep_vars.pt"))
    torch.save({"p": torch.nn.Parameter(torch.arange(3.0)), "t": torch.ones(2)},
               at("parameter.pt"))

    optimizer_file(at("adamw_lr_tensor.pt"),
                   lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(0.01), foreach=False))
    optimizer_file(at("adamw_fused.pt"), lambda ps: torch.optim.AdamW(ps, lr=0.01, fused=True))
    optimizer_file(at("sgd.pt"), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    torch.save({"a": torch.arange(4.0), "b": torch.arange(4.0)}, at("two_storages.pt"))

    names = ["cycle_list.pt", "cycle_dict.pt", "cycle_tuple.pt", "bn_plain.pt", "bn_v1.pt",
             "bn_v2.pt", "in_plain.pt", "keep_vars.pt", "parameter.pt", "adamw_lr_tensor.pt",
             "adamw_fused.pt", "sgd.pt"]
    for name in names:
        try:
            value = torch.load(at(name), weights_only=True)
            if name == "cycle_list.pt":
                assert value["loop"][1] is value["loop"]
            print("\t".join(["load", name, "ok", ""]))
        except Exception as error:  # noqa: BLE001 - the first line is what is compared
            print("\t".join(["load", name, "error", first_line(error)]))
    model = None
    for name in ["bn_plain.pt", "bn_v1.pt", "bn_v2.pt", "keep_vars.pt"]:
        candidate = fresh_bn_model()
        try:
            candidate.load_state_dict(torch.load(at(name), weights_only=True), strict=True)
            print("\t".join(["strict", name, "ok", ""]))
            if name == "bn_v1.pt":
                model = candidate
        except RuntimeError as error:
            print("\t".join(["strict", name, "error", first_line(error)]))
    torch.manual_seed(6)
    inorm = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.InstanceNorm1d(3))
    try:
        inorm.load_state_dict(torch.load(at("in_plain.pt"), weights_only=True), strict=False)
        print("\t".join(["strict", "in_plain.pt", "ok", ""]))
    except RuntimeError as error:
        text = str(error)
        print("\t".join(["strict", "in_plain.pt", "error",
                         text[text.index("Unexpected running stats"):].split(". ")[0]]))
    for key, value in model.state_dict().items():
        print(row(key, value))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "write":
        raise SystemExit(__doc__)
    write(sys.argv[2])
