"""Small edge-case models. Expected costs are derived by hand in each docstring."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class ConvNet(nn.Module):
    """input [2, 3, 16, 16]
    conv1 3->8, k3, pad 1: out [2, 8, 16, 16] = 4,096 elems; MACs = 4,096 * 3 * 9 = 110,592
    bn1 (eval): 4 FLOPs/elem = 16,384; relu 4,096; maxpool 2: out [2, 8, 8, 8] = 1,024 elems, 3 FLOPs each
    conv2 8->16, k3, stride 2, pad 1, groups 2: out [2, 16, 4, 4] = 512; MACs = 512 * 4 * 9 = 18,432
    fc 256->10: MACs = 2 * 256 * 10 = 5,120
    total MACs = 110,592 + 18,432 + 5,120 = 134,144
    """

    MACS = 134_144

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2)
        self.fc = nn.Linear(256, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        return self.fc(self.conv2(x).flatten(1))


class SDPABlock(nn.Module):
    """x [2, 8, 32], 4 heads of 8
    qkv 32->96: MACs = 16 rows * 32 * 96 = 49,152
    SDPA: Q.K^T 2*4*8*8*8 = 4,096; P.V 4,096 -> 8,192 (causal unmasked: 36 of 64 scores -> 4,608)
    proj 32->32: 16 * 32 * 32 = 16,384
    total = 73,728 (unmasked causal: 70,144)
    """

    MACS = 73_728
    MACS_UNMASKED = 70_144

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(a.transpose(1, 2).reshape(b, s, d))


class ExplicitAttention(nn.Module):
    """q, k, v [2, 4, 8, 8] given as inputs; scores = q @ k^T / sqrt(8); softmax; @ v
    q @ k^T: 2*4 * 8*8*8 = 4,096 MACs; p @ v: 4,096 MACs -> 8,192
    """

    MACS = 8_192

    def forward(self, q, k, v):
        p = torch.softmax(q @ k.transpose(-2, -1) / 8 ** 0.5, dim=-1)
        return torch.einsum("bhqk,bhkd->bhqd", p, v)


class MHA(nn.Module):
    """nn.MultiheadAttention E=16, H=2 on [2, 5, 16] (batch_first), self-attention
    in-proj 10 rows * 16 * 48 = 7,680; attention 2 * (2*5*5*16) = 1,600; out-proj 10*16*16 = 2,560
    total 11,840 MACs whether the fused fast path (eval, no grad) or the unfused path runs.
    """

    MACS = 11_840

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class Tied(nn.Module):
    """Embedding(100, 16) tied to the head Linear(16, 100, bias=False); LayerNorm(16) between.
    params: 1,600 (shared, counted once) + 32 = 1,632; ids [2, 6] -> head MACs 12 * 16 * 100 = 19,200
    """

    PARAMS = 1_632
    MACS = 19_200

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.ln = nn.LayerNorm(16)
        self.head = nn.Linear(16, 100, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.ln(self.emb(ids)))


class Reused(nn.Module):
    """One Linear(8, 8) called three times on [4, 8]: 3 records; MACs 3 * 4*8*8 = 768; params 72 once."""

    MACS = 768
    PARAMS = 72

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(torch.relu(self.lin(torch.relu(self.lin(x)))))


class LSTMNet(nn.Module):
    """LSTM(16, 32, 2 layers) on [2, T, 16], batch first.
    layer 1: T*2 * (16*128 + 32*128) = T * 12,288; layer 2: T*2 * (32*128 + 32*128) = T * 16,384
    MACs = T * 28,672 (T = 5: 143,360; T = 10: 286,720)
    """

    MACS_PER_STEP = 28_672

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(16, 32, num_layers=2, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]


@dataclass
class Out:
    logits: torch.Tensor
    extras: list


class DictModel(nn.Module):
    """dict in, dataclass out. a: [3, 4] -> Linear(4, 5); b: [3, 6] -> Linear(6, 5)
    MACs = 3*4*5 + 3*6*5 = 60 + 90 = 150
    """

    MACS = 150

    def __init__(self) -> None:
        super().__init__()
        self.fa = nn.Linear(4, 5)
        self.fb = nn.Linear(6, 5)

    def forward(self, batch: dict, scale: float = 1.0):
        ya, yb = self.fa(batch["a"]), self.fb(batch["parts"][0])
        return Out(logits=(ya + yb) * scale, extras=[{"a": ya}, (yb,)])


class Raises(nn.Module):
    """Fails inside `body.1` (a Linear fed the wrong width)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 6), nn.Linear(5, 2))
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.body(self.bn(x))


