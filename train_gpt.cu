// train_gpt.cu: GPT-2 training on one GPU or several (one process each), in one file.
//
// Reads top to bottom: the model's buffers (one flat device buffer each for the parameters, their
// gradients and the activations, carved into named tensors), forward, backward, AdamW update,
// generation, then the run: command line, set-up, training loop. The config and the list of
// parameter tensors are model_config.h's; each kernel family lives in its own header (encoder,
// layernorm, matmul, attention, flash_attention, lm_head, classifier, adamw), the run's
// infrastructure in headers of one job each: dataloader.h, checkpoint.h, run_log.h, schedule.h,
// outlier_guard.h, stop_signal.h, profiler.h, and for several GPUs distributed.cuh (the ranks) and
// zero.cuh (gradient buckets, ZeRO-1 shards).
//
// Precision is a build option: train_gpt_fp32 (everything fp32, cuBLAS without TF32) and
// train_gpt_bf16 (bf16 parameters, gradients and activations; fp32 master weights, AdamW state,
// LayerNorm statistics, softmax and loss).
//
// A training step never waits on the GPU: batches go up from pinned staging buffers, the loss is
// summed on the device, and AdamW clips (or skips a non-finite step) from device values. The host
// synchronises once, at the end of the step, and only then reads the loss and gradient norm (with
// the outlier guard on, -sl or -sg, also once before the update, which waits for its decision).
//
// Nothing touches the GPU before every input (flags, token files, tokenizer, checkpoints, output
// folder) has been validated, so bad input fails with one line and exit code 1 even without a GPU.
#include <sys/stat.h>
#include <unistd.h>

#include <cuda_profiler_api.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "adamw.cuh"
#include "attention.cuh"
#include "checkpoint.h"
#include "classifier.cuh"
#include "common.cuh"
#include "dataloader.h"
#include "distributed.cuh"
#include "encoder.cuh"
#include "evaluation.h"
#include "fileio.h"
#include "flash_attention.cuh"
#include "fp8.cuh"
#include "layernorm.cuh"
#include "lm_head.cuh"
#include "matmul.cuh"
#include "model_config.h"
#include "outlier_guard.h"
#include "profiler.h"
#include "run_log.h"
#include "schedule.h"
#include "stop_signal.h"
#include "tokenizer.h"
#include "zero.cuh"

// ---------------------------------------------------------------------------------------------
// Parameters: one flat buffer of floatX in the order of GPT_PARAMETER_TENSORS, carved into named
// tensors (gradients alike). Shapes are the list's: (Vp, C) wte, (L, 3C, C) qkvw, ...

struct ParameterTensors {
#define GPT_PARAM_VIEW(name, ...) floatX* name = nullptr;
    GPT_PARAMETER_TENSORS(GPT_PARAM_VIEW)
#undef GPT_PARAM_VIEW
    floatX*& operator[](int i) {
        using Member = floatX* ParameterTensors::*;
        static const Member members[NUM_PARAM_TENSORS] = {
#define GPT_PARAM_MEMBER(name, ...) &ParameterTensors::name,
            GPT_PARAMETER_TENSORS(GPT_PARAM_MEMBER)
#undef GPT_PARAM_MEMBER
        };
        return this->*members[i];
    }
};

inline ParameterTensors point_parameters(floatX* base, const size_t sizes[NUM_PARAM_TENSORS]) {
    ParameterTensors t;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) t[i] = base, base += sizes[i];
    return t;
}

// ---------------------------------------------------------------------------------------------
// Activations: one flat floatX buffer and one flat fp32 buffer (statistics, losses), carved into
// named tensors. Each set is declared once as a struct of P: with P = a pointer the tensors, with
// P = size_t their sizes (activation_sizes), field by field. Per-layer tensors are (L, ...) so the
// backward finds each layer's forward values.

template <typename P> struct ActivationSet {
    P encoded;    // (B, T, C)     token + position embedding
    P ln1;        // (L, B, T, Cp) LayerNorm 1 output, rows of Cp = ln_ld(C): C values, a one, zeros (see ln_ld);
                  //               with -f8 1 one layer (the backward reads its FP8 copy, Fp8Buffers::input)
    P qkv;        // (L, B, T, 3C)
    P atty;       // (L, B, T, C)  attention output before the projection
    P att;        // (L, B, NH, T, T) softmax probabilities (cuBLAS attention only; flash keeps attn_lse)
    P residual2;  // (L, B, T, C)  residual after attention: x + attproj, written by attproj's matmul
    P ln2;        // (L, B, T, Cp) as ln1, one layer with -f8 1 too
    P fch;        // (L, B, T, 4C) MLP hidden, before GELU
    P fch_gelu;   // (L, B, T, 4C) GELU output; with recompute (-r 1) one (B, T, 4C) buffer, rewritten per
                  //               layer; none with -f8 1 (fcproj's FP8 cast applies GELU to fch)
    P residual3;  // (L, B, T, C)  residual after the MLP = input of the next layer, written by fcproj's matmul
    P lnf;        // (B, T, C)
    P logits;     // (min(B T, kLogitsChunkRows), Vp): one chunk of rows' logits at a time, overwritten by
                  //               dlogits when the forward is given a dloss; dead after the LM head's
                  //               backward, so the attention backward borrows it (Scratch::flash_ds)
    P qkvr;       // (3, B, NH, T, HS) scratch: q, k, v per head (cuBLAS attention only)
    P yr;         // (B, NH, T, HS) scratch: attention output per head (dy per head in the backward)
    // backward scratch
    P dresidual;  // (B, T, C)     gradient of the residual stream
    P dln;        // (B, T, C)     gradient of a LayerNorm output / of atty
    P dbig;       // (B, T, 4C)    gradient of fch_gelu / fch (-f8 1: of fch_gelu only), then of qkv
    P dqkvr;      // (3, B, NH, T, HS) (cuBLAS attention only)
    P datt;       // (B, NH, T, T) (cuBLAS attention only)
};
using ActivationTensors = ActivationSet<floatX*>;
constexpr int NUM_ACT_TENSORS = sizeof(ActivationSet<size_t>) / sizeof(size_t);

template <typename P> struct StatSet {
    P ln1_mean;  // (L, B, T)
    P ln1_rstd;  // (L, B, T)
    P ln2_mean;  // (L, B, T)
    P ln2_rstd;  // (L, B, T)
    P lnf_mean;  // (B, T)
    P lnf_rstd;  // (B, T)
    P losses;    // (B, T)
    P attn_lse;  // (L, B, NH, T) flash attention's log-sum-exp per query (flash only)
};
using StatTensors = StatSet<float*>;
constexpr int NUM_STAT_TENSORS = sizeof(StatSet<size_t>) / sizeof(size_t);
static_assert(sizeof(ActivationTensors) == NUM_ACT_TENSORS * sizeof(floatX*) && sizeof(StatTensors) == NUM_STAT_TENSORS * sizeof(float*),
              "one pointer per tensor");

// The LM head and classifier run over at most this many rows at a time (gpt_forward): at B = 64,
// T = 1024 the logits of all rows would take 6.6 GB in bf16, two chunks take half. Larger chunks buy
// nothing: each chunk's matmuls are already large (32768 x 50304 x 768).
constexpr size_t kLogitsChunkRows = 32768;
inline size_t logits_rows(size_t BT) { return std::min(BT, kLogitsChunkRows); }

// The LayerNorm outputs that feed a linear layer with a bias (ln1 -> qkv, ln2 -> fc) are stored with
// rows of ln_ld(C) > C elements: the C values, a column of ones, zeros up to a whole 16-byte vector.
// The LayerNorm writes only the C values; the ones and zeros are set once (gpt_create). Then the
// weight gradient's GEMM also yields the bias gradient (matmul_backward_weight_bias): dout, the
// largest tensor of each layer's backward, is read once instead of twice.
inline int ln_ld(int C) { return ones_column_ld(C, sizeof(floatX)); }

__global__ void fill_ones_column_kernel(floatX* x, size_t rows, int C, int ld) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < rows * (ld - C); i += size_t(gridDim.x) * blockDim.x)
        x[i / (ld - C) * ld + C + i % (ld - C)] = from_float<floatX>(i % (ld - C) == 0 ? 1.0f : 0.0f);
}

// With flash attention the (B, NH, T, T) tensors and the per-head scratch are not needed (size 0).
// With recompute (GELU recomputed in the backward) fch_gelu holds one layer, not L. With fp8_inputs
// (-f8 1) so do ln1 and ln2, and fch_gelu is not kept at all: the backward's weight gradients read the
// FP8 copies of the linear layers' inputs that the forward kept (Fp8Buffers::input), not these, and
// fcproj's forward cast makes GELU's output from fch.
inline void activation_sizes(const GPTConfig& c, int B, int T, bool flash, bool recompute, bool fp8_inputs, ActivationSet<size_t>& a,
                             StatSet<size_t>& s) {
    const size_t L = c.L, BT = size_t(B) * T, C = c.C, NH = c.NH, TT = flash ? 0 : size_t(T) * T, heads = flash ? 0 : 1;
    const size_t LG = fp8_inputs ? 0 : recompute ? 1 : L;  // layers of fch_gelu kept
    const size_t LN = fp8_inputs ? 1 : L;                  // layers of ln1 and ln2 kept
    const size_t Cp = ln_ld(c.C);                          // ln1, ln2: rows with their column of ones
    a.encoded = BT * C, a.ln1 = LN * BT * Cp, a.qkv = L * BT * 3 * C, a.atty = L * BT * C, a.att = L * B * NH * TT;
    a.residual2 = L * BT * C, a.ln2 = LN * BT * Cp, a.fch = L * BT * 4 * C, a.fch_gelu = LG * BT * 4 * C;
    a.residual3 = L * BT * C, a.lnf = BT * C, a.logits = logits_rows(BT) * c.Vp;
    a.qkvr = heads * 3 * BT * C, a.yr = heads * BT * C;
    a.dresidual = BT * C, a.dln = BT * C, a.dbig = BT * 4 * C, a.dqkvr = heads * 3 * BT * C, a.datt = size_t(B) * NH * TT;
    s.ln1_mean = s.ln1_rstd = s.ln2_mean = s.ln2_rstd = L * BT;
    s.lnf_mean = s.lnf_rstd = s.losses = BT;
    s.attn_lse = flash ? L * NH * BT : 0;
}

// Carves `base` into the tensors of a set (views, sizes: a struct of P*, a struct of size_t), each
// start rounded up to 16 bytes so every tensor can take the vectorized kernel paths. Returns the
// bytes used (pass base = nullptr to size the buffer).
template <typename P, typename Views, typename Sizes> size_t carve(Views& views, const Sizes& sizes, P* base) {
    constexpr int count = sizeof(Sizes) / sizeof(size_t);
    static_assert(sizeof(Views) == count * sizeof(P*), "one view per size");
    P** view = reinterpret_cast<P**>(&views);
    const size_t* size = reinterpret_cast<const size_t*>(&sizes);
    size_t offset = 0;  // in elements
    for (int i = 0; i < count; i++) {
        offset = (offset + 16 / sizeof(P) - 1) / (16 / sizeof(P)) * (16 / sizeof(P));
        view[i] = base ? base + offset : nullptr;
        offset += size[i];
    }
    return offset * sizeof(P);
}

// ---------------------------------------------------------------------------------------------
// The model on the device, by job.

// What the model is built with: as -fa, -ge, -r and -ov of train_gpt. GELU fusion by default in bf16
// builds, forward and backward (-ge 2: fewer passes over (B, T, 4C) tensors); fp32 builds are the
// exact reference (PyTorch to ~1e-6): their GELU stays our tanhf kernel, not the epilogue's
// undocumented arithmetic, and their speed is not the point. Every activation is kept by default
// (speed first; d12 fits at B=64 on an 80 GB GPU), and the weight gradients run on a second stream
// (the same kernels and the same bits, overlapped).
constexpr int GELU_FUSION_DEFAULT = std::is_same<floatX, float>::value ? 0 : 2;
constexpr int RECOMPUTE_DEFAULT = 0;
constexpr int OVERLAP_DEFAULT = 1;
struct GPTSettings {
    bool flash = true;  // flash attention where it runs (bf16 builds, head sizes with its tensor-core path)
    int gelu_fusion = GELU_FUSION_DEFAULT;  // GELU in cuBLASLt epilogues: 0 none, 1 forward, 2 forward and backward
    int recompute = RECOMPUTE_DEFAULT;      // 1: fch_gelu holds one layer, the backward recomputes it from fch (-f8 1: no-op)
    bool overlap = OVERLAP_DEFAULT;         // the backward's weight gradients on their own stream
    bool fp8 = false;                       // the blocks' linear layers in FP8 (-f8 1, bf16 builds; Fp8Buffers)
    bool inference = false;                 // forward only (generation): no gradients or optimizer state
};

// -f8 1 takes the FP8 path in a model that trains (gpt_create_fp8 turns it on or refuses the run): the
// one decision that both the activations' sizes and the FP8 buffers follow.
inline bool gpt_fp8_wanted(const GPTSettings& s) { return s.fp8 && !s.inference; }

// Every device allocation of the model, freed together.
struct DeviceMemory {
    std::vector<void*> blocks;
    size_t bytes = 0;  // in all, at start-up
    template <typename P> P* alloc(size_t n, const char* what) {
        void* p = device_malloc(std::max<size_t>(n, 16), what);
        blocks.push_back(p), bytes += n;
        return static_cast<P*>(p);
    }
    void adopt(void* p, size_t n) { blocks.push_back(p), bytes += n; }
    void release(void* p) {  // frees one block early (bytes, the start-up figure, keeps counting it)
        if (!p) return;
        blocks.erase(std::find(blocks.begin(), blocks.end(), p));
        cuda_check(cudaFree(p));
    }
    void release_all() {
        for (void* p : blocks) cuda_check(cudaFree(p));
        blocks.clear();
    }
};

struct ModelWeights {
    size_t sizes[NUM_PARAM_TENSORS] = {};
    size_t count = 0;                 // parameters in all
    ParameterTensors params, grads;   // views into:
    floatX* params_memory = nullptr;  // (world * shard) the tail past `count` is padding (zero.cuh)
    floatX* grads_memory = nullptr;   // (world * shard)
};

struct OptimizerState {  // this rank's shard [dp.lo, dp.hi) of the flat parameter vector
    float* master = nullptr;  // fp32 master weights (bf16 builds only)
    float* adam_m = nullptr;
    float* adam_v = nullptr;
};

struct Activations {
    int B = 0, T = 0;  // the largest batch the buffers hold
    ActivationTensors acts{};
    StatTensors stats{};
};

struct Scratch {
    void* layernorm = nullptr;  // the LayerNorm backward's
    float* wgrad = nullptr;     // (4C, ln_ld(C)) fp32: qkv's and fc's weight and bias gradients, one GEMM each
    void* flash = nullptr;      // flash attention backward's (D)
    void* flash_ds = nullptr;   // room for its backward's dS tiles: acts.logits where that is big enough
    size_t flash_ds_bytes = 0;
    floatX* dqkv = nullptr;     // (B, T, 3C) gradient of qkv: acts.dbig, or with the weight stream its own room
    float* encoder_partials = nullptr;  // the encoder backward's fp32 partial rows of split tokens
    StepStats* step = nullptr;          // (1) the current step's loss sum and squared gradient norm
    float* norm_partials = nullptr;
    double* mean_loss = nullptr;        // (1) gpt_mean_loss's sum
};

// The exp head (-lx 1, lm_head.cuh): the LM head's GEMM writes exp(logit - target logit) and the
// classifier reads only its row sums. Its scratch, one logits chunk's rows.
struct ExpHead {
    bool on = false;
    float* shift = nullptr;  // (rows) each row's target logit
    float* sums = nullptr;   // (rows, lm_head_tiles(Vp)) each row's sums of exp by column tile
    float* scale = nullptr;  // (rows) dloss / (the row's sum)
    floatX* x = nullptr;     // (rows, C) lnf's rows times their scale, for wte's gradient
};

// gpt_set_batch copies each batch asynchronously from pinned host memory, so the host prepares the
// next micro-batch while the GPU works (a pageable cudaMemcpy would wait for the GPU to drain first).
// A slot is reused kBatchSlots batches later, once its copies have run (its event): the host can wait
// there only while the GPU has not reached that batch, i.e. still holds kBatchSlots - 1 batches of
// work, so the GPU never idles on it. A step of up to kBatchSlots micro-batches never waits at all.
constexpr int kBatchSlots = 4;
struct BatchSlot {
    int* host = nullptr;            // pinned: inputs (B*T) | targets (B*T) | encoder-backward work
    cudaEvent_t copied = nullptr;   // recorded after the slot's copies
    TokenBuckets buckets;           // the batch's encoder-backward work, grouped on the host
    int tokens = 0;                 // B*T of the batch staged here
    bool has_targets = false;
};
struct BatchStaging {
    int* inputs = nullptr;   // (B, T) device
    int* targets = nullptr;  // (B, T) device
    int* buckets = nullptr;  // the encoder-backward work of the batch on the device
    BatchSlot slots[kBatchSlots];
    int next_slot = 0;
    int slot = 0;  // the slot of the batch on the device (its buckets drive the encoder backward)
};

// The weight stream (-ov 1): the backward's weight gradients (dweight, and dbias where a matmul
// computes it) run on their own stream beside the chain of data gradients (gpt_backward). The events
// order the two.
struct WeightStream {
    cudaStream_t stream = nullptr;  // null: off, the weight gradients run in line
    cudaEvent_t fork = nullptr;
    cudaEvent_t done[4] = {};
};

