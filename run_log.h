// run_log.h: a run folder's logs. main.log in llm.c's form ("s:STEP trl:LOSS" for a training step,
// followed by " skip:loss_z=Z,norm_z=Z" (either or both) when the outlier guard skipped its update,
// "s:STEP tel:LOSS" for a validation, "s:STEP eval:ACC_NORM" for HellaSwag) and metrics.csv (a header,
// then a row per step, per validation and per evaluation; scripts/plot_runs.py reads it). Each row is flushed as it is written. A row that cannot
// be written (a full disk) is said once on stderr and the run goes on: its checkpoints, written and
// checked on their own, are what a run must not lose.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

#include "common.cuh"
#include "fileio.h"

struct LogFile {
    FILE* file = nullptr;
    std::string path;
    bool warned = false;
    void open(const std::string& p) {
        path = p;
        file = fopen(p.c_str(), "a");
        if (!file) fail("cannot open '%s' for appending: %s", p.c_str(), strerror(errno));
    }
    void row(const char* fmt, ...) {
        if (!file) return;
        va_list args;
        va_start(args, fmt);
        const int n = vfprintf(file, fmt, args);
        va_end(args);
        if ((n < 0 || fflush(file) != 0) && !warned) {
            fprintf(stderr, "warning: cannot write to %s (%s): its rows from here on may be lost\n", path.c_str(), strerror(errno));
            warned = true;
        }
    }
    void close() {
        if (file && fclose(file) != 0 && !warned)
            fprintf(stderr, "warning: closing %s: %s: its last rows may be lost\n", path.c_str(), strerror(errno));
        file = nullptr;
    }
};

constexpr const char* kMetricsHeader = "step,train_loss,val_loss,lr,grad_norm,step_ms,tokens_per_s,hellaswag_acc_norm,hellaswag_acc";
constexpr const char* kMetricsHeaderBeforeEval = "step,train_loss,val_loss,lr,grad_norm,step_ms,tokens_per_s";

// A metrics.csv written before the evaluation columns, resumed: rewritten (atomically) with them, its
// rows given two empty fields, so the file keeps one header. Anything else is left as it is.
inline void upgrade_metrics(const std::string& path) {
    std::vector<uint8_t> bytes;
    std::string error;
    if (!read_whole_file(path, bytes, &error, uint64_t(1) << 32)) return;
    std::string text(bytes.begin(), bytes.end()), out;
    const std::string old_header = std::string(kMetricsHeaderBeforeEval) + "\n";
    if (text.compare(0, old_header.size(), old_header) != 0) return;
    out = std::string(kMetricsHeader) + "\n";
    for (size_t at = old_header.size(); at < text.size();) {
        size_t end = text.find('\n', at);
        if (end == std::string::npos) break;  // a row cut short by a kill: dropped
        out += text.substr(at, end - at) + ",,\n";
        at = end + 1;
    }
    if (!write_file_atomic(path, {{out.data(), out.size()}}, &error))
        fail("cannot add the evaluation columns to '%s': %s", path.c_str(), error.c_str());
}

// A log whose last row a kill cut short (no newline at its end) loses that row, so the next row
// starts a line of its own. Nothing else is changed.
inline void drop_partial_row(const std::string& path) {
    std::vector<uint8_t> bytes;
    std::string error;
    if (!file_exists(path) || !read_whole_file(path, bytes, &error, uint64_t(1) << 32) || bytes.empty() || bytes.back() == '\n')
        return;
    size_t keep = bytes.size();
    while (keep > 0 && bytes[keep - 1] != '\n') keep--;
    if (truncate(path.c_str(), (off_t)keep) != 0)
        fail("cannot drop the cut-short last row of '%s': %s", path.c_str(), strerror(errno));
}

// Both logs of a run folder; closed, they take nothing (a run without -o, or a rank other than 0).
struct RunLogs {
    LogFile main, metrics;

    void open(const std::string& dir) {
        const std::string csv_path = dir + "/metrics.csv";
        for (const std::string& tmp : expand_glob(csv_path + ".tmp.*"))  // an upgrade a kill cut short
            if (tmp.size() > csv_path.size() + 5) unlink(tmp.c_str());
        drop_partial_row(csv_path);
        drop_partial_row(dir + "/main.log");
        struct stat csv_stat;
        const bool csv_new = stat(csv_path.c_str(), &csv_stat) != 0 || csv_stat.st_size == 0;  // empty: killed before its header
        if (!csv_new) upgrade_metrics(csv_path);
        main.open(dir + "/main.log");
        metrics.open(csv_path);
        if (csv_new) metrics.row("%s\n", kMetricsHeader);
    }
    // `skipped`: why the outlier guard skipped the step's update, in main.log's form ("" if it did not).
    void train_step(int step, float loss, float lr, float norm, double ms, double tokens_per_s, const std::string& skipped) {
        main.row("s:%d trl:%.6f%s%s\n", step, loss, skipped.empty() ? "" : " skip:", skipped.c_str());
        metrics.row("%d,%.6f,,%.6e,%.6f,%.3f,%.1f,,\n", step, loss, lr, norm, ms, tokens_per_s);
    }
    void validation(int step, float loss) {
        main.row("s:%d tel:%.6f\n", step, loss);
        metrics.row("%d,,%.6f,,,,,,\n", step, loss);
    }
    void evaluation(int step, double acc_norm, double acc) {
        main.row("s:%d eval:%.4f\n", step, acc_norm);
        metrics.row("%d,,,,,,,%.6f,%.6f\n", step, acc_norm, acc);
    }
    void close() {
        main.close();
        metrics.close();
    }
};

// "1h05m" or "4m09s", for the time left.
inline std::string format_duration(double seconds) {
    char buf[32];
    const long s = (long)seconds;
    if (s >= 3600) snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, s / 60 % 60);
    else snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
    return buf;
}
