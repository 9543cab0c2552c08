// layernorm_backward.cu: the LayerNorm backward laboratory. Numbered versions retrace how the kernel
// got fast; the last one is the header's layernorm_backward (layernorm.cuh), so the lab measures what
// training runs. Every version is validated against the double-precision CPU reference
// (dev/cuda/layernorm_reference.cuh) at many shapes, then benchmarked.
//
//   make dev/cuda/layernorm_backward
//   ./dev/cuda/layernorm_backward           validate, then benchmark every version, fp32 and bf16
//   ./dev/cuda/layernorm_backward 7 8       only versions 7 and 8
//   ./dev/cuda/layernorm_backward --check   validation only (what CI runs; skips without a GPU)
//
// Contract (every version): dx += dL/dx, dweight += sum over rows, dbias += sum over rows, from the
// forward's cached mean and rstd. Versions 1..5 sum dweight/dbias with fp32 atomics into an fp32
// buffer the lab zeroes first, then one small kernel adds it into dweight/dbias (T); both are inside
// the timing. Only versions 6, 7 and 8 are deterministic.
//   1  one thread per row: two passes over its row (the two row sums, then dx), one atomicAdd per
//      element for dweight and dbias. Uncoalesced (a warp touches 32 rows) and 2 N C atomics
//      contending on C addresses.
//   2  one warp per row: coalesced loads, cooperative-groups warp reductions. Same atomics.
//   3  version 2 with the row's dout staged in shared memory on the first pass, so the second pass
//      reads dout from shared memory, not global memory. Needs C * sizeof(T) <= 96 KiB (one warp's
//      row per block slot); longer rows run version 2 (the lab says so).
//   4  one 1024-thread block per row: 32x the threads of a warp per row, for long rows; block
//      reductions through shared memory. Same atomics.
//   5  several rows per block (8 warps, a warp per row, a grid of 2 blocks per SM striding over the
//      rows): dweight/dbias partials accumulate in shared memory (shared-memory atomics, cheap and
//      spread over 32 banks), and each block adds its partial row with ONE global atomic per column.
//      Needs 2 C floats of shared memory (C <= 16384); longer rows run version 4 (the lab says so).
//   6  deterministic two-stage reduction: a persistent grid of 256-thread blocks, one row at a time
//      per block; each thread owns the same columns for every row, so its dweight/dbias sums go to
//      the block's own partial row in a scratch buffer with plain read-modify-writes (no atomics);
//      a finalize kernel sums the partial rows in a fixed order. Same bits every run.
//   7  fused and vectorized (the header's kernel without its prefetch). Row groups of 32 * WPR
//      threads sized by C, x / dy / dx each read once with 128-bit streaming loads into registers
//      (16 columns per thread, all loads issued before the first use), dweight/dbias sums in
//      registers across all the block's rows, one partial row per block, fixed-order finalize.
//      Deterministic. A scalar general path for any C and alignment. 91-95% of copy in fp32, but
//      74-85% in bf16: 16 bf16 columns are half the bytes per thread, too few in flight.
//   8  the header's layernorm_backward: version 7 with, in bf16, the next row's x / dy / dx (and
//      mean / rstd) copied into shared memory by cp.async while the current row is reduced and
//      written, double-buffered; so a row's loads are in flight through the previous row's barrier
//      and arithmetic. No extra registers (a register prefetch spills: 7 uses all 128). fp32 runs
//      version 7's kernel (its bytes in flight already suffice, and its stages would not fit).
//
// Fused column sum (versions 7 and 8, shown as "7+colsum", "8+colsum"): the header's optional
// next_dbias += column sums of the dx it wrote, i.e. the bias gradient of the linear layer whose output
// gradient is the residual stream, which training otherwise computes in a separate pass (cuBLAS
// matrix-vector product with ones, matmul.cuh) that reads all N x C of dx again. Validated at every
// shape and alignment like the rest, plus: dx bit for bit as without next_dbias, and nothing written
// past next_dbias's C values. The benchmark times 7/8 without it, with it, and without it followed by
// the separate pass ("+gemv"), so the fused cost and the saved pass are side by side.
//
// The header's version is also run with its FP8 amax option (with_amax) at every shape, without and
// with next_dbias: the same bits out (dx, dweight, dbias, next_dbias), and the amax exactly the
// largest |dx| as stored.
//
// Bandwidth: backward bytes = 4*N*C*sizeof(T) (read x, dy, dx; write dx) + 8*N (mean, rstd); weight,
// dweight, dbias (and next_dbias) and the partials (P x 2C floats, 3C with next_dbias) are small next
// to it and left out. Reported as a fraction of a device-to-device copy measured in the same run.

#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>

#include <string>

#include "common.cuh"
#include "dev/lab.cuh"
#include "dev/cuda/layernorm_reference.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"

namespace cg = cooperative_groups;

constexpr int kNumVersions = 8;

// ---------------------------------------------------------------------------------------------
// Version 1: one thread per row, atomics.

template <typename T>
__global__ void layernorm_backward_kernel1(T* dinp, float* dweight_f, float* dbias_f, const T* dout, const T* inp,
                                           const T* weight, const float* mean, const float* rstd, int N, int C) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    const size_t off = size_t(row) * C;
    const float m = mean[row], s = rstd[row];
    float sum_g = 0.0f, sum_gn = 0.0f;
    for (int c = 0; c < C; c++) {
        const float n = (to_float(inp[off + c]) - m) * s, g = to_float(weight[c]) * to_float(dout[off + c]);
        sum_g += g;
        sum_gn += g * n;
    }
    const float mean_g = sum_g / C, mean_gn = sum_gn / C;
    for (int c = 0; c < C; c++) {
        const float n = (to_float(inp[off + c]) - m) * s, dy = to_float(dout[off + c]), g = to_float(weight[c]) * dy;
        dinp[off + c] = from_float<T>(to_float(dinp[off + c]) + s * (g - mean_g - n * mean_gn));
        atomicAdd(&dweight_f[c], n * dy);
        atomicAdd(&dbias_f[c], dy);
    }
}

