// classifier.cuh: softmax cross-entropy over the logits, fused with its gradient.
//
// Per row of logits (B*T, Vp), over the first V columns only (columns V..Vp-1 are vocabulary padding
// for fast matmuls and never take part): p = softmax(logits), loss[row] = -log p[target]; when
// `dloss` is non-zero the row is overwritten in place with dlogits = (p - onehot(target)) * dloss and
// the padding columns with zeros, so the padding never receives gradient. (Training in bf16 on Hopper
// takes lm_head.cuh instead, which needs no pass over the logits; this runs everywhere else.)
//
// Non-obvious choices:
//   - The vector kernel (16-byte loads and stores; Vp a multiple of 8 bf16 / 4 fp32 values and the
//     logits 16-byte aligned, as in training) reads the row once for an online max/sum, a running
//     maximum and a sum rescaled when it grows, once per vector of 4-8 values rather than per value,
//     then a second time to write dlogits, counting on the row (100 KB for GPT-2) to be still in L2
//     then. Several vectors per thread are loaded before any is used, to keep enough bytes in
//     flight. The scalar kernel below is the fallback for any other Vp or alignment.
//   - The on-chip kernel (same vector conditions, and a row that fits in shared memory) reads the
//     row from memory exactly once and keeps it on the SM until its dlogits are written: in shared
//     memory (cp.async copies, no registers held, two 512-thread blocks per SM for a bf16 GPT-2 row
//     of 100 KB, so one block's loads overlap the other's arithmetic). With the whole row at hand it
//     takes the maximum first and then the sum of exponentials, no running rescale. fused_classifier
//     runs it wherever the row fits, else the vector kernel, else the scalar one. Keeping the row in
//     registers instead (the lab's versions 3 and 4) takes 128 registers a thread where this needs
//     32, and holds no fp32 GPT-2 row. The measurements: docs/classifier.md.
//   - __expf (ex2.approx after a multiply by log2 e; a few units in the last place for the arguments
//     here, all <= 0): the accurate expf costs ~10 instructions a value, and two exponentials per
//     logit at that price would make this pass compute-bound.
//   - loss = log(sum) + max - logit[target] in fp32, never log(p): no underflow for tiny p.
//   - Block reductions combine in a fixed order: the same bits every run.
#pragma once

#include <type_traits>

#include "common.cuh"
#include "ptx.cuh"

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

// ---------------------------------------------------------------------------------------------
// On-chip kernel: the row is read from memory once and kept on the SM.

// The shared-memory kernel's block: 512 threads, two blocks per SM for a bf16 GPT-2 row.
constexpr int kClassifierSharedThreads = 512;

// The on-chip kernel holds a 16-byte vector as its four 32-bit words (uint4), each word one fp32 or
// two bf16 (element 2k in the low half of word k), and reads values out of the words with shifts and
// masks. Holding Vec128<bf16> and touching single elements lets the compiler give every bf16 its
// own 32-bit register: twice the registers, and spills.
template <typename T> constexpr unsigned kNegInfWord = sizeof(T) == 2 ? 0xff80ff80u : 0xff800000u;  // -inf, -inf

__device__ __forceinline__ unsigned word_of(const uint4& w, int k) {  // k known at compile time
    return k == 0 ? w.x : k == 1 ? w.y : k == 2 ? w.z : w.w;
}
__device__ __forceinline__ void set_word(uint4& w, int k, unsigned value) {
    if (k == 0) w.x = value;
    else if (k == 1) w.y = value;
    else if (k == 2) w.z = value;
    else w.w = value;
}

// Element j (known at compile time) of a vector held as words, as a float: a bf16 is the top half of
// the fp32 with the same value, so the conversion is exact, as __bfloat162float.
template <typename T> __device__ __forceinline__ float value_of(const uint4& w, int j) {
    if constexpr (sizeof(T) == 2) {
        const unsigned word = word_of(w, j / 2);
        return __uint_as_float(j % 2 == 0 ? word << 16 : word & 0xffff0000u);
    } else {
        return __uint_as_float(word_of(w, j));
    }
}

// The vector with its elements j >= first (the padding after the last real column) set to -inf.
template <typename T> __device__ __forceinline__ uint4 with_negative_infinity_from(uint4 w, int first) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        unsigned word = word_of(w, k);
        if constexpr (sizeof(T) == 2) {
            if (2 * k >= first) word = kNegInfWord<T>;
            else if (2 * k + 1 >= first) word = (word & 0x0000ffffu) | 0xff800000u;
        } else {
            if (k >= first) word = kNegInfWord<T>;
        }
        set_word(w, k, word);
    }
    return w;
}

