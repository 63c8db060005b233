"""Differential, stateful fuzzer of amp::GradScaler against Python's torch.amp.GradScaler.

Random sequences of public API calls (scale + backward with finite, inf or NaN gradients on
random parameters, unscale_, clipping, step with five optimizers, update with and without a new
scale, every setter, state_dict round trips, files written by one side and loaded by the other,
loads of arbitrary dicts, calls in the wrong order, disabled scalers) run in amp (the C++ runner,
runner.cpp, one process for the whole run) and here, with the venv's torch as the oracle. After
every call both must have thrown or neither (amp may also refuse where a deliberate difference,
docs/PYTHON-PARITY.md, says it does, which is then predicted here), error messages must carry
Python's words, and the whole state must be equal bit for bit: scale, tracker, options, every
parameter, gradient and optimizer state tensor. The runner also checks after every call that the
state reached reloads (state_dict and file) into a fresh scaler. Scalers using amp's extensions
(hysteresis, bounds, counters) run against ExtGradScaler below, a transcription of the rule
documented in docs/GUIDE.md on top of torch.amp's GradScaler.

A failing sequence is shrunk to a short reproducer (the runner's own protocol, one call per
line), printed, and written to --findings; committed under regressions/, it is replayed first
by every run.

Usage: difffuzz.py --runner PATH [--seed N] [--sequences N | --seconds S] [--regressions DIR]
                   [--findings DIR] [--summary FILE]
Exit status: 0 when every sequence agreed, 1 when a finding was made.
"""
import argparse
import collections
import ctypes
import math
import os
import random
import subprocess
import sys
import tempfile
import time

import torch
from torch.amp.grad_scaler import _refresh_per_optimizer_state

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
INT64_MAX = 2**63 - 1
SMALLEST_SCALE = 2.0**-126  # amp's back-off floor: float32's smallest normal value
FLOAT32_MAX = 3.4028234663852886e38


def f32(x):
    """x rounded to float32 (overflowing to inf), as a C cast does."""
    return ctypes.c_float(x).value


def hexf(x):
    return float.hex(float(x))


def double_bits(x):
    return "%016x" % ctypes.c_uint64.from_buffer(ctypes.c_double(float(x))).value


def tensor_bits(t):
    if t is None:
        return "none"
    t = t.detach().reshape(-1)
    if t.dtype == torch.float32:
        return ",".join("%08x" % (v & 0xFFFFFFFF) for v in t.view(torch.int32).tolist())
    return ",".join(str(int(v)) for v in t.to(torch.int64).tolist())


def parse_line(line):
    words = line.split()
    return words[0], dict(w.split("=", 1) for w in words[1:])


def number(text):
    """A protocol value: decimal ints, hex floats, inf and nan, as the runner reads them."""
    if "p" in text or text in ("inf", "-inf", "nan"):
        return float.fromhex(text) if "p" in text else float(text)
    return int(text)


def in_bounds(scale, lo, hi, exact=False):
    """amp's bounds check: on float32 values, as the scale is kept and clamped; with `exact` (an
    initial or loaded scale, held unrounded until the first scale()) the value itself too, against
    each bound or its float32 rounding, whichever is wider."""
    inside32 = f32(lo) <= f32(scale) <= f32(hi)
    return inside32 and (not exact or min(lo, f32(lo)) <= scale <= max(hi, f32(hi)))


def storable_scale(x):
    return math.isfinite(x) and x > 0 and math.isfinite(f32(x)) and f32(x) >= SMALLEST_SCALE


