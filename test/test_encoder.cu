// test_encoder: encoder_backward (encoder.cuh) against a double-precision CPU reference, bf16 and fp32
// storage, on batches that take each of its paths: the 16-byte vector path (C = 768) and the scalar
// one (C = 13, misaligned buffers), a single position, one token everywhere (one group cut into many
// chunks), exactly kEncoderChunk and kEncoderChunk + 1 copies of a token (the edge of the cut), every
// token kEncoderChunk + 1 times (the split-token bound reached), Zipf-distributed tokens as in real
// text, and C = 1600 (fp32 threads loop over the columns). Per batch and storage type it checks:
//   - dwte rows of the batch's tokens and every dwpe row: += the sum of dout, within the bound below;
//   - dwte rows of tokens not in the batch: untouched, byte for byte;
//   - a second run from the same initial dwte, dwpe: byte-identical (the header promises determinism).
// Before that, on the host (no GPU needed): the work list TokenBuckets builds covers each token's
// positions once, in increasing order, in chunks of at most kEncoderChunk, with its partial rows and
// reductions numbered consistently and within the bounds the caller allocates for.
//
//   make build/test/test_encoder && ./build/test/test_encoder      (no flags; -h prints this usage)
#include <cstring>
#include <string>

#include "common.cuh"
#include "dev/lab.cuh"
#include "encoder.cuh"

// ---------------------------------------------------------------------------------------------
// Batches.

enum class Tokens {
    kUniform,    // uniform over [0, V)
    kOneToken,   // every position the same token
    kChunkEdge,  // token 1 exactly kEncoderChunk times, token 2 kEncoderChunk + 1 times, the rest uniform over [3, V)
    kAllSplit,   // B*T / (kEncoderChunk + 1) tokens, each kEncoderChunk + 1 times
    kZipf,       // P(rank r) ~ 1 / (r + 1), as word frequencies in text
};

struct Case {
    const char* what;
    int B, T, C, V;
    Tokens tokens;
    int shift;  // elements past 16-byte alignment of dout, dwte, dwpe (1: no vector path)
};

const Case kCases[] = {
        {"uniform tokens, C=768 (vector path)", 4, 256, 768, 1000, Tokens::kUniform, 0},
        {"uniform tokens, C=13 (scalar path)", 4, 256, 13, 50, Tokens::kUniform, 0},
        {"B*T=1", 1, 1, 768, 10, Tokens::kUniform, 0},
        {"one token everywhere (64 chunks)", 4, 1024, 768, 100, Tokens::kOneToken, 0},
        {"one token everywhere, C=13", 2, 1024, 13, 100, Tokens::kOneToken, 0},
        {"kEncoderChunk and kEncoderChunk+1 copies", 2, 128, 768, 5000, Tokens::kChunkEdge, 0},
        {"every token kEncoderChunk+1 times", 1, 8 * (kEncoderChunk + 1), 768, 100, Tokens::kAllSplit, 0},
        {"Zipf tokens (as in real text)", 8, 1024, 768, 50257, Tokens::kZipf, 0},
        {"Zipf tokens, C=13", 8, 1024, 13, 50257, Tokens::kZipf, 0},
        {"Zipf tokens, misaligned (scalar path, C=768)", 2, 1024, 768, 50257, Tokens::kZipf, 1},
        {"Zipf tokens, C=1600 (fp32 threads loop)", 2, 1024, 1600, 2000, Tokens::kZipf, 0},
};

