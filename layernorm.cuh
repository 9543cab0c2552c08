// layernorm.cuh: LayerNorm forward and backward.
//
// What it computes, per row x of length C (fp32 statistics and reductions, whatever the storage T):
//   forward   m = mean(x), v = mean((x - m)^2) (no bias correction), s = 1 / sqrt(v + 1e-5),
//             y = (x - m) * s * w + b; mean and rstd are written (fp32, one per row) for the backward.
//   backward  from the cached mean and rstd (x is read once, never re-reduced):
//             n = (x - m) * s, g = w * dy, dx += s * (g - mean(g) - n * mean(g * n)),
//             dweight += sum over rows of n * dy, dbias += sum over rows of dy;
//             optionally next_dbias += sum over rows of dx (the updated dx, as stored in T).
//
// Non-obvious choices:
//   - dx, dweight and dbias ACCUMULATE (+=). In GPT-2 the LayerNorm input is the residual stream,
//     whose gradient already holds the skip connection's contribution; adding in place saves a
//     separate add kernel and a full read + write of the stream. dweight/dbias are += so that
//     gradient accumulation over micro-steps needs no extra buffer. Zero them yourself when needed.
//   - Deterministic: no floating-point atomics anywhere. The backward kernel runs a persistent grid
//     of P = (SMs x resident blocks) blocks; each block gives its rows in a fixed order, keeps its
//     dweight/dbias column sums in registers, folds its row groups in a fixed order and writes one
//     partial row per block to the scratch buffer; one small finalize kernel sums the P partials in
//     a fixed order and adds them into dweight/dbias. Same bits every run on the same device (P
//     depends on the SM count, so a different GPU model may round differently).
//   - The scratch needs no zeroing: every block overwrites its whole partial row. Its size is
//     layernorm_backward_scratch_bytes(N, C), which queries the current device.
//   - next_dbias: in GPT-2 the tensor this backward updates in place, the residual stream's gradient,
//     is also the output gradient of the linear layer before it (attproj, fcproj), whose bias gradient
//     is its column sum; summed here, while each dx is in registers, that costs no read of the N x C
//     tensor (a separate column sum reads it all again). The sums are of the values as stored
//     (rounded to T), in fp32, over the same fixed partition as dweight/dbias: a third section of
//     each partial row, summed by the same finalize and rounded into T once. The vector kernel keeps
//     each thread's 16 running sums in shared memory (private slots, no barrier), not registers: it
//     already uses all 128 registers at 512 threads, and 16 more would spill. A template bool
//     (COLSUM) selects it, so without next_dbias the kernels carry none of it (the finalize only
//     takes one more, unused, pointer). The scratch is sized for it (3 C floats per partial row
//     instead of 2).
//   - Two paths each. The vector path (C a multiple of 16 / sizeof(T), every pointer 16-byte
//     aligned, C <= 16384 forward, C <= 8192 backward) keeps the row in registers:
//     one read of x (128-bit plain loads, all issued before the first use), a two-pass
//     mean/variance on the registers (numerically safe for rows with a large mean), one write.
//     A row group of 32 * WPR threads owns a row; WPR (warps per row) grows with C so that each thread
//     holds at most 32 columns (forward) or 16 columns (backward); row groups inside a block sync
//     with their own named barrier, so they never wait for each other. The general path (any C >= 1,
//     any alignment, any size) uses one block per row (forward) or a persistent grid of blocks
//     (backward) with scalar accesses and re-reads the row from L1/L2 between passes.

#pragma once

#include <type_traits>

#include "common.cuh"
#include "ptx.cuh"

namespace layernorm_detail {

using namespace ptx;

constexpr float kEps = 1e-5f;
constexpr int kForwardColsPerThread = 32;  // forward: up to 32 columns of the row per thread, in registers
constexpr int kForwardMaxWarpsPerRow = 16;  // 512 threads per row: vector forward up to C = 16384
constexpr int kBackwardColsPerThread = 16;  // backward: 16 columns per thread (x, dy, dx, w, dw, db in registers)
constexpr int kBackwardMaxWarpsPerRow = 16;  // 512 threads per row: vector backward up to C = 8192
constexpr int kForwardMinBlock = 256;   // bf16 forward blocks hold at least this many threads (several rows when rows are short)
constexpr int kBackwardMinBlock = 512;  // persistent backward blocks: 16 warps, at most 8 row groups (named barriers 1..8)

// Barrier for the WPR warps of one row group. With several row groups per block each group uses its
// own named barrier (ids 1..15), so a group never waits for another group's loads.
template <int WPR, int BLOCK> __device__ __forceinline__ void row_group_sync(int group) {
    if constexpr (BLOCK / (32 * WPR) == 1) {
        __syncthreads();
    } else {
        named_barrier_sync<32 * WPR>(group + 1);
    }
}

// Sum over the 32 * WPR threads of a row group. `buf` holds one float per warp of the block; callers
// alternate between two buffers on successive reductions so one barrier per reduction suffices.
template <int WPR, int BLOCK> __device__ __forceinline__ float row_group_sum(float v, float* buf) {
    v = warp_sum(v);
    if constexpr (WPR == 1) {
        return v;
    } else {
        const int warp = threadIdx.x / 32, group = warp / WPR;
        if (threadIdx.x % 32 == 0) buf[warp] = v;
        row_group_sync<WPR, BLOCK>(group);
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < WPR; w++) sum += buf[group * WPR + w];  // fixed order: deterministic
        return sum;
    }
}

