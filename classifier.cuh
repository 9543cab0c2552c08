// classifier.cuh: softmax cross-entropy over the logits, fused with its gradient.
//
// Per row of logits (B*T, Vp), over the first V columns only (columns V..Vp-1 are vocabulary padding
// for fast matmuls and never take part): p = softmax(logits), loss[row] = -log p[target]; when
// `dloss` is non-zero the row is overwritten in place with dlogits = (p - onehot(target)) * dloss and
// the padding columns with zeros, so the padding never receives gradient.
//
// Non-obvious choices:
//   - One pass reads the row for an online max/sum (running max, rescaled sum), a second writes
//     dlogits; the row (100 KB for GPT-2) is still in L2 for the second read.
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

// targets: device (rows) ids, each in [0, V). dloss = 0 computes the losses only (logits kept).
template <typename T>
void fused_classifier(T* logits, float* losses, const int* targets, float dloss, int rows, int V, int Vp,
                      cudaStream_t stream = 0) {
    fused_classifier_kernel<T><<<rows, kClassifierThreads, 0, stream>>>(logits, losses, targets, dloss, V, Vp);
    cuda_check_launch();
}
