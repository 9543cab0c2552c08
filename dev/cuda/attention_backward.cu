// attention_backward.cu: the causal attention backward laboratory. Numbered versions retrace how the
// kernel got fast; version 11 is the header's flash_attention_backward (flash_attention.cuh), so
// the lab measures what training runs (12-14: Hopper wgmma; 14, the header's choice, runs inside 11).
// Every version is validated against the double-precision CPU reference
// (dev/cuda/attention_lab.cuh, which also states the tolerances) at many shapes, then
// benchmarked.
//
//   make dev/cuda/attention_backward
//   ./dev/cuda/attention_backward           validate, then benchmark every version at B=64 NH=12 T=1024 HS=64 bf16
//   ./dev/cuda/attention_backward 4 10      only versions 4 and 10
//   ./dev/cuda/attention_backward --check   validation only (what CI runs; skips without a GPU)
//
// Inputs (all versions): qkv (B, T, 3C), dout (B, T, C), and the forward's out (B, T, C) and lse
// (B, NH, T), here the reference's rounded to the storage type / fp32. Output: dqkv (B, T, 3C),
// overwritten. Every version is deterministic (no atomics).
//
// Versions:
//   1  naive: D = rowsum(dout * out) one thread per row; dq one thread per query row (loop over
//      keys <= t); dk, dv one thread per key row (loop over queries >= j); probabilities recomputed
//      from lse; fp32 math, per-thread HS-float arrays. fp32 and bf16 storage.
//   2  cuBLAS + softmax backward (attention.cuh): needs the forward's (B, NH, T, T) probabilities
//      (its forward runs first, untimed), then 4 full batched matmuls and a softmax-backward kernel.
//      fp32 and bf16.
//   3  flash, plain (the header's fallback): one warp per row for dq and for dk/dv, keys (queries) in
//      chunks of 32, fp32 CUDA-core math. Any head size <= 256. bf16.
//   4  flash, tensor cores: a dk/dv kernel (4 warps x 16 keys, query tiles of 64 double-buffered with
//      cp.async: s^T = k q^T, P^T from lse, dv += P^T dO, dP^T = v dO^T, dS^T, dk += dS^T q) and a dq
//      kernel (4 warps x 16 queries, key tiles of 64: s, dP, dS, dq += dS k). Head sizes 64, 80, 128
//      (else version 3 runs; the lab says so). bf16.
//   5  as 4 with query/key tiles of 32: fewer registers (more blocks per SM), twice the barriers.
//   6  as 4 with 8 warps per block (128 keys / 128 queries): each streamed tile is reused by twice
//      the warps, half the tile loads.
//   7  as 4 with 2 16-row tiles per warp in both kernels (32 keys / 32 queries per warp) and tiles of
//      32 streamed rows: every B fragment read from shared memory feeds two MMAs instead of one
//      (ldmatrix traffic per MMA was the limit of 4: ~0.56 loads per MMA, now ~0.38).
//   8  mixed: 7's dk/dv kernel with 4's dq kernel (7 and 8 differ only in the dq kernel, 4 and 8 only
//      in the dk/dv kernel, so the three timings separate the two kernels' changes).
//   9  as 4 with the dk/dv kernel held to 168 registers (__launch_bounds__ minimum of 3 blocks per SM,
//      from 183): 12 warps per SM instead of 8 to hide the MMA and ldmatrix latencies (ncu: 1.9
//      active warps per scheduler, 0.5 eligible, in 4's dk/dv kernel). HS = 128 spills under it.
//   10 as 4, but the dk/dv kernel also stores dS (bf16, 64 x 64 tiles on and below the diagonal,
//      each 8x8 piece transposed in registers by movmatrix into the dq kernel's A-fragment order), and
//      the dq kernel only reads dS and multiplies by k: no second q k^T, dO v^T or softmax. 5 products
//      instead of 7, for an extra write and read of the causal dS (0.86 GB at the benchmark shape).
//   11 the header's flash_attention_backward (the configuration it picks per head size; given room for
//      dS, as here: version 14 where it runs, else version 10).
//   12 as 10 with the dk/dv kernel on Hopper's warpgroup MMA (wgmma, sm_90a; head size 64): a
//      warpgroup per 64 keys, k/v and the streamed q/dO tiles 128-byte swizzled in shared memory and
//      read by the tensor cores through descriptors (no ldmatrix), P^T and dS^T from registers; dP^T
//      runs while P^T is computed. The same dS tiles, so the same dq kernel. Else version 10 runs.
//   13 as 12 with the dk/dv kernel held to 168 registers (3 warpgroups per SM instead of 2; 16 bytes
//      of spill). 12 and 13 are the lab's own kernel (dev/cuda/flash_attention_lab.cuh).
//   14 the header's wgmma key side (flash_attention.cuh, backward_dkdv_wgmma_kernel): 13 with dv's
//      product issued together with dk's, after dS, instead of while dS is computed: at 168
//      registers ptxas then no longer serializes the wgmma instructions (its C7512 warning on 13) and
//      nothing spills. The same products in the same order: bit-identical to 12 and 13.
//
// FLOPs: 2.5 x the forward's, 2.5 * 4 * B * NH * T * T * HS / 2 (the five matrix products q k^T,
// dO v^T, P^T dO, dS^T q, dS k of a fused backward, over the T^2 / 2 causal pairs). Every version is
// credited with this count; flash versions 4..9 do 7 products (q k^T and dO v^T once per kernel).

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#include "attention.cuh"
#include "common.cuh"
#include "dev/cuda/attention_lab.cuh"
#include "dev/cuda/flash_attention_lab.cuh"
#include "flash_attention.cuh"

