"""A small Llama-style decoder for whole-training-step benchmarks and tests.

RMSNorm, rotary position embeddings, SwiGLU feed-forward, grouped-query attention through
:func:`kernels.attention.attention`, and an LM head whose loss goes through the fused
``kernels.lce.linear_cross_entropy`` when that package is importable (``F.cross_entropy``
over materialized logits otherwise, or when asked). Sizes run from :meth:`LlamaConfig.tiny`
(CPU tests) to :meth:`LlamaConfig.llama_1b` (~1.2 B parameters, Llama-3.2-1B's shape).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import attention
from .attention import masks as M

__all__ = ["LlamaConfig", "Llama", "ModelConfigError", "fused_loss_available", "lm_loss"]


class ModelConfigError(ValueError):
    """A :class:`LlamaConfig` field is out of range or inconsistent with another."""


LossImpl = Literal["auto", "fused", "torch"]


@dataclass(frozen=True)
class LlamaConfig:
    """Shape and behaviour of a :class:`Llama`.

    ``attn_window``: None for causal attention, else a causal sliding window of that many
    positions. ``attn_backend``: passed to :func:`kernels.attention.attention`.
    ``loss_impl``: 'auto' (fused linear + cross-entropy when importable), 'fused' (require it),
    'torch' (``F.cross_entropy`` on materialized logits). ``compile_pointwise``: compile the
    RoPE and SwiGLU elementwise parts (fewer memory passes on GPU).
    """

    vocab_size: int = 32000
    dim: int = 512
    n_layers: int = 8
    n_heads: int = 8
    n_kv_heads: int | None = None
    ffn_dim: int | None = None
    multiple_of: int = 256
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    max_seq_len: int = 8192
    tie_embeddings: bool = True
    attn_window: int | None = None
    attn_backend: str = "auto"
    attn_kernel_options: tuple[tuple[str, Any], ...] | None = None
    loss_impl: LossImpl = "auto"
    compile_pointwise: bool = False
    init_std: float = 0.02

    def __post_init__(self) -> None:
        def positive(name: str) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ModelConfigError(f"{name} must be a positive int, got {v!r}")

        for name in ("vocab_size", "dim", "n_layers", "n_heads", "multiple_of", "max_seq_len"):
            positive(name)
        if self.n_kv_heads is not None:
            positive("n_kv_heads")
        if self.ffn_dim is not None:
            positive("ffn_dim")
        if self.attn_window is not None:
            positive("attn_window")
        if self.dim % self.n_heads:
            raise ModelConfigError(f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads})")
        if self.head_dim % 2:
            raise ModelConfigError(f"head_dim ({self.head_dim}) must be even for rotary embeddings")
        if self.n_heads % self.kv_heads:
            raise ModelConfigError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.kv_heads})")
        if self.loss_impl not in ("auto", "fused", "torch"):
            raise ModelConfigError(f"loss_impl must be 'auto', 'fused' or 'torch', got {self.loss_impl!r}")
        if self.attn_backend not in ("auto", "flex", "sdpa", "math", "triton_window"):
            raise ModelConfigError(
                f"attn_backend must be auto/flex/sdpa/math/triton_window, got {self.attn_backend!r}")
        for name in ("norm_eps", "rope_theta", "init_std"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ModelConfigError(f"{name} must be a positive number, got {v!r}")
        for name in ("tie_embeddings", "compile_pointwise"):
            if not isinstance(getattr(self, name), bool):  # "no" would be true
                raise ModelConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def hidden_dim(self) -> int:
        """Feed-forward width: ``ffn_dim`` or Llama's rule (8/3·dim rounded up to ``multiple_of``)."""
        if self.ffn_dim is not None:
            return self.ffn_dim
        h = int(8 * self.dim / 3)
        return self.multiple_of * ((h + self.multiple_of - 1) // self.multiple_of)

    def replace(self, **changes: Any) -> LlamaConfig:
        return dataclasses.replace(self, **changes)

    def mask(self) -> M.Mask:
        """The attention pattern this config trains with."""
        return M.causal() if self.attn_window is None else M.sliding_window(self.attn_window)

    # -- presets --------------------------------------------------------------------------
    @classmethod
    def tiny(cls, **overrides: Any) -> LlamaConfig:
        """A few hundred thousand parameters: CPU tests and smoke runs."""
        base = dict(vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                    max_seq_len=1024)
        return cls(**{**base, **overrides})

    @classmethod
    def llama_1b(cls, **overrides: Any) -> LlamaConfig:
        """Llama-3.2-1B's shape: 16 layers, dim 2048, 32 heads / 8 KV heads, FFN 8192, vocab 128256."""
        base = dict(vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                    ffn_dim=8192, max_seq_len=131072, tie_embeddings=True)
        return cls(**{**base, **overrides})

    # -- accounting -----------------------------------------------------------------------
    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token (all but the embedding lookup; the
        LM head counts even when tied)."""
        hd, kv = self.head_dim, self.kv_heads
        attn = self.dim * (self.n_heads + 2 * kv) * hd + self.n_heads * hd * self.dim
        mlp = 3 * self.dim * self.hidden_dim
        return self.n_layers * (attn + mlp) + self.dim * self.vocab_size

    def train_flops(self, batch: int, seq_len: int, mask: M.Mask | None = None) -> float:
        """Useful FLOPs of one forward+backward: 6 per matmul parameter per token, plus
        attention's 12·head_dim per allowed (query, key) pair per head per layer (QKᵀ and PV,
        forward and twice that backward)."""
        mask = self.mask() if mask is None else mask
        tokens = batch * seq_len
        pairs = mask.count_pairs(seq_len, seq_len, batch=batch)
        attn = 12.0 * self.head_dim * self.n_heads * self.n_layers * pairs
        return 6.0 * self.matmul_params() * tokens + attn


# --- building blocks ------------------------------------------------------------------------


def _rope_tables(head_dim: int, max_len: int, theta: float) -> tuple[Tensor, Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    ang = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate (B, S, H, D) by position: pairs (x[i], x[i + D/2]) turn by angle pos·θ_i."""
    d2 = x.shape[-1] // 2
    x1, x2 = x[..., :d2].float(), x[..., d2:].float()
    c = cos[: x.shape[1]].view(1, x.shape[1], 1, d2)
    s = sin[: x.shape[1]].view(1, x.shape[1], 1, d2)
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).to(x.dtype)


