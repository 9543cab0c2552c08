// model_config.h: GPT-2's configuration and its parameter tensors, declared once.
//
// GPT_PARAMETER_TENSORS is the one list of the model's parameters: each tensor's name, its shape
// from the config, whether it takes weight decay, whether it is stacked over the layers, and its
// init. Everything else follows from it: the sizes and the flat buffer's order (which is also the
// checkpoint's and llm.c's order), the named views (ParameterTensors in train_gpt.cu), random init,
// AdamW's decay, the data-parallel buckets (the per-layer tensors), the checks of the converters.
// gpt_reference.py holds the same list in Python; test/test_formats.py checks that the two agree
// (checkpoint_tool layout prints this one).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <sched.h>

#include "common.cuh"

struct GPTConfig {
    int L = 0, NH = 0, C = 0, maxT = 0, V = 0, Vp = 0;  // layers, heads, channels, max sequence, vocab, padded vocab
};

inline int padded_vocab(int V) { return (V + 127) / 128 * 128; }  // 50257 -> 50304: whole matmul tiles

// Returns "" when valid, else what is wrong. Limits keep every size below 2^31 elements per tensor.
inline std::string config_error(const GPTConfig& c) {
    char buf[256];
    if (c.L < 1 || c.L > 1024 || c.NH < 1 || c.C < 1 || c.C > 65536 || c.maxT < 1 || c.maxT > 65536 || c.V < 1 ||
        c.V > 1 << 20 || c.Vp < c.V || c.Vp > (1 << 20) + 128 || c.C % c.NH != 0) {
        snprintf(buf, sizeof(buf), "invalid model config L=%d NH=%d C=%d maxT=%d V=%d Vp=%d", c.L, c.NH, c.C, c.maxT, c.V,
                 c.Vp);
        return buf;
    }
    // The largest tensors: fcw and fcprojw (L x 4C x C), wte (Vp x C), wpe (maxT x C).
    const uint64_t largest = std::max({uint64_t(c.L) * 4 * c.C * c.C, uint64_t(c.Vp) * c.C, uint64_t(c.maxT) * c.C});
    if (largest >= uint64_t(1) << 31) {
        snprintf(buf, sizeof(buf), "model config L=%d NH=%d C=%d maxT=%d V=%d Vp=%d: a tensor of %llu elements, the limit is 2^31",
                 c.L, c.NH, c.C, c.maxT, c.V, c.Vp, (unsigned long long)largest);
        return buf;
    }
    return "";
}

// GPT-2 descriptors: d12 is GPT-2 124M, d24 350M, d36 774M, d48 1558M; d6 a small one for quick runs.
inline bool config_from_descriptor(const std::string& d, GPTConfig& c) {
    struct { const char* name; int L, NH, C; } table[] = {
        {"d6", 6, 6, 384}, {"d12", 12, 12, 768}, {"d24", 24, 16, 1024}, {"d36", 36, 20, 1280}, {"d48", 48, 25, 1600}};
    for (auto& t : table)
        if (d == t.name) {
            c.L = t.L, c.NH = t.NH, c.C = t.C, c.maxT = 1024, c.V = 50257, c.Vp = padded_vocab(50257);
            return true;
        }
    return false;
}

// The config in words, for messages: "L=12 NH=12 C=768 maxT=1024 V=50257 Vp=50304".
inline std::string config_text(const GPTConfig& c) {
    char buf[160];
    snprintf(buf, sizeof(buf), "L=%d NH=%d C=%d maxT=%d V=%d Vp=%d", c.L, c.NH, c.C, c.maxT, c.V, c.Vp);
    return buf;
}

// How a tensor starts (GPT-2's init): N(0, 0.02) for matrices and embeddings, N(0, 0.02 / sqrt(2L))
// for the two projections into the residual stream, ones for LayerNorm weights, zeros for biases.
enum ParamInit { kInitNormal, kInitResidualNormal, kInitOnes, kInitZeros };

// X(name, rows, cols, weight decay, per layer, init): a tensor of rows x cols (cols = 1: a vector),
// or with `per layer` one such per layer, stacked: (L, rows, cols). The order is the flat buffer's.
// rows and cols are expressions in C, Vp and maxT.
#define GPT_PARAMETER_TENSORS(X)                                    \
    X(wte,      Vp,    C,     true,  false, kInitNormal)            \
    X(wpe,      maxT,  C,     true,  false, kInitNormal)            \
    X(ln1w,     C,     1,     false, true,  kInitOnes)              \
    X(ln1b,     C,     1,     false, true,  kInitZeros)             \
    X(qkvw,     3 * C, C,     true,  true,  kInitNormal)            \
    X(qkvb,     3 * C, 1,     false, true,  kInitZeros)             \
    X(attprojw, C,     C,     true,  true,  kInitResidualNormal)    \
    X(attprojb, C,     1,     false, true,  kInitZeros)             \
    X(ln2w,     C,     1,     false, true,  kInitOnes)              \
    X(ln2b,     C,     1,     false, true,  kInitZeros)             \
    X(fcw,      4 * C, C,     true,  true,  kInitNormal)            \
    X(fcb,      4 * C, 1,     false, true,  kInitZeros)             \
    X(fcprojw,  C,     4 * C, true,  true,  kInitResidualNormal)    \
    X(fcprojb,  C,     1,     false, true,  kInitZeros)             \
    X(lnfw,     C,     1,     false, false, kInitOnes)              \
    X(lnfb,     C,     1,     false, false, kInitZeros)