constexpr int kNumVersions = 14;
constexpr int kNaiveMaxHS = 256;

// ---------------------------------------------------------------------------------------------
// Version 1.

template <typename T> __global__ void dot_kernel1(float* D, const T* dout, const T* out, int B, int T_, int NH, int HS) {
    const long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x;  // (b, h, t), t fastest
    if (row >= (long long)B * NH * T_) return;
    const int t = int(row % T_), h = int(row / T_ % NH), b = int(row / ((long long)T_ * NH));
    const size_t off = (size_t(b) * T_ + t) * NH * HS + size_t(h) * HS;
    float s = 0.0f;
    for (int d = 0; d < HS; d++) s += to_float(dout[off + d]) * to_float(out[off + d]);
    D[row] = s;
}

template <typename T>
__global__ void dq_kernel1(T* dqkv, const T* dout, const float* lse, const float* D, const T* qkv, int B, int T_, int NH,
                           int HS) {
    const long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (row >= (long long)B * NH * T_) return;
    const int t = int(row % T_), h = int(row / T_ % NH), b = int(row / ((long long)T_ * NH));
    const int C = NH * HS;
    const size_t stride = 3 * size_t(C);
    const T* base = qkv + size_t(b) * T_ * stride + h * HS;
    const T* q = base + size_t(t) * stride;
    const T* g = dout + (size_t(b) * T_ + t) * C + h * HS;
    const float scale = 1.0f / sqrtf(float(HS));
    float acc[kNaiveMaxHS];
    for (int d = 0; d < HS; d++) acc[d] = 0.0f;
    for (int j = 0; j <= t; j++) {
        const T* k = base + size_t(j) * stride + C;
        const T* v = k + C;
        float s = 0.0f, dp = 0.0f;
        for (int d = 0; d < HS; d++) s += to_float(q[d]) * to_float(k[d]), dp += to_float(g[d]) * to_float(v[d]);
        const float ds = expf(s * scale - lse[row]) * (dp - D[row]);
        for (int d = 0; d < HS; d++) acc[d] += ds * to_float(k[d]);
    }
    for (int d = 0; d < HS; d++) dqkv[(size_t(b) * T_ + t) * stride + h * HS + d] = from_float<T>(acc[d] * scale);
}

