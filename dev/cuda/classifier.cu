// classifier.cu: the fused softmax cross-entropy laboratory (classifier.cuh). Versions 1, 2 and 5 are
// the header's kernels, 3 and 4 the lab's own (below), each launched directly, so each is measured on
// its own; training runs version 5 wherever it applies, else 2, else 1 (the header's fused_classifier
// picks). Every version is validated against a double-precision CPU reference at many shapes, then
// benchmarked.
//
//   make dev/cuda/classifier
//   ./dev/cuda/classifier            validate, then benchmark every version (bf16, rows 16384, V 50257, Vp 50304)
//   ./dev/cuda/classifier 2          only version 2
//   ./dev/cuda/classifier 2 3 4 5    versions 2 to 5 (validated, then benchmarked side by side)
//   ./dev/cuda/classifier --check    validation only (what CI runs; skips without a GPU)
//   ./dev/cuda/classifier -h         the usage (--rows, --V, --Vp, --dtype)
//
// Contract (every version), per row of logits (rows, Vp), only the first V columns taking part
// (V..Vp-1 are vocabulary padding): loss[row] = logsumexp(logits[row, 0:V]) - logits[row, target].
// With dloss != 0 the row is overwritten in place with dlogits = (softmax - onehot(target)) * dloss
// and the padding columns with 0; with dloss == 0 the logits are left untouched (loss only).
//
// Versions:
//   1  the header's fused_classifier_kernel: one 1024-thread block per row, scalar loads (any Vp, any
//      alignment). One pass over the row for an online max/sum updated per value (a running maximum
//      and a sum rescaled when it grows: two expf per value), a fixed-order block reduction, then a
//      second pass that writes dlogits (the row is still in L2). What training runs on shapes where
//      version 2 does not apply.
//   2  the header's fused_classifier_vec_kernel (what training runs where 5 does not fit): 512
//      threads per row, 16-byte loads and stores, 4 vectors loaded per thread before any is used
//      (more bytes in flight), the online max/sum updated once per vector of 4 (fp32) or 8 (bf16)
//      values, __expf instead of expf, streaming loads and stores in the second pass. Needs Vp a multiple of the vector size
//      and 16-byte aligned logits; on any other shape the lab says so and does not run it (it never
//      runs version 1 in its place).
//   3  the lab's fused_classifier_registers_kernel, ClassifierRegistersWide (1024 threads, 7 slots,
//      exponentials computed again): the row read from memory once and kept in registers as packed
//      32-bit words, thread t holding vectors t, t + 1024, ... (Vp <= 57344 in bf16, 28672 in fp32),
//      all 7 streaming loads issued before any value is used (the whole 100 KB row in flight per
//      SM). Slots past the real columns hold -inf, so the maximum (no exponential), then the sum of
//      exponentials, need no per-value test; a plain block max and a fixed-order block sum replace
//      the online combine; then dlogits from the registers, streaming stores. Why it should be
//      faster: DRAM sees one read and one write per value (version 2 reads the row twice, counting on
//      L2 for the second) and there is no running rescale. The risk: at 1024 threads a thread has 64
//      registers (one block per SM), so its loads do not overlap its own reductions and exponentials
//      (other SMs' loads keep DRAM busy meanwhile), and the exponentials of the sum cannot stay in
//      registers: two per value, as version 2 (28 registers of row data; 62 used, no spills).
//   4  the same kernel, ClassifierRegistersNarrow (512 threads, 13 slots, exponentials kept): Vp <=
//      53248 in bf16, 26624 in fp32. The 104 exponentials of the sum stay in registers for the
//      dlogits (the row's words are dead by then): one exponential per value, half of 3's and 2's
//      (MUFU.EX2 issues 16 a clock per SM: two per value of a GPT-2 row take ~3.6 us of an SM at
//      1.75 GHz, against ~8.8 us for the row's 200 KB of DRAM traffic at 3 TB/s over 132 SMs), at 128
//      registers a thread, one block per SM, 16 warps each with twice 3's loads in flight. Measured
//      against 3: fewer exponentials, fewer warps.
//   5  the header's fused_classifier_shared_kernel<T, 512> (what training runs): the row kept in
//      shared memory instead, copied by cp.async (16 bytes a copy, every copy issued before the
//      wait, no registers held), so a bf16 GPT-2 row (100 KB) lets two 512-thread blocks share an
//      SM: one block's loads overlap the other's reductions and exponentials, which versions 3 and 4
//      cannot do. Max, then sum, then dlogits as in 3 (two exponentials per value), reading the row
//      from shared memory three times. Needs Vp * sizeof(T) within the device's shared memory per
//      block (227 KB on the H100: fp32 GPT-2 rows fit, one block per SM), besides version 2's
//      conditions.
//   Versions 3-5 need what version 2 needs, plus a row that fits; elsewhere the lab says so and does
//   not run them (the header's fused_classifier falls back from 5 to 2, else 1).
//
// Bandwidth: minimal bytes = rows*Vp*sizeof(T) read + rows*Vp*sizeof(T) written, + rows*4 (losses)
// + rows*4 (targets), negligible (8 bytes a row against 200 KB a row for GPT-2 in bf16) but counted.
// Versions 1 and 2 read the row a second time (from L2), not counted; 3-5 read it once. Reported as a
// fraction of a device-to-device copy measured in the same run, with each kernel's registers a thread
// and resident blocks per SM (the occupancy API) beside it.

