// token_file_tool: a thin command-line face on fileio.h, so test/test_data.py can check the C++
// readers against Python's view of the same files. Host-only: runs without a GPU.
//
//   token_file_tool read-tokens FILE VOCAB        prints "tokens N first A last B"
//   token_file_tool read-stream PATTERN VOCAB     TokenStream (train_gpt's -i / -j): prints "files N tokens T",
//                                                 then each file's path
//   token_file_tool decode TOKENIZER              prints "vocab V eot E", then one line per token id:
//                                                 its bytes in hex
//   token_file_tool encode TOKENIZER TEXTFILE     prints the GPT-2 token ids of the file's text, one line
//   token_file_tool crc32 FILE                    prints the CRC-32 as 8 hex digits
//   token_file_tool copy SRC DST                  read_whole_file + write_file_atomic
//   token_file_tool parse-int VALUE MIN MAX       prints the value parse_int_flag accepts
//   token_file_tool parse-float VALUE MIN MAX     prints the value parse_float_flag accepts
// Every error is one `error: ...` line on stderr and exit code 1.
#include "tokenizer.h"

static void usage() {
    printf(
            "usage: token_file_tool read-tokens FILE VOCAB | read-stream PATTERN VOCAB | decode TOKENIZER\n"
            "                       | encode TOKENIZER TEXTFILE | crc32 FILE\n"
            "                       | copy SRC DST\n"
            "                       | parse-int VALUE MIN MAX | parse-float VALUE MIN MAX\n");
}

int main(int argc, char** argv) {
    std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "-h" || cmd == "--help") {
        usage();
        return 0;
    }
    if (cmd == "read-tokens" && argc == 4) {
        int vocab = (int)parse_int_flag("VOCAB", argv[3], 1, 65536);
        TokenFile tf = read_token_file(argv[2], vocab);
        printf("tokens %zu first %u last %u\n", tf.tokens.size(), tf.tokens.front(), tf.tokens.back());
        return 0;
    }
    if (cmd == "read-stream" && argc == 4) {
        TokenStream stream;
        std::string error;
        if (!stream.open(argv[2], (int)parse_int_flag("VOCAB", argv[3], 1, 65536), &error)) fail("%s", error.c_str());
        printf("files %zu tokens %llu\n", stream.shards.size(), (unsigned long long)stream.total);
        for (const TokenStream::Shard& s : stream.shards) printf("%s\n", s.file.path.c_str());
        return 0;
    }
    if (cmd == "decode" && argc == 3) {
        Tokenizer tok = read_tokenizer(argv[2]);
        printf("vocab %d eot %d\n", tok.vocab_size, tok.eot_token);
        for (int id = 0; id < tok.vocab_size; id++) {
            for (unsigned char c : tokenizer_decode(tok, id)) printf("%02x", c);
            printf("\n");
        }
        return 0;
    }
    if (cmd == "encode" && argc == 4) {
        Tokenizer tok = read_tokenizer(argv[2]);
        std::vector<uint8_t> bytes;
        std::string error;
        if (!read_whole_file(argv[3], bytes, &error)) fail("%s", error.c_str());
        const std::vector<int> ids = tokenizer_encode(tok, std::string(bytes.begin(), bytes.end()));
        for (size_t i = 0; i < ids.size(); i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
        return 0;
    }
    if (cmd == "crc32" && argc == 3) {
        std::vector<uint8_t> bytes;
        std::string error;
        if (!read_whole_file(argv[2], bytes, &error)) fail("%s", error.c_str());
        printf("%08x\n", crc32(bytes.data(), bytes.size()));
        return 0;
    }
    if (cmd == "copy" && argc == 4) {
        std::vector<uint8_t> bytes;
        std::string error;
        if (!read_whole_file(argv[2], bytes, &error)) fail("%s", error.c_str());
        if (!write_file_atomic(argv[3], {{bytes.data(), bytes.size()}}, &error)) fail("%s", error.c_str());
        printf("copied %zu bytes\n", bytes.size());
        return 0;
    }
    if (cmd == "parse-int" && argc == 5) {
        long lo = parse_int_flag("MIN", argv[3], -1000000000L, 1000000000L);
        long hi = parse_int_flag("MAX", argv[4], -1000000000L, 1000000000L);
        printf("%ld\n", parse_int_flag("-x", argv[2], lo, hi));
        return 0;
    }
    if (cmd == "parse-float" && argc == 5) {
        double lo = parse_float_flag("MIN", argv[3], -1e30, 1e30);
        double hi = parse_float_flag("MAX", argv[4], -1e30, 1e30);
        printf("%.17g\n", parse_float_flag("-x", argv[2], lo, hi));
        return 0;
    }
    fail("unknown subcommand or wrong arguments: '%s' (run with -h for usage)", cmd.c_str());
}