template <typename T>
__global__ void dkdv_kernel1(T* dqkv, const T* dout, const float* lse, const float* D, const T* qkv, int B, int T_, int NH,
                             int HS) {
    const long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (row >= (long long)B * NH * T_) return;
    const int j = int(row % T_), h = int(row / T_ % NH), b = int(row / ((long long)T_ * NH));
    const int C = NH * HS;
    const size_t stride = 3 * size_t(C);
    const T* base = qkv + size_t(b) * T_ * stride + h * HS;
    const T* k = base + size_t(j) * stride + C;
    const T* v = k + C;
    const float scale = 1.0f / sqrtf(float(HS));
    float dk[kNaiveMaxHS], dv[kNaiveMaxHS];
    for (int d = 0; d < HS; d++) dk[d] = dv[d] = 0.0f;
    for (int t = j; t < T_; t++) {
        const T* q = base + size_t(t) * stride;
        const T* g = dout + (size_t(b) * T_ + t) * C + h * HS;
        const long long qrow = row - j + t;
        float s = 0.0f, dp = 0.0f;
        for (int d = 0; d < HS; d++) s += to_float(q[d]) * to_float(k[d]), dp += to_float(g[d]) * to_float(v[d]);
        const float p = expf(s * scale - lse[qrow]), ds = p * (dp - D[qrow]);
        for (int d = 0; d < HS; d++) dv[d] += p * to_float(g[d]), dk[d] += ds * to_float(q[d]);
    }
    T* dst = dqkv + (size_t(b) * T_ + j) * stride + C + h * HS;
    for (int d = 0; d < HS; d++) dst[d] = from_float<T>(dk[d] * scale), dst[C + d] = from_float<T>(dv[d]);
}

// ---------------------------------------------------------------------------------------------
// Dispatch.

// Everything a version may need beyond its inputs: D (versions 1, 3+), the dS tiles (10, 11; poisoned
// with NaN so a tile the dq kernel reads but nobody wrote fails the check), and for version 2 the
// forward's probabilities and attention.cuh's permute buffers.
template <typename T> struct Scratch {
    DeviceBuffer<float> D;
    std::unique_ptr<DeviceBuffer<uint4>> ds;
    std::unique_ptr<DeviceBuffer<T>> att, qkvr, dqkvr, dyr, datt, y, yr;
    Scratch(const AttnShape& s, bool cublas, bool store_ds = false)
        : D(flash_attention_backward_scratch_bytes(s.B, s.T, s.NH, s.HS) / 4, "D") {
        if (store_ds) {
            ds.reset(new DeviceBuffer<uint4>(flash_detail::backward_ds_bytes(s.B, s.T, s.NH) / sizeof(uint4), "dS tiles"));
            ds->poison();
        }
        if (!cublas) return;
        const size_t tt = size_t(s.B) * s.NH * s.T * s.T, per = s.rows() * s.C();
        att.reset(new DeviceBuffer<T>(tt, "att")), datt.reset(new DeviceBuffer<T>(tt, "datt"));
        qkvr.reset(new DeviceBuffer<T>(3 * per, "qkvr")), dqkvr.reset(new DeviceBuffer<T>(3 * per, "dqkvr"));
        dyr.reset(new DeviceBuffer<T>(per, "dyr")), y.reset(new DeviceBuffer<T>(per, "y")), yr.reset(new DeviceBuffer<T>(per, "yr"));
    }
};

// Version 2's forward (its probabilities); untimed.
template <typename T> void prepare_version2(Scratch<T>& sc, const T* qkv, const AttnShape& s) {
    attention_forward<T>(sc.y->ptr, sc.att->ptr, sc.qkvr->ptr, sc.yr->ptr, qkv, s.B, s.T, s.C(), s.NH);
}

