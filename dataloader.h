// dataloader.h: B x T windows of a token stream (one token file, or the shards a glob names, in
// sorted order: fileio.h), targets shifted by one, and each rank's share of a step.
//
// Window i is tokens [i B T, i B T + B T + 1) of the stream; an epoch visits every window once, in
// order, or in a permutation drawn from (seed, epoch) when shuffling. Its whole state is (epoch,
// cursor), which checkpoints save. Windows are read from the files as they are needed (pread), never
// the whole stream. gpt_reference.py train reads the same windows in the same order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common.cuh"
#include "fileio.h"

struct DataLoader {
    const TokenStream* stream = nullptr;
    int B = 0, T = 0;
    uint64_t windows = 0;  // B*T+1 tokens each, starting every B*T tokens
    bool shuffle = false;
    uint64_t seed = 0;
    uint64_t epoch = 0, cursor = 0;
    std::vector<uint32_t> order;  // the epoch's permutation (shuffling only; 4 bytes a window)
    std::vector<uint16_t> window;

    // `min_windows`: what one step needs (one window per rank); fewer is a bad input.
    void init(const TokenStream& s, int B_, int T_, bool shuffle_, uint64_t seed_, const char* flag, uint64_t min_windows = 1) {
        stream = &s, B = B_, T = T_, shuffle = shuffle_, seed = seed_;
        const uint64_t need = uint64_t(B) * T * min_windows + 1;
        if (s.total < need)
            fail("%s '%s' has %llu tokens, fewer than %s = %llu (use a smaller -b or -t%s)", flag, s.pattern.c_str(),
                 (unsigned long long)s.total, min_windows > 1 ? "B*T*ranks+1" : "B*T+1", (unsigned long long)need,
                 min_windows > 1 ? ", or fewer ranks" : "");
        windows = (s.total - 1) / (uint64_t(B) * T);
        if (shuffle && windows > UINT32_MAX) fail("%s '%s': %llu windows are too many to shuffle (use a larger -b or -t, or -sh 0)",
                                                  flag, s.pattern.c_str(), (unsigned long long)windows);
        seek(0, 0);
    }
    void seek(uint64_t epoch_, uint64_t cursor_) {
        epoch = epoch_, cursor = cursor_;
        if (!shuffle) return;
        order.resize(windows);
        for (uint64_t i = 0; i < windows; i++) order[i] = uint32_t(i);
        Rng rng(seed * 0x9E3779B97F4A7C15ull + epoch);
        for (uint64_t i = windows - 1; i > 0; i--) std::swap(order[i], order[rng.next() % (i + 1)]);
    }
    // The next window of the epoch (rolling into the next epoch), without reading it.
    uint64_t advance() {
        if (cursor >= windows) seek(epoch + 1, 0);
        const uint64_t i = cursor++;
        return shuffle ? order[i] : i;
    }
    void next(std::vector<int>& inputs, std::vector<int>& targets) {
        const size_t n = size_t(B) * T;
        window.resize(n + 1);
        stream->read(advance() * n, n + 1, window.data());
        inputs.resize(n), targets.resize(n);
        for (size_t i = 0; i < n; i++) inputs[i] = window[i], targets[i] = window[i + 1];
    }
};

// One rank's micro-batches. Of the accum * world windows a step takes from the data, rank r trains
// on the r-th run of `accum`, so one GPU accumulating accum * world micro-batches and world GPUs see
// the same tokens in the same order. The training loop reads a step's first batch while the GPU
// still runs the step before; mark() records where such a read begins and rewind() returns there,
// so a checkpoint taken between steps records the step's own data position.
struct RankBatches {
    DataLoader* loader = nullptr;
    int rank = 0, world = 1, accum = 1;
    int micro = 0;  // micro-batches of the current step read so far
    struct Position { uint64_t epoch, cursor; int micro; } marked{0, 0, 0};

    void init(DataLoader& l, int rank_, int world_, int accum_) { loader = &l, rank = rank_, world = world_, accum = accum_; }
    void next(std::vector<int>& inputs, std::vector<int>& targets) {
        if (micro == 0)
            for (int k = 0; k < rank * accum; k++) loader->advance();
        loader->next(inputs, targets);
        if (++micro == accum) {
            micro = 0;
            for (int k = 0; k < (world - 1 - rank) * accum; k++) loader->advance();
        }
    }
    void mark() { marked = {loader->epoch, loader->cursor, micro}; }
    void rewind() {
        loader->seek(marked.epoch, marked.cursor);
        micro = marked.micro;
    }
};