class ExtGradScaler(torch.amp.GradScaler):
    """torch.amp's GradScaler with amp's documented extensions: hysteresis (an overflow spends
    one unit of an allowance of `hysteresis`; only an exhausted allowance backs off; the
    allowance refills on growth, or after every clean step when consecutive), min/max bounds
    on a backed-off / grown scale, and counters (steps taken, skipped, consecutive skips). The
    tracker and counters saturate instead of wrapping; a back-off stops at 2^-126."""

    def __init__(self, hysteresis, consecutive, min_scale, max_scale, counters, **kwargs):
        super().__init__("cpu", **kwargs)
        self.hysteresis = hysteresis
        self.consecutive = consecutive
        self.min_scale = min_scale
        self.max_scale = max_scale
        self.remaining = hysteresis
        self.counts = [0, 0, 0] if counters else None

    def update(self, new_scale=None):
        if not self._enabled:
            return
        if new_scale is not None:
            return super().update(new_scale)
        scale, tracker = self._check_scale_growth_tracker("update")
        flags = [f for s in self._per_optimizer_states.values()
                 for f in s["found_inf_per_device"].values()]
        assert len(flags) > 0, "No inf checks were recorded prior to update."
        found = sum(float(f.item()) for f in flags) != 0
        old, count = scale.item(), int(tracker.item())
        left = max(self.remaining - 1 if found else self.remaining, 0)
        back_off = found and left <= 0
        saturated = count == INT32_MAX
        successful = count if saturated else count + 1
        grow = not found and not saturated and successful == self._growth_interval
        new = old
        if back_off:
            new = max(f32(old * self._backoff_factor), SMALLEST_SCALE)
            if self.min_scale > 0:
                new = max(new, f32(self.min_scale))
        elif grow:
            candidate = f32(old * self._growth_factor)
            if math.isfinite(candidate):
                new = min(candidate, f32(self.max_scale)) if self.max_scale < math.inf else candidate
        scale.fill_(new)
        tracker.fill_(0 if (found or grow) else successful)
        refill = (not found) if self.consecutive else grow
        # With hysteresis 1 there is no allowance to keep: it reads 1 throughout.
        self.remaining = self.hysteresis if refill or self.hysteresis == 1 else left
        if self.counts is not None:
            if found:
                self.counts[1] = min(self.counts[1] + 1, INT64_MAX)
                self.counts[2] = min(self.counts[2] + 1, INT64_MAX)
            else:
                self.counts[0] = min(self.counts[0] + 1, INT64_MAX)
                self.counts[2] = 0
        self._per_optimizer_states = collections.defaultdict(_refresh_per_optimizer_state)

    def state_dict(self):
        state = super().state_dict()
        if not self._enabled:
            return state
        state.update({"_amp_format_version": 1, "_amp_hysteresis": self.hysteresis,
                      "_amp_consecutive_hysteresis": self.consecutive,
                      "_amp_min_scale": float(self.min_scale),
                      "_amp_max_scale": float(self.max_scale),
                      "_amp_hysteresis_remaining": self.remaining})
        if self.counts is not None:
            state.update({"_amp_steps_taken": self.counts[0], "_amp_steps_skipped": self.counts[1],
                          "_amp_consecutive_skips": self.counts[2]})
        return state

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if not self._enabled:
            return
        self.hysteresis = int(state.get("_amp_hysteresis", self.hysteresis))
        self.consecutive = bool(state.get("_amp_consecutive_hysteresis", self.consecutive))
        self.min_scale = float(state.get("_amp_min_scale", self.min_scale))
        self.max_scale = float(state.get("_amp_max_scale", self.max_scale))
        self.remaining = int(state.get("_amp_hysteresis_remaining", self.hysteresis))
        if self.hysteresis == 1:
            self.remaining = 1
        if self.counts is not None and "_amp_steps_taken" in state:
            self.counts = [int(state["_amp_steps_taken"]), int(state["_amp_steps_skipped"]),
                           int(state["_amp_consecutive_skips"])]


