#!/usr/bin/env python3
"""Numpy emulation of prefill_hopper_kernel (src/kernels/prefill_attention_hopper.cu), for checking the Hopper
kernel's index logic on a machine without a GPU.

It mirrors the kernel's data movement, not its timing: the CTA's rows and key tiles (prefill_cta), the
tensor-map boxes (2 per K or V tile: 64 dims x KEYS tokens, 128-byte swizzle, zeros past the maps' extent pos0 + n)
placed into a byte-addressed shared memory, the wgmma operands read through the kernel's descriptors
(K-major for K, N-major for V, with the 128-byte swizzle applied to the absolute address, as the PTX ISA's
canonical layouts define them), Q's register fragments as q_pair loads them, the accumulator and P fragment
layouts per thread, the diagonal masking, the online softmax per row half with the quad's shuffles, the key
splits with their merge, and the output indexing. The warpgroups' turns and the mbarriers are not emulated
(every step runs in order). Each case compares against float64 causal GQA attention on the same bf16 q and
fails on an unwritten output or nmse >= 1e-5 (P's bf16 rounding gives ~1e-6).

It is not the kernel: keep it in step when the kernel changes. About 20 s for the default cases.

  prefill_hopper_emulation.py
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prefill_kernel_emulation import bf16, reference  # noqa: E402  (the bf16 rounding and the float64 reference)

D, ROWS = 128, 128
KEYS, STAGES = 176, 2  # the kernel's tile width (kHopperKeys) and stages per ring
BLOCK = KEYS * 128  # bytes of one 64-column block of a tile
TILE = 2 * BLOCK


def swizzle(addr):
    """The 128-byte swizzle of an absolute shared-memory byte address: bits [4, 7) ^= bits [7, 10)."""
    return addr ^ (((addr >> 7) & 7) << 4)


class Smem:
    """Shared memory as bf16 elements at byte addresses (NaN where nothing was written)."""

    def __init__(self, nbytes):
        self.a = np.full(nbytes // 2, np.nan, dtype=np.float32)

    def tma_box(self, dst, tensor, x, y, extent):
        """A box of 64 dims x KEYS tokens of tensor [tokens, 128] at (x, y) -> dst, 128-byte swizzled rows."""
        for r in range(KEYS):
            row = tensor[y + r, x:x + 64] if y + r < extent else np.zeros(64, dtype=np.float32)
            for c in range(8):
                addr = swizzle(dst + r * 128 + c * 16)
                self.a[addr // 2: addr // 2 + 8] = row[8 * c: 8 * c + 8]

    def k_major(self, start, n_rows):
        """B operand [n_rows, 16] of a K-major descriptor (stride-dimension offset 1024) at `start`."""
        out = np.empty((n_rows, 16), dtype=np.float32)
        for n in range(n_rows):
            for k in range(16):
                out[n, k] = self.a[swizzle(start + (n % 8) * 128 + (n // 8) * 1024 + 2 * k) // 2]
        return out

    def n_major(self, start, lead, n_cols):
        """B operand [16, n_cols] of an N-major descriptor (leading offset `lead`, stride offset 1024)."""
        out = np.empty((16, n_cols), dtype=np.float32)
        for k in range(16):
            for n in range(n_cols):
                out[k, n] = self.a[swizzle(start + (n % 64) * 2 + (n // 64) * lead + (k % 8) * 128 + (k // 8) * 1024) // 2]
        return out


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


def cta(bidx, p, q, K, V, out, parts):
    G, n, pos0, hq, hkv, splits = p['group'], p['n'], p['pos0'], p['hq'], p['hkv'], p['splits']
    # prefill_cta
    m_tiles = (n * G + ROWS - 1) // ROWS
    b, split = bidx // splits, bidx % splits
    h = b % hkv
    r0 = (m_tiles - 1 - b // hkv) * ROWS
    t_lo, t_hi = r0 // G, min(n - 1, (r0 + ROWS - 1) // G)
    kv_end = pos0 + t_hi + 1
    all_tiles = (kv_end + KEYS - 1) // KEYS
    first_masked = (pos0 + t_lo + 1) // KEYS
    per_split = (all_tiles + splits - 1) // splits
    j0 = min(all_tiles, split * per_split)
    num_tiles = min(all_tiles, j0 + per_split)
    extent = pos0 + n
    sm = Smem(2 * STAGES * TILE)
    sk, sv = 0, STAGES * TILE

    def q_bf16(r, col):  # q_pair: one element of packed row r
        t = r // G
        if t >= n:
            return 0.0
        return bf16(q[t, h * G + (r - t * G), col])

    for wg in range(2):
        # Q fragments -> the warpgroup's [64, 128] A matrix (rows row_base and + 8, k pairs 2 tig and 8 + 2 tig)
        A = np.array([[q_bf16(r0 + wg * 64 + r, c) for c in range(D)] for r in range(64)], dtype=np.float32)
        o = np.zeros((128, 64), dtype=np.float64)
        row_max = np.full((128, 2), -np.inf)
        row_sum = np.zeros((128, 2))
        for it, j in enumerate(range(j0, num_tiles)):
            st = it % STAGES
            for x in (0, 64):
                sm.tma_box(sk + st * TILE + (x // 64) * BLOCK, K[h], x, j * KEYS, extent)
                sm.tma_box(sv + st * TILE + (x // 64) * BLOCK, V[h], x, j * KEYS, extent)
            S = np.zeros((64, KEYS), dtype=np.float64)
            for kk in range(D // 16):
                Bk = sm.k_major(sk + st * TILE + (kk >> 2) * BLOCK + (kk & 3) * 32, KEYS)
                S += A[:, 16 * kk: 16 * kk + 16].astype(np.float64) @ Bk.T.astype(np.float64)
            s_row, s_col = acc_maps(KEYS)
            s = S.astype(np.float32)[s_row, s_col]  # [thread, element]
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
                new_max = np.maximum(row_max[:, hf], mx * p['scale_log2'])
                base = np.where(new_max == -np.inf, 0.0, new_max)
                up = new_max != row_max[:, hf]
                alpha[:, hf] = np.where(up, np.exp2(row_max[:, hf] - base), 1.0)
                row_max[:, hf] = new_max
                pr = np.exp2(s[:, cols] * p['scale_log2'] - base[:, None])
                s[:, cols] = pr
                row_sum[:, hf] = row_sum[:, hf] * alpha[:, hf] + pr.sum(axis=1)
            o *= alpha[:, (E // 2) % 2]
            # P fragments (bf16) back to the [64, KEYS] A matrix of O += P V
            Pm = np.zeros((64, KEYS), dtype=np.float32)
            Pm[s_row, s_col] = bf16(s)
            O = np.zeros((64, D), dtype=np.float64)
            for kk in range(KEYS // 16):
                Bv = sm.n_major(sv + st * TILE + kk * 16 * 128, BLOCK, D)
                O += Pm[:, 16 * kk: 16 * kk + 16].astype(np.float64) @ Bv.astype(np.float64)
            o += O[ACC_ROW, ACC_COL]
        # prefill_row_out
        for t_idx in range(128):
            for hf in range(2):
                quad = (t_idx // 4) * 4
                l = row_sum[quad: quad + 4, hf].sum()
                r = r0 + wg * 64 + (t_idx // 32) * 16 + (t_idx % 32) // 4 + hf * 8
                t = r // G
                if t >= n:
                    continue
                qh = h * G + (r - t * G)
                for i in range(D // 8):
                    for e in range(2):
                        col = 8 * i + 2 * (t_idx % 4) + e
                        val = o[t_idx, 4 * i + 2 * hf + e]
                        if splits > 1:
                            parts['o'][split, t, qh, col] = val
                        else:
                            out[t, qh, col] = val / l if l > 0 else 0.0
                if splits > 1:
                    parts['ml'][split, t, qh] = (row_max[t_idx, hf], l)


def run(hkv, G, pos0, n, splits, seed, pad=3):
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
    ctas = (n * G + ROWS - 1) // ROWS * hkv * splits
    for b in range(ctas):
        cta(b, p, q, K, V, out, parts)
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
    cases = [  # hkv, G, pos0, n, splits, seed
        (1, 4, 0, 40, 1, 1), (1, 1, 3, 200, 1, 2), (1, 8, 127, 20, 1, 3), (2, 3, 60, 50, 1, 4),
        (1, 4, 300, 8, 2, 5), (1, 1, 129, 130, 1, 6), (1, 1, 170, 200, 1, 7), (1, 2, 350, 30, 3, 8),
    ]
    for c in cases:
        run(*c)
    print("all cases passed")


if __name__ == "__main__":
    main()
