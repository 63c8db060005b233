"""The arithmetic of amp's optimizer step engine, in PyTorch ops (the reference).

amp::optim's FusedAdam/FusedAdamW/FusedSGD with master_weights, kahan_summation,
stochastic_rounding or state_dtype, and FusedLion, update bfloat16/float16 parameters with
PyTorch's Adam, AdamW and SGD arithmetic (Lion's as the lion-pytorch package computes it, with
fused multiply-adds where ATen fuses) in float32, one rounding per operation, and write the
result back:
  round to nearest     param = round(param + u)
  master weights       master = master + u (float32); param = round(master)
  Kahan summation      comp = round(comp + u); new = round(param + comp);
                       comp = round(comp + round(param - new)); param = new   (optimi's order)
  stochastic rounding  param = the top 16 bits of (float32 bits of param + u) + 16 random bits
where u is the update and round() rounds to the parameter's dtype. Every arithmetic operation
goes through add/sub/mul/div/sqrt below: computed in float64 from float32 operands and rounded to
float32, which is the correctly rounded float32 result (float64 has more than twice float32's
precision), exactly what amp's kernel computes per element. PyTorch's own float32 kernels are not
used for arithmetic: its vectorised sqrt is not always correctly rounded (seen: 1 ulp off).
`LowPrecisionOptimizer` is a torch.optim.Optimizer with `_step_supports_amp_scaling`, so
torch.amp.GradScaler hands it the scale and the inf flag as it hands them to fused optimizers.
"""
import math

import numpy as np
import torch

MASK64 = (1 << 64) - 1


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def _mix32(x):
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def rounding_bits(seed, stream, step, count):
    """The 16 random bits (as uint32) of elements 0..count-1 of the parameter at position `stream`
    on step `step` (the count after the increment)."""
    key = _splitmix64(_splitmix64(_splitmix64(seed & MASK64) ^ stream) ^ step)
    index = np.arange(count, dtype=np.uint32)
    with np.errstate(over="ignore"):
        return _mix32(_mix32(index ^ np.uint32(key & 0xFFFFFFFF)) + np.uint32(key >> 32)) >> np.uint32(16)


def stochastic_round_bf16(value, bits):
    """float32 tensor -> bfloat16 tensor: add `bits` (uint32 array) to the low half, truncate."""
    raw = value.contiguous().cpu().numpy().view(np.uint32).reshape(-1).astype(np.uint64) + bits
    top = (raw >> np.uint64(16)).astype(np.uint16)
    rounded = torch.from_numpy(top.view(np.int16).copy()).view(torch.bfloat16)
    return rounded.reshape(value.shape).to(value.device)


def k(value, like):
    """The float32 constant `value` (a Python float, rounded once) shaped like `like`."""
    return torch.full_like(like, value, dtype=torch.float32)


# float32 arithmetic, one correct rounding per operation.
def add(a, b):
    return (a.double() + b.double()).float()


def sub(a, b):
    return (a.double() - b.double()).float()


def mul(a, b):
    return (a.double() * b.double()).float()


def div(a, b):
    return (a.double() / b.double()).float()


def sqrt(a):
    return a.double().sqrt().float()


def fma(a, b, c):
    """float32 a * b + c with one rounding: the product is exact in float64, the sum's error is
    recovered exactly (TwoSum) and folded in by rounding to odd, after which the rounding to
    float32 is the correctly rounded fused result."""
    p = a.double() * b.double()
    c = c.double()
    s = p + c
    bp = s - p
    e = (p - (s - bp)) + (c - bp)
    odd = (s.view(torch.int64) & 1) == 1
    toward = torch.where(e > 0, torch.full_like(s, math.inf), torch.full_like(s, -math.inf))
    s = torch.where((e != 0) & ~odd, torch.nextafter(s, toward), s)
    return s.float()


