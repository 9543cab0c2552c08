// matmul_wgmma.cu: a GEMM of our own on Hopper's tensor-memory accelerator (TMA) and warpgroup MMA
// (wgmma), beside cuBLAS at the shapes of GPT-2's forward matmuls.
//
//   make dev/cuda/matmul_wgmma
//   ./dev/cuda/matmul_wgmma            validate, then benchmark (bf16, 65536 rows)
//   ./dev/cuda/matmul_wgmma --check    validation only (skips without an sm_90 GPU)
//   ./dev/cuda/matmul_wgmma -h         the usage (--rows, --group, --no-validate, --versions, --shape)
//
// Why a GEMM of our own: the training step's matmuls are cuBLAS's and run at its rate, and what is
// left around them (the classifier's pass over the logits, GELU's pre-activation, the LayerNorm
// outputs) can only go away inside a GEMM's prologue or epilogue, which cuBLAS does not offer. Such
// fusions pay only if the GEMM itself keeps cuBLAS's pace; this lab measures whether ours does.
//
// The product: out (M, N) = a (M, K) b (N, K)^T, bf16 in, fp32 accumulation, bf16 out, every matrix
// row-major (the forward of a linear layer: a = the input, b = the weight). K and N multiples of 8
// (16-byte rows for the TMA), M any.
//
// Versions (each validated against a double-precision CPU reference, and against cuBLAS at the
// benchmark shapes):
//   1  the header (matmul_forward without bias: tuned cuBLASLt), what training runs.
//   2-7 ours, one kernel (gemm_tma_wgmma_kernel) in six configurations: a persistent kernel, one
//      block an SM, output tiles of 128 x 256 taken in groups of --group row tiles (the b tiles of a
//      group stay in L2). Warp-specialized: one warpgroup loads k-slices of 64 (a: 128 x 64, b: 256 x
//      64, 48 KiB) by TMA into a ring of stages, each guarded by a pair of mbarriers (full: the TMA's
//      bytes arrived; empty: the consumers are done with it); two warpgroups each multiply 64 rows of
//      the tile by all 256 columns (wgmma m64n256k16 from 128-byte-swizzled shared memory, the layout
//      the TMA writes), 128 fp32 accumulators a thread, while the loader fills the next stages.
//   2  4 stages; each thread stores its accumulators to global memory itself.
//   3  3 stages; the outputs leave through shared memory by TMA stores (32 KiB a consumer).
//   4  4 stages; the same in two halves (16 KiB a consumer, which leaves room for the fourth stage).
//   5  3's blocks in pairs (thread-block clusters) on vertically adjacent tiles.
//   6  5, the pair loading its shared b tile once (TMA multicast).
//   7  4's blocks in pairs, b multicast.
//   8-12 gemm_pingpong_kernel: the same loader, but each consumer warpgroup owns whole tiles (128 x 128
//      or 128 x 192) and the two take turns, so one stores while the other multiplies.
//   8  tiles of 128 x 128, 5 stages.   9  8 in pairs, b multicast.
//   10 tiles of 128 x 192, 4 stages, outputs staged 64 rows at a time.   11  10 in pairs, b multicast.
//   12 11 with 5 stages: the two consumers share one 64-row staging buffer.
//   13 (its own benchmark, --shape lmhead-dx) the LM head's input gradient dx = dlogits W read from
//      the logits: 11 forming each slice of the classifier's gradient in shared memory first.
//   14 (its own benchmark, --shape lmhead-exp) the header lm_head.cuh, what training runs in bf16 on
//      Hopper: the LM head's forward writing exp(logit - target logit) with each row's sums from 11's
//      epilogue, then the losses, row scales and dlogits: no pass over the logits.
// What they measured (H100, 2026-11-25) is in docs/matmul.md: the TMA stores took ours from ~0.55x
// to ~0.75-0.9x of cuBLAS's rate at these shapes, the pairs to ~0.84-0.93x, ping-pong tiles of
// 128 x 192 in pairs (11) to about cuBLAS's (0.98-1.03x of its time summed, the versions in turn).

#include <cuda_profiler_api.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>

#include "common.cuh"
#include "dev/lab.cuh"
#include "classifier.cuh"
#include "lm_head.cuh"  // version 14, and the persistent launch and tile order the others share
#include "matmul.cuh"
#include "ptx.cuh"

using bf16 = __nv_bfloat16;
using namespace ptx;
using lm_head_detail::launch_persistent;
using lm_head_detail::tile_origin;

// ---------------------------------------------------------------------------------------------
// Versions 2-7: one kernel, four choices.
//   STAGES      the ring's depth (48 KiB a stage).
//   STORE_COLS  0: each thread stores its accumulators to global memory directly. 128 or 256: the
//               outputs go through shared memory (64 x 64 boxes, 128-byte swizzled: the accumulator
//               fragments land there without bank conflicts) and leave by TMA stores that run while
//               the warpgroup goes on; 256 stages a consumer's whole 64 x 256 at once (32 KiB each),
//               128 half of it at a time (16 KiB each, leaving room for a fourth stage).
//   CLUSTER     2: blocks in pairs (a thread-block cluster, on one GPC) taking vertically adjacent
//               tiles, which share their b tile.
//   MULTICAST   the pair loads that b tile once: each block half of it, which the TMA multicasts to
//               both, so L2 serves 2/3 of the bytes (a stage of the pair: 2 x 16 KiB of a
//               and 32 KiB of b, against 2 x 48 KiB). A stage is refilled only when both blocks'
//               consumers are done with it: each consumer warp arrives on both blocks' empty barriers,
//               with the plain (CTA-scope release) arrive. A cluster-scope release there (an
//               `mbarrier.arrive.release.cluster`) halved the kernel's speed.

constexpr int kBM = 128, kBN = 256, kBK = 64, kThreads = 384;
static_assert(kThreads == lm_head_detail::kThreads, "every version launches through lm_head.cuh's launch_persistent");
constexpr int kTileA = kBM * kBK * 2, kTileB = kBN * kBK * 2;  // bytes of one stage's a and b
template <int STAGES, int STORE_COLS> constexpr size_t smem_bytes() {
    return size_t(STAGES) * (kTileA + kTileB) + 2 * (64 * STORE_COLS * 2) + 2 * STAGES * sizeof(uint64_t) + 1024;
}
constexpr size_t kMaxSmemBytes = 227 * 1024;  // a block's dynamic shared memory on compute capability 9.0