// FP8 linear layers (-f8 1, fp8.cuh): each block's four linear layers run their three GEMMs in FP8,
// forward e4m3 x e4m3 (fast accumulation), dinp e4m3 weight x e5m2 dout and dweight e4m3 inp x e5m2
// dout (fp32 promotion), every output bf16 as in the bf16 path; one scale per tensor (scaling below).
// LayerNorm, attention, the residual stream, the LM head and AdamW are the bf16 path's (LayerNorm 1 and
// 2 write their outputs straight in FP8 once their scales are delayed; GELU's forward and backward are
// computed in casts: fcproj's input and fc's output gradient, below). The buffers, allocated only with
// -f8 1:
//   weight[k]: (L, OC, C) e4m3 copies of layer k's weights and their transposes (L, C, OC), made
//              when the weights change (gpt_cast_weights_fp8), not per micro-batch;
//   input[k]:  layer k's input in e4m3: q (B T, C_in), one buffer that every layer's forward GEMM reads
//              in turn (shared by the four kinds), and qt (L, C_in, B T), each block's transposed copy,
//              written with q in a forward that a backward follows (by the cast, or for ln1 and ln2 by
//              the LayerNorm itself, block_layernorm) and read by that block's weight gradient; meta per
//              block. So the backward casts no input, and the bf16 inputs ln1 and ln2 are kept for one
//              layer only (written only until their scales have a history), fch_gelu not at all:
//              fcproj's cast makes the GELU output's copies from fch (activation_sizes);
//   dout[k]:   (B T, OC) e5m2, layer k's output gradient, natural (dinp) and transposed (dweight);
//              one pair per layer of a block, so the weight stream may still read the block above's
//              while this one's is cast (no waits beyond the bf16 path's).
// The layer inputs' transposed copies are B T 7C bytes a block, against the 2 (2 Cp + 4C) B T bytes a
// block of ln1, ln2 and fch_gelu in bf16 that -f8 1 does not keep.
// GELU's backward happens in fc's output gradient's cast: fcproj's dinp GEMM leaves GELU's output
// gradient in dbig, and the cast writes the FP8 copies of dbig GELU'(fch) and their column sums
// (fc's bias gradient), so the bf16 gradient of fch is neither written nor read.
// Scaling: each tensor's scale is fp8_scale of an amax, found without a pass over the activations or
// gradients after a run's first step. The weights' come from their batched casts (one amax launch per
// layer kind a step), and dresidual's (fcproj's and attproj's output gradient) from the LayerNorm
// backward, which writes the amax of what it writes (current scaling: this micro-batch's own). The
// other six take delayed scaling, as Transformer Engine's delayed recipe does (Fp8Delayed): atty and
// dqkv, whose attention kernels write no amax; GELU(fch) and fch's gradient, made in their casts; ln1
// and ln2, which the LayerNorm then writes in FP8 itself, the bf16 output never written (with a current
// scale it would need the whole tensor's amax before its first value). A delayed scale is that of twice
// the largest amax of the last kFp8History training steps (each training cast records its tensor's
// amax, the step's is the max over micro-batches and ranks). The factor 2 is one binade of headroom, so
// that a tensor may grow 2-4x past that amax before any value saturates to the format's largest (it
// costs the format's lowest binade); the run reports how many (tensor, step) pairs saturated. A run's
// first step, with no history yet, scales them by their current amax (a pass each; ln1's and ln2's from
// the LayerNorm writing bf16, then a cast); the history goes into the checkpoints, so a resumed run
// scales as the uninterrupted one.
enum LinearLayer { kQkv, kAttproj, kFc, kFcproj };
constexpr int kLinearIn[4] = {1, 1, 1, 4}, kLinearOut[4] = {3, 1, 4, 1};  // each layer's C and OC, in units of C
// The delayed-scaled tensors of a block, in the order of the history's rows (ln1's and ln2's came last).
// kNotDelayed: a tensor on current scaling (kDoutDelayed).
enum Fp8Delayed { kNotDelayed = -1, kDelayedAtty, kDelayedGelu, kDelayedDfch, kDelayedDqkv, kDelayedLn1, kDelayedLn2, kNumDelayed };
constexpr int kFp8DelayedBefore = 4;  // delayed tensors a state file's history held before ln1 and ln2 joined
static_assert(kDelayedLn1 == kFp8DelayedBefore && kDelayedLn2 + 1 == kNumDelayed, "ln1 and ln2 last: an older history is a prefix");
// Which delayed tensor each LinearLayer's input and output gradient is. attproj's and fcproj's output
// gradient is dresidual, on current scaling.
constexpr Fp8Delayed kInputDelayed[4] = {kDelayedLn1, kDelayedAtty, kDelayedLn2, kDelayedGelu};
constexpr Fp8Delayed kDoutDelayed[4] = {kDelayedDqkv, kNotDelayed, kDelayedDfch, kNotDelayed};
// Each delayed tensor is one layer's input or output gradient, once.
constexpr bool fp8_delayed_tables_cover() {
    int seen[kNumDelayed] = {};
    for (int k = 0; k < 4; k++) {
        seen[kInputDelayed[k]]++;
        if (kDoutDelayed[k] != kNotDelayed) seen[kDoutDelayed[k]]++;
    }
    for (int d = 0; d < kNumDelayed; d++)
        if (seen[d] != 1) return false;
    return true;
}
static_assert(fp8_delayed_tables_cover(), "kInputDelayed and kDoutDelayed name every delayed tensor once");
constexpr int kFp8History = 16;  // training steps whose amax a delayed scale covers
struct Fp8Buffers {
    bool on = false;
    int kept_rows = 0;         // B T of the last forward if it wrote the inputs' transposed copies (it had a dloss), else 0
    Fp8Tensor weight[4];       // per LinearLayer; fp8_weight views one block's
    Fp8Tensor input[4];        // per LinearLayer; fp8_input views one block's
    Fp8Tensor dout[4];         // per LinearLayer; fp8_dout views one block's scale
    unsigned* seen = nullptr;  // (kNumDelayed, L): the amax bits the step's training casts recorded
    float* history = nullptr;  // (kNumDelayed, L, kFp8History): the last steps' amaxes, one column a step in turn
    int* saturated = nullptr;  // delayed casts whose tensor outgrew its scale's range (some values saturated)
    int64_t delayed_casts = 0; // of how many: tensors a step scaled by the history, summed over the steps
    int64_t history_steps = 0; // training steps recorded (0: none yet, current scaling)
    int ready = 0;             // the first `ready` of Fp8Delayed take their scale from the history (0: none yet)
    int delayable = kNumDelayed;  // how many can: kFp8DelayedBefore where the LayerNorm cannot write FP8 (its C)
    float* colsum = nullptr;   // (ceil(B T / 64), 4C): fc's output gradient's column sums per 64-row tile (its bias gradient)
    size_t bytes = 0;          // all of them, scales included
};

struct GPT {
    GPTConfig config;
    GPTSettings settings;
    bool flash = false;  // flash attention taken (settings.flash, where it runs)
    ModelWeights weights;
    OptimizerState opt;
    Activations act;
    Scratch scratch;
    ExpHead exp_head;
    BatchStaging batch;
    WeightStream wgrad;
    Fp8Buffers fp8;
    DataParallel dp;
    DeviceMemory memory;
    Profiler profiler;
};

// Uploads fp32 parameters (from a checkpoint or init) into the storage type, and the master copy.
__global__ void convert_params_kernel(floatX* out, const float* in, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        out[i] = from_float<floatX>(in[i]);
}

// True where flash attention can run: bf16 builds, head sizes with its tensor-core path.
inline bool flash_attention_usable(const GPTConfig& c) {
    return std::is_same<floatX, __nv_bfloat16>::value && flash_attention_supported(c.C / c.NH);
}

// The parameters, their gradients and the optimizer state (this rank's shard of it).
inline void gpt_create_weights(GPT& m, const HostModel& host) {
    ModelWeights& w = m.weights;
    DeviceMemory& mem = m.memory;
    param_sizes(m.config, w.sizes);
    w.count = num_parameters(m.config);
    const size_t np = w.count, padded = m.dp.padded(), shard = m.dp.shard;
    w.params_memory = mem.alloc<floatX>(padded * sizeof(floatX), "parameters");
    w.params = point_parameters(w.params_memory, w.sizes);
    cuda_check(cudaMemset(w.params_memory, 0, padded * sizeof(floatX)));
    if (!m.settings.inference) {
        w.grads_memory = mem.alloc<floatX>(padded * sizeof(floatX), "gradients");
        w.grads = point_parameters(w.grads_memory, w.sizes);
        m.opt.adam_m = mem.alloc<float>(shard * sizeof(float), "AdamW first moments");
        m.opt.adam_v = mem.alloc<float>(shard * sizeof(float), "AdamW second moments");
        cuda_check(cudaMemset(m.opt.adam_m, 0, shard * sizeof(float)));
        cuda_check(cudaMemset(m.opt.adam_v, 0, shard * sizeof(float)));
        cuda_check(cudaMemset(w.grads_memory, 0, padded * sizeof(floatX)));
        const auto specs = param_specs(m.config);
        for (int i = 0; i < NUM_PARAM_TENSORS; i++) m.dp.grads.push_back({w.grads[i], w.sizes[i], specs[i].per_layer});
    }
    float* staging = static_cast<float*>(device_malloc(np * sizeof(float), "parameter upload"));
    cuda_check(cudaMemcpy(staging, host.params.data(), np * sizeof(float), cudaMemcpyHostToDevice));
    convert_params_kernel<<<1024, 256>>>(w.params_memory, staging, np);
    cuda_check_launch();
    if (sizeof(floatX) == sizeof(float) || m.settings.inference) {
        cuda_check(cudaFree(staging));
    } else if (!m.dp.multi()) {  // the master weights are the upload itself
        m.opt.master = staging;
        mem.adopt(staging, np * sizeof(float));
    } else {  // this rank's shard of them
        m.opt.master = mem.alloc<float>(shard * sizeof(float), "fp32 master weights");
        cuda_check(cudaMemset(m.opt.master, 0, shard * sizeof(float)));
        cuda_check(cudaMemcpy(m.opt.master, staging + m.dp.lo, (m.dp.hi - m.dp.lo) * sizeof(float), cudaMemcpyDeviceToDevice));
        cuda_check(cudaFree(staging));
    }
}

// The activations and every scratch buffer for batches of up to B x T.
inline void gpt_create_activations(GPT& m, int B, int T) {
    DeviceMemory& mem = m.memory;
    Activations& act = m.act;
    Scratch& s = m.scratch;
    act.B = B, act.T = T;
    ActivationSet<size_t> act_sizes;
    StatSet<size_t> stat_sizes;
    const bool fp8_inputs = gpt_fp8_wanted(m.settings);  // gpt_create_fp8 follows (or refuses)
    activation_sizes(m.config, B, T, m.flash, m.settings.recompute != 0, fp8_inputs, act_sizes, stat_sizes);
    carve<floatX>(act.acts, act_sizes, mem.alloc<floatX>(carve<floatX>(act.acts, act_sizes, nullptr), "activations"));
    carve<float>(act.stats, stat_sizes, mem.alloc<float>(carve<float>(act.stats, stat_sizes, nullptr), "LayerNorm statistics and losses"));

    const int BT = B * T, NH = m.config.NH, HS = m.config.C / NH;
    s.layernorm = mem.alloc<void>(layernorm_backward_scratch_bytes(BT, m.config.C), "LayerNorm backward scratch");
    const int C = m.config.C, Cp = ln_ld(C);
    s.wgrad = mem.alloc<float>(size_t(4) * C * Cp * sizeof(float), "weight and bias gradient scratch");
    for (floatX* ln : {act.acts.ln1, act.acts.ln2}) {
        fill_ones_column_kernel<<<1024, 256>>>(ln, size_t(fp8_inputs ? 1 : m.config.L) * BT, C, Cp);
        cuda_check_launch();
    }
    // The logits buffer holds nothing live between the LM head's backward and the next forward: the
    // backward borrows it. With the weight stream qkv's gradient takes its tail (the weight stream
    // reads it while the data gradients go on in dbig), where that leaves room for flash attention's dS.
    const size_t logits_bytes = logits_rows(BT) * m.config.Vp * sizeof(floatX);
    const size_t ds_bytes = m.flash ? flash_attention_backward_ds_bytes(B, T, NH, HS) : 0;
    const size_t dqkv_bytes = size_t(BT) * 3 * m.config.C * sizeof(floatX);
    size_t logits_lent = logits_bytes;  // bytes at the start of the logits buffer left for dS
    s.dqkv = act.acts.dbig;
    if (m.settings.overlap) {
        const size_t tail = dqkv_bytes <= logits_bytes ? (logits_bytes - dqkv_bytes) / 256 * 256 : 0;
        if (dqkv_bytes <= logits_bytes && ds_bytes <= tail)
            s.dqkv = reinterpret_cast<floatX*>(reinterpret_cast<char*>(act.acts.logits) + tail), logits_lent = tail;
        else
            s.dqkv = mem.alloc<floatX>(dqkv_bytes, "qkv gradient");
        cuda_check(cudaStreamCreateWithFlags(&m.wgrad.stream, cudaStreamNonBlocking));
        cuda_check(cudaEventCreateWithFlags(&m.wgrad.fork, cudaEventDisableTiming));
        for (cudaEvent_t& e : m.wgrad.done) cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    if (m.flash) {
        s.flash = mem.alloc<void>(flash_attention_backward_scratch_bytes(B, T, NH, HS), "flash attention scratch");
        // dS lets the attention backward skip recomputing the scores for dq (flash_attention.cuh).
        if (ds_bytes <= logits_lent) s.flash_ds = act.acts.logits, s.flash_ds_bytes = logits_lent;
        else s.flash_ds = mem.alloc<void>(ds_bytes, "flash attention dS"), s.flash_ds_bytes = ds_bytes;
    }
    s.step = mem.alloc<StepStats>(sizeof(StepStats), "step loss and gradient norm");
    cuda_check(cudaMemset(s.step, 0, sizeof(StepStats)));
    s.norm_partials = mem.alloc<float>(kNormBlocks * sizeof(float), "gradient norm partials");
    s.mean_loss = mem.alloc<double>(sizeof(double), "mean loss");
    s.encoder_partials = mem.alloc<float>(encoder_backward_partials_bytes(BT, m.config.C), "encoder backward partials");
    BatchStaging& b = m.batch;
    b.inputs = mem.alloc<int>(BT * sizeof(int), "inputs");
    b.targets = mem.alloc<int>(BT * sizeof(int), "targets");
    b.buckets = mem.alloc<int>(encoder_backward_work_ints(BT) * sizeof(int), "encoder buckets");
    for (BatchSlot& slot : b.slots) {
        cuda_check(cudaMallocHost(&slot.host, (2 * size_t(BT) + encoder_backward_work_ints(BT)) * sizeof(int)));
        cuda_check(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
    }
}

// -f8 1: an FP8 function's refusal ends the run (the shapes were checked at gpt_create).
inline void fp8_must(const std::string& why) {
    if (!why.empty()) fail("-f8 1: %s", why.c_str());
}

// fp8_quantize (fp8.cuh) reads bf16. An fp32 build never gets here (gpt_create_fp8 refuses -f8 1);
// this call compiles in both.
template <typename T>
void fp8_cast(Fp8Tensor& t, const T* x, int R, int C, bool natural, bool transposed, int ld, const Fp8CastOptions& o) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value)
        fp8_must(fp8_quantize(t, x, R, C, natural, transposed, 0, ld, o));
    else fail("FP8 casts need a bf16 build");
}
template <typename T> void fp8_cast_batch(Fp8Tensor& t, const T* x, int count, int R, int C) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) fp8_must(fp8_quantize_batch(t, x, count, R, C, true, true));
    else fail("FP8 casts need a bf16 build");
}

// Block l's weight of linear layer k (OC, C), bf16, and its FP8 copies.
inline floatX* linear_weight(const GPT& m, LinearLayer k, int l) {
    const ParameterTensors& p = m.weights.params;
    floatX* const stacked[4] = {p.qkvw, p.attprojw, p.fcw, p.fcprojw};
    return stacked[k] + size_t(l) * kLinearIn[k] * kLinearOut[k] * m.config.C * m.config.C;
}
inline Fp8Tensor fp8_weight(const GPT& m, LinearLayer k, int l) {
    Fp8Tensor w = m.fp8.weight[k];
    w.capacity = size_t(w.R) * w.C;
    w.q += l * w.capacity, w.qt += l * w.capacity, w.meta += 4 * l;  // 16 bytes: 1 / s stays aligned
    return w;
}
// Block l's input of linear layer k, N rows: the shared natural copy, this block's transposed copy and
// scale.
inline Fp8Tensor fp8_input(const GPT& m, LinearLayer k, int l, int N) {
    Fp8Tensor t = m.fp8.input[k];
    t.R = N, t.C = kLinearIn[k] * m.config.C;
    t.qt += l * t.capacity, t.meta += 4 * l;
    return t;
}
// Block l's output gradient of linear layer k: the shared copies, this block's scale.
inline Fp8Tensor fp8_dout(const GPT& m, LinearLayer k, int l) {
    Fp8Tensor t = m.fp8.dout[k];
    t.meta += 4 * l;
    return t;
}

// -f8 1: where a training cast (or LayerNorm into FP8) of delayed tensor `delayed` of block l records
// its amax for the history; null outside training (validation's casts leave the history alone).
inline unsigned* fp8_record(GPT& m, Fp8Delayed delayed, int l, bool training) {
    return training ? m.fp8.seen + delayed * m.config.L + l : nullptr;
}
// -f8 1, a delayed tensor's cast: scaled by the history's amax, which fp8_history_kernel left in the
// slot, or, before the tensor has a history, by the cast's own pass.
inline Fp8Amax fp8_scaling(const GPT& m, Fp8Delayed delayed) { return delayed < m.fp8.ready ? Fp8Amax::given : Fp8Amax::compute; }

// -f8 1 with ln1's and ln2's scales delayed: the LayerNorms write qkv's and fc's FP8 inputs themselves
// (fp8_layernorm_forward) and the bf16 ln1 and ln2 are not written. Before (a run's first step), or
// where the LayerNorm cannot (Fp8Buffers::delayable): the LayerNorm writes bf16 and its current amax,
// and the cast reads it.
inline bool fp8_layernorm_direct(const GPT& m) { return m.fp8.on && m.fp8.ready > kDelayedLn2; }

// -f8 1: the amax slot of block l's input of layer k, zeroed, for the kernel that writes that input
// (LayerNorm 1 and 2 before their scales are delayed) to fill as it writes, so that the cast need not
// read the input twice (linear_forward takes it as given). Null without FP8: the kernels as the bf16
// path runs them.
inline unsigned* fp8_input_amax(GPT& m, LinearLayer k, int l) {
    if (!m.fp8.on) return nullptr;
    Fp8Tensor t = fp8_input(m, k, l, 0);
    return fp8_amax_slot(t);
}
// -f8 1: the amax slot of block l's output gradient of layer k, zeroed, for the kernel that writes it
// (the LayerNorm backward, for dresidual) to fill, so that its cast need not read it twice
// (linear_backward with Fp8Amax::given). Null without FP8.
inline unsigned* fp8_dout_amax(GPT& m, LinearLayer k, int l) {
    if (!m.fp8.on) return nullptr;
    Fp8Tensor t = fp8_dout(m, k, l);
    return fp8_amax_slot(t);
}

