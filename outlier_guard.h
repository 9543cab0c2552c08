// outlier_guard.h: llm.c's outlier guard (train_gpt -sl and -sg), made deterministic. An optimizer
// update is skipped when the step's mean loss, or its global gradient norm, is more than Z standard
// deviations above the mean of the last kOutlierWindow steps' values. Host code only; train_gpt.cu
// asks it once a step, gpt_reference.py train (OutlierGuard there) does the same arithmetic in the
// same order, and test/test_outlier_guard.py checks both against a computation of its own.
//
// What it does, value by value (the loss and the norm each have a window of their own):
//   - The window holds the last 128 finite values, one a step, whether that step's update ran or
//     was skipped (as llm.c: a skipped value enters), and whether the guard is on or not (so -sl or
//     -sg given at a resume finds the window as an uninterrupted run would have it).
//   - z = (x - mean) / std over the window after x went in, so over x and the 127 values before it,
//     std the population one (divided by 128), as llm.c. A value has a z only when the window was
//     already full before it: the first 128 finite values of a run fill it and skip nothing, the
//     129th is the first that can. std = 0 gives z = 0. x being in its own window bounds z by
//     sqrt(127) = 11.27 (Samuelson's inequality): a larger Z never skips.
//   - A non-finite value (NaN, inf) has no z and does not enter: the window stays as it was, so one
//     bad step cannot poison it. Its update is skipped anyway (adamw.cuh's non-finite rule).
//   - Skip when Z > 0 and z > Z, for either value (0 = that check off). A skipped update changes
//     nothing: weights and AdamW's moments stay, the step's gradients are dropped. The step still
//     counts for the learning-rate schedule, the data position and AdamW's bias correction, whose t
//     is the step number (skipped steps included, as llm.c and as after a non-finite step).
// The arithmetic keeps no running sums: every z is recomputed from the 128 values, in double, in
// slot order, mean first and then the squared deviations, each square added with one rounding
// (std::fma, so no compiler can contract it differently). z is then a function of the window's
// state alone (values, count, next): a run resumed from a checkpoint, which stores that state
// (checkpoint.h), takes the same decisions bit for bit as one never stopped.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

constexpr int kOutlierWindow = 128;

// One value's window: a ring of its last kOutlierWindow finite values. Its bytes are its record in
// the train-state file (no padding: two int32, then doubles at offset 8).
struct OutlierWindow {
    int32_t count = 0;  // values held, at most kOutlierWindow
    int32_t next = 0;   // the slot the next value takes: count while filling, then the oldest value's
    double values[kOutlierWindow] = {};
};
static_assert(sizeof(OutlierWindow) == 8 + 8 * kOutlierWindow, "OutlierWindow is the file's record: no padding");

// Both windows: what a checkpoint keeps of the guard.
struct OutlierWindows {
    OutlierWindow loss, norm;
};
static_assert(sizeof(OutlierWindows) == 2 * sizeof(OutlierWindow), "two records, back to back");

// Whether a window read from a file is one this code could have made: count and next in range and
// consistent, every held value finite.
inline bool outlier_window_valid(const OutlierWindow& w) {
    if (w.count < 0 || w.count > kOutlierWindow || w.next < 0 || w.next >= kOutlierWindow) return false;
    if (w.count < kOutlierWindow && w.next != w.count) return false;
    for (int i = 0; i < w.count; i++)
        if (!std::isfinite(w.values[i])) return false;
    return true;
}

// z of the newest value of a full window (see the top of the file for the order of operations).
inline double outlier_z(const OutlierWindow& w, double x) {
    double sum = 0.0;
    for (int i = 0; i < kOutlierWindow; i++) sum += w.values[i];
    const double mean = sum / kOutlierWindow;
    double squares = 0.0;
    for (int i = 0; i < kOutlierWindow; i++) {
        const double d = w.values[i] - mean;
        squares = std::fma(d, d, squares);
    }
    const double std_dev = std::sqrt(squares / kOutlierWindow);
    return std_dev > 0.0 ? (x - mean) / std_dev : 0.0;
}

// Adds x to the window and returns its z: NaN while the window fills, and for a non-finite x, which
// is not added.
inline double outlier_push(OutlierWindow& w, double x) {
    if (!std::isfinite(x)) return NAN;
    const bool full = w.count == kOutlierWindow;
    w.values[w.next] = x;
    w.next = (w.next + 1) % kOutlierWindow;
    if (!full) {
        w.count++;
        return NAN;
    }
    return outlier_z(w, x);
}

// One step's finding: each value's z (NaN: none) and whether it asks for the update to be skipped.
struct OutlierVerdict {
    double loss_z = NAN, norm_z = NAN;
    bool loss_skip = false, norm_skip = false;
    bool skip() const { return loss_skip || norm_skip; }
};

struct OutlierGuard {
    double loss_limit = 0.0, norm_limit = 0.0;  // -sl, -sg: Z, 0 = off
    OutlierWindows windows;

    bool on() const { return loss_limit > 0.0 || norm_limit > 0.0; }

    // Takes a step's mean loss and gradient norm (the values the step line prints, as doubles).
    OutlierVerdict observe(double loss, double norm) {
        OutlierVerdict v;
        v.loss_z = outlier_push(windows.loss, loss);
        v.norm_z = outlier_push(windows.norm, norm);
        v.loss_skip = loss_limit > 0.0 && v.loss_z > loss_limit;  // (false for a NaN z)
        v.norm_skip = norm_limit > 0.0 && v.norm_z > norm_limit;
        return v;
    }

    // Why a step's update was skipped, "" if it was not: "loss z 4.312 > 3" and/or "norm z 5.021 > 3".
    // `log` gives main.log's one-token form instead: "loss_z=4.312" and/or "norm_z=5.021".
    std::string reasons(const OutlierVerdict& v, bool log = false) const {
        std::string out;
        char part[96];
        const bool skips[2] = {v.loss_skip, v.norm_skip};
        const double z[2] = {v.loss_z, v.norm_z}, limit[2] = {loss_limit, norm_limit};
        const char* names[2] = {"loss", "norm"};
        for (int i = 0; i < 2; i++) {
            if (!skips[i]) continue;
            if (log) snprintf(part, sizeof(part), "%s%s_z=%.3f", out.empty() ? "" : ",", names[i], z[i]);
            else snprintf(part, sizeof(part), "%s%s z %.3f > %g", out.empty() ? "" : ", ", names[i], z[i], limit[i]);
            out += part;
        }
        return out;
    }
};