// ---------------------------------------------------------------------------------------------
// Version 2: one warp per row. Version 3: the same with dout staged in shared memory.

template <typename T, bool STAGE>
__global__ void layernorm_backward_kernel2(T* dinp, float* dweight_f, float* dbias_f, const T* dout, const T* inp,
                                           const T* weight, const float* mean, const float* rstd, int N, int C) {
    extern __shared__ unsigned char smem_raw[];
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    const int row = blockIdx.x * (blockDim.x / 32) + warp.meta_group_rank();
    if (row >= N) return;
    T* dy_row = reinterpret_cast<T*>(smem_raw) + size_t(warp.meta_group_rank()) * C;  // STAGE only
    const size_t off = size_t(row) * C;
    const float m = mean[row], s = rstd[row];
    float sum_g = 0.0f, sum_gn = 0.0f;
    for (int c = warp.thread_rank(); c < C; c += 32) {
        const T dyt = dout[off + c];
        if constexpr (STAGE) dy_row[c] = dyt;
        const float n = (to_float(inp[off + c]) - m) * s, g = to_float(weight[c]) * to_float(dyt);
        sum_g += g;
        sum_gn += g * n;
    }
    const float mean_g = cg::reduce(warp, sum_g, cg::plus<float>()) / C;
    const float mean_gn = cg::reduce(warp, sum_gn, cg::plus<float>()) / C;
    // Each lane reads back only what it staged itself: no barrier needed.
    for (int c = warp.thread_rank(); c < C; c += 32) {
        const float dy = to_float(STAGE ? dy_row[c] : dout[off + c]);
        const float n = (to_float(inp[off + c]) - m) * s, g = to_float(weight[c]) * dy;
        dinp[off + c] = from_float<T>(to_float(dinp[off + c]) + s * (g - mean_g - n * mean_gn));
        atomicAdd(&dweight_f[c], n * dy);
        atomicAdd(&dbias_f[c], dy);
    }
}

constexpr size_t kV3MaxSmem = 96 * 1024;
template <typename T> int version3_warps(int C) {
    const size_t row_bytes = size_t(C) * sizeof(T);
    if (row_bytes > kV3MaxSmem) return 0;
    return (int)std::min<size_t>(8, kV3MaxSmem / row_bytes);
}

// ---------------------------------------------------------------------------------------------
// Version 4: one 1024-thread block per row.

__device__ float2 block_sum2(float2 v, float2* shared) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int o = 16; o > 0; o >>= 1) v.x += __shfl_xor_sync(0xffffffffu, v.x, o), v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float2 total = make_float2(0.0f, 0.0f);
    for (int w = 0; w < warps; w++) total.x += shared[w].x, total.y += shared[w].y;
    __syncthreads();
    return total;
}

template <typename T>
__global__ void __launch_bounds__(1024)
    layernorm_backward_kernel4(T* dinp, float* dweight_f, float* dbias_f, const T* dout, const T* inp, const T* weight,
                               const float* mean, const float* rstd, int N, int C) {
    __shared__ float2 shared[32];
    const int row = blockIdx.x;
    const size_t off = size_t(row) * C;
    const float m = mean[row], s = rstd[row];
    float2 sums = make_float2(0.0f, 0.0f);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float n = (to_float(inp[off + c]) - m) * s, g = to_float(weight[c]) * to_float(dout[off + c]);
        sums.x += g;
        sums.y += g * n;
    }
    sums = block_sum2(sums, shared);
    const float mean_g = sums.x / C, mean_gn = sums.y / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float n = (to_float(inp[off + c]) - m) * s, dy = to_float(dout[off + c]), g = to_float(weight[c]) * dy;
        dinp[off + c] = from_float<T>(to_float(dinp[off + c]) + s * (g - mean_g - n * mean_gn));
        atomicAdd(&dweight_f[c], n * dy);
        atomicAdd(&dbias_f[c], dy);
    }
}

// ---------------------------------------------------------------------------------------------
// Version 5: several rows per block, shared-memory partials, one global atomic per column per block.

template <typename T>
__global__ void __launch_bounds__(256)
    layernorm_backward_kernel5(T* dinp, float* dweight_f, float* dbias_f, const T* dout, const T* inp, const T* weight,
                               const float* mean, const float* rstd, int N, int C) {
    extern __shared__ float partial[];  // [2 * C]: dweight sums, then dbias sums
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) partial[c] = 0.0f;
    __syncthreads();
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    const int warps = blockDim.x / 32;
    for (int row = blockIdx.x * warps + warp.meta_group_rank(); row < N; row += gridDim.x * warps) {
        const size_t off = size_t(row) * C;
        const float m = mean[row], s = rstd[row];
        float sum_g = 0.0f, sum_gn = 0.0f;
        for (int c = warp.thread_rank(); c < C; c += 32) {
            const float n = (to_float(inp[off + c]) - m) * s, g = to_float(weight[c]) * to_float(dout[off + c]);
            sum_g += g;
            sum_gn += g * n;
        }
        const float mean_g = cg::reduce(warp, sum_g, cg::plus<float>()) / C;
        const float mean_gn = cg::reduce(warp, sum_gn, cg::plus<float>()) / C;
        for (int c = warp.thread_rank(); c < C; c += 32) {
            const float n = (to_float(inp[off + c]) - m) * s, dy = to_float(dout[off + c]), g = to_float(weight[c]) * dy;
            dinp[off + c] = from_float<T>(to_float(dinp[off + c]) + s * (g - mean_g - n * mean_gn));
            atomicAdd(&partial[c], n * dy);
            atomicAdd(&partial[C + c], dy);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        atomicAdd(&dweight_f[c], partial[c]);
        atomicAdd(&dbias_f[c], partial[C + c]);
    }
}

constexpr int kV5MaxC = 16384;  // 2 C floats = 128 KiB of shared memory

// ---------------------------------------------------------------------------------------------
// Version 6: deterministic two-stage reduction through a scratch buffer.

