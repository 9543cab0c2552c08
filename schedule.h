// schedule.h: the learning rate of each step, by llm.c's names (-k):
//   cosine    linear warm-up from 0 over `warmup` steps, then a cosine decay to final_fraction * peak
//             at the last step
//   linear    the warm-up, then a straight line down to final_fraction * peak at the last step
//   constant  the warm-up, then the peak
//   wsd       warm-up, stable, decay (arXiv 2405.18392, as llm.c): the warm-up, the peak until the last
//             decay_fraction of the steps, then 1 - sqrt down to final_fraction * peak
// (llm.c's constant has no warm-up; here -u applies to every schedule, and -u 0 is llm.c's constant.)
// gpt_reference.py train computes the same values in the same float arithmetic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>

enum class ScheduleKind { kCosine, kLinear, kConstant, kWsd };

inline bool schedule_kind_from_name(const char* name, ScheduleKind* kind) {
    static const struct { const char* name; ScheduleKind kind; } kinds[] = {
        {"cosine", ScheduleKind::kCosine}, {"linear", ScheduleKind::kLinear},
        {"constant", ScheduleKind::kConstant}, {"wsd", ScheduleKind::kWsd}};
    for (auto& k : kinds)
        if (!strcmp(name, k.name)) return *kind = k.kind, true;
    return false;
}

struct LearningRateSchedule {
    float peak = 6e-4f, final_fraction = 0.1f;
    int warmup = 10, steps = 100;
    ScheduleKind kind = ScheduleKind::kCosine;
    float decay_fraction = 0.2f;  // wsd: the share of the steps that decays

    float at(int step) const {  // step counts from 0
        if (step < warmup) return peak * (step + 1) / warmup;
        const float min_lr = peak * final_fraction;
        switch (kind) {
            case ScheduleKind::kConstant:
                return peak;
            case ScheduleKind::kLinear: {
                const float span = std::max(1, steps - warmup);
                const float progress = std::min(1.0f, (step - warmup) / span);
                return peak - progress * (peak - min_lr);
            }
            case ScheduleKind::kWsd: {
                const int decay_start = std::max(warmup, steps - (int)std::lround(decay_fraction * steps));
                if (step < decay_start) return peak;
                const float span = std::max(1, steps - decay_start);
                const float progress = std::min(1.0f, (step - decay_start) / span);
                return min_lr + (1.0f - std::sqrt(progress)) * (peak - min_lr);
            }
            case ScheduleKind::kCosine:
            default: {
                const float span = std::max(1, steps - warmup);
                const float progress = std::min(1.0f, (step - warmup) / span);
                return min_lr + 0.5f * (peak - min_lr) * (1.0f + std::cos(3.14159265358979f * progress));
            }
        }
    }
};
