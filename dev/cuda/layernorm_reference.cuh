// layernorm_reference.cuh: the CPU reference LayerNorm, in double precision, that the laboratories
// (dev/cuda/layernorm_forward.cu, dev/cuda/layernorm_backward.cu) validate every kernel against.
// test/test_layernorm_reference.py checks these very functions (through build/liblayernorm_capi.so)
// against PyTorch's F.layer_norm forward and autograd backward in float64.
//
// Host only. T (inputs) and S (cached statistics) may be float, __nv_bfloat16 or double: the stored
// values are read exactly, every operation after that is double.
#pragma once

#include <cmath>

#include "common.cuh"
#include "dev/lab.cuh"  // to_double

constexpr double kLayerNormRefEps = 1e-5;

// out = (x - mean) * rstd * weight + bias per row; mean, rstd: (N,). Any of mean/rstd may be null.
template <typename T>
void layernorm_forward_reference(double* out, double* mean, double* rstd, const T* inp, const T* weight,
                                 const T* bias, int N, int C) {
    for (int n = 0; n < N; n++) {
        const T* x = inp + size_t(n) * C;
        double m = 0.0;
        for (int c = 0; c < C; c++) m += to_double(x[c]);
        m /= C;
        double v = 0.0;
        for (int c = 0; c < C; c++) {
            const double d = to_double(x[c]) - m;
            v += d * d;
        }
        v /= C;  // biased variance, as PyTorch's layer_norm
        const double s = 1.0 / std::sqrt(v + kLayerNormRefEps);
        for (int c = 0; c < C; c++)
            out[size_t(n) * C + c] = (to_double(x[c]) - m) * s * to_double(weight[c]) + to_double(bias[c]);
        if (mean) mean[n] = m;
        if (rstd) rstd[n] = s;
    }
}

// Accumulates (+=) into dinp (N, C), dweight (C,), dbias (C,), from the cached statistics mean/rstd.
// The caller initializes the three buffers (zeros, or the values the kernel under test starts from).
template <typename T, typename S>
void layernorm_backward_reference(double* dinp, double* dweight, double* dbias, const T* dout, const T* inp,
                                  const T* weight, const S* mean, const S* rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        const T* x = inp + size_t(n) * C;
        const T* dy = dout + size_t(n) * C;
        const double m = to_double(mean[n]), s = to_double(rstd[n]);
        double mean_g = 0.0, mean_gn = 0.0;
        for (int c = 0; c < C; c++) {
            const double xn = (to_double(x[c]) - m) * s, g = to_double(weight[c]) * to_double(dy[c]);
            mean_g += g;
            mean_gn += g * xn;
        }
        mean_g /= C;
        mean_gn /= C;
        for (int c = 0; c < C; c++) {
            const double xn = (to_double(x[c]) - m) * s, g = to_double(weight[c]) * to_double(dy[c]);
            dinp[size_t(n) * C + c] += s * (g - mean_g - xn * mean_gn);
            dweight[c] += xn * to_double(dy[c]);
            dbias[c] += to_double(dy[c]);
        }
    }
}
