// flash_attention_lab.cuh: what the attention labs (dev/cuda/attention_forward.cu,
// attention_backward.cu) run beside the header's kernels (flash_attention.cuh):
//   - forward_tc, forward_wgmma, backward_tc: the header's kernels in any configuration (the header
//     launches only training's), the lab's versions 4-8 and 10-12 (forward), 4-10 (backward).
//   - backward_dkdv_wgmma_early_dv_kernel: the backward's wgmma key-side kernel as the lab's versions
//     12 and 13 ran it, before training's kernel (backward_dkdv_wgmma_kernel, the lab's version 14)
//     issued dv's product late.
//   - backward_fused_wgmma_kernel: the backward in one kernel without dS in memory (the lab's version
//     15): warp-specialized (TMA loader, a dq warp, a consumer warpgroup), dq summed in L2 in a fixed order.
//
// The early dv: dv += P^T dO is issued while dS is computed, right after P^T; training's kernel
// issues it together with dk's product, after dS. At 168 registers (MIN_BLOCKS 3, version 13) the
// early dv runs out of registers: ptxas serializes every wgmma (its warning C7512 names this kernel)
// and spills 16 bytes; MIN_BLOCKS 2 (version 12) leaves it 170 registers, 2 warpgroups per SM. The
// products are the same, in the same order, so versions 12, 13 and 14 give the same bits: the lab
// checks 14 against 13 bit for bit.
#pragma once

#include "common.cuh"
#include "flash_attention.cuh"

namespace flash_lab {

using namespace flash_detail;

// ---------------------------------------------------------------------------------------------
// The header's kernels in other configurations; each false where HS has no such path.

// forward_kernel: WARPS warps x MT 16-row tiles, key tiles of BC.
template <int WARPS, int MT, int BC>
bool forward_tc(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int HS, cudaStream_t stream) {
    switch (HS) {
        case 64: launch_forward<64, WARPS, MT, BC>(out, lse, qkv, B, T, NH, stream); return true;
        case 80: launch_forward<80, WARPS, MT, BC>(out, lse, qkv, B, T, NH, stream); return true;
        case 128: launch_forward<128, WARPS, MT, BC>(out, lse, qkv, B, T, NH, stream); return true;
        default: return false;
    }
}

// forward_wgmma_kernel: NWG warpgroups a block, key tiles of BC (HS 64 on an sm_90 GPU only).
template <int NWG, int BC>
bool forward_wgmma(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int HS, cudaStream_t stream) {
    if (HS != 64 || !wgmma_available()) return false;
    launch_forward_wgmma<NWG, BC>(out, lse, qkv, B, T, NH, stream);
    return true;
}

// Key-side kernel: WK warps x MK 16-key tiles, query tiles of BQ; query-side kernel: WQ warps x MQ
// 16-query tiles, key tiles of BK. KMIN / QMIN: blocks per SM each kernel's registers must allow.
// ds (nullptr: recompute): room for the dS tiles; the key side stores them and
// backward_dq_from_ds_kernel replaces the query side (configurations with kDsTile-key blocks and
// kDsTile-query tiles only).
template <int HS, int WK, int MK, int BQ, int WQ, int MQ, int BK, int KMIN, int QMIN>
void launch_backward_config(bf16* dqkv, float* D, uint4* ds, const bf16* dout, const bf16* out, const float* lse, const bf16* qkv,
                            int B, int T, int NH, cudaStream_t stream) {
    constexpr bool kCanStore = WK * MK * 16 == kDsTile && BQ == kDsTile;
    if (ds && !kCanStore) fail("flash attention backward: this configuration cannot store dS tiles");
    launch_backward_dot<HS>(D, dout, out, B, T, NH, stream);
    const float scale = 1.0f / sqrtf(float(HS));
    if constexpr (kCanStore) {
        if (ds) {
            launch_backward_dkdv<HS, WK, MK, BQ, KMIN, true>(dqkv, ds, dout, lse, D, qkv, B, T, NH, scale, stream);
            launch_backward_dq_from_ds<HS>(dqkv, ds, qkv, B, T, NH, scale, stream);
            return;
        }
    }
    launch_backward_dkdv<HS, WK, MK, BQ, KMIN, false>(dqkv, ds, dout, lse, D, qkv, B, T, NH, scale, stream);
    launch_backward_dq<HS, WQ, MQ, BK, QMIN>(dqkv, dout, lse, D, qkv, B, T, NH, scale, stream);
}
template <int WK, int MK, int BQ, int WQ, int MQ, int BK, int KMIN = 1, int QMIN = 1>
bool backward_tc(bf16* dqkv, float* D, const bf16* dout, const bf16* out, const float* lse, const bf16* qkv, int B, int T,
                 int NH, int HS, cudaStream_t stream, uint4* ds = nullptr) {
    switch (HS) {
        case 64: launch_backward_config<64, WK, MK, BQ, WQ, MQ, BK, KMIN, QMIN>(dqkv, D, ds, dout, out, lse, qkv, B, T, NH, stream); return true;
        case 80: launch_backward_config<80, WK, MK, BQ, WQ, MQ, BK, KMIN, QMIN>(dqkv, D, ds, dout, out, lse, qkv, B, T, NH, stream); return true;
        case 128: launch_backward_config<128, WK, MK, BQ, WQ, MQ, BK, KMIN, QMIN>(dqkv, D, ds, dout, out, lse, qkv, B, T, NH, stream); return true;
        default: return false;
    }
}

// ---------------------------------------------------------------------------------------------
// The wgmma key side with dv issued early (versions 12 and 13).

template <int MIN_BLOCKS>
__global__ void __launch_bounds__(128, MIN_BLOCKS)
    backward_dkdv_wgmma_early_dv_kernel(bf16* dqkv, uint4* ds, const bf16* dout, const float* lse, const float* Dsum,
                                        const bf16* qkv, int T, int NH, float scale) {
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
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) wgmma_m64n64k16_rs_mn(dv, pa[kk], o_desc_mn + kk * (16 * 128 / 16));
        wgmma_commit();

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
    __trap();  // built without sm_90a: backward_wgmma_early_dv never launches it (wgmma_available)
#endif
}