class LibTorchAdam(torch.optim.Optimizer):
    """LibTorch's torch::optim::Adam, op for op (its exp_avg update is mul_ + add_ where Python's
    Adam uses lerp_, so Python's own Adam differs from it in the last bit)."""

    def __init__(self, params, lr, betas, eps, weight_decay, amsgrad):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                    if group["amsgrad"]:
                        state["max_exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                bias_correction1 = 1 - beta1 ** state["step"]
                bias_correction2 = 1 - beta2 ** state["step"]
                if group["weight_decay"] != 0:
                    grad = grad.add(p, alpha=group["weight_decay"])
                state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                if group["amsgrad"]:
                    torch.maximum(state["max_exp_avg_sq"], state["exp_avg_sq"],
                                  out=state["max_exp_avg_sq"])
                    denom = state["max_exp_avg_sq"].sqrt() / math.sqrt(bias_correction2)
                else:
                    denom = state["exp_avg_sq"].sqrt() / math.sqrt(bias_correction2)
                denom = denom.add_(group["eps"])
                p.addcdiv_(state["exp_avg"], denom, value=-(group["lr"] / bias_correction1))


class StartingBuffersFusedSGD(torch.optim.SGD):
    """torch's fused SGD, run once for the parameters that have a momentum buffer and once for
    those starting one, as amp's FusedSGD does: torch's own raises TypeError ("expected Tensor as
    element 1 in argument 2, but got NoneType") when a parameter's first gradient comes after
    the others' first step (a deliberate difference)."""

    @torch.no_grad()
    def step(self):
        group = self.param_groups[0]
        params = group["params"]
        with_grad = [p for p in params if p.grad is not None]
        has_buffer = [self.state[p].get("momentum_buffer") is not None for p in with_grad]
        if group["momentum"] == 0 or all(has_buffer) or not any(has_buffer):
            return super().step()
        try:
            for keep in (True, False):
                group["params"] = [p for p, b in zip(with_grad, has_buffer) if b == keep]
                super().step()
        finally:
            group["params"] = params


def clip_grad_norm(params, max_norm):
    """Python's clip_grad_norm_(foreach=False) on the parameters that have gradients."""
    with_grads = [p for p in params if p.grad is not None]
    if with_grads:
        torch.nn.utils.clip_grad_norm_(with_grads, max_norm, foreach=False)


class PyRun:
    """One sequence's Python side: the same scaler, parameters and optimizer as the runner's."""

    def __init__(self, w):
        self.enabled = w["enabled"] == "1"
        self.ctor = dict(init_scale=number(w["init_scale"]), growth_factor=number(w["growth_factor"]),
                         backoff_factor=number(w["backoff_factor"]),
                         growth_interval=number(w["growth_interval"]), enabled=self.enabled)
        self.ext = dict(hysteresis=number(w["hysteresis"]), consecutive=w["consecutive"] == "1",
                        min_scale=number(w["min_scale"]), max_scale=number(w["max_scale"]),
                        counters=w["counters"] == "1")
        self.extended = (self.ext["hysteresis"] != 1 or self.ext["consecutive"]
                         or self.ext["min_scale"] > 0 or self.ext["max_scale"] < math.inf
                         or self.ext["counters"])
        self.scaler = self.make_scaler()
        values = [number(v) for v in w["values"].split(",")]
        self.params, at = [], 0
        for size in (int(s) for s in w["sizes"].split(",")):
            self.params.append(torch.tensor(values[at:at + size], dtype=torch.float32,
                                            requires_grad=True))
            at += size
        self.kind = w["opt"]
        lr, wd = number(w["lr"]), number(w["weight_decay"])
        if self.kind in ("sgd", "fused_sgd"):
            cls = StartingBuffersFusedSGD if self.kind == "fused_sgd" else torch.optim.SGD
            self.opt = cls(self.params, lr=lr, momentum=number(w["momentum"]),
                                       dampening=number(w["dampening"]), weight_decay=wd,
                                       nesterov=w["nesterov"] == "1",
                                       **({"fused": True} if self.kind == "fused_sgd"
                                          else {"foreach": False}))
        else:
            betas, eps = (number(w["beta1"]), number(w["beta2"])), number(w["eps"])
            amsgrad = w["amsgrad"] == "1"
            if self.kind == "adam":
                self.opt = LibTorchAdam(self.params, lr, betas, eps, wd, amsgrad)
            else:
                cls = torch.optim.Adam if self.kind == "fused_adam" else torch.optim.AdamW
                self.opt = cls(self.params, lr=lr, betas=betas, eps=eps, weight_decay=wd,
                               amsgrad=amsgrad, fused=True)

    def make_scaler(self):
        if self.extended:
            return ExtGradScaler(self.ext["hysteresis"], self.ext["consecutive"],
                                 self.ext["min_scale"], self.ext["max_scale"],
                                 self.ext["counters"], **self.ctor)
        return torch.amp.GradScaler("cpu", **self.ctor)

    def call(self, op, w):
        s = self.scaler
        if op == "backward":
            mask, coef, loss, at = int(w["mask"]), [number(c) for c in w["coef"].split(",")], None, 0
            for i, p in enumerate(self.params):
                n = p.numel()
                if (mask >> i) & 1:
                    term = (p * torch.tensor(coef[at:at + n], dtype=torch.float32)).sum()
                    loss = term if loss is None else loss + term
                at += n
            s.scale(loss).backward()
        elif op == "unscale":
            s.unscale_(self.opt)
        elif op == "clip":
            clip_grad_norm(self.params, number(w["max_norm"]))
        elif op == "step":
            self.step()
        elif op == "update":
            s.update()
            # amp's deliberate differences on the plain rule: the back-off floor and the
            # saturating tracker (ExtGradScaler applies both itself).
            if self.enabled and not self.extended:
                if s._scale.item() < SMALLEST_SCALE:
                    s._scale.fill_(SMALLEST_SCALE)
                if int(s._growth_tracker.item()) == INT32_MIN:
                    s._growth_tracker.fill_(INT32_MAX)
        elif op == "update_float":
            s.update(number(w["v"]))
        elif op == "update_tensor":
            s.update(torch.tensor(f32(number(w["v"])), dtype=torch.float32))
        elif op == "set_growth_factor":
            s.set_growth_factor(number(w["v"]))
        elif op == "set_backoff_factor":
            s.set_backoff_factor(number(w["v"]))
        elif op == "set_growth_interval":
            s.set_growth_interval(number(w["v"]))
        elif op == "zero_grad":
            self.opt.zero_grad()
        elif op == "roundtrip":
            s.load_state_dict(s.state_dict())
        elif op == "fresh":
            fresh = self.make_scaler()
            fresh.load_state_dict(s.state_dict())
            self.scaler = fresh
        elif op == "save":
            torch.save(s.state_dict(), w["path"] + ".py.pt")
        elif op == "load":
            s.load_state_dict(torch.load(w["path"] + ".amp.pt", weights_only=True))
        elif op == "load_dict":
            s.load_state_dict({k: number(v) for k, v in w.items()})
        else:
            raise ValueError("unknown call " + op)

    def step(self):
        s, fresh_buffers = self.scaler, []
        if self.kind == "fused_sgd":
            fresh_buffers = [p for p in self.params if "momentum_buffer" not in self.opt.state[p]]
        s.step(self.opt)
        # amp's FusedSGD starts a momentum buffer at zeros where Python's fused SGD leaves it
        # uninitialised when that first step is skipped (a deliberate difference).
        if fresh_buffers and self.enabled:
            flags = s._per_optimizer_states[id(self.opt)]["found_inf_per_device"].values()
            if sum(float(f.item()) for f in flags) != 0:
                for p in fresh_buffers:
                    buf = self.opt.state[p].get("momentum_buffer")
                    if buf is not None:
                        buf.zero_()

    def state(self):
        s = self.scaler
        parts = ["scale=" + double_bits(s.get_scale()), "tracker=%d" % s._get_growth_tracker()]
        if self.enabled:
            parts += ["gf=" + double_bits(s.get_growth_factor()),
                      "bf=" + double_bits(s.get_backoff_factor()),
                      "gi=%d" % s.get_growth_interval()]
        if self.extended:
            parts.append("hyst=%d" % (s.remaining if self.enabled else 0))
            if self.ext["counters"]:
                counts = s.counts if self.enabled else [0, 0, 0]
                parts.append("counters=%d,%d,%d" % tuple(counts))
        for i, p in enumerate(self.params):
            parts.append("p%d=%s" % (i, tensor_bits(p)))
            parts.append("g%d=%s" % (i, tensor_bits(p.grad)))
            parts.append("s%d=%s" % (i, self.optimizer_state(p)))
        parts.append("reload=ok")
        return " ".join(parts)

    def optimizer_state(self, p):
        state = self.opt.state.get(p)
        if not state:
            return "none"
        if self.kind in ("sgd", "fused_sgd"):
            return tensor_bits(state.get("momentum_buffer"))
        step = state["step"]
        step = str(int(step)) if not torch.is_tensor(step) else tensor_bits(step)
        return "/".join([step, tensor_bits(state["exp_avg"]), tensor_bits(state["exp_avg_sq"]),
                         tensor_bits(state.get("max_exp_avg_sq"))])


def deliberate_refusal(op, w, run, initialized):
    """Why amp refuses a call Python accepts (docs/PYTHON-PARITY.md), or None."""
    ext = run.scaler if run.extended else None
    if op == "set_growth_factor":
        v = number(w["v"])
        return None if math.isfinite(v) and v > 1 else "growth factor must be finite and > 1"
    if op == "set_backoff_factor":
        v = number(w["v"])
        return None if 0 < v < 1 else "backoff factor must be in (0, 1)"
    if op == "set_growth_interval":
        return None if number(w["v"]) >= 1 else "growth interval must be >= 1"
    if not run.enabled:
        return None
    if op in ("update_float", "update_tensor") and initialized:
        v = number(w["v"]) if op == "update_float" else f32(number(w["v"]))
        if not storable_scale(v):
            return "new_scale must be a normal float32 value"
        if ext is not None and not in_bounds(v, ext.min_scale, ext.max_scale):
            return "new_scale must lie in [min_scale, max_scale]"
        return None
    if op == "load_dict":
        return invalid_state({k: number(v) for k, v in w.items()}, run)
    if op == "load":
        path = w["path"] + ".amp.pt"
        return invalid_state(torch.load(path, weights_only=True), run) if os.path.exists(path) else None
    return None


def invalid_state(d, run):
    """amp's load_state_dict checks (all before any write); None when the dict passes them or
    Python refuses it too (empty dict, missing key)."""
    if not d or any(k not in d for k in ("scale", "growth_factor", "backoff_factor",
                                         "growth_interval", "_growth_tracker")):
        return None
    if d.get("_amp_format_version", 1) > 1:
        return "newer format version"
    if not storable_scale(float(d["scale"])):
        return "scale not a normal float32 value"
    gf, bf = float(d["growth_factor"]), float(d["backoff_factor"])
    if not (math.isfinite(gf) and gf > 1):
        return "growth factor"
    if not 0 < bf < 1:
        return "backoff factor"
    if d["growth_interval"] < 1:
        return "growth interval"
    if not 0 <= d["_growth_tracker"] <= INT32_MAX:
        return "tracker outside [0, 2^31)"
    ext = run.ext if not run.extended else dict(
        hysteresis=run.scaler.hysteresis, min_scale=run.scaler.min_scale,
        max_scale=run.scaler.max_scale, counters=run.ext["counters"])
    hyst = d.get("_amp_hysteresis", ext["hysteresis"])
    lo, hi = float(d.get("_amp_min_scale", ext["min_scale"])), float(d.get("_amp_max_scale", ext["max_scale"]))
    if not (1 <= hyst <= INT32_MAX and math.isfinite(lo) and lo >= 0 and hi > 0 and lo <= hi):
        return "extension options"
    if not in_bounds(float(d["scale"]), lo, hi, exact=True):
        return "scale outside [min_scale, max_scale]"
    if not 0 <= d.get("_amp_hysteresis_remaining", hyst) <= hyst:
        return "hysteresis allowance"
    if ext["counters"] and "_amp_steps_taken" in d:
        c = [d["_amp_steps_taken"], d["_amp_steps_skipped"], d["_amp_consecutive_skips"]]
        if min(c) < 0 or c[2] > c[1]:
            return "counters"
    return None


def words_of(text):
    return " ".join(text.split())


def python_words(exc):
    """The part of Python's message amp repeats: its first sentence."""
    text = words_of(str(exc))
    return text.split(". ")[0].rstrip(".")


class Runner:
    def __init__(self, path):
        self.path = path
        self.start()

    def start(self):
        self.proc = subprocess.Popen([self.path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)

    def send(self, line):
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
        except BrokenPipeError:
            answer = ""
        if not answer:
            code = self.proc.wait()
            self.start()
            return ("crash", "runner exited with status %d" % code, "")
        parts = answer.rstrip("\n").split("\t")
        if parts[0] == "ok":
            return ("ok", "", parts[1])
        return ("err", parts[1], parts[2])

    def close(self):
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.wait()


def run_sequence(runner, lines, workdir, stats=None):
    """Runs the protocol lines on both sides; returns None or (index, what, detail)."""
    run = None
    for index, raw in enumerate(lines):
        line = raw.replace("@", workdir)
        op, w = parse_line(line)
        status, amp_message, amp_state = runner.send(line)
        if status == "crash":
            return (index, "amp crashed", amp_message)
        if op == "new":
            if status != "ok":
                return (index, "runner refused the configuration", amp_message)
            run = PyRun(w)
        else:
            initialized = getattr(run.scaler, "_scale", None) is not None
            expected = deliberate_refusal(op, w, run, initialized)
            py_error = None
            if expected is None:
                try:
                    run.call(op, w)
                except Exception as exc:  # noqa: BLE001 - every Python error is compared
                    py_error = exc
            if stats is not None:
                stats["calls"][op] += 1
                if status == "err":
                    stats["refused"][op] += 1
            if expected is not None and status == "ok":
                return (index, "amp accepted a call its documented checks refuse", expected)
            if expected is None and (status == "err") != (py_error is not None):
                return (index, "only one side threw",
                        "amp: %s | python: %r" % (amp_message or "ok", py_error))
            # Python's own words are owed for the scaler's checks (AssertionError, RuntimeError);
            # a TypeError or AttributeError from inside torch's optimizers is breakage, where
            # amp only has to refuse too.
            if (isinstance(py_error, (AssertionError, RuntimeError))
                    and python_words(py_error) not in words_of(amp_message)):
                return (index, "amp's message lacks Python's words",
                        "amp: %s | python: %s" % (amp_message, python_words(py_error)))
            if expected is not None and stats is not None:
                stats["deliberate"][expected] += 1
            if py_error is not None and not isinstance(py_error, (AssertionError, RuntimeError)):
                # torch broke inside its optimizer (amp refused first, changing nothing), after
                # creating state there: the two sides cannot be compared from here on.
                if stats is not None:
                    stats["deliberate"]["python fails inside torch (%s); sequence ends" %
                                        type(py_error).__name__] += 1
                return None
        py_state = run.state()
        if amp_state != py_state:
            return (index, "states differ", diff_states(amp_state, py_state))
        if stats is not None and op != "new":
            count_events(stats["events"], run)
    return None


def count_events(events, run):
    """The edge states a sequence reached (after a call both sides agreed on)."""
    s = run.scaler
    if not run.enabled or getattr(s, "_scale", None) is None:
        return
    tracker = int(s._growth_tracker.item())
    if tracker == INT32_MAX:
        events["tracker at 2^31-1"] += 1
    if tracker >= s._growth_interval:
        events["tracker at or past growth_interval"] += 1
    if s._scale.item() == SMALLEST_SCALE:
        events["scale at the 2^-126 floor"] += 1
    if run.extended:
        if getattr(s, "counts", None) and INT64_MAX in s.counts:
            events["a counter at 2^63-1"] += 1
        if s.min_scale > 0 and s._scale.item() == f32(s.min_scale):
            events["scale at min_scale"] += 1
        if s._scale.item() == f32(s.max_scale):
            events["scale at max_scale"] += 1


def diff_states(amp_state, py_state):
    a, p = dict(x.split("=", 1) for x in amp_state.split()), dict(x.split("=", 1) for x in py_state.split())
    return "; ".join("%s: amp %s python %s" % (k, a.get(k), p.get(k))
                     for k in sorted(set(a) | set(p)) if a.get(k) != p.get(k))


# ---- generation -----------------------------------------------------------------------------

def f32_value(rng, scale=1.0):
    return f32(rng.gauss(0.0, 1.0) * scale)


class Generator:
    def __init__(self, rng):
        self.rng = rng

    def choice(self, options):
        return self.rng.choice(options)

    def config(self):
        r = self.rng
        extended = r.random() < 0.3
        hysteresis = self.choice([1, 2, 3]) if extended else 1
        consecutive = extended and r.random() < 0.3
        # 0.7 and 1e5 + 0.2 are not float32 values: float32 rounds the first down, the second up.
        min_scale = self.choice([0.0, 1.0, 2.0**-20, 0.7]) if extended else 0.0
        max_scale = self.choice([math.inf, 2.0**20, 2.0**40, 1e5 + 0.2]) if extended else math.inf
        counters = extended and r.random() < 0.6
        init_scale = self.choice([65536.0, 1024.0, 1.0, 2.0**-120, 3.0e38, f32(abs(r.gauss(0, 1e4)) + 1e-3)])
        init_scale = min(max(init_scale, min_scale or init_scale), max_scale)
        kind = self.choice(["sgd", "adam", "fused_sgd", "fused_adam", "fused_adamw"])
        sizes = [r.randint(1, 5) for _ in range(r.randint(1, 3))]
        values = [f32_value(r) for _ in range(sum(sizes))]
        momentum = self.choice([0.0, 0.9])
        dampening = self.choice([0.0, 0.1]) if momentum else 0.0
        nesterov = int(momentum > 0 and dampening == 0 and r.random() < 0.5)
        words = dict(enabled=int(r.random() < 0.9), init_scale=hexf(init_scale),
                     growth_factor=hexf(self.choice([2.0, 1.5, 1.0000001, 1e30])),
                     backoff_factor=hexf(self.choice([0.5, 0.25, 0.9, 1e-10])),
                     growth_interval=self.choice([1, 2, 3, 5, 2000, INT32_MAX, 2**31, 2**40]),
                     hysteresis=hysteresis, consecutive=int(consecutive), min_scale=hexf(min_scale),
                     max_scale=hexf(max_scale), counters=int(counters), opt=kind,
                     lr=hexf(self.choice([0.01, 0.1, 0.0])), weight_decay=hexf(self.choice([0.0, 0.01])),
                     momentum=hexf(momentum), dampening=hexf(dampening), nesterov=nesterov,
                     beta1=hexf(self.choice([0.9, 0.5])), beta2=hexf(self.choice([0.999, 0.9])),
                     eps=hexf(self.choice([1e-8, 1e-3])), amsgrad=int(r.random() < 0.3),
                     sizes=",".join(map(str, sizes)), values=",".join(hexf(v) for v in values))
        return sizes, "new " + " ".join("%s=%s" % kv for kv in words.items())

    def backward(self, sizes):
        r = self.rng
        mask = r.randint(1, 2 ** len(sizes) - 1)
        magnitude = self.choice([1.0, 1.0, 1e3, 1e-3, 1e30])
        coef = [f32_value(r, magnitude) for _ in range(sum(sizes))]
        if r.random() < 0.2:
            coef[r.randrange(len(coef))] = self.choice([math.inf, -math.inf, math.nan])
        return "backward mask=%d coef=%s" % (mask, ",".join(hexf(c) for c in coef))

    def scale_value(self):
        return self.choice([1.0, 4096.0, 2.0**-126, 2.0**20, 0.0, -1.0, math.inf, math.nan,
                            1e-45, 1e39, f32(abs(self.rng.gauss(0, 1e3))), 0.7, f32(0.7),
                            1e5 + 0.2, f32(1e5 + 0.2)])

    def load_dict(self):
        """Mostly a valid state (so that later calls start from it), else any mix of values."""
        r = self.rng
        valid = r.random() < 0.6
        pick = lambda good, bad: self.choice(good if valid else good + bad)  # noqa: E731
        scale = self.choice([64.0, 1024.0, 1.0, 2.0**-126, 2.0**20]) if valid or r.random() < 0.5 \
            else self.scale_value()
        words = dict(scale=scale, growth_factor=pick([2.0, 3.5], [1.0, math.nan]),
                     backoff_factor=pick([0.5, 0.125], [1.0, 0.0]),
                     growth_interval=pick([1, 3, 2000, INT32_MAX, 2**40], [0]),
                     _growth_tracker=pick([0, 1, 2, 5, INT32_MAX - 2, INT32_MAX - 1, INT32_MAX],
                                          [2**31, -1]))
        if r.random() < 0.3:
            words["_amp_hysteresis_remaining"] = pick([0, 1, 2], [5, -1])
        if r.random() < 0.4:
            taken, skipped = self.choice([0, 3, INT64_MAX - 1, INT64_MAX]), self.choice([2, INT64_MAX])
            words.update(_amp_steps_taken=taken, _amp_steps_skipped=skipped,
                         _amp_consecutive_skips=pick([0, 1, skipped], [-1, skipped + 1 if skipped < INT64_MAX else -2]))
        text = []
        for key, value in words.items():
            as_int = isinstance(value, int) or (r.random() < 0.2 and key == "scale"
                                                and math.isfinite(value) and float(value).is_integer()
                                                and abs(value) < 2**53)
            text.append("%s=%s" % (key, int(value) if as_int else hexf(value)))
        return "load_dict " + " ".join(text)

    def call(self, sizes, saves):
        r = self.rng
        kind = r.choices(["iteration", "backward", "unscale", "clip", "step", "update",
                          "update_float", "update_tensor", "set_growth_factor",
                          "set_backoff_factor", "set_growth_interval", "zero_grad", "roundtrip",
                          "fresh", "save", "load", "load_dict"],
                         weights=[30, 8, 4, 3, 5, 5, 2, 2, 1, 1, 2, 3, 1, 1, 2, 4, 3])[0]
        if kind == "iteration":  # a correct iteration, often repeated, to move the state along
            lines = []
            for _ in range(self.choice([1, 1, 3, 8])):
                lines += [self.backward(sizes) for _ in range(self.choice([1, 1, 2]))]
                if r.random() < 0.3:
                    lines.append("unscale")
                    if r.random() < 0.5:
                        lines.append("clip max_norm=%s" % hexf(self.choice([0.1, 1.0, 100.0])))
                lines += ["step", "update", "zero_grad"]
            return lines
        if kind == "backward":
            return [self.backward(sizes)]
        if kind == "clip":
            return ["clip max_norm=%s" % hexf(self.choice([0.1, 1.0, 100.0]))]
        if kind in ("update_float", "update_tensor"):
            return ["%s v=%s" % (kind, hexf(self.scale_value()))]
        if kind == "set_growth_factor":
            return ["set_growth_factor v=%s" % hexf(self.choice([2.0, 1.5, 4.0, 1.0, 0.5, math.nan, math.inf]))]
        if kind == "set_backoff_factor":
            return ["set_backoff_factor v=%s" % hexf(self.choice([0.5, 0.25, 0.75, 1.0, 0.0, -0.5, math.nan]))]
        if kind == "set_growth_interval":
            return ["set_growth_interval v=%d" % self.choice([1, 2, 3, 4, 10, 0, -5, INT32_MAX, 2**40])]
        if kind == "save":
            saves.append(len(saves))
            return ["save path=@/s%d" % saves[-1]]
        if kind == "load":
            return ["load path=@/s%d" % self.choice(saves)] if saves else []
        if kind == "load_dict":
            return [self.load_dict()]
        return [kind]

    def sequence(self):
        sizes, new = self.config()
        lines, saves = [new], []
        target = self.choice([5, 10, 20, 40])
        while len(lines) < target:
            lines += self.call(sizes, saves)
        return lines


# ---- shrinking and the driver ---------------------------------------------------------------

def shrink(runner, lines, finding, workdir):
    """Removes calls while the sequence still fails with the same kind of finding."""
    kind = finding[1]
    lines = lines[:finding[0] + 1]

    def fails(candidate):
        result = run_sequence(runner, candidate, workdir)
        return result is not None and result[1] == kind

    changed = True
    while changed:
        changed = False
        chunk = max(1, (len(lines) - 1) // 2)
        while chunk >= 1:
            i = 1
            while i < len(lines):
                candidate = lines[:i] + lines[i + chunk:]
                if len(candidate) > 1 and fails(candidate):
                    lines, changed = candidate, True
                else:
                    i += chunk
            chunk //= 2
    return lines, run_sequence(runner, lines, workdir)


def replay_regressions(runner, directory, workdir):
    failures = []
    names = sorted(n for n in os.listdir(directory) if n.endswith(".seq")) if directory else []
    for name in names:
        with open(os.path.join(directory, name)) as f:
            lines = [l.strip() for l in f if l.strip() and not l.startswith("#")]
        result = run_sequence(runner, lines, workdir)
        if result is not None:
            failures.append((name, result))
    return len(names), failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runner", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sequences", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument("--regressions", default=os.path.join(os.path.dirname(__file__), "regressions"))
    parser.add_argument("--findings", default="")
    parser.add_argument("--summary", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    runner = Runner(args.runner)
    workdir = tempfile.mkdtemp(prefix="amp_difffuzz_")
    replayed, failures = replay_regressions(runner, args.regressions, workdir)
    for name, (index, what, detail) in failures:
        print("regression %s fails at line %d: %s: %s" % (name, index + 1, what, detail))
    stats = dict(calls=collections.Counter(), refused=collections.Counter(),
                 deliberate=collections.Counter(), events=collections.Counter())
    rng = random.Random(args.seed)
    generator = Generator(rng)
    start, sequences, findings, seen = time.time(), 0, [], set()
    while True:
        if args.sequences and sequences >= args.sequences:
            break
        if args.seconds and time.time() - start >= args.seconds:
            break
        if not args.sequences and not args.seconds:
            break
        lines = generator.sequence()
        sequences += 1
        result = run_sequence(runner, lines, workdir, stats)
        if result is None:
            continue
        small, final = shrink(runner, lines, result, workdir)
        index, what, detail = final or result
        signature = what + "|" + small[-1].split()[0]
        if signature in seen:
            continue
        seen.add(signature)
        findings.append(small)
        print("\nFINDING %d (sequence %d, seed %d): %s at line %d\n  %s" %
              (len(findings), sequences, args.seed, what, index + 1, detail))
        print("reproducer (%d lines; commit under tests/difffuzz/regressions/):" % len(small))
        print("\n".join(small))
        if args.findings:
            os.makedirs(args.findings, exist_ok=True)
            with open(os.path.join(args.findings, "finding-%d.seq" % len(findings)), "w") as f:
                f.write("# %s: %s\n" % (what, detail[:300]))
                f.write("\n".join(small) + "\n")
        if args.sequences:  # the short, fixed-seed run stops at the first finding
            break
    runner.close()
    elapsed = time.time() - start
    total_calls = sum(stats["calls"].values())
    summary = ["difffuzz: seed %d, %d sequences, %d calls in %.1f s (%.1f sequences/s, %.0f calls/s)"
               % (args.seed, sequences, total_calls, elapsed, sequences / max(elapsed, 1e-9),
                  total_calls / max(elapsed, 1e-9)),
               "regressions replayed: %d, failing: %d" % (replayed, len(failures)),
               "findings: %d" % len(findings),
               "calls (refused by both or by amp alone):"]
    for op, count in sorted(stats["calls"].items()):
        summary.append("  %-20s %8d  (%d refused)" % (op, count, stats["refused"][op]))
    summary.append("edge states reached (calls after which they held):")
    for what, count in sorted(stats["events"].items()):
        summary.append("  %-45s %6d" % (what, count))
    summary.append("deliberate refusals (amp refuses, Python accepts):")
    for why, count in sorted(stats["deliberate"].items()):
        summary.append("  %-45s %6d" % (why, count))
    print("\n".join(summary))
    if args.summary:
        with open(args.summary, "w") as f:
            f.write("\n".join(summary) + "\n")
    return 1 if findings or failures else 0


if __name__ == "__main__":
    sys.exit(main())
