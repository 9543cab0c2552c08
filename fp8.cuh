// fp8.cuh: FP8 tensors, their casts, and a linear layer's three GEMMs in FP8 through cuBLASLt, as
// train_gpt -f8 1 runs them (dev/cuda/matmul_fp8.cu's version 2, which validates them against a
// float64 reference with derived bounds and times them beside bf16).
//
//   fp8_quantize         x (R, C) bf16, rows ld apart -> q (R, C) and/or qt (C, R) FP8, one scale from amax(x)
//                        (its own pass over x, the amax the kernel that wrote x left in the slot, or one the
//                        caller keeps: delayed scaling, with the cast's own amax recorded); Fp8CastOptions:
//                        of GELU(x) or of GELU's backward x GELU'(z) as bf16 holds them (that bf16 tensor
//                        itself is never written), and the column sums of what is cast (a bias gradient)
//   fp8_quantize_batch   the same for `count` tensors one after another (a layer kind's L weights)
//   fp8_layernorm_forward q and/or qt of LayerNorm(inp) straight from inp, the bf16 output never written
//                        (layernorm_forward then fp8_quantize's bytes, with the amax given: delayed scaling)
//   fp8_forward          out (N, OC) = inp (N, C) weight (OC, C)^T + bias (+ residual)   bf16 out
//   fp8_backward_input   dinp (N, C) = dout (N, OC) weight                               bf16 out
//   fp8_backward_weight  dweight (OC, C) += dout^T inp                                   fp32 or bf16, accumulated
//
// Non-obvious choices:
//   - Formats: e4m3 (3 mantissa bits, up to 448) for activations and weights, e5m2 (2 bits, up to
//     57344) for output gradients, which span more binades.
//   - Scales: one per tensor, from its amax now (current scaling) or from one the caller put in the slot
//     (train_gpt's delayed scaling: the largest of recent steps'), computed on the GPU (no host
//     synchronisation): s = 2^p, the largest power of two with amax s <= the format's largest value, so
//     the tensor fills the format's top binade and, with its current amax, nothing saturates (a delayed
//     amax the tensor has outgrown saturates the values past it, SATFINITE). A power of two makes x s and q / s
//     exact: the FP8 value is x s rounded once, and cuBLASLt's scaling of its fp32 sum by 1/s_a 1/s_b is
//     exact too. amax is an atomicMax on the float's bits (non-negative floats order as their bits do):
//     the same bits in any order, so every run gives the same bytes; a NaN anywhere wins and reaches the
//     output.
//   - Layouts: on Hopper cuBLASLt's FP8 kernels take only TN, D (m, n) = A^T B with A stored (k, m) and
//     B (k, n): both operands with the GEMM's K contiguous. Row-major (R, K) is column-major (K, R), so
//       forward  out (N, OC):     A weight (OC, C) as stored,  B inp (N, C) as stored
//       dinp     dinp (N, C):     A weight^T (C, OC), a copy,  B dout (N, OC) as stored
//       dweight  dweight (OC, C): A inp^T (C, N), a copy,      B dout^T (OC, N), a copy
//     so each of inp, weight and dout is needed in both orientations; one cast kernel reads the bf16
//     tensor once and writes either copy or both (the transposed one through shared memory).
//   - Each tensor's meta holds 1/s, s and amax's bits, 1/s first: cuBLASLt's FP8 GEMMs answer
//     CUBLAS_STATUS_NOT_SUPPORTED, with no log message, for a scale pointer that is not 16-byte aligned
//     (measured, cuBLASLt 13.1 on an H200), and meta is.
//   - Fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM) keeps Hopper's FP8 sums in the tensor cores
//     without periodic promotion to fp32: the forward takes it (K = C or 4C, output in bf16; Transformer
//     Engine's recipe too), the backward GEMMs do not (dweight sums K = B T rows into gradients that
//     accumulate). The lab's bound 1 and its measurements say why.
//   - Every dimension a multiple of 16 and every operand 16-byte aligned (cuBLASLt's FP8 rules; each of
//     N, C and OC is the K of one GEMM, the row length of two operands). Anything else is refused with
//     words: the functions return why, or "" when they ran.
//   - Plans are made once per case and tuned on their first call with matmul.cuh's tuner (the fastest of
//     the heuristic's candidates whose output is its first choice's bits): deterministic.
#pragma once

#include <cuda_fp8.h>

#include <algorithm>
#include <array>
#include <cstdarg>
#include <map>
#include <string>
#include <type_traits>

#include "common.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"

