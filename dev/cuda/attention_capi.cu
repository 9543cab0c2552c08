// attention_capi.cu: a C API over flash_attention.cuh, built into build/libattention_capi.so
// (`make build/libattention_capi.so`) for Python's ctypes: dev/cuda/attention_vs_torch.py calls our
// kernels on PyTorch's tensors (raw device pointers and PyTorch's current stream), so both sides run
// in one process on the same memory. A library, not a program: the Makefile builds every other
// dev/cuda/*.cu into one. Returns 0 on success; a CUDA error ends the process with one line on stderr
// (common.cuh's fail).

#include "common.cuh"
#include "flash_attention.cuh"

extern "C" {

int attn_supported(int HS) { return flash_attention_supported(HS) ? 1 : 0; }

// out (B, T, C) bf16, lse (B, NH, T) fp32, qkv (B, T, 3C) bf16.
int attn_forward(void* out, float* lse, const void* qkv, int B, int T, int NH, int HS, void* stream) {
    flash_attention_forward(static_cast<__nv_bfloat16*>(out), lse, static_cast<const __nv_bfloat16*>(qkv), B, T, NH, HS,
                            static_cast<cudaStream_t>(stream));
    return 0;
}

// D, then room for the dS tiles (so the side-by-side times the backward training runs).
size_t attn_backward_scratch_bytes(int B, int T, int NH, int HS) {
    return flash_attention_backward_scratch_bytes(B, T, NH, HS) + flash_attention_backward_ds_bytes(B, T, NH, HS);
}

// dqkv (B, T, 3C) bf16 (overwritten), scratch of attn_backward_scratch_bytes bytes.
int attn_backward(void* dqkv, void* scratch, const void* dout, const void* out, const float* lse, const void* qkv, int B, int T,
                  int NH, int HS, void* stream) {
    using bf = __nv_bfloat16;
    void* ds_scratch = static_cast<char*>(scratch) + flash_attention_backward_scratch_bytes(B, T, NH, HS);
    const FlashAttentionBackwardOptions options = FlashAttentionBackwardOptions()
                                                      .with_ds_scratch(ds_scratch, flash_attention_backward_ds_bytes(B, T, NH, HS))
                                                      .with_stream(static_cast<cudaStream_t>(stream));
    flash_attention_backward(static_cast<bf*>(dqkv), scratch, static_cast<const bf*>(dout), static_cast<const bf*>(out), lse,
                             static_cast<const bf*>(qkv), B, T, NH, HS, options);
    return 0;
}

}  // extern "C"
