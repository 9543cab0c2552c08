// flash_attention.cuh: fused causal multi-head attention for bf16 (FlashAttention-2 style), forward and
// backward, straight from and to the training loop's layouts.
//
//   forward   qkv (B, T, 3C) -> out (B, T, C) = softmax(q k^T / sqrt(HS), causal) v per head, and
//             lse (B, NH, T) fp32 = log sum_j exp(q_t . k_j / sqrt(HS)), the only thing kept for the
//             backward (no (B, NH, T, T) probabilities anywhere).
//   backward  from dout (B, T, C), out, lse and qkv: D = rowsum(dout * out) (B, NH, T) into the
//             caller's scratch, then dq, dk, dv written (not accumulated) into dqkv (B, T, 3C).
//
// q, k, v of head h at position t are the HS contiguous values at qkv[(b T + t) 3C + {0, C, 2C} + h HS]:
// the kernels read them there (no permute pass) and write out / dqkv the same way.
//
// Non-obvious choices:
//   - Tensor cores through mma.sync m16n8k16 (bf16 in, fp32 accumulate; inline PTX), operands moved
//     from shared memory by ldmatrix (the .trans form for operands stored the other way round, e.g. v
//     in P v). Shared rows are padded to HS + 8 elements so the 8 rows one ldmatrix reads fall in
//     different banks. K/V (forward) and Q/dO (backward) tiles are double-buffered with cp.async: the
//     next tile streams in while the current one is computed, one barrier per tile.
//   - The score tile's accumulator fragment is, element for element, the A fragment of the next
//     matrix product (P v, P^T dO, dS k, ...): probabilities never leave registers.
//   - Online softmax in fp32 in the log2 domain (scores scaled by log2(e) / sqrt(HS), ex2.approx.ftz);
//     each thread keeps partial row sums and the 4 threads that share a row combine them once at the end.
//     P is rounded to bf16 only as a matrix-product input; the row sums use the fp32 values.
//   - Causal: a block of queries streams only the key tiles at or before its diagonal; only tiles that
//     cross the diagonal are masked; a warp skips a tile lying wholly above its rows. Blocks with the
//     most tiles are launched first (less tail). Rows past T are zero-filled by cp.async (src-size 0),
//     so T need not be a multiple of a tile and nothing non-finite enters a product.
//   - Backward without floating-point atomics, so bitwise deterministic: one kernel per key block
//     (dk, dv, looping over the query tiles at or after it) and one per query block (dq, looping over
//     the key tiles up to it, in order). Given room for dS (flash_attention_backward_ds_bytes; the
//     training loop lends its dead logits buffer), the key-side kernel stores dS in bf16 and the dq
//     kernel only reads it and multiplies by k: 5 matrix products, as an atomic dq would do, for one
//     extra write and read of the causal dS. Without it the dq kernel recomputes q k^T, dO v^T and
//     the softmax (7 products).
//   - Configurations (the fastest of the labs dev/cuda/attention_{forward,backward}.cu; the figures
//     are in dev/cuda/README.md and docs/attention.md):
//     forward at HS 64 on compute capability 9.0: Hopper's warpgroup MMA (wgmma, forward_wgmma_kernel:
//     64 queries per block, key tiles of 128 read by the tensor cores from swizzled shared memory);
//     elsewhere mma.sync, 4 warps x 2 row tiles (128 queries per block) for HS 64 and 80, 4 warps x 1
//     for 128 (2 tiles spill there); backward with room for dS at HS 64 on compute capability 9.0: the
//     key side on wgmma (backward_dkdv_wgmma_kernel, a warpgroup per 64 keys, 3 per SM), elsewhere
//     4 warps x 16 rows per block, streamed tiles of 64, all HS.
//   - Fast path: head sizes 64, 80 and 128 (flash_attention_supported), 16-byte aligned pointers.
//     Every other head size up to 256 (and misaligned pointers) takes a plain path in this header:
//     one warp per row, fp32 CUDA-core math, the same algorithm (online softmax, lse, recompute,
//     deterministic), correct but several times slower; callers that care about speed use
//     attention.cuh there instead. bf16 only: fp32 builds use attention.cuh.
#pragma once

#include <type_traits>

#include "common.cuh"
#include "ptx.cuh"

namespace flash_detail {

using namespace ptx;
typedef __nv_bfloat16 bf16;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
constexpr int kPlainMaxHS = 256;

// ---------------------------------------------------------------------------------------------
// mma.sync fragments.

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half: the lower column
    return *reinterpret_cast<uint32_t*>(&v);
}

// Eight fp32 values as four bf16 pairs: register i holds v[2 i] (low half) and v[2 i + 1]. Applied to
// accumulator elements 8 kk .. 8 kk + 7 (two adjacent 8-column tiles) it gives the A fragment of the
// 16-wide k slice kk (the layout below).
__device__ __forceinline__ void pack8_bf16(uint32_t (&r)[4], const float* v) {
#pragma unroll
    for (int i = 0; i < 4; i++) r[i] = pack_bf16(v[2 * i], v[2 * i + 1]);
}

// Fragment layout of mma m16n8k16 (lane = 4 g + c): accumulator element e of a 16x8 tile sits at
// row g + 8 (e / 2), column 2 c + e % 2; A register i holds row g + 8 (i % 2), columns 2 c + 8 (i / 2)
// + {0, 1}; B register i holds k rows 2 c + 8 i + {0, 1}, column g.
//
// A (16x16) from rows r0.., columns c0.. of a row-major tile with row stride ld.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* tile, int ld, int r0, int c0) {
    const int lane = threadIdx.x & 31, m = lane >> 3;
    ldsm_x4(a, tile + (r0 + (lane & 7) + (m & 1) * 8) * ld + c0 + (m >> 1) * 8);
}
// B for two n-tiles (n0.. -> b[0], b[1]; n0+8.. -> b[2], b[3]) and k0..k0+15, from a tile stored with
// n as the row (e.g. k in q k^T).
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const bf16* tile, int ld, int n0, int k0) {
    const int lane = threadIdx.x & 31, m = lane >> 3;
    ldsm_x4(b, tile + (n0 + (lane & 7) + (m >> 1) * 8) * ld + k0 + (m & 1) * 8);
}
// The same from a tile stored with k as the row (e.g. v in P v): the transposing load.
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const bf16* tile, int ld, int k0, int n0) {
    const int lane = threadIdx.x & 31, m = lane >> 3;
    ldsm_x4_trans(b, tile + (k0 + (lane & 7) + (m & 1) * 8) * ld + n0 + (m >> 1) * 8);
}
// Accumulator tiles 2 kk and 2 kk + 1 (16 rows x 16 columns) as the A operand of the next product.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
    a[0] = pack_bf16(lo[0], lo[1]);
    a[1] = pack_bf16(lo[2], lo[3]);
    a[2] = pack_bf16(hi[0], hi[1]);
    a[3] = pack_bf16(hi[2], hi[3]);
}

// The products of the kernels below, on MT 16-row tiles per warp (one shared B fragment feeds all MT).
template <int M, int N> __device__ __forceinline__ void zero(float (&acc)[M][N][4]) {
#pragma unroll
    for (int i = 0; i < M; i++)
#pragma unroll
        for (int j = 0; j < N; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
}

// d (MT x 16 rows, NT x 8 columns) += A B^T over KS x 16 head dimensions: A = 16-row tiles a_tile0..
// of a row-major tile (e.g. k), B = a tile stored with n as the row (e.g. q, for s^T = k q^T).
template <int MT, int NT, int KS>
__device__ __forceinline__ void mma_a_bt(float (&d)[MT][NT][4], const bf16* sA, int a_tile0, const bf16* sB, int ld) {
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) load_a(a[mt], sA, ld, (a_tile0 + mt) * 16, ks * 16);
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            uint32_t bb[4];
            load_b_nk(bb, sB, ld, np * 16, ks * 16);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_bf16(d[mt][2 * np], a[mt], bb[0], bb[1]);
                mma_bf16(d[mt][2 * np + 1], a[mt], bb[2], bb[3]);
            }
        }
    }
}

// d (MT x 16 rows, DT x 8 columns) += P B: P = the accumulator of a previous product (MT x 16 rows,
// NT x 8 columns, rounded to bf16 as A fragments, 16 columns at a time), B = a tile stored with k as
// the row (e.g. v, for P v).
template <int MT, int NT, int DT>
__device__ __forceinline__ void mma_p_b(float (&d)[MT][DT][4], const float (&p)[MT][NT][4], const bf16* sB, int ld) {
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) acc_to_a(pa[mt], p[mt][2 * kk], p[mt][2 * kk + 1]);
#pragma unroll
        for (int dpair = 0; dpair < DT / 2; dpair++) {
            uint32_t bb[4];
            load_b_kn(bb, sB, ld, kk * 16, dpair * 16);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_bf16(d[mt][2 * dpair], pa[mt], bb[0], bb[1]);
                mma_bf16(d[mt][2 * dpair + 1], pa[mt], bb[2], bb[3]);
            }
        }
    }
}

// The backward's P recomputed from a score s and its query's lse (log2 domain, lse_log2 = lse log2(e)):
// the forward's probability, exp(s scale - lse).
__device__ __forceinline__ float probability(float s, float sl2, float lse_log2) { return exp2_ftz(fmaf(s, sl2, -lse_log2)); }
// The causal mask (key j hidden from query t when j > t) is written out in each kernel, in the
// orientation of its tiles (query < key where the rows are keys, key > query where they are queries):
// as a shared function, or with its operands turned round, the compiler emits different code for the
// kernels, and their instruction streams are kept identical across changes to this file.