#include <cstring>
#include <string>

#include "classifier.cuh"
#include "common.cuh"
#include "dev/lab.cuh"

constexpr int kNumVersions = 5;

// Validation buffers hold this many elements before and after the rows, filled with NaN bytes and
// checked afterwards: a write outside the rows fails. A multiple of every vector size, so the rows
// keep the buffer's 16-byte alignment.
constexpr int kGuard = 16;

// ---------------------------------------------------------------------------------------------
// Inputs.
//
// Row r: offset_r + scale_r * U(-1, 1), offset in [-5, 5], scale in [0.5, 8] (softmax anywhere from
// nearly flat to peaked). Rows with r % 4 == 1 have their target's logit raised to offset + scale + 15
// (confident and right: loss near 0, p[target] near 1, dlogit[target] near 0); rows with r % 4 == 2 a
// non-target column raised the same way (confident and wrong: loss ~ 15 or more). Row 0's target is
// V - 1 and row 1's is 0 (the edge columns); the others' uniform in [0, V). So |logit| <= 28 and a
// row's max - min <= 31 (the tolerances use both). The padding columns hold NaN bytes: a kernel that
// lets them into the sum, or leaves them unwritten, fails.
constexpr double kMaxAbsLogit = 28.0, kMaxSpread = 32.0;

template <typename T> void set_nan_bytes(T* x, size_t n) { std::memset(static_cast<void*>(x), 0xff, n * sizeof(T)); }

template <typename T>
void make_inputs(std::vector<T>& logits, std::vector<int>& targets, int rows, int V, int Vp, Rng& rng) {
    logits.assign(size_t(rows) * Vp, from_float<T>(0.0f));
    targets.assign(rows, 0);
    for (int r = 0; r < rows; r++) {
        T* x = logits.data() + size_t(r) * Vp;
        const float offset = rng.uniform(-5.0f, 5.0f), scale = rng.uniform(0.5f, 8.0f);
        for (int c = 0; c < V; c++) x[c] = from_float<T>(offset + scale * rng.uniform(-1.0f, 1.0f));
        set_nan_bytes(x + V, Vp - V);
        targets[r] = r == 0 ? V - 1 : r == 1 ? 0 : int(rng.next() % uint64_t(V));
        int spike = -1;
        if (r % 4 == 1) spike = targets[r];
        if (r % 4 == 2 && V > 1) spike = (targets[r] + 1 + int(rng.next() % uint64_t(V - 1))) % V;  // any other column
        if (spike >= 0) x[spike] = from_float<T>(offset + scale + 15.0f);
    }
}

// ---------------------------------------------------------------------------------------------
// CPU reference, in double: per row s = sum_c exp(x_c - m) over the first V columns (m = their max,
// so nothing overflows), loss = log(s) + (m - x[target]) (logsumexp - x[target], without forming
// logsumexp = m + log(s), whose rounding at the scale of |m| would not shrink with the loss),
// prob_c = exp(x_c - m) / s (0 in the padding). The inputs are T values, read exactly. dlogits follow
// from prob for any dloss.

template <typename T>
void classifier_reference(double* loss, double* prob, const T* logits, const int* targets, int rows, int V, int Vp) {
    for (int r = 0; r < rows; r++) {
        const T* x = logits + size_t(r) * Vp;
        double m = -INFINITY, s = 0.0;
        for (int c = 0; c < V; c++) m = std::max(m, to_double(x[c]));
        for (int c = 0; c < V; c++) s += std::exp(to_double(x[c]) - m);
        loss[r] = std::log(s) + (m - to_double(x[targets[r]]));
        double* p = prob + size_t(r) * Vp;
        for (int c = 0; c < Vp; c++) p[c] = c < V ? std::exp(to_double(x[c]) - m) / s : 0.0;
    }
}

inline double reference_dlogit(double prob, int c, int target, double dloss) {
    return (prob - (c == target ? 1.0 : 0.0)) * dloss;
}

// Host-only: the reference against values computed independently (Python's math.exp and math.log
// in double), so the yardstick itself is checked even where there is no GPU.
bool reference_self_test_one(const char* what, const std::vector<float>& logits, int V, int target, double dloss,
                             double want_loss, const std::vector<double>& want_dlogits) {
    const int Vp = int(logits.size());
    double loss = 0.0;
    std::vector<double> prob(Vp), dl(Vp);
    classifier_reference(&loss, prob.data(), logits.data(), &target, 1, V, Vp);
    for (int c = 0; c < Vp; c++) dl[c] = reference_dlogit(prob[c], c, target, dloss);
    printf("%s\n", what);
    bool ok = check_close("loss", &loss, &want_loss, 1, 1e-14, 1e-14);
    ok &= check_close("dlogits", dl.data(), want_dlogits.data(), Vp, 1e-14, 1e-14);
    return ok;
}

