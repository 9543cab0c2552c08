// matmul_fp8.cu: a linear layer's three GEMMs in FP8 through cuBLASLt, checked against a float64
// reference with stated bounds, and timed beside the bf16 GEMMs of matmul.cuh at GPT-2's shapes.
//
//   make dev/cuda/matmul_fp8
//   ./dev/cuda/matmul_fp8            validate, then benchmark d12's and d48's layers at 65536 and 8192 rows
//   ./dev/cuda/matmul_fp8 --check    validation only (what CI runs; skips without a GPU, or one without FP8)
//   ./dev/cuda/matmul_fp8 -h         the usage (--rows, --model, --force)
//
// The layer is matmul.cuh's: out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias, and its backward
// dinp (N, C) = dout (N, OC) @ weight, dweight (OC, C) += dout^T @ inp. In FP8 each bf16 operand is
// first quantized with one scale for the whole tensor, from its amax now (current scaling): inp and
// weight to e4m3 (3 mantissa bits, up to 448), dout to e5m2 (2 mantissa bits, up to 57344: gradients
// span more binades). cuBLASLt multiplies the FP8 operands and scales the fp32 sum back.
//
// Versions (one table; every one at every shape):
//   1  bf16, the header as training calls it: matmul_forward (bias in the epilogue), matmul_backward's
//      dinp and dweight (+= in bf16); tuned cuBLASLt. The baseline (validated by dev/cuda/matmul).
//   2  FP8 through cuBLASLt: a cast pair per tensor (amax, then scale + cast + transpose); the forward
//      inp x weight e4m3 x e4m3 with fast accumulation, dinp (dout x weight) and dweight (dout^T x inp)
//      e5m2 x e4m3 without; out and dinp in bf16 (the bias in the forward's epilogue), dweight += in
//      fp32 (beta = 1: where gradients accumulate). Its casts and GEMMs are fp8.cuh's, the code
//      train_gpt -f8 1 runs (there dweight += in bf16, into the gradient).
//   3  2 with fast accumulation in the backward GEMMs too: what it would save, and what it costs.
//
// Scales: s = 2^p, the largest power of two with amax s <= the format's largest value, so amax s lies
// in (max / 2, max]: the tensor fills the format's top binade and nothing saturates. A power of two
// makes x s and q / s exact: the FP8 value is x s rounded once (the host reproduces every byte), the
// dequantized operands are exact in float64, and cuBLASLt's scaling of its fp32 sum by 1/s_a 1/s_b is
// exact too. Transformer Engine's default, s = max / amax, would gain at most one binade at the bottom
// (subnormals) and lose those exactnesses. amax is a max, so its reduction is order-independent
// (atomicMax on the float's bits): the same bits every run, a NaN anywhere wins and reaches the output.
//
// Layouts: cuBLAS is column-major, a row-major (R, K) tensor a column-major (K, R) matrix. On Hopper
// cuBLASLt's FP8 kernels take only the TN layout (cublasLtMatmul's FP8 requirements: "A must be
// transposed and B non-transposed"), D (m, n) = A^T B, A stored (k, m) and B (k, n): both operands with
// the GEMM's K as their contiguous dimension. So:
//   forward  out (N, OC):      m OC, n N,  k C:   A weight (OC, C) as stored, B inp (N, C) as stored
//   dinp     dinp (N, C):      m C,  n N,  k OC:  A weight^T (C, OC), a transposed copy; B dout (N, OC)
//   dweight  dweight (OC, C):  m C,  n OC, k N:   A inp^T (C, N), B dout^T (OC, N): transposed copies
// Each of inp, weight and dout is needed both ways: one cast kernel writes both FP8 copies from one read
// of the bf16 tensor (through shared memory). Each of N, C and OC is the K of one GEMM, the row length of
// two FP8 operands, and cuBLASLt wants those rows in whole 16-byte vectors and every dimension a
// multiple of 16: shapes that are not are refused with words, before anything runs.
//
// Fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM): Hopper's FP8 tensor cores do not sum in full
// fp32. Without the flag cuBLASLt promotes their partial sums into fp32 registers every few steps;
// with it, all of K stays in the tensor cores' sum. Bound 1 below turns that into an error of at most
// ceil(K / 32) 2^-10 of the result with the flag, 2^-10 without, whatever K. That is a worst case (every
// step's loss of one sign); measured errors are far below it. The forward's K is C or 4C (768..6400 in
// GPT-2), its outputs go to bf16, and fast is the usual choice there (Transformer Engine's and torchao's
// recipes). The backward keeps fp32 promotion: dinp sums K = OC (up to 4C) and dweight K = B T rows
// (65536 at B 64, T 1024) into gradients that accumulate across steps, where the unpromoted sum has no
// bound worth the name.
// Version 3 measures what that choice costs in time and what fast accumulation does to its errors.
//
// Bounds (each derived here, printed beside the error it bounds). u_out: the output's rounding, 2^-8
// relative in bf16 (8 significant bits), 2^-24 in fp32, each with 2^-22 more for the epilogue's fp32
// scaling and bias. A value in an FP8 format's normal range is rounded with relative error at most
// u = 2^-4 in e4m3 (3 mantissa bits), 2^-3 in e5m2 (2); below its smallest normal (2^-6, 2^-14 scaled)
// at most delta = half the subnormal step, 2^-10 / s and 2^-17 / s in x's units. S = sum_k |a_k b_k|.
//   1. The GEMM alone, against the float64 product of the dequantized operands it was given (products of
//      FP8 values are exact in fp32 and the scales are powers of two: only the sums and the output's
//      rounding can err). Elementwise |got - ref| <= u_out |ref| + g S; in norm ||got - ref|| / ||ref||
//      <= u_out / sqrt(3) + g' ||product|| / ||ref|| (ref includes the bias, or dweight's start).
//      NVIDIA documents only that fast accumulation does not "periodically promote intermediate results
//      to a higher precision"; DeepSeek-V3 (sec. 3.3.2) measured ~14 bits kept in those sums on H800 (up
//      to 2% relative error for a whole unpromoted K = 4096). Assuming 13 (2^-13 of the running sum lost
//      per step of 32 products, wgmma's k for 8-bit inputs) failed here: on an H200, e5m2 x e4m3 with
//      gradient rows spread over 8 binades lost up to 4.1 x 2^-13 in a single step (K = 16), as products
//      aligned to the largest one before they are summed would. We assume 10 bits, 2^-10 a step (2x that
//      measurement). Fast: every step adds onto the whole running sum, up to ceil(K / 32) losses of one
//      sign: g = g' = ceil(K / 32) 2^-10, where an accumulating GEMM's running sum starts from its C (S is
//      |C| + sum|a b| there). Split: promoted to fp32 at least every 8 steps (CUTLASS's Hopper FP8
//      mainloop promotes every 4, mma_promotion_interval); each promoted block is taken to lose at most
//      2^-10 of its sum and blocks add in fp32: g = g' = 2^-10, plus fp32's 4 K 2^-24 in g. The norm's
//      rounding term is the uniform-rounding model: an error spread evenly over +-half a step,
//      <= u_out |v|, has rms <= u_out / sqrt(3).
//   2. The quantization, against the float64 product of the original bf16 operands. Elementwise:
//      |got - ref| <= bound 1 + (ua + ub + ua ub) S + (1 + ua) db sum|a| + da sum|b| (each factor off
//      by at most u |x| + delta: a worst case for any inputs). In norm: ||got - ref|| <= 1.1 sqrt(sum over
//      outputs and k of ((ua^2 + ub^2) a^2 b^2 + da^2 b^2 + db^2 a^2) / 3) + bound 1's norm: rounding
//      errors of different elements are independent and spread evenly over their step, so each factor's
//      error has variance <= (u^2 x^2 + delta^2) / 3, and an output's K products add them in quadrature.
//      For iid zero-mean inputs ||ref||^2 ~ sum a^2 b^2 and the ratio's bound is sqrt((ua^2 + ub^2) / 3):
//      2^-4 sqrt(2/3) = 0.051 for e4m3 x e4m3 (2^-4 / sqrt(3) from each operand), 2^-4 sqrt(5/3) = 0.081
//      with e5m2; rows with non-zero means give a larger ||ref|| and a smaller ratio. Values
//      sit anywhere in their binade, not at its bottom, so measured ratios come out ~0.6-0.7 of this;
//      1.1 covers the products of two errors (u^2) and the sample's spread.
//   The elementwise bounds are worst cases over the signs of K terms, ~sqrt(K) times what random inputs
//   reach: they catch a wrong element, scale or layout; the norm bounds are the sharp ones.
//   The casts are checked exactly: amax, the scale, every FP8 byte against the host's round-to-nearest-
//   even of x s, the transposed copy byte for byte, nothing written past either copy.
//
// Validation: every GEMM of versions 2 and 3 at small shapes (every dimension a multiple of 16, cast
// tiles and cuBLASLt tiles partial, GPT-2's C, 3C, 4C and K up to 65536), outputs and FP8 copies
// poisoned with NaN first and guarded past their ends, fresh inputs per shape (rows with non-zero
// means, weights with larger rows, gradient rows over 8 binades), dweight from a non-zero start; two
// runs the same bits; shapes with a dimension not a multiple of 16, and a misaligned input, refused.
// Training's other casts, byte for byte against fp8_quantize's: batches of weights (fp8_quantize_batch,
// e4m3 and e5m2, each matrix its own scale, nothing written past the batch) and an amax given by the
// kernel that wrote the tensor (LayerNorm's amax option, whose output must not change);
// delayed scaling's casts, from an amax planted below and above x's (the values past the format's
// largest saturate), with x's own amax recorded in the same read; GELU's backward in the cast, with the
// column sums that give the bias gradient (against float64); LayerNorm straight into FP8
// (fp8_layernorm_forward), against layernorm_forward then the cast.
// Then d12's and d48's layers (8192 rows with --check, else the benchmark's) against the bf16 GEMMs:
// ||v2 - v1|| / ||v1|| within bound 2's iid value plus both GEMMs' own terms, two runs the same bits.
//
// Benchmark: d12 (C 768) and d48 (C 1600), qkv (C -> 3C), attproj (C -> C), fc (C -> 4C) and fcproj
// (4C -> C), at B T = 65536 and 8192 rows, random operands (tensor cores run faster on zeros). Each GEMM
// alone, then with the casts its operands need, then the whole layer as training would run it (inp,
// weight and dout each cast once, both copies, and the three GEMMs); median of 50 runs after 10
// (time_median_ms), TFLOP/s of 2 m n k, bf16's time over FP8's. cuBLASLt plans are tuned on their first
// call as the header tunes its own (matmul_tune: the fastest candidate with the first choice's bits).
// Then LayerNorm's FP8 copies at the benchmark's rows: layernorm_forward then the cast, against
// LayerNorm straight into FP8, each against the copy bandwidth measured in the same run.

#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common.cuh"
#include "dev/lab.cuh"
#include "fp8.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"

using bf16 = __nv_bfloat16;

// ---------------------------------------------------------------------------------------------
// The host's own decoding and rounding of FP8 (independent of cuda_fp8.h's); the formats and
// fp8_scale are fp8.cuh's.

inline double fp8_unit(const Fp8Format& f) { return std::ldexp(1.0, -f.mbits - 1); }                 // u
inline double fp8_half_subnormal(const Fp8Format& f) { return std::ldexp(1.0, f.emin - f.mbits - 1); }  // delta s

// An FP8 byte's value.
double fp8_decode(uint8_t b, const Fp8Format& f) {
    const int ebits = 7 - f.mbits, bias = (1 << (ebits - 1)) - 1;
    const int e = (b >> f.mbits) & ((1 << ebits) - 1), m = b & ((1 << f.mbits) - 1);
    const double sign = (b & 0x80) ? -1.0 : 1.0;
    if (f.mbits == 3 && e == 15 && m == 7) return NAN;  // e4m3: no infinities, one NaN per sign
    if (f.mbits == 2 && e == 31) return m == 0 ? sign * INFINITY : NAN;
    if (e == 0) return sign * std::ldexp(double(m), 1 - bias - f.mbits);
    return sign * std::ldexp(double((1 << f.mbits) + m), e - bias - f.mbits);
}

