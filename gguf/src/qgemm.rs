//! Matrix products of the GGUF weights' integer quants with 16-bit integer activations, for
//! multi-row passes (scoring).
//!
//! Every weight row is stored as blocks of 32 16-bit integers `w` with an f32 scale per block
//! and, for Q4_K, an f32 min per block: value `j` of block `b` is `scale[b] * w[j] - min[b]`
//! (the mins enter as `-min[b] * (sum of the block's activations)`, 8 blocks at a time),
//! the value ggml's dequantization gives (the integers carry the formats' integer sub-scales:
//! Q6_K's `sc * (q - 32)`, Q4_K's `sc * q` with its super-block's `d` as the scale). Each
//! activation row is rounded to `D * a` with one f32 scale `D` per row and 16-bit integers `a`
//! (`|a| <= 32767`, so a value is off by at most 1/65534 of the row's largest). A block's dot
//! product is an exact integer sum of 32 products (AVX2 `vpmaddwd`), converted to f32, scaled by
//! the weight block's scale and accumulated in f32; the row's `D` is applied once at the end.
//! That is five vector instructions per 32 multiply-adds and pair of rows and columns, against
//! four FMAs for f32 weights, but on two more execution ports, and weights take 2 bytes each
//! rather than 4; scores stay within ~1e-3 of an f32 product of the same weights (8-bit
//! activations, llama.cpp's choice, would move them by ~0.1 nats a request).
//!
//! Why hand-written: candle 0.11's quantized matmul works a row at a time (each weight block is
//! read once per activation row, with 8-bit activations) and has no AVX2 kernel for Q5_0; its f32
//! GEMM on dequantized weights runs at ~15 GMAC/s a core here. No maintained Rust crate offers
//! tiled kernels on GGUF block formats (llama.cpp's are C++ inside ggml).
//!
//! Each output element is computed by the same sequence of operations whatever rows and columns
//! share its tile or thread, and the scalar fallback repeats that sequence (fused multiply-adds
//! included), so results are deterministic, independent of batch composition, and the same
//! with or without AVX2.

use anyhow::{Result, bail};
use candle_core::quantized::{GgmlDType, QTensor};
use rayon::prelude::*;

/// Values per block.
const QK: usize = 32;
/// Rows and columns of the AVX2 kernel's register tile.
const RM: usize = 4;
const RN: usize = 2;
/// Columns per parallel task.
const TASK_COLS: usize = 32;

/// 16 16-bit integers, 32-byte aligned (one AVX2 register).
#[derive(Clone, Copy, Default)]
#[repr(C, align(32))]
struct Half([i16; 16]);

/// A weight matrix `[n, k]` in the block form above.
pub(crate) struct QMatrix {
    /// Output features.
    pub n: usize,
    /// Input features.
    pub k: usize,
    nb: usize,
    /// `nb` rounded up to a multiple of 8 (the min correction is an 8-lane dot product).
    nbp: usize,
    /// `n * nb * 2` halves of blocks.
    w: Vec<Half>,
    scales: Vec<f32>,
    /// Minus the mins, `n * nbp` (zero-padded); empty for formats without mins.
    neg_mins: Vec<f32>,
}

/// Activation rows `[m, k]` as 16-bit integers with a scale per row.
pub(crate) struct QActs {
    m: usize,
    k: usize,
    nbp: usize,
    /// `m * k / 16` halves of blocks.
    a: Vec<Half>,
    /// Per row.
    d: Vec<f32>,
    /// Per row and block (`m * nbp`, zero-padded): the sum of the block's integers (exact in
    /// f32), for the min correction.
    sums: Vec<f32>,
}