template <int STAGES, int STORE_COLS, int CLUSTER, bool MULTICAST>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_tma_wgmma_kernel(bf16* out, const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                          const __grid_constant__ CUtensorMap map_out, int M, int N, int K, int group) {
    static_assert(STORE_COLS == 0 || STORE_COLS == 128 || STORE_COLS == 256, "staging width");
    static_assert(CLUSTER == 1 || CLUSTER == 2, "cluster size");
    static_assert(!MULTICAST || CLUSTER == 2, "multicast within a pair");
#ifdef PTX_HAVE_SM90A
    constexpr int kStaging = 64 * STORE_COLS * 2;  // bytes, per consumer
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // swizzle atoms: 1024-aligned
    unsigned char* s_a = smem;                                                       // STAGES x kTileA
    unsigned char* s_b = smem + STAGES * kTileA;                                     // STAGES x kTileB
    unsigned char* s_out = s_b + STAGES * kTileB;                                    // 2 x kStaging
    uint64_t* full = reinterpret_cast<uint64_t*>(s_out + 2 * kStaging);
    uint64_t* empty = full + STAGES;
    const int warpgroup = threadIdx.x / 128;
    const uint32_t rank = CLUSTER > 1 ? cluster_rank() : 0;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);              // the loader's arrive.expect_tx; then the TMA's bytes
            mbar_init(&empty[s], MULTICAST ? 8 * CLUSTER : 8);  // each consumer warp (of the cluster), done with the stage
        }
        fence_mbarrier_init();
    }
    if constexpr (CLUSTER > 1) cluster_sync();  // no multicast or remote arrival before every barrier exists
    else __syncthreads();
    const int num_m = (M + kBM * CLUSTER - 1) / (kBM * CLUSTER), num_n = (N + kBN - 1) / kBN, tiles = num_m * num_n;
    const int k_slices = (K + kBK - 1) / kBK, first_tile = blockIdx.x / CLUSTER, tile_step = gridDim.x / CLUSTER;

    if (warpgroup == 0) {  // the loader: one thread issues every copy
        setmaxnreg_dec<40>();
        if (threadIdx.x == 0) {
            int stage = 0;
            uint32_t phase = 0;
            for (int t = first_tile; t < tiles; t += tile_step) {
                int m0, n0;
                tile_origin(t, num_m, num_n, group, kBM * CLUSTER, kBN, m0, n0);
                for (int ks = 0; ks < k_slices; ks++) {
                    mbar_wait(&empty[stage], phase ^ 1);  // a fresh barrier's "previous phase" counts as done
                    mbar_arrive_expect_tx(&full[stage], kTileA + kTileB);  // out-of-range rows arrive as zeros, counted
                    tma_load_2d(s_a + stage * kTileA, &map_a, &full[stage], ks * kBK, m0 + rank * kBM);
                    if constexpr (MULTICAST)
                        tma_load_2d_multicast(s_b + stage * kTileB + rank * (kTileB / 2), &map_b, &full[stage], ks * kBK,
                                              n0 + rank * (kBN / 2), 0x3);
                    else
                        tma_load_2d(s_b + stage * kTileB, &map_b, &full[stage], ks * kBK, n0);
                    if (++stage == STAGES) stage = 0, phase ^= 1;
                }
            }
        }
    } else {
        setmaxnreg_inc<232>();
        const int half = warpgroup - 1;  // rows half * 64 .. + 63 of each tile
        const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
        auto release = [&](int s) {  // this warp is done with stage s (every block of the cluster refills it)
            if (lane == 0) {
                if constexpr (MULTICAST)
                    for (uint32_t r = 0; r < CLUSTER; r++) mbar_arrive_cluster(&empty[s], r);
                else
                    mbar_arrive(&empty[s]);
            }
        };
        float acc[128];
        int stage = 0;
        uint32_t phase = 0;
        for (int t = first_tile; t < tiles; t += tile_step) {
            int m0, n0;
            tile_origin(t, num_m, num_n, group, kBM * CLUSTER, kBN, m0, n0);
            m0 += rank * kBM;
            int previous = -1;
            for (int ks = 0; ks < k_slices; ks++) {
                mbar_wait(&full[stage], phase);
                const unsigned char* a = s_a + stage * kTileA + half * 64 * 128;  // 64 rows of 128 bytes
                const unsigned char* b = s_b + stage * kTileB;
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < kBK / 16; kk++)  // 16 values = 32 bytes along the swizzled rows
                    wgmma_m64n256k16_ss(acc, sw128_desc(a + kk * 32, 16, 1024), sw128_desc(b + kk * 32, 16, 1024), ks > 0 || kk > 0);
                wgmma_commit();
                keep_regs(acc);
                if (previous >= 0) {  // the slice before this one is read: hand its stage back
                    wgmma_wait<1>();
                    keep_regs(acc);
                    release(previous);
                }
                previous = stage;
                if (++stage == STAGES) stage = 0, phase ^= 1;
            }
            wgmma_wait<0>();
            keep_regs(acc);
            release(previous);
            // Accumulator layout (per warp, as mma.sync's): element 4 j + e is row g + 8 (e / 2), column
            // 8 j + 2 c + e % 2 of the warp's 16 x 256 slice (lane = 4 g + c).
            if constexpr (STORE_COLS > 0) {
                unsigned char* staging = s_out + half * kStaging;
                const bool leader = threadIdx.x % 128 == 0;
                const int r = warp * 16 + lane / 4;
#pragma unroll
                for (int pass = 0; pass < 256 / STORE_COLS; pass++) {
                    if (leader) bulk_wait_read();  // earlier stores have read it
                    named_barrier_sync<128>(1 + half);
#pragma unroll
                    for (int jj = 0; jj < STORE_COLS / 8; jj++) {
                        const int j = pass * (STORE_COLS / 8) + jj;
                        unsigned char* box = staging + (jj / 8) * 8192 + r * 128 + (((jj % 8) ^ (r % 8)) * 16) + 4 * (lane % 4);
                        *reinterpret_cast<__nv_bfloat162*>(box) = __floats2bfloat162_rn(acc[4 * j], acc[4 * j + 1]);
                        *reinterpret_cast<__nv_bfloat162*>(box + 8 * 128) = __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
                    }
                    fence_proxy_async_smem();  // generic-proxy writes, read by the TMA (async proxy)
                    named_barrier_sync<128>(1 + half);
                    if (leader) {
#pragma unroll
                        for (int b = 0; b < STORE_COLS / 64; b++)
                            tma_store_2d(&map_out, staging + b * 8192, n0 + pass * STORE_COLS + 64 * b, m0 + half * 64);
                        bulk_commit();
                    }
                }
            } else {
                const int row = m0 + half * 64 + warp * 16 + lane / 4, col0 = n0 + 2 * (lane % 4);
#pragma unroll
                for (int j = 0; j < 32; j++) {
                    const int col = col0 + 8 * j;
                    if (col < N) {
                        if (row < M) *reinterpret_cast<__nv_bfloat162*>(out + size_t(row) * N + col) = __floats2bfloat162_rn(acc[4 * j], acc[4 * j + 1]);
                        if (row + 8 < M)
                            *reinterpret_cast<__nv_bfloat162*>(out + size_t(row + 8) * N + col) =
                                __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
                    }
                }
            }
        }
        if (STORE_COLS > 0 && threadIdx.x % 128 == 0) bulk_wait();
    }
    __syncwarp();  // the cluster barrier is .aligned: each warp's threads reach it together
    if constexpr (CLUSTER > 1) cluster_sync();  // the peer may still multicast into this block or arrive on its barriers
#endif
}

int g_group = 16;  // --group

template <int STAGES, int STORE_COLS, int CLUSTER, bool MULTICAST> void gemm_ours(bf16* out, const bf16* a, const bf16* b, int M, int N, int K) {
    if (K % 8 || N % 8) fail("gemm_ours: K (%d) and N (%d) must be multiples of 8", K, N);
    constexpr size_t smem = smem_bytes<STAGES, STORE_COLS>();
    static_assert(smem <= kMaxSmemBytes, "stages and staging exceed a block's shared memory");
    auto kernel = gemm_tma_wgmma_kernel<STAGES, STORE_COLS, CLUSTER, MULTICAST>;
    const CUtensorMap map_a = make_tensor_map(a, M, K, kBM), map_b = make_tensor_map(b, N, K, MULTICAST ? kBN / CLUSTER : kBN),
                      map_out = make_tensor_map(out, M, N, 64);
    const int num_m = (M + kBM * CLUSTER - 1) / (kBM * CLUSTER), tiles = num_m * ((N + kBN - 1) / kBN);
    static int resident = 0;
    const int group = std::min(g_group, num_m);  // more rows than the matrix has: the same order
    launch_persistent(kernel, smem, CLUSTER, tiles, resident, out, map_a, map_b, map_out, M, N, K, group);
}

// ---------------------------------------------------------------------------------------------
// Versions 8-12: ping-pong consumers. Each consumer warpgroup owns whole 128 x BN tiles (two m64nBNk16
// products a k-step, 2 x BN / 2 accumulators a thread); a block's tiles alternate between the two,
// and the loader fills one ring in the order the tiles are taken, so one consumer's epilogue (its
// TMA stores) runs while the other multiplies and the tensor cores do not wait for stores.
// The consumers take turns at the ring (turn barriers): a consumer starts a tile's slices only after
// the other has passed the full barriers of all of its previous tile's. Without that, a consumer
// k-slices ahead would wait on the parity of a stage's phase that an earlier use already completed,
// and read the other consumer's slice.
//   BN            128 or 192 columns a tile.
//   STAGES        the ring's depth (16 KiB of a + BN x 128 bytes of b a stage).
//   CLUSTER       2: blocks in pairs on vertically adjacent tiles, each loading half of the shared b
//                 tile and multicasting it to both (as version 6); the stage's consumer in both blocks
//                 must be done with it before either refills it.
//   STAGING       where the outputs wait for their TMA stores: kStageAll, each consumer its whole tile
//                 (BN x 256 bytes); kStageHalves, each consumer 64 rows at a time (BN x 128 bytes);
//                 kStageShared, one 64-row buffer both consumers take turns at (their epilogues
//                 alternate anyway), which leaves room for a fifth stage at BN = 192.
// Why: at the K = 768 shapes versions 2-7 keep the tensor cores busy ~80% of the time (Nsight
// Compute) while both consumers store; cuBLAS's kernels keep them ~96% busy.

template <int BN> __device__ __forceinline__ void wgmma_pp(float (&d)[BN / 2], uint64_t a_desc, uint64_t b_desc, int accumulate) {
    if constexpr (BN == 128) wgmma_m64n128k16_ss(d, a_desc, b_desc, accumulate);
    else wgmma_m64n192k16_ss(d, a_desc, b_desc, accumulate);
}

enum { kStageAll, kStageHalves, kStageShared };
template <int STAGING> constexpr int pp_staging_rows() { return STAGING == kStageAll ? 256 : STAGING == kStageHalves ? 128 : 64; }
template <int BN, int STAGES, int STAGING> constexpr size_t pp_smem_bytes() {
    return size_t(STAGES) * (kTileA + BN * kBK * 2) + size_t(pp_staging_rows<STAGING>()) * BN * 2 + (2 * STAGES + 3) * sizeof(uint64_t) + 1024;
}