template <int WPR, int BLOCK> __device__ __forceinline__ float2 row_group_sum2(float2 v, float2* buf) {
    v.x = warp_sum(v.x);
    v.y = warp_sum(v.y);
    if constexpr (WPR == 1) {
        return v;
    } else {
        const int warp = threadIdx.x / 32, group = warp / WPR;
        if (threadIdx.x % 32 == 0) buf[warp] = v;
        row_group_sync<WPR, BLOCK>(group);
        float2 sum = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < WPR; w++) sum.x += buf[group * WPR + w].x, sum.y += buf[group * WPR + w].y;
        return sum;
    }
}

__host__ __device__ constexpr int block_threads_of(int wpr, int min_block) { return 32 * wpr > min_block ? 32 * wpr : min_block; }
template <int WPR, int MIN = kForwardMinBlock> __host__ __device__ constexpr int block_threads() { return block_threads_of(WPR, MIN); }
template <int WPR> __host__ __device__ constexpr int backward_block_threads() { return block_threads<WPR, kBackwardMinBlock>(); }

// ---------------------------------------------------------------------------------------------
// Forward, vector path: row in registers, one 128-bit read of x, one write.

// The forward's launch choices, the faster ones in the lab (figures: docs/layernorm.md): x is read
// with plain loads, not streaming (evict-first) ones; fp32 blocks hold one row group (32 WPR
// threads), bf16 blocks at least 256 threads. The lab keeps the other choices as its own variants
// (dev/cuda/layernorm_lab.cuh).
template <typename T> constexpr int kForwardMinBlockOf = sizeof(T) == 4 ? 32 : kForwardMinBlock;
template <typename T, int WPR> __host__ __device__ constexpr int forward_block_threads() {
    return block_threads<WPR, kForwardMinBlockOf<T>>();
}

// The vector forward's row, in pieces that fp8.cuh's LayerNorm into FP8 shares, so that both give
// the same y bits: thread t of a row group of TPR = 32 WPR threads holds the row's vectors t, t + TPR,
// ... (K of them, VS values each) in registers.
template <typename T, int WPR> struct ForwardRow {
    static constexpr int TPR = 32 * WPR, VS = Vec128<T>::size, K = kForwardColsPerThread / VS;
    Vec128<T> x[K];
    __device__ __forceinline__ void load(const T* row, int t, int nvec) {
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int i = k * TPR + t;
            if (i < nvec) x[k] = Vec128<T>::load(row + size_t(i) * VS);
        }
    }
    // The row's mean and rstd (two passes over the registers, sums in a fixed order); buf: two
    // buffers of one float per warp of the block (row_group_sum).
    template <int BLOCK> __device__ __forceinline__ float2 stats(int t, int nvec, int C, float (*buf)[BLOCK / 32]) const {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++)
            if (k * TPR + t < nvec)
#pragma unroll
                for (int j = 0; j < VS; j++) sum += to_float(x[k][j]);
        const float m = row_group_sum<WPR, BLOCK>(sum, buf[0]) / C;
        float sq = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++)
            if (k * TPR + t < nvec)
#pragma unroll
                for (int j = 0; j < VS; j++) {
                    const float d = to_float(x[k][j]) - m;
                    sq += d * d;
                }
        return make_float2(m, rsqrtf(row_group_sum<WPR, BLOCK>(sq, buf[1]) / C + kEps));
    }
    // The row's mean and rstd into mean[row] and rstd[row] (either may be null), by one thread of the group.
    static __device__ __forceinline__ void store_stats(float* mean, float* rstd, int row, float2 ms) {
        if (mean) mean[row] = ms.x;
        if (rstd) rstd[row] = ms.y;
    }
    // y for vector k (column i = k TPR + t), with the weight's and bias's vectors at i.
    __device__ __forceinline__ Vec128<T> output(int k, float2 ms, const Vec128<T>& w, const Vec128<T>& b) const {
        Vec128<T> y;
#pragma unroll
        for (int j = 0; j < VS; j++) y[j] = from_float<T>((to_float(x[k][j]) - ms.x) * ms.y * to_float(w[j]) + to_float(b[j]));
        return y;
    }
};

// AMAX: also *amax_bits = max(*amax_bits, the bits of |y| over every y written, as stored in T), FP8's
// amax of out (fp8.cuh); a template argument: with AMAX = false the kernel has no trace of it.
template <typename T, int WPR, bool AMAX = false>
__global__ void __launch_bounds__(forward_block_threads<T, WPR>())
    layernorm_forward_vec_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N,
                                 int C, int out_ld, unsigned* amax_bits) {
    using Row = ForwardRow<T, WPR>;
    constexpr int BLOCK = forward_block_threads<T, WPR>(), TPR = Row::TPR, ROWS = BLOCK / TPR, VS = Row::VS, K = Row::K;
    __shared__ float buf[2][BLOCK / 32];
    const int group = threadIdx.x / TPR, t = threadIdx.x % TPR;
    const int row = blockIdx.x * ROWS + group;
    const bool active = row < N;
    const size_t offset = size_t(active ? row : N - 1) * C;  // inactive groups still reach the barriers
    const int nvec = C / VS;

    Row x;
    x.load(inp + offset, t, nvec);
    const float2 ms = x.template stats<BLOCK>(t, nvec, C, buf);
    // No barrier after this point, but AMAX's at the end, which inactive groups reach writing nothing.
    if (!AMAX && !active) return;
    if (t == 0 && active) Row::store_stats(mean, rstd, row, ms);
    unsigned amax = 0;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int i = k * TPR + t;
        if (i < nvec && active) {
            const Vec128<T> y = x.output(k, ms, Vec128<T>::load(weight + size_t(i) * VS), Vec128<T>::load(bias + size_t(i) * VS));
            y.store(out + size_t(row) * out_ld + size_t(i) * VS);
            if constexpr (AMAX)
#pragma unroll
                for (int j = 0; j < VS; j++) amax = max(amax, abs_bits(to_float(y[j])));
        }
    }
    if constexpr (AMAX) block_atomic_max<BLOCK>(amax_bits, amax);
}

