// matmul.cuh: the linear layers (cuBLASLt / cuBLAS) and the tanh-GELU between them.
//
//   matmul_forward   out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC)
//                    with pre_gelu: pre_gelu (N, OC) = that, out = gelu(pre_gelu)   (GELU fused)
//                    with residual (N, OC): out = that + residual                   (residual add fused)
//   matmul_backward  dinp (N, C) = dout (N, OC) @ weight            (overwritten)
//                    with pre_gelu (N, C): dinp = (dout @ weight) * gelu'(pre_gelu)   (GELU backward fused)
//                    dweight (OC, C) += dout^T @ inp                  (accumulated)
//                    dbias (OC) += column sums of dout                (accumulated)
//   matmul_backward_weight_bias  dweight and dbias in one GEMM, from an inp with a column of ones
//   gelu_forward / gelu_backward_inplace: GPT-2's tanh approximation, as separate kernels.
//
// Non-obvious choices:
//   - cuBLAS is column-major: a row-major (R, K) tensor is a column-major (K, R) matrix. So `out`
//     (N, OC) row-major is the column-major (OC, N) product op(A) B with A = weight as stored, a
//     (C, OC) matrix used transposed, and B = inp as stored, a (C, N) matrix. The backward's dinp
//     (N, C) is the column-major (C, N) product A B with A = weight as stored, a (C, OC) matrix, and
//     B = dout, an (OC, N) matrix.
//   - The forward adds the bias in the cuBLASLt epilogue (no extra pass over `out`); the backward's
//     dinp goes through cuBLASLt too. When cuBLASLt offers no algorithm for a shape/alignment, or
//     refuses the one it offered, or a leading dimension is not whole 16-byte vectors (see
//     matmul_plan), a plain cublasGemmEx plus a bias kernel (plus the GELU kernels where GELU was to
//     be fused): the same result, unfused. dweight (D += in place, beta = 1) goes through cuBLASLt
//     as well, tuned like the rest (the tuner puts D back before every candidate's run).
//   - Each cuBLASLt plan is tuned on its first call (matmul_tune): the fastest of the heuristic's
//     candidates (up to 16 asked) among those
//     whose output is bit for bit its first choice's. So the choice costs nothing in determinism.
//     With tune_wide (train_gpt -tw 1) the candidates also include the configurations around the
//     heuristic's (matmul_config_space), screened within a time budget per plan, same rule.
//     cuBLASLt's bias-gradient epilogues (BGRADB on dweight's GEMM, DGELU_BGRAD on fcproj's dinp)
//     exist for our layouts but ran slower than the GEMM plus the matrix-vector dbias (lab, H100),
//     so they are not used.
//   - Residual fusion (attproj and fcproj in train_gpt): the residual stream's add rides in the GEMM
//     as cuBLASLt's C operand (D = A B + bias + beta C, beta = 1, C laid out as D), so the training
//     step writes residual2 / residual3 straight from the GEMM and the next LayerNorm is the plain
//     one (reads 1 tensor, writes 1) instead of the fused residual + LayerNorm (reads 2, writes 2):
//     one (N, C) pass less per LayerNorm, 24 a step at d12, for the GEMM's read of C in its epilogue.
//     Numerics: the sum is fp32 (accumulator + bias + residual; the order of those two adds inside
//     the epilogue is cuBLASLt's, undocumented) rounded once to T. The plain path copies the
//     residual into out and runs the GEMM with beta = 1, then the bias kernel: fp32 accumulator +
//     residual rounded to T, then + bias rounded again (as its bias always was). out must not
//     overlap the residual: the first call's tuning reruns the matmul, which is idempotent only
//     while C and D are apart (in place, each run would add C again). GELU fusion and a residual in
//     one call are not supported (fail()): no layer of GPT-2 needs both.
//   - GELU fusion (train_gpt -ge): the MLP's fc matmul writes gelu(x W^T + b) as its output and the
//     pre-activation as cuBLASLt's auxiliary output (CUBLASLT_EPILOGUE_GELU_AUX_BIAS), and the
//     fcproj backward's dinp matmul multiplies by gelu'(pre-activation) read from the auxiliary input
//     (CUBLASLT_EPILOGUE_DGELU): one pass over a (B, T, 4C) tensor less each way. Which GELU:
//     NVIDIA's documentation and cublasLt.h (CUDA 13.0) say only "GELU", no formula. It is the tanh
//     approximation GPT-2 uses by the account of the libraries that depend on it: PyTorch's
//     addmm_out_cuda_impl (aten/src/ATen/native/cuda/Blas.cpp) applies at::gelu_(result, "tanh")
//     where it cannot use the epilogue; XLA's GemmRewriter (xla/service/gpu/gemm_rewriter.cc,
//     FuseGeluActivation) fuses only the pattern 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//     into it; llm.c offers it for GPT-2 (its -ge flag, off by default there). As that is not NVIDIA's
//     word, test_gpt probes both epilogues on the GPU against both formulas (test_gpt.cu,
//     probe_gelu_epilogues: in the negative tail they differ by many units in the last place).
//     Auxiliary-buffer rules (cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD): the leading
//     dimension, here the row length (OC forward, C backward), must be a multiple of 8; we also ask
//     for a 16-byte aligned buffer, and the heuristic sees its pointer (it checks its alignment).
//     Otherwise the unfused path.
//   - fp32 builds compute in true fp32 (CUBLAS_COMPUTE_32F, no TF32), so they match PyTorch with TF32
//     off to ~1e-6; bf16 builds take bf16 inputs with fp32 accumulation. A fused GELU is computed from
//     the fp32 pre-activation before it is rounded to bf16, the unfused kernel from the rounded one:
//     the two differ by bf16 rounding, not by formula.
//   - dbias: given an inp that carries a column of ones after its C values (train_gpt's LayerNorm
//     outputs), the weight gradient's GEMM over that column computes it too
//     (matmul_backward_weight_bias: dout read once for both). Otherwise (matmul_backward) a
//     matrix-vector product with a vector of ones (cuBLAS, beta = 1): accumulates, deterministic,
//     and reads dout once more.
//   - cuBLAS results are bitwise reproducible run to run on the same GPU model and stream (its
//     documented guarantee; epilogues included), which the deterministic training relies on.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common.cuh"

