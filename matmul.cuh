// matmul.cuh: the linear layers (cuBLASLt / cuBLAS) and the tanh-GELU between them.
//
//   matmul_forward   out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC)
//   matmul_backward  dinp (N, C) = dout (N, OC) @ weight            (overwritten)
//                    dweight (OC, C) += dout^T @ inp                  (accumulated)
//                    dbias (OC) += column sums of dout                (accumulated)
//   gelu_forward / gelu_backward_inplace: GPT-2's tanh approximation.
//
// Non-obvious choices:
//   - cuBLAS is column-major: a row-major (R, K) tensor is a column-major (K, R) matrix. So `out`
//     (N, OC) row-major is the column-major (OC, N) product op(A) B with A = weight as stored, a
//     (C, OC) matrix used transposed, and B = inp as stored, a (C, N) matrix.
//   - The forward adds the bias in the cuBLASLt epilogue (no extra pass over `out`). When cuBLASLt
//     offers no algorithm for a shape/alignment (odd sizes), or refuses the one it offered, a plain
//     cublasGemmEx plus a bias kernel.
//   - fp32 builds compute in true fp32 (CUBLAS_COMPUTE_32F, no TF32), so they match PyTorch with TF32
//     off to ~1e-6; bf16 builds take bf16 inputs with fp32 accumulation.
//   - dbias is a matrix-vector product with a vector of ones (cuBLAS, beta = 1): accumulates,
//     deterministic, and reads dout once.
//   - cuBLAS results are bitwise reproducible run to run on the same GPU model and stream (its
//     documented guarantee), which the deterministic training relies on.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include <map>
#include <tuple>

#include "common.cuh"

inline void cublas_check_impl(cublasStatus_t status, const char* expr, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: status %d (%s) at %s:%d", (int)status, expr, file, line);
}
#define cublas_check(expr) cublas_check_impl((expr), #expr, __FILE__, __LINE__)

template <typename T> constexpr cudaDataType_t cuda_data_type();
template <> constexpr cudaDataType_t cuda_data_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType_t cuda_data_type<__nv_bfloat16>() { return CUDA_R_16BF; }

// One set of handles per process, made by blas_init() before the first matmul.
struct BlasContext {
    cublasHandle_t handle = nullptr;
    cublasLtHandle_t lt = nullptr;
    void* workspace = nullptr;
    size_t workspace_bytes = size_t(32) << 20;  // cuBLASLt's recommendation for Hopper
    void* ones_buffer = nullptr;                // a vector of ones of the storage type, for dbias
    size_t ones_count = 0;
};
inline BlasContext& blas() {
    static BlasContext ctx;
    return ctx;
}

template <typename T> __global__ void fill_ones_kernel(T* x, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        x[i] = from_float<T>(1.0f);
}

// max_rows: the largest N any matmul_backward will see (sizes the ones vector).
template <typename T> void blas_init(size_t max_rows) {
    BlasContext& b = blas();
    cublas_check(cublasCreate(&b.handle));
    cublas_check(cublasSetMathMode(b.handle, CUBLAS_DEFAULT_MATH));  // no TF32 for fp32 inputs
    cublas_check(cublasLtCreate(&b.lt));
    b.workspace = device_malloc(b.workspace_bytes, "cuBLAS workspace");
    cublas_check(cublasSetWorkspace(b.handle, b.workspace, b.workspace_bytes));
    b.ones_count = std::max<size_t>(max_rows, 1);
    b.ones_buffer = device_malloc(b.ones_count * sizeof(T), "matmul ones vector");
    fill_ones_kernel<T><<<256, 256>>>(static_cast<T*>(b.ones_buffer), b.ones_count);
    cuda_check_launch();
}

inline void blas_destroy() {
    BlasContext& b = blas();
    if (b.handle) cublas_check(cublasDestroy(b.handle));
    if (b.lt) cublas_check(cublasLtDestroy(b.lt));
    if (b.workspace) cuda_check(cudaFree(b.workspace));
    if (b.ones_buffer) cuda_check(cudaFree(b.ones_buffer));
    b = BlasContext();
}

template <typename T> __global__ void add_bias_kernel(T* out, const T* bias, size_t N, int OC) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < N * OC; i += size_t(gridDim.x) * blockDim.x)
        out[i] = from_float<T>(to_float(out[i]) + to_float(bias[i % OC]));
}

