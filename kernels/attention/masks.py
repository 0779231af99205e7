"""Attention masks for FlexAttention, each also evaluable as a dense boolean tensor.

A :class:`Mask` says which (query, key) pairs may attend. It is immutable and hashable, so
that block masks built from it can be cached by value (see :mod:`kernels.attention.block_mask`).
Its :meth:`Mask.mask_mod` has FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)`` signature and
uses tensor operations only, so the same function serves ``create_block_mask`` (vmapped over
scalars) and :meth:`Mask.dense` (broadcast index grids).

Masks compose: ``a & b`` keeps pairs both allow, ``a | b`` pairs either allows, ``~a`` the rest.

Index convention: queries and keys share one position axis (self-attention); for a query at
position ``q`` and key at ``kv``, "causal" means ``kv <= q`` and a causal window of size ``W``
means ``q - W < kv <= q`` (``W`` keys, the query's own position included).
"""
from __future__ import annotations

import hashlib
import numbers
from collections.abc import Sequence
from typing import Callable

import torch
from torch import Tensor

__all__ = [
    "Mask",
    "MaskError",
    "Full",
    "Causal",
    "SlidingWindow",
    "Document",
    "PrefixLM",
    "ChunkedLocal",
    "And",
    "Or",
    "Not",
    "full",
    "causal",
    "sliding_window",
    "document",
    "document_from_offsets",
    "document_ids_from_offsets",
    "prefix_lm",
    "chunked_local",
]


class MaskError(ValueError):
    """A mask was given invalid parameters (a non-positive window, malformed offsets, ...)."""


def _tensor_fingerprint(t: Tensor) -> tuple:
    """A hashable summary of a tensor's contents: shape, dtype, device and a digest of its bytes."""
    data = t.detach().to("cpu").contiguous()
    digest = hashlib.blake2b(data.numpy().tobytes(), digest_size=16).hexdigest()
    return (tuple(t.shape), str(t.dtype), str(t.device), digest)


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MaskError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise MaskError(f"{name} must be positive, got {value}")
    return value