// The classifier's gradient, dlogits = (softmax(logits) - onehot(target)) * dloss over the first V
// columns and 0 in the padding, given each row's log-sum-exp: what version 13 applies to a's slices.
struct SoftmaxGrad {
    const float* lse;    // (M): log sum exp of the row's first V logits
    const int* targets;  // (M)
    float dloss;
    int V;
};
// One value of it, from the row's lse * log2(e) (exp2_ftz, as the attention kernels: ex2.approx.ftz).
__device__ __forceinline__ float softmax_grad(float logit, float lse_log2, int v, int target, const SoftmaxGrad& sg) {
    if (v >= sg.V) return 0.0f;
    const float p = exp2_ftz(fmaf(logit, 1.4426950408889634f, -lse_log2));
    return (v == target ? p - 1.0f : p) * sg.dloss;
}

template <int BN, int STAGES, int CLUSTER, int STAGING, bool SOFTMAX_A = false>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_pingpong_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                         const __grid_constant__ CUtensorMap map_out, int M, int N, int K, int group, SoftmaxGrad sg) {
    static_assert(BN == 128 || BN == 192, "tile width");
    static_assert(CLUSTER == 1 || CLUSTER == 2, "cluster size");
#ifdef PTX_HAVE_SM90A
    constexpr bool kHalves = STAGING != kStageAll, kShared = STAGING == kStageShared;
    constexpr int kTileBp = BN * kBK * 2, kStaging = (kHalves ? 64 : 128) * BN * 2, kBoxes = BN / 64;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    unsigned char* s_a = smem;
    unsigned char* s_b = s_a + STAGES * kTileA;
    unsigned char* s_out = s_b + STAGES * kTileBp;
    uint64_t* full = reinterpret_cast<uint64_t*>(s_out + (kShared ? 1 : 2) * kStaging);
    uint64_t* empty = full + STAGES;
    uint64_t* turn = empty + STAGES;  // turn[c]: consumer c may start its next tile's slices
    uint64_t* staging_free = turn + 2;  // kStageShared: the previous tile's stores have read the buffer
    const int warpgroup = threadIdx.x / 128;
    const uint32_t rank = CLUSTER > 1 ? cluster_rank() : 0;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 4 * CLUSTER);  // the 4 warps of the consumer whose tile the stage holds, in each block
        }
        for (int c = 0; c < 2; c++) mbar_init(&turn[c], 4);  // the other consumer's 4 warps
        mbar_init(staging_free, 1);                           // the leader of the consumer that stored last
        fence_mbarrier_init();
    }
    if constexpr (CLUSTER > 1) cluster_sync();
    else __syncthreads();
    const int num_m = (M + kBM * CLUSTER - 1) / (kBM * CLUSTER), num_n = (N + BN - 1) / BN, tiles = num_m * num_n;
    const int k_slices = (K + kBK - 1) / kBK, first_tile = blockIdx.x / CLUSTER, tile_step = gridDim.x / CLUSTER;

    if (warpgroup == 0) {
        setmaxnreg_dec<40>();
        if (threadIdx.x == 0) {
            int stage = 0;
            uint32_t phase = 0;
            for (int t = first_tile; t < tiles; t += tile_step) {
                int m0, n0;
                tile_origin(t, num_m, num_n, group, kBM * CLUSTER, BN, m0, n0);
                for (int ks = 0; ks < k_slices; ks++) {
                    mbar_wait(&empty[stage], phase ^ 1);
                    mbar_arrive_expect_tx(&full[stage], kTileA + kTileBp);
                    tma_load_2d(s_a + stage * kTileA, &map_a, &full[stage], ks * kBK, m0 + rank * kBM);
                    if constexpr (CLUSTER > 1)
                        tma_load_2d_multicast(s_b + stage * kTileBp + rank * (kTileBp / 2), &map_b, &full[stage], ks * kBK,
                                              n0 + rank * (BN / 2), 0x3);
                    else
                        tma_load_2d(s_b + stage * kTileBp, &map_b, &full[stage], ks * kBK, n0);
                    if (++stage == STAGES) stage = 0, phase ^= 1;
                }
            }
        }
    } else {
        setmaxnreg_inc<232>();
        const int consumer = warpgroup - 1;
        const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
        unsigned char* staging = s_out + (kShared ? 0 : consumer * kStaging);
        const bool leader = threadIdx.x % 128 == 0;
        auto release = [&](int s) {  // this warp is done with stage s (in every block of the cluster)
            if (lane == 0) {
                if constexpr (CLUSTER > 1)
                    for (uint32_t r = 0; r < CLUSTER; r++) mbar_arrive_cluster(&empty[s], r);
                else
                    mbar_arrive(&empty[s]);
            }
        };
        float acc0[BN / 2], acc1[BN / 2];  // rows 0..63 and 64..127 of the tile
        int j = consumer;                  // this block's j-th tile is this consumer's when j % 2 == consumer
        for (int t = first_tile + consumer * tile_step, i = 0; t < tiles; t += 2 * tile_step, j += 2, i++) {
            int m0, n0;
            tile_origin(t, num_m, num_n, group, kBM * CLUSTER, BN, m0, n0);
            m0 += rank * kBM;
            if (consumer == 1) mbar_wait(&turn[1], i & 1);     // consumer 0 is past tile j - 1's slices
            else if (i > 0) mbar_wait(&turn[0], (i - 1) & 1);  // consumer 1 is past tile j - 1's slices
            // Version 13: thread r of the consumer transforms row r of each a slice (its lse and target
            // held for the tile) in shared memory before the slice's products.
            const int my_row = m0 + threadIdx.x % 128;
            float lse_log2 = 0.0f;
            int target = -1;
            if (SOFTMAX_A && my_row < M) lse_log2 = sg.lse[my_row] * 1.4426950408889634f, target = sg.targets[my_row];
            int previous = -1;
            for (int ks = 0; ks < k_slices; ks++) {
                const int pos = j * k_slices + ks;  // the slice's place in the ring's sequence
                const int stage = pos % STAGES;
                mbar_wait(&full[stage], (pos / STAGES) & 1);
                if constexpr (SOFTMAX_A) {
                    // Row r's 128 bytes hold 8 chunks of 8 values, logical chunk c at c ^ (r % 8) (the
                    // swizzle); the thread starts at chunk r % 8 so that 8 consecutive rows hit 8 banks.
                    const int r = threadIdx.x % 128;
                    unsigned char* row_bytes = s_a + stage * kTileA + r * 128;
#pragma unroll
                    for (int q = 0; q < 8; q++) {
                        const int place = (q + r) & 7, v0 = ks * kBK + 8 * (place ^ (r & 7));
                        uint4 chunk = *reinterpret_cast<uint4*>(row_bytes + place * 16);
                        __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&chunk);
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const float2 x = __bfloat1622float2(h[e]);
                            h[e] = __floats2bfloat162_rn(softmax_grad(x.x, lse_log2, v0 + 2 * e, target, sg),
                                                         softmax_grad(x.y, lse_log2, v0 + 2 * e + 1, target, sg));
                        }
                        *reinterpret_cast<uint4*>(row_bytes + place * 16) = chunk;
                    }
                    fence_proxy_async_smem();  // generic-proxy writes, read by wgmma (async proxy)
                    named_barrier_sync<128>(1 + consumer);
                }
                const unsigned char* a = s_a + stage * kTileA;
                const unsigned char* b = s_b + stage * kTileBp;
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < kBK / 16; kk++) {
                    const uint64_t b_desc = sw128_desc(b + kk * 32, 16, 1024);
                    wgmma_pp<BN>(acc0, sw128_desc(a + kk * 32, 16, 1024), b_desc, ks > 0 || kk > 0);
                    wgmma_pp<BN>(acc1, sw128_desc(a + 64 * 128 + kk * 32, 16, 1024), b_desc, ks > 0 || kk > 0);
                }
                wgmma_commit();
                keep_regs(acc0);
                keep_regs(acc1);
                if (previous >= 0) {
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
            // Staging: 64 x 64 boxes, 128-byte swizzled; box h kBoxes + c holds rows 64 h.., columns 64 c..
            // (with halves each half h in turn goes to boxes 0 .. kBoxes - 1).
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (h == 0 || kHalves) {
                    if (leader) {
                        bulk_wait_read();  // this consumer's stores have read it
                        if (kShared && h == 0 && j > 0) mbar_wait(staging_free, (j - 1) & 1);  // and the other's, of tile j - 1
                    }
                    named_barrier_sync<128>(1 + consumer);
                }
                const float* acc = h == 0 ? acc0 : acc1;
                unsigned char* half_staging = staging + (kHalves ? 0 : h * kBoxes * 8192);
#pragma unroll
                for (int jj = 0; jj < BN / 8; jj++) {
                    unsigned char* box = half_staging + (jj / 8) * 8192 + r * 128 + (((jj % 8) ^ (r % 8)) * 16) + 4 * (lane % 4);
                    *reinterpret_cast<__nv_bfloat162*>(box) = __floats2bfloat162_rn(acc[4 * jj], acc[4 * jj + 1]);
                    *reinterpret_cast<__nv_bfloat162*>(box + 8 * 128) = __floats2bfloat162_rn(acc[4 * jj + 2], acc[4 * jj + 3]);
                }
                if (h == 1 || kHalves) {
                    fence_proxy_async_smem();
                    named_barrier_sync<128>(1 + consumer);
                    if (leader) {
                        for (int hh = kHalves ? h : 0; hh <= h; hh++)
#pragma unroll
                            for (int c = 0; c < kBoxes; c++)
                                tma_store_2d(&map_out, staging + ((kHalves ? 0 : hh * kBoxes) + c) * 8192, n0 + 64 * c, m0 + 64 * hh);
                        bulk_commit();
                        if (kShared && h == 1) {  // the buffer is the other consumer's once these stores have read it
                            bulk_wait_read();
                            mbar_arrive(staging_free);
                        }
                    }
                }
            }
        }
        if (leader) bulk_wait();
    }
    __syncwarp();
    if constexpr (CLUSTER > 1) cluster_sync();  // the peer may still multicast into this block or arrive on its barriers