std::vector<int> make_tokens(const Case& c, Rng& rng) {
    const int BT = c.B * c.T;
    std::vector<int> tokens(BT);
    const auto uniform = [&](int lo) { return lo + int(rng.next() % uint64_t(c.V - lo)); };
    switch (c.tokens) {
        case Tokens::kUniform:
            for (int& t : tokens) t = uniform(0);
            break;
        case Tokens::kOneToken:
            for (int& t : tokens) t = c.V / 2;
            break;
        case Tokens::kChunkEdge:
            for (int i = 0; i < BT; i++) tokens[i] = i < kEncoderChunk ? 1 : i < 2 * kEncoderChunk + 1 ? 2 : uniform(3);
            break;
        case Tokens::kAllSplit:
            for (int i = 0; i < BT; i++) tokens[i] = 3 + i % (BT / (kEncoderChunk + 1));
            break;
        case Tokens::kZipf: {
            std::vector<double> cdf(c.V);
            double total = 0.0;
            for (int r = 0; r < c.V; r++) cdf[r] = total += 1.0 / (r + 1);
            for (int& t : tokens) {
                const double u = (rng.next() >> 11) * 0x1p-53 * total;
                const int rank = int(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
                t = int(int64_t(std::min(rank, c.V - 1)) * 7919 % c.V);  // 7919 is prime: a permutation of ids unless it divides V
            }
            break;
        }
    }
    for (int i = BT - 1; i > 0; i--) std::swap(tokens[i], tokens[rng.next() % uint64_t(i + 1)]);  // spread the copies
    return tokens;
}

// ---------------------------------------------------------------------------------------------
// The work list, on the host.

bool check_work_list(const TokenBuckets& b, const std::vector<int>& tokens, int V) {
    const int BT = int(tokens.size()), K = kEncoderChunk;
    std::vector<int> count(V, 0);
    for (int t : tokens) count[t]++;
    const int* pos = b.packed.data();
    const int* items = pos + BT;
    const int* reductions = items + 4 * size_t(b.num_items);
    const char* why = nullptr;
    if (b.num_positions != BT || b.packed.size() != size_t(BT) + 4 * size_t(b.num_items) + 3 * size_t(b.num_reductions))
        why = "packed has the wrong size";
    else if (b.packed.size() > encoder_backward_work_ints(BT) || b.num_partial_rows > encoder_max_partial_rows(BT))
        why = "beyond the bounds the caller allocates for";
    std::vector<char> seen(BT, 0), token_seen(V, 0);
    for (int p = 0; p < BT && !why; p++)
        if (pos[p] < 0 || pos[p] >= BT || seen[pos[p]]++) why = "positions are not a permutation of 0..B*T-1";
    int next_begin = 0, next_slot = 0, r = -1;  // r: the current reduction
    for (int k = 0; k < b.num_items && !why; k++) {
        const int* item = items + 4 * k;
        const int token = item[0], begin = item[1], end = item[2], slot = item[3];
        if (begin != next_begin || end <= begin || end - begin > K || end > BT) {
            why = "items do not tile the positions in chunks of 1..kEncoderChunk";
            break;
        }
        for (int p = begin; p < end && !why; p++) {
            if (tokens[pos[p]] != token) why = "an item holds a position of another token";
            else if (p > 0 && tokens[pos[p - 1]] == token && pos[p - 1] >= pos[p]) why = "a token's positions are not increasing";
        }
        if (why) break;
        const bool group_start = begin == 0 || tokens[pos[begin - 1]] != token;
        const bool group_end = end == BT || tokens[pos[end]] != token;
        if (group_start && token_seen[token]++) {
            why = "a token's positions in two groups";
        } else if (slot == -1) {
            if (!group_start || !group_end) why = "slot -1 on a chunk of a split token";
        } else if (group_start && group_end) {
            why = "a partial row for a token of one chunk";
        } else if (slot != next_slot++) {
            why = "partial rows not numbered in order";
        } else if (group_start) {
            r++;
            const int* red = reductions + 3 * r;
            if (r >= b.num_reductions || red[0] != token || red[1] != slot || red[2] != (count[token] + K - 1) / K)
                why = "a reduction does not match its token's chunks";
        }
        next_begin = end;
    }
    if (!why && (next_begin != BT || r + 1 != b.num_reductions || next_slot != b.num_partial_rows))
        why = "items, reductions and partial rows do not add up";
    const int largest = *std::max_element(count.begin(), count.end());
    printf("  %-40s %s  %d items, %d split tokens (bound %d), %d partial rows (bound %d), largest group %d%s%s\n",
           "work list", why ? "FAIL" : "ok  ", b.num_items, b.num_reductions, encoder_max_split_tokens(BT),
           b.num_partial_rows, encoder_max_partial_rows(BT), largest, why ? ": " : "", why ? why : "");
    return !why;
}

// ---------------------------------------------------------------------------------------------
// Tolerance (u = 2^-24, fp32's unit roundoff). A gradient element ends as init + x_1 + ... + x_n (init
// its value before the call, x_i the dout values of the n positions summed into it): n + 1 terms
// summed by n fp32 additions, whatever the grouping (chunks, partial rows, the final +=). Summed in
// any order, the fp32 result is within gamma_n S of the exact sum, gamma_n = n u / (1 - n u) and
// S = |init| + sum |x_i| (Higham, Accuracy and Stability of Numerical Algorithms, section 4.2).
//   fp32: atol gamma_n S, rtol 0.
//   bf16: one more rounding, of the fp32 result f to 8 significant bits: within 2^-8 |f| <= 2^-8 (|ref|
//         + gamma_n S). atol (1 + 2^-8) gamma_n S, rtol 2^-8.
// The inputs are T values, read exactly by the reference, which sums in double (its own error ~1e-16
// relative). check_close takes one atol per call: each dwte row is checked alone, n its token's count
// and S the largest over its columns; dwpe (n = B for every element) in one call, S its largest.
constexpr double kU = 1.0 / (1 << 24);

template <typename T> void bounds_for(int n, double S, double& atol, double& rtol) {
    const double store = sizeof(T) == 2 ? std::ldexp(1.0, -8) : 0.0;
    atol = (1.0 + store) * n * kU / (1.0 - n * kU) * S;
    rtol = store;
}

// Byte-for-byte comparison of whole rows of C elements, printed like check_close.
template <typename T>
bool check_same_rows(const char* what, const T* got, const T* want, const std::vector<int>& rows, int C) {
    size_t bad = 0;
    for (int r : rows) bad += std::memcmp(got + size_t(r) * C, want + size_t(r) * C, size_t(C) * sizeof(T)) != 0;
    printf("  %-40s %s  %zu/%zu rows differ\n", what, bad ? "FAIL" : "ok  ", bad, rows.size());
    return bad == 0;
}

// ---------------------------------------------------------------------------------------------
// One batch, one storage type, on the GPU.

template <typename T> bool check_backward(const Case& c, const std::vector<int>& tokens, const TokenBuckets& b, uint64_t seed) {
    const int B = c.B, T_ = c.T, C = c.C, V = c.V, BT = B * T_;
    Rng rng(seed);
    std::vector<T> dout(size_t(BT) * C), wte0(size_t(V) * C), wpe0(size_t(T_) * C);
    fill_uniform(dout, -1.0f, 1.0f, rng);
    fill_uniform(wte0, -1.0f, 1.0f, rng);
    fill_uniform(wpe0, -1.0f, 1.0f, rng);

    DeviceBuffer<T> d_dout(dout.size(), "dout", c.shift), d_wte(wte0.size(), "dwte", c.shift), d_wpe(wpe0.size(), "dwpe", c.shift);
    DeviceBuffer<int> d_work(b.packed.size(), "work list");
    DeviceBuffer<float> d_partials(encoder_backward_partials_bytes(BT, C) / sizeof(float), "partial rows");
    d_dout.upload(dout);
    d_work.upload(b.packed);
    const auto run = [&](std::vector<T>& wte, std::vector<T>& wpe) {
        d_wte.upload(wte0);
        d_wpe.upload(wpe0);
        d_partials.poison();  // NaN: a reduction that reads a row no item wrote fails
        encoder_backward(d_wte.ptr, d_wpe.ptr, d_partials.ptr, d_dout.ptr, d_work.ptr, b, B, T_, C);
        cuda_check(cudaDeviceSynchronize());
        wte = d_wte.download();
        wpe = d_wpe.download();
    };
    std::vector<T> wte, wpe, wte_again, wpe_again;
    run(wte, wpe);
    run(wte_again, wpe_again);

    // Reference, for the rows the batch touches: ref = init + sum, S = |init| + sum |x|.
    std::vector<int> row_of(V, -1), row_tokens, row_count;
    for (int t : tokens)
        if (row_of[t] < 0) row_of[t] = int(row_tokens.size()), row_tokens.push_back(t), row_count.push_back(0);
    const size_t R = row_tokens.size();
    std::vector<double> wte_ref(R * C), wte_abs(R * C), wpe_ref(wpe0.size()), wpe_abs(wpe0.size());
    for (size_t r = 0; r < R; r++)
        for (int col = 0; col < C; col++) {
            const double init = to_double(wte0[size_t(row_tokens[r]) * C + col]);
            wte_ref[r * C + col] = init, wte_abs[r * C + col] = std::fabs(init);
        }
    for (size_t i = 0; i < wpe0.size(); i++) wpe_ref[i] = to_double(wpe0[i]), wpe_abs[i] = std::fabs(wpe_ref[i]);
    for (int bt = 0; bt < BT; bt++) {
        const int r = row_of[tokens[bt]], t = bt % T_;
        row_count[r]++;
        for (int col = 0; col < C; col++) {
            const double x = to_double(dout[size_t(bt) * C + col]);
            wte_ref[size_t(r) * C + col] += x, wte_abs[size_t(r) * C + col] += std::fabs(x);
            wpe_ref[size_t(t) * C + col] += x, wpe_abs[size_t(t) * C + col] += std::fabs(x);
        }
    }

    // dwte: each row alone (its bound depends on its count); printed: the most frequent token's row,
    // and any row that fails.
    const size_t heaviest = std::max_element(row_count.begin(), row_count.end()) - row_count.begin();
    bool ok = true;
    for (size_t r = 0; r < R; r++) {
        const double S = *std::max_element(wte_abs.begin() + r * C, wte_abs.begin() + (r + 1) * C);
        double atol, rtol;
        bounds_for<T>(row_count[r], S, atol, rtol);
        char name[100];
        snprintf(name, sizeof(name), "dwte row %d (%d positions)", row_tokens[r], row_count[r]);
        ok &= check_close(name, wte.data() + size_t(row_tokens[r]) * C, wte_ref.data() + r * C, C, atol, rtol, r == heaviest);
    }
    printf("  %-40s %s  %zu rows of batch tokens checked, each against its own bound\n", "dwte", ok ? "ok  " : "FAIL", R);
    double atol, rtol;
    bounds_for<T>(B, *std::max_element(wpe_abs.begin(), wpe_abs.end()), atol, rtol);
    ok &= check_close("dwpe", wpe.data(), wpe_ref.data(), wpe.size(), atol, rtol);

    std::vector<int> other_rows, all_wte_rows(V), all_wpe_rows(T_);
    for (int v = 0; v < V; v++) {
        all_wte_rows[v] = v;
        if (row_of[v] < 0) other_rows.push_back(v);
    }
    for (int t = 0; t < T_; t++) all_wpe_rows[t] = t;
    ok &= check_same_rows("dwte rows of tokens not in the batch", wte.data(), wte0.data(), other_rows, C);
    ok &= check_same_rows("dwte, second run (deterministic)", wte_again.data(), wte.data(), all_wte_rows, C);
    ok &= check_same_rows("dwpe, second run (deterministic)", wpe_again.data(), wpe.data(), all_wpe_rows, C);
    return ok;
}

// ---------------------------------------------------------------------------------------------

static void usage(FILE* f) {
    fprintf(f, "usage: test_encoder    (no flags) encoder_backward against a CPU reference; skips the GPU checks without a GPU\n");
}

int main(int argc, char** argv) {
    if (argc > 1) {
        if (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0) {
            usage(stdout);
            return 0;
        }
        usage(stderr);
        fail("unknown argument '%s'", argv[1]);
    }
    const bool gpu = cuda_device_available();
    TestCounter tests;
    uint64_t seed = 1;
    for (const Case& c : kCases) {
        Rng rng(seed++);
        const std::vector<int> tokens = make_tokens(c, rng);
        TokenBuckets b;
        b.build(tokens.data(), c.B * c.T, c.V);
        char name[200];
        snprintf(name, sizeof(name), "encoder backward, %s: B=%d T=%d C=%d V=%d", c.what, c.B, c.T, c.C, c.V);
        printf("%s\n", name);
        tests.record(check_work_list(b, tokens, c.V));
        for (int bf16 : {1, 0}) {
            std::string what = std::string(name) + ", " + (bf16 ? "bf16" : "fp32");
            if (!gpu) {
                tests.skip(what.c_str());
                continue;
            }
            printf("%s\n", what.c_str());
            tests.record(bf16 ? check_backward<__nv_bfloat16>(c, tokens, b, seed * 10 + 1)
                              : check_backward<float>(c, tokens, b, seed * 10 + 2));
        }
    }
    return tests.finish();
}