inline void cublas_check_impl(cublasStatus_t status, const char* expr, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: status %d (%s) at %s:%d", (int)status, expr, file, line);
}
#define cublas_check(expr) cublas_check_impl((expr), #expr, __FILE__, __LINE__)

template <typename T> constexpr cudaDataType_t cuda_data_type();
template <> constexpr cudaDataType_t cuda_data_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType_t cuda_data_type<__nv_bfloat16>() { return CUDA_R_16BF; }

// Algorithms the heuristic is asked for per plan (the tuning's candidates), and timed runs of each.
constexpr int kMatmulTuneCandidates = 16, kMatmulTuneReps = 5;

// A stream that runs matmuls, with its own cuBLAS handle and workspace. Matmuls on two streams run
// at once (train_gpt's weight gradients, -ov), and two kernels must never share a workspace; one
// stream's matmuls run one after another, so its cuBLAS and cuBLASLt calls share one.
struct BlasStream {
    cudaStream_t stream = nullptr;
    cublasHandle_t handle = nullptr;
    void* workspace = nullptr;
};

template <typename T> struct OnesVector {
    T* ptr = nullptr;
    size_t count = 0;
};

// One set of handles per process, made by blas_init() before the first matmul.
struct BlasContext {
    cublasHandle_t handle = nullptr;  // the default stream's (streams[0])
    cublasLtHandle_t lt = nullptr;
    void* workspace = nullptr;        // the default stream's
    size_t workspace_bytes = size_t(32) << 20;  // cuBLASLt's recommendation for Hopper
    std::vector<BlasStream> streams;  // the default stream first, then any other that ran a matmul
    // Vectors of ones for dbias (matmul_backward's matrix-vector product), one per precision: blas_init
    // makes floatX's; a program that runs matmul_backward in the other precision too makes that one
    // with blas_init_ones.
    OnesVector<float> ones_f32;
    OnesVector<__nv_bfloat16> ones_bf16;
    // Matmuls asked to fuse GELU (forward or backward): how many ran in a cuBLASLt epilogue, how
    // many took the unfused path (no algorithm for the shape/alignment). Reported by the programs.
    size_t gelu_fused = 0, gelu_unfused = 0;
    // Algorithm tuning (matmul_tune): plans tuned, and how many of them kept an algorithm other than
    // the heuristic's first choice. hash: one device word for it.
    size_t tuned_plans = 0, tuned_changed = 0;
    unsigned long long* hash = nullptr;
    // tune_wide: each plan's candidates also include the configurations around the heuristic's
    // (matmul_config_space, at most tune_wide_max), screened for tune_wide_seconds at most per plan.
    // tune_print: one line per plan as it is tuned (what was tried, what it kept), for the lab and
    // train_gpt -tw.
    bool tune_wide = false, tune_print = false;
    bool tune = true;  // false: plans made now keep the heuristic's first choice until a call with tune on
    size_t tune_wide_max = 3000;
    double tune_wide_seconds = 3.0;
};
inline BlasContext& blas() {
    static BlasContext ctx;
    return ctx;
}
// The handle and workspace of `stream`, made on its first matmul. The stream is bound to the handle
// once: cublasSetStream also resets the handle's workspace to cuBLAS's own pool (cuBLAS
// documentation), so it is followed by cublasSetWorkspace here and not called per matmul.
inline const BlasStream& blas_stream(cudaStream_t stream) {
    BlasContext& b = blas();
    for (const BlasStream& s : b.streams)
        if (s.stream == stream) return s;
    BlasStream s;
    s.stream = stream;
    cublas_check(cublasCreate(&s.handle));
    cublas_check(cublasSetMathMode(s.handle, CUBLAS_DEFAULT_MATH));  // no TF32 for fp32 inputs
    cublas_check(cublasSetStream(s.handle, stream));
    s.workspace = device_malloc(b.workspace_bytes, "cuBLAS workspace");
    cublas_check(cublasSetWorkspace(s.handle, s.workspace, b.workspace_bytes));
    b.streams.push_back(s);
    return b.streams.back();
}

template <typename T> OnesVector<T>& blas_ones_vector();
template <> inline OnesVector<float>& blas_ones_vector<float>() { return blas().ones_f32; }
template <> inline OnesVector<__nv_bfloat16>& blas_ones_vector<__nv_bfloat16>() { return blas().ones_bf16; }

template <typename T> __global__ void fill_ones_kernel(T* x, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        x[i] = from_float<T>(1.0f);
}

// max_rows ones of T: at least the rows of any matmul_backward<T> with a dbias.
template <typename T> void blas_init_ones(size_t max_rows) {
    OnesVector<T>& ones = blas_ones_vector<T>();
    if (ones.ptr) cuda_check(cudaFree(ones.ptr));
    ones.count = std::max<size_t>(max_rows, 1);
    ones.ptr = static_cast<T*>(device_malloc(ones.count * sizeof(T), "matmul ones vector"));
    fill_ones_kernel<T><<<256, 256>>>(ones.ptr, ones.count);
    cuda_check_launch();
}

// The ones of T for a product over `rows` rows.
template <typename T> const T* blas_ones(size_t rows) {
    const OnesVector<T>& ones = blas_ones_vector<T>();
    if (rows > ones.count) fail("matmul: %zu rows, the %s ones vector holds %zu", rows, sizeof(T) == 4 ? "fp32" : "bf16", ones.count);
    return ones.ptr;
}

// max_rows: the largest N any matmul_backward will see (sizes floatX's ones vector).
inline void blas_init(size_t max_rows) {
    BlasContext& b = blas();
    cublas_check(cublasLtCreate(&b.lt));
    const BlasStream& main = blas_stream(0);
    b.handle = main.handle, b.workspace = main.workspace;
    b.hash = static_cast<unsigned long long*>(device_malloc(sizeof(unsigned long long), "matmul tuning hash"));
    blas_init_ones<floatX>(max_rows);
}