// ROWS rows of HS values, rows row0.. of a sequence whose row t starts at src + t * stride, into a
// shared tile with row stride LD; rows >= T are zero-filled. All THREADS threads of the block take
// part. The trip count is a constant, and where THREADS is a multiple of the chunks per row each
// thread moves the same column of every STEP-th row, so its addresses advance by constants: a few
// instructions per 16 bytes, where a loop over runtime bounds recomputes row, column and bound for
// each (these loads are a large share of the attention kernels' instructions).
template <int HS, int LD, int THREADS, int ROWS>
__device__ __forceinline__ void load_rows_async(bf16* dst, const bf16* src, size_t stride, int row0, int T) {
    constexpr int CPR = HS / 8, CHUNKS = ROWS * CPR;  // 16-byte chunks per row, in all
    if constexpr (THREADS % CPR == 0) {
        constexpr int STEP = THREADS / CPR;
        const int r0 = threadIdx.x / CPR, col = (threadIdx.x % CPR) * 8;
        bf16* d = dst + r0 * LD + col;
        const bf16* p = src + size_t(row0 + r0) * stride + col;  // past T: never read (0 bytes), any address
#pragma unroll
        for (int i = 0; i < (ROWS + STEP - 1) / STEP; i++) {
            if (ROWS % STEP != 0 && r0 + i * STEP >= ROWS) break;
            cp_async16_zfill(d + i * STEP * LD, p + i * STEP * stride, row0 + r0 + i * STEP < T);
        }
    } else {
#pragma unroll
        for (int i = 0; i < (CHUNKS + THREADS - 1) / THREADS; i++) {
            const int c = threadIdx.x + i * THREADS;
            if (CHUNKS % THREADS != 0 && c >= CHUNKS) break;
            const int r = c / CPR, col = (c % CPR) * 8, t = row0 + r;
            const bool valid = t < T;
            cp_async16_zfill(dst + r * LD + col, src + size_t(valid ? t : 0) * stride + col, valid);
        }
    }
}
// ROWS floats, rows row0.. of src, into dst; rows >= T zero-filled (and not read).
template <int THREADS, int ROWS>
__device__ __forceinline__ void load_floats_async(float* dst, const float* src, int row0, int T) {
#pragma unroll
    for (int i = 0; i < (ROWS + THREADS - 1) / THREADS; i++) {
        const int r = threadIdx.x + i * THREADS;
        if (ROWS % THREADS != 0 && r >= ROWS) break;
        cp_async4_zfill(dst + r, src + row0 + r, row0 + r < T);
    }
}

template <typename K> void allow_smem(K kernel, size_t bytes) {
    if (bytes > 48 * 1024) cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// ---------------------------------------------------------------------------------------------
// Forward, tensor cores. A block owns BR = WARPS * MT * 16 consecutive queries of one (b, h); each
// warp MT 16-row tiles. Q fragments stay in registers; K/V tiles of BC keys are double-buffered.

template <int HS, int WARPS, int MT, int BC>
__global__ void __launch_bounds__(WARPS * 32)
    forward_kernel(bf16* out, float* lse, const bf16* qkv, int T, int NH, float scale) {
    constexpr int BR = WARPS * MT * 16, LD = HS + 8, NT = BC / 8, KS = HS / 16, DT = HS / 8, THREADS = WARPS * 32;
    static_assert(HS % 16 == 0 && BC % 16 == 0, "tile shapes");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // BR x LD
    bf16* sK = sQ + BR * LD;                       // 2 x BC x LD
    bf16* sV = sK + 2 * BC * LD;                   // 2 x BC x LD

    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;  // heaviest blocks first
    const int C = NH * HS, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c4 = lane % 4;
    const size_t stride = 3 * size_t(C);
    const bf16* q_src = qkv + size_t(b) * T * stride + h * HS;
    const bf16* k_src = q_src + C;
    const bf16* v_src = q_src + 2 * C;
    const int q0 = qb * BR, n_tiles = (min(q0 + BR, T) - 1) / BC + 1;
    const int wrow0 = q0 + warp * MT * 16;  // this warp's first query
    const float sl2 = scale * kLog2e;

    load_rows_async<HS, LD, THREADS, BR>(sQ, q_src, stride, q0, T);
    load_rows_async<HS, LD, THREADS, BC>(sK, k_src, stride, 0, T);
    load_rows_async<HS, LD, THREADS, BC>(sV, v_src, stride, 0, T);
    cp_async_commit();

    uint32_t qf[MT][KS][4];
    float o[MT][DT][4];
    float m_run[MT][2], l_run[MT][2];  // running max (log2 domain) and this thread's partial row sum
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int dt = 0; dt < DT; dt++) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.0f;
        m_run[mt][0] = m_run[mt][1] = -INFINITY;
        l_run[mt][0] = l_run[mt][1] = 0.0f;
    }

    for (int j = 0; j < n_tiles; j++) {
        cp_async_wait<0>();
        __syncthreads();  // tile j is in; every warp is done with tile j - 1, whose buffers are refilled next
        if (j == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int ks = 0; ks < KS; ks++) load_a(qf[mt][ks], sQ, LD, warp * MT * 16 + mt * 16, ks * 16);
        }
        if (j + 1 < n_tiles) {
            const int st = (j + 1) & 1;
            load_rows_async<HS, LD, THREADS, BC>(sK + st * BC * LD, k_src, stride, (j + 1) * BC, T);
            load_rows_async<HS, LD, THREADS, BC>(sV + st * BC * LD, v_src, stride, (j + 1) * BC, T);
            cp_async_commit();
        }
        const int k0 = j * BC;
        if (k0 > wrow0 + MT * 16 - 1) continue;  // every key of this tile is after every row of this warp
        const bf16* cK = sK + (j & 1) * BC * LD;
        const bf16* cV = sV + (j & 1) * BC * LD;

        float s[MT][NT][4];
        zero(s);
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t bb[4];
                load_b_nk(bb, cK, LD, np * 16, ks * 16);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16(s[mt][2 * np], qf[mt][ks], bb[0], bb[1]);
                    mma_bf16(s[mt][2 * np + 1], qf[mt][ks], bb[2], bb[3]);
                }
            }

        const bool mask = k0 + BC - 1 > wrow0;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int row = wrow0 + mt * 16 + g + hf * 8;
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float& x = s[mt][nt][hf * 2 + e];
                        if (mask && k0 + nt * 8 + 2 * c4 + e > row) x = -INFINITY;
                        mx = fmaxf(mx, x);
                    }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_new = fmaxf(m_run[mt][hf], mx * sl2);
                const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing unmasked yet
                const float corr = exp2_ftz(m_run[mt][hf] - m_use);
                m_run[mt][hf] = m_new;
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float& x = s[mt][nt][hf * 2 + e];
                        x = exp2_ftz(fmaf(x, sl2, -m_use));
                        sum += x;
                    }
                l_run[mt][hf] = l_run[mt][hf] * corr + sum;
#pragma unroll
                for (int dt = 0; dt < DT; dt++) o[mt][dt][hf * 2] *= corr, o[mt][dt][hf * 2 + 1] *= corr;
            }

        mma_p_b(o, s, cV, LD);
    }

#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float l = l_run[mt][hf];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int row = wrow0 + mt * 16 + g + hf * 8;
            if (row >= T) continue;
            const float inv = 1.0f / l;
            bf16* dst = out + (size_t(b) * T + row) * C + h * HS + 2 * c4;
#pragma unroll
            for (int dt = 0; dt < DT; dt++)
                *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8) =
                    __floats2bfloat162_rn(o[mt][dt][hf * 2] * inv, o[mt][dt][hf * 2 + 1] * inv);
            if (c4 == 0) lse[(size_t(b) * NH + h) * T + row] = (m_run[mt][hf] + log2f(l)) * kLn2;
        }
}

template <int HS, int WARPS, int MT, int BC>
void launch_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, cudaStream_t stream) {
    constexpr int BR = WARPS * MT * 16;
    const size_t smem = size_t(BR + 4 * BC) * (HS + 8) * sizeof(bf16);
    auto kernel = forward_kernel<HS, WARPS, MT, BC>;
    static bool configured = false;
    if (!configured) allow_smem(kernel, smem), configured = true;
    const dim3 grid((T + BR - 1) / BR, NH, B);
    kernel<<<grid, WARPS * 32, smem, stream>>>(out, lse, qkv, T, NH, 1.0f / sqrtf(float(HS)));
    cuda_check_launch();
}

// The configuration training runs: 4 warps x 2 row tiles, key tiles of 64; at HS 128 one row tile
// (two spill there). false where HS has no fast path. (The lab runs others: dev/cuda/flash_attention_lab.cuh.)
inline bool forward_tc(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int HS, cudaStream_t stream) {
    switch (HS) {
        case 64: launch_forward<64, 4, 2, 64>(out, lse, qkv, B, T, NH, stream); return true;
        case 80: launch_forward<80, 4, 2, 64>(out, lse, qkv, B, T, NH, stream); return true;
        case 128: launch_forward<128, 4, 1, 64>(out, lse, qkv, B, T, NH, stream); return true;
        default: return false;
    }
}

