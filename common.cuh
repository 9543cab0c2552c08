// common.cuh: the one place for things every program here shares.
//   - error handling: cuda_check / cublas_check, and fail() for a one-line error plus a non-zero exit
//   - floatX: the activation/parameter type of a training build (PRECISION=FP32|BF16)
//   - Vec128<T>: the one 128-bit vector type, for 16-byte loads and stores
//   - warp_sum / warp_max: the one warp-wide reduction of each kind; abs_bits / block_atomic_max: FP8's amax
//   - Rng: the one pseudo-random generator (splitmix64, host)
// The labs' and tests' own helpers (timing, tolerance checks, the pass/fail count) are in dev/lab.cuh.
// Host-only programs may include it too (it needs only the CUDA runtime headers).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

// ---------------------------------------------------------------------------------------------
// Errors. Every failure a user can cause ends in one line on stderr and exit code 1; never an assert
// or a core dump.

// The line is written in one piece: ranks of a multi-GPU run that share a terminal or a log file
// then never interleave their messages mid-line.
[[noreturn]] inline void fail(const char* fmt, ...) {
    char line[4096] = "error: ";
    const size_t prefix = strlen(line);
    va_list args;
    va_start(args, fmt);
    vsnprintf(line + prefix, sizeof(line) - prefix - 1, fmt, args);
    va_end(args);
    strcat(line, "\n");
    fwrite(line, 1, strlen(line), stderr);
    exit(1);
}

// For std::set_new_handler at the start of a program: a host allocation too large for the machine
// (a model or file whose header asks for more) ends in one line, not std::bad_alloc's abort.
inline void fail_out_of_host_memory() { fail("out of host memory"); }

inline void cuda_check_impl(cudaError_t err, const char* expr, const char* file, int line) {
    if (err != cudaSuccess) fail("CUDA: %s (%s) at %s:%d", cudaGetErrorString(err), expr, file, line);
}
#define cuda_check(expr) cuda_check_impl((expr), #expr, __FILE__, __LINE__)
// After a kernel launch: catches bad launch configurations at the launch site.
#define cuda_check_launch() cuda_check_impl(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// cudaMalloc that says how much was asked and how much was free, so an out-of-memory run tells the
// user what to shrink. Never falls back to managed memory.
inline void* device_malloc(size_t bytes, const char* what) {
    void* ptr = nullptr;
    cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();  // clear the sticky-free error so the query below works
        size_t free_bytes = 0, total_bytes = 0;
        cudaMemGetInfo(&free_bytes, &total_bytes);
        fail("out of GPU memory allocating %s: requested %.3f GiB, free %.3f GiB of %.3f GiB "
             "(try a smaller -b, or train_gpt's -r 1: GELU recomputed in the backward)",
             what, bytes / 1073741824.0, free_bytes / 1073741824.0, total_bytes / 1073741824.0);
    }
    return ptr;
}

// Seconds on a steady clock (for durations, deadlines and tokens/s).
inline double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// True when a CUDA device is usable; GPU tests print `skipped (no CUDA device)` otherwise.
inline bool cuda_device_available() {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return count > 0;
}

// ---------------------------------------------------------------------------------------------
// Precision of a training build. Statistics, reductions, loss and optimizer state are fp32 always.

#if defined(ENABLE_FP32)
typedef float floatX;
#define PRECISION_NAME "fp32"
#else
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "bf16"
#endif

// ---------------------------------------------------------------------------------------------
// Vec128<T>: 16 bytes of T, loaded and stored in one instruction (LDG.128 / STG.128). The pointer
// must be 16-byte aligned; callers take the vector path only when it is.