template <typename T>
const char* run_version(int version, T* dqkv, const T* dout, const T* out, const float* lse, const T* qkv, const AttnShape& s,
                        Scratch<T>& sc) {
    const int B = s.B, T_ = s.T, NH = s.NH, HS = s.HS;
    typedef __nv_bfloat16 bf16;
    if (version >= 3 && !std::is_same<T, bf16>::value) fail("version %d is bf16 only", version);
    bf16* dqkvb = reinterpret_cast<bf16*>(dqkv);
    const bf16 *doutb = reinterpret_cast<const bf16*>(dout), *outb = reinterpret_cast<const bf16*>(out);
    const bf16* qkvb = reinterpret_cast<const bf16*>(qkv);
    bool ran = true;
    switch (version) {
        case 1: {
            if (HS > kNaiveMaxHS) fail("version 1 takes HS <= %d", kNaiveMaxHS);
            const long long rows = (long long)B * NH * T_;
            const unsigned blocks = unsigned((rows + 127) / 128);
            dot_kernel1<T><<<blocks, 128>>>(sc.D.ptr, dout, out, B, T_, NH, HS);
            cuda_check_launch();
            dq_kernel1<T><<<blocks, 128>>>(dqkv, dout, lse, sc.D.ptr, qkv, B, T_, NH, HS);
            cuda_check_launch();
            dkdv_kernel1<T><<<blocks, 128>>>(dqkv, dout, lse, sc.D.ptr, qkv, B, T_, NH, HS);
            cuda_check_launch();
            break;
        }
        case 2:
            attention_backward<T>(dqkv, sc.qkvr->ptr, sc.dqkvr->ptr, sc.dyr->ptr, sc.datt->ptr, dout, sc.att->ptr, qkv, B, T_,
                                  NH * HS, NH);
            break;
        case 3: flash_detail::backward_plain(dqkvb, sc.D.ptr, doutb, outb, lse, qkvb, B, T_, NH, HS, 0); break;
        case 4: ran = flash_lab::backward_tc<4, 1, 64, 4, 1, 64>(dqkvb, sc.D.ptr, doutb, outb, lse, qkvb, B, T_, NH, HS, 0); break;
        case 5: ran = flash_lab::backward_tc<4, 1, 32, 4, 1, 32>(dqkvb, sc.D.ptr, doutb, outb, lse, qkvb, B, T_, NH, HS, 0); break;
        case 6: ran = flash_lab::backward_tc<8, 1, 64, 8, 1, 64>(dqkvb, sc.D.ptr, doutb, outb, lse, qkvb, B, T_, NH, HS, 0); break;
        case 7: ran = flash_lab::backward_tc<4, 2, 32, 4, 2, 32>(dqkvb, sc.D.ptr, doutb, outb, lse, qkvb, B, T_, NH, HS, 0); break;
        case 8: ran = flash_lab::backward_tc<4, 2, 32, 4, 1, 64>(dqkvb, sc.D.ptr, doutb, outb, lse, qkvb, B, T_, NH, HS, 0); break;
        case 9: ran = flash_lab::backward_tc<4, 1, 64, 4, 1, 64, 3>(dqkvb, sc.D.ptr, doutb, outb, lse, qkvb, B, T_, NH, HS, 0); break;
        case 10:
            ran = flash_lab::backward_tc<4, 1, 64, 4, 1, 64>(dqkvb, sc.D.ptr, doutb, outb, lse, qkvb, B, T_, NH, HS, 0, sc.ds->ptr);
            break;
        case 11:
            flash_attention_backward(dqkvb, sc.D.ptr, doutb, outb, lse, qkvb, B, T_, NH, HS,
                                     FlashAttentionBackwardOptions().with_ds_scratch(sc.ds->ptr, sc.ds->n * sizeof(uint4)));
            if (!flash_attention_supported(HS)) return "plain path for this HS";
            break;
        case 12:
        case 13:
        case 14:
            ran = version == 12   ? flash_lab::backward_wgmma_early_dv<2>(dqkvb, sc.D.ptr, sc.ds->ptr, doutb, outb, lse, qkvb, B, T_, NH, HS, 0)
                  : version == 13 ? flash_lab::backward_wgmma_early_dv<3>(dqkvb, sc.D.ptr, sc.ds->ptr, doutb, outb, lse, qkvb, B, T_, NH, HS, 0)
                                  : flash_detail::backward_wgmma(dqkvb, sc.D.ptr, sc.ds->ptr, doutb, outb, lse, qkvb, B, T_, NH, HS, 0);
            if (!ran) {
                ran = flash_lab::backward_tc<4, 1, 64, 4, 1, 64>(dqkvb, sc.D.ptr, doutb, outb, lse, qkvb, B, T_, NH, HS, 0, sc.ds->ptr);
                if (ran) return "no wgmma path for this HS or GPU, ran v10";
            }
            break;
        default: fail("version %d does not exist (1..%d)", version, kNumVersions);
    }
    if (!ran) {
        flash_detail::backward_plain(dqkvb, sc.D.ptr, doutb, outb, lse, qkvb, B, T_, NH, HS, 0);
        return "no tensor-core path for this HS, ran v3";
    }
    return nullptr;
}

