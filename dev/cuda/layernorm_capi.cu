// layernorm_capi.cu: a C API over layernorm.cuh and the CPU reference, built into
// build/liblayernorm_capi.so (`make build/liblayernorm_capi.so`) for Python's ctypes:
//   - dev/cuda/layernorm_vs_torch.py calls our kernels on PyTorch's tensors (raw device pointers and
//     PyTorch's current stream), so both sides run in one process on the same memory;
//   - test/test_layernorm_reference.py calls the labs' CPU reference (host only, no GPU needed).
// A library, not a program: the Makefile builds every other dev/cuda/*.cu into one. Returns 0 on
// success; a CUDA error ends the process with one line on stderr (common.cuh's fail), as everywhere
// in this project.

#include "common.cuh"
#include "dev/cuda/layernorm_reference.cuh"
#include "layernorm.cuh"

extern "C" {

int ln_forward_f32(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias, int N,
                   int C, void* stream) {
    layernorm_forward(out, mean, rstd, inp, weight, bias, N, C,
                      LayerNormForwardOptions().with_stream(static_cast<cudaStream_t>(stream)));
    return 0;
}

int ln_forward_bf16(void* out, float* mean, float* rstd, const void* inp, const void* weight, const void* bias, int N,
                    int C, void* stream) {
    using bf = __nv_bfloat16;
    layernorm_forward(static_cast<bf*>(out), mean, rstd, static_cast<const bf*>(inp), static_cast<const bf*>(weight),
                      static_cast<const bf*>(bias), N, C,
                      LayerNormForwardOptions().with_stream(static_cast<cudaStream_t>(stream)));
    return 0;
}

size_t ln_backward_scratch_bytes(int N, int C) { return layernorm_backward_scratch_bytes(N, C); }

// Accumulates: dinp += ..., dweight += ..., dbias += ... (zero them first for plain gradients).
int ln_backward_f32(float* dinp, float* dweight, float* dbias, void* scratch, const float* dout, const float* inp,
                    const float* weight, const float* mean, const float* rstd, int N, int C, void* stream) {
    layernorm_backward(dinp, dweight, dbias, scratch, dout, inp, weight, mean, rstd, N, C,
                       LayerNormBackwardOptions<float>().with_stream(static_cast<cudaStream_t>(stream)));
    return 0;
}

int ln_backward_bf16(void* dinp, void* dweight, void* dbias, void* scratch, const void* dout, const void* inp,
                     const void* weight, const float* mean, const float* rstd, int N, int C, void* stream) {
    using bf = __nv_bfloat16;
    layernorm_backward(static_cast<bf*>(dinp), static_cast<bf*>(dweight), static_cast<bf*>(dbias), scratch,
                       static_cast<const bf*>(dout), static_cast<const bf*>(inp), static_cast<const bf*>(weight), mean, rstd,
                       N, C, LayerNormBackwardOptions<bf>().with_stream(static_cast<cudaStream_t>(stream)));
    return 0;
}

// The labs' CPU reference, on float64 host arrays.
void ln_reference_forward(double* out, double* mean, double* rstd, const double* inp, const double* weight,
                          const double* bias, int N, int C) {
    layernorm_forward_reference(out, mean, rstd, inp, weight, bias, N, C);
}

// Accumulates into dinp, dweight, dbias, like the kernels.
void ln_reference_backward(double* dinp, double* dweight, double* dbias, const double* dout, const double* inp,
                           const double* weight, const double* mean, const double* rstd, int N, int C) {
    layernorm_backward_reference(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

}  // extern "C"