void reference_self_test(TestCounter& tests) {
    // softmax(1, 2, 3) = (0.0900305731703804, 0.244728471054798, 0.665240955774822), lse 3.40760596444438;
    // the NaN padding column must neither enter the sum nor get a gradient.
    tests.record(reference_self_test_one("reference self-test: logits (1, 2, 3 | NaN padding), target 2, dloss 1",
                                         {1.0f, 2.0f, 3.0f, NAN}, 3, 2, 1.0, 0.4076059644443806,
                                         {0.09003057317038043, 0.24472847105479759, -0.3347590442251783, 0.0}));
    // exp(1000) overflows a double: only a max-subtracted logsumexp gets log 2.
    tests.record(reference_self_test_one("reference self-test: logits (1000, 1000), target 0, dloss 1", {1000.0f, 1000.0f},
                                         2, 0, 1.0, 0.6931471805599453, {-0.5, 0.5}));
    // dloss scales every column; lse = 4.0 + log(1 + e^-6.5 + e^-3.5 + e^-3) = 4.078337769846363.
    tests.record(reference_self_test_one("reference self-test: logits (-2.5, 0.5, 4, 1), target 1, dloss 0.25",
                                         {-2.5f, 0.5f, 4.0f, 1.0f}, 4, 1, 0.25, 3.578337769846363,
                                         {0.00034753953454134934, -0.24301948184670227, 0.2311630135523105,
                                          0.011508928759850342}));
}

// ---------------------------------------------------------------------------------------------
// Versions 3 and 4: the row kept in registers (the lab's own kernel; training runs version 5).

// The register kernels' shapes: BLOCK threads holding VPT 16-byte vectors each (Vp <= BLOCK * VPT * 8
// in bf16, half that in fp32), KEEP_EXP whether the exponentials of the sum are kept in registers for
// the dlogits (one exponential a value, VPT * 8 more floats a thread in bf16) or computed again.
// Version 3: 1024 x 7 hold Vp <= 57344 (GPT-2's 50304) within 64 registers a thread (one block per
// SM) only by computing the exponentials again. Version 4: 512 x 13 hold Vp <= 53248 and keep them,
// 128 registers a thread, one block per SM. fp32 GPT-2 rows (Vp > 28672) fit neither: the vector
// kernel runs them.
template <int BLOCK_, int VPT_, bool KEEP_EXP_> struct ClassifierRegisters {
    static constexpr int BLOCK = BLOCK_, VPT = VPT_;
    static constexpr bool KEEP_EXP = KEEP_EXP_;
};
using ClassifierRegistersWide = ClassifierRegisters<1024, 7, false>;   // version 3
using ClassifierRegistersNarrow = ClassifierRegisters<512, 13, true>;  // version 4

// Registers: one block per row, vector i of the row held by thread i % BLOCK in slot i / BLOCK, for
// Vp <= BLOCK * VPT * VS. Slots past the real columns (the padding in the last vector with real
// columns, the padding-only vectors, the slots past the row) hold -inf, so the maximum and the sum
// need no per-value test: exp(-inf - m) = 0. Loads and stores are streaming (evict-first: each line
// is read once and written once).
template <typename T, int BLOCK, int VPT, bool KEEP_EXP>
__global__ void __launch_bounds__(BLOCK, 1)
    fused_classifier_registers_kernel(T* logits, float* losses, const int* targets, float dloss, int V, int Vp) {
    constexpr int VS = Vec128<T>::size;
    __shared__ float smax[BLOCK / 32], ssum[BLOCK / 32];
    T* x = logits + size_t(blockIdx.x) * Vp;
    const int vectors = Vp / VS, vectors_with_v = (V + VS - 1) / VS;
    const int target = targets[blockIdx.x];
    uint4 v[VPT];  // slot u: vector threadIdx.x + u * BLOCK of the row
#pragma unroll
    for (int u = 0; u < VPT; u++) {  // every load issued before any value is used
        const int i = threadIdx.x + u * BLOCK;
        v[u] = make_uint4(kNegInfWord<T>, kNegInfWord<T>, kNegInfWord<T>, kNegInfWord<T>);
        if (i < vectors_with_v) v[u] = __ldcs(reinterpret_cast<const uint4*>(x + size_t(i) * VS));
    }
    // The vector holding columns V - V % VS .. V - 1 and then padding, and the target's vector (its
    // logit read from the registers). Tests on each slot, not a slot index computed from the column:
    // a computed index would put v in local memory.
    const int tail = V % VS != 0 ? V / VS : -1;
    float target_logit = 0.0f;
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        const int i = threadIdx.x + u * BLOCK;
        if (i == tail) v[u] = with_negative_infinity_from<T>(v[u], V % VS);
        if (i == target / VS) {
#pragma unroll
            for (int j = 0; j < VS; j++)
                if (j == target % VS) target_logit = value_of<T>(v[u], j);
        }
    }
    float m = -INFINITY;
