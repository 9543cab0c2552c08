// matmul.cu: the linear-layer laboratory (matmul.cuh). The training step's matmuls are cuBLAS's, so
// the question here is not how to write a GEMM but which of cuBLAS's kernels each of our shapes
// should run, and which passes over memory the epilogues can take away.
//
//   make dev/cuda/matmul
//   ./dev/cuda/matmul            validate, then benchmark every GEMM of a d12 step (bf16, N = 65536 rows)
//   ./dev/cuda/matmul --check    validation only (what CI runs; skips without a GPU)
//   ./dev/cuda/matmul -h         the usage (--rows, --algos)
//
// The layer is out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (+ residual (N, OC) for attproj and
// fcproj, whose outputs are the residual stream), and its backward
//   dinp (N, C) = dout (N, OC) @ weight          (times gelu'(pre) for the fcproj layer)
//   dweight (OC, C) += dout^T @ inp,  dbias (OC) += column sums of dout.
//
// Versions (every one validated against a double-precision CPU reference):
//   1  plain cuBLAS (cublasGemmEx) and separate kernels for bias, GELU and its backward, dbias a
//     matrix-vector product with a vector of ones, the residual copied into out before a beta = 1
//     GEMM: matmul.cuh's fallback path, taken for shapes cuBLASLt has no algorithm for.
//   2  the header as training calls it (matmul_forward, matmul_backward; the residual as cuBLASLt's C).
//   2w the header with --wide (train_gpt -tw 1): each plan tuned also over the configurations around
//     the heuristic's list (matmul_config_space: each candidate's custom options x cluster shapes x
//     swizzles, and its algorithm's other tiles; its split-K), within a time budget per plan. Validation
//     runs the same way then; version 3's listing is skipped.
//   3  every algorithm cuBLASLt's heuristic offers for the shape (up to --algos of them, in its order),
//     each run on its own: how much the heuristic's first choice leaves on the table, and whether
//     the faster ones give the same bits (determinism).
//
// Benchmark: the GEMMs of one GPT-2 124M step at N = B*T rows, timed alone (median of 20 runs after
// 3 warm-ups; every operand larger than L2 except the weights), in TFLOP/s (2 N C OC per GEMM) next
// to an 8192^3 GEMM measured in the same run (the rate this GPU's cuBLAS reaches on an easy shape).
// attproj and fcproj also time their forward with the residual in the epilogue (fwd+res), as
// training runs them: the difference is what reading C costs the GEMM.

#include <cstring>
#include <string>

#include "common.cuh"
#include "dev/lab.cuh"
#include "matmul.cuh"

// ---------------------------------------------------------------------------------------------
// CPU reference, in double, from the same storage-type inputs the GPU reads.

double gelu_ref(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double gelu_grad_ref(double x) {
    const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x), th = std::tanh(u);
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

// ---------------------------------------------------------------------------------------------
// Version 3: one cuBLASLt problem, every algorithm the heuristic returns.

struct LtProblem {
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    int m = 0, n = 0, k = 0;  // column-major D (m, n) = op(A) op(B), A/B/D leading dimensions their row counts
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    float beta = 0.0f;
    const void *A = nullptr, *B = nullptr, *bias = nullptr, *aux = nullptr;
    const void* C = nullptr;  // with beta != 0: C, laid out as D (null: C is D, in place)
    void* D = nullptr;
    void* bgrad = nullptr;  // a bias-gradient epilogue's output (BGRADB, DGELU_BGRAD), written
    bool bgrad_fp32 = false;  // as fp32 (else the storage type)
};

struct LtSetup {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    std::vector<cublasLtMatmulHeuristicResult_t> algos;
    ~LtSetup() {
        if (desc) cublasLtMatmulDescDestroy(desc);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (d) cublasLtMatrixLayoutDestroy(d);
    }
};

template <typename T> void lt_setup(LtSetup& s, const LtProblem& p, int max_algos) {
    const cudaDataType_t type = cuda_data_type<T>();
    cublas_check(cublasLtMatmulDescCreate(&s.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublas_check(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSA, &p.ta, sizeof(p.ta)));
    cublas_check(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSB, &p.tb, sizeof(p.tb)));
    cublas_check(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue, sizeof(p.epilogue)));
    if (p.bias) cublas_check(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
    if (p.bgrad) {
        const cudaDataType_t f32 = CUDA_R_32F;
        cublas_check(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bgrad, sizeof(p.bgrad)));
        if (p.bgrad_fp32)
            cublas_check(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &f32, sizeof(f32)));
    }
    if (p.aux) {
        const int64_t ld = p.m;
        cublas_check(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p.aux, sizeof(p.aux)));
        cublas_check(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
    }
    if (p.ta == CUBLAS_OP_T) cublas_check(cublasLtMatrixLayoutCreate(&s.a, type, p.k, p.m, p.k));
    else cublas_check(cublasLtMatrixLayoutCreate(&s.a, type, p.m, p.k, p.m));
    if (p.tb == CUBLAS_OP_T) cublas_check(cublasLtMatrixLayoutCreate(&s.b, type, p.n, p.k, p.n));
    else cublas_check(cublasLtMatrixLayoutCreate(&s.b, type, p.k, p.n, p.k));
    cublas_check(cublasLtMatrixLayoutCreate(&s.d, type, p.m, p.n, p.m));
    cublasLtMatmulPreference_t pref;
    cublas_check(cublasLtMatmulPreferenceCreate(&pref));
    cublas_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &blas().workspace_bytes,
                                                      sizeof(blas().workspace_bytes)));
    s.algos.resize(max_algos);
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(blas().lt, s.desc, s.a, s.b, s.d, s.d, pref, max_algos, s.algos.data(), &found) !=
        CUBLAS_STATUS_SUCCESS)
        found = 0;
    s.algos.resize(found);
    cublas_check(cublasLtMatmulPreferenceDestroy(pref));
}

