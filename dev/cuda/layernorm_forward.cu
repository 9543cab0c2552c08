// layernorm_forward.cu: the LayerNorm forward laboratory. Numbered versions retrace how the kernel
// got fast; the last one is the header's layernorm_forward (layernorm.cuh), so the lab measures what
// training runs. Every version is validated against the double-precision CPU reference
// (dev/cuda/layernorm_reference.cuh) at many shapes, then benchmarked.
//
//   make dev/cuda/layernorm_forward
//   ./dev/cuda/layernorm_forward            validate, then benchmark every version, fp32 and bf16
//   ./dev/cuda/layernorm_forward 4 5        only versions 4 and 5
//   ./dev/cuda/layernorm_forward --check    validation only (what CI runs; skips without a GPU)
//   ./dev/cuda/layernorm_forward --residual fused residual + LayerNorm instead
//
// Versions (plain LayerNorm):
//   1  one thread per row: three passes over the row (mean, variance, output), each thread walking its
//      own row, so a warp's 32 loads hit 32 different rows: uncoalesced, and only N threads in all.
//   2  one warp per row: the 32 lanes stride the row together, so every load is coalesced, and the
//      sums are cooperative-groups warp reductions (shuffles, no shared memory). 32x the threads.
//   3  one block (256 threads) per row: 8x the threads per row again, so long rows get enough loads
//      in flight; per-warp sums are combined through shared memory. Still three passes over memory
//      (the second and third mostly hit L1/L2).
//   4  one block per row, the row read ONCE into registers with 128-bit loads (4 vectors per
//      thread); mean and variance (two-pass, safe for rows with a large mean) come from registers,
//      then one write. DRAM traffic is now the minimum: one read, one write. Needs C a multiple of
//      16 / sizeof(T), 16-byte aligned pointers and C <= 4 * 1024 * (16 / sizeof(T)); other shapes
//      run version 3 (the lab says so).
//   5  the header's layernorm_forward: row groups of 32 * WPR threads sized by C (a warp per row up to
//      1024 columns, so small rows need no barrier at all), several rows per block in bf16 (blocks of
//      at least 256 threads; fp32 blocks hold one row group), up to 32 columns per thread all loaded
//      before the first use (many loads in flight), plain 128-bit loads of x (streaming, evict-first
//      ones measured slower: --stream-loads), named barriers so row groups never wait for each other;
//      a scalar general path for any C and alignment (one block per row). The knobs below run the
//      lab's variants of it instead (dev/cuda/layernorm_lab.cuh).
//
// Fused residual (--residual): residual = a + b (rounded to T and stored), out = LayerNorm(residual).
//   1  unfused: an elementwise add kernel, then the header's layernorm_forward (reads the residual
//      back: 5 N C transfers instead of 4).
//   2  fused_residual_layernorm_forward (dev/cuda/layernorm_lab.cuh; training ran it until the
//      residual adds moved into the matmul epilogues): the sum is formed in registers, stored once
//      and normalized without reading it back.
//
// The header's version is also run with its FP8 amax option (with_amax) at every shape: the same bits
// out, and the amax exactly the largest |out| as stored.
//
// Bandwidth: forward bytes = N*C*sizeof(T) read + N*C*sizeof(T) written + 8*N (mean, rstd), plus
// 2*C*sizeof(T) of weight and bias (negligible). Residual: 2 N C sizeof(T) read + 2 N C sizeof(T)
// written + 8 N. Reported as a fraction of a device-to-device copy measured in the same run.

#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>

#include <string>

#include "common.cuh"
#include "dev/lab.cuh"
#include "dev/cuda/layernorm_lab.cuh"
#include "dev/cuda/layernorm_reference.cuh"
#include "layernorm.cuh"

namespace cg = cooperative_groups;

constexpr float kEps = 1e-5f;
constexpr int kNumVersions = 5, kNumResidualVersions = 2;

