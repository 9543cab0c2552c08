// test_random_init: random_init (model_config.h), which draws a fresh model's normals on several
// threads, each skipping ahead in the splitmix64 stream (Rng::skip), must give the bits of drawing the
// whole sequence in order on one thread, as written here: the normal tensors in param_specs' order
// (wte's first V rows; the residual projections with std 0.02 / sqrt(2 L), the rest 0.02), the
// LayerNorm scales 1, everything else 0 (biases, wte's padding rows V..Vp). Checked at 1, 2, 3, 7 and
// 64 threads and at the default count, on a small model with padding (V=1000, Vp=1024), a model with
// fewer normals than threads (L=1, C=1, V=1, maxT=1: 14 normals) and d6 (30 million parameters); and
// Rng::skip(n) against n draws. Host only: no GPU needed.
//
//   make build/test/test_random_init && ./build/test/test_random_init      (no flags; -h prints this usage)
#include <cstring>
#include <string>

#include "common.cuh"
#include "dev/lab.cuh"
#include "model_config.h"

static TestCounter counter;
static void report(const std::string& name, bool ok, const std::string& detail) {
    printf("  %-78s %s  %s\n", name.c_str(), ok ? "ok" : "FAILED", detail.c_str());
    counter.record(ok);
}

// The definition: one generator, every normal in order, two draws each.
static std::vector<float> sequential_init(const GPTConfig& c, uint64_t seed) {
    std::vector<float> params(num_parameters(c), 0.0f);
    Rng rng(seed);
    const auto specs = param_specs(c);
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        const ParamSpec& s = specs[i];
        if (s.init == kInitNormal || s.init == kInitResidualNormal) {
            const float std = s.init == kInitResidualNormal ? 0.02f / std::sqrt(2.0f * c.L) : 0.02f;
            const size_t n = i == kParam_wte ? size_t(c.V) * c.C : s.count();
            for (size_t j = 0; j < n; j++) params[offset + j] = rng.normal() * std;
        } else if (s.init == kInitOnes) {
            std::fill(params.begin() + offset, params.begin() + offset + s.count(), 1.0f);
        }
        offset += s.count();
    }
    return params;
}

static size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
    const size_t n = std::min(a.size(), b.size());
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
    return a.size() == b.size() ? a.size() : n;
}

int main(int argc, char** argv) {
    if (argc > 1) {
        const bool help = std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help";
        fprintf(help ? stdout : stderr, "%susage: ./build/test/test_random_init   (no flags)\n",
                help ? "" : ("error: unknown argument '" + std::string(argv[1]) + "'\n").c_str());
        return help ? 0 : 1;
    }
    printf("Rng::skip\n");
    {
        bool ok = true;
        for (uint64_t n : {0ull, 1ull, 2ull, 1000ull, 123457ull}) {
            Rng a(7), b(7);
            for (uint64_t i = 0; i < n; i++) a.next();
            b.skip(n);
            ok &= a.next() == b.next() && a.normal() == b.normal();
        }
        report("skip(n) leaves the stream where n draws do", ok, "n in {0, 1, 2, 1000, 123457}, seed 7");
    }
    GPTConfig small{2, 2, 64, 32, 1000, 1024}, tiny{1, 1, 1, 1, 1, 128}, d6;
    config_from_descriptor("d6", d6);
    const struct { const char* name; GPTConfig c; uint64_t seed; } models[] = {
        {"L=2 C=64 V=1000 Vp=1024", small, 1337}, {"L=1 C=1 V=1 Vp=128", tiny, 5}, {"d6", d6, 42}};
    for (const auto& model : models) {
        printf("%s (%zu parameters)\n", model.name, num_parameters(model.c));
        const std::vector<float> want = sequential_init(model.c, model.seed);
        for (int threads : {1, 2, 3, 7, 64, 0}) {
            const HostModel got = random_init(model.c, model.seed, threads);
            const size_t at = first_difference(got.params, want);
            const bool same = got.params.size() == want.size() && at == want.size();
            const std::string who = threads ? std::to_string(threads) + " threads" : "the default thread count";
            report("random_init on " + who + " = one thread drawing in order", same,
                   same ? "every bit" : "first difference at parameter " + std::to_string(at));
        }
    }
    return counter.finish();
}