// The header's backward_wgmma with this key side; false where it does not run (HS != 64, no room for
// dS, or not an sm_90 GPU).
template <int MIN_BLOCKS>
bool backward_wgmma_early_dv(bf16* dqkv, float* D, uint4* ds, const bf16* dout, const bf16* out, const float* lse,
                             const bf16* qkv, int B, int T, int NH, int HS, cudaStream_t stream) {
    if (HS != 64 || !ds || !wgmma_available()) return false;
    launch_backward_dot<64>(D, dout, out, B, T, NH, stream);
    const float scale = 1.0f / 8.0f;
    const size_t smem = size_t(6 * 64 * 64) * sizeof(bf16) + 4 * 64 * sizeof(float) + 1024;
    static bool configured = false;
    if (!configured) allow_smem(backward_dkdv_wgmma_early_dv_kernel<MIN_BLOCKS>, smem), configured = true;
    backward_dkdv_wgmma_early_dv_kernel<MIN_BLOCKS>
        <<<dim3((T + 63) / 64, NH, B), 128, smem, stream>>>(dqkv, ds, dout, lse, D, qkv, T, NH, scale);
    cuda_check_launch();
    launch_backward_dq_from_ds<64>(dqkv, ds, qkv, B, T, NH, scale, stream);
    return true;
}


// ---------------------------------------------------------------------------------------------
// One kernel, no dS in memory: warp-specialized, dq summed in L2 in a fixed order (version 15).
//
// A block owns 64 keys of one (b, h), as backward_dkdv_wgmma_kernel does, with 256 threads in roles:
//   - warp 0 (loader): K and V once, then each query tile's q and dO by TMA (128-byte swizzled boxes,
//     the layout the descriptors describe) and its lse and D by plain loads (zero past T), into a ring
//     of STAGES stages; a full barrier per stage (the 32 lanes' arrivals and the TMA's bytes), an
//     empty barrier (the 128 consumer threads, after their last read of the stage).
//   - warpgroup 1 (consumer, 128 threads): backward_dkdv_wgmma_kernel's products in the same order on
//     the same operands (so dk and dv have its bits), then a fifth, dq's share dS k = (dS^T)^T k: dS^T
//     goes from the registers that feed dk's product to a swizzled shared tile (keys as rows; each
//     lane's bf16 pair is one 4-byte store, the 32 lanes on 32 banks), read with k by the tensor cores
//     with both operands MN-major. The 64 x 64 fp32 share goes to one of two shared buffers.
//   - warp 1 (dq): sums each share into dq. Tile qt's shares come from key blocks qt, qt - 1, ..., 0,
//     in that order: a counter per query tile says how many are in. Block kb waits for qt - kb, then
//     stores its share (kb = qt, the first: no memset) or adds it in L2 with the bulk reduce-add, and
//     after that has completed, counts itself in (release). The last, kb = 0, instead reads the sum
//     (L2), adds its share, and writes dq in bf16. Fixed order, so the same bits every run.
//   - warps 2, 3: nothing (they give their registers to the consumer).
// Why: the one-kernel backward tried before (docs/attention.md, 2026-11-23) added the shares in order
// from the products' own warps, and the waits and L2 round trips on their critical path cost ~0.37 ms;
// here they are a warp's, off it, with two buffers of slack. Without dS, its 0.86 GB written and read
// again (B=64 NH=12 T=1024) and the dq kernel are gone; the shares' adds move 16 KB a tile pair in L2.
// Blocks take tickets (an atomic counter) in the order they start: head by head, key blocks from the
// last to the first, so the block a dq warp waits for took an earlier ticket and is running or done
// (no wait for a block that is not resident; no deadlock).
// Registers: 2 blocks an SM (launch bounds: 128 a thread; shared memory ~90 KB a block at 2 stages);
// setmaxnreg moves them to the consumer (the sum stays 256). ptxas (-Xptxas -v): no spill at 72 / 184,
// spills in the dq warp's last-share loop below 72; the consumer fits in 160 (dq's product is issued
// after s and dP are dead), so 184 leaves it room.
constexpr int kDqRegsLoader = 72, kDqRegsConsumer = 184;