inline void blas_destroy() {
    BlasContext& b = blas();
    for (BlasStream& s : b.streams) {
        cublas_check(cublasDestroy(s.handle));
        cuda_check(cudaFree(s.workspace));
    }
    if (b.lt) cublas_check(cublasLtDestroy(b.lt));
    if (b.hash) cuda_check(cudaFree(b.hash));
    if (b.ones_f32.ptr) cuda_check(cudaFree(b.ones_f32.ptr));
    if (b.ones_bf16.ptr) cuda_check(cudaFree(b.ones_bf16.ptr));
    b = BlasContext();
}

// ---------------------------------------------------------------------------------------------
// GELU, tanh approximation: gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

__device__ __forceinline__ float gelu_tanh(float x) {
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_tanh_grad(float x) {
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    const float th = tanhf(u), sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
}
// The values the GELU kernels store, rounded to T: GELU(x), and GELU's backward d GELU'(x) (d the
// gradient of GELU's output). FP8's casts (fp8.cuh) make theirs with these, so that their bytes are
// those of these kernels' outputs cast.
template <typename T> __device__ __forceinline__ T gelu_value(T x) { return from_float<T>(gelu_tanh(to_float(x))); }
template <typename T> __device__ __forceinline__ T gelu_backward_value(T d, T x) {
    return from_float<T>(to_float(d) * gelu_tanh_grad(to_float(x)));
}

template <typename T, int VS> __global__ void gelu_forward_kernel(T* out, const T* inp, size_t n) {
    for (size_t i = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * VS; i < n; i += size_t(gridDim.x) * blockDim.x * VS) {
        if constexpr (VS == 1) {
            out[i] = gelu_value(inp[i]);
        } else {
            const Vec128<T> x = Vec128<T>::load(inp + i);
            Vec128<T> y;
#pragma unroll
            for (int j = 0; j < VS; j++) y[j] = gelu_value(x[j]);
            y.store(out + i);
        }
    }
}

template <typename T, int VS> __global__ void gelu_backward_kernel(T* d, const T* inp, size_t n) {
    for (size_t i = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * VS; i < n; i += size_t(gridDim.x) * blockDim.x * VS) {
        if constexpr (VS == 1) {
            d[i] = gelu_backward_value(d[i], inp[i]);
        } else {
            const Vec128<T> x = Vec128<T>::load(inp + i);
            Vec128<T> g = Vec128<T>::load(d + i);
#pragma unroll
            for (int j = 0; j < VS; j++) g[j] = gelu_backward_value(g[j], x[j]);
            g.store(d + i);
        }
    }
}

inline int elementwise_blocks(size_t work, int threads = 256) {
    return (int)std::max<size_t>(1, std::min<size_t>((work + threads - 1) / threads, 132 * 16));
}

// The GELU kernels' two instances: 128-bit vectors where n and both pointers allow, else one value a
// thread. Calls launch(vs, blocks), vs as std::integral_constant, for the instance that fits.
template <typename T, typename Launch> void gelu_launch(size_t n, bool aligned16, Launch&& launch) {
    constexpr int VS = Vec128<T>::size;
    const bool vec = n % VS == 0 && aligned16;
    const int blocks = elementwise_blocks(vec ? n / VS : n);
    if (vec) launch(std::integral_constant<int, VS>(), blocks);
    else launch(std::integral_constant<int, 1>(), blocks);
    cuda_check_launch();
}

// out = gelu(inp), n values.
template <typename T> void gelu_forward(T* out, const T* inp, size_t n, cudaStream_t stream = 0) {
    gelu_launch<T>(n, is_aligned16(out) && is_aligned16(inp), [&](auto vs, int blocks) {
        gelu_forward_kernel<T, decltype(vs)::value><<<blocks, 256, 0, stream>>>(out, inp, n);
    });
}

// d = d * gelu'(inp), in place: d holds dL/d(gelu output) on entry, dL/d(inp) on exit.
template <typename T> void gelu_backward_inplace(T* d, const T* inp, size_t n, cudaStream_t stream = 0) {
    gelu_launch<T>(n, is_aligned16(d) && is_aligned16(inp), [&](auto vs, int blocks) {
        gelu_backward_kernel<T, decltype(vs)::value><<<blocks, 256, 0, stream>>>(d, inp, n);
    });
}

// ---------------------------------------------------------------------------------------------
// Matmuls.

template <typename T> __global__ void add_bias_kernel(T* out, const T* bias, size_t N, int OC) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < N * OC; i += size_t(gridDim.x) * blockDim.x)
        out[i] = from_float<T>(to_float(out[i]) + to_float(bias[i % OC]));
}

