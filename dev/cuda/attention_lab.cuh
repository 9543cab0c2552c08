// attention_lab.cuh: what the attention laboratories (dev/cuda/attention_forward.cu and
// attention_backward.cu) share: the double-precision CPU reference of causal attention, the inputs,
// device buffers, the check shapes and the tolerance argument.
//
// Tolerances. Every output element is a sum of terms (out_td = sum_j p_tj v_jd, dv_jd = sum_t p_tj
// dO_td, ...). The reference also returns, per element, the sum of the terms' absolute values
// ("|terms|"; for dq and dk it includes p (|dP| + sum|dO * O|) |k| or |q|, which bounds the effect
// of errors in dP and D). Rounding a factor of every term to a relative error e moves the element by
// at most e * |terms|, so each element is checked as err / |terms| (check_close on the ratio):
//   - bf16 versions round each of P (or dS), the bf16 copy of out used for D, and the output itself
//     once (unit roundoff u = 2^-9 each): bound 6 u, plus 2 u |ref| / |terms| for the output's own
//     rounding. Score errors are fp32 (products of bf16 values are exact, sums of HS terms).
//   - the cuBLAS version in bf16 also stores the scores in bf16 before the softmax: |ds| <= u |s|,
//     which moves each probability by up to 2 u max|s| relatively (its own exp and the normalizer),
//     and stores dP in bf16: bound (8 + 4 max|s|) u.
//   - fp32 versions: sums of up to T + HS fp32 terms, each rounding 2^-24: 16 (T + HS) 2^-24.
//   - lse (fp32 everywhere): absolute error of log(sum) ~ the sum's relative error, 8 (T + HS) 2^-24,
//     plus 2^-22 relative.
// A normalized error is scale-free: a missing or extra key moves an element by p |v|, which at
// small t is a large fraction of |terms|; T = 1 and T = 37 check exactly those rows.
#pragma once

#include <cmath>
#include <vector>

#include "common.cuh"
#include "dev/lab.cuh"

// ---------------------------------------------------------------------------------------------
// Shapes and inputs.

struct AttnShape {
    int B, NH, T, HS;
    int C() const { return NH * HS; }
    size_t rows() const { return size_t(B) * T; }
};

// Validation shapes: T = 1, T not a multiple of any tile (37, 129, 1000), head sizes 64, 80, 128
// (the fast path), 13 and 32 (the plain path), several batches and heads (indexing).
const AttnShape kCheckShapes[] = {
    {1, 1, 1, 64},   {2, 3, 37, 64},  {1, 2, 1000, 64}, {2, 2, 256, 64}, {1, 1, 1, 80},   {2, 2, 129, 80},
    {1, 2, 1000, 80}, {1, 1, 1, 128}, {2, 3, 37, 128},  {1, 2, 1000, 128}, {1, 1, 1, 13}, {2, 3, 37, 13},
    {1, 2, 300, 13}, {2, 2, 100, 32},
};

// qkv (B, T, 3C): q and k uniform in [-2, 2] (scores with a standard deviation of ~1.3, so the
// softmax is neither flat nor one-hot), v in [-1, 1]. Values are rounded to bf16 so that the fp32
// and bf16 runs see identical inputs and the reference reads them exactly.
inline std::vector<float> make_qkv(const AttnShape& s, uint64_t seed) {
    Rng rng(seed);
    const int C = s.C();
    std::vector<float> x(s.rows() * 3 * C);
    for (size_t r = 0; r < s.rows(); r++)
        for (int c = 0; c < 3 * C; c++) {
            const float v = c < 2 * C ? rng.uniform(-2.0f, 2.0f) : rng.uniform(-1.0f, 1.0f);
            x[r * 3 * C + c] = __bfloat162float(__float2bfloat16(v));
        }
    return x;
}
inline std::vector<float> make_uniform_bf16(size_t n, float lo, float hi, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> x(n);
    for (auto& v : x) v = __bfloat162float(__float2bfloat16(rng.uniform(lo, hi)));
    return x;
}
template <typename T> std::vector<T> convert(const std::vector<float>& x) {
    std::vector<T> y(x.size());
    for (size_t i = 0; i < x.size(); i++) y[i] = from_float<T>(x[i]);
    return y;
}

// ---------------------------------------------------------------------------------------------
// Reference (double). Layouts as the kernels: qkv (B, T, 3C), out (B, T, C), lse (B, NH, T),
// dout (B, T, C), dqkv (B, T, 3C). *_terms: the per-element sums of |terms| (see the top).

struct AttnReference {
    std::vector<double> out, out_terms, lse;      // forward
    std::vector<double> dqkv, dqkv_terms;         // backward (empty unless asked for)
    double max_abs_score = 0.0;                   // max |q . k| / sqrt(HS) over the causal pairs
};