template <int STAGES> struct FusedBwdSmem {
    static constexpr int kTile = 64 * 64 * 2;  // bf16 64 x 64, 128-byte swizzled
    static constexpr int kK = 0, kV = kTile, kQ = 2 * kTile, kO = kQ + STAGES * kTile, kDs = kO + STAGES * kTile;
    static constexpr int kDq = kDs + kTile;  // 2 x 64 x 64 fp32
    static constexpr int kL = kDq + 2 * 64 * 64 * 4, kD = kL + STAGES * 64 * 4;
    static constexpr int kBars = kD + STAGES * 64 * 4;  // kv_full, q_full[STAGES], q_empty[STAGES], dq_full[2], dq_empty[2]
    static constexpr int kTicket = kBars + 8 * (1 + 2 * STAGES + 4);
    static constexpr int kBytes = kTicket + 16 + 1024;  // + room to align the base to 1024
};

template <int STAGES>
__global__ void __launch_bounds__(256, 2)
    backward_fused_wgmma_kernel(bf16* dqkv, float* dq_acc, int* counters, const __grid_constant__ CUtensorMap map_qkv,
                                const __grid_constant__ CUtensorMap map_dout, const float* lse, const float* Dsum, int B, int T,
                                int NH, float scale) {
#ifdef PTX_HAVE_SM90A
    using L = FusedBwdSmem<STAGES>;
    constexpr int HS = 64, BK = 64, BQ = 64, NT = BQ / 8, TILE = 64 * 64;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    bf16* sK = reinterpret_cast<bf16*>(smem + L::kK);
    bf16* sV = reinterpret_cast<bf16*>(smem + L::kV);
    bf16* sQ = reinterpret_cast<bf16*>(smem + L::kQ);    // STAGES x BQ x 64
    bf16* sO = reinterpret_cast<bf16*>(smem + L::kO);    // STAGES x BQ x 64 (dO)
    bf16* sDs = reinterpret_cast<bf16*>(smem + L::kDs);  // dS^T: BK keys x BQ queries
    float* sDq = reinterpret_cast<float*>(smem + L::kDq);  // 2 x 64 x 64, see dq_index
    float* sL = reinterpret_cast<float*>(smem + L::kL);    // STAGES x BQ (lse)
    float* sD = reinterpret_cast<float*>(smem + L::kD);    // STAGES x BQ (D)
    uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + L::kBars);
    uint64_t* q_full = kv_full + 1;
    uint64_t* q_empty = q_full + STAGES;
    uint64_t* dq_full = q_empty + STAGES;
    uint64_t* dq_empty = dq_full + 2;
    int* s_ticket = reinterpret_cast<int*>(smem + L::kTicket);

    const int n_qt = (T + BQ - 1) / BQ;  // = key blocks per head
    int* ticket = counters + size_t(B) * NH * n_qt;
    if (threadIdx.x == 0) {
        mbar_init(kv_full, 1);
        for (int s = 0; s < STAGES; s++) mbar_init(&q_full[s], 32), mbar_init(&q_empty[s], 128);
        for (int i = 0; i < 2; i++) mbar_init(&dq_full[i], 128), mbar_init(&dq_empty[i], 1);
        fence_mbarrier_init();
        *s_ticket = atomicAdd(ticket, 1);
    }
    __syncthreads();
    const int t = *s_ticket, bh = t / n_qt, kb = n_qt - 1 - t % n_qt, h = bh % NH, b = bh / NH;
    const int C = NH * HS, n_tiles = n_qt - kb;  // query tiles kb .. n_qt - 1
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    // dq tiles (fp32, in the shared buffers and in dq_acc alike): row r's 16-byte chunk j at chunk j ^ (r % 8),
    // so that the accumulator fragments' 8 rows per store land on different banks.
    auto dq_index = [](int r, int c) { return r * 64 + (((c >> 2) ^ (r & 7)) << 2) + (c & 3); };

    if (threadIdx.x < 128) {
        setmaxnreg_dec<kDqRegsLoader>();
        if (warp == 0) {
            const float* l_src = lse + size_t(bh) * T;
            const float* d_src = Dsum + size_t(bh) * T;
            if (lane == 0) {
                mbar_arrive_expect_tx(kv_full, 2 * TILE * 2);
                tma_load_2d(sK, &map_qkv, kv_full, C + h * HS, b * T + kb * BK);
                tma_load_2d(sV, &map_qkv, kv_full, 2 * C + h * HS, b * T + kb * BK);
            }
            for (int j = 0; j < n_tiles; j++) {
                const int st = j % STAGES, q0 = (kb + j) * BQ;
                mbar_wait(&q_empty[st], ((j / STAGES) & 1) ^ 1);  // a fresh barrier's "previous phase" counts as done
                for (int i = lane; i < BQ; i += 32) {
                    const bool in = q0 + i < T;
                    sL[st * BQ + i] = in ? l_src[q0 + i] : 0.0f;
                    sD[st * BQ + i] = in ? d_src[q0 + i] : 0.0f;
                }
                if (lane == 0) {
                    mbar_arrive_expect_tx(&q_full[st], 2 * TILE * 2);
                    // Rows past T are the next sequence's (or zeros past the tensor): finite, and masked (P = 0).
                    tma_load_2d(sQ + st * TILE, &map_qkv, &q_full[st], h * HS, b * T + q0);
                    tma_load_2d(sO + st * TILE, &map_dout, &q_full[st], h * HS, b * T + q0);
                } else {
                    mbar_arrive(&q_full[st]);
                }
            }
        } else if (warp == 1) {
            const size_t stride = 3 * size_t(C);
            for (int j = 0; j < n_tiles; j++) {
                const int qt = kb + j, buf = j & 1;
                const size_t tile = size_t(bh) * n_qt + qt;
                float* acc = dq_acc + tile * TILE;
                const float* mine = sDq + buf * TILE;
                mbar_wait(&dq_full[buf], (j >> 1) & 1);
                // Key blocks qt .. kb + 1 are in (j of them): each lane acquires the count itself.
                if (j > 0)
                    while (ld_acquire_gpu(counters + tile) != j) {
                    }
                if (kb > 0) {
                    if (lane == 0) {
                        fence_proxy_async_global();
                        if (j == 0) bulk_store_1d(acc, mine, TILE * 4);
                        else bulk_reduce_add_f32(acc, mine, TILE * 4);
                        bulk_commit();
                        bulk_wait_read();
                        mbar_arrive(&dq_empty[buf]);
                        bulk_wait();
                        fence_proxy_async_global();
                        red_release_gpu_add(counters + tile, 1);
                    }
                    __syncwarp();
                } else {
                    // The last share: dq = scale (sum so far + this share), rows < T. Lanes 0-15 and 16-31
                    // take alternate rows, each lane one 16-byte chunk (4 values) of a row, kRowsAhead loads
                    // in flight.
                    constexpr int kRowsAhead = 4;
                    const int pj = lane & 15;
                    for (int r0 = 0; r0 < BQ; r0 += 2 * kRowsAhead) {
                        float4 prior[kRowsAhead];
#pragma unroll
                        for (int i = 0; i < kRowsAhead; i++)
                            prior[i] = j > 0 ? __ldcg(reinterpret_cast<const float4*>(acc + (r0 + 2 * i + lane / 16) * 64 + pj * 4))
                                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                        for (int i = 0; i < kRowsAhead; i++) {
                            const int r = r0 + 2 * i + lane / 16, row = qt * BQ + r;
                            const float4 m = *reinterpret_cast<const float4*>(mine + r * 64 + pj * 4);
                            if (row >= T) continue;
                            const __nv_bfloat162 lo = __floats2bfloat162_rn((prior[i].x + m.x) * scale, (prior[i].y + m.y) * scale);
                            const __nv_bfloat162 hi = __floats2bfloat162_rn((prior[i].z + m.z) * scale, (prior[i].w + m.w) * scale);
                            uint2 v;
                            v.x = *reinterpret_cast<const uint32_t*>(&lo), v.y = *reinterpret_cast<const uint32_t*>(&hi);
                            *reinterpret_cast<uint2*>(dqkv + (size_t(b) * T + row) * stride + h * HS + 4 * (pj ^ (r & 7))) = v;
                        }
                    }
                    __syncwarp();
                    if (lane == 0) mbar_arrive(&dq_empty[buf]);
                }
            }
        }
        return;
    }

    setmaxnreg_inc<kDqRegsConsumer>();
    const int g = lane / 4, c4 = lane % 4, wk0 = kb * BK + warp * 16;  // this warp's first key
    const float sl2 = scale * kLog2e;
    const uint64_t k_desc = sw128_desc(sK, 16, 1024), v_desc = sw128_desc(sV, 16, 1024);
    const uint64_t k_desc_mn = sw128_desc(sK, BK * 128, 1024), ds_desc_mn = sw128_desc(sDs, BQ * 128, 1024);
    float dk[HS / 2], dv[HS / 2];