class LowPrecisionOptimizer(torch.optim.Optimizer):
    """kind: "adam", "adamw", "sgd" or "lion"; mode: "nearest", "master", "kahan" or "sr";
    state_dtype: the moments' dtype. `mutate` (a test of the test) drops one operation of the
    Kahan update."""

    _step_supports_amp_scaling = True

    def __init__(self, params, kind, mode, state_dtype, lr, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, amsgrad=False, momentum=0.0, dampening=0.0, nesterov=False,
                 maximize=False, seed=0, mutate=False):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        momentum=momentum, dampening=dampening, nesterov=nesterov,
                        maximize=maximize)
        super().__init__(params, defaults)
        self.kind, self.mode, self.state_dtype = kind, mode, state_dtype
        self.seed, self.mutate = seed, mutate
        self.positions = {}
        for group in self.param_groups:
            for p in group["params"]:
                self.positions[p] = len(self.positions)

    @torch.no_grad()
    def step(self):
        scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        work = [(p, g) for g in self.param_groups for p in g["params"] if p.grad is not None]
        # State exists from the first step on, skipped or not; a momentum buffer created by a
        # skipped step stays zero and counts as started (amp's documented FusedSGD behaviour).
        for p, group in work:
            self._state(p, group)
        if found_inf is not None and found_inf.item() != 0:
            for p, _ in work:
                self.state[p].pop("first", None)
            return
        for p, group in work:
            self._update(p, group, scale)

    def _state(self, p, group):
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            zeros = lambda: torch.zeros(p.shape, dtype=self.state_dtype, device=p.device)  # noqa: E731
            if self.kind == "sgd":
                if group["momentum"] != 0:
                    state["momentum_buffer"] = zeros()
                    state["first"] = True
            elif self.kind == "lion":
                state["exp_avg"] = zeros()
            else:
                state["exp_avg"], state["exp_avg_sq"] = zeros(), zeros()
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = zeros()
            if self.mode == "master":
                state["master_weight"] = p.detach().float().clone()
            if self.mode == "kahan":
                state["kahan_comp"] = torch.zeros_like(p)
        return state

    def _update(self, p, group, scale):
        state = self._state(p, group)
        state["step"] += 1
        count = state["step"].item()
        g = p.grad.float()
        if scale is not None:
            g = div(g, k(scale.item(), g))
            p.grad.copy_(g.to(p.dtype))
        if group["maximize"]:
            g = -g
        w = state["master_weight"] if self.mode == "master" else p.float()
        if self.kind == "sgd":
            u = self._sgd(state, group, g, w)
        elif self.kind == "lion":
            new = self._lion(state, group, g, w)
            if p.dtype == torch.float32 and self.mode == "nearest":
                p.copy_(new)  # a float32 parameter takes lion-pytorch's value itself
                return
            u = sub(new, w)
        else:
            u = self._adam(state, group, g, w, count)
        self._write_back(p, state, w, u, count)

    def _adam(self, state, group, g, w, count):
        beta1, beta2 = group["betas"]
        lr, wd, sd = group["lr"], group["weight_decay"], self.state_dtype
        if self.kind == "adam" and wd != 0:
            g = add(g, mul(w, k(wd, g)))
        state["exp_avg"] = add(mul(state["exp_avg"].float(), k(beta1, g)),
                               mul(g, k(1.0 - beta1, g))).to(sd)
        state["exp_avg_sq"] = add(mul(state["exp_avg_sq"].float(), k(beta2, g)),
                                  mul(mul(g, g), k(1.0 - beta2, g))).to(sd)
        v = state["exp_avg_sq"].float()
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = torch.maximum(state["max_exp_avg_sq"].float(), v).to(sd)
            v = state["max_exp_avg_sq"].float()
        step_size = lr / (1.0 - math.pow(beta1, count))
        bias_correction2_sqrt = math.sqrt(1.0 - math.pow(beta2, count))
        denom = add(div(sqrt(v), k(bias_correction2_sqrt, g)), k(group["eps"], g))
        delta = mul(div(state["exp_avg"].float(), denom), k(step_size, g))
        if self.kind == "adamw" and wd != 0:
            delta = add(delta, mul(w, k(lr * wd, g)))
        return -delta

    def _lion(self, state, group, g, w):
        """The parameter's next value, as lion-pytorch's update_fn computes it on ATen (whose
        x.add(y, alpha=a) is fma(y, a, x)); sign(NaN) is 0, as torch.sgn gives."""
        beta1, beta2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        m = state["exp_avg"].float()
        direction = torch.sgn(fma(g, k(1.0 - beta1, g), mul(m, k(beta1, g))))
        new = fma(direction, k(-lr, g), mul(w, k(1.0 - lr * wd, g)))
        state["exp_avg"] = fma(g, k(1.0 - beta2, g), mul(m, k(beta2, g))).to(self.state_dtype)
        return new

    def _sgd(self, state, group, g, w):
        momentum = group["momentum"]
        if group["weight_decay"] != 0:
            g = add(g, mul(w, k(group["weight_decay"], g)))
        d = g
        if momentum != 0:
            if state.pop("first", False):
                buf = g
            else:
                buf = add(mul(state["momentum_buffer"].float(), k(momentum, g)),
                          mul(g, k(1.0 - group["dampening"], g)))
            state["momentum_buffer"] = buf.to(self.state_dtype)
            b = state["momentum_buffer"].float()
            d = add(g, mul(b, k(momentum, g))) if group["nesterov"] else b
        return -mul(d, k(group["lr"], g))

    def _write_back(self, p, state, w, u, count):
        if self.mode == "master":
            state["master_weight"] = add(w, u)
            p.copy_(state["master_weight"].to(p.dtype))
        elif self.mode == "nearest":
            p.copy_(add(w, u).to(p.dtype))
        elif self.mode == "sr":
            bits = rounding_bits(self.seed, self.positions[p], int(count), p.numel())
            p.copy_(stochastic_round_bf16(add(w, u), bits))
        else:
            comp = add(state["kahan_comp"].float(), u).to(p.dtype)
            new = add(w, comp.float()).to(p.dtype)
            if self.mutate:  # drops the lost low-order part: plain rounding with extra steps
                state["kahan_comp"] = torch.zeros_like(comp)
            else:
                lost = sub(w, new.float()).to(p.dtype)
                state["kahan_comp"] = add(comp.float(), lost.float()).to(p.dtype)
            p.copy_(new)
