// dev/lab.cuh: what every kernel laboratory in dev/cuda shares: reproducible random inputs, device
// buffers that can be misaligned on purpose, and strict integer flags.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common.cuh"

// Reproducible pseudo-random numbers (splitmix64): the same seed gives the same inputs everywhere.
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    float uniform(float lo, float hi) { return lo + (hi - lo) * float((next() >> 40) * (1.0 / 16777216.0)); }
};

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