#pragma unroll
    for (int i = 0; i < HS / 2; i++) dk[i] = dv[i] = 0.0f;
    mbar_wait(kv_full, 0);

    for (int j = 0; j < n_tiles; j++) {
        const int st = j % STAGES, q0 = (kb + j) * BQ;
        mbar_wait(&q_full[st], (j / STAGES) & 1);
        const uint64_t q_desc = sw128_desc(sQ + st * TILE, 16, 1024), o_desc = sw128_desc(sO + st * TILE, 16, 1024);
        const uint64_t q_desc_mn = sw128_desc(sQ + st * TILE, BQ * 128, 1024), o_desc_mn = sw128_desc(sO + st * TILE, BQ * 128, 1024);
        const float* cL = sL + st * BQ;
        const float* cD = sD + st * BQ;

        // From here to the dk/dv products: backward_dkdv_wgmma_kernel's code.
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
        uint32_t pa[BQ / 16][4], pb[BQ / 16][4];
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) pack8_bf16(pa[kk], s + 8 * kk);
        wgmma_wait<0>();
        keep_regs(dp);

#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) dp[4 * nt + e] = s[4 * nt + e] * (dp[4 * nt + e] - cD[nt * 8 + 2 * c4 + (e & 1)]);
        // dS^T into shared memory for dq's product: pb[kk][i] holds key g + 8 (i % 2) (of this warp's 16),
        // queries 16 kk + 8 (i / 2) + 2 c4 + {0, 1}: 16-byte chunk 2 kk + i / 2 of its row, swizzled.
        // One buffer: each warp's slice of the previous tile's dq product reads every warp's rows, and a
        // warp's wgmma wait covers only its own slice, so all four must be past that wait (barrier 2).
        if (j > 0) named_barrier_sync<128>(2);
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            pack8_bf16(pb[kk], dp + 8 * kk);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = warp * 16 + g + 8 * (i & 1), chunk = (2 * kk + (i >> 1)) ^ g;
                *reinterpret_cast<uint32_t*>(sDs + row * 64 + chunk * 8 + 2 * c4) = pb[kk][i];
            }
        }
        fence_proxy_async_smem();
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) wgmma_m64n64k16_rs_mn(dv, pa[kk], o_desc_mn + kk * (16 * 128 / 16));
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) wgmma_m64n64k16_rs_mn(dk, pb[kk], q_desc_mn + kk * (16 * 128 / 16));
        wgmma_commit();

        // dq's share, scale left out: dS (queries x keys) = A from dS^T as stored (MN-major), k as stored
        // (MN-major B); 16 keys a step. The four warps' rows of dS^T must all be in.
        named_barrier_sync<128>(1);
        float dq[HS / 2];
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < BK / 16; ks++) wgmma_m64n64k16_ss_mn(dq, ds_desc_mn + ks * (16 * 128 / 16), k_desc_mn + ks * (16 * 128 / 16), ks);
        wgmma_commit();
        wgmma_wait<0>();
        keep_regs(dk);
        keep_regs(dv);
        keep_regs(dq);
        keep_regs(pa);
        keep_regs(pb);
        mbar_arrive(&q_empty[st]);  // this thread is done with the stage (its lse, D and the products' reads)

        // dq[4 dt + e]: query warp * 16 + g + 8 (e / 2), head dimension 8 dt + 2 c4 + e % 2.
        const int buf = j & 1;
        mbar_wait(&dq_empty[buf], ((j >> 1) & 1) ^ 1);
        float* dst = sDq + buf * TILE;