// False when cuBLASLt refuses this algorithm at run time (it may, for some it listed).
inline bool lt_run(const LtSetup& s, const LtProblem& p, int i) {
    const float alpha = 1.0f;
    const cublasStatus_t st = cublasLtMatmul(blas().lt, s.desc, &alpha, p.A, s.a, p.B, s.b, &p.beta, p.C ? p.C : p.D, s.d,
                                             p.D, s.d, &s.algos[i].algo, blas().workspace, blas().workspace_bytes, 0);
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) cublas_check(st);
    return false;
}

// ---------------------------------------------------------------------------------------------
// Validation at small shapes: every version against the CPU reference.
//
// Bounds, per element: |got - ref| <= atol + rtol (|ref| + |inner|), rtol = 2^-8 in bf16, 1e-6 in fp32.
//   - The inputs are storage-type values read exactly by both sides; products accumulate in fp32, at
//     most ~K 2^-24 sum|a b| of error (atol allows 4x that).
//   - rtol in fp32: each rounding is at most 2^-24 relative (6e-8), and a result carries at most four
//     (itself and the intermediates below), 2.4e-7: 1e-6 leaves 4x.
//   - A bf16 result is rounded once (at most 2^-8 |ref|: 8 significant bits), and some paths round an intermediate too: the
//     unfused bias (the GEMM's result, then the sum), the += of dweight (cuBLAS rounds the product
//     to bf16 before adding the old value: seen on the H100, not documented) and the unfused GELU
//     (the pre-activation). `inner` is that intermediate's magnitude, so rtol covers both roundings.
//   - cuBLASLt evaluates GELU and GELU' in its epilogues with a fast tanh (NVIDIA documents no
//     accuracy; we measured gelu' off by ~1e-4 absolute): the epilogue paths get 2^-10 |x| (GELU)
//     and 2^-10 |dout @ W| (GELU') more. The unfused kernels use tanhf.
//   - The residual forward (out = inp W^T + bias + r) adds one more term: |r| joins the sum of
//     magnitudes (atol: one more fp32 addition) and `inner` becomes 2 |s| + |r|: the plain path
//     rounds three times, the product (cuBLAS at beta = 1, as for dweight's +=), then s + r, then the
//     sum with the bias (the epilogue rounds the whole fp32 sum once). With |s| + |r| alone, version 1
//     exceeded the bound by up to 1.26x at 4 shapes (H100): the product's rounding was not counted.

struct Shape {
    int N, C, OC;
};

template <typename T> double rtol_for() { return sizeof(T) == 2 ? 1.0 / 256 : 1e-6; }

// Per-element bound for a sum of K products whose absolute values sum to `mag`.
inline double accumulation_atol(int K, double mag) { return 4.0 * K * std::ldexp(1.0, -24) * mag + 1e-7; }