#endif
}

template <int BN, int STAGES, int CLUSTER, int STAGING, bool SOFTMAX_A>
void launch_pingpong(bf16* out, const bf16* a, const bf16* b, int M, int N, int K, SoftmaxGrad sg) {
    if (K % 8 || N % 8) fail("gemm_pingpong: K (%d) and N (%d) must be multiples of 8", K, N);
    constexpr size_t smem = pp_smem_bytes<BN, STAGES, STAGING>();
    static_assert(smem <= kMaxSmemBytes, "ping-pong stages and staging exceed a block's shared memory");
    auto kernel = gemm_pingpong_kernel<BN, STAGES, CLUSTER, STAGING, SOFTMAX_A>;
    const CUtensorMap map_a = make_tensor_map(a, M, K, kBM), map_b = make_tensor_map(b, N, K, BN / CLUSTER),
                      map_out = make_tensor_map(out, M, N, 64);
    const int num_m = (M + kBM * CLUSTER - 1) / (kBM * CLUSTER), tiles = num_m * ((N + BN - 1) / BN);
    static int resident = 0;
    launch_persistent(kernel, smem, CLUSTER, tiles, resident, map_a, map_b, map_out, M, N, K, std::min(g_group, num_m), sg);
}
template <int BN, int STAGES, int CLUSTER, int STAGING> void gemm_pingpong(bf16* out, const bf16* a, const bf16* b, int M, int N, int K) {
    launch_pingpong<BN, STAGES, CLUSTER, STAGING, false>(out, a, b, M, N, K, SoftmaxGrad{});
}
// Version 13: out = dlogits b^T with dlogits = softmax_grad(a) formed slice by slice in shared memory.
void gemm_softmax_grad_fused(bf16* out, const bf16* logits, const bf16* b, int M, int N, int K, const SoftmaxGrad& sg) {
    launch_pingpong<192, 4, 2, kStageHalves, true>(out, logits, b, M, N, K, sg);
}
void gemm_cublas(bf16* out, const bf16* a, const bf16* b, int M, int N, int K) {
    matmul_forward<bf16>(out, a, b, nullptr, M, K, N);
}

// ---------------------------------------------------------------------------------------------
// Validation.
//
// Bound per element (the matmul lab's): |got - ref| <= 4 K 2^-24 sum|a b| + 2^-8 |ref| + 1e-7: the
// products accumulate in fp32 (at most ~K 2^-24 sum|a b| of error; 4x that allowed), the result is
// rounded to bf16 once (at most 2^-8 |ref|: 8 significant bits). ref and sum|a b| in double from the
// same bf16 inputs. At the benchmark shapes the reference covers sampled elements (every row tile and
// column tile is hit), and the whole output is compared with cuBLAS's, each side within its bound of
// the exact value, so their difference within the sum of the two bounds. These are worst-case bounds:
// from K ~ 3000 up they would let through an error as small as one 16-wide step of k left out of a
// tile (~1.3 with these inputs), which the small shapes' tight bounds (K <= 3072, every element) are
// there to catch; each benchmark-shape line also prints the share of elements with cuBLAS's bits.

__global__ void fill_random_kernel(bf16* x, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const uint64_t z = splitmix64_mix((i + 1) * kSplitMixStep + seed);  // SplitMix64's i-th output from seed
        x[i] = __float2bfloat16(float((z >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f);  // U[-1, 1)
    }
}

double bound_of(double ref, double mag, int K) { return 4.0 * K * std::ldexp(1.0, -24) * mag + std::ldexp(1.0, -8) * std::fabs(ref) + 1e-7; }

struct Product {
    double value, mag;
};
Product reference_at(const std::vector<bf16>& a, const std::vector<bf16>& b, int K, int i, int j) {
    double s = 0, m = 0;
    for (int k = 0; k < K; k++) {
        const double p = (double)__bfloat162float(a[size_t(i) * K + k]) * (double)__bfloat162float(b[size_t(j) * K + k]);
        s += p;
        m += std::fabs(p);
    }
    return {s, m};
}

using GemmFn = void (*)(bf16*, const bf16*, const bf16*, int, int, int);
constexpr int kVersions = 12;
const char* version_name(int v) {
    static const char* names[] = {"",           "header (cuBLASLt)", "direct stores",     "TMA stores",
                                  "TMA stores, 4 stages", "3 in pairs",        "5, b multicast", "4 in pairs, b multicast",
                                  "ping-pong 128x128", "8 in pairs, b multicast", "ping-pong 128x192",  "10 in pairs, b multicast",
                                  "11, 5 stages, staging shared"};
    return names[v];
}
GemmFn version_fn(int v) {
    static const GemmFn fns[] = {nullptr,
                                 gemm_cublas,
                                 gemm_ours<4, 0, 1, false>,
                                 gemm_ours<3, 256, 1, false>,
                                 gemm_ours<4, 128, 1, false>,
                                 gemm_ours<3, 256, 2, false>,
                                 gemm_ours<3, 256, 2, true>,
                                 gemm_ours<4, 128, 2, true>,
                                 gemm_pingpong<128, 5, 1, kStageAll>,
                                 gemm_pingpong<128, 5, 2, kStageAll>,
                                 gemm_pingpong<192, 4, 1, kStageHalves>,
                                 gemm_pingpong<192, 4, 2, kStageHalves>,
                                 gemm_pingpong<192, 5, 2, kStageShared>};
    return fns[v];
}

// Every element at a small shape, against the CPU reference.
void check_small(TestCounter& tests, int M, int N, int K, Rng& rng) {
    std::vector<bf16> a(size_t(M) * K), b(size_t(N) * K);
    for (auto& v : a) v = __float2bfloat16(rng.uniform(-1.0f, 1.0f));
    for (auto& v : b) v = __float2bfloat16(rng.uniform(-1.0f, 1.0f));
    DeviceBuffer<bf16> d_a(a.size(), "a"), d_b(b.size(), "b"), d_out(size_t(M) * N, "out");
    d_a.upload(a);
    d_b.upload(b);
    std::vector<double> ref(size_t(M) * N), bound(size_t(M) * N);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const Product p = reference_at(a, b, K, i, j);
            ref[size_t(i) * N + j] = p.value;
            bound[size_t(i) * N + j] = bound_of(p.value, p.mag, K);
        }
    for (int v = 1; v <= kVersions; v++) {
        d_out.poison();
        version_fn(v)(d_out.ptr, d_a.ptr, d_b.ptr, M, N, K);
        cuda_check(cudaDeviceSynchronize());
        const std::vector<bf16> got = d_out.download();
        size_t bad = 0, worst = 0;
        double worst_ratio = 0;
        for (size_t e = 0; e < got.size(); e++) {
            const double g = __bfloat162float(got[e]), ratio = std::fabs(g - ref[e]) / bound[e];
            if (!std::isfinite(g) || ratio > 1) bad++;
            if (!std::isfinite(g) || ratio > worst_ratio) worst_ratio = std::isfinite(g) ? ratio : INFINITY, worst = e;
        }
        printf("  v%d %-22s M %5d N %5d K %5d  %s worst err/bound %.3f at [%zu] (%zu/%zu bad)\n", v, version_name(v), M, N, K,
               bad ? "FAIL" : "ok  ", worst_ratio, worst, bad, got.size());
        tests.record(bad == 0);
    }
}

