// lm_head.cuh: the LM head's forward and the classifier's loss and gradient without a pass over the
// logits (bf16 builds, Hopper; train_gpt -lx 1, the default where it runs).
//
//   The usual way: logits = x W^T (a GEMM writing B T x Vp values), then the classifier reads them
//   all to find each row's log-sum-exp and loss and writes dlogits = dloss (softmax - onehot) over
//   them, then the LM head's backward reads dlogits twice (dx = dlogits W, dW = dlogits^T x).
//   Here the GEMM's epilogue writes E = exp(logit - shift) instead of the logit, with each row's sum
//   of E over each 192-column tile, so nothing reads the logits between the GEMMs:
//     shift[r] = logit[r, target[r]]  (a dot product of x's row and W's target row, before the GEMM)
//     S[r]     = sum of E over the row (from the tile sums);  loss[r] = log S[r]
//     E[r, target[r]] -= S[r];  scale[r] = dloss / S[r],  so that dlogits = diag(scale) E
//   and the backward: dx = diag(scale) (E W) (a pass scaling dx's rows after that GEMM) and dW +=
//   E^T (diag(scale) x) (a pass scaling x's rows before it): two passes over B T x C values instead
//   of one over B T x Vp.
//
// Why the target logit as the shift: the target's own term is exp(0) = 1, so S >= 1 never underflows,
// and S = exp(loss) overflows only for a loss of 88 and more. The row's scale and the scaled x must
// stay normal floats, so rows with S > 2^64 (a token's loss above 44: a probability below 1e-19) are
// refused: their loss is written as NaN, which makes the step non-finite (its update skipped) and
// train_gpt goes back to the logits and the classifier for the rest of the run. The exponentials are
// ex2.approx (a relative error of ~2^-22, below E's bf16 rounding).
//
// The GEMM: a persistent kernel, one block an SM in pairs (thread-block clusters) on vertically
// adjacent 128 x 192 tiles; one warpgroup loads k-slices of 64 columns by TMA into a ring of 4
// stages (the pair's shared W tile loaded once and multicast to both blocks); two consumer warpgroups
// each own whole tiles (wgmma m64n192k16 from 128-byte-swizzled shared memory) and take turns, so one
// runs its epilogue (exponentials, sums, TMA stores of 64 rows at a time) while the other multiplies.
// The versions that led here and their measurements: dev/cuda/matmul_wgmma.cu and docs/matmul.md.
#pragma once

#include <algorithm>

#include "common.cuh"
#include "ptx.cuh"

namespace lm_head_detail {
using bf16 = __nv_bfloat16;
using namespace ptx;

// Output tile t of the persistent loop, in units of `unit_rows` rows: groups of `group` row units,
// and within a group the row unit changes fastest, so the blocks running at once share a few b tiles
// (and a tiles) through L2.
__host__ __device__ __forceinline__ void tile_origin(int t, int num_m, int num_n, int group, int unit_rows, int unit_cols,
                                                     int& m0, int& n0) {
    const int group_tiles = group * num_n, g = t / group_tiles, first = g * group;
    const int rows = min(num_m - first, group), local = t - g * group_tiles;
    m0 = (first + local % rows) * unit_rows;
    n0 = (local / rows) * unit_cols;
}

constexpr int kBM = 128, kBN = 192, kBK = 64;      // a tile (kBM x kBN) and a k-slice's columns
constexpr int kStages = 4, kThreads = 384;         // the ring's depth; a loader and two consumer warpgroups
constexpr int kTileGroup = 16;                     // row pairs a group of the tile order (tile_origin)
constexpr int kTileA = kBM * kBK * 2, kTileB = kBN * kBK * 2;  // bytes of one stage's x and W slices
constexpr int kStaging = 64 * kBN * 2;             // a consumer's 64 output rows on their way to the TMA store
constexpr size_t kSmemBytes = size_t(kStages) * (kTileA + kTileB) + 2 * kStaging + (2 * kStages + 2) * sizeof(uint64_t) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "stages and staging exceed a block's shared memory");

// What the epilogue needs besides the accumulators.
struct ExpOut {
    const float* shift;  // (M) subtracted from each row's logits before exp (the target logit)
    int V;               // real columns; V..N-1 are padding, written as 0 and left out of the sums
    float* tile_sums;    // (M, column tiles): sum of E over the tile's columns, in fp32 before rounding
};

