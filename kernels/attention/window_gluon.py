"""The sliding-window forward written in Gluon for Hopper: the tensor cores overlap the softmax.

Triton 3.6 waits for every matrix product of the window forward's loop right after issuing it
(``wgmma.wait_group 0``), so within one program the tensor cores idle while the softmax runs.
Gluon states the waits: here each iteration issues the next key tile's scores Q·Kᵀ, then the
previous tile's P·V, waits only for the scores (one product may stay in flight), runs the
softmax on them while P·V is multiplied, and only then waits for P·V. Keys and values arrive
through TMA into a ring of ``STAGES`` shared-memory slots, each with its own barrier, refilled
as soon as the products that read a slot are done.

Same contract as ``window_triton.launch_forward``: causal sliding window ``q - W < kv <= q``,
GQA, (B, H, S, D) contiguous bf16/fp16 operands, output and the LSE in log2 units. CUDA with
compute capability 9.x only (:func:`gluon_forward_unsupported` says why not elsewhere).
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
except ImportError:  # pragma: no cover - Triton without Gluon, or no Triton
    gluon = None  # type: ignore[assignment]

from .errors import AttentionInputError
from .window_triton import Blocks, ds_layout

_GL_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def gluon_forward_unsupported(q: Tensor) -> str | None:
    """``None`` if the Gluon forward runs for ``q``, else why not."""
    if gluon is None:
        return "the Gluon forward needs triton.experimental.gluon (Triton 3.5 or later)"
    if q.device.type != "cuda":
        return f"the Gluon forward runs on CUDA, not {q.device.type}"
    if torch.cuda.get_device_capability(q.device)[0] != 9:
        return "the Gluon forward uses Hopper's warpgroup MMA (compute capability 9.x)"
    if q.dtype not in _GL_DTYPES:
        return f"the Gluon forward takes bfloat16 or float16, got {q.dtype}"
    return None


if gluon is not None:

    @gluon.jit
    def _key_spans_gl(m0, S, W, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """As ``window_triton._key_spans`` for the query block starting at row ``m0``."""
        lo = (gl.maximum(m0 - W + 1, 0) // BLOCK_N) * BLOCK_N
        hi = gl.minimum(m0 + BLOCK_M, S)
        mid_hi = gl.maximum(((m0 + 1) // BLOCK_N) * BLOCK_N, lo)
        if m0 + BLOCK_M > S:
            mid_hi = lo
        mid_lo = ((gl.maximum(m0 + BLOCK_M - W, 0) + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
        mid_lo = gl.minimum(gl.maximum(mid_lo, lo), mid_hi)
        return lo, mid_lo, mid_hi, hi

    @gluon.jit
    def _masked(s, offs_m, start_n, S, W, BLOCK_N: gl.constexpr, col_layout: gl.constexpr,
                EVEN: gl.constexpr = False):
        """Scores outside the window (or past S; ``EVEN``: no tile reaches past S) set to -inf."""
        offs_n = start_n + gl.arange(0, BLOCK_N, col_layout)
        diff = gl.expand_dims(offs_m, 1) - gl.expand_dims(offs_n, 0)
        keep = (diff >= 0) & (diff < W)
        if not EVEN:
            keep = keep & (gl.expand_dims(offs_m, 1) < S) & (gl.expand_dims(offs_n, 0) < S)
        return gl.where(keep, s, float("-inf"))

    @gluon.jit
    def _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, slot, row, pred, BLOCK_N: gl.constexpr,
                 D: gl.constexpr):
        """Issue the TMA copies of one key tile and its value tile into ring slot ``slot``."""
        nbytes: gl.constexpr = BLOCK_N * D * 2
        mbarrier.expect(k_bars.index(slot), nbytes, pred=pred)
        tma.async_copy_global_to_shared(k_desc, [row, 0], k_bars.index(slot), k_smem.index(slot), pred=pred)
        mbarrier.expect(v_bars.index(slot), nbytes, pred=pred)
        tma.async_copy_global_to_shared(v_desc, [row, 0], v_bars.index(slot), v_smem.index(slot), pred=pred)

    @gluon.jit
    def _fwd_gluon(q_desc, k_desc, v_desc, O, LSE, sm_scale, S, W, GROUP, HQ, HKV, sob, soh, sos,
                   D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                   Q_REGS: gl.constexpr = False, EVEN: gl.constexpr = False):
        """``Q_REGS``: the query tile is held in registers as the scores' left operand (the
        products then read only K from shared memory); ``EVEN``: S is a multiple of both tiles."""
        WARPS: gl.constexpr = gl.num_warps()
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        dtype: gl.constexpr = q_desc.dtype

        pid_m = gl.program_id(0)
        bh = gl.program_id(1)
        b = bh // HQ
        h = bh % HQ
        hk = h // GROUP
        kv_row0 = (b * HKV + hk) * S
        m0 = pid_m * BLOCK_M
        lo, mid_lo, mid_hi, hi = _key_spans_gl(m0, S, W, BLOCK_M, BLOCK_N)
        n_tiles = gl.cdiv(hi - lo, BLOCK_N)

        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)
        fence_async_shared()

        mbarrier.expect(q_bar, BLOCK_M * D * 2)
        tma.async_copy_global_to_shared(q_desc, [bh * S + m0, 0], q_bar, q_smem)
        for i in gl.static_range(STAGES):
            _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, i, kv_row0 + lo + i * BLOCK_N, i < n_tiles,
                     BLOCK_N, D)

        qk_scale = sm_scale * 1.4426950408889634
        offs_m = m0 + gl.arange(0, BLOCK_M, row_s)
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)

        # the first tile: its scores and softmax (no P·V to overlap yet)
        mbarrier.wait(q_bar, 0)
        if Q_REGS:
            q_op = q_smem.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
        else:
            q_op = q_smem
        mbarrier.wait(k_bars.index(0), 0)
        s = warpgroup_mma(q_op, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False)
        if (lo < mid_lo) | (lo >= mid_hi):
            s = _masked(s, offs_m, lo, S, W, BLOCK_N, col_s, EVEN)
        m_i = gl.maximum(gl.full([BLOCK_M], -1.0e30, gl.float32, row_s), gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_i, 1))
        l_i = gl.sum(p, 1)

        for j in range(1, n_tiles):
            slot = j % STAGES
            prev = (j - 1) % STAGES
            start_n = lo + j * BLOCK_N
            mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
            s_tok = warpgroup_mma(q_op, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
            # the scores are ready once at most one product (P·V) is still in flight
            s = warpgroup_mma_wait(1, deps=[s_tok])
            if (start_n < mid_lo) | (start_n >= mid_hi):
                s = _masked(s, offs_m, start_n, S, W, BLOCK_N, col_s, EVEN)
            m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
            l_i = l_i * alpha + gl.sum(p, 1)
            m_i = m_new
            acc, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
            # both products reading slot ``prev`` are done: refill it with the tile STAGES ahead
            _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, prev,
                     kv_row0 + lo + (j - 1 + STAGES) * BLOCK_N, j - 1 + STAGES < n_tiles, BLOCK_N, D)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)

        last = (n_tiles - 1) % STAGES
        mbarrier.wait(v_bars.index(last), ((n_tiles - 1) // STAGES) & 1)
        acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v_smem.index(last), acc)

        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_bars.index(i))
            mbarrier.invalidate(v_bars.index(i))

        l_safe = gl.where(l_i == 0.0, 1.0, l_i)
        gl.store(LSE + bh * S + offs_m, m_i + gl.log2(l_safe), mask=offs_m < S)
        out = acc / gl.expand_dims(gl.convert_layout(l_safe, row_o), 1)
        store_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 * 8 // D, D // 8],
                                                      warps_per_cta=[WARPS, 1], order=[1, 0])
        out = gl.convert_layout(out.to(dtype), store_layout)
        rows = m0 + gl.arange(0, BLOCK_M, gl.SliceLayout(1, store_layout))
        cols = gl.arange(0, D, gl.SliceLayout(0, store_layout))
        ptrs = O + b * sob + h * soh + gl.expand_dims(rows, 1) * sos + gl.expand_dims(cols, 0)
        gl.store(ptrs, out, mask=gl.expand_dims(rows, 1) < S)


    @gluon.jit
    def _load_tile(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, slot, row, BLOCK_N: gl.constexpr,
                   D: gl.constexpr):
        nbytes: gl.constexpr = BLOCK_N * D * 2
        mbarrier.expect(k_bars.index(slot), nbytes)
        tma.async_copy_global_to_shared(k_desc, [row, 0], k_bars.index(slot), k_smem.index(slot))
        mbarrier.expect(v_bars.index(slot), nbytes)
        tma.async_copy_global_to_shared(v_desc, [row, 0], v_bars.index(slot), v_smem.index(slot))

    @gluon.jit
    def _fwd_gluon_chunk(q_desc, k_desc, v_desc, O, LSE, sm_scale, S, W, GROUP, HQ, HKV, sob, soh, sos, NQB, CHUNK,
                         D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SLOTS: gl.constexpr):
        """``CHUNK`` consecutive query blocks of one head per program. Key/value tiles live in a
        ring of ``SLOTS`` slots by key-tile index (at least one window's worth), so each tile is
        loaded once per program instead of once per query block; the next block's query tile
        and new key tile load while the current block computes."""
        WARPS: gl.constexpr = gl.num_warps()
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        store_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 * 8 // D, D // 8],
                                                      warps_per_cta=[WARPS, 1], order=[1, 0])
        dtype: gl.constexpr = q_desc.dtype

        bh = gl.program_id(1)
        b = bh // HQ
        h = bh % HQ
        hk = h // GROUP
        kv_row0 = (b * HKV + hk) * S
        blk0 = gl.program_id(0) * CHUNK
        blk1 = gl.minimum(blk0 + CHUNK, NQB)
        t_first = (gl.maximum(blk0 * BLOCK_M - W + 1, 0) // BLOCK_N)
        t_end = gl.cdiv(gl.minimum(blk1 * BLOCK_M, S), BLOCK_N)

        q_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_M, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [SLOTS, BLOCK_N, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [SLOTS, BLOCK_N, D], v_desc.layout)
        q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        k_bars = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(q_bars.index(i), count=1)
        for i in gl.static_range(SLOTS):
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)
        fence_async_shared()

        q_bytes: gl.constexpr = BLOCK_M * D * 2
        mbarrier.expect(q_bars.index(0), q_bytes)
        tma.async_copy_global_to_shared(q_desc, [bh * S + blk0 * BLOCK_M, 0], q_bars.index(0), q_smem.index(0))
        qk_scale = sm_scale * 1.4426950408889634
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        for blk in range(blk0, blk1):
            m0 = blk * BLOCK_M
            lo, mid_lo, mid_hi, hi = _key_spans_gl(m0, S, W, BLOCK_M, BLOCK_N)
            lo_t = lo // BLOCK_N
            n_tiles = gl.cdiv(hi - lo, BLOCK_N)
            # every tile below lo_t is done with (earlier blocks finished): its slot can take a new
            # tile, so tiles up to lo_t + SLOTS may be in flight; the previous block issued those up
            # to its own limit (in closed form: a loop-carried count is not carried by Gluon 3.6 here)
            limit = gl.minimum(lo_t + SLOTS, t_end)
            issued = gl.minimum((gl.maximum(m0 - BLOCK_M - W + 1, 0) // BLOCK_N) + SLOTS, t_end)
            if blk == blk0:
                issued = t_first
            for u in range(issued, limit):
                _load_tile(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, (u - t_first) % SLOTS,
                           kv_row0 + u * BLOCK_N, BLOCK_N, D)
            r = blk - blk0
            qs = r % 2
            if blk + 1 < blk1:  # the next block's queries, into the slot the previous block used
                mbarrier.expect(q_bars.index(1 - qs), q_bytes)
                tma.async_copy_global_to_shared(q_desc, [bh * S + m0 + BLOCK_M, 0], q_bars.index(1 - qs),
                                                q_smem.index(1 - qs))
            q_tile = q_smem.index(qs)
            mbarrier.wait(q_bars.index(qs), (r // 2) & 1)

            offs_m = m0 + gl.arange(0, BLOCK_M, row_s)
            acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
            rel0 = lo_t - t_first
            mbarrier.wait(k_bars.index(rel0 % SLOTS), (rel0 // SLOTS) & 1)
            s = warpgroup_mma(q_tile, k_smem.index(rel0 % SLOTS).permute((1, 0)), zero_s, use_acc=False)
            if (lo < mid_lo) | (lo >= mid_hi):
                s = _masked(s, offs_m, lo, S, W, BLOCK_N, col_s)
            m_i = gl.maximum(gl.full([BLOCK_M], -1.0e30, gl.float32, row_s), gl.max(s, 1) * qk_scale)
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_i, 1))
            l_i = gl.sum(p, 1)
            for j in range(1, n_tiles):
                rel = rel0 + j
                start_n = lo + j * BLOCK_N
                mbarrier.wait(k_bars.index(rel % SLOTS), (rel // SLOTS) & 1)
                s_tok = warpgroup_mma(q_tile, k_smem.index(rel % SLOTS).permute((1, 0)), zero_s, use_acc=False,
                                      is_async=True)
                prev = rel - 1
                mbarrier.wait(v_bars.index(prev % SLOTS), (prev // SLOTS) & 1)
                p_op = gl.convert_layout(p.to(dtype), p_layout)
                o_tok = warpgroup_mma(p_op, v_smem.index(prev % SLOTS), acc, is_async=True)
                s = warpgroup_mma_wait(1, deps=[s_tok])
                if (start_n < mid_lo) | (start_n >= mid_hi):
                    s = _masked(s, offs_m, start_n, S, W, BLOCK_N, col_s)
                m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
                alpha = gl.exp2(m_i - m_new)
                p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
                l_i = l_i * alpha + gl.sum(p, 1)
                m_i = m_new
                acc, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            last = rel0 + n_tiles - 1
            mbarrier.wait(v_bars.index(last % SLOTS), (last // SLOTS) & 1)
            acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v_smem.index(last % SLOTS), acc)

            l_safe = gl.where(l_i == 0.0, 1.0, l_i)
            gl.store(LSE + bh * S + offs_m, m_i + gl.log2(l_safe), mask=offs_m < S)
            out = gl.convert_layout((acc / gl.expand_dims(gl.convert_layout(l_safe, row_o), 1)).to(dtype),
                                    store_layout)
            rows = m0 + gl.arange(0, BLOCK_M, gl.SliceLayout(1, store_layout))
            cols = gl.arange(0, D, gl.SliceLayout(0, store_layout))
            ptrs = O + b * sob + h * soh + gl.expand_dims(rows, 1) * sos + gl.expand_dims(cols, 0)
            gl.store(ptrs, out, mask=gl.expand_dims(rows, 1) < S)

        for i in gl.static_range(2):
            mbarrier.invalidate(q_bars.index(i))
        for i in gl.static_range(SLOTS):
            mbarrier.invalidate(k_bars.index(i))
            mbarrier.invalidate(v_bars.index(i))


    @gluon.jit
    def _ws_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, k_full, v_full, kv_empty,
                     bh, kv_row0, blk0, blk1, S, W, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr,
                     STAGES: gl.constexpr, QBUF: gl.constexpr, TILES: gl.constexpr):
        """One warp issuing every TMA copy of the program: per query block its query tile, then
        ``TILES`` ring entries (key and value tiles; entries past the block's own tiles are
        signalled without a copy), each into a slot the consumers have released."""
        tile_bytes: gl.constexpr = BLOCK_N * D * 2
        for blk in range(blk0, blk1):
            r = blk - blk0
            qs = r % QBUF
            mbarrier.wait(q_empty.index(qs), ((r // QBUF) & 1) ^ 1)
            mbarrier.expect(q_full.index(qs), BLOCK_M * D * 2)
            tma.async_copy_global_to_shared(q_desc, [bh * S + blk * BLOCK_M, 0], q_full.index(qs), q_smem.index(qs))
            lo, _mid_lo, _mid_hi, hi = _key_spans_gl(blk * BLOCK_M, S, W, BLOCK_M, BLOCK_N)
            n_tiles = gl.cdiv(hi - lo, BLOCK_N)
            for j in gl.static_range(TILES):
                c = r * TILES + j
                slot = c % STAGES
                mbarrier.wait(kv_empty.index(slot), ((c // STAGES) & 1) ^ 1)
                if j < n_tiles:
                    mbarrier.expect(k_full.index(slot), tile_bytes)
                    tma.async_copy_global_to_shared(k_desc, [kv_row0 + lo + j * BLOCK_N, 0], k_full.index(slot),
                                                    k_smem.index(slot))
                    mbarrier.expect(v_full.index(slot), tile_bytes)
                    tma.async_copy_global_to_shared(v_desc, [kv_row0 + lo + j * BLOCK_N, 0], v_full.index(slot),
                                                    v_smem.index(slot))
                else:
                    mbarrier.arrive(k_full.index(slot))
                    mbarrier.arrive(v_full.index(slot))

    @gluon.jit
    def _ws_consumer(q_smem, k_smem, v_smem, q_full, q_empty, k_full, v_full, kv_empty, O, LSE, qk_scale,
                     b, h, bh, blk0, blk1, S, W, sob, soh, sos, dtype: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                     QBUF: gl.constexpr, TILES: gl.constexpr, EVEN: gl.constexpr):
        """The warpgroup that multiplies: the rotated loop of ``_fwd_gluon`` over the ring's entries,
        releasing each slot once the products reading it are done."""
        WARPS: gl.constexpr = gl.num_warps()
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        for blk in range(blk0, blk1):
            r = blk - blk0
            m0 = blk * BLOCK_M
            lo, mid_lo, mid_hi, hi = _key_spans_gl(m0, S, W, BLOCK_M, BLOCK_N)
            n_tiles = gl.cdiv(hi - lo, BLOCK_N)
            qs = r % QBUF
            q_tile = q_smem.index(qs)
            mbarrier.wait(q_full.index(qs), (r // QBUF) & 1)
            offs_m = m0 + gl.arange(0, BLOCK_M, row_s)
            acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
            c0 = r * TILES
            slot0 = c0 % STAGES
            mbarrier.wait(k_full.index(slot0), (c0 // STAGES) & 1)
            s = warpgroup_mma(q_tile, k_smem.index(slot0).permute((1, 0)), zero_s, use_acc=False)
            if (lo < mid_lo) | (lo >= mid_hi):
                s = _masked(s, offs_m, lo, S, W, BLOCK_N, col_s, EVEN)
            m_i = gl.maximum(gl.full([BLOCK_M], -1.0e30, gl.float32, row_s), gl.max(s, 1) * qk_scale)
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_i, 1))
            l_i = gl.sum(p, 1)
            for j in range(1, n_tiles):
                c = c0 + j
                slot = c % STAGES
                prev = (c - 1) % STAGES
                start_n = lo + j * BLOCK_N
                mbarrier.wait(k_full.index(slot), (c // STAGES) & 1)
                s_tok = warpgroup_mma(q_tile, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False,
                                      is_async=True)
                mbarrier.wait(v_full.index(prev), ((c - 1) // STAGES) & 1)
                p_op = gl.convert_layout(p.to(dtype), p_layout)
                o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
                s = warpgroup_mma_wait(1, deps=[s_tok])
                if (start_n < mid_lo) | (start_n >= mid_hi):
                    s = _masked(s, offs_m, start_n, S, W, BLOCK_N, col_s, EVEN)
                m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
                alpha = gl.exp2(m_i - m_new)
                p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
                l_i = l_i * alpha + gl.sum(p, 1)
                m_i = m_new
                acc, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
                mbarrier.arrive(kv_empty.index(prev))
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            c_last = c0 + n_tiles - 1
            mbarrier.arrive(q_empty.index(qs))  # every score product of this block is done
            mbarrier.wait(v_full.index(c_last % STAGES), (c_last // STAGES) & 1)
            acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v_smem.index(c_last % STAGES), acc)
            mbarrier.arrive(kv_empty.index(c_last % STAGES))
            for j in range(n_tiles, TILES):  # entries the producer signalled without a copy
                c = c0 + j
                mbarrier.wait(k_full.index(c % STAGES), (c // STAGES) & 1)
                mbarrier.wait(v_full.index(c % STAGES), (c // STAGES) & 1)
                mbarrier.arrive(kv_empty.index(c % STAGES))
            l_safe = gl.where(l_i == 0.0, 1.0, l_i)
            gl.store(LSE + bh * S + offs_m, m_i + gl.log2(l_safe), mask=offs_m < S)
            out = (acc / gl.expand_dims(gl.convert_layout(l_safe, row_o), 1)).to(dtype)
            rows = m0 + gl.arange(0, BLOCK_M, row_o)
            cols = gl.arange(0, D, col_o)
            ptrs = O + b * sob + h * soh + gl.expand_dims(rows, 1) * sos + gl.expand_dims(cols, 0)
            gl.store(ptrs, out, mask=gl.expand_dims(rows, 1) < S)

    @gluon.jit
    def _fwd_ws(q_desc, k_desc, v_desc, O, LSE, sm_scale, S, W, GROUP, HQ, HKV, sob, soh, sos, NQB, CHUNK,
                D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                QBUF: gl.constexpr, TILES: gl.constexpr, EVEN: gl.constexpr):
        """Warp-specialised forward: a producer warp streams ``CHUNK`` query blocks' tiles into a
        ring of ``STAGES`` slots (``QBUF`` query buffers) while the warpgroup computes."""
        dtype: gl.constexpr = q_desc.dtype
        bh = gl.program_id(1)
        b = bh // HQ
        h = bh % HQ
        kv_row0 = (b * HKV + h // GROUP) * S
        blk0 = gl.program_id(0) * CHUNK
        blk1 = gl.minimum(blk0 + CHUNK, NQB)
        q_smem = gl.allocate_shared_memory(dtype, [QBUF, BLOCK_M, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], v_desc.layout)
        q_full = gl.allocate_shared_memory(gl.int64, [QBUF, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [QBUF, 1], mbarrier.MBarrierLayout())
        k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(QBUF):
            mbarrier.init(q_full.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_full.index(i), count=1)
            mbarrier.init(v_full.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=1)
        fence_async_shared()
        gl.warp_specialize([
            (_ws_consumer, (q_smem, k_smem, v_smem, q_full, q_empty, k_full, v_full, kv_empty, O, LSE,
                            sm_scale * 1.4426950408889634, b, h, bh, blk0, blk1, S, W, sob, soh, sos, dtype,
                            BLOCK_M, BLOCK_N, D, STAGES, QBUF, TILES, EVEN)),
            (_ws_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, k_full, v_full,
                            kv_empty, bh, kv_row0, blk0, blk1, S, W, BLOCK_M, BLOCK_N, D, STAGES, QBUF, TILES)),
        ], [1], [24])


@functools.lru_cache(maxsize=64)
def _smem_layout(rows: int, d: int, dtype_name: str):  # -> gl.NVMMASharedLayout
    return gl.NVMMASharedLayout.get_default_for([rows, d], getattr(gl, dtype_name))


def _descriptor(t: Tensor, rows: int) -> object:
    flat = t.view(-1, t.shape[-1])
    return GluonDescriptor.from_tensor(flat, [rows, t.shape[-1]], _smem_layout(rows, t.shape[-1], _GL_DTYPES[t.dtype]))


def launch_forward_gluon(q: Tensor, k: Tensor, v: Tensor, window: int, scale: float, *, block_n: int = 64,
                         warps: int = 4, stages: int = 3, q_regs: bool = False) -> tuple[Tensor, Tensor]:
    """The Gluon forward: ``(out, lse2)``, the LSE in log2 units (float32); query tiles of
    16 rows per warp (64 with 4 warps), key tiles of ``block_n`` rows, ``stages`` ring slots."""
    why = gluon_forward_unsupported(q)
    if why is not None:
        raise AttentionInputError(why)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise AttentionInputError(f"the Gluon forward needs contiguous 16-byte aligned operands; {name} is not")
    bsz, hq, s, d = q.shape
    block_m = 16 * warps
    o = torch.empty_like(q)
    lse2 = torch.empty((bsz, hq, s), device=q.device, dtype=torch.float32)
    grid = (-(-s // block_m), bsz * hq)
    _fwd_gluon[grid](_descriptor(q, block_m), _descriptor(k, block_n), _descriptor(v, block_n), o, lse2, scale, s,
                     window, hq // k.shape[1], hq, k.shape[1], *o.stride()[:3], D=d, BLOCK_M=block_m,
                     BLOCK_N=block_n, STAGES=stages, Q_REGS=q_regs, EVEN=s % block_m == 0 and s % block_n == 0,
                     num_warps=warps)
    return o, lse2


def launch_forward_gluon_chunked(q: Tensor, k: Tensor, v: Tensor, window: int, scale: float, *, block_n: int = 64,
                                 slots: int | None = None, chunk: int | None = None, warps: int = 4
                                 ) -> tuple[Tensor, Tensor]:
    """The Gluon forward with ``chunk`` query blocks per program and a key/value ring of
    ``slots`` tiles (default: one window's worth, each tile then loaded once per program)."""
    why = gluon_forward_unsupported(q)
    if why is not None:
        raise AttentionInputError(why)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise AttentionInputError(f"the Gluon forward needs contiguous 16-byte aligned operands; {name} is not")
    bsz, hq, s, d = q.shape
    block_m = 16 * warps
    need = ds_layout(s, window, Blocks(block_m, block_n))[1]  # the most key tiles one query block reads
    slots = need if slots is None else slots
    if slots < need:
        raise AttentionInputError(f"slots={slots} is fewer than the {need} key tiles one query block reads")
    nqb = -(-s // block_m)
    if chunk is None:  # about eight waves of one program per SM
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        chunk = max(1, min(nqb, -(-nqb * bsz * hq // (8 * sms))))
    o = torch.empty_like(q)
    lse2 = torch.empty((bsz, hq, s), device=q.device, dtype=torch.float32)
    grid = (-(-nqb // chunk), bsz * hq)
    _fwd_gluon_chunk[grid](_descriptor(q, block_m), _descriptor(k, block_n), _descriptor(v, block_n), o, lse2, scale,
                           s, window, hq // k.shape[1], hq, k.shape[1], *o.stride()[:3], nqb, chunk, D=d,
                           BLOCK_M=block_m, BLOCK_N=block_n, SLOTS=slots, num_warps=warps)
    return o, lse2


def launch_forward_gluon_ws(q: Tensor, k: Tensor, v: Tensor, window: int, scale: float, *, block_n: int = 64,
                            stages: int = 3, qbuf: int = 1, chunk: int | None = None) -> tuple[Tensor, Tensor]:
    """The warp-specialised Gluon forward (one producer warp, one warpgroup of 64 query rows)."""
    why = gluon_forward_unsupported(q)
    if why is not None:
        raise AttentionInputError(why)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise AttentionInputError(f"the Gluon forward needs contiguous 16-byte aligned operands; {name} is not")
    bsz, hq, s, d = q.shape
    block_m = 64
    nqb, tiles = ds_layout(s, window, Blocks(block_m, block_n))
    if chunk is None:  # about eight waves of two programs per SM
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        chunk = max(1, min(nqb, -(-nqb * bsz * hq // (16 * sms))))
    o = torch.empty_like(q)
    lse2 = torch.empty((bsz, hq, s), device=q.device, dtype=torch.float32)
    grid = (-(-nqb // chunk), bsz * hq)
    _fwd_ws[grid](_descriptor(q, block_m), _descriptor(k, block_n), _descriptor(v, block_n), o, lse2, scale,
                  s, window, hq // k.shape[1], hq, k.shape[1], *o.stride()[:3], nqb, chunk, D=d,
                  BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, QBUF=qbuf, TILES=tiles,
                  EVEN=s % block_m == 0 and s % block_n == 0, num_warps=4,
                  # 8 warps launch (the producer's warpgroup); 128 registers each at launch keep two
                  # programs per SM, and the warpgroup that multiplies then takes 232 from the producer's
                  maxnreg=128)
    return o, lse2
