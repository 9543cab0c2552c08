// test_gpt.cu: checks train_gpt.cu against the PyTorch reference (gpt_reference.py).
//
// Loads a checkpoint (-e) and a reference-state file (-rf) written by `gpt_reference.py state`, runs
// one forward/backward on the reference batch and compares the logits, the loss and the gradient of
// every parameter tensor by name, then runs the reference's K AdamW steps and compares each loss.
// Optionally saves the model after the K steps (-s) so the reference can score it back.
//
// Each comparison prints the tensor's relative error ||ours - ref|| / ||ref|| (the pass criterion)
// and its worst element. -ge and -r run the GELU-fusion and GELU-recompute paths, as the same flags of
// train_gpt do; with fusion, probes first check which GELU formula cuBLASLt's epilogues compute
// (matmul.cuh: NVIDIA documents none). Bounds: fp32 builds compute in true fp32 (no TF32), so every
// tensor is within 1e-4 relative and every loss within 1e-5; bf16 builds round parameters and
// activations to 8 significant bits, so gradients and logits get 2e-2 and losses 1e-2.
#define GPT_NO_MAIN
#include "train_gpt.cu"

#include "dev/lab.cuh"  // TestCounter

#if defined(ENABLE_FP32)
constexpr double kTensorTol = 1e-4, kLossTol = 1e-5;
#else
constexpr double kTensorTol = 2e-2, kLossTol = 1e-2;
#endif

struct Reference {
    int B = 0, T = 0, K = 0;
    GPTConfig config;
    float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, clip = 0;
    std::vector<int> inputs, targets;
    std::vector<float> logits, grads, losses;  // logits (B, T, V); grads in checkpoint order; K losses
    float loss = 0;
};

// The header is checked against the file's size before anything else is read (the file of d12 at
// T=1024 holds 1.3 GB of logits).
static Reference read_reference(const std::string& path) {
    InputFile file;
    std::string error;
    if (!file.open_file(path, &error)) fail("%s", error.c_str());
    ReferenceHeader h;
    if (file.size < sizeof(h)) fail("reference '%s' is truncated", path.c_str());
    if (!file.read_at(0, &h, sizeof(h), &error)) fail("%s", error.c_str());
    if (h.magic != kReferenceMagic) fail("'%s' is not a reference-state file (bad magic %d)", path.c_str(), h.magic);
    if (h.version != kReferenceVersion) fail("reference '%s' has version %d, expected %d", path.c_str(), h.version, kReferenceVersion);
    Reference r;
    r.B = h.B, r.T = h.T, r.K = h.K;
    r.config = GPTConfig{h.L, h.NH, h.C, h.maxT, h.V, h.Vp};
    if (!config_error(r.config).empty() || r.B < 1 || r.T < 1 || r.T > r.config.maxT || r.K < 1)
        fail("reference '%s' has an invalid header", path.c_str());
    r.lr = h.lr, r.beta1 = h.beta1, r.beta2 = h.beta2, r.eps = h.eps, r.weight_decay = h.weight_decay, r.clip = h.clip;
    const size_t BT = size_t(r.B) * r.T, np = num_parameters(r.config);
    const uint64_t expected = sizeof(h) + 2 * BT * 4 + BT * uint64_t(r.config.V) * 4 + 4 + np * 4 + size_t(r.K) * 4;
    if (file.size != expected)
        fail("reference '%s' has %llu bytes, expected %llu for its header", path.c_str(), (unsigned long long)file.size,
             (unsigned long long)expected);
    uint64_t at = sizeof(h);
    auto take = [&](auto* dst, size_t n) {
        if (!file.read_at(at, dst, n * 4, &error)) fail("%s", error.c_str());
        at += n * 4;
    };
    r.inputs.resize(BT), r.targets.resize(BT), r.logits.resize(BT * r.config.V), r.grads.resize(np), r.losses.resize(r.K);
    take(r.inputs.data(), BT);
    take(r.targets.data(), BT);
    take(r.logits.data(), BT * r.config.V);
    take(&r.loss, 1);
    take(r.grads.data(), np);
    take(r.losses.data(), r.K);
    for (size_t i = 0; i < BT; i++)
        if (r.inputs[i] < 0 || r.inputs[i] >= r.config.V || r.targets[i] < 0 || r.targets[i] >= r.config.V)
            fail("reference '%s' holds a token id outside [0, %d)", path.c_str(), r.config.V);
    return r;
}