// The delayed scales' metas: one array of L metas (4 floats apart) per delayed tensor, and each one's
// format.
struct Fp8DelayedMetas {
    float* meta[kNumDelayed];
    float largest[kNumDelayed];
    int emax[kNumDelayed];
};
// Thread i, delayed tensor i / L of block i % L. push: the step's amax (seen, non-finite counted as 0:
// a step that overflowed does not poison the scales after it) goes into history column `column`, seen
// is zeroed, and a cast of the first `counted` tensors (those the step scaled by the history) whose
// amax outgrew the scale it was cast with adds one to *saturated. Then the slot the casts scale by
// (meta[2]) = twice the history's largest amax (Fp8Buffers).
__global__ void fp8_history_kernel(float* history, unsigned* seen, int* saturated, Fp8DelayedMetas metas, int L, int column, bool push,
                                   int counted) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= kNumDelayed * L) return;
    float* meta = metas.meta[i / L] + 4 * (i % L);
    float* h = history + size_t(i) * kFp8History;
    if (push) {
        const float amax = __uint_as_float(seen[i]);
        const float v = isfinite(amax) ? amax : 0.0f;
        const int d = i / L;
        if (d < counted && v * fp8_scale(meta[2], metas.emax[d]) > metas.largest[d]) atomicAdd(saturated, 1);
        h[column] = v;
        seen[i] = 0;
    }
    float m = 0.0f;
    for (int j = 0; j < kFp8History; j++) m = fmaxf(m, h[j]);
    meta[2] = fminf(2.0f * m, 3.402823466e38f);  // finite: fp8_scale of an infinite amax is NaN
}
inline void fp8_history_launch(GPT& m, bool push) {
    Fp8Buffers& f = m.fp8;
    const int L = m.config.L;
    const Fp8Tensor* tensors[kNumDelayed] = {};  // in Fp8Delayed's order
    for (int k = 0; k < 4; k++) {
        tensors[kInputDelayed[k]] = &f.input[k];
        if (kDoutDelayed[k] != kNotDelayed) tensors[kDoutDelayed[k]] = &f.dout[k];
    }
    Fp8DelayedMetas metas;
    for (int d = 0; d < kNumDelayed; d++)
        metas.meta[d] = tensors[d]->meta, metas.largest[d] = float(tensors[d]->fmt->max), metas.emax[d] = tensors[d]->fmt->emax;
    const int column = int(f.history_steps % kFp8History);
    const int counted = push ? f.ready : 0;  // a run's first step scaled by its own amaxes
    fp8_history_kernel<<<(kNumDelayed * L + 127) / 128, 128>>>(f.history, f.seen, f.saturated, metas, L, column, push, counted);
    cuda_check_launch();
    f.delayed_casts += int64_t(counted) * L;
    if (push) f.history_steps++, f.ready = f.delayable;
}
// -f8 1, at the end of a step's backward (after the ranks' seen are max-reduced): the step's amaxes
// into the history, and the delayed scales from it.
inline void gpt_fp8_history_push(GPT& m) {
    if (m.fp8.on) fp8_history_launch(m, true);
}
// The history a checkpoint holds (empty without -f8 1), and its count of steps.
inline std::vector<float> gpt_fp8_history(GPT& m, int64_t* steps) {
    *steps = m.fp8.history_steps;
    if (!m.fp8.on) return {};
    std::vector<float> h(size_t(kNumDelayed) * m.config.L * kFp8History);
    cuda_check(cudaMemcpy(h.data(), m.fp8.history, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}
// A resumed run's history (a checkpoint's): the delayed scales as the run that wrote it had them.
// Empty (a file from a run without -f8 1, or from before delayed scaling): the first step scales by
// the current amax, as a new run's does. A history of the first kFp8DelayedBefore tensors only (a file
// from before ln1 and ln2 were delayed): those resume from it, ln1 and ln2 take their current amax
// for one step, as a new run's first step does.
inline void gpt_set_fp8_history(GPT& m, const std::vector<float>& h, int64_t steps) {
    if (!m.fp8.on || h.empty()) return;
    const size_t per_tensor = size_t(m.config.L) * kFp8History;
    if (h.size() != kNumDelayed * per_tensor && h.size() != kFp8DelayedBefore * per_tensor)
        fail("the checkpoint's FP8 amax history holds %zu values, this model's %zu", h.size(), kNumDelayed * per_tensor);
    cuda_check(cudaMemset(m.fp8.history, 0, kNumDelayed * per_tensor * sizeof(float)));
    cuda_check(cudaMemcpy(m.fp8.history, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    m.fp8.history_steps = steps;
    m.fp8.ready = steps > 0 ? std::min(int(h.size() / per_tensor), m.fp8.delayable) : 0;
    fp8_history_launch(m, false);
}
// How many delayed casts saturated (see Fp8Buffers), of how many (synchronizes).
inline int gpt_fp8_saturated(const GPT& m) {
    int n = 0;
    if (m.fp8.on) cuda_check(cudaMemcpy(&n, m.fp8.saturated, sizeof(int), cudaMemcpyDeviceToHost));
    return n;
}

// The weights' FP8 copies, made whenever the weights change (gpt_create, gpt_update) and read by
// every micro-batch of the step: each matrix with its own scale, both e4m3 copies (natural for the
// forward, transposed for dinp). One memset of the 4L amax slots (the weights' metas are one array),
// then per layer kind one amax and one cast launch over its L matrices: 9 launches, not 12 L.
inline void gpt_cast_weights_fp8(GPT& m) {
    if (!m.fp8.on) return;
    m.profiler.mark("opt.fp8cast");
    const int L = m.config.L;
    fp8_zero_amax_slots(m.fp8.weight[kQkv].meta, 4 * L);
    for (int k = 0; k < 4; k++) {
        Fp8Tensor& w = m.fp8.weight[k];
        fp8_cast_batch(w, linear_weight(m, LinearLayer(k), 0), L, w.R, w.C);
    }
}

// -f8 1: the FP8 buffers (Fp8Buffers) for batches of up to B x T, and the weights' first copies.
// Refused in one line where cuBLASLt's FP8 GEMMs cannot run: an fp32 build, a GPU below compute
// capability 8.9 (here); a C (so 3C, 4C) or a T (so every batch's B T rows) not a multiple of 16
// (open_data and parse_options, before the GPU is touched).
inline void gpt_create_fp8(GPT& m, int B, int T) {
    if (!std::is_same<floatX, __nv_bfloat16>::value) fail("-f8 1: FP8 linear layers need the bf16 build (train_gpt_bf16)");
    int device = 0;
    cudaDeviceProp prop;
    cuda_check(cudaGetDevice(&device));
    cuda_check(cudaGetDeviceProperties(&prop, device));
    if (prop.major * 10 + prop.minor < 89)
        fail("-f8 1: FP8 GEMMs need a GPU of compute capability 8.9 or newer; %s is %d.%d", prop.name, prop.major, prop.minor);
    const int L = m.config.L, C = m.config.C;
    if (C % 16 || T % 16) fail("-f8 1: C = %d and T = %d must be multiples of 16", C, T);  // open_data and the options refuse them first
    Fp8Buffers& f = m.fp8;
    DeviceMemory& mem = m.memory;
    const size_t before = mem.bytes, BT = size_t(B) * T;
    // Scales, 4 floats (16 bytes) a tensor: the 4L weights, the 4L layer inputs, the 4L douts.
    float* meta = mem.alloc<float>(size_t(48 * L) * sizeof(float), "FP8 scales");
    uint8_t* natural_input = mem.alloc<uint8_t>(BT * 4 * C, "FP8 layer input");
    for (int k = 0; k < 4; k++) {
        Fp8Tensor& w = f.weight[k];
        w.fmt = &kE4M3, w.R = kLinearOut[k] * C, w.C = kLinearIn[k] * C;
        w.capacity = size_t(L) * w.R * w.C;
        w.q = mem.alloc<uint8_t>(2 * w.capacity, "FP8 weights"), w.qt = w.q + w.capacity;
        w.meta = meta + 4 * L * k;
        Fp8Tensor& in = f.input[k];
        in.fmt = &kE4M3, in.capacity = BT * kLinearIn[k] * C;  // one block's
        in.q = natural_input, in.qt = mem.alloc<uint8_t>(L * in.capacity, "FP8 layer inputs, transposed");
        in.meta = meta + 16 * L + 4 * L * k;
        Fp8Tensor& d = f.dout[k];
        d.fmt = &kE5M2, d.capacity = BT * kLinearOut[k] * C;
        d.q = mem.alloc<uint8_t>(2 * d.capacity, "FP8 output gradients"), d.qt = d.q + d.capacity;
        d.meta = meta + 32 * L + 4 * L * k;
    }
    f.seen = mem.alloc<unsigned>(size_t(kNumDelayed) * L * sizeof(unsigned), "FP8 amax seen");
    f.history = mem.alloc<float>(size_t(kNumDelayed) * L * kFp8History * sizeof(float), "FP8 amax history");
    f.saturated = mem.alloc<int>(sizeof(int), "FP8 saturation count");
    f.colsum = mem.alloc<float>(size_t(fp8_column_sum_tiles(int(BT))) * 4 * C * sizeof(float), "FP8 bias gradient partials");
    cuda_check(cudaMemset(f.seen, 0, size_t(kNumDelayed) * L * sizeof(unsigned)));
    cuda_check(cudaMemset(f.history, 0, size_t(kNumDelayed) * L * kFp8History * sizeof(float)));
    cuda_check(cudaMemset(f.saturated, 0, sizeof(int)));
    f.history_steps = 0, f.ready = 0;
    // ln1 and ln2 straight into FP8 with delayed scales from the second step; where the LayerNorm cannot
    // (C past its tile, fp8_layernorm_refusal), they keep the first step's way: current scaling.
    f.delayable = fp8_layernorm_refusal(16, C).empty() ? kNumDelayed : kFp8DelayedBefore;
    f.bytes = mem.bytes - before;
    f.on = true;
    // No GELU fusion in the GEMMs in FP8: the fc GEMM writes fch, fcproj's input cast applies GELU to it
    // (linear_forward's fp8_gelu), and fc's output gradient's cast applies GELU's backward to fcproj's
    // dinp (linear_backward_fp8's gelu_input), as -ge 0 orders them.
    m.settings.gelu_fusion = 0;
    gpt_cast_weights_fp8(m);
}

// A model for batches of up to B x T. `dist`: the ranks it trains with (null: one GPU).
inline void gpt_create(GPT& m, const HostModel& host, int B, int T, const GPTSettings& settings = GPTSettings(),
                       Dist* dist = nullptr) {
    m.config = host.config;
    m.settings = settings;
    m.flash = settings.flash && flash_attention_usable(m.config);
    dp_create(m.dp, dist, num_parameters(m.config), m.config.L);
    gpt_create_weights(m, host);
    gpt_create_activations(m, B, T);
    blas_init(std::max<size_t>(size_t(B) * T, 1));
    if (gpt_fp8_wanted(settings)) gpt_create_fp8(m, B, T);  // FP8 on, or the run refused
    cuda_check(cudaDeviceSynchronize());
}

// Where the exp head (lm_head.cuh) runs: bf16 builds on Hopper, C and Vp multiples of 8.
inline bool gpt_exp_head_usable(const GPT& m) {
    return std::is_same<floatX, __nv_bfloat16>::value && lm_head_exp_usable(m.config.C, m.config.Vp);
}

// Takes the exp head where it runs. Returns whether the model now takes it; its scratch is sized for
// gpt_create's B and T.
inline bool gpt_use_exp_head(GPT& m) {
    if (!gpt_exp_head_usable(m)) return false;
    ExpHead& h = m.exp_head;
    if (!h.shift) {
        const size_t rows = logits_rows(size_t(m.act.B) * m.act.T);
        h.shift = m.memory.alloc<float>(rows * sizeof(float), "LM head target logits");
        h.sums = m.memory.alloc<float>(rows * lm_head_tiles(m.config.Vp) * sizeof(float), "LM head row sums");
        h.scale = m.memory.alloc<float>(rows * sizeof(float), "LM head row scales");
        h.x = m.memory.alloc<floatX>(rows * m.config.C * sizeof(floatX), "LM head scaled input");
    }
    h.on = true;
    return true;
}

// Back to the logits and the classifier for good, mid-run: the exp head's scratch is freed.
inline void gpt_drop_exp_head(GPT& m) {
    ExpHead& h = m.exp_head;
    for (void* p : {(void*)h.shift, (void*)h.sums, (void*)h.scale, (void*)h.x}) m.memory.release(p);
    h = ExpHead();
}

inline void gpt_free(GPT& m) {
    m.memory.release_all();
    for (BatchSlot& slot : m.batch.slots) {
        if (slot.host) cuda_check(cudaFreeHost(slot.host));
        if (slot.copied) cuda_check(cudaEventDestroy(slot.copied));
    }
    blas_destroy();  // before the weight stream: one of its cuBLAS handles is bound to it
    if (m.wgrad.stream) cuda_check(cudaStreamDestroy(m.wgrad.stream));
    if (m.wgrad.fork) cuda_check(cudaEventDestroy(m.wgrad.fork));
    for (cudaEvent_t e : m.wgrad.done)
        if (e) cuda_check(cudaEventDestroy(e));
    dp_destroy(m.dp);
    m.profiler.destroy();
    m = GPT();
}

// A batch goes to the device in two halves. gpt_stage_batch does the host's work: checks the shape,
// groups the positions by token for the encoder backward, and copies inputs, targets (optional) and
// that work into a pinned slot (see kBatchSlots); it returns the slot, and the caller may overwrite
// its arrays at once. The training loop stages the next step's batch while the GPU runs this one, so
// the GPU does not idle on it. gpt_upload_batch enqueues the slot's copies: the device buffers are
// rewritten in stream order, after the previous batch's kernels. Stage, then upload, in order, with at
// most kBatchSlots - 1 other batches set in between (they would take the staged slot).
inline int gpt_stage_batch(GPT& m, const int* inputs, const int* targets, int B, int T) {
    if (B < 1 || T < 1 || B * T > m.act.B * m.act.T || T > m.config.maxT) fail("batch %dx%d does not fit the model buffers", B, T);
    const int BT = B * T;
    const size_t capacity = size_t(m.act.B) * m.act.T;
    BatchStaging& b = m.batch;
    const int index = b.next_slot;
    BatchSlot& slot = b.slots[index];
    b.next_slot = (b.next_slot + 1) % kBatchSlots;
    cuda_check(cudaEventSynchronize(slot.copied));  // its last copies have run: free to overwrite
    slot.buckets.build(inputs, BT, m.config.V);
    const std::vector<int>& work = slot.buckets.packed;
    if (work.size() > encoder_backward_work_ints(int(capacity))) fail("encoder backward work (%zu ints) overflows its buffer", work.size());
    slot.tokens = BT, slot.has_targets = targets != nullptr;
    memcpy(slot.host, inputs, BT * sizeof(int));
    if (targets) memcpy(slot.host + capacity, targets, BT * sizeof(int));
    memcpy(slot.host + 2 * capacity, work.data(), work.size() * sizeof(int));
    return index;
}

inline void gpt_upload_batch(GPT& m, int index) {
    BatchStaging& b = m.batch;
    BatchSlot& slot = b.slots[index];
    const size_t capacity = size_t(m.act.B) * m.act.T;
    cuda_check(cudaMemcpyAsync(b.inputs, slot.host, slot.tokens * sizeof(int), cudaMemcpyHostToDevice));
    if (slot.has_targets)
        cuda_check(cudaMemcpyAsync(b.targets, slot.host + capacity, slot.tokens * sizeof(int), cudaMemcpyHostToDevice));
    cuda_check(cudaMemcpyAsync(b.buckets, slot.host + 2 * capacity, slot.buckets.packed.size() * sizeof(int),
                               cudaMemcpyHostToDevice));
    cuda_check(cudaEventRecord(slot.copied));
    b.slot = index;
}

inline void gpt_set_batch(GPT& m, const int* inputs, const int* targets, int B, int T) {
    gpt_upload_batch(m, gpt_stage_batch(m, inputs, targets, B, T));
}

// ---------------------------------------------------------------------------------------------
// Flash attention and the exp head are bf16 kernels. An fp32 build never takes them (m.flash and the
// exp head stay off: flash_attention_usable, gpt_exp_head_usable); these calls compile in both.

template <typename T> void flash_forward(T* out, float* lse, const T* qkv, int B, int T_, int NH, int HS) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) flash_attention_forward(out, lse, qkv, B, T_, NH, HS);
    else fail("flash attention needs a bf16 build");
}
template <typename T> void flash_backward(T* dqkv, void* scratch, const T* dout, const T* out, const float* lse, const T* qkv,
                                          int B, int T_, int NH, int HS, void* ds, size_t ds_bytes) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value)
        flash_attention_backward(dqkv, scratch, dout, out, lse, qkv, B, T_, NH, HS,
                                 FlashAttentionBackwardOptions().with_ds_scratch(ds, ds_bytes));
    else fail("flash attention needs a bf16 build");
}

// The LM head over `rows` rows of lnf with the exp head: E, the losses, and with a dloss its
// backward, dx = diag(scale) (E wte) into dln and dwte += E^T diag(scale) lnf (lm_head.cuh).
template <typename T> void exp_head_forward_backward(GPT& m, T* logits, float* losses, T* dln, const T* lnf, const int* targets,
                                                     int rows, float dloss) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        const GPTConfig& c = m.config;
        ExpHead& h = m.exp_head;
        const ParameterTensors& p = m.weights.params;
        lm_head_exp_forward(logits, losses, h.scale, h.shift, h.sums, lnf, p.wte, targets, rows, c.C, c.V, c.Vp, dloss);
        if (dloss == 0.0f) return;
        m.profiler.mark("bwd.matmul");
        lm_head_scale_rows(h.x, lnf, h.scale, rows, c.C);
        matmul_backward(dln, m.weights.grads.wte, (T*)nullptr, logits, h.x, p.wte, rows, c.C, c.Vp);
        lm_head_scale_rows(dln, dln, h.scale, rows, c.C);
    } else {
        fail("the exp LM head needs a bf16 build");
    }
}

// One linear layer's forward, layer k of block l: matmul_forward, or with -f8 1 its FP8 GEMM. Then
// inp's e4m3 copies are cast here from its C values (a LayerNorm output's rows, options.inp_ld
// apart, end in its column of ones), unless the LayerNorm wrote them (block_layernorm): the natural
// one for this GEMM and, where a backward follows (Fp8Buffers::kept_rows), the block's transposed one
// for its weight gradient, in the same pass; the weight's were made when the weights changed. e4m3 x
// e4m3 with fast accumulation into bf16, the bias in the epilogue and the residual as cuBLASLt's C
// (beta 1, out apart), as matmul_forward adds them. No GELU fusion in the GEMMs in FP8 (gpt_create_fp8
// sets -ge 0).
// The scale: qkv's and fc's inputs (ln1, ln2) once delayed come in FP8 from the LayerNorm
// (block_layernorm), and there is no cast here; before that the LayerNorm wrote its amax into the slot
// (fp8_input_amax) and the cast takes it as given, reading inp once. atty's and GELU's output take the
// delayed scale (fp8_scaling). Training casts record the amax of what they cast for the history.
// fp8_gelu (-f8 1 only): inp is GELU's input (fch), and the cast makes the FP8 copies of GELU(inp)
// itself (fp8_quantize's gelu), so GELU's bf16 output is never written.
template <typename T>
void linear_forward(GPT& m, LinearLayer k, int l, T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                    const MatmulForwardOptions<T>& options, bool fp8_gelu = false) {
    if (!m.fp8.on) {
        matmul_forward(out, inp, weight, bias, N, C, OC, options);
        return;
    }
    Fp8Tensor input = fp8_input(m, k, l, N);
    const bool from_layernorm = k == kQkv || k == kFc;
    if (!(from_layernorm && fp8_layernorm_direct(m))) {
        m.profiler.mark("fwd.fp8cast");
        const bool training = m.fp8.kept_rows != 0;
        const Fp8Amax scaling = from_layernorm ? Fp8Amax::given : fp8_scaling(m, kInputDelayed[k]);
        fp8_cast(input, inp, N, C, true, training, options.inp_ld,
                 Fp8CastOptions().with_amax(scaling).with_gelu(fp8_gelu).with_record(fp8_record(m, kInputDelayed[k], l, training)));
    }
    m.profiler.mark("fwd.matmul");
    if constexpr (std::is_same<T, __nv_bfloat16>::value)
        fp8_must(fp8_forward(out, input, fp8_weight(m, k, l), bias, true, 0, options.residual));
}