#pragma unroll
    for (int u = 0; u < VPT; u++) m = vec_max<T>(v[u], m);
    m = block_max<BLOCK>(m, smax);
    float e[KEEP_EXP ? VPT : 1][VS];  // KEEP_EXP: the exponentials, kept for the dlogits
    float s = 0.0f;
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        float eu[VS];
        vec_exp<T>(v[u], m, eu);
        s += vec_sum<T>(eu);  // one partial sum per vector
        if constexpr (KEEP_EXP) {
#pragma unroll
            for (int j = 0; j < VS; j++) e[u][j] = eu[j];
        }
    }
    s = block_sum<BLOCK>(s, ssum);
    if (threadIdx.x == (target / VS) % BLOCK) losses[blockIdx.x] = logf(s) + m - target_logit;
    if (dloss == 0.0f) return;
    const float inv = 1.0f / s;
    // Without KEEP_EXP the exponentials are computed again from the row's values. The empty asm makes
    // m a value the compiler cannot prove equal to the one above (it is), so it cannot merge the two
    // sets of exponentials and keep VPT * VS floats alive across the reduction (over 64 registers at
    // 1024 threads: spills).
    if constexpr (!KEEP_EXP) asm volatile("" : "+f"(m));
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        const int i = threadIdx.x + u * BLOCK;
        if (i >= vectors) continue;
        float eu[VS];
        if constexpr (KEEP_EXP) {
#pragma unroll
            for (int j = 0; j < VS; j++) eu[j] = e[u][j];
        } else {
            vec_exp<T>(v[u], m, eu);
        }
        dlogits_of<T>(eu, inv, i, target, dloss).store_stream(x + size_t(i) * VS);
    }
}

template <typename C, typename T> bool classifier_registers_fit(const T* logits, int Vp) {
    return classifier_vectors_fit(logits, Vp) && Vp <= C::BLOCK * C::VPT * Vec128<T>::size;
}

template <typename C, typename T>
void fused_classifier_registers(T* logits, float* losses, const int* targets, float dloss, int rows, int V, int Vp,
                                cudaStream_t stream = 0) {
    fused_classifier_registers_kernel<T, C::BLOCK, C::VPT, C::KEEP_EXP>
        <<<rows, C::BLOCK, 0, stream>>>(logits, losses, targets, dloss, V, Vp);
    cuda_check_launch();
}

// ---------------------------------------------------------------------------------------------
// Dispatch: one block per row; the header's kernels launched directly with its block sizes (1, 2) or
// through its launch function (5, which sets the shared-memory attributes it needs), the lab's
// register kernel through its own (3, 4).

using Wide = ClassifierRegistersWide;      // version 3
using Narrow = ClassifierRegistersNarrow;  // version 4

template <typename C, typename T> const void* registers_kernel() {
    return (const void*)fused_classifier_registers_kernel<T, C::BLOCK, C::VPT, C::KEEP_EXP>;
}

int version_threads(int version) {
    switch (version) {
        case 1: return kClassifierThreads;
        case 2: return kClassifierVecThreads;
        case 3: return Wide::BLOCK;
        case 4: return Narrow::BLOCK;
        case 5: return kClassifierSharedThreads;
        default: fail("version %d does not exist (1..%d)", version, kNumVersions);
    }
}

// Why `version` cannot run on these logits (the header's own conditions decide), or "" when it can.
// The shared-memory limit of version 5 is the device's: without one (`device` false) it is not
// checked.
template <typename C, typename T> std::string registers_missing(const T* logits, int Vp) {
    if (classifier_registers_fit<C>(logits, Vp)) return "";
    char why[200];
    snprintf(why, sizeof(why), "Vp > %d threads x %d vectors x %d values = %d, what the registers hold", C::BLOCK,
             C::VPT, Vec128<T>::size, C::BLOCK * C::VPT * Vec128<T>::size);
    return why;
}

template <typename T> std::string version_missing(int version, const T* logits, int Vp, bool device = true) {
    if (version == 1) return "";
    if (!classifier_vectors_fit(logits, Vp)) {
        if (Vp % Vec128<T>::size != 0) return sizeof(T) == 2 ? "Vp not a multiple of 8" : "Vp not a multiple of 4";
        return "logits not 16-byte aligned";
    }
    if (version == 3) return registers_missing<Wide>(logits, Vp);
    if (version == 4) return registers_missing<Narrow>(logits, Vp);
    if (version == 5 && device && !classifier_shared_fits(logits, Vp)) {
        char why[200];
        snprintf(why, sizeof(why), "a row of %zu bytes > %d bytes of shared memory a block", size_t(Vp) * sizeof(T),
                 classifier_shared_max_bytes<T>());
        return why;
    }
    return "";
}

// What the header runs where `version` does not apply: never run by the lab in its place.
template <typename T> int header_fallback(int version, const T* logits, int Vp) {
    return version >= 3 && version_missing<T>(2, logits, Vp).empty() ? 2 : 1;
}