// printf into a std::string (the refusals' words).
inline std::string strf(const char* fmt, ...) {
    char buf[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(buf, sizeof(buf), fmt, args);
    va_end(args);
    return buf;
}

struct Fp8Format {
    const char* name;
    cudaDataType_t type;
    double max;             // the largest finite value, 1.75 2^emax
    int mbits, emin, emax;  // stored mantissa bits; exponents of the smallest normal and of the top binade
};
constexpr Fp8Format kE4M3{"e4m3", CUDA_R_8F_E4M3, 448.0, 3, -6, 8};
constexpr Fp8Format kE5M2{"e5m2", CUDA_R_8F_E5M2, 57344.0, 2, -14, 15};

// s = 2^p, the largest power of two with amax s <= 1.75 2^emax (the format's max). With amax = m 2^e,
// m in [0.5, 1): m 2^(emax + 1) fits while m <= 0.875, else m 2^emax; either way amax s > max / 2.
// amax 0: 1. Not finite: NaN, so that the casts and the GEMM put NaN out where the input had it.
__host__ __device__ inline float fp8_scale(float amax, int emax) {
    if (!(amax <= 3.402823466e38f)) return nanf("");
    if (amax == 0.0f) return 1.0f;
    int e;
    const float m = frexpf(amax, &e);
    int p = emax + 1 - e - (m > 0.875f ? 1 : 0);
    p = p < -126 ? -126 : p > 126 ? 126 : p;  // s and 1 / s normal floats
    return ldexpf(1.0f, p);
}

// ---------------------------------------------------------------------------------------------
// The cast pair: amax, then scale + cast (+ transpose).

// What a cast casts of x: x itself, with GELU GELU(x), with DGELU x GELU'(z) (x the gradient of GELU's
// output, z its input), in bf16 exactly as gelu_forward and gelu_backward_inplace store them (matmul.cuh).
template <bool GELU, bool DGELU> __device__ __forceinline__ __nv_bfloat16 fp8_source(__nv_bfloat16 x, __nv_bfloat16 z) {
    static_assert(!(GELU && DGELU), "GELU or its backward");
    if constexpr (GELU) return gelu_value(x);
    else if constexpr (DGELU) return gelu_backward_value(x, z);
    else return x;
}

// amax = max |x| (GELU: |GELU(x)|, DGELU: |x GELU'(z)|, each in bf16 as fp8_cast_kernel casts it) over
// the C first values of R rows ld apart (C and ld multiples of 8, x and z 16-byte aligned) into meta's
// amax slot (meta[2]'s bits), zeroed before. A batch: blockIdx.y picks the tensor, the tensors R ld
// apart in x, their metas 4 floats apart.
template <bool GELU = false, bool DGELU = false>
__global__ void __launch_bounds__(256) fp8_amax_kernel(float* meta, const __nv_bfloat16* x, size_t R, int C, int ld,
                                                       const __nv_bfloat16* z) {
    x += blockIdx.y * R * ld;
    const size_t per_row = C / 8, n = R * per_row;  // vectors of 8
    unsigned m = 0;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const size_t at = i / per_row * ld + i % per_row * 8;
        const Vec128<__nv_bfloat16> v = Vec128<__nv_bfloat16>::load(x + at);
        Vec128<__nv_bfloat16> zin = v;  // read only with DGELU
        if constexpr (DGELU) zin = Vec128<__nv_bfloat16>::load(z + blockIdx.y * R * ld + at);
#pragma unroll
        for (int j = 0; j < 8; j++) m = max(m, abs_bits(__bfloat162float(fp8_source<GELU, DGELU>(v[j], zin[j]))));
    }
    block_atomic_max<256>(reinterpret_cast<unsigned*>(meta + 4 * blockIdx.y + 2), m);
}

template <bool E5M2> __device__ __forceinline__ unsigned fp8x4(float a, float b, float c, float d) {
    constexpr __nv_fp8_interpretation_t kind = E5M2 ? __NV_E5M2 : __NV_E4M3;
    const unsigned lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kind);  // a in the low byte
    const unsigned hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, kind);
    return lo | hi << 16;
}
// 8 bf16 values times s, to FP8 in order (SATFINITE): one 8-byte vector of a natural copy. amax (null:
// none): the values' largest |y| max'ed into its bits.
template <bool E5M2> __device__ __forceinline__ uint2 fp8x8(const Vec128<__nv_bfloat16>& y, float s, unsigned* amax = nullptr) {
    float f[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        if (amax) *amax = max(*amax, abs_bits(__bfloat162float(y[j])));
        f[j] = __bfloat162float(y[j]) * s;
    }
    return make_uint2(fp8x4<E5M2>(f[0], f[1], f[2], f[3]), fp8x4<E5M2>(f[4], f[5], f[6], f[7]));
}

// x (R, C; rows ld apart) bf16 -> q (R, C) and/or qt (C, R) FP8, q = fp8(y s) with s from meta[2]'s
// amax, y = x, or with GELU GELU(x), with DGELU x GELU'(gelu_in) (GELU's backward: x its output's
// gradient, gelu_in its input, rows ld apart too), each rounded to bf16 as gelu_forward and gelu_backward_inplace write
// them; block (0, 0, z) also writes tensor z's meta[1] = s and meta[0] = 1 / s (cuBLASLt's scale
// pointer). Values past s's range saturate to the format's largest (SATFINITE). record (null: none):
// the amax of y atomicMax'ed into *record's bits, a delayed scale's newest observation. colsum (null:
// none; with the transposed copy, one tensor): y's column sums over the block's 64 rows, in fp32, into
// row blockIdx.x of colsum (C floats a row): thread t sums its 16 rows of column t % 64 in order, then
// the four 16-row sums are added in order, so the same bits every run (fp8_add_column_sums finishes).
// R and C multiples of 16. A batch:
// blockIdx.z picks the tensor, the tensors R ld apart in x, R C apart in q and qt, their metas 4 floats
// apart. A block takes a 64 x 64 tile: 256 threads load 2 vectors of 8
// each (a row is 8 threads, 128 bytes) and write q from registers; for qt the tile goes through shared memory, and
// thread t reads column t % 64 at rows 16 (t / 64) + 0..15 (a warp reads 32 consecutive columns of a
// row: no bank conflict) and writes those 16 FP8 values as one 16-byte vector of qt's row.
constexpr int kCastTile = 64;
template <bool E5M2, bool kNatural, bool kTransposed, bool GELU = false, bool DGELU = false>
__global__ void __launch_bounds__(256)
    fp8_cast_kernel(uint8_t* q, uint8_t* qt, float* meta, const __nv_bfloat16* x, int R, int C, int ld, unsigned* record,
                    const __nv_bfloat16* gelu_in, float* colsum) {
    __shared__ __align__(16) __nv_bfloat16 tile[kCastTile][kCastTile];
    __shared__ float chunk_sums[4][kCastTile];
    const size_t z = blockIdx.z;
    x += z * R * ld, q += z * R * C, qt += z * R * C, meta += 4 * z;
    constexpr int emax = (E5M2 ? kE5M2 : kE4M3).emax;
    const float s = fp8_scale(__uint_as_float(*reinterpret_cast<const unsigned*>(meta + 2)), emax);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) meta[0] = 1.0f / s, meta[1] = s;
    const int r0 = blockIdx.x * kCastTile, c0 = blockIdx.y * kCastTile;
    unsigned amax_bits = 0;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int v = threadIdx.x + 256 * i, row = v / 8, col = v % 8 * 8;
        const int r = r0 + row, c = c0 + col;
        if (r >= R || c >= C) continue;
        Vec128<__nv_bfloat16> in = Vec128<__nv_bfloat16>::load(x + size_t(r) * ld + c);
        Vec128<__nv_bfloat16> zin = in;  // read only with DGELU
        if constexpr (DGELU) zin = Vec128<__nv_bfloat16>::load(gelu_in + z * R * ld + size_t(r) * ld + c);
