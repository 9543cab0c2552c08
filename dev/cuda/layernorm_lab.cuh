// layernorm_lab.cuh: the LayerNorm forward's variants that only the lab runs
// (dev/cuda/layernorm_forward.cu): the header's vector kernel (layernorm.cuh) with its launch choices
// as template knobs, and the fused residual + LayerNorm forward.
//   STREAM_LOADS  streaming (evict-first) loads of x instead of plain ones
//   MIN_BLOCK     the smallest block: 32 (one row group per block) or 256 (several row groups when rows
//                 are short); the header takes 32 in fp32, 256 in bf16
//   wpr_override  warps per row other than the header's choice
//   RESIDUAL      residual = inp1 + inp2 rounded to T and stored, then LayerNorm runs on the stored
//                 residual, so a backward (which reads it) sees exactly the values the forward
//                 normalized. Training ran it until the residual adds moved into the attproj / fcproj
//                 matmul epilogues (matmul.cuh); the lab keeps it as its --residual version 2.
// With the header's choices (no residual, plain loads, its MIN_BLOCK and warps per row) a variant
// computes what the header's kernel computes, the same way; the lab runs the header's own
// layernorm_forward there (its version 5), so it measures what training runs.
#pragma once

#include "common.cuh"
#include "layernorm.cuh"

namespace layernorm_lab {

using namespace layernorm_detail;

template <typename T, int WPR, bool RESIDUAL, bool STREAM_LOADS = false, int MIN_BLOCK = kForwardMinBlockOf<T>>
__global__ void __launch_bounds__(block_threads<WPR, MIN_BLOCK>())
    forward_variant_vec_kernel(T* residual, T* out, float* mean, float* rstd, const T* inp1, const T* inp2,
                               const T* weight, const T* bias, int N, int C, int out_ld) {
    constexpr int BLOCK = block_threads<WPR, MIN_BLOCK>(), TPR = ForwardRow<T, WPR>::TPR, ROWS = BLOCK / TPR;
    constexpr int VS = ForwardRow<T, WPR>::VS, K = ForwardRow<T, WPR>::K;
    __shared__ float buf[2][BLOCK / 32];
    const int group = threadIdx.x / TPR, t = threadIdx.x % TPR;
    const int row = blockIdx.x * ROWS + group;
    const bool active = row < N;
    const size_t offset = size_t(active ? row : N - 1) * C;  // inactive groups still reach the barriers
    const int nvec = C / VS;

    ForwardRow<T, WPR> x;  // the header's row code: the same sums and y
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int i = k * TPR + t;
        if (i < nvec) {
            auto load = [](const T* p) { return STREAM_LOADS ? Vec128<T>::load_stream(p) : Vec128<T>::load(p); };
            if constexpr (RESIDUAL) {
                Vec128<T> a = load(inp1 + offset + size_t(i) * VS);
                Vec128<T> b = load(inp2 + offset + size_t(i) * VS);
#pragma unroll
                for (int j = 0; j < VS; j++) x.x[k][j] = from_float<T>(to_float(a[j]) + to_float(b[j]));
            } else {
                x.x[k] = load(inp1 + offset + size_t(i) * VS);
            }
        }
    }
    const float2 ms = x.template stats<BLOCK>(t, nvec, C, buf);
    if (!active) return;  // no barrier after this point
    if (t == 0) x.store_stats(mean, rstd, row, ms);
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int i = k * TPR + t;
        if (i < nvec) {
            if constexpr (RESIDUAL) x.x[k].store(residual + offset + size_t(i) * VS);
            const Vec128<T> y = x.output(k, ms, Vec128<T>::load(weight + size_t(i) * VS), Vec128<T>::load(bias + size_t(i) * VS));
            y.store(out + size_t(row) * out_ld + size_t(i) * VS);
        }
    }
}

