"""mlp_fashion's training loop in Python (PyTorch alone, no amp): the same MLP, data order,
autocast, fused AdamW, clipping, warmup + cosine schedule and epoch lines as main.cpp, with the
checkpoint of `mlp_fashion --checkpoint-format python`. Either program resumes the other's
checkpoint, and both print the same epoch lines and parameter fingerprint.

    python train.py --data DIR [--epochs N] [--batch-size N] [--accumulate N]
                    [--optimizer fused-adamw|adamw] [--lr R] [--weight-decay W]
                    [--warmup-steps N] [--clip NORM] [--seed N]
                    [--precision fp32|bf16|fp16] [--init-scale S]
                    [--checkpoint PATH [--resume]] [--stop-after N]

Supported: the CPU, --precision fp32, bf16 and fp16 (with GradScaler's loss scaling) and fp32
weights; the C++ program's other options keep their defaults, which the checkpoint's settings
record. With --clip below the gradient norm the two programs differ in the last bits:
clip_grad_norm_ rounds the norm and scales the gradients its own way (examples/mlp_fashion/README.md).
"""
import argparse
import gzip
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

EVAL_CHUNK = 2000  # main.cpp's kEvalChunk
CHECKPOINT_FORMAT = 1  # main.cpp's kCheckpointFormat


def read_idx(folder, stem):
    """An IDX file (`stem`, or `stem`.gz) as a uint8 tensor shaped by its header."""
    path = os.path.join(folder, stem)
    if not os.path.exists(path):
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def load_data(folder):
    """Images standardised by the training pixels' mean and std (float64), as main.cpp does."""
    train_images = read_idx(folder, "train-images-idx3-ubyte")
    pixels = train_images.reshape(-1).to(torch.float64).div_(255)
    mean, std = pixels.mean().item(), pixels.std().item()

    def images(raw):
        return raw.reshape(-1, 1, 28, 28).to(torch.float32).div_(255).sub_(mean).div_(std)

    def labels(stem):
        return read_idx(folder, stem).to(torch.int64)

    return ((images(train_images), labels("train-labels-idx1-ubyte")),
            (images(read_idx(folder, "t10k-images-idx3-ubyte")), labels("t10k-labels-idx1-ubyte")))


class Mlp(torch.nn.Module):
    """784-512-256-10 with ReLU; the C++ module's names (hidden1, hidden2, output)."""

    def __init__(self):
        super().__init__()
        self.hidden1 = torch.nn.Linear(784, 512)
        self.hidden2 = torch.nn.Linear(512, 256)
        self.output = torch.nn.Linear(256, 10)

    def forward(self, x):
        x = torch.relu(self.hidden1(x.flatten(1)))
        return self.output(torch.relu(self.hidden2(x)))


class WarmupCosine:
    """main.cpp's schedule: linear warmup to `peak`, then a cosine to 0 over `total` steps."""

    def __init__(self, peak, warmup, total):
        self.peak, self.warmup, self.total, self.step = peak, min(warmup, total), total, 0

    def current(self):
        if self.step < self.warmup:
            return self.peak * (self.step + 1) / self.warmup
        progress = (self.step - self.warmup) / max(1, self.total - self.warmup)
        return 0.5 * self.peak * (1 + math.cos(math.pi * min(progress, 1.0)))


def settings_of(args, train_size):
    """The settings main.cpp records in a checkpoint (resume_keys), with its option names."""
    return {"precision": args.precision, "--optimizer": args.optimizer, "--weights": "fp32",
            "--low-precision": "none", "--state-dtype": "fp32", "--fp8-recipe": "tensorwise",
            "batch-size": args.batch_size, "accumulate": args.accumulate, "lr": args.lr,
            "weight-decay": args.weight_decay, "warmup-steps": args.warmup_steps,
            "clip": args.clip, "seed": args.seed, "training images": train_size}


# The autocast dtype of each --precision; fp32 runs without autocast.
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(precision):
    dtype = AUTOCAST_DTYPES[precision]
    return torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def forward_loss(model, images, labels, precision):
    with autocast(precision):
        logits = model(images)
        return F.cross_entropy(logits, labels)


def scale_text(scale):
    """The loss scale as main.cpp prints a double (fmt's shortest form: 65536, not 65536.0)."""
    return str(int(scale)) if scale.is_integer() and abs(scale) < 1e16 else repr(scale)


def train_epoch(model, opt, scaler, schedule, shuffle, train, args):
    """main.cpp's train_epoch: accumulated micro-batches weighted by their share of the step,
    unscaling and clipping, the schedule's rate, then the step, which the scaler skips when a
    gradient overflowed (fp16). Returns the mean loss, the mean norm and the clipped count over
    the steps taken, and the steps taken and skipped."""
    model.train()
    images, labels = train
    n = labels.shape[0]
    order = torch.randperm(n, generator=shuffle, dtype=torch.int64)
    loss_sum = torch.zeros((), dtype=torch.float64)
    norm_sum = torch.zeros((), dtype=torch.float64)
    clipped = torch.zeros((), dtype=torch.float64)
    steps = skipped = 0
    group_images = args.batch_size * args.accumulate
    for group in range(0, n, group_images):
        group_end = min(group + group_images, n)
        for start in range(group, group_end, args.batch_size):
            end = min(start + args.batch_size, group_end)
            index = order[start:end]
            loss = forward_loss(model, images.index_select(0, index),
                                labels.index_select(0, index), args.precision)
            scaler.scale(loss * ((end - start) / (group_end - group))).backward()
            loss_sum += loss.detach() * (end - start)
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for g in opt.param_groups:
            g["lr"] = schedule.current()
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        steps += 1
        # The scale halves exactly when the scaler skipped the step (an inf or NaN gradient).
        if scaler.is_enabled() and scaler.get_scale() < scale:
            skipped += 1
        else:
            norm_sum += norm
            clipped += norm.gt(args.clip)
        opt.zero_grad()
        schedule.step += 1
    taken = steps - skipped
    return (loss_sum.item() / n, norm_sum.item() / taken if taken else 0.0,
            int(clipped.item()), taken, skipped)