// The epilogue on one consumer's 64 rows: acc[4 jj + e] is row row0 + 8 (e / 2), column n0 + 8 jj +
// 2 (lane % 4) + e % 2. Replaces each value by E and sums E by row over the tile (the row's 4 lanes in
// a fixed order: the same bits every run).
__device__ __forceinline__ void exp_epilogue(float (&acc)[kBN / 2], int row0, int n0, int lane, int M, int num_n, const ExpOut& eo) {
    constexpr float kLog2e = 1.4426950408889634f;
#pragma unroll
    for (int e2 = 0; e2 < 2; e2++) {
        const int row = row0 + 8 * e2, real = eo.V - (n0 + 2 * (lane % 4));  // this thread's real columns
        const float shift_log2 = row < M ? eo.shift[row] * kLog2e : 0.0f;
        float sum = 0.0f;
#pragma unroll
        for (int jj = 0; jj < kBN / 8; jj++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float& x = acc[4 * jj + 2 * e2 + e];
                x = 8 * jj + e < real ? exp2_ftz(fmaf(x, kLog2e, -shift_log2)) : 0.0f;
                sum += x;
            }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (lane % 4 == 0 && row < M) eo.tile_sums[size_t(row) * num_n + n0 / kBN] = sum;
    }
}

// E (M, N) = exp(x W^T - shift) with its tile sums (ExpOut); x (M, K), W (N, K), every matrix
// row-major bf16, fp32 accumulation. K and N multiples of 8 (16-byte rows for the TMA), M any.
//
// The consumers take turns at the ring (turn barriers): a consumer starts a tile's slices only after
// the other has passed the full barriers of all of its previous tile's. Without that, a consumer
// k-slices ahead would wait on the parity of a stage's phase that an earlier use already completed,
// and read the other consumer's slice. A stage is refilled only when the consumer it holds a tile for
// is done with it in both blocks of the pair (each consumer warp arrives on both blocks' empty
// barriers, with the plain CTA-scope arrive: a cluster-scope release there halved the speed).
__global__ void __launch_bounds__(kThreads, 1)
    exp_gemm_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                    const __grid_constant__ CUtensorMap map_out, int M, int N, int K, int group, ExpOut eo) {
#ifdef PTX_HAVE_SM90A
    constexpr int kBoxes = kBN / 64;  // 64 x 64 boxes of a staged half
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    unsigned char* s_a = smem;
    unsigned char* s_b = s_a + kStages * kTileA;
    unsigned char* s_out = s_b + kStages * kTileB;
    uint64_t* full = reinterpret_cast<uint64_t*>(s_out + 2 * kStaging);
    uint64_t* empty = full + kStages;
    uint64_t* turn = empty + kStages;  // turn[c]: consumer c may start its next tile's slices
    const int warpgroup = threadIdx.x / 128;
    const uint32_t rank = cluster_rank();
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 4 * 2);  // the 4 warps of the consumer whose tile the stage holds, in each block
        }
        for (int c = 0; c < 2; c++) mbar_init(&turn[c], 4);  // the other consumer's 4 warps
        fence_mbarrier_init();
    }
    cluster_sync();
    const int num_m = (M + 2 * kBM - 1) / (2 * kBM), num_n = (N + kBN - 1) / kBN, tiles = num_m * num_n;
    const int k_slices = (K + kBK - 1) / kBK, first_tile = blockIdx.x / 2, tile_step = gridDim.x / 2;

    if (warpgroup == 0) {  // the loader: one thread
        setmaxnreg_dec<40>();
        if (threadIdx.x == 0) {
            int stage = 0;
            uint32_t phase = 0;
            for (int t = first_tile; t < tiles; t += tile_step) {
                int m0, n0;
                tile_origin(t, num_m, num_n, group, 2 * kBM, kBN, m0, n0);
                for (int ks = 0; ks < k_slices; ks++) {
                    mbar_wait(&empty[stage], phase ^ 1);
                    mbar_arrive_expect_tx(&full[stage], kTileA + kTileB);
                    tma_load_2d(s_a + stage * kTileA, &map_x, &full[stage], ks * kBK, m0 + rank * kBM);
                    tma_load_2d_multicast(s_b + stage * kTileB + rank * (kTileB / 2), &map_w, &full[stage], ks * kBK,
                                          n0 + rank * (kBN / 2), 0x3);
                    if (++stage == kStages) stage = 0, phase ^= 1;
                }
            }
        }
    } else {
        setmaxnreg_inc<232>();
        const int consumer = warpgroup - 1;
        const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
        unsigned char* staging = s_out + consumer * kStaging;
        const bool leader = threadIdx.x % 128 == 0;
        auto release = [&](int s) {  // this warp is done with stage s (in both blocks of the pair)
            if (lane == 0)
                for (uint32_t r = 0; r < 2; r++) mbar_arrive_cluster(&empty[s], r);
        };
        float acc0[kBN / 2], acc1[kBN / 2];  // rows 0..63 and 64..127 of the tile
        int j = consumer;                    // this block's j-th tile is this consumer's when j % 2 == consumer
        for (int t = first_tile + consumer * tile_step, i = 0; t < tiles; t += 2 * tile_step, j += 2, i++) {
            int m0, n0;
            tile_origin(t, num_m, num_n, group, 2 * kBM, kBN, m0, n0);
            m0 += rank * kBM;
            if (consumer == 1) mbar_wait(&turn[1], i & 1);     // consumer 0 is past tile j - 1's slices
            else if (i > 0) mbar_wait(&turn[0], (i - 1) & 1);  // consumer 1 is past tile j - 1's slices
            int previous = -1;
            for (int ks = 0; ks < k_slices; ks++) {
                const int pos = j * k_slices + ks;  // the slice's place in the ring's sequence
                const int stage = pos % kStages;
                mbar_wait(&full[stage], (pos / kStages) & 1);
                const unsigned char* a = s_a + stage * kTileA;
                const unsigned char* b = s_b + stage * kTileB;
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < kBK / 16; kk++) {
                    const uint64_t b_desc = sw128_desc(b + kk * 32, 16, 1024);
                    wgmma_m64n192k16_ss(acc0, sw128_desc(a + kk * 32, 16, 1024), b_desc, ks > 0 || kk > 0);
                    wgmma_m64n192k16_ss(acc1, sw128_desc(a + 64 * 128 + kk * 32, 16, 1024), b_desc, ks > 0 || kk > 0);
                }
                wgmma_commit();
                keep_regs(acc0);
                keep_regs(acc1);
                if (previous >= 0) {  // the slice before this one is done: its stage can be refilled
                    wgmma_wait<1>();
                    keep_regs(acc0);
                    keep_regs(acc1);
                    release(previous);
                }
                previous = stage;
            }
            if (lane == 0) mbar_arrive(&turn[1 - consumer]);  // every slice of this tile waited for: the other's turn
            wgmma_wait<0>();
            keep_regs(acc0);
            keep_regs(acc1);
            release(previous);
            const int r = warp * 16 + lane / 4;
            exp_epilogue(acc0, m0 + r, n0, lane, M, num_n, eo);
            exp_epilogue(acc1, m0 + 64 + r, n0, lane, M, num_n, eo);
            // Staging, 64 rows at a time: 64 x 64 boxes, 128-byte swizzled (row r's 16-byte chunk c at
            // chunk c ^ (r % 8): the accumulator fragments land without bank conflicts).
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (leader) bulk_wait_read();  // the last stores have read it
                named_barrier_sync<128>(1 + consumer);
                const float* acc = h == 0 ? acc0 : acc1;
#pragma unroll
                for (int jj = 0; jj < kBN / 8; jj++) {
                    unsigned char* box = staging + (jj / 8) * 8192 + r * 128 + (((jj % 8) ^ (r % 8)) * 16) + 4 * (lane % 4);
                    *reinterpret_cast<__nv_bfloat162*>(box) = __floats2bfloat162_rn(acc[4 * jj], acc[4 * jj + 1]);
                    *reinterpret_cast<__nv_bfloat162*>(box + 8 * 128) = __floats2bfloat162_rn(acc[4 * jj + 2], acc[4 * jj + 3]);
                }
                fence_proxy_async_smem();  // generic-proxy writes, read by the TMA (async proxy)
                named_barrier_sync<128>(1 + consumer);
                if (leader) {
#pragma unroll
                    for (int c = 0; c < kBoxes; c++)
                        tma_store_2d(&map_out, staging + c * 8192, n0 + 64 * c, m0 + 64 * h);
                    bulk_commit();
                }
            }
        }
        if (leader) bulk_wait();
    }
    __syncwarp();
    cluster_sync();  // the peer may still multicast into this block or arrive on its barriers
