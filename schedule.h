// schedule.h: the learning rate of each step: a linear warm-up from 0 over `warmup` steps, then a
// cosine decay to final_fraction * peak at the last step.
#pragma once

#include <algorithm>
#include <cmath>

struct LearningRateSchedule {
    float peak = 6e-4f, final_fraction = 0.1f;
    int warmup = 10, steps = 100;

    float at(int step) const {  // step counts from 0
        if (step < warmup) return peak * (step + 1) / warmup;
        const float span = std::max(1, steps - warmup);
        const float progress = std::min(1.0f, (step - warmup) / span);
        const float min_lr = peak * final_fraction;
        return min_lr + 0.5f * (peak - min_lr) * (1.0f + std::cos(3.14159265358979f * progress));
    }
};
