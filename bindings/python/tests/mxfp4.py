"""MXFP4 (gpt-oss) quantisation in torch for test checkpoints: e2m1 values with one e8m0 scale per
32 weights, packed two per byte (element 2j in the low nibble), as the checkpoints store them."""
import torch

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def mxfp4_quantise(w):
    """w [E, N, K] -> (blocks [E, N, K/32, 16] uint8, scales [E, N, K/32] uint8, dequantised [E, N, K]
    float32). The scale is the smallest power of two that brings the block's largest magnitude to at
    most 6; values round to the nearest e2m1 magnitude."""
    e_, n_, k_ = w.shape
    blocks = w.float().reshape(e_, n_, k_ // 32, 32)
    amax = blocks.abs().amax(-1).clamp(min=2.0 ** -120)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = blocks / torch.pow(2.0, exp)[..., None]
    lut = torch.tensor(E2M1, device=w.device)
    idx = (scaled.abs()[..., None] - lut).abs().argmin(-1)
    neg = (scaled < 0) & (idx > 0)
    codes = (idx | (neg.long() << 3)).to(torch.uint8)
    sign = torch.where(neg, torch.full_like(scaled, -1.0), torch.ones_like(scaled))
    deq = lut[idx] * sign * torch.pow(2.0, exp)[..., None]
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.contiguous(), (exp + 127).to(torch.uint8).contiguous(), deq.reshape(e_, n_, k_)
