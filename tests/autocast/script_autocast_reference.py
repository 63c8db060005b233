"""Python's side of autocast_script.tests.cpp: a model with a convolution, saved scripted and
traced (torch.jit.save), and eager autocast's bits on the same model for several calls.

  write DIR     writes DIR/scripted.pt, DIR/traced.pt and DIR/inputs.pt (one input per call),
                then prints, for each call under torch.autocast("cpu", bfloat16) on the eager
                model: the output's row and each parameter gradient's row

A row: key, dtype, shape, the tensor's bytes in hex.
"""
import os
import sys
import warnings

import torch

# torch.jit is deprecated in favour of torch.export; LibTorch users still load its files.
warnings.filterwarnings("ignore", category=FutureWarning)

CALLS = 3


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(3, 4, 3)
        self.head = torch.nn.Linear(4 * 6, 5)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1))


def row(key, t):
    shape = "x".join(str(s) for s in t.shape)
    data = t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes().hex()
    print(f"{key}\t{str(t.dtype).removeprefix('torch.')}\t{shape}\t{data}")


def main():
    command, directory = sys.argv[1:]
    assert command == "write"
    torch.manual_seed(4)
    model = ConvNet()
    inputs = [torch.randn(2, 3, 8) for _ in range(CALLS)]
    torch.jit.save(torch.jit.script(model), os.path.join(directory, "scripted.pt"))
    torch.jit.save(torch.jit.trace(model, inputs[0]), os.path.join(directory, "traced.pt"))
    torch.save(inputs, os.path.join(directory, "inputs.pt"))
    for call, x in enumerate(inputs):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        out.float().square().mean().backward()
        row(f"call{call}.out", out)
        for name, p in model.named_parameters():
            row(f"call{call}.grad.{name}", p.grad)


if __name__ == "__main__":
    main()