// v rounded to the nearest value of the format, ties to even, clamped to +-max (cvt.rn.satfinite).
double fp8_round(double v, const Fp8Format& f) {
    const double a = std::fabs(v);
    if (a == 0.0 || !std::isfinite(a)) return std::isnan(v) ? v : std::copysign(a == 0.0 ? 0.0 : f.max, v);
    int e;
    std::frexp(a, &e);  // a in [2^(e-1), 2^e)
    const double step = std::ldexp(1.0, std::max(e - 1, f.emin) - f.mbits);
    return std::copysign(std::min(std::nearbyint(a / step) * step, f.max), v);
}

// Guard past each FP8 copy (bytes) and each GEMM output (elements): poisoned, and nothing may write it.
constexpr size_t kGuard = 64;

// A bf16 tensor's FP8 copies for the lab: fp8.cuh's Fp8Tensor over buffers of its own, each with a
// guard past it (q_buf and qt_buf hold the copies, meta_buf 1 / s, s and amax's bits; `metas` of them,
// 4 floats apart, for a batch).
struct LabFp8Tensor : Fp8Tensor {
    DeviceBuffer<uint8_t> q_buf, qt_buf;
    DeviceBuffer<float> meta_buf;
    LabFp8Tensor(const Fp8Format& f, size_t cap, int metas = 1)
        : q_buf(cap + kGuard, "FP8 copy"), qt_buf(cap + kGuard, "FP8 transposed copy"), meta_buf(4 * size_t(metas), "FP8 scales") {
        fmt = &f, q = q_buf.ptr, qt = qt_buf.ptr, meta = meta_buf.ptr, capacity = cap;
    }
    void poison() {
        q_buf.poison(), qt_buf.poison();  // 0xff: NaN in e4m3 and e5m2
        meta_buf.poison();
    }
    // The amax slot set as a caller sets it for Fp8Amax::given (delayed scaling).
    void plant_amax(float amax) { cuda_check(cudaMemcpy(meta + 2, &amax, sizeof(float), cudaMemcpyHostToDevice)); }
};

// One layer's FP8 tensors, sized for the largest it will hold.
struct Fp8Layer {
    LabFp8Tensor inp, weight, dout;
    Fp8Layer(size_t inp_capacity, size_t weight_capacity, size_t dout_capacity)
        : inp(kE4M3, inp_capacity), weight(kE4M3, weight_capacity), dout(kE5M2, dout_capacity) {}
    void poison() { inp.poison(), weight.poison(), dout.poison(); }
};

// Why a layer's shape cannot take the FP8 path (empty: it can).
std::string fp8_layer_refusal(int N, int C, int OC) {
    const std::pair<const char*, int> dims[] = {{"N", N}, {"C", C}, {"OC", OC}};
    for (const auto& [name, v] : dims)
        if (v % 16)
            return strf("%s = %d is not a multiple of 16: N, C and OC are each the K of one GEMM (dweight, forward, dinp), "
                        "and cuBLASLt's FP8 GEMMs need K-long rows of whole 16-byte vectors and every dimension a multiple of 16",
                        name, v);
    return "";
}

// Versions 2 and 3: the layer as training would run it, each bf16 tensor cast once (both FP8 copies).
// Empty, or why not (nothing runs then).
std::string fp8_layer(Fp8Layer& L, int version, bf16* out, bf16* dinp, float* dweight, const bf16* inp, const bf16* weight,
                      const bf16* bias, const bf16* dout, int N, int C, int OC, cudaStream_t stream = 0) {
    std::string why = fp8_layer_refusal(N, C, OC);
    const bool fast_backward = version == 3;
    if (why.empty()) why = fp8_quantize(L.inp, inp, N, C, true, true, stream);
    if (why.empty()) why = fp8_quantize(L.weight, weight, OC, C, true, true, stream);
    if (why.empty()) why = fp8_forward(out, L.inp, L.weight, bias, true, stream);
    if (why.empty()) why = fp8_quantize(L.dout, dout, N, OC, true, true, stream);
    if (why.empty()) why = fp8_backward_input(dinp, L.dout, L.weight, fast_backward, stream);
    if (why.empty()) why = fp8_backward_weight(dweight, L.dout, L.inp, fast_backward, stream);
    return why;
}

// ---------------------------------------------------------------------------------------------
// Host checks of the host's FP8 helpers (they run everywhere, GPU or not): the reference's rounding is
// the one the casts are held to, so it is checked against NVIDIA's host conversion too.

void check_host_helpers(TestCounter& tests) {
    for (const Fp8Format* f : {&kE4M3, &kE5M2}) {
        const __nv_fp8_interpretation_t kind = f == &kE5M2 ? __NV_E5M2 : __NV_E4M3;
        size_t bad = 0;
        constexpr int kSamples = 65536;
        // Every finite byte rounds to itself; each midpoint of two neighbours to the even one.
        std::vector<double> pos;
        for (int byte = 0; byte < 128; byte++) {
            const double v = fp8_decode(uint8_t(byte), *f);
            if (!std::isfinite(v)) continue;
            pos.push_back(v);
            bad += fp8_round(v, *f) != v || fp8_round(-v, *f) != -v || fp8_decode(uint8_t(byte | 0x80), *f) != -v;
        }
        bad += pos.back() != f->max;
        for (size_t i = 0; i + 1 < pos.size(); i++) {
            bad += !(pos[i] < pos[i + 1]);
            const double mid = 0.5 * (pos[i] + pos[i + 1]), even = (i % 2 == 0) ? pos[i] : pos[i + 1];
            bad += fp8_round(mid, *f) != even;
        }
        // Against cuda_fp8.h's host conversion over 2^16 values across the whole range and past max.
        Rng rng(17);
        for (int i = 0; i < kSamples; i++) {
            const double v = std::ldexp(rng.uniform(-2.0f, 2.0f), int(rng.next() % (f->emax - f->emin + 12)) + f->emin - f->mbits - 4);
            const double theirs = fp8_decode(__nv_cvt_double_to_fp8(v, __NV_SATFINITE, kind), *f);
            bad += fp8_round(v, *f) != theirs;
        }
        // The scale: a power of two with amax s in (max / 2, max], over 2^16 amaxes from 2^-40 to 2^40.
        for (int i = 0; i < kSamples; i++) {
            const float amax = std::ldexp(rng.uniform(1.0f, 2.0f), int(rng.next() % 80) - 40);
            const double s = fp8_scale(amax, f->emax), scaled = double(amax) * s;
            int e;
            bad += std::frexp(s, &e) != 0.5 || !(scaled > f->max / 2 && scaled <= f->max);
        }
        bad += fp8_scale(0.0f, f->emax) != 1.0f || !std::isnan(fp8_scale(INFINITY, f->emax)) || !std::isnan(fp8_scale(NAN, f->emax));
        printf("  host %s: %zu finite values round to themselves, midpoints to the even neighbour, %d values as cuda_fp8.h "
               "rounds them, %d scales in (max/2, max]  %s (%zu bad)\n",
               f->name, pos.size() * 2, kSamples, kSamples, bad ? "FAIL" : "ok  ", bad);
        tests.record(bad == 0);
    }
}

// ---------------------------------------------------------------------------------------------
// Validation at small shapes against the float64 reference.

// D[i][j] = sum_k A[i][k] B[j][k] (A: I x K, B: J x K, row-major) from the original operands (a, b) and
// from the dequantized FP8 ones (ah, bh), with the sums the bounds need.
struct Reference {
    int I = 0, J = 0, K = 0;
    std::vector<double> y, mag, sq;  // sum a b, sum |a b|, sum (a b)^2
    std::vector<double> yh, magh;    // sum ah bh, sum |ah bh|
    std::vector<double> a_abs, a_sq, b_abs, b_sq;  // per row of A and of B: sum |.|, sum .^2
};
Reference reference(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& ah,
                    const std::vector<float>& bh, int I, int J, int K) {
    Reference r;
    r.I = I, r.J = J, r.K = K;
    const size_t n = size_t(I) * J;
    r.y.resize(n), r.mag.resize(n), r.sq.resize(n), r.yh.resize(n), r.magh.resize(n);
    r.a_abs.assign(I, 0.0), r.a_sq.assign(I, 0.0), r.b_abs.assign(J, 0.0), r.b_sq.assign(J, 0.0);
    for (int i = 0; i < I; i++)
        for (int k = 0; k < K; k++) r.a_abs[i] += std::fabs(a[size_t(i) * K + k]), r.a_sq[i] += double(a[size_t(i) * K + k]) * a[size_t(i) * K + k];
    for (int j = 0; j < J; j++)
        for (int k = 0; k < K; k++) r.b_abs[j] += std::fabs(b[size_t(j) * K + k]), r.b_sq[j] += double(b[size_t(j) * K + k]) * b[size_t(j) * K + k];
    // Four rows of A against each row of B: B is read once per four outputs (it is the larger operand
    // at the shapes with a long K).
    constexpr int kRows = 4;
    for (int i0 = 0; i0 < I; i0 += kRows) {
        const float *ai[kRows], *ahi[kRows];
        for (int t = 0; t < kRows; t++) {
            const int i = std::min(i0 + t, I - 1);  // past the end: the last row again, not stored
            ai[t] = &a[size_t(i) * K], ahi[t] = &ah[size_t(i) * K];
        }
        for (int j = 0; j < J; j++) {
            const float *bj = &b[size_t(j) * K], *bhj = &bh[size_t(j) * K];
            double s[kRows] = {}, m[kRows] = {}, q[kRows] = {}, sh[kRows] = {}, mh[kRows] = {};
            for (int k = 0; k < K; k++) {
                const double bk = bj[k], bhk = bhj[k];
                for (int t = 0; t < kRows; t++) {
                    const double p = ai[t][k] * bk, ph = ahi[t][k] * bhk;
                    s[t] += p, m[t] += std::fabs(p), q[t] += p * p, sh[t] += ph, mh[t] += std::fabs(ph);
                }
            }
            for (int t = 0; t < kRows && i0 + t < I; t++) {
                const size_t o = size_t(i0 + t) * J + j;
                r.y[o] = s[t], r.mag[o] = m[t], r.sq[o] = q[t], r.yh[o] = sh[t], r.magh[o] = mh[t];
            }
        }
    }
    return r;
}

struct GemmSpec {
    const char* name;  // fwd, dinp, dweight
    const Fp8Format *fa, *fb;
    bool fast, fp32_out;
};

// The worst ratio of error to bound per version and GEMM over the shapes: [0] norm, [1] element vs the
// dequantized operands (bound 1), [2] norm, [3] element vs the original ones (bound 2).
std::map<std::string, std::vector<double>> g_worst;