// Forward, general path: one block of 256 threads per row, scalar accesses, three passes over the row
// (the second and third hit L1/L2). Any C >= 1, any alignment. AMAX: as the vector kernel's.
template <typename T, bool AMAX = false>
__global__ void __launch_bounds__(256)
    layernorm_forward_general_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N,
                                     int C, int out_ld, unsigned* amax_bits) {
    __shared__ float buf[2][8];
    const int row = blockIdx.x;
    const size_t offset = size_t(row) * C;
    const T* x = inp + offset;
    float sum = 0.0f;
    for (int c = threadIdx.x; c < C; c += 256) sum += to_float(x[c]);
    const float m = row_group_sum<8, 256>(sum, buf[0]) / C;
    float sq = 0.0f;
    for (int c = threadIdx.x; c < C; c += 256) {
        const float d = to_float(x[c]) - m;
        sq += d * d;
    }
    const float s = rsqrtf(row_group_sum<8, 256>(sq, buf[1]) / C + kEps);
    if (threadIdx.x == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = s;
    }
    unsigned amax = 0;
    for (int c = threadIdx.x; c < C; c += 256) {
        const T y = from_float<T>((to_float(x[c]) - m) * s * to_float(weight[c]) + to_float(bias[c]));
        out[size_t(row) * out_ld + c] = y;
        if constexpr (AMAX) amax = max(amax, abs_bits(to_float(y)));
    }
    if constexpr (AMAX) block_atomic_max<256>(amax_bits, amax);
}

// ---------------------------------------------------------------------------------------------
// Backward, vector path: persistent grid; each row group takes rows group, group + ROWS * P, ...;
// a thread owns the same 16 columns for every row, so its weights and dweight/dbias sums stay in
// registers. At the end the block's row groups fold their sums in smem in a fixed order and the
// block writes one partial row (dweight sums in [0, C), dbias sums in [C, 2C)) to the scratch.
//
// PREFETCH: while a row is reduced and written, the next row's x, dy, dx, mean and rstd are already
// on their way into shared memory (cp.async, double-buffered, each thread copies and later reads
// only its own slots, so no barrier is needed). bf16 wants it: its 16 columns per thread are half
// the bytes of fp32's, too few in flight to cover memory latency without it, and prefetching into
// registers instead spills (the kernel already uses all 128 of them).

template <typename T, int K> struct BackwardRow {
    Vec128<T> x[K], dy[K], dx[K];
    float mean, rstd;
};

// Dynamic shared memory of the vector kernel: the fold of the row groups' sums (2 C floats, 3 C with
// COLSUM, when a block holds several rows) and, with PREFETCH, two stages of every thread's x/dy/dx
// vectors and its row's mean/rstd; with COLSUM then every thread's column sums.
template <typename T, int WPR, bool PREFETCH> __host__ __device__ constexpr size_t backward_stage_bytes() {
    constexpr int K = kBackwardColsPerThread / Vec128<T>::size;
    return PREFETCH ? size_t(2) * (3 * K * sizeof(int4) + sizeof(float2)) * backward_block_threads<WPR>() : 0;
}
// With COLSUM, after the stages: every thread's running column sums of the dx it wrote, 16 floats
// (4 float4 slots) per thread, slot [q][thread] so that a warp's 128-bit accesses never conflict.
template <int WPR, bool COLSUM> __host__ __device__ constexpr size_t backward_colsum_bytes() {
    return COLSUM ? size_t(kBackwardColsPerThread) * sizeof(float) * backward_block_threads<WPR>() : 0;
}