// A benchmark shape: sampled elements against the CPU reference, the whole output against cuBLAS's.
void check_large(TestCounter& tests, const char* name, const bf16* d_a, const bf16* d_b, int M, int N, int K, Rng& rng) {
    const size_t count = size_t(M) * N;
    DeviceBuffer<bf16> d_ours(count, "ours"), d_theirs(count, "cuBLAS");
    d_theirs.poison();
    gemm_cublas(d_theirs.ptr, d_a, d_b, M, N, K);
    std::vector<bf16> a(size_t(M) * K), b(size_t(N) * K);
    cuda_check(cudaMemcpy(a.data(), d_a, a.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
    cuda_check(cudaMemcpy(b.data(), d_b, b.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
    const std::vector<bf16> theirs = d_theirs.download();
    // Sampled: 4096 random elements plus elements of the first and last row and column.
    std::vector<std::pair<int, int>> at;
    for (int s = 0; s < 4096; s++) at.push_back({int(rng.next() % M), int(rng.next() % N)});
    for (int j = 0; j < N; j += std::min(kBN, std::max(1, N / 512))) at.push_back({0, j}), at.push_back({M - 1, j});
    for (int i = 0; i < M; i += std::min(kBM, std::max(1, M / 512))) at.push_back({i, 0}), at.push_back({i, N - 1});
    std::vector<Product> ref;
    for (auto [i, j] : at) ref.push_back(reference_at(a, b, K, i, j));
    for (int v = 2; v <= kVersions; v++) {
        d_ours.poison();
        version_fn(v)(d_ours.ptr, d_a, d_b, M, N, K);
        const std::vector<bf16> ours = d_ours.download();
        size_t bad_ref = 0, bad_pair = 0, same = 0;
        double worst_ref = 0, worst_pair = 0;
        for (size_t s = 0; s < at.size(); s++) {
            const double g = __bfloat162float(ours[size_t(at[s].first) * N + at[s].second]);
            const double r = std::fabs(g - ref[s].value) / bound_of(ref[s].value, ref[s].mag, K);
            if (!std::isfinite(g) || r > 1) bad_ref++;
            worst_ref = std::max(worst_ref, std::isfinite(g) ? r : INFINITY);
        }
        // Against cuBLAS everywhere: each side within its bound of the exact value, so |ours - theirs|
        // <= 2 (4 K 2^-24 sum|a b| + 1e-7) + 2^-8 (|ours| + |theirs|); inputs in [-1, 1) make sum|a b| <= K.
        const double accumulation = 2.0 * (4.0 * K * std::ldexp(1.0, -24) * K + 1e-7);
        for (size_t e = 0; e < count; e++) {
            const double g = __bfloat162float(ours[e]), t = __bfloat162float(theirs[e]);
            const double bound = accumulation + std::ldexp(1.0, -8) * (std::fabs(g) + std::fabs(t));
            const double r = std::fabs(g - t) / bound;
            if (!std::isfinite(g) || !std::isfinite(t) || r > 1) bad_pair++;
            worst_pair = std::max(worst_pair, std::isfinite(g) && std::isfinite(t) ? r : INFINITY);
            same += memcmp(&ours[e], &theirs[e], sizeof(bf16)) == 0;
        }
        printf("  v%d %-8s M %5d N %5d K %5d  %s sampled vs CPU: worst err/bound %.3f (%zu/%zu bad); vs cuBLAS: worst %.3f "
               "(%zu/%zu bad), %.1f%% the same bits\n",
               v, name, M, N, K, bad_ref || bad_pair ? "FAIL" : "ok  ", worst_ref, bad_ref, at.size(), worst_pair, bad_pair, count,
               100.0 * same / count);
        tests.record(bad_ref == 0);
        tests.record(bad_pair == 0);
    }
}

struct BenchShape {
    const char* name;
    int M, N, K;
    bool gpt2;  // one of d12's GEMMs (summed), else the reference shape
};

// Contestants timed in turn: each runs once first (cuBLASLt's tuning), then kRounds rounds, in each
// every contestant 1 warm-up and kCallsPerRound timed calls, the order rotating, so a GPU warming up
// under its power cap slows them alike; a profiler started off (`ncu --profile-from-start off`) sees
// only the timed calls. Returns each contestant's median over its kRounds x kCallsPerRound calls.
constexpr int kRounds = 5, kCallsPerRound = 4;
std::vector<float> medians_in_turn(const std::vector<std::function<void()>>& runs) {
    for (const auto& run : runs) run();
    std::vector<std::vector<float>> samples(runs.size());
    cuda_check(cudaProfilerStart());
    for (int round = 0; round < kRounds; round++)
        for (size_t i = 0; i < runs.size(); i++) {
            const size_t k = (i + round) % runs.size();
            const std::vector<float> ms = time_each_ms(runs[k], 1, kCallsPerRound);
            samples[k].insert(samples[k].end(), ms.begin(), ms.end());
        }
    cuda_check(cudaProfilerStop());
    std::vector<float> medians;
    for (auto& t : samples) {
        std::sort(t.begin(), t.end());
        medians.push_back(t[t.size() / 2]);
    }
    return medians;
}

// ---------------------------------------------------------------------------------------------
// Version 13, the LM head's input gradient with the classifier's gradient folded in: dx (M, C) =
// dlogits W with dlogits = softmax_grad(logits) (SoftmaxGrad), where training today writes dlogits
// over the logits in a pass of its own (classifier.cuh: 2.2 ms for 32768 rows on an H100) and then
// runs the GEMM on it. Here the GEMM reads the logits and forms each slice of dlogits in shared memory
// before its products (version 11's kernel; b = W^T, (C, Vp), K-major). Checks: the dlogits pass
// against float64; the fused output bit for bit against version 11 on that pass's output (the same
// values in the same order), and sampled against float64 from the logits.
__global__ void softmax_grad_pass_kernel(bf16* out, const bf16* logits, SoftmaxGrad sg, int M, int Vp) {
    const size_t chunks = size_t(M) * Vp / 8;  // 8 values (16 bytes) a thread; Vp % 8 == 0
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < chunks; i += size_t(gridDim.x) * blockDim.x) {
        const int row = int(i * 8 / Vp), v0 = int(i * 8 % Vp);
        const float lse_log2 = sg.lse[row] * 1.4426950408889634f;
        const int target = sg.targets[row];
        uint4 chunk = reinterpret_cast<const uint4*>(logits)[i];
        __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&chunk);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 x = __bfloat1622float2(h[e]);
            h[e] = __floats2bfloat162_rn(softmax_grad(x.x, lse_log2, v0 + 2 * e, target, sg),
                                         softmax_grad(x.y, lse_log2, v0 + 2 * e + 1, target, sg));
        }
        reinterpret_cast<uint4*>(out)[i] = chunk;
    }
}
void softmax_grad_pass(bf16* out, const bf16* logits, const SoftmaxGrad& sg, int M, int Vp) {
    softmax_grad_pass_kernel<<<132 * 8, 256>>>(out, logits, sg, M, Vp);
    cuda_check_launch();
}

double softmax_grad_reference(double logit, double lse, int v, int target, const SoftmaxGrad& sg, double& exp_part) {
    exp_part = v < sg.V ? std::exp(logit - lse) * sg.dloss : 0.0;
    return v >= sg.V ? 0.0 : (std::exp(logit - lse) - (v == target ? 1.0 : 0.0)) * sg.dloss;
}

// M rows of logits (Vp columns, the first V real), W^T (C, Vp); validate and/or time.
void classifier_backward(TestCounter& tests, int M, int C, int V, int Vp, bool validate, bool timing, Rng& rng) {
    DeviceBuffer<bf16> d_logits(size_t(M) * Vp, "logits"), d_wt(size_t(C) * Vp, "W^T"), d_dlogits(size_t(M) * Vp, "dlogits");
    DeviceBuffer<bf16> d_fused(size_t(M) * C, "dx fused"), d_unfused(size_t(M) * C, "dx unfused");
    DeviceBuffer<float> d_lse(M, "lse");
    DeviceBuffer<int> d_targets(M, "targets");
    fill_random_kernel<<<1024, 256>>>(d_logits.ptr, size_t(M) * Vp, rng.next());  // logits in [-1, 1)
    fill_random_kernel<<<1024, 256>>>(d_wt.ptr, size_t(C) * Vp, rng.next());
    cuda_check_launch();
    std::vector<float> lse(M);
    std::vector<int> targets(M);
    for (int i = 0; i < M; i++) lse[i] = std::log(float(V)) + rng.uniform(0.0f, 1.0f), targets[i] = int(rng.next() % V);  // p ~ 1/V, as trained
    cuda_check(cudaMemcpy(d_lse.ptr, lse.data(), M * sizeof(float), cudaMemcpyHostToDevice));
    cuda_check(cudaMemcpy(d_targets.ptr, targets.data(), M * sizeof(int), cudaMemcpyHostToDevice));
    const SoftmaxGrad sg{d_lse.ptr, d_targets.ptr, 1.0f / 65536, V};  // dloss = 1 / (B T) at B = 64
    auto unfused_cublas = [&] { softmax_grad_pass(d_dlogits.ptr, d_logits.ptr, sg, M, Vp); gemm_cublas(d_unfused.ptr, d_dlogits.ptr, d_wt.ptr, M, C, Vp); };
    auto unfused_ours = [&] { softmax_grad_pass(d_dlogits.ptr, d_logits.ptr, sg, M, Vp); version_fn(11)(d_unfused.ptr, d_dlogits.ptr, d_wt.ptr, M, C, Vp); };
    auto fused = [&] { gemm_softmax_grad_fused(d_fused.ptr, d_logits.ptr, d_wt.ptr, M, C, Vp, sg); };
    if (validate) {
        d_dlogits.poison();
        d_fused.poison();
        d_unfused.poison();
        unfused_ours();
        fused();
        const std::vector<bf16> logits = d_logits.download(), wt = d_wt.download(), dlogits = d_dlogits.download();
        const std::vector<bf16> got = d_fused.download(), pair = d_unfused.download();
        // The pass: |got - ref| <= 2^-8 |ref| (bf16 rounding) + 2^-18 e^(x - lse) dloss (ex2.approx and the
        // fp32 argument, ~2^-21 each); the padding exactly 0. Sampled rows, every column.
        size_t bad_pass = 0, checked = 0;
        double worst_pass = 0;
        for (int s = 0; s < 16; s++) {
            const int row = s == 0 ? 0 : s == 1 ? M - 1 : int(rng.next() % M);
            for (int v = 0; v < Vp; v++) {
                double e;
                const double ref = softmax_grad_reference(__bfloat162float(logits[size_t(row) * Vp + v]), lse[row], v, targets[row], sg, e);
                const double g = __bfloat162float(dlogits[size_t(row) * Vp + v]);
                const double r = v >= V ? (g == 0.0 ? 0.0 : INFINITY) : std::fabs(g - ref) / (std::ldexp(std::fabs(ref), -8) + std::ldexp(e, -18) + 1e-30);
                if (!(r <= 1)) bad_pass++;
                worst_pass = std::max(worst_pass, std::isfinite(r) ? r : INFINITY);
                checked++;
            }
        }
        size_t differ = 0;
        for (size_t e = 0; e < got.size(); e++) differ += memcmp(&got[e], &pair[e], sizeof(bf16)) != 0 || !std::isfinite(__bfloat162float(got[e]));
        // The fused output against float64 from the logits: sum_v dlogits W^T with each term's dlogits
        // error as above, the fp32 accumulation (4 K 2^-24 sum|p w|) and the output's bf16 rounding.
        size_t bad_ref = 0;
        double worst_ref = 0;
        for (int s = 0; s < 256; s++) {
            const int row = s == 0 ? 0 : s == 1 ? M - 1 : int(rng.next() % M), col = s == 1 ? C - 1 : int(rng.next() % C);
            double ref = 0, mag = 0, pass_err = 0;
            for (int v = 0; v < Vp; v++) {
                double e;
                const double p = softmax_grad_reference(__bfloat162float(logits[size_t(row) * Vp + v]), lse[row], v, targets[row], sg, e);
                const double w = __bfloat162float(wt[size_t(col) * Vp + v]);
                ref += p * w, mag += std::fabs(p * w), pass_err += std::fabs(w) * (std::ldexp(std::fabs(p), -8) + std::ldexp(e, -18));
            }
            const double g = __bfloat162float(got[size_t(row) * C + col]);
            const double bound = pass_err + 4.0 * Vp * std::ldexp(1.0, -24) * mag + std::ldexp(std::fabs(ref), -8) + 1e-30;
            const double r = std::fabs(g - ref) / bound;
            if (!(r <= 1)) bad_ref++;
            worst_ref = std::max(worst_ref, std::isfinite(r) ? r : INFINITY);
        }
        printf("  v13 dx = dlogits W  M %5d C %4d V %5d Vp %5d  %s dlogits pass vs CPU: worst err/bound %.3f (%zu/%zu bad); "
               "fused vs v11 on that pass: %zu/%zu elements differ; fused vs CPU: worst err/bound %.3f (%zu/256 bad)\n",
               M, C, V, Vp, bad_pass || differ || bad_ref ? "FAIL" : "ok  ", worst_pass, bad_pass, checked, differ, got.size(),
               worst_ref, bad_ref);
        tests.record(bad_pass == 0);
        tests.record(differ == 0);
        tests.record(bad_ref == 0);
    }
    if (!timing) return;
    const char* names[] = {"dlogits pass", "cuBLAS GEMM on dlogits", "pass + cuBLAS", "pass + v11", "v13 fused"};
    const std::vector<float> ms = medians_in_turn({[&] { softmax_grad_pass(d_dlogits.ptr, d_logits.ptr, sg, M, Vp); },
                                                   [&] { gemm_cublas(d_unfused.ptr, d_dlogits.ptr, d_wt.ptr, M, C, Vp); },
                                                   unfused_cublas, unfused_ours, fused});
    const double copy_gbs = measure_copy_bandwidth_gbs();
    printf("\nLM head's dx with the classifier's gradient (M %d, C %d, Vp %d; median of %d calls, in turn), ms:\n", M, C, Vp,
           kRounds * kCallsPerRound);
    for (size_t k = 0; k < ms.size(); k++) printf("  %-24s %8.4f\n", names[k], ms[k]);
    printf("  (a pass over the logits at this run's copy bandwidth, %.0f GB/s, reading and writing %.2f GB: %.4f ms)\n", copy_gbs,
           4.0 * M * Vp / 1e9, 4.0 * M * Vp / (copy_gbs * 1e9) * 1e3);
}

// ---------------------------------------------------------------------------------------------
// Version 14, the header lm_head.cuh: the LM head's forward and the classifier without a pass over
// the logits. Its GEMM is version 11's kernel with an epilogue writing E = exp(logit - target logit)
// and each row's sums of E by column tile (hidden behind the other consumer's products); small kernels
// make the target logits before it and the losses, the row scales and the target column's E - S after.
// Checked against float64 on sampled rows: E at every column (the padding exactly 0, the target column
// E - S), the loss and the scale; x's rows are scaled so that most rows' losses are ~10-35, and every
// 97th row (from row 1) is scaled up with its target the row's smallest logit, so that its loss is
// far beyond the 44 the header takes (~100 and more): each of those rows must come out as NaN.
void exp_head_check(TestCounter& tests, int M, int Vp, int C, int V, bool validate, bool timing, Rng& rng) {
    const int tiles = lm_head_tiles(Vp);
    const float dloss = 1.0f / 65536;
    DeviceBuffer<bf16> d_x(size_t(M) * C, "x"), d_w(size_t(Vp) * C, "W"), d_out(size_t(M) * Vp, "E");
    DeviceBuffer<float> d_sums(size_t(M) * tiles, "tile sums"), d_losses(M, "losses"), d_scale(M, "scales"),
        d_shift(M, "target logits");
    DeviceBuffer<int> d_targets(M, "targets");
    fill_random_kernel<<<1024, 256>>>(d_x.ptr, size_t(M) * C, rng.next());
    fill_random_kernel<<<1024, 256>>>(d_w.ptr, size_t(Vp) * C, rng.next());
    cuda_check_launch();
    {
        std::vector<float> row_scale(M);
        for (int r = 0; r < M; r++) row_scale[r] = (r % 97 == 1 ? 2.0f : 0.5f) * std::sqrt(768.0f / C);
        cuda_check(cudaMemcpy(d_scale.ptr, row_scale.data(), M * sizeof(float), cudaMemcpyHostToDevice));
        lm_head_scale_rows(d_x.ptr, d_x.ptr, d_scale.ptr, M, C);
    }
    std::vector<int> targets(M);
    for (int& t : targets) t = int(rng.next() % V);
    std::vector<bf16> x, w;
    std::vector<std::pair<int, double>> refuse;  // (row, its S in float64) of the rows to be refused
    if (validate) {
        x = d_x.download(), w = d_w.download();
        for (int row = 1; row < M; row += 97) {
            std::vector<double> logits(V);
            for (int v = 0; v < V; v++) logits[v] = reference_at(x, w, C, row, v).value;
            const int t = int(std::min_element(logits.begin(), logits.end()) - logits.begin());
            double S = 0;
            for (int v = 0; v < V; v++) S += std::exp(logits[v] - logits[t]);
            targets[row] = t;
            refuse.push_back({row, S});
        }
    }
    cuda_check(cudaMemcpy(d_targets.ptr, targets.data(), M * sizeof(int), cudaMemcpyHostToDevice));
    auto forward = [&] {
        lm_head_exp_forward(d_out.ptr, d_losses.ptr, d_scale.ptr, d_shift.ptr, d_sums.ptr, d_x.ptr, d_w.ptr, d_targets.ptr, M, C, V,
                            Vp, dloss);
    };
    if (validate) {
        d_out.poison();
        d_sums.poison();
        d_losses.poison();
        d_scale.poison();
        forward();
        const std::vector<bf16> e = d_out.download();
        const std::vector<float> losses = d_losses.download(), scale = d_scale.download();
        // A logit's error is the GEMM's (4 C 2^-24 sum|x w|), the target logit's the same: exp carries
        // both as a relative error, plus its fp32 argument's rounding (< 2^-17 for |logit - shift| <
        // 128) and ex2.approx's (~2^-22): 2^-16 in all; then E's bf16 rounding (2^-8). The GEMM's term
        // dominates at C = 768 (~0.01-0.03 in a logit, so 1-3% of E, several times E's own bf16
        // rounding): these checks catch wrong indexing, scaling or shifts, not a lost bit or two.
        size_t bad_e = 0, bad_row = 0, checked = 0, refused = 0;
        double worst_e = 0, worst_row = 0;
        const double kMax = std::ldexp(1.0, 64);
        auto score = [&](double r, size_t& bad, double& worst) {
            if (!(r <= 1)) bad++;
            worst = std::max(worst, std::isfinite(r) ? r : INFINITY);
        };
        for (const auto& [row, S] : refuse) {  // NaN loss and scale (E is not checked)
            if (S < 2 * kMax) continue;  // (not with these scales: S > e^100)
            refused++;
            score(std::isnan(losses[row]) && std::isnan(scale[row]) ? 0.0 : INFINITY, bad_row, worst_row);
        }
        const int rows[] = {0, M - 1, int(rng.next() % M), int(rng.next() % M), int(rng.next() % M), int(rng.next() % M),
                            int(rng.next() % M), int(rng.next() % M)};
        for (int row : rows) {
            if (row % 97 == 1) continue;  // a row refused above
            const int t = targets[row];
            const Product pt = reference_at(x, w, C, row, t);
            const double shift_err = 4.0 * C * std::ldexp(1.0, -24) * pt.mag;
            std::vector<double> ref(Vp), err(Vp);
            double S = 0, S_err = 0;
            for (int v = 0; v < V; v++) {
                const Product p = reference_at(x, w, C, row, v);
                ref[v] = std::exp(p.value - pt.value);
                err[v] = ref[v] * (1.01 * (4.0 * C * std::ldexp(1.0, -24) * p.mag + shift_err) + std::ldexp(1.0, -16));
                S += ref[v], S_err += err[v];
            }
            S_err += 128.0 * std::ldexp(1.0, -24) * S;  // fp32 sums of <= 128 terms deep
            if (S + S_err > kMax) {  // a random target can be refused too (losses of ~10-35 make it rare)
                if (S - S_err > kMax) score(std::isnan(losses[row]) && std::isnan(scale[row]) ? 0.0 : INFINITY, bad_row, worst_row);
                continue;
            }
            for (int v = 0; v < Vp; v++) {
                const double g = __bfloat162float(e[size_t(row) * Vp + v]);
                double r;
                if (v >= V) r = g == 0.0 ? 0.0 : INFINITY;
                else if (v == t)  // E - S from E's bf16 value: both roundings, and S's error
                    r = std::fabs(g - (ref[v] - S)) / (std::ldexp(1.0, -8) * (ref[v] + std::fabs(ref[v] - S)) + err[v] + S_err);
                else r = std::fabs(g - ref[v]) / (std::ldexp(1.0, -8) * ref[v] + err[v] + 1e-30);
                score(r, bad_e, worst_e);
                checked++;
            }
            // The loss (log S: S's relative error and logf's few ulps) and the scale dloss / S.
            score(std::fabs(losses[row] - std::log(S)) / (S_err / S + 1e-6 * std::fabs(std::log(S)) + 1e-6), bad_row, worst_row);
            score(std::fabs(scale[row] - dloss / S) / ((dloss / S) * (S_err / S + 1e-6)), bad_row, worst_row);
        }
        printf("  v14 exp head        M %5d Vp %5d C %4d V %5d  %s E vs CPU: worst err/bound %.3f (%zu/%zu bad); losses and "
               "scales: worst err/bound %.3f (%zu bad; %zu rows past the bound checked for NaN)\n",
               M, Vp, C, V, bad_e || bad_row || !refused ? "FAIL" : "ok  ", worst_e, bad_e, checked, worst_row, bad_row, refused);
        tests.record(bad_e == 0 && checked > 0);
        tests.record(bad_row == 0 && refused > 0);
    }
    if (!timing) return;
    DeviceBuffer<bf16> d_logits(size_t(M) * Vp, "logits"), d_xs(size_t(M) * C, "scaled x");
    const char* names[] = {"cuBLAS GEMM (logits)", "classifier pass", "cuBLAS + classifier", "v11 GEMM (logits)",
                           "v14 exp head", "v14 + its 2 row scalings"};
    const std::vector<float> ms = medians_in_turn({[&] { gemm_cublas(d_logits.ptr, d_x.ptr, d_w.ptr, M, Vp, C); },
                                                   [&] { fused_classifier(d_logits.ptr, d_losses.ptr, d_targets.ptr, dloss, M, V, Vp); },
                                                   [&] {
                                                       gemm_cublas(d_logits.ptr, d_x.ptr, d_w.ptr, M, Vp, C);
                                                       fused_classifier(d_logits.ptr, d_losses.ptr, d_targets.ptr, dloss, M, V, Vp);
                                                   },
                                                   [&] { version_fn(11)(d_logits.ptr, d_x.ptr, d_w.ptr, M, Vp, C); }, forward,
                                                   [&] {
                                                       forward();
                                                       lm_head_scale_rows(d_xs.ptr, d_x.ptr, d_scale.ptr, M, C);
                                                       lm_head_scale_rows(d_xs.ptr, d_xs.ptr, d_scale.ptr, M, C);
                                                   }});
    printf("\nLM head's forward and loss (M %d, Vp %d, C %d; median of %d calls, in turn), ms:\n", M, Vp, C, kRounds * kCallsPerRound);
    for (size_t k = 0; k < ms.size(); k++) printf("  %-24s %8.4f\n", names[k], ms[k]);
}

// The persistent loop's tile order (tile_origin, run here on the CPU): tiles 0 .. num_m num_n - 1 must
// name every (row unit, column tile) exactly once, inside the matrix, for any group size.
void check_tile_order(TestCounter& tests) {
    size_t cases = 0, bad = 0;
    for (int num_m : {1, 2, 3, 15, 16, 17, 33, 256, 257})
        for (int num_n : {1, 3, 9, 197})
            for (int group : {1, 2, 8, 16, 1000}) {
                std::vector<int> seen(size_t(num_m) * num_n, 0);
                bool ok = true;
                for (int t = 0; t < num_m * num_n; t++) {
                    int m0, n0;
                    tile_origin(t, num_m, num_n, std::min(group, num_m), kBM, kBN, m0, n0);
                    const int m = m0 / kBM, n = n0 / kBN;
                    if (m0 % kBM || n0 % kBN || m < 0 || m >= num_m || n < 0 || n >= num_n) ok = false;
                    else seen[size_t(m) * num_n + n]++;
                }
                for (int c : seen) ok = ok && c == 1;
                cases++;
                bad += !ok;
            }
    printf("  tile order: every tile exactly once in %zu cases of rows x columns x group sizes  %s (%zu bad)\n", cases,
           bad ? "FAIL" : "ok  ", bad);
    tests.record(bad == 0);
}

void usage(FILE* f) {
    fprintf(f,
            "usage: matmul_wgmma [--check | --no-validate] [--rows R] [--group G] [--versions V,V..] [--shape NAME]\n"
            "  --check        validate at small shapes and the benchmark shapes (no timing)\n"
            "  --no-validate  benchmark only\n"
            "  --rows R       rows of the forward GEMMs (default 65536, with --check 8192; the LM head takes R / 2)\n"
            "  --group G      row tiles (pairs in 5-7, 9, 11-13) per group in the tile order of versions 2-13 (default 16)\n"
            "  --versions L   the GEMM table's versions, e.g. 1,5 (default: all, then versions 13 and 14 as well)\n"
            "  --shape NAME   benchmark only this shape (qkv, attproj, fc, fcproj, lmhead, 8192^3; lmhead-dx: version 13;\n"
            "                 lmhead-exp: version 14),\n"
            "                 e.g. under a profiler\n");
}

int main(int argc, char** argv) {
    bool check_only = false, validate = true, run_version[kVersions + 1];
    std::fill(std::begin(run_version), std::end(run_version), true);
    std::string only_shape;
    bool versions_given = false;
    int rows = 0;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "-h" || a == "--help") return usage(stdout), 0;
        else if (a == "--check") check_only = true;
        else if (a == "--no-validate") validate = false;
        else if (a == "--rows") rows = parse_int(flag_value(argc, argv, i, usage), "--rows", 2, usage);
        else if (a == "--group") g_group = parse_int(flag_value(argc, argv, i, usage), "--group", 1, usage);
        else if (a == "--versions") {
            std::fill(std::begin(run_version), std::end(run_version), false);
            std::stringstream list(flag_value(argc, argv, i, usage));
            for (std::string v; std::getline(list, v, ',');) {
                const int version = parse_int(v.c_str(), "--versions", 1, usage);
                if (version > kVersions)
                    fail("--versions: no version %d in the GEMM table (1..%d; 13 and 14 run with --shape lmhead-dx, lmhead-exp)",
                         version, kVersions);
                run_version[version] = true;
            }
            if (std::none_of(std::begin(run_version), std::end(run_version), [](bool b) { return b; })) {
                usage(stderr);
                fail("--versions needs at least one version");
            }
            versions_given = true;
        } else if (a == "--shape") only_shape = flag_value(argc, argv, i, usage);
        else {
            usage(stderr);
            fail("unknown argument '%s'", argv[i]);
        }
    }
    if (check_only && !validate) {
        usage(stderr);
        fail("--check and --no-validate exclude each other");
    }
    if (!rows) rows = check_only ? 8192 : 65536;  // --check: every shape's N and K, fewer rows
    const BenchShape shapes[] = {{"qkv", rows, 2304, 768, true},    {"attproj", rows, 768, 768, true},
                                 {"fc", rows, 3072, 768, true},     {"fcproj", rows, 768, 3072, true},
                                 {"lmhead", rows / 2, 50304, 768, true}, {"8192^3", 8192, 8192, 8192, false}};
    // Versions 13 and 14 have benchmarks of their own.
    const bool only_13 = only_shape == "lmhead-dx", only_14 = only_shape == "lmhead-exp", gemm_table = !only_13 && !only_14;
    const bool everything = only_shape.empty() && !versions_given;  // versions 13 and 14 run unless the GEMM table is narrowed
    const bool classifier = everything || only_13, exp_forward = everything || only_14;
    if (!only_shape.empty() && gemm_table &&
        std::none_of(std::begin(shapes), std::end(shapes), [&](const BenchShape& s) { return only_shape == s.name; }))
        fail("--shape: no benchmark shape is called '%s'", only_shape.c_str());
    const auto skipped = [&](const BenchShape& s) { return !only_shape.empty() && only_shape != s.name; };
    TestCounter tests;
    check_tile_order(tests);  // host code: runs everywhere
    if (!cuda_device_available()) {
        tests.skip("matmul_wgmma validation");
        return tests.finish();
    }
    if (!wgmma_available()) {  // wgmma and the TMA are Hopper's
        printf("matmul_wgmma validation: skipped (needs a compute capability 9.0 GPU)\n");
        tests.skipped++;
        return tests.finish();
    }
    blas_init(size_t(rows));
    Rng rng(1234);
    if (validate) printf("validation, small shapes (every element against the CPU reference):\n");
    // The last: more tiles than blocks (each block runs several, in groups whose last is short).
    const int small[][3] = {{1, 8, 64},     {100, 72, 64},   {128, 256, 64},   {129, 264, 128}, {300, 520, 192},
                            {257, 1000, 768}, {64, 2304, 72}, {1000, 768, 3072}, {77, 504, 200}, {513, 776, 1600},
                            {2200, 2056, 200}};
    if (validate)
        for (auto& s : small) check_small(tests, s[0], s[1], s[2], rng);

    size_t max_a = 0, max_b = 0, max_out = 0;
    for (auto& s : shapes) {
        max_a = std::max(max_a, size_t(s.M) * s.K);
        max_b = std::max(max_b, size_t(s.N) * s.K);
        max_out = std::max(max_out, size_t(s.M) * s.N);
    }
    DeviceBuffer<bf16> d_a(max_a, "a"), d_b(max_b, "b");
    if (validate) printf("\nvalidation, benchmark shapes:\n");
    for (auto& s : shapes) {
        if (!validate) break;
        if (skipped(s)) continue;
        fill_random_kernel<<<1024, 256>>>(d_a.ptr, size_t(s.M) * s.K, rng.next());
        fill_random_kernel<<<1024, 256>>>(d_b.ptr, size_t(s.N) * s.K, rng.next());
        cuda_check_launch();
        check_large(tests, s.name, d_a.ptr, d_b.ptr, s.M, s.N, s.K, rng);
    }
    if (validate && classifier) {
        printf("\nvalidation, version 13 (the LM head's dx from the logits):\n");
        classifier_backward(tests, 300, 776, 1000, 1024, true, false, rng);  // rows and columns not multiples of the tiles
        if (check_only) classifier_backward(tests, rows / 2, 768, 50257, 50304, true, false, rng);
    }
    if (validate && exp_forward) {
        printf("\nvalidation, version 14 (lm_head.cuh: exp(logits), row sums, losses, scales, dlogits):\n");
        exp_head_check(tests, 300, 1000, 200, 995, true, false, rng);  // V inside the last column tile
        exp_head_check(tests, rows / 2, 50304, 768, 50257, true, false, rng);
    }
    if (check_only || tests.failed) return tests.finish();
    if (!gemm_table) {
        if (only_13) classifier_backward(tests, rows / 2, 768, 50257, 50304, validate, true, rng);
        if (only_14) exp_head_check(tests, rows / 2, 50304, 768, 50257, false, true, rng);
        return tests.finish();
    }

    // The versions take turns (medians_in_turn).
    printf("\nbenchmark: median of %d runs (%d rounds, the versions in turn), ms (TFLOP/s = 2 M N K / time), random "
           "operands in [-1, 1)\n", kRounds * kCallsPerRound, kRounds);
    printf("%-8s %6s %6s %6s", "shape", "M", "N", "K");
    std::vector<int> versions;
    for (int v = 1; v <= kVersions; v++)
        if (run_version[v]) {
            versions.push_back(v);
            printf("  %33s", ("v" + std::to_string(v) + " " + version_name(v)).c_str());
        }
    printf("\n");
    DeviceBuffer<bf16> d_out(max_out, "out");
    double sum[kVersions + 1] = {};
    bool all_gpt2_shapes = true;
    for (auto& s : shapes) {
        const uint64_t seed_a = rng.next(), seed_b = rng.next();  // drawn for every shape: the same operands under --shape
        if (skipped(s)) {
            all_gpt2_shapes = all_gpt2_shapes && !s.gpt2;
            continue;
        }
        fill_random_kernel<<<1024, 256>>>(d_a.ptr, size_t(s.M) * s.K, seed_a);
        fill_random_kernel<<<1024, 256>>>(d_b.ptr, size_t(s.N) * s.K, seed_b);
        cuda_check_launch();
        const double flops = 2.0 * s.M * s.N * s.K;
        printf("%-8s %6d %6d %6d", s.name, s.M, s.N, s.K);
        std::vector<std::function<void()>> runs;
        for (int v : versions) runs.push_back([&, v] { version_fn(v)(d_out.ptr, d_a.ptr, d_b.ptr, s.M, s.N, s.K); });
        const std::vector<float> medians = medians_in_turn(runs);
        for (size_t i = 0; i < versions.size(); i++) {
            printf("  %24.4f (%6.1f)", medians[i], flops / medians[i] * 1e-9);
            if (s.gpt2) sum[versions[i]] += medians[i];
        }
        printf("\n");
    }
    if (all_gpt2_shapes) {
        printf("GPT-2 shapes summed, ms:");
        for (int v = 1; v <= kVersions; v++) {
            if (!run_version[v]) continue;
            printf(" v%d %.3f", v, sum[v]);
            if (run_version[1]) printf(" (%.3f of cuBLAS)", sum[v] / sum[1]);
        }
        printf("\n");
    }
    if (classifier) classifier_backward(tests, rows / 2, 768, 50257, 50304, validate, true, rng);
    if (exp_forward) exp_head_check(tests, rows / 2, 50304, 768, 50257, false, true, rng);
    return tests.finish();
}