#pragma unroll
        for (int dt = 0; dt < HS / 8; dt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
                *reinterpret_cast<float2*>(dst + dq_index(warp * 16 + g + 8 * hf, 8 * dt + 2 * c4)) =
                    make_float2(dq[4 * dt + 2 * hf], dq[4 * dt + 2 * hf + 1]);
        fence_proxy_async_smem();  // read next by the bulk copy (async proxy)
        mbar_arrive(&dq_full[buf]);
    }

    const size_t stride = 3 * size_t(C);
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
    __trap();  // built without sm_90a: backward_fused_wgmma never launches it (wgmma_available)
#endif
}

// d (64 x 32, fp32) = A B + (accumulate ? d : 0), both operands in shared memory and MN-major (as
// wgmma_m64n64k16_ss_mn, N = 32).
__device__ __forceinline__ void wgmma_m64n32k16_ss_mn(float (&d)[16], uint64_t a_desc, uint64_t b_desc, int accumulate) {
#ifdef PTX_HAVE_SM90A
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(a_desc), "l"(b_desc), "r"(accumulate));
#endif
}

// Version 16: version 15 with two consumer warpgroups a block (128 keys: each warpgroup 64, version
// 14's products on its keys), sharing each query tile's q, dO, lse and D, and dq's product split by head
// dimension (each warpgroup 32 columns over all 128 keys), so one 64 x 64 share a (query tile, 128 keys)
// goes to L2: half of version 15's reduce-adds and loads of q and dO. 384 threads, one block an SM.
constexpr int kDq2RegsLoader = 72, kDq2RegsConsumer = 216;

template <int STAGES> struct Fused2BwdSmem {
    static constexpr int kTile = 64 * 64 * 2;  // bf16 64 x 64, 128-byte swizzled
    static constexpr int kK = 0, kV = 2 * kTile, kQ = 4 * kTile, kO = kQ + STAGES * kTile, kDs = kO + STAGES * kTile;
    static constexpr int kDq = kDs + 2 * kTile;  // 2 x 64 x 64 fp32
    static constexpr int kL = kDq + 2 * 64 * 64 * 4, kD = kL + STAGES * 64 * 4;
    static constexpr int kBars = kD + STAGES * 64 * 4;  // kv_full, q_full[STAGES], q_empty[STAGES], dq_full[2], dq_empty[2]
    static constexpr int kTicket = kBars + 8 * (1 + 2 * STAGES + 4);
    static constexpr int kBytes = kTicket + 16 + 1024;  // + room to align the base to 1024
};