// ---------------------------------------------------------------------------------------------
// Forward, Hopper warpgroup MMA (wgmma; sm_90a), head size 64. A warpgroup (4 warps, 128 threads)
// owns 64 consecutive queries; a block NWG warpgroups. Why: mma.sync moves every operand through
// registers (ldmatrix, then the MMA reads them); wgmma reads K and V straight from shared memory and
// runs asynchronously, fewer instructions and register-file traffic per product, which also matters
// for energy (training runs at the H100's power cap, dev/cuda/README.md).
//   - Shared tiles are 128-byte swizzled, the layout wgmma's descriptors describe: each 64-value
//     (128-byte) row's 16-byte chunk c sits at chunk c ^ (row % 8), tiles 1024-byte aligned.
//   - S = q k^T: A = q, B = k, both K-major (head dimension contiguous), m64nBCk16 x 4.
//   - O += P v: A = P from registers (the score accumulator's layout is, per warp, mma.sync's: the
//     same packing as the mma.sync kernel), B = v as stored, MN-major (its rows are k), m64n64k16 x
//     BC / 16.
//   - The softmax, masking, rounding and output are the mma.sync kernel's, row for row.
// Every product is issued, committed and waited for at once: the overlap of one warpgroup's softmax
// with another's products comes from several warpgroups per SM.

// ROWS rows of 64 values into a 128-byte swizzled tile (1024-byte aligned); rows >= T zero-filled.
// As load_rows_async: each thread moves chunk tid % 8 of rows tid / 8 + i STEP; STEP is a multiple of
// 8, so the chunk's swizzled place (chunk ^ (row % 8)) is the same in all of them.
template <int THREADS, int ROWS>
__device__ __forceinline__ void load_rows_sw128_async(bf16* dst, const bf16* src, size_t stride, int row0, int T) {
    constexpr int STEP = THREADS / 8;
    static_assert(THREADS % 64 == 0 && ROWS % STEP == 0, "each thread: one chunk of every STEP-th row, STEP % 8 == 0");
    const int r0 = threadIdx.x / 8, chunk = threadIdx.x % 8;
    bf16* d = dst + r0 * 64 + (chunk ^ (r0 & 7)) * 8;
    const bf16* p = src + size_t(row0 + r0) * stride + chunk * 8;  // past T: never read (0 bytes), any address
#pragma unroll
    for (int i = 0; i < ROWS / STEP; i++) cp_async16_zfill(d + i * STEP * 64, p + i * STEP * stride, row0 + r0 + i * STEP < T);
}

template <int NWG, int BC>
__global__ void __launch_bounds__(NWG * 128)
    forward_wgmma_kernel(bf16* out, float* lse, const bf16* qkv, int T, int NH, float scale) {
#ifdef PTX_HAVE_SM90A
    constexpr int HS = 64, BR = NWG * 64, THREADS = NWG * 128;
    static_assert(BC == 64 || BC == 128, "key tile");
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // swizzle atoms: 1024-aligned
    bf16* sQ = reinterpret_cast<bf16*>(smem);  // BR x 64
    bf16* sK = sQ + BR * HS;                   // 2 x BC x 64
    bf16* sV = sK + 2 * BC * HS;               // 2 x BC x 64

    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;  // heaviest blocks first
    const int C = NH * HS, wg = threadIdx.x / 128, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, c4 = lane % 4;
    const size_t stride = 3 * size_t(C);
    const bf16* q_src = qkv + size_t(b) * T * stride + h * HS;
    const bf16* k_src = q_src + C;
    const bf16* v_src = q_src + 2 * C;
    const int q0 = qb * BR, n_tiles = (min(q0 + BR, T) - 1) / BC + 1;
    const int wg_row0 = q0 + wg * 64, wrow0 = q0 + warp * 16;  // this warpgroup's and this warp's first query
    const float sl2 = scale * kLog2e;

    load_rows_sw128_async<THREADS, BR>(sQ, q_src, stride, q0, T);
    load_rows_sw128_async<THREADS, BC>(sK, k_src, stride, 0, T);
    load_rows_sw128_async<THREADS, BC>(sV, v_src, stride, 0, T);
    cp_async_commit();

    const uint64_t q_desc = sw128_desc(sQ + wg * 64 * HS, 16, 1024);
    float o[HS / 2];
#pragma unroll
    for (int i = 0; i < HS / 2; i++) o[i] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

    for (int j = 0; j < n_tiles; j++) {
        cp_async_wait<0>();
        fence_proxy_async_smem();
        __syncthreads();  // tile j is in; every warpgroup is done with tile j - 1, whose buffers are refilled next
        if (j + 1 < n_tiles) {
            const int st = (j + 1) & 1;
            load_rows_sw128_async<THREADS, BC>(sK + st * BC * HS, k_src, stride, (j + 1) * BC, T);
            load_rows_sw128_async<THREADS, BC>(sV + st * BC * HS, v_src, stride, (j + 1) * BC, T);
            cp_async_commit();
        }
        const int k0 = j * BC;
        if (k0 > wg_row0 + 63) continue;  // every key of this tile is after every row of this warpgroup
        const uint64_t k_desc = sw128_desc(sK + (j & 1) * BC * HS, 16, 1024);
        const uint64_t v_desc = sw128_desc(sV + (j & 1) * BC * HS, BC * 128, 1024);

        // The tile's products over W keys: BC, or 64 where the tile's second half lies after every
        // row of this warpgroup (its last tile when its rows start at a multiple of BC: half of the
        // blocks at BC = 128). Those keys would only add exact zeros (P = 0), so skipping them gives
        // the same bits, for 5-6% fewer products and exponentials in the forward.
        auto tile = [&](auto width) {
            constexpr int W = decltype(width)::value, NTW = W / 8;
            float s[W / 2];
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < HS / 16; ks++) {  // +32 bytes along the swizzled row per 16 values
                if constexpr (W == 128) wgmma_m64n128k16_ss(s, q_desc + 2 * ks, k_desc + 2 * ks, ks);
                else wgmma_m64n64k16_ss(s, q_desc + 2 * ks, k_desc + 2 * ks, ks);
            }
            wgmma_commit();
            wgmma_wait<0>();
            keep_regs(s);

            // s[4 nt + e]: row g + 8 (e / 2) of this warp's 16, key k0 + 8 nt + 2 c4 + e % 2 (mma.sync's layout).
            const bool mask = k0 + W - 1 > wrow0;
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int row = wrow0 + g + hf * 8;
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < NTW; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float& x = s[4 * nt + hf * 2 + e];
                        if (mask && k0 + nt * 8 + 2 * c4 + e > row) x = -INFINITY;
                        mx = fmaxf(mx, x);
                    }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_new = fmaxf(m_run[hf], mx * sl2);
                const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing unmasked yet
                const float corr = exp2_ftz(m_run[hf] - m_use);
                m_run[hf] = m_new;
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < NTW; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float& x = s[4 * nt + hf * 2 + e];
                        x = exp2_ftz(fmaf(x, sl2, -m_use));
                        sum += x;
                    }
                l_run[hf] = l_run[hf] * corr + sum;
#pragma unroll
                for (int dt = 0; dt < HS / 8; dt++) o[4 * dt + hf * 2] *= corr, o[4 * dt + hf * 2 + 1] *= corr;
            }

            uint32_t pa[W / 16][4];
#pragma unroll
            for (int kk = 0; kk < W / 16; kk++) {
                pack8_bf16(pa[kk], s + 8 * kk);
            }
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < W / 16; kk++) wgmma_m64n64k16_rs_mn(o, pa[kk], v_desc + kk * (16 * 128 / 16));  // 16 rows of v
            wgmma_commit();
            wgmma_wait<0>();
            keep_regs(o);
            keep_regs(pa);
        };
        if (BC == 128 && k0 >= wg_row0) tile(std::integral_constant<int, 64>());
        else tile(std::integral_constant<int, BC>());
    }

#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float l = l_run[hf];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = wrow0 + g + hf * 8;
        if (row >= T) continue;
        const float inv = 1.0f / l;
        bf16* dst = out + (size_t(b) * T + row) * C + h * HS + 2 * c4;
#pragma unroll
        for (int dt = 0; dt < HS / 8; dt++)
            *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8) =
                __floats2bfloat162_rn(o[4 * dt + hf * 2] * inv, o[4 * dt + hf * 2 + 1] * inv);
        if (c4 == 0) lse[(size_t(b) * NH + h) * T + row] = (m_run[hf] + log2f(l)) * kLn2;
    }
#else
    __trap();  // built without sm_90a: forward_wgmma never launches it (wgmma_available)
#endif
}

template <int NWG, int BC>
void launch_forward_wgmma(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, cudaStream_t stream) {
    constexpr int BR = NWG * 64;
    const size_t smem = size_t(BR + 4 * BC) * 64 * sizeof(bf16) + 1024;  // + room to align to 1024
    auto kernel = forward_wgmma_kernel<NWG, BC>;
    static bool configured = false;
    if (!configured) allow_smem(kernel, smem), configured = true;
    const dim3 grid((T + BR - 1) / BR, NH, B);
    kernel<<<grid, NWG * 128, smem, stream>>>(out, lse, qkv, T, NH, 1.0f / 8.0f);
    cuda_check_launch();
}

// The configuration training runs: one warpgroup a block, key tiles of 128. false where it does not
// run (HS != 64, or not an sm_90 GPU).
inline bool forward_wgmma(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int HS, cudaStream_t stream) {
    if (HS != 64 || !wgmma_available()) return false;
    launch_forward_wgmma<1, 128>(out, lse, qkv, B, T, NH, stream);
    return true;
}

// ---------------------------------------------------------------------------------------------
// Backward, tensor cores.