bool version_has_dtype(int version, bool bf16) { return bf16 || version <= 2; }
bool version_stores_ds(int version) { return version >= 10; }

// ---------------------------------------------------------------------------------------------
// Validation.

struct Inputs {
    std::vector<float> qkv, dout, out;  // out: the reference's, rounded to fp32
    std::vector<float> lse;
};

// 1: passed, 0: failed, -1: another version ran in this one's place (skipped).
template <typename T> int check_one(int version, const AttnShape& s, const Inputs& in, const AttnReference& ref) {
    const bool bf16 = std::is_same<T, __nv_bfloat16>::value;
    DeviceBuffer<T> qkv(in.qkv.size(), "qkv"), dout(in.dout.size(), "dout"), out(in.out.size(), "out");
    DeviceBuffer<T> dqkv(in.qkv.size(), "dqkv");
    DeviceBuffer<float> lse(in.lse.size(), "lse");
    qkv.upload(convert<T>(in.qkv)), dout.upload(convert<T>(in.dout)), out.upload(convert<T>(in.out)), lse.upload(in.lse);
    Scratch<T> sc(s, version == 2, version_stores_ds(version));
    if (version == 2) prepare_version2(sc, qkv.ptr, s);
    dqkv.poison();
    const char* note = run_version<T>(version, dqkv.ptr, dout.ptr, out.ptr, lse.ptr, qkv.ptr, s, sc);
    cuda_check(cudaDeviceSynchronize());
    if (note) printf("  (%s)\n", note);
    if (fell_back(note)) return -1;
    const Rounding rounding = !bf16 ? Rounding::fp32 : version == 2 ? Rounding::bf16_scores : Rounding::bf16;
    const double bound = terms_bound(rounding, s, ref.max_abs_score, true);
    const auto got = dqkv.download();
    bool ok = true;
    const char* names[3] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; part++)
        ok &= check_normalized(names[part], got.data(), ref.dqkv, ref.dqkv_terms, s.rows(), 3 * s.C(), part, s.C(), bound, bf16);
    return ok;
}

Inputs make_inputs(const AttnShape& s, uint64_t seed, AttnReference* ref) {
    Inputs in;
    in.qkv = make_qkv(s, seed);
    in.dout = make_uniform_bf16(s.rows() * s.C(), -1.0f, 1.0f, seed * 7919 + 1);
    if (ref) *ref = attention_reference(s, in.qkv, &in.dout);
    const AttnReference fwd = ref ? AttnReference() : attention_reference(s, in.qkv, nullptr);
    const AttnReference& r = ref ? *ref : fwd;
    in.out.resize(r.out.size()), in.lse.resize(r.lse.size());
    for (size_t i = 0; i < r.out.size(); i++) in.out[i] = float(r.out[i]);  // rounded again for bf16 runs
    for (size_t i = 0; i < r.lse.size(); i++) in.lse[i] = float(r.lse[i]);
    return in;
}

