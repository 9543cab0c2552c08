// attention.cuh: causal multi-head self-attention through cuBLAS (batched matmuls + a softmax kernel).
//
//   forward   qkv (B, T, 3C) -> q, k, v (B, NH, T, HS); att = softmax(q k^T / sqrt(HS), causal)
//             (B, NH, T, T), kept for the backward; y = att v, back to (B, T, C).
//   backward  from dy (B, T, C), att and qkv: dv = att^T dy, datt = dy v^T, dpreatt = softmax
//             backward, dq = dpreatt k / sqrt(HS), dk = dpreatt^T q / sqrt(HS), into dqkv (B, T, 3C).
//
// Non-obvious choices:
//   - Correct for any T and head size: cuBLAS takes any shape, and the softmax masks by position.
//     It stores the (B, NH, T, T) probabilities per layer, which is what limits batch size;
//     flash_attention.cuh (bf16, what training takes where it runs) keeps one log-sum-exp per row
//     instead.
//   - The scores are computed straight into the layer's `att` buffer and normalized in place: each
//     lane rewrites only the elements it read itself, so no second buffer is needed.
//   - The softmax reads in the storage type and reduces in fp32; the entries above the diagonal
//     are written as exact zeros so the following full matmuls ignore them.
#pragma once

#include "common.cuh"
#include "matmul.cuh"

// qkv (B, T, 3, NH, HS) -> q, k, v each (B, NH, T, HS)
template <typename T>
__global__ void attention_permute_kernel(T* q, T* k, T* v, const T* qkv, int B, int T_, int NH, int HS) {
    const size_t n = size_t(B) * NH * T_ * HS;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const int d = int(i % HS), t = int(i / HS % T_), h = int(i / (size_t(HS) * T_) % NH), b = int(i / (size_t(HS) * T_ * NH));
        const size_t src = ((size_t(b) * T_ + t) * 3 * NH + h) * HS + d;
        q[i] = qkv[src];
        k[i] = qkv[src + size_t(NH) * HS];
        v[i] = qkv[src + 2 * size_t(NH) * HS];
    }
}

// dq, dk, dv each (B, NH, T, HS) -> dqkv (B, T, 3, NH, HS)
template <typename T>
__global__ void attention_unpermute_qkv_kernel(T* dqkv, const T* dq, const T* dk, const T* dv, int B, int T_, int NH, int HS) {
    const size_t n = size_t(B) * NH * T_ * HS;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const int d = int(i % HS), t = int(i / HS % T_), h = int(i / (size_t(HS) * T_) % NH), b = int(i / (size_t(HS) * T_ * NH));
        const size_t dst = ((size_t(b) * T_ + t) * 3 * NH + h) * HS + d;
        dqkv[dst] = dq[i];
        dqkv[dst + size_t(NH) * HS] = dk[i];
        dqkv[dst + 2 * size_t(NH) * HS] = dv[i];
    }
}

// (B, NH, T, HS) <-> (B, T, NH, HS); to_heads selects the direction.
template <typename T>
__global__ void attention_heads_kernel(T* out, const T* inp, int B, int T_, int NH, int HS, bool to_heads) {
    const size_t n = size_t(B) * NH * T_ * HS;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const int d = int(i % HS), t = int(i / HS % T_), h = int(i / (size_t(HS) * T_) % NH), b = int(i / (size_t(HS) * T_ * NH));
        const size_t flat = ((size_t(b) * T_ + t) * NH + h) * HS + d;  // (B, T, NH, HS)
        if (to_heads) out[i] = inp[flat];
        else out[flat] = inp[i];
    }
}

// One warp per row (b, h, t): softmax over columns 0..t, zeros after; in place.
template <typename T> __global__ void causal_softmax_kernel(T* att, int rows, int T_) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const int t = row % T_;
    T* x = att + size_t(row) * T_;
    float maxval = -INFINITY;
    for (int c = lane; c <= t; c += 32) maxval = fmaxf(maxval, to_float(x[c]));
    maxval = warp_max(maxval);
    float sum = 0.0f;
    for (int c = lane; c <= t; c += 32) sum += expf(to_float(x[c]) - maxval);
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    for (int c = lane; c < T_; c += 32) x[c] = from_float<T>(c <= t ? expf(to_float(x[c]) - maxval) * inv : 0.0f);
}

// One warp per row: d <- att * (d - sum(att * d)) over columns 0..t, zeros after; in place on d.
template <typename T> __global__ void causal_softmax_backward_kernel(T* d, const T* att, int rows, int T_) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const int t = row % T_;
    T* g = d + size_t(row) * T_;
    const T* p = att + size_t(row) * T_;
    float dot = 0.0f;
    for (int c = lane; c <= t; c += 32) dot += to_float(p[c]) * to_float(g[c]);
    dot = warp_sum(dot);
    for (int c = lane; c < T_; c += 32) g[c] = from_float<T>(c <= t ? to_float(p[c]) * (to_float(g[c]) - dot) : 0.0f);
}