#pragma unroll
        for (int j = 0; j < 8; j++) in[j] = fp8_source<GELU, DGELU>(in[j], zin[j]);
        if (record)
#pragma unroll
            for (int j = 0; j < 8; j++) amax_bits = max(amax_bits, abs_bits(__bfloat162float(in[j])));
        if (kTransposed) *reinterpret_cast<int4*>(&tile[row][col]) = *reinterpret_cast<const int4*>(in.v);
        if (kNatural) *reinterpret_cast<uint2*>(q + size_t(r) * C + c) = fp8x8<E5M2>(in, s);
    }
    if (record) block_atomic_max<256>(record, amax_bits);  // every thread of the block: record is the same for all
    if (!kTransposed) return;
    __syncthreads();
    const int cc = threadIdx.x % kCastTile, rr = threadIdx.x / kCastTile * 16;
    const int c = c0 + cc, r = r0 + rr;
    if (colsum) {  // every thread reaches the barrier; chunks past R or C add nothing
        float sum = 0.0f;
        if (c < C && r < R)
#pragma unroll
            for (int k = 0; k < 16; k++) sum += __bfloat162float(tile[rr + k][cc]);
        chunk_sums[rr / 16][cc] = sum;
        __syncthreads();
        if (rr == 0 && c < C)
            colsum[size_t(blockIdx.x) * C + c] = ((chunk_sums[0][cc] + chunk_sums[1][cc]) + chunk_sums[2][cc]) + chunk_sums[3][cc];
    }
    if (c >= C || r >= R) return;  // R a multiple of 16: a chunk of 16 rows is all in or all out
    unsigned w[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
        w[k] = fp8x4<E5M2>(__bfloat162float(tile[rr + 4 * k][cc]) * s, __bfloat162float(tile[rr + 4 * k + 1][cc]) * s,
                            __bfloat162float(tile[rr + 4 * k + 2][cc]) * s, __bfloat162float(tile[rr + 4 * k + 3][cc]) * s);
    *reinterpret_cast<uint4*>(qt + size_t(c) * R + r) = make_uint4(w[0], w[1], w[2], w[3]);
}

// A bf16 tensor's FP8 copies, in memory its owner allocated: q (R, C) as stored and qt (C, R); meta
// (16-byte aligned): 1 / s, s, amax's bits. q and qt hold `capacity` bytes each (they may be one
// buffer where the owner never needs both copies at once).
struct Fp8Tensor {
    const Fp8Format* fmt = nullptr;
    int R = 0, C = 0;  // the tensor last quantized
    uint8_t* q = nullptr;
    uint8_t* qt = nullptr;
    float* meta = nullptr;
    size_t capacity = 0;
    const float* scale_inv() const { return meta; }
};

// Where the amax a tensor's scale comes from is: fp8_quantize's own pass over x (compute), or the
// tensor's amax slot as it stands (given): written by the kernel that produced x (fp8_amax_slot before
// that kernel), or by the caller, e.g. the largest amax of the steps before (delayed scaling).
enum class Fp8Amax { compute, given };

// What fp8_quantize casts besides x itself, and what it writes besides the copies.
struct Fp8CastOptions {
    Fp8Amax amax = Fp8Amax::compute;
    bool gelu = false;                         // GELU(x): x is GELU's input (e4m3)
    const __nv_bfloat16* gelu_input = nullptr; // x GELU'(gelu_input): x is GELU's output gradient (e5m2)
    unsigned* record = nullptr;                // *record = max(*record, amax of what is cast), on the float's bits
    float* colsum = nullptr;                   // per 64-row tile column sums (fp8_column_sum_tiles(R) rows of C)
    Fp8CastOptions& with_amax(Fp8Amax a) { amax = a; return *this; }
    Fp8CastOptions& with_gelu(bool on = true) { gelu = on; return *this; }
    Fp8CastOptions& with_gelu_backward(const __nv_bfloat16* inp) { gelu_input = inp; return *this; }
    Fp8CastOptions& with_record(unsigned* r) { record = r; return *this; }
    Fp8CastOptions& with_column_sums(float* sums) { colsum = sums; return *this; }
};

// Zeroes t's amax slot (meta[2]) on `stream` and returns it, for the kernel that produces the tensor
// to atomicMax the bits of |x| into (abs_bits, block_atomic_max), as fp8_amax_kernel would. That
// kernel must run on the same stream, after this.
inline unsigned* fp8_amax_slot(Fp8Tensor& t, cudaStream_t stream = 0) {
    cuda_check(cudaMemsetAsync(t.meta + 2, 0, sizeof(float), stream));
    return reinterpret_cast<unsigned*>(t.meta + 2);
}