impl QActs {
    /// Rounds `x` (`m` rows of `k`, row-major).
    pub fn quantize(x: &[f32], m: usize, k: usize) -> QActs {
        assert!(k.is_multiple_of(QK) && x.len() == m * k);
        let nb = k / QK;
        let nbp = nb.div_ceil(8) * 8;
        let mut q = QActs {
            m,
            k,
            nbp,
            a: vec![Half::default(); m * k / 16],
            d: vec![0.0; m],
            sums: vec![0.0; m * nbp],
        };
        let rows =
            q.a.par_chunks_mut(k / 16)
                .zip(q.d.par_iter_mut())
                .zip(q.sums.par_chunks_mut(nbp));
        rows.zip(x.par_chunks(k)).for_each(|(((a, d), sums), x)| {
            // The largest magnitude, 8 lanes at a time (so that it vectorises).
            let mut lanes = [0f32; 8];
            for c in x.as_chunks::<8>().0 {
                for l in 0..8 {
                    lanes[l] = lanes[l].max(c[l].abs());
                }
            }
            let amax = lanes.iter().fold(0f32, |m, &v| m.max(v));
            *d = amax / 32767.0;
            let id = if *d > 0.0 { 1.0 / *d } else { 0.0 };
            // SAFETY: `Half` is 16 i16s, `repr(C)`.
            let a: &mut [i16] =
                unsafe { std::slice::from_raw_parts_mut(a.as_mut_ptr() as *mut i16, a.len() * 16) };
            for (o, &v) in a.iter_mut().zip(x) {
                // Round to nearest, ties to even (|v * id| <= 32767 + rounding): adding and
                // subtracting 1.5 * 2^23 leaves the nearest integer, without a libm call.
                const MAGIC: f32 = 12_582_912.0;
                *o = ((v * id + MAGIC) - MAGIC).clamp(-32767.0, 32767.0) as i16;
            }
            for (sum, blk) in sums.iter_mut().zip(a.as_chunks::<QK>().0) {
                *sum = blk.iter().map(|&v| v as i32).sum::<i32>() as f32;
            }
        });
        q
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.m
    }
}