// D[b, h, t] = sum_d dout * out over the head's HS values. A group of LANES = HS / 8 lanes (rounded up
// to a power of two) per (b, t, h), each reading one 16-byte vector of dout and of out: the loads
// are 128-bit and a warp's loads cover whole rows, so this pure read runs near copy speed (a warp per
// row with 2-byte loads is issue-bound, far below it).
template <int HS>
__global__ void backward_dot_kernel(float* D, const bf16* dout, const bf16* out, int B, int T, int NH) {
    constexpr int VECS = HS / 8, LANES = VECS <= 8 ? 8 : VECS <= 16 ? 16 : 32, ROWS_PER_WARP = 32 / LANES;
    static_assert(HS % 8 == 0 && VECS <= 32, "head size");
    const int lane = threadIdx.x % 32, sub = lane % LANES;
    const long long row = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32 * ROWS_PER_WARP + lane / LANES;
    const long long rows = (long long)B * T * NH;
    float sum = 0.0f;
    if (row < rows && sub < VECS) {
        const size_t off = size_t(row) * HS + size_t(sub) * 8;  // (b, t, h) rows are HS apart in (B, T, C)
        const Vec128<bf16> a = Vec128<bf16>::load_stream(dout + off), o = Vec128<bf16>::load_stream(out + off);
#pragma unroll
        for (int j = 0; j < 8; j++) sum += __bfloat162float(a[j]) * __bfloat162float(o[j]);
    }
#pragma unroll
    for (int o = LANES / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (row < rows && sub == 0) {
        const int h = int(row % NH), t = int(row / NH % T), b = int(row / ((long long)NH * T));
        D[(size_t(b) * NH + h) * T + t] = sum;
    }
}

// The same for any head size and alignment (the plain path): one warp per (b, t, h), scalar loads.
__global__ void backward_dot_plain_kernel(float* D, const bf16* dout, const bf16* out, int B, int T, int NH, int HS) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= B * T * NH) return;
    const int h = row % NH, t = row / NH % T, b = row / (NH * T);
    const size_t off = size_t(row / NH) * NH * HS + size_t(h) * HS;
    float sum = 0.0f;
    for (int d = lane; d < HS; d += 32) sum += __bfloat162float(dout[off + d]) * __bfloat162float(out[off + d]);
    sum = warp_sum(sum);
    if (lane == 0) D[(size_t(b) * NH + h) * T + t] = sum;
}

// The stored dS (backward_dkdv_kernel<..., STORE_DS> writes, backward_dq_from_ds_kernel reads): square
// tiles of kDsTile queries x kDsTile keys on and below the diagonal, kDsTileVecs uint4 each (see the
// dk/dv kernel for the order inside a tile); tile (qt, kb), kb <= qt, of head (b, h) is number
// ds_tile_index, n = ceil(T / kDsTile) query tiles per head.
constexpr int kDsTile = 64, kDsTileVecs = (kDsTile / 16) * (kDsTile / 16) * 32;
__host__ __device__ inline size_t ds_tile_index(int b, int h, int NH, int n, int qt, int kb) {
    return (size_t(b) * NH + h) * (size_t(n) * (n + 1) / 2) + size_t(qt) * (qt + 1) / 2 + kb;
}

// dk, dv for BK = WARPS * MT * 16 keys (MT 16-key tiles per warp), streaming the query tiles (q, dO,
// lse, D) of BQ rows that can see them. MT = 2 halves the shared-memory reads per MMA: every B
// fragment (from q or dO) feeds both key tiles.
//
// STORE_DS (BK == BQ == kDsTile): also writes each dS tile, bf16, for backward_dq_from_ds_kernel, so
// that the dq pass reads dS instead of recomputing q k^T, dO v^T and the softmax. The dq pass needs
// dS (query x key) as an MMA A fragment, pairs of adjacent keys per register; this kernel holds dS^T,
// pairs of adjacent queries. movmatrix transposes each 8x8 piece in registers, and each lane stores
// its four pieces of a 16x16 block as one 16-byte vector: a tile is [query block][key block][lane]
// of uint4 (8 KB), written and later read as whole 512-byte warp rows, at ds_tile_index.
template <int HS, int WARPS, int MT, int BQ, int MIN_BLOCKS, bool STORE_DS>
__global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS)
    backward_dkdv_kernel(bf16* dqkv, uint4* ds, const bf16* dout, const float* lse, const float* Dsum, const bf16* qkv, int T,
                         int NH, float scale) {
    constexpr int BK = WARPS * MT * 16, LD = HS + 8, NT = BQ / 8, KS = HS / 16, DT = HS / 8, THREADS = WARPS * 32;
    static_assert(HS % 16 == 0 && BQ % 16 == 0, "tile shapes");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sK = reinterpret_cast<bf16*>(smem_raw);  // BK x LD
    bf16* sV = sK + BK * LD;                       // BK x LD
    bf16* sQ = sV + BK * LD;                       // 2 x BQ x LD
    bf16* sO = sQ + 2 * BQ * LD;                   // 2 x BQ x LD (dO)
    float* sL = reinterpret_cast<float*>(sO + 2 * BQ * LD);  // 2 x BQ (lse)
    float* sD = sL + 2 * BQ;                                 // 2 x BQ (D)

    const int kb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;  // early key blocks (most work) first
    const int C = NH * HS, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c4 = lane % 4;
    const size_t stride = 3 * size_t(C);
    const bf16* q_src = qkv + size_t(b) * T * stride + h * HS;
    const bf16* k_src = q_src + C;
    const bf16* v_src = q_src + 2 * C;
    const bf16* o_src = dout + size_t(b) * T * C + h * HS;
    const float* l_src = lse + (size_t(b) * NH + h) * T;
    const float* d_src = Dsum + (size_t(b) * NH + h) * T;
    const int kblk0 = kb * BK, wk0 = kblk0 + warp * MT * 16;  // this warp's first key
    const int qt0 = kblk0 / BQ, n_qt = (T + BQ - 1) / BQ;
    const float sl2 = scale * kLog2e;
    static_assert(!STORE_DS || (BK == kDsTile && BQ == kDsTile), "dS tiles are kDsTile x kDsTile");

    auto load_query_tile = [&](int qt, int st) {
        load_rows_async<HS, LD, THREADS, BQ>(sQ + st * BQ * LD, q_src, stride, qt * BQ, T);
        load_rows_async<HS, LD, THREADS, BQ>(sO + st * BQ * LD, o_src, size_t(C), qt * BQ, T);
        load_floats_async<THREADS, BQ>(sL + st * BQ, l_src, qt * BQ, T);
        load_floats_async<THREADS, BQ>(sD + st * BQ, d_src, qt * BQ, T);
    };
    load_rows_async<HS, LD, THREADS, BK>(sK, k_src, stride, kblk0, T);
    load_rows_async<HS, LD, THREADS, BK>(sV, v_src, stride, kblk0, T);
    load_query_tile(qt0, 0);
    cp_async_commit();

    float dk[MT][DT][4], dv[MT][DT][4];
    zero(dk);
    zero(dv);

    for (int qt = qt0; qt < n_qt; qt++) {
        cp_async_wait<0>();
        __syncthreads();
        const int st = (qt - qt0) & 1;
        if (qt + 1 < n_qt) {
            load_query_tile(qt + 1, st ^ 1);
            cp_async_commit();
        }
        const int q0 = qt * BQ;
        if (q0 + BQ - 1 < wk0) continue;  // every query of this tile is before every key of this warp
        const bf16* cQ = sQ + st * BQ * LD;
        const bf16* cO = sO + st * BQ * LD;
        const float* cL = sL + st * BQ;
        const float* cD = sD + st * BQ;

        // s^T = k q^T (this warp's MT x 16 keys x BQ queries)
        float s[MT][NT][4], dp[MT][NT][4];
        zero(s);
        zero(dp);
        mma_a_bt<MT, NT, KS>(s, sK, warp * MT, cQ, LD);
        // P^T from the saved lse; masked: query before key, or past T
        const bool mask = q0 < wk0 + MT * 16 - 1 || q0 + BQ > T;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = nt * 8 + 2 * c4 + (e & 1), key = wk0 + mt * 16 + g + (e >> 1) * 8, query = q0 + qi;
                    float p = probability(s[mt][nt][e], sl2, cL[qi] * kLog2e);
                    if (mask && (query < key || query >= T)) p = 0.0f;
                    s[mt][nt][e] = p;
                }
        // dv += P^T dO
        mma_p_b(dv, s, cO, LD);
        // dP^T = v dO^T
        mma_a_bt<MT, NT, KS>(dp, sV, warp * MT, cO, LD);
        // dS^T = P^T * (dP^T - D)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    dp[mt][nt][e] = s[mt][nt][e] * (dp[mt][nt][e] - cD[nt * 8 + 2 * c4 + (e & 1)]);
        // dk += dS^T q: mma_p_b's loop, with each slice of dS^T stored between its packing and its products
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            uint32_t pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) acc_to_a(pa[mt], dp[mt][2 * kk], dp[mt][2 * kk + 1]);
            if (STORE_DS) {  // pa[i]: key g + 8 (i % 2) x queries 2 c4 + 8 (i / 2) + {0, 1}; transposed: dq's A 0, 2, 1, 3
                uint4* tile = ds + ds_tile_index(b, h, NH, n_qt, qt, kb) * kDsTileVecs;
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    tile[(kk * (BK / 16) + warp * MT + mt) * 32 + lane] =
                        make_uint4(transpose8x8(pa[mt][0]), transpose8x8(pa[mt][2]), transpose8x8(pa[mt][1]),
                                   transpose8x8(pa[mt][3]));
            }