template <typename T>
__global__ void __launch_bounds__(256)
    layernorm_backward_kernel6(T* dinp, float* partials, const T* dout, const T* inp, const T* weight, const float* mean,
                               const float* rstd, int N, int C) {
    __shared__ float2 shared[32];
    float* pw = partials + size_t(blockIdx.x) * 2 * C;  // this block's partial row: [dweight sums | dbias sums]
    float* pb = pw + C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) pw[c] = pb[c] = 0.0f;
    for (int row = blockIdx.x; row < N; row += gridDim.x) {
        const size_t off = size_t(row) * C;
        const float m = mean[row], s = rstd[row];
        float2 sums = make_float2(0.0f, 0.0f);
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            const float n = (to_float(inp[off + c]) - m) * s, g = to_float(weight[c]) * to_float(dout[off + c]);
            sums.x += g;
            sums.y += g * n;
        }
        sums = block_sum2(sums, shared);
        const float mean_g = sums.x / C, mean_gn = sums.y / C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            const float n = (to_float(inp[off + c]) - m) * s, dy = to_float(dout[off + c]), g = to_float(weight[c]) * dy;
            dinp[off + c] = from_float<T>(to_float(dinp[off + c]) + s * (g - mean_g - n * mean_gn));
            pw[c] += n * dy;  // column c belongs to this thread in every row: no race
            pb[c] += dy;
        }
    }
}

// Sums P partial rows per column in a fixed order and adds them into dweight/dbias.
template <typename T>
__global__ void layernorm_backward_finalize6(T* dweight, T* dbias, const float* partials, int P, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float w = 0.0f, b = 0.0f;
    for (int p = 0; p < P; p++) w += partials[size_t(p) * 2 * C + c], b += partials[size_t(p) * 2 * C + C + c];
    dweight[c] = from_float<T>(to_float(dweight[c]) + w);
    dbias[c] = from_float<T>(to_float(dbias[c]) + b);
}

// Versions 1..5: adds the fp32 atomic sums into dweight/dbias (T).
template <typename T> __global__ void add_sums_kernel(T* dweight, T* dbias, const float* dweight_f, const float* dbias_f, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < C) {
        dweight[c] = from_float<T>(to_float(dweight[c]) + dweight_f[c]);
        dbias[c] = from_float<T>(to_float(dbias[c]) + dbias_f[c]);
    }
}

// ---------------------------------------------------------------------------------------------
// Dispatch. `scratch` holds max(2 C floats, version 6's and 7's partials, the header's scratch). Returns a
// note when a version ran another version's kernel on a shape it cannot hold.

inline int sm_count() { return layernorm_detail::device_sm_count(); }
inline int version6_partials(int N) { return std::max(1, std::min(N, 2 * sm_count())); }

// Version 7's partials in bf16: the header's vector kernel without its prefetch, whose grid (more
// resident blocks) the header's scratch need not hold; in fp32 version 7 is the header's own launch.
inline size_t version7_scratch_bytes(int N, int C) {
    using namespace layernorm_detail;
    const int wpr = backward_warps_per_row<__nv_bfloat16>(C);
    if (!wpr) return 0;
    return backward_vec_partial_floats<__nv_bfloat16, false>(N, C, wpr) * sizeof(float);
}

inline size_t lab_scratch_bytes(int N, int C) {
    return std::max({size_t(2) * C * sizeof(float), size_t(version6_partials(N)) * 2 * C * sizeof(float),
                     layernorm_backward_scratch_bytes(N, C), version7_scratch_bytes(N, C)});
}

// Version 7: the header's launch with its prefetch off (the header prefetches in bf16).
template <typename T>
void backward_without_prefetch(T* dinp, T* dweight, T* dbias, void* scratch, const T* dout, const T* inp, const T* weight,
                               const float* mean, const float* rstd, int N, int C, T* next_dbias) {
    using namespace layernorm_detail;
    if (N <= 0 || C <= 0) return;
    float* partials = static_cast<float*>(scratch);
    if (next_dbias)
        backward_launch_sections<T, false, true>(dinp, dweight, dbias, next_dbias, partials, dout, inp, weight, mean, rstd, N, C,
                                                 nullptr, 0);
    else
        backward_launch_sections<T, false, false>(dinp, dweight, dbias, nullptr, partials, dout, inp, weight, mean, rstd, N, C,
                                                  nullptr, 0);
}

// Versions whose kernels take next_dbias (the header's).
inline bool has_colsum(int version) { return version == 7 || version == 8; }

