// evaluation.h: multiple-choice evaluations (HellaSwag) in llm.c's eval-file format, and their score.
//
// The file (data/prepare_hellaswag.py writes it; llm.c's dev/data/hellaswag.py writes the same): an
// EvalFileHeader, then the examples one after another, each a run of uint16:
//   65535 (start), the example's size in bytes, its index, the label (the right completion),
//   the number of completions K, the context's length and tokens, then K times a completion's length
//   and tokens.
// Each completion is scored as llm.c scores it: the model reads context + completion, and the loss of
// each completion token given everything before it is summed (in double). acc counts the examples
// whose right completion has the smallest sum, acc_norm those whose right completion has the smallest
// sum per token (llm.c's headline figure); ties go to the lowest index.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fileio.h"

constexpr int32_t kEvalFileMagic = 20240522, kEvalFileVersion = 1;
struct EvalFileHeader {
    int32_t magic = kEvalFileMagic, version = kEvalFileVersion;
    int32_t examples = 0;
    int32_t longest_example_bytes = 0;
    int32_t unused[252] = {};
};
static_assert(sizeof(EvalFileHeader) == FILE_HEADER_BYTES, "eval file header");

struct EvalExample {
    int index = 0, label = 0;
    std::vector<int> context;
    std::vector<std::vector<int>> completions;
    int longest_row() const {  // tokens of context + the longest completion
        size_t n = 0;
        for (const auto& c : completions) n = std::max(n, c.size());
        return int(context.size() + n);
    }
};

// Reads and checks a whole eval file; false with *error naming the file and what is wrong. Token ids
// must be below `vocab`.
inline bool read_eval_file(const std::string& path, int vocab, std::vector<EvalExample>& out, std::string* error) {
    std::vector<uint8_t> bytes;
    if (!read_whole_file(path, bytes, error, uint64_t(1) << 30)) return false;
    auto bad = [&](const std::string& what) {
        *error = "eval file '" + path + "': " + what;
        return false;
    };
    EvalFileHeader h;
    if (bytes.size() < sizeof(h)) return bad("no complete header (" + std::to_string(bytes.size()) + " bytes)");
    memcpy(static_cast<void*>(&h), bytes.data(), sizeof(h));
    if (h.magic != kEvalFileMagic) return bad("bad magic " + std::to_string(h.magic) + ", expected " + std::to_string(kEvalFileMagic));
    if (h.version != kEvalFileVersion) return bad("version " + std::to_string(h.version) + ", expected 1");
    if (h.examples < 1) return bad("its header says " + std::to_string(h.examples) + " examples");
    if ((bytes.size() - sizeof(h)) % 2) return bad("an odd number of bytes after the header (truncated?)");
    const size_t n = (bytes.size() - sizeof(h)) / 2;
    std::vector<uint16_t> w(n);
    memcpy(w.data(), bytes.data() + sizeof(h), n * 2);
    out.clear();
    size_t at = 0;
    for (int e = 0; e < h.examples; e++) {
        const std::string which = "example " + std::to_string(e);
        if (at + 5 > n || w[at] != 65535) return bad(which + ": no example starts at word " + std::to_string(at) + " (truncated or damaged)");
        const size_t words = w[at + 1] / 2;
        if (w[at + 1] % 2 || words < 6 || at + words > n) return bad(which + ": its size " + std::to_string(w[at + 1]) + " does not fit the file");
        const size_t end = at + words;
        EvalExample ex;
        ex.index = w[at + 2], ex.label = w[at + 3];
        const int K = w[at + 4];
        if (K < 1 || ex.label >= K) return bad(which + ": label " + std::to_string(ex.label) + " of " + std::to_string(K) + " completions");
        size_t p = at + 5;
        auto take = [&](std::vector<int>& dst) {
            if (p >= end || p + 1 + w[p] > end) return false;
            const size_t len = w[p++];
            dst.assign(w.begin() + p, w.begin() + p + len);
            p += len;
            for (int t : dst)
                if (t >= vocab) return false;
            return true;
        };
        if (!take(ex.context) || ex.context.empty()) return bad(which + ": a damaged context (or a token id >= " + std::to_string(vocab) + ")");
        ex.completions.resize(K);
        for (auto& c : ex.completions)
            if (!take(c) || c.empty()) return bad(which + ": a damaged completion (or a token id >= " + std::to_string(vocab) + ")");
        if (p != end) return bad(which + ": " + std::to_string(end - p) + " words beyond its completions");
        out.push_back(std::move(ex));
        at = end;
    }
    if (at != n) return bad(std::to_string(n - at) + " words after the last example");
    return true;
}

// One completion's row: the tokens the model reads and the targets it is scored on. Positions
// [context - 1, context - 1 + completion) predict the completion's tokens; the rest of the row (up to
// T) is padding whose losses are not read.
inline void eval_row(const EvalExample& ex, int k, int T, int* inputs, int* targets) {
    const std::vector<int>& c = ex.completions[k];
    const int n = int(ex.context.size() + c.size());
    for (int t = 0; t < T; t++) {
        const int token = t < int(ex.context.size()) ? ex.context[t] : t < n ? c[t - ex.context.size()] : 0;
        inputs[t] = token;
        if (t > 0) targets[t - 1] = token;
    }
    targets[T - 1] = 0;
}

struct EvalScore {
    int64_t examples = 0, correct = 0, correct_norm = 0;
    double acc() const { return examples ? double(correct) / examples : 0.0; }
    double acc_norm() const { return examples ? double(correct_norm) / examples : 0.0; }
};

// Scores one example from its completions' per-position losses (losses[k] holds row k's T losses);
// `sums` (optional) receives each completion's summed loss.
inline void eval_score(const EvalExample& ex, const std::vector<const float*>& losses, EvalScore& score,
                       std::vector<double>* sums = nullptr) {
    int best = 0, best_norm = 0;
    double best_sum = 0, best_mean = 0;
    if (sums) sums->assign(ex.completions.size(), 0.0);
    for (size_t k = 0; k < ex.completions.size(); k++) {
        double sum = 0;
        const size_t first = ex.context.size() - 1, count = ex.completions[k].size();
        for (size_t t = first; t < first + count; t++) sum += losses[k][t];
        if (sums) (*sums)[k] = sum;
        const double mean = sum / count;
        if (k == 0 || sum < best_sum) best = int(k), best_sum = sum;
        if (k == 0 || mean < best_mean) best_norm = int(k), best_mean = mean;
    }
    score.examples++;
    score.correct += best == ex.label;
    score.correct_norm += best_norm == ex.label;
}