// C (m, n) = alpha * op(A) op(B) + beta * C, column-major, plain cuBLAS (fp32 accumulation).
template <typename T>
void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const T* A, int lda, const T* B,
          int ldb, float beta, T* C, int ldc, cudaStream_t stream) {
    cublas_check(cublasGemmEx(blas_stream(stream).handle, ta, tb, m, n, k, &alpha, A, cuda_data_type<T>(), lda, B, cuda_data_type<T>(),
                              ldb, &beta, C, cuda_data_type<T>(), ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Largest power of two (up to 256) dividing the address: cuBLASLt's kernels need their operands
// aligned as they assume, and per-layer slices of odd-sized models (C = 39, say) are not.
inline int pointer_alignment(const void* p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    int align = 256;
    while (align > 1 && a % align != 0) align /= 2;
    return align;
}

// What the cuBLASLt epilogue does after D = op(A) B (+ C, where the call gives a residual C):
//   plain: nothing; bias: D += bias (per row of the column-major D);
//   gelu:  aux = D (+ bias), D = gelu(aux)   (GELU_AUX / GELU_AUX_BIAS: aux keeps the pre-activation);
//   dgelu: D *= gelu'(aux)                   (aux: the forward's pre-activation, an input).
enum class MatmulEpilogue { plain, bias, gelu, dgelu };

// A cuBLASLt plan for one shape, epilogue, residual or not and set of alignments: descriptors and the
// algorithm, made once (the heuristic query costs tens of microseconds of CPU, every layer of every
// step otherwise). With a residual, C shares D's layout descriptor.
// has_algo = false: this case takes the plain cuBLAS path. tuned: the algorithm was chosen by timing.
struct MatmulPlan {
    bool made = false, tuned = false;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo;
    bool has_algo = false;
    std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's list, first choice first (until tuned),
    size_t heuristic_count = 0;                    // then, with tune_wide, the rest of the configuration space
    int m = 0, n = 0, k = 0;                       // for the tuning log
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
};

// What an algorithm is, in cuBLASLt's own words (its configuration attributes).
inline std::string matmul_algo_name(const cublasLtMatmulAlgo_t& algo) {
    int32_t id = 0, splitk = 0;
    uint32_t tile = 0, stages = 0, reduction = 0, swizzle = 0, custom = 0;
    uint16_t cluster = 0;
    size_t w = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction, sizeof(reduction), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof(swizzle), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof(custom), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster), &w);
    char buf[128];
    snprintf(buf, sizeof(buf), "id %d tile %u stages %u splitk %d red %u swz %u cust %u cluster %u", id, tile, stages,
             splitk, reduction, swizzle, custom, (unsigned)cluster);
    return buf;
}

// The configurations around the heuristic's list (tune_wide). On the H100 its candidates for a GPT-2
// shape differ in tile, cluster shape and custom option (cuBLASLt's undocumented per-kernel knob) and
// are ranked by a model of the GPU, not by measurement (dev/cuda/matmul.cu, version 3). For each of
// them, in its order: (1) its tile and stages with every custom option, cluster shape up to 4 CTAs
// and CTA swizzle; (2) every tile its algorithm lists, with its stages, custom option and cluster,
// both swizzles. Each keeps its seed's split-K and reduction scheme: the heuristic's first choice sums
// K in one order (split-K 1) for every forward and dinp, in 2 to 5 parts for the layers' dweight, and
// only candidates that sum as it does can give its bits, the only ones kept. Kept where
// cublasLtMatmulAlgoCheck accepts the configuration for this plan within the workspace and it is not
// listed already; at most max_count in all.
inline void matmul_config_space(std::vector<cublasLtMatmulAlgo_t>& out, cublasLtMatmulDesc_t desc,
                                cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d,
                                size_t max_count) {
    BlasContext& bc = blas();
    const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                                 CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1, CUBLASLT_CLUSTER_SHAPE_4x1x1,
                                 CUBLASLT_CLUSTER_SHAPE_1x4x1};
    auto add = [&](cublasLtMatmulAlgo_t c, uint32_t tile, uint32_t custom, uint16_t cluster, uint32_t swizzle) {
        if (out.size() >= max_count) return;
        if (cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile)) ||
            cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof(swizzle)) ||
            cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof(custom)) ||
            cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster)))
            return;
        cublasLtMatmulHeuristicResult_t r;
        if (cublasLtMatmulAlgoCheck(bc.lt, desc, a, b, d, d, &c, &r) != CUBLAS_STATUS_SUCCESS || r.workspaceSize > bc.workspace_bytes)
            return;
        for (const cublasLtMatmulAlgo_t& y : out)
            if (std::memcmp(&c, &y, sizeof(c)) == 0) return;
        out.push_back(c);
    };
    const std::vector<cublasLtMatmulAlgo_t> seeds = out;
    for (int ring = 1; ring <= 2; ring++)
        for (const cublasLtMatmulAlgo_t& seed : seeds) {
            uint32_t tile = 0, custom = 0, swizzle_support = 0;
            uint16_t cluster = 0;
            int32_t custom_max = 0;
            size_t w = 0;
            cublasLtMatmulAlgoConfigGetAttribute(&seed, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &w);
            cublasLtMatmulAlgoConfigGetAttribute(&seed, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof(custom), &w);
            cublasLtMatmulAlgoConfigGetAttribute(&seed, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster), &w);
            cublasLtMatmulAlgoCapGetAttribute(&seed, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swizzle_support,
                                              sizeof(swizzle_support), &w);
            cublasLtMatmulAlgoCapGetAttribute(&seed, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max, sizeof(custom_max), &w);
            const uint32_t swizzles = swizzle_support ? 2 : 1;
            if (ring == 1) {
                for (uint32_t o = 0; o <= (uint32_t)std::max(0, std::min(custom_max, 63)); o++)
                    for (uint16_t cl : clusters)
                        for (uint32_t sw = 0; sw < swizzles; sw++) add(seed, tile, o, cl, sw);
            } else {
                size_t bytes = 0;
                std::vector<uint32_t> tiles;
                if (cublasLtMatmulAlgoCapGetAttribute(&seed, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &bytes) ==
                        CUBLAS_STATUS_SUCCESS && bytes > 0) {
                    tiles.resize(bytes / sizeof(uint32_t));
                    if (cublasLtMatmulAlgoCapGetAttribute(&seed, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(),
                                                          tiles.size() * sizeof(uint32_t), &bytes) != CUBLAS_STATUS_SUCCESS)
                        tiles.clear();
                }
                for (uint32_t t : tiles)
                    for (uint32_t sw = 0; sw < swizzles; sw++) add(seed, t, custom, cluster, sw);
            }
        }
}