template <typename T> void check_shape(TestCounter& tests, bool gpu, const Shape& sh, bool with_gelu, Rng& rng) {
    const int N = sh.N, C = sh.C, OC = sh.OC;
    const char* dtype = sizeof(T) == 2 ? "bf16" : "fp32";
    char what[160];
    snprintf(what, sizeof(what), "%s N=%d C=%d OC=%d%s", dtype, N, C, OC, with_gelu ? " gelu" : "");
    if (!gpu) {
        tests.skip(what);
        return;
    }
    std::vector<T> inp(size_t(N) * C), weight(size_t(OC) * C), bias(OC), dout(size_t(N) * OC), pre(size_t(N) * C),
        dweight0(size_t(OC) * C), dbias0(OC), residual(size_t(N) * OC);
    fill_uniform(inp, -1.0f, 1.0f, rng);
    fill_uniform(weight, -0.5f, 0.5f, rng);
    fill_uniform(bias, -1.0f, 1.0f, rng);
    fill_uniform(dout, -1.0f, 1.0f, rng);
    fill_uniform(pre, -4.0f, 4.0f, rng);  // the forward pre-activation for the dgelu backward (tails included)
    fill_uniform(dweight0, -1.0f, 1.0f, rng);
    fill_uniform(dbias0, -1.0f, 1.0f, rng);
    fill_uniform(residual, -2.0f, 2.0f, rng);  // drawn last: the other inputs stay those of the runs before it

    // Reference. Forward: y = inp W^T + b (and gelu(y) for with_gelu; yr = y + residual without).
    // Backward: dinp = dout W (times gelu'(pre) for with_gelu), dweight = dweight0 + dout^T inp,
    // dbias = dbias0 + colsum(dout).
    const double rtol = rtol_for<T>(), epilogue_gelu = std::ldexp(1.0, -10);
    std::vector<double> y(size_t(N) * OC), y_tol(size_t(N) * OC), g(size_t(N) * OC), g_tol(size_t(N) * OC),
        yr(size_t(N) * OC), yr_tol(size_t(N) * OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = 0.0, mag = 0.0;
            for (int c = 0; c < C; c++) {
                const double p = to_double(inp[size_t(n) * C + c]) * to_double(weight[size_t(o) * C + c]);
                s += p, mag += std::fabs(p);
            }
            const size_t i = size_t(n) * OC + o;
            const double x = s + to_double(bias[o]);
            y[i] = x, y_tol[i] = accumulation_atol(C, mag) + rtol * std::fabs(s);
            const double r = to_double(residual[i]);
            yr[i] = x + r, yr_tol[i] = accumulation_atol(C, mag + std::fabs(r)) + rtol * (2 * std::fabs(s) + std::fabs(r));
            // GELU of a pre-activation off by up to y_tol + rtol |x| (the unfused path's rounding): |gelu'| <= 1.13.
            g[i] = gelu_ref(x), g_tol[i] = 1.13 * (y_tol[i] + rtol * std::fabs(x)) + epilogue_gelu * std::fabs(x);
        }
    std::vector<double> dinp(size_t(N) * C), dinp_tol(size_t(N) * C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = 0.0, mag = 0.0;
            for (int o = 0; o < OC; o++) {
                const double p = to_double(dout[size_t(n) * OC + o]) * to_double(weight[size_t(o) * C + c]);
                s += p, mag += std::fabs(p);
            }
            const size_t i = size_t(n) * C + c;
            const double gg = with_gelu ? gelu_grad_ref(to_double(pre[i])) : 1.0;
            dinp[i] = s * gg, dinp_tol[i] = accumulation_atol(OC, mag) * 1.13 + rtol * std::fabs(s) +
                                             (with_gelu ? epilogue_gelu * std::fabs(s) : 0.0);
        }
    std::vector<double> dw(size_t(OC) * C), dw_tol(size_t(OC) * C), db(OC), db_tol(OC);
    for (int o = 0; o < OC; o++) {
        for (int c = 0; c < C; c++) {
            double s = 0.0, mag = 0.0;
            for (int n = 0; n < N; n++) {
                const double p = to_double(dout[size_t(n) * OC + o]) * to_double(inp[size_t(n) * C + c]);
                s += p, mag += std::fabs(p);
            }
            const size_t i = size_t(o) * C + c;
            dw[i] = to_double(dweight0[i]) + s, dw_tol[i] = accumulation_atol(N, mag) + rtol * std::fabs(s);
        }
        double s = 0.0, mag = 0.0;
        for (int n = 0; n < N; n++) s += to_double(dout[size_t(n) * OC + o]), mag += std::fabs(to_double(dout[size_t(n) * OC + o]));
        db[o] = to_double(dbias0[o]) + s, db_tol[o] = accumulation_atol(N, mag) + rtol * std::fabs(s);
    }

    // Buffers, outputs poisoned with NaN before every run.
    DeviceBuffer<T> d_inp(inp.size(), "inp"), d_w(weight.size(), "weight"), d_b(bias.size(), "bias"),
        d_dout(dout.size(), "dout"), d_pre(pre.size(), "pre"), d_out(size_t(N) * OC, "out"), d_aux(size_t(N) * OC, "aux"),
        d_dinp(size_t(N) * C, "dinp"), d_dw(dweight0.size(), "dweight"), d_db(OC, "dbias"), d_res(residual.size(), "residual");
    d_inp.upload(inp), d_w.upload(weight), d_b.upload(bias), d_dout.upload(dout), d_pre.upload(pre), d_res.upload(residual);

    // counted = false: printed, not counted (a version-3 candidate the tuner would never keep); out of
    // bound it reads "over", not FAIL: a reader who greps FAIL finds the failures that count.
    auto check_vec = [&](const char* label, int version, const std::vector<T>& got, const std::vector<double>& ref,
                         const std::vector<double>& atol, bool counted = true) {
        bool ok = true;
        size_t bad = 0, worst = 0;
        double worst_ratio = 0.0;
        for (size_t i = 0; i < ref.size(); i++) {
            const double gv = to_double(got[i]), bound = atol[i] + rtol * std::fabs(ref[i]);
            const double err = std::fabs(gv - ref[i]);
            if (!std::isfinite(gv) || err > bound) ok = false, bad++;
            const double ratio = std::isfinite(gv) ? err / bound : 1e300;
            if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
        }
        printf("  v%d %-8s %-34s %s worst err/bound %.3f at [%zu] got %.6g ref %.6g (%zu/%zu bad)%s\n", version, label,
               what, ok ? "ok  " : counted ? "FAIL" : "over", worst_ratio, worst, to_double(got[worst]), ref[worst], bad, ref.size(),
               counted ? "" : "  [other bits than #0: never kept, not counted]");
        if (counted) tests.record(ok);
    };

    BlasContext& b = blas();
    for (int version = 1; version <= 2; version++) {
        // Forward (with GELU: out = gelu(y), aux = y).
        d_out.poison(), d_aux.poison();
        if (version == 1) {
            T* pre_out = with_gelu ? d_aux.ptr : d_out.ptr;
            gemm<T>(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, 1.0f, d_w.ptr, C, d_inp.ptr, C, 0.0f, pre_out, OC, 0);
            add_bias_kernel<T><<<64, 256>>>(pre_out, d_b.ptr, size_t(N), OC);
            cuda_check_launch();
            if (with_gelu) gelu_forward(d_out.ptr, d_aux.ptr, size_t(N) * OC);
        } else {
            matmul_forward(d_out.ptr, d_inp.ptr, d_w.ptr, d_b.ptr, N, C, OC,
                           MatmulForwardOptions<T>().with_pre_gelu(with_gelu ? d_aux.ptr : nullptr));
        }
        cuda_check(cudaDeviceSynchronize());
        if (with_gelu) {
            check_vec("fwd aux", version, d_aux.download(), y, y_tol);
            check_vec("fwd gelu", version, d_out.download(), g, g_tol);
        } else {
            check_vec("fwd", version, d_out.download(), y, y_tol);
            // With the residual (attproj, fcproj in training; never with GELU).
            d_out.poison();
            if (version == 1) {
                cuda_check(cudaMemcpy(d_out.ptr, d_res.ptr, d_res.n * sizeof(T), cudaMemcpyDeviceToDevice));
                gemm<T>(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, 1.0f, d_w.ptr, C, d_inp.ptr, C, 1.0f, d_out.ptr, OC, 0);
                add_bias_kernel<T><<<64, 256>>>(d_out.ptr, d_b.ptr, size_t(N), OC);
                cuda_check_launch();
            } else {
                matmul_forward(d_out.ptr, d_inp.ptr, d_w.ptr, d_b.ptr, N, C, OC, MatmulForwardOptions<T>().with_residual(d_res.ptr));
            }
            cuda_check(cudaDeviceSynchronize());
            check_vec("fwd+res", version, d_out.download(), yr, yr_tol);
            const std::vector<T> res_after = d_res.download();  // the residual is an input: left as it was
            const bool res_kept = std::memcmp(res_after.data(), residual.data(), residual.size() * sizeof(T)) == 0;
            printf("  v%d %-8s %-34s %s\n", version, "residual", what, res_kept ? "ok   unchanged" : "FAIL changed");
            tests.record(res_kept);
        }
        // Backward (with GELU: dinp times gelu'(pre)), from non-zero dweight / dbias (the += contract).
        d_dinp.poison();
        d_dw.upload(dweight0), d_db.upload(dbias0);
        if (version == 1) {
            gemm<T>(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, 1.0f, d_w.ptr, C, d_dout.ptr, OC, 0.0f, d_dinp.ptr, C, 0);
            if (with_gelu) gelu_backward_inplace(d_dinp.ptr, d_pre.ptr, size_t(N) * C);
            gemm<T>(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, 1.0f, d_inp.ptr, C, d_dout.ptr, OC, 1.0f, d_dw.ptr, C, 0);
            gemm<T>(CUBLAS_OP_N, CUBLAS_OP_N, OC, 1, N, 1.0f, d_dout.ptr, OC, blas_ones<T>(N), N, 1.0f,
                    d_db.ptr, OC, 0);
        } else {
            matmul_backward(d_dinp.ptr, d_dw.ptr, d_db.ptr, d_dout.ptr, d_inp.ptr, d_w.ptr, N, C, OC,
                            MatmulBackwardOptions<T>().with_pre_gelu(with_gelu ? d_pre.ptr : nullptr));
        }
        cuda_check(cudaDeviceSynchronize());
        check_vec("dinp", version, d_dinp.download(), dinp, dinp_tol);
        check_vec("dweight", version, d_dw.download(), dw, dw_tol);
        check_vec("dbias", version, d_db.download(), db, db_tol);
    }

    // Version 2, the layers with a bias as training runs them: inp with its column of ones (rows of
    // ones_column_ld(C) elements: C values, a one, zeros), read by the forward at that row distance,
    // and one GEMM for dweight and dbias (matmul_backward_weight_bias), from non-zero dweight / dbias.
    {
        const int ld = ones_column_ld(C, sizeof(T));
        std::vector<T> inp_ld(size_t(N) * ld);
        for (int n = 0; n < N; n++)
            for (int c = 0; c < ld; c++)
                inp_ld[size_t(n) * ld + c] = c < C ? inp[size_t(n) * C + c] : from_float<T>(c == C ? 1.0f : 0.0f);
        DeviceBuffer<T> d_inp_ld(inp_ld.size(), "inp with its ones column");
        DeviceBuffer<float> d_scratch(size_t(OC) * ld, "weight and bias gradient scratch");
        d_inp_ld.upload(inp_ld);
        d_out.poison(), d_aux.poison(), d_scratch.poison();
        matmul_forward(d_out.ptr, d_inp_ld.ptr, d_w.ptr, d_b.ptr, N, C, OC,
                       MatmulForwardOptions<T>().with_pre_gelu(with_gelu ? d_aux.ptr : nullptr).with_inp_ld(ld));
        cuda_check(cudaDeviceSynchronize());
        if (with_gelu) {
            check_vec("fwd aux ld", 2, d_aux.download(), y, y_tol);
            check_vec("fwd gelu ld", 2, d_out.download(), g, g_tol);
        } else {
            check_vec("fwd ld", 2, d_out.download(), y, y_tol);
        }
        d_dw.upload(dweight0), d_db.upload(dbias0);
        matmul_backward_weight_bias(d_dw.ptr, d_db.ptr, d_scratch.ptr, d_dout.ptr, d_inp_ld.ptr, ld, N, C, OC);
        cuda_check(cudaDeviceSynchronize());
        check_vec("dw 1 GEMM", 2, d_dw.download(), dw, dw_tol);
        check_vec("db 1 GEMM", 2, d_db.download(), db, db_tol);
        const bool inp_kept = d_inp_ld.download() == inp_ld;
        printf("  v2 %-8s %-34s %s\n", "inp ld", what, inp_kept ? "ok   unchanged" : "FAIL changed");
        tests.record(inp_kept);
    }

    // Version 3: every algorithm the heuristic offers for the forward (with and without the residual)
    // and the two backward GEMMs, at the shapes the header sends to cuBLASLt (every dimension a whole
    // number of 16-byte vectors).
    if (sizeof(T) != 2) return;  // training's matmuls that matter are bf16; fp32 runs the header's choice
    if (C % 8 != 0 || OC % 8 != 0) return;
    struct Case {
        const char* label;
        LtProblem p;
        const std::vector<double>* ref;
        const std::vector<double>* tol;
        DeviceBuffer<T>* out;
        const std::vector<T>* init;
    };
    std::vector<Case> cases;
    LtProblem fwd;
    fwd.ta = CUBLAS_OP_T, fwd.m = OC, fwd.n = N, fwd.k = C, fwd.A = d_w.ptr, fwd.B = d_inp.ptr, fwd.D = d_out.ptr;
    fwd.epilogue = CUBLASLT_EPILOGUE_BIAS, fwd.bias = d_b.ptr;
    if (!with_gelu) cases.push_back({"fwd", fwd, &y, &y_tol, &d_out, nullptr});
    LtProblem fwd_res = fwd;
    fwd_res.beta = 1.0f, fwd_res.C = d_res.ptr;
    if (!with_gelu) cases.push_back({"fwd+res", fwd_res, &yr, &yr_tol, &d_out, nullptr});
    LtProblem dx;
    dx.m = C, dx.n = N, dx.k = OC, dx.A = d_w.ptr, dx.B = d_dout.ptr, dx.D = d_dinp.ptr;
    if (with_gelu && C % 8 == 0) dx.epilogue = CUBLASLT_EPILOGUE_DGELU, dx.aux = d_pre.ptr;
    if (!with_gelu || C % 8 == 0) cases.push_back({"dinp", dx, &dinp, &dinp_tol, &d_dinp, nullptr});
    LtProblem dwp;
    dwp.tb = CUBLAS_OP_T, dwp.m = C, dwp.n = OC, dwp.k = N, dwp.A = d_inp.ptr, dwp.B = d_dout.ptr, dwp.D = d_dw.ptr;
    dwp.beta = 1.0f;
    cases.push_back({"dweight", dwp, &dw, &dw_tol, &d_dw, &dweight0});
    for (Case& cs : cases) {
        LtSetup s;
        lt_setup<T>(s, cs.p, 32);
        int ran = 0;
        std::vector<T> first;
        for (int i = 0; i < (int)s.algos.size(); i++) {
            cs.out->poison();
            if (cs.init) cs.out->upload(*cs.init);
            if (!lt_run(s, cs.p, i)) continue;
            cuda_check(cudaDeviceSynchronize());
            char label[32];
            snprintf(label, sizeof(label), "%s#%d", cs.label, i);
            const std::vector<T> got = cs.out->download();
            if (ran == 0) first = got;
            // Counted: the heuristic's first choice and whatever gives its bits (what matmul_tune may keep).
            const bool same = std::memcmp(got.data(), first.data(), got.size() * sizeof(T)) == 0;
            check_vec(label, 3, got, *cs.ref, *cs.tol, same);
            ran++;
        }
        if (ran == 0) printf("  v3 %-8s %-34s no cuBLASLt algorithm for this shape\n", cs.label, what);
    }
}

