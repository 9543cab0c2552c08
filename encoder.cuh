// encoder.cuh: GPT-2's input embedding, out[b,t,:] = wte[token[b,t],:] + wpe[t,:], and its backward.
//
// Non-obvious choices:
//   - The backward is deterministic without atomics. dwpe[t] sums dout over the batch in a fixed
//     order (one thread per (t, c)). dwte needs, per token id, the sum of dout over every position
//     holding that id; the positions are grouped by token on the host (the host has the batch before
//     the GPU does, so this costs no synchronisation) with a stable counting sort, and one block per
//     distinct token sums its positions in that fixed order. Both += (gradient accumulation).
//   - The forward sums in fp32 and rounds once, as PyTorch does on the fp32 reference.
#pragma once

#include <vector>

#include "common.cuh"

template <typename T, int VS>
__global__ void encoder_forward_kernel(T* out, const int* tokens, const T* wte, const T* wpe, int BT, int T_, int C) {
    const size_t n = size_t(BT) * C / VS;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const size_t e = i * VS;
        const int bt = int(e / C), c = int(e % C), t = bt % T_;
        const T* w = wte + size_t(tokens[bt]) * C + c;
        const T* p = wpe + size_t(t) * C + c;
        if constexpr (VS == 1) {
            out[e] = from_float<T>(to_float(*w) + to_float(*p));
        } else {
            const Vec128<T> a = Vec128<T>::load(w), b = Vec128<T>::load(p);
            Vec128<T> y;
#pragma unroll
            for (int j = 0; j < VS; j++) y[j] = from_float<T>(to_float(a[j]) + to_float(b[j]));
            y.store(out + e);
        }
    }
}

// tokens: device (B*T) ids; all pointers device memory.
template <typename T>
void encoder_forward(T* out, const int* tokens, const T* wte, const T* wpe, int B, int T_, int C, cudaStream_t stream = 0) {
    constexpr int VS = Vec128<T>::size;
    const size_t n = size_t(B) * T_ * C;
    const bool vec = C % VS == 0 && is_aligned16(out) && is_aligned16(wte) && is_aligned16(wpe);
    const int threads = 256;
    const int blocks = (int)std::min<size_t>((n / (vec ? VS : 1) + threads - 1) / threads, 65536);
    if (vec) encoder_forward_kernel<T, VS><<<blocks, threads, 0, stream>>>(out, tokens, wte, wpe, B * T_, T_, C);
    else encoder_forward_kernel<T, 1><<<blocks, threads, 0, stream>>>(out, tokens, wte, wpe, B * T_, T_, C);
    cuda_check_launch();
}

// Positions grouped by token id, built on the host for one batch: bucket k holds token
// bucket_token[k] at positions positions[bucket_start[k] .. bucket_start[k+1]), in increasing order.
struct TokenBuckets {
    std::vector<int> bucket_token, bucket_start, positions;  // packed for one host-to-device copy

    void build(const int* tokens, int BT, int vocab) {
        std::vector<int> count(vocab + 1, 0);
        for (int i = 0; i < BT; i++) count[tokens[i] + 1]++;
        for (int v = 0; v < vocab; v++) count[v + 1] += count[v];  // count[v] = first slot of token v
        positions.assign(BT, 0);
        bucket_token.clear();
        bucket_start.clear();
        std::vector<int> next(count.begin(), count.end() - 1);
        for (int i = 0; i < BT; i++) positions[next[tokens[i]]++] = i;  // stable: increasing positions
        for (int v = 0; v < vocab; v++)
            if (count[v + 1] > count[v]) bucket_token.push_back(v), bucket_start.push_back(count[v]);
        bucket_start.push_back(BT);
    }
};

template <typename T>
__global__ void encoder_backward_wte_kernel(T* dwte, const T* dout, const int* bucket_token, const int* bucket_start,
                                            const int* positions, int C) {
    const int k = blockIdx.x, token = bucket_token[k], begin = bucket_start[k], end = bucket_start[k + 1];
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float sum = 0.0f;
        for (int p = begin; p < end; p++) sum += to_float(dout[size_t(positions[p]) * C + c]);
        T* d = dwte + size_t(token) * C + c;
        *d = from_float<T>(to_float(*d) + sum);
    }
}

template <typename T>
__global__ void encoder_backward_wpe_kernel(T* dwpe, const T* dout, int B, int T_, int C) {
    const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;  // over (t, c)
    if (i >= size_t(T_) * C) return;
    float sum = 0.0f;
    for (int b = 0; b < B; b++) sum += to_float(dout[size_t(b) * T_ * C + i]);
    dwpe[i] = from_float<T>(to_float(dwpe[i]) + sum);
}

// buckets_device: bucket_token (num_buckets), bucket_start (num_buckets + 1), positions (B*T) on the
// device, copied from a TokenBuckets of the same batch.
template <typename T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const int* bucket_token, const int* bucket_start,
                      const int* positions, int num_buckets, int B, int T_, int C, cudaStream_t stream = 0) {
    encoder_backward_wte_kernel<T><<<num_buckets, std::min(256, (C + 31) / 32 * 32), 0, stream>>>(
        dwte, dout, bucket_token, bucket_start, positions, C);
    cuda_check_launch();
    const size_t n = size_t(T_) * C;
    encoder_backward_wpe_kernel<T><<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(dwpe, dout, B, T_, C);
    cuda_check_launch();
}