template <typename T>
void run_version(int version, T* logits, float* losses, const int* targets, float dloss, int rows, int V, int Vp) {
    const std::string why = version_missing<T>(version, logits, Vp);
    if (!why.empty()) fail("version %d cannot run here: %s", version, why.c_str());
    switch (version) {
        case 1:
            fused_classifier_kernel<T><<<rows, kClassifierThreads>>>(logits, losses, targets, dloss, V, Vp);
            break;
        case 2:
            fused_classifier_vec_kernel<T><<<rows, kClassifierVecThreads>>>(logits, losses, targets, dloss, V, Vp);
            break;
        case 3:
            fused_classifier_registers<Wide>(logits, losses, targets, dloss, rows, V, Vp);
            break;
        case 4:
            fused_classifier_registers<Narrow>(logits, losses, targets, dloss, rows, V, Vp);
            break;
        case 5:
            fused_classifier_shared<T>(logits, losses, targets, dloss, rows, V, Vp);
            break;
        default:
            fail("version %d does not exist (1..%d)", version, kNumVersions);
    }
    cuda_check_launch();
}

// Registers a thread and resident blocks per SM of `version`'s kernel at row length Vp.
template <typename T> void version_occupancy(int version, int Vp, int* regs, int* blocks_per_sm) {
    const void* kernel = nullptr;
    size_t smem = 0;
    switch (version) {
        case 1: kernel = (const void*)fused_classifier_kernel<T>; break;
        case 2: kernel = (const void*)fused_classifier_vec_kernel<T>; break;
        case 3: kernel = registers_kernel<Wide, T>(); break;
        case 4: kernel = registers_kernel<Narrow, T>(); break;
        case 5:
            kernel = (const void*)fused_classifier_shared_kernel<T, kClassifierSharedThreads>;
            smem = size_t(Vp) * sizeof(T);
            classifier_shared_max_bytes<T>();  // its attributes set, as before a launch
            break;
        default: fail("version %d does not exist (1..%d)", version, kNumVersions);
    }
    cudaFuncAttributes attr;
    cuda_check(cudaFuncGetAttributes(&attr, kernel));
    *regs = attr.numRegs;
    cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, kernel, version_threads(version), smem));
}

// ---------------------------------------------------------------------------------------------
// Tolerances (u = 2^-24, the fp32 unit roundoff; every version computes in fp32). Worst-case
// bounds, not estimates: roundings are assumed to add up with the same sign.
//
// One exponential: the argument a = x - m <= 0 is rounded (relative error |a| u on exp(a)), then
// __expf (versions 2-5) is within 2 + 1.173 |a| ulp (the CUDA Programming Guide's bound; an ulp is at
// most 2 u relative): <= (4 |a| + 4) u in all. expf (version 1, reductions) is within 2 ulp, 4 u.
//
// The sum s = sum_c exp(x_c - m): its relative error E is the sum of
//   - each thread's sequential chain: version 1 updates per value (two expf, a product, a sum: 6 u)
//     over ceil(V / 1024) values; version 2 per vector (VS - 1 additions inside the vector, then a
//     rescale by __expf, a product, a sum: VS + 6 u) over ceil(V / VS / 512) vectors; versions 3-5
//     add VS values inside a vector and the vector's sum to the thread's (VS u, no rescale: the
//     maximum is known first) over ceil(V / VS / P) vectors, P their threads, so version 2's
//     bound with P threads holds for them too, the slots holding -inf adding exact zeros;
//   - the reduction: 5 shuffle combines then one combine per warp in a fixed order (32 or 16), 6 u
//     each (versions 3-5 add plainly, u each: within it);
//   - the terms' own exponentials, weighted by the terms: at most (4 kMaxSpread + 4) u, and 4 u
//     margin.
// For V = 50257 that is 3.9e-5 (version 1) and 2.7e-5 (version 2, bf16), the "~1e-5 relative" one
// expects of fp32 over 50k terms.
//
// loss = (log(s) + m) - x[target], in fp32: log's error is s's relative error, E, plus one ulp of
// log(s) (0 <= log s <= log V: <= 2 log V u) and the rounding of log(s) + m (<= (log V +
// kMaxAbsLogit) u), which do not shrink with the loss (the subtraction of x[target] cancels): atol
// E + 2 (3 log V + kMaxAbsLogit) u, twice what they add up to; the final subtraction: rtol 2 u. The
// loss is fp32 in both storages, so bf16 has the same bound (its inputs are bf16 values that the
// reference reads exactly).
//
// dlogits: p = exp(x - m) / s per element has relative error p_rel = E + (4 kMaxSpread + 4) u (its
// exponential) + 2 u (1 / s and the product) + 2 u margin. Non-target columns are p * dloss: purely
// relative, rtol p_rel + 2 u, no absolute slack (nothing underflows: p > e^-32 / V). The target
// column is (p - 1) * dloss: p's error p_rel * p <= p_rel, plus u for p - 1, does not shrink with
// |p - 1|: atol |dloss| (p_rel + 2 u), rtol 2 u. bf16 stores each dlogit rounded to nearest: half an
// ulp, at most 2^-8 of the value, which is within the fp32 bound of the reference: the fp32 bounds
// times (1 + 2^-8), plus 2^-8 relative. (A host emulation of both kernels' fp32 arithmetic and
// reduction order on these inputs, every exponential off by its full bound in the same direction,
// used 24-47% of the loss bound, 20-46% of the fp32 dlogit bounds, up to 57% of the bf16 target
// bound and 99% of the bf16 non-target bound: the rounding alone reaches 2^-8 just above a power of
// two, so that bound cannot be tighter.) Padding columns must be exactly 0 (bound 0), and with
// dloss = 0 the buffer must be byte-identical to what was uploaded.
constexpr double kU = 1.0 / (1 << 24);