// next_dbias: versions 7 and 8 only (null elsewhere).
template <typename T>
const char* run_version(int version, T* dinp, T* dweight, T* dbias, void* scratch, const T* dout, const T* inp,
                        const T* weight, const float* mean, const float* rstd, int N, int C, T* next_dbias = nullptr) {
    float* dw_f = static_cast<float*>(scratch);
    float* db_f = dw_f + C;
    const char* note = nullptr;
    if (next_dbias && !has_colsum(version)) fail("next_dbias: versions 7 and 8 only, not %d", version);
    if (version >= 1 && version <= 5) cuda_check(cudaMemsetAsync(scratch, 0, size_t(2) * C * sizeof(float)));
    if (version == 3 && !version3_warps<T>(C)) version = 2, note = "v3 n/a here (row too long for shared memory), ran v2";
    if (version == 5 && C > kV5MaxC) version = 4, note = "v5 n/a here (partials too long for shared memory), ran v4";
    switch (version) {
        case 1:
            layernorm_backward_kernel1<T><<<(N + 127) / 128, 128>>>(dinp, dw_f, db_f, dout, inp, weight, mean, rstd, N, C);
            break;
        case 2:
            layernorm_backward_kernel2<T, false><<<(N + 7) / 8, 256>>>(dinp, dw_f, db_f, dout, inp, weight, mean, rstd, N, C);
            break;
        case 3: {
            const int warps = version3_warps<T>(C);
            const size_t smem = size_t(warps) * C * sizeof(T);
            cuda_check(cudaFuncSetAttribute(layernorm_backward_kernel2<T, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            layernorm_backward_kernel2<T, true><<<(N + warps - 1) / warps, 32 * warps, smem>>>(dinp, dw_f, db_f, dout, inp, weight,
                                                                                              mean, rstd, N, C);
            break;
        }
        case 4:
            layernorm_backward_kernel4<T><<<N, 1024>>>(dinp, dw_f, db_f, dout, inp, weight, mean, rstd, N, C);
            break;
        case 5: {
            const size_t smem = size_t(2) * C * sizeof(float);
            cuda_check(cudaFuncSetAttribute(layernorm_backward_kernel5<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            const int grid = std::max(1, std::min((N + 7) / 8, 2 * sm_count()));
            layernorm_backward_kernel5<T><<<grid, 256, smem>>>(dinp, dw_f, db_f, dout, inp, weight, mean, rstd, N, C);
            break;
        }
        case 6: {
            const int P = version6_partials(N);
            layernorm_backward_kernel6<T><<<P, 256>>>(dinp, dw_f, dout, inp, weight, mean, rstd, N, C);
            cuda_check_launch();
            layernorm_backward_finalize6<T><<<(C + 255) / 256, 256>>>(dweight, dbias, dw_f, P, C);
            break;
        }
        case 7:
            backward_without_prefetch(dinp, dweight, dbias, scratch, dout, inp, weight, mean, rstd, N, C, next_dbias);
            break;
        case 8:
            layernorm_backward(dinp, dweight, dbias, scratch, dout, inp, weight, mean, rstd, N, C,
                               LayerNormBackwardOptions<T>().with_next_dbias(next_dbias));
            break;
        default:
            fail("backward version %d does not exist (1..%d)", version, kNumVersions);
    }
    cuda_check_launch();
    if (version <= 5) {
        add_sums_kernel<T><<<(C + 255) / 256, 256>>>(dweight, dbias, dw_f, db_f, C);
        cuda_check_launch();
    }
    return note;
}

// ---------------------------------------------------------------------------------------------
// Tolerances.
//
// dx (fp32): dx = dx0 + s * (g - mean(g) - n * mean(g n)); the two row sums are fp32 reductions over
// C values: each thread sequentially over L = C / (threads per row) values (error ~ sqrt(L) ulps for
// random rounding), then a tree (log2 C levels at most); |n| <= 4 for our inputs amplifies them a
// few times, and every term of dx is scaled by s = rstd, which is 1/sqrt(1e-5) = 316 for a row of
// zero variance (C = 1): there g - mean(g) cancels to a product's rounding error (FMA contraction may
// round g differently in the two passes) times 316. Bound: 32 * (sqrt(L) + log2(C) + 1) fp32 ulps,
// relative, and that times max(1, max rstd) absolute.
// dx (bf16): stored rounded to bf16: 1 bf16 ulp (2^-8) relative, plus the fp32 bound.
// dweight / dbias: sums over N rows of n * dy and dy (plus the initial value), so the bound grows
// with N. An fp32 sum of N terms, in any order (fixed chains, trees, or atomics), is off by at most a
// chain length of ulps of sum |terms|; for random rounding the chains grow like sqrt(N) (a sequential
// chain, e.g. one block's rows or an atomic order) plus log2(N) (tree levels). Bound, absolute:
// 4 * (sqrt(N) + log2(N) + 1) fp32 ulps of the largest column's sum over rows of |term| (+1 for the
// initial value). bf16 adds 1 bf16 ulp (2^-8) relative for the final rounding of dweight/dbias.
// next_dbias (fused column sum), against the CPU's: initial value + sum over the N rows of the CPU's
// updated dx. Each stored dx is off from the CPU's by at most e = (dx's absolute bound) + (dx's
// relative bound) |dx| (in bf16 mostly its rounding to T, up to 2^-8 relative). A worst-case sum,
// N e, grows like N, the column sums only like sqrt(N): at N = 5000 in bf16 it is ~20 against column
// sums of ~85, wide enough to pass a dozen lost rows. But the rows' errors are independent with zero
// mean (round to nearest; each row's own fp32 reductions), so by Hoeffding their sum exceeds 6 sqrt(sum_n e_n^2)
// with probability below 2 exp(-18) = 3e-8 per column, even were every error at its bound. Bound,
// absolute: that (largest column) plus the dbias bound above for the fp32 sum of N terms
// (sum |dx| + |initial value|); bf16 adds 2^-8 relative for the final rounding.
// next_dbias against the column sums (double) of the dx the kernel stored: only the fp32 sum and the
// final rounding: the dbias bound with sum |stored dx| + |initial value|, + 2^-8 relative in bf16.
// This one catches a lost or doubled row where the first bound is too wide to.

inline double fp32_tol(int C, int threads_per_row) {
    const double L = std::ceil(double(C) / threads_per_row);
    return 32.0 * (std::sqrt(L) + std::log2(double(C)) + 1.0) * std::ldexp(1.0, -23);
}

inline int threads_per_row(int version, int C) {
    switch (version) {
        case 1: return 1;
        case 2: case 3: case 5: return 32;
        case 4: return 1024;
        case 6: return 256;
        default: return std::max(32, std::min(256, C / 64));  // header: 32..512 threads (vector), 256 (general)
    }
}

struct Shape {
    int N, C;
};
const Shape kCheckShapes[] = {{1, 768},  {7, 1},     {5, 33},    {64, 768},  {33, 1000}, {16, 1600}, {300, 1024},
                              {9, 4100}, {4, 16384}, {2, 65536}, {1, 65536}, {2048, 64}, {37, 3072}, {5000, 768}};

constexpr int kColsumGuard = 8;  // elements past next_dbias's C, poisoned: must stay untouched

// The header's amax option (LayerNormBackwardOptions::with_amax, FP8's amax of dinp, fp8.cuh): the same
// call with it, from the same inputs (dx, dweight, dbias, next_dbias copied from the initial values,
// the scratch poisoned), must write the same bits (dx, dweight, dbias, and next_dbias with the guard
// past its C when `colsum`), and the amax written must be the largest |dx| over the N C values as
// stored, exactly (its float's bits). got_*: the same call's outputs without the option.
template <typename T>
bool check_amax_option(const std::vector<T>& dx0, const std::vector<T>& dw0, const std::vector<T>& db0,
                       const std::vector<T>& ndb0, const std::vector<T>& got_dx, const std::vector<T>& got_dw,
                       const std::vector<T>& got_db, const std::vector<T>& got_ndb, const DeviceBuffer<T>& d_dy,
                       const DeviceBuffer<T>& d_x, const DeviceBuffer<T>& d_w, const DeviceBuffer<float>& d_mean,
                       const DeviceBuffer<float>& d_rstd, int N, int C, int shift, bool colsum) {
    const size_t NC = size_t(N) * C;
    DeviceBuffer<T> dx(NC, "dx, amax option", shift), dw(C, "dweight, amax option", shift), db(C, "dbias, amax option", shift);
    DeviceBuffer<T> ndb(C + kColsumGuard, "next_dbias, amax option", shift);
    DeviceBuffer<unsigned char> scratch(lab_scratch_bytes(N, C), "scratch, amax option");
    DeviceBuffer<unsigned> amax_bits(1, "amax");
    dx.upload(dx0), dw.upload(dw0), db.upload(db0), ndb.upload(ndb0);
    scratch.poison();
    cuda_check(cudaMemset(amax_bits.ptr, 0, sizeof(unsigned)));
    layernorm_backward(dx.ptr, dw.ptr, db.ptr, scratch.ptr, d_dy.ptr, d_x.ptr, d_w.ptr, d_mean.ptr, d_rstd.ptr, N, C,
                       LayerNormBackwardOptions<T>().with_next_dbias(colsum ? ndb.ptr : nullptr).with_amax(amax_bits.ptr));
    cuda_check(cudaDeviceSynchronize());
    const auto x = dx.download(), w = dw.download(), b = db.download(), nb = ndb.download();
    const bool same = std::memcmp(x.data(), got_dx.data(), NC * sizeof(T)) == 0 &&
                      std::memcmp(w.data(), got_dw.data(), C * sizeof(T)) == 0 &&
                      std::memcmp(b.data(), got_db.data(), C * sizeof(T)) == 0 &&
                      std::memcmp(nb.data(), got_ndb.data(), (C + kColsumGuard) * sizeof(T)) == 0;
    float host = 0.0f;
    for (size_t i = 0; i < NC; i++) host = std::max(host, std::fabs(to_float(got_dx[i])));
    unsigned host_bits, got_bits = amax_bits.download()[0];
    memcpy(&host_bits, &host, sizeof(host));
    float got;
    memcpy(&got, &got_bits, sizeof(got));
    const bool exact = got_bits == host_bits;
    const char* outputs = colsum ? "dx, dweight, dbias, next_dbias the same bits" : "dx, dweight, dbias the same bits";
    printf("  amax option: %s; amax %.9g (host, max |dx| as stored: %.9g) %s\n", same ? outputs : "FAIL: OUTPUTS CHANGED", got,
           host, exact ? "exact" : "FAIL");
    return same && exact;
}

// One (version, dtype, shape, alignment). With `determinism`, also runs the version twice more from
// the same inputs and compares every output bit for bit. With `colsum` (versions 7, 8), passes
// next_dbias and checks it too.
// 1: passed, 0: failed, -1: another version ran in this one's place (skipped).
template <typename T> int check_one(int version, int N, int C, int shift, uint64_t seed, bool determinism, bool colsum) {
    const size_t NC = size_t(N) * C;
    Rng rng(seed);
    std::vector<T> x(NC), dy(NC), dx0(NC), w(C), b(C), dw0(C), db0(C), ndb0(C + kColsumGuard);
    fill_rows(x, N, C, rng);
    fill_uniform(dy, -1.0f, 1.0f, rng);
    fill_uniform(dx0, -1.0f, 1.0f, rng);  // accumulate contract: start from non-zero gradients
    fill_uniform(w, 0.5f, 1.5f, rng);
    fill_uniform(b, -0.5f, 0.5f, rng);
    fill_uniform(dw0, -1.0f, 1.0f, rng);
    fill_uniform(db0, -1.0f, 1.0f, rng);
    if (colsum) {
        fill_uniform(ndb0, -1.0f, 1.0f, rng);
        std::fill(ndb0.begin() + C, ndb0.end(), from_float<T>(NAN));
    }

    // Statistics from the reference forward, rounded to fp32 as the forward stores them; the
    // reference backward uses those same fp32 values.
    std::vector<double> y(NC), mean_d(N), rstd_d(N);
    layernorm_forward_reference(y.data(), mean_d.data(), rstd_d.data(), x.data(), w.data(), b.data(), N, C);
    std::vector<float> mean(N), rstd(N);
    for (int n = 0; n < N; n++) mean[n] = (float)mean_d[n], rstd[n] = (float)rstd_d[n];
    std::vector<double> ref_dx(NC), ref_dw(C), ref_db(C), abs_dw(C, 0.0), abs_db(C, 0.0);
    for (size_t i = 0; i < NC; i++) ref_dx[i] = to_double(dx0[i]);
    for (int c = 0; c < C; c++) ref_dw[c] = to_double(dw0[c]), ref_db[c] = to_double(db0[c]);
    layernorm_backward_reference(ref_dx.data(), ref_dw.data(), ref_db.data(), dy.data(), x.data(), w.data(), mean.data(),
                                 rstd.data(), N, C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            const double d = to_double(dy[size_t(n) * C + c]);
            abs_dw[c] += std::fabs((to_double(x[size_t(n) * C + c]) - mean[n]) * rstd[n] * d);
            abs_db[c] += std::fabs(d);
        }

    DeviceBuffer<T> d_x(NC, "x", shift), d_dy(NC, "dy", shift), d_dx(NC, "dx", shift), d_w(C, "weight", shift);
    DeviceBuffer<T> d_dw(C, "dweight", shift), d_db(C, "dbias", shift), d_ndb(C + kColsumGuard, "next_dbias", shift);
    DeviceBuffer<float> d_mean(N, "mean"), d_rstd(N, "rstd");
    DeviceBuffer<unsigned char> d_scratch(lab_scratch_bytes(N, C), "scratch");
    d_x.upload(x), d_dy.upload(dy), d_w.upload(w);
    cuda_check(cudaMemcpy(d_mean.ptr, mean.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    cuda_check(cudaMemcpy(d_rstd.ptr, rstd.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    d_scratch.poison();  // the header's contract: scratch needs no zeroing

    std::vector<T> got_dx[3], got_dw[3], got_db[3], got_ndb[3];
    const int runs = determinism ? 3 : 1;
    const char* note = nullptr;
    for (int r = 0; r < runs; r++) {
        d_dx.upload(dx0), d_dw.upload(dw0), d_db.upload(db0), d_ndb.upload(ndb0);
        note = run_version<T>(version, d_dx.ptr, d_dw.ptr, d_db.ptr, d_scratch.ptr, d_dy.ptr, d_x.ptr, d_w.ptr, d_mean.ptr,
                              d_rstd.ptr, N, C, colsum ? d_ndb.ptr : nullptr);
        cuda_check(cudaDeviceSynchronize());
        got_dx[r] = d_dx.download(), got_dw[r] = d_dw.download(), got_db[r] = d_db.download(), got_ndb[r] = d_ndb.download();
    }
    if (note) printf("  (%s)\n", note);
    if (fell_back(note)) return -1;
    std::vector<T> plain_dx;  // with colsum: dx from the same call without next_dbias
    if (colsum) {
        d_dx.upload(dx0), d_dw.upload(dw0), d_db.upload(db0);
        run_version<T>(version, d_dx.ptr, d_dw.ptr, d_db.ptr, d_scratch.ptr, d_dy.ptr, d_x.ptr, d_w.ptr, d_mean.ptr, d_rstd.ptr,
                       N, C);
        cuda_check(cudaDeviceSynchronize());
        plain_dx = d_dx.download();
    }

    const bool bf16 = sizeof(T) == 2;
    const double ulp_bf16 = std::ldexp(1.0, -8), eps32 = std::ldexp(1.0, -23);
    const double tol = fp32_tol(C, threads_per_row(version, C));
    const double sum_tol = 4.0 * (std::sqrt(double(N)) + std::log2(double(N)) + 1.0) * eps32;
    const double max_abs_dw = *std::max_element(abs_dw.begin(), abs_dw.end()) + 1.0;  // + |initial value|
    const double max_abs_db = *std::max_element(abs_db.begin(), abs_db.end()) + 1.0;
    bool ok = true;
    const double max_rstd = std::max(1.0f, *std::max_element(rstd.begin(), rstd.end()));
    ok &= check_close("dx", got_dx[0].data(), ref_dx.data(), NC, tol * max_rstd, bf16 ? ulp_bf16 + tol : tol);
    ok &= check_close("dweight", got_dw[0].data(), ref_dw.data(), C, sum_tol * max_abs_dw, bf16 ? ulp_bf16 : 0.0);
    ok &= check_close("dbias", got_db[0].data(), ref_db.data(), C, sum_tol * max_abs_db, bf16 ? ulp_bf16 : 0.0);
    if (colsum) {
        // Reference: initial value + the CPU's updated dx summed over rows; and the same over the dx the
        // kernel stored. Per column: e_n's root sum of squares, sum |dx| (CPU's and stored).
        std::vector<double> ref_ndb(C), stored_ndb(C), rss_e(C, 0.0), abs_ref(C, 0.0), abs_stored(C, 0.0);
        for (int c = 0; c < C; c++) ref_ndb[c] = stored_ndb[c] = to_double(ndb0[c]);
        const double dx_atol = tol * max_rstd, dx_rtol = bf16 ? ulp_bf16 + tol : tol;
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++) {
                const size_t i = size_t(n) * C + c;
                const double e = dx_atol + dx_rtol * std::fabs(ref_dx[i]), stored = to_double(got_dx[0][i]);
                ref_ndb[c] += ref_dx[i], stored_ndb[c] += stored;
                rss_e[c] += e * e, abs_ref[c] += std::fabs(ref_dx[i]), abs_stored[c] += std::fabs(stored);
            }
        double max_rss = 0.0, max_abs_ref = 0.0, max_abs_stored = 0.0;
        for (int c = 0; c < C; c++) {
            max_rss = std::max(max_rss, std::sqrt(rss_e[c]));
            max_abs_ref = std::max(max_abs_ref, abs_ref[c] + 1.0);  // + |initial value|
            max_abs_stored = std::max(max_abs_stored, abs_stored[c] + 1.0);
        }
        ok &= check_close("next_dbias (vs CPU dx column sums)", got_ndb[0].data(), ref_ndb.data(), C,
                          6.0 * max_rss + sum_tol * max_abs_ref, bf16 ? ulp_bf16 : 0.0);
        ok &= check_close("next_dbias (vs stored dx column sums)", got_ndb[0].data(), stored_ndb.data(), C,
                          sum_tol * max_abs_stored, bf16 ? ulp_bf16 : 0.0);
        const bool untouched = memcmp(got_ndb[0].data() + C, ndb0.data() + C, kColsumGuard * sizeof(T)) == 0;
        printf("  %-40s %s  (%d poisoned elements past C)\n", "next_dbias: nothing written past C", untouched ? "ok  " : "FAIL",
               kColsumGuard);
        const bool same_dx = memcmp(plain_dx.data(), got_dx[0].data(), NC * sizeof(T)) == 0;
        printf("  %-40s %s  (bit for bit)\n", "dx as without next_dbias", same_dx ? "ok  " : "FAIL");
        ok &= untouched && same_dx;
    }
    if (determinism) {
        bool same = true;
        for (int r = 1; r < runs; r++)
            same &= memcmp(got_dx[r].data(), got_dx[0].data(), NC * sizeof(T)) == 0 &&
                    memcmp(got_dw[r].data(), got_dw[0].data(), C * sizeof(T)) == 0 &&
                    memcmp(got_db[r].data(), got_db[0].data(), C * sizeof(T)) == 0 &&
                    (!colsum || memcmp(got_ndb[r].data(), got_ndb[0].data(), C * sizeof(T)) == 0);
        printf("  %-40s %s  (3 runs from the same inputs, dx/dweight/dbias%s compared bit for bit)\n", "deterministic",
               same ? "ok  " : "FAIL", colsum ? "/next_dbias" : "");
        ok &= same;
    }
    if (version == kNumVersions)
        ok &= check_amax_option(dx0, dw0, db0, ndb0, got_dx[0], got_dw[0], got_db[0], got_ndb[0], d_dy, d_x, d_w, d_mean, d_rstd,
                                N, C, shift, colsum);
    return ok;
}

// ---------------------------------------------------------------------------------------------
// Benchmark.

// The separate pass next_dbias replaces: column sums of dx as matmul_backward_weight computes a bias
// gradient (cuBLAS matrix-vector product with blas_ones, beta = 1).
template <typename T> void column_sums_gemv(T* next_dbias, const T* dx, int N, int C) {
    gemm<T>(CUBLAS_OP_N, CUBLAS_OP_N, C, 1, N, 1.0f, dx, C, blas_ones<T>(N), N, 1.0f, next_dbias, C, 0);
}

// --floor: the header's two launches timed apart (its vector kernel, its finalize), a copy of the same
// bytes and an empty launch of the kernel's grid and block: where a short row's time goes.
bool g_floor = false;

template <typename T>
void benchmark_floor(int N, int C, T* dx, T* dw, T* db, void* scratch, const T* dy, const T* x, const T* w, const float* mean,
                     const float* rstd, double bytes, double copy_gbs) {
    using namespace layernorm_detail;
    constexpr bool P = kBackwardPrefetch<T>;
    const int wpr = backward_warps_per_row<T>(C);
    if (!wpr) return;
    float* partials = static_cast<float*>(scratch);
    int grid = 0;
    auto kernel = [&] { grid = backward_vec_launch<T, P, false>(dx, partials, dy, x, w, mean, rstd, N, C, wpr, nullptr, 0); };
    auto finalize = [&] {
        layernorm_backward_finalize_kernel<T, false><<<(C + 31) / 32, dim3(32, 32)>>>(dw, db, nullptr, partials, grid, C);
    };
    kernel();  // sets grid, which the finalize sums over
    const float kernel_ms = time_median_ms(kernel, 10, 100), finalize_ms = time_median_ms(finalize, 10, 100);
    cuda_check_launch();
    const double gbs = bytes / (kernel_ms * 1e-3) / 1e9;
    printf("  %-10s %-6s %-8d %10.1f %10.1f %7.1f%%  (its vector kernel alone, grid %d)\n", "8 kernel", dtype_name<T>(), C,
           kernel_ms * 1e3, gbs, 100.0 * gbs / copy_gbs, grid);
    printf("  %-10s %-6s %-8d %10.1f %10s %8s  (its finalize alone)\n", "8 finalize", dtype_name<T>(), C, finalize_ms * 1e3, "-", "-");
    print_launch_floor(dtype_name<T>(), C, bytes, grid, block_threads_of(wpr, kBackwardMinBlock), copy_gbs);
}

// Rows of versions 7 and 8: plain, with next_dbias (fused), plain then the separate pass (gemv).
enum class Colsum { none, fused, gemv };

template <typename T> void benchmark(const std::vector<int>& versions, int N, const std::vector<int>& Cs, double copy_gbs) {
    printf("\nLayerNorm backward benchmark, %s, N = %d (median of many runs after warm-up)\n", dtype_name<T>(), N);
    printf("  bytes = 4*N*C*sizeof(T) (read x, dy, dx; write dx) + 8*N (mean, rstd)\n");
    printf("  +colsum: with next_dbias (fused column sum); +gemv: without, then the separate cuBLAS column sum.\n");
    printf("  GB/s and %% copy count the LayerNorm's bytes only, for every row: compare those rows by time.\n");
    printf("  %-10s %-6s %-8s %10s %10s %8s\n", "version", "dtype", "C", "time (us)", "GB/s", "% copy");
    for (int C : Cs) {
        const size_t NC = size_t(N) * C;
        Rng rng(99 + C);
        std::vector<T> h(NC), w(C);
        fill_rows(h, N, C, rng);
        fill_uniform(w, 0.5f, 1.5f, rng);
        DeviceBuffer<T> d_x(NC, "x"), d_dy(NC, "dy"), d_dx(NC, "dx"), d_w(C, "weight"), d_dw(C, "dweight"),
            d_db(C, "dbias"), d_ndb(C, "next_dbias"), d_out(NC, "forward out");
        DeviceBuffer<float> d_mean(N, "mean"), d_rstd(N, "rstd");
        DeviceBuffer<unsigned char> d_scratch(lab_scratch_bytes(N, C), "scratch");
        d_x.upload(h), d_dy.upload(h), d_w.upload(w);
        cuda_check(cudaMemset(d_dx.ptr, 0, NC * sizeof(T)));
        cuda_check(cudaMemset(d_dw.ptr, 0, C * sizeof(T)));
        cuda_check(cudaMemset(d_db.ptr, 0, C * sizeof(T)));
        cuda_check(cudaMemset(d_ndb.ptr, 0, C * sizeof(T)));
        layernorm_forward(d_out.ptr, d_mean.ptr, d_rstd.ptr, d_x.ptr, d_w.ptr, d_w.ptr, N, C);  // real statistics
        const double bytes = 4.0 * NC * sizeof(T) + 8.0 * N;
        for (int v : versions)
            for (Colsum mode : {Colsum::none, Colsum::fused, Colsum::gemv}) {
                if (mode != Colsum::none && !has_colsum(v)) continue;
                const char* note = nullptr;
                auto run = [&] {
                    note = run_version<T>(v, d_dx.ptr, d_dw.ptr, d_db.ptr, d_scratch.ptr, d_dy.ptr, d_x.ptr, d_w.ptr, d_mean.ptr,
                                          d_rstd.ptr, N, C, mode == Colsum::fused ? d_ndb.ptr : nullptr);
                    if (mode == Colsum::gemv) column_sums_gemv(d_ndb.ptr, d_dx.ptr, N, C);
                };
                const float first = time_median_ms(run, 1, 1);  // slow versions get fewer runs
                const float ms = first > 20.0f ? time_median_ms(run, 0, 3) : time_median_ms(run, 10, 100);
                const double gbs = bytes / (ms * 1e-3) / 1e9;
                char label[16];
                snprintf(label, sizeof(label), "%d%s", v, mode == Colsum::fused ? "+colsum" : mode == Colsum::gemv ? "+gemv" : "");
                printf("  %-10s %-6s %-8d %10.1f %10.1f %7.1f%%%s%s\n", label, dtype_name<T>(), C, ms * 1e3, gbs,
                       100.0 * gbs / copy_gbs, note ? "  " : "", note ? note : "");
            }
        if (g_floor)
            benchmark_floor<T>(N, C, d_dx.ptr, d_dw.ptr, d_db.ptr, d_scratch.ptr, d_dy.ptr, d_x.ptr, d_w.ptr, d_mean.ptr, d_rstd.ptr,
                               bytes, copy_gbs);
    }
}

// ---------------------------------------------------------------------------------------------

void usage(FILE* f) {
    fprintf(f,
            "usage: layernorm_backward [versions...] [--check] [-N rows] [-C cols] [--dtype fp32|bf16]\n"
            "  versions      which kernels to run (default: all, 1..%d)\n"
            "  --check       validation only: every version, every shape, fp32 and bf16 (CI);\n"
            "                versions 7 and 8 also with next_dbias (the fused column sum)\n"
            "  -N rows       benchmark rows (default 65536)\n"
            "  -C cols       benchmark row length (default: 768 1024 1600 2048 4096)\n"
            "  --dtype T     benchmark fp32 or bf16 only (default: both)\n"
            "  --floor       benchmark: also the header's kernel and finalize timed apart, a copy of the same bytes\n"
            "                and an empty launch of the kernel's shape\n"
            "  -h            this message\n",
            kNumVersions);
}

// Versions 7 and 8 run each case twice, without and with next_dbias, from the same inputs (seed).
template <typename T> void check_all(TestCounter& tests, bool gpu, const std::vector<int>& versions) {
    uint64_t seed = 1;
    for (int v : versions)
        for (const Shape& s : kCheckShapes)
            for (int shift : {0, 1}) {
                seed++;
                for (bool colsum : {false, true}) {
                    if (colsum && !has_colsum(v)) continue;
                    char name[160];
                    snprintf(name, sizeof(name), "backward v%d%s %s N=%d C=%d %s", v, colsum ? "+colsum" : "", dtype_name<T>(),
                             s.N, s.C, shift ? "misaligned" : "aligned");
                    if (!gpu) {
                        tests.skip(name);
                        continue;
                    }
                    printf("%s\n", name);
                    tests.record(name, check_one<T>(v, s.N, s.C, shift, seed, /*determinism=*/v >= 6, colsum));
                }
            }
}

int main(int argc, char** argv) {
    std::vector<int> versions;
    bool check = false, fp32 = true, bf16 = true;
    int N = 65536;
    std::vector<int> Cs = {768, 1024, 1600, 2048, 4096};
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto value = [&] { return flag_value(argc, argv, i, usage); };
        if (a == "-h" || a == "--help") {
            usage(stdout);
            return 0;
        } else if (a == "--check") {
            check = true;
        } else if (a == "-N") {
            N = parse_int(value(), "-N", 1, usage);
        } else if (a == "-C") {
            Cs = {parse_int(value(), "-C", 1, usage)};
        } else if (a == "--dtype") {
            bf16 = parse_dtype_is_bf16(value(), usage), fp32 = !bf16;
        } else if (a == "--floor") {
            g_floor = true;
        } else if (!a.empty() && a[0] != '-') {
            versions.push_back(parse_int(a.c_str(), "version", 1, usage));
        } else {
            usage(stderr);
            fail("unknown flag '%s'", a.c_str());
        }
    }
    for (int v : versions)
        if (v > kNumVersions) fail("version %d does not exist (1..%d)", v, kNumVersions);
    std::vector<int> all;
    for (int i = 1; i <= kNumVersions; i++) all.push_back(i);
    const bool gpu = cuda_device_available();
    TestCounter tests;
    if (check) {
        check_all<float>(tests, gpu, all);
        check_all<__nv_bfloat16>(tests, gpu, all);
        return tests.finish();
    }
    if (!gpu) fail("no CUDA device: the benchmark needs a GPU (--check alone reports skips)");
    if (versions.empty()) versions = all;
    if (fp32) check_all<float>(tests, gpu, versions);
    if (bf16) check_all<__nv_bfloat16>(tests, gpu, versions);
    cudaDeviceProp prop;
    cuda_check(cudaGetDeviceProperties(&prop, 0));
    const double copy_gbs = measure_copy_bandwidth_gbs();
    printf("\ndevice: %s, %d SMs, L2 %d MB; device-to-device copy %.1f GB/s (bytes read + written)\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, copy_gbs);
    blas_init(N);  // the +gemv rows' separate column sum, in fp32 and bf16
    blas_init_ones<float>(N);
    blas_init_ones<__nv_bfloat16>(N);
    if (fp32) benchmark<float>(versions, N, Cs, copy_gbs);
    if (bf16) benchmark<__nv_bfloat16>(versions, N, Cs, copy_gbs);
    blas_destroy();
    return tests.finish();
}