/// The little-endian IEEE half at `b[i..i + 2]`, exactly (every half is an f32).
fn f16_at(b: &[u8], i: usize) -> f32 {
    let h = u16::from_le_bytes([b[i], b[i + 1]]) as u32;
    let (sign, exp, man) = ((h >> 15) << 31, (h >> 10) & 0x1F, h & 0x3FF);
    let bits = match exp {
        0 if man == 0 => sign,
        // Subnormal: man * 2^-24.
        0 => {
            let v = man as f32 * f32::powi(2.0, -24);
            return if sign != 0 { -v } else { v };
        }
        0x1F => sign | 0x7F80_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// ggml's 6-bit scale and min `j` of a Q4_K super-block.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

impl QMatrix {
    /// The block form of a GGUF weight `[n, k]` (Q8_0, Q5_0, Q4_K, Q6_K); `None` for other
    /// formats.
    pub fn from_qtensor(t: &QTensor) -> Result<Option<QMatrix>> {
        let (n, k) = t.shape().dims2()?;
        let super_blocks = matches!(t.dtype(), GgmlDType::Q4K | GgmlDType::Q6K);
        if !k.is_multiple_of(if super_blocks { 256 } else { QK }) {
            return Ok(None);
        }
        let nb = k / QK;
        let nbp = nb.div_ceil(8) * 8;
        let data = t.data()?;
        let mut m = QMatrix {
            n,
            k,
            nb,
            nbp,
            w: vec![Half::default(); n * nb * 2],
            scales: vec![0.0; n * nb],
            neg_mins: vec![],
        };
        // Block `i` (row-major over rows and blocks): its scale and its 32 integers.
        let mut put = |i: usize, scale: f32, vals: &dyn Fn(usize) -> i16| {
            m.scales[i] = scale;
            for j in 0..QK {
                m.w[2 * i + j / 16].0[j % 16] = vals(j);
            }
        };
        match t.dtype() {
            GgmlDType::Q8_0 => {
                for (i, blk) in data.chunks_exact(34).enumerate() {
                    put(i, f16_at(blk, 0), &|j| blk[2 + j] as i8 as i16);
                }
            }
            GgmlDType::Q5_0 => {
                // f16 scale, 4 bytes of high bits, 16 bytes of low nibbles; value j is
                // `d * ((low nibble | high bit << 4) - 16)` (ggml's `dequantize_row_q5_0`).
                for (i, blk) in data.chunks_exact(22).enumerate() {
                    let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                    put(i, f16_at(blk, 0), &|j| {
                        let (lo, hi) = if j < 16 {
                            (blk[6 + j] & 0x0F, (qh >> j) & 1)
                        } else {
                            (blk[6 + j - 16] >> 4, (qh >> j) & 1)
                        };
                        (lo as u32 | (hi << 4)) as i16 - 16
                    });
                }
            }
            GgmlDType::Q4K => {
                // d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles: value
                // is `d * sc * q - dmin * m` per 32 (ggml's `dequantize_row_q4_K`).
                let mut mins = vec![0.0; n * nbp];
                for (s, blk) in data.chunks_exact(144).enumerate() {
                    let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
                    let (sc, qs) = (&blk[4..16], &blk[16..144]);
                    let (row, sb) = (s / (k / 256), s % (k / 256));
                    for j in 0..8 {
                        let (scale, mn) = scale_min_k4(j, sc);
                        let b = sb * 8 + j;
                        mins[row * nbp + b] = -(dmin * mn as f32);
                        let src = &qs[(j / 2) * 32..(j / 2) * 32 + 32];
                        put(row * nb + b, d, &|l| {
                            scale as i16
                                * if j % 2 == 0 {
                                    src[l] & 0xF
                                } else {
                                    src[l] >> 4
                                } as i16
                        });
                    }
                }
                m.neg_mins = mins;
            }
            GgmlDType::Q6K => {
                // 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales (one per 16
                // values), d (f16): value is `d * sc * (q - 32)` (ggml's `dequantize_row_q6_K`).
                for (s, blk) in data.chunks_exact(210).enumerate() {
                    let (ql, qh, sc) = (&blk[0..128], &blk[128..192], &blk[192..208]);
                    let d = f16_at(blk, 208);
                    let (row, sb) = (s / (k / 256), s % (k / 256));
                    for half in 0..2 {
                        let (ql, qh, sc) = (&ql[64 * half..], &qh[32 * half..], &sc[8 * half..]);
                        // Blocks of 32 within this 128: l, l+32, l+64, l+96 for l in 0..32.
                        for (jb, (lo_off, shift_lo, shift_h)) in
                            [(0, 0, 0), (32, 0, 2), (0, 4, 4), (32, 4, 6)]
                                .into_iter()
                                .enumerate()
                        {
                            let b = sb * 8 + half * 4 + jb;
                            put(row * nb + b, d, &|l| {
                                let q = ((ql[l + lo_off] >> shift_lo) & 0xF)
                                    | (((qh[l] >> shift_h) & 3) << 4);
                                sc[2 * jb + l / 16] as i8 as i16 * (q as i16 - 32)
                            });
                        }
                    }
                }
            }
            _ => return Ok(None),
        }
        Ok(Some(m))
    }

    /// The f32 values `scale * w - min` (see the module docs).
    #[cfg(test)]
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n * self.k];
        for r in 0..self.n {
            for b in 0..self.nb {
                let i = r * self.nb + b;
                let neg_min = if self.neg_mins.is_empty() {
                    0.0
                } else {
                    self.neg_mins[r * self.nbp + b]
                };
                for j in 0..QK {
                    out[r * self.k + b * QK + j] =
                        self.scales[i] * self.w[2 * i + j / 16].0[j % 16] as f32 + neg_min;
                }
            }
        }
        out
    }

    /// `x @ W^T`: `[x.rows(), n]`, row-major.
    pub fn matmul(&self, x: &QActs) -> Result<Vec<f32>> {
        if x.k != self.k {
            bail!(
                "matmul: activations of width {} against a weight of width {}",
                x.k,
                self.k
            );
        }
        let (m, n) = (x.m, self.n);
        let mut out = vec![0f32; m * n];
        let ptr = SendPtr(out.as_mut_ptr());
        (0..n.div_ceil(TASK_COLS)).into_par_iter().for_each(|t| {
            let (c_lo, c_hi) = (t * TASK_COLS, ((t + 1) * TASK_COLS).min(n));
            // SAFETY: each task writes only its own columns of `out`.
            // `(&ptr).0`, not `ptr.0`: the closure must capture the Sync wrapper, not the raw
            // pointer field (which a disjoint capture would take, and which is not Sync).
            #[allow(clippy::needless_borrow)]
            unsafe {
                self.columns(x, c_lo, c_hi, (&ptr).0, n)
            };
        });
        Ok(out)
    }

    /// `x @ W^T` `width` columns at a time, without keeping the whole product: `f` gets the
    /// chunk's first column and its values (`x.rows()` rows of the chunk's width, row-major);
    /// returns `f`'s results in column order. Chunks are the same whatever the thread count.
    pub fn map_column_chunks<R: Send>(
        &self,
        x: &QActs,
        width: usize,
        f: impl Fn(usize, &[f32]) -> R + Sync,
    ) -> Result<Vec<R>> {
        if x.k != self.k {
            bail!(
                "matmul: activations of width {} against a weight of width {}",
                x.k,
                self.k
            );
        }
        let (m, n) = (x.m, self.n);
        Ok((0..n.div_ceil(width))
            .into_par_iter()
            .map(|t| {
                let (c_lo, c_hi) = (t * width, ((t + 1) * width).min(n));
                let mut buf = vec![0f32; m * (c_hi - c_lo)];
                let out = buf.as_mut_ptr().wrapping_sub(c_lo);
                for s in (c_lo..c_hi).step_by(TASK_COLS) {
                    // SAFETY: `buf` holds `m` rows of the chunk's width.
                    unsafe { self.columns(x, s, (s + TASK_COLS).min(c_hi), out, c_hi - c_lo) };
                }
                f(c_lo, &buf)
            })
            .collect())
    }

    /// Columns `c_lo..c_hi` of all rows: element `(r, c)` goes to `out + r * ldo + c`.
    /// The tile's rows of activations stay in L1 while it walks the chunk's columns, whose
    /// weights stay in L1 or L2 while it walks the rows.
    unsafe fn columns(&self, x: &QActs, c_lo: usize, c_hi: usize, out: *mut f32, ldo: usize) {
        let avx2 = has_avx2();
        let mut r0 = 0;
        while r0 < x.m {
            let rm = RM.min(x.m - r0);
            let mut c0 = c_lo;
            while c0 < c_hi {
                let rn = RN.min(c_hi - c0);
                unsafe { self.tile(x, r0, rm, c0, rn, out, ldo, avx2) };
                c0 += rn;
            }
            r0 += rm;
        }
    }

    /// Output rows `r0..r0+rm`, columns `c0..c0+rn` into `out` (row stride `ldo`).
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile(
        &self,
        x: &QActs,
        r0: usize,
        rm: usize,
        c0: usize,
        rn: usize,
        out: *mut f32,
        ldo: usize,
        avx2: bool,
    ) {
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            unsafe {
                match (rm, rn) {
                    (4, 2) => avx2::tile_4x2(self, x, r0, c0, out, ldo),
                    (rm, rn) => avx2::tile_any(self, x, r0, rm, c0, rn, out, ldo),
                }
            }
            return;
        }
        let _ = avx2;
        for r in r0..r0 + rm {
            for c in c0..c0 + rn {
                unsafe { *out.wrapping_add(r * ldo + c) = self.dot_scalar(x, r, c) };
            }
        }
    }

    /// One output element, by the same operations as the AVX2 kernel.
    fn dot_scalar(&self, x: &QActs, r: usize, c: usize) -> f32 {
        let mut acc = [0f32; 8];
        for b in 0..self.nb {
            let i = c * self.nb + b;
            let (w, a) = (
                &self.w[2 * i..2 * i + 2],
                &x.a[(r * x.k) / 16 + 2 * b..(r * x.k) / 16 + 2 * b + 2],
            );
            for (l, acc) in acc.iter_mut().enumerate() {
                // Lane l of `vpmaddwd` on each half: the products of elements 2l and 2l + 1.
                let mut p = 0i32;
                for h in 0..2 {
                    p += w[h].0[2 * l] as i32 * a[h].0[2 * l] as i32
                        + w[h].0[2 * l + 1] as i32 * a[h].0[2 * l + 1] as i32;
                }
                *acc = (p as f32).mul_add(self.scales[i], *acc);
            }
        }
        // The mins: `acc += (sum of a block's activation integers) * -min`, 8 blocks a step.
        if !self.neg_mins.is_empty() {
            let (mins, sums) = (
                &self.neg_mins[c * self.nbp..(c + 1) * self.nbp],
                &x.sums[r * x.nbp..(r + 1) * x.nbp],
            );
            for (m, s) in mins.chunks_exact(8).zip(sums.chunks_exact(8)) {
                for l in 0..8 {
                    acc[l] = s[l].mul_add(m[l], acc[l]);
                }
            }
        }
        hsum(&acc) * x.d[r]
    }
}