// Relative error of a whole tensor, plus its worst element; prints one line.
static bool compare_tensor(const char* name, const std::vector<float>& got, const float* ref, size_t n, double tol) {
    double diff2 = 0.0, ref2 = 0.0, worst = 0.0;
    size_t worst_i = 0;
    bool finite = true;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)got[i] - ref[i];
        if (!std::isfinite(got[i])) finite = false;
        diff2 += d * d;
        ref2 += (double)ref[i] * ref[i];
        if (std::fabs(d) > worst) worst = std::fabs(d), worst_i = i;
    }
    const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    const bool ok = finite && rel <= tol;
    printf("  %-10s %s  rel err %.3e (bound %.0e)  worst |err| %.3e at [%zu] (ours %.6g, ref %.6g)  n=%zu\n", name,
           ok ? "ok  " : "FAIL", rel, tol, worst, worst_i, n ? got[worst_i] : 0.0f, n ? ref[worst_i] : 0.0f, n);
    return ok;
}

static bool compare_loss(const char* what, float got, float ref, double tol) {
    const double rel = std::fabs((double)got - ref) / std::max(1e-30, std::fabs((double)ref));
    const bool ok = std::isfinite(got) && rel <= tol;
    printf("  %-16s %s  ours %.7f  ref %.7f  rel err %.3e (bound %.0e)\n", what, ok ? "ok  " : "FAIL", got, ref, rel, tol);
    return ok;
}