struct Bounds {
    double loss_atol, loss_rtol, nontarget_rtol, target_atol, target_rtol;
};

inline double ceil_div(double a, double b) { return std::ceil(a / b); }

template <typename T> Bounds bounds_for(int version, int V, float dloss) {
    constexpr int VS = Vec128<T>::size;
    const int P = version_threads(version);
    const double chain = version == 1 ? 6.0 * ceil_div(V, P) : (VS + 6.0) * ceil_div(ceil_div(V, VS), P);
    const double E = (chain + 6.0 * (P / 32 + 5) + 4.0 * kMaxSpread + 8.0) * kU;
    const double p_rel = E + (4.0 * kMaxSpread + 8.0) * kU;
    const double store = sizeof(T) == 2 ? std::ldexp(1.0, -8) : 0.0;  // bf16 rounding of dlogits
    Bounds b;
    b.loss_atol = E + 2.0 * (3.0 * std::log(double(V)) + kMaxAbsLogit) * kU;
    b.loss_rtol = 2.0 * kU;
    b.nontarget_rtol = (p_rel + 2.0 * kU) * (1.0 + store) + store;
    b.target_atol = std::fabs(double(dloss)) * (p_rel + 2.0 * kU) * (1.0 + store);
    b.target_rtol = 2.0 * kU * (1.0 + store) + store;
    return b;
}

// ---------------------------------------------------------------------------------------------
// Validation.

const int kCheckRows[] = {1, 7, 300};
struct VocabShape {
    int V, Vp;
};
// V = 1 (a one-hot softmax), padding of 7 (all but one column of a bf16 vector), Vp odd (no vector
// path), Vp = V and Vp > V at small, medium and GPT-2 sizes; 4104 = 8 * 513 is a whole number of
// vectors but not of the vector kernel's 512-thread sweeps.
const VocabShape kCheckShapes[] = {{1, 1},       {1, 8},       {33, 33},     {33, 40},
                                   {1000, 1000}, {1000, 1024}, {4100, 4104}, {50257, 50304}};

// One (dtype, rows, V, Vp): inputs and reference, shared by every version, dloss and alignment.
template <typename T> struct Case {
    int rows = 0, V = 0, Vp = 0;
    std::vector<T> logits;     // (rows, Vp), NaN bytes in the padding
    std::vector<int> targets;  // (rows)
    std::vector<double> loss;  // (rows) reference
    std::vector<double> prob;  // (rows, Vp) reference softmax, 0 in the padding
};

template <typename T> Case<T> make_case(int rows, int V, int Vp, uint64_t seed) {
    Case<T> c;
    c.rows = rows, c.V = V, c.Vp = Vp;
    Rng rng(seed);
    make_inputs(c.logits, c.targets, rows, V, Vp, rng);
    c.loss.resize(rows);
    c.prob.resize(size_t(rows) * Vp);
    classifier_reference(c.loss.data(), c.prob.data(), c.logits.data(), c.targets.data(), rows, V, Vp);
    return c;
}

// Byte-for-byte comparison of n elements, printed like check_close.
template <typename T> bool check_same_bytes(const char* what, const T* got, const T* want, size_t n) {
    size_t first = n, bad = 0;
    for (size_t i = 0; i < n; i++)
        if (std::memcmp(got + i, want + i, sizeof(T)) != 0) {
            if (first == n) first = i;
            bad++;
        }
    if (bad) printf("  %-40s FAIL  first differing element [%zu]  (%zu/%zu differ)\n", what, first, bad, n);
    else printf("  %-40s ok    byte-identical (%zu elements)\n", what, n);
    return bad == 0;
}