#pragma unroll
            for (int dpair = 0; dpair < DT / 2; dpair++) {
                uint32_t bb[4];
                load_b_kn(bb, cQ, LD, kk * 16, dpair * 16);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16(dk[mt][2 * dpair], pa[mt], bb[0], bb[1]);
                    mma_bf16(dk[mt][2 * dpair + 1], pa[mt], bb[2], bb[3]);
                }
            }
        }
    }

#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int key = wk0 + mt * 16 + g + hf * 8;
            if (key >= T) continue;
            bf16* dst = dqkv + (size_t(b) * T + key) * stride + C + h * HS + 2 * c4;
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8) =
                    __floats2bfloat162_rn(dk[mt][dt][hf * 2] * scale, dk[mt][dt][hf * 2 + 1] * scale);
                *reinterpret_cast<__nv_bfloat162*>(dst + C + dt * 8) =
                    __floats2bfloat162_rn(dv[mt][dt][hf * 2], dv[mt][dt][hf * 2 + 1]);
            }
        }
}

// dq for BQ = WARPS * MT * 16 queries (MT 16-query tiles per warp), streaming the key tiles (k, v) of
// BK rows they see.
template <int HS, int WARPS, int MT, int BK, int MIN_BLOCKS>
__global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS)
    backward_dq_kernel(bf16* dqkv, const bf16* dout, const float* lse, const float* Dsum, const bf16* qkv, int T, int NH,
                       float scale) {
    constexpr int BQ = WARPS * MT * 16, LD = HS + 8, NT = BK / 8, KS = HS / 16, DT = HS / 8, THREADS = WARPS * 32;
    static_assert(HS % 16 == 0 && BK % 16 == 0, "tile shapes");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // BQ x LD
    bf16* sO = sQ + BQ * LD;                       // BQ x LD (dO)
    bf16* sK = sO + BQ * LD;                       // 2 x BK x LD
    bf16* sV = sK + 2 * BK * LD;                   // 2 x BK x LD

    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;  // heaviest blocks first
    const int C = NH * HS, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c4 = lane % 4;
    const size_t stride = 3 * size_t(C);
    const bf16* q_src = qkv + size_t(b) * T * stride + h * HS;
    const bf16* k_src = q_src + C;
    const bf16* v_src = q_src + 2 * C;
    const bf16* o_src = dout + size_t(b) * T * C + h * HS;
    const int q0 = qb * BQ, wq0 = q0 + warp * MT * 16, n_tiles = (min(q0 + BQ, T) - 1) / BK + 1;
    const float sl2 = scale * kLog2e;

    load_rows_async<HS, LD, THREADS, BQ>(sQ, q_src, stride, q0, T);
    load_rows_async<HS, LD, THREADS, BQ>(sO, o_src, size_t(C), q0, T);
    load_rows_async<HS, LD, THREADS, BK>(sK, k_src, stride, 0, T);
    load_rows_async<HS, LD, THREADS, BK>(sV, v_src, stride, 0, T);
    cp_async_commit();

    float l2[MT][2], Dr[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int row = wq0 + mt * 16 + g + hf * 8;
            const size_t i = (size_t(b) * NH + h) * T + row;
            l2[mt][hf] = row < T ? lse[i] * kLog2e : 0.0f;
            Dr[mt][hf] = row < T ? Dsum[i] : 0.0f;
        }
    float dq[MT][DT][4];
    zero(dq);

    for (int j = 0; j < n_tiles; j++) {
        cp_async_wait<0>();
        __syncthreads();
        if (j + 1 < n_tiles) {
            const int st = (j + 1) & 1;
            load_rows_async<HS, LD, THREADS, BK>(sK + st * BK * LD, k_src, stride, (j + 1) * BK, T);
            load_rows_async<HS, LD, THREADS, BK>(sV + st * BK * LD, v_src, stride, (j + 1) * BK, T);
            cp_async_commit();
        }
        const int k0 = j * BK;
        if (k0 > wq0 + MT * 16 - 1) continue;  // every key of this tile is after every query of this warp
        const bf16* cK = sK + (j & 1) * BK * LD;
        const bf16* cV = sV + (j & 1) * BK * LD;

        float s[MT][NT][4], dp[MT][NT][4];
        zero(s);
        zero(dp);
        // s = q k^T and dP = dO v^T
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            uint32_t a[MT][4], a2[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                load_a(a[mt], sQ, LD, (warp * MT + mt) * 16, ks * 16);
                load_a(a2[mt], sO, LD, (warp * MT + mt) * 16, ks * 16);
            }
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t bb[4];
                load_b_nk(bb, cK, LD, np * 16, ks * 16);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16(s[mt][2 * np], a[mt], bb[0], bb[1]);
                    mma_bf16(s[mt][2 * np + 1], a[mt], bb[2], bb[3]);
                }
                load_b_nk(bb, cV, LD, np * 16, ks * 16);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16(dp[mt][2 * np], a2[mt], bb[0], bb[1]);
                    mma_bf16(dp[mt][2 * np + 1], a2[mt], bb[2], bb[3]);
                }
            }
        }
        // dS = P * (dP - D), P recomputed from lse; keys after the query masked
        const bool mask = k0 + BK - 1 > wq0;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int hf = e >> 1, row = wq0 + mt * 16 + g + hf * 8, key = k0 + nt * 8 + 2 * c4 + (e & 1);
                    float p = probability(s[mt][nt][e], sl2, l2[mt][hf]);
                    if (mask && key > row) p = 0.0f;
                    dp[mt][nt][e] = p * (dp[mt][nt][e] - Dr[mt][hf]);
                }
        // dq += dS k
        mma_p_b(dq, dp, cK, LD);
    }

#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int row = wq0 + mt * 16 + g + hf * 8;
            if (row >= T) continue;
            bf16* dst = dqkv + (size_t(b) * T + row) * stride + h * HS + 2 * c4;
#pragma unroll
            for (int dt = 0; dt < DT; dt++)
                *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8) =
                    __floats2bfloat162_rn(dq[mt][dt][hf * 2] * scale, dq[mt][dt][hf * 2 + 1] * scale);
        }
}

// dq for BQ = kDsTile queries (a warp per 16) from the dS tiles backward_dkdv_kernel<..., STORE_DS> wrote:
// dq = scale sum_j dS_j k_j over the key tiles j <= this query tile, in order (deterministic). A warp
// reads its A fragments straight from global memory (one coalesced 512-byte row per 16x16 block, the
// next tile's prefetched into registers during this one's MMAs); k tiles are double-buffered in
// shared memory. Bound by reading dS (8 KB per tile pair), not by arithmetic.
template <int HS>
__global__ void __launch_bounds__(kDsTile * 2)
    backward_dq_from_ds_kernel(bf16* dqkv, const uint4* ds, const bf16* qkv, int T, int NH, float scale) {
    constexpr int BQ = kDsTile, BK = kDsTile, KSTEPS = BK / 16, LD = HS + 8, DT = HS / 8, THREADS = kDsTile * 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sK = reinterpret_cast<bf16*>(smem_raw);  // 2 x BK x LD

    const int n_qt = gridDim.x, qt = n_qt - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;  // heaviest first
    const int C = NH * HS, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c4 = lane % 4;
    const size_t stride = 3 * size_t(C);
    const bf16* k_src = qkv + size_t(b) * T * stride + C + h * HS;
    const uint4* frag = ds + ds_tile_index(b, h, NH, n_qt, qt, 0) * kDsTileVecs + warp * KSTEPS * 32 +
                        lane;  // + j kDsTileVecs + ks 32: tile j, key step ks

    load_rows_async<HS, LD, THREADS, BK>(sK, k_src, stride, 0, T);
    cp_async_commit();
    uint4 cur[KSTEPS], next[KSTEPS];
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ks++) cur[ks] = frag[ks * 32];
    float dq[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;

    for (int j = 0; j <= qt; j++) {
        cp_async_wait<0>();
        __syncthreads();
        if (j < qt) {
            load_rows_async<HS, LD, THREADS, BK>(sK + ((j + 1) & 1) * BK * LD, k_src, stride, (j + 1) * BK, T);
            cp_async_commit();
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) next[ks] = frag[(j + 1) * kDsTileVecs + ks * 32];
        }
        const bf16* cK = sK + (j & 1) * BK * LD;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
            if (j == qt && ks > warp) break;  // on the diagonal tile these keys are after all this warp's queries: dS = 0
            const uint32_t a[4] = {cur[ks].x, cur[ks].y, cur[ks].z, cur[ks].w};
#pragma unroll
            for (int dpair = 0; dpair < DT / 2; dpair++) {
                uint32_t bb[4];
                load_b_kn(bb, cK, LD, ks * 16, dpair * 16);
                mma_bf16(dq[2 * dpair], a, bb[0], bb[1]);
                mma_bf16(dq[2 * dpair + 1], a, bb[2], bb[3]);
            }
        }
        if (j < qt)
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) cur[ks] = next[ks];
    }

#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int row = qt * BQ + warp * 16 + g + hf * 8;
        if (row >= T) continue;
        bf16* dst = dqkv + (size_t(b) * T + row) * stride + h * HS + 2 * c4;
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
            *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8) =
                __floats2bfloat162_rn(dq[dt][hf * 2] * scale, dq[dt][hf * 2 + 1] * scale);
    }
}

template <int HS>
void launch_backward_dot(float* D, const bf16* dout, const bf16* out, int B, int T, int NH, cudaStream_t stream) {
    constexpr int VECS = HS / 8, LANES = VECS <= 8 ? 8 : VECS <= 16 ? 16 : 32;
    const long long threads = (long long)B * T * NH * LANES;
    backward_dot_kernel<HS><<<unsigned((threads + 255) / 256), 256, 0, stream>>>(D, dout, out, B, T, NH);
    cuda_check_launch();
}

