// dev/lab.cuh: what every kernel laboratory in dev/cuda and every test program (test_gpt.cu, test/*.cu)
// shares: the one timing helper (CUDA events, warm-up, median of many runs), the one tolerance check
// and the `N passed, N failed, N skipped` line, random inputs (from common.cuh's Rng), device buffers
// that can be misaligned on purpose, and strict integer flags. Training never includes it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common.cuh"

// Name of a storage type, for messages and tables.
template <typename T> inline const char* dtype_name();
template <> inline const char* dtype_name<float>() { return "fp32"; }
template <> inline const char* dtype_name<__nv_bfloat16>() { return "bf16"; }

// Host conversion of a storage type (or a double) to double, for references and checks.
inline double to_double(double x) { return x; }
inline double to_double(float x) { return x; }
inline double to_double(__nv_bfloat16 x) { return __bfloat162float(x); }

// ---------------------------------------------------------------------------------------------
// Timing: median of `reps` runs after `warmup` runs, each run timed with its own pair of events.
// `run` is any callable that enqueues work on `stream`.

// Milliseconds of each of `reps` calls of run after `warmup` untimed ones, in call order.
template <typename F> std::vector<float> time_each_ms(F run, int warmup, int reps, cudaStream_t stream = 0) {
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
    return ms;
}
template <typename F> float time_median_ms(F run, int warmup = 10, int reps = 50, cudaStream_t stream = 0) {
    std::vector<float> ms = time_each_ms(run, warmup, reps, stream);
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2];
}

// Median milliseconds of a device-to-device cudaMemcpy of `bytes` (fresh buffers, freed after).
inline float time_copy_ms(size_t bytes, int warmup, int reps) {
    void *src = device_malloc(bytes, "copy source"), *dst = device_malloc(bytes, "copy target");
    cuda_check(cudaMemset(src, 1, bytes));
    const float ms = time_median_ms([&] { cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); }, warmup, reps);
    cuda_check(cudaFree(src));
    cuda_check(cudaFree(dst));
    return ms;
}

// Device-to-device copy bandwidth in GB/s (bytes read + bytes written), measured in the same run as
// a benchmark so kernels are reported as a fraction of what this card does today.
inline double measure_copy_bandwidth_gbs(size_t bytes = size_t(2) << 30) {
    return 2.0 * bytes / (time_copy_ms(bytes, 3, 20) * 1e-3) / 1e9;
}

// What a memory-bound kernel of `traffic` bytes (read + written) cannot beat at its size: a
// device-to-device copy of the same traffic (traffic / 2 bytes copied) and an empty kernel launched
// with the same grid and block, each timed like a benchmark row (median of 100 after 10). Prints two
// rows in the labs' format: a name, dtype and C, then time, GB/s and % of the long copy's bandwidth.
__global__ void lab_empty_kernel() {}
inline void print_launch_floor(const char* dtype, int C, double traffic, int grid, int block, double copy_gbs) {
    const float copy_ms = time_copy_ms(size_t(traffic / 2), 10, 100);
    const float empty_ms = time_median_ms([&] { lab_empty_kernel<<<grid, block>>>(); }, 10, 100);
    cuda_check_launch();
    const double gbs = traffic / (copy_ms * 1e-3) / 1e9;
    printf("  %-10s %-6s %-8d %10.1f %10.1f %7.1f%%  (cudaMemcpy of the same bytes)\n", "copy", dtype, C, copy_ms * 1e3, gbs,
           100.0 * gbs / copy_gbs);
    printf("  %-10s %-6s %-8d %10.1f %10s %8s  (empty kernel, grid %d x %d threads)\n", "empty", dtype, C, empty_ms * 1e3, "-", "-",
           grid, block);
}

// ---------------------------------------------------------------------------------------------
// Tests: one tolerance check and one counter, shared by every dev program and test.

