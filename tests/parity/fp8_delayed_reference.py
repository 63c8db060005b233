"""Transformer Engine's delayed scaling, transcribed from its published rule (DelayedScaling and
the amax-and-scale update of transformer_engine/common/recipe), on torchao's tensorwise GEMMs:
the Python side of fp8_parity.py's delayed scenarios.

Per layer and operand (input, weight, grad_output): a float32 amax history and scale. A cast
quantises with the current scale, then history[0] = amax(|x|) (NaN ignored), then
  amax  = max(history) ("max") or history[0] ("most_recent")
  history = roll(history, -1); history[0] = 0
  scale = (fp8_max * 2^-margin) / amax   if amax is finite and > 0, else the old scale
  scale = FLT_MAX                        if that is inf
Each operand is cast once per step; the backward reuses the forward's float8 input and weight.
"""
import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FLT_MAX = torch.finfo(torch.float32).max


class DelayedState:
    def __init__(self, history_len, device):
        self.history = torch.zeros(history_len, dtype=torch.float32, device=device)
        self.scale = torch.ones((), dtype=torch.float32, device=device)


def delayed_update(state, fp8_dtype, algo, margin):
    history = state.history
    if algo == "max":
        amax = torch.nan_to_num(history, nan=0.0, posinf=float("inf")).max()
    else:
        amax = history[0].clone()
    history.copy_(torch.roll(history, -1, 0))
    history[0] = 0.0
    target = torch.tensor(torch.finfo(fp8_dtype).max * 2.0 ** -margin, dtype=torch.float32,
                          device=history.device)
    new_scale = target / amax
    new_scale = torch.where(torch.isfinite(amax) & (amax > 0), new_scale, state.scale)
    new_scale = torch.where(torch.isinf(new_scale), torch.full_like(new_scale, FLT_MAX),
                            new_scale)
    state.scale.copy_(new_scale)


def delayed_cast(x, fp8_dtype, state, algo, margin):
    """Returns (float8 data, the scale it was cast with)."""
    scale = state.scale.clone()
    fp8_max = torch.finfo(fp8_dtype).max
    data = (x.to(torch.float32) * scale).clamp(min=-fp8_max, max=fp8_max).to(fp8_dtype)
    amax = torch.nan_to_num(x.abs().to(torch.float32), nan=0.0, posinf=float("inf")).max()
    state.history[0] = amax
    delayed_update(state, fp8_dtype, algo, margin)
    return data, scale


def tensorwise_mm(a, a_scale, b, b_scale, out_dtype, fast_accum):
    """a [M, K] @ b [K, N] with at::_scaled_mm's layouts (a row-major, b column-major)."""
    if not (a.stride(0) > a.stride(1) and a.stride(1) == 1):
        a = a.contiguous()
    if b.stride(0) > b.stride(1) and b.stride(1) == 1:
        b = b.t().contiguous().t()
    return torch._scaled_mm(a, b, scale_a=a_scale.reciprocal(), scale_b=b_scale.reciprocal(),
                            out_dtype=out_dtype, use_fast_accum=fast_accum)


class _DelayedMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, layer):
        ctx.layer = layer
        wt = weight.t()
        x_fp8, x_scale = delayed_cast(x, E4M3, layer.states[0], layer.algo, layer.margin)
        w_fp8, w_scale = delayed_cast(wt, E4M3, layer.states[1], layer.algo, layer.margin)
        x2 = x_fp8.reshape(-1, x.shape[-1])
        out = tensorwise_mm(x2, x_scale, w_fp8, w_scale, x.dtype, True)
        ctx.saved = (x2, x_scale, w_fp8, w_scale)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad_out):
        layer = ctx.layer
        x2, x_scale, w_fp8, w_scale = ctx.saved
        g = grad_out.reshape(-1, grad_out.shape[-1])
        g_fp8, g_scale = delayed_cast(g, layer.grad_dtype, layer.states[2], layer.algo,
                                      layer.margin)
        grad_input = tensorwise_mm(g_fp8, g_scale, w_fp8.t(), w_scale, g.dtype, False)
        grad_weight = tensorwise_mm(g_fp8.t(), g_scale, x2, x_scale, g.dtype, False)
        return grad_input.reshape(*grad_out.shape[:-1], grad_input.shape[-1]), grad_weight, None


class DelayedFloat8Linear(torch.nn.Linear):
    """nn.Linear with delayed-scaling float8 GEMMs; fmt "hybrid" (e5m2 grad_output) or "e4m3"."""

    def __init__(self, linear, history_len=1024, algo="max", margin=0, fmt="hybrid"):
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None,
                         device="meta")
        self.weight, self.bias = linear.weight, linear.bias
        self.algo, self.margin = algo, margin
        self.grad_dtype = E5M2 if fmt == "hybrid" else E4M3
        self.states = [DelayedState(history_len, linear.weight.device) for _ in range(3)]

    def forward(self, x):
        out = _DelayedMatmul.apply(x, self.weight, self)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out