template <int STAGES>
__global__ void __launch_bounds__(384, 1)
    backward_fused2_wgmma_kernel(bf16* dqkv, float* dq_acc, int* counters, const __grid_constant__ CUtensorMap map_qkv,
                                const __grid_constant__ CUtensorMap map_dout, const float* lse, const float* Dsum, int B, int T,
                                int NH, float scale) {
#ifdef PTX_HAVE_SM90A
    using L = Fused2BwdSmem<STAGES>;
    constexpr int HS = 64, BK = 128, BQ = 64, NT = BQ / 8, TILE = 64 * 64;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    bf16* sK = reinterpret_cast<bf16*>(smem + L::kK);
    bf16* sV = reinterpret_cast<bf16*>(smem + L::kV);
    bf16* sQ = reinterpret_cast<bf16*>(smem + L::kQ);    // STAGES x BQ x 64
    bf16* sO = reinterpret_cast<bf16*>(smem + L::kO);    // STAGES x BQ x 64 (dO)
    bf16* sDs = reinterpret_cast<bf16*>(smem + L::kDs);  // dS^T: BK (128) keys x BQ queries
    float* sDq = reinterpret_cast<float*>(smem + L::kDq);  // 2 x 64 x 64, see dq_index
    float* sL = reinterpret_cast<float*>(smem + L::kL);    // STAGES x BQ (lse)
    float* sD = reinterpret_cast<float*>(smem + L::kD);    // STAGES x BQ (D)
    uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + L::kBars);
    uint64_t* q_full = kv_full + 1;
    uint64_t* q_empty = q_full + STAGES;
    uint64_t* dq_full = q_empty + STAGES;
    uint64_t* dq_empty = dq_full + 2;
    int* s_ticket = reinterpret_cast<int*>(smem + L::kTicket);

    const int n_qt = (T + BQ - 1) / BQ, n_kb = (T + BK - 1) / BK;  // query tiles, key blocks per head
    int* ticket = counters + size_t(B) * NH * n_qt;
    if (threadIdx.x == 0) {
        mbar_init(kv_full, 1);
        for (int s = 0; s < STAGES; s++) mbar_init(&q_full[s], 32), mbar_init(&q_empty[s], 256);
        for (int i = 0; i < 2; i++) mbar_init(&dq_full[i], 256), mbar_init(&dq_empty[i], 1);
        fence_mbarrier_init();
        *s_ticket = atomicAdd(ticket, 1);
    }
    __syncthreads();
    const int t = *s_ticket, bh = t / n_kb, kb = n_kb - 1 - t % n_kb, h = bh % NH, b = bh / NH;
    const int C = NH * HS, qt0 = 2 * kb, n_tiles = n_qt - qt0;  // query tiles 2 kb .. n_qt - 1
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    // dq tiles (fp32, in the shared buffers and in dq_acc alike): row r's 16-byte chunk j at chunk j ^ (r % 8),
    // so that the accumulator fragments' 8 rows per store land on different banks.
    auto dq_index = [](int r, int c) { return r * 64 + (((c >> 2) ^ (r & 7)) << 2) + (c & 3); };

    if (threadIdx.x < 128) {
        setmaxnreg_dec<kDq2RegsLoader>();
        if (warp == 0) {
            const float* l_src = lse + size_t(bh) * T;
            const float* d_src = Dsum + size_t(bh) * T;
            if (lane == 0) {
                mbar_arrive_expect_tx(kv_full, 4 * TILE * 2);
                tma_load_2d(sK, &map_qkv, kv_full, C + h * HS, b * T + kb * BK);
                tma_load_2d(sK + TILE, &map_qkv, kv_full, C + h * HS, b * T + kb * BK + 64);
                tma_load_2d(sV, &map_qkv, kv_full, 2 * C + h * HS, b * T + kb * BK);
                tma_load_2d(sV + TILE, &map_qkv, kv_full, 2 * C + h * HS, b * T + kb * BK + 64);
            }
            for (int j = 0; j < n_tiles; j++) {
                const int st = j % STAGES, q0 = (qt0 + j) * BQ;
                mbar_wait(&q_empty[st], ((j / STAGES) & 1) ^ 1);  // a fresh barrier's "previous phase" counts as done
                for (int i = lane; i < BQ; i += 32) {
                    const bool in = q0 + i < T;
                    sL[st * BQ + i] = in ? l_src[q0 + i] : 0.0f;
                    sD[st * BQ + i] = in ? d_src[q0 + i] : 0.0f;
                }
                if (lane == 0) {
                    mbar_arrive_expect_tx(&q_full[st], 2 * TILE * 2);
                    // Rows past T are the next sequence's (or zeros past the tensor): finite, and masked (P = 0).
                    tma_load_2d(sQ + st * TILE, &map_qkv, &q_full[st], h * HS, b * T + q0);
                    tma_load_2d(sO + st * TILE, &map_dout, &q_full[st], h * HS, b * T + q0);
                } else {
                    mbar_arrive(&q_full[st]);
                }
            }
        } else if (warp == 1) {
            const size_t stride = 3 * size_t(C);
            for (int j = 0; j < n_tiles; j++) {
                const int qt = qt0 + j, buf = j & 1, rank = qt / 2 - kb;  // shares before this block's: key blocks qt / 2 .. kb + 1
                const size_t tile = size_t(bh) * n_qt + qt;
                float* acc = dq_acc + tile * TILE;
                const float* mine = sDq + buf * TILE;
                mbar_wait(&dq_full[buf], (j >> 1) & 1);
                if (rank > 0)
                    while (ld_acquire_gpu(counters + tile) != rank) {
                    }
                if (kb > 0) {
                    if (lane == 0) {
                        fence_proxy_async_global();
                        if (rank == 0) bulk_store_1d(acc, mine, TILE * 4);
                        else bulk_reduce_add_f32(acc, mine, TILE * 4);
                        bulk_commit();
                        bulk_wait_read();
                        mbar_arrive(&dq_empty[buf]);
                        bulk_wait();
                        fence_proxy_async_global();
                        red_release_gpu_add(counters + tile, 1);
                    }
                    __syncwarp();
                } else {
                    // The last share: dq = scale (sum so far + this share), rows < T. Lanes 0-15 and 16-31
                    // take alternate rows, each lane one 16-byte chunk (4 values) of a row, kRowsAhead loads
                    // in flight.
                    constexpr int kRowsAhead = 4;
                    const int pj = lane & 15;
                    for (int r0 = 0; r0 < BQ; r0 += 2 * kRowsAhead) {
                        float4 prior[kRowsAhead];
#pragma unroll
                        for (int i = 0; i < kRowsAhead; i++)
                            prior[i] = rank > 0 ? __ldcg(reinterpret_cast<const float4*>(acc + (r0 + 2 * i + lane / 16) * 64 + pj * 4))
                                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                        for (int i = 0; i < kRowsAhead; i++) {
                            const int r = r0 + 2 * i + lane / 16, row = qt * BQ + r;
                            const float4 m = *reinterpret_cast<const float4*>(mine + r * 64 + pj * 4);
                            if (row >= T) continue;
                            const __nv_bfloat162 lo = __floats2bfloat162_rn((prior[i].x + m.x) * scale, (prior[i].y + m.y) * scale);
                            const __nv_bfloat162 hi = __floats2bfloat162_rn((prior[i].z + m.z) * scale, (prior[i].w + m.w) * scale);
                            uint2 v;
                            v.x = *reinterpret_cast<const uint32_t*>(&lo), v.y = *reinterpret_cast<const uint32_t*>(&hi);
                            *reinterpret_cast<uint2*>(dqkv + (size_t(b) * T + row) * stride + h * HS + 4 * (pj ^ (r & 7))) = v;
                        }
                    }
                    __syncwarp();
                    if (lane == 0) mbar_arrive(&dq_empty[buf]);
                }
            }
        }
        return;
    }

    setmaxnreg_inc<kDq2RegsConsumer>();
    const int wg = threadIdx.x / 128 - 1;  // consumer warpgroup 0 or 1: keys 64 wg .. 64 wg + 63 of the block
    const int g = lane / 4, c4 = lane % 4, wk0 = kb * BK + wg * 64 + warp * 16;  // this warp's first key
    const float sl2 = scale * kLog2e;
    const uint64_t k_desc = sw128_desc(sK + wg * TILE, 16, 1024), v_desc = sw128_desc(sV + wg * TILE, 16, 1024);
    // dq's product: this warpgroup's 32 of the 64 head dimensions over all 128 keys (B: k MN-major, from
    // column 32 wg: 64 bytes into each 128-byte row, 4 descriptor units)
    const uint64_t k_desc_mn = sw128_desc(sK, BK * 128, 1024) + 4 * wg, ds_desc_mn = sw128_desc(sDs, BQ * 128, 1024);
    float dk[HS / 2], dv[HS / 2];