// A lab's run_version returns a note when it ran another version in the requested one's place (no
// path for the shape or GPU), ending ", ran vN": that run checks the other version, which has its own
// check, so the requested one's counts as skipped, not passed.
inline bool fell_back(const char* note) { return note && strstr(note, ", ran v"); }

struct TestCounter {
    int passed = 0, failed = 0, skipped = 0;
    void pass() { passed++; }
    void fail_one() { failed++; }
    void skip(const char* what, const char* why = "no CUDA device") {
        printf("%s: skipped (%s)\n", what, why);
        skipped++;
    }
    void record(bool ok) { ok ? passed++ : failed++; }
    // A lab's check_one result: 1 passed, 0 failed, -1 another version ran in this one's place (fell_back).
    void record(const char* what, int result) {
        if (result < 0) skip(what, "another version ran in its place");
        else record(result == 1);
    }
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

// ---------------------------------------------------------------------------------------------
// Inputs (Rng: common.cuh) and device buffers.

template <typename T> void fill_uniform(std::vector<T>& x, float lo, float hi, Rng& rng) {
    for (auto& v : x) v = from_float<T>(rng.uniform(lo, hi));
}

// Row r of an (N, C) tensor: offset_r + scale_r * U(-1, 1), offset in [-2, 2] (0 for every fourth
// row), scale in [1, 2], so |mean| / std <= 2 / (1 / sqrt(3)) ~ 3.5: rows with a non-zero mean, which
// a one-pass variance would get wrong.
template <typename T> void fill_rows(std::vector<T>& x, int N, int C, Rng& rng) {
    for (int n = 0; n < N; n++) {
        const float offset = n % 4 == 0 ? 0.0f : rng.uniform(-2.0f, 2.0f), scale = rng.uniform(1.0f, 2.0f);
        for (int c = 0; c < C; c++) x[size_t(n) * C + c] = from_float<T>(offset + scale * rng.uniform(-1.0f, 1.0f));
    }
}

// Device buffer of n elements of T, `shift` elements past a 256-byte aligned allocation (shift = 1
// makes every 16-byte vector path unusable, exercising the general paths).
template <typename T> struct DeviceBuffer {
    void* base = nullptr;
    T* ptr = nullptr;
    size_t n = 0;
    DeviceBuffer(size_t n_, const char* what, int shift = 0) : n(n_) {
        base = device_malloc((std::max<size_t>(n, 1) + shift) * sizeof(T), what);
        ptr = static_cast<T*>(base) + shift;
    }
    ~DeviceBuffer() { cudaFree(base); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    void upload(const std::vector<T>& h) { cuda_check(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
    std::vector<T> download() const {
        std::vector<T> h(n);
        cuda_check(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
    void poison() { cuda_check(cudaMemset(ptr, 0xff, n * sizeof(T))); }  // all-ones bytes: NaN in fp32 and bf16
};

// The value that follows flag argv[i] (i moves onto it), else the usage and an error.
inline const char* flag_value(int argc, char** argv, int& i, void (*usage)(FILE*)) {
    if (i + 1 >= argc) {
        usage(stderr);
        fail("%s needs a value", argv[i]);
    }
    return argv[++i];
}

// --dtype's value: true for bf16, false for fp32, else the usage and an error.
inline bool parse_dtype_is_bf16(const std::string& d, void (*usage)(FILE*)) {
    if (d != "fp32" && d != "bf16") {
        usage(stderr);
        fail("--dtype must be fp32 or bf16, got '%s'", d.c_str());
    }
    return d == "bf16";
}

// A flag's integer value: all of `s` a decimal number in [lo, 2^30], else the usage and an error.
inline int parse_int(const char* s, const char* what, int lo, void (*usage)(FILE*)) {
    char* end = nullptr;
    const long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > (1 << 30)) {
        usage(stderr);
        fail("%s must be an integer >= %d, got '%s'", what, lo, s);
    }
    return (int)v;
}