// Tuning knobs of the benchmark, for experiments on version 5: warps per row (--wpr; 0: the header's
// choice), streaming (evict-first) instead of plain loads of x (--stream-loads), the smallest block
// (--min-block 32: one row group per block; 256: several row groups when rows are short; 0: the
// header's choice), and where `out` starts in its allocation (--out-offset). Any of the first three
// runs the lab's variant of the header's kernel (dev/cuda/layernorm_lab.cuh) with those choices.
int g_wpr = 0;
bool g_stream_loads = false;
int g_min_block = 0;
int g_out_offset_kib = 0;
bool g_floor = false;  // --floor: also a copy of the same bytes and an empty launch of the header's shape

// ---------------------------------------------------------------------------------------------
// Version 1: one thread per row.

template <typename T>
__global__ void layernorm_forward_kernel1(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                                          const T* bias, int N, int C) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    const T* x = inp + size_t(row) * C;
    float m = 0.0f;
    for (int c = 0; c < C; c++) m += to_float(x[c]);
    m /= C;
    float v = 0.0f;
    for (int c = 0; c < C; c++) {
        const float d = to_float(x[c]) - m;
        v += d * d;
    }
    const float s = rsqrtf(v / C + kEps);
    for (int c = 0; c < C; c++)
        out[size_t(row) * C + c] = from_float<T>((to_float(x[c]) - m) * s * to_float(weight[c]) + to_float(bias[c]));
    mean[row] = m;
    rstd[row] = s;
}

// ---------------------------------------------------------------------------------------------
// Version 2: one warp per row, cooperative-groups reductions.

template <typename T>
__global__ void layernorm_forward_kernel2(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                                          const T* bias, int N, int C) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    const int row = blockIdx.x * (blockDim.x / 32) + warp.meta_group_rank();
    if (row >= N) return;  // whole warps leave together
    const T* x = inp + size_t(row) * C;
    float sum = 0.0f;
    for (int c = warp.thread_rank(); c < C; c += 32) sum += to_float(x[c]);
    const float m = cg::reduce(warp, sum, cg::plus<float>()) / C;
    float sq = 0.0f;
    for (int c = warp.thread_rank(); c < C; c += 32) {
        const float d = to_float(x[c]) - m;
        sq += d * d;
    }
    const float s = rsqrtf(cg::reduce(warp, sq, cg::plus<float>()) / C + kEps);
    for (int c = warp.thread_rank(); c < C; c += 32)
        out[size_t(row) * C + c] = from_float<T>((to_float(x[c]) - m) * s * to_float(weight[c]) + to_float(bias[c]));
    if (warp.thread_rank() == 0) mean[row] = m, rstd[row] = s;
}

// ---------------------------------------------------------------------------------------------
// Version 3: one block per row, shared-memory reduction of the per-warp sums.

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `shared` holds 32 floats; the trailing barrier lets the caller reuse it at once.
__device__ float block_sum(float v, float* shared) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < warps; w++) total += shared[w];
    __syncthreads();
    return total;
}

template <typename T>
__global__ void layernorm_forward_kernel3(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                                          const T* bias, int N, int C) {
    __shared__ float shared[32];
    const int row = blockIdx.x;
    const T* x = inp + size_t(row) * C;
    float sum = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) sum += to_float(x[c]);
    const float m = block_sum(sum, shared) / C;
    float sq = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float d = to_float(x[c]) - m;
        sq += d * d;
    }
    const float s = rsqrtf(block_sum(sq, shared) / C + kEps);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        out[size_t(row) * C + c] = from_float<T>((to_float(x[c]) - m) * s * to_float(weight[c]) + to_float(bias[c]));
    if (threadIdx.x == 0) mean[row] = m, rstd[row] = s;
}

// ---------------------------------------------------------------------------------------------
// Version 4: one block per row, the row read once into registers with 128-bit loads.

constexpr int kV4VectorsPerThread = 4;

template <typename T>
__global__ void __launch_bounds__(1024)
    layernorm_forward_kernel4(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N,
                              int C) {
    constexpr int VS = Vec128<T>::size, K = kV4VectorsPerThread;
    __shared__ float shared[32];
    const int row = blockIdx.x, nvec = C / VS;
    const T* x = inp + size_t(row) * C;
    Vec128<T> xv[K];
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int i = k * blockDim.x + threadIdx.x;
        if (i < nvec) xv[k] = Vec128<T>::load(x + size_t(i) * VS);
    }
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++)
        if (k * blockDim.x + threadIdx.x < nvec)