class Mask:
    """Base class: a boolean attention pattern over (batch, head, query, key) positions.

    Subclasses implement :meth:`mask_mod` and :meth:`_key`. Class attributes describe the
    pattern to the dispatch code: ``batch_dependent``/``head_dependent`` say whether the
    pattern varies along those axes (block masks are then built per batch/head).
    """

    batch_dependent: bool = False
    head_dependent: bool = False

    def mask_mod(self, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        raise NotImplementedError

    def _key(self) -> tuple:
        raise NotImplementedError

    @property
    def key(self) -> tuple:
        """Hashable identity of this mask's pattern (equal keys ⇒ equal patterns)."""
        return self._key()

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mask) and self.key == other.key

    def __and__(self, other: Mask) -> Mask:
        return And(self, other)

    def __or__(self, other: Mask) -> Mask:
        return Or(self, other)

    def __invert__(self) -> Mask:
        return Not(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}{self.key[1:]}"

    def to(self, device: torch.device | str) -> Mask:
        """This mask with any tensors it holds on ``device`` (a no-op for index-only masks)."""
        return self

    def as_mask_mod(self) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
        """A plain function of (b, h, q_idx, kv_idx), the form FlexAttention requires
        (one per mask object, so that compiled callers see the same function each time)."""
        cached = self.__dict__.get("_mask_mod_fn")
        if cached is not None:
            return cached
        impl = self.mask_mod

        def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return impl(b, h, q_idx, kv_idx)

        mask_mod.__name__ = f"{type(self).__name__.lower()}_mask_mod"
        self.__dict__["_mask_mod_fn"] = mask_mod
        return mask_mod

    def check_shape(self, batch: int, q_len: int, kv_len: int) -> None:
        """Raise :class:`MaskError` if this mask cannot describe a (batch, q_len, kv_len) problem."""

    def dense(
        self,
        q_len: int,
        kv_len: int | None = None,
        *,
        batch: int = 1,
        heads: int = 1,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """Evaluate the mask on every pair: a bool tensor of shape (B', H', q_len, kv_len).

        ``B'`` is ``batch`` when the mask depends on the batch index, else 1 (broadcastable);
        likewise ``H'``. Memory is q_len × kv_len: meant for references and small problems.
        """
        kv_len = q_len if kv_len is None else kv_len
        self.check_shape(batch, q_len, kv_len)
        nb = batch if self.batch_dependent else 1
        nh = heads if self.head_dependent else 1
        b = torch.arange(nb, device=device).view(nb, 1, 1, 1)
        h = torch.arange(nh, device=device).view(1, nh, 1, 1)
        q = torch.arange(q_len, device=device).view(1, 1, q_len, 1)
        kv = torch.arange(kv_len, device=device).view(1, 1, 1, kv_len)
        out = self.to(b.device).mask_mod(b, h, q, kv)  # tensors the mask holds go along
        return out.expand(nb, nh, q_len, kv_len).to(torch.bool)

    def count_pairs(
        self, q_len: int, kv_len: int | None = None, *, batch: int = 1, heads: int = 1,
        device: torch.device | str | None = None, chunk: int = 4096,
    ) -> int:
        """Number of allowed (query, key) pairs summed over batch and heads.

        Evaluated in query chunks so that memory stays chunk × kv_len; subclasses with a
        closed form override it.
        """
        kv_len = q_len if kv_len is None else kv_len
        self.check_shape(batch, q_len, kv_len)
        nb = batch if self.batch_dependent else 1
        nh = heads if self.head_dependent else 1
        total = 0
        b = torch.arange(nb, device=device).view(nb, 1, 1, 1)
        h = torch.arange(nh, device=device).view(1, nh, 1, 1)
        kv = torch.arange(kv_len, device=device).view(1, 1, 1, kv_len)
        moved = self.to(kv.device)
        for start in range(0, q_len, chunk):
            q = torch.arange(start, min(q_len, start + chunk), device=device).view(1, 1, -1, 1)
            m = moved.mask_mod(b, h, q, kv).expand(nb, nh, q.shape[2], kv_len)
            total += int(m.sum().item())
        return total * (batch // nb) * (heads // nh)


class Full(Mask):
    """Every query attends to every key."""

    def mask_mod(self, b, h, q_idx, kv_idx):
        return (q_idx >= 0) & (kv_idx >= 0)

    def dense(self, q_len, kv_len=None, *, batch=1, heads=1, device=None):
        kv_len = q_len if kv_len is None else kv_len
        return torch.ones(1, 1, q_len, kv_len, dtype=torch.bool, device=device)

    def count_pairs(self, q_len, kv_len=None, *, batch=1, heads=1, device=None, chunk=4096):
        kv_len = q_len if kv_len is None else kv_len
        return q_len * kv_len * batch * heads

    def _key(self):
        return ("full",)


class Causal(Mask):
    """Each query attends to its own and earlier positions (``kv <= q``)."""

    def mask_mod(self, b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    def count_pairs(self, q_len, kv_len=None, *, batch=1, heads=1, device=None, chunk=4096):
        kv_len = q_len if kv_len is None else kv_len
        return _causal_pairs(q_len, kv_len) * batch * heads

    def _key(self):
        return ("causal",)


def _causal_pairs(q_len: int, kv_len: int) -> int:
    # rows q < kv_len see q + 1 keys; rows q >= kv_len see kv_len keys
    n = min(q_len, kv_len)
    return n * (n + 1) // 2 + max(0, q_len - kv_len) * kv_len


class SlidingWindow(Mask):
    """A local window of ``window`` positions.

    Causal (default): ``q - window < kv <= q``. Bidirectional: ``|q - kv| < window``, i.e.
    ``window - 1`` positions on each side plus the query's own.
    """

    def __init__(self, window: int, *, causal: bool = True) -> None:
        self.window = _check_positive_int("window", window)
        self.causal = bool(causal)

    def mask_mod(self, b, h, q_idx, kv_idx):
        diff = q_idx - kv_idx
        if self.causal:
            return (diff >= 0) & (diff < self.window)
        return (diff < self.window) & (diff > -self.window)

    def count_pairs(self, q_len, kv_len=None, *, batch=1, heads=1, device=None, chunk=4096):
        kv_len = q_len if kv_len is None else kv_len
        if q_len != kv_len:
            return super().count_pairs(q_len, kv_len, batch=batch, heads=heads, device=device,
                                       chunk=chunk)
        s, w = q_len, min(self.window, q_len)
        one_side = _causal_pairs(s, s) - _causal_pairs(s - w, s - w)  # pairs with 0 <= q-kv < w
        pairs = one_side if self.causal else 2 * one_side - s
        return pairs * batch * heads

    def _key(self):
        return ("sliding_window", self.window, self.causal)


class ChunkedLocal(Mask):
    """Positions attend only within their fixed-size chunk (``q // chunk == kv // chunk``),
    causally by default (as in Llama 4's chunked attention)."""

    def __init__(self, chunk: int, *, causal: bool = True) -> None:
        self.chunk = _check_positive_int("chunk", chunk)
        self.causal = bool(causal)

    def mask_mod(self, b, h, q_idx, kv_idx):
        same = (q_idx // self.chunk) == (kv_idx // self.chunk)
        return same & (kv_idx <= q_idx) if self.causal else same

    def _key(self):
        return ("chunked_local", self.chunk, self.causal)


class Document(Mask):
    """Packed sequences: a query attends only to keys of the same document.

    ``doc_ids`` is an int tensor of shape (S,) (shared by the batch) or (B, S): position ``i``
    belongs to document ``doc_ids[..., i]``. Causal within each document by default.
    Use :func:`document_from_offsets` to build one from document boundaries.
    """

    def __init__(self, doc_ids: Tensor, *, causal: bool = True) -> None:
        if not isinstance(doc_ids, Tensor):
            raise MaskError(f"doc_ids must be a tensor, got {type(doc_ids).__name__}")
        if doc_ids.dtype.is_floating_point or doc_ids.dtype == torch.bool or doc_ids.is_complex():
            raise MaskError(f"doc_ids must be an integer tensor, got {doc_ids.dtype}")
        if doc_ids.dim() not in (1, 2) or doc_ids.shape[-1] == 0:
            raise MaskError(f"doc_ids must have shape (S,) or (B, S) with S > 0, got {tuple(doc_ids.shape)}")
        ids = doc_ids.detach().clone()
        self.batch_dependent = ids.dim() == 2
        self.doc_ids = ids if ids.dim() == 2 else ids.unsqueeze(0)
        self.causal = bool(causal)
        self._fingerprint = _tensor_fingerprint(self.doc_ids)

    @property
    def seq_len(self) -> int:
        return int(self.doc_ids.shape[-1])

    def to(self, device: torch.device | str) -> Document:
        """The same mask with its ids on ``device`` (block-mask creation needs them there)."""
        if self.doc_ids.device == torch.device(device):
            return self
        out = Document.__new__(Document)
        out.doc_ids = self.doc_ids.to(device)
        out.batch_dependent = self.batch_dependent
        out.causal = self.causal
        out._fingerprint = self._fingerprint
        return out

    def check_shape(self, batch, q_len, kv_len):
        s = self.seq_len
        if q_len > s or kv_len > s:
            raise MaskError(f"Document mask covers {s} positions, problem has q_len={q_len}, kv_len={kv_len}")
        if self.batch_dependent and self.doc_ids.shape[0] != batch:
            raise MaskError(f"Document mask has ids for batch {self.doc_ids.shape[0]}, problem has batch {batch}")

    def mask_mod(self, b, h, q_idx, kv_idx):
        ids = self.doc_ids
        bi = b if self.batch_dependent else torch.zeros_like(b)
        same = ids[bi, q_idx] == ids[bi, kv_idx]
        return same & (kv_idx <= q_idx) if self.causal else same

    def _key(self):
        return ("document", self.causal, self._fingerprint)


class PrefixLM(Mask):
    """Prefix-LM: the first ``prefix_len`` positions attend bidirectionally among themselves,
    everything else is causal (``kv <= q or kv < prefix_len``).

    ``prefix_len`` is an int shared by the batch or an int tensor of shape (B,).
    """

    def __init__(self, prefix_len: int | Tensor) -> None:
        if isinstance(prefix_len, Tensor):
            if prefix_len.dtype.is_floating_point or prefix_len.dtype == torch.bool or prefix_len.dim() != 1:
                raise MaskError(f"prefix_len tensor must be an integer tensor of shape (B,), got "
                                f"{prefix_len.dtype} {tuple(prefix_len.shape)}")
            if bool((prefix_len < 0).any()):
                raise MaskError("prefix_len must be non-negative")
            self.prefix: int | Tensor = prefix_len.detach().clone()
            self.batch_dependent = True
            self._fingerprint: tuple = _tensor_fingerprint(self.prefix)
        else:
            if isinstance(prefix_len, bool) or not isinstance(prefix_len, int):
                raise MaskError(f"prefix_len must be an int or a tensor, got {type(prefix_len).__name__}")
            if prefix_len < 0:
                raise MaskError(f"prefix_len must be non-negative, got {prefix_len}")
            self.prefix = prefix_len
            self._fingerprint = (prefix_len,)

    def to(self, device: torch.device | str) -> PrefixLM:
        if not isinstance(self.prefix, Tensor) or self.prefix.device == torch.device(device):
            return self
        out = PrefixLM.__new__(PrefixLM)
        out.prefix = self.prefix.to(device)
        out.batch_dependent = True
        out._fingerprint = self._fingerprint
        return out

    def check_shape(self, batch, q_len, kv_len):
        if isinstance(self.prefix, Tensor) and self.prefix.shape[0] != batch:
            raise MaskError(f"PrefixLM has prefix lengths for batch {self.prefix.shape[0]}, problem has batch {batch}")

    def mask_mod(self, b, h, q_idx, kv_idx):
        prefix = self.prefix[b] if isinstance(self.prefix, Tensor) else self.prefix
        return (kv_idx <= q_idx) | (kv_idx < prefix)

    def _key(self):
        return ("prefix_lm", self._fingerprint)


class _Composite(Mask):
    op_name = ""

    def __init__(self, *masks: Mask) -> None:
        if len(masks) < 1:
            raise MaskError(f"{type(self).__name__} needs at least one mask")
        for m in masks:
            if not isinstance(m, Mask):
                raise MaskError(f"{type(self).__name__} takes Mask objects, got {type(m).__name__}")
        flat: list[Mask] = []
        for m in masks:  # flatten (a & b) & c into one node
            flat.extend(m.masks if type(m) is type(self) else (m,))  # type: ignore[attr-defined]
        self.masks: tuple[Mask, ...] = tuple(flat)
        self.batch_dependent = any(m.batch_dependent for m in flat)
        self.head_dependent = any(m.head_dependent for m in flat)

    def check_shape(self, batch, q_len, kv_len):
        for m in self.masks:
            m.check_shape(batch, q_len, kv_len)

    def to(self, device: torch.device | str) -> Mask:
        return type(self)(*(m.to(device) for m in self.masks))

    def _key(self):
        return (self.op_name,) + tuple(m.key for m in self.masks)

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(map(repr, self.masks))})"


class And(_Composite):
    """Pairs every given mask allows."""

    op_name = "and"

    def mask_mod(self, b, h, q_idx, kv_idx):
        out = self.masks[0].mask_mod(b, h, q_idx, kv_idx)
        for m in self.masks[1:]:
            out = out & m.mask_mod(b, h, q_idx, kv_idx)
        return out


class Or(_Composite):
    """Pairs any given mask allows."""

    op_name = "or"

    def mask_mod(self, b, h, q_idx, kv_idx):
        out = self.masks[0].mask_mod(b, h, q_idx, kv_idx)
        for m in self.masks[1:]:
            out = out | m.mask_mod(b, h, q_idx, kv_idx)
        return out


class Not(Mask):
    """The complement of a mask."""

    def __init__(self, mask: Mask) -> None:
        if not isinstance(mask, Mask):
            raise MaskError(f"Not takes a Mask, got {type(mask).__name__}")
        self.mask = mask
        self.batch_dependent = mask.batch_dependent
        self.head_dependent = mask.head_dependent

    def check_shape(self, batch, q_len, kv_len):
        self.mask.check_shape(batch, q_len, kv_len)

    def to(self, device):
        return Not(self.mask.to(device))

    def mask_mod(self, b, h, q_idx, kv_idx):
        return ~self.mask.mask_mod(b, h, q_idx, kv_idx)

    def _key(self):
        return ("not", self.mask.key)


# --- constructors -------------------------------------------------------------------------


def full() -> Full:
    """Mask allowing every pair."""
    return Full()


def causal() -> Causal:
    """Causal mask: ``kv <= q``."""
    return Causal()


def sliding_window(window: int, *, causal: bool = True) -> SlidingWindow:
    """Sliding window of ``window`` positions (causal: ``q - window < kv <= q``)."""
    return SlidingWindow(window, causal=causal)


def chunked_local(chunk: int, *, causal: bool = True) -> ChunkedLocal:
    """Attention within fixed chunks of ``chunk`` positions."""
    return ChunkedLocal(chunk, causal=causal)


def prefix_lm(prefix_len: int | Tensor) -> PrefixLM:
    """Bidirectional over the first ``prefix_len`` positions, causal after."""
    return PrefixLM(prefix_len)


def document(doc_ids: Tensor, *, causal: bool = True) -> Document:
    """Packed-sequence mask from per-position document ids, shape (S,) or (B, S)."""
    return Document(doc_ids, causal=causal)


def _offset(value: object) -> int:
    """One boundary as an int: an int (NumPy's too) or a float with an integral value, never
    truncated (``int(2.5)`` would silently move a document boundary)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise MaskError(f"offsets must be integers, got {value!r}")
    if int(value) != value:
        raise MaskError(f"offsets must be integers, got {value!r}")
    return int(value)


def document_ids_from_offsets(offsets: Sequence[int] | Tensor, seq_len: int | None = None) -> Tensor:
    """Document ids (int32, shape (S,)) from boundaries ``[0, end_0, end_1, ..., S]``.

    ``offsets`` must start at 0 and increase strictly; the last entry is the total length
    (``seq_len`` if given must equal it). Document ``d`` covers ``offsets[d]:offsets[d+1]``.
    """
    if isinstance(offsets, Tensor):
        if offsets.dtype.is_floating_point or offsets.dim() != 1:
            raise MaskError(f"offsets must be a 1-D integer tensor, got {offsets.dtype} {tuple(offsets.shape)}")
        offs = [int(x) for x in offsets.tolist()]
    else:
        offs = [_offset(x) for x in offsets]
    if len(offs) < 2:
        raise MaskError(f"offsets needs at least two entries [0, ..., S], got {offs}")
    if offs[0] != 0:
        raise MaskError(f"offsets must start at 0, got {offs[0]}")
    if any(b <= a for a, b in zip(offs, offs[1:])):
        raise MaskError(f"offsets must increase strictly, got {offs}")
    if seq_len is not None and offs[-1] != seq_len:
        raise MaskError(f"offsets end at {offs[-1]} but seq_len is {seq_len}")
    lengths = torch.tensor([b - a for a, b in zip(offs, offs[1:])])
    return torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), lengths)


def document_from_offsets(offsets: Sequence[int] | Tensor, seq_len: int | None = None,
                          *, causal: bool = True) -> Document:
    """Packed-sequence mask from document boundaries (see :func:`document_ids_from_offsets`)."""
    return Document(document_ids_from_offsets(offsets, seq_len), causal=causal)

