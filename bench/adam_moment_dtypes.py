"""Which dtypes Adam's moments need for bf16 weights to keep every update: the 1,000-step case.

4,096 bfloat16 weights at 1.0, AdamW (lr 1e-4, betas (0.9, 0.999), eps 1e-8, no weight decay),
gradient -1 for 1,000 steps: in float32 the weights end at 1.1. Each design of the moments is
emulated with the write-back rounded to bfloat16 by Kahan summation or stochastic rounding, in
PyTorch ops (float32 arithmetic, the moments stored in their dtype after each update):
  - both moments bfloat16 (amp's state_dtype(kBFloat16); torch-optimi's default for bf16 params),
  - bfloat16 first moment, float32 second moment (not offered by amp; measured to decide),
  - both moments float32 (amp's default).
Usage: .venv/bin/python bench/adam_moment_dtypes.py
"""
import torch

STEPS, LR, BETA1, BETA2, EPS, COUNT = 1000, 1e-4, 0.9, 0.999, 1e-8, 4096


def final_mean(write_back, m_dtype, v_dtype):
    p = torch.ones(COUNT, dtype=torch.bfloat16)
    comp = torch.zeros_like(p)
    m = torch.zeros(COUNT, dtype=m_dtype)
    v = torch.zeros(COUNT, dtype=v_dtype)
    g = -torch.ones(COUNT)
    bits_generator = torch.Generator().manual_seed(0)
    for t in range(1, STEPS + 1):
        m = (m.float() * BETA1 + g * (1 - BETA1)).to(m_dtype)
        v = (v.float() * BETA2 + g * g * (1 - BETA2)).to(v_dtype)
        denom = v.float().sqrt() / (1 - BETA2**t) ** 0.5 + EPS
        update = -(m.float() / denom) * (LR / (1 - BETA1**t))
        w = p.float()
        if write_back == "kahan":
            c = (comp.float() + update).bfloat16().float()
            new = (w + c).bfloat16()
            comp = (c + (w - new.float()).bfloat16().float()).bfloat16()
            p = new
        else:  # stochastic rounding: 16 random bits added below the bf16 mantissa, truncated
            bits = torch.randint(0, 1 << 16, (COUNT,), generator=bits_generator, dtype=torch.int32)
            p = (((w + update).view(torch.int32) + bits) >> 16).to(torch.int16).view(torch.bfloat16)
    return p.float().mean().item()


def main():
    designs = [("bf16 / bf16", torch.bfloat16, torch.bfloat16),
               ("bf16 / fp32", torch.bfloat16, torch.float32),
               ("fp32 / fp32", torch.float32, torch.float32)]
    print(f"{'exp_avg / exp_avg_sq':22} {'Kahan':>10} {'SR':>10}   (float32 reaches 1.1; "
          "the bf16 nearest to it is 1.1015625)")
    for name, m_dtype, v_dtype in designs:
        print(f"{name:22} {final_mean('kahan', m_dtype, v_dtype):10.5f} "
              f"{final_mean('sr', m_dtype, v_dtype):10.5f}")


if __name__ == "__main__":
    main()