// One launch of each backward kernel, in the configuration its template names (training's is in
// launch_backward below; the lab runs others, dev/cuda/flash_attention_lab.cuh). MIN_BLOCKS: blocks per
// SM the kernel's registers must allow (__launch_bounds__; 1 leaves the compiler free).
template <int HS, int WARPS, int MT, int BQ, int MIN_BLOCKS, bool STORE_DS>
void launch_backward_dkdv(bf16* dqkv, uint4* ds, const bf16* dout, const float* lse, const float* D, const bf16* qkv, int B,
                          int T, int NH, float scale, cudaStream_t stream) {
    constexpr int BK = WARPS * MT * 16;
    const size_t smem = size_t(2 * BK + 4 * BQ) * (HS + 8) * sizeof(bf16) + 4 * BQ * sizeof(float);
    auto kernel = backward_dkdv_kernel<HS, WARPS, MT, BQ, MIN_BLOCKS, STORE_DS>;
    static bool configured = false;
    if (!configured) allow_smem(kernel, smem), configured = true;
    kernel<<<dim3((T + BK - 1) / BK, NH, B), WARPS * 32, smem, stream>>>(dqkv, ds, dout, lse, D, qkv, T, NH, scale);
    cuda_check_launch();
}
template <int HS, int WARPS, int MT, int BK, int MIN_BLOCKS>
void launch_backward_dq(bf16* dqkv, const bf16* dout, const float* lse, const float* D, const bf16* qkv, int B, int T, int NH,
                        float scale, cudaStream_t stream) {
    constexpr int BQ = WARPS * MT * 16;
    const size_t smem = size_t(2 * BQ + 4 * BK) * (HS + 8) * sizeof(bf16);
    auto kernel = backward_dq_kernel<HS, WARPS, MT, BK, MIN_BLOCKS>;
    static bool configured = false;
    if (!configured) allow_smem(kernel, smem), configured = true;
    kernel<<<dim3((T + BQ - 1) / BQ, NH, B), WARPS * 32, smem, stream>>>(dqkv, dout, lse, D, qkv, T, NH, scale);
    cuda_check_launch();
}
template <int HS> void launch_backward_dq_from_ds(bf16* dqkv, const uint4* ds, const bf16* qkv, int B, int T, int NH, float scale,
                                                  cudaStream_t stream) {
    const size_t smem = size_t(2 * kDsTile) * (HS + 8) * sizeof(bf16);
    backward_dq_from_ds_kernel<HS><<<dim3((T + kDsTile - 1) / kDsTile, NH, B), kDsTile * 2, smem, stream>>>(dqkv, ds, qkv, T, NH,
                                                                                                           scale);
    cuda_check_launch();
}

// The configuration training runs: both kernels 4 warps x 16 rows, streamed tiles of 64. ds (nullptr:
// recompute): room for the dS tiles (backward_ds_bytes); the key side stores them and
// backward_dq_from_ds_kernel replaces the query side.
template <int HS>
void launch_backward(bf16* dqkv, float* D, uint4* ds, const bf16* dout, const bf16* out, const float* lse, const bf16* qkv, int B,
                     int T, int NH, cudaStream_t stream) {
    launch_backward_dot<HS>(D, dout, out, B, T, NH, stream);
    const float scale = 1.0f / sqrtf(float(HS));
    if (ds) {
        launch_backward_dkdv<HS, 4, 1, 64, 1, true>(dqkv, ds, dout, lse, D, qkv, B, T, NH, scale, stream);
        launch_backward_dq_from_ds<HS>(dqkv, ds, qkv, B, T, NH, scale, stream);
    } else {
        launch_backward_dkdv<HS, 4, 1, 64, 1, false>(dqkv, ds, dout, lse, D, qkv, B, T, NH, scale, stream);
        launch_backward_dq<HS, 4, 1, 64, 1>(dqkv, dout, lse, D, qkv, B, T, NH, scale, stream);
    }
}

// dk, dv (and the dS tiles) with Hopper's warpgroup MMA, head size 64, dS stored: the key side of the
// dS-storing backward (backward_dkdv_kernel<64, 4, 1, 64, ..., true>) with its four products on wgmma
// (forward_wgmma_kernel says why). A warpgroup owns 64 keys; query tiles of 64 stream through
// swizzled, double-buffered shared memory. Per tile: s^T = k q^T and dP^T = v dO^T (A = k, v; B = q, dO,
// all K-major in shared memory; dP^T still runs while P^T is computed), then dv += P^T dO and dk += dS^T
// q (A = P^T, dS^T from registers; B = dO, q as stored, MN-major). Each warp's accumulator rows are
// its 16 keys in mma.sync's layout, so P^T, dS^T, their masking and the stored dS tiles are the
// mma.sync kernel's, element for element.
// At least 3 blocks per SM (__launch_bounds__) hold it to 168 registers: 3 warpgroups per SM instead
// of 2. dv's product is issued with dk's, after dS, not while dS is computed: at 168 registers that is
// what lets ptxas keep the products asynchronous. With P^T's bf16 copy held live through the dS math
// (dv issued early, the lab's version 13) it runs out of registers and serializes every wgmma (ptxas
// C7512), with 16 bytes of spill. The same products in the same order either way, so the same bits.
constexpr int kDkdvWgmmaMinBlocks = 3;
__global__ void __launch_bounds__(128, kDkdvWgmmaMinBlocks)
    backward_dkdv_wgmma_kernel(bf16* dqkv, uint4* ds, const bf16* dout, const float* lse, const float* Dsum, const bf16* qkv,
                               int T, int NH, float scale) {
#ifdef PTX_HAVE_SM90A
    constexpr int HS = 64, BK = 64, BQ = 64, NT = BQ / 8, THREADS = 128, TILE = 64 * 64;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // swizzle atoms: 1024-aligned
    bf16* sK = reinterpret_cast<bf16*>(smem);  // BK x 64
    bf16* sV = sK + TILE;                      // BK x 64
    bf16* sQ = sV + TILE;                      // 2 x BQ x 64
    bf16* sO = sQ + 2 * TILE;                  // 2 x BQ x 64 (dO)
    float* sL = reinterpret_cast<float*>(sO + 2 * TILE);  // 2 x BQ (lse)
    float* sD = sL + 2 * BQ;                              // 2 x BQ (D)

    const int kb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;  // early key blocks (most work) first
    const int C = NH * HS, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c4 = lane % 4;
    const size_t stride = 3 * size_t(C);
    const bf16* q_src = qkv + size_t(b) * T * stride + h * HS;
    const bf16* k_src = q_src + C;
    const bf16* v_src = q_src + 2 * C;
    const bf16* o_src = dout + size_t(b) * T * C + h * HS;
    const float* l_src = lse + (size_t(b) * NH + h) * T;
    const float* d_src = Dsum + (size_t(b) * NH + h) * T;
    const int kblk0 = kb * BK, wk0 = kblk0 + warp * 16;  // this warp's first key
    const int qt0 = kb, n_qt = (T + BQ - 1) / BQ;
    const float sl2 = scale * kLog2e;

    auto load_query_tile = [&](int qt, int st) {
        load_rows_sw128_async<THREADS, BQ>(sQ + st * TILE, q_src, stride, qt * BQ, T);
        load_rows_sw128_async<THREADS, BQ>(sO + st * TILE, o_src, size_t(C), qt * BQ, T);
        load_floats_async<THREADS, BQ>(sL + st * BQ, l_src, qt * BQ, T);
        load_floats_async<THREADS, BQ>(sD + st * BQ, d_src, qt * BQ, T);
    };
    load_rows_sw128_async<THREADS, BK>(sK, k_src, stride, kblk0, T);
    load_rows_sw128_async<THREADS, BK>(sV, v_src, stride, kblk0, T);
    load_query_tile(qt0, 0);
    cp_async_commit();

    const uint64_t k_desc = sw128_desc(sK, 16, 1024), v_desc = sw128_desc(sV, 16, 1024);
    float dk[HS / 2], dv[HS / 2];
#pragma unroll
    for (int i = 0; i < HS / 2; i++) dk[i] = dv[i] = 0.0f;

    for (int qt = qt0; qt < n_qt; qt++) {
        cp_async_wait<0>();
        fence_proxy_async_smem();
        __syncthreads();  // tile qt is in; the products of tile qt - 1 are done (waited for below)
        const int st = (qt - qt0) & 1;
        if (qt + 1 < n_qt) {
            load_query_tile(qt + 1, st ^ 1);
            cp_async_commit();
        }
        const int q0 = qt * BQ;
        const uint64_t q_desc = sw128_desc(sQ + st * TILE, 16, 1024), o_desc = sw128_desc(sO + st * TILE, 16, 1024);
        const uint64_t q_desc_mn = sw128_desc(sQ + st * TILE, BQ * 128, 1024), o_desc_mn = sw128_desc(sO + st * TILE, BQ * 128, 1024);
        const float* cL = sL + st * BQ;
        const float* cD = sD + st * BQ;

        // s^T = k q^T, then dP^T = v dO^T (two groups: P^T is computed while the second runs)
        float s[BQ / 2], dp[BQ / 2];
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) wgmma_m64n64k16_ss(s, k_desc + 2 * ks, q_desc + 2 * ks, ks);
        wgmma_commit();
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) wgmma_m64n64k16_ss(dp, v_desc + 2 * ks, o_desc + 2 * ks, ks);
        wgmma_commit();
        wgmma_wait<1>();
        keep_regs(s);

        // P^T from the saved lse; s[4 nt + e]: key wk0 + g + 8 (e / 2), query q0 + 8 nt + 2 c4 + e % 2.
        // Masked: query before key, or past T.
        const bool mask = q0 < wk0 + 15 || q0 + BQ > T;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qi = nt * 8 + 2 * c4 + (e & 1), key = wk0 + g + (e >> 1) * 8, query = q0 + qi;
                float p = probability(s[4 * nt + e], sl2, cL[qi] * kLog2e);
                if (mask && (query < key || query >= T)) p = 0.0f;
                s[4 * nt + e] = p;
            }
        // dv += P^T dO
        uint32_t pa[BQ / 16][4], pb[BQ / 16][4];
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            pack8_bf16(pa[kk], s + 8 * kk);
        }
        wgmma_wait<0>();
        keep_regs(dp);

        // dS^T = P^T * (dP^T - D), stored for the dq pass, then dk += dS^T q
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) dp[4 * nt + e] = s[4 * nt + e] * (dp[4 * nt + e] - cD[nt * 8 + 2 * c4 + (e & 1)]);
        uint4* tile = ds + ds_tile_index(b, h, NH, n_qt, qt, kb) * kDsTileVecs;
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            pack8_bf16(pb[kk], dp + 8 * kk);
            // pb[i]: key g + 8 (i % 2) x queries 2 c4 + 8 (i / 2) + {0, 1}; transposed: dq's A 0, 2, 1, 3
            tile[(kk * (BK / 16) + warp) * 32 + lane] =
                make_uint4(transpose8x8(pb[kk][0]), transpose8x8(pb[kk][2]), transpose8x8(pb[kk][1]), transpose8x8(pb[kk][3]));
        }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) wgmma_m64n64k16_rs_mn(dv, pa[kk], o_desc_mn + kk * (16 * 128 / 16));
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) wgmma_m64n64k16_rs_mn(dk, pb[kk], q_desc_mn + kk * (16 * 128 / 16));
        wgmma_commit();
        wgmma_wait<0>();  // before the next barrier: the stage these read is refilled after it
        keep_regs(dk);
        keep_regs(dv);
        keep_regs(pa);
        keep_regs(pb);
    }