#else
    __trap();  // built without sm_90a: lm_head_exp_usable is false, so it never launches
#endif
}

// Whether this build's device code has the wgmma path (sm_90a) for the GPU it runs on: a PTX JIT
// build for another architecture (GPU_ARCH=80 on an H100) runs on compute capability 9.0 without it.
__global__ void wgmma_built_kernel(int* built) {
#ifdef PTX_HAVE_SM90A
    *built = 1;
#else
    *built = 0;
#endif
}

// Launches a persistent kernel of kThreads-thread blocks in clusters of `cluster` along x: one block
// an SM, at most `tiles` clusters. The grid must fit at once: the clusters the GPU can hold together
// (a GPC whose SM count is odd leaves one SM out of pairs); one more would run after the others,
// doubling the time. `resident` (the caller's, one per kernel) caches that count. The lab's GEMMs
// (dev/cuda/matmul_wgmma.cu) launch through it too.
template <typename... KernelArgs, typename... Args>
void launch_persistent(void (*kernel)(KernelArgs...), size_t smem, int cluster, int tiles, int& resident, Args... args) {
    cudaLaunchConfig_t config = {};
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = smem;
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = cluster, attribute.val.clusterDim.y = 1, attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    if (!resident) {
        cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        config.gridDim = dim3(cluster);
        cuda_check(cudaOccupancyMaxActiveClusters(&resident, kernel, &config));
        if (resident < 1) fail("no cluster of %d blocks of this GEMM fits on this GPU", cluster);
    }
    config.gridDim = dim3(std::min(tiles, resident) * cluster);
    cuda_check(cudaLaunchKernelEx(&config, kernel, args...));
}