// Batched column-major C_i = alpha op(A_i) op(B_i) + beta C_i over `batch` matrices.
template <typename T>
void gemm_batched(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const T* A, int lda,
                  long long sa, const T* B, int ldb, long long sb, float beta, T* C, int ldc, long long sc, int batch,
                  cudaStream_t stream) {
    cublas_check(cublasGemmStridedBatchedEx(blas_stream(stream).handle, ta, tb, m, n, k, &alpha, A, cuda_data_type<T>(), lda, sa, B,
                                            cuda_data_type<T>(), ldb, sb, &beta, C, cuda_data_type<T>(), ldc, sc, batch,
                                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Scratch the caller provides: qkvr 3 * B*NH*T*HS (q, k, v per head), yr B*NH*T*HS.
template <typename T>
void attention_forward(T* y, T* att, T* qkvr, T* yr, const T* qkv, int B, int T_, int C, int NH, cudaStream_t stream = 0) {
    const int HS = C / NH;
    const size_t per = size_t(B) * NH * T_ * HS;
    T *q = qkvr, *k = qkvr + per, *v = qkvr + 2 * per;
    attention_permute_kernel<T><<<elementwise_blocks(per), 256, 0, stream>>>(q, k, v, qkv, B, T_, NH, HS);
    cuda_check_launch();
    const long long sqk = (long long)T_ * HS, satt = (long long)T_ * T_;
    // att^T (column-major, T x T) = k q^T: att[t][t2] = q[t] . k[t2] / sqrt(HS)
    gemm_batched<T>(CUBLAS_OP_T, CUBLAS_OP_N, T_, T_, HS, 1.0f / sqrtf((float)HS), k, HS, sqk, q, HS, sqk, 0.0f, att, T_,
                    satt, B * NH, stream);
    const int rows = B * NH * T_;
    causal_softmax_kernel<T><<<(rows + 7) / 8, 256, 0, stream>>>(att, rows, T_);
    cuda_check_launch();
    // y (column-major HS x T) = v (HS x T) att^T-as-stored
    gemm_batched<T>(CUBLAS_OP_N, CUBLAS_OP_N, HS, T_, T_, 1.0f, v, HS, sqk, att, T_, satt, 0.0f, yr, HS, sqk, B * NH, stream);
    attention_heads_kernel<T><<<elementwise_blocks(per), 256, 0, stream>>>(y, yr, B, T_, NH, HS, false);
    cuda_check_launch();
}

// Scratch: qkvr and dqkvr 3 * B*NH*T*HS each, dyr B*NH*T*HS, datt B*NH*T*T. dqkv is overwritten.
template <typename T>
void attention_backward(T* dqkv, T* qkvr, T* dqkvr, T* dyr, T* datt, const T* dy, const T* att, const T* qkv, int B, int T_,
                        int C, int NH, cudaStream_t stream = 0) {
    const int HS = C / NH;
    const size_t per = size_t(B) * NH * T_ * HS;
    T *q = qkvr, *k = qkvr + per, *v = qkvr + 2 * per;
    T *dq = dqkvr, *dk = dqkvr + per, *dv = dqkvr + 2 * per;
    attention_permute_kernel<T><<<elementwise_blocks(per), 256, 0, stream>>>(q, k, v, qkv, B, T_, NH, HS);
    cuda_check_launch();
    attention_heads_kernel<T><<<elementwise_blocks(per), 256, 0, stream>>>(dyr, dy, B, T_, NH, HS, true);
    cuda_check_launch();
    const long long sqk = (long long)T_ * HS, satt = (long long)T_ * T_;
    const int batch = B * NH;
    // datt[t][t2] = dy[t] . v[t2]
    gemm_batched<T>(CUBLAS_OP_T, CUBLAS_OP_N, T_, T_, HS, 1.0f, v, HS, sqk, dyr, HS, sqk, 0.0f, datt, T_, satt, batch, stream);
    // dv[t2] = sum_t att[t][t2] dy[t]
    gemm_batched<T>(CUBLAS_OP_N, CUBLAS_OP_T, HS, T_, T_, 1.0f, dyr, HS, sqk, att, T_, satt, 0.0f, dv, HS, sqk, batch, stream);
    const int rows = batch * T_;
    causal_softmax_backward_kernel<T><<<(rows + 7) / 8, 256, 0, stream>>>(datt, att, rows, T_);
    cuda_check_launch();
    const float scale = 1.0f / sqrtf((float)HS);
    // dq[t] = scale * sum_t2 dpreatt[t][t2] k[t2]
    gemm_batched<T>(CUBLAS_OP_N, CUBLAS_OP_N, HS, T_, T_, scale, k, HS, sqk, datt, T_, satt, 0.0f, dq, HS, sqk, batch, stream);
    // dk[t2] = scale * sum_t dpreatt[t][t2] q[t]
    gemm_batched<T>(CUBLAS_OP_N, CUBLAS_OP_T, HS, T_, T_, scale, q, HS, sqk, datt, T_, satt, 0.0f, dk, HS, sqk, batch, stream);
    attention_unpermute_qkv_kernel<T><<<elementwise_blocks(per), 256, 0, stream>>>(dqkv, dq, dk, dv, B, T_, NH, HS);
    cuda_check_launch();
}
