// attention_forward.cu: the causal attention forward laboratory. Numbered versions retrace how the
// kernel got fast; version 9 is the header's flash_attention_forward (flash_attention.cuh), so the
// lab measures what training runs (10-12: Hopper wgmma; 11, the header's choice, runs inside 9).
// Every version is validated against the double-precision CPU reference
// (dev/cuda/attention_lab.cuh, which also states the tolerances) at many shapes, then
// benchmarked.
//
//   make dev/cuda/attention_forward
//   ./dev/cuda/attention_forward            validate, then benchmark every version at B=64 NH=12 T=1024 HS=64 bf16
//   ./dev/cuda/attention_forward 4 9        only versions 4 and 9
//   ./dev/cuda/attention_forward --check    validation only (what CI runs; skips without a GPU)
//
// Layouts (all versions): qkv (B, T, 3C) -> out (B, T, C); versions that produce it, lse (B, NH, T).
//
// Versions:
//   1  naive: one thread per query row, two passes over the keys (max; then exp, sum and the output
//      accumulated in a per-thread array of HS floats, i.e. local memory). fp32 and bf16 storage.
//   2  cuBLAS + softmax (attention.cuh, what training ran before): permute to (B, NH, T, HS), batched
//      q k^T into a (B, NH, T, T) buffer, a softmax kernel, batched att v, permute back. Full T x T
//      matrices (twice the causal work) and T^2 memory traffic per head. fp32 and bf16.
//   3  flash, plain (the header's fallback): one warp per query row, online softmax over chunks of
//      32 keys (a lane per key for the dot product, then a lane per head dimension for the output),
//      fp32 CUDA-core math, no T x T buffer. Any head size <= 256. bf16.
//   4  flash, tensor cores: 4 warps x 16 query rows (64-row blocks), K/V tiles of 64 keys double-
//      buffered in shared memory with cp.async, mma.sync m16n8k16 for q k^T and P v, online softmax
//      in registers. Head sizes 64, 80, 128 (else version 3 runs; the lab says so). bf16.
//   5  as 4 with 2 row tiles per warp (128-row blocks): each K/V fragment read from shared memory
//      feeds twice the MMAs (shared-memory bandwidth was the limit of 4), half the K/V tile loads.
//   6  as 4 with 8 warps (128-row blocks, 16 rows per warp): the same halving of K/V loads per query,
//      without 5's doubled registers per thread.
//   7  as 5 with key tiles of 128 (FlashAttention-2's tiling for head size 64): half the barriers and
//      running-max updates per key, twice the score registers.
//   8  as 5 with 8 warps (256-row blocks): each K/V tile loaded once for twice the queries.
//   9  the header's flash_attention_forward: 11 where it runs (head size 64 on compute capability
//      9.0), else 5's configuration for head sizes 64 and 80, 4's for 128 (where 5's doubled
//      accumulators spill registers).
//  10  Hopper warpgroup MMA (wgmma, sm_90a; forward_wgmma_kernel), head size 64: a warpgroup
//      per 64 queries, q and k/v tiles 128-byte swizzled in shared memory and read by the tensor
//      cores through descriptors (no ldmatrix), P from registers; key tiles of 64. Else version 9 runs.
//  11  as 10 with key tiles of 128 (half the barriers and running-max updates per key). Where a
//      warpgroup's rows start at a multiple of 128 (half of them), its last tile's second half lies
//      after all of its rows: that tile runs 64-key products (the same bits).
//  12  as 11 with 2 warpgroups per block (128 queries): each k/v tile loaded once for twice the queries.
//
// FLOPs: 4 * B * NH * T * T * HS / 2, the useful causal work (two matrix products of 2 * HS
// multiply-adds per (query, key) pair, over the T^2 / 2 causal pairs). Every version is credited with
// this count, so TFLOP/s compare times; version 2 does twice as much arithmetic.

#include <memory>
#include <string>
#include <type_traits>

#include "attention.cuh"
#include "common.cuh"
#include "dev/cuda/attention_lab.cuh"
#include "dev/cuda/flash_attention_lab.cuh"
#include "flash_attention.cuh"

constexpr int kNumVersions = 12;

// ---------------------------------------------------------------------------------------------
// Version 1: one thread per query row.

constexpr int kNaiveMaxHS = 256;