// The persistent grid: as many pairs as fit at once (one block an SM), each taking tiles in turn.
inline void exp_gemm(bf16* out, const bf16* x, const bf16* w, int M, int N, int K, const ExpOut& eo) {
    if (K % 8 || N % 8) fail("lm_head: C (%d) and the padded vocabulary (%d) must be multiples of 8", K, N);
    const CUtensorMap map_x = make_tensor_map(x, M, K, kBM), map_w = make_tensor_map(w, N, K, kBN / 2),
                      map_out = make_tensor_map(out, M, N, 64);
    const int tiles = ((M + 2 * kBM - 1) / (2 * kBM)) * ((N + kBN - 1) / kBN);
    static int resident = 0;
    const int group = std::min(kTileGroup, (M + 2 * kBM - 1) / (2 * kBM));
    launch_persistent(exp_gemm_kernel, kSmemBytes, 2, tiles, resident, map_x, map_w, map_out, M, N, K, group, eo);
}

// shift[r] = x[r] . w[target[r]] in fp32: a warp per row, 16-byte loads (C a multiple of 8), the
// lanes' partial sums added in a fixed order.
__global__ void target_logit_kernel(float* shift, const bf16* x, const bf16* w, const int* targets, int M, int C) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= M) return;
    const uint4* xr = reinterpret_cast<const uint4*>(x + size_t(row) * C);
    const uint4* wr = reinterpret_cast<const uint4*>(w + size_t(targets[row]) * C);
    float dot = 0.0f;
    for (int k = lane; k < C / 8; k += 32) {
        uint4 xa = xr[k], wa = wr[k];
        const __nv_bfloat162* xh = reinterpret_cast<const __nv_bfloat162*>(&xa);
        const __nv_bfloat162* wh = reinterpret_cast<const __nv_bfloat162*>(&wa);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 xf = __bfloat1622float2(xh[e]), wf = __bfloat1622float2(wh[e]);
            dot = fmaf(xf.x, wf.x, dot);
            dot = fmaf(xf.y, wf.y, dot);
        }
    }
    dot = warp_sum(dot);
    if (lane == 0) shift[row] = dot;
}

// The largest row sum S taken (see the top): beyond it the row's loss is written as NaN.
constexpr float kMaxRowSum = 18446744073709551616.0f;  // 2^64