// The heuristic's candidates for a plan whose descriptor and layouts are made (C's layout is D's):
// asked with the workspace and the operands' alignments in bytes, first choice first, into
// plan.candidates; plan.algo is the first choice (has_algo: there was one). The bf16 and FP8 plans
// (fp8.cuh) share it.
inline void matmul_plan_candidates(MatmulPlan& plan, int m, int n, int k, cublasLtEpilogue_t epilogue, int align_a, int align_b,
                                   int align_c, int align_d) {
    BlasContext& b = blas();
    cublasLtMatmulPreference_t pref;
    cublas_check(cublasLtMatmulPreferenceCreate(&pref));
    cublas_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &b.workspace_bytes,
                                                      sizeof(b.workspace_bytes)));
    const uint32_t aligns[4] = {(uint32_t)align_a, (uint32_t)align_b, (uint32_t)align_c, (uint32_t)align_d};
    const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        cublas_check(cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &aligns[i], sizeof(aligns[i])));
    cublasLtMatmulHeuristicResult_t heuristic[kMatmulTuneCandidates];
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(b.lt, plan.desc, plan.a, plan.b, plan.d, plan.d, pref, kMatmulTuneCandidates,
                                       heuristic, &found) != CUBLAS_STATUS_SUCCESS)
        found = 0;
    cublas_check(cublasLtMatmulPreferenceDestroy(pref));
    for (int i = 0; i < found; i++) plan.candidates.push_back(heuristic[i].algo);
    plan.heuristic_count = plan.candidates.size();
    plan.m = m, plan.n = n, plan.k = k, plan.epilogue = epilogue;
    if (found > 0) plan.algo = heuristic[0].algo, plan.has_algo = true;
}