inline AttnReference attention_reference(const AttnShape& s, const std::vector<float>& qkv, const std::vector<float>* dout) {
    const int B = s.B, NH = s.NH, T = s.T, HS = s.HS, C = s.C();
    const double scale = 1.0 / std::sqrt(double(HS));
    AttnReference r;
    r.out.assign(s.rows() * C, 0.0), r.out_terms.assign(s.rows() * C, 0.0), r.lse.assign(size_t(B) * NH * T, 0.0);
    if (dout) r.dqkv.assign(s.rows() * 3 * C, 0.0), r.dqkv_terms.assign(s.rows() * 3 * C, 0.0);
    std::vector<double> P(size_t(T) * T), dP(size_t(T) * T), D(T), Dabs(T);
    auto at = [&](int b, int t, int part, int h, int d) { return size_t(b * T + t) * 3 * C + part * C + h * HS + d; };
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                double* p = &P[size_t(t) * T];
                double m = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    double dot = 0.0;
                    for (int d = 0; d < HS; d++) dot += double(qkv[at(b, t, 0, h, d)]) * qkv[at(b, j, 1, h, d)];
                    p[j] = dot * scale;
                    m = std::max(m, p[j]);
                    r.max_abs_score = std::max(r.max_abs_score, std::fabs(p[j]));
                }
                double l = 0.0;
                for (int j = 0; j <= t; j++) l += (p[j] = std::exp(p[j] - m));
                for (int j = 0; j <= t; j++) p[j] /= l;
                r.lse[(size_t(b) * NH + h) * T + t] = m + std::log(l);
                for (int d = 0; d < HS; d++) {
                    double o = 0.0, terms = 0.0;
                    for (int j = 0; j <= t; j++) {
                        const double v = qkv[at(b, j, 2, h, d)];
                        o += p[j] * v, terms += p[j] * std::fabs(v);
                    }
                    r.out[(size_t(b) * T + t) * C + h * HS + d] = o;
                    r.out_terms[(size_t(b) * T + t) * C + h * HS + d] = terms;
                }
            }
            if (!dout) continue;
            auto g = [&](int t, int d) { return double((*dout)[(size_t(b) * T + t) * C + h * HS + d]); };
            for (int t = 0; t < T; t++) {
                D[t] = Dabs[t] = 0.0;
                for (int d = 0; d < HS; d++) {
                    const double o = r.out[(size_t(b) * T + t) * C + h * HS + d];
                    D[t] += g(t, d) * o, Dabs[t] += std::fabs(g(t, d) * o);
                }
                for (int j = 0; j <= t; j++) {
                    double dot = 0.0;
                    for (int d = 0; d < HS; d++) dot += g(t, d) * qkv[at(b, j, 2, h, d)];
                    dP[size_t(t) * T + j] = dot;
                }
            }
            for (int t = 0; t < T; t++)
                for (int j = 0; j <= t; j++) {
                    const double p = P[size_t(t) * T + j], dp = dP[size_t(t) * T + j];
                    const double ds = p * (dp - D[t]);
                    const double ds_terms = std::fabs(ds) + p * (std::fabs(dp) + Dabs[t]);
                    for (int d = 0; d < HS; d++) {
                        const double q = qkv[at(b, t, 0, h, d)], k = qkv[at(b, j, 1, h, d)];
                        r.dqkv[at(b, t, 0, h, d)] += scale * ds * k;
                        r.dqkv_terms[at(b, t, 0, h, d)] += scale * ds_terms * std::fabs(k);
                        r.dqkv[at(b, j, 1, h, d)] += scale * ds * q;
                        r.dqkv_terms[at(b, j, 1, h, d)] += scale * ds_terms * std::fabs(q);
                        r.dqkv[at(b, j, 2, h, d)] += p * g(t, d);
                        r.dqkv_terms[at(b, j, 2, h, d)] += p * std::fabs(g(t, d));
                    }
                }
        }
    return r;
}

// ---------------------------------------------------------------------------------------------
// Checks.

enum class Rounding { fp32, bf16, bf16_scores };  // see the top: which roundings a version does

inline double terms_bound(Rounding k, const AttnShape& s, double max_abs_score, bool backward) {
    const double u = std::ldexp(1.0, -9);
    switch (k) {
        case Rounding::fp32: return 16.0 * (s.T + s.HS) * std::ldexp(1.0, -24);
        case Rounding::bf16: return 6.0 * u;
        default: return (backward ? 8.0 + 4.0 * max_abs_score : 6.0 + 2.0 * max_abs_score) * u;
    }
}

// Elements [part * C, part * C + C) of every row of width `width` (part 0 and width C for out; 0, 1, 2
// of 3C for dq, dk, dv), as err / |terms| through check_close.
template <typename G>
bool check_normalized(const char* what, const G* got, const std::vector<double>& ref, const std::vector<double>& terms,
                      size_t rows, int width, int part, int C, double bound, bool output_bf16) {
    std::vector<double> g, rn;
    g.reserve(rows * C), rn.reserve(rows * C);
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < C; c++) {
            const size_t i = r * width + size_t(part) * C + c;
            const double m = terms[i] + 1e-30;
            g.push_back(to_double(got[i]) / m);
            rn.push_back(ref[i] / m);
        }
    char label[96];
    snprintf(label, sizeof(label), "%s (err / |terms|)", what);
    return check_close(label, g.data(), rn.data(), g.size(), bound, output_bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -22));
}

inline bool check_lse(const float* got, const std::vector<double>& ref, const AttnShape& s) {
    return check_close("lse (fp32)", got, ref.data(), ref.size(), 8.0 * (s.T + s.HS) * std::ldexp(1.0, -24), std::ldexp(1.0, -22));
}