// A row's loss from its tile sums: loss = log S (E's shift is the target logit). With dloss != 0 also
// scale = dloss / S and the one-hot folded into E's target column (E[t] -= S), so that dlogits =
// scale E. A warp per row, its sums in a fixed order. (The target's own term in S is 1 + d, not 1:
// the GEMM and the dot product sum the same products in other orders, d ~ 1e-6..1e-4; the loss and
// the target's dlogit carry it, far below E's bf16 rounding of 2^-9.)
__global__ void exp_loss_kernel(float* losses, float* scale, bf16* E, const float* tile_sums, const int* targets, float dloss,
                                int M, int Vp, int tiles) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= M) return;
    float s = 0.0f;
    for (int t = lane; t < tiles; t += 32) s += tile_sums[size_t(row) * tiles + t];
    s = warp_sum(s);
    if (lane == 0) {
        const bool taken = s <= kMaxRowSum;  // (false for NaN too)
        losses[row] = taken ? logf(s) : NAN;
        if (dloss != 0.0f) {
            scale[row] = taken ? dloss / s : NAN;
            bf16& e = E[size_t(row) * Vp + targets[row]];
            e = __float2bfloat16(__bfloat162float(e) - s);
        }
    }
}

// out[r, :] = in[r, :] * scale[r] (in place allowed), rows of C values (a multiple of 8), 16 bytes a thread.
__global__ void scale_rows_kernel(bf16* out, const bf16* in, const float* scale, int M, int C) {
    const size_t chunks = size_t(M) * (C / 8);
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < chunks; i += size_t(gridDim.x) * blockDim.x) {
        const float s = scale[i / (C / 8)];
        uint4 v = reinterpret_cast<const uint4*>(in)[i];
        __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 f = __bfloat1622float2(h[e]);
            h[e] = __floats2bfloat162_rn(f.x * s, f.y * s);
        }
        reinterpret_cast<uint4*>(out)[i] = v;
    }
}

}  // namespace lm_head_detail

// True where the exp head runs: a compute capability 9.0 GPU, device code built for sm_90a, C and the
// padded vocabulary multiples of 8.
inline bool lm_head_exp_usable(int C, int Vp) {
    if (C % 8 || Vp % 8 || !ptx::wgmma_available()) return false;
    static int built = -1;
    if (built < 0) {
        int* d_built = nullptr;
        cuda_check(cudaMalloc(&d_built, sizeof(int)));
        lm_head_detail::wgmma_built_kernel<<<1, 1>>>(d_built);
        cuda_check_launch();
        cuda_check(cudaMemcpy(&built, d_built, sizeof(int), cudaMemcpyDeviceToHost));
        cuda_check(cudaFree(d_built));
    }
    return built == 1;
}

// Column tiles of E (the tile sums' row length).
inline int lm_head_tiles(int Vp) { return (Vp + lm_head_detail::kBN - 1) / lm_head_detail::kBN; }

// The forward and the classifier of M rows: E (M, Vp) = exp(x w^T - shift), 0 in columns V..Vp-1;
// losses (M); with dloss != 0 also scale (M) and E's target column as the top says, E then holding
// dlogits / scale. x (M, C), w (Vp, C); scratch: shift (M), tile_sums (M, lm_head_tiles(Vp)).
inline void lm_head_exp_forward(__nv_bfloat16* E, float* losses, float* scale, float* shift, float* tile_sums,
                                const __nv_bfloat16* x, const __nv_bfloat16* w, const int* targets, int M, int C, int V,
                                int Vp, float dloss) {
    using namespace lm_head_detail;
    target_logit_kernel<<<(M + 7) / 8, 256>>>(shift, x, w, targets, M, C);
    cuda_check_launch();
    exp_gemm(E, x, w, M, Vp, C, ExpOut{shift, V, tile_sums});
    exp_loss_kernel<<<(M + 7) / 8, 256>>>(losses, scale, E, tile_sums, targets, dloss, M, Vp, lm_head_tiles(Vp));
    cuda_check_launch();
}

// out[r, :] = in[r, :] * scale[r] for M rows of C values (C a multiple of 8; in place allowed).
inline void lm_head_scale_rows(__nv_bfloat16* out, const __nv_bfloat16* in, const float* scale, int M, int C) {
    const size_t blocks = std::min<size_t>((size_t(M) * (C / 8) + 255) / 256, 8192);
    lm_head_detail::scale_rows_kernel<<<(unsigned)std::max<size_t>(blocks, 1), 256>>>(out, in, scale, M, C);
    cuda_check_launch();
}