void check_all(TestCounter& tests, bool gpu) {
    Rng rng(1234);
    // {128, 768, 2304}: a GPT-2 layer's C and OC with N a whole number of 16-byte vectors, so that the
    // 1-GEMM dweight + dbias takes cuBLASLt.
    const Shape shapes[] = {{1, 768, 2304}, {37, 64, 192}, {300, 40, 24}, {5, 13, 7}, {130, 768, 768}, {64, 96, 384}, {77, 136, 3072},
                            {513, 128, 50}, {128, 768, 2304}};
    for (const Shape& sh : shapes) {
        check_shape<float>(tests, gpu, sh, false, rng);
        check_shape<__nv_bfloat16>(tests, gpu, sh, false, rng);
        check_shape<float>(tests, gpu, sh, true, rng);
        check_shape<__nv_bfloat16>(tests, gpu, sh, true, rng);
    }
}

// ---------------------------------------------------------------------------------------------
// Benchmark.

using bf16 = __nv_bfloat16;

struct Layer {
    const char* name;
    int C, OC;
    bool bias, gelu_fwd, dgelu_bwd, residual;  // residual: training adds the residual stream in its forward
};

// Training runs the LM head over chunks of this many rows (train_gpt.cu's kLogitsChunkRows), so the
// benchmark times its GEMMs at that size, and counts them rows / chunk times a step.
constexpr int kLmHeadChunkRows = 32768;

