// common.cuh: the one place for things every program here shares.
//   - error handling: cuda_check / cublas_check, and fail() for a one-line error plus a non-zero exit
//   - floatX: the activation/parameter type of a training build (PRECISION=FP32|BF16)
//   - Vec128<T>: the one 128-bit vector type, for 16-byte loads and stores
//   - time_median_ms: the one timing helper (CUDA events, warm-up, median of many runs)
//   - check_close / TestCounter: the one tolerance check and the `N passed, N failed, N skipped` line
// Host-only programs may include it too (it needs only the CUDA runtime headers).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

// ---------------------------------------------------------------------------------------------
// Errors. Every failure a user can cause ends in one line on stderr and exit code 1; never an assert
// or a core dump.

[[noreturn]] inline void fail(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    exit(1);
}

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

// Name of a storage type, for messages and tables.
template <typename T> inline const char* dtype_name();
template <> inline const char* dtype_name<float>() { return "fp32"; }
template <> inline const char* dtype_name<__nv_bfloat16>() { return "bf16"; }

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
    __device__ static Vec128 zero() {
        Vec128 out;
        *reinterpret_cast<int4*>(out.v) = make_int4(0, 0, 0, 0);  // 0.0 in fp32 and bf16 alike
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
// Host conversions between float and storage types (also usable on the device).

__host__ __device__ inline float to_float(float x) { return x; }
__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __host__ __device__ inline T from_float(float x);
template <> __host__ __device__ inline float from_float<float>(float x) { return x; }
template <> __host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
inline double to_double(double x) { return x; }
inline double to_double(float x) { return x; }
inline double to_double(__nv_bfloat16 x) { return __bfloat162float(x); }

// ---------------------------------------------------------------------------------------------
// Timing: median of `reps` runs after `warmup` runs, each run timed with its own pair of events.
// `run` is any callable that enqueues work on `stream`.

template <typename F> float time_median_ms(F run, int warmup = 10, int reps = 50, cudaStream_t stream = 0) {
    for (int i = 0; i < warmup; i++) run();
    cuda_check(cudaStreamSynchronize(stream));
    std::vector<cudaEvent_t> events(2 * reps);
    for (auto& e : events) cuda_check(cudaEventCreate(&e));
    for (int i = 0; i < reps; i++) {
        cuda_check(cudaEventRecord(events[2 * i], stream));
        run();
        cuda_check(cudaEventRecord(events[2 * i + 1], stream));
    }
    cuda_check(cudaStreamSynchronize(stream));
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; i++) cuda_check(cudaEventElapsedTime(&ms[i], events[2 * i], events[2 * i + 1]));
    for (auto& e : events) cuda_check(cudaEventDestroy(e));
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2];
}

// Device-to-device copy bandwidth in GB/s (bytes read + bytes written), measured in the same run as
// a benchmark so kernels are reported as a fraction of what this card does today.
inline double measure_copy_bandwidth_gbs(size_t bytes = size_t(2) << 30) {
    void *src = device_malloc(bytes, "copy-bandwidth source"), *dst = device_malloc(bytes, "copy-bandwidth target");
    cuda_check(cudaMemset(src, 1, bytes));
    float ms = time_median_ms([&] { cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); }, 3, 20);
    cuda_check(cudaFree(src));
    cuda_check(cudaFree(dst));
    return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

// ---------------------------------------------------------------------------------------------
// Tests: one tolerance check and one counter, shared by every dev program and test.

struct TestCounter {
    int passed = 0, failed = 0, skipped = 0;
    void pass() { passed++; }
    void fail_one() { failed++; }
    void skip(const char* what) {
        printf("%s: skipped (no CUDA device)\n", what);
        skipped++;
    }
    void record(bool ok) { ok ? passed++ : failed++; }
    // Prints the closing count line; returns the process exit code.
    int finish() const {
        printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
        return failed == 0 ? 0 : 1;
    }
};

// Compares `got` against the higher-precision reference `ref`, element by element, with the bound
// |got - ref| <= atol + rtol * |ref|. Non-finite values (unwritten poison included) always fail.
// Prints one line: what was compared, the worst error, and the bound it was held to.
template <typename G, typename R>
bool check_close(const char* what, const G* got, const R* ref, size_t n, double atol, double rtol,
                 bool verbose = true) {
    double worst_excess = -1e300, worst_abs = 0.0;
    size_t worst_i = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        double g = (double)to_double(got[i]), r = (double)ref[i];
        double err = std::fabs(g - r), bound = atol + rtol * std::fabs(r);
        bool ok = std::isfinite(g) && err <= bound;
        if (!ok) bad++;
        double excess = std::isfinite(g) ? err - bound : 1e300;
        if (excess > worst_excess) worst_excess = excess, worst_i = i;
        if (std::isfinite(g)) worst_abs = std::max(worst_abs, err);
    }
    if (verbose || bad) {
        double g = n ? (double)to_double(got[worst_i]) : 0.0, r = n ? (double)ref[worst_i] : 0.0;
        printf("  %-40s %s  max|err| %.3e  bound %.1e + %.1e|ref|  worst [%zu] got %.6g ref %.6g  (%zu/%zu bad)\n",
               what, bad ? "FAIL" : "ok  ", worst_abs, atol, rtol, worst_i, g, r, bad, n);
    }
    return bad == 0;
}