def test_accuracy(model, test, precision):
    model.eval()
    images, labels = test
    correct = torch.zeros((), dtype=torch.int64)
    with torch.no_grad(), autocast(precision):
        for start in range(0, labels.shape[0], EVAL_CHUNK):
            predicted = model(images[start:start + EVAL_CHUNK]).argmax(1)
            correct += predicted.eq(labels[start:start + EVAL_CHUNK]).sum()
    return correct.item() / labels.shape[0]


def fingerprint(model):
    """FNV-1a over each parameter's bytes in turn (examples/common/fingerprint.cpp)."""
    h = 0xcbf29ce484222325
    for p in model.parameters():
        for byte in p.detach().contiguous().view(-1).view(torch.uint8).tolist():
            h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--optimizer", choices=["fused-adamw", "adamw"], default="fused-adamw")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--precision", choices=list(AUTOCAST_DTYPES), default="bf16")
    parser.add_argument("--init-scale", type=float, default=65536.0)
    parser.add_argument("--checkpoint")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--stop-after", type=int)
    args = parser.parse_args()
    if args.resume and not args.checkpoint:
        parser.error("--resume continues from a checkpoint; name it with --checkpoint PATH")

    train, test = load_data(args.data)
    n = train[1].shape[0]
    steps = -(-(-(-n // args.batch_size)) // args.accumulate)
    torch.manual_seed(args.seed)
    model = Mlp()
    # Python's AdamW on the CPU: fused as amp::optim::FusedAdamW, or its default single-tensor
    # path as amp::optim::AdamW.
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                            fused=args.optimizer == "fused-adamw", foreach=False)
    # Enabled for fp16 only, as main.cpp's; a disabled scaler's state dict is empty.
    scaler = torch.amp.GradScaler("cpu", init_scale=args.init_scale,
                                  enabled=args.precision == "fp16")
    schedule = WarmupCosine(args.lr, args.warmup_steps, args.epochs * steps)
    shuffle = torch.Generator().manual_seed(args.seed)
    settings = settings_of(args, n)
    epochs_done = 0
    if args.resume:
        saved = torch.load(args.checkpoint, weights_only=True)
        if saved.get("format") != CHECKPOINT_FORMAT:
            sys.exit(f"the checkpoint '{args.checkpoint}' has format {saved.get('format')}; "
                     f"this train.py reads format {CHECKPOINT_FORMAT} only")
        for key, value in settings.items():
            if saved["settings"].get(key) != value:
                sys.exit(f"the checkpoint '{args.checkpoint}' was written with {key} "
                         f"{saved['settings'].get(key)} but this run has {key} {value}; resume "
                         "with the checkpoint's settings, or start afresh without --resume")
        if saved["schedule"]["total"] != schedule.total:
            sys.exit(f"the checkpoint '{args.checkpoint}' follows a learning-rate schedule of "
                     f"{saved['schedule']['total']} steps but this run's has {schedule.total}")
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        scaler.load_state_dict(saved["scaler"])
        schedule.step = saved["schedule"]["step"]
        shuffle.set_state(saved["shuffle"])
        epochs_done = saved["epoch"]
        print(f"resumed from {args.checkpoint} after epoch {epochs_done}")

    last = min(args.epochs, args.stop_after or args.epochs)
    accuracy = None
    while epochs_done < last:
        loss, norm, clipped, taken, skipped = train_epoch(model, opt, scaler, schedule, shuffle,
                                                          train, args)
        epochs_done += 1
        accuracy = test_accuracy(model, test, args.precision)
        scale_note = (f", loss scale {scale_text(scaler.get_scale())}, skipped steps {skipped} of "
                      f"{taken + skipped}" if scaler.is_enabled() else "")
        if args.checkpoint:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "scaler": scaler.state_dict(),
                        "schedule": {"step": schedule.step, "total": schedule.total},
                        "shuffle": shuffle.get_state(), "epoch": epochs_done,
                        "format": CHECKPOINT_FORMAT, "settings": settings}, args.checkpoint)
        print(f"epoch {epochs_done}/{args.epochs}: mean train loss {loss:.6f}, test accuracy "
              f"{100 * accuracy:.2f}%, grad norm {norm:.4f} (clipped {clipped} of {taken} "
              f"steps), next lr {schedule.current():.6g}{scale_note}, 0.00 s", flush=True)
    if accuracy is None:
        accuracy = test_accuracy(model, test, args.precision)
    if epochs_done < args.epochs:
        print(f"stopped after epoch {epochs_done} of {args.epochs} (--stop-after); continue "
              "with --resume")
    print(f"parameters: fingerprint {fingerprint(model):016x}")
    print(f"done: precision {args.precision}, test accuracy {100 * accuracy:.2f}%")


if __name__ == "__main__":
    main()