template <typename T>
__global__ void attention_forward_kernel1(T* out, float* lse, const T* qkv, int B, int T_, int NH, int HS) {
    const long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x;  // (b, h, t), t fastest
    if (row >= (long long)B * NH * T_) return;
    const int t = int(row % T_), h = int(row / T_ % NH), b = int(row / ((long long)T_ * NH));
    const int C = NH * HS;
    const size_t stride = 3 * size_t(C);
    const T* base = qkv + size_t(b) * T_ * stride + h * HS;
    const T* q = base + size_t(t) * stride;
    const float scale = 1.0f / sqrtf(float(HS));
    float m = -INFINITY;
    for (int j = 0; j <= t; j++) {
        float s = 0.0f;
        for (int d = 0; d < HS; d++) s += to_float(q[d]) * to_float(base[size_t(j) * stride + C + d]);
        m = fmaxf(m, s * scale);
    }
    float acc[kNaiveMaxHS];
    for (int d = 0; d < HS; d++) acc[d] = 0.0f;
    float l = 0.0f;
    for (int j = 0; j <= t; j++) {
        float s = 0.0f;
        for (int d = 0; d < HS; d++) s += to_float(q[d]) * to_float(base[size_t(j) * stride + C + d]);
        const float p = expf(s * scale - m);
        l += p;
        for (int d = 0; d < HS; d++) acc[d] += p * to_float(base[size_t(j) * stride + 2 * C + d]);
    }
    T* dst = out + (size_t(b) * T_ + t) * C + h * HS;
    for (int d = 0; d < HS; d++) dst[d] = from_float<T>(acc[d] / l);
    lse[row] = m + logf(l);
}

// ---------------------------------------------------------------------------------------------
// Dispatch. Returns a note when a version ran something else on this shape.

// Scratch of version 2 (cuBLAS): att (B, NH, T, T), qkvr 3 (B, NH, T, HS), yr (B, NH, T, HS).
template <typename T> struct CublasScratch {
    DeviceBuffer<T> att, qkvr, yr;
    explicit CublasScratch(const AttnShape& s)
        : att(size_t(s.B) * s.NH * s.T * s.T, "att"), qkvr(3 * s.rows() * s.C(), "qkvr"), yr(s.rows() * s.C(), "yr") {}
};

template <typename T>
const char* run_version(int version, T* out, float* lse, const T* qkv, const AttnShape& s, CublasScratch<T>* cublas) {
    const int B = s.B, T_ = s.T, NH = s.NH, HS = s.HS;
    typedef __nv_bfloat16 bf16;
    if (version >= 3 && !std::is_same<T, bf16>::value) fail("version %d is bf16 only", version);
    bf16* outb = reinterpret_cast<bf16*>(out);
    const bf16* qkvb = reinterpret_cast<const bf16*>(qkv);
    bool ran = true;
    switch (version) {
        case 1: {
            if (HS > kNaiveMaxHS) fail("version 1 takes HS <= %d", kNaiveMaxHS);
            const long long rows = (long long)B * NH * T_;
            attention_forward_kernel1<T><<<unsigned((rows + 127) / 128), 128>>>(out, lse, qkv, B, T_, NH, HS);
            cuda_check_launch();
            break;
        }
        case 2:
            attention_forward<T>(out, cublas->att.ptr, cublas->qkvr.ptr, cublas->yr.ptr, qkv, B, T_, NH * HS, NH);
            break;
        case 3: flash_detail::forward_plain(outb, lse, qkvb, B, T_, NH, HS, 0); break;
        case 4: ran = flash_lab::forward_tc<4, 1, 64>(outb, lse, qkvb, B, T_, NH, HS, 0); break;
        case 5: ran = flash_lab::forward_tc<4, 2, 64>(outb, lse, qkvb, B, T_, NH, HS, 0); break;
        case 6: ran = flash_lab::forward_tc<8, 1, 64>(outb, lse, qkvb, B, T_, NH, HS, 0); break;
        case 7: ran = flash_lab::forward_tc<4, 2, 128>(outb, lse, qkvb, B, T_, NH, HS, 0); break;
        case 8: ran = flash_lab::forward_tc<8, 2, 64>(outb, lse, qkvb, B, T_, NH, HS, 0); break;
        case 9:
            flash_attention_forward(outb, lse, qkvb, B, T_, NH, HS, 0);
            if (!flash_attention_supported(HS)) return "plain path for this HS";
            break;
        case 10: ran = flash_lab::forward_wgmma<1, 64>(outb, lse, qkvb, B, T_, NH, HS, 0); break;
        case 11: ran = flash_lab::forward_wgmma<1, 128>(outb, lse, qkvb, B, T_, NH, HS, 0); break;
        case 12: ran = flash_lab::forward_wgmma<2, 128>(outb, lse, qkvb, B, T_, NH, HS, 0); break;
        default: fail("version %d does not exist (1..%d)", version, kNumVersions);
    }
    if (!ran && version >= 10) {
        flash_attention_forward(outb, lse, qkvb, B, T_, NH, HS, 0);
        return "no wgmma path for this HS or GPU, ran v9";
    }
    if (!ran) {
        flash_detail::forward_plain(outb, lse, qkvb, B, T_, NH, HS, 0);
        return "no tensor-core path for this HS, ran v3";
    }
    return nullptr;
}