// Rounds VS floats into a vector; bf16 two at a time (one cvt.rn.bf16x2.f32, the same bits as two
// single conversions).
template <typename T> __device__ __forceinline__ Vec128<T> vec_from_floats(const float (&f)[Vec128<T>::size]) {
    Vec128<T> out;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
#pragma unroll
        for (int k = 0; k < Vec128<T>::size / 2; k++)
            reinterpret_cast<__nv_bfloat162*>(out.v)[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
    } else {
#pragma unroll
        for (int j = 0; j < Vec128<T>::size; j++) out[j] = from_float<T>(f[j]);
    }
    return out;
}

// Block-wide maximum and sum; every thread gets the result. scratch: BLOCK / 32 floats, one array per
// call site (no barrier between a reduction's reads and the next one's writes). The sum adds the warp
// partials in warp order: the same bits every run.
template <int BLOCK> __device__ __forceinline__ float block_max(float m, float* scratch) {
    m = warp_max(m);
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = m;
    __syncthreads();
    m = scratch[0];
    for (int w = 1; w < BLOCK / 32; w++) m = fmaxf(m, scratch[w]);
    return m;
}
template <int BLOCK> __device__ __forceinline__ float block_sum(float s, float* scratch) {
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = s;
    __syncthreads();
    s = scratch[0];
    for (int w = 1; w < BLOCK / 32; w++) s += scratch[w];
    return s;
}

template <typename T> __device__ __forceinline__ float vec_max(const uint4& w, float m) {
#pragma unroll
    for (int j = 0; j < Vec128<T>::size; j++) m = fmaxf(m, value_of<T>(w, j));
    return m;
}
// e[j] = exp(x[j] - m) for the values of one vector (0 for -inf, the padding).
template <typename T>
__device__ __forceinline__ void vec_exp(const uint4& w, float m, float (&e)[Vec128<T>::size]) {
#pragma unroll
    for (int j = 0; j < Vec128<T>::size; j++) e[j] = __expf(value_of<T>(w, j) - m);
}
template <typename T> __device__ __forceinline__ float vec_sum(const float (&e)[Vec128<T>::size]) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < Vec128<T>::size; j++) s += e[j];
    return s;
}

// dlogits of vector i from its exponentials (padding included: e = 0 gives p = 0, written as 0):
// (p - onehot(target)) * dloss with p = e * inv, as the vector kernel computes them.
template <typename T>
__device__ __forceinline__ Vec128<T> dlogits_of(const float (&e)[Vec128<T>::size], float inv, int i, int target,
                                                float dloss) {
    constexpr int VS = Vec128<T>::size;
    float d[VS];
#pragma unroll
    for (int j = 0; j < VS; j++) d[j] = e[j] * inv;
    if (i == target / VS) {  // the one vector with the target column; a select per value, where an
                             // `if` would become d[target % VS], a computed index: local memory
#pragma unroll
        for (int j = 0; j < VS; j++) d[j] -= j == target % VS ? 1.0f : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < VS; j++) d[j] *= dloss;
    return vec_from_floats<T>(d);
}

// Whether a row of Vp T's at `logits` can take 16-byte vectors (the vector kernel's condition).
template <typename T> bool classifier_vectors_fit(const T* logits, int Vp) {
    return Vp % Vec128<T>::size == 0 && is_aligned16(logits);
}

// Shared memory: one block per row, the row's vectors with real columns copied into Vp * sizeof(T)
// bytes of dynamic shared memory (100 KB for a bf16 GPT-2 row: two blocks per SM of the H100's
// 228 KB). The padding of the last vector with real columns is overwritten with -inf there, by the
// thread that copied it; the padding-only vectors are never read, only written as 0.
extern __shared__ uint4 classifier_row_smem[];

