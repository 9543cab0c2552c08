// dataloader.h: a token stream (one token file, or the shards a glob names, in sorted order: fileio.h)
// as sequences of T+1 tokens, and each rank's share of a training step.
//
// Sequence j is tokens [j T, j T + T + 1) of the stream: T inputs and their targets, shifted by one.
// An epoch has (tokens - 1) / T sequences and visits each once, in order, or in a permutation drawn
// from (seed, epoch) when shuffling; the next epoch follows without a gap, so the data is one endless
// list of sequences. Step k trains on the k-th run of d/T of them (d = -d, tokens per step): which
// sequences a step takes depends on the data, T, -d and the seed, never on B or the number of GPUs. The
// loader's whole state is (epoch, cursor), in sequences, which checkpoints save. Sequences are read
// from the files as they are needed (pread), never the whole stream; consecutive ones are one read,
// so in order a batch of B sequences is one read of B T + 1 tokens. gpt_reference.py train reads the
// same sequences in the same order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common.cuh"
#include "fileio.h"

struct DataLoader {
    const TokenStream* stream = nullptr;
    int T = 0;
    uint64_t sequences = 0;  // per epoch: T+1 tokens each, starting every T tokens
    bool shuffle = false;
    uint64_t seed = 0;
    uint64_t epoch = 0, cursor = 0;
    std::vector<uint32_t> order;  // the epoch's permutation (shuffling only; 4 bytes a sequence)
    std::vector<uint64_t> picked;  // the sequences of the batch being read
    std::vector<uint16_t> run;     // the tokens of one read

    // `min_sequences`: what one step takes (d/T); fewer is a bad input.
    void init(const TokenStream& s, int T_, bool shuffle_, uint64_t seed_, const char* flag, uint64_t min_sequences = 1) {
        stream = &s, T = T_, shuffle = shuffle_, seed = seed_;
        const uint64_t need = uint64_t(T) * min_sequences + 1;
        if (s.total < need)
            fail("%s '%s' has %llu tokens, fewer than the %llu that a step's %llu sequences of T+1 = %d tokens span (use a "
                 "smaller -t or -d; -d defaults to B*T*GPUs)", flag, s.pattern.c_str(), (unsigned long long)s.total,
                 (unsigned long long)need, (unsigned long long)min_sequences, T + 1);
        sequences = (s.total - 1) / T;
        if (shuffle && sequences > UINT32_MAX)
            fail("%s '%s': %llu sequences are too many to shuffle (use a larger -t, or -sh 0)", flag, s.pattern.c_str(),
                 (unsigned long long)sequences);
        seek(0, 0);
    }
    void seek(uint64_t epoch_, uint64_t cursor_) {
        epoch = epoch_, cursor = cursor_;
        if (!shuffle) return;
        order.resize(sequences);
        for (uint64_t i = 0; i < sequences; i++) order[i] = uint32_t(i);
        Rng rng(seed * 0x9E3779B97F4A7C15ull + epoch);
        for (uint64_t i = sequences - 1; i > 0; i--) std::swap(order[i], order[rng.next() % (i + 1)]);
    }
    // The next sequence (rolling into the next epoch), without reading it.
    uint64_t advance() {
        if (cursor >= sequences) seek(epoch + 1, 0);
        const uint64_t i = cursor++;
        return shuffle ? order[i] : i;
    }
    // The next `rows` sequences as a (rows, T) batch. Returns the reads it took: one per run of
    // consecutive sequences (one in order, but where the batch crosses into the next epoch).
    int next(int rows, std::vector<int>& inputs, std::vector<int>& targets) {
        picked.resize(rows);
        for (int i = 0; i < rows; i++) picked[i] = advance();
        inputs.resize(size_t(rows) * T), targets.resize(size_t(rows) * T);
        int reads = 0;
        for (int first = 0, last; first < rows; first = last, reads++) {
            for (last = first + 1; last < rows && picked[last] == picked[last - 1] + 1; last++) {}
            const size_t n = size_t(last - first) * T;
            run.resize(n + 1);
            stream->read(picked[first] * T, n + 1, run.data());
            for (size_t k = 0; k < n; k++) inputs[size_t(first) * T + k] = run[k], targets[size_t(first) * T + k] = run[k + 1];
        }
        return reads;
    }
};

// One rank's micro-batches of B sequences. Of the d/T = accum * world * B sequences a step takes,
// rank r's micro-batch m is the (r accum + m)-th run of B, so one GPU accumulating, or several GPUs
// with any B that divides the step, train on the same sequences each step. The training loop reads a
// step's first batch while the GPU still runs the step before; mark() records where such a read
// begins and rewind() returns there, so a checkpoint taken between steps records the step's own
// data position (the same on every rank, and for any B).
struct RankBatches {
    DataLoader* loader = nullptr;
    int B = 0, rank = 0, world = 1, accum = 1;
    int micro = 0;  // micro-batches of the current step read so far
    struct Position { uint64_t epoch, cursor; int micro; } marked{0, 0, 0};

    void init(DataLoader& l, int B_, int rank_, int world_, int accum_) { loader = &l, B = B_, rank = rank_, world = world_, accum = accum_; }
    int next(std::vector<int>& inputs, std::vector<int>& targets) {
        if (micro == 0)
            for (uint64_t k = 0; k < uint64_t(rank) * accum * B; k++) loader->advance();
        const int reads = loader->next(B, inputs, targets);
        if (++micro == accum) {
            micro = 0;
            for (uint64_t k = 0; k < uint64_t(world - 1 - rank) * accum * B; k++) loader->advance();
        }
        return reads;
    }
    void mark() { marked = {loader->epoch, loader->cursor, micro}; }
    void rewind() {
        loader->seek(marked.epoch, marked.cursor);
        micro = marked.micro;
    }
};
