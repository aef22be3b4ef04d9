#!/usr/bin/env python3
"""Lane-level numpy emulation of prefill_kernel (src/kernels/prefill_attention.cu, the portable kernel), for
checking the kernel's index logic on a machine without a GPU.

It mirrors the kernel by hand, statement by statement: the CTA's work item (prefill_cta: row tiles of whole
tokens, 128 // G of them, the rows past the tile's tokens padding: zero Q, never written; the order in bands),
the packed query rows (token r / G, member r % G), the XOR-swizzled shared-memory tiles and cp.async tile
loads (zero-filled past the last key), the stage ring (3 stages where two CTAs fit, else 2), the per-lane
ldmatrix addresses (chunk_patterns plus immediates), ldmatrix (.trans) and mma.sync m16n8k16 with the
fragment layouts of the PTX ISA, the diagonal masking, the online softmax with the lazy rescale, the bf16
rounding of q and P, and the output indexing. Each case compares against float64 causal GQA attention (q
rounded to bf16 as the kernel does) and fails on any unwritten output or nmse >= 1e-5 (P's bf16 rounding
gives ~1e-6).

It is not the kernel: keep it in step when the kernel changes. About 15 s for the default cases; they start
with check_cta_order (every row tile, head and split exactly once, for shapes of several bands too).

  prefill_kernel_emulation.py            # default cases (D 64 / 128, 64- and 32-key tiles, groups 1-8)
"""
import numpy as np

def bf16(x):
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32)

LANES = np.arange(32)
ROWS = 128                # kPrefillRows: packed query rows per row tile (CTA)
BAND_TILES = 128          # kPrefillBandTiles: row tiles per band of the CTA order


def tile_tokens(rows, G):
    """prefill_tile_tokens: tokens per row tile (whole tokens; rows - tokens * G rows of padding)."""
    return rows // G


def row_tiles(n, G, rows=ROWS):
    """Row tiles of a launch: ceil(n / T) (prefill_ctas / prefill_splits without the heads and splits)."""
    T = tile_tokens(rows, G)
    return (n + T - 1) // T


