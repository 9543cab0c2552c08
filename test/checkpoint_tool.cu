// checkpoint_tool: train_gpt's checkpoint code (write_checkpoint, prune_checkpoints,
// find_resume_checkpoint) driven from the command line, on the host, so test/test_checkpoint_faults.sh
// can kill or fail a save at every file operation without a GPU. The saved values are made from the
// step number, so every checkpoint's content is known exactly.
//
//   checkpoint_tool save DIR STEP [KEEP]   write checkpoint STEP of a small model into DIR, keep KEEP (2)
//   checkpoint_tool resume DIR             what train_gpt -y 1 would take: "resume STEP", "fresh" or
//                                          "refuse" (damaged checkpoints only), one line
//   checkpoint_tool verify DIR STEP        checkpoint STEP loads and holds exactly what save wrote
//   checkpoint_tool layout L,NH,C,maxT,V,Vp the parameter list of model_config.h for that config, a tensor a line
//   checkpoint_tool schedule KIND PEAK FINAL WARMUP STEPS DECAY   the learning rate of every step (schedule.h)
//   checkpoint_tool sample LOGITS TEMP TOP_K TOP_P SEED N   N draws of sample_token from the fp32 logits in
//                                          the file LOGITS (raw floats), one generator: the ids, one a line
//   checkpoint_tool evalfile FILE V        an eval file as evaluation.h reads it: each example's index, label,
//                                          context and completions, a line each (or its one error line)
//   checkpoint_tool logs DIR               open and close DIR's main.log and metrics.csv as a run starting there does
//   checkpoint_tool outliers VALUES SL SG [DIR K]   the outlier guard (outlier_guard.h, -sl SL -sg SG) over
//                                          the steps of the text file VALUES, a line "LOSS NORM" each
//                                          (strtod's forms: 4.25, nan, inf): a line a step, "STEP LOSS_Z
//                                          NORM_Z LOSS_SKIP NORM_SKIP | REASONS" (z as %.17g, nan: none).
//                                          With DIR K: after step K the windows are saved in checkpoint
//                                          K of DIR (write_checkpoint) and the rest runs on the windows
//                                          loaded back from it (load_checkpoint), as a resumed run does
//   checkpoint_tool windows DIR STEP       the outlier windows checkpoint STEP holds: "NAME COUNT NEXT" and
//                                          the 128 slots (%.17g), a line per window
//   checkpoint_tool formats DIR            each file format's header with every field set to a value of its own,
//                                          written to DIR/NAME.bin, and "NAME FIELD VALUE" a field a line
//                                          (test/test_formats.py compares both with data/file_formats.py)
//   checkpoint_tool batches TOKENS T D B WORLD SEED SHUFFLE STEPS [EPOCH CURSOR | STATE]
//                                          what each rank of a run reads (dataloader.h) from the token file
//                                          TOKENS (vocabulary 65536), STEPS steps from the data position
//                                          (EPOCH, CURSOR), or a state file's as -y 1 reads it, or the start.
//                                          Each rank reads as train_step does: the next step's first batch
//                                          ahead, but before every third step (as before a validation); and
//                                          after every fourth step's read-ahead it rewinds, as a stop does.
//                                          Lines: "batch STEP RANK MICRO READS FIRST..." with each row's first
//                                          token's position (-1: the row is not T tokens in a row, targets
//                                          one after) and "position STEP EPOCH CURSOR" where no batch is
//                                          read ahead: what a checkpoint there records (test/test_data_order.py)
// Every error is one `error: ...` line on stderr and exit code 1.
#define GPT_NO_MAIN
#include "train_gpt.cu"

static const GPTConfig kConfig{2, 2, 16, 8, 50, 64};  // L NH C maxT V Vp: 7,8xx parameters