// Column-major D (m, n) = op(A) op(B) (+ C), op(A) = A^T (A stored (k, m), ld k) or A (stored (m, k), ld m);
// op(B) = B (stored (k, n), ld ldb, default k) or B^T (stored (n, k), ld n); C (optional: apart from D,
// or D itself for D += op(A) op(B)), D and aux stored (m, n), ld m. A, B, aux and bias are T; C and D
// are TD (fp32 D from bf16 A and B: the weight gradient with its bias, matmul_backward_weight_bias).
template <typename T, typename TD = T>
MatmulPlan& matmul_plan(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, MatmulEpilogue ep, const void* A,
                        const void* B, const void* D, const void* bias, const void* aux, const void* C, int ldb = 0) {
    if (ldb == 0) ldb = tb == CUBLAS_OP_T ? n : k;
    const int align_a = pointer_alignment(A), align_b = pointer_alignment(B), align_d = pointer_alignment(D);
    const int align_bias = bias ? pointer_alignment(bias) : 0, align_aux = aux ? pointer_alignment(aux) : 0;
    const int align_c = C ? pointer_alignment(C) : 0;  // 0: no C, its own plan (beta = 0)
    const int in_place = C == D;
    static std::map<std::tuple<int, int, int, int, int, int, int, int, int, int, int, int, int, int, int>, MatmulPlan> plans;
    MatmulPlan& plan = plans[std::make_tuple((int)ta, (int)tb, m, n, k, (int)ep, align_a, align_b, align_d, align_bias,
                                             align_aux, align_c, in_place, ldb, (int)sizeof(TD))];
    if (plan.made) return plan;
    plan.made = true;
    const bool uses_aux = ep == MatmulEpilogue::gelu || ep == MatmulEpilogue::dgelu;
    if (uses_aux && (m % 8 != 0 || align_aux < 16)) return plan;  // the auxiliary buffer's rules: unfused path
    // Leading dimensions (m and k) of whole 16-byte vectors only: at others some of the heuristic's
    // own candidates, its first choice among them for GELU', return wrong results (the lab's
    // validation, k = 50 in bf16: errors of tens of bounds). Those shapes take plain cuBLAS.
    const int per_vector = 16 / int(sizeof(T));
    if (m % per_vector != 0 || k % per_vector != 0 || ldb % per_vector != 0) return plan;
    BlasContext& b = blas();
    const cudaDataType_t type = cuda_data_type<T>();
    cublas_check(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    if (ep == MatmulEpilogue::bias) epilogue = CUBLASLT_EPILOGUE_BIAS;
    if (ep == MatmulEpilogue::gelu) epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    if (ep == MatmulEpilogue::dgelu) epilogue = CUBLASLT_EPILOGUE_DGELU;
    cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    // The heuristic looks at the bias and aux pointers (their alignment): show it the ones of this call.
    if (bias) cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    if (uses_aux) {
        const int64_t aux_ld = m;
        cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
        cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    }
    if (ta == CUBLAS_OP_T) cublas_check(cublasLtMatrixLayoutCreate(&plan.a, type, k, m, k));
    else cublas_check(cublasLtMatrixLayoutCreate(&plan.a, type, m, k, m));
    if (tb == CUBLAS_OP_T) cublas_check(cublasLtMatrixLayoutCreate(&plan.b, type, n, k, ldb));
    else cublas_check(cublasLtMatrixLayoutCreate(&plan.b, type, k, n, ldb));
    cublas_check(cublasLtMatrixLayoutCreate(&plan.d, cuda_data_type<TD>(), m, n, m));
    matmul_plan_candidates(plan, m, n, k, epilogue, align_a, align_b, C ? align_c : align_d, align_d);
    if (plan.has_algo && b.tune_wide)
        matmul_config_space(plan.candidates, plan.desc, plan.a, plan.b, plan.d, b.tune_wide_max);
    return plan;
}

// ---------------------------------------------------------------------------------------------
// Tuning. cuBLASLt's first choice is often not its fastest kernel for our shapes (dev/cuda/matmul.cu
// measures each; docs/matmul.md). So on a plan's first call every candidate runs on
// that call's own operands, and the fastest one whose output (and auxiliary output) is bit for bit
// the first choice's is kept. Kernels that sum K in the same order give the same bits whatever
// their tiles and clusters (the lab shows it: all of split-K 1 agree); a candidate that differs
// (split-K) is never kept. So the training is as deterministic as with the first choice alone, and
// its losses are the same bits, whichever candidate timing noise favours. One-time cost per shape:
// a few ms to ~1 s (the LM head), and host synchronisations on that first call only.

// Order-independent 64-bit hash of n elements' bits (a sum of per-element mixes, mod 2^64: the
// same bits give the same hash whatever the block order).
__device__ __forceinline__ unsigned long long hash_mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
template <typename W> __global__ void hash_bits_kernel(unsigned long long* out, const W* x, size_t n) {
    unsigned long long h = 0;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        h += hash_mix64((unsigned long long)x[i] ^ (i * 0x9e3779b97f4a7c15ull));
    for (int o = 16; o > 0; o >>= 1) h += __shfl_xor_sync(0xffffffffu, h, o);
    if (threadIdx.x % 32 == 0) atomicAdd(out, h);
}
template <typename T> unsigned long long hash_bits(const T* x, size_t n, cudaStream_t stream) {
    using W = std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>;
    BlasContext& b = blas();
    cuda_check(cudaMemsetAsync(b.hash, 0, sizeof(unsigned long long), stream));
    hash_bits_kernel<W><<<elementwise_blocks(n), 256, 0, stream>>>(b.hash, reinterpret_cast<const W*>(x), n);
    cuda_check_launch();
    unsigned long long h = 0;
    cuda_check(cudaMemcpyAsync(&h, b.hash, sizeof(h), cudaMemcpyDeviceToHost, stream));
    cuda_check(cudaStreamSynchronize(stream));
    return h;
}

// run_once(algo) enqueues the plan's matmul with that algorithm and returns false if cuBLASLt refuses
// it. Every run writes D (m x n) and, for the gelu epilogue, aux, from the same start: with beta = 0,
// or beta = 1 and a residual C apart from D, runs are idempotent; with in_place (D += ..., C is D) D is
// saved first and put back before every run and at the end. The caller then runs the kept algorithm
// once, as a plain call. Two rounds. First each candidate runs once (a warm-up: a kernel's first launch may load its
// module) and once timed; its output is then compared with #0's if it could be kept: the heuristic's
// own candidates always, the others (tune_wide) while they are faster than the kMatmulTuneFinalists-th
// fastest kept so far, and only until tune_wide_seconds have passed. Then the heuristic's candidates
// and the kMatmulTuneFinalists fastest others with #0's bits are timed kMatmulTuneReps times each,
// and the lowest median wins. Timing noise can change which candidate wins, never the bits.
constexpr int kMatmulTuneFinalists = 8;
template <typename TD, typename TA, typename Run>
void matmul_tune(MatmulPlan& plan, Run run_once, TD* D, const TA* aux_out, size_t elements, cudaStream_t stream,
                 bool in_place) {
    plan.tuned = true;
    if (plan.candidates.size() < 2) return;
    // Alone on the GPU: work queued on another stream (train_gpt's weight stream) would skew the times.
    cuda_check(cudaDeviceSynchronize());
    TD* saved = in_place ? static_cast<TD*>(device_malloc(elements * sizeof(TD), "matmul tuning's copy of D")) : nullptr;
    if (saved) cuda_check(cudaMemcpyAsync(saved, D, elements * sizeof(TD), cudaMemcpyDeviceToDevice, stream));
    auto restore = [&] {
        if (saved) cuda_check(cudaMemcpyAsync(D, saved, elements * sizeof(TD), cudaMemcpyDeviceToDevice, stream));
    };
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
        restore();
        return run_once(algo);
    };
    auto finish = [&] {
        restore();
        if (saved) {
            cuda_check(cudaStreamSynchronize(stream));
            cuda_check(cudaFree(saved));
        }
    };
    if (!run(plan.candidates[0])) return finish();  // the caller finds the refusal on its own call
    const unsigned long long want = hash_bits(D, elements, stream), want_aux = aux_out ? hash_bits(aux_out, elements, stream) : 0;
    BlasContext& bc = blas();
    cudaEvent_t start, stop;
    cuda_check(cudaEventCreate(&start));
    cuda_check(cudaEventCreate(&stop));
    auto time_once = [&](const cublasLtMatmulAlgo_t& algo) {
        float ms = 0.0f;
        restore();
        cuda_check(cudaEventRecord(start, stream));
        run_once(algo);
        cuda_check(cudaEventRecord(stop, stream));
        cuda_check(cudaEventSynchronize(stop));
        cuda_check(cudaEventElapsedTime(&ms, start, stop));
        return ms;
    };
    const auto began = std::chrono::steady_clock::now();
    std::vector<std::pair<float, size_t>> kept;  // (one run's ms, candidate) with #0's bits
    std::vector<float> others_ms;                // those of them not the heuristic's, fastest first
    size_t refused = 0, other_bits = 0, unscreened = 0, slower = 0;
    for (size_t i = 0; i < plan.candidates.size(); i++) {
        const bool heuristic = i < plan.heuristic_count;
        if (!heuristic && std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count() > bc.tune_wide_seconds) {
            unscreened = plan.candidates.size() - i;
            break;
        }
        if (!run(plan.candidates[i])) {
            refused++;
            continue;
        }
        const float ms = time_once(plan.candidates[i]);  // D (and aux) now hold this candidate's output
        if (!heuristic && others_ms.size() >= (size_t)kMatmulTuneFinalists && ms >= others_ms[kMatmulTuneFinalists - 1]) {
            slower++;
            continue;
        }
        if (hash_bits(D, elements, stream) != want || (aux_out && hash_bits(aux_out, elements, stream) != want_aux)) {
            other_bits++;
            continue;
        }
        kept.push_back({ms, i});
        if (!heuristic) others_ms.insert(std::upper_bound(others_ms.begin(), others_ms.end(), ms), ms);
    }
    std::sort(kept.begin(), kept.end());
    float best_ms = INFINITY, first_ms = NAN, best_heuristic_ms = INFINITY;
    size_t best = 0, others = 0;
    for (const auto& [screen_ms, i] : kept) {
        const bool heuristic = i < plan.heuristic_count;
        if (!heuristic && others++ >= (size_t)kMatmulTuneFinalists) continue;
        float ms[kMatmulTuneReps];
        for (int r = 0; r < kMatmulTuneReps; r++) ms[r] = time_once(plan.candidates[i]);
        std::sort(ms, ms + kMatmulTuneReps);
        const float median = ms[kMatmulTuneReps / 2];
        if (i == 0) first_ms = median;
        if (heuristic) best_heuristic_ms = std::min(best_heuristic_ms, median);
        if (median < best_ms) best_ms = median, best = i;
    }
    cuda_check(cudaEventDestroy(start));
    cuda_check(cudaEventDestroy(stop));
    if (bc.tune_print)
        printf("matmul tuned m %d n %d k %d epilogue %d%s: %zu candidates (%zu the heuristic's): %zu refused, %zu other "
               "bits, %zu slower than %d kept, %zu not screened (%.1f s) | #0 %.4f ms, best of the heuristic's %.4f ms, kept "
               "#%zu %.4f ms (%s)\n",
               plan.m, plan.n, plan.k, (int)plan.epilogue, in_place ? " (D +=)" : "", plan.candidates.size(),
               plan.heuristic_count, refused, other_bits, slower, kMatmulTuneFinalists, unscreened,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count(), first_ms, best_heuristic_ms,
               best, best_ms, matmul_algo_name(plan.candidates[best]).c_str());
    plan.algo = plan.candidates[best];
    plan.candidates.clear();
    bc.tuned_plans++;
    if (best != 0) bc.tuned_changed++;
    finish();
}