// COLSUM: also sums the dx it writes over its rows (partial row section [2C, 3C)); see the top comment.
// AMAX: also *amax_bits = max(*amax_bits, the bits of |dx| over every dx written, as stored in T), FP8's
// amax of dinp (fp8.cuh): one running max per thread over its rows (a single register: the kernel is
// register-tight), one atomicMax per block at the end. A template argument: with AMAX = false the
// kernel has no trace of it.
template <typename T, int WPR, bool PREFETCH, bool COLSUM = false, bool AMAX = false>
__global__ void __launch_bounds__(backward_block_threads<WPR>(), 1)
    layernorm_backward_vec_kernel(T* dinp, float* partials, const T* dout, const T* inp, const T* weight,
                                  const float* mean, const float* rstd, int N, int C, unsigned* amax_bits) {
    constexpr int BLOCK = backward_block_threads<WPR>(), TPR = 32 * WPR, ROWS = BLOCK / TPR, VS = Vec128<T>::size;
    constexpr int K = kBackwardColsPerThread / VS, Q = VS / 4;  // Q: float4 column-sum slots per vector
    constexpr int SECTIONS = COLSUM ? 3 : 2;  // floats per column in a partial row: dweight, dbias(, dx sums)
    __shared__ float2 buf[2][BLOCK / 32];
    extern __shared__ float fold[];  // [SECTIONS * C] when ROWS > 1, then the prefetch stages, then the column sums
    const int group = threadIdx.x / TPR, t = threadIdx.x % TPR;
    const int nvec = C / VS;

    float w[K][VS], dw[K][VS], db[K][VS];
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int i = k * TPR + t;
        Vec128<T> wv;
        if (i < nvec) wv = Vec128<T>::load(weight + size_t(i) * VS);
#pragma unroll
        for (int j = 0; j < VS; j++) {
            w[k][j] = i < nvec ? to_float(wv[j]) : 0.0f;
            dw[k][j] = db[k][j] = 0.0f;
        }
    }

    // Rows past N (the last round of row groups) read row N - 1 and write nothing.
    auto load_row = [&](int row, BackwardRow<T, K>& r) {
        const int rowc = min(row, N - 1);
        const size_t offset = size_t(rowc) * C;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int i = k * TPR + t;
            if (i < nvec) {
                r.x[k] = Vec128<T>::load_stream(inp + offset + size_t(i) * VS);
                r.dy[k] = Vec128<T>::load_stream(dout + offset + size_t(i) * VS);
                r.dx[k] = Vec128<T>::load_stream(dinp + offset + size_t(i) * VS);
            }
        }
        r.mean = mean[rowc], r.rstd = rstd[rowc];
    };
    // The prefetch stages: [stage][x, dy, dx][k][thread] vectors, then [stage][thread] (mean, rstd).
    int4* stage = reinterpret_cast<int4*>(fold + (ROWS > 1 ? SECTIONS * C : 0));
    float2* stage_stats = reinterpret_cast<float2*>(stage + 2 * 3 * K * BLOCK);
    // Column sums, slot (k, h) holds columns (k * TPR + t) * VS + 4h .. + 3; each thread touches only its own.
    float4* colsum = reinterpret_cast<float4*>(reinterpret_cast<char*>(stage) + backward_stage_bytes<T, WPR, PREFETCH>());
    auto colsum_slot = [&](int k, int h) -> float4& { return colsum[(k * Q + h) * BLOCK + threadIdx.x]; };
    if constexpr (COLSUM)
#pragma unroll
        for (int q = 0; q < K * Q; q++) colsum_slot(0, q) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    auto slot = [&](int st, int a, int k) { return stage + ((st * 3 + a) * K + k) * BLOCK + threadIdx.x; };
    auto prefetch_row = [&](int row, int st) {
        const int rowc = min(row, N - 1);
        const size_t offset = size_t(rowc) * C;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int i = k * TPR + t;
            if (i < nvec) {
                cp_async16(slot(st, 0, k), inp + offset + size_t(i) * VS);
                cp_async16(slot(st, 1, k), dout + offset + size_t(i) * VS);
                cp_async16(slot(st, 2, k), dinp + offset + size_t(i) * VS);
            }
        }
        cp_async4(&stage_stats[st * BLOCK + threadIdx.x].x, mean + rowc);
        cp_async4(&stage_stats[st * BLOCK + threadIdx.x].y, rstd + rowc);
        cp_async_commit();
    };
    auto read_stage = [&](int st, BackwardRow<T, K>& r) {
#pragma unroll
        for (int k = 0; k < K; k++)
            if (k * TPR + t < nvec) {
                r.x[k] = *reinterpret_cast<const Vec128<T>*>(slot(st, 0, k));
                r.dy[k] = *reinterpret_cast<const Vec128<T>*>(slot(st, 1, k));
                r.dx[k] = *reinterpret_cast<const Vec128<T>*>(slot(st, 2, k));
            }
        const float2 ms = stage_stats[st * BLOCK + threadIdx.x];
        r.mean = ms.x, r.rstd = ms.y;
    };

    const int stride = gridDim.x * ROWS;
    if constexpr (PREFETCH) prefetch_row(blockIdx.x * ROWS + group, 0);
    int parity = 0;  // alternates the reduction buffer and the prefetch stage
    unsigned amax = 0;  // AMAX only: the largest |dx| written by this thread, as bits
    for (int base = blockIdx.x * ROWS; base < N; base += stride, parity ^= 1) {
        const int row = base + group;
        const bool active = row < N;
        BackwardRow<T, K> cur;
        if constexpr (PREFETCH) {
            if (base + stride < N) {  // the same for the whole block
                prefetch_row(row + stride, parity ^ 1);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            read_stage(parity, cur);
        } else {
            load_row(row, cur);
        }
        const float m = cur.mean, s = cur.rstd;
        float2 sums = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int k = 0; k < K; k++) {
            if (k * TPR + t < nvec) {
#pragma unroll
                for (int j = 0; j < VS; j++) {
                    const float n = (to_float(cur.x[k][j]) - m) * s, dy = to_float(cur.dy[k][j]), g = w[k][j] * dy;
                    sums.x += g;
                    sums.y += g * n;
                    if (active) {
                        dw[k][j] += n * dy;
                        db[k][j] += dy;
                    }
                }
            }
        }
        sums = row_group_sum2<WPR, BLOCK>(sums, buf[parity]);
        const float mean_g = sums.x / C, mean_gn = sums.y / C;
        if (active) {
            const size_t offset = size_t(row) * C;
#pragma unroll
            for (int k = 0; k < K; k++) {
                const int i = k * TPR + t;
                if (i < nvec) {
                    Vec128<T> dx;
#pragma unroll
                    for (int j = 0; j < VS; j++) {
                        const float n = (to_float(cur.x[k][j]) - m) * s, g = w[k][j] * to_float(cur.dy[k][j]);
                        dx[j] = from_float<T>(to_float(cur.dx[k][j]) + s * (g - mean_g - n * mean_gn));
                    }
                    dx.store(dinp + offset + size_t(i) * VS);
                    if constexpr (AMAX)  // the values as stored, rounded to T; rows past N never get here
#pragma unroll
                        for (int j = 0; j < VS; j++) amax = max(amax, abs_bits(to_float(dx[j])));
                    if constexpr (COLSUM) {  // the values as stored, rounded to T
#pragma unroll
                        for (int h = 0; h < Q; h++) {
                            float4 a = colsum_slot(k, h);
                            a.x += to_float(dx[4 * h]), a.y += to_float(dx[4 * h + 1]);
                            a.z += to_float(dx[4 * h + 2]), a.w += to_float(dx[4 * h + 3]);
                            colsum_slot(k, h) = a;
                        }
                    }
                }
            }
        }
    }

    // This thread's column sum of column i * VS + j (COLSUM only).
    auto colsum_of = [&](int k, int j) {
        const float4 a = colsum_slot(k, j / 4);
        return j % 4 == 0 ? a.x : j % 4 == 1 ? a.y : j % 4 == 2 ? a.z : a.w;
    };
    float* out = partials + size_t(blockIdx.x) * SECTIONS * C;
    if constexpr (ROWS == 1) {
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int i = k * TPR + t;
            if (i < nvec)
#pragma unroll
                for (int j = 0; j < VS; j++) {
                    out[i * VS + j] = dw[k][j], out[C + i * VS + j] = db[k][j];
                    if constexpr (COLSUM) out[2 * C + i * VS + j] = colsum_of(k, j);
                }
        }
    } else {
        for (int r = 0; r < ROWS; r++) {  // fixed order over row groups: deterministic
            if (group == r) {
#pragma unroll
                for (int k = 0; k < K; k++) {
                    const int i = k * TPR + t;
                    if (i < nvec)
#pragma unroll
                        for (int j = 0; j < VS; j++) {
                            const int c = i * VS + j;
                            fold[c] = r == 0 ? dw[k][j] : fold[c] + dw[k][j];
                            fold[C + c] = r == 0 ? db[k][j] : fold[C + c] + db[k][j];
                            if constexpr (COLSUM)
                                fold[2 * C + c] = r == 0 ? colsum_of(k, j) : fold[2 * C + c] + colsum_of(k, j);
                        }
                }
            }
            __syncthreads();
        }
        for (int c = threadIdx.x; c < SECTIONS * C; c += BLOCK) out[c] = fold[c];
    }
    if constexpr (AMAX) block_atomic_max<BLOCK>(amax_bits, amax);  // every thread gets here
}