#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int key = wk0 + g + hf * 8;
        if (key >= T) continue;
        bf16* dst = dqkv + (size_t(b) * T + key) * stride + C + h * HS + 2 * c4;
#pragma unroll
        for (int dt = 0; dt < HS / 8; dt++) {
            *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8) =
                __floats2bfloat162_rn(dk[4 * dt + hf * 2] * scale, dk[4 * dt + hf * 2 + 1] * scale);
            *reinterpret_cast<__nv_bfloat162*>(dst + C + dt * 8) = __floats2bfloat162_rn(dv[4 * dt + hf * 2], dv[4 * dt + hf * 2 + 1]);
        }
    }
#else
    __trap();  // built without sm_90a: backward_wgmma never launches it (wgmma_available)
#endif
}

// The dS-storing backward with backward_dkdv_wgmma_kernel as its key side; false where it does not
// run (HS != 64, no room for dS, or not an sm_90 GPU).
inline bool backward_wgmma(bf16* dqkv, float* D, uint4* ds, const bf16* dout, const bf16* out, const float* lse,
                           const bf16* qkv, int B, int T, int NH, int HS, cudaStream_t stream) {
    if (HS != 64 || !ds || !wgmma_available()) return false;
    launch_backward_dot<64>(D, dout, out, B, T, NH, stream);
    const float scale = 1.0f / 8.0f;
    const size_t smem = size_t(6 * 64 * 64) * sizeof(bf16) + 4 * 64 * sizeof(float) + 1024;
    static bool configured = false;
    if (!configured) allow_smem(backward_dkdv_wgmma_kernel, smem), configured = true;
    backward_dkdv_wgmma_kernel<<<dim3((T + 63) / 64, NH, B), 128, smem, stream>>>(dqkv, ds, dout, lse, D, qkv, T, NH, scale);
    cuda_check_launch();
    launch_backward_dq_from_ds<64>(dqkv, ds, qkv, B, T, NH, scale, stream);
    return true;
}

// Bytes of dS tiles (kDsTile x kDsTile bf16, the causal ones) the dS-storing backward needs.
inline size_t backward_ds_bytes(int B, int T, int NH) {
    const int n = (T + kDsTile - 1) / kDsTile;
    return ds_tile_index(B, 0, NH, n, 0, 0) * kDsTileVecs * sizeof(uint4);
}

// false where HS has no fast path.
inline bool backward_tc(bf16* dqkv, float* D, const bf16* dout, const bf16* out, const float* lse, const bf16* qkv, int B, int T,
                        int NH, int HS, cudaStream_t stream, uint4* ds = nullptr) {
    switch (HS) {
        case 64: launch_backward<64>(dqkv, D, ds, dout, out, lse, qkv, B, T, NH, stream); return true;
        case 80: launch_backward<80>(dqkv, D, ds, dout, out, lse, qkv, B, T, NH, stream); return true;
        case 128: launch_backward<128>(dqkv, D, ds, dout, out, lse, qkv, B, T, NH, stream); return true;
        default: return false;
    }
}

// ---------------------------------------------------------------------------------------------
// Plain path: any HS <= 256, any alignment. One warp per row; keys (or queries) in chunks of 32, one
// per lane for the dot products, then the lanes switch to owning head dimensions (d = lane + 32 i)
// to accumulate. fp32 throughout.

constexpr int kPlainWarps = 4, kPlainPerLane = kPlainMaxHS / 32;

__device__ __forceinline__ float dot_row(const float* x, const bf16* y, int HS) {
    float s = 0.0f;
    for (int d = 0; d < HS; d++) s += x[d] * __bfloat162float(y[d]);
    return s;
}