class Everything(nn.Module):
    """One of each layer family, to check that every forward and backward op has a formula."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(4, 4, 3, padding=1)
        self.c2 = nn.Conv2d(4, 4, 3, padding=1)
        self.c3 = nn.Conv3d(2, 2, 3, padding=1)
        self.t2 = nn.ConvTranspose2d(4, 4, 2, stride=2)
        self.norms = nn.ModuleList([nn.BatchNorm2d(4), nn.GroupNorm(2, 4), nn.InstanceNorm2d(4, affine=True)])
        self.ln, self.rms = nn.LayerNorm(8), nn.RMSNorm(8)
        self.emb = nn.Embedding(10, 8)
        self.acts = nn.ModuleList([nn.ReLU(), nn.GELU(), nn.SiLU(), nn.Tanh(), nn.Sigmoid(), nn.LeakyReLU(),
                                   nn.ELU(), nn.Hardswish(), nn.Softplus(), nn.Mish(), nn.Hardtanh(),
                                   nn.PReLU(), nn.GELU(approximate="tanh"), nn.Hardsigmoid(), nn.ReLU6()])
        self.pools = nn.ModuleList([nn.MaxPool2d(2), nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(3),
                                    nn.AdaptiveMaxPool2d(3)])
        self.pools1d = nn.ModuleList([nn.MaxPool1d(2), nn.AvgPool1d(2), nn.AdaptiveAvgPool1d(3)])
        self.pools3d = nn.ModuleList([nn.MaxPool3d(2), nn.AvgPool3d(2), nn.AdaptiveAvgPool3d(1)])
        self.ups = nn.ModuleList([nn.Upsample(scale_factor=2, mode=m) for m in ("nearest", "bilinear", "bicubic")])
        self.lstm, self.gru, self.rnn = nn.LSTM(8, 8), nn.GRU(8, 8), nn.RNN(8, 8)
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(8, 3)

    def forward(self, img, ids, vol):
        x = self.c2(img)
        for n in self.norms:
            x = n(x)
        for a in self.acts:
            x = a(x)
        total = self.t2(x).mean()
        for p in self.pools:
            total = total + p(x).sum()
        for u in self.ups:
            total = total + u(x).amax()
        seq = self.c1(x.flatten(2))
        for p in self.pools1d:
            total = total + p(seq).std()
        for p in self.pools3d:
            total = total + p(self.c3(vol)).logsumexp(dim=1).sum()
        e = self.drop(self.rms(self.ln(self.emb(ids))))
        e = e + self.mha(e, e, e)[0]
        e = F.scaled_dot_product_attention(e.unsqueeze(1), e.unsqueeze(1), e.unsqueeze(1), is_causal=True)[:, 0]
        h = self.lstm(e)[0] + self.gru(e)[0] + self.rnn(e)[0]
        logits = self.head(h)
        loss = F.cross_entropy(logits.flatten(0, 1), ids.flatten() % 3) + F.mse_loss(logits, logits.detach() * 0.5)
        return torch.log_softmax(logits, -1).sum() + torch.softmax(logits, -1).max() + loss + total


class UNet(nn.Module):
    """A small U-Net: convolutions with GroupNorm, a skip connection, a transposed convolution
    (tests/analyses/test_memory_trust.py; bench/bench_memory.py builds it with c=16)."""

    def __init__(self, c=8):
        super().__init__()

        def blk(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.GroupNorm(4, o), nn.SiLU())
        self.d1, self.d2, self.pool, self.mid = blk(3, c), blk(c, 2 * c), nn.MaxPool2d(2), blk(2 * c, 2 * c)
        self.up = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.u1, self.out = blk(2 * c, c), nn.Conv2d(c, 3, 1)

    def forward(self, x):
        a = self.d1(x)
        return self.out(self.u1(torch.cat([self.up(self.mid(self.d2(self.pool(a)))), a], 1)))