// Why `count` tensors (R, C), rows ld apart, cannot be cast into t ("": they can): what the caller's
// shapes decide. Past the buffer or the grid's limits is a bug of the caller's sizing: fail().
inline std::string fp8_cast_refusal(const Fp8Tensor& t, const __nv_bfloat16* x, int count, int R, int C, int ld, bool natural,
                                    bool transposed) {
    if (R % 16 || C % 16) return strf("a %d x %d tensor: FP8 casts need both dimensions multiples of 16", R, C);
    if (!is_aligned16(x)) return "the bf16 input is not 16-byte aligned: FP8 casts read 16-byte vectors";
    if (ld % 8 || ld < C) return strf("rows %d apart: FP8 casts read rows of %d values in 16-byte vectors", ld, C);
    if (!natural && !transposed) return "nothing to write";
    if (size_t(count) * R * C > t.capacity) fail("fp8 cast: %d x %d x %d is past the buffer's %zu elements", count, R, C, t.capacity);
    if ((C + kCastTile - 1) / kCastTile > 65535) fail("fp8 cast: C = %d is past the grid's 65535 column tiles", C);
    if (count < 1 || count > 65535) fail("fp8 cast: a batch of %d tensors (1 to 65535)", count);
    return "";
}

// The amax pass over `count` tensors (blocks shared out between them; their slots zeroed before), then
// the cast of each; gelu: of GELU(x); gelu_input: of x GELU'(gelu_input) (Fp8CastOptions).
inline void fp8_amax_launch(Fp8Tensor& t, const __nv_bfloat16* x, int count, int R, int C, int ld, cudaStream_t stream,
                            bool gelu = false, const __nv_bfloat16* gelu_input = nullptr) {
    const size_t n = size_t(R) * C;
    const dim3 grid(std::max(1, elementwise_blocks(count * n / 8) / count), count);
    (gelu_input ? fp8_amax_kernel<false, true> : gelu ? fp8_amax_kernel<true> : fp8_amax_kernel<false>)<<<grid, 256, 0, stream>>>(
        t.meta, x, R, C, ld, gelu_input);
    cuda_check_launch();
}
inline void fp8_cast_launch(Fp8Tensor& t, const __nv_bfloat16* x, int count, int R, int C, int ld, bool natural, bool transposed,
                            cudaStream_t stream, const Fp8CastOptions& o = Fp8CastOptions()) {
    using Kernel = void (*)(uint8_t*, uint8_t*, float*, const __nv_bfloat16*, int, int, int, unsigned*, const __nv_bfloat16*, float*);
    const bool e5m2 = t.fmt->type == CUDA_R_8F_E5M2, gelu = o.gelu;  // fp8_quantize checks the combinations
    const Kernel k = o.gelu_input ? fp8_cast_kernel<true, true, true, false, true>  // GELU's backward: both e5m2 copies
                   : gelu ? (natural ? (transposed ? fp8_cast_kernel<false, true, true, true> : fp8_cast_kernel<false, true, false, true>)
                                     : fp8_cast_kernel<false, false, true, true>)  // an activation: e4m3
                   : e5m2 ? (natural ? (transposed ? fp8_cast_kernel<true, true, true> : fp8_cast_kernel<true, true, false>)
                                     : fp8_cast_kernel<true, false, true>)
                          : (natural ? (transposed ? fp8_cast_kernel<false, true, true> : fp8_cast_kernel<false, true, false>)
                                     : fp8_cast_kernel<false, false, true>);
    const dim3 grid((R + kCastTile - 1) / kCastTile, (C + kCastTile - 1) / kCastTile, count);
    k<<<grid, 256, 0, stream>>>(t.q, t.qt, t.meta, x, R, C, ld, o.record, o.gelu_input, o.colsum);
    cuda_check_launch();
}

// Rows of column sums fp8_quantize's colsum writes for R rows (one per 64-row tile).
inline int fp8_column_sum_tiles(int R) { return (R + kCastTile - 1) / kCastTile; }

// Quantizes x (R, C), rows ld apart (0: C): natural writes q, transposed writes qt. With
// Fp8Amax::compute one read of x for the amax and one for the cast; with Fp8Amax::given the amax is
// already in t's slot (the kernel that wrote x put it there after fp8_amax_slot, or the caller did:
// delayed scaling) and only the cast reads x: the same bytes and scale for the same amax.
// o.gelu (e4m3): x is GELU's input, and the copies are those of GELU(x) as gelu_forward would write it
// in bf16: the bytes and scale of gelu_forward then fp8_quantize, without the bf16 output's write and
// read. o.gelu_input (e5m2, both copies): x is GELU's output gradient and the copies
// those of x GELU'(gelu_input) as gelu_backward_inplace would leave it, without that bf16 tensor's
// write and read. o.record (null: none): the amax of what is cast also goes into *record's bits by
// atomicMax, in the cast's one read of x: with a given amax that is not x's (delayed scaling) the
// caller learns x's for later casts. o.colsum (with the transposed copy): the column sums of what is
// cast, per 64-row tile (fp8_column_sum_tiles(R) rows of C floats; fp8_add_column_sums adds them up).
// "" when enqueued, or why not.
inline std::string fp8_quantize(Fp8Tensor& t, const __nv_bfloat16* x, int R, int C, bool natural, bool transposed,
                                cudaStream_t stream = 0, int ld = 0, const Fp8CastOptions& o = Fp8CastOptions()) {
    if (ld == 0) ld = C;
    const std::string why = fp8_cast_refusal(t, x, 1, R, C, ld, natural, transposed);
    if (!why.empty()) return why;
    if (o.gelu && o.gelu_input) fail("fp8_quantize: GELU or its backward, not both");
    if (o.gelu && t.fmt->type != CUDA_R_8F_E4M3) fail("fp8_quantize: GELU's output is cast in e4m3");
    if (o.gelu_input && (t.fmt->type != CUDA_R_8F_E5M2 || !natural || !transposed))
        fail("fp8_quantize: GELU's backward is cast in e5m2, both copies");
    if (o.gelu_input && !is_aligned16(o.gelu_input)) return "GELU's input is not 16-byte aligned: FP8 casts read 16-byte vectors";
    if (o.colsum && !transposed) fail("fp8_quantize: the column sums ride in the transposing cast");
    t.R = R, t.C = C;
    if (o.amax == Fp8Amax::compute) {
        fp8_amax_slot(t, stream);
        fp8_amax_launch(t, x, 1, R, C, ld, stream, o.gelu, o.gelu_input);
    }
    fp8_cast_launch(t, x, 1, R, C, ld, natural, transposed, stream, o);
    return "";
}