#pragma unroll
            for (int j = 0; j < VS; j++) sum += to_float(xv[k][j]);
    const float m = block_sum(sum, shared) / C;
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++)
        if (k * blockDim.x + threadIdx.x < nvec)
#pragma unroll
            for (int j = 0; j < VS; j++) {
                const float d = to_float(xv[k][j]) - m;
                sq += d * d;
            }
    const float s = rsqrtf(block_sum(sq, shared) / C + kEps);
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int i = k * blockDim.x + threadIdx.x;
        if (i < nvec) {
            const Vec128<T> w = Vec128<T>::load(weight + size_t(i) * VS), b = Vec128<T>::load(bias + size_t(i) * VS);
            Vec128<T> y;
#pragma unroll
            for (int j = 0; j < VS; j++) y[j] = from_float<T>((to_float(xv[k][j]) - m) * s * to_float(w[j]) + to_float(b[j]));
            y.store(out + size_t(row) * C + size_t(i) * VS);
        }
    }
    if (threadIdx.x == 0) mean[row] = m, rstd[row] = s;
}

template <typename T> bool version4_applies(int C, std::initializer_list<const void*> ptrs) {
    constexpr int VS = Vec128<T>::size;
    if (C % VS != 0 || C / VS > 1024 * kV4VectorsPerThread) return false;
    for (const void* p : ptrs)
        if (!is_aligned16(p)) return false;
    return true;
}

// ---------------------------------------------------------------------------------------------
// Residual version 1's add kernel (vectorized where alignment allows).