// C (m, n) = alpha * op(A) op(B) + beta * C, column-major, plain cuBLAS (fp32 accumulation).
template <typename T>
void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const T* A, int lda, const T* B,
          int ldb, float beta, T* C, int ldc, cudaStream_t stream) {
    cublas_check(cublasSetStream(blas().handle, stream));
    cublas_check(cublasGemmEx(blas().handle, ta, tb, m, n, k, &alpha, A, cuda_data_type<T>(), lda, B, cuda_data_type<T>(),
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

// A cuBLASLt plan for one shape and alignment: descriptors and the heuristic's algorithm, made once
// (the heuristic query costs tens of microseconds of CPU, every layer of every step otherwise).
struct MatmulPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo;
    bool has_algo = false;
};

template <typename T>
MatmulPlan& matmul_plan(int N, int C, int OC, const void* weight, const void* inp, const void* out, const void* bias) {
    const int align_a = pointer_alignment(weight), align_b = pointer_alignment(inp), align_d = pointer_alignment(out);
    const int align_bias = bias ? pointer_alignment(bias) : 0;
    static std::map<std::tuple<int, int, int, int, int, int, int>, MatmulPlan> plans;
    MatmulPlan& plan = plans[std::make_tuple(N, C, OC, align_a, align_b, align_d, align_bias)];
    if (plan.desc) return plan;
    BlasContext& b = blas();
    const cudaDataType_t type = cuda_data_type<T>();
    cublas_check(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
    cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)));
    cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
    const cublasLtEpilogue_t epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    // The heuristic may look at the bias pointer (its alignment): show it the one of this call.
    if (bias) cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    cublas_check(cublasLtMatrixLayoutCreate(&plan.a, type, C, OC, C));
    cublas_check(cublasLtMatrixLayoutCreate(&plan.b, type, C, N, C));
    cublas_check(cublasLtMatrixLayoutCreate(&plan.d, type, OC, N, OC));
    cublasLtMatmulPreference_t pref;
    cublas_check(cublasLtMatmulPreferenceCreate(&pref));
    cublas_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &b.workspace_bytes,
                                                      sizeof(b.workspace_bytes)));
    const uint32_t aligns[4] = {(uint32_t)align_a, (uint32_t)align_b, (uint32_t)align_d, (uint32_t)align_d};
    const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        cublas_check(cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &aligns[i], sizeof(aligns[i])));
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(b.lt, plan.desc, plan.a, plan.b, plan.d, plan.d, pref, 1, &heuristic, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found > 0)
        plan.algo = heuristic.algo, plan.has_algo = true;
    cublas_check(cublasLtMatmulPreferenceDestroy(pref));
    return plan;
}

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC, cudaStream_t stream = 0) {
    BlasContext& b = blas();
    MatmulPlan& plan = matmul_plan<T>(N, C, OC, weight, inp, out, bias);
    const float alpha = 1.0f, beta = 0.0f;
    if (plan.has_algo) {
        if (bias)
            cublas_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        const cublasStatus_t status = cublasLtMatmul(b.lt, plan.desc, &alpha, weight, plan.a, inp, plan.b, &beta, out, plan.d,
                                                     out, plan.d, &plan.algo, b.workspace, b.workspace_bytes, stream);
        if (status == CUBLAS_STATUS_SUCCESS) return;
        if (status != CUBLAS_STATUS_NOT_SUPPORTED) cublas_check(status);
        plan.has_algo = false;  // this shape/alignment is not for cuBLASLt: the plain path from now on
    }
    gemm<T>(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, 1.0f, weight, C, inp, C, 0.0f, out, OC, stream);
    if (bias) {
        add_bias_kernel<T><<<1024, 256, 0, stream>>>(out, bias, size_t(N), OC);
        cuda_check_launch();
    }
}

// dinp may be null (not needed), dbias may be null (no bias).
template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N, int C, int OC,
                     cudaStream_t stream = 0) {
    if (dinp) gemm<T>(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, 1.0f, weight, C, dout, OC, 0.0f, dinp, C, stream);
    gemm<T>(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, C, stream);
    if (dbias) {
        if (size_t(N) > blas().ones_count) fail("matmul_backward: %d rows, ones vector holds %zu", N, blas().ones_count);
        gemm<T>(CUBLAS_OP_N, CUBLAS_OP_N, OC, 1, N, 1.0f, dout, OC, static_cast<const T*>(blas().ones_buffer), N, 1.0f,
                dbias, OC, stream);
    }
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

template <typename T, int VS> __global__ void gelu_forward_kernel(T* out, const T* inp, size_t n) {
    for (size_t i = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * VS; i < n; i += size_t(gridDim.x) * blockDim.x * VS) {
        if constexpr (VS == 1) {
            out[i] = from_float<T>(gelu_tanh(to_float(inp[i])));
        } else {
            const Vec128<T> x = Vec128<T>::load(inp + i);
            Vec128<T> y;
#pragma unroll
            for (int j = 0; j < VS; j++) y[j] = from_float<T>(gelu_tanh(to_float(x[j])));
            y.store(out + i);
        }
    }
}

template <typename T, int VS> __global__ void gelu_backward_kernel(T* d, const T* inp, size_t n) {
    for (size_t i = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * VS; i < n; i += size_t(gridDim.x) * blockDim.x * VS) {
        if constexpr (VS == 1) {
            d[i] = from_float<T>(to_float(d[i]) * gelu_tanh_grad(to_float(inp[i])));
        } else {
            const Vec128<T> x = Vec128<T>::load(inp + i);
            Vec128<T> g = Vec128<T>::load(d + i);
#pragma unroll
            for (int j = 0; j < VS; j++) g[j] = from_float<T>(to_float(g[j]) * gelu_tanh_grad(to_float(x[j])));
            g.store(d + i);
        }
    }
}

inline int elementwise_blocks(size_t work, int threads = 256) {
    return (int)std::max<size_t>(1, std::min<size_t>((work + threads - 1) / threads, 132 * 16));
}

template <typename T> void gelu_forward(T* out, const T* inp, size_t n, cudaStream_t stream = 0) {
    constexpr int VS = Vec128<T>::size;
    if (n % VS == 0 && is_aligned16(out) && is_aligned16(inp))
        gelu_forward_kernel<T, VS><<<elementwise_blocks(n / VS), 256, 0, stream>>>(out, inp, n);
    else
        gelu_forward_kernel<T, 1><<<elementwise_blocks(n), 256, 0, stream>>>(out, inp, n);
    cuda_check_launch();
}

// d = d * gelu'(inp), in place: d holds dL/d(gelu output) on entry, dL/d(inp) on exit.
template <typename T> void gelu_backward_inplace(T* d, const T* inp, size_t n, cudaStream_t stream = 0) {
    constexpr int VS = Vec128<T>::size;
    if (n % VS == 0 && is_aligned16(d) && is_aligned16(inp))
        gelu_backward_kernel<T, VS><<<elementwise_blocks(n / VS), 256, 0, stream>>>(d, inp, n);
    else
        gelu_backward_kernel<T, 1><<<elementwise_blocks(n), 256, 0, stream>>>(d, inp, n);
    cuda_check_launch();
}