// Version 14 against 13: the same products in the same order, so the same bits (dq, dk, dv and dS).
bool check_v14_bits(const AttnShape& s, const Inputs& in) {
    typedef __nv_bfloat16 bf16;
    DeviceBuffer<bf16> qkv(in.qkv.size(), "qkv"), dout(in.dout.size(), "dout"), out(in.out.size(), "out");
    DeviceBuffer<bf16> d13(in.qkv.size(), "dqkv 13"), d14(in.qkv.size(), "dqkv 14");
    DeviceBuffer<float> lse(in.lse.size(), "lse");
    qkv.upload(convert<bf16>(in.qkv)), dout.upload(convert<bf16>(in.dout)), out.upload(convert<bf16>(in.out)), lse.upload(in.lse);
    Scratch<bf16> sc13(s, false, true), sc14(s, false, true);
    d13.poison(), d14.poison();
    run_version<bf16>(13, d13.ptr, dout.ptr, out.ptr, lse.ptr, qkv.ptr, s, sc13);
    run_version<bf16>(14, d14.ptr, dout.ptr, out.ptr, lse.ptr, qkv.ptr, s, sc14);
    const auto a = d13.download(), b = d14.download();
    const auto ds13 = sc13.ds->download(), ds14 = sc14.ds->download();
    const bool ok = memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0 &&
                    memcmp(ds13.data(), ds14.data(), ds13.size() * sizeof(uint4)) == 0;
    printf("  v14 = v13 (dqkv and dS): %s\n", ok ? "bitwise identical" : "DIFFERENT");
    return ok;
}

void check_all(TestCounter& tests, bool gpu, const std::vector<int>& versions) {
    uint64_t seed = 100;
    for (const AttnShape& s : kCheckShapes) {
        seed++;
        Inputs in;
        AttnReference ref;
        if (gpu) in = make_inputs(s, seed, &ref);
        for (int v : versions)
            for (bool bf16 : {false, true}) {
                if (!version_has_dtype(v, bf16)) continue;
                char name[160];
                snprintf(name, sizeof(name), "backward v%d %s B=%d NH=%d T=%d HS=%d", v, bf16 ? "bf16" : "fp32", s.B, s.NH, s.T,
                         s.HS);
                if (!gpu) {
                    tests.skip(name);
                    continue;
                }
                printf("%s (max|score| %.2f)\n", name, ref.max_abs_score);
                tests.record(name, bf16 ? check_one<__nv_bfloat16>(v, s, in, ref) : check_one<float>(v, s, in, ref));
            }
        // Elsewhere (another head size, or a GPU without wgmma) 13 and 14 both run version 10: the
        // comparison would test nothing.
        if (s.HS == 64 && std::find(versions.begin(), versions.end(), 14) != versions.end()) {
            char name[160];
            snprintf(name, sizeof(name), "backward v14 = v13 bf16 B=%d NH=%d T=%d HS=%d", s.B, s.NH, s.T, s.HS);
            if (!gpu) {
                tests.skip(name);
                continue;
            }
            if (!ptx::wgmma_available()) {
                tests.skip(name, "no wgmma on this GPU: both would run version 10");
                continue;
            }
            printf("%s\n", name);
            tests.record(check_v14_bits(s, in));
        }
    }
}

// Determinism: the header's backward twice on the same inputs gives identical bits (with room for dS,
// and once more without it, which takes the recomputing dq kernel).
bool check_deterministic(const AttnShape& s) {
    typedef __nv_bfloat16 bf16;
    const Inputs in = make_inputs(s, 4242, nullptr);
    DeviceBuffer<bf16> qkv(in.qkv.size(), "qkv"), dout(in.dout.size(), "dout"), out(in.out.size(), "out");
    DeviceBuffer<bf16> d1(in.qkv.size(), "dqkv"), d2(in.qkv.size(), "dqkv");
    DeviceBuffer<float> lse(in.lse.size(), "lse");
    qkv.upload(convert<bf16>(in.qkv)), dout.upload(convert<bf16>(in.dout)), out.upload(convert<bf16>(in.out)), lse.upload(in.lse);
    Scratch<bf16> sc(s, false, true);
    const size_t ds_bytes = sc.ds->n * sizeof(uint4);
    bool same = true;
    for (bool with_ds : {true, false}) {
        d1.poison(), d2.poison();
        for (DeviceBuffer<bf16>* d : {&d1, &d2})
            flash_attention_backward(d->ptr, sc.D.ptr, dout.ptr, out.ptr, lse.ptr, qkv.ptr, s.B, s.T, s.NH, s.HS,
                                     FlashAttentionBackwardOptions().with_ds_scratch(with_ds ? sc.ds->ptr : nullptr,
                                                                                     with_ds ? ds_bytes : 0));
        const auto a = d1.download(), b = d2.download();
        const bool ok = memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0;
        printf("  header backward run twice (%s): %s\n", with_ds ? "dS stored" : "dS recomputed", ok ? "bitwise identical" : "DIFFERENT");
        same &= ok;
    }
    return same;
}