template <typename T> static std::vector<float> download(const T* d, size_t n) {
    std::vector<T> tmp(n);
    cuda_check(cudaMemcpy(tmp.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    std::vector<float> out(n);
    for (size_t i = 0; i < n; i++) out[i] = to_float(tmp[i]);
    return out;
}

template <typename T> static T* upload(const std::vector<float>& host, const char* what) {
    std::vector<T> tmp(host.size());
    for (size_t i = 0; i < host.size(); i++) tmp[i] = from_float<T>(host[i]);
    T* d = static_cast<T*>(device_malloc(tmp.size() * sizeof(T), what));
    cuda_check(cudaMemcpy(d, tmp.data(), tmp.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

// GELU and its derivative in double: the tanh approximation (GPT-2's) and the exact erf form.
static double gelu_tanh_d(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double gelu_erf_d(double x) { return 0.5 * x * (1.0 + std::erf(x * 0.7071067811865476)); }
static double gelu_tanh_grad_d(double x) {
    const double th = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}
static double gelu_erf_grad_d(double x) {
    return 0.5 * (1.0 + std::erf(x * 0.7071067811865476)) + x * std::exp(-0.5 * x * x) * 0.3989422804014327;
}

// Which formula the values `got` (of f at x) follow. Points count where the two formulas differ by at
// least 4 units in the last place of floatX (in bf16 that is the negative tail, x in about
// [-4.5, -2.3], where they differ by 3% to 45%). Over those, the least-squares fit
// got - tanh = alpha (erf - tanh) gives alpha = 0 for the tanh approximation, 1 for the erf form;
// rounding and a less exact tanh inside the epilogue scatter it, without pulling it towards 1.
// Passes with |alpha| <= 0.25. The share of points nearer tanh than erf is printed too.
static bool gelu_formula_check(const char* what, const std::vector<float>& x, const std::vector<float>& got,
                               double (*f_tanh)(double), double (*f_erf)(double)) {
    const int mantissa_bits = std::is_same<floatX, float>::value ? 23 : 7;
    int points = 0, nearer_tanh = 0;
    double rd = 0.0, dd = 0.0, worst = 0.0;
    for (size_t i = 0; i < x.size(); i++) {
        const double t = f_tanh(x[i]), e = f_erf(x[i]), g = got[i];
        if (!std::isfinite(g)) return printf("  %-16s FAIL  non-finite value at x = %g\n", what, x[i]), false;
        worst = std::max(worst, std::fabs(g - t));
        int exponent = 0;
        std::frexp(t, &exponent);
        if (t == 0.0 || std::fabs(e - t) < 4.0 * std::ldexp(1.0, exponent - 1 - mantissa_bits)) continue;
        points++;
        nearer_tanh += std::fabs(g - t) < std::fabs(g - e);
        rd += (g - t) * (e - t), dd += (e - t) * (e - t);
    }
    const double alpha = dd > 0 ? rd / dd : NAN;
    const bool ok = points >= 20 && std::fabs(alpha) <= 0.25;
    printf("  %-16s %s  fit alpha %.3f (0 = tanh approximation, 1 = erf; bound |alpha| <= 0.25) over %d points where "
           "they differ, %d nearer tanh; worst |ours - tanh| %.3e\n",
           what, ok ? "ok  " : "FAIL", alpha, points, nearer_tanh, worst);
    return ok;
}

// Probes cuBLASLt's GELU epilogues on a grid of pre-activations x in [-8, 8) (rounded to floatX):
// forward: a zero weight and bias = x make the pre-activation exactly x, so the auxiliary output
// must equal x and the output is gelu(x); backward (gelu_fusion 2): dout = ones, weight = 1/8, so
// dout @ weight = 1 exactly and dinp = gelu'(x). x runs along the output rows' length, so a
// mistaken auxiliary layout shows too. A probe that cuBLASLt would not fuse proves nothing: counted
// as skipped.
static void probe_gelu_epilogues(int gelu_fusion, TestCounter& counter) {
    const int N = 64, K = 8, X = 1024;  // rows, inner dimension, grid points
    std::vector<float> x(X);
    for (int i = 0; i < X; i++) x[i] = to_float(from_float<floatX>(-8.0f + i / 64.0f));
    BlasContext& b = blas();
    printf("GELU epilogue probes (x in [-8, 8), %d points):\n", X);
    {
        floatX* inp = upload<floatX>(std::vector<float>(size_t(N) * K, 1.0f), "probe input");
        floatX* weight = upload<floatX>(std::vector<float>(size_t(X) * K, 0.0f), "probe weight");
        floatX* bias = upload<floatX>(x, "probe bias");
        floatX* out = upload<floatX>(std::vector<float>(size_t(N) * X, 0.0f), "probe output");
        floatX* pre = upload<floatX>(std::vector<float>(size_t(N) * X, 0.0f), "probe pre-activation");
        const size_t fused_before = b.gelu_fused;
        matmul_forward(out, inp, weight, bias, N, K, X, MatmulForwardOptions<floatX>().with_pre_gelu(pre));
        cuda_check(cudaDeviceSynchronize());
        if (b.gelu_fused == fused_before) {
            counter.skip("  forward GELU probe", "cuBLASLt has no GELU_AUX_BIAS algorithm for the probe");
        } else {
            const std::vector<float> got_out = download(out, size_t(N) * X), got_pre = download(pre, size_t(N) * X);
            size_t bad_pre = 0, bad_rows = 0;
            for (int n = 0; n < N; n++)
                for (int i = 0; i < X; i++) {
                    bad_pre += got_pre[size_t(n) * X + i] != x[i];
                    bad_rows += got_out[size_t(n) * X + i] != got_out[i];
                }
            printf("  forward aux      %s  pre-activation output equals x in %zu of %zu places, every row alike: %s\n",
                   bad_pre == 0 && bad_rows == 0 ? "ok  " : "FAIL", size_t(N) * X - bad_pre, size_t(N) * X,
                   bad_rows == 0 ? "yes" : "NO");
            counter.record(bad_pre == 0 && bad_rows == 0);
            counter.record(gelu_formula_check("forward GELU", x, std::vector<float>(got_out.begin(), got_out.begin() + X),
                                             gelu_tanh_d, gelu_erf_d));
        }
        for (floatX* p : {inp, weight, bias, out, pre}) cuda_check(cudaFree(p));
    }
    if (gelu_fusion < 2) return;
    {
        // matmul_backward's dinp (N, X) = dout (N, K) @ weight (K, X): here C = X, OC = K.
        floatX* dout = upload<floatX>(std::vector<float>(size_t(N) * K, 1.0f), "probe dout");
        floatX* weight = upload<floatX>(std::vector<float>(size_t(K) * X, 1.0f / K), "probe weight");
        std::vector<float> pre_host(size_t(N) * X);
        for (int n = 0; n < N; n++) std::copy(x.begin(), x.end(), pre_host.begin() + size_t(n) * X);
        floatX* pre = upload<floatX>(pre_host, "probe pre-activation");
        floatX* dinp = upload<floatX>(std::vector<float>(size_t(N) * X, 0.0f), "probe dinp");
        floatX* dweight = upload<floatX>(std::vector<float>(size_t(K) * X, 0.0f), "probe dweight");
        const size_t fused_before = b.gelu_fused;
        matmul_backward(dinp, dweight, (floatX*)nullptr, dout, pre, weight, N, X, K, MatmulBackwardOptions<floatX>().with_pre_gelu(pre));
        cuda_check(cudaDeviceSynchronize());
        if (b.gelu_fused == fused_before) {
            counter.skip("  backward GELU probe", "cuBLASLt has no DGELU algorithm for the probe");
        } else {
            const std::vector<float> got = download(dinp, size_t(N) * X);
            size_t bad_rows = 0;
            for (int n = 0; n < N; n++)
                for (int i = 0; i < X; i++) bad_rows += got[size_t(n) * X + i] != got[i];
            printf("  backward rows    %s  every row of dinp alike: %s\n", bad_rows == 0 ? "ok  " : "FAIL",
                   bad_rows == 0 ? "yes" : "NO");
            counter.record(bad_rows == 0);
            counter.record(gelu_formula_check("backward GELU'", x, std::vector<float>(got.begin(), got.begin() + X),
                                             gelu_tanh_grad_d, gelu_erf_grad_d));
        }
        for (floatX* p : {dout, weight, pre, dinp, dweight}) cuda_check(cudaFree(p));
    }
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    std::string checkpoint, reference, save_path;
    bool flash = true, exp_head = true;
    int gelu_fusion = GELU_FUSION_DEFAULT, recompute = RECOMPUTE_DEFAULT;
    for (int i = 1; i < argc; i++) {
        const std::string f = argv[i];
        if (f == "-h" || f == "--help") {
            printf("usage: test_gpt_%s -e CHECKPOINT -rf REFERENCE [-s SAVE] [-fa 0|1] [-ge 0|1|2] [-r 0|1] [-lx 0|1]\n"
                   "  -e  checkpoint written by gpt_reference.py init\n"
                   "  -rf reference state written by gpt_reference.py state for that checkpoint\n"
                   "  -s  write the model after the reference's K steps here (for gpt_reference.py loss)\n"
                   "  -fa 0|1    flash attention where it runs (default 1), else cuBLAS attention\n"
                   "  -ge 0|1|2  GELU in cuBLASLt epilogues, as train_gpt's -ge: none, forward, forward and backward\n"
                   "             (default %d); with 1 or 2 the epilogues' GELU formula is probed first\n"
                   "  -r 0|1     recompute GELU in the backward, as train_gpt's -r (default %d)\n"
                   "  -lx 0|1    the exp LM head where it runs, as train_gpt's -lx (default 1): then the logits are\n"
                   "             checked from the logits path, the loss from both, the gradients and steps from the exp head\n",
                   PRECISION_NAME, GELU_FUSION_DEFAULT, RECOMPUTE_DEFAULT);
            return 0;
        }
        if (i + 1 >= argc) fail("flag %s needs a value (-h for usage)", argv[i]);
        if (f == "-e") checkpoint = argv[++i];
        else if (f == "-rf") reference = argv[++i];
        else if (f == "-s") save_path = argv[++i];
        else if (f == "-fa") flash = parse_int_flag("-fa", argv[++i], 0, 1) != 0;
        else if (f == "-ge") gelu_fusion = (int)parse_int_flag("-ge", argv[++i], 0, 2);
        else if (f == "-r") recompute = (int)parse_int_flag("-r", argv[++i], 0, 1);
        else if (f == "-lx") exp_head = parse_int_flag("-lx", argv[++i], 0, 1) != 0;
        else fail("unknown flag %s (-h for usage)", argv[i]);
    }
    if (checkpoint.empty() || reference.empty()) fail("give -e CHECKPOINT and -rf REFERENCE (-h for usage)");

    HostModel host;
    std::string error;
    if (!read_model_file(checkpoint, host, &error)) fail("%s", error.c_str());
    const Reference ref = read_reference(reference);
    const GPTConfig& c = host.config;
    if (memcmp(&c, &ref.config, sizeof(c)) != 0) fail("reference '%s' was made for another model config", reference.c_str());
    TestCounter counter;
    char label[256];
    snprintf(label, sizeof(label), "test_gpt_%s L=%d NH=%d C=%d V=%d B=%d T=%d -ge %d -r %d -lx %d", PRECISION_NAME, c.L,
             c.NH, c.C, c.V, ref.B, ref.T, gelu_fusion, recompute, (int)exp_head);
    if (!cuda_device_available()) {
        counter.skip(label);
        return counter.finish();
    }
    printf("%s, %d steps, tensor bound %.0e, loss bound %.0e\n", label, ref.K, kTensorTol, kLossTol);

    GPT m;
    GPTSettings settings;
    settings.flash = flash, settings.gelu_fusion = gelu_fusion, settings.recompute = recompute;
    gpt_create(m, host, ref.B, ref.T, settings);
    if (exp_head) gpt_use_exp_head(m);
    printf("attention: %s | LM head: %s | GELU fusion -ge %d | GELU recompute -r %d\n",
           m.flash ? "flash (flash_attention.cuh)" : "cuBLAS (attention.cuh)",
           m.exp_head.on ? "exp (lm_head.cuh)" : "logits and classifier", gelu_fusion, recompute);
    if (gelu_fusion >= 1) probe_gelu_epilogues(gelu_fusion, counter);
    const size_t probe_fused = blas().gelu_fused, probe_unfused = blas().gelu_unfused;
    const int B = ref.B, T = ref.T, BT = B * T;

    // Forward only: logits and loss.
    gpt_set_batch(m, ref.inputs.data(), ref.targets.data(), B, T);
    const bool exp_head_on = m.exp_head.on;
    m.exp_head.on = false;  // the exp head writes no logits: they come from the logits path
    gpt_forward(m, B, T, true, 0.0f);
    const float loss = gpt_mean_loss(m, B, T);
    m.exp_head.on = exp_head_on;
    {
        std::vector<float> all = download(m.act.acts.logits, size_t(BT) * c.Vp), logits(size_t(BT) * c.V);
        for (int i = 0; i < BT; i++) std::copy_n(all.begin() + size_t(i) * c.Vp, c.V, logits.begin() + size_t(i) * c.V);
        counter.record(compare_tensor("logits", logits, ref.logits.data(), logits.size(), kTensorTol));
    }
    counter.record(compare_loss("loss", loss, ref.loss, kLossTol));
    if (exp_head_on) {  // and the loss from the exp head's row sums (the losses poisoned first: the
        // logits path above wrote the right ones into the same buffer)
        cuda_check(cudaMemset(m.act.stats.losses, 0xff, size_t(BT) * sizeof(float)));
        gpt_forward(m, B, T, true, 0.0f);
        counter.record(compare_loss("loss (exp head)", gpt_mean_loss(m, B, T), ref.loss, kLossTol));
    }

    // K AdamW steps on the same batch; gradients compared after the first backward.
    AdamWConfig adam;
    adam.beta1 = ref.beta1, adam.beta2 = ref.beta2, adam.eps = ref.eps, adam.weight_decay = ref.weight_decay;
    for (int k = 0; k < ref.K; k++) {
        // The training step's own path: loss summed, gradients clipped (or the step skipped) on the device.
        gpt_zero_grad(m);
        gpt_forward(m, B, T, true, 1.0f / BT);
        gpt_accumulate_loss(m, B, T);
        gpt_backward(m, B, T);
        if (k == 0) {
            printf("gradients after one backward:\n");
            std::vector<float> grads = download(m.weights.grads_memory, m.weights.count);
            size_t offset = 0;
            for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
                std::vector<float> g(grads.begin() + offset, grads.begin() + offset + m.weights.sizes[i]);
                counter.record(compare_tensor(param_name(i), g, ref.grads.data() + offset, g.size(), kTensorTol));
                offset += m.weights.sizes[i];
            }
            printf("losses of %d AdamW steps (lr %g, weight decay %g, clip %g):\n", ref.K, ref.lr, ref.weight_decay, ref.clip);
        }
        gpt_grad_norm_squared(m);
        gpt_update(m, adam, ref.lr, k + 1, ref.clip);
        const StepStats stats = gpt_step_stats(m);
        if (!step_finite(stats)) {
            printf("  step %d           FAIL  non-finite loss or gradient norm: update skipped\n", k);
            counter.record(false);
        }
        char what[32];
        snprintf(what, sizeof(what), "step %d loss", k);
        counter.record(compare_loss(what, (float)stats.loss_sum, ref.losses[k], kLossTol));  // one micro-batch
    }
    gpt_forward(m, B, T, true, 0.0f);
    printf("loss after %d steps: %.7f\n", ref.K, gpt_mean_loss(m, B, T));
    if (!save_path.empty()) {
        if (!write_model_file(save_path, c, gpt_params_fp32(m), &error)) fail("%s", error.c_str());
        printf("wrote %s\n", save_path.c_str());
    }

    // Determinism: the same forward/backward again gives bit-identical gradients. And the weight
    // stream (-ov 1, on by default) changes nothing: the backward with the weight gradients in line
    // on the default stream gives the same bits (a race between the streams would show here).
    {
        const cudaStream_t weight_stream = m.wgrad.stream;  // null: created without one
        auto gradients = [&](bool overlap) {
            m.wgrad.stream = overlap ? weight_stream : nullptr;
            gpt_zero_grad(m);
            gpt_forward(m, B, T, true, 1.0f / BT);
            gpt_backward(m, B, T);
            return download(m.weights.grads_memory, m.weights.count);
        };
        const bool created_overlap = weight_stream != nullptr;
        const std::vector<float> first = gradients(created_overlap), second = gradients(created_overlap);
        const bool same = memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0;
        printf("  %-16s %s  two backward passes give %s gradients\n", "determinism", same ? "ok  " : "FAIL",
               same ? "bit-identical" : "DIFFERENT");
        counter.record(same);
        if (created_overlap) {
            const std::vector<float> inline_ = gradients(false);
            m.wgrad.stream = weight_stream;
            const bool same_inline = memcmp(first.data(), inline_.data(), first.size() * sizeof(float)) == 0;
            printf("  %-16s %s  weight gradients on their own stream and in line give %s gradients\n", "weight stream",
                   same_inline ? "ok  " : "FAIL", same_inline ? "bit-identical" : "DIFFERENT");
            counter.record(same_inline);
        }
    }
    if (gelu_fusion >= 1)
        printf("GELU fusion in the model: %zu matmuls ran with a cuBLASLt GELU epilogue, %zu took the GELU kernels\n",
               blas().gelu_fused - probe_fused, blas().gelu_unfused - probe_unfused);
    gpt_free(m);
    return counter.finish();
}