// LayerNorm 1 or 2 of block l, whose output out (rows Cp apart) is linear layer k's input (qkv's or
// fc's). -f8 1 with their scales delayed (fp8_layernorm_direct): straight into that input's FP8 copies,
// the transposed one where a backward follows, recording the amax in training, and out is not written;
// else layernorm_forward, with -f8 1 also writing the amax of what it writes for the cast.
template <typename T>
void block_layernorm(GPT& m, LinearLayer k, int l, T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N,
                     int C) {
    if (fp8_layernorm_direct(m)) {  // a bf16 build (gpt_create_fp8)
        if constexpr (std::is_same<T, __nv_bfloat16>::value) {
            Fp8Tensor input = fp8_input(m, k, l, N);
            const bool training = m.fp8.kept_rows != 0;
            fp8_must(fp8_layernorm_forward(input, mean, rstd, inp, weight, bias, N, C, training,
                                           fp8_record(m, kInputDelayed[k], l, training)));
        }
        return;
    }
    layernorm_forward(out, mean, rstd, inp, weight, bias, N, C,
                      LayerNormForwardOptions().with_out_ld(ln_ld(C)).with_amax(fp8_input_amax(m, k, l)));
}

// ---------------------------------------------------------------------------------------------
// Forward. With `dloss` != 0 the classifier also turns the logits into dlogits (scaled by dloss, the
// weight of each position's loss in the step's mean loss) and the LM head's backward runs at once:
// a.dln receives the gradient of lnf and g.wte the head's share of its gradient, ready for
// gpt_backward. The head runs over chunks of kLogitsChunkRows rows, so the logits buffer holds one
// chunk (with two chunks g.wte takes two bf16 += where one matmul did one, as with micro-batches).
// With targets = false the logits are left as they are (sampling), which needs B T <= kLogitsChunkRows.

inline void gpt_forward(GPT& m, int B, int T, bool targets, float dloss) {
    const GPTConfig& c = m.config;
    const int L = c.L, C = c.C, NH = c.NH, BT = B * T;
    const ParameterTensors& p = m.weights.params;
    const ActivationTensors& a = m.act.acts;
    const StatTensors& s = m.act.stats;
    const size_t btc = size_t(BT) * C;
    const int Cp = ln_ld(C);
    const size_t btcp = m.fp8.on ? 0 : size_t(BT) * Cp;  // one layer of ln1 / ln2 (-f8 1: they keep one)
    const bool recompute = m.settings.recompute != 0;  // fch_gelu keeps one layer (-f8 1: none)
    const int gelu_fusion = m.settings.gelu_fusion;
    m.fp8.kept_rows = m.fp8.on && targets && dloss != 0.0f ? BT : 0;  // a backward follows

    Profiler& prof = m.profiler;
    prof.mark("fwd.encoder");
    encoder_forward(a.encoded, m.batch.inputs, p.wte, p.wpe, B, T, C);
    prof.mark("fwd.layernorm");
    // -f8 1: LayerNorm 1 and 2 write the next linear layer's FP8 input, or its amax (block_layernorm).
    block_layernorm(m, kQkv, 0, a.ln1, s.ln1_mean, s.ln1_rstd, a.encoded, p.ln1w, p.ln1b, BT, C);
    for (int l = 0; l < L; l++) {
        const floatX* x = l == 0 ? a.encoded : a.residual3 + (l - 1) * btc;  // this layer's input residual
        floatX* ln1 = a.ln1 + l * btcp;
        floatX* qkv = a.qkv + l * 3 * btc;
        floatX* atty = a.atty + l * btc;
        floatX* att = a.att + l * size_t(B) * NH * T * T;
        floatX* residual2 = a.residual2 + l * btc;
        floatX* ln2 = a.ln2 + l * btcp;
        floatX* fch = a.fch + l * 4 * btc;
        floatX* fch_gelu = m.fp8.on ? nullptr : recompute ? a.fch_gelu : a.fch_gelu + l * 4 * btc;  // -r 1: only for the next matmul
        floatX* residual3 = a.residual3 + l * btc;

        prof.mark("fwd.matmul");
        linear_forward(m, kQkv, l, qkv, ln1, p.qkvw + size_t(l) * 3 * C * C, p.qkvb + size_t(l) * 3 * C, BT, C, 3 * C,
                       MatmulForwardOptions<floatX>().with_inp_ld(Cp));
        prof.mark("fwd.attention");
        if (m.flash) flash_forward(atty, s.attn_lse + size_t(l) * NH * BT, qkv, B, T, NH, C / NH);
        else attention_forward(atty, att, a.qkvr, a.yr, qkv, B, T, C, NH);
        // The residual adds ride in the projections' epilogues (residual2 = x + atty attprojw^T + attprojb,
        // matmul.cuh), so each LayerNorm after them reads one tensor, not two.
        prof.mark("fwd.matmul");
        linear_forward(m, kAttproj, l, residual2, atty, p.attprojw + size_t(l) * C * C, p.attprojb + size_t(l) * C, BT, C, C,
                       MatmulForwardOptions<floatX>().with_residual(x));
        prof.mark("fwd.layernorm");
        block_layernorm(m, kFc, l, ln2, s.ln2_mean + l * BT, s.ln2_rstd + l * BT, residual2, p.ln2w + l * C, p.ln2b + l * C, BT, C);
        prof.mark("fwd.matmul");
        if (gelu_fusion >= 1) {  // fch = ln2 fcw^T + fcb as the epilogue's auxiliary output, fch_gelu = gelu(fch)
            matmul_forward(fch_gelu, ln2, p.fcw + size_t(l) * 4 * C * C, p.fcb + size_t(l) * 4 * C, BT, C, 4 * C,
                           MatmulForwardOptions<floatX>().with_pre_gelu(fch).with_inp_ld(Cp));
        } else {
            linear_forward(m, kFc, l, fch, ln2, p.fcw + size_t(l) * 4 * C * C, p.fcb + size_t(l) * 4 * C, BT, C, 4 * C,
                           MatmulForwardOptions<floatX>().with_inp_ld(Cp));
            if (!m.fp8.on) {  // -f8 1: fcproj's cast applies GELU to fch itself
                prof.mark("fwd.gelu");
                gelu_forward(fch_gelu, fch, 4 * btc);
            }
        }
        prof.mark("fwd.matmul");  // residual3 = residual2 + fch_gelu fcprojw^T + fcprojb
        linear_forward(m, kFcproj, l, residual3, m.fp8.on ? fch : fch_gelu, p.fcprojw + size_t(l) * 4 * C * C,
                       p.fcprojb + size_t(l) * C, BT, 4 * C, C, MatmulForwardOptions<floatX>().with_residual(residual2), m.fp8.on);
        prof.mark("fwd.layernorm");  // ln_1 of the next layer, or ln_f
        if (l + 1 < L)
            block_layernorm(m, kQkv, l + 1, a.ln1 + (l + 1) * btcp, s.ln1_mean + (l + 1) * BT, s.ln1_rstd + (l + 1) * BT, residual3,
                            p.ln1w + (l + 1) * C, p.ln1b + (l + 1) * C, BT, C);
        else
            layernorm_forward(a.lnf, s.lnf_mean, s.lnf_rstd, residual3, p.lnfw, p.lnfb, BT, C);
    }
    if (!targets && size_t(BT) > kLogitsChunkRows)
        fail("gpt_forward: logits without targets are kept for at most %zu rows, asked for %d", kLogitsChunkRows, BT);
    for (int r0 = 0; r0 < BT; r0 += (int)kLogitsChunkRows) {
        const int rows = std::min(BT - r0, (int)kLogitsChunkRows);
        prof.mark("fwd.matmul");
        if (m.exp_head.on && targets) {  // no logits: E, the losses, dlogits = diag(scale) E
            exp_head_forward_backward(m, a.logits, s.losses + r0, a.dln + size_t(r0) * C, a.lnf + size_t(r0) * C,
                                      m.batch.targets + r0, rows, dloss);
            continue;
        }
        matmul_forward(a.logits, a.lnf + size_t(r0) * C, p.wte, (const floatX*)nullptr, rows, C, c.Vp);  // tied to wte
        if (!targets) continue;
        prof.mark("fwd.classifier");
        fused_classifier(a.logits, s.losses + r0, m.batch.targets + r0, dloss, rows, c.V, c.Vp);
        if (dloss == 0.0f) continue;
        prof.mark("bwd.matmul");  // the LM head's backward, counted with the backward's matmuls
        matmul_backward(a.dln + size_t(r0) * C, m.weights.grads.wte, (floatX*)nullptr, a.logits, a.lnf + size_t(r0) * C, p.wte,
                        rows, C, c.Vp);
    }
    prof.mark(nullptr);
}

// *sum += the mean of losses[0..BT), rounded to float (the value the step reports per micro-batch).
// One block, a fixed thread count and a fixed tree, in double: the same bits on every run and GPU.
constexpr int kLossThreads = 1024;
__global__ void __launch_bounds__(kLossThreads) loss_mean_kernel(double* sum, const float* losses, int BT) {
    __shared__ double partial[kLossThreads];
    double s = 0.0;
    for (int i = threadIdx.x; i < BT; i += kLossThreads) s += losses[i];
    partial[threadIdx.x] = s;
    __syncthreads();
    for (int stride = kLossThreads / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) *sum += (float)(partial[0] / BT);
}

// Adds the last forward's mean loss to the step's loss sum, on the device: no synchronisation.
inline void gpt_accumulate_loss(GPT& m, int B, int T) {
    m.profiler.mark("fwd.loss");
    loss_mean_kernel<<<1, kLossThreads>>>(&m.scratch.step->loss_sum, m.act.stats.losses, B * T);
    cuda_check_launch();
    m.profiler.mark(nullptr);
}

// Mean of the per-position losses of the last forward (synchronizes: for validation and tests).
inline float gpt_mean_loss(GPT& m, int B, int T) {
    cuda_check(cudaMemsetAsync(m.scratch.mean_loss, 0, sizeof(double)));
    loss_mean_kernel<<<1, kLossThreads>>>(m.scratch.mean_loss, m.act.stats.losses, B * T);
    cuda_check_launch();
    double mean = 0.0;
    cuda_check(cudaMemcpy(&mean, m.scratch.mean_loss, sizeof(double), cudaMemcpyDeviceToHost));
    return (float)mean;
}

// Starts an optimizer step: the gradients and the step's loss sum accumulate from zero.
inline void gpt_zero_grad(GPT& m) {
    cuda_check(cudaMemsetAsync(m.weights.grads_memory, 0, m.weights.count * sizeof(floatX)));
    cuda_check(cudaMemsetAsync(m.scratch.step, 0, sizeof(StepStats)));
}

// The weight stream (-ov 1). Each linear layer's backward is two calls: dinp on the default stream,
// the chain every later kernel waits for, and dweight (+ dbias) on the weight stream, which nothing
// in the backward waits for. They are independent, so the GPU runs them side by side: a weight
// gradient's GEMM fills the SMs that a LayerNorm, the attention backward or the tail of a dinp GEMM
// leaves idle. Every kernel computes what it computes alone (no atomics between them, cuBLAS has a
// workspace per stream), so the gradients are the same bits as with -ov 0 (test_gpt checks it).
//   wgrad_fork:  the weight stream's next work comes after all the default stream has enqueued.
//   wgrad_mark:  a point on the weight stream, after its reads of some buffer;
//   wgrad_wait:  the default stream waits for that point before it rewrites the buffer.
// Without -ov 1 all three do nothing and the weight gradients run in line on the default stream.
enum WgradPoint { kReadMlpDresidual, kReadDbig, kReadAttnDresidual, kReadDqkv };
inline cudaStream_t wgrad_fork(GPT& m) {
    if (!m.wgrad.stream) return 0;
    cuda_check(cudaEventRecord(m.wgrad.fork, 0));
    cuda_check(cudaStreamWaitEvent(m.wgrad.stream, m.wgrad.fork, 0));
    return m.wgrad.stream;
}
inline void wgrad_mark(GPT& m, WgradPoint point) {
    if (m.wgrad.stream) cuda_check(cudaEventRecord(m.wgrad.done[point], m.wgrad.stream));
}
inline void wgrad_wait(GPT& m, WgradPoint point) {
    if (m.wgrad.stream) cuda_check(cudaStreamWaitEvent(0, m.wgrad.done[point], 0));
}

// One linear layer's backward in FP8 (-f8 1; layer k of block l): dout is cast once, on the default
// stream, into both e5m2 copies (layer k's pair, once the weight stream has read the block above's:
// `point`; dout_amax: Fp8Amax::given where the LayerNorm backward wrote dresidual's amax into the
// slot (fp8_dout_amax), else dqkv's and fch's gradient's delayed scale), and dinp =
// dout weight runs there (e5m2 x e4m3, fp32 promotion, bf16 out). Then on the weight stream: dweight +=
// inp^T dout from the transposed e4m3 copy of inp that the forward kept (e4m3 x e5m2, fp32 promotion,
// += into the bf16 gradient), and dbias where one is asked for, as matmul_backward's column sums of
// the bf16 dout (a matrix-vector product: deterministic).
// gelu_input (fc's backward): dout is GELU's output gradient and gelu_input GELU's input (fch); the
// cast makes the copies of dout GELU'(gelu_input), the layer's output gradient, with a delayed scale,
// and sums its columns per 64-row tile, which one small kernel adds into dbias in order (before the
// fork: the layer's all-reduce waits for the default stream): that gradient is never in bf16.
template <typename T>
void linear_backward_fp8(GPT& m, LinearLayer k, int l, T* dinp, T* dweight, T* dbias, const T* dout, int N, int C, int OC,
                         WgradPoint point, Fp8Amax dout_amax, const T* gelu_input) {
    m.profiler.mark("bwd.fp8cast");
    wgrad_wait(m, point);
    Fp8Tensor d = fp8_dout(m, k, l);
    unsigned* record = nullptr;
    if (dout_amax == Fp8Amax::compute && kDoutDelayed[k] != kNotDelayed) {  // dqkv and fch's gradient
        dout_amax = fp8_scaling(m, kDoutDelayed[k]);
        record = fp8_record(m, kDoutDelayed[k], l, true);
    }
    Fp8CastOptions o = Fp8CastOptions().with_amax(dout_amax).with_record(record);
    if constexpr (std::is_same<T, __nv_bfloat16>::value)
        if (gelu_input) o.with_gelu_backward(gelu_input).with_column_sums(dbias ? m.fp8.colsum : nullptr);
    fp8_cast(d, dout, N, OC, true, true, 0, o);
    if (o.colsum) {
        fp8_add_column_sums(dbias, m.fp8.colsum, N, OC);
        dbias = nullptr;  // done
    }
    const cudaStream_t ws = wgrad_fork(m);
    m.profiler.mark("bwd.matmul");
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        fp8_must(fp8_backward_input(dinp, d, fp8_weight(m, k, l), false));
        fp8_must(fp8_backward_weight(dweight, d, fp8_input(m, k, l, N), false, ws));
    }
    if (dbias) matmul_backward<T>(nullptr, nullptr, dbias, dout, nullptr, nullptr, N, C, OC, MatmulBackwardOptions<T>().with_stream(ws));
    wgrad_mark(m, point);
}

// One linear layer's backward (with -f8 1 linear_backward_fp8): dinp on the default stream, then
// dweight (+ dbias; -f8 1's fc's before the fork) on the weight stream, which marks `point` once it
// has read dout and inp. The fork comes first, so the weight gradients wait for dout only, not for
// dinp; dinp is enqueued first, so
// the GPU's block scheduler serves the chain's kernel before the weight stream's (docs/performance.md
// has the measurement).
// inp_ld != 0: inp is a LayerNorm output with its column of ones (rows of inp_ld = ln_ld(C)), and the
// weight and bias gradients come from one GEMM (matmul_backward_weight_bias, via Scratch::wgrad,
// which the weight stream's GEMMs use one after another). 0: inp is (N, C).
// dout_amax and fp8_gelu_input: -f8 1 only, as linear_backward_fp8 takes them (its gelu_input).
template <typename T>
void linear_backward(GPT& m, LinearLayer k, int l, T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int N, int C, int OC, const T* pre_gelu, WgradPoint point, int inp_ld = 0,
                     Fp8Amax dout_amax = Fp8Amax::compute, const T* fp8_gelu_input = nullptr) {
    if (m.fp8.on) {
        linear_backward_fp8(m, k, l, dinp, dweight, dbias, dout, N, C, OC, point, dout_amax, fp8_gelu_input);
        return;
    }
    const cudaStream_t ws = wgrad_fork(m);
    matmul_backward<T>(dinp, nullptr, nullptr, dout, inp, weight, N, C, OC, MatmulBackwardOptions<T>().with_pre_gelu(pre_gelu));
    if (inp_ld) matmul_backward_weight_bias<T>(dweight, dbias, m.scratch.wgrad, dout, inp, inp_ld, N, C, OC, ws);
    else matmul_backward<T>(nullptr, dweight, dbias, dout, inp, weight, N, C, OC, MatmulBackwardOptions<T>().with_stream(ws));
    wgrad_mark(m, point);
}