// The state of "step": parameters, moments and loader position derived from it alone.
static void make_state(int step, std::vector<float>& params, std::vector<float>& m, std::vector<float>& v, TrainState& st) {
    const size_t n = num_parameters(kConfig);
    Rng rng(uint64_t(step) * 7919 + 1);
    params.resize(n), m.resize(n), v.resize(n);
    for (size_t i = 0; i < n; i++) params[i] = rng.normal(), m[i] = rng.normal() * 1e-3f, v[i] = float(rng.uniform()) * 1e-6f;
    st = TrainState();
    st.step = step, st.loader_epoch = step / 7, st.loader_cursor = step % 7, st.sampler_rng = rng.next();
    st.B = 2, st.T = 8, st.seed = 1337, st.shuffle = 1, st.data_tokens = 12345, st.data_crc = 0xC0FFEE;
    OutlierGuard guard;  // windows full or not, by the step
    for (int i = 0; i < 60 + step % 150; i++) guard.observe(3.0 + rng.normal(), rng.uniform());
    st.outliers = guard.windows;
}

// Sets a header field to the next value of a counter, and prints it.
#define SET_FIELD(format, header, field)                                                                \
    do {                                                                                                 \
        header.field = static_cast<decltype(header.field)>(++value);                                     \
        if (std::is_floating_point<decltype(header.field)>::value) header.field += 0.5f;                \
        printf("%s %s %.17g\n", format, #field, (double)header.field);                                 \
    } while (0)
#define KEEP_FIELD(format, header, field) printf("%s %s %.17g\n", format, #field, (double)header.field)

static void write_header(const std::string& dir, const char* name, const void* header, size_t bytes) {
    std::string error;
    if (!write_file_atomic(dir + "/" + name + ".bin", {{header, bytes}}, &error)) fail("%s", error.c_str());
}

// The batches command. Tokens are their own positions in the test's token files, so a row's tokens
// say where it was read.
static void print_batches(const TokenStream& tokens, int T, long D, int B, int world, uint64_t seed, bool shuffle, int steps,
                          uint64_t epoch, uint64_t cursor) {
    const int accum = micro_steps_per_rank(D, B, T, world);
    if (accum == 0) fail("batches: D = %ld is not a multiple of B*T*WORLD = %ld", D, long(B) * T * world);
    for (int rank = 0; rank < world; rank++) {
        DataLoader loader;
        loader.init(tokens, T, shuffle, seed, "TOKENS", uint64_t(D) / T);
        loader.seek(epoch, cursor);
        RankBatches batches;
        batches.init(loader, B, rank, world, accum);
        std::vector<int> inputs, targets;
        bool staged = false;
        int reads = 0;
        for (int step = 0; step < steps; step++) {
            for (int micro = 0; micro < accum; micro++) {
                if (!staged) reads = batches.next(inputs, targets);
                staged = false;
                printf("batch %d %d %d %d", step, rank, micro, reads);
                for (int row = 0; row < B; row++) {
                    const int* in = inputs.data() + size_t(row) * T;
                    const int* tg = targets.data() + size_t(row) * T;
                    bool whole = true;
                    for (int k = 0; k < T; k++) whole = whole && in[k] == in[0] + k && tg[k] == in[0] + k + 1;
                    printf(" %d", whole ? in[0] : -1);
                }
                printf("\n");
                const bool last = micro + 1 == accum;
                if (!last || (step + 1) % 3 != 0) {
                    if (last) batches.mark();
                    reads = batches.next(inputs, targets);
                    staged = true;
                }
            }
            if (staged && (step + 1) % 4 == 0) batches.rewind(), staged = false;
            if (!staged) printf("position %d %llu %llu\n", step + 1, (unsigned long long)loader.epoch, (unsigned long long)loader.cursor);
        }
    }
}

static void write_formats(const std::string& dir) {
    long long value = 0;
    ModelFileHeader model;
    KEEP_FIELD("model", model, magic); KEEP_FIELD("model", model, version);
    SET_FIELD("model", model, L); SET_FIELD("model", model, NH); SET_FIELD("model", model, C); SET_FIELD("model", model, maxT);
    SET_FIELD("model", model, V); SET_FIELD("model", model, Vp); SET_FIELD("model", model, crc);
    write_header(dir, "model", &model, sizeof(model));
    LlmcModelHeader llmc;
    KEEP_FIELD("llmc_model", llmc, magic); KEEP_FIELD("llmc_model", llmc, version);
    SET_FIELD("llmc_model", llmc, maxT); SET_FIELD("llmc_model", llmc, V); SET_FIELD("llmc_model", llmc, L);
    SET_FIELD("llmc_model", llmc, NH); SET_FIELD("llmc_model", llmc, C); SET_FIELD("llmc_model", llmc, Vp);
    write_header(dir, "llmc_model", &llmc, sizeof(llmc));
    TrainStateHeader st;
    KEEP_FIELD("train_state", st, magic); KEEP_FIELD("train_state", st, version);
    SET_FIELD("train_state", st, step); SET_FIELD("train_state", st, B); SET_FIELD("train_state", st, T);
    SET_FIELD("train_state", st, crc); SET_FIELD("train_state", st, num_params); SET_FIELD("train_state", st, loader_epoch);
    SET_FIELD("train_state", st, loader_cursor); SET_FIELD("train_state", st, sampler_rng); SET_FIELD("train_state", st, seed);
    SET_FIELD("train_state", st, shuffle); SET_FIELD("train_state", st, data_crc); SET_FIELD("train_state", st, data_tokens);
    SET_FIELD("train_state", st, gelu_fusion); SET_FIELD("train_state", st, recompute);
    SET_FIELD("train_state", st, total_batch); SET_FIELD("train_state", st, head); SET_FIELD("train_state", st, cursor_unit);
    SET_FIELD("train_state", st, outlier_bytes); SET_FIELD("train_state", st, fp8);
    SET_FIELD("train_state", st, fp8_history_bytes); SET_FIELD("train_state", st, fp8_history_steps);
    write_header(dir, "train_state", &st, sizeof(st));
    ReferenceHeader ref;
    KEEP_FIELD("reference", ref, magic); KEEP_FIELD("reference", ref, version);
    SET_FIELD("reference", ref, B); SET_FIELD("reference", ref, T); SET_FIELD("reference", ref, K);
    SET_FIELD("reference", ref, L); SET_FIELD("reference", ref, NH); SET_FIELD("reference", ref, C);
    SET_FIELD("reference", ref, maxT); SET_FIELD("reference", ref, V); SET_FIELD("reference", ref, Vp);
    SET_FIELD("reference", ref, lr); SET_FIELD("reference", ref, beta1); SET_FIELD("reference", ref, beta2);
    SET_FIELD("reference", ref, eps); SET_FIELD("reference", ref, weight_decay); SET_FIELD("reference", ref, clip);
    write_header(dir, "reference", &ref, sizeof(ref));
    TokenFileHeader tokens;
    KEEP_FIELD("token_file", tokens, magic); KEEP_FIELD("token_file", tokens, version); SET_FIELD("token_file", tokens, count);
    write_header(dir, "token_file", &tokens, sizeof(tokens));
    TokenizerHeader tok;
    KEEP_FIELD("tokenizer", tok, magic); KEEP_FIELD("tokenizer", tok, version);
    SET_FIELD("tokenizer", tok, vocab_size); SET_FIELD("tokenizer", tok, eot_token);
    write_header(dir, "tokenizer", &tok, sizeof(tok));
    EvalFileHeader eval;
    KEEP_FIELD("eval_file", eval, magic); KEEP_FIELD("eval_file", eval, version);
    SET_FIELD("eval_file", eval, examples); SET_FIELD("eval_file", eval, longest_example_bytes);
    write_header(dir, "eval_file", &eval, sizeof(eval));
}

// Checkpoint STEP of dir through load_checkpoint (the reader train_gpt uses); its error ends the program.
static TrainState load_state_or_fail(const std::string& dir, const char* step) {
    HostModel model;
    TrainState st;
    std::string error;
    bool incomplete = false;
    if (!load_checkpoint(dir, (int)parse_int_flag("STEP", step, 0, 99999999), model, st, &error, &incomplete)) fail("%s", error.c_str());
    return st;
}

int main(int argc, char** argv) {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "-h" || cmd == "--help" || argc < 3) {
        printf("usage: checkpoint_tool save DIR STEP [KEEP] | resume DIR | verify DIR STEP | layout L,NH,C,maxT,V,Vp |\n"
               "       schedule KIND PEAK FINAL WARMUP STEPS DECAY | sample LOGITS TEMP TOP_K TOP_P SEED N | evalfile FILE V |\n"
               "       logs DIR | formats DIR | batches TOKENS T D B WORLD SEED SHUFFLE STEPS [EPOCH CURSOR | STATE] |\n"
               "       outliers VALUES SL SG [DIR K] | windows DIR STEP | fp8history DIR STEP N STEPS | history DIR STEP\n");
        return argc < 3 && cmd != "-h" && cmd != "--help";
    }
    if (cmd == "schedule" && argc == 8) {
        LearningRateSchedule s;
        if (!schedule_kind_from_name(argv[2], &s.kind)) fail("schedule: unknown kind '%s'", argv[2]);
        s.peak = (float)parse_float_flag("PEAK", argv[3], 0.0, 10.0), s.final_fraction = (float)parse_float_flag("FINAL", argv[4], 0.0, 1.0);
        s.warmup = (int)parse_int_flag("WARMUP", argv[5], 0, 1 << 30), s.steps = (int)parse_int_flag("STEPS", argv[6], 1, 1 << 30);
        s.decay_fraction = (float)parse_float_flag("DECAY", argv[7], 0.0, 1.0);
        for (int step = 0; step < s.steps; step++) printf("%.9g\n", s.at(step));
        return 0;
    }
    if (cmd == "sample" && argc == 8) {
        std::vector<uint8_t> bytes;
        std::string error;
        if (!read_whole_file(argv[2], bytes, &error, uint64_t(1) << 30) || bytes.size() % 4 || bytes.empty())
            fail("sample: %s", error.empty() ? "the logits file holds no whole floats" : error.c_str());
        std::vector<float> logits(bytes.size() / 4);
        memcpy(logits.data(), bytes.data(), bytes.size());
        SampleOptions o;
        o.temperature = (float)parse_float_flag("TEMP", argv[3], 0.0, 100.0), o.top_k = (int)parse_int_flag("TOP_K", argv[4], 0, 1 << 30);
        o.top_p = (float)parse_float_flag("TOP_P", argv[5], 1e-9, 1.0);
        Rng rng((uint64_t)parse_int_flag("SEED", argv[6], 0, 1l << 62));
        const int n = (int)parse_int_flag("N", argv[7], 1, 1 << 20);
        std::vector<double> scratch;
        std::vector<int> order;
        for (int i = 0; i < n; i++) printf("%d\n", sample_token(logits, o, rng, scratch, order));
        return 0;
    }
    if (cmd == "evalfile" && argc == 4) {
        std::vector<EvalExample> examples;
        std::string error;
        if (!read_eval_file(argv[2], (int)parse_int_flag("V", argv[3], 1, 1 << 20), examples, &error)) fail("%s", error.c_str());
        printf("examples %zu\n", examples.size());
        for (const EvalExample& ex : examples) {
            printf("%d %d %zu", ex.index, ex.label, ex.context.size());
            for (int t : ex.context) printf(" %d", t);
            for (const auto& c : ex.completions) {
                printf(" | %zu", c.size());
                for (int t : c) printf(" %d", t);
            }
            printf("\n");
        }
        return 0;
    }
    if (cmd == "layout" && argc == 3) {
        GPTConfig c;
        if (sscanf(argv[2], "%d,%d,%d,%d,%d,%d", &c.L, &c.NH, &c.C, &c.maxT, &c.V, &c.Vp) != 6 || !config_error(c).empty())
            fail("layout: expected a valid L,NH,C,maxT,V,Vp, got '%s'", argv[2]);
        static const char* const inits[] = {"normal", "residual_normal", "ones", "zeros"};
        for (const ParamSpec& s : param_specs(c))
            printf("%s %zu %zu %zu %d %d %s\n", s.name, s.layers, s.rows, s.cols, (int)s.decay, (int)s.per_layer, inits[s.init]);
        return 0;
    }
    if (cmd == "batches" && (argc == 10 || argc == 11 || argc == 12)) {
        TokenStream tokens;
        std::string error;
        if (!tokens.open(argv[2], 65536, &error)) fail("batches: %s", error.c_str());
        const int T = (int)parse_int_flag("T", argv[3], 1, 65536);
        const long D = parse_int_flag("D", argv[4], 1, 1 << 30);
        const int B = (int)parse_int_flag("B", argv[5], 1, 4096), world = (int)parse_int_flag("WORLD", argv[6], 1, 1024);
        const uint64_t seed = (uint64_t)parse_int_flag("SEED", argv[7], 0, 1l << 62);
        const bool shuffle = parse_int_flag("SHUFFLE", argv[8], 0, 1) != 0;
        const int steps = (int)parse_int_flag("STEPS", argv[9], 0, 1 << 20);
        TrainState st;
        if (argc == 12) {
            st.loader_epoch = (uint64_t)parse_int_flag("EPOCH", argv[10], 0, 1l << 62);
            st.loader_cursor = (uint64_t)parse_int_flag("CURSOR", argv[11], 0, 1l << 62);
        } else if (argc == 11) {  // the header of a state file, as load_checkpoint takes it
            InputFile f;
            TrainStateHeader h;
            if (!f.open_file(argv[10], &error) || !f.read_at(0, &h, sizeof(h), &error)) fail("batches: %s", error.c_str());
            state_from_header(h, st);
            if (st.shuffled_windows) {
                printf("shuffled windows\n");
                return 0;
            }
        }
        print_batches(tokens, T, D, B, world, seed, shuffle, steps, st.loader_epoch, st.loader_cursor);
        return 0;
    }
    if (cmd == "outliers" && (argc == 5 || argc == 7)) {
        std::vector<uint8_t> bytes;
        std::string error;
        if (!read_whole_file(argv[2], bytes, &error)) fail("outliers: %s", error.c_str());
        std::vector<std::pair<double, double>> steps;
        const std::string text(bytes.begin(), bytes.end());
        for (size_t at = 0; at < text.size();) {
            const size_t end = std::min(text.find('\n', at), text.size());
            const std::string line = text.substr(at, end - at);
            at = end + 1;
            if (line.empty()) continue;
            char* rest = nullptr;
            const double loss = strtod(line.c_str(), &rest), norm = strtod(rest, &rest);
            if (rest == line.c_str() || *rest != '\0')
                fail("outliers: line %zu is not two numbers: '%s'", steps.size() + 1, line.c_str());
            steps.push_back({loss, norm});
        }
        OutlierGuard guard;
        guard.loss_limit = parse_float_flag("SL", argv[3], 0.0, 1e6);
        guard.norm_limit = parse_float_flag("SG", argv[4], 0.0, 1e6);
        const int resume_at = argc == 7 ? (int)parse_int_flag("K", argv[6], 1, (long)steps.size() - 1) : -1;
        for (int step = 0; step < (int)steps.size(); step++) {
            if (step == resume_at) {  // a checkpoint of step K, then a run resumed from it
                std::vector<float> params, m, v;
                TrainState st;
                make_state(step, params, m, v, st);
                st.outliers = guard.windows;
                if (!write_checkpoint(argv[5], kConfig, st, params, m, v, &error)) fail("outliers: %s", error.c_str());
                HostModel model;
                TrainState loaded;
                bool incomplete = false;
                if (!load_checkpoint(argv[5], step, model, loaded, &error, &incomplete)) fail("outliers: %s", error.c_str());
                guard.windows = loaded.outliers;  // all the resumed run knows of the steps before
            }
            const OutlierVerdict verdict = guard.observe(steps[step].first, steps[step].second);
            printf("%d %.17g %.17g %d %d | %s\n", step + 1, verdict.loss_z, verdict.norm_z, (int)verdict.loss_skip,
                   (int)verdict.norm_skip, guard.reasons(verdict).c_str());
        }
        return 0;
    }
    const std::string dir = argv[2];
    if (cmd == "windows" && argc == 4) {
        const TrainState st = load_state_or_fail(dir, argv[3]);
        const OutlierWindow* windows[2] = {&st.outliers.loss, &st.outliers.norm};
        const char* names[2] = {"loss", "norm"};
        for (int i = 0; i < 2; i++) {
            printf("%s %d %d", names[i], windows[i]->count, windows[i]->next);
            for (double x : windows[i]->values) printf(" %.17g", x);
            printf("\n");
        }
        return 0;
    }
    if (cmd == "fp8history" && argc == 6) {  // a checkpoint whose state file holds N history floats 0.5 + i / 4
        const int step = (int)parse_int_flag("STEP", argv[3], 0, 99999999);
        const int n = (int)parse_int_flag("N", argv[4], 0, 1 << 20);
        std::vector<float> params, m, v;
        TrainState st;
        make_state(step, params, m, v, st);
        for (int i = 0; i < n; i++) st.fp8_history.push_back(0.5f + 0.25f * float(i));
        st.fp8_history_steps = parse_int_flag("STEPS", argv[5], 0, 1l << 40);
        std::string error;
        if (!write_checkpoint(dir, kConfig, st, params, m, v, &error)) fail("writing checkpoint for step %d: %s", step, error.c_str());
        printf("saved step %d\n", step);
        return 0;
    }
    if (cmd == "history" && argc == 4) {  // the FP8 history a state file holds: its steps, then its values
        const TrainState st = load_state_or_fail(dir, argv[3]);
        printf("steps %lld values %zu\n", (long long)st.fp8_history_steps, st.fp8_history.size());
        for (float x : st.fp8_history) printf("%.9g\n", x);
        return 0;
    }
    if (cmd == "logs" && argc == 3) {  // what a run (rank 0) does to its folder's logs at start
        RunLogs logs;
        logs.open(dir);
        logs.close();
        return 0;
    }
    if (cmd == "formats" && argc == 3) {
        write_formats(dir);
        return 0;
    }
    if (cmd == "save" && (argc == 4 || argc == 5)) {
        const int step = (int)parse_int_flag("STEP", argv[3], 0, 99999999);
        const int keep = argc == 5 ? (int)parse_int_flag("KEEP", argv[4], 1, 1000) : 2;
        std::vector<float> params, m, v;
        TrainState st;
        make_state(step, params, m, v, st);
        std::string error;
        if (!write_checkpoint(dir, kConfig, st, params, m, v, &error)) fail("writing checkpoint for step %d: %s", step, error.c_str());
        prune_checkpoints(dir, keep, step);
        printf("saved step %d\n", step);
        return 0;
    }
    if (cmd == "resume" && argc == 3) {
        HostModel model;
        TrainState st;
        int damaged = 0;
        if (find_resume_checkpoint(dir, model, st, &damaged, true)) printf("resume %d\n", st.step);
        else printf(damaged ? "refuse\n" : "fresh\n");
        return 0;
    }
    if (cmd == "verify" && argc == 4) {
        const int step = (int)parse_int_flag("STEP", argv[3], 0, 99999999);
        std::vector<float> params, m, v;
        TrainState want;
        make_state(step, params, m, v, want);
        HostModel model;
        TrainState got;
        std::string error;
        bool incomplete = false;
        if (!load_checkpoint(dir, step, model, got, &error, &incomplete)) fail("checkpoint %d: %s", step, error.c_str());
        const bool same = model.params == params && got.adam_m == m && got.adam_v == v && got.loader_epoch == want.loader_epoch &&
                          got.loader_cursor == want.loader_cursor && got.sampler_rng == want.sampler_rng && got.B == want.B &&
                          got.data_crc == want.data_crc && model.config.C == kConfig.C &&
                          memcmp(&got.outliers, &want.outliers, sizeof(OutlierWindows)) == 0;
        if (!same) fail("checkpoint %d loads, but holds other values than were saved", step);
        HostModel file_model;  // the model file holds the same parameters
        if (!read_model_file(checkpoint_path(dir, "model", step), file_model, &error) || file_model.params != params)
            fail("checkpoint %d: its model file does not hold the saved parameters", step);
        printf("verified step %d\n", step);
        return 0;
    }
    fail("unknown subcommand or wrong arguments: '%s' (run with -h for usage)", cmd.c_str());
}