// Bounds 1 and 2 of the top comment for one GEMM's output; records both.
void check_gemm(TestCounter& tests, int version, const GemmSpec& g, const char* shape, const Reference& r,
                const std::vector<double>& got, const std::vector<double>& extra, double a_scale_inv, double b_scale_inv) {
    const int K = r.K, steps = (K + 31) / 32;
    const double u_out = (g.fp32_out ? std::ldexp(1.0, -24) : std::ldexp(1.0, -8)) + std::ldexp(1.0, -22);
    const double u_out_rms = u_out / std::sqrt(3.0);
    const double g_norm = g.fast ? steps * std::ldexp(1.0, -10) : std::ldexp(1.0, -10);
    const double g_elem = g_norm + 4.0 * K * std::ldexp(1.0, -24);
    const double ua = fp8_unit(*g.fa), ub = fp8_unit(*g.fb);
    const double da = fp8_half_subnormal(*g.fa) * a_scale_inv, db = fp8_half_subnormal(*g.fb) * b_scale_inv;
    auto sq = [](double x) { return x * x; };
    double e2h = 0, t2h = 0, p2h = 0, e2 = 0, t2 = 0, var = 0, worst_h = 0, worst = 0, max_err_h = 0, max_err = 0;
    size_t bad_h = 0, bad = 0;
    for (int i = 0; i < r.I; i++)
        for (int j = 0; j < r.J; j++) {
            const size_t o = size_t(i) * r.J + j;
            const double v = got[o], th = r.yh[o] + extra[o], t = r.y[o] + extra[o];
            // Fast accumulation keeps an accumulating GEMM's start (dweight's) in the unpromoted sum too.
            const double run_mag = r.magh[o] + (g.fast ? std::fabs(extra[o]) : 0.0);
            const double tol_h = u_out * std::fabs(th) + g_elem * run_mag + 1e-30;
            const double tol = tol_h + (ua + ub + ua * ub) * r.mag[o] + (1 + ua) * db * r.a_abs[i] + da * r.b_abs[j];
            const double eh = std::fabs(v - th), e = std::fabs(v - t);
            if (!std::isfinite(v)) {
                bad_h++, bad++, worst_h = worst = INFINITY;
                continue;
            }
            bad_h += eh > tol_h, bad += e > tol;
            worst_h = std::max(worst_h, eh / tol_h), worst = std::max(worst, e / tol);
            max_err_h = std::max(max_err_h, eh), max_err = std::max(max_err, e);
            e2h += eh * eh, t2h += th * th, p2h += sq(std::fabs(r.yh[o]) + (g.fast ? std::fabs(extra[o]) : 0.0)), e2 += e * e, t2 += t * t;
            var += ((ua * ua + ub * ub) * r.sq[o] + da * da * r.b_sq[j] + db * db * r.a_sq[i]) / 3;
        }
    const double norm_h = std::sqrt(e2h / t2h), bound_h = u_out_rms + g_norm * std::sqrt(p2h / t2h);
    const double norm = std::sqrt(e2 / t2),
                 bound = (1.1 * std::sqrt(var) + u_out_rms * std::sqrt(t2h) + g_norm * std::sqrt(p2h)) / std::sqrt(t2);
    const bool ok_h = bad_h == 0 && norm_h <= bound_h, ok = bad == 0 && norm <= bound;
    printf("  v%d %-7s %s x %s %-5s %-22s vs dequantized %s norm %.2e (bound %.1e) max|err| %.1e (%.3f of its bound) | "
           "vs bf16 inputs %s norm %.2e (bound %.1e) max|err| %.1e (%.3f)%s\n",
           version, g.name, g.fa->name, g.fb->name, g.fast ? "fast" : "split", shape, ok_h ? "ok  " : "FAIL", norm_h, bound_h,
           max_err_h, worst_h, ok ? "ok  " : "FAIL", norm, bound, max_err, worst,
           bad_h + bad ? strf("  (%zu, %zu elements past their bounds)", bad_h, bad).c_str() : "");
    tests.record(ok_h);
    tests.record(ok);
    std::vector<double>& w = g_worst[strf("v%d %-7s %s x %s %-5s", version, g.name, g.fa->name, g.fb->name, g.fast ? "fast" : "split")];
    w.resize(4, 0.0);
    w[0] = std::max(w[0], norm_h / bound_h), w[1] = std::max(w[1], worst_h);
    w[2] = std::max(w[2], norm / bound), w[3] = std::max(w[3], worst);
}

// A layer's device tensors at one shape.
struct ShapeBuffers {
    int N, C, OC;
    DeviceBuffer<bf16> inp, weight, bias, dout, out, dinp;
    DeviceBuffer<float> dweight;
    Fp8Layer fp8;
    ShapeBuffers(int N_, int C_, int OC_)
        : N(N_), C(C_), OC(OC_), inp(size_t(N_) * C_, "inp"), weight(size_t(OC_) * C_, "weight"), bias(OC_, "bias"),
          dout(size_t(N_) * OC_, "dout"), out(size_t(N_) * OC_ + kGuard, "out"), dinp(size_t(N_) * C_ + kGuard, "dinp"),
          dweight(size_t(OC_) * C_ + kGuard, "dweight"), fp8(size_t(N_) * C_, size_t(OC_) * C_, size_t(N_) * OC_) {}
};

// Everything one run of a version leaves, guards included.
struct LayerRun {
    std::string refusal;
    std::vector<bf16> out, dinp;
    std::vector<float> dweight;
    std::vector<uint8_t> q[3], qt[3];  // inp, weight, dout
    std::vector<float> meta[3];
    bool same_bits(const LayerRun& o, bool outputs) const {
        auto same = [](const auto& x, const auto& y) {
            return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
        };
        bool ok = !outputs || (same(out, o.out) && same(dinp, o.dinp) && same(dweight, o.dweight));
        for (int t = 0; t < 3; t++) ok = ok && same(q[t], o.q[t]) && same(qt[t], o.qt[t]) && same(meta[t], o.meta[t]);
        return ok;
    }
};

LayerRun run_layer(ShapeBuffers& B, int version, const std::vector<float>& dweight0) {
    B.out.poison(), B.dinp.poison(), B.dweight.poison(), B.fp8.poison();
    cuda_check(cudaMemcpy(B.dweight.ptr, dweight0.data(), dweight0.size() * sizeof(float), cudaMemcpyHostToDevice));
    LayerRun r;
    r.refusal = fp8_layer(B.fp8, version, B.out.ptr, B.dinp.ptr, B.dweight.ptr, B.inp.ptr, B.weight.ptr, B.bias.ptr, B.dout.ptr,
                          B.N, B.C, B.OC);
    cuda_check(cudaDeviceSynchronize());
    r.out = B.out.download(), r.dinp = B.dinp.download(), r.dweight = B.dweight.download();
    LabFp8Tensor* t[3] = {&B.fp8.inp, &B.fp8.weight, &B.fp8.dout};
    for (int i = 0; i < 3; i++) r.q[i] = t[i]->q_buf.download(), r.qt[i] = t[i]->qt_buf.download(), r.meta[i] = t[i]->meta_buf.download();
    return r;
}

template <typename T> bool guard_intact(const std::vector<T>& v, size_t n) {
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(v.data());
    for (size_t i = n * sizeof(T); i < v.size() * sizeof(T); i++)
        if (bytes[i] != 0xff) return false;
    return true;
}

// max |v| over a bf16 tensor: the amax an FP8 cast of it takes.
float host_amax(const std::vector<bf16>& v) {
    float amax = 0.0f;
    for (const bf16& x : v) amax = std::max(amax, std::fabs(__bfloat162float(x)));
    return amax;
}

// One tensor's casts: amax, s, every byte of q against the host's rounding, qt byte for byte, the guards.
bool check_cast(const char* name, const std::vector<bf16>& x, int R, int C, const Fp8Format& f, const LayerRun& run, int t) {
    const std::vector<uint8_t>&q = run.q[t], &qt = run.qt[t];
    const float amax = host_amax(x);
    const float s = fp8_scale(amax, f.emax);
    const float got_amax = run.meta[t][2], got_s = run.meta[t][1], got_inv = run.meta[t][0];
    size_t bad_q = 0, bad_qt = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            const uint8_t b = q[size_t(r) * C + c];
            bad_q += fp8_decode(b, f) != fp8_round(double(__bfloat162float(x[size_t(r) * C + c])) * s, f);
            bad_qt += qt[size_t(c) * R + r] != b;
        }
    const bool scales_ok = got_amax == amax && got_s == s && double(got_inv) * s == 1.0;
    const bool guards = guard_intact(q, size_t(R) * C) && guard_intact(qt, size_t(R) * C);
    const bool ok = scales_ok && bad_q == 0 && bad_qt == 0 && guards;
    printf("  cast %-5s %s %-24s %s amax %.6g (host %.6g) s 2^%d (1/s %s); %zu bytes: %zu not the host's rounding, %zu "
           "transposed bytes differ; guards %s\n",
           name, f.name, strf("%d x %d", R, C).c_str(), ok ? "ok  " : "FAIL", got_amax, amax, int(std::lround(std::log2(s))),
           double(got_inv) * s == 1.0 ? "exact" : "WRONG", size_t(R) * C, bad_q, bad_qt, guards ? "intact" : "WRITTEN");
    return ok;
}

struct Shape {
    int N, C, OC;
};

std::vector<float> to_floats(const std::vector<bf16>& x) {
    std::vector<float> f(x.size());
    for (size_t i = 0; i < x.size(); i++) f[i] = __bfloat162float(x[i]);
    return f;
}
std::vector<float> transpose(const std::vector<float>& x, int R, int C) {
    std::vector<float> t(x.size());
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) t[size_t(c) * R + r] = x[size_t(r) * C + c];
    return t;
}
// Dequantized FP8 values: the first n bytes (the guard is not data).
std::vector<float> dequantize(const std::vector<uint8_t>& q, size_t n, const Fp8Format& f, float scale_inv) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) x[i] = float(fp8_decode(q[i], f) * scale_inv);  // exact: q's value times a power of two
    return x;
}