template <typename T> bool check_one(const Case<T>& c, int version, float dloss, int shift) {
    const int rows = c.rows, V = c.V, Vp = c.Vp;
    const size_t n = size_t(rows) * Vp;
    std::vector<T> before(n + 2 * kGuard);  // guard | rows | guard
    set_nan_bytes(before.data(), before.size());
    std::copy(c.logits.begin(), c.logits.end(), before.begin() + kGuard);
    DeviceBuffer<T> d_logits(before.size(), "logits", shift);
    DeviceBuffer<int> d_targets(rows, "targets");
    DeviceBuffer<float> d_losses(rows, "losses");
    d_logits.upload(before);
    d_targets.upload(c.targets);
    d_losses.poison();
    T* logits = d_logits.ptr + kGuard;
    run_version<T>(version, logits, d_losses.ptr, d_targets.ptr, dloss, rows, V, Vp);
    cuda_check(cudaDeviceSynchronize());

    const Bounds b = bounds_for<T>(version, V, dloss);
    const auto losses = d_losses.download();
    const auto after = d_logits.download();
    bool ok = check_close("loss (fp32)", losses.data(), c.loss.data(), rows, b.loss_atol, b.loss_rtol);
    if (dloss == 0.0f) {
        ok &= check_same_bytes("logits untouched (dloss = 0)", after.data(), before.data(), after.size());
        // The header promises the same bits every run (fixed-order reductions).
        d_losses.poison();
        run_version<T>(version, logits, d_losses.ptr, d_targets.ptr, dloss, rows, V, Vp);
        const auto again = d_losses.download();
        ok &= check_same_bytes("loss, second run (deterministic)", again.data(), losses.data(), rows);
        return ok;
    }
    std::vector<T> guards_after(after.begin(), after.begin() + kGuard);
    std::vector<T> guards_before(before.begin(), before.begin() + kGuard);
    guards_after.insert(guards_after.end(), after.end() - kGuard, after.end());
    guards_before.insert(guards_before.end(), before.end() - kGuard, before.end());
    ok &= check_same_bytes("guards before and after the rows", guards_after.data(), guards_before.data(), 2 * kGuard);
    std::vector<T> nontarget, target, padding;
    std::vector<double> nontarget_ref, target_ref;
    nontarget.reserve(size_t(rows) * V), nontarget_ref.reserve(size_t(rows) * V);
    for (int r = 0; r < rows; r++) {
        const T* d = after.data() + kGuard + size_t(r) * Vp;
        const double* p = c.prob.data() + size_t(r) * Vp;
        for (int col = 0; col < Vp; col++) {
            const double ref = reference_dlogit(p[col], col, c.targets[r], dloss);
            if (col >= V) padding.push_back(d[col]);
            else if (col == c.targets[r]) target.push_back(d[col]), target_ref.push_back(ref);
            else nontarget.push_back(d[col]), nontarget_ref.push_back(ref);
        }
    }
    const std::vector<double> zeros(padding.size(), 0.0);
    ok &= check_close("dlogits, non-target columns", nontarget.data(), nontarget_ref.data(), nontarget.size(), 0.0,
                      b.nontarget_rtol);
    ok &= check_close("dlogits, target column", target.data(), target_ref.data(), target.size(), b.target_atol,
                      b.target_rtol);
    if (!padding.empty())
        ok &= check_close("dlogits, padding columns (exactly 0)", padding.data(), zeros.data(), padding.size(), 0.0, 0.0);
    return ok;
}

template <typename T> void check_all(TestCounter& tests, bool gpu, const std::vector<int>& versions) {
    uint64_t seed = sizeof(T) * 1000;
    for (int rows : kCheckRows)
        for (const VocabShape& s : kCheckShapes) {
            seed++;
            Case<T> c;
            if (gpu) c = make_case<T>(rows, s.V, s.Vp, seed);  // fresh inputs for every shape
            for (int v : versions)
                for (int shift : {0, 1}) {
                    if (shift && v >= 2) continue;  // misaligned logits: version 1 only (the header's fallback)
                    for (float dloss : {0.0f, 1.0f / rows}) {
                        char name[200];
                        const std::string dloss_name = dloss == 0.0f ? "0" : "1/" + std::to_string(rows);
                        snprintf(name, sizeof(name), "classifier v%d %s rows=%d V=%d Vp=%d dloss=%s %s", v, dtype_name<T>(),
                                 rows, s.V, s.Vp, dloss_name.c_str(), shift ? "misaligned" : "aligned");
                        // Validation buffers are 256-byte aligned plus kGuard elements: only Vp decides.
                        const T* aligned = nullptr;
                        const std::string why = version_missing<T>(v, aligned, s.Vp, gpu);
                        if (!why.empty()) {
                            printf("%s: not run (%s: version %d does not apply; the header falls back to version %d here)\n", name,
                                   why.c_str(), v, header_fallback<T>(v, aligned, s.Vp));
                            continue;
                        }
                        if (!gpu) {
                            tests.skip(name);
                            continue;
                        }
                        printf("%s\n", name);
                        tests.record(check_one(c, v, dloss, shift));
                    }
                }
        }
}

// ---------------------------------------------------------------------------------------------
// Benchmark: dloss = 1/rows (as training's 1 / (B T)), so every run reads the row and overwrites it
// in place. The runs repeat on the same buffer: after the first it holds dlogits (small values, a
// nearly flat softmax), which are as good as logits for timing (the work does not depend on the
// values), and restoring the input before each run would cost more than the run itself.