template <typename T> struct alignas(16) Vec128 {
    static constexpr int size = 16 / sizeof(T);
    T v[size];

    __device__ __host__ T& operator[](int i) { return v[i]; }
    __device__ __host__ const T& operator[](int i) const { return v[i]; }
    __device__ static Vec128 load(const T* ptr) {
        Vec128 out;
        *reinterpret_cast<int4*>(out.v) = *reinterpret_cast<const int4*>(ptr);
        return out;
    }
    // Streaming load: data read once, do not keep it in L1/L2 at the expense of data reused later.
    __device__ static Vec128 load_stream(const T* ptr) {
        Vec128 out;
        *reinterpret_cast<int4*>(out.v) = __ldcs(reinterpret_cast<const int4*>(ptr));
        return out;
    }
    __device__ void store(T* ptr) const { *reinterpret_cast<int4*>(ptr) = *reinterpret_cast<const int4*>(v); }
    __device__ void store_stream(T* ptr) const {
        __stcs(reinterpret_cast<int4*>(ptr), *reinterpret_cast<const int4*>(v));
    }
};

inline bool is_aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

// ---------------------------------------------------------------------------------------------
// Warp reductions: the butterfly leaves every lane holding the same bits (the same sum in the same
// order on each lane), which the kernels rely on where every lane then uses the result.

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// FP8's amax (fp8.cuh) is a max over the bits of |x|: non-negative floats order as their bits do (a
// NaN's above every number), so the max is the same bits in any order, atomics included. The
// producers that write a tensor's amax beside it (layernorm_forward and _backward), the FP8 casts that
// record it (fp8.cuh) and the FP8 amax kernel share these two.
__device__ __forceinline__ unsigned abs_bits(float x) { return __float_as_uint(fabsf(x)); }
// *dst = max(*dst, v over the block's BLOCK threads): one atomicMax per block. Every thread of the
// block calls it (a barrier inside).
template <int BLOCK> __device__ __forceinline__ void block_atomic_max(unsigned* dst, unsigned v) {
    static_assert(BLOCK % 32 == 0 && BLOCK <= 1024, "whole warps, at most 1024 threads");
    __shared__ unsigned warp_max_bits[BLOCK / 32];
    v = __reduce_max_sync(0xffffffffu, v);  // sm_80+: one instruction for the warp's unsigned max
    if (threadIdx.x % 32 == 0) warp_max_bits[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < BLOCK / 32; w++) v = max(v, warp_max_bits[w]);
        atomicMax(dst, v);
    }
}

// ---------------------------------------------------------------------------------------------
// Host conversions between float and storage types (also usable on the device).

__host__ __device__ inline float to_float(float x) { return x; }
__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __host__ __device__ inline T from_float(float x);
template <> __host__ __device__ inline float from_float<float>(float x) { return x; }
template <> __host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// ---------------------------------------------------------------------------------------------
// Rng: reproducible pseudo-random numbers on the host (splitmix64). train_gpt draws its
// initialization, data order and sampling from it, so its stream and these methods must stay as they
// are: checkpoints, resumed runs and their data order depend on them. The labs and tests draw their
// inputs from it too, so the same seed gives the same inputs everywhere.

// SplitMix64: the state advances by kSplitMixStep, and each state is mixed into one output.
constexpr uint64_t kSplitMixStep = 0x9E3779B97F4A7C15ull;
__host__ __device__ inline uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

struct Rng {
    uint64_t state;
    explicit Rng(uint64_t seed = 0) : state(seed) {}
    uint64_t next() { return splitmix64_mix(state += kSplitMixStep); }
    // Moves the stream n draws ahead at once (the state only adds kSplitMixStep a draw), so a part of
    // the stream can be drawn apart from what precedes it: the same numbers as drawing it in order.
    void skip(uint64_t n) { state += n * kSplitMixStep; }
    double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1), 53 random bits
    float normal() {
        const double u1 = 1.0 - uniform(), u2 = uniform();  // u1 in (0, 1]: log is finite
        return (float)(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
    // [lo, hi) from 24 random bits (a float's worth): the labs' and tests' inputs.
    float uniform(float lo, float hi) { return lo + (hi - lo) * float((next() >> 40) * (1.0 / 16777216.0)); }
};