// Backward, general path: persistent grid of blocks of 256 threads, one row at a time per block,
// scalar accesses; the block's dweight/dbias sums (and with COLSUM its sums of the dx it wrote) live in
// its own partial row of the scratch (each column owned by one thread, so plain read-modify-write, no
// atomics). AMAX: as the vector kernel's.
template <typename T, bool COLSUM = false, bool AMAX = false>
__global__ void __launch_bounds__(256)
    layernorm_backward_general_kernel(T* dinp, float* partials, const T* dout, const T* inp, const T* weight,
                                      const float* mean, const float* rstd, int N, int C, unsigned* amax_bits) {
    constexpr int SECTIONS = COLSUM ? 3 : 2;
    __shared__ float2 buf[2][8];
    float* pw = partials + size_t(blockIdx.x) * SECTIONS * C;
    float* pb = pw + C;
    float* pc = pb + C;  // COLSUM only
    for (int c = threadIdx.x; c < C; c += 256) {
        pw[c] = pb[c] = 0.0f;
        if constexpr (COLSUM) pc[c] = 0.0f;
    }
    int parity = 0;
    unsigned amax = 0;  // AMAX only
    for (int row = blockIdx.x; row < N; row += gridDim.x, parity ^= 1) {
        const size_t offset = size_t(row) * C;
        const float m = mean[row], s = rstd[row];
        float2 sums = make_float2(0.0f, 0.0f);
        for (int c = threadIdx.x; c < C; c += 256) {
            const float n = (to_float(inp[offset + c]) - m) * s, g = to_float(weight[c]) * to_float(dout[offset + c]);
            sums.x += g;
            sums.y += g * n;
        }
        sums = row_group_sum2<8, 256>(sums, buf[parity]);
        const float mean_g = sums.x / C, mean_gn = sums.y / C;
        for (int c = threadIdx.x; c < C; c += 256) {
            const float n = (to_float(inp[offset + c]) - m) * s, dy = to_float(dout[offset + c]);
            const float g = to_float(weight[c]) * dy;
            const T dx = from_float<T>(to_float(dinp[offset + c]) + s * (g - mean_g - n * mean_gn));
            dinp[offset + c] = dx;
            pw[c] += n * dy;
            pb[c] += dy;
            if constexpr (COLSUM) pc[c] += to_float(dx);
            if constexpr (AMAX) amax = max(amax, abs_bits(to_float(dx)));
        }
    }
    if constexpr (AMAX) block_atomic_max<256>(amax_bits, amax);
}