void check_shape(TestCounter& tests, bool gpu, const Shape& sh, Rng& rng) {
    const int N = sh.N, C = sh.C, OC = sh.OC;
    const std::string shape = strf("N %d C %d OC %d", N, C, OC);
    if (!gpu) {
        tests.skip(("fp8 " + shape).c_str());
        return;
    }
    // Inputs: inp rows with non-zero means (LayerNorm-like), weight ~ U(+-0.05) with every 7th row 4x larger,
    // dout rows spread over 8 binades (gradients), a small bias and dweight start (~5% of the products).
    std::vector<bf16> inp(size_t(N) * C), weight(size_t(OC) * C), bias(OC), dout(size_t(N) * OC);
    fill_rows(inp, N, C, rng);
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++) weight[size_t(o) * C + c] = __float2bfloat16(rng.uniform(-0.05f, 0.05f) * (o % 7 == 3 ? 4.0f : 1.0f));
    for (auto& b : bias) b = __float2bfloat16(rng.uniform(-0.1f, 0.1f));
    for (int n = 0; n < N; n++) {
        const float row_scale = 1e-3f * std::exp2(rng.uniform(-8.0f, 0.0f));
        for (int o = 0; o < OC; o++) dout[size_t(n) * OC + o] = __float2bfloat16(row_scale * rng.uniform(-1.0f, 1.0f));
    }
    std::vector<float> dweight0(size_t(OC) * C);
    for (auto& v : dweight0) v = rng.uniform(-1.0f, 1.0f) * 1e-5f * std::sqrt(float(N));

    ShapeBuffers B(N, C, OC);
    B.inp.upload(inp), B.weight.upload(weight), B.bias.upload(bias), B.dout.upload(dout);
    const LayerRun v2 = run_layer(B, 2, dweight0);
    if (!v2.refusal.empty()) {
        printf("  v2 FAIL refused: %s\n", v2.refusal.c_str());
        tests.fail_one();
        return;
    }
    tests.record(check_cast("inp", inp, N, C, kE4M3, v2, 0));
    tests.record(check_cast("weight", weight, OC, C, kE4M3, v2, 1));
    tests.record(check_cast("dout", dout, N, OC, kE5M2, v2, 2));

    // The references, from the original operands and from the FP8 copies each GEMM read (in dot form).
    const float si[3] = {v2.meta[0][0], v2.meta[1][0], v2.meta[2][0]};
    const std::vector<float> inp_f = to_floats(inp), w_f = to_floats(weight), dout_f = to_floats(dout);
    const size_t n_inp = size_t(N) * C, n_w = size_t(OC) * C, n_dout = size_t(N) * OC;
    const Reference fwd = reference(inp_f, w_f, dequantize(v2.q[0], n_inp, kE4M3, si[0]), dequantize(v2.q[1], n_w, kE4M3, si[1]), N, OC, C);
    const Reference dx = reference(dout_f, transpose(w_f, OC, C), dequantize(v2.q[2], n_dout, kE5M2, si[2]),
                                   dequantize(v2.qt[1], n_w, kE4M3, si[1]), N, C, OC);
    const Reference dw = reference(transpose(dout_f, N, OC), transpose(inp_f, N, C), dequantize(v2.qt[2], n_dout, kE5M2, si[2]),
                                   dequantize(v2.qt[0], n_inp, kE4M3, si[0]), OC, C, N);
    std::vector<double> bias_extra(n_dout), zeros(n_inp, 0.0), dw_extra(dweight0.begin(), dweight0.end());
    for (size_t i = 0; i < n_dout; i++) bias_extra[i] = __bfloat162float(bias[i % OC]);

    for (int version = 2; version <= 3; version++) {
        const LayerRun run = version == 2 ? v2 : run_layer(B, 3, dweight0);
        const LayerRun again = run_layer(B, version, dweight0);
        const bool fast_bwd = version == 3;
        std::vector<double> out(n_dout), dinp(n_inp), dweight(n_w);
        for (size_t i = 0; i < n_dout; i++) out[i] = __bfloat162float(run.out[i]);
        for (size_t i = 0; i < n_inp; i++) dinp[i] = __bfloat162float(run.dinp[i]);
        for (size_t i = 0; i < n_w; i++) dweight[i] = run.dweight[i];
        // Formats and scales in the reference's order: fwd inp x weight, dinp dout x weight, dweight dout^T x inp.
        check_gemm(tests, version, {"fwd", &kE4M3, &kE4M3, true, false}, shape.c_str(), fwd, out, bias_extra, si[0], si[1]);
        check_gemm(tests, version, {"dinp", &kE5M2, &kE4M3, fast_bwd, false}, shape.c_str(), dx, dinp, zeros, si[2], si[1]);
        check_gemm(tests, version, {"dweight", &kE5M2, &kE4M3, fast_bwd, true}, shape.c_str(), dw, dweight, dw_extra, si[2], si[0]);
        const bool guards = guard_intact(run.out, n_dout) && guard_intact(run.dinp, n_inp) && guard_intact(run.dweight, n_w);
        const bool same = run.same_bits(again, true) && run.same_bits(v2, false);
        printf("  v%d two runs %-22s %s %s; FP8 copies and scales %s; guards past out, dinp, dweight %s\n", version,
               shape.c_str(), same ? "ok  " : "FAIL", run.same_bits(again, true) ? "the same bits" : "DIFFERENT BITS",
               run.same_bits(v2, false) ? "the same as v2's" : "NOT v2's", guards ? "intact" : "WRITTEN");
        tests.record(same && guards);
    }
}

// A refusal's check: ok when `why` gives the reason and nothing was written (untouched).
void record_refusal(TestCounter& tests, const char* what, const std::string& why, bool untouched) {
    const bool ok = !why.empty() && untouched;
    printf("  %-56s %s %s; outputs %s\n", what, ok ? "ok  " : "FAIL", why.empty() ? "NOT REFUSED" : why.c_str(),
           untouched ? "untouched" : "WRITTEN");
    tests.record(ok);
}

// Shapes not for FP8, and a misaligned input: refused with words, nothing written.
void check_refusals(TestCounter& tests, bool gpu) {
    const Shape refused[] = {{37, 64, 64}, {64, 40, 64}, {64, 64, 24}};
    for (const Shape& sh : refused) {
        const std::string what = strf("refusal N %d C %d OC %d", sh.N, sh.C, sh.OC);
        if (!gpu) {
            tests.skip(what.c_str());
            continue;
        }
        ShapeBuffers B(sh.N, sh.C, sh.OC);
        const LayerRun r = run_layer(B, 2, std::vector<float>(size_t(sh.OC) * sh.C, 0.0f));
        record_refusal(tests, what.c_str(), r.refusal, guard_intact(r.out, 0) && guard_intact(r.dinp, 0) && guard_intact(r.q[0], 0));
    }
    const char* what = "refusal: inp 2 bytes past 16-byte alignment";
    if (!gpu) {
        tests.skip(what);
        return;
    }
    DeviceBuffer<bf16> x(64 * 64, "misaligned inp", 1);
    LabFp8Tensor t(kE4M3, 64 * 64);
    t.poison();
    const std::string why = fp8_quantize(t, x.ptr, 64, 64, true, true);
    cuda_check(cudaDeviceSynchronize());
    record_refusal(tests, what, why, guard_intact(t.q_buf.download(), 0) && guard_intact(t.qt_buf.download(), 0));
}

// ---------------------------------------------------------------------------------------------
// Training's casts besides fp8_quantize with its own amax pass: a layer kind's L weights in one batch
// (fp8_quantize_batch), and an amax written by the kernel that produced the tensor (layernorm_forward's
// with_amax; the LayerNorm backward's is checked in its own lab) taken as given (Fp8Amax::given). Each must give fp8_quantize's
// bytes and scales exactly: the same roundings, only fewer launches and reads.

// A cast's q and qt (the first n bytes and the guard past them) and its 4 meta floats.
struct CastBytes {
    std::vector<uint8_t> q, qt;
    std::vector<float> meta;
};
CastBytes cast_bytes(const LabFp8Tensor& t) { return {t.q_buf.download(), t.qt_buf.download(), t.meta_buf.download()}; }
bool same_cast(const CastBytes& a, const CastBytes& b) {
    return a.q == b.q && a.qt == b.qt && std::memcmp(a.meta.data(), b.meta.data(), 3 * sizeof(float)) == 0;
}

// count matrices (R, C), matrix i of magnitude 4^i 2^-3 (each its own scale), cast in one batch against
// fp8_quantize of each: every byte of both copies, 1 / s, s and amax, and nothing written past the batch.
void check_batched_casts(TestCounter& tests, bool gpu, Rng& rng) {
    struct Case {
        int count, R, C;
    };
    const Case cases[] = {{3, 48, 80}, {4, 208, 144}, {2, 64, 768}, {12, 16, 16}, {5, 128, 64}};
    for (const Fp8Format* f : {&kE4M3, &kE5M2})
        for (const Case& c : cases) {
            const std::string what = strf("batch %s %d x (%d x %d)", f->name, c.count, c.R, c.C);
            if (!gpu) {
                tests.skip(what.c_str());
                continue;
            }
            const size_t n = size_t(c.R) * c.C;
            std::vector<bf16> x(c.count * n);
            for (size_t i = 0; i < x.size(); i++) x[i] = __float2bfloat16(rng.uniform(-1.0f, 1.0f) * std::ldexp(1.0f, 2 * int(i / n) - 3));
            DeviceBuffer<bf16> dx(x.size(), "batch input");
            dx.upload(x);
            LabFp8Tensor all(*f, c.count * n, c.count), one(*f, n);
            all.poison();
            fp8_zero_amax_slots(all.meta, c.count);
            const std::string why = fp8_quantize_batch(all, dx.ptr, c.count, c.R, c.C, true, true);
            cuda_check(cudaDeviceSynchronize());
            const CastBytes batch = cast_bytes(all);
            size_t bad_bytes = 0;
            int bad_scales = 0, bad_amax = 0;
            for (int i = 0; i < c.count && why.empty(); i++) {
                one.poison();
                const std::string why_one = fp8_quantize(one, dx.ptr + i * n, c.R, c.C, true, true);
                if (!why_one.empty()) fail("fp8_quantize refused a batch's matrix: %s", why_one.c_str());
                cuda_check(cudaDeviceSynchronize());
                const CastBytes single = cast_bytes(one);
                for (size_t j = 0; j < n; j++) bad_bytes += (batch.q[i * n + j] != single.q[j]) + (batch.qt[i * n + j] != single.qt[j]);
                bad_scales += std::memcmp(&batch.meta[4 * i], single.meta.data(), 3 * sizeof(float)) != 0;
                float amax = 0.0f;
                for (size_t j = 0; j < n; j++) amax = std::max(amax, std::fabs(__bfloat162float(x[i * n + j])));
                bad_amax += batch.meta[4 * i + 2] != amax;
            }
            const bool guards = guard_intact(batch.q, c.count * n) && guard_intact(batch.qt, c.count * n);
            const bool ok = why.empty() && bad_bytes == 0 && bad_scales == 0 && bad_amax == 0 && guards;
            printf("  %-26s %s %s%zu bytes differ from fp8_quantize's one by one; %d of %d metas differ, %d amax not the host's; "
                   "scales 2^%d .. 2^%d; guards %s\n",
                   what.c_str(), ok ? "ok  " : "FAIL", why.empty() ? "" : ("REFUSED: " + why + "; ").c_str(), bad_bytes, bad_scales,
                   c.count, bad_amax, int(std::lround(std::log2(batch.meta[1]))), int(std::lround(std::log2(batch.meta[4 * (c.count - 1) + 1]))),
                   guards ? "intact" : "WRITTEN");
            tests.record(ok);
        }
}

// The forward's LayerNorm with the amax option (ln1 and ln2 in train_gpt -f8 1), then the cast with
// Fp8Amax::given, against the LayerNorm without it and fp8_quantize's own amax: the LayerNorm's output
// bit for bit (and nothing between its rows written), the FP8 bytes and scales. Then an amax given that
// is not x's: the cast must take it as it is (the pass is skipped), its scale fp8_scale of that amax.
void check_given_amax(TestCounter& tests, bool gpu, Rng& rng) {
    struct Case {
        int N, C, ld;  // ld: the LayerNorm's out rows (a column of ones after C, as train_gpt's)
    };
    const Case cases[] = {{64, 768, 776}, {208, 144, 152}, {48, 1600, 1600}};
    for (const Case& c : cases) {
        const std::string what = strf("layernorm %d x %d%s", c.N, c.C, c.ld != c.C ? strf(" (ld %d)", c.ld).c_str() : "");
        if (!gpu) {
            tests.skip(what.c_str());
            continue;
        }
        const size_t n_out = size_t(c.N) * c.ld, n_in = size_t(c.N) * c.C;
        std::vector<bf16> inp(n_in), w(c.C), b(c.C);
        fill_rows(inp, c.N, c.C, rng);
        fill_uniform(w, 0.5f, 1.5f, rng);
        fill_uniform(b, -0.5f, 0.5f, rng);
        DeviceBuffer<bf16> d_inp(n_in, "LayerNorm input"), d_w(c.C, "weight"), d_b(c.C, "bias");
        DeviceBuffer<bf16> out_plain(n_out, "output, no amax"), out_amax(n_out, "output, amax");
        d_inp.upload(inp), d_w.upload(w), d_b.upload(b);
        out_plain.poison(), out_amax.poison();
        LabFp8Tensor plain(kE4M3, n_in), given(kE4M3, n_in);
        plain.poison(), given.poison();
        auto produce = [&](bf16* out, unsigned* amax_bits) {
            layernorm_forward(out, (float*)nullptr, (float*)nullptr, d_inp.ptr, d_w.ptr, d_b.ptr, c.N, c.C,
                              LayerNormForwardOptions().with_out_ld(c.ld).with_amax(amax_bits));
        };
        produce(out_plain.ptr, nullptr);
        std::string why = fp8_quantize(plain, out_plain.ptr, c.N, c.C, true, true, 0, c.ld);
        produce(out_amax.ptr, fp8_amax_slot(given));
        if (why.empty()) why = fp8_quantize(given, out_amax.ptr, c.N, c.C, true, true, 0, c.ld, Fp8CastOptions().with_amax(Fp8Amax::given));
        cuda_check(cudaDeviceSynchronize());
        const std::vector<bf16> y_plain = out_plain.download(), y_amax = out_amax.download();
        const bool same_out = std::memcmp(y_plain.data(), y_amax.data(), n_out * sizeof(bf16)) == 0;
        const CastBytes cb_plain = cast_bytes(plain), cb_given = cast_bytes(given);
        float amax = 0.0f;  // the host's, over the C values of each row
        for (int r = 0; r < c.N; r++)
            for (int j = 0; j < c.C; j++) amax = std::max(amax, std::fabs(__bfloat162float(y_amax[size_t(r) * c.ld + j])));
        const bool same = same_cast(cb_plain, cb_given), amax_ok = cb_given.meta[2] == amax;
        const bool ok = why.empty() && same_out && same && amax_ok;
        printf("  %-32s %s %s%s; amax %.6g (host %.6g); FP8 copies and scales %s\n", what.c_str(), ok ? "ok  " : "FAIL",
               why.empty() ? "" : ("REFUSED: " + why + "; ").c_str(), same_out ? "output the same bits with the amax option" : "OUTPUT CHANGED",
               cb_given.meta[2], amax, same ? "the same as with fp8_quantize's own amax" : "DIFFERENT");
        tests.record(ok);
    }
    const char* what = "given amax taken as it is";
    if (!gpu) {
        tests.skip(what);
        return;
    }
    std::vector<bf16> x(64 * 64);
    fill_uniform(x, -1.0f, 1.0f, rng);
    DeviceBuffer<bf16> dx(x.size(), "x");
    dx.upload(x);
    LabFp8Tensor t(kE4M3, x.size());
    const float planted = 100.0f;  // not x's amax (below 1): s 2^2, where x's own would give 2^8
    t.plant_amax(planted);
    const std::string why = fp8_quantize(t, dx.ptr, 64, 64, true, false, 0, 0, Fp8CastOptions().with_amax(Fp8Amax::given));
    cuda_check(cudaDeviceSynchronize());
    const std::vector<float> meta = t.meta_buf.download();
    const bool ok = why.empty() && meta[2] == planted && meta[1] == fp8_scale(planted, kE4M3.emax);
    printf("  %-32s %s amax %.6g (planted %.6g), s 2^%d (fp8_scale of it: 2^%d)\n", what, ok ? "ok  " : "FAIL", meta[2], planted,
           int(std::lround(std::log2(meta[1]))), int(std::lround(std::log2(fp8_scale(planted, kE4M3.emax)))));
    tests.record(ok);
}