// Backward of the last forward (which must have had targets and a dloss). Gradients accumulate (+=)
// into the gradient buffer, so several micro-batches add up to one step. Returns with all of it
// enqueued on the default stream (the weight stream joined). With `last_micro_batch` on several GPUs
// the gradients and the step's loss sum are also summed over the ranks, each layer's bucket as soon
// as the layer is done (zero.cuh).
inline void gpt_backward(GPT& m, int B, int T, bool last_micro_batch = false) {
    const GPTConfig& c = m.config;
    const int L = c.L, C = c.C, NH = c.NH, BT = B * T;
    const ParameterTensors& p = m.weights.params;
    const ParameterTensors& g = m.weights.grads;
    const ActivationTensors& a = m.act.acts;
    const StatTensors& s = m.act.stats;
    const Scratch& scratch = m.scratch;
    const size_t btc = size_t(BT) * C;
    const int Cp = ln_ld(C);
    const size_t btcp = m.fp8.on ? 0 : size_t(BT) * Cp;  // one layer of ln1 / ln2 (-f8 1: they keep one)
    const bool recompute = m.settings.recompute != 0 && !m.fp8.on;  // -f8 1 reads GELU(fch)'s FP8 copy
    const int gelu_fusion = m.settings.gelu_fusion;
    const bool reduce = last_micro_batch && m.dp.multi();
    floatX* const none = nullptr;
    if (m.fp8.on && m.fp8.kept_rows != BT)
        fail("gpt_backward: -f8 1 needs the last forward to have had a dloss and the same %d rows (its inputs' FP8 copies: %d rows)",
             BT, m.fp8.kept_rows);
    // -f8 1: the LayerNorm backwards write the amax of dresidual (fcproj's and attproj's dout) into its
    // slot, for the cast to take as given; fc's and qkv's are delayed (Fp8Buffers).
    const Fp8Amax given = Fp8Amax::given;

    Profiler& prof = m.profiler;
    prof.mark("bwd.other");
    cuda_check(cudaMemsetAsync(a.dresidual, 0, btc * sizeof(floatX)));
    // The LM head's backward ran in gpt_forward: a.dln holds the gradient of lnf.
    prof.mark("bwd.layernorm");
    // Each LayerNorm backward also adds its dresidual's column sums into the next linear layer's bias
    // gradient (that layer's dout is this dresidual): fcproj's of the layer below, attproj's of its own.
    layernorm_backward(a.dresidual, g.lnfw, g.lnfb, scratch.layernorm, a.dln, a.residual3 + (L - 1) * btc, p.lnfw, s.lnf_mean,
                       s.lnf_rstd, BT, C,
                       LayerNormBackwardOptions<floatX>().with_next_dbias(g.fcprojb + size_t(L - 1) * C).with_amax(fp8_dout_amax(m, kFcproj, L - 1)));
    for (int l = L - 1; l >= 0; l--) {
        const floatX* x = l == 0 ? a.encoded : a.residual3 + (l - 1) * btc;
        const floatX* ln1 = a.ln1 + l * btcp;
        const floatX* qkv = a.qkv + l * 3 * btc;
        const floatX* atty = a.atty + l * btc;
        const floatX* att = a.att + l * size_t(B) * NH * T * T;
        const floatX* residual2 = a.residual2 + l * btc;
        const floatX* ln2 = a.ln2 + l * btcp;
        const floatX* fch = a.fch + l * 4 * btc;
        floatX* fch_gelu = m.fp8.on ? nullptr : recompute ? a.fch_gelu : a.fch_gelu + l * 4 * btc;  // -f8 1: none
        const size_t fc_w = size_t(l) * 4 * C * C;

        // MLP. dresidual is the gradient of residual3 = residual2 + fcproj, so also of fcproj.
        if (recompute) {  // -r 1: fcprojw's gradient needs this layer's GELU output, recomputed from fch
            // (rewriting fch_gelu is safe: the layer above's LayerNorm 2 waited for its last reader)
            prof.mark("bwd.gelu");
            gelu_forward(fch_gelu, fch, 4 * btc);
        }
        prof.mark("bwd.matmul");
        // the layer above's fc weight gradients read dbig (-f8 1: its FP8 copies, which fc's cast waits for)
        if (!m.fp8.on) wgrad_wait(m, kReadDbig);
        // -ge 2: the epilogue multiplies by gelu'(fch), so dbig leaves as the gradient of fch.
        // (-f8 1 reads the GELU output's FP8 copy that the forward kept, not fch_gelu, which it has not)
        linear_backward(m, kFcproj, l, a.dbig, g.fcprojw + fc_w, none, a.dresidual, fch_gelu, p.fcprojw + fc_w, BT, 4 * C, C,
                        gelu_fusion >= 2 ? fch : none, kReadMlpDresidual, 0, given);
        if (gelu_fusion < 2 && !m.fp8.on) {  // -f8 1: in fc's output gradient's cast, from fch
            prof.mark("bwd.gelu");
            gelu_backward_inplace(a.dbig, fch, 4 * btc);
        }
        prof.mark("bwd.matmul");
        linear_backward(m, kFc, l, a.dln, g.fcw + fc_w, g.fcb + size_t(l) * 4 * C, a.dbig, ln2, p.fcw + fc_w, BT, C, 4 * C, none,
                        kReadDbig, Cp, Fp8Amax::compute, m.fp8.on ? fch : none);
        // += into dresidual: it becomes the gradient of residual2.
        prof.mark("bwd.layernorm");
        wgrad_wait(m, kReadMlpDresidual);
        layernorm_backward(a.dresidual, g.ln2w + l * C, g.ln2b + l * C, scratch.layernorm, a.dln, residual2, p.ln2w + l * C,
                           s.ln2_mean + l * BT, s.ln2_rstd + l * BT, BT, C,
                           LayerNormBackwardOptions<floatX>().with_next_dbias(g.attprojb + size_t(l) * C).with_amax(fp8_dout_amax(m, kAttproj, l)));
        // Attention. dln now holds the gradient of atty, scratch.dqkv that of qkv.
        prof.mark("bwd.matmul");
        linear_backward(m, kAttproj, l, a.dln, g.attprojw + size_t(l) * C * C, none, a.dresidual, atty,
                        p.attprojw + size_t(l) * C * C, BT, C, C, none, kReadAttnDresidual, 0, given);
        prof.mark("bwd.attention");
        wgrad_wait(m, kReadDqkv);  // the layer above's qkv weight gradients read scratch.dqkv
        if (m.flash)
            flash_backward(scratch.dqkv, scratch.flash, a.dln, atty, s.attn_lse + size_t(l) * NH * BT, qkv, B, T, NH, C / NH,
                           scratch.flash_ds, scratch.flash_ds_bytes);
        else
            attention_backward(scratch.dqkv, a.qkvr, a.dqkvr, a.yr, a.datt, a.dln, att, qkv, B, T, C, NH);
        prof.mark("bwd.matmul");
        linear_backward(m, kQkv, l, a.dln, g.qkvw + size_t(l) * 3 * C * C, g.qkvb + size_t(l) * 3 * C, scratch.dqkv, ln1,
                        p.qkvw + size_t(l) * 3 * C * C, BT, C, 3 * C, none, kReadDqkv, Cp);
        // += into dresidual: it becomes the gradient of this layer's input x.
        prof.mark("bwd.layernorm");
        wgrad_wait(m, kReadAttnDresidual);
        layernorm_backward(a.dresidual, g.ln1w + l * C, g.ln1b + l * C, scratch.layernorm, a.dln, x, p.ln1w + l * C,
                           s.ln1_mean + l * BT, s.ln1_rstd + l * BT, BT, C,
                           LayerNormBackwardOptions<floatX>()
                               .with_next_dbias(l > 0 ? g.fcprojb + size_t(l - 1) * C : none)
                               .with_amax(l > 0 ? fp8_dout_amax(m, kFcproj, l - 1) : nullptr));
        // layer l's gradients are final (fcprojb's came from the layer above)
        if (reduce) dp_reduce_layer<floatX>(m.dp, l, m.wgrad.stream);
    }
    prof.mark("bwd.encoder");
    encoder_backward(g.wte, g.wpe, scratch.encoder_partials, a.dresidual, m.batch.buckets, m.batch.slots[m.batch.slot].buckets,
                     B, T, C);
    prof.mark("bwd.join");  // the weight stream's last work (qkv's of layer 0), and so all of it
    wgrad_wait(m, kReadDqkv);
    if (reduce) {
        prof.mark("bwd.allreduce");  // what the all-reduces add to the step, beyond the overlap
        dp_reduce_rest<floatX>(m.dp, &scratch.step->loss_sum, m.wgrad.stream, m.fp8.seen, m.fp8.on ? kNumDelayed * L : 0);
    }
    if (last_micro_batch) gpt_fp8_history_push(m);
    prof.mark(nullptr);
}

// Squared global gradient norm into the step's stats, for gpt_update (no synchronisation).
inline void gpt_grad_norm_squared(GPT& m) {
    m.profiler.mark("opt.grad_norm");
    global_norm_squared(&m.scratch.step->norm_squared, m.scratch.norm_partials, m.weights.grads_memory, m.weights.count);
}

struct AdamWConfig {
    float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
};

// One AdamW step (t counts from 1) after gpt_grad_norm_squared: gradients clipped to global norm
// grad_clip (<= 0: off); no update at all when the step's loss sum or gradient norm is non-finite.
// The decision is the device's (adamw.cuh); read it afterwards with gpt_step_stats and step_finite.
// Each rank updates its shard (its AdamW state and master weights), then the updated parameters are
// all-gathered: ZeRO stage 1 (zero.cuh). An element's update is the same arithmetic whichever rank
// does it. Weight decay is the parameter list's.
inline void gpt_update(GPT& m, const AdamWConfig& h, float lr, int t, float grad_clip) {
    const DataParallel& dp = m.dp;
    const auto specs = param_specs(m.config);
    ParamTable table{};  // tensor ends relative to the shard's first element
    table.count = NUM_PARAM_TENSORS;
    size_t end = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        table.end[i] = std::max(end += m.weights.sizes[i], dp.lo) - dp.lo;
        if (specs[i].decay) table.decay_mask |= 1u << i;
    }
    AdamWHyper hyper{lr, h.beta1, h.beta2, h.eps, h.weight_decay,
                     1.0f - std::pow(h.beta1, (float)t), 1.0f - std::pow(h.beta2, (float)t), grad_clip, m.scratch.step};
    m.profiler.mark("opt.adamw");
    if (dp.hi > dp.lo)  // (a tiny model on many GPUs can leave the last ranks nothing)
        adamw_update(m.weights.params_memory + dp.lo, m.opt.master, m.weights.grads_memory + dp.lo, m.opt.adam_m, m.opt.adam_v,
                     dp.hi - dp.lo, table, hyper);
    if (dp.multi()) {
        m.profiler.mark("opt.allgather");
        dp_all_gather_params(m.dp, m.weights.params_memory);
    }
    gpt_cast_weights_fp8(m);  // -f8 1: the weights' FP8 copies follow them
    m.profiler.mark(nullptr);
}

// The step's loss sum and squared gradient norm (synchronizes: call after the step's kernels).
inline StepStats gpt_step_stats(GPT& m) {
    StepStats s;
    cuda_check(cudaMemcpy(&s, m.scratch.step, sizeof(StepStats), cudaMemcpyDeviceToHost));
    return s;
}

// fp32 copy of the parameters (the master weights in bf16 builds), for checkpoints; on several GPUs
// on rank 0 only (empty elsewhere).
inline std::vector<float> gpt_params_fp32(GPT& m) {
    if (m.opt.master) return dp_gather_shards(m.dp, m.opt.master, m.weights.count);
    std::vector<float> out(m.weights.count);  // fp32 builds: the parameters themselves, whole on every rank
    cuda_check(cudaMemcpy(out.data(), m.weights.params_memory, m.weights.count * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
}

// Sets this rank's shard of the AdamW state from whole host arrays (a resumed checkpoint).
inline void gpt_set_optimizer_state(GPT& m, const std::vector<float>& adam_m, const std::vector<float>& adam_v) {
    const size_t count = (m.dp.hi - m.dp.lo) * sizeof(float);
    cuda_check(cudaMemcpy(m.opt.adam_m, adam_m.data() + m.dp.lo, count, cudaMemcpyHostToDevice));
    cuda_check(cudaMemcpy(m.opt.adam_v, adam_v.data() + m.dp.lo, count, cudaMemcpyHostToDevice));
}

// Writes a checkpoint of the model's current state (checkpoint.h; rank 0 writes, every rank takes
// part in the gather). On a failed write the run ends with one line: the earlier checkpoints are intact.
inline void gpt_save_checkpoint(GPT& m, const std::string& dir, const TrainState& st) {
    const std::vector<float> params = gpt_params_fp32(m);
    const std::vector<float> am = dp_gather_shards(m.dp, m.opt.adam_m, m.weights.count);
    const std::vector<float> av = dp_gather_shards(m.dp, m.opt.adam_v, m.weights.count);
    if (m.dp.rank() != 0) return;
    std::unique_ptr<DistSolo> solo(m.dp.dist ? new DistSolo(*m.dp.dist) : nullptr);  // the others wait while rank 0 writes
    std::string error;
    if (!write_checkpoint(dir, m.config, st, params, am, av, &error)) fail("writing checkpoint for step %d: %s", st.step, error.c_str());
    printf("checkpoint: wrote %s and %s\n", checkpoint_path(dir, "model", st.step).c_str(), checkpoint_path(dir, "state", st.step).c_str());
}

// ---------------------------------------------------------------------------------------------
// Multiple-choice evaluation (evaluation.h): every completion of an example is a row, context +
// completion, and the per-position losses of the forward score it. Rows are cut to the longest of
// their batch, rounded up to 64 positions (causal attention makes a position independent of the
// padding after it), and a batch holds as many whole examples as the buffers' tokens take. The
// logits path runs (not the exp head), so every loss is there and the fp32 build matches PyTorch.

inline int eval_row_length(const EvalExample& ex, int window) {
    return std::min(window, (ex.longest_row() + 63) / 64 * 64);
}

// Why the model's buffers (B x T tokens, rows of at most T) cannot take `examples`, or "".
inline std::string eval_fit_error(const std::vector<EvalExample>& examples, int B, int T) {
    for (const EvalExample& ex : examples) {
        if (ex.longest_row() > T)
            return "example " + std::to_string(ex.index) + " has a row of " + std::to_string(ex.longest_row()) +
                   " tokens, more than T = " + std::to_string(T);
        if (size_t(ex.completions.size()) * eval_row_length(ex, T) > size_t(B) * T)
            return "example " + std::to_string(ex.index) + " needs " + std::to_string(ex.completions.size()) + " rows of " +
                   std::to_string(eval_row_length(ex, T)) + " tokens, more than B*T = " + std::to_string(B * T);
    }
    return "";
}

// Scores examples rank, rank + world, ... (the caller sums the ranks' scores). `sums` (optional)
// receives each completion's summed loss, examples in order, for comparisons; `dist` (optional) hears
// of progress after each batch (its watchdog). The rows' many lengths are not worth tuning passes:
// the plans made here keep the heuristic's choice (the same bits).
inline EvalScore gpt_evaluate(GPT& m, const std::vector<EvalExample>& examples, int rank, int world,
                              std::vector<std::vector<double>>* sums = nullptr, Dist* dist = nullptr) {
    const int window = std::min(m.act.T, m.config.maxT);
    const size_t capacity = size_t(m.act.B) * m.act.T;
    constexpr int kMaxRows = 65535;  // a kernel's grid.z (flash attention's batch dimension)
    const bool exp_head = m.exp_head.on, tune = blas().tune;
    m.exp_head.on = false;
    blas().tune = false;
    EvalScore score;
    std::vector<int> inputs, targets, batch;
    std::vector<float> losses;
    for (size_t first = rank; first < examples.size();) {
        batch.clear();
        int T = 0, rows = 0;
        for (size_t i = first; i < examples.size(); i += world) {
            const int K = (int)examples[i].completions.size(), t = std::max(T, eval_row_length(examples[i], window));
            if (!batch.empty() && (size_t(rows + K) * t > capacity || rows + K > kMaxRows)) break;
            batch.push_back(int(i)), rows += K, T = t;
        }
        first = size_t(batch.back()) + world;
        inputs.assign(size_t(rows) * T, 0), targets.assign(size_t(rows) * T, 0);
        int row = 0;
        for (int i : batch)
            for (size_t k = 0; k < examples[i].completions.size(); k++, row++)
                eval_row(examples[i], int(k), T, inputs.data() + size_t(row) * T, targets.data() + size_t(row) * T);
        gpt_set_batch(m, inputs.data(), targets.data(), rows, T);
        gpt_forward(m, rows, T, true, 0.0f);
        losses.resize(size_t(rows) * T);
        cuda_check(cudaMemcpy(losses.data(), m.act.stats.losses, losses.size() * sizeof(float), cudaMemcpyDeviceToHost));
        row = 0;
        for (int i : batch) {
            std::vector<const float*> rows_of(examples[i].completions.size());
            for (size_t k = 0; k < rows_of.size(); k++) rows_of[k] = losses.data() + size_t(row++) * T;
            eval_score(examples[i], rows_of, score, sums ? &(*sums)[i] : nullptr);
        }
        if (dist) dist_progress(*dist);
    }
    m.exp_head.on = exp_head;
    blas().tune = tune;
    return score;
}

// ---------------------------------------------------------------------------------------------
// Generation: new tokens one at a time after a context, each drawn from the logits of the last
// position on the host, in double, with its own RNG (so sampling never changes training).
// gpt_reference.py generate does the same, step for step: temperature 0 takes the argmax (the lowest
// id on ties); else the probabilities are softmax(logits / temperature) over the top-k ids (every id
// with k = 0; ids tied with the k-th are kept), and a uniform draw walks the ids in increasing
// order. The model sees at most the last min(maxT, the buffers' T) tokens (a sliding window). Each
// forward runs over the context padded to a multiple of kGenerateBucket positions: causal attention
// makes a position independent of the ones after it, and a few lengths keep the matmul plans few.

struct SampleOptions {
    float temperature = 1.0f;  // 0: greedy
    int top_k = 0;             // 0: every id
    float top_p = 1.0f;        // nucleus: 1 keeps every id top-k kept
};

// One draw from `logits` (V of them). `scratch` and `order` avoid allocations per token. In double:
// s = logits / temperature; top-k keeps the ids whose s >= the k-th largest (ties kept); p = exp(s -
// max s) over them; top-p < 1 then keeps the fewest of those ids, taken by p downwards (ties by id
// upwards), whose p, added in that order, reach top_p times the sum of every kept p (added in id
// order); the rest get p = 0. A uniform draw r times the sum of p (in id order) walks the ids upwards,
// subtracting each p, to the first id where r < 0 (the last kept id if rounding never gets there).
inline int sample_token(const std::vector<float>& logits, const SampleOptions& o, Rng& rng, std::vector<double>& scratch,
                        std::vector<int>& order) {
    const int V = (int)logits.size();
    if (o.temperature <= 0.0f) return int(std::max_element(logits.begin(), logits.end()) - logits.begin());
    scratch.assign(logits.begin(), logits.end());
    for (double& s : scratch) s /= o.temperature;
    double cut = -INFINITY;  // ids below the k-th largest value are left out
    if (o.top_k > 0 && o.top_k < V) {
        std::vector<double> sorted(scratch);
        std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<double>());
        cut = sorted[o.top_k - 1];
    }
    const double max_s = *std::max_element(scratch.begin(), scratch.end());
    double sum = 0.0;
    for (int v = 0; v < V; v++) {
        scratch[v] = scratch[v] >= cut ? std::exp(scratch[v] - max_s) : 0.0;
        sum += scratch[v];
    }
    if (o.top_p < 1.0f) {
        order.clear();
        for (int v = 0; v < V; v++)
            if (scratch[v] > 0.0) order.push_back(v);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return scratch[a] > scratch[b]; });
        const double target = double(o.top_p) * sum;
        double mass = 0.0;
        size_t kept = order.size();
        for (size_t i = 0; i < order.size(); i++)
            if ((mass += scratch[order[i]]) >= target) {
                kept = i + 1;
                break;
            }
        for (size_t i = kept; i < order.size(); i++) scratch[order[i]] = 0.0;
        sum = 0.0;
        for (int v = 0; v < V; v++) sum += scratch[v];
    }
    int last_kept = 0;
    for (int v = 0; v < V; v++)
        if (scratch[v] > 0.0) last_kept = v;
    double r = rng.uniform() * sum;
    for (int v = 0; v < V; v++)
        if ((r -= scratch[v]) < 0) return v;
    return last_kept;  // rounding left r >= 0
}

constexpr int kGenerateBucket = 64;

