#!/usr/bin/env python3
"""Numpy emulation of prefill_hopper_kernel (src/kernels/prefill_attention_hopper.cu), for checking the Hopper
kernel's index logic on a machine without a GPU.

It mirrors the kernel's data movement, not its timing: the work items (prefill_cta: row tiles of whole tokens,
T = 128 // G of them, the rows past them padding) taken in turn by persistent CTAs whose shared memory lives
across items, the tensor-map boxes placed into a byte-addressed shared memory with the 128-byte swizzle (K, V: 2
per tile, 64 dims x KEYS tokens, zeros past the maps' extent pos0 + n; Q: q rounded to bf16, q_bf16 [n][Hq][128],
through its 4-D map {128, G, Hkv, n}, one box {64, G, 1, T} at (x, 0, h, r0 / G) per 64-column block of the
128-row Q tile, row t G + g, zeros past the n tokens; the tile's padding rows T G .. 127 zeroed once at the CTA's
start), the wgmma operands read through the kernel's descriptors (K-major for Q, the A operand of warpgroup wg at
sq + 64 wg 128 + (kk >> 2) kQBlockBytes + 32 (kk & 3), and for K; N-major for V; the 128-byte swizzle applied to
the absolute address, as the PTX ISA's canonical layouts define them), the accumulator and P fragment layouts per
thread, the diagonal masking, the online softmax per row half with the quad's shuffles, the key splits with their
merge, and the output indexing (padding rows never written). The warpgroups' turns and the mbarriers are not
emulated (every step runs in order, each tile's boxes placed just before its products, so the rings' stage
choice is not checked). Each case compares against float64 causal GQA attention on the same bf16 q and fails on
an unwritten output or nmse >= 1e-5 (P's bf16 rounding gives ~1e-6).

It is not the kernel: keep it in step when the kernel changes. About 3 s for the default cases.

  prefill_hopper_emulation.py
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prefill_kernel_emulation import bf16, prefill_cta, reference, row_tiles  # noqa: E402  (shared with the portable)

D, ROWS = 128, 128
KEYS, STAGES = 176, 2  # the kernel's tile width (kHopperKeys) and stages per ring
BLOCK = KEYS * 128  # bytes of one 64-column block of a K or V tile (kBlockBytes)
TILE = 2 * BLOCK
RESCALE_SLACK = 8.0  # log2 units the tile max must pass the running max by to move it (the kernel's slack)
QBLOCK = ROWS * 128  # bytes of one 64-column block of the Q tile (kQBlockBytes)
QBYTES = 2 * QBLOCK
SK, SV, SQ = 0, STAGES * TILE, 2 * STAGES * TILE  # sk_addr, sv_addr, sq_addr (1024-byte aligned)


def swizzle(addr):
    """The 128-byte swizzle of an absolute shared-memory byte address: bits [4, 7) ^= bits [7, 10)."""
    return addr ^ (((addr >> 7) & 7) << 4)


class Smem:
    """Shared memory as bf16 elements at byte addresses (NaN where nothing was written)."""

    def __init__(self, nbytes):
        self.a = np.full(nbytes // 2, np.nan, dtype=np.float32)

    def put_rows(self, dst, rows):
        """rows [R, 64] as a tensor-map copy writes a box of 128-byte rows with the 128-byte swizzle: row r at
        dst + 128 r, its 16-byte chunk c at swizzle(dst + 128 r + 16 c) (the absolute address's bits)."""
        r = np.arange(rows.shape[0])[:, None]
        addr = swizzle(dst + r * 128 + np.arange(8)[None, :] * 16)  # [R, 8 chunks]
        self.a[(addr // 2)[:, :, None] + np.arange(8)] = rows.reshape(-1, 8, 8)

    def tma_box(self, dst, tensor, x, y, extent):
        """A box of 64 dims x KEYS tokens of tensor [tokens, 128] at (x, y) -> dst (K, V: 3-D maps, one head);
        zeros past the map's extent (tokens pos0 + n)."""
        rows = np.zeros((KEYS, 64), dtype=np.float32)
        valid = max(0, min(KEYS, extent - y))
        rows[:valid] = tensor[y:y + valid, x:x + 64]
        self.put_rows(dst, rows)

    def tma_box_q(self, dst, qb, x, h, t0, G, T):
        """Q's 4-D map (dims {128, G, Hkv, n} of qb [n][Hq][128] bf16, box {64, G, 1, T}): the box at
        (x, 0, h, t0) -> dst, element (d, g, 0, t) at row t G + g; zeros past the n tokens."""
        n = qb.shape[0]
        rows = np.zeros((T, G, 64), dtype=np.float32)
        valid = max(0, min(T, n - t0))
        rows[:valid] = qb[t0:t0 + valid, h * G:(h + 1) * G, x:x + 64]
        self.put_rows(dst, rows.reshape(T * G, 64))

    def k_major(self, start, n_rows):
        """Operand [n_rows, 16] of a K-major descriptor (stride-dimension offset 1024) at `start`: A (Q, 64 rows)
        or B (K, n_rows keys)."""
        n = np.arange(n_rows)[:, None]
        k = np.arange(16)[None, :]
        return self.a[swizzle(start + (n % 8) * 128 + (n // 8) * 1024 + 2 * k) // 2]

    def n_major(self, start, lead, n_cols):
        """B operand [16, n_cols] of an N-major descriptor (leading offset `lead`, stride offset 1024)."""
        k = np.arange(16)[:, None]
        n = np.arange(n_cols)[None, :]
        return self.a[swizzle(start + (n % 64) * 2 + (n // 64) * lead + (k % 8) * 128 + (k // 8) * 1024) // 2]


# Thread t of a warpgroup (warp w = t // 32, lane l): its rows w * 16 + l // 4 and + 8, accumulator element
# [4 i + 2 hf + e] at column 8 i + 2 (l % 4) + e of row half hf: acc_maps(cols) gives each element's row and
# column, [128 threads, cols / 2 elements] each (O: cols = D; S: cols = KEYS).
T = np.arange(128)
E = np.arange(64)


def acc_maps(cols):
    e = np.arange(cols // 2)
    row = (T[:, None] // 32) * 16 + (T[:, None] % 32) // 4 + 8 * ((e[None, :] // 2) % 2)
    col = 8 * (e[None, :] // 4) + 2 * (T[:, None] % 4) + e[None, :] % 2
    return row, col


ACC_ROW, ACC_COL = acc_maps(D)
S_ROW, S_COL = acc_maps(KEYS)


class Cta:
    """One persistent CTA: its shared memory (K and V rings, the Q tile) lives across the items it takes, the Q
    tile's padding rows zeroed once at its start, and the rings' positions run on across items."""

    def __init__(self, G):
        self.sm = Smem(SQ + QBYTES)
        tokens = ROWS // G  # prefill_tile_tokens
        q_rows = tokens * G
        for cb in range(2):  # rows T G .. ROWS - 1 of both column blocks: no box writes them
            lo = (SQ + cb * QBLOCK + q_rows * 128) // 2
            self.sm.a[lo: lo + (ROWS - q_rows) * 64] = 0.0
        self.consumed = 0  # ring positions (tiles) of the earlier items


def item(cta, bidx, p, qb, K, V, out, parts):
    """Work item bidx on persistent CTA `cta`."""
    G, n, pos0, splits = p['group'], p['n'], p['pos0'], p['splits']
    c = prefill_cta(p, ROWS, KEYS, bidx)
    h, r0, r_end, split = c['h'], c['r0'], c['r_end'], c['split']
    first_masked, j0, num_tiles = c['first_masked'], c['j0'], c['num_tiles']
    n_it = num_tiles - j0
    extent = pos0 + n
    sm, t0 = cta.sm, cta.consumed
    # The producer's Q tile: one box per 64-column block at (x, 0, h, r0 / G) (only for an item with key tiles)
    if n_it > 0:
        for x in (0, 64):
            sm.tma_box_q(SQ + (x // 64) * QBLOCK, qb, x, h, r0 // G, G, ROWS // G)
    o = np.zeros((2, 128, 64), dtype=np.float64)  # [warpgroup, thread, element]
    row_max = np.full((2, 128, 2), -np.inf)
    row_sum = np.zeros((2, 128, 2))
    for it, j in enumerate(range(j0, num_tiles)):
        st = (t0 + it) % STAGES  # ring position t0 + it
        for x in (0, 64):
            sm.tma_box(SK + st * TILE + (x // 64) * BLOCK, K[h], x, j * KEYS, extent)
            sm.tma_box(SV + st * TILE + (x // 64) * BLOCK, V[h], x, j * KEYS, extent)
        for wg in range(2):
            q_addr = SQ + wg * 64 * 128  # the warpgroup's 64 Q rows
            S = np.zeros((64, KEYS), dtype=np.float64)
            for kk in range(D // 16):
                Aq = sm.k_major(q_addr + (kk >> 2) * QBLOCK + (kk & 3) * 32, 64)
                Bk = sm.k_major(SK + st * TILE + (kk >> 2) * BLOCK + (kk & 3) * 32, KEYS)
                S += Aq.astype(np.float64) @ Bk.T.astype(np.float64)
            s = S.astype(np.float32)[S_ROW, S_COL]  # [thread, element]
            if j >= first_masked:
                for hf in range(2):
                    lim = pos0 + (r0 + wg * 64 + (T // 32) * 16 + (T % 32) // 4 + hf * 8) // G - j * KEYS - (T % 4) * 2
                    for i in range(KEYS // 8):
                        for e in range(2):
                            mask = i * 8 + e > lim
                            s[mask, 4 * i + 2 * hf + e] = -np.inf
            alpha = np.ones((128, 2), dtype=np.float32)
            for hf in range(2):
                cols = [4 * i + 2 * hf + e for i in range(KEYS // 8) for e in range(2)]
                mx = s[:, cols].max(axis=1)
                mx = mx.reshape(32, 4).max(axis=1).repeat(4)  # the quad's shuffles
                tile_max = mx * p['scale_log2']
                up = tile_max > row_max[wg, :, hf] + RESCALE_SLACK  # the running max moves only past the slack
                new_max = np.where(up, tile_max, row_max[wg, :, hf])
                base = np.where(new_max == -np.inf, 0.0, new_max)
                alpha[:, hf] = np.where(up, np.exp2(row_max[wg, :, hf] - base), 1.0)
                row_max[wg, :, hf] = new_max
                pr = np.exp2(s[:, cols] * p['scale_log2'] - base[:, None])
                s[:, cols] = pr
                row_sum[wg, :, hf] = row_sum[wg, :, hf] * alpha[:, hf] + pr.sum(axis=1)
            o[wg] *= alpha[:, (E // 2) % 2]
            # P fragments (bf16) back to the [64, KEYS] A matrix of O += P V
            Pm = np.zeros((64, KEYS), dtype=np.float32)
            Pm[S_ROW, S_COL] = bf16(s)
            O = np.zeros((64, D), dtype=np.float64)
            for kk in range(KEYS // 16):
                Bv = sm.n_major(SV + st * TILE + kk * 16 * 128, BLOCK, D)
                O += Pm[:, 16 * kk: 16 * kk + 16].astype(np.float64) @ Bv.astype(np.float64)
            o[wg] += O[ACC_ROW, ACC_COL]
    cta.consumed += n_it
    # write_out: prefill_row_out per thread and row half (padding rows r >= r_end: nothing stored)
    for wg in range(2):
        for t_idx in range(128):
            for hf in range(2):
                quad = (t_idx // 4) * 4
                l = row_sum[wg, quad: quad + 4, hf].sum()
                r = r0 + wg * 64 + (t_idx // 32) * 16 + (t_idx % 32) // 4 + hf * 8
                if r >= r_end:
                    continue
                t = r // G
                qh = h * G + (r - t * G)
                for i in range(D // 8):
                    for e in range(2):
                        col = 8 * i + 2 * (t_idx % 4) + e
                        val = o[wg, t_idx, 4 * i + 2 * hf + e]
                        if splits > 1:
                            parts['o'][split, t, qh, col] = val
                        else:
                            out[t, qh, col] = val / l if l > 0 else 0.0
                if splits > 1:
                    parts['ml'][split, t, qh] = (row_max[wg, t_idx, hf], l)


def run(hkv, G, pos0, n, splits, seed, pad=3, sms=2):
    """One case: the launch's items (prefill_ctas) taken in turn by `sms` persistent CTAs (the kernel's counter
    hands them out in order; which CTA takes which does not change the result), then the split merge."""
    rng = np.random.default_rng(seed)
    hq = hkv * G
    total = pos0 + n
    K = np.full((hkv, total + pad + KEYS, D), np.nan, dtype=np.float32)  # NaN past the tokens
    V = K.copy()
    K[:, :total] = bf16(rng.standard_normal((hkv, total, D)))
    V[:, :total] = bf16(rng.standard_normal((hkv, total, D)))
    q = (2 * rng.standard_normal((n, hq, D))).astype(np.float32)
    out = np.full((n, hq, D), np.nan, dtype=np.float32)
    parts = {'o': np.zeros((splits, n, hq, D)), 'ml': np.zeros((splits, n, hq, 2))}
    scale = 1 / np.sqrt(D)
    p = dict(group=G, n=n, pos0=pos0, hq=hq, hkv=hkv, splits=splits, scale_log2=np.float32(scale * np.log2(np.e)))
    qb = bf16(q)  # q_bf16: q rounded to bf16 (nearest even), [n][Hq][128]
    items = row_tiles(n, G, ROWS) * hkv * splits  # prefill_ctas
    ctas = [Cta(G) for _ in range(min(items, sms))]
    for b in range(items):
        item(ctas[b % len(ctas)], b, p, qb, K, V, out, parts)
    if splits > 1:  # prefill_merge_splits
        m = parts['ml'][..., 0].max(axis=0)
        base = np.where(m == -np.inf, 0.0, m)
        w = np.exp2(parts['ml'][..., 0] - base)
        l = (parts['ml'][..., 1] * w).sum(axis=0)
        acc = (parts['o'] * w[..., None]).sum(axis=0)
        out = np.where(l[..., None] > 0, acc / np.where(l > 0, l, 1)[..., None], 0.0)
    ref = reference(q, K, V, G, pos0, scale)
    err = out - ref
    nmse = (err ** 2).sum() / (ref ** 2).sum()
    print(f"keys={KEYS} hkv={hkv} G={G} pos0={pos0} n={n} splits={splits}: nan={np.isnan(out).sum()} nmse={nmse:.3e} "
          f"max={np.nanmax(np.abs(err)):.3e}")
    assert not np.isnan(out).any() and nmse < 1e-5


def main():
    cases = [  # hkv, G, pos0, n, splits, seed[, sms]; row tiles of 128 // G tokens (G = 3, 5, 6, 7: padding rows)
        (1, 4, 0, 40, 1, 1), (1, 1, 3, 200, 1, 2), (1, 8, 127, 20, 1, 3), (2, 3, 60, 50, 1, 4),
        (1, 4, 300, 8, 2, 5), (1, 1, 129, 130, 1, 6), (1, 1, 170, 200, 1, 7), (1, 2, 350, 30, 3, 8),
        (1, 4, 10, 100, 1, 9), (2, 4, 180, 70, 2, 10, 3), (1, 3, 5, 150, 1, 11), (1, 3, 400, 90, 3, 12, 1),
        (1, 7, 0, 60, 1, 13), (2, 7, 200, 40, 2, 14), (1, 7, 171, 37, 1, 15, 1), (1, 5, 30, 60, 1, 16),
        (2, 6, 90, 45, 1, 17, 3), (1, 4, 1000, 300, 1, 18, 3), (1, 7, 500, 200, 4, 19, 3),
    ]
    for c in cases:
        run(*c[:6], sms=c[6] if len(c) > 6 else 2)
    print("all cases passed")


if __name__ == "__main__":
    main()
