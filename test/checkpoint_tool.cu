// checkpoint_tool: train_gpt's checkpoint code (write_checkpoint, prune_checkpoints,
// find_resume_checkpoint) driven from the command line, on the host, so test/test_checkpoint_faults.sh
// can kill or fail a save at every file operation without a GPU. The saved values are made from the
// step number, so every checkpoint's content is known exactly.
//
//   checkpoint_tool save DIR STEP [KEEP]   write checkpoint STEP of a small model into DIR, keep KEEP (2)
//   checkpoint_tool resume DIR             what train_gpt -y 1 would take: "resume STEP", "fresh" or
//                                          "refuse" (damaged checkpoints only), one line
//   checkpoint_tool verify DIR STEP        checkpoint STEP loads and holds exactly what save wrote
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
}

int main(int argc, char** argv) {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "-h" || cmd == "--help" || argc < 3) {
        printf("usage: checkpoint_tool save DIR STEP [KEEP] | resume DIR | verify DIR STEP\n");
        return argc < 3 && cmd != "-h" && cmd != "--help";
    }
    const std::string dir = argv[2];
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
                          got.data_crc == want.data_crc && model.config.C == kConfig.C;
        if (!same) fail("checkpoint %d loads, but holds other values than were saved", step);
        HostModel file_model;  // the model file holds the same parameters
        if (!read_checkpoint(checkpoint_path(dir, "model", step), file_model, &error) || file_model.params != params)
            fail("checkpoint %d: its model file does not hold the saved parameters", step);
        printf("verified step %d\n", step);
        return 0;
    }
    fail("unknown subcommand or wrong arguments: '%s' (run with -h for usage)", cmd.c_str());
}