// Appends up to `count` tokens to `tokens` (which holds the context, at least one token), calling
// on_token(id) after each; a drawn `stop` token (>= 0) ends it, neither appended nor passed on. Uses
// the model's buffers: a batch of one row of up to min(the buffers' T, maxT). Returns the tokens added.
template <typename F>
int gpt_generate(GPT& m, std::vector<int>& tokens, int count, const SampleOptions& o, Rng& rng, F on_token, int stop = -1) {
    const GPTConfig& c = m.config;
    const int window = std::min(m.act.T, c.maxT), pad = tokens.empty() ? 0 : tokens.back();
    std::vector<floatX> row(c.Vp);
    std::vector<float> logits(c.V);
    std::vector<double> scratch;
    std::vector<int> batch, order;
    for (int i = 0; i < count; i++) {
        const int len = std::min((int)tokens.size(), window);
        const int T = std::min(window, (len + kGenerateBucket - 1) / kGenerateBucket * kGenerateBucket);
        batch.assign(tokens.end() - len, tokens.end());
        batch.resize(T, pad);  // positions after the context do not affect it (causal attention)
        gpt_set_batch(m, batch.data(), nullptr, 1, T);
        gpt_forward(m, 1, T, false, 0.0f);
        cuda_check(cudaMemcpy(row.data(), m.act.acts.logits + size_t(len - 1) * c.Vp, c.Vp * sizeof(floatX), cudaMemcpyDeviceToHost));
        for (int v = 0; v < c.V; v++) logits[v] = to_float(row[v]);
        const int token = sample_token(logits, o, rng, scratch, order);
        if (token == stop) return i;
        tokens.push_back(token);
        on_token(token);
    }
    return count;
}


#ifndef GPT_NO_MAIN
// ---------------------------------------------------------------------------------------------
// Command line. Flags follow llm.c's; every value is range-checked (no division by zero anywhere),
// and a flag given twice is an error, not "the last one wins".

struct Options {
    std::string train_path = "data/tinyshakespeare/tiny_shakespeare_train.bin";
    std::string val_path = "data/tinyshakespeare/tiny_shakespeare_val.bin";
    std::string eval_path;  // -he: a multiple-choice eval file (HellaSwag)
    std::string tokenizer_path = "data/gpt2_tokenizer.bin";
    std::string model = "d12";
    std::string out_dir;
    bool train_given = false, val_given = false, tokenizer_given = false, val_batches_given = false, model_given = false;
    int checkpoint_every = 0, checkpoint_keep = 2, resume = 0;
    int B = 16, T = 1024, max_steps = 100;
    long total_batch = 0;
    float lr = 6e-4f, final_lr_frac = 0.1f, weight_decay = 0.1f, grad_clip = 1.0f;
    std::string schedule = "cosine";
    float wsd_decay = 0.2f;
    double skip_loss_z = 0.0, skip_norm_z = 0.0;  // -sl, -sg: the outlier guard's Z, 0 = off
    int warmup = 10, val_every = 20, val_batches = 20, sample_every = 50, gen_len = 64;
    std::string prompt;
    float temperature = 1.0f;
    int top_k = 0;
    long seed = 1337;
    int shuffle = 1;
    int profile = 0;
    int flash = 1;
    int gelu_fusion = GELU_FUSION_DEFAULT, recompute = RECOMPUTE_DEFAULT, overlap = OVERLAP_DEFAULT;
    int tune_wide = 0;
    int exp_head = 1;
    int fp8 = 0;
    std::string rendezvous;
    int stall_seconds = 600;
};

static void usage(const Options& d) {
    printf("usage: train_gpt_%s [flags]   (every flag takes a value)\n"
           "data and model\n"
           "  -i <glob>   training tokens: a token file or a glob of shards, e.g. \"data/x/x_train_*.bin\" (default %s)\n"
           "  -j <glob>   validation tokens (default: with -i, the files named like -i's with \"val\" for its last\n"
           "              \"train\"; without -i, %s)\n"
           "  -z <file>   tokenizer, for printing samples (default %s)\n"
           "  -e <model>  d6|d12|d24|d36|d48 for a fresh GPT-2 init, or a model file: ours, or llm.c's\n"
           "              (gpt2_124M.bin, fp32 or bf16) (default %s)\n"
           "output\n"
           "  -o <dir>    run folder: checkpoints, main.log and metrics.csv (default: none)\n"
           "  -n <int>    checkpoint every N steps, and at the end; 0 = only at the end when -o is set (default %d)\n"
           "  -nk <int>   keep the newest K checkpoints (default %d)\n"
           "  -y <0|1>    resume from the newest complete checkpoint in -o; an -e given must name its model, and -t, -d,\n"
           "              -sd, -sh and the data must be the checkpoint's; -b and the number of GPUs may change (default %d)\n"
           "batch and schedule\n"
           "  -b <int>    micro-batch size B, per GPU (default %d)\n"
           "  -t <int>    sequence length T, at most the model's maxT (default %d)\n"
           "  -d <int>    total batch size in tokens, a multiple of B*T*GPUs (default B*T*GPUs: no accumulation); a step\n"
           "              trains on d/T sequences of T+1 tokens, the same ones whatever -b and the number of GPUs\n"
           "  -x <int>    optimizer steps, at most 99999999 (checkpoint names hold 8 digits; default %d)\n"
           "  -l <float>  peak learning rate (default %g)\n"
           "  -u <int>    warmup steps, linear from 0 (default %d)\n"
           "  -k <name>   learning-rate schedule after the warm-up: cosine, linear (to -q), constant, or wsd\n"
           "              (constant until the last -wd of the steps, then 1 - sqrt down to -q) (default %s)\n"
           "  -q <float>  final learning rate as a fraction of -l (default %g)\n"
           "  -wd <float> wsd: the fraction of the steps that decays (default %g)\n"
           "  -c <float>  weight decay of matrices and embeddings (default %g)\n"
           "  -gc <float> global gradient-norm clip, 0 = off (default %g)\n"
           "  -sl <float> skip the update of a step whose loss is more than Z standard deviations above the mean\n"
           "              of the last 128 steps' losses, its own included (from step 129; z is at most 11.27;\n"
           "              non-finite losses are left out) (default %g = off)\n"
           "  -sg <float> the same for the global gradient norm (default %g = off)\n"
           "  -sd <int>   seed of init, shuffling and sampling (default %ld)\n"
           "  -sh <0|1>   shuffle the training sequences each epoch (default %d)\n"
           "validation and samples\n"
           "  -v <int>    validation loss (and -he) every N steps, 0 = never (-he then at the end only) (default %d)\n"
           "  -he <file>  a HellaSwag eval file (data/prepare_hellaswag.py, or llm.c's hellaswag_val.bin): its\n"
           "              acc_norm and acc every -v steps and at the end (default: none)\n"
           "  -m <int>    validation batches of -d tokens: the loss is the mean over the first -m * d/T sequences of the\n"
           "              validation data, or all it holds if fewer, whatever -b and the number of GPUs (default %d)\n"
           "  -s <int>    print a sample every N steps, 0 = never (default %d)\n"
           "  -g <int>    tokens per sample (default %d)\n"
           "  -p <text>   prompt of the samples, after <|endoftext|> (default: none)\n"
           "  -tp <float> sampling temperature, 0 = greedy (default %g)\n"
           "  -sk <int>   sample from the top-k tokens only, 0 = all (default %d)\n"
           "speed and memory\n"
           "  -fa <0|1>   flash attention where it runs (bf16 builds, head size 64/80/128), else cuBLAS attention (default %d)\n"
           "  -ge <0|1|2> GELU in cuBLASLt matmul epilogues: 0 = separate GELU kernels, 1 = fused in the forward,\n"
           "              2 = forward and backward (default %d; fp32 builds, the exact reference, keep 0)\n"
           "  -r <0|1>    1 = recompute GELU in the backward instead of keeping it: saves (L-1)*B*T*4C activations\n"
           "              (4.1 GiB at d12 B=64 bf16) for ~2.5%% of the step; with -ge 1/2 not bit-identical to -r 0; -f8 1\n"
           "              keeps no GELU output and recomputes nothing either way (default %d)\n"
           "  -ov <0|1>   1 = the backward's weight gradients on a second stream, overlapped: the same bits (default %d)\n"
           "  -tw <0|1>   1 = tune each matmul also over the configurations around cuBLASLt's heuristic (up to 3 s\n"
           "              a shape at start): the same bits, ~1%% faster at B=64 on an H100 (default %d)\n"
           "  -lx <0|1>   where it runs (bf16 builds on Hopper), 1 = the LM head's GEMM writes exp(logits) and the\n"
           "              classifier no pass over the logits: ~2.5%% faster at d12, other bits (default %d)\n"
           "  -f8 <0|1>   1 = the blocks' linear layers in FP8 (e4m3 forward, e5m2 gradients; bf16 builds, compute\n"
           "              capability 8.9+, C and -t multiples of 16; GELU unfused); checkpoints resume either way (default %d)\n"
           "  -pf <0|1>   time every kernel family with CUDA events and print the breakdown at the end; the last\n"
           "              step runs between cudaProfilerStart/Stop (ncu --profile-from-start off) (default %d)\n"
           "several GPUs (one process each, started by mpirun, srun, torchrun or scripts/launch.sh)\n"
           "  -rz <where> where rank 0 listens: HOST:PORT, or file:PATH on a file system every node sees\n"
           "              (default: MASTER_ADDR:MASTER_PORT, or this host when every rank runs here)\n"
           "  -wt <int>   end every rank when a step makes no progress for this many seconds, 0 = never (default %d)\n"
           "  -h          this help\n"
           "Each step prints loss, grad norm, lr, time, tokens/s and MFU = 6*N + 12*L*C*T FLOPs per token\n"
           "(PaLM's count) over the peak of an H100 SXM (989 TFLOP/s dense bf16; 67 TFLOP/s fp32), per GPU.\n"
           "SIGTERM or SIGINT (Ctrl-C): the step in progress finishes, a checkpoint is written when -o is set,\n"
           "and the program exits with code 75; a second signal ends it at once.\n",
           PRECISION_NAME, d.train_path.c_str(), d.val_path.c_str(), d.tokenizer_path.c_str(), d.model.c_str(),
           d.checkpoint_every, d.checkpoint_keep, d.resume, d.B, d.T, d.max_steps, d.lr, d.warmup, d.schedule.c_str(), d.final_lr_frac, d.wsd_decay,
           d.weight_decay, d.grad_clip, d.skip_loss_z, d.skip_norm_z, d.seed, d.shuffle, d.val_every, d.val_batches,
           d.sample_every, d.gen_len, d.temperature, d.top_k, d.flash, d.gelu_fusion, d.recompute, d.overlap, d.tune_wide,
           d.exp_head, d.fp8, d.profile, d.stall_seconds);
}

static Options parse_options(int argc, char** argv) {
    Options o;
    if (help_asked(argc, argv)) {
        usage(o);
        exit(0);
    }
    for_each_flag(argc, argv, "-b 4", [&](const std::string& f, const char* fl, const char* v) {
        auto path = [&](std::string& out) {
            if (!*v) fail("flag %s: expected a path, got an empty string", fl);
            out = v;
        };
        if (f == "-i") path(o.train_path), o.train_given = true;
        else if (f == "-j") path(o.val_path), o.val_given = true;
        else if (f == "-z") path(o.tokenizer_path), o.tokenizer_given = true;
        else if (f == "-e") path(o.model), o.model_given = true;
        else if (f == "-o") path(o.out_dir);
        else if (f == "-n") o.checkpoint_every = (int)parse_int_flag(fl, v, 0, 1 << 30);
        else if (f == "-nk") o.checkpoint_keep = (int)parse_int_flag(fl, v, 1, 1 << 20);
        else if (f == "-y") o.resume = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-b") o.B = (int)parse_int_flag(fl, v, 1, 4096);
        else if (f == "-t") o.T = (int)parse_int_flag(fl, v, 1, 65536);
        else if (f == "-d") o.total_batch = parse_int_flag(fl, v, 1, 1 << 30);
        else if (f == "-x") o.max_steps = (int)parse_int_flag(fl, v, 1, 99999999);
        else if (f == "-l") o.lr = (float)parse_float_flag(fl, v, 0.0, 10.0);
        else if (f == "-u") o.warmup = (int)parse_int_flag(fl, v, 0, 1 << 30);
        else if (f == "-q") o.final_lr_frac = (float)parse_float_flag(fl, v, 0.0, 1.0);
        else if (f == "-k") {
            ScheduleKind kind;
            if (!schedule_kind_from_name(v, &kind))
                fail("flag -k: expected a schedule, cosine, linear, constant or wsd, got '%s'%s", v,
                     v[0] >= '0' && v[0] <= '9' ? " (the samples' top-k is -sk)" : "");
            o.schedule = v;
        }
        else if (f == "-wd") o.wsd_decay = (float)parse_float_flag(fl, v, 0.0, 1.0);
        else if (f == "-c") o.weight_decay = (float)parse_float_flag(fl, v, 0.0, 10.0);
        else if (f == "-gc") o.grad_clip = (float)parse_float_flag(fl, v, 0.0, 1e6);
        else if (f == "-sl") o.skip_loss_z = parse_float_flag(fl, v, 0.0, 1e6);
        else if (f == "-sg") o.skip_norm_z = parse_float_flag(fl, v, 0.0, 1e6);
        else if (f == "-v") o.val_every = (int)parse_int_flag(fl, v, 0, 1 << 30);
        else if (f == "-he") path(o.eval_path);
        else if (f == "-m") o.val_batches = (int)parse_int_flag(fl, v, 1, 1 << 20), o.val_batches_given = true;
        else if (f == "-s") o.sample_every = (int)parse_int_flag(fl, v, 0, 1 << 30);
        else if (f == "-g") o.gen_len = (int)parse_int_flag(fl, v, 1, 65536);
        else if (f == "-p") {
            o.prompt = v;
            check_prompt_utf8(o.prompt);
        }
        else if (f == "-tp") o.temperature = (float)parse_float_flag(fl, v, 0.0, 100.0);
        else if (f == "-sk") o.top_k = (int)parse_int_flag(fl, v, 0, 1 << 20);
        else if (f == "-sd") o.seed = parse_int_flag(fl, v, 0, 1l << 62);
        else if (f == "-sh") o.shuffle = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-pf") o.profile = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-fa") o.flash = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-ge") o.gelu_fusion = (int)parse_int_flag(fl, v, 0, 2);
        else if (f == "-r") o.recompute = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-ov") o.overlap = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-tw") o.tune_wide = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-lx") o.exp_head = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-f8") o.fp8 = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-rz") path(o.rendezvous);
        else if (f == "-wt") o.stall_seconds = (int)parse_int_flag(fl, v, 0, 1 << 24);
        else fail("unknown flag %s (-h lists the flags)", fl);
    });
    if ((long)o.B * o.T > (1l << 24)) fail("-b %d -t %d: B*T = %ld tokens per micro-batch is more than 16M", o.B, o.T, (long)o.B * o.T);
    if (o.resume && o.out_dir.empty()) fail("-y 1 resumes from the output folder: give it with -o");
    if (o.checkpoint_every > 0 && o.out_dir.empty()) fail("-n %d writes checkpoints into the output folder: give it with -o", o.checkpoint_every);
    if (o.fp8 && !std::is_same<floatX, __nv_bfloat16>::value)
        fail("flag -f8 1: FP8 linear layers need the bf16 build (train_gpt_bf16), not train_gpt_%s", PRECISION_NAME);
    if (o.fp8 && o.T % 16)
        fail("flag -f8 1: -t %d is not a multiple of 16 (FP8 GEMMs need every batch's B*T rows a multiple of 16)", o.T);
    return o;
}

// The output folder is checked before anything else, and made only once every input is valid, so a
// run that fails validation leaves nothing behind. An existing folder must take a file (one is
// written and removed); a missing one must be creatable: with probe_only it and its missing parents
// are made and removed again, else made (and returned, outermost first).
static std::vector<std::string> missing_folders(const std::string& dir) {  // outermost first
    std::vector<std::string> missing;
    for (std::string p = dir; !p.empty() && p != "/" && p != "."; ) {
        struct stat st;
        if (stat(p.c_str(), &st) == 0) {
            if (!S_ISDIR(st.st_mode)) fail("output path '%s': '%s' is not a folder", dir.c_str(), p.c_str());
            break;
        }
        missing.insert(missing.begin(), p);
        const size_t slash = p.find_last_of('/', p.size() - 1);
        p = slash == std::string::npos ? "" : p.substr(0, slash);
    }
    return missing;
}
static std::vector<std::string> make_out_dir(const std::string& dir, bool probe_only) {
    const std::vector<std::string> missing = missing_folders(dir);
    size_t made = 0;
    for (; made < missing.size(); made++)
        if (mkdir(missing[made].c_str(), 0755) != 0 && errno != EEXIST) break;
    if (made < missing.size()) {
        const int err = errno;
        while (made-- > 0) rmdir(missing[made].c_str());
        fail("cannot create output folder '%s': %s", dir.c_str(), strerror(err));
    }
    const std::string probe = dir + "/.write_test";
    std::string error;
    const char byte = 0;
    const bool ok = write_file_atomic(probe, {{&byte, 1}}, &error);
    unlink(probe.c_str());
    if (probe_only)
        for (size_t i = missing.size(); i-- > 0;) rmdir(missing[i].c_str());
    if (!ok) fail("output folder '%s' is not writable: %s", dir.c_str(), error.c_str());
    return missing;  // the folders it made
}

// The validation data beside -i's: the same pattern with "val" for the last "train" of its file name.
static std::string validation_beside(const std::string& train) {
    const size_t slash = train.find_last_of('/'), name = slash == std::string::npos ? 0 : slash + 1;
    const size_t at = train.rfind("train");
    if (at == std::string::npos || at < name) return "";
    return train.substr(0, at) + "val" + train.substr(at + 5);
}

static bool looks_like_descriptor(const std::string& s) {
    return s.size() >= 2 && s[0] == 'd' && std::all_of(s.begin() + 1, s.end(), [](char c) { return isdigit((unsigned char)c); });
}


// ---------------------------------------------------------------------------------------------
// The run: what main's steps share.

struct Run {
    Options o;
    Dist dist;
    bool lead = true;  // rank 0 alone prints, logs, samples and writes
    int accum = 1;     // micro-batches per step and rank
    long total_batch = 0;  // tokens per step, all ranks together
    HostModel host;
    TrainState state;
    bool resumed = false, fresh_init = false;
    int start_step = 0;  // the resumed step, or 0
    CheckpointScan scan;
    TokenStream train_data, val_data;
    DataLoader train, val;
    RankBatches batches;
    uint64_t val_sequences = 0;  // validated on: the first of the validation data
    Tokenizer tokenizer;
    bool have_tokenizer = false;
    std::vector<int> sample_context;
    std::vector<EvalExample> eval_examples;  // -he
    EvalScore last_eval;
    LearningRateSchedule schedule;
    OutlierGuard guard;      // -sl, -sg, and the windows of the steps so far
    OutlierVerdict verdict;  // the current step's
    GPT m;
    cudaDeviceProp prop{};
    RunLogs logs;
    Rng sampler{0};
    std::vector<int> inputs, targets;  // the host's copy of the batch being staged
    int staged = -1;                   // the slot of the next training batch, staged while the GPU ran the step before
    std::vector<double> step_ms;
    float last_val = NAN, train_loss = NAN;
    int bad_steps = 0, last_checkpoint = -1;
    size_t peak_used = 0;
    double flops_per_token = 0, peak_flops = 0;
};