// ---------------------------------------------------------------------------------------------
// Benchmark.

template <typename T> void benchmark(const std::vector<int>& versions, const AttnShape& s) {
    const double flops = 2.5 * 4.0 * s.B * s.NH * double(s.T) * s.T * s.HS / 2.0;
    printf("\nattention backward benchmark, %s, B=%d NH=%d T=%d HS=%d (median of many runs after warm-up)\n", dtype_name<T>(),
           s.B, s.NH, s.T, s.HS);
    printf("  FLOPs = 2.5 * 4*B*NH*T*T*HS/2 = %.4g (useful causal work; every version credited with it)\n", flops);
    printf("  %-8s %-6s %12s %10s\n", "version", "dtype", "time (ms)", "TFLOP/s");
    // Inputs need not be a true forward's for timing: random out and lse of the right magnitude.
    const size_t per = s.rows() * s.C();
    DeviceBuffer<T> qkv(per * 3, "qkv"), dout(per, "dout"), out(per, "out"), dqkv(per * 3, "dqkv");
    DeviceBuffer<float> lse(size_t(s.B) * s.NH * s.T, "lse");
    qkv.upload(convert<T>(make_qkv(s, 1234)));
    dout.upload(convert<T>(make_uniform_bf16(per, -1.0f, 1.0f, 5)));
    out.upload(convert<T>(make_uniform_bf16(per, -1.0f, 1.0f, 6)));
    lse.upload(make_uniform_bf16(lse.n, 3.0f, 6.0f, 7));
    for (int v : versions) {
        if (!version_has_dtype(v, std::is_same<T, __nv_bfloat16>::value)) continue;
        Scratch<T> sc(s, v == 2, version_stores_ds(v));
        if (v == 2) prepare_version2(sc, qkv.ptr, s);
        const char* note = nullptr;
        auto run = [&] { note = run_version<T>(v, dqkv.ptr, dout.ptr, out.ptr, lse.ptr, qkv.ptr, s, sc); };
        const float first = time_median_ms(run, 1, 1);
        const float ms = first > 20.0f ? time_median_ms(run, 1, 3) : time_median_ms(run, 10, 50);
        printf("  %-8d %-6s %12.4f %10.1f%s%s\n", v, dtype_name<T>(), ms, flops / (ms * 1e-3) / 1e12, note ? "  " : "",
               note ? note : "");
    }
}

// ---------------------------------------------------------------------------------------------

void usage(FILE* f) {
    fprintf(f,
            "usage: attention_backward [versions...] [--check] [--no-validate] [-b B] [-n NH] [-t T] [-s HS] [--dtype fp32|bf16]\n"
            "  versions      which versions to run (default: all), 1..%d; 3 and up are bf16 only\n"
            "  --check       validation only: every version, every check shape, fp32 and bf16, determinism (CI)\n"
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
    auto determinism = [&] {
        for (const AttnShape& s : {AttnShape{2, 3, 1000, 64}, AttnShape{1, 2, 77, 13}}) {
            char name[96];
            snprintf(name, sizeof(name), "backward determinism B=%d NH=%d T=%d HS=%d", s.B, s.NH, s.T, s.HS);
            if (!gpu) {
                tests.skip(name);
                continue;
            }
            printf("%s\n", name);
            tests.record(check_deterministic(s));
        }
    };
    if (check) {
        check_all(tests, gpu, all);  // CI: everything, whatever versions were named
        determinism();
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
