// classifier.cuh: softmax cross-entropy over the logits, fused with its gradient.
//
// Per row of logits (B*T, Vp), over the first V columns only (columns V..Vp-1 are vocabulary padding
// for fast matmuls and never take part): p = softmax(logits), loss[row] = -log p[target]; when
// `dloss` is non-zero the row is overwritten in place with dlogits = (p - onehot(target)) * dloss and
// the padding columns with zeros, so the padding never receives gradient.
//
// Non-obvious choices:
//   - The vector kernel (16-byte loads and stores; Vp a multiple of 8 bf16 / 4 fp32 values and the
//     logits 16-byte aligned, as in training) reads the row once for an online max/sum, a running
//     maximum and a sum rescaled when it grows, once per vector of 4-8 values rather than per value,
//     then a second time to write dlogits, counting on the row (100 KB for GPT-2) to be still in L2
//     then. Several vectors per thread are loaded before any is used, to keep enough bytes in
//     flight. dev/cuda/classifier.cu measures it against the scalar kernel below (the fallback for
//     any other Vp or alignment): 71% of copy on the H100, against 41%.
//   - __expf (ex2.approx after a multiply by log2 e; a few units in the last place for the arguments
//     here, all <= 0): the accurate expf costs ~10 instructions a value, and two exponentials per
//     logit at that price would make this pass compute-bound.
//   - loss = log(sum) + max - logit[target] in fp32, never log(p): no underflow for tiny p.
//   - Block reductions combine in a fixed order: the same bits every run.
#pragma once

#include "common.cuh"

constexpr int kClassifierThreads = 1024;

__device__ __forceinline__ void online_combine(float& m, float& s, float m2, float s2) {
    const float mx = fmaxf(m, m2);
    s = (m == -INFINITY ? 0.0f : s * expf(m - mx)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mx));
    m = mx;
}

template <typename T>
__global__ void __launch_bounds__(kClassifierThreads)
    fused_classifier_kernel(T* logits, float* losses, const int* targets, float dloss, int V, int Vp) {
    __shared__ float smax[kClassifierThreads / 32], ssum[kClassifierThreads / 32];
    const int row = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    T* x = logits + size_t(row) * Vp;
    float m = -INFINITY, s = 0.0f;
    for (int c = threadIdx.x; c < V; c += kClassifierThreads) online_combine(m, s, to_float(x[c]), 1.0f);
    for (int o = 16; o > 0; o >>= 1) online_combine(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    if (lane == 0) smax[warp] = m, ssum[warp] = s;
    __syncthreads();
    m = -INFINITY, s = 0.0f;
    for (int w = 0; w < kClassifierThreads / 32; w++) online_combine(m, s, smax[w], ssum[w]);  // fixed order
    const int target = targets[row];
    const float target_logit = to_float(x[target]);
    __syncthreads();  // every thread has read x[target] before any thread overwrites the row
    if (threadIdx.x == 0) losses[row] = logf(s) + m - target_logit;
    if (dloss == 0.0f) return;
    const float inv = 1.0f / s;
    for (int c = threadIdx.x; c < Vp; c += kClassifierThreads) {
        float d = 0.0f;
        if (c < V) d = (expf(to_float(x[c]) - m) * inv - (c == target ? 1.0f : 0.0f)) * dloss;
        x[c] = from_float<T>(d);
    }
}

constexpr int kClassifierVecThreads = 512;
constexpr int kClassifierUnroll = 4;  // vectors loaded per thread before any is used

template <typename T>
__global__ void __launch_bounds__(kClassifierVecThreads)
    fused_classifier_vec_kernel(T* logits, float* losses, const int* targets, float dloss, int V, int Vp) {
    constexpr int VS = Vec128<T>::size, BLOCK = kClassifierVecThreads, U = kClassifierUnroll;
    __shared__ float smax[BLOCK / 32], ssum[BLOCK / 32];
    const int row = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    T* x = logits + size_t(row) * Vp;
    const int vectors_with_v = (V + VS - 1) / VS;  // the last one may hold padding columns too
    float m = -INFINITY, s = 0.0f;
    for (int first = threadIdx.x; first < vectors_with_v; first += BLOCK * U) {
        Vec128<T> v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (first + u * BLOCK < vectors_with_v) v[u] = Vec128<T>::load(x + size_t(first + u * BLOCK) * VS);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c0 = (first + u * BLOCK) * VS;
            if (c0 >= V) continue;
            float vmax = -INFINITY;
#pragma unroll
            for (int j = 0; j < VS; j++)
                if (c0 + j < V) vmax = fmaxf(vmax, to_float(v[u][j]));
            const float m_new = fmaxf(m, vmax);
            float add = 0.0f;
#pragma unroll
            for (int j = 0; j < VS; j++)
                if (c0 + j < V) add += __expf(to_float(v[u][j]) - m_new);
            s = (m == -INFINITY ? 0.0f : s * __expf(m - m_new)) + add;
            m = m_new;
        }
    }
    for (int o = 16; o > 0; o >>= 1) online_combine(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    if (lane == 0) smax[warp] = m, ssum[warp] = s;
    __syncthreads();
    m = -INFINITY, s = 0.0f;
    for (int w = 0; w < BLOCK / 32; w++) online_combine(m, s, smax[w], ssum[w]);  // fixed order
    if (threadIdx.x == 0) losses[row] = logf(s) + m - to_float(x[targets[row]]);
    if (dloss == 0.0f) return;
    __syncthreads();  // thread 0 has read x[target] before any thread overwrites the row
    const int target = targets[row], vectors = Vp / VS;
    const float inv = 1.0f / s;
    for (int first = threadIdx.x; first < vectors; first += BLOCK * U) {
        Vec128<T> v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (first + u * BLOCK < vectors) v[u] = Vec128<T>::load_stream(x + size_t(first + u * BLOCK) * VS);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = first + u * BLOCK;
            if (i >= vectors) continue;
            Vec128<T> d;
#pragma unroll
            for (int j = 0; j < VS; j++) {
                const int c = i * VS + j;
                const float p = c < V ? __expf(to_float(v[u][j]) - m) * inv : 0.0f;
                d[j] = from_float<T>((p - (c == target ? 1.0f : 0.0f)) * dloss);
            }
            d.store_stream(x + size_t(i) * VS);
        }
    }
}

// targets: device (rows) ids, each in [0, V). dloss = 0 computes the losses only (logits kept).
template <typename T>
void fused_classifier(T* logits, float* losses, const int* targets, float dloss, int rows, int V, int Vp,
                      cudaStream_t stream = 0) {
    if (Vp % Vec128<T>::size == 0 && is_aligned16(logits))
        fused_classifier_vec_kernel<T><<<rows, kClassifierVecThreads, 0, stream>>>(logits, losses, targets, dloss, V, Vp);
    else
        fused_classifier_kernel<T><<<rows, kClassifierThreads, 0, stream>>>(logits, losses, targets, dloss, V, Vp);
    cuda_check_launch();
}