// The general path with RESIDUAL: one block of 256 threads per row, scalar accesses, three passes over
// the row. Without RESIDUAL the header's general kernel is the same code.
template <typename T, bool RESIDUAL>
__global__ void __launch_bounds__(256)
    forward_variant_general_kernel(T* residual, T* out, float* mean, float* rstd, const T* inp1, const T* inp2,
                                   const T* weight, const T* bias, int N, int C, int out_ld) {
    __shared__ float buf[2][8];
    const int row = blockIdx.x;
    const size_t offset = size_t(row) * C;
    // With RESIDUAL, x is the rounded sum this same thread stored in pass 1 (same thread, same
    // addresses: program order makes the stores visible to its own later loads).
    const T* x = RESIDUAL ? residual + offset : inp1 + offset;
    float sum = 0.0f;
    for (int c = threadIdx.x; c < C; c += 256) {
        if constexpr (RESIDUAL) {
            const T r = from_float<T>(to_float(inp1[offset + c]) + to_float(inp2[offset + c]));
            residual[offset + c] = r;
            sum += to_float(r);
        } else {
            sum += to_float(x[c]);
        }
    }
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
    for (int c = threadIdx.x; c < C; c += 256)
        out[size_t(row) * out_ld + c] = from_float<T>((to_float(x[c]) - m) * s * to_float(weight[c]) + to_float(bias[c]));
}

// The header's forward_launch with the variants' choices: wpr_override (0: the header's warps per row;
// values below what the row needs are ignored), RESIDUAL, STREAM_LOADS, MIN_BLOCK.
template <typename T, bool RESIDUAL, bool STREAM_LOADS = false, int MIN_BLOCK = kForwardMinBlockOf<T>>
void forward_variant_launch(T* residual, T* out, float* mean, float* rstd, const T* inp1, const T* inp2,
                            const T* weight, const T* bias, int N, int C, cudaStream_t stream, int wpr_override = 0,
                            int out_ld = 0) {
    if (N <= 0 || C <= 0) return;
    if (out_ld == 0) out_ld = C;
    if (out_ld < C) fail("layernorm forward variant: out_ld %d < C %d", out_ld, C);
    int wpr = forward_warps_per_row<T>(C);
    if (wpr_override && wpr && wpr_override >= forward_min_warps_per_row(C) && wpr_override <= kForwardMaxWarpsPerRow)
        wpr = wpr_override;
    if (wpr && out_ld % Vec128<T>::size == 0 && vector_ok<T>(C, {residual, out, inp1, inp2, weight, bias})) {
#define LN_FWD(W)                                                                                              \
    case W: {                                                                                                  \
        constexpr int block = block_threads<W, MIN_BLOCK>(), rows = block / (32 * W);                         \
        forward_variant_vec_kernel<T, W, RESIDUAL, STREAM_LOADS, MIN_BLOCK>                                    \
            <<<(N + rows - 1) / rows, block, 0, stream>>>(                                                     \
            residual, out, mean, rstd, inp1, inp2, weight, bias, N, C, out_ld);                                \
        break;                                                                                                 \
    }
        switch (wpr) {
            LN_FWD(1) LN_FWD(2) LN_FWD(4) LN_FWD(8) LN_FWD(16)
            default: fail("layernorm forward variant: bad warps per row %d", wpr);
        }
#undef LN_FWD
    } else {
        forward_variant_general_kernel<T, RESIDUAL>
            <<<N, 256, 0, stream>>>(residual, out, mean, rstd, inp1, inp2, weight, bias, N, C, out_ld);
    }
    cuda_check_launch();
}

}  // namespace layernorm_lab

// residual = inp1 + inp2 (rounded to T), out = LayerNorm(residual), in one pass.
template <typename T>
void fused_residual_layernorm_forward(T* residual, T* out, float* mean, float* rstd, const T* inp1, const T* inp2,
                                      const T* weight, const T* bias, int N, int C, cudaStream_t stream = 0) {
    layernorm_lab::forward_variant_launch<T, true>(residual, out, mean, rstd, inp1, inp2, weight, bias, N, C, stream);
}