#pragma unroll
    for (int i = 0; i < HS / 2; i++) dk[i] = dv[i] = 0.0f;
    mbar_wait(kv_full, 0);

    for (int j = 0; j < n_tiles; j++) {
        const int st = j % STAGES, q0 = (qt0 + j) * BQ;
        mbar_wait(&q_full[st], (j / STAGES) & 1);
        const uint64_t q_desc = sw128_desc(sQ + st * TILE, 16, 1024), o_desc = sw128_desc(sO + st * TILE, 16, 1024);
        const uint64_t q_desc_mn = sw128_desc(sQ + st * TILE, BQ * 128, 1024), o_desc_mn = sw128_desc(sO + st * TILE, BQ * 128, 1024);
        const float* cL = sL + st * BQ;
        const float* cD = sD + st * BQ;

        // From here to the dk/dv products: backward_dkdv_wgmma_kernel's code.
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
        uint32_t pa[BQ / 16][4], pb[BQ / 16][4];
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) pack8_bf16(pa[kk], s + 8 * kk);
        wgmma_wait<0>();
        keep_regs(dp);

#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) dp[4 * nt + e] = s[4 * nt + e] * (dp[4 * nt + e] - cD[nt * 8 + 2 * c4 + (e & 1)]);
        // dS^T into shared memory for dq's product: pb[kk][i] holds key g + 8 (i % 2) (of this warp's 16),
        // queries 16 kk + 8 (i / 2) + 2 c4 + {0, 1}: 16-byte chunk 2 kk + i / 2 of its row, swizzled.
        // One buffer: each warp's slice of the previous tile's dq product reads every warp's rows, and a
        // warp's wgmma wait covers only its own slice, so all four must be past that wait (barrier 2).
        if (j > 0) named_barrier_sync<256>(2);
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            pack8_bf16(pb[kk], dp + 8 * kk);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = wg * 64 + warp * 16 + g + 8 * (i & 1), chunk = (2 * kk + (i >> 1)) ^ g;
                *reinterpret_cast<uint32_t*>(sDs + row * 64 + chunk * 8 + 2 * c4) = pb[kk][i];
            }
        }
        fence_proxy_async_smem();
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) wgmma_m64n64k16_rs_mn(dv, pa[kk], o_desc_mn + kk * (16 * 128 / 16));
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) wgmma_m64n64k16_rs_mn(dk, pb[kk], q_desc_mn + kk * (16 * 128 / 16));
        wgmma_commit();

        // dq's share, scale left out: dS (queries x keys) = A from dS^T as stored (MN-major), k as stored
        // (MN-major B); 16 keys a step. The four warps' rows of dS^T must all be in.
        named_barrier_sync<256>(1);
        float dq[16];
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < BK / 16; ks++) wgmma_m64n32k16_ss_mn(dq, ds_desc_mn + ks * (16 * 128 / 16), k_desc_mn + ks * (16 * 128 / 16), ks);
        wgmma_commit();
        wgmma_wait<0>();
        keep_regs(dk);
        keep_regs(dv);
        keep_regs(dq);
        keep_regs(pa);
        keep_regs(pb);
        mbar_arrive(&q_empty[st]);  // this thread is done with the stage (its lse, D and the products' reads)

        // dq[4 dt + e]: query warp * 16 + g + 8 (e / 2), head dimension 32 wg + 8 dt + 2 c4 + e % 2.
        const int buf = j & 1;
        mbar_wait(&dq_empty[buf], ((j >> 1) & 1) ^ 1);
        float* dst = sDq + buf * TILE;