def prefill_cta(P, rows, keys, item):
    """prefill_cta (prefill_common.cuh): work item `item`'s key split, KV head, rows [r0, r_end) (whole tokens
    [t_lo, t_hi]; rows r_end .. r0 + rows - 1 are padding) and key tiles. P: group, n, pos0, hkv, splits."""
    G, n, pos0, hkv, splits = P['group'], P['n'], P['pos0'], P['hkv'], P.get('splits', 1)
    T = tile_tokens(rows, G)
    m_tiles = (n + T - 1) // T
    b, split = item // splits, item % splits
    band = b // (BAND_TILES * hkv)
    in_band = b - band * BAND_TILES * hkv
    band_tiles = min(BAND_TILES, m_tiles - band * BAND_TILES)  # the last: fewer
    h = in_band // band_tiles
    tile = band * BAND_TILES + in_band % band_tiles  # 0: the heaviest
    t_lo = (m_tiles - 1 - tile) * T
    t_hi = min(n - 1, t_lo + T - 1)
    kv_end = pos0 + t_hi + 1
    all_tiles = (kv_end + keys - 1) // keys
    per_split = (all_tiles + splits - 1) // splits
    j0 = min(all_tiles, split * per_split)
    return dict(split=split, h=h, r0=t_lo * G, r_end=(t_hi + 1) * G, kv_end=kv_end,
                first_masked=(pos0 + t_lo + 1) // keys, j0=j0, num_tiles=min(all_tiles, j0 + per_split))


def check_cta_order():
    """The work items of prefill_ctas cover every (KV head, row tile, split) once, row tiles of whole tokens
    covering [0, n G) with at most `rows` rows each (several bands where n is large)."""
    for G, n, hkv, splits in [(1, 300, 2, 1), (3, 129, 2, 2), (4, 40000, 2, 1), (7, 2400, 3, 2), (3, 6000, 1, 3),
                              (8, 17, 4, 5)]:
        P = dict(group=G, n=n, pos0=0, hkv=hkv, splits=splits)
        items = row_tiles(n, G) * hkv * splits
        seen = set()
        rows = {}
        for item in range(items):
            c = prefill_cta(P, ROWS, 64, item)
            key = (c['h'], c['r0'], c['split'])
            assert key not in seen, (G, n, hkv, splits, item)
            seen.add(key)
            assert c['r0'] % G == 0 and c['r_end'] % G == 0 and 0 < c['r_end'] - c['r0'] <= ROWS
            rows[(c['h'], c['split'])] = rows.get((c['h'], c['split']), 0) + c['r_end'] - c['r0']
        assert len(seen) == items and all(v == n * G for v in rows.values()) and len(rows) == hkv * splits

class Smem:
    def __init__(self, elems):
        self.a = np.full(elems, np.nan, dtype=np.float32)
    def ldsm(self, addr, trans=False):
        # addr: [32] byte addresses; returns regs [32, 4, 2] (lo, hi)
        out = np.zeros((32, 4, 2), dtype=np.float32)
        for i in range(4):
            rows = np.stack([self.a[addr[8 * i + r] // 2: addr[8 * i + r] // 2 + 8] for r in range(8)])  # [8 rows, 8 cols]
            for l in range(32):
                if not trans:
                    out[l, i] = rows[l // 4, 2 * (l % 4): 2 * (l % 4) + 2]
                else:
                    out[l, i, 0] = rows[2 * (l % 4), l // 4]
                    out[l, i, 1] = rows[2 * (l % 4) + 1, l // 4]
        return out

def mma(c, a, b0, b1):
    # c [32, 4] f32, a [32, 4, 2], b0/b1 [32, 2]
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for l in range(32):
        g, t = l // 4, l % 4
        A[g, 2 * t:2 * t + 2] = a[l, 0]; A[g + 8, 2 * t:2 * t + 2] = a[l, 1]
        A[g, 2 * t + 8:2 * t + 10] = a[l, 2]; A[g + 8, 2 * t + 8:2 * t + 10] = a[l, 3]
        B[2 * t:2 * t + 2, g] = b0[l]; B[2 * t + 8:2 * t + 10, g] = b1[l]
    C = A @ B
    for l in range(32):
        g, t = l // 4, l % 4
        c[l, 0:2] += C[g, 2 * t:2 * t + 2]; c[l, 2:4] += C[g + 8, 2 * t:2 * t + 2]

def shfl_xor(x, m):
    return x[LANES ^ m]

def swz(D, row, chunk):
    return row * D + ((chunk ^ (row & 7)) << 3)

def chunk_patterns(D, base, row, hi):
    return [base + row * D * 2 + (((2 * b + hi) ^ (row & 7)) << 4) for b in range(4)]

def pack(lo, hi):
    return np.stack([bf16(lo), bf16(hi)], axis=-1)

def cta(bidx, P, D, BN, q, K, V, out):
    BM, kThreads, kWarpRows = 128, 128, 32
    kChunks, kDT, kNT = D // 8, D // 8, BN // 8
    kQ, kKV = BM * D, BN * D
    S = 3 if (kQ + 6 * kKV) * 2 <= 113 * 1024 else 2
    sm = Smem(kQ + 2 * S * kKV)
    sq, sk0, sv0 = 0, kQ, kQ + S * kKV
    G, n, pos0, hq, hkv = P['group'], P['n'], P['pos0'], P['hq'], P['hkv']
    c = prefill_cta(P, BM, BN, bidx)
    h, r0, r_end, kv_end = c['h'], c['r0'], c['r_end'], c['kv_end']
    first_masked, j0, num_tiles = c['first_masked'], c['j0'], c['num_tiles']
    gk, gv = K[h], V[h]  # [stride, D] float32 (bf16 values)

    def load_kv_tile(skb, svb, kb):
        rpp = kThreads // kChunks
        for tid in range(kThreads):
            row0, c = tid // kChunks, tid % kChunks
            soff = swz(D, row0, c)
            tok0 = kb + row0
            for i in range(BN // rpp):
                valid = tok0 + i * rpp < kv_end
                src = gk[tok0 + i * rpp, c * 8:c * 8 + 8] if valid else np.zeros(8)
                srv = gv[tok0 + i * rpp, c * 8:c * 8 + 8] if valid else np.zeros(8)
                o = soff + i * rpp * D
                sm.a[skb + o: skb + o + 8] = src
                sm.a[svb + o: svb + o + 8] = srv

    for st in range(S - 1):
        if j0 + st < num_tiles:
            load_kv_tile(sk0 + st * kKV, sv0 + st * kKV, (j0 + st) * BN)
    for idx in range(BM * kChunks):
        row, ch = idx // kChunks, idx % kChunks
        r = r0 + row
        w = np.zeros(8, dtype=np.float32)  # q_chunk_bf16: zeros for the tile's padding rows
        if r < r_end:
            t = r // G
            qh = h * G + (r - t * G)
            w = bf16(q[t, qh, ch * 8:ch * 8 + 8])
        o = swz(D, row, ch)
        sm.a[sq + o: sq + o + 8] = w

    quad, tig = LANES >> 2, LANES & 3
    scale_log2 = np.float32(P['scale'] * 1.4426950408889634)
    warps = []
    for warp in range(4):
        wrow = warp * kWarpRows
        W = dict(wrow=wrow,
                 q_pat=chunk_patterns(D, sq * 2, wrow + (LANES & 15), LANES >> 4),
                 k_pat=chunk_patterns(D, sk0 * 2, (LANES & 7) + ((LANES >> 4) << 3), (LANES >> 3) & 1),
                 v_pat=chunk_patterns(D, sv0 * 2, (LANES & 7) + (((LANES >> 3) & 1) << 3), LANES >> 4),
                 o=np.zeros((2, kDT, 32, 4), dtype=np.float32),
                 rmax=np.full((2, 2, 32), -np.inf, dtype=np.float32),
                 rsum=np.zeros((2, 2, 32), dtype=np.float32))
        warps.append(W)
    stage = 0
    for j in range(j0, num_tiles):
        nxt = j + S - 1
        st = S - 1 if stage == 0 else stage - 1
        if nxt < num_tiles:
            load_kv_tile(sk0 + st * kKV, sv0 + st * kKV, nxt * BN)
        stage_off = stage * kKV * 2
        stage = 0 if stage + 1 == S else stage + 1
        kb = j * BN
        for W in warps:
            wrow = W['wrow']
            s = np.zeros((2, kNT, 32, 4), dtype=np.float32)
            for kk in range(D // 16):
                a = [sm.ldsm(W['q_pat'][kk & 3] + (kk >> 2) * 128 + mt * 16 * D * 2) for mt in range(2)]
                for np_ in range(kNT // 2):
                    bk = sm.ldsm(W['k_pat'][kk & 3] + stage_off + (kk >> 2) * 128 + np_ * 16 * D * 2)
                    for mt in range(2):
                        mma(s[mt, 2 * np_], a[mt], bk[:, 0], bk[:, 1])
                        mma(s[mt, 2 * np_ + 1], a[mt], bk[:, 2], bk[:, 3])
            if j >= first_masked:
                for mt in range(2):
                    for hf in range(2):
                        lim = pos0 + (r0 + wrow + mt * 16 + hf * 8 + quad) // G - kb - tig * 2
                        for nt in range(kNT):
                            for e in range(2):
                                m = (nt * 8 + e) > lim
                                s[mt, nt, m, hf * 2 + e] = -np.inf
            alpha = np.ones((2, 2, 32), dtype=np.float32)
            raised = np.zeros(32, dtype=bool)
            for mt in range(2):
                for hf in range(2):
                    mx = np.full(32, -np.inf, dtype=np.float32)
                    for nt in range(kNT):
                        mx = np.maximum(mx, np.maximum(s[mt, nt, :, hf * 2], s[mt, nt, :, hf * 2 + 1]))
                    mx = np.maximum(mx, shfl_xor(mx, 1)); mx = np.maximum(mx, shfl_xor(mx, 2))
                    with np.errstate(invalid='ignore'):
                        new_max = np.maximum(W['rmax'][mt, hf], mx * scale_log2)
                    base = np.where(new_max == -np.inf, 0, new_max).astype(np.float32)
                    up = new_max != W['rmax'][mt, hf]
                    with np.errstate(invalid='ignore'):
                        alpha[mt, hf] = np.where(up, np.exp2(W['rmax'][mt, hf] - base), 1.0).astype(np.float32)
                    raised |= up
                    W['rmax'][mt, hf] = new_max
                    W['rsum'][mt, hf] *= alpha[mt, hf]
                    ssum = np.zeros(32, dtype=np.float32)
                    for nt in range(kNT):
                        for e in (hf * 2, hf * 2 + 1):
                            pr = np.exp2(s[mt, nt, :, e] * scale_log2 - base).astype(np.float32)
                            s[mt, nt, :, e] = pr
                            ssum += pr
                    W['rsum'][mt, hf] += ssum
            if raised.any():
                for mt in range(2):
                    for e in range(4):
                        W['o'][mt, :, :, e] *= alpha[mt, e >> 1]
            pa = np.zeros((2, BN // 16, 32, 4, 2), dtype=np.float32)
            for mt in range(2):
                for kk in range(BN // 16):
                    pa[mt, kk, :, 0] = pack(s[mt, 2 * kk, :, 0], s[mt, 2 * kk, :, 1])
                    pa[mt, kk, :, 1] = pack(s[mt, 2 * kk, :, 2], s[mt, 2 * kk, :, 3])
                    pa[mt, kk, :, 2] = pack(s[mt, 2 * kk + 1, :, 0], s[mt, 2 * kk + 1, :, 1])
                    pa[mt, kk, :, 3] = pack(s[mt, 2 * kk + 1, :, 2], s[mt, 2 * kk + 1, :, 3])
            for kk in range(BN // 16):
                for dp in range(D // 16):
                    bv = sm.ldsm(W['v_pat'][dp & 3] + stage_off + (dp >> 2) * 128 + kk * 16 * D * 2, trans=True)
                    for mt in range(2):
                        mma(W['o'][mt, 2 * dp], pa[mt, kk], bv[:, 0], bv[:, 1])
                        mma(W['o'][mt, 2 * dp + 1], pa[mt, kk], bv[:, 2], bv[:, 3])
    for W in warps:
        wrow = W['wrow']
        for mt in range(2):
            for hf in range(2):
                l = W['rsum'][mt, hf].copy()
                l += shfl_xor(l, 1); l += shfl_xor(l, 2)
                inv = np.where(l > 0, 1 / l, 0)
                for lane in range(32):
                    r = r0 + wrow + mt * 16 + hf * 8 + (lane >> 2)
                    if r >= r_end:  # prefill_row_out: padding rows are never written
                        continue
                    t = r // G
                    qh = h * G + (r - t * G)
                    for dt in range(kDT):
                        d0 = dt * 8 + (lane & 3) * 2
                        out[t, qh, d0] = W['o'][mt, dt, lane, hf * 2] * inv[lane]
                        out[t, qh, d0 + 1] = W['o'][mt, dt, lane, hf * 2 + 1] * inv[lane]

def reference(q, K, V, G, pos0, scale):
    """float64 causal GQA attention of q [n, Hq, D] (rounded to bf16, as the kernels do) over K, V [Hkv, T, D]."""
    n, hq, _ = q.shape
    qb = bf16(q).astype(np.float64)
    ref = np.zeros(q.shape, dtype=np.float64)
    for i in range(n):
        for qh in range(hq):
            kk = K[qh // G, :pos0 + i + 1].astype(np.float64)
            s = kk @ qb[i, qh] * scale
            p = np.exp(s - s.max())
            ref[i, qh] = p @ V[qh // G, :pos0 + i + 1].astype(np.float64) / p.sum()
    return ref


def run(hkv, G, D, BN, pos0, n, seed, pad=3):
    rng = np.random.default_rng(seed)
    hq = hkv * G
    total = pos0 + n
    K = np.full((hkv, total + pad, D), np.nan, dtype=np.float32)
    V = K.copy()
    K[:, :total] = bf16(rng.standard_normal((hkv, total, D)))
    V[:, :total] = bf16(rng.standard_normal((hkv, total, D)))
    q = (2 * rng.standard_normal((n, hq, D))).astype(np.float32)
    out = np.full((n, hq, D), np.nan, dtype=np.float32)
    P = dict(group=G, n=n, pos0=pos0, hq=hq, hkv=hkv, splits=1, scale=1 / np.sqrt(D))
    ctas = row_tiles(n, G) * hkv  # prefill_ctas
    for b in range(ctas):
        cta(b, P, D, BN, q, K, V, out)
    ref = reference(q, K, V, G, pos0, P['scale'])
    err = out - ref
    nmse = (err ** 2).sum() / (ref ** 2).sum()
    print(f"hkv={hkv} G={G} D={D} BN={BN} pos0={pos0} n={n}: nan={np.isnan(out).sum()} nmse={nmse:.3e} "
          f"max={np.nanmax(np.abs(err)):.3e}")
    assert not np.isnan(out).any() and nmse < 1e-5

def main():
    check_cta_order()
    cases = [  # hkv, G, D, BN, pos0, n, seed; G = 3, 7: row tiles of 42 / 18 tokens, 2 padding rows each
        (1, 4, 128, 64, 3, 60, 11), (1, 1, 128, 64, 0, 200, 12), (1, 4, 64, 64, 0, 40, 1),
        (1, 1, 128, 32, 5, 70, 2), (2, 3, 64, 64, 37, 50, 3), (1, 8, 128, 32, 64, 20, 4),
        (1, 1, 64, 64, 100, 150, 5), (1, 8, 128, 64, 63, 41, 7), (1, 3, 64, 64, 1, 129, 8),
        (1, 7, 128, 64, 0, 40, 9), (2, 7, 64, 32, 20, 37, 10),
    ]
    for c in cases:
        run(*c)
    print("all cases passed")


if __name__ == "__main__":
    main()
