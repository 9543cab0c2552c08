// encoder.cuh: GPT-2's input embedding, out[b,t,:] = wte[token[b,t],:] + wpe[t,:], and its backward.
//
// Non-obvious choices:
//   - The backward is deterministic without atomics: every sum has a fixed order, so dwte and dwpe
//     come out bitwise identical run to run. dwpe[t] sums dout over the batch in a fixed order (one
//     thread per (t, c)). dwte needs, per token id, the sum of dout over every position holding that
//     id. The host groups the positions by token with a stable counting sort (it has the batch before
//     the GPU does, so this costs no synchronisation) and cuts each group into chunks of at most
//     kEncoderChunk consecutive positions. One block per chunk sums its rows in position order, in
//     fp32; a token of one chunk adds that straight into dwte, a token of several leaves fp32 partial
//     rows that a second kernel sums in chunk order. Without the cut, the one block of the most
//     frequent token would walk all of its positions alone (thousands in a Tiny Shakespeare batch),
//     serializing a pass that should cost one read of dout. Both += (gradient accumulation), rounded
//     to the storage type once.
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

// ---------------------------------------------------------------------------------------------
// Backward.

// The most positions one block sums alone. Short enough that no block is a serial tail (16 rounds of
// kEncoderRowsAhead loads), long enough that the partial rows stay cheap: at most 2 BT / 64 fp32
// rows, each written once and read once, at most 1/8 of the bytes of a bf16 dout.
constexpr int kEncoderChunk = 64;
// Rows a thread loads before it adds the first of them: four 16-byte loads in flight instead of one,
// while the additions keep position order (and so the result).
constexpr int kEncoderRowsAhead = 4;

// Worst cases for BT positions, so the caller allocates once for its largest batch:
//   - items <= BT: every item holds at least one position and no position is in two items;
//   - split tokens <= BT / (kEncoderChunk + 1): each has more than kEncoderChunk positions;
//   - partial rows <= 2 BT / kEncoderChunk: a split token of n > K positions has ceil(n / K) <
//     n / K + 1 < 2 n / K chunks, and the split tokens' n add up to at most BT.
inline int encoder_max_items(int BT) { return BT; }
inline int encoder_max_split_tokens(int BT) { return BT / (kEncoderChunk + 1); }
inline int encoder_max_partial_rows(int BT) { return int(2 * int64_t(BT) / kEncoderChunk); }
// Ints of TokenBuckets::packed for any batch of up to BT positions.
inline size_t encoder_backward_work_ints(int BT) {
    return size_t(BT) + 4 * size_t(encoder_max_items(BT)) + 3 * size_t(encoder_max_split_tokens(BT));
}
// Bytes of the fp32 partial rows for any batch of up to BT positions, C columns.
inline size_t encoder_backward_partials_bytes(int BT, int C) {
    return size_t(encoder_max_partial_rows(BT)) * C * sizeof(float);
}

// The dwte work of one batch, built on the host and copied to the device in one piece:
//   packed = positions (BT) | items (num_items, 4) | reductions (num_reductions, 3)
// positions: 0..BT-1 grouped by token id, increasing within a token (a stable counting sort).
// item (token, begin, end, slot): positions[begin..end), at most kEncoderChunk consecutive ones of the
//   token's group; slot -1 when they are the whole group (its block adds into dwte), else the partial
//   row its block writes.
// reduction (token, first_slot, num_chunks): a split token; its partial rows are first_slot.. in
//   position order.
struct TokenBuckets {
    std::vector<int> packed;
    int num_positions = 0, num_items = 0, num_reductions = 0, num_partial_rows = 0;

    void build(const int* tokens, int BT, int vocab) {
        std::vector<int> start(vocab + 1, 0);
        for (int i = 0; i < BT; i++) {
            if (tokens[i] < 0 || tokens[i] >= vocab) fail("token %d at position %d is outside [0, %d)", tokens[i], i, vocab);
            start[tokens[i] + 1]++;
        }
        for (int v = 0; v < vocab; v++) start[v + 1] += start[v];  // start[v] = first slot of token v
        packed.assign(BT, 0);
        std::vector<int> next(start.begin(), start.end() - 1), reductions;
        for (int i = 0; i < BT; i++) packed[next[tokens[i]]++] = i;  // stable: increasing positions
        num_partial_rows = 0;
        for (int v = 0; v < vocab; v++) {
            const int begin = start[v], end = start[v + 1];
            if (end - begin <= kEncoderChunk) {
                if (end > begin) packed.insert(packed.end(), {v, begin, end, -1});
                continue;
            }
            reductions.insert(reductions.end(), {v, num_partial_rows, (end - begin + kEncoderChunk - 1) / kEncoderChunk});
            for (int b = begin; b < end; b += kEncoderChunk)
                packed.insert(packed.end(), {v, b, std::min(b + kEncoderChunk, end), num_partial_rows++});
        }
        num_positions = BT;
        num_items = int(packed.size() - BT) / 4;
        num_reductions = int(reductions.size()) / 3;
        packed.insert(packed.end(), reductions.begin(), reductions.end());
        if (num_items > encoder_max_items(BT) || num_reductions > encoder_max_split_tokens(BT) ||
            num_partial_rows > encoder_max_partial_rows(BT))
            fail("encoder backward: %d items, %d split tokens, %d partial rows exceed the bounds for %d positions",
                 num_items, num_reductions, num_partial_rows, BT);
    }
};

