"""Every mask against a dense boolean reference written out pair by pair."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from kernels.attention import masks as M
from kernels.attention.masks import MaskError


def reference(pred, q_len: int, kv_len: int) -> torch.Tensor:
    out = torch.zeros(q_len, kv_len, dtype=torch.bool)
    for q, kv in itertools.product(range(q_len), range(kv_len)):
        out[q, kv] = bool(pred(q, kv))
    return out


S = 133  # deliberately not a multiple of 128 (nor of 16)


@pytest.mark.parametrize(
    "mask, pred",
    [
        (M.full(), lambda q, kv: True),
        (M.causal(), lambda q, kv: kv <= q),
        (M.sliding_window(7), lambda q, kv: 0 <= q - kv < 7),
        (M.sliding_window(1), lambda q, kv: q == kv),
        (M.sliding_window(500), lambda q, kv: kv <= q),
        (M.sliding_window(5, causal=False), lambda q, kv: abs(q - kv) < 5),
        (M.chunked_local(16), lambda q, kv: q // 16 == kv // 16 and kv <= q),
        (M.chunked_local(16, causal=False), lambda q, kv: q // 16 == kv // 16),
        (M.prefix_lm(20), lambda q, kv: kv <= q or kv < 20),
        (M.prefix_lm(0), lambda q, kv: kv <= q),
        (M.document_from_offsets([0, 40, 41, 100, S]),
         lambda q, kv: kv <= q and _doc(q) == _doc(kv)),
        (M.document_from_offsets([0, 40, 41, 100, S], causal=False),
         lambda q, kv: _doc(q) == _doc(kv)),
        (M.sliding_window(9) & M.document_from_offsets([0, 40, 41, 100, S]),
         lambda q, kv: 0 <= q - kv < 9 and _doc(q) == _doc(kv)),
        (M.sliding_window(4) | M.chunked_local(16, causal=False),
         lambda q, kv: 0 <= q - kv < 4 or q // 16 == kv // 16),
        (~M.causal(), lambda q, kv: kv > q),
        (M.causal() & ~M.sliding_window(3), lambda q, kv: q - kv >= 3),
    ],
    ids=lambda x: repr(x) if isinstance(x, M.Mask) else "",
)
def test_mask_matches_reference(mask, pred):
    ref = reference(pred, S, S)
    dense = mask.dense(S)
    assert dense.shape == (1, 1, S, S) and dense.dtype == torch.bool
    assert torch.equal(dense[0, 0], ref)
    assert mask.count_pairs(S) == int(ref.sum())
    assert M.Mask.count_pairs(mask, S, chunk=50) == int(ref.sum())  # chunked generic path


def _doc(i: int) -> int:
    bounds = [0, 40, 41, 100, S]
    return next(d for d in range(4) if bounds[d] <= i < bounds[d + 1])


def test_rectangular_problems():
    ref = reference(lambda q, kv: 0 <= q - kv < 6, 50, 77)
    assert torch.equal(M.sliding_window(6).dense(50, 77)[0, 0], ref)
    assert M.sliding_window(6).count_pairs(50, 77) == int(ref.sum())
    assert M.causal().count_pairs(90, 40) == int(reference(lambda q, kv: kv <= q, 90, 40).sum())


def test_per_batch_document_ids_and_prefix():
    ids = torch.tensor([[0, 0, 0, 1, 1, 2], [0, 1, 1, 1, 1, 1]])
    m = M.document(ids)
    assert m.batch_dependent
    d = m.dense(6, batch=2)
    assert d.shape == (2, 1, 6, 6)
    for b in range(2):
        ref = reference(lambda q, kv: kv <= q and ids[b, q] == ids[b, kv], 6, 6)
        assert torch.equal(d[b, 0], ref)
    p = M.prefix_lm(torch.tensor([0, 3]))
    d = p.dense(6, batch=2)
    assert torch.equal(d[0, 0], reference(lambda q, kv: kv <= q, 6, 6))
    assert torch.equal(d[1, 0], reference(lambda q, kv: kv <= q or kv < 3, 6, 6))
    assert p.count_pairs(6, batch=2) == int(d.sum())


def test_document_ids_from_offsets():
    ids = M.document_ids_from_offsets([0, 2, 5, 6])
    assert ids.tolist() == [0, 0, 1, 1, 1, 2]
    assert M.document_ids_from_offsets(torch.tensor([0, 3]), seq_len=3).tolist() == [0, 0, 0]
    assert M.document_ids_from_offsets([0, 2.0, np.int64(3)]).tolist() == [0, 0, 1]


def test_keys_hash_by_value():
    assert M.sliding_window(8) == M.sliding_window(8)
    assert hash(M.sliding_window(8)) == hash(M.sliding_window(8))
    assert M.sliding_window(8) != M.sliding_window(8, causal=False)
    assert M.sliding_window(8) != M.sliding_window(9)
    a = M.document_from_offsets([0, 3, 10])
    assert a == M.document_from_offsets([0, 3, 10])
    assert a != M.document_from_offsets([0, 4, 10])
    assert (M.causal() & a) == (M.causal() & M.document_from_offsets([0, 3, 10]))
    assert (M.causal() & a) != (M.causal() | a)
    # the mask copies its ids: mutating the caller's tensor does not change it
    ids = torch.tensor([0, 0, 1])
    m = M.document(ids)
    ids[2] = 0
    assert m.dense(3)[0, 0, 2, 0].item() is False


def test_and_or_flatten():
    a, b, c = M.causal(), M.sliding_window(3), M.prefix_lm(2)
    assert len(((a & b) & c).masks) == 3
    assert len(((a | b) | c).masks) == 3


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: M.sliding_window(0), "window must be positive"),
        (lambda: M.sliding_window(2.5), "window must be an int"),
        (lambda: M.chunked_local(-1), "chunk must be positive"),
        (lambda: M.prefix_lm(-3), "non-negative"),
        (lambda: M.prefix_lm("4"), "prefix_len must be an int"),
        (lambda: M.prefix_lm(torch.tensor([1.5])), "integer tensor"),
        (lambda: M.document(torch.tensor([0.0, 1.0])), "integer tensor"),
        (lambda: M.document(torch.zeros(2, 2, 2, dtype=torch.long)), "shape"),
        (lambda: M.document([0, 1]), "must be a tensor"),
        (lambda: M.document_ids_from_offsets([1, 4]), "start at 0"),
        (lambda: M.document_ids_from_offsets([0, 4, 4]), "increase strictly"),
        (lambda: M.document_ids_from_offsets([0]), "at least two"),
        (lambda: M.document_ids_from_offsets([0, 4], seq_len=5), "seq_len is 5"),
        (lambda: M.document_ids_from_offsets([0, 2.5, 5]), "integers, got 2.5"),  # was truncated to 2
        (lambda: M.document_ids_from_offsets([0, "4"]), "integers, got '4'"),
        (lambda: M.causal() & "x", "Mask objects"),
        (lambda: M.Not(3), "Not takes a Mask"),
    ],
)
def test_bad_parameters_raise_mask_error(make, match):
    with pytest.raises(MaskError, match=match):
        make()


def test_shape_mismatch_is_reported():
    m = M.document_from_offsets([0, 4, 8])
    with pytest.raises(MaskError, match="covers 8 positions"):
        m.dense(9)
    with pytest.raises(MaskError, match="batch 2"):
        M.document(torch.zeros(2, 5, dtype=torch.long)).dense(5, batch=3)
    assert issubclass(MaskError, ValueError)