template <typename T, int BLOCK>
__global__ void __launch_bounds__(BLOCK, 2)
    fused_classifier_shared_kernel(T* logits, float* losses, const int* targets, float dloss, int V, int Vp) {
    constexpr int VS = Vec128<T>::size;
    __shared__ float smax[BLOCK / 32], ssum[BLOCK / 32];
    uint4* row = classifier_row_smem;  // (Vp / VS) vectors, the first vectors_with_v of them copied
    T* x = logits + size_t(blockIdx.x) * Vp;
    const int vectors = Vp / VS, vectors_with_v = (V + VS - 1) / VS;
    for (int i = threadIdx.x; i < vectors_with_v; i += BLOCK) ptx::cp_async16(&row[i], x + size_t(i) * VS);
    ptx::cp_async_wait_all();  // this thread's copies
    const int tail = V / VS;
    if (V % VS != 0 && threadIdx.x == tail % BLOCK)  // the thread that copied the tail vector
        row[tail] = with_negative_infinity_from<T>(row[tail], V % VS);
    __syncthreads();  // every thread's copies
    float m = -INFINITY;
    for (int i = threadIdx.x; i < vectors_with_v; i += BLOCK) m = vec_max<T>(row[i], m);
    m = block_max<BLOCK>(m, smax);
    float s = 0.0f;
    for (int i = threadIdx.x; i < vectors_with_v; i += BLOCK) {
        float e[VS];
        vec_exp<T>(row[i], m, e);
        s += vec_sum<T>(e);
    }
    s = block_sum<BLOCK>(s, ssum);
    const int target = targets[blockIdx.x];
    if (threadIdx.x == 0) losses[blockIdx.x] = logf(s) + m - to_float(reinterpret_cast<const T*>(row)[target]);
    if (dloss == 0.0f) return;
    const float inv = 1.0f / s;
    const uint4 padding = make_uint4(kNegInfWord<T>, kNegInfWord<T>, kNegInfWord<T>, kNegInfWord<T>);
    for (int i = threadIdx.x; i < vectors; i += BLOCK) {
        uint4 w = padding;  // an `if`, not `?:` over row[i]: the latter goes through local memory
        if (i < vectors_with_v) w = row[i];
        float e[VS];
        vec_exp<T>(w, m, e);
        dlogits_of<T>(e, inv, i, target, dloss).store_stream(x + size_t(i) * VS);
    }
}

// The most dynamic shared memory the shared-memory kernel can have on the current device (the
// per-block opt-in maximum less its static arrays), after allowing it that much and asking for the
// largest shared-memory carveout. Once per dtype (one device per process here).
template <typename T> int classifier_shared_max_bytes() {
    static int max_bytes = -1;
    if (max_bytes < 0) {
        const auto kernel = fused_classifier_shared_kernel<T, kClassifierSharedThreads>;
        int device = 0, optin = 0;
        cuda_check(cudaGetDevice(&device));
        cuda_check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        cudaFuncAttributes attr;
        cuda_check(cudaFuncGetAttributes(&attr, kernel));
        max_bytes = optin - int(attr.sharedSizeBytes);
        cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_bytes));
        cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        int(cudaSharedmemCarveoutMaxShared)));
    }
    return max_bytes;
}

template <typename T> bool classifier_shared_fits(const T* logits, int Vp) {
    return classifier_vectors_fit(logits, Vp) && size_t(Vp) * sizeof(T) <= size_t(classifier_shared_max_bytes<T>());
}

template <typename T>
void fused_classifier_shared(T* logits, float* losses, const int* targets, float dloss, int rows, int V, int Vp,
                             cudaStream_t stream = 0) {
    classifier_shared_max_bytes<T>();  // the attributes set before the first launch
    fused_classifier_shared_kernel<T, kClassifierSharedThreads>
        <<<rows, kClassifierSharedThreads, size_t(Vp) * sizeof(T), stream>>>(logits, losses, targets, dloss, V, Vp);
    cuda_check_launch();
}

// ---------------------------------------------------------------------------------------------

// targets: device (rows) ids, each in [0, V). dloss = 0 computes the losses only (logits kept).
// Runs the shared-memory kernel where the row fits it, else the vector kernel, else the scalar one.
template <typename T>
void fused_classifier(T* logits, float* losses, const int* targets, float dloss, int rows, int V, int Vp,
                      cudaStream_t stream = 0) {
    if (classifier_shared_fits(logits, Vp)) {
        fused_classifier_shared<T>(logits, losses, targets, dloss, rows, V, Vp, stream);
        return;
    }
    if (classifier_vectors_fit(logits, Vp))
        fused_classifier_vec_kernel<T><<<rows, kClassifierVecThreads, 0, stream>>>(logits, losses, targets, dloss, V, Vp);
    else
        fused_classifier_kernel<T><<<rows, kClassifierThreads, 0, stream>>>(logits, losses, targets, dloss, V, Vp);
    cuda_check_launch();
}