// Sums the P partial rows in a fixed order and adds them into dweight / dbias (and with COLSUM the dx
// column sums into next_dbias, unused otherwise). Block: 32 columns x 32 slices of the partials; each
// slice sums P / 32 partials, then slice sums are added in slice order.
template <typename T, bool COLSUM = false>
__global__ void __launch_bounds__(1024)
    layernorm_backward_finalize_kernel(T* dweight, T* dbias, T* next_dbias, const float* partials, int P, int C) {
    constexpr int SECTIONS = COLSUM ? 3 : 2;
    __shared__ float sw[32][33], sb[32][33];
    __shared__ float sx[COLSUM ? 32 : 1][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float w = 0.0f, b = 0.0f, x = 0.0f;
    if (c < C) {
#pragma unroll 8
        for (int p = threadIdx.y; p < P; p += 32) {
            w += partials[size_t(p) * SECTIONS * C + c];
            b += partials[size_t(p) * SECTIONS * C + C + c];
            if constexpr (COLSUM) x += partials[size_t(p) * SECTIONS * C + 2 * C + c];
        }
    }
    sw[threadIdx.y][threadIdx.x] = w;
    sb[threadIdx.y][threadIdx.x] = b;
    if constexpr (COLSUM) sx[threadIdx.y][threadIdx.x] = x;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        w = b = x = 0.0f;
        for (int y = 0; y < 32; y++) {
            w += sw[y][threadIdx.x], b += sb[y][threadIdx.x];
            if constexpr (COLSUM) x += sx[y][threadIdx.x];
        }
        dweight[c] = from_float<T>(to_float(dweight[c]) + w);
        dbias[c] = from_float<T>(to_float(dbias[c]) + b);
        if constexpr (COLSUM) next_dbias[c] = from_float<T>(to_float(next_dbias[c]) + x);
    }
}

// ---------------------------------------------------------------------------------------------
// Host side: path and shape choice.

inline int device_sm_count() {
    int device = 0, sms = 0;
    cuda_check(cudaGetDevice(&device));
    cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return sms;
}

template <typename T> inline bool vector_ok(int C, std::initializer_list<const void*> ptrs) {
    if (C % Vec128<T>::size != 0) return false;
    for (const void* p : ptrs)
        if (p && !is_aligned16(p)) return false;
    return true;
}

// The fewest warps per row that hold the row in at most kForwardColsPerThread columns per thread
// (fewer barriers, more rows per block); 0 when the row is too long for the vector path.
inline int forward_min_warps_per_row(int C) {
    for (int wpr = 1; wpr <= kForwardMaxWarpsPerRow; wpr *= 2)
        if (C <= kForwardColsPerThread * 32 * wpr) return wpr;
    return 0;
}

// The forward's choice: that, doubled for fp32 rows longer than 2048 (16 columns per thread, the
// faster of the two in the lab: docs/layernorm.md).
template <typename T> inline int forward_warps_per_row(int C) {
    const int wpr = forward_min_warps_per_row(C);
    return sizeof(T) == 4 && C > 2048 && wpr && wpr < kForwardMaxWarpsPerRow ? 2 * wpr : wpr;
}

template <typename T> inline int backward_warps_per_row(int C) {
    for (int wpr = 1; wpr <= kBackwardMaxWarpsPerRow; wpr *= 2)
        if (C <= kBackwardColsPerThread * 32 * wpr) return wpr;
    return 0;
}

template <typename T, bool AMAX>
void forward_launch(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N, int C,
                    int out_ld, unsigned* amax_bits, cudaStream_t stream) {
    if (N <= 0 || C <= 0) return;
    if (out_ld == 0) out_ld = C;
    if (out_ld < C) fail("layernorm_forward: out_ld %d < C %d", out_ld, C);
    const int wpr = forward_warps_per_row<T>(C);
    if (wpr && out_ld % Vec128<T>::size == 0 && vector_ok<T>(C, {out, inp, weight, bias})) {
#define LN_FWD(W)                                                                                              \
    case W: {                                                                                                  \
        constexpr int block = forward_block_threads<T, W>(), rows = block / (32 * W);                         \
        layernorm_forward_vec_kernel<T, W, AMAX><<<(N + rows - 1) / rows, block, 0, stream>>>(               \
            out, mean, rstd, inp, weight, bias, N, C, out_ld, amax_bits);                                      \
        break;                                                                                                 \
    }
        switch (wpr) {
            LN_FWD(1) LN_FWD(2) LN_FWD(4) LN_FWD(8) LN_FWD(16)
            default: fail("layernorm_forward: bad warps per row %d", wpr);
        }
#undef LN_FWD
    } else {
        layernorm_forward_general_kernel<T, AMAX><<<N, 256, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C, out_ld,
                                                                         amax_bits);
    }
    cuda_check_launch();
}

// The header's choice: prefetch the next row in bf16 only (fp32 has the bytes in flight already, and
// its 16 columns take twice the registers, which a second row would spill).
template <typename T> constexpr bool kBackwardPrefetch = sizeof(T) == 2;

// Launch shape of the backward vector kernel: every block resident at once (persistent grid), so the
// partial count (the grid) is small and the finalize cheap. Shared memory holds the block's partials
// (dweight, dbias, with COLSUM the dx column sums) when it has several rows, plus the staging of the
// rows in flight, plus with COLSUM the threads' column sums; above the default 48 KiB a kernel must
// opt in, which this does. Largest: bf16 with COLSUM at C = 4096, 184 KiB (Hopper allows 227). The
// grid is the one without AMAX's, whatever runs, so that the amax option cannot move the partial sums'
// count and with it dweight's and dbias's bits (AMAX's 64 more bytes of static shared memory and its
// register leave the same one block an SM on Hopper; where they did not, its blocks would queue, as
// the grid-stride loop allows).
struct BackwardShape {
    int grid;
    size_t smem;
};