void benchmark(int rows, int max_algos) {
    const int C = 768, Vp = 50304, N = rows;
    const Layer layers[] = {{"qkv", C, 3 * C, true, false, false, false},
                            {"attproj", C, C, true, false, false, true},
                            {"fc", C, 4 * C, true, true, false, false},
                            {"fcproj", 4 * C, C, true, false, true, true},
                            {"lmhead", C, Vp, false, false, false, false}};
    // One set of buffers big enough for every layer.
    // inp: fcproj's (N, 4C), or with the column of ones of the 1-GEMM dweight + dbias (rows of ld(4C)).
    const size_t max_in = size_t(N) * ones_column_ld(4 * C, sizeof(bf16)), max_out = std::max(size_t(N) * 4 * C, size_t(std::min(N, kLmHeadChunkRows)) * Vp);
    DeviceBuffer<bf16> inp(max_in, "inp"), dout(max_out, "dout"), out(max_out, "out"),
        aux(size_t(N) * 4 * C, "aux"), w(size_t(Vp) * C, "weight"), dw(size_t(Vp) * C, "dweight"),
        dw_init(size_t(Vp) * C, "dweight init"), b(Vp, "bias"), db(Vp, "dbias"), res(size_t(N) * C, "residual");
    DeviceBuffer<float> bgrad(Vp, "bias gradient fp32");
    size_t wb_floats = 0;  // the 1-GEMM dweight + dbias's scratch, (OC, ld(C)) floats, for the largest layer
    for (const Layer& L : layers)
        if (L.bias) wb_floats = std::max(wb_floats, size_t(L.OC) * ones_column_ld(L.C, sizeof(bf16)));
    DeviceBuffer<float> wb_scratch(wb_floats, "weight and bias gradient scratch");
    {
        Rng rng(7);
        std::vector<bf16> h(max_in);
        fill_uniform(h, -1.0f, 1.0f, rng);
        inp.upload(h);
        res.upload(std::vector<bf16>(h.begin(), h.begin() + res.n));
        h.assign(max_out, from_float<bf16>(0.0f));
        fill_uniform(h, -0.01f, 0.01f, rng);
        dout.upload(h);
        h.assign(size_t(N) * 4 * C, from_float<bf16>(0.0f));
        fill_uniform(h, -3.0f, 3.0f, rng);
        aux.upload(h);
        h.assign(size_t(Vp) * C, from_float<bf16>(0.0f));
        fill_uniform(h, -0.05f, 0.05f, rng);
        w.upload(h);
        fill_uniform(h, -0.01f, 0.01f, rng);
        dw_init.upload(h);
        h.assign(Vp, from_float<bf16>(0.0f));
        fill_uniform(h, -0.1f, 0.1f, rng);
        b.upload(h), db.upload(h);
    }
    cuda_check(cudaMemcpy(dw.ptr, dw_init.ptr, dw.n * sizeof(bf16), cudaMemcpyDeviceToDevice));

    // The reference rate: an easy large GEMM through the header (cuBLASLt's first choice).
    double peak_tflops = 0.0;
    {
        const int S = 8192;
        DeviceBuffer<bf16> a(size_t(S) * S, "peak A"), bb(size_t(S) * S, "peak B"), c(size_t(S) * S, "peak C");
        std::vector<bf16> h(a.n);  // random operands: tensor cores run faster on zeros (METHOD.md)
        Rng rng(11);
        fill_uniform(h, -1.0f, 1.0f, rng);
        a.upload(h), bb.upload(h);
        const float ms = time_median_ms([&] { matmul_forward(c.ptr, a.ptr, bb.ptr, (const bf16*)nullptr, S, S, S); }, 3, 20);
        peak_tflops = 2.0 * S * S * double(S) / (ms * 1e-3) / 1e12;
        printf("reference: 8192^3 bf16 GEMM %.3f ms = %.1f TFLOP/s\n", ms, peak_tflops);
    }
    printf("\nmatmul benchmark, bf16, N = %d rows (the LM head: chunks of %d, as training), median of 20 runs after 3 "
           "warm-ups, TFLOP/s and %% of the 8192^3 rate\n", rows, std::min(rows, kLmHeadChunkRows));
    printf("%-8s %-8s %-26s %9s %8s %s\n", "layer", "GEMM", "version", "ms", "TFLOP/s", "");
    double total_header = 0.0, total_best = 0.0, total_residual = 0.0;
    auto report = [&](const char* layer, const char* gemm_name, const std::string& version, float ms, double flops, const char* extra) {
        const double tf = flops / (ms * 1e-3) / 1e12;
        printf("%-8s %-8s %-26s %9.4f %8.1f %5.1f%% %s\n", layer, gemm_name, version.c_str(), ms, tf, 100.0 * tf / peak_tflops, extra);
    };
    for (const Layer& L : layers) {
        const int N = L.OC == Vp ? std::min(rows, kLmHeadChunkRows) : rows;  // this GEMM's rows
        const double per_step = L.OC == Vp ? double(rows) / N : 12.0;        // its calls in one step
        const double flops = 2.0 * N * double(L.C) * L.OC;
        const bf16* bias = L.bias ? b.ptr : nullptr;
        // Header.
        const float f_ms = time_median_ms([&] {
            matmul_forward(out.ptr, inp.ptr, w.ptr, bias, N, L.C, L.OC,
                           MatmulForwardOptions<bf16>().with_pre_gelu(L.gelu_fwd ? aux.ptr : nullptr));
        }, 3, 20);
        report(L.name, "fwd", "2 header", f_ms, flops, "");
        if (L.residual) {
            const float r_ms = time_median_ms([&] {
                matmul_forward(out.ptr, inp.ptr, w.ptr, bias, N, L.C, L.OC, MatmulForwardOptions<bf16>().with_residual(res.ptr));
            }, 3, 20);
            char extra[80];
            snprintf(extra, sizeof(extra), "residual in the epilogue: %+.4f ms", r_ms - f_ms);
            report(L.name, "fwd+res", "2 header", r_ms, flops, extra);
            total_residual += 12.0 * (r_ms - f_ms);
        }
        const float x_ms = time_median_ms([&] {  // matmul_backward's dinp (tuned on its first call, in the warm-up)
            matmul_lt<bf16>(CUBLAS_OP_N, L.C, N, L.OC, L.dgelu_bwd ? MatmulEpilogue::dgelu : MatmulEpilogue::plain, w.ptr,
                            dout.ptr, out.ptr, nullptr, L.dgelu_bwd ? aux.ptr : nullptr, 0);
        }, 3, 20);
        report(L.name, "dinp", "2 header", x_ms, flops, "");
        const float w_ms = time_median_ms([&] {  // matmul_backward's dweight (D +=; tuned on its first call)
            matmul_backward<bf16>(nullptr, dw.ptr, nullptr, dout.ptr, inp.ptr, w.ptr, N, L.C, L.OC);
        }, 3, 20);
        report(L.name, "dweight", "2 header", w_ms, flops, "");
        float b_ms = 0.0f;
        if (L.bias) {
            b_ms = time_median_ms([&] {
                gemm<bf16>(CUBLAS_OP_N, CUBLAS_OP_N, L.OC, 1, N, 1.0f, dout.ptr, L.OC, blas_ones<bf16>(N),
                           N, 1.0f, db.ptr, L.OC, 0);
            }, 3, 20);
            const double gbs = double(N) * L.OC * 2 / (b_ms * 1e-3) / 1e9;
            printf("%-8s %-8s %-26s %9.4f  (%.0f GB/s)\n", L.name, "dbias", "2 header (gemv)", b_ms, gbs);
            // As training runs these layers: inp with its column of ones, dweight and dbias from one GEMM.
            const int ld = ones_column_ld(L.C, sizeof(bf16));
            const float wb_ms = time_median_ms([&] {
                matmul_backward_weight_bias<bf16>(dw.ptr, db.ptr, wb_scratch.ptr, dout.ptr, inp.ptr, ld, N, L.C, L.OC);
            }, 3, 20);
            char extra[96];
            snprintf(extra, sizeof(extra), "inp rows of %d: %+.4f ms against dweight + dbias", ld, wb_ms - w_ms - b_ms);
            report(L.name, "dw+db", "2 header, 1 GEMM", wb_ms, flops, extra);
        }
        total_header += per_step * (f_ms + x_ms + w_ms + b_ms);

        // Version 3 for each GEMM, and the bias-gradient epilogues (dbias fused into dweight's GEMM, or
        // the fc layer's dbias into fcproj's dinp with GELU'). Not with --wide, whose tuning tries them.
        float best_g[3] = {f_ms, x_ms, w_ms};
        for (int g = 0; g < (blas().tune_wide ? 0 : 6); g++) {
            LtProblem p;
            const char* gname = "";
            size_t out_n = 0;
            if (g == 0) {
                gname = "fwd";
                p.ta = CUBLAS_OP_T, p.m = L.OC, p.n = N, p.k = L.C, p.A = w.ptr, p.B = inp.ptr, p.D = out.ptr;
                if (L.gelu_fwd) p.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS, p.aux = aux.ptr, p.bias = b.ptr;
                else if (L.bias) p.epilogue = CUBLASLT_EPILOGUE_BIAS, p.bias = b.ptr;
                out_n = size_t(N) * L.OC;
            } else if (g == 1) {
                gname = "dinp";
                p.m = L.C, p.n = N, p.k = L.OC, p.A = w.ptr, p.B = dout.ptr, p.D = out.ptr;
                if (L.dgelu_bwd) p.epilogue = CUBLASLT_EPILOGUE_DGELU, p.aux = aux.ptr;
                out_n = size_t(N) * L.C;
            } else if (g == 5) {
                gname = "dinp+bgr";
                if (!L.dgelu_bwd) continue;
                p.m = L.C, p.n = N, p.k = L.OC, p.A = w.ptr, p.B = dout.ptr, p.D = out.ptr;
                p.epilogue = CUBLASLT_EPILOGUE_DGELU_BGRAD, p.aux = aux.ptr, p.bgrad = db.ptr;
                out_n = size_t(N) * L.C;
            } else {
                gname = g == 2 ? "dweight" : g == 3 ? "dw+db16" : "dw+db32";
                if (g >= 3 && !L.bias) continue;
                p.tb = CUBLAS_OP_T, p.m = L.C, p.n = L.OC, p.k = N, p.A = inp.ptr, p.B = dout.ptr, p.D = dw.ptr, p.beta = 1.0f;
                if (g >= 3) p.epilogue = CUBLASLT_EPILOGUE_BGRADB, p.bgrad = g == 3 ? (void*)db.ptr : (void*)bgrad.ptr;
                p.bgrad_fp32 = g == 4;
                out_n = size_t(L.C) * L.OC;
            }
            LtSetup s;
            lt_setup<bf16>(s, p, max_algos);
            if (s.algos.empty()) {
                printf("%-8s %-8s 3: no cuBLASLt algorithm\n", L.name, gname);
                continue;
            }
            // The first algorithm's output hash, for the bit comparison (matmul_tune's hash; dweight
            // from the same start).
            auto reset = [&] { if (p.beta != 0.0f) cuda_check(cudaMemcpy(dw.ptr, dw_init.ptr, out_n * 2, cudaMemcpyDeviceToDevice)); };
            reset();
            const bool first_ok = lt_run(s, p, 0);
            const unsigned long long first_hash = hash_bits(static_cast<const bf16*>(p.D), out_n, 0);
            float best = 1e30f;
            int best_i = -1;
            for (int i = 0; i < (int)s.algos.size(); i++) {
                reset();
                if (!lt_run(s, p, i)) {
                    printf("%-8s %-8s 3 #%-2d refused at run time\n", L.name, gname, i);
                    continue;
                }
                const bool same = first_ok && hash_bits(static_cast<const bf16*>(p.D), out_n, 0) == first_hash;
                const float ms = time_median_ms([&] { lt_run(s, p, i); }, 3, 20);
                char extra[200];
                snprintf(extra, sizeof(extra), "%s | %s", same ? "same bits as #0" : "bits differ from #0",
                         matmul_algo_name(s.algos[i].algo).c_str());
                report(L.name, gname, "3 #" + std::to_string(i), ms, flops, extra);
                if (ms < best) best = ms, best_i = i;
            }
            reset();
            printf("%-8s %-8s best #%d %.4f ms\n", L.name, gname, best_i, best);
            if (g < 3) best_g[g] = std::min(best_g[g], best);
        }
        total_best += per_step * (best_g[0] + best_g[1] + best_g[2] + b_ms);
    }
    printf("\nper step (12 layers + LM head, dbias as the header's): header %.2f ms, best of header and version 3 per GEMM "
           "%.2f ms\n", total_header, total_best);
    printf("residual epilogue (attproj and fcproj forward, 12 layers): %+.2f ms a step over the forwards without it, "
           "against 24 fused residual + LayerNorm forwards that become plain LayerNorms\n", total_residual);
    printf("matmul tuning%s: %zu plans tuned, %zu kept an algorithm other than the heuristic's first\n",
           blas().tune_wide ? " (--wide: the configurations around the heuristic's)" : "", blas().tuned_plans,
           blas().tuned_changed);
}