// Row r of B * NH * T is (b, h, t) with t fastest.
__global__ void plain_forward_kernel(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int HS, float scale) {
    __shared__ float sq[kPlainWarps][kPlainMaxHS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long row = (long long)blockIdx.x * kPlainWarps + warp;
    if (row >= (long long)B * NH * T) return;
    const int t = int(row % T), h = int(row / T % NH), b = int(row / ((long long)T * NH));
    const int C = NH * HS;
    const size_t stride = 3 * size_t(C);
    const bf16* base = qkv + size_t(b) * T * stride + h * HS;
    const float sl2 = scale * kLog2e;
    for (int d = lane; d < HS; d += 32) sq[warp][d] = __bfloat162float(base[size_t(t) * stride + d]) * sl2;
    __syncwarp();
    float acc[kPlainPerLane] = {};
    float m = -INFINITY, l = 0.0f;
    for (int c0 = 0; c0 <= t; c0 += 32) {
        const int key = c0 + lane;
        const float s = key <= t ? dot_row(sq[warp], base + size_t(key) * stride + C, HS) : -INFINITY;
        const float m_new = fmaxf(m, warp_max(s));  // finite: key c0 <= t is in every chunk
        const float corr = exp2f(m - m_new), p = exp2f(s - m_new);
        l = l * corr + warp_sum(p);
        m = m_new;
#pragma unroll
        for (int i = 0; i < kPlainPerLane; i++) acc[i] *= corr;
        const int n = min(32, t - c0 + 1);
        for (int jj = 0; jj < n; jj++) {
            const float pj = __shfl_sync(0xffffffffu, p, jj);
            const bf16* v = base + size_t(c0 + jj) * stride + 2 * C;
#pragma unroll
            for (int i = 0; i < kPlainPerLane; i++)
                if (lane + 32 * i < HS) acc[i] += pj * __bfloat162float(v[lane + 32 * i]);
        }
    }
    bf16* dst = out + (size_t(b) * T + t) * C + h * HS;
#pragma unroll
    for (int i = 0; i < kPlainPerLane; i++)
        if (lane + 32 * i < HS) dst[lane + 32 * i] = __float2bfloat16(acc[i] / l);
    if (lane == 0) lse[row] = (m + log2f(l)) * kLn2;
}

// dq for query row (b, h, t): sum over keys j <= t of dS_tj k_j.
__global__ void plain_backward_dq_kernel(bf16* dqkv, const bf16* dout, const float* lse, const float* Dsum, const bf16* qkv,
                                         int B, int T, int NH, int HS, float scale) {
    __shared__ float sq[kPlainWarps][kPlainMaxHS], sdo[kPlainWarps][kPlainMaxHS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long row = (long long)blockIdx.x * kPlainWarps + warp;
    if (row >= (long long)B * NH * T) return;
    const int t = int(row % T), h = int(row / T % NH), b = int(row / ((long long)T * NH));
    const int C = NH * HS;
    const size_t stride = 3 * size_t(C);
    const bf16* base = qkv + size_t(b) * T * stride + h * HS;
    const float sl2 = scale * kLog2e, l2 = lse[row] * kLog2e, Dt = Dsum[row];
    for (int d = lane; d < HS; d += 32) {
        sq[warp][d] = __bfloat162float(base[size_t(t) * stride + d]) * sl2;
        sdo[warp][d] = __bfloat162float(dout[(size_t(b) * T + t) * C + h * HS + d]);
    }
    __syncwarp();
    float acc[kPlainPerLane] = {};
    for (int c0 = 0; c0 <= t; c0 += 32) {
        const int key = c0 + lane;
        float ds = 0.0f;
        if (key <= t) {
            const float p = exp2f(dot_row(sq[warp], base + size_t(key) * stride + C, HS) - l2);
            ds = p * (dot_row(sdo[warp], base + size_t(key) * stride + 2 * C, HS) - Dt);
        }
        const int n = min(32, t - c0 + 1);
        for (int jj = 0; jj < n; jj++) {
            const float dsj = __shfl_sync(0xffffffffu, ds, jj);
            const bf16* k = base + size_t(c0 + jj) * stride + C;
#pragma unroll
            for (int i = 0; i < kPlainPerLane; i++)
                if (lane + 32 * i < HS) acc[i] += dsj * __bfloat162float(k[lane + 32 * i]);
        }
    }
    bf16* dst = dqkv + (size_t(b) * T + t) * stride + h * HS;
#pragma unroll
    for (int i = 0; i < kPlainPerLane; i++)
        if (lane + 32 * i < HS) dst[lane + 32 * i] = __float2bfloat16(acc[i] * scale);
}

// dk, dv for key row (b, h, j): sums over queries t >= j.
__global__ void plain_backward_dkdv_kernel(bf16* dqkv, const bf16* dout, const float* lse, const float* Dsum,
                                           const bf16* qkv, int B, int T, int NH, int HS, float scale) {
    __shared__ float sk[kPlainWarps][kPlainMaxHS], sv[kPlainWarps][kPlainMaxHS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long row = (long long)blockIdx.x * kPlainWarps + warp;
    if (row >= (long long)B * NH * T) return;
    const int j = int(row % T), h = int(row / T % NH), b = int(row / ((long long)T * NH));
    const int C = NH * HS;
    const size_t stride = 3 * size_t(C);
    const bf16* base = qkv + size_t(b) * T * stride + h * HS;
    const bf16* dbase = dout + size_t(b) * T * C + h * HS;
    const float* lrow = lse + (row - j);
    const float* drow = Dsum + (row - j);
    const float sl2 = scale * kLog2e;
    for (int d = lane; d < HS; d += 32) {
        sk[warp][d] = __bfloat162float(base[size_t(j) * stride + C + d]) * sl2;
        sv[warp][d] = __bfloat162float(base[size_t(j) * stride + 2 * C + d]);
    }
    __syncwarp();
    float dk[kPlainPerLane] = {}, dv[kPlainPerLane] = {};
    for (int c0 = j; c0 < T; c0 += 32) {
        const int query = c0 + lane;
        float p = 0.0f, ds = 0.0f;
        if (query < T) {
            p = exp2f(dot_row(sk[warp], base + size_t(query) * stride, HS) - lrow[query] * kLog2e);
            ds = p * (dot_row(sv[warp], dbase + size_t(query) * C, HS) - drow[query]);
        }
        const int n = min(32, T - c0);
        for (int jj = 0; jj < n; jj++) {
            const float pj = __shfl_sync(0xffffffffu, p, jj), dsj = __shfl_sync(0xffffffffu, ds, jj);
            const bf16* q = base + size_t(c0 + jj) * stride;
            const bf16* g = dbase + size_t(c0 + jj) * C;
#pragma unroll
            for (int i = 0; i < kPlainPerLane; i++)
                if (lane + 32 * i < HS) {
                    dv[i] += pj * __bfloat162float(g[lane + 32 * i]);
                    dk[i] += dsj * __bfloat162float(q[lane + 32 * i]);
                }
        }
    }
    bf16* dst = dqkv + (size_t(b) * T + j) * stride + C + h * HS;
#pragma unroll
    for (int i = 0; i < kPlainPerLane; i++)
        if (lane + 32 * i < HS) {
            dst[lane + 32 * i] = __float2bfloat16(dk[i] * scale);
            dst[C + lane + 32 * i] = __float2bfloat16(dv[i]);
        }
}

inline void forward_plain(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int HS, cudaStream_t stream) {
    const long long rows = (long long)B * NH * T;
    plain_forward_kernel<<<unsigned((rows + kPlainWarps - 1) / kPlainWarps), kPlainWarps * 32, 0, stream>>>(
        out, lse, qkv, B, T, NH, HS, 1.0f / sqrtf(float(HS)));
    cuda_check_launch();
}

inline void backward_plain(bf16* dqkv, float* D, const bf16* dout, const bf16* out, const float* lse, const bf16* qkv, int B,
                           int T, int NH, int HS, cudaStream_t stream) {
    const long long rows = (long long)B * NH * T;
    backward_dot_plain_kernel<<<unsigned((rows + 7) / 8), 256, 0, stream>>>(D, dout, out, B, T, NH, HS);
    cuda_check_launch();
    const unsigned blocks = unsigned((rows + kPlainWarps - 1) / kPlainWarps);
    const float scale = 1.0f / sqrtf(float(HS));
    plain_backward_dq_kernel<<<blocks, kPlainWarps * 32, 0, stream>>>(dqkv, dout, lse, D, qkv, B, T, NH, HS, scale);
    cuda_check_launch();
    plain_backward_dkdv_kernel<<<blocks, kPlainWarps * 32, 0, stream>>>(dqkv, dout, lse, D, qkv, B, T, NH, HS, scale);
    cuda_check_launch();
}

inline void check_shape(int B, int T, int NH, int HS) {
    if (B < 1 || T < 1 || NH < 1 || HS < 1 || HS > kPlainMaxHS)
        fail("flash attention: unsupported shape B=%d T=%d NH=%d HS=%d (HS must be 1..%d)", B, T, NH, HS, kPlainMaxHS);
}

}  // namespace flash_detail

// ---------------------------------------------------------------------------------------------
// Public API.

// True where the tensor-core path runs (given 16-byte aligned pointers); other head sizes <= 256 run
// the plain path, correct but slow.
inline bool flash_attention_supported(int head_size) { return head_size == 64 || head_size == 80 || head_size == 128; }

// out (B, T, NH*HS) and lse (B, NH, T) from qkv (B, T, 3*NH*HS).
inline void flash_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T, int NH, int HS,
                                    cudaStream_t stream = 0) {
    using namespace flash_detail;
    check_shape(B, T, NH, HS);
    const bool fast = flash_attention_supported(HS) && is_aligned16(out) && is_aligned16(qkv);
    if (fast) {
        if (!forward_wgmma(out, lse, qkv, B, T, NH, HS, stream)) forward_tc(out, lse, qkv, B, T, NH, HS, stream);
    } else {
        forward_plain(out, lse, qkv, B, T, NH, HS, stream);
    }
}

// Scratch for the backward: D = rowsum(dout * out), fp32 (B, NH, T).
inline size_t flash_attention_backward_scratch_bytes(int B, int T, int NH, int HS) {
    (void)HS;
    return (size_t(B) * NH * T * sizeof(float) + 255) / 256 * 256;
}

// Optional second scratch for the backward: room for dS, bf16, in 64 x 64 tiles on and below the
// diagonal (B NH n (n + 1) / 2 tiles of 8 KB, n = ceil(T / 64); 0.86 GB at B=64 NH=12 T=1024). Given
// it, the dk/dv pass stores dS and the dq pass reads it back instead of recomputing it (5 matrix
// products instead of 7; faster at GPT-2's shapes, dev/cuda/README.md); without it, or too small, dq
// recomputes.
inline size_t flash_attention_backward_ds_bytes(int B, int T, int NH, int HS) {
    return flash_attention_supported(HS) ? flash_detail::backward_ds_bytes(B, T, NH) : 0;
}

// The optional parts of a flash_attention_backward call, each set by name (the defaults: no room for
// dS, the default stream):
//   ds_scratch, ds_scratch_bytes: the room for dS above (null or too small: dq recomputes it).
struct FlashAttentionBackwardOptions {
    void* ds_scratch = nullptr;
    size_t ds_scratch_bytes = 0;
    cudaStream_t stream = 0;
    FlashAttentionBackwardOptions& with_ds_scratch(void* p, size_t bytes) {
        ds_scratch = p, ds_scratch_bytes = bytes;
        return *this;
    }
    FlashAttentionBackwardOptions& with_stream(cudaStream_t s) { stream = s; return *this; }
};

// dqkv (B, T, 3*NH*HS), overwritten, from dout and out (B, T, NH*HS), lse (B, NH, T) and qkv.
// scratch: flash_attention_backward_scratch_bytes; options: see above.
inline void flash_attention_backward(__nv_bfloat16* dqkv, void* scratch, const __nv_bfloat16* dout, const __nv_bfloat16* out,
                                     const float* lse, const __nv_bfloat16* qkv, int B, int T, int NH, int HS,
                                     const FlashAttentionBackwardOptions& options = FlashAttentionBackwardOptions()) {
    using namespace flash_detail;
    void* const ds_scratch = options.ds_scratch;
    const size_t ds_scratch_bytes = options.ds_scratch_bytes;
    const cudaStream_t stream = options.stream;
    check_shape(B, T, NH, HS);
    float* D = static_cast<float*>(scratch);
    const bool fast = flash_attention_supported(HS) && is_aligned16(dqkv) && is_aligned16(dout) && is_aligned16(out) &&
                      is_aligned16(qkv);
    if (fast) {
        const bool store_ds = ds_scratch && is_aligned16(ds_scratch) && ds_scratch_bytes >= backward_ds_bytes(B, T, NH);
        if (store_ds && backward_wgmma(dqkv, D, static_cast<uint4*>(ds_scratch), dout, out, lse, qkv, B, T, NH, HS, stream)) return;
        backward_tc(dqkv, D, dout, out, lse, qkv, B, T, NH, HS, stream, store_ds ? static_cast<uint4*>(ds_scratch) : nullptr);
    } else {
        backward_plain(dqkv, D, dout, out, lse, qkv, B, T, NH, HS, stream);
    }
}