// Micro-batches per step: -d must split into whole micro-batches of B*T tokens on every rank.
static void plan_batch(Run& r) {
    const Options& o = r.o;
    const int world = r.dist.world;
    r.accum = micro_steps_per_rank(o.total_batch ? o.total_batch : long(o.B) * o.T * world, o.B, o.T, world);
    if (r.accum == 0)
        fail("-d %ld: the total batch size must be a multiple of B*T*GPUs = %d*%d*%d = %ld", o.total_batch, o.B, o.T, world,
             long(o.B) * o.T * world);
    r.total_batch = long(r.accum) * o.B * o.T * world;
}

// The model an -e names, without reading its parameters: a descriptor's config, or a model file's
// header (checked against the file's size).
static GPTConfig config_named_by(const std::string& model) {
    GPTConfig c;
    if (config_from_descriptor(model, c)) return c;
    std::string error;
    if (!read_model_config(model, c, &error)) fail("-e %s: %s", model.c_str(), error.c_str());
    return c;
}

// -y 1: the newest usable checkpoint of -o, which must belong to this run's model and setup.
static void find_checkpoint(Run& r) {
    const Options& o = r.o;
    if (!o.out_dir.empty()) {
        if (r.lead) make_out_dir(o.out_dir, true);  // rank 0 alone writes there; the others read checkpoints
        r.scan = scan_checkpoints(o.out_dir);
    }
    // A new run must not share a folder with another run's checkpoints: pruning keeps the highest
    // steps, so it would delete this run's own checkpoints, and -y 1 would take the other run's.
    if (!o.resume && !r.scan.states.empty())
        fail("output folder '%s' already holds checkpoints (newest: step %d): resume with -y 1, or give another -o",
             o.out_dir.c_str(), r.scan.states[0]);
    if (!o.resume) return;
    TrainState& st = r.state;
    int damaged = 0;
    r.resumed = find_resume_checkpoint(o.out_dir, r.host, st, &damaged, r.lead);
    r.start_step = r.resumed ? st.step : 0;
    // Starting over there would overwrite a run's complete (if damaged) checkpoints.
    if (!r.resumed && damaged > 0)
        fail("none of the %zu checkpoints in '%s' can be loaded (see the warnings): move them away to start over",
             r.scan.states.size(), o.out_dir.c_str());
    if (!r.resumed) {
        if (r.lead && r.scan.states.empty() && !r.scan.has_leftovers())
            printf("no checkpoint in %s: starting from -e %s\n", o.out_dir.c_str(), o.model.c_str());
        else if (r.lead)
            fprintf(stderr, "warning: no complete checkpoint in %s (only what interrupted saves left): starting from -e %s\n",
                    o.out_dir.c_str(), o.model.c_str());
        return;
    }
    // What model the folder holds is the first thing to agree on.
    if (o.model_given) {
        const GPTConfig named = config_named_by(o.model), held = r.host.config;
        if (memcmp(&named, &held, sizeof(named)) != 0)
            fail("the checkpoint of step %d in '%s' holds the model %s; -e %s is %s: resume without -e, or give another -o",
                 st.step, o.out_dir.c_str(), config_text(held).c_str(), o.model.c_str(), config_text(named).c_str());
    }
    // The data order is the data's, T's, -d's and the seed's (dataloader.h): -b and the number of GPUs may change.
    if (st.T != o.T || st.seed != o.seed || st.shuffle != o.shuffle)
        fail("the checkpoint of step %d in '%s' was written with -t %d -sd %lld -sh %d: resume with the same flags "
             "(given -t %d -sd %lld -sh %d)",
             st.step, o.out_dir.c_str(), st.T, (long long)st.seed, st.shuffle, o.T, (long long)o.seed, o.shuffle);
    // The tokens per step, whatever -b and the number of GPUs (-d's default grows with them).
    if (st.total_batch != 0 && st.total_batch != (uint64_t)r.total_batch)
        fail("the checkpoint of step %d in '%s' was written with -d %llu tokens per step, this run has %ld: resume with "
             "-d %llu", st.step, o.out_dir.c_str(), (unsigned long long)st.total_batch, r.total_batch,
             (unsigned long long)st.total_batch);
    if (r.lead && (st.gelu_fusion != o.gelu_fusion || st.recompute != o.recompute || st.fp8 != o.fp8))
        fprintf(stderr, "warning: the checkpoint of step %d was written with -ge %d -r %d -f8 %d, this run has -ge %d -r %d -f8 %d: "
                "its losses will differ from an uninterrupted run's%s\n", st.step, st.gelu_fusion, st.recompute, st.fp8,
                o.gelu_fusion, o.recompute, o.fp8, st.fp8 != o.fp8 ? " (FP8's roundings in place of bf16's, or back)" : " in rounding");
    // Else the final checkpoint would be labelled step -x while holding the later weights.
    if (st.step > o.max_steps)
        fail("-x %d is below step %d of the checkpoint in %s (give a larger -x to continue it)", o.max_steps, st.step,
             o.out_dir.c_str());
}

// The model to start from when nothing is resumed: -e's descriptor (a random init, made later) or
// model file.
static void choose_model(Run& r) {
    const Options& o = r.o;
    if (r.resumed) return;
    r.fresh_init = config_from_descriptor(o.model, r.host.config);
    if (r.fresh_init) return;
    if (looks_like_descriptor(o.model) && !file_exists(o.model))
        fail("-e %s: no such model file, and not a model name (d6, d12, d24, d36, d48)", o.model.c_str());
    const std::string hf = hugging_face_hint(o.model);
    if (!hf.empty()) fail("-e %s: %s", o.model.c_str(), hf.c_str());
    std::string error;
    if (!read_model_file(o.model, r.host, &error)) fail("-e %s: %s", o.model.c_str(), error.c_str());
}

// The training and validation token streams, and the resumed position in them.
static void open_data(Run& r) {
    const Options& o = r.o;
    const GPTConfig& c = r.host.config;
    std::string error;
    if (o.T > c.maxT) fail("-t %d is larger than the model's maximum sequence length %d", o.T, c.maxT);
    if (o.fp8 && c.C % 16)
        fail("-f8 1: the model's C = %d is not a multiple of 16 (cuBLASLt's FP8 GEMMs need every dimension, C, 3C and 4C, "
             "a multiple of 16)", c.C);
    if (!r.train_data.open(o.train_path, c.V, &error)) fail("-i %s: %s", o.train_path.c_str(), error.c_str());
    r.train.init(r.train_data, o.T, o.shuffle != 0, (uint64_t)o.seed, "-i", uint64_t(r.total_batch) / o.T);
    // Small data is read whole now (its fingerprint), so a bad token id fails before any GPU work;
    // a large corpus is checked as its sequences are read.
    const uint64_t data_tokens = r.train_data.total;
    const uint32_t data_crc = r.train_data.fingerprint();
    std::string val_path = o.val_path;
    if (o.val_every > 0) {  // -v 0 never validates: no validation data is needed
        if (o.train_given && !o.val_given) {
            val_path = validation_beside(o.train_path);
            const std::vector<std::string> found = val_path.empty() ? std::vector<std::string>() : expand_glob(val_path);
            if (found.empty() || !file_exists(found[0]))
                fail("-i %s: no validation data beside it%s%s%s: give -j, or -v 0 to train without validation", o.train_path.c_str(),
                     val_path.empty() ? "" : " (looked for '", val_path.c_str(), val_path.empty() ? "" : "')");
        }
        if (!r.val_data.open(val_path, c.V, &error)) fail("-j %s: %s", val_path.c_str(), error.c_str());
        if (r.val_data.total <= TokenStream::kFullCrcTokens) r.val_data.fingerprint();  // reads (and checks) every token
        // Validation takes the first -m * d/T sequences, or as many as the data holds: a small validation
        // file (Tiny Shakespeare's 32,768 tokens) still serves with fewer.
        if (r.val_data.total < uint64_t(o.T) + 1)
            fail("-j %s has %llu tokens, fewer than T+1 = %d (use a smaller -t, or -v 0)", val_path.c_str(),
                 (unsigned long long)r.val_data.total, o.T + 1);
        r.val.init(r.val_data, o.T, false, 0, "-j");
    }
    if (!o.eval_path.empty()) {
        if (!read_eval_file(o.eval_path, c.V, r.eval_examples, &error)) fail("-he %s: %s", o.eval_path.c_str(), error.c_str());
        const std::string unfit = eval_fit_error(r.eval_examples, o.B, std::min(o.T, c.maxT));
        if (!unfit.empty()) fail("-he %s: %s (give a larger -t or -b)", o.eval_path.c_str(), unfit.c_str());
    }
    TrainState& st = r.state;
    if (r.resumed) {
        if (st.data_tokens != data_tokens || st.data_crc != data_crc)
            fail("-i '%s' (%llu tokens, fingerprint %08x) is not the training data of the checkpoint of step %d (%llu tokens, "
                 "fingerprint %08x)", o.train_path.c_str(), (unsigned long long)data_tokens, data_crc, st.step,
                 (unsigned long long)st.data_tokens, st.data_crc);
        if (st.shuffled_windows)
            fail("the checkpoint of step %d in '%s' was written by a version that shuffled windows of B*T tokens, not "
                 "sequences of T+1: its data order cannot be continued; start a new run from its model (-e %s, another -o)",
                 st.step, o.out_dir.c_str(), checkpoint_path(o.out_dir, "model", st.step).c_str());
        if (st.loader_cursor > r.train.sequences)  // only a damaged or hand-made state file gets here
            fail("checkpoint data position %llu is beyond the %llu sequences of '%s'", (unsigned long long)st.loader_cursor,
                 (unsigned long long)r.train.sequences, o.train_path.c_str());
        r.train.seek(st.loader_epoch, st.loader_cursor);
        if (r.lead) printf("resuming from step %d in %s\n", st.step, o.out_dir.c_str());
    }
    st.B = o.B, st.T = o.T, st.seed = o.seed, st.shuffle = o.shuffle;
    st.gelu_fusion = o.gelu_fusion, st.recompute = o.recompute, st.fp8 = o.fp8;
    st.data_tokens = data_tokens, st.data_crc = data_crc, st.total_batch = (uint64_t)r.total_batch;
    r.batches.init(r.train, o.B, r.dist.rank, r.dist.world, r.accum);
    const uint64_t val_asked = uint64_t(o.val_batches) * uint64_t(r.total_batch / o.T);
    r.val_sequences = std::min(val_asked, r.val.sequences);  // 0 when -v 0
    if (r.lead && o.val_every > 0 && o.val_batches_given && r.val_sequences < val_asked)
        fprintf(stderr, "warning: -m %d: the validation data holds %llu sequences of T+1 tokens, fewer than -m * d/T = %llu; "
                "validating on those\n", o.val_batches, (unsigned long long)r.val_sequences, (unsigned long long)val_asked);
}

// The tokenizer (optional: samples print token ids without it) and the samples' context.
static void open_tokenizer(Run& r) {
    const Options& o = r.o;
    const GPTConfig& c = r.host.config;
    r.have_tokenizer = o.tokenizer_given || file_exists(o.tokenizer_path);
    if (r.have_tokenizer) r.tokenizer = read_tokenizer(o.tokenizer_path);
    if (r.have_tokenizer && r.tokenizer.vocab_size != c.V)
        fail("tokenizer '%s' has %d tokens, the model %d", o.tokenizer_path.c_str(), r.tokenizer.vocab_size, c.V);
    if (!o.prompt.empty() && !r.have_tokenizer)
        fail("-p needs the tokenizer (-z %s is missing): prepare it with data/prepare_tinyshakespeare.py", o.tokenizer_path.c_str());
    if (r.lead && o.sample_every > 0 && !r.have_tokenizer)
        fprintf(stderr, "warning: no tokenizer at %s: samples print token ids\n", o.tokenizer_path.c_str());
    const int eot = r.have_tokenizer && r.tokenizer.eot_token >= 0 ? r.tokenizer.eot_token : c.V - 1;
    r.sample_context = {eot};
    if (!o.prompt.empty()) {
        const std::vector<int> p = tokenizer_encode(r.tokenizer, o.prompt);
        r.sample_context.insert(r.sample_context.end(), p.begin(), p.end());
    }
    r.schedule = LearningRateSchedule{o.lr, o.final_lr_frac, o.warmup, o.max_steps};
    schedule_kind_from_name(o.schedule.c_str(), &r.schedule.kind);
    r.schedule.decay_fraction = o.wsd_decay;
    if (r.lead && o.warmup >= o.max_steps && r.start_step < o.max_steps)
        fprintf(stderr, "warning: -u %d warm-up steps of -x %d: the learning rate never reaches -l %g (it peaks at %g)\n",
                o.warmup, o.max_steps, o.lr, r.schedule.at(o.max_steps - 1));
}

// The outlier guard: -sl and -sg, and the windows a resumed run's checkpoint holds (empty for a new
// run, or a checkpoint written before the guard). The flags may differ from the checkpoint's run.
static void plan_outlier_guard(Run& r) {
    r.guard.loss_limit = r.o.skip_loss_z, r.guard.norm_limit = r.o.skip_norm_z;
    r.guard.windows = r.state.outliers;
    const double most = std::sqrt(double(kOutlierWindow - 1));  // z's bound, the value being in its window
    const char* flags[2] = {"-sl", "-sg"};
    const double limits[2] = {r.guard.loss_limit, r.guard.norm_limit};
    for (int i = 0; i < 2; i++)
        if (r.lead && limits[i] >= most)
            fprintf(stderr, "warning: %s %g: a z over %d values that include the value itself is at most sqrt(%d) = %.2f, "
                    "so this never skips an update\n", flags[i], limits[i], kOutlierWindow, kOutlierWindow - 1, most);
}

// Several GPUs: the ranks meet, and each is refused unless its run setup is rank 0's.
static void meet_ranks(Run& r, int argc, char** argv) {
    Dist& dist = r.dist;
    if (!dist.multi()) return;
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
    if (devices != 1 && dist.local_rank >= devices)
        fail("rank %d has local rank %d, but this node has %d GPUs: start at most one rank per GPU", dist.rank, dist.local_rank, devices);
    // What must be the same on every rank, the most telling first: build, model, data, flags.
    const GPTConfig& c = r.host.config;
    std::string setup = std::string("build=") + PRECISION_NAME;
    auto add = [&](const char* key, const std::string& value) { setup += std::string(" ") + key + "=" + value; };
    add("model", "L" + std::to_string(c.L) + ",NH" + std::to_string(c.NH) + ",C" + std::to_string(c.C) + ",T" +
                     std::to_string(c.maxT) + ",V" + std::to_string(c.V) + ",Vp" + std::to_string(c.Vp));
    add("resumed-step", std::to_string(r.resumed ? r.state.step : -1));
    char data[64];
    snprintf(data, sizeof(data), "%llu:%08x", (unsigned long long)r.state.data_tokens, r.state.data_crc);
    add("data", data);
    for (int i = 1; i + 1 < argc; i += 2) add(argv[i], argv[i + 1]);  // the flags as given
    add("-d(tokens)", std::to_string(r.total_batch));
    if (setup.size() >= kSetupChars)
        fail("the run setup is %zu characters, more than the %d ranks can compare (shorter paths?)", setup.size(), kSetupChars - 1);
    dp_meet(dist, r.o.rendezvous, setup, r.o.stall_seconds);
}

// The GPU (one per rank: the rank's local index on its node), the output folder, the model on it.
static void open_gpu(Run& r) {
    const Options& o = r.o;
    Dist& dist = r.dist;
    if (!cuda_device_available()) fail("no CUDA device found (train_gpt needs a GPU)");
    int devices = 0;
    cuda_check(cudaGetDeviceCount(&devices));
    // One visible GPU: the launcher gave this rank its own (srun --gpus-per-task, CUDA_VISIBLE_DEVICES
    // per rank). Several: the rank's local index picks one.
    const int device = devices == 1 ? 0 : dist.local_rank;
    if (device >= devices)
        fail("rank %d has local rank %d, but this node has %d GPUs: start at most one rank per GPU", dist.rank, dist.local_rank, devices);
    cuda_check(cudaSetDevice(device));
    cuda_check(cudaGetDeviceProperties(&r.prop, device));
    // Inputs are valid and there is a GPU: the output folder is made now (removed again, if still
    // empty, should the run fail), and what interrupted saves left in it is removed.
    if (!o.out_dir.empty() && r.lead) {
        static std::vector<std::string> made;
        made = make_out_dir(o.out_dir, false);
        atexit([] {
            for (size_t i = made.size(); i-- > 0;) rmdir(made[i].c_str());  // only empty folders go
        });
        if (!r.resumed && r.scan.has_leftovers()) prune_checkpoints(o.out_dir, 0);
    }
    dp_init_comm(dist);
    GPT& m = r.m;
    m.profiler.on = o.profile != 0;
    blas().tune_wide = o.tune_wide != 0;
    blas().tune_print = o.tune_wide != 0 && r.lead;  // -tw 1 prints what each plan's tuning kept
    GPTSettings settings;
    settings.flash = o.flash != 0, settings.gelu_fusion = o.gelu_fusion, settings.recompute = o.recompute;
    settings.overlap = o.overlap != 0, settings.fp8 = o.fp8 != 0;
    gpt_create(m, r.host, o.B, o.T, settings, &dist);
    const TrainState& st = r.state;
    if (o.exp_head && gpt_exp_head_usable(m)) {
        if (!r.resumed || st.head != 1) gpt_use_exp_head(m);
        else if (r.lead)  // written on the logits path (-lx 0, or after a refused row)
            printf("the checkpoint of step %d was written with the logits and the classifier: resuming so (-lx 0)\n", st.step);
    }
    if (r.resumed && r.lead && (st.head == 2) != m.exp_head.on) {
        fprintf(stderr, "warning: the checkpoint of step %d was written with the %s LM head, this run has the %s one: its losses "
                "will differ in rounding from an uninterrupted run\n", st.step, st.head == 2 ? "exp" : "logits",
                m.exp_head.on ? "exp" : "logits");
    }
}

// The optimizer state of a resumed run, the sampler, and what the step's report counts with.
static void restore_state(Run& r) {
    if (r.resumed) {
        gpt_set_optimizer_state(r.m, r.state.adam_m, r.state.adam_v);
        r.state.adam_m = std::vector<float>(), r.state.adam_v = std::vector<float>();
        gpt_set_fp8_history(r.m, r.state.fp8_history, r.state.fp8_history_steps);
        r.last_checkpoint = r.state.step;
    }
    r.host.params = std::vector<float>();
    r.sampler = Rng(r.state.sampler_rng ? r.state.sampler_rng : (uint64_t)r.o.seed ^ 0x5DEECE66Dull);
    const GPTConfig& c = r.m.config;
    const size_t real_params = r.m.weights.count - size_t(c.Vp - c.V) * c.C;
    r.flops_per_token = 6.0 * real_params + 12.0 * c.L * c.C * r.o.T;
    r.peak_flops = sizeof(floatX) == 2 ? 989.4e12 : 66.9e12;
}