// fp8_quantize's gelu (train_gpt -f8 1 casts fcproj's input from fch so): GELU's input x in, the FP8
// copies of GELU(x) out, against gelu_forward's bf16 output cast by fp8_quantize: every byte of both
// copies and the scale, and nothing written past the tensor. x in [-8, 3) spans GELU's negative dip,
// zero crossing and near-linear tail, and max |x| (8) is not max |GELU(x)| (3): an amax pass over x in
// place of GELU(x) would give another scale and fail.
void check_gelu_cast(TestCounter& tests, bool gpu, Rng& rng) {
    struct Case {
        int R, C;
        bool natural, transposed;
    };
    const Case cases[] = {{64, 3072, true, true}, {208, 144, true, true}, {16, 6400, true, false}, {1024, 48, false, true}};
    for (const Case& c : cases) {
        const std::string what = strf("GELU cast %d x %d%s%s", c.R, c.C, c.natural ? " natural" : "", c.transposed ? " transposed" : "");
        if (!gpu) {
            tests.skip(what.c_str());
            continue;
        }
        const size_t n = size_t(c.R) * c.C;
        std::vector<bf16> x(n);
        fill_uniform(x, -8.0f, 3.0f, rng);
        DeviceBuffer<bf16> dx(n, "GELU input"), dy(n, "GELU output");
        dx.upload(x);
        dy.poison();
        LabFp8Tensor fused(kE4M3, n), plain(kE4M3, n);
        fused.poison(), plain.poison();
        std::string why = fp8_quantize(fused, dx.ptr, c.R, c.C, c.natural, c.transposed, 0, 0, Fp8CastOptions().with_gelu());
        gelu_forward(dy.ptr, (const bf16*)dx.ptr, n);
        if (why.empty()) why = fp8_quantize(plain, dy.ptr, c.R, c.C, c.natural, c.transposed);
        cuda_check(cudaDeviceSynchronize());
        const CastBytes a = cast_bytes(fused), b = cast_bytes(plain);
        const bool guards = guard_intact(a.q, n) && guard_intact(a.qt, n);
        const bool ok = why.empty() && same_cast(a, b) && guards;
        printf("  %-44s %s %sFP8 copies and scale %s gelu_forward's output cast; amax %.6g; guards %s\n", what.c_str(), ok ? "ok  " : "FAIL",
               why.empty() ? "" : ("REFUSED: " + why + "; ").c_str(), same_cast(a, b) ? "the same as" : "DIFFERENT from", a.meta[2],
               guards ? "intact" : "WRITTEN");
        tests.record(ok);
    }
}

// Delayed scaling's casts (train_gpt -f8 1's atty, GELU(fch) and dqkv): the scale from an amax the
// caller planted in the slot (Fp8Amax::given), not x's, and x's own amax recorded (fp8_quantize's
// record) in the same read. The planted amax is x's / 5 (the tensor outgrew its scale: the values past
// the format's largest saturate to it) or x's x 3 (room to spare). Checked: the scale is fp8_scale of the
// planted amax, the slot keeps it, every byte of q is the host's rounding of x s clamped to +-max (for
// GELU: the bytes of gelu_forward's output cast the same way), qt is q transposed, the recorded amax is
// x's (GELU(x)'s) exactly and only ever raised (it starts at a smaller value's bits), the guards intact.
void check_delayed_cast(TestCounter& tests, bool gpu, Rng& rng) {
    struct Case {
        const Fp8Format* f;
        bool gelu;
        int R, C;
        float planted_over_amax;
    };
    const Case cases[] = {{&kE4M3, false, 208, 144, 0.2f}, {&kE4M3, false, 64, 768, 3.0f}, {&kE5M2, false, 48, 2304, 0.2f},
                          {&kE5M2, false, 1024, 48, 3.0f}, {&kE4M3, true, 64, 3072, 0.2f}, {&kE4M3, true, 208, 400, 3.0f}};
    for (const Case& c : cases) {
        const std::string what = strf("delayed %s%s %d x %d, planted amax x %.1f", c.f->name, c.gelu ? " GELU" : "", c.R, c.C,
                                      c.planted_over_amax);
        if (!gpu) {
            tests.skip(what.c_str());
            continue;
        }
        const size_t n = size_t(c.R) * c.C;
        std::vector<bf16> x(n);
        if (c.gelu) fill_uniform(x, -8.0f, 3.0f, rng);
        else fill_uniform(x, -3.0f, 2.0f, rng);
        DeviceBuffer<bf16> dx(n, "input"), dy(n, "GELU output");
        dx.upload(x);
        std::vector<bf16> y = x;  // what is cast: x, or GELU(x) as gelu_forward writes it
        if (c.gelu) {
            gelu_forward(dy.ptr, (const bf16*)dx.ptr, n);
            cuda_check(cudaDeviceSynchronize());
            y = dy.download();
        }
        const float amax = host_amax(y);
        const float planted = amax * c.planted_over_amax, before = amax / 64;  // the record's value before the cast
        DeviceBuffer<unsigned> record(1, "recorded amax");
        auto cast = [&](LabFp8Tensor& t, const bf16* src, bool gelu) {
            t.poison();
            t.plant_amax(planted);
            cuda_check(cudaMemcpy(record.ptr, &before, sizeof(float), cudaMemcpyHostToDevice));
            const std::string why = fp8_quantize(t, src, c.R, c.C, true, true, 0, 0,
                                                  Fp8CastOptions().with_amax(Fp8Amax::given).with_gelu(gelu).with_record(record.ptr));
            cuda_check(cudaDeviceSynchronize());
            return why;
        };
        LabFp8Tensor t(*c.f, n), plain(*c.f, n);
        std::string why = cast(t, dx.ptr, c.gelu);
        const CastBytes got = cast_bytes(t);
        float recorded = 0.0f;
        cuda_check(cudaMemcpy(&recorded, record.ptr, sizeof(float), cudaMemcpyDeviceToHost));
        const float s = fp8_scale(planted, c.f->emax);
        size_t bad_q = 0, bad_qt = 0, saturated = 0;
        std::vector<uint8_t> ref_q;
        if (c.gelu && why.empty()) {  // the GELU cast against gelu_forward's output cast alike
            why = cast(plain, dy.ptr, false);
            ref_q = cast_bytes(plain).q;
        }
        for (int r = 0; r < c.R; r++)
            for (int j = 0; j < c.C; j++) {
                const size_t i = size_t(r) * c.C + j;
                const double v = double(__bfloat162float(y[i])) * s;
                saturated += std::fabs(v) > c.f->max;
                bad_q += c.gelu ? got.q[i] != ref_q[i] : fp8_decode(got.q[i], *c.f) != fp8_round(v, *c.f);
                bad_qt += got.qt[size_t(j) * c.R + r] != got.q[i];
            }
        const bool scale_ok = got.meta[2] == planted && got.meta[1] == s && double(got.meta[0]) * s == 1.0;
        const bool guards = guard_intact(got.q, n) && guard_intact(got.qt, n);
        const bool ok = why.empty() && scale_ok && bad_q == 0 && bad_qt == 0 && recorded == amax && guards &&
                        (c.planted_over_amax < 1.0f) == (saturated > 0);
        printf("  %-44s %s %ss 2^%d from the planted amax%s; %zu values saturated; %zu bytes not the %s, %zu transposed "
               "differ; recorded amax %.6g (host %.6g); guards %s\n",
               what.c_str(), ok ? "ok  " : "FAIL", why.empty() ? "" : ("REFUSED: " + why + "; ").c_str(), int(std::lround(std::log2(s))),
               scale_ok ? "" : " (SCALE OR SLOT WRONG)", saturated, bad_q, c.gelu ? "GELU output's cast" : "host's rounding", bad_qt,
               recorded, amax, guards ? "intact" : "WRITTEN");
        tests.record(ok);
    }
}