/// The fixed summation order of 8 lanes (both kernels).
#[inline(always)]
fn hsum(a: &[f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

struct SendPtr(*mut f32);
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static DETECTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| {
            std::env::var_os("ZFLOW_EVAL_NO_AVX2").is_none()
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Half, QActs, QMatrix, hsum};
    use std::arch::x86_64::*;

    /// One block for one row and column: `acc += cvt(sum of 32 products) * s`, with the
    /// activations `a` read from memory. In assembly so that the compiler issues each load
    /// where it stands: with intrinsics it merges and hoists the loads, keeping every row's
    /// activations in registers across the columns and spilling the accumulators instead.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn step(acc: __m256, w0: __m256i, w1: __m256i, s: __m256, a: *const Half) -> __m256 {
        let mut acc = acc;
        unsafe {
            std::arch::asm!(
                "vpmaddwd {t0}, {w0}, ymmword ptr [{a}]",
                "vpmaddwd {t1}, {w1}, ymmword ptr [{a} + 32]",
                "vpaddd {t0}, {t0}, {t1}",
                "vcvtdq2ps {t0}, {t0}",
                "vfmadd231ps {acc}, {t0}, {s}",
                acc = inout(ymm_reg) acc,
                w0 = in(ymm_reg) w0,
                w1 = in(ymm_reg) w1,
                s = in(ymm_reg) s,
                a = in(reg) a,
                t0 = out(ymm_reg) _,
                t1 = out(ymm_reg) _,
                options(nostack, readonly, preserves_flags, pure),
            )
        };
        acc
    }

    /// The 4 x 2 register tile, written out so the 8 accumulators stay in registers: each
    /// weight block is loaded once per 4 rows.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_4x2(
        w: &QMatrix,
        x: &QActs,
        r0: usize,
        c0: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        unsafe {
            let z = _mm256_setzero_ps();
            let (mut a00, mut a01, mut a10, mut a11, mut a20, mut a21, mut a30, mut a31) =
                (z, z, z, z, z, z, z, z);
            let halves = x.k / 16;
            let x0 = x.a.as_ptr().wrapping_add(r0 * halves);
            let (x1, x2, x3) = (
                x0.wrapping_add(halves),
                x0.wrapping_add(2 * halves),
                x0.wrapping_add(3 * halves),
            );
            let mut wp0 = w.w.as_ptr().wrapping_add(c0 * w.nb * 2);
            let mut wp1 = wp0.wrapping_add(w.nb * 2);
            let mut sp0 = w.scales.as_ptr().wrapping_add(c0 * w.nb);
            let mut sp1 = sp0.wrapping_add(w.nb);
            let mut off = 0usize;
            for _ in 0..w.nb {
                let (w00, w01, s0) = (
                    _mm256_load_si256(wp0 as *const __m256i),
                    _mm256_load_si256(wp0.wrapping_add(1) as *const __m256i),
                    _mm256_broadcast_ss(&*sp0),
                );
                a00 = step(a00, w00, w01, s0, x0.wrapping_add(off));
                a10 = step(a10, w00, w01, s0, x1.wrapping_add(off));
                a20 = step(a20, w00, w01, s0, x2.wrapping_add(off));
                a30 = step(a30, w00, w01, s0, x3.wrapping_add(off));
                let (w10, w11, s1) = (
                    _mm256_load_si256(wp1 as *const __m256i),
                    _mm256_load_si256(wp1.wrapping_add(1) as *const __m256i),
                    _mm256_broadcast_ss(&*sp1),
                );
                a01 = step(a01, w10, w11, s1, x0.wrapping_add(off));
                a11 = step(a11, w10, w11, s1, x1.wrapping_add(off));
                a21 = step(a21, w10, w11, s1, x2.wrapping_add(off));
                a31 = step(a31, w10, w11, s1, x3.wrapping_add(off));
                wp0 = wp0.wrapping_add(2);
                wp1 = wp1.wrapping_add(2);
                sp0 = sp0.wrapping_add(1);
                sp1 = sp1.wrapping_add(1);
                off += 2;
            }
            let mut tile = [[a00, a01], [a10, a11], [a20, a21], [a30, a31]];
            add_mins(w, x, r0, c0, &mut tile);
            store(x, r0, c0, &tile, out, ldo);
        }
    }

    /// Horizontal sums times the rows' scales, into `out` (row stride `ldo`).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store<const M: usize, const N: usize>(
        x: &QActs,
        r0: usize,
        c0: usize,
        acc: &[[__m256; N]; M],
        out: *mut f32,
        ldo: usize,
    ) {
        for (r, row) in acc.iter().enumerate() {
            let d = x.d[r0 + r];
            for (c, v) in row.iter().enumerate() {
                let mut lanes = [0f32; 8];
                unsafe {
                    _mm256_storeu_ps(lanes.as_mut_ptr(), *v);
                    *out.wrapping_add((r0 + r) * ldo + c0 + c) = hsum(&lanes) * d;
                }
            }
        }
    }

    /// The mins of columns `c0..c0+N` for rows `r0..r0+M`: `acc += sums * -mins`, 8 blocks a
    /// step (as [`QMatrix::dot_scalar`]).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn add_mins<const M: usize, const N: usize>(
        w: &QMatrix,
        x: &QActs,
        r0: usize,
        c0: usize,
        acc: &mut [[__m256; N]; M],
    ) {
        if w.neg_mins.is_empty() {
            return;
        }
        unsafe {
            for g in (0..w.nbp).step_by(8) {
                let mins: [__m256; N] = std::array::from_fn(|c| {
                    _mm256_loadu_ps(w.neg_mins.as_ptr().add((c0 + c) * w.nbp + g))
                });
                for (r, acc) in acc.iter_mut().enumerate() {
                    let sums = _mm256_loadu_ps(x.sums.as_ptr().add((r0 + r) * x.nbp + g));
                    for (acc, m) in acc.iter_mut().zip(&mins) {
                        *acc = _mm256_fmadd_ps(sums, *m, *acc);
                    }
                }
            }
        }
    }

    /// Any smaller tile (edges): the same operations per element, in loops.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile_any(
        w: &QMatrix,
        x: &QActs,
        r0: usize,
        rm: usize,
        c0: usize,
        rn: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        unsafe {
            let halves = x.k / 16;
            for c in 0..rn {
                for r in 0..rm {
                    let mut v = _mm256_setzero_ps();
                    for b in 0..w.nb {
                        let i = (c0 + c) * w.nb + b;
                        let wp = w.w.as_ptr().add(2 * i);
                        let (w0, w1) = (
                            _mm256_load_si256(wp as *const __m256i),
                            _mm256_load_si256(wp.add(1) as *const __m256i),
                        );
                        v = step(
                            v,
                            w0,
                            w1,
                            _mm256_set1_ps(w.scales[i]),
                            x.a.as_ptr().add((r0 + r) * halves + 2 * b),
                        );
                    }
                    let mut one = [[v]];
                    add_mins(w, x, r0 + r, c0 + c, &mut one);
                    store(x, r0 + r, c0 + c, &one, out, ldo);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod bench;