def swiglu(gate_up: Tensor) -> Tensor:
    """SiLU(gate) · up for the fused [gate | up] projection."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


_COMPILED: dict[str, Callable] = {}  # registry of compiled pointwise helpers


def _maybe_compiled(name: str, fn: Callable, enabled: bool) -> Callable:
    if not enabled:
        return fn
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=False)
    return _COMPILED[name]


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # autocast runs norms in float32; keep the residual stream's dtype
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps).to(x.dtype)


class Attention(nn.Module):
    """Grouped-query self-attention with rotary embeddings and a fused QKV projection."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(cfg.dim, (cfg.n_heads + 2 * cfg.kv_heads) * cfg.head_dim, bias=False)
        self.out = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: M.Mask) -> Tensor:
        cfg = self.cfg
        b, s, _ = x.shape
        hd, nh, nkv = cfg.head_dim, cfg.n_heads, cfg.kv_heads
        q, k, v = self.qkv(x).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        rope = _maybe_compiled("rope", apply_rope, cfg.compile_pointwise and x.is_cuda)
        q = rope(q.view(b, s, nh, hd), cos, sin).transpose(1, 2)
        k = rope(k.view(b, s, nkv, hd), cos, sin).transpose(1, 2)
        v = v.view(b, s, nkv, hd).transpose(1, 2)
        opts = dict(cfg.attn_kernel_options) if cfg.attn_kernel_options else None
        o = attention(q, k, v, mask, backend=cfg.attn_backend, kernel_options=opts)
        return self.out(o.transpose(1, 2).reshape(b, s, nh * hd))