// D = op(A) op(B) (+ C) with the epilogue, through cuBLASLt: beta = 0 without C (D is overwritten),
// beta = 1 with C, which is either apart from D (the residual) or D itself (D +=, the weight
// gradients). False when cuBLASLt has no algorithm for this case or refuses it (then never tried
// again): the caller takes the plain path.
template <typename T, typename TD = T>
bool matmul_lt(cublasOperation_t ta, int m, int n, int k, MatmulEpilogue ep, const T* A, const T* B, TD* D,
               const T* bias, const T* aux, cudaStream_t stream, const TD* C = nullptr,
               cublasOperation_t tb = CUBLAS_OP_N, int ldb = 0) {
    BlasContext& b = blas();
    void* workspace = blas_stream(stream).workspace;
    MatmulPlan& plan = matmul_plan<T, TD>(ta, tb, m, n, k, ep, A, B, D, bias, aux, C, ldb);
    if (!plan.has_algo) return false;
    if (bias) cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    if (aux) cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    const float alpha = 1.0f, beta = C ? 1.0f : 0.0f;
    const TD* c_in = C ? C : D;  // beta = 0: cuBLASLt does not read C
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
        const cublasStatus_t status = cublasLtMatmul(b.lt, plan.desc, &alpha, A, plan.a, B, plan.b, &beta, c_in, plan.d, D,
                                                     plan.d, &algo, workspace, b.workspace_bytes, stream);
        if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED) cublas_check(status);
        return status == CUBLAS_STATUS_SUCCESS;
    };
    if (!plan.tuned && b.tune)
        matmul_tune(plan, run, D, ep == MatmulEpilogue::gelu ? aux : nullptr, size_t(m) * n, stream, C == D);
    if (run(plan.algo)) return true;
    plan.has_algo = false;  // this case is not for cuBLASLt: the plain path from now on
    return false;
}

// The optional parts of a matmul_forward call, each set by name (the defaults: none of them, the
// default stream):
//   matmul_forward(out, inp, weight, bias, N, C, OC, MatmulForwardOptions<T>().with_pre_gelu(pre).with_inp_ld(ld))
//   pre_gelu (N, OC): fuse GELU; it receives the pre-activation, out the GELU of it.
//   residual (N, OC), laid out as out, not overlapping it: out = inp weight^T + bias + residual.
//   inp_ld: the distance between inp's rows in elements, >= C (0: C); train_gpt's LayerNorm outputs
//           carry a column of ones after their C values (matmul_backward_weight_bias).
template <typename T> struct MatmulForwardOptions {
    T* pre_gelu = nullptr;
    const T* residual = nullptr;
    int inp_ld = 0;
    cudaStream_t stream = 0;
    MatmulForwardOptions& with_pre_gelu(T* p) { pre_gelu = p; return *this; }
    MatmulForwardOptions& with_residual(const T* r) { residual = r; return *this; }
    MatmulForwardOptions& with_inp_ld(int ld) { inp_ld = ld; return *this; }
    MatmulForwardOptions& with_stream(cudaStream_t s) { stream = s; return *this; }
};

// out (N, OC) = inp (N, C) weight (OC, C)^T + bias (OC; may be null), with the options above.
template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                    const MatmulForwardOptions<T>& options = MatmulForwardOptions<T>()) {
    T* const pre_gelu = options.pre_gelu;
    const T* const residual = options.residual;
    const cudaStream_t stream = options.stream;
    const int inp_ld = options.inp_ld ? options.inp_ld : C;
    if (inp_ld < C) fail("matmul_forward: inp_ld %d < C %d", inp_ld, C);
    BlasContext& b = blas();
    const size_t count = size_t(N) * OC;
    if (residual && pre_gelu) fail("matmul_forward: a residual and GELU fusion in one call are not supported");
    if (residual && reinterpret_cast<uintptr_t>(out) < reinterpret_cast<uintptr_t>(residual + count) &&
        reinterpret_cast<uintptr_t>(residual) < reinterpret_cast<uintptr_t>(out + count))
        fail("matmul_forward: out overlaps residual (the residual add needs them apart)");
    const MatmulEpilogue ep = pre_gelu ? MatmulEpilogue::gelu : bias ? MatmulEpilogue::bias : MatmulEpilogue::plain;
    const bool fused =
        matmul_lt<T>(CUBLAS_OP_T, OC, N, C, ep, weight, inp, out, bias, pre_gelu, stream, residual, CUBLAS_OP_N, inp_ld);
    if (pre_gelu) (fused ? b.gelu_fused : b.gelu_unfused)++;
    if (fused) return;
    T* pre = pre_gelu ? pre_gelu : out;
    if (residual) cuda_check(cudaMemcpyAsync(out, residual, count * sizeof(T), cudaMemcpyDeviceToDevice, stream));
    gemm<T>(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, 1.0f, weight, C, inp, inp_ld, residual ? 1.0f : 0.0f, pre, OC, stream);
    if (bias) {
        add_bias_kernel<T><<<1024, 256, 0, stream>>>(pre, bias, size_t(N), OC);
        cuda_check_launch();
    }
    if (pre_gelu) gelu_forward(out, pre_gelu, count, stream);
}