static void print_setup(const Run& r) {
    if (!r.lead) return;
    const Options& o = r.o;
    const GPT& m = r.m;
    const GPTConfig& c = m.config;
    const size_t real_params = m.weights.count - size_t(c.Vp - c.V) * c.C;
    const double state_copies = m.opt.master ? 3 : 2;  // fp32 arrays a parameter has in the optimizer
    printf("device: %s | precision %s | %s attention | LM head %s | GELU fusion -ge %d, recompute -r %d, weight stream -ov %d, "
           "matmul tuning -tw %d, FP8 linear layers -f8 %d | model L=%d NH=%d C=%d maxT=%d V=%d (Vp=%d), %zu parameters\n",
           r.prop.name, PRECISION_NAME, m.flash ? "flash" : "cuBLAS", m.exp_head.on ? "exp (-lx 1)" : "logits and classifier",
           m.settings.gelu_fusion, m.settings.recompute, (int)m.settings.overlap, o.tune_wide, (int)m.fp8.on, c.L, c.NH, c.C,
           c.maxT, c.V, c.Vp, real_params);
    if (r.dist.multi())
        printf("data parallel: %d ranks (%s), optimizer state sharded (ZeRO-1): %.2f GiB per GPU instead of %.2f\n", r.dist.world,
               r.dist.launcher.c_str(), m.dp.shard * sizeof(float) * state_copies / 1073741824.0,
               m.weights.count * sizeof(float) * state_copies / 1073741824.0);
    printf("batch: B=%d T=%d x %d GPUs, total %ld tokens per step (%d micro-steps per GPU) | train %llu tokens (%llu sequences, "
           "%zu files), val %llu tokens (%llu sequences)\n",
           o.B, o.T, r.dist.world, r.total_batch, r.accum, (unsigned long long)r.train_data.total,
           (unsigned long long)r.train.sequences, r.train_data.shards.size(), (unsigned long long)r.val_data.total,
           (unsigned long long)r.val_sequences);
    std::string fp8_text;  // -f8 1: its buffers, both copies of each (Fp8Buffers)
    if (m.fp8.on) {
        size_t weights = 0, inputs = 4 * m.fp8.input[0].capacity, douts = 0;  // the shared natural copy, B T 4C
        for (int k = 0; k < 4; k++)
            weights += 2 * m.fp8.weight[k].capacity, inputs += size_t(c.L) * m.fp8.input[k].capacity, douts += 2 * m.fp8.dout[k].capacity;
        fp8_text = strf(" (-f8 1: %.2f GiB of it FP8 copies: weights %.2f, layer inputs %.2f, output gradients %.2f; ln1 and ln2 in bf16 for "
                        "one layer, not L, and no GELU output)",
                        m.fp8.bytes / 1073741824.0, weights / 1073741824.0, inputs / 1073741824.0, douts / 1073741824.0);
    }
    printf("memory: %.2f GiB allocated for parameters, optimizer state, activations and scratch%s%s\n", m.memory.bytes / 1073741824.0,
           m.settings.recompute && !m.fp8.on ? " (-r 1: GELU output of one layer, not L)" : "", fp8_text.c_str());
    const OutlierGuard& g = r.guard;
    printf("outlier guard: -sl %g -sg %g (0 = off): an update is skipped when the loss's or the grad norm's z over the last "
           "%d steps' values is above it; %d and %d held now\n", g.loss_limit, g.norm_limit, kOutlierWindow,
           g.windows.loss.count, g.windows.norm.count);
}

// The exp head writes a NaN loss for a row it refuses (lm_head.cuh: a token's loss above 44), which
// makes the step (its update skipped) or the validation non-finite on every rank alike; then the
// run goes on with the logits and the classifier. Any other non-finite step turns it off as well.
static void exp_head_off(Run& r, int step, const char* what) {
    gpt_drop_exp_head(r.m);
    if (r.lead)
        fprintf(stderr, "warning: %s %d was non-finite with the exp LM head: the logits and the classifier (-lx 0) "
                        "from here on\n", what, step);
}

// The validation loss: the mean of the first val_sequences sequences' mean losses, the same sequences
// whatever -b and the number of GPUs. They go in batches of up to B, batch i on rank i % world.
static void validate(Run& r, int step) {
    GPT& m = r.m;
    Dist& dist = r.dist;
    const int B = r.o.B, T = r.o.T;
    double sum = 0.0;
    for (;;) {
        sum = 0.0;
        for (uint64_t first = uint64_t(B) * dist.rank; first < r.val_sequences; first += uint64_t(B) * dist.world) {
            const int rows = (int)std::min<uint64_t>(B, r.val_sequences - first);
            r.val.seek(0, first);
            r.val.next(rows, r.inputs, r.targets);
            gpt_set_batch(m, r.inputs.data(), r.targets.data(), rows, T);
            gpt_forward(m, rows, T, true, 0.0f);
            sum += double(gpt_mean_loss(m, rows, T)) * rows;
            dist_progress(dist);
        }
        sum = dp_sum(dist, sum);
        if (std::isfinite(sum) || !m.exp_head.on) break;
        exp_head_off(r, step, "validation");  // a row it refused: this validation again with the logits
    }
    r.last_val = (float)(sum / r.val_sequences);
    dist_progress(dist);
    if (!r.lead) return;
    printf("step %5d | val loss %.6f\n", step, r.last_val);
    r.logs.validation(step, r.last_val);
}

// -he: the eval file's score, examples spread over the ranks.
static void evaluate(Run& r, int step) {
    if (r.eval_examples.empty()) return;
    EvalScore s = gpt_evaluate(r.m, r.eval_examples, r.dist.rank, r.dist.world, nullptr, &r.dist);
    // (counts summed as doubles: exact below 2^53)
    s.examples = (int64_t)dp_sum(r.dist, double(s.examples)), s.correct = (int64_t)dp_sum(r.dist, double(s.correct));
    s.correct_norm = (int64_t)dp_sum(r.dist, double(s.correct_norm));
    r.last_eval = s;
    dist_progress(r.dist);
    if (!r.lead) return;
    printf("step %5d | hellaswag acc_norm %.4f acc %.4f (%lld examples)\n", step, s.acc_norm(), s.acc(), (long long)s.examples);
    r.logs.evaluation(step, s.acc_norm(), s.acc());
}

static void sample(Run& r, int step) {
    if (!r.lead) return;  // the others go on to the next step's first collective and wait there
    DistSolo solo(r.dist);
    std::vector<int> tokens = r.sample_context;
    printf("step %5d | sample:\n---\n", step);
    if (r.have_tokenizer)
        for (size_t i = 1; i < tokens.size(); i++) fputs(tokenizer_decode(r.tokenizer, tokens[i]).c_str(), stdout);
    const bool tune = blas().tune;
    blas().tune = false;  // sampling's shapes are not worth a tuning pass (the bits are the same)
    gpt_generate(r.m, tokens, r.o.gen_len, SampleOptions{r.o.temperature, r.o.top_k, 1.0f}, r.sampler, [&](int id) {
        if (r.have_tokenizer) fputs(tokenizer_decode(r.tokenizer, id).c_str(), stdout);
        else printf("%d ", id);
    });
    blas().tune = tune;
    printf("\n---\n");
}

static void checkpoint(Run& r, int step) {
    TrainState& st = r.state;
    st.step = step, st.loader_epoch = r.train.epoch, st.loader_cursor = r.train.cursor, st.sampler_rng = r.sampler.state;
    st.head = r.m.exp_head.on ? 2 : 1;
    st.outliers = r.guard.windows;
    st.fp8_history = gpt_fp8_history(r.m, &st.fp8_history_steps);
    gpt_save_checkpoint(r.m, r.o.out_dir, st);
    if (r.lead) {
        DistSolo solo(r.dist);
        prune_checkpoints(r.o.out_dir, r.o.checkpoint_keep, step);
    }
    r.last_checkpoint = step;
    dist_progress(r.dist);
}

// A stop asked by a signal on any rank: every rank takes the same decision, at the same step.
static bool stop_requested(Run& r) { return dp_sum(r.dist, int(stop_signal_received())) > 0; }

// The run's last steps, at a normal end or a stop: close the logs, then tell the other ranks this
// one is done (so that none takes its end for a failure).
static void close_run(Run& r) {
    r.logs.close();
    dp_finish(r.dist);
}

// A stop between steps: the batch read ahead goes back to the loader, so the checkpoint's data
// position is the step's.
[[noreturn]] static void stop_now(Run& r, int step) {
    if (r.staged >= 0) r.batches.rewind(), r.staged = -1;
    if (!r.o.out_dir.empty() && r.last_checkpoint != step) checkpoint(r, step);
    if (r.lead)
        printf("stopped at step %d by a signal%s\n", step,
               r.o.out_dir.empty() ? " (no -o: nothing saved)" : ": resume with the same flags and -y 1");
    close_run(r);
    exit(kExitStopped);
}

static bool validates(const Run& r, int step) { return r.o.val_every > 0 && step % r.o.val_every == 0; }
static bool samples(const Run& r, int step) { return r.o.sample_every > 0 && step > 0 && step % r.o.sample_every == 0; }
static bool checkpoints(const Run& r, int step) {
    return !r.o.out_dir.empty() && r.o.checkpoint_every > 0 && step % r.o.checkpoint_every == 0;
}

// The step's mean loss: the same value on every rank (summed over them by the backward).
static float step_mean_loss(const Run& r, const StepStats& stats) {
    return (float)(stats.loss_sum / (r.accum * r.dist.world));
}

// The outlier guard's look at a step, once a step: its mean loss and gradient norm go into the
// windows, and r.verdict says whether the update is to be skipped (returned) and why.
static bool guard_step(Run& r, const StepStats& stats) {
    r.verdict = r.guard.observe(step_mean_loss(r, stats), std::sqrt(stats.norm_squared));
    return r.verdict.skip();
}

// One optimizer step (`step` counts completed steps), enqueued without waiting on the GPU: the loss
// sum, the norm, the clipping factor and the skip decision live on the device until the one
// synchronisation at its end (with the outlier guard on, also one before the update). Each batch's
// host work (reading, grouping tokens, pinned copy) is done while the GPU runs the micro-batch
// before, this step's or the last step's; not across validation, sampling or a checkpoint, which use
// the slots or record the loader's position. Returns the step's learning rate.
static float train_step(Run& r, int step) {
    const Options& o = r.o;
    GPT& m = r.m;
    gpt_zero_grad(m);
    for (int micro = 0; micro < r.accum; micro++) {
        if (r.staged < 0) {
            r.batches.next(r.inputs, r.targets);
            r.staged = gpt_stage_batch(m, r.inputs.data(), r.targets.data(), o.B, o.T);
        }
        gpt_upload_batch(m, r.staged);
        r.staged = -1;
        // The step's loss is the mean over all its tokens, on every GPU together.
        gpt_forward(m, o.B, o.T, true, 1.0f / (float(o.B) * o.T * r.accum * r.dist.world));
        gpt_accumulate_loss(m, o.B, o.T);
        const bool last = micro + 1 == r.accum;
        gpt_backward(m, o.B, o.T, last);
        const int next = step + 1;
        if (!last || (next < o.max_steps && !checkpoints(r, next) && !validates(r, next) && !samples(r, next))) {
            if (last) r.batches.mark();
            r.batches.next(r.inputs, r.targets);
            r.staged = gpt_stage_batch(m, r.inputs.data(), r.targets.data(), o.B, o.T);
        }
    }
    gpt_grad_norm_squared(m);
    const float lr = r.schedule.at(step);
    // The outlier guard decides from the step's loss and norm: with it on, the host waits for them
    // here, before the update. A skipped update leaves the weights and AdamW's moments as they are;
    // the gradients are dropped by the next step's gpt_zero_grad. The step still counts: the next
    // update's t is its own step number, as after a non-finite step. Every rank holds the same two
    // values and so decides alike; the vote makes sure (one rank updating while another skips would
    // pair the all-gather with unlike collectives).
    if (r.guard.on() && dp_sum(r.dist, int(guard_step(r, gpt_step_stats(m)))) > 0) {
        m.profiler.mark(nullptr);  // the host's wait closes the grad-norm mark, as gpt_update would
        return lr;
    }
    AdamWConfig adam;
    adam.weight_decay = o.weight_decay;
    gpt_update(m, adam, lr, step + 1, o.grad_clip);  // writes nothing if the loss or norm is non-finite
    return lr;
}

// After a step's synchronisation: its loss and norm, what a non-finite one does, the report (which
// names an update the outlier guard skipped, and why).
static void finish_step(Run& r, int step, float lr, double ms) {
    const Options& o = r.o;
    GPT& m = r.m;
    const StepStats stats = gpt_step_stats(m);
    r.train_loss = step_mean_loss(r, stats);
    const float norm = std::sqrt(stats.norm_squared);
    if (!r.guard.on()) guard_step(r, stats);  // off: the windows still fill, for a resume with -sl or -sg
    if (!step_finite(stats)) {  // the device's decision, from the same two values (the same on every rank)
        r.bad_steps++;
        if (m.exp_head.on) exp_head_off(r, step + 1, "step");
        if (r.lead)
            fprintf(stderr, "warning: step %d: non-finite %s, update skipped\n", step + 1,
                    std::isfinite(stats.loss_sum) ? "grad norm" : "loss");
        if (r.bad_steps >= 3)
            fail("stopping at step %d: %d steps in a row had a non-finite loss or gradient norm (last good checkpoint: %s)",
                 step + 1, r.bad_steps,
                 r.last_checkpoint >= 0 ? checkpoint_path(o.out_dir, "model", r.last_checkpoint).c_str() : "none");
    } else {
        r.bad_steps = 0;
    }
    if (step > r.start_step) m.profiler.collect();  // the first step includes one-time set-up
    else m.profiler.discard();
    r.step_ms.push_back(ms);
    size_t free_b = 0, total_b = 0;
    cuda_check(cudaMemGetInfo(&free_b, &total_b));
    r.peak_used = std::max(r.peak_used, total_b - free_b);
    const double tok_s = r.total_batch / (ms * 1e-3);
    const double eta = (o.max_steps - step - 1) * ms * 1e-3;
    if (!r.lead) return;
    const std::string skipped = r.guard.reasons(r.verdict);
    printf("step %5d/%d | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s | MFU %.1f%% | ETA %s%s%s\n", step + 1,
           o.max_steps, r.train_loss, norm, lr, ms, tok_s, 100.0 * r.flops_per_token * tok_s / r.dist.world / r.peak_flops,
           format_duration(eta).c_str(), skipped.empty() ? "" : " | skipped: ", skipped.c_str());
    r.logs.train_step(step + 1, r.train_loss, lr, norm, ms, tok_s, r.guard.reasons(r.verdict, true));
}

// The training loop, from the resumed step to -x, then the last validation, sample and checkpoint.
static void train(Run& r) {
    const Options& o = r.o;
    const int start_step = r.start_step;
    double last_end = NAN;  // when the previous step's synchronisation returned
    for (int step = start_step; step < o.max_steps; step++) {
        if (stop_requested(r)) stop_now(r, step);
        const bool interrupted = validates(r, step) || samples(r, step) || checkpoints(r, step);  // (the last step ended with one)
        if (validates(r, step)) validate(r, step), evaluate(r, step);
        if (samples(r, step)) sample(r, step);
        // A step's time runs from the previous step's end (its printing and logging included), or from
        // here after validation, sampling or a checkpoint, to its own synchronisation.
        const double t0 = interrupted || std::isnan(last_end) ? now_seconds() : last_end;
        r.m.profiler.discard();
        // With -pf 1 a profiler started with --profile-from-start off (ncu, scripts/profile_step.sh)
        // sees exactly one steady step: the last.
        const bool profiled_step = o.profile && step + 1 == o.max_steps && step > start_step;
        if (profiled_step) cuda_check(cudaProfilerStart());
        const float lr = train_step(r, step);
        cuda_check(cudaDeviceSynchronize());
        if (profiled_step) cuda_check(cudaProfilerStop());
        last_end = now_seconds();
        dist_progress(r.dist);
        finish_step(r, step, lr, (last_end - t0) * 1e3);
        if (checkpoints(r, step + 1)) checkpoint(r, step + 1);
    }
    if (stop_requested(r)) stop_now(r, o.max_steps);
    if (o.val_every > 0) validate(r, o.max_steps);
    evaluate(r, o.max_steps);
    if (o.sample_every > 0) sample(r, o.max_steps);
    if (!o.out_dir.empty() && r.last_checkpoint != o.max_steps) checkpoint(r, o.max_steps);
}

// Median step time after warm-up (the first steps include cuBLAS heuristics and caches).
static void report(const Run& r, double start) {
    if (!r.lead) return;
    std::vector<double> steady(r.step_ms.begin() + std::min<size_t>(r.step_ms.size() / 4, 5), r.step_ms.end());
    std::sort(steady.begin(), steady.end());
    const double median_ms = steady.empty() ? NAN : steady[steady.size() / 2];
    char val_text[32] = "-";  // no validation ran (-v 0)
    if (!std::isnan(r.last_val)) snprintf(val_text, sizeof(val_text), "%.6f", r.last_val);
    printf("done: %d steps in %s | final train loss %.6f | val loss %s | median step %.1f ms = %.0f tok/s | "
           "peak GPU memory %.2f GiB%s\n",
           (int)r.step_ms.size(), format_duration(now_seconds() - start).c_str(), r.train_loss, val_text, median_ms,
           r.total_batch / (median_ms * 1e-3), r.peak_used / 1073741824.0, r.dist.multi() ? " (rank 0)" : "");
    if (r.m.fp8.on) {
        const bool ln_delayed = r.m.fp8.delayable == kNumDelayed;
        printf("FP8 delayed scales: %d of %lld tensor-steps saturated (a tensor past its scale's range: atty, GELU's output, "
               "fch's gradient, dqkv%s of each block, each step that had a history)%s\n",
               gpt_fp8_saturated(r.m), (long long)r.m.fp8.delayed_casts, ln_delayed ? ", ln1 and ln2" : "",
               ln_delayed ? "" : ("; ln1 and ln2 on current scaling, " + fp8_layernorm_refusal(16, r.m.config.C)).c_str());
    }
    if (r.m.settings.gelu_fusion > 0)
        printf("GELU fusion: %zu matmuls ran with a cuBLASLt GELU epilogue, %zu took the GELU kernels (no epilogue "
               "algorithm for their shape)\n", blas().gelu_fused, blas().gelu_unfused);
    r.m.profiler.report();
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    std::set_new_handler(fail_out_of_host_memory);
    Run r;
    r.o = parse_options(argc, argv);
    dist_from_env(r.dist);
    r.lead = r.dist.rank == 0;
    dp_check_build(r.dist);

    // 1. Validate every input on the host. Nothing touches the GPU, and nothing is written, before
    // every flag, file and folder has been checked.
    plan_batch(r);
    find_checkpoint(r);
    choose_model(r);
    open_data(r);
    open_tokenizer(r);
    plan_outlier_guard(r);
    meet_ranks(r, argc, argv);
    // A descriptor's random init (seconds for d12) waits until every other input has been checked.
    if (r.fresh_init) r.host = random_init(r.host.config, (uint64_t)r.o.seed);

    // 2. The GPU. Until here a signal ends the program the default way (nothing has been written);
    // from here on it stops the training loop after the step in progress.
    stop_signals_catch_blocked();
    open_gpu(r);
    stop_signals_unblock();
    restore_state(r);
    print_setup(r);
    if (!r.o.out_dir.empty() && r.lead) r.logs.open(r.o.out_dir);

    // 3. Train.
    const double start = now_seconds();
    train(r);
    report(r, start);
    close_run(r);
    gpt_free(r.m);
    return 0;
}
#endif
