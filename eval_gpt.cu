// eval_gpt.cu: a model's score on a multiple-choice eval file (HellaSwag), on the GPU.
//
//   ./eval_gpt_bf16 -e out/d12_fineweb -he data/hellaswag/hellaswag_val.bin
//
// The model is a checkpoint file (ours or llm.c's) or a run folder (its newest complete checkpoint).
// The examples are scored as train_gpt's -he scores them (gpt_evaluate, evaluation.h): acc_norm and
// acc as llm.c computes them. gpt_reference.py eval does the same in PyTorch; -scores writes each
// completion's summed loss for a side-by-side comparison.
#define GPT_NO_MAIN
#include "train_gpt.cu"

struct EvalOptions {
    std::string model, eval_path, scores_path;
    int B = 64, T = 1024, flash = 1, limit = 0;
};

static void usage(const EvalOptions& d) {
    printf("usage: eval_gpt_%s -e <model> -he <file> [flags]   (every flag takes a value)\n"
           "  -e <model>  a model file (ours, or llm.c's) or a run folder of train_gpt (-o): its newest checkpoint\n"
           "  -he <file>  the eval file (data/prepare_hellaswag.py, or llm.c's hellaswag_val.bin)\n"
           "  -b <int>    rows per forward at -t tokens: the buffers hold B*T tokens (default %d)\n"
           "  -t <int>    the longest row, at most the model's maxT (default %d)\n"
           "  -n <int>    only the first N examples, 0 = all (default %d)\n"
           "  -scores <file>  write each example's index, label and its completions' summed losses (tab-separated)\n"
           "  -fa <0|1>   flash attention where it runs (default %d)\n"
           "  -h          this help\n",
           PRECISION_NAME, d.B, d.T, d.limit, d.flash);
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    std::set_new_handler(fail_out_of_host_memory);
    EvalOptions o;
    if (help_asked(argc, argv)) {
        usage(o);
        return 0;
    }
    for_each_flag(argc, argv, "-b 32", [&](const std::string& f, const char* fl, const char* v) {
        if ((f == "-e" || f == "-he" || f == "-scores") && !*v) fail("flag %s: expected a path, got an empty string", fl);
        if (f == "-e") o.model = v;
        else if (f == "-he") o.eval_path = v;
        else if (f == "-scores") o.scores_path = v;
        else if (f == "-b") o.B = (int)parse_int_flag(fl, v, 1, 4096);
        else if (f == "-t") o.T = (int)parse_int_flag(fl, v, 1, 65536);
        else if (f == "-n") o.limit = (int)parse_int_flag(fl, v, 0, 1 << 30);
        else if (f == "-fa") o.flash = (int)parse_int_flag(fl, v, 0, 1);
        else fail("unknown flag %s (-h lists the flags)", fl);
    });
    if (o.model.empty() || o.eval_path.empty()) fail("give the model with -e and the eval file with -he (-h for help)");
    if ((long)o.B * o.T > (1l << 24)) fail("-b %d -t %d: B*T is more than 16M tokens", o.B, o.T);

    std::string error;
    const std::string path = model_file_of(o.model);
    HostModel host;
    if (!read_model_file(path, host, &error)) fail("-e %s: %s", path.c_str(), error.c_str());
    std::vector<EvalExample> examples;
    if (!read_eval_file(o.eval_path, host.config.V, examples, &error)) fail("-he %s: %s", o.eval_path.c_str(), error.c_str());
    if (o.limit > 0 && size_t(o.limit) < examples.size()) examples.resize(o.limit);
    const int T = std::min(o.T, host.config.maxT);
    const std::string unfit = eval_fit_error(examples, o.B, T);
    if (!unfit.empty()) fail("-he %s: %s (give a larger -t or -b)", o.eval_path.c_str(), unfit.c_str());
    if (!o.scores_path.empty() && file_exists(o.scores_path)) fail("-scores %s: the file exists (nothing is replaced)", o.scores_path.c_str());

    if (!cuda_device_available()) fail("no CUDA device found (eval_gpt needs a GPU)");
    GPT m;
    GPTSettings settings;
    settings.flash = o.flash != 0, settings.inference = true;
    blas().tune = false;  // rows of many lengths, each plan run a few times: tuning would not pay (same bits)
    gpt_create(m, host, o.B, T, settings);
    host.params = std::vector<float>();
    fprintf(stderr, "model %s: L=%d NH=%d C=%d, %s build | %zu examples of %s\n", path.c_str(), m.config.L, m.config.NH,
            m.config.C, PRECISION_NAME, examples.size(), o.eval_path.c_str());
    std::vector<std::vector<double>> sums(examples.size());
    const double start = now_seconds();
    const EvalScore s = gpt_evaluate(m, examples, 0, 1, &sums);
    const double seconds = now_seconds() - start;
    printf("acc_norm %.4f acc %.4f (%lld examples, %.1f s)\n", s.acc_norm(), s.acc(), (long long)s.examples, seconds);
    if (!o.scores_path.empty()) {
        std::string text = "index\tlabel\tsums\n";
        char buf[64];
        for (size_t i = 0; i < examples.size(); i++) {
            text += std::to_string(examples[i].index) + "\t" + std::to_string(examples[i].label);
            for (double v : sums[i]) snprintf(buf, sizeof(buf), "\t%.17g", v), text += buf;
            text += "\n";
        }
        if (!write_file_atomic(o.scores_path, {{text.data(), text.size()}}, &error)) fail("-scores %s: %s", o.scores_path.c_str(), error.c_str());
    }
    gpt_free(m);
    return 0;
}