// LayerNorm straight into FP8 (fp8_layernorm_forward: train_gpt -f8 1's ln1 and ln2 once their scales
// are delayed) against layernorm_forward's bf16 output cast by fp8_quantize with the same amax given:
// every byte of q and qt, the scale and slot, mean and rstd bit for bit, the recorded amax the host's of
// that bf16 output exactly (it starts at a smaller value's bits), and nothing written past the tensor
// (qt not at all without the transposed copy). The planted amax is y's x 3 (room) or / 5 (the values
// past the format's largest saturate, in both paths alike). Shapes: each row-group width (C 144 to
// 12288: 1 to 16 warps a row), N not a multiple of the 32-row tile (208, 48: a last chunk of 16), and
// the tile of 16 rows where two of 32 rows would not fit an SM (on an H100 or H200 C past ~3580:
// 4096, 8192, 12288). The LayerNorm's
// output, cast, has been checked against the float64 reference in its own lab.
void check_layernorm_cast(TestCounter& tests, bool gpu, Rng& rng) {
    struct Case {
        int N, C;
        bool transposed;
        float planted_over_amax;
    };
    const Case cases[] = {{64, 768, true, 3.0f},   {208, 144, true, 0.2f},    {48, 1600, true, 3.0f}, {96, 1600, false, 3.0f},
                          {32, 4096, true, 0.2f},  {48, 8192, true, 3.0f},    {16, 12288, true, 3.0f}, {1024, 48, true, 3.0f}};
    for (const Case& c : cases) {
        const std::string what = strf("LayerNorm into FP8 %d x %d%s, planted amax x %.1f", c.N, c.C, c.transposed ? " + transposed" : "",
                                      c.planted_over_amax);
        if (!gpu) {
            tests.skip(what.c_str());
            continue;
        }
        const size_t n = size_t(c.N) * c.C;
        std::vector<bf16> inp(n), w(c.C), b(c.C);
        fill_rows(inp, c.N, c.C, rng);
        fill_uniform(w, 0.5f, 1.5f, rng);
        fill_uniform(b, -0.5f, 0.5f, rng);
        DeviceBuffer<bf16> d_inp(n, "LayerNorm input"), d_w(c.C, "weight"), d_b(c.C, "bias"), d_y(n, "LayerNorm output");
        DeviceBuffer<float> mean_ref(c.N, "mean"), rstd_ref(c.N, "rstd"), mean(c.N, "mean"), rstd(c.N, "rstd");
        DeviceBuffer<unsigned> record(1, "recorded amax");
        d_inp.upload(inp), d_w.upload(w), d_b.upload(b);
        d_y.poison(), mean_ref.poison(), rstd_ref.poison(), mean.poison(), rstd.poison();
        layernorm_forward(d_y.ptr, mean_ref.ptr, rstd_ref.ptr, d_inp.ptr, d_w.ptr, d_b.ptr, c.N, c.C);
        cuda_check(cudaDeviceSynchronize());
        const std::vector<bf16> y = d_y.download();
        const float amax = host_amax(y);
        const float planted = amax * c.planted_over_amax, before = amax / 64;
        LabFp8Tensor ref(kE4M3, n), got(kE4M3, n);
        ref.poison(), got.poison();
        ref.plant_amax(planted), got.plant_amax(planted);
        cuda_check(cudaMemcpy(record.ptr, &before, sizeof(float), cudaMemcpyHostToDevice));
        std::string why = fp8_quantize(ref, d_y.ptr, c.N, c.C, true, c.transposed, 0, 0, Fp8CastOptions().with_amax(Fp8Amax::given));
        if (why.empty())
            why = fp8_layernorm_forward(got, mean.ptr, rstd.ptr, d_inp.ptr, d_w.ptr, d_b.ptr, c.N, c.C, c.transposed, record.ptr);
        cuda_check(cudaDeviceSynchronize());
        const CastBytes a = cast_bytes(got), r = cast_bytes(ref);
        size_t bad_q = 0, bad_qt = 0, saturated = 0;
        const float s = fp8_scale(planted, kE4M3.emax);
        for (size_t i = 0; i < n; i++) {
            bad_q += a.q[i] != r.q[i];
            if (c.transposed) bad_qt += a.qt[i] != r.qt[i];
            saturated += std::fabs(double(__bfloat162float(y[i])) * s) > kE4M3.max;
        }
        const bool scale_ok = std::memcmp(a.meta.data(), r.meta.data(), 3 * sizeof(float)) == 0 && a.meta[2] == planted;
        const std::vector<float> m_ref = mean_ref.download(), m_got = mean.download(), s_ref = rstd_ref.download(), s_got = rstd.download();
        const bool stats_same = std::memcmp(m_ref.data(), m_got.data(), c.N * sizeof(float)) == 0 &&
                                std::memcmp(s_ref.data(), s_got.data(), c.N * sizeof(float)) == 0;
        float recorded = 0.0f;
        cuda_check(cudaMemcpy(&recorded, record.ptr, sizeof(float), cudaMemcpyDeviceToHost));
        const bool guards = guard_intact(a.q, n) && guard_intact(a.qt, c.transposed ? n : 0);
        const bool ok = why.empty() && bad_q == 0 && bad_qt == 0 && scale_ok && stats_same && recorded == amax && guards &&
                        (c.planted_over_amax < 1.0f) == (saturated > 0);
        printf("  %-56s %s %s%zu bytes of q and %zu of qt differ from layernorm_forward then the cast; scale %s; mean and rstd %s; "
               "%zu values saturated; recorded amax %.6g (host %.6g); guards %s\n",
               what.c_str(), ok ? "ok  " : "FAIL", why.empty() ? "" : ("REFUSED: " + why + "; ").c_str(), bad_q, bad_qt,
               scale_ok ? "the same" : "DIFFERENT", stats_same ? "the same bits" : "DIFFERENT", saturated, recorded, amax,
               guards ? "intact" : "WRITTEN");
        tests.record(ok);
    }
    const char* what = "LayerNorm into FP8, C 16400: refused";
    if (!gpu) {
        tests.skip(what);
        return;
    }
    LabFp8Tensor t(kE4M3, 16 * 16400);
    t.poison();
    DeviceBuffer<bf16> x(16 * 16400, "x"), wb(16400, "weight and bias");
    const std::string why = fp8_layernorm_forward(t, nullptr, nullptr, x.ptr, wb.ptr, wb.ptr, 16, 16400, true, nullptr);
    cuda_check(cudaDeviceSynchronize());
    record_refusal(tests, what, why, guard_intact(t.q_buf.download(), 0) && guard_intact(t.qt_buf.download(), 0));
}

// The LayerNorm's FP8 copies two ways, timed (median of 50 after 10): layernorm_forward writing bf16
// then fp8_quantize with the amax given (train_gpt -f8 1's first step), and fp8_layernorm_forward
// (every step after it), with and without the transposed copy; against the copy bandwidth measured in
// the same run, for the bytes each must move (x in, y in bf16 and out, the copies out).
inline void must_run(const std::string& why) {
    if (!why.empty()) fail("%s", why.c_str());
}
void time_layernorm_cast(int N, int C, double copy_gbs) {
    const size_t n = size_t(N) * C;
    DeviceBuffer<bf16> x(n, "x"), y(n, "y"), w(C, "weight"), b(C, "bias");
    DeviceBuffer<float> mean(N, "mean"), rstd(N, "rstd");
    std::vector<bf16> h(n);
    Rng rng(7);
    fill_rows(h, N, C, rng);
    x.upload(h);
    std::vector<bf16> hw(C, __float2bfloat16(1.0f)), hb(C, __float2bfloat16(0.0f));
    w.upload(hw), b.upload(hb);
    LabFp8Tensor t(kE4M3, n);
    const float planted = 8.0f;
    for (bool transposed : {true, false}) {
        auto pair = [&] {
            layernorm_forward(y.ptr, mean.ptr, rstd.ptr, x.ptr, w.ptr, b.ptr, N, C);
            must_run(fp8_quantize(t, y.ptr, N, C, true, transposed, 0, 0, Fp8CastOptions().with_amax(Fp8Amax::given)));
        };
        auto fused = [&] { must_run(fp8_layernorm_forward(t, mean.ptr, rstd.ptr, x.ptr, w.ptr, b.ptr, N, C, transposed, nullptr)); };
        t.plant_amax(planted);
        const float ms_pair = time_median_ms(pair), ms_fused = time_median_ms(fused);
        const double copies = transposed ? 2.0 : 1.0, bytes_pair = n * (2.0 + 2.0 + 2.0 + copies), bytes_fused = n * (2.0 + copies);
        printf("  %6d x %-5d %-14s LayerNorm then cast %8.1f us (%5.1f%% of copy speed)   into FP8 %8.1f us (%5.1f%%)   %.2fx\n", N, C,
               transposed ? "both copies" : "natural only", ms_pair * 1e3, 100.0 * bytes_pair / (ms_pair * 1e-3) / 1e9 / copy_gbs,
               ms_fused * 1e3, 100.0 * bytes_fused / (ms_fused * 1e-3) / 1e9 / copy_gbs, ms_pair / ms_fused);
    }
}

// fp8_quantize's gelu_backward (train_gpt -f8 1 casts fc's output gradient so): x, GELU's output
// gradient, and z, its input, in; the e5m2 copies of x GELU'(z) out, with their column sums (fc's bias
// gradient) and amax recorded. Against gelu_backward_inplace's bf16 output cast by fp8_quantize: every
// byte of both copies and the scale, with the cast's own amax pass and again with that amax given (as
// delayed scaling runs it); the recorded amax the host's of that bf16 output exactly; bias += the column
// sums (fp8_add_column_sums) against a float64 sum of the bf16 output (bound: the fp32 sums' rounding,
// R 2^-24 sum |y| a column, plus the bf16 rounding of the result, 2^-8 |bias|), and a second run the
// same bits; x left as it was. z from [-8, 3) spans GELU's dip and tail; partial tiles (R not a
// multiple of 64, C not of 64).
void check_gelu_backward_cast(TestCounter& tests, bool gpu, Rng& rng) {
    struct Case {
        int R, C;
    };
    const Case cases[] = {{256, 3072}, {208, 144}, {4096, 48}, {16, 2304}};
    for (const Case& c : cases) {
        const std::string what = strf("GELU backward cast %d x %d", c.R, c.C);
        if (!gpu) {
            tests.skip(what.c_str());
            continue;
        }
        const size_t n = size_t(c.R) * c.C;
        std::vector<bf16> x(n), z(n), bias(c.C);
        fill_uniform(x, -1.0f, 1.0f, rng);
        fill_uniform(z, -8.0f, 3.0f, rng);
        fill_uniform(bias, -0.5f, 0.5f, rng);
        DeviceBuffer<bf16> dx(n, "GELU output gradient"), dz(n, "GELU input"), dy(n, "gelu_backward_inplace output");
        DeviceBuffer<bf16> d_bias(c.C, "bias gradient"), d_bias2(c.C, "bias gradient, again");
        DeviceBuffer<float> partials(size_t(fp8_column_sum_tiles(c.R)) * c.C, "column sums");
        DeviceBuffer<unsigned> record(1, "recorded amax");
        dx.upload(x), dz.upload(z), dy.upload(x), d_bias.upload(bias), d_bias2.upload(bias);
        partials.poison();
        cuda_check(cudaMemset(record.ptr, 0, sizeof(unsigned)));
        LabFp8Tensor fused(kE5M2, n), given(kE5M2, n), plain(kE5M2, n);
        fused.poison(), given.poison(), plain.poison();
        const Fp8CastOptions o = Fp8CastOptions().with_gelu_backward(dz.ptr).with_record(record.ptr).with_column_sums(partials.ptr);
        std::string why = fp8_quantize(fused, dx.ptr, c.R, c.C, true, true, 0, 0, o);
        if (why.empty()) fp8_add_column_sums(d_bias.ptr, partials.ptr, c.R, c.C);
        gelu_backward_inplace(dy.ptr, (const bf16*)dz.ptr, n);
        if (why.empty()) why = fp8_quantize(plain, dy.ptr, c.R, c.C, true, true);
        cuda_check(cudaDeviceSynchronize());
        const std::vector<float> plain_meta = plain.meta_buf.download();
        given.plant_amax(plain_meta[2]);
        Fp8CastOptions og = o;
        if (why.empty()) why = fp8_quantize(given, dx.ptr, c.R, c.C, true, true, 0, 0, og.with_amax(Fp8Amax::given));
        if (why.empty()) fp8_add_column_sums(d_bias2.ptr, partials.ptr, c.R, c.C);
        cuda_check(cudaDeviceSynchronize());
        const std::vector<bf16> y = dy.download(), got = d_bias.download(), again = d_bias2.download(), x_after = dx.download();
        const float amax = host_amax(y);
        float recorded = 0.0f;
        cuda_check(cudaMemcpy(&recorded, record.ptr, sizeof(float), cudaMemcpyDeviceToHost));
        double worst = 0.0;
        for (int j = 0; j < c.C; j++) {
            double sum = 0.0, abs_sum = 0.0;
            for (int i = 0; i < c.R; i++) {
                const double v = __bfloat162float(y[size_t(i) * c.C + j]);
                sum += v, abs_sum += std::fabs(v);
            }
            const double ref = double(__bfloat162float(bias[j])) + sum;
            const double bound = c.R * std::ldexp(1.0, -24) * abs_sum + std::ldexp(1.0, -8) * std::fabs(ref) + 1e-30;
            worst = std::max(worst, std::fabs(double(__bfloat162float(got[j])) - ref) / bound);
        }
        const CastBytes a = cast_bytes(fused), g = cast_bytes(given), p = cast_bytes(plain);
        const bool same = same_cast(a, p) && same_cast(g, p);
        const bool repeat = std::memcmp(got.data(), again.data(), c.C * sizeof(bf16)) == 0;
        const bool untouched = std::memcmp(x.data(), x_after.data(), n * sizeof(bf16)) == 0;
        const bool guards = guard_intact(a.q, n) && guard_intact(a.qt, n);
        const bool ok = why.empty() && same && recorded == amax && worst <= 1.0 && repeat && untouched && guards;
        printf("  %-34s %s %sFP8 copies and scale %s gelu_backward_inplace's output cast (own amax and given); recorded amax %.6g "
               "(host %.6g); bias worst error / bound %.3f, a second run %s; x %s; guards %s\n",
               what.c_str(), ok ? "ok  " : "FAIL", why.empty() ? "" : ("REFUSED: " + why + "; ").c_str(), same ? "the same as" : "DIFFERENT from",
               recorded, amax, worst, repeat ? "the same bits" : "DIFFERENT BITS", untouched ? "untouched" : "WRITTEN",
               guards ? "intact" : "WRITTEN");
        tests.record(ok);
    }
}