template <typename T, int WPR, bool PREFETCH, bool COLSUM, bool AMAX = false>
inline BackwardShape backward_vec_shape(int N, int C) {
    constexpr int BLOCK = backward_block_threads<WPR>(), ROWS = BLOCK / (32 * WPR), SECTIONS = COLSUM ? 3 : 2;
    const size_t smem = (ROWS > 1 ? size_t(SECTIONS) * C * sizeof(float) : 0) + backward_stage_bytes<T, WPR, PREFETCH>() +
                        backward_colsum_bytes<WPR, COLSUM>();
    auto kernel = layernorm_backward_vec_kernel<T, WPR, PREFETCH, COLSUM, AMAX>;
    auto sizing = layernorm_backward_vec_kernel<T, WPR, PREFETCH, COLSUM, false>;
    if (smem > 48 * 1024) {
        cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        cuda_check(cudaFuncSetAttribute(sizing, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    }
    int per_sm = 0;
    cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sizing, BLOCK, smem));
    const int groups = (N + ROWS - 1) / ROWS;
    return {std::max(1, std::min(groups, std::max(1, per_sm) * device_sm_count())), smem};
}

template <typename T, bool PREFETCH, bool COLSUM, bool AMAX = false>
inline BackwardShape backward_vec_shape_any(int N, int C, int wpr) {
    switch (wpr) {
        case 1: return backward_vec_shape<T, 1, PREFETCH, COLSUM, AMAX>(N, C);
        case 2: return backward_vec_shape<T, 2, PREFETCH, COLSUM, AMAX>(N, C);
        case 4: return backward_vec_shape<T, 4, PREFETCH, COLSUM, AMAX>(N, C);
        case 8: return backward_vec_shape<T, 8, PREFETCH, COLSUM, AMAX>(N, C);
        case 16: return backward_vec_shape<T, 16, PREFETCH, COLSUM, AMAX>(N, C);
    }
    fail("layernorm_backward: bad warps per row %d", wpr);
}

// General backward grid: two blocks per SM, fewer when rows are so long that the partials (`sections`
// floats per column: 2, or 3 with the dx column sums) would pass 64 MiB.
inline int backward_general_grid(int N, int C, int sections = 2) {
    const size_t cap = (size_t(64) << 20) / (size_t(sections) * C * sizeof(float));
    return (int)std::max<size_t>(1, std::min<size_t>({size_t(N), size_t(2) * device_sm_count(), cap}));
}

// The vector kernel alone, with wpr = backward_warps_per_row<T>(C) warps per row; returns its grid
// (the number of partial rows it wrote). amax_bits: AMAX's slot (unused without it).
template <typename T, bool PREFETCH, bool COLSUM, bool AMAX = false>
int backward_vec_launch(T* dinp, float* partials, const T* dout, const T* inp, const T* weight, const float* mean,
                        const float* rstd, int N, int C, int wpr, unsigned* amax_bits, cudaStream_t stream) {
    const BackwardShape shape = backward_vec_shape_any<T, PREFETCH, COLSUM, AMAX>(N, C, wpr);
#define LN_BWD(W)                                                                                                   \
    case W:                                                                                                         \
        layernorm_backward_vec_kernel<T, W, PREFETCH, COLSUM, AMAX><<<shape.grid, backward_block_threads<W>(),      \
                                                                      shape.smem, stream>>>(                        \
            dinp, partials, dout, inp, weight, mean, rstd, N, C, amax_bits);                                        \
        break;
    switch (wpr) { LN_BWD(1) LN_BWD(2) LN_BWD(4) LN_BWD(8) LN_BWD(16) }  // (backward_vec_shape_any refused any other)
#undef LN_BWD
    return shape.grid;
}

template <typename T, bool PREFETCH, bool COLSUM, bool AMAX = false>
void backward_launch_sections(T* dinp, T* dweight, T* dbias, T* next_dbias, float* partials, const T* dout, const T* inp,
                              const T* weight, const float* mean, const float* rstd, int N, int C, unsigned* amax_bits,
                              cudaStream_t stream) {
    const int wpr = backward_warps_per_row<T>(C);
    int P = 0;
    if (wpr && vector_ok<T>(C, {dinp, dout, inp, weight})) {
        P = backward_vec_launch<T, PREFETCH, COLSUM, AMAX>(dinp, partials, dout, inp, weight, mean, rstd, N, C, wpr, amax_bits,
                                                           stream);
    } else {
        P = backward_general_grid(N, C, COLSUM ? 3 : 2);
        layernorm_backward_general_kernel<T, COLSUM, AMAX>
            <<<P, 256, 0, stream>>>(dinp, partials, dout, inp, weight, mean, rstd, N, C, amax_bits);
    }
    cuda_check_launch();
    layernorm_backward_finalize_kernel<T, COLSUM>
        <<<(C + 31) / 32, dim3(32, 32), 0, stream>>>(dweight, dbias, next_dbias, partials, P, C);
    cuda_check_launch();
}

// With the prefetch where T takes it (kBackwardPrefetch). A null next_dbias runs the kernels without
// the column sums (COLSUM = false), a null amax_bits without the amax (AMAX = false).
template <typename T>
void backward_launch(T* dinp, T* dweight, T* dbias, void* scratch, const T* dout, const T* inp, const T* weight,
                     const float* mean, const float* rstd, int N, int C, cudaStream_t stream, T* next_dbias = nullptr,
                     unsigned* amax_bits = nullptr) {
    if (N <= 0 || C <= 0) return;
    constexpr bool PREFETCH = kBackwardPrefetch<T>;
    float* partials = static_cast<float*>(scratch);
    auto launch = [&](auto colsum, auto amax) {  // std::bool_constant arguments: the kernels' COLSUM and AMAX
        backward_launch_sections<T, PREFETCH, decltype(colsum)::value, decltype(amax)::value>(
            dinp, dweight, dbias, next_dbias, partials, dout, inp, weight, mean, rstd, N, C, amax_bits, stream);
    };
    using yes = std::true_type;
    using no = std::false_type;
    if (next_dbias)
        amax_bits ? launch(yes(), yes()) : launch(yes(), no());
    else
        amax_bits ? launch(no(), yes()) : launch(no(), no());
}