// The optional parts of a matmul_backward call, each set by name (the defaults: none, the default
// stream):
//   pre_gelu (N, C): the forward's pre-activation of `inp` = gelu(pre_gelu); dinp then leaves as the
//           gradient of pre_gelu.
template <typename T> struct MatmulBackwardOptions {
    const T* pre_gelu = nullptr;
    cudaStream_t stream = 0;
    MatmulBackwardOptions& with_pre_gelu(const T* p) { pre_gelu = p; return *this; }
    MatmulBackwardOptions& with_stream(cudaStream_t s) { stream = s; return *this; }
};

// dinp, dweight and dbias may each be null (not needed, no bias): train_gpt asks for dinp in one
// call and for the weight gradients in another, on a second stream (-ov).
template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N, int C, int OC,
                     const MatmulBackwardOptions<T>& options = MatmulBackwardOptions<T>()) {
    const T* const pre_gelu = options.pre_gelu;
    const cudaStream_t stream = options.stream;
    BlasContext& b = blas();
    if (dinp) {
        // Through cuBLASLt (tuned; with pre_gelu, GELU' in the epilogue), else plain cuBLAS.
        const MatmulEpilogue ep = pre_gelu ? MatmulEpilogue::dgelu : MatmulEpilogue::plain;
        const bool fused = matmul_lt<T>(CUBLAS_OP_N, C, N, OC, ep, weight, dout, dinp, (const T*)nullptr, pre_gelu, stream);
        if (pre_gelu) (fused ? b.gelu_fused : b.gelu_unfused)++;
        if (!fused) {
            gemm<T>(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, 1.0f, weight, C, dout, OC, 0.0f, dinp, C, stream);
            if (pre_gelu) gelu_backward_inplace(dinp, pre_gelu, size_t(N) * C, stream);
        }
    }
    // dweight (C, OC) column-major += inp (C, N) dout (OC, N)^T: through cuBLASLt (tuned), else plain cuBLAS.
    if (dweight && !matmul_lt<T>(CUBLAS_OP_N, C, OC, N, MatmulEpilogue::plain, inp, dout, dweight, (const T*)nullptr,
                                 (const T*)nullptr, stream, dweight, CUBLAS_OP_T))
        gemm<T>(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, C, stream);
    if (dbias) {
        gemm<T>(CUBLAS_OP_N, CUBLAS_OP_N, OC, 1, N, 1.0f, dout, OC, blas_ones<T>(N), N, 1.0f, dbias, OC, stream);
    }
}

// Bias and weight gradients from one GEMM. The bias gradient is the column sums of dout, i.e.
// dout^T times a column of ones: given inp with that column, laid out (N, inp_ld) with columns [0, C)
// the layer's input, column C all ones and columns (C, inp_ld) all zeros, one GEMM over inp's inp_ld
// columns gives dweight in its first C columns and dbias in column C, and dout (N, OC, the largest
// tensor here) is read once instead of twice (the separate matrix-vector dbias reads it all again).
// The GEMM
// writes fp32 into scratch ((OC, inp_ld) floats, overwritten), and a small kernel adds it into
// dweight (OC, C) and dbias (OC): each gradient rounded to T once, as D += in the GEMM would.
// inp_ld = round_up(C + 1, 16 bytes). Falls back to the two-pass way where cuBLASLt has no algorithm
// (shapes whose leading dimensions are not whole 16-byte vectors). The measurements: docs/matmul.md.
template <typename T> __global__ void add_weight_bias_kernel(T* dweight, T* dbias, const float* scratch, int OC, int C, int ld) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < size_t(OC) * ld; i += size_t(gridDim.x) * blockDim.x) {
        const int o = int(i / ld), c = int(i % ld);
        if (c < C) dweight[size_t(o) * C + c] = from_float<T>(to_float(dweight[size_t(o) * C + c]) + scratch[i]);
        else if (c == C) dbias[o] = from_float<T>(to_float(dbias[o]) + scratch[i]);
    }
}
inline int ones_column_ld(int C, size_t elem_bytes) {
    const int per_vector = int(16 / elem_bytes);
    return (C + 1 + per_vector - 1) / per_vector * per_vector;
}
template <typename T>
void matmul_backward_weight_bias(T* dweight, T* dbias, float* scratch, const T* dout, const T* inp, int inp_ld, int N, int C,
                                 int OC, cudaStream_t stream = 0) {
    if (inp_ld != ones_column_ld(C, sizeof(T)))
        fail("matmul_backward_weight_bias: inp_ld %d, expected %d for C = %d", inp_ld, ones_column_ld(C, sizeof(T)), C);
    // scratch (inp_ld, OC) column-major = inp (inp_ld, N) dout (OC, N)^T
    if (matmul_lt<T, float>(CUBLAS_OP_N, inp_ld, OC, N, MatmulEpilogue::plain, inp, dout, scratch, (const T*)nullptr,
                            (const T*)nullptr, stream, (const float*)nullptr, CUBLAS_OP_T)) {
        add_weight_bias_kernel<T><<<elementwise_blocks(size_t(OC) * inp_ld), 256, 0, stream>>>(dweight, dbias, scratch, OC, C, inp_ld);
        cuda_check_launch();
        return;
    }
    gemm<T>(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, 1.0f, inp, inp_ld, dout, OC, 1.0f, dweight, C, stream);
    matmul_backward<T>(nullptr, nullptr, dbias, dout, inp, nullptr, N, C, OC,
                       MatmulBackwardOptions<T>().with_stream(stream));  // the matrix-vector dbias
}