class FeedForward(nn.Module):
    """SwiGLU MLP with a fused gate/up projection."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.gate_up = nn.Linear(cfg.dim, 2 * cfg.hidden_dim, bias=False)
        self.down = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        act = _maybe_compiled("swiglu", swiglu, self.cfg.compile_pointwise and x.is_cuda)
        return self.down(act(self.gate_up(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = FeedForward(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: M.Mask) -> Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, mask)
        return x + self.mlp(self.mlp_norm(x))


# --- loss -----------------------------------------------------------------------------------


def _fused_loss_fn() -> Callable | None:
    try:
        from .lce import linear_cross_entropy  # type: ignore[attr-defined]
    except ImportError:
        return None
    return linear_cross_entropy


def fused_loss_available() -> bool:
    """Whether ``kernels.lce.linear_cross_entropy`` can be imported."""
    return _fused_loss_fn() is not None


def lm_loss(hidden: Tensor, weight: Tensor, targets: Tensor, *, impl: LossImpl = "auto",
            ignore_index: int = -100) -> Tensor:
    """Mean next-token cross-entropy of ``hidden @ weight.T`` against ``targets``.

    hidden (N, D) or (B, S, D); targets of matching leading shape. ``impl`` as in
    :class:`LlamaConfig`; 'fused' raises :class:`ImportError` when ``kernels.lce`` is missing.
    """
    h = hidden.reshape(-1, hidden.shape[-1])
    t = targets.reshape(-1)
    if h.shape[0] != t.shape[0]:
        raise ModelConfigError(f"hidden has {h.shape[0]} tokens but targets {t.shape[0]}")
    fused = _fused_loss_fn() if impl != "torch" else None
    if impl == "fused" and fused is None:
        raise ImportError("loss_impl='fused' but kernels.lce.linear_cross_entropy is not importable")
    if fused is not None:
        return fused(h, weight.to(h.dtype), t, ignore_index=ignore_index)
    logits = F.linear(h, weight.to(h.dtype))
    return F.cross_entropy(logits.float(), t, ignore_index=ignore_index)


# --- model ----------------------------------------------------------------------------------


class Llama(nn.Module):
    """Llama-style decoder. ``forward(tokens)`` gives logits; ``forward(tokens, targets)`` the
    mean loss (fused with the LM head when available), never materializing logits then."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        if not isinstance(cfg, LlamaConfig):
            raise ModelConfigError(f"Llama takes a LlamaConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = _rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        nn.init.normal_(self.embed.weight, std=std)
        for blk in self.blocks:
            nn.init.normal_(blk.attn.qkv.weight, std=std)
            nn.init.normal_(blk.attn.out.weight, std=out_std)
            nn.init.normal_(blk.mlp.gate_up.weight, std=std)
            nn.init.normal_(blk.mlp.down.weight, std=out_std)
        if self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight, std=std)

    @property
    def output_weight(self) -> Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, tokens: Tensor, targets: Tensor | None = None, *,
                mask: M.Mask | None = None) -> Tensor:
        """tokens (B, S) int64. Returns logits (B, S, V) or, with targets (B, S), the mean loss.

        ``mask`` overrides the config's pattern (e.g. a document mask for packed sequences).
        """
        if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise ModelConfigError(f"tokens must be an int tensor of shape (B, S), got {tokens.dtype} {tuple(tokens.shape)}")
        b, s = tokens.shape
        if s > self.cfg.max_seq_len:
            raise ModelConfigError(f"sequence length {s} exceeds max_seq_len {self.cfg.max_seq_len}")
        if targets is not None and targets.shape != tokens.shape:
            raise ModelConfigError(f"targets shape {tuple(targets.shape)} != tokens shape {tuple(tokens.shape)}")
        mask = self.cfg.mask() if mask is None else mask
        x = self.embed(tokens)
        if torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
        for blk in self.blocks:
            x = blk(x, self.rope_cos, self.rope_sin, mask)
        x = self.norm(x)
        if targets is None:
            return F.linear(x, self.output_weight.to(x.dtype))
        return lm_loss(x, self.output_weight, targets, impl=self.cfg.loss_impl)