// kParam_wte, kParam_wpe, ...: a tensor's place in the list.
enum ParamIndex {
#define GPT_PARAM_INDEX(name, ...) kParam_##name,
    GPT_PARAMETER_TENSORS(GPT_PARAM_INDEX)
#undef GPT_PARAM_INDEX
    NUM_PARAM_TENSORS
};

struct ParamSpec {
    const char* name;
    size_t rows, cols;  // one layer's shape for per-layer tensors
    bool decay, per_layer;
    ParamInit init;
    size_t layers = 1;  // L for per-layer tensors
    size_t per_layer_count() const { return rows * cols; }
    size_t count() const { return layers * rows * cols; }
};

inline std::array<ParamSpec, NUM_PARAM_TENSORS> param_specs(const GPTConfig& c) {
    const size_t C = c.C, Vp = c.Vp, maxT = c.maxT;
    std::array<ParamSpec, NUM_PARAM_TENSORS> specs = {{
#define GPT_PARAM_SPEC(name, rows, cols, decay, per_layer, init) {#name, rows, cols, decay, per_layer, init},
        GPT_PARAMETER_TENSORS(GPT_PARAM_SPEC)
#undef GPT_PARAM_SPEC
    }};
    for (ParamSpec& s : specs) s.layers = s.per_layer ? size_t(c.L) : 1;
    return specs;
}

inline const char* param_name(int i) {
    static const char* const names[NUM_PARAM_TENSORS] = {
#define GPT_PARAM_NAME(name, ...) #name,
        GPT_PARAMETER_TENSORS(GPT_PARAM_NAME)
#undef GPT_PARAM_NAME
    };
    return names[i];
}

inline void param_sizes(const GPTConfig& c, size_t sizes[NUM_PARAM_TENSORS]) {
    const auto specs = param_specs(c);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) sizes[i] = specs[i].count();
}

inline size_t num_parameters(const GPTConfig& c) {
    size_t n = 0;
    for (const ParamSpec& s : param_specs(c)) n += s.count();
    return n;
}

// The model on the host, as read from a checkpoint or made by random init: fp32 parameters.
struct HostModel {
    GPTConfig config;
    std::vector<float> params;
};

// Draws every tensor's init in the list's order from one generator; the padding rows of wte
// (V..Vp) stay 0, as they never meet a token. Each normal takes two draws, so element k of the
// normal-initialized tensors, counted in the list's order, comes from draws 2k and 2k+1: threads fill
// slices of that sequence apart (Rng::skip) with the bits of drawing it in order (d48's 1.56 billion
// normals took a minute on one core). threads: how many draw (0: as many as this process may run on).
inline HostModel random_init(const GPTConfig& c, uint64_t seed, int threads_wanted = 0) {
    HostModel m{c, std::vector<float>(num_parameters(c), 0.0f)};
    struct NormalRun { float* p; size_t n; float std; uint64_t first; };  // first: its index in the sequence
    std::vector<NormalRun> runs;
    const auto specs = param_specs(c);
    size_t offset = 0, normals = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const ParamSpec& s = specs[i];
        float* p = m.params.data() + offset;
        if (s.init == kInitNormal || s.init == kInitResidualNormal) {
            const float std = s.init == kInitResidualNormal ? 0.02f / std::sqrt(2.0f * c.L) : 0.02f;
            const size_t n = i == kParam_wte ? size_t(c.V) * c.C : s.count();
            runs.push_back({p, n, std, normals});
            normals += n;
        } else if (s.init == kInitOnes) {
            std::fill(p, p + s.count(), 1.0f);
        }
        offset += s.count();
    }
    // Thread t draws normals [normals * t / threads, normals * (t + 1) / threads) of the sequence; by
    // default as many threads as this process may run on (several ranks on one node share its cores),
    // at most 64. A thread that cannot be started leaves the rest of the sequence to this one.
    cpu_set_t cpus;
    const int usable = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    const unsigned threads = unsigned(threads_wanted > 0 ? threads_wanted : std::clamp(usable, 1, 64));
    auto fill = [&](uint64_t lo, uint64_t hi) {
        Rng rng(seed);
        rng.skip(2 * lo);
        for (const NormalRun& r : runs) {
            const uint64_t a = std::max(lo, r.first), b = std::min<uint64_t>(hi, r.first + r.n);
            for (uint64_t k = a; k < b; k++) r.p[k - r.first] = rng.normal() * r.std;
        }
    };
    std::vector<std::thread> pool;
    const uint64_t own_end = normals / threads;  // this thread's part: [0, own_end), then what no thread took
    unsigned t = 1;
    for (; t < threads; t++) {
        try {
            pool.emplace_back(fill, normals * t / threads, normals * (t + 1) / threads);
        } catch (const std::system_error&) {
            break;
        }
    }
    fill(0, own_end);
    if (t < threads) fill(normals * t / threads, normals);
    for (std::thread& th : pool) th.join();
    return m;
}