// bias[c] += the sum over the tiles' column sums of column c (fp8_quantize's colsum for R rows and C
// columns), added in a fixed order, rounded to T once: a bias gradient, as matmul_backward's
// matrix-vector product adds it, without reading the output gradient again. Deterministic.
// A block takes 32 columns: thread (x, y) sums tiles y, y + 16, y + 32, ... of column x in order, then
// thread (x, 0) adds the 16 sums in order and the bias.
template <typename T> __global__ void __launch_bounds__(512) fp8_add_column_sums_kernel(T* bias, const float* colsum, int tiles, int C) {
    __shared__ float part[16][32];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float sum = 0.0f;
    if (c < C)
        for (int i = threadIdx.y; i < tiles; i += 16) sum += colsum[size_t(i) * C + c];
    part[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return;
    for (int y = 1; y < 16; y++) sum += part[y][threadIdx.x];
    bias[c] = from_float<T>(to_float(bias[c]) + sum);
}
template <typename T> void fp8_add_column_sums(T* bias, const float* colsum, int R, int C, cudaStream_t stream = 0) {
    fp8_add_column_sums_kernel<T><<<(C + 31) / 32, dim3(32, 16), 0, stream>>>(bias, colsum, fp8_column_sum_tiles(R), C);
    cuda_check_launch();
}

// Quantizes `count` tensors (R, C) stored one after another in x (R C apart) into t's q and qt (R C
// apart) and its metas (4 floats apart, 16 bytes: every 1 / s stays aligned), each with its own scale:
// the bytes and scales of `count` fp8_quantize calls, in one amax and one cast launch. Every amax slot
// must be zeroed before (fp8_zero_amax_slots: one memset for them all). "" when enqueued, or why not.
inline std::string fp8_quantize_batch(Fp8Tensor& t, const __nv_bfloat16* x, int count, int R, int C, bool natural, bool transposed,
                                      cudaStream_t stream = 0) {
    const std::string why = fp8_cast_refusal(t, x, count, R, C, C, natural, transposed);
    if (!why.empty()) return why;
    t.R = R, t.C = C;
    fp8_amax_launch(t, x, count, R, C, C, stream);
    fp8_cast_launch(t, x, count, R, C, C, natural, transposed, stream);
    return "";
}

// Zeroes the amax slots of `count` metas 4 floats apart from meta (one strided memset; the scales are
// left as they are).
inline void fp8_zero_amax_slots(float* meta, int count, cudaStream_t stream = 0) {
    cuda_check(cudaMemset2DAsync(meta + 2, 4 * sizeof(float), 0, sizeof(float), count, stream));
}

// ---------------------------------------------------------------------------------------------
// LayerNorm straight into FP8: train_gpt -f8 1's ln1 and ln2 once their scales are delayed. The bf16
// output is never written: per value, LayerNorm's y as layernorm_forward's vector kernel rounds it to
// bf16 (its row code, ForwardRow), then y s cast to e4m3 as fp8_cast_kernel casts it, s from the amax in
// the slot (meta[2], given). So the bytes are those of layernorm_forward then fp8_quantize with that
// amax given, from one read of x and one write of each copy, where the pair reads x, writes y, reads
// y and writes the copies (2 + 2 + 2 + 2 bytes a value against 2 + 2).
//
// A block takes RT rows: its row groups (layernorm_forward's, WPR warps a row) take rows group,
// group + ROWS, ...; each y goes to q from registers (8 bytes a vector) and, for qt, into a tile of RT
// rows in shared memory. Then a thread takes 4 columns of 16 rows, transposes the 4 x 4 byte blocks with
// byte permutes and writes 16 bytes to each of the 4 columns' rows of qt: N a multiple of 16, so 16
// rows are all in or all out. With RT = 32 a warp's stores fill whole 32-byte sectors of qt (16 rows
// a store took 1.7x as long at d12's shape, docs/fp8.md). mean and rstd as layernorm_forward writes
// them; record: the amax of y (as bf16) atomicMax'ed into *record's bits; block 0 writes meta[1] = s,
// meta[0] = 1 / s.
template <int WPR, int RT>
__global__ void __launch_bounds__(layernorm_detail::forward_block_threads<__nv_bfloat16, WPR>())
    fp8_layernorm_kernel(uint8_t* q, uint8_t* qt, float* meta, float* mean, float* rstd, const __nv_bfloat16* inp,
                         const __nv_bfloat16* weight, const __nv_bfloat16* bias, int N, int C, unsigned* record) {
    using namespace layernorm_detail;
    using Row = ForwardRow<__nv_bfloat16, WPR>;
    constexpr int BLOCK = forward_block_threads<__nv_bfloat16, WPR>(), TPR = Row::TPR, ROWS = BLOCK / TPR, K = Row::K;
    constexpr int CHUNKS = RT / 16;
    static_assert(Row::VS == 8 && RT % 16 == 0 && RT % ROWS == 0, "8 values a vector; whole row groups and 16-row chunks a tile");
    extern __shared__ __align__(16) uint8_t tile[];  // (RT, C + 4) FP8 bytes, with qt
    __shared__ float buf[2][BLOCK / 32];
    const float s = fp8_scale(__uint_as_float(*reinterpret_cast<const unsigned*>(meta + 2)), kE4M3.emax);
    if (blockIdx.x == 0 && threadIdx.x == 0) meta[0] = 1.0f / s, meta[1] = s;
    const int group = threadIdx.x / TPR, t = threadIdx.x % TPR, nvec = C / 8, ld = C + 4;
    const int r0 = blockIdx.x * RT;
    unsigned amax = 0;
    for (int rr = group; rr < RT && r0 + rr < N; rr += ROWS) {  // a row group's rows: its barriers are its own
        const int row = r0 + rr;
        Row x;
        x.load(inp + size_t(row) * C, t, nvec);
        const float2 ms = x.template stats<BLOCK>(t, nvec, C, buf);
        if (t == 0) Row::store_stats(mean, rstd, row, ms);
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int i = k * TPR + t;
            if (i >= nvec) continue;
            const Vec128<__nv_bfloat16> y =
                x.output(k, ms, Vec128<__nv_bfloat16>::load(weight + size_t(i) * 8), Vec128<__nv_bfloat16>::load(bias + size_t(i) * 8));
            const uint2 v = fp8x8<false>(y, s, &amax);
            *reinterpret_cast<uint2*>(q + size_t(row) * C + i * 8) = v;
            if (qt) {  // tile rows C + 4 bytes apart: 4-byte aligned
                unsigned* at = reinterpret_cast<unsigned*>(tile + rr * ld + i * 8);
                at[0] = v.x, at[1] = v.y;
            }
        }
    }
    if (record) block_atomic_max<BLOCK>(record, amax);  // every thread of the block: record is the same for all
    if (!qt) return;
    __syncthreads();
    // Job (cq, h): columns 4 cq .. 4 cq + 3, rows 16 h .. 16 h + 15 of the tile; h varies fastest, so
    // a warp's 16-byte stores fill whole 32-byte sectors of qt's rows (RT 32). A warp reads words cq
    // .. cq + 15 of tile rows 16 h + i: with rows C / 4 + 1 words apart (odd), h = 1 is 16 banks on.
    const int quads = C / 4;
    for (int job = threadIdx.x; job < quads * CHUNKS; job += BLOCK) {
        const int cq = job / CHUNKS, h = job % CHUNKS, r = r0 + 16 * h;
        if (r >= N) continue;
        unsigned col[4][4];  // col[j][g]: column 4 cq + j, rows 4 g .. 4 g + 3 of the chunk, one byte each
#pragma unroll
        for (int g = 0; g < 4; g++) {
            unsigned w[4];
#pragma unroll
            for (int i = 0; i < 4; i++) w[i] = *reinterpret_cast<const unsigned*>(tile + (16 * h + 4 * g + i) * ld + 4 * cq);
            const unsigned lo01 = __byte_perm(w[0], w[1], 0x5140), lo23 = __byte_perm(w[2], w[3], 0x5140);  // bytes 0 and 1
            const unsigned hi01 = __byte_perm(w[0], w[1], 0x7362), hi23 = __byte_perm(w[2], w[3], 0x7362);  // bytes 2 and 3
            col[0][g] = __byte_perm(lo01, lo23, 0x5410), col[1][g] = __byte_perm(lo01, lo23, 0x7632);
            col[2][g] = __byte_perm(hi01, hi23, 0x5410), col[3][g] = __byte_perm(hi01, hi23, 0x7632);
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
            *reinterpret_cast<uint4*>(qt + size_t(4 * cq + j) * N + r) = make_uint4(col[j][0], col[j][1], col[j][2], col[j][3]);
    }
}

// The tile's rows for C (each C + 4 bytes): 32 (a 32-byte sector of each qt row a block) while two
// blocks fit an SM, else 16; 0 where even 16 rows are past a block's shared memory. kSmemSpare covers
// the kernel's static shared memory (under 200 bytes) and the 1 KB the GPU reserves a block.
inline int fp8_layernorm_tile_rows(int C) {
    constexpr int kSmemSpare = 2048;
    static int per_block = 0, per_sm = 0;
    if (!per_block) {
        int device = 0;
        cuda_check(cudaGetDevice(&device));
        cuda_check(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        cuda_check(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
    }
    const long tile16 = 16L * (C + 4);
    return 2 * (2 * tile16 + kSmemSpare) <= per_sm ? 32 : tile16 + kSmemSpare <= per_block ? 16 : 0;
}

// Why LayerNorm into FP8 cannot run for these shapes ("": it can): what fp8_layernorm_forward needs.
inline std::string fp8_layernorm_refusal(int N, int C) {
    if (N % 16 || C % 16) return strf("a %d x %d LayerNorm: FP8 casts need both dimensions multiples of 16", N, C);
    if (!layernorm_detail::forward_min_warps_per_row(C)) return strf("C = %d: LayerNorm into FP8 holds rows of at most %d values", C,
                                                                     layernorm_detail::kForwardColsPerThread * 32 * layernorm_detail::kForwardMaxWarpsPerRow);
    if (!fp8_layernorm_tile_rows(C)) return strf("C = %d: LayerNorm into FP8's transposing tile of 16 rows is past shared memory", C);
    return "";
}

struct Fp8LayerNormArgs {
    uint8_t *q, *qt;
    float *meta, *mean, *rstd;
    const __nv_bfloat16 *inp, *weight, *bias;
    int N, C;
    unsigned* record;
};
template <int WPR> void fp8_layernorm_launch(const Fp8LayerNormArgs& a, int rows, cudaStream_t stream) {
    auto kernel = rows == 32 ? fp8_layernorm_kernel<WPR, 32> : fp8_layernorm_kernel<WPR, 16>;
    const size_t smem = a.qt ? size_t(rows) * (a.C + 4) : 0;
    static size_t allowed[2] = {};  // the dynamic shared memory each instance may take, as last set
    size_t& allowed_now = allowed[rows == 32];
    if (smem > allowed_now) {
        cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        allowed_now = smem;
    }
    kernel<<<(a.N + rows - 1) / rows, layernorm_detail::forward_block_threads<__nv_bfloat16, WPR>(), smem, stream>>>(
        a.q, a.qt, a.meta, a.mean, a.rstd, a.inp, a.weight, a.bias, a.N, a.C, a.record);
}

// t's e4m3 copies of y = LayerNorm(inp) with weight and bias (N, C rows; layernorm_forward's y, never
// written in bf16): q always, qt with transposed; scaled by the amax in t's slot (given: delayed
// scaling); record (null: none) as Fp8CastOptions's; mean and rstd (either may be null) as
// layernorm_forward writes them. inp, weight and bias 16-byte aligned. "" when enqueued, or why not.
inline std::string fp8_layernorm_forward(Fp8Tensor& t, float* mean, float* rstd, const __nv_bfloat16* inp, const __nv_bfloat16* weight,
                                         const __nv_bfloat16* bias, int N, int C, bool transposed, unsigned* record,
                                         cudaStream_t stream = 0) {
    using namespace layernorm_detail;
    std::string why = fp8_layernorm_refusal(N, C);
    if (why.empty() && !vector_ok<__nv_bfloat16>(C, {inp, weight, bias})) why = "LayerNorm into FP8 reads 16-byte aligned vectors";
    if (!why.empty()) return why;
    if (t.fmt->type != CUDA_R_8F_E4M3) fail("fp8_layernorm_forward: a layer input is cast in e4m3");
    if (size_t(N) * C > t.capacity) fail("fp8_layernorm_forward: %d x %d is past the buffer's %zu elements", N, C, t.capacity);
    t.R = N, t.C = C;
    const int rows = fp8_layernorm_tile_rows(C);
    const Fp8LayerNormArgs args{t.q, transposed ? t.qt : nullptr, t.meta, mean, rstd, inp, weight, bias, N, C, record};
    switch (forward_warps_per_row<__nv_bfloat16>(C)) {  // layernorm_forward's choice: the same sums
        case 1: fp8_layernorm_launch<1>(args, rows, stream); break;
        case 2: fp8_layernorm_launch<2>(args, rows, stream); break;
        case 4: fp8_layernorm_launch<4>(args, rows, stream); break;
        case 8: fp8_layernorm_launch<8>(args, rows, stream); break;
        case 16: fp8_layernorm_launch<16>(args, rows, stream); break;
        default: fail("fp8_layernorm_forward: bad warps per row");
    }
    cuda_check_launch();
    return "";
}

// ---------------------------------------------------------------------------------------------
// One FP8 GEMM through cuBLASLt, column-major as cuBLAS sees it, TN:
//   D (m, n) = a_scale b_scale A^T B (+ bias per row of D) (+ residual, or + D with accumulate),
//   A stored (k, m), B stored (k, n), D and the residual stored (m, n); leading dimensions k, k, m.

struct Fp8Gemm {
    int m = 0, n = 0, k = 0;
    const uint8_t* A = nullptr;
    const Fp8Format* a_fmt = nullptr;
    const float* a_scale = nullptr;  // device: the factor back to A's units (1 / s)
    const uint8_t* B = nullptr;
    const Fp8Format* b_fmt = nullptr;
    const float* b_scale = nullptr;
    void* D = nullptr;
    bool d_fp32 = false;                       // D fp32 (a weight gradient), else bf16
    const __nv_bfloat16* bias = nullptr;       // (m), bf16 D only
    const __nv_bfloat16* residual = nullptr;   // (m, n) apart from D, bf16 D only: cuBLASLt's C with beta = 1
    bool accumulate = false;                   // D += (beta = 1, C is D)
    bool fast_accum = false;
};

// Runs it, or says why not ("": it ran).
inline std::string fp8_gemm(const Fp8Gemm& g, cudaStream_t stream = 0) {
    if (g.m % 16 || g.n % 16 || g.k % 16)
        return strf("m %d n %d k %d: cuBLASLt's FP8 GEMMs need every dimension a multiple of 16", g.m, g.n, g.k);
    const int align_a = pointer_alignment(g.A), align_b = pointer_alignment(g.B), align_d = pointer_alignment(g.D);
    const int align_c = g.residual ? pointer_alignment(g.residual) : align_d;
    const int align_bias = g.bias ? pointer_alignment(g.bias) : 0;
    if (std::min({align_a, align_b, align_c, align_d}) < 16) return "an operand is not 16-byte aligned (cuBLASLt's FP8 GEMMs need it)";
    if ((g.bias || g.residual) && g.d_fp32) fail("fp8_gemm: a bias or residual goes with a bf16 D");
    if (g.residual && g.accumulate) fail("fp8_gemm: a residual and accumulate in one call");
    static std::map<std::array<int, 15>, MatmulPlan> plans;
    MatmulPlan& plan = plans[{g.m, g.n, g.k, (int)g.a_fmt->type, (int)g.b_fmt->type, g.d_fp32, g.bias != nullptr, g.residual != nullptr,
                              g.accumulate, g.fast_accum, align_a, align_b, align_c, align_d, align_bias}];
    BlasContext& b = blas();
    if (!plan.made) {
        plan.made = true;
        cublas_check(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        const int8_t fast = g.fast_accum ? 1 : 0;
        const cublasLtEpilogue_t epilogue = g.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
        cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
        cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
        cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
        cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
        cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.a_scale, sizeof(g.a_scale)));
        cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.b_scale, sizeof(g.b_scale)));
        if (g.bias) {
            const cudaDataType_t bias_type = CUDA_R_16BF;  // FP8 in, bf16 out: the bias is bf16 (cuBLASLt's FP8 table)
            cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
            cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
        }
        cublas_check(cublasLtMatrixLayoutCreate(&plan.a, g.a_fmt->type, g.k, g.m, g.k));
        cublas_check(cublasLtMatrixLayoutCreate(&plan.b, g.b_fmt->type, g.k, g.n, g.k));
        cublas_check(cublasLtMatrixLayoutCreate(&plan.d, g.d_fp32 ? CUDA_R_32F : CUDA_R_16BF, g.m, g.n, g.m));  // C's too
        matmul_plan_candidates(plan, g.m, g.n, g.k, epilogue, align_a, align_b, align_c, align_d);
    }
    if (!plan.has_algo)
        return strf("cuBLASLt offers no FP8 algorithm for m %d n %d k %d, %s x %s -> %s", g.m, g.n, g.k, g.a_fmt->name, g.b_fmt->name,
                    g.d_fp32 ? "fp32" : "bf16");
    cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.a_scale, sizeof(g.a_scale)));
    cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.b_scale, sizeof(g.b_scale)));
    if (g.bias) cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
    const float alpha = 1.0f, beta = g.accumulate || g.residual ? 1.0f : 0.0f;
    const void* c_in = g.residual ? static_cast<const void*>(g.residual) : g.D;  // beta = 0: cuBLASLt does not read C
    void* workspace = blas_stream(stream).workspace;
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
        const cublasStatus_t st = cublasLtMatmul(b.lt, plan.desc, &alpha, g.A, plan.a, g.B, plan.b, &beta, c_in, plan.d, g.D, plan.d,
                                                 &algo, workspace, b.workspace_bytes, stream);
        if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) cublas_check(st);
        return st == CUBLAS_STATUS_SUCCESS;
    };
    if (!plan.tuned && b.tune) {  // runs are idempotent but for accumulate, where the tuner puts D back before each
        const size_t count = size_t(g.m) * g.n;
        const __nv_bfloat16* no_aux = nullptr;
        if (g.d_fp32) matmul_tune(plan, run, static_cast<float*>(g.D), no_aux, count, stream, g.accumulate);
        else matmul_tune(plan, run, static_cast<__nv_bfloat16*>(g.D), no_aux, count, stream, g.accumulate);
    }
    if (!run(plan.algo)) {
        plan.has_algo = false;
        return strf("cuBLASLt refused its own FP8 algorithm for m %d n %d k %d", g.m, g.n, g.k);
    }
    return "";
}