template <typename T> void benchmark(const std::vector<int>& versions, int rows, int V, int Vp, double copy_gbs) {
    printf("\nclassifier benchmark, %s, rows = %d, V = %d, Vp = %d, dloss = 1/rows (median of 100 runs after 10 warm-ups)\n",
           dtype_name<T>(), rows, V, Vp);
    printf("  bytes = rows*Vp*sizeof(T) read + rows*Vp*sizeof(T) written + rows*4 (losses) + rows*4 (targets)\n");
    printf("  %-8s %-6s %10s %10s %8s %6s %10s\n", "version", "dtype", "time (us)", "GB/s", "% copy", "regs",
           "blocks/SM");
    const size_t n = size_t(rows) * Vp;
    DeviceBuffer<T> logits(n, "logits (benchmark)");
    DeviceBuffer<int> targets(rows, "targets");
    DeviceBuffer<float> losses(rows, "losses");
    // Inputs: up to 256 rows made on the host, uploaded over and over (making all rows would take
    // seconds; they are overwritten by the first run anyway).
    Rng rng(1234);
    const int block = std::min(rows, 256);
    std::vector<T> h;
    std::vector<int> ht, all_targets(rows);
    make_inputs(h, ht, block, V, Vp, rng);
    for (int r0 = 0; r0 < rows; r0 += block)
        cuda_check(cudaMemcpy(logits.ptr + size_t(r0) * Vp, h.data(), size_t(std::min(block, rows - r0)) * Vp * sizeof(T),
                              cudaMemcpyHostToDevice));
    for (int r = 0; r < rows; r++) all_targets[r] = ht[r % block];
    targets.upload(all_targets);
    const float dloss = 1.0f / rows;
    const double bytes = 2.0 * n * sizeof(T) + 8.0 * rows;
    for (int v : versions) {
        const std::string why = version_missing<T>(v, logits.ptr, Vp);
        if (!why.empty()) {
            printf("  %-8d %-6s not run: %s (version %d does not apply; the header falls back to version %d here)\n", v,
                   dtype_name<T>(), why.c_str(), v, header_fallback<T>(v, logits.ptr, Vp));
            continue;
        }
        int regs = 0, blocks_per_sm = 0;
        version_occupancy<T>(v, Vp, &regs, &blocks_per_sm);
        auto run = [&] { run_version<T>(v, logits.ptr, losses.ptr, targets.ptr, dloss, rows, V, Vp); };
        const float ms = time_median_ms(run, 10, 100);
        const double gbs = bytes / (ms * 1e-3) / 1e9;
        printf("  %-8d %-6s %10.1f %10.1f %7.1f%% %6d %10d\n", v, dtype_name<T>(), ms * 1e3, gbs, 100.0 * gbs / copy_gbs,
               regs, blocks_per_sm);
    }
}

// ---------------------------------------------------------------------------------------------

void usage(FILE* f) {
    fprintf(f,
            "usage: classifier [versions...] [--check] [--rows N] [--V V] [--Vp Vp] [--dtype fp32|bf16]\n"
            "  versions      which kernels to run (default: all, 1..%d)\n"
            "  --check       validation only: every version, every shape, fp32 and bf16 (CI)\n"
            "  --rows N      benchmark rows, B*T (default 16384)\n"
            "  --V V         benchmark vocabulary size (default 50257)\n"
            "  --Vp Vp       benchmark padded row length, >= V (default: V rounded up to a multiple of 128)\n"
            "  --dtype T     validation and benchmark dtype (default bf16, what training runs)\n"
            "  -h            this message\n",
            kNumVersions);
}

int main(int argc, char** argv) {
    std::vector<int> versions;
    bool check = false, bf16 = true;
    int rows = 16384, V = 50257, Vp = -1;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto value = [&] { return flag_value(argc, argv, i, usage); };
        if (a == "-h" || a == "--help") {
            usage(stdout);
            return 0;
        } else if (a == "--check") {
            check = true;
        } else if (a == "--rows") {
            rows = parse_int(value(), "--rows", 1, usage);
        } else if (a == "--V") {
            V = parse_int(value(), "--V", 1, usage);
        } else if (a == "--Vp") {
            Vp = parse_int(value(), "--Vp", 1, usage);
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
    if (Vp < 0) Vp = (V + 127) / 128 * 128;  // train_gpt's padded_vocab (at most 2^30, a multiple of 128)
    if (Vp < V) fail("--Vp must be >= --V, got Vp = %d, V = %d", Vp, V);
    std::vector<int> all;
    for (int v = 1; v <= kNumVersions; v++) all.push_back(v);
    const bool gpu = cuda_device_available();
    if (!check && !gpu) fail("no CUDA device: the benchmark needs a GPU (--check alone reports skips)");
    TestCounter tests;
    reference_self_test(tests);  // host only: runs with or without a GPU
    if (check) {
        check_all<float>(tests, gpu, all);  // CI: everything, whatever versions were named
        check_all<__nv_bfloat16>(tests, gpu, all);
        return tests.finish();
    }
    if (versions.empty()) versions = all;
    if (bf16) check_all<__nv_bfloat16>(tests, gpu, versions);
    else check_all<float>(tests, gpu, versions);
    cudaDeviceProp prop;
    cuda_check(cudaGetDeviceProperties(&prop, 0));
    const double copy_gbs = measure_copy_bandwidth_gbs();
    printf("\ndevice: %s, %d SMs, L2 %d MB; device-to-device copy %.1f GB/s (bytes read + written)\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, copy_gbs);
    if (bf16) benchmark<__nv_bfloat16>(versions, rows, V, Vp, copy_gbs);
    else benchmark<float>(versions, rows, V, Vp, copy_gbs);
    return tests.finish();
}