bool version_has_dtype(int version, bool bf16) { return bf16 || version <= 2; }

// ---------------------------------------------------------------------------------------------
// Validation: one reference per shape, every version and dtype against it.

// 1: passed, 0: failed, -1: another version ran in this one's place (skipped).
template <typename T>
int check_one(int version, const AttnShape& s, const std::vector<float>& qkv_h, const AttnReference& ref) {
    const bool bf16 = std::is_same<T, __nv_bfloat16>::value;
    DeviceBuffer<T> qkv(qkv_h.size(), "qkv"), out(s.rows() * s.C(), "out");
    DeviceBuffer<float> lse(size_t(s.B) * s.NH * s.T, "lse");
    qkv.upload(convert<T>(qkv_h));
    out.poison(), lse.poison();
    std::unique_ptr<CublasScratch<T>> cublas(version == 2 ? new CublasScratch<T>(s) : nullptr);
    const char* note = run_version<T>(version, out.ptr, lse.ptr, qkv.ptr, s, cublas.get());
    cuda_check(cudaDeviceSynchronize());
    if (note) printf("  (%s)\n", note);
    if (fell_back(note)) return -1;
    const Rounding rounding = !bf16 ? Rounding::fp32 : version == 2 ? Rounding::bf16_scores : Rounding::bf16;
    const double bound = terms_bound(rounding, s, ref.max_abs_score, false);
    bool ok = check_normalized("out", out.download().data(), ref.out, ref.out_terms, s.rows(), s.C(), 0, s.C(), bound, bf16);
    if (version != 2) ok &= check_lse(lse.download().data(), ref.lse, s);
    return ok;
}

void check_all(TestCounter& tests, bool gpu, const std::vector<int>& versions) {
    uint64_t seed = 1;
    for (const AttnShape& s : kCheckShapes) {
        seed++;
        std::vector<float> qkv;
        AttnReference ref;
        if (gpu) qkv = make_qkv(s, seed), ref = attention_reference(s, qkv, nullptr);
        for (int v : versions)
            for (bool bf16 : {false, true}) {
                if (!version_has_dtype(v, bf16)) continue;
                char name[160];
                snprintf(name, sizeof(name), "forward v%d %s B=%d NH=%d T=%d HS=%d", v, bf16 ? "bf16" : "fp32", s.B, s.NH, s.T,
                         s.HS);
                if (!gpu) {
                    tests.skip(name);
                    continue;
                }
                printf("%s (max|score| %.2f)\n", name, ref.max_abs_score);
                tests.record(name, bf16 ? check_one<__nv_bfloat16>(v, s, qkv, ref) : check_one<float>(v, s, qkv, ref));
            }
    }
}

// ---------------------------------------------------------------------------------------------
// Benchmark.

