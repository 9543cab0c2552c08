// generate_gpt.cu: text from a trained model, on the GPU.
//
//   ./generate_gpt_bf16 -e out/d12_tinyshakespeare_bf16 -p "ROMEO:" -g 200 -tp 0.8 -k 200
//
// The model is a checkpoint file (ours or llm.c's) or a run folder (its newest complete checkpoint).
// The prompt is encoded with GPT-2's tokenizer (tokenizer.h) after <|endoftext|>, then tokens are
// drawn one at a time exactly as train_gpt's samples and gpt_reference.py generate draw them
// (gpt_generate in train_gpt.cu): temperature 0 is greedy, so the fp32 build's greedy tokens equal
// PyTorch's for the same checkpoint and prompt (test/test_generate.sh). Without a KV cache each token
// runs the forward over the context (at most maxT tokens, a sliding window beyond that).
#define GPT_NO_MAIN
#include "train_gpt.cu"

struct GenerateOptions {
    std::string model, tokenizer_path = "data/gpt2_tokenizer.bin", prompt, prompt_file;
    int tokens = 256, flash = 1, print_ids = 0, stop_at_eot = 0;
    bool prompt_given = false;
    float temperature = 1.0f, top_p = 1.0f;
    int top_k = 0;
    long seed = 1337;
};