#pragma unroll
        for (int dt = 0; dt < 4; dt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
                *reinterpret_cast<float2*>(dst + dq_index(warp * 16 + g + 8 * hf, 32 * wg + 8 * dt + 2 * c4)) =
                    make_float2(dq[4 * dt + 2 * hf], dq[4 * dt + 2 * hf + 1]);
        fence_proxy_async_smem();  // read next by the bulk copy (async proxy)
        mbar_arrive(&dq_full[buf]);
    }

    const size_t stride = 3 * size_t(C);
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
    __trap();  // built without sm_90a: backward_fused2_wgmma never launches it (wgmma_available)
#endif
}


// D, then version 16's kernel; false where it does not run (HS != 64, or not an sm_90 GPU). Scratch as
// version 15's (its counters and dq sums, per 64-query tile).
template <int STAGES>
bool backward_fused2_wgmma(bf16* dqkv, float* D, float* dq_acc, int* counters, const bf16* dout, const bf16* out, const float* lse,
                           const bf16* qkv, int B, int T, int NH, int HS, cudaStream_t stream) {
    if (HS != 64 || !wgmma_available()) return false;
    if (size_t(B) * T > size_t(INT32_MAX)) fail("flash attention backward (fused): B * T must fit in an int (TMA rows)");
    launch_backward_dot<64>(D, dout, out, B, T, NH, stream);
    cuda_check(cudaMemsetAsync(counters, 0, (size_t(B) * NH * ((T + 63) / 64) + 1) * sizeof(int), stream));
    const int C = NH * 64;
    const CUtensorMap map_qkv = make_tensor_map(qkv, B * T, 3 * C, 64), map_dout = make_tensor_map(dout, B * T, C, 64);
    constexpr int smem = Fused2BwdSmem<STAGES>::kBytes;
    static bool configured = false;
    if (!configured) allow_smem(backward_fused2_wgmma_kernel<STAGES>, smem), configured = true;
    const unsigned blocks = unsigned(size_t(B) * NH * ((T + 127) / 128));
    backward_fused2_wgmma_kernel<STAGES>
        <<<blocks, 384, smem, stream>>>(dqkv, dq_acc, counters, map_qkv, map_dout, lse, D, B, T, NH, 1.0f / 8.0f);
    cuda_check_launch();
    return true;
}

// Scratch of backward_fused_wgmma: the fp32 dq sums (a 64 x 64 tile per query tile) and the counters
// (one per query tile, then the ticket), zeroed by each call.
inline size_t backward_fused_dq_floats(int B, int T, int NH) { return size_t(B) * NH * ((T + 63) / 64) * 64 * 64; }
inline size_t backward_fused_counters(int B, int T, int NH) { return size_t(B) * NH * ((T + 63) / 64) + 1; }

// D, then the one kernel; false where it does not run (HS != 64, or not an sm_90 GPU).
template <int STAGES>
bool backward_fused_wgmma(bf16* dqkv, float* D, float* dq_acc, int* counters, const bf16* dout, const bf16* out, const float* lse,
                          const bf16* qkv, int B, int T, int NH, int HS, cudaStream_t stream) {
    if (HS != 64 || !wgmma_available()) return false;
    if (size_t(B) * T > size_t(INT32_MAX)) fail("flash attention backward (fused): B * T must fit in an int (TMA rows)");
    launch_backward_dot<64>(D, dout, out, B, T, NH, stream);
    cuda_check(cudaMemsetAsync(counters, 0, backward_fused_counters(B, T, NH) * sizeof(int), stream));
    const int C = NH * 64;
    const CUtensorMap map_qkv = make_tensor_map(qkv, B * T, 3 * C, 64), map_dout = make_tensor_map(dout, B * T, C, 64);
    constexpr int smem = FusedBwdSmem<STAGES>::kBytes;
    static bool configured = false;
    if (!configured) allow_smem(backward_fused_wgmma_kernel<STAGES>, smem), configured = true;
    const unsigned blocks = unsigned(size_t(B) * NH * ((T + 63) / 64));
    backward_fused_wgmma_kernel<STAGES>
        <<<blocks, 256, smem, stream>>>(dqkv, dq_acc, counters, map_qkv, map_dout, lse, D, B, T, NH, 1.0f / 8.0f);
    cuda_check_launch();
    return true;
}

}  // namespace flash_lab