// ---------------------------------------------------------------------------------------------
// GPT-2's layers at full size: checked against the bf16 GEMMs, then timed.

__global__ void fill_uniform_kernel(bf16* x, size_t n, float scale, uint64_t seed) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const uint64_t z = splitmix64_mix((i + 1) * kSplitMixStep + seed);  // SplitMix64's i-th output from seed
        x[i] = __float2bfloat16(scale * (float((z >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f));  // scale U[-1, 1)
    }
}

// sums[0] += sum (got - ref)^2, sums[1] += sum ref^2, sums[2] += count of non-finite got.
template <typename G> __global__ void diff_norms_kernel(double* sums, const G* got, const bf16* ref, size_t n) {
    double d2 = 0.0, r2 = 0.0, nonfinite = 0.0;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const double g = to_float(got[i]), r = __bfloat162float(ref[i]);
        if (!isfinite(g)) nonfinite += 1.0;
        else d2 += (g - r) * (g - r);
        r2 += r * r;
    }
    for (int o = 16; o > 0; o >>= 1) {
        d2 += __shfl_xor_sync(0xffffffffu, d2, o);
        r2 += __shfl_xor_sync(0xffffffffu, r2, o);
        nonfinite += __shfl_xor_sync(0xffffffffu, nonfinite, o);
    }
    if (threadIdx.x % 32 == 0) {
        atomicAdd(&sums[0], d2);
        atomicAdd(&sums[1], r2);
        atomicAdd(&sums[2], nonfinite);
    }
}
// ||got - ref|| / ||ref||, infinity if got has a non-finite element.
template <typename G> double relative_diff(DeviceBuffer<double>& sums, const G* got, const bf16* ref, size_t n) {
    cuda_check(cudaMemset(sums.ptr, 0, 3 * sizeof(double)));
    diff_norms_kernel<G><<<elementwise_blocks(n), 256>>>(sums.ptr, got, ref, n);
    cuda_check_launch();
    const std::vector<double> s = sums.download();
    return s[2] > 0 ? INFINITY : std::sqrt(s[0] / s[1]);
}

struct Model {
    const char* name;
    int C;
};
struct Layer {
    const char* name;
    int C, OC;
};
std::vector<Layer> layers_of(const Model& m) {
    return {{"qkv", m.C, 3 * m.C}, {"attproj", m.C, m.C}, {"fc", m.C, 4 * m.C}, {"fcproj", 4 * m.C, m.C}};
}

// Every layer of one model at one row count: inputs, both versions' outputs, the bf16 references.
struct Gpt2Buffers {
    DeviceBuffer<bf16> inp, weight, bias, dout, out, out_bf16, dinp, dinp_bf16, dweight_bf16;
    DeviceBuffer<float> dweight;
    DeviceBuffer<double> sums;
    Fp8Layer fp8;
    Gpt2Buffers(int N, int C)
        : inp(size_t(N) * 4 * C, "inp"), weight(size_t(4) * C * C, "weight"), bias(4 * C, "bias"), dout(size_t(N) * 4 * C, "dout"),
          out(size_t(N) * 4 * C, "out"), out_bf16(size_t(N) * 4 * C, "out bf16"), dinp(size_t(N) * 4 * C, "dinp"),
          dinp_bf16(size_t(N) * 4 * C, "dinp bf16"), dweight_bf16(size_t(4) * C * C, "dweight bf16"), dweight(size_t(4) * C * C, "dweight"),
          sums(3, "norm sums"), fp8(size_t(N) * 4 * C, size_t(4) * C * C, size_t(N) * 4 * C) {}
};

// Times of one layer, ms: [0] fwd, [1] dinp, [2] dweight, [3] the layer (for v2: each tensor cast once).
struct LayerTimes {
    std::string layer;
    int N = 0, C = 0, OC = 0;
    float v1[4] = {}, v2[4] = {}, v2_casts[3] = {}, v3[3] = {};
    double err[3] = {};
};

// The layer at N rows against the bf16 GEMMs (bound 2's iid value plus both GEMMs' own terms; see the
// top comment) and two runs bit for bit; then, with timing, every time of the benchmark table.
void gpt2_layer(TestCounter& tests, Gpt2Buffers& B, const Model& model, const Layer& L, int N, Rng& rng, LayerTimes* timing) {
    const int C = L.C, OC = L.OC;
    const std::string what = strf("%s %-7s %5d rows", model.name, L.name, N);
    // Operands: inp U(+-1), weight U(+-0.02) (GPT-2's init scale), bias U(+-0.1), dout U(+-1e-4).
    fill_uniform_kernel<<<1024, 256>>>(B.inp.ptr, size_t(N) * C, 1.0f, rng.next());
    fill_uniform_kernel<<<1024, 256>>>(B.weight.ptr, size_t(OC) * C, 0.02f, rng.next());
    fill_uniform_kernel<<<1024, 256>>>(B.bias.ptr, OC, 0.1f, rng.next());
    fill_uniform_kernel<<<1024, 256>>>(B.dout.ptr, size_t(N) * OC, 1e-4f, rng.next());
    cuda_check_launch();
    auto v1_fwd = [&] { matmul_forward(B.out_bf16.ptr, B.inp.ptr, B.weight.ptr, B.bias.ptr, N, C, OC); };
    auto v1_dinp = [&] { matmul_backward<bf16>(B.dinp_bf16.ptr, nullptr, nullptr, B.dout.ptr, B.inp.ptr, B.weight.ptr, N, C, OC); };
    auto v1_dweight = [&] { matmul_backward<bf16>(nullptr, B.dweight_bf16.ptr, nullptr, B.dout.ptr, B.inp.ptr, B.weight.ptr, N, C, OC); };
    v1_fwd(), v1_dinp();
    cuda_check(cudaMemset(B.dweight_bf16.ptr, 0, size_t(OC) * C * sizeof(bf16)));
    v1_dweight();
    unsigned long long hashes[2][3];
    std::string why;
    for (int run = 0; run < 2; run++) {
        B.out.poison(), B.dinp.poison(), B.fp8.poison();
        cuda_check(cudaMemset(B.dweight.ptr, 0, size_t(OC) * C * sizeof(float)));
        why = fp8_layer(B.fp8, 2, B.out.ptr, B.dinp.ptr, B.dweight.ptr, B.inp.ptr, B.weight.ptr, B.bias.ptr, B.dout.ptr, N, C, OC);
        if (!why.empty()) break;
        hashes[run][0] = hash_bits(B.out.ptr, size_t(N) * OC, 0);
        hashes[run][1] = hash_bits(B.dinp.ptr, size_t(N) * C, 0);
        hashes[run][2] = hash_bits(B.dweight.ptr, size_t(OC) * C, 0);
        if (run > 0) continue;
        double errs[3] = {relative_diff(B.sums, B.out.ptr, B.out_bf16.ptr, size_t(N) * OC),
                          relative_diff(B.sums, B.dinp.ptr, B.dinp_bf16.ptr, size_t(N) * C),
                          relative_diff(B.sums, B.dweight.ptr, B.dweight_bf16.ptr, size_t(OC) * C)};
        if (timing) std::copy(errs, errs + 3, timing->err);
        // Bound: sqrt((ua^2 + ub^2) / 3) 1.1 + both sides' bf16 rounding (2^-8 / sqrt 3; dweight in fp32 on
        // the FP8 side) + the FP8 GEMM's accumulation (2^-10 split, ceil(K/32) 2^-10 fast; bound 1).
        const double rms8 = std::ldexp(1.0, -8) / std::sqrt(3.0);
        const double quant_fwd = 1.1 * std::sqrt(2.0 / 3.0) / 16, quant_bwd = 1.1 * std::sqrt(5.0 / 3.0) / 16;
        const double bounds[3] = {quant_fwd + 2 * rms8 + ((C + 31) / 32) * std::ldexp(1.0, -10),
                                  quant_bwd + 2 * rms8 + std::ldexp(1.0, -10), quant_bwd + rms8 + std::ldexp(1.0, -10)};
        const char* names[3] = {"fwd", "dinp", "dweight"};
        printf("  %-24s |v2 - v1| / |v1|:", what.c_str());
        for (int g = 0; g < 3; g++) {
            const bool good = errs[g] <= bounds[g];
            printf(" %s %.4f (bound %.4f) %s", names[g], errs[g], bounds[g], good ? "ok  " : "FAIL");
            tests.record(good);
        }
        printf("\n");
    }
    if (!why.empty()) {
        printf("  %-24s FAIL refused: %s\n", what.c_str(), why.c_str());
        tests.fail_one();
        return;
    }
    const bool same = std::memcmp(hashes[0], hashes[1], sizeof(hashes[0])) == 0;
    printf("  %-24s two runs of v2: %s\n", what.c_str(), same ? "ok   the same bits" : "FAIL different bits");
    tests.record(same);
    if (!timing) return;

    // Timing. The FP8 copies of the check's last run are in place for the GEMMs alone.
    timing->layer = L.name, timing->N = N, timing->C = C, timing->OC = OC;
    Fp8Layer& F = B.fp8;
    timing->v1[0] = time_median_ms(v1_fwd);
    timing->v1[1] = time_median_ms(v1_dinp);
    timing->v1[2] = time_median_ms(v1_dweight);
    timing->v1[3] = time_median_ms([&] { v1_fwd(), v1_dinp(), v1_dweight(); });
    timing->v2[0] = time_median_ms([&] { fp8_forward(B.out.ptr, F.inp, F.weight, B.bias.ptr, true); });
    timing->v2[1] = time_median_ms([&] { fp8_backward_input(B.dinp.ptr, F.dout, F.weight, false); });
    timing->v2[2] = time_median_ms([&] { fp8_backward_weight(B.dweight.ptr, F.dout, F.inp, false); });
    timing->v3[1] = time_median_ms([&] { fp8_backward_input(B.dinp.ptr, F.dout, F.weight, true); });
    timing->v3[2] = time_median_ms([&] { fp8_backward_weight(B.dweight.ptr, F.dout, F.inp, true); });
    timing->v3[0] = timing->v2[0];
    timing->v2_casts[0] = time_median_ms([&] {
        fp8_quantize(F.inp, B.inp.ptr, N, C, true, false);
        fp8_quantize(F.weight, B.weight.ptr, OC, C, true, false);
        fp8_forward(B.out.ptr, F.inp, F.weight, B.bias.ptr, true);
    });
    timing->v2_casts[1] = time_median_ms([&] {
        fp8_quantize(F.dout, B.dout.ptr, N, OC, true, false);
        fp8_quantize(F.weight, B.weight.ptr, OC, C, false, true);
        fp8_backward_input(B.dinp.ptr, F.dout, F.weight, false);
    });
    timing->v2_casts[2] = time_median_ms([&] {
        fp8_quantize(F.inp, B.inp.ptr, N, C, false, true);
        fp8_quantize(F.dout, B.dout.ptr, N, OC, false, true);
        fp8_backward_weight(B.dweight.ptr, F.dout, F.inp, false);
    });
    timing->v2[3] = time_median_ms([&] {
        fp8_layer(F, 2, B.out.ptr, B.dinp.ptr, B.dweight.ptr, B.inp.ptr, B.weight.ptr, B.bias.ptr, B.dout.ptr, N, C, OC);
    });
}

