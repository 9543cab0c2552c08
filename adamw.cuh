// adamw.cuh: the global gradient norm and the AdamW update, each over all parameters in one launch.
//
//   global_norm_squared  sum of g^2 over the flat gradient buffer, into one fp32 on the device
//   adamw_update         PyTorch's AdamW (decoupled weight decay, bias-corrected moments):
//                        p -= lr * wd * p (decayed tensors only); m = b1 m + (1 - b1) g;
//                        v = b2 v + (1 - b2) g^2; p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
//                        with g = grad * clip_factor(norm, clip) (PyTorch's clip_grad_norm_ factor).
//
// Non-obvious choices:
//   - No host synchronisation: the step's loss sum and squared gradient norm stay on the device
//     (StepStats), and every AdamW thread computes the clipping factor and the skip decision (a
//     non-finite loss or norm: no write at all) from them itself, so the GPU never waits on a round
//     trip to the host. The host reads StepStats after the step's one synchronisation and decides
//     what to report with the same step_finite(), so its decision is the device's.
//   - The norm is a two-stage reduction with a fixed grid (kNormBlocks, independent of the GPU), so
//     it gives the same bits every run and on every GPU model.
//   - Mixed precision: `master` holds the fp32 weights the update applies to; the storage-type
//     parameters are then rounded from them (round to nearest), so a model saved from `master` and
//     reloaded gives the same storage-type parameters bit for bit. Without master weights (fp32
//     builds) the update applies to the parameters directly.
//   - Which tensors decay is a per-tensor flag; the kernel finds an element's tensor from a small
//     table of tensor end offsets passed by value.
#pragma once

#include "common.cuh"

constexpr int kNormBlocks = 1024, kNormThreads = 256;
constexpr int kMaxParamTensors = 16;

template <typename T> __global__ void __launch_bounds__(kNormThreads) global_norm_partials_kernel(float* partials, const T* x, size_t n) {
    __shared__ float warp_sums[kNormThreads / 32];
    float sum = 0.0f;
    for (size_t i = blockIdx.x * size_t(kNormThreads) + threadIdx.x; i < n; i += size_t(kNormBlocks) * kNormThreads) {
        const float g = to_float(x[i]);
        sum += g * g;
    }
    sum = warp_sum(sum);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < kNormThreads / 32; w++) total += warp_sums[w];
        partials[blockIdx.x] = total;
    }
}

__global__ void global_norm_finalize_kernel(float* out, const float* partials) {
    __shared__ float warp_sums[32];
    float sum = 0.0f;
    for (int i = threadIdx.x; i < kNormBlocks; i += 1024) sum += partials[i];
    sum = warp_sum(sum);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < 32; w++) total += warp_sums[w];
        *out = total;
    }
}

// partials: device scratch of kNormBlocks floats; out: one device float (the squared norm).
template <typename T> void global_norm_squared(float* out, float* partials, const T* grads, size_t n, cudaStream_t stream = 0) {
    global_norm_partials_kernel<T><<<kNormBlocks, kNormThreads, 0, stream>>>(partials, grads, n);
    cuda_check_launch();
    global_norm_finalize_kernel<<<1, 1024, 0, stream>>>(out, partials);
    cuda_check_launch();
}

// Tensor table: tensor i covers [end[i-1], end[i]) of the flat buffer; decay bit i says whether it
// gets weight decay.
struct ParamTable {
    size_t end[kMaxParamTensors];
    int count;
    unsigned decay_mask;
};

// What one optimizer step produces on the device and the update depends on; adjacent, so the host
// fetches both in one copy after the step.
struct StepStats {
    double loss_sum;     // sum of the step's micro-batch mean losses, each rounded to float first
    float norm_squared;  // squared global gradient norm (global_norm_squared)
    float unused;        // pads to 16 bytes
};

// The update runs only when both are finite. sqrt(norm_squared) is finite exactly when
// norm_squared is (a sum of squares is not negative), so this is also "loss and norm finite".
__host__ __device__ inline bool step_finite(const StepStats& s) {
    return isfinite(s.loss_sum) && isfinite(s.norm_squared);
}

// PyTorch's clip_grad_norm_ factor: min(1, clip / (norm + 1e-6)); clip <= 0 disables clipping. Host
// and device give the same bits: IEEE sqrtf and division (nvcc's defaults, no fast-math), no FMA
// to contract.
__host__ __device__ inline float clip_factor(float norm_squared, float clip) {
    if (clip <= 0.0f) return 1.0f;
    const float scale = clip / (sqrtf(norm_squared) + 1e-6f);
    return scale < 1.0f ? scale : 1.0f;  // std::min(1.0f, scale)
}

struct AdamWHyper {
    float lr, beta1, beta2, eps, weight_decay;
    float beta1_correction, beta2_correction;  // 1 - beta^t
    float grad_clip;                           // global-norm clip, <= 0: off
    const StepStats* step;                     // device: the step's loss sum and squared gradient norm
};

template <typename T>
__global__ void adamw_kernel(T* params, float* master, const T* grads, float* m, float* v, size_t n, ParamTable table,
                             AdamWHyper h) {
    // Every thread decides for itself (two loads of one cached line, one sqrt and one division): no
    // extra kernel, no host round trip.
    const StepStats step = *h.step;
    if (!step_finite(step)) return;  // a skipped step writes nothing
    const float grad_scale = clip_factor(step.norm_squared, h.grad_clip);
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        int tensor = 0;
        while (tensor < table.count - 1 && i >= table.end[tensor]) tensor++;
        const float wd = (table.decay_mask >> tensor) & 1u ? h.weight_decay : 0.0f;
        const float g = to_float(grads[i]) * grad_scale;
        float p = master ? master[i] : to_float(params[i]);
        const float mi = h.beta1 * m[i] + (1.0f - h.beta1) * g;
        const float vi = h.beta2 * v[i] + (1.0f - h.beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        p -= h.lr * wd * p;
        p -= h.lr * (mi / h.beta1_correction) / (sqrtf(vi / h.beta2_correction) + h.eps);
        if (master) master[i] = p;
        params[i] = from_float<T>(p);
    }
}

template <typename T>
void adamw_update(T* params, float* master, const T* grads, float* m, float* v, size_t n, const ParamTable& table,
                  const AdamWHyper& h, cudaStream_t stream = 0) {
    adamw_kernel<T><<<(unsigned)std::min<size_t>((n + 255) / 256, 132 * 32), 256, 0, stream>>>(params, master, grads, m, v,
                                                                                               n, table, h);
    cuda_check_launch();
}
