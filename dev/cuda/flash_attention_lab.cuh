// flash_attention_lab.cuh: what the attention labs (dev/cuda/attention_forward.cu,
// attention_backward.cu) run beside the header's kernels (flash_attention.cuh):
//   - forward_tc, forward_wgmma, backward_tc: the header's kernels in any configuration (the header
//     launches only training's), the lab's versions 4-8 and 10-12 (forward), 4-10 (backward).
//   - backward_dkdv_wgmma_early_dv_kernel: the backward's wgmma key-side kernel as the lab's versions
//     12 and 13 ran it, before training's kernel (backward_dkdv_wgmma_kernel, the lab's version 14)
//     issued dv's product late.
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

}  // namespace flash_lab