static void usage(const GenerateOptions& d) {
    printf("usage: generate_gpt_%s -e <model> [flags]   (every flag takes a value)\n"
           "  -e <model>  a model file (ours, or llm.c's gpt2_124M.bin style) or a run folder of train_gpt (-o): its\n"
           "              newest complete checkpoint\n"
           "  -z <file>   tokenizer (default %s)\n"
           "  -p <text>   prompt, after <|endoftext|> (default: none)\n"
           "  -pi <file>  the prompt read from a file (UTF-8 text; instead of -p)\n"
           "  -g <int>    tokens to generate (default %d)\n"
           "  -tp <float> temperature, 0 = greedy (default %g; 0.8 is a common choice)\n"
           "  -k <int>    sample from the top-k tokens only, 0 = all (default %d; 200 is a common choice)\n"
           "  -pp <float> nucleus (top-p): sample from the most likely tokens whose probabilities reach this\n"
           "              share, 1 = all (default %g; 0.9 is a common choice)\n"
           "  -eot <0|1>  1 = stop at <|endoftext|>, which is not printed (default %d)\n"
           "  -sd <int>   seed of the sampling (default %ld)\n"
           "  -fa <0|1>   flash attention where it runs (default %d)\n"
           "  -ids <0|1>  also print the generated token ids, on a line `tokens: ...` (default %d)\n"
           "  -h          this help\n",
           PRECISION_NAME, d.tokenizer_path.c_str(), d.tokens, d.temperature, d.top_k, d.top_p, d.stop_at_eot, d.seed, d.flash,
           d.print_ids);
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IONBF, 0);  // tokens appear as they are drawn
    std::set_new_handler(fail_out_of_host_memory);
    GenerateOptions o;
    if (help_asked(argc, argv)) {
        usage(o);
        return 0;
    }
    for_each_flag(argc, argv, "-g 100", [&](const std::string& f, const char* fl, const char* v) {
        if ((f == "-e" || f == "-z" || f == "-pi") && !*v) fail("flag %s: expected a path, got an empty string", fl);
        if (f == "-e") o.model = v;
        else if (f == "-z") o.tokenizer_path = v;
        else if (f == "-p") {
            o.prompt = v, o.prompt_given = true;
            check_prompt_utf8(o.prompt);
        }
        else if (f == "-g") o.tokens = (int)parse_int_flag(fl, v, 1, 1 << 20);
        else if (f == "-tp") o.temperature = (float)parse_float_flag(fl, v, 0.0, 100.0);
        else if (f == "-k") o.top_k = (int)parse_int_flag(fl, v, 0, 1 << 20);
        else if (f == "-pp") {
            o.top_p = (float)parse_float_flag(fl, v, 0.0, 1.0);
            if (o.top_p <= 0.0f) fail("flag -pp: expected a share in (0, 1], got '%s'", v);
        }
        else if (f == "-pi") o.prompt_file = v;
        else if (f == "-eot") o.stop_at_eot = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-sd") o.seed = parse_int_flag(fl, v, 0, 1l << 62);
        else if (f == "-fa") o.flash = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-ids") o.print_ids = (int)parse_int_flag(fl, v, 0, 1);
        else fail("unknown flag %s (-h lists the flags)", fl);
    });
    if (o.model.empty()) fail("give the model with -e (a checkpoint file or a run folder; -h for help)");
    if (!o.prompt_file.empty()) {
        if (o.prompt_given) fail("give the prompt with -p or -pi, not both");
        std::vector<uint8_t> bytes;
        std::string read_error;
        if (!read_whole_file(o.prompt_file, bytes, &read_error, uint64_t(16) << 20)) fail("-pi: %s", read_error.c_str());
        o.prompt.assign(bytes.begin(), bytes.end());
        check_prompt_utf8(o.prompt);
    }

    // The model: a file, or a run folder's newest complete checkpoint.
    std::string error;
    const std::string path = model_file_of(o.model);
    HostModel host;
    if (!read_model_file(path, host, &error)) fail("-e %s: %s", path.c_str(), error.c_str());
    Tokenizer tok = read_tokenizer(o.tokenizer_path);
    if (tok.vocab_size != host.config.V)
        fail("tokenizer '%s' has %d tokens, the model %d", o.tokenizer_path.c_str(), tok.vocab_size, host.config.V);
    const int eot = tok.eot_token >= 0 ? tok.eot_token : host.config.V - 1;
    std::vector<int> tokens = {eot};
    const std::vector<int> prompt = tokenizer_encode(tok, o.prompt);
    tokens.insert(tokens.end(), prompt.begin(), prompt.end());

    if (!cuda_device_available()) fail("no CUDA device found (generate_gpt needs a GPU)");
    GPT m;
    GPTSettings settings;
    settings.flash = o.flash != 0, settings.inference = true;
    blas().tune = false;  // few shapes, one run each: tuning would cost more than it saves (same bits)
    gpt_create(m, host, 1, host.config.maxT, settings);
    host.params = std::vector<float>();
    fprintf(stderr, "model %s: L=%d NH=%d C=%d, %s build | prompt %zu tokens | %d tokens, temperature %g, top-k %d, top-p %g, "
            "seed %ld%s\n", path.c_str(), m.config.L, m.config.NH, m.config.C, PRECISION_NAME, prompt.size(), o.tokens,
            o.temperature, o.top_k, o.top_p, o.seed, o.stop_at_eot ? ", stops at <|endoftext|>" : "");
    for (size_t i = 1; i < tokens.size(); i++) fputs(tokenizer_decode(tok, tokens[i]).c_str(), stdout);
    Rng rng((uint64_t)o.seed);
    const double start = now_seconds();
    const int made = gpt_generate(m, tokens, o.tokens, SampleOptions{o.temperature, o.top_k, o.top_p}, rng,
                                  [&](int id) { fputs(tokenizer_decode(tok, id).c_str(), stdout); }, o.stop_at_eot ? eot : -1);
    const double seconds = now_seconds() - start;
    printf("\n");
    if (o.print_ids) {
        printf("tokens:");
        for (size_t i = tokens.size() - made; i < tokens.size(); i++) printf(" %d", tokens[i]);
        printf("\n");
    }
    fprintf(stderr, "generated %d tokens in %.2f s: %.1f tokens/s%s\n", made, seconds, made / seconds,
            made < o.tokens ? " (stopped at <|endoftext|>)" : "");
    gpt_free(m);
    return 0;
}