template <typename T> __global__ void residual_add_kernel(T* residual, const T* a, const T* b, size_t n) {
    const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    if (i < n) residual[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

// ---------------------------------------------------------------------------------------------
// Dispatch. Returns the name of what actually ran (version 4 falls back to 3 on shapes it can't hold).

// out_ld (version 5 only; 0: C): the distance between out's rows, as train_gpt's LayerNorm outputs
// with their column of ones after the C values (matmul.cuh, matmul_backward_weight_bias).
template <typename T>
const char* run_version(int version, T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                        int N, int C, int out_ld = 0) {
    if (out_ld && version != 5) fail("out_ld is the header's (version 5) only");
    switch (version) {
        case 1:
            layernorm_forward_kernel1<T><<<(N + 127) / 128, 128>>>(out, mean, rstd, inp, weight, bias, N, C);
            break;
        case 2:
            layernorm_forward_kernel2<T><<<(N + 7) / 8, 256>>>(out, mean, rstd, inp, weight, bias, N, C);
            break;
        case 3:
            layernorm_forward_kernel3<T><<<N, 256>>>(out, mean, rstd, inp, weight, bias, N, C);
            break;
        case 4:
            if (version4_applies<T>(C, {out, inp, weight, bias})) {
                const int nvec = C / Vec128<T>::size;
                const int threads = std::min(1024, std::max(32, ((nvec + kV4VectorsPerThread - 1) / kV4VectorsPerThread + 31) / 32 * 32));
                layernorm_forward_kernel4<T><<<N, threads>>>(out, mean, rstd, inp, weight, bias, N, C);
                break;
            }
            layernorm_forward_kernel3<T><<<N, 256>>>(out, mean, rstd, inp, weight, bias, N, C);
            cuda_check_launch();
            return "v4 n/a here, ran v3";
        case 5: {
            using namespace layernorm_lab;
            const int min_block = g_min_block ? g_min_block : kForwardMinBlockOf<T>;  // the knobs pick the launcher's template arguments
            if (!g_wpr && !g_stream_loads && !g_min_block)
                layernorm_forward(out, mean, rstd, inp, weight, bias, N, C,
                                  LayerNormForwardOptions().with_out_ld(out_ld));  // the header, as training runs it
            else if (g_stream_loads && min_block == 32)
                forward_variant_launch<T, false, true, 32>(nullptr, out, mean, rstd, inp, nullptr, weight, bias, N, C, 0, g_wpr, out_ld);
            else if (g_stream_loads)
                forward_variant_launch<T, false, true, 256>(nullptr, out, mean, rstd, inp, nullptr, weight, bias, N, C, 0, g_wpr, out_ld);
            else if (min_block == 32)
                forward_variant_launch<T, false, false, 32>(nullptr, out, mean, rstd, inp, nullptr, weight, bias, N, C, 0, g_wpr, out_ld);
            else
                forward_variant_launch<T, false, false, 256>(nullptr, out, mean, rstd, inp, nullptr, weight, bias, N, C, 0, g_wpr, out_ld);
            if (g_wpr && g_wpr < forward_min_warps_per_row(C)) {
                cuda_check_launch();
                return "--wpr below the rows' need: the header's choice ran";
            }
            break;
        }
        default:
            fail("forward version %d does not exist (1..%d)", version, kNumVersions);
    }
    cuda_check_launch();
    return nullptr;
}

template <typename T>
const char* run_residual_version(int version, T* residual, T* out, float* mean, float* rstd, const T* a, const T* b,
                                 const T* weight, const T* bias, int N, int C) {
    switch (version) {
        case 1: {
            const size_t n = size_t(N) * C;
            residual_add_kernel<T><<<(unsigned)((n + 255) / 256), 256>>>(residual, a, b, n);
            cuda_check_launch();
            layernorm_forward(out, mean, rstd, residual, weight, bias, N, C);
            break;
        }
        case 2:
            fused_residual_layernorm_forward(residual, out, mean, rstd, a, b, weight, bias, N, C);
            break;
        default:
            fail("residual version %d does not exist (1..%d)", version, kNumResidualVersions);
    }
    cuda_check_launch();
    return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Tolerances.
//
// fp32 outputs: the kernel sums C values in fp32: each thread sequentially over L = C / (threads per
// row) values (rounding error grows like sqrt(L) ulps for random rounding), then a tree over the
// threads (log2 of their count). The mean's error, relative to the row's spread, is amplified by
// |mean| / std <= 3.5 for our inputs (fill_rows) before it reaches (x - mean) * rstd, and the output
// adds a few roundings more. Bound for out, mean and rstd: 8 * (sqrt(L) + log2(C) + 1) fp32 ulps
// (2^-23), absolute and relative. For the header's kernel at C = 768 that is ~1e-5; for version 1
// (L = C) at C = 65536 ~2.5e-4.
// bf16 outputs: out is rounded to bf16, so 1 bf16 ulp (2^-8 relative; half an ulp from rounding and
// up to half more where the fp32 value sits near a rounding boundary) plus the fp32 statistic error
// above. mean and rstd are fp32 in every build: the fp32 bound. The inputs are bf16 values, read
// exactly by the double reference, so they add nothing.
// residual: the contract is r = T(float(a) + float(b)) exactly; compared bit for bit (bound 0).

inline double fp32_stat_tol(int C, int threads_per_row) {
    const double L = std::ceil(double(C) / threads_per_row);
    return 8.0 * (std::sqrt(L) + std::log2(double(C)) + 1.0) * std::ldexp(1.0, -23);
}

// Threads that share one row's reduction in each version (the sequential length is C / this).
template <typename T> int threads_per_row(int version, int C, bool residual) {
    if (residual) version = 5;
    switch (version) {
        case 1: return 1;
        case 2: return 32;
        case 3: return 256;
        case 4: return 32;  // v4's blocks have at least 32 threads (fewer threads: longer sums, looser bound)
        // Header: the vector path gives a row 32..512 threads holding <= 32 columns each, the general
        // path 256 threads; C / 64 clamped to [32, 256] is never more than either.
        default: return std::max(32, std::min(256, C / 64));
    }
}

// ---------------------------------------------------------------------------------------------
// Validation of one (mode, version, dtype, shape, alignment).

struct Shape {
    int N, C;
};
const Shape kCheckShapes[] = {{1, 768},  {7, 1},     {5, 33},    {64, 768},  {33, 1000}, {16, 1600}, {300, 1024},
                              {9, 4100}, {4, 16384}, {2, 65536}, {1, 65536}, {2048, 64}, {37, 3072}};

// The header's amax option (LayerNormForwardOptions::with_amax, FP8's amax of out, fp8.cuh): the same
// call with it must write the same bits (out with what lies between its rows, mean, rstd), and the
// amax written must be the largest |out| over the N C values as stored, exactly (its float's bits).
template <typename T>
bool check_amax_option(const DeviceBuffer<T>& d_out, const DeviceBuffer<float>& d_mean, const DeviceBuffer<float>& d_rstd,
                       const DeviceBuffer<T>& d_inp, const DeviceBuffer<T>& d_w, const DeviceBuffer<T>& d_bias, int N, int C, int ld,
                       int shift) {
    DeviceBuffer<T> out(d_out.n, "out, amax option", shift);
    DeviceBuffer<float> mean(N, "mean, amax option"), rstd(N, "rstd, amax option");
    DeviceBuffer<unsigned> amax_bits(1, "amax");
    out.poison(), mean.poison(), rstd.poison();
    cuda_check(cudaMemset(amax_bits.ptr, 0, sizeof(unsigned)));
    layernorm_forward(out.ptr, mean.ptr, rstd.ptr, d_inp.ptr, d_w.ptr, d_bias.ptr, N, C,
                      LayerNormForwardOptions().with_out_ld(ld == C ? 0 : ld).with_amax(amax_bits.ptr));
    cuda_check(cudaDeviceSynchronize());
    const auto y = out.download(), y0 = d_out.download();
    const auto m = mean.download(), m0 = d_mean.download(), r = rstd.download(), r0 = d_rstd.download();
    const bool same = std::memcmp(y.data(), y0.data(), y.size() * sizeof(T)) == 0 &&
                      std::memcmp(m.data(), m0.data(), N * sizeof(float)) == 0 && std::memcmp(r.data(), r0.data(), N * sizeof(float)) == 0;
    float host = 0.0f;
    for (int row = 0; row < N; row++)
        for (int c = 0; c < C; c++) host = std::max(host, std::fabs(to_float(y0[size_t(row) * ld + c])));
    unsigned got_bits = amax_bits.download()[0];
    float got;
    memcpy(&got, &got_bits, sizeof(got));
    const bool ok = same && got == host;
    printf("  amax option: %s; amax %.9g (host, max |out| as stored: %.9g) %s\n", same ? "out, mean, rstd the same bits" : "FAIL: OUTPUTS CHANGED",
           got, host, got == host ? "exact" : "FAIL");
    return ok;
}

// strided: out rows out_ld = C + 1 rounded up to 16 bytes apart (the header only); the elements
// between rows must keep their poison (the LayerNorm writes only its C values).
// 1: passed, 0: failed, -1: another version ran in this one's place (skipped).
template <typename T> int check_one(int version, bool residual, int N, int C, int shift, uint64_t seed, bool strided = false) {
    const size_t NC = size_t(N) * C;
    const int ld = strided ? (C + Vec128<T>::size) / Vec128<T>::size * Vec128<T>::size : C;
    Rng rng(seed);
    std::vector<T> a(NC), b(NC), w(C), bias(C);
    fill_rows(a, N, C, rng);
    if (residual) fill_uniform(b, -1.0f, 1.0f, rng);
    fill_uniform(w, 0.5f, 1.5f, rng);
    fill_uniform(bias, -0.5f, 0.5f, rng);

    // Reference: LayerNorm of x = a, or of the stored residual T(float(a) + float(b)).
    std::vector<T> x(NC);
    for (size_t i = 0; i < NC; i++) x[i] = residual ? from_float<T>(to_float(a[i]) + to_float(b[i])) : a[i];
    std::vector<double> ref_out(NC), ref_mean(N), ref_rstd(N);
    layernorm_forward_reference(ref_out.data(), ref_mean.data(), ref_rstd.data(), x.data(), w.data(), bias.data(), N, C);

    DeviceBuffer<T> d_a(NC, "a", shift), d_b(NC, "b", shift), d_w(C, "weight", shift), d_bias(C, "bias", shift);
    DeviceBuffer<T> d_out(size_t(N) * ld, "out", shift), d_res(NC, "residual", shift);
    DeviceBuffer<float> d_mean(N, "mean"), d_rstd(N, "rstd");
    d_a.upload(a), d_w.upload(w), d_bias.upload(bias);
    if (residual) d_b.upload(b);
    d_out.poison(), d_res.poison(), d_mean.poison(), d_rstd.poison();

    const char* note = residual ? run_residual_version<T>(version, d_res.ptr, d_out.ptr, d_mean.ptr, d_rstd.ptr, d_a.ptr,
                                                          d_b.ptr, d_w.ptr, d_bias.ptr, N, C)
                                : run_version<T>(version, d_out.ptr, d_mean.ptr, d_rstd.ptr, d_a.ptr, d_w.ptr, d_bias.ptr, N, C,
                                                 strided ? ld : 0);
    cuda_check(cudaDeviceSynchronize());
    if (note) printf("  (%s)\n", note);
    if (fell_back(note)) return -1;

    const double tol = fp32_stat_tol(C, threads_per_row<T>(version, C, residual));
    const bool bf16 = sizeof(T) == 2;
    const double out_rtol = bf16 ? std::ldexp(1.0, -8) + tol : tol;
    bool ok = true;
    const auto out_rows = d_out.download();
    std::vector<T> out(NC);
    size_t pad_written = 0;
    for (int r = 0; r < N; r++)
        for (int c = 0; c < ld; c++) {
            const T v = out_rows[size_t(r) * ld + c];
            if (c < C) out[size_t(r) * C + c] = v;
            else {
                uint16_t bits[sizeof(T) / 2];
                memcpy(bits, &v, sizeof(T));
                for (uint16_t b : bits) pad_written += b != 0xffff;
            }
        }
    if (pad_written) printf("  FAIL: %zu elements between rows (out_ld %d) were written\n", pad_written, ld), ok = false;
    const auto mean = d_mean.download(), rstd = d_rstd.download();
    ok &= check_close("out", out.data(), ref_out.data(), NC, tol, out_rtol);
    ok &= check_close("mean (fp32)", mean.data(), ref_mean.data(), N, tol, tol);
    ok &= check_close("rstd (fp32)", rstd.data(), ref_rstd.data(), N, tol, tol);
    if (residual) {
        std::vector<double> ref_res(NC);
        for (size_t i = 0; i < NC; i++) ref_res[i] = to_double(x[i]);
        const auto res = d_res.download();
        ok &= check_close("residual (exact)", res.data(), ref_res.data(), NC, 0.0, 0.0);
    }
    if (version == kNumVersions && !residual && !g_wpr && !g_stream_loads && !g_min_block) ok &= check_amax_option(d_out, d_mean, d_rstd, d_a, d_w, d_bias, N, C, ld, shift);
    return ok;
}

// ---------------------------------------------------------------------------------------------
// Benchmark.

template <typename T> void benchmark(const std::vector<int>& versions, bool residual, int N, const std::vector<int>& Cs,
                                     double copy_gbs) {
    printf("\n%s forward benchmark, %s, N = %d (median of many runs after warm-up)\n", residual ? "fused residual" : "LayerNorm",
           dtype_name<T>(), N);
    printf("  bytes = %s\n", residual ? "2*N*C*sizeof(T) read (a, b) + 2*N*C*sizeof(T) written (residual, out) + 8*N (mean, rstd) + 2*C*sizeof(T)"
                                      : "N*C*sizeof(T) read + N*C*sizeof(T) written + 8*N (mean, rstd) + 2*C*sizeof(T) (weight, bias)");
    printf("  %-8s %-6s %-8s %10s %10s %8s\n", "version", "dtype", "C", "time (us)", "GB/s", "% copy");
    for (int C : Cs) {
        const size_t NC = size_t(N) * C;
        Rng rng(1234 + C);
        std::vector<T> h(NC), w(C), bias(C);
        fill_rows(h, N, C, rng);
        fill_uniform(w, 0.5f, 1.5f, rng);
        fill_uniform(bias, -0.5f, 0.5f, rng);
        const int out_shift = int(size_t(g_out_offset_kib) * 1024 / sizeof(T));
        DeviceBuffer<T> d_a(NC, "a"), d_out(NC, "out", out_shift), d_w(C, "weight"), d_bias(C, "bias");
        DeviceBuffer<T> d_b(residual ? NC : 1, "b"), d_res(residual ? NC : 1, "residual");
        DeviceBuffer<float> d_mean(N, "mean"), d_rstd(N, "rstd");
        d_a.upload(h), d_w.upload(w), d_bias.upload(bias);
        if (residual) d_b.upload(h);
        const double bytes = (residual ? 4.0 : 2.0) * NC * sizeof(T) + 8.0 * N + 2.0 * C * sizeof(T);
        for (int v : versions) {
            const char* note = nullptr;
            auto run = [&] {
                note = residual ? run_residual_version<T>(v, d_res.ptr, d_out.ptr, d_mean.ptr, d_rstd.ptr, d_a.ptr, d_b.ptr,
                                                          d_w.ptr, d_bias.ptr, N, C)
                                : run_version<T>(v, d_out.ptr, d_mean.ptr, d_rstd.ptr, d_a.ptr, d_w.ptr, d_bias.ptr, N, C);
            };
            // Slow versions get fewer runs: a first timing decides.
            const float first = time_median_ms(run, 1, 1);
            const float ms = first > 20.0f ? time_median_ms(run, 1, 3) : time_median_ms(run, 10, 100);
            const double gbs = bytes / (ms * 1e-3) / 1e9;
            printf("  %-8d %-6s %-8d %10.1f %10.1f %7.1f%%%s%s\n", v, dtype_name<T>(), C, ms * 1e3, gbs, 100.0 * gbs / copy_gbs,
                   note ? "  " : "", note ? note : "");
        }
        const int wpr = layernorm_detail::forward_warps_per_row<T>(C);
        if (g_floor && wpr && !residual) {  // the header's vector launch: blocks of max(32 wpr, its minimum) threads
            const int block = layernorm_detail::block_threads_of(wpr, layernorm_detail::kForwardMinBlockOf<T>);
            const int rows = block / (32 * wpr);
            print_launch_floor(dtype_name<T>(), C, bytes, (N + rows - 1) / rows, block, copy_gbs);
        }
    }
}

// ---------------------------------------------------------------------------------------------

void usage(FILE* f) {
    fprintf(f,
            "usage: layernorm_forward [versions...] [--check] [--residual] [-N rows] [-C cols] [--dtype fp32|bf16]\n"
            "  versions      which kernels to run (default: all). LayerNorm: 1..%d; with --residual: 1..%d\n"
            "  --check       validation only: every version, every shape, fp32 and bf16, both modes (CI)\n"
            "  --residual    the fused residual + LayerNorm forward instead of LayerNorm\n"
            "  -N rows       benchmark rows (default 65536)\n"
            "  -C cols       benchmark row length (default: 768 1024 1600 2048 4096)\n"
            "  --dtype T     benchmark fp32 or bf16 only (default: both)\n"
            "  --wpr W       version 5 with W warps per row (1, 2, 4, 8, 16; at least what the row needs; experiment)\n"
            "  --stream-loads  version 5 with streaming (evict-first) loads of x instead of plain ones (experiment)\n"
            "  --min-block B  version 5 with blocks of at least B threads: 32 (one row group) or 256 (experiment)\n"
            "  --out-offset K  benchmark: out starts K KiB into its allocation (address placement experiments)\n"
            "  --floor       benchmark: also time a copy of the same bytes and an empty launch of the header's shape\n"
            "  -h            this message\n",
            kNumVersions, kNumResidualVersions);
}

template <typename T> void check_all(TestCounter& tests, bool gpu, bool residual, const std::vector<int>& versions) {
    uint64_t seed = 1;
    for (int v : versions)
        for (const Shape& s : kCheckShapes)
            for (int shift : {0, 1})
                for (bool strided : {false, true}) {  // strided: out_ld, the header's only
                    if (strided && (v != kNumVersions || residual)) continue;
                    char name[160];
                    snprintf(name, sizeof(name), "forward%s v%d %s N=%d C=%d %s%s", residual ? " residual" : "", v,
                             dtype_name<T>(), s.N, s.C, shift ? "misaligned" : "aligned", strided ? " out_ld" : "");
                    seed++;
                    if (!gpu) {
                        tests.skip(name);
                        continue;
                    }
                    printf("%s\n", name);
                    tests.record(name, check_one<T>(v, residual, s.N, s.C, shift, seed, strided));
                }
}

int main(int argc, char** argv) {
    std::vector<int> versions;
    bool check = false, residual = false, fp32 = true, bf16 = true;
    int N = 65536;
    std::vector<int> Cs = {768, 1024, 1600, 2048, 4096};
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto value = [&] { return flag_value(argc, argv, i, usage); };
        if (a == "-h" || a == "--help") {
            usage(stdout);
            return 0;
        } else if (a == "--check") {
            check = true;
        } else if (a == "--residual") {
            residual = true;
        } else if (a == "-N") {
            N = parse_int(value(), "-N", 1, usage);
        } else if (a == "-C") {
            Cs = {parse_int(value(), "-C", 1, usage)};
        } else if (a == "--wpr") {
            g_wpr = parse_int(value(), "--wpr", 1, usage);
            if (g_wpr & (g_wpr - 1) || g_wpr > layernorm_detail::kForwardMaxWarpsPerRow)
                fail("--wpr must be 1, 2, 4, 8 or 16, got %d", g_wpr);
        } else if (a == "--floor") {
            g_floor = true;
        } else if (a == "--stream-loads") {
            g_stream_loads = true;
        } else if (a == "--min-block") {
            g_min_block = parse_int(value(), "--min-block", 32, usage);
            if (g_min_block != 32 && g_min_block != 256) fail("--min-block must be 32 or 256, got %d", g_min_block);
        } else if (a == "--out-offset") {
            g_out_offset_kib = parse_int(value(), "--out-offset", 0, usage);
            if (g_out_offset_kib > (1 << 20)) fail("--out-offset is at most 1048576 KiB (1 GiB), got %d", g_out_offset_kib);
        } else if (a == "--dtype") {
            bf16 = parse_dtype_is_bf16(value(), usage), fp32 = !bf16;
        } else if (!a.empty() && a[0] != '-') {
            versions.push_back(parse_int(a.c_str(), "version", 1, usage));
        } else {
            usage(stderr);
            fail("unknown flag '%s'", a.c_str());
        }
    }
    const int max_version = residual ? kNumResidualVersions : kNumVersions;
    for (int v : versions)
        if (v > max_version) fail("%sversion %d does not exist (1..%d)", residual ? "residual " : "", v, max_version);

    auto all = [](int n) {
        std::vector<int> v;
        for (int i = 1; i <= n; i++) v.push_back(i);
        return v;
    };
    const bool gpu = cuda_device_available();
    TestCounter tests;
    if (check) {
        // CI: everything, both modes and dtypes, whatever versions were named.
        for (bool res : {false, true}) {
            const auto vs = all(res ? kNumResidualVersions : kNumVersions);
            check_all<float>(tests, gpu, res, vs);
            check_all<__nv_bfloat16>(tests, gpu, res, vs);
        }
        return tests.finish();
    }
    if (!gpu) fail("no CUDA device: the benchmark needs a GPU (--check alone reports skips)");
    if (versions.empty()) versions = all(max_version);
    if (fp32) check_all<float>(tests, gpu, residual, versions);
    if (bf16) check_all<__nv_bfloat16>(tests, gpu, residual, versions);
    cudaDeviceProp prop;
    cuda_check(cudaGetDeviceProperties(&prop, 0));
    const double copy_gbs = measure_copy_bandwidth_gbs();
    printf("\ndevice: %s, %d SMs, L2 %d MB; device-to-device copy %.1f GB/s (bytes read + written)\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, copy_gbs);
    if (fp32) benchmark<float>(versions, residual, N, Cs, copy_gbs);
    if (bf16) benchmark<__nv_bfloat16>(versions, residual, N, Cs, copy_gbs);
    return tests.finish();
}