// x = N consecutive values at p, as floats: whole 16-byte loads when N > 1 (p then 16-byte aligned).
template <int N, typename T> __device__ void load_floats(float (&x)[N], const T* p) {
    if constexpr (N == 1) {
        x[0] = to_float(*p);
    } else {
        constexpr int W = Vec128<T>::size;
        static_assert(N % W == 0, "whole vectors only");
#pragma unroll
        for (int k = 0; k < N; k += W) {
            const Vec128<T> v = Vec128<T>::load(p + k);
#pragma unroll
            for (int j = 0; j < W; j++) x[k + j] = to_float(v[j]);
        }
    }
}

template <int N, typename T> __device__ void store_floats(T* p, const float (&x)[N]) {
    if constexpr (N == 1) {
        *p = from_float<T>(x[0]);
    } else {
        constexpr int W = Vec128<T>::size;
        static_assert(N % W == 0, "whole vectors only");
#pragma unroll
        for (int k = 0; k < N; k += W) {
            Vec128<T> v;
#pragma unroll
            for (int j = 0; j < W; j++) v[j] = from_float<T>(x[k + j]);
            v.store(p + k);
        }
    }
}

// sum += row(0) + row(1) + ... + row(n - 1), in that order whatever n, each row VS values.
template <int VS, typename RowAddress> __device__ void add_rows_in_order(float (&sum)[VS], int n, RowAddress row) {
    int i = 0;
    for (; i + kEncoderRowsAhead <= n; i += kEncoderRowsAhead) {
        float x[kEncoderRowsAhead][VS];
#pragma unroll
        for (int r = 0; r < kEncoderRowsAhead; r++) load_floats(x[r], row(i + r));
#pragma unroll
        for (int r = 0; r < kEncoderRowsAhead; r++)
#pragma unroll
            for (int j = 0; j < VS; j++) sum[j] += x[r][j];
    }
    for (; i < n; i++) {
        float x[VS];
        load_floats(x, row(i));
#pragma unroll
        for (int j = 0; j < VS; j++) sum[j] += x[j];
    }
}

// d[0..VS) += sum, in fp32, rounded once to T.
template <int VS, typename T> __device__ void add_into(T* d, const float (&sum)[VS]) {
    float x[VS];
    load_floats(x, d);
#pragma unroll
    for (int j = 0; j < VS; j++) x[j] += sum[j];
    store_floats(d, x);
}

// One block per item: its dout rows summed in position order; each thread owns VS columns at a time.
template <typename T, int VS>
__global__ void encoder_backward_wte_kernel(T* dwte, float* partials, const T* dout, const int* positions,
                                            const int* items, int C) {
    __shared__ int rows[kEncoderChunk];  // the item's positions, read by every thread
    const int* item = items + 4 * blockIdx.x;
    const int token = item[0], begin = item[1], n = item[2] - item[1], slot = item[3];
    for (int i = threadIdx.x; i < n; i += blockDim.x) rows[i] = positions[begin + i];
    __syncthreads();
    for (int c = threadIdx.x * VS; c < C; c += blockDim.x * VS) {
        float sum[VS] = {};
        add_rows_in_order(sum, n, [&](int i) { return dout + size_t(rows[i]) * C + c; });
        if (slot >= 0) store_floats(partials + size_t(slot) * C + c, sum);
        else add_into(dwte + size_t(token) * C + c, sum);
    }
}

// One block per split token: its partial rows summed in chunk (= position) order, added into dwte.
template <typename T, int VS>
__global__ void encoder_backward_wte_reduce_kernel(T* dwte, const float* partials, const int* reductions, int C) {
    const int* reduction = reductions + 3 * blockIdx.x;
    const int token = reduction[0], first = reduction[1], n = reduction[2];
    for (int c = threadIdx.x * VS; c < C; c += blockDim.x * VS) {
        float sum[VS] = {};
        add_rows_in_order(sum, n, [&](int i) { return partials + size_t(first + i) * C + c; });
        add_into(dwte + size_t(token) * C + c, sum);
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

template <typename T, int VS>
void encoder_backward_wte(T* dwte, float* partials, const T* dout, const int* work, const TokenBuckets& buckets, int C,
                          cudaStream_t stream) {
    const int threads = std::min(256, ((C + VS - 1) / VS + 31) / 32 * 32);  // more columns: the threads loop
    const int* items = work + buckets.num_positions;
    const int* reductions = items + 4 * size_t(buckets.num_items);
    if (buckets.num_items > 0) {
        encoder_backward_wte_kernel<T, VS><<<buckets.num_items, threads, 0, stream>>>(dwte, partials, dout, work, items, C);
        cuda_check_launch();
    }
    if (buckets.num_reductions > 0) {
        encoder_backward_wte_reduce_kernel<T, VS><<<buckets.num_reductions, threads, 0, stream>>>(dwte, partials, reductions, C);
        cuda_check_launch();
    }
}

// dwte (V, C) += and dwpe (T, C) += the gradient of dout (B, T, C). work: device copy of buckets.packed,
// built from this batch; partials: device, encoder_backward_partials_bytes(B * T, C) bytes or more.
template <typename T>
void encoder_backward(T* dwte, T* dwpe, float* partials, const T* dout, const int* work, const TokenBuckets& buckets,
                      int B, int T_, int C, cudaStream_t stream = 0) {
    if (buckets.num_positions != B * T_)
        fail("encoder_backward: buckets built for %d positions, the batch has %d", buckets.num_positions, B * T_);
    constexpr int VS = Vec128<T>::size;
    const bool vec = C % VS == 0 && is_aligned16(dwte) && is_aligned16(dout) && is_aligned16(partials);
    if (vec) encoder_backward_wte<T, VS>(dwte, partials, dout, work, buckets, C, stream);
    else encoder_backward_wte<T, 1>(dwte, partials, dout, work, buckets, C, stream);
    const size_t n = size_t(T_) * C;
    encoder_backward_wpe_kernel<T><<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(dwpe, dout, B, T_, C);
    cuda_check_launch();
}