// A linear layer's three GEMMs on quantized tensors (inp: N x C, weight: OC x C, dout: N x OC).
// out (N, OC) = inp weight^T + bias (+ residual (N, OC), apart from out): column-major (OC, N) =
// weight (C, OC)^T inp (C, N). Reads inp's and the weight's natural copies.
inline std::string fp8_forward(__nv_bfloat16* out, const Fp8Tensor& inp, const Fp8Tensor& w, const __nv_bfloat16* bias, bool fast,
                               cudaStream_t stream = 0, const __nv_bfloat16* residual = nullptr) {
    if (w.C != inp.C) fail("fp8_forward: weight has %d columns, inp %d", w.C, inp.C);
    Fp8Gemm g;
    g.m = w.R, g.n = inp.R, g.k = inp.C;
    g.A = w.q, g.a_fmt = w.fmt, g.a_scale = w.scale_inv();
    g.B = inp.q, g.b_fmt = inp.fmt, g.b_scale = inp.scale_inv();
    g.D = out, g.bias = bias, g.residual = residual, g.fast_accum = fast;
    return fp8_gemm(g, stream);
}
// dinp (N, C) = dout weight: column-major (C, N) = weight^T's copy (OC, C)^T dout (OC, N). Reads the
// weight's transposed copy and dout's natural one.
inline std::string fp8_backward_input(__nv_bfloat16* dinp, const Fp8Tensor& dout, const Fp8Tensor& w, bool fast, cudaStream_t stream = 0) {
    if (w.R != dout.C) fail("fp8_backward_input: weight has %d rows, dout %d columns", w.R, dout.C);
    Fp8Gemm g;
    g.m = w.C, g.n = dout.R, g.k = dout.C;
    g.A = w.qt, g.a_fmt = w.fmt, g.a_scale = w.scale_inv();
    g.B = dout.q, g.b_fmt = dout.fmt, g.b_scale = dout.scale_inv();
    g.D = dinp, g.fast_accum = fast;
    return fp8_gemm(g, stream);
}
// dweight (OC, C) += dout^T inp: column-major (C, OC) += inp^T's copy (N, C)^T dout^T's copy (N, OC),
// in fp32 or bf16 (TD). Reads inp's and dout's transposed copies.
template <typename TD>
std::string fp8_backward_weight(TD* dweight, const Fp8Tensor& dout, const Fp8Tensor& inp, bool fast, cudaStream_t stream = 0) {
    static_assert(std::is_same<TD, float>::value || std::is_same<TD, __nv_bfloat16>::value, "dweight in fp32 or bf16");
    if (inp.R != dout.R) fail("fp8_backward_weight: inp has %d rows, dout %d", inp.R, dout.R);
    Fp8Gemm g;
    g.m = inp.C, g.n = dout.C, g.k = inp.R;
    g.A = inp.qt, g.a_fmt = inp.fmt, g.a_scale = inp.scale_inv();
    g.B = dout.qt, g.b_fmt = dout.fmt, g.b_scale = dout.scale_inv();
    g.D = dweight, g.d_fp32 = std::is_same<TD, float>::value, g.accumulate = true, g.fast_accum = fast;
    return fp8_gemm(g, stream);
}