template <typename T> void benchmark(const std::vector<int>& versions, const AttnShape& s) {
    const double flops = 4.0 * s.B * s.NH * double(s.T) * s.T * s.HS / 2.0;
    printf("\nattention forward benchmark, %s, B=%d NH=%d T=%d HS=%d (median of many runs after warm-up)\n", dtype_name<T>(),
           s.B, s.NH, s.T, s.HS);
    printf("  FLOPs = 4*B*NH*T*T*HS/2 = %.4g (useful causal work; every version credited with it)\n", flops);
    printf("  %-8s %-6s %12s %10s\n", "version", "dtype", "time (ms)", "TFLOP/s");
    DeviceBuffer<T> qkv(s.rows() * 3 * s.C(), "qkv"), out(s.rows() * s.C(), "out");
    DeviceBuffer<float> lse(size_t(s.B) * s.NH * s.T, "lse");
    qkv.upload(convert<T>(make_qkv(s, 1234)));
    for (int v : versions) {
        if (!version_has_dtype(v, std::is_same<T, __nv_bfloat16>::value)) continue;
        std::unique_ptr<CublasScratch<T>> cublas(v == 2 ? new CublasScratch<T>(s) : nullptr);
        const char* note = nullptr;
        auto run = [&] { note = run_version<T>(v, out.ptr, lse.ptr, qkv.ptr, s, cublas.get()); };
        const float first = time_median_ms(run, 1, 1);  // slow versions get fewer runs
        const float ms = first > 20.0f ? time_median_ms(run, 1, 3) : time_median_ms(run, 10, 50);
        printf("  %-8d %-6s %12.4f %10.1f%s%s\n", v, dtype_name<T>(), ms, flops / (ms * 1e-3) / 1e12, note ? "  " : "",
               note ? note : "");
    }
}

// ---------------------------------------------------------------------------------------------

void usage(FILE* f) {
    fprintf(f,
            "usage: attention_forward [versions...] [--check] [--no-validate] [-b B] [-n NH] [-t T] [-s HS] [--dtype fp32|bf16]\n"
            "  versions      which versions to run (default: all), 1..%d; 3 and up are bf16 only\n"
            "  --check       validation only: every version, every check shape, fp32 and bf16 (CI)\n"
            "  --no-validate benchmark only (by default the named versions are validated first)\n"
            "  -b B          benchmark batch size (default 64)\n"
            "  -n NH         benchmark heads (default 12)\n"
            "  -t T          benchmark sequence length (default 1024)\n"
            "  -s HS         benchmark head size (default 64)\n"
            "  --dtype T     benchmark dtype (default bf16; fp32 runs versions 1 and 2 only)\n"
            "  -h            this message\n",
            kNumVersions);
}

int main(int argc, char** argv) {
    std::vector<int> versions;
    bool check = false, bf16 = true, validate = true;
    AttnShape bench{64, 12, 1024, 64};
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto value = [&] { return flag_value(argc, argv, i, usage); };
        if (a == "-h" || a == "--help") {
            usage(stdout);
            return 0;
        } else if (a == "--check") {
            check = true;
        } else if (a == "--no-validate") {
            validate = false;
        } else if (a == "-b") {
            bench.B = parse_int(value(), "-b", 1, usage);
        } else if (a == "-n") {
            bench.NH = parse_int(value(), "-n", 1, usage);
        } else if (a == "-t") {
            bench.T = parse_int(value(), "-t", 1, usage);
        } else if (a == "-s") {
            bench.HS = parse_int(value(), "-s", 1, usage);
            if (bench.HS > flash_detail::kPlainMaxHS) fail("-s must be <= %d", flash_detail::kPlainMaxHS);
        } else if (a == "--dtype") {
            bf16 = parse_dtype_is_bf16(value(), usage);
        } else if (!a.empty() && a[0] != '-') {
            const int v = parse_int(a.c_str(), "version", 1, usage);
            if (v > kNumVersions) fail("version %d does not exist (1..%d)", v, kNumVersions);
            versions.push_back(v);
        } else {
            usage(stderr);
            fail("unknown flag '%s'", a.c_str());
        }
    }
    std::vector<int> all;
    for (int v = 1; v <= kNumVersions; v++) all.push_back(v);
    const bool gpu = cuda_device_available();
    TestCounter tests;
    if (gpu) blas_init(1);
    if (check) {
        check_all(tests, gpu, all);  // CI: everything, whatever versions were named
        return tests.finish();
    }
    if (!gpu) fail("no CUDA device: the benchmark needs a GPU (--check alone reports skips)");
    if (versions.empty()) versions = all;
    if (validate) check_all(tests, gpu, versions);
    cudaDeviceProp prop;
    cuda_check(cudaGetDeviceProperties(&prop, 0));
    printf("\ndevice: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    if (bf16) benchmark<__nv_bfloat16>(versions, bench);
    else benchmark<float>(versions, bench);
    return tests.finish();
}
