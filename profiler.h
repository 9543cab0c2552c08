// profiler.h: the phase profiler of train_gpt -pf 1. mark(name) records a CUDA event; the GPU time
// until the next mark is charged to `name` ("fwd.matmul", "bwd.attention", ...). Off by default
// (events cost a little); when off, mark() returns at once. Sums are read after the step's
// synchronisation.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common.cuh"

struct Profiler {
    bool on = false;
    std::vector<cudaEvent_t> events;
    std::vector<const char*> names;  // names[i] is charged the time from events[i] to events[i + 1]
    size_t used = 0;
    std::vector<std::pair<std::string, double>> total_ms;  // in first-seen order
    int steps = 0;

    void mark(const char* name) {
        if (!on) return;
        if (used == events.size()) {
            cudaEvent_t e;
            cuda_check(cudaEventCreate(&e));
            events.push_back(e), names.push_back(nullptr);
        }
        cuda_check(cudaEventRecord(events[used]));
        names[used++] = name;
    }
    void destroy() {
        for (cudaEvent_t e : events) cuda_check(cudaEventDestroy(e));
        events.clear(), names.clear(), used = 0;
    }
    void discard() { used = 0; }  // drops marks made outside a training step (validation, sampling)
    // After a synchronisation: adds this step's spans to the totals.
    void collect() {
        if (!on) return;
        for (size_t i = 0; i + 1 < used; i++) {
            if (!names[i]) continue;
            float ms = 0;
            cuda_check(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
            auto it = std::find_if(total_ms.begin(), total_ms.end(), [&](auto& p) { return p.first == names[i]; });
            if (it == total_ms.end()) total_ms.emplace_back(names[i], ms);
            else it->second += ms;
        }
        used = 0;
        steps++;
    }
    void report() const {
        if (!on || steps == 0) return;
        double all = 0;
        for (auto& p : total_ms) all += p.second;
        printf("GPU time per step by phase (mean of %d steps, %.2f ms in all):\n", steps, all / steps);
        for (const char* prefix : {"fwd.", "bwd.", "opt."}) {
            double sum = 0;
            for (auto& p : total_ms)
                if (p.first.rfind(prefix, 0) == 0) sum += p.second;
            printf("  %-14s %8.3f ms  %5.1f%%\n", prefix, sum / steps, 100.0 * sum / all);
            for (auto& p : total_ms)
                if (p.first.rfind(prefix, 0) == 0)
                    printf("    %-16s %8.3f ms  %5.1f%%\n", p.first.c_str(), p.second / steps, 100.0 * p.second / all);
        }
    }
};