void print_table(const Model& model, int N, const std::vector<LayerTimes>& rows) {
    printf("\n%s (C %d), %d rows: ms, median of 50 after 10 warm-ups (TFLOP/s = 2 m n k / time); x = v1's time / this one's\n",
           model.name, model.C, N);
    printf("%-8s %-8s %6s %6s %6s | %-16s | %-16s %5s | %-10s %5s | %-9s %5s | %s\n", "layer", "GEMM", "m", "n", "k", "v1 bf16",
           "v2 FP8 GEMM", "x", "v2 + casts", "x", "v3 GEMM", "x", "|v2 - v1| / |v1|");
    const char* gemms[3] = {"fwd", "dinp", "dweight"};
    for (const LayerTimes& t : rows) {
        const int C = t.C, OC = t.OC;
        const int dims[3][3] = {{OC, N, C}, {C, N, OC}, {C, OC, N}};
        const double flops = 2.0 * N * double(C) * OC;
        auto tf = [&](float ms, double f) { return f / (ms * 1e-3) / 1e12; };
        for (int g = 0; g < 3; g++) {
            printf("%-8s %-8s %6d %6d %6d | %8.4f (%5.0f) | %8.4f (%5.0f) %5.2f | %10.4f %5.2f | ", t.layer.c_str(), gemms[g], dims[g][0],
                   dims[g][1], dims[g][2], t.v1[g], tf(t.v1[g], flops), t.v2[g], tf(t.v2[g], flops), t.v1[g] / t.v2[g], t.v2_casts[g],
                   t.v1[g] / t.v2_casts[g]);
            if (g == 0) printf("%-9s %5s | %.4f\n", "(= v2)", "", t.err[g]);
            else printf("%9.4f %5.2f | %.4f\n", t.v3[g], t.v1[g] / t.v3[g], t.err[g]);
        }
        const float v2_sum = t.v2[0] + t.v2[1] + t.v2[2], v3_sum = t.v3[0] + t.v3[1] + t.v3[2];
        printf("%-8s %-8s %6s %6s %6s | %8.4f (%5.0f) | %8.4f (%5.0f) %5.2f | %10.4f %5.2f | %9.4f %5.2f | (layer: the GEMMs, or "
               "each tensor cast once)\n",
               t.layer.c_str(), "layer", "", "", "", t.v1[3], tf(t.v1[3], 3 * flops), v2_sum, tf(v2_sum, 3 * flops), t.v1[3] / v2_sum,
               t.v2[3], t.v1[3] / t.v2[3], v3_sum, t.v1[3] / v3_sum);
    }
}

struct BlockSummary {
    std::string model;
    int N;
    double v1 = 0, v2 = 0, v2_casts = 0, v3 = 0;
};

// ---------------------------------------------------------------------------------------------

void usage(FILE* f) {
    fprintf(f,
            "usage: matmul_fp8 [--check] [--force] [--rows R[,R..]] [--model d12|d48|all]\n"
            "  --check      validation only: versions 2 and 3 at small shapes against the float64 reference, the\n"
            "               refusals, and d12's and d48's layers at 8192 rows against version 1 (CI)\n"
            "  --force      benchmark even when validation failed (it says so)\n"
            "  --rows L     the benchmark's rows, comma-separated multiples of 16 (default 65536,8192)\n"
            "  --model M    benchmark d12 (C 768), d48 (C 1600) or all (default)\n"
            "  -h           this message\n"
            "versions (all in every table): 1 bf16 (matmul.cuh), 2 FP8 with fast accumulation in the forward only,\n"
            "3 FP8 with fast accumulation in all three GEMMs\n");
}

int main(int argc, char** argv) {
    bool check = false, force = false;
    std::vector<int> rows = {65536, 8192};
    std::vector<Model> models = {{"d12", 768}, {"d48", 1600}};
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto value = [&] { return flag_value(argc, argv, i, usage); };
        if (a == "-h" || a == "--help") {
            usage(stdout);
            return 0;
        } else if (a == "--check") {
            check = true;
        } else if (a == "--force") {
            force = true;
        } else if (a == "--rows") {
            rows.clear();
            std::stringstream list(value());
            for (std::string r; std::getline(list, r, ',');) {
                rows.push_back(parse_int(r.c_str(), "--rows", 16, usage));
                if (rows.back() % 16) fail("--rows: %d is not a multiple of 16 (FP8 GEMMs need it)", rows.back());
            }
            if (rows.empty()) {
                usage(stderr);
                fail("--rows needs at least one row count");
            }
        } else if (a == "--model") {
            const std::string m = value();
            if (m == "d12") models = {{"d12", 768}};
            else if (m == "d48") models = {{"d48", 1600}};
            else if (m != "all") {
                usage(stderr);
                fail("--model must be d12, d48 or all, got '%s'", m.c_str());
            }
        } else {
            usage(stderr);
            fail("unknown flag '%s'", a.c_str());
        }
    }
    const bool gpu = cuda_device_available();
    if (!check && !gpu) fail("no CUDA device: the benchmark needs a GPU (--check alone reports skips)");
    TestCounter tests;
    printf("host FP8 helpers (the reference's rounding):\n");
    check_host_helpers(tests);
    std::string device = "no CUDA device";
    if (gpu) {
        cudaDeviceProp prop;
        cuda_check(cudaGetDeviceProperties(&prop, 0));
        device = strf("%s (compute capability %d.%d), cuBLASLt %zu", prop.name, prop.major, prop.minor, cublasLtGetVersion());
        if (prop.major * 10 + prop.minor < 89) {
            const std::string why = strf("FP8 GEMMs need compute capability 8.9 or newer; %s", device.c_str());
            if (!check) fail("%s", why.c_str());
            printf("matmul_fp8 validation: skipped (%s)\n", why.c_str());
            tests.skipped++;
            return tests.finish();
        }
        blas_init(size_t(std::max(65536, *std::max_element(rows.begin(), rows.end()))));
    }
    printf("device: %s\n", device.c_str());

    // Validation, small shapes: every dimension a multiple of 16; cast tiles (64) and cuBLASLt's tiles
    // partial; GPT-2's C, 3C and 4C; the forward's K up to 6400 and dweight's up to 65536.
    printf("\nvalidation, small shapes (every element against the float64 reference; bounds: top comment):\n");
    Rng rng(1234);
    const Shape shapes[] = {{16, 16, 16},  {48, 32, 80},    {208, 144, 400}, {64, 768, 2304},  {64, 3072, 768},
                            {16, 1600, 4800}, {16, 6400, 1600}, {1024, 64, 48}, {65536, 32, 48}};
    for (const Shape& sh : shapes) check_shape(tests, gpu, sh, rng);
    printf("\nrefusals:\n");
    check_refusals(tests, gpu);
    // Training's other casts, each against fp8_quantize's bytes (top comment), in this order.
    const struct {
        const char* title;
        void (*check)(TestCounter&, bool, Rng&);
    } cast_checks[] = {
        {"batched casts (a layer kind's weights) against fp8_quantize one by one", check_batched_casts},
        {"amax written by the producer (the LayerNorm forward), the cast taking it as given", check_given_amax},
        {"the cast applying GELU (fp8_quantize's gelu) against gelu_forward, then the cast", check_gelu_cast},
        {"delayed scaling: the scale from a planted amax, the cast's own amax recorded", check_delayed_cast},
        {"GELU's backward in the output gradient's cast, with its column sums (a bias gradient), against gelu_backward_inplace",
         check_gelu_backward_cast},
        {"LayerNorm straight into FP8, against layernorm_forward then the cast", check_layernorm_cast},
    };
    for (const auto& c : cast_checks) {
        printf("\n%s:\n", c.title);
        c.check(tests, gpu, rng);
    }

    std::vector<BlockSummary> blocks;
    auto gpt2 = [&](int N, bool timing) {
        for (const Model& m : models) {
            Gpt2Buffers B(N, m.C);
            std::vector<LayerTimes> times;
            for (const Layer& L : layers_of(m)) {
                LayerTimes t;
                gpt2_layer(tests, B, m, L, N, rng, timing ? &t : nullptr);
                if (timing && t.N) times.push_back(t);
            }
            if (!timing || times.size() != 4) continue;
            print_table(m, N, times);
            BlockSummary s{m.name, N};
            for (const LayerTimes& t : times)
                s.v1 += t.v1[3], s.v2 += t.v2[0] + t.v2[1] + t.v2[2], s.v2_casts += t.v2[3], s.v3 += t.v3[0] + t.v3[1] + t.v3[2];
            blocks.push_back(s);
        }
    };
    auto print_summary = [&] {
        printf("\nsummary (%s)\n", device.c_str());
        printf("  validation, small shapes: the worst error / its bound over %zu shapes (bounds 1 and 2 of the top comment)\n",
               std::size(shapes));
        printf("    %-34s %18s %18s\n", "version, GEMM, A x B, accumulation", "vs dequantized:", "vs bf16 inputs:");
        printf("    %-34s %9s %8s %9s %8s\n", "", "norm", "element", "norm", "element");
        if (g_worst.empty()) printf("    (none ran)\n");
        for (const auto& [label, w] : g_worst) printf("    %-34s %9.3f %8.3f %9.3f %8.3f\n", label.c_str(), w[0], w[1], w[2], w[3]);
        if (!blocks.empty()) {
            printf("  speed: a block's four linear layers, forward and backward, ms (x = v1's time / this one's)\n");
            printf("    %-5s %6s %9s %16s %16s %16s %s\n", "model", "rows", "v1 bf16", "v2 GEMMs", "v2 + casts", "v3 GEMMs",
                   "casts' share of v2 + casts");
            for (const BlockSummary& s : blocks)
                printf("    %-5s %6d %9.3f %9.3f (%4.2f) %9.3f (%4.2f) %9.3f (%4.2f) %5.1f%%\n", s.model.c_str(), s.N, s.v1, s.v2,
                       s.v1 / s.v2, s.v2_casts, s.v1 / s.v2_casts, s.v3, s.v1 / s.v3, 100.0 * (s.v2_casts - s.v2) / s.v2_casts);
        }
        if (gpu)
            printf("  cuBLASLt plans tuned: %zu, %zu of them kept a candidate other than the heuristic's first (same bits)\n",
                   blas().tuned_plans, blas().tuned_changed);
    };

    if (check) {
        printf("\nvalidation, GPT-2's layers at 8192 rows (v2 against v1, bf16; two runs):\n");
        if (gpu) gpt2(8192, false);
        else
            for (const Model& m : models)
                for (const Layer& L : layers_of(m)) tests.skip(strf("%s %s 8192 rows vs v1", m.name, L.name).c_str());
        print_summary();
        return tests.finish();
    }
    if (tests.failed && !force) {
        tests.finish();
        fail("validation failed: no benchmark (--force benchmarks anyway)");
    }
    if (tests.failed) printf("VALIDATION FAILED (%d): benchmarking anyway (--force)\n", tests.failed);
    for (int N : rows) {
        printf("\nGPT-2's layers at %d rows: checked (v2 against v1, two runs), then timed\n", N);
        gpt2(N, true);
    }
    const double copy_gbs = measure_copy_bandwidth_gbs();
    printf("\nLayerNorm's FP8 copies (copy bandwidth %.0f GB/s, this run):\n", copy_gbs);
    for (int N : rows)
        for (const Model& m : models) time_layernorm_cast(N, m.C, copy_gbs);
    print_summary();
    return tests.finish();
}