void usage(FILE* f) {
    fprintf(f,
            "usage: matmul [--check] [--force] [--rows N] [--algos K] [--wide]\n"
            "  --check    validate every version at small shapes (no benchmark)\n"
            "  --force    benchmark even when validation failed (it says so)\n"
            "  --rows N   rows of the benchmark's activations (default 65536 = B 64 x T 1024)\n"
            "  --algos K  cuBLASLt algorithms asked of the heuristic per GEMM (default 16)\n"
            "  --wide     the header tunes each plan also over the configurations around the heuristic's list\n"
            "             (train_gpt -tw 1); one line per plan says what it kept\n");
}

int main(int argc, char** argv) {
    bool check = false, force = false, wide = false;
    int rows = 65536, algos = 16;
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
        } else if (a == "--wide") {
            wide = true;
        } else if (a == "--rows") {
            rows = parse_int(value(), "--rows", 1, usage);
        } else if (a == "--algos") {
            algos = parse_int(value(), "--algos", 1, usage);
        } else {
            usage(stderr);
            fail("unknown flag '%s'", a.c_str());
        }
    }
    const bool gpu = cuda_device_available();
    if (!check && !gpu) fail("no CUDA device: the benchmark needs a GPU (--check alone reports skips)");
    TestCounter tests;
    if (gpu) {
        blas_init(size_t(std::max(rows, 1024)));
        blas_init_ones<float>(size_t(std::max(rows, 1024)));  // fp32 and bf16 run side by side here
        blas_init_ones<__nv_bfloat16>(size_t(std::max(rows, 1024)));
    }
    blas().tune_wide = wide;  // validation then checks what the wide tuning keeps, too
    check_all(tests, gpu);
    blas().tune_print = true;  // the benchmark's plans: one line each as it is tuned
    if (check) return tests.finish();
    if (tests.failed && !force) {
        tests.finish();
        fail("validation failed: no benchmark (--force benchmarks anyway)");
    }
    if (tests.failed) printf("VALIDATION FAILED (%d): benchmarking anyway (--force)\n", tests.failed);
    benchmark(rows, algos);
    return tests.finish();
}