// Floats of partials a vector-path launch writes, with and without the column sums (the larger; the
// amax option does not change the grid).
template <typename T, bool PREFETCH> inline size_t backward_vec_partial_floats(int N, int C, int wpr) {
    return std::max(size_t(backward_vec_shape_any<T, PREFETCH, false>(N, C, wpr).grid) * 2 * C,
                    size_t(backward_vec_shape_any<T, PREFETCH, true>(N, C, wpr).grid) * 3 * C);
}

}  // namespace layernorm_detail

// ---------------------------------------------------------------------------------------------
// Public API. All launches go to the options' stream (default: the default stream); nothing synchronizes.

// The optional parts of a layernorm_forward call, each set by name (the defaults: out_ld = C, the
// default stream):
//   out_ld: the distance between out's rows in elements, >= C (0: C); elements [C, out_ld) of each
//           row are left as they are (train_gpt keeps a column of ones there, matmul_backward_weight_bias).
//   amax_bits: *amax_bits = max(*amax_bits, the bits of |y| over the N C values written, as stored in
//           T): the amax of out that FP8's cast needs (fp8.cuh's fp8_amax_slot, zeroed by the caller),
//           so that it need not read out again. One atomicMax per block. Null: kernels without a trace
//           of it (AMAX is a template argument).
struct LayerNormForwardOptions {
    int out_ld = 0;
    unsigned* amax_bits = nullptr;
    cudaStream_t stream = 0;
    LayerNormForwardOptions& with_out_ld(int ld) { out_ld = ld; return *this; }
    LayerNormForwardOptions& with_amax(unsigned* bits) { amax_bits = bits; return *this; }
    LayerNormForwardOptions& with_stream(cudaStream_t s) { stream = s; return *this; }
};

// out (N, C) = LayerNorm(inp) with weight and bias (C); mean and rstd (N; either may be null) for the
// backward.
template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N, int C,
                       const LayerNormForwardOptions& options = LayerNormForwardOptions()) {
    if (options.amax_bits)
        layernorm_detail::forward_launch<T, true>(out, mean, rstd, inp, weight, bias, N, C, options.out_ld, options.amax_bits,
                                                  options.stream);
    else
        layernorm_detail::forward_launch<T, false>(out, mean, rstd, inp, weight, bias, N, C, options.out_ld, nullptr,
                                                   options.stream);
}

// Bytes of scratch layernorm_backward needs for these shapes on the current device, with or without
// next_dbias (the larger of the paths' needs, since the path also depends on pointer alignment; the
// amax option needs none more).
// Caller allocates; no zeroing.
inline size_t layernorm_backward_scratch_bytes(int N, int C) {
    using namespace layernorm_detail;
    if (N <= 0 || C <= 0) return 0;
    size_t floats = std::max(size_t(backward_general_grid(N, C, 2)) * 2 * C, size_t(backward_general_grid(N, C, 3)) * 3 * C);
    for (int wpr : {backward_warps_per_row<float>(C), backward_warps_per_row<__nv_bfloat16>(C)})
        if (wpr)
            floats = std::max({floats, backward_vec_partial_floats<float, kBackwardPrefetch<float>>(N, C, wpr),
                               backward_vec_partial_floats<__nv_bfloat16, kBackwardPrefetch<__nv_bfloat16>>(N, C, wpr)});
    return floats * sizeof(float);
}

// The optional parts of a layernorm_backward call, each set by name (the defaults: no next_dbias, no
// amax, the default stream):
//   next_dbias (C): += the column sums of dinp as written by this call (sum over the N rows), i.e. the
//           bias gradient of the linear layer whose output gradient dinp also is; null skips it at no cost.
//   amax_bits: *amax_bits = max(*amax_bits, the bits of |dinp| over the N C values this call writes (the
//           updated dinp, as stored in T)): the amax of dinp that FP8's cast needs (fp8.cuh's
//           fp8_amax_slot, zeroed by the caller), so that it need not read dinp again. One atomicMax per
//           block. Null: kernels without a trace of it (AMAX is a template argument), and the same grid
//           either way, so the same bits.
template <typename T> struct LayerNormBackwardOptions {
    T* next_dbias = nullptr;
    unsigned* amax_bits = nullptr;
    cudaStream_t stream = 0;
    LayerNormBackwardOptions& with_next_dbias(T* d) { next_dbias = d; return *this; }
    LayerNormBackwardOptions& with_amax(unsigned* bits) { amax_bits = bits; return *this; }
    LayerNormBackwardOptions& with_stream(cudaStream_t s) { stream = s; return *this; }
};

// dinp += dL/dinp, dweight += ..., dbias += ... (see the top comment), with the options above.
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, void* scratch, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, int N, int C,
                        const LayerNormBackwardOptions<T>& options = LayerNormBackwardOptions<T>()) {
    layernorm_detail::backward_launch<T>(dinp, dweight, dbias, scratch, dout, inp, weight, mean, rstd, N, C, options.stream,
                                         options.next_dbias, options.amax_bits);
}
