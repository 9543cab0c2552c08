// train_gpt.cu: GPT-2 training on one GPU or several (one process each), in one file.
//
// Reads top to bottom: model config and checkpoint format, parameter and activation buffers (one flat
// device buffer each, carved into named tensors), forward, backward, AdamW update, data loader,
// checkpoints, generation, command line, training loop. Each kernel family lives in its own header
// (encoder, layernorm, matmul, attention, classifier, adamw); several GPUs in distributed.cuh.
//
// Precision is a build option: train_gpt_fp32 (everything fp32, cuBLAS without TF32) and
// train_gpt_bf16 (bf16 parameters, gradients and activations; fp32 master weights, AdamW state,
// LayerNorm statistics, softmax and loss).
//
// A training step never waits on the GPU: batches go up from pinned staging buffers, the loss is
// summed on the device, and AdamW clips (or skips a non-finite step) from device values. The host
// synchronises once, at the end of the step, and only then reads the loss and gradient norm.
//
// Nothing touches the GPU before every input (flags, token files, tokenizer, checkpoints, output
// folder) has been validated, so bad input fails with one line and exit code 1 even without a GPU.
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda_profiler_api.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
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
#include "classifier.cuh"
#if !defined(ENABLE_FP32)
#include "lm_head.cuh"
#endif
#include "common.cuh"
#include "distributed.cuh"
#include "encoder.cuh"
#include "fileio.h"
#include "flash_attention.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"
#include "tokenizer.h"

// ---------------------------------------------------------------------------------------------
// Model config and the checkpoint format (shared with gpt_reference.py, which documents it too):
// 256 int32 header {magic 20251101, version 1, L, NH, C, maxT, V, Vp, crc32 (0 = none), 0...} then
// every parameter as fp32 in PARAM_NAMES order, per-layer tensors stacked over layers.

constexpr int CHECKPOINT_MAGIC = 20251101, CHECKPOINT_VERSION = 1;
constexpr int STATE_MAGIC = 20251103, STATE_VERSION = 2;
constexpr int HEADER_INTS = 256;

struct GPTConfig {
    int L = 0, NH = 0, C = 0, maxT = 0, V = 0, Vp = 0;  // layers, heads, channels, max sequence, vocab, padded vocab
};

inline int padded_vocab(int V) { return (V + 127) / 128 * 128; }  // 50257 -> 50304: whole matmul tiles

// Returns "" when valid, else what is wrong. Limits keep every size below 2^31 elements per tensor.
inline std::string config_error(const GPTConfig& c) {
    char buf[256];
    if (c.L < 1 || c.L > 1024 || c.NH < 1 || c.C < 1 || c.C > 65536 || c.maxT < 1 || c.maxT > 65536 || c.V < 1 ||
        c.V > 1 << 20 || c.Vp < c.V || c.Vp > (1 << 20) + 128 || c.C % c.NH != 0) {
        snprintf(buf, sizeof(buf), "invalid model config L=%d NH=%d C=%d maxT=%d V=%d Vp=%d", c.L, c.NH, c.C, c.maxT, c.V,
                 c.Vp);
        return buf;
    }
    // The largest tensors: fcw and fcprojw (L x 4C x C), wte (Vp x C), wpe (maxT x C).
    const uint64_t largest = std::max({uint64_t(c.L) * 4 * c.C * c.C, uint64_t(c.Vp) * c.C, uint64_t(c.maxT) * c.C});
    if (largest >= uint64_t(1) << 31) {
        snprintf(buf, sizeof(buf), "model config L=%d NH=%d C=%d maxT=%d V=%d Vp=%d: a tensor of %llu elements, the limit is 2^31",
                 c.L, c.NH, c.C, c.maxT, c.V, c.Vp, (unsigned long long)largest);
        return buf;
    }
    return "";
}

constexpr int NUM_PARAM_TENSORS = 16;
const char* const PARAM_NAMES[NUM_PARAM_TENSORS] = {"wte",      "wpe",      "ln1w", "ln1b", "qkvw",    "qkvb",
                                                    "attprojw", "attprojb", "ln2w", "ln2b", "fcw",     "fcb",
                                                    "fcprojw",  "fcprojb",  "lnfw", "lnfb"};
// Matrices and embeddings get weight decay; biases and LayerNorm parameters do not.
constexpr unsigned PARAM_DECAY_MASK = (1u << 0) | (1u << 1) | (1u << 4) | (1u << 6) | (1u << 10) | (1u << 12);

inline void param_sizes(const GPTConfig& c, size_t sizes[NUM_PARAM_TENSORS]) {
    const size_t L = c.L, C = c.C;
    const size_t s[NUM_PARAM_TENSORS] = {size_t(c.Vp) * C, size_t(c.maxT) * C, L * C, L * C, L * 3 * C * C, L * 3 * C,
                                         L * C * C, L * C, L * C, L * C, L * 4 * C * C, L * 4 * C,
                                         L * C * 4 * C, L * C, C, C};
    std::copy(s, s + NUM_PARAM_TENSORS, sizes);
}

inline size_t num_parameters(const GPTConfig& c) {
    size_t sizes[NUM_PARAM_TENSORS], n = 0;
    param_sizes(c, sizes);
    for (size_t s : sizes) n += s;
    return n;
}

// The model on the host, as read from a checkpoint or made by random init: fp32 parameters.
struct HostModel {
    GPTConfig config;
    std::vector<float> params;
};

// GPT-2 descriptors: d12 is GPT-2 124M, d24 350M, d36 774M, d48 1558M; d6 a small one for quick runs.
inline bool config_from_descriptor(const std::string& d, GPTConfig& c) {
    struct { const char* name; int L, NH, C; } table[] = {
        {"d6", 6, 6, 384}, {"d12", 12, 12, 768}, {"d24", 24, 16, 1024}, {"d36", 36, 20, 1280}, {"d48", 48, 25, 1600}};
    for (auto& t : table)
        if (d == t.name) {
            c.L = t.L, c.NH = t.NH, c.C = t.C, c.maxT = 1024, c.V = 50257, c.Vp = padded_vocab(50257);
            return true;
        }
    return false;
}

// GPT-2's init: N(0, 0.02) for matrices and embeddings, N(0, 0.02 / sqrt(2L)) for the two residual
// projections (attprojw, fcprojw), LayerNorm weights 1, every bias 0, padded vocabulary rows 0.
inline HostModel random_init(const GPTConfig& c, uint64_t seed) {
    HostModel m{c, std::vector<float>(num_parameters(c), 0.0f)};
    size_t sizes[NUM_PARAM_TENSORS];
    param_sizes(c, sizes);
    Rng rng(seed);
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        float* p = m.params.data() + offset;
        const std::string name = PARAM_NAMES[i];
        if ((PARAM_DECAY_MASK >> i) & 1u) {
            const float std = (name == "attprojw" || name == "fcprojw") ? 0.02f / std::sqrt(2.0f * c.L) : 0.02f;
            const size_t n = name == "wte" ? size_t(c.V) * c.C : sizes[i];  // padding rows stay 0
            for (size_t j = 0; j < n; j++) p[j] = rng.normal() * std;
        } else if (name == "ln1w" || name == "ln2w" || name == "lnfw") {
            std::fill(p, p + sizes[i], 1.0f);
        }
        offset += sizes[i];
    }
    return m;
}

inline uint32_t header_and_payload_crc(const int32_t* header, int crc_slot, const void* payload, size_t bytes) {
    std::vector<int32_t> h(header, header + HEADER_INTS);
    h[crc_slot] = 0;
    return crc32(payload, bytes, crc32(h.data(), h.size() * sizeof(int32_t)));
}

// llm.c's model files (its train_gpt2.cu and the files its scripts write, e.g. gpt2_124M.bin): 256 int32
// header {magic 20240326, version 3 (fp32 parameters) or 5 (bf16), maxT, V, L, NH, C, Vp, 0...}, then
// the parameters in the same order and shapes as ours, no checksum.
constexpr int LLMC_MODEL_MAGIC = 20240326, LLMC_MODEL_FP32 = 3, LLMC_MODEL_BF16 = 5;

// Reads and validates a model file: ours (magic 20251101) or llm.c's. On any problem returns false
// with *error set (resume skips a bad checkpoint; a model given by -e is fatal). The header's config
// is checked against the file's size before anything is allocated. A crc32 of 0 means "not recorded".
inline bool read_checkpoint(const std::string& path, HostModel& m, std::string* error) {
    InputFile f;
    if (!f.open_file(path, error)) return false;
    int32_t h[HEADER_INTS];
    if (f.size < sizeof(h)) {
        *error = "checkpoint '" + path + "' is truncated (" + std::to_string(f.size) + " bytes, no complete header)";
        return false;
    }
    if (!f.read_at(0, h, sizeof(h), error)) return false;
    const bool llmc = h[0] == LLMC_MODEL_MAGIC;
    if (!llmc && h[0] != CHECKPOINT_MAGIC) {
        *error = "'" + path + "' is not a model checkpoint (bad magic " + std::to_string(h[0]) + ", expected " +
                 std::to_string(CHECKPOINT_MAGIC) + ", or llm.c's " + std::to_string(LLMC_MODEL_MAGIC) + ")";
        return false;
    }
    if (llmc ? (h[1] != LLMC_MODEL_FP32 && h[1] != LLMC_MODEL_BF16) : h[1] != CHECKPOINT_VERSION) {
        *error = (llmc ? "llm.c model file '" : "checkpoint '") + path + "' has version " + std::to_string(h[1]) + ", expected " +
                 (llmc ? "3 (fp32) or 5 (bf16)" : std::to_string(CHECKPOINT_VERSION));
        return false;
    }
    const GPTConfig c = llmc ? GPTConfig{h[4], h[5], h[6], h[2], h[3], h[7]} : GPTConfig{h[2], h[3], h[4], h[5], h[6], h[7]};
    const std::string bad = config_error(c);
    if (!bad.empty()) {
        *error = "checkpoint '" + path + "': " + bad;
        return false;
    }
    const size_t n = num_parameters(c), width = llmc && h[1] == LLMC_MODEL_BF16 ? 2 : 4;
    const uint64_t expected = sizeof(h) + uint64_t(n) * width;
    if (f.size != expected) {
        *error = "checkpoint '" + path + "' has " + std::to_string(f.size) + " bytes, expected " + std::to_string(expected) +
                 " for its config (truncated or corrupt)";
        return false;
    }
    m.config = c;
    m.params.resize(n);
    if (width == 4) {
        if (!f.read_at(sizeof(h), m.params.data(), n * sizeof(float), error)) return false;
    } else {  // bf16 -> fp32 is exact: the bf16 bits are the top half of the float's
        std::vector<uint16_t> half(n);
        if (!f.read_at(sizeof(h), half.data(), n * sizeof(uint16_t), error)) return false;
        for (size_t i = 0; i < n; i++) {
            const uint32_t bits = uint32_t(half[i]) << 16;
            memcpy(&m.params[i], &bits, sizeof(bits));
        }
    }
    if (!llmc && h[8] != 0 && (uint32_t)h[8] != header_and_payload_crc(h, 8, m.params.data(), n * sizeof(float))) {
        *error = "checkpoint '" + path + "' fails its checksum (corrupt)";
        return false;
    }
    for (size_t i = 0; i < n; i++)
        if (!std::isfinite(m.params[i])) {
            *error = "checkpoint '" + path + "' holds a non-finite parameter at index " + std::to_string(i);
            return false;
        }
    return true;
}

// ---------------------------------------------------------------------------------------------
// Parameters: one flat buffer of floatX, carved into the 16 named tensors (gradients alike).

struct ParameterTensors {
    floatX* wte;       // (Vp, C)
    floatX* wpe;       // (maxT, C)
    floatX* ln1w;      // (L, C)
    floatX* ln1b;      // (L, C)
    floatX* qkvw;      // (L, 3C, C)
    floatX* qkvb;      // (L, 3C)
    floatX* attprojw;  // (L, C, C)
    floatX* attprojb;  // (L, C)
    floatX* ln2w;      // (L, C)
    floatX* ln2b;      // (L, C)
    floatX* fcw;       // (L, 4C, C)
    floatX* fcb;       // (L, 4C)
    floatX* fcprojw;   // (L, C, 4C)
    floatX* fcprojb;   // (L, C)
    floatX* lnfw;      // (C)
    floatX* lnfb;      // (C)
};
static_assert(sizeof(ParameterTensors) == NUM_PARAM_TENSORS * sizeof(floatX*), "one pointer per tensor");

inline ParameterTensors point_parameters(floatX* base, const size_t sizes[NUM_PARAM_TENSORS]) {
    ParameterTensors t;
    floatX** ptrs = reinterpret_cast<floatX**>(&t);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) ptrs[i] = base, base += sizes[i];
    return t;
}

// ---------------------------------------------------------------------------------------------
// Activations: one flat floatX buffer and one flat fp32 buffer (statistics, losses), carved into
// named tensors. Per-layer tensors are (L, ...) so the backward finds each layer's forward values.

struct ActivationTensors {
    floatX* encoded;    // (B, T, C)     token + position embedding
    floatX* ln1;        // (L, B, T, Cp) LayerNorm 1 output, rows of Cp = ln_ld(C): C values, a one, zeros (see ln_ld)
    floatX* qkv;        // (L, B, T, 3C)
    floatX* atty;       // (L, B, T, C)  attention output before the projection
    floatX* att;        // (L, B, NH, T, T) softmax probabilities (cuBLAS attention only; flash keeps attn_lse)
    floatX* residual2;  // (L, B, T, C)  residual after attention: x + attproj, written by attproj's matmul
    floatX* ln2;        // (L, B, T, Cp) as ln1
    floatX* fch;        // (L, B, T, 4C) MLP hidden, before GELU
    floatX* fch_gelu;   // (L, B, T, 4C) GELU output; with recompute (-r 1) one (B, T, 4C) buffer, rewritten per layer
    floatX* residual3;  // (L, B, T, C)  residual after the MLP = input of the next layer, written by fcproj's matmul
    floatX* lnf;        // (B, T, C)
    floatX* logits;     // (min(B T, kLogitsChunkRows), Vp): one chunk of rows' logits at a time, overwritten by
                        //               dlogits when the forward is given a dloss; dead after the LM head's
                        //               backward, so the attention backward borrows it (GPT::flash_ds)
    floatX* qkvr;       // (3, B, NH, T, HS) scratch: q, k, v per head
    floatX* yr;         // (B, NH, T, HS) scratch: attention output per head (dy per head in the backward)
    // backward scratch
    floatX* dresidual;  // (B, T, C)     gradient of the residual stream
    floatX* dln;        // (B, T, C)     gradient of a LayerNorm output / of atty
    floatX* dbig;       // (B, T, 4C)    gradient of fch_gelu / fch, then of qkv
    floatX* dqkvr;      // (3, B, NH, T, HS)
    floatX* datt;       // (B, NH, T, T)
};
constexpr int NUM_ACT_TENSORS = sizeof(ActivationTensors) / sizeof(floatX*);

struct StatTensors {
    float* ln1_mean;  // (L, B, T)
    float* ln1_rstd;  // (L, B, T)
    float* ln2_mean;  // (L, B, T)
    float* ln2_rstd;  // (L, B, T)
    float* lnf_mean;  // (B, T)
    float* lnf_rstd;  // (B, T)
    float* losses;    // (B, T)
    float* attn_lse;  // (L, B, NH, T) flash attention's log-sum-exp per query (flash only)
};
constexpr int NUM_STAT_TENSORS = sizeof(StatTensors) / sizeof(float*);

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
// With recompute (GELU recomputed in the backward) fch_gelu holds one layer, not L.
inline void activation_sizes(const GPTConfig& c, int B, int T, bool flash, bool recompute, size_t act[NUM_ACT_TENSORS],
                             size_t stat[NUM_STAT_TENSORS]) {
    const size_t L = c.L, BT = size_t(B) * T, C = c.C, NH = c.NH, TT = flash ? 0 : size_t(T) * T, heads = flash ? 0 : 1;
    const size_t LG = recompute ? 1 : L;  // layers of fch_gelu kept
    const size_t Cp = ln_ld(c.C);           // ln1, ln2: rows with their column of ones
    const size_t a[NUM_ACT_TENSORS] = {BT * C,     L * BT * Cp,    L * BT * 3 * C, L * BT * C,     L * B * NH * TT,
                                       L * BT * C, L * BT * Cp,    L * BT * 4 * C, LG * BT * 4 * C, L * BT * C,
                                       BT * C,     logits_rows(BT) * c.Vp, heads * 3 * BT * C, heads * BT * C,
                                       BT * C,     BT * C,         BT * 4 * C,     heads * 3 * BT * C, size_t(B) * NH * TT};
    const size_t s[NUM_STAT_TENSORS] = {L * BT, L * BT, L * BT, L * BT, BT, BT, BT, flash ? L * NH * BT : 0};
    std::copy(a, a + NUM_ACT_TENSORS, act);
    std::copy(s, s + NUM_STAT_TENSORS, stat);
}

// Carves `base` into tensors, each start rounded up to 16 bytes so every tensor can take the
// vectorized kernel paths. Returns the bytes used (pass base = nullptr to size the buffer).
template <typename P> size_t carve(P** views, int count, P* base, const size_t* sizes) {
    size_t offset = 0;  // in elements
    for (int i = 0; i < count; i++) {
        offset = (offset + 16 / sizeof(P) - 1) / (16 / sizeof(P)) * (16 / sizeof(P));
        views[i] = base ? base + offset : nullptr;
        offset += sizes[i];
    }
    return offset * sizeof(P);
}

// ---------------------------------------------------------------------------------------------
// The model on the device.

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

struct GPT {
    GPTConfig config;
    size_t param_sizes[NUM_PARAM_TENSORS];
    size_t num_params = 0;
    ParameterTensors params, grads;
    floatX* params_memory = nullptr;
    floatX* grads_memory = nullptr;
    // Data parallel (ZeRO stage 1): the optimizer state of elements [shard_lo, shard_hi) of the flat
    // parameter vector lives on this rank only; with one GPU the shard is everything. params_memory and
    // grads_memory hold world * shard_size elements (the tail past num_params is padding), so the
    // updated shards are all-gathered in place.
    Dist* dist = nullptr;
    bool inference = false;  // set before gpt_create: forward only (generation), no gradients or optimizer state
    size_t shard_lo = 0, shard_hi = 0;
    float* master = nullptr;  // (shard) fp32 master weights (bf16 builds only)
    float* adam_m = nullptr;  // (shard)
    float* adam_v = nullptr;  // (shard)
    cudaEvent_t grads_ready = nullptr, wgrads_ready = nullptr, reduced = nullptr;  // gradient all-reduce ordering
    int B = 0, T = 0;  // the largest batch the buffers hold
    ActivationTensors acts;
    StatTensors stats;
    floatX* acts_memory = nullptr;
    float* stats_memory = nullptr;
    void* ln_scratch = nullptr;
    float* wgrad_scratch = nullptr;  // (4C, ln_ld(C)) fp32: qkv's and fc's weight and bias gradients, one GEMM each
    bool flash = false;             // attention through flash_attention.cuh (bf16 builds, head sizes it takes)
    void* flash_scratch = nullptr;  // its backward's scratch (D)
    void* flash_ds = nullptr;       // room for its backward's dS tiles: acts.logits where that is big enough
    size_t flash_ds_bytes = 0;
    void* flash_ds_memory = nullptr;  // else its own allocation
    int gelu_fusion = 0;            // GELU in cuBLASLt epilogues: 0 none, 1 forward, 2 forward and backward (-ge)
    int recompute = 0;              // 1: fch_gelu holds one layer, the backward recomputes it from fch (-r)
    // The exp head (-lx 1, lm_head.cuh): the LM head's GEMM writes exp(logit - target logit) and the
    // classifier reads only its row sums. Its scratch, one logits chunk's rows:
    bool exp_head = false;
    float* head_shift = nullptr;  // (rows) each row's target logit
    float* head_sums = nullptr;   // (rows, lm_head_tiles(Vp)) each row's sums of exp by column tile
    float* head_scale = nullptr;  // (rows) dloss / (the row's sum)
    floatX* head_x = nullptr;     // (rows, C) lnf's rows times their scale, for wte's gradient
    // -ov 1: the backward's weight gradients (dweight, and dbias where a matmul computes it) run on
    // their own stream beside the chain of data gradients (gpt_backward). The events order the two.
    bool overlap = false;
    cudaStream_t wgrad_stream = nullptr;
    cudaEvent_t wgrad_fork = nullptr;
    cudaEvent_t wgrad_done[4] = {};
    floatX* dqkv = nullptr;         // (B, T, 3C) gradient of qkv: acts.dbig, or with -ov 1 a buffer of its own
    floatX* dqkv_memory = nullptr;  // (the logits' tail where it fits, else this allocation)
    StepStats* step = nullptr;  // (1) the current step's loss sum and squared gradient norm
    float* norm_partials = nullptr;
    double* loss_scratch = nullptr;  // (1) gpt_mean_loss's sum
    int* inputs = nullptr;   // (B, T) device
    int* targets = nullptr;  // (B, T) device
    int* buckets = nullptr;  // encoder-backward work of the current batch: its slot's buckets.packed on the device
    float* encoder_partials = nullptr;  // encoder backward's fp32 partial rows of split tokens
    BatchSlot batch_slots[kBatchSlots];  // pinned staging of the last kBatchSlots batches (gpt_set_batch)
    int next_batch_slot = 0;
    int batch_slot = 0;  // the slot of the batch on the device (its buckets drive the encoder backward)
    size_t bytes_allocated = 0;
};

template <typename P> P* gpt_alloc(GPT& m, size_t bytes, const char* what) {
    m.bytes_allocated += bytes;
    return static_cast<P*>(device_malloc(std::max<size_t>(bytes, 16), what));
}

// Uploads fp32 parameters (from a checkpoint or init) into the storage type, and the master copy.
__global__ void convert_params_kernel(floatX* out, const float* in, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        out[i] = from_float<floatX>(in[i]);
}

// True where flash attention can run: bf16 builds, head sizes with its tensor-core path.
inline bool flash_attention_usable(const GPTConfig& c) {
    return std::is_same<floatX, __nv_bfloat16>::value && flash_attention_supported(c.C / c.NH);
}

// GELU fusion by default: in bf16 builds forward and backward (-ge 2: fewer passes over (B, T, 4C)
// tensors). fp32 builds are the exact reference (PyTorch to ~1e-6): their GELU stays our tanhf
// kernel, not the epilogue's undocumented arithmetic, and their speed is not the point.
constexpr int GELU_FUSION_DEFAULT = std::is_same<floatX, float>::value ? 0 : 2;
// Every activation kept by default: speed first; d12 fits at B=64 on an 80 GB GPU (see -r in -h).
constexpr int RECOMPUTE_DEFAULT = 0;
// Weight gradients on a second stream by default: the same kernels and the same bits, overlapped.
constexpr int OVERLAP_DEFAULT = 1;

// use_flash: take flash attention where usable (else the cuBLAS attention of attention.cuh).
// gelu_fusion, recompute, overlap: as -ge, -r and -ov of train_gpt.
inline void gpt_create(GPT& m, const HostModel& host, int B, int T, bool use_flash = true,
                       int gelu_fusion = GELU_FUSION_DEFAULT, int recompute = RECOMPUTE_DEFAULT,
                       int overlap = OVERLAP_DEFAULT) {
    m.config = host.config;
    m.B = B, m.T = T;
    m.flash = use_flash && flash_attention_usable(m.config);
    m.gelu_fusion = gelu_fusion, m.recompute = recompute, m.overlap = overlap != 0;
    param_sizes(m.config, m.param_sizes);
    m.num_params = num_parameters(m.config);
    const size_t np = m.num_params;
    const int world = m.dist ? m.dist->world : 1, rank = m.dist ? m.dist->rank : 0;
    const size_t padded = shard_size(np, world) * world, shard = shard_size(np, world);
    m.shard_lo = shard_begin(np, world, rank), m.shard_hi = shard_end(np, world, rank);
    m.params_memory = gpt_alloc<floatX>(m, padded * sizeof(floatX), "parameters");
    m.params = point_parameters(m.params_memory, m.param_sizes);
    cuda_check(cudaMemset(m.params_memory, 0, padded * sizeof(floatX)));
    if (!m.inference) {
        m.grads_memory = gpt_alloc<floatX>(m, padded * sizeof(floatX), "gradients");
        m.grads = point_parameters(m.grads_memory, m.param_sizes);
        m.adam_m = gpt_alloc<float>(m, shard * sizeof(float), "AdamW first moments");
        m.adam_v = gpt_alloc<float>(m, shard * sizeof(float), "AdamW second moments");
        cuda_check(cudaMemset(m.adam_m, 0, shard * sizeof(float)));
        cuda_check(cudaMemset(m.adam_v, 0, shard * sizeof(float)));
        cuda_check(cudaMemset(m.grads_memory, 0, padded * sizeof(floatX)));
    }
    float* staging = static_cast<float*>(device_malloc(np * sizeof(float), "parameter upload"));
    cuda_check(cudaMemcpy(staging, host.params.data(), np * sizeof(float), cudaMemcpyHostToDevice));
    convert_params_kernel<<<1024, 256>>>(m.params_memory, staging, np);
    cuda_check_launch();
    if (sizeof(floatX) == sizeof(float) || m.inference) {
        cuda_check(cudaFree(staging));
    } else if (world == 1) {  // the master weights are the upload itself
        m.master = staging, m.bytes_allocated += np * sizeof(float);
    } else {  // this rank's shard of them
        m.master = gpt_alloc<float>(m, shard * sizeof(float), "fp32 master weights");
        cuda_check(cudaMemset(m.master, 0, shard * sizeof(float)));
        cuda_check(cudaMemcpy(m.master, staging + m.shard_lo, (m.shard_hi - m.shard_lo) * sizeof(float), cudaMemcpyDeviceToDevice));
        cuda_check(cudaFree(staging));
    }
    if (world > 1)
        for (cudaEvent_t* e : {&m.grads_ready, &m.wgrads_ready, &m.reduced}) cuda_check(cudaEventCreateWithFlags(e, cudaEventDisableTiming));

    size_t act_sizes[NUM_ACT_TENSORS], stat_sizes[NUM_STAT_TENSORS];
    activation_sizes(m.config, B, T, m.flash, m.recompute != 0, act_sizes, stat_sizes);
    floatX** act_views = reinterpret_cast<floatX**>(&m.acts);
    float** stat_views = reinterpret_cast<float**>(&m.stats);
    m.acts_memory = gpt_alloc<floatX>(m, carve<floatX>(act_views, NUM_ACT_TENSORS, nullptr, act_sizes), "activations");
    carve<floatX>(act_views, NUM_ACT_TENSORS, m.acts_memory, act_sizes);
    m.stats_memory = gpt_alloc<float>(m, carve<float>(stat_views, NUM_STAT_TENSORS, nullptr, stat_sizes), "LayerNorm statistics and losses");
    carve<float>(stat_views, NUM_STAT_TENSORS, m.stats_memory, stat_sizes);

    const int BT = B * T, NH = m.config.NH, HS = m.config.C / NH;
    m.ln_scratch = gpt_alloc<void>(m, layernorm_backward_scratch_bytes(BT, m.config.C), "LayerNorm backward scratch");
    const int C = m.config.C, Cp = ln_ld(C);
    m.wgrad_scratch = gpt_alloc<float>(m, size_t(4) * C * Cp * sizeof(float), "weight and bias gradient scratch");
    for (floatX* ln : {m.acts.ln1, m.acts.ln2}) {
        fill_ones_column_kernel<<<1024, 256>>>(ln, size_t(m.config.L) * BT, C, Cp);
        cuda_check_launch();
    }
    // The logits buffer holds nothing live between the LM head's backward and the next forward: the
    // backward borrows it. With -ov 1 qkv's gradient takes its tail (the weight stream reads it while
    // the data gradients go on in dbig), where that leaves room for flash attention's dS.
    const size_t logits_bytes = logits_rows(BT) * m.config.Vp * sizeof(floatX);
    const size_t ds_bytes = m.flash ? flash_attention_backward_ds_bytes(B, T, NH, HS) : 0;
    const size_t dqkv_bytes = size_t(BT) * 3 * m.config.C * sizeof(floatX);
    size_t logits_lent = logits_bytes;  // bytes at the start of the logits buffer left for dS
    m.dqkv = m.acts.dbig;
    if (m.overlap) {
        const size_t tail = dqkv_bytes <= logits_bytes ? (logits_bytes - dqkv_bytes) / 256 * 256 : 0;
        if (dqkv_bytes <= logits_bytes && ds_bytes <= tail)
            m.dqkv = reinterpret_cast<floatX*>(reinterpret_cast<char*>(m.acts.logits) + tail), logits_lent = tail;
        else
            m.dqkv = m.dqkv_memory = gpt_alloc<floatX>(m, dqkv_bytes, "qkv gradient");
        cuda_check(cudaStreamCreateWithFlags(&m.wgrad_stream, cudaStreamNonBlocking));
        cuda_check(cudaEventCreateWithFlags(&m.wgrad_fork, cudaEventDisableTiming));
        for (cudaEvent_t& e : m.wgrad_done) cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    if (m.flash) {
        m.flash_scratch = gpt_alloc<void>(m, flash_attention_backward_scratch_bytes(B, T, NH, HS), "flash attention scratch");
        // dS lets the attention backward skip recomputing the scores for dq (flash_attention.cuh).
        if (ds_bytes <= logits_lent) m.flash_ds = m.acts.logits, m.flash_ds_bytes = logits_lent;
        else m.flash_ds = m.flash_ds_memory = gpt_alloc<void>(m, ds_bytes, "flash attention dS"), m.flash_ds_bytes = ds_bytes;
    }
    m.step = gpt_alloc<StepStats>(m, sizeof(StepStats), "step loss and gradient norm");
    cuda_check(cudaMemset(m.step, 0, sizeof(StepStats)));
    m.norm_partials = gpt_alloc<float>(m, kNormBlocks * sizeof(float), "gradient norm partials");
    m.loss_scratch = gpt_alloc<double>(m, sizeof(double), "mean loss");
    m.inputs = gpt_alloc<int>(m, BT * sizeof(int), "inputs");
    m.targets = gpt_alloc<int>(m, BT * sizeof(int), "targets");
    m.buckets = gpt_alloc<int>(m, encoder_backward_work_ints(BT) * sizeof(int), "encoder buckets");
    m.encoder_partials = gpt_alloc<float>(m, encoder_backward_partials_bytes(BT, m.config.C), "encoder backward partials");
    for (BatchSlot& slot : m.batch_slots) {
        cuda_check(cudaMallocHost(&slot.host, (2 * size_t(BT) + encoder_backward_work_ints(BT)) * sizeof(int)));
        cuda_check(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
    }
    blas_init(std::max<size_t>(BT, 1));
    cuda_check(cudaDeviceSynchronize());
}

// Where the exp head (lm_head.cuh) runs: bf16 builds on Hopper, C and Vp multiples of 8.
inline bool gpt_exp_head_usable(const GPT& m) {
#if defined(ENABLE_FP32)
    return false;
#else
    return lm_head_exp_usable(m.config.C, m.config.Vp);
#endif
}

// Takes the exp head where it runs. Returns whether the model now takes it; its scratch is sized for
// gpt_create's B and T.
inline bool gpt_use_exp_head(GPT& m) {
#if defined(ENABLE_FP32)
    return false;
#else
    if (!gpt_exp_head_usable(m)) return false;
    if (!m.head_shift) {
        const size_t rows = logits_rows(size_t(m.B) * m.T);
        m.head_shift = gpt_alloc<float>(m, rows * sizeof(float), "LM head target logits");
        m.head_sums = gpt_alloc<float>(m, rows * lm_head_tiles(m.config.Vp) * sizeof(float), "LM head row sums");
        m.head_scale = gpt_alloc<float>(m, rows * sizeof(float), "LM head row scales");
        m.head_x = gpt_alloc<floatX>(m, rows * m.config.C * sizeof(floatX), "LM head scaled input");
    }
    m.exp_head = true;
    return true;
#endif
}

// Back to the logits and the classifier for good, mid-run: the exp head's scratch is freed
// (bytes_allocated, the start-up figure, keeps counting it).
inline void gpt_drop_exp_head(GPT& m) {
    for (void* p : {(void*)m.head_shift, (void*)m.head_sums, (void*)m.head_scale, (void*)m.head_x})
        if (p) cuda_check(cudaFree(p));
    m.head_shift = m.head_sums = m.head_scale = nullptr, m.head_x = nullptr;
    m.exp_head = false;
}

inline void gpt_free(GPT& m) {
    for (void* p : std::initializer_list<void*>{m.params_memory, m.grads_memory, m.master, m.adam_m, m.adam_v, m.acts_memory,
                                                m.stats_memory, m.ln_scratch, m.wgrad_scratch, m.flash_scratch, m.flash_ds_memory, m.step,
                                                m.norm_partials, m.loss_scratch, m.inputs, m.targets, m.buckets,
                                                m.encoder_partials, (void*)m.dqkv_memory, m.head_shift, m.head_sums,
                                                m.head_scale, (void*)m.head_x})
        if (p) cuda_check(cudaFree(p));
    for (BatchSlot& slot : m.batch_slots) {
        if (slot.host) cuda_check(cudaFreeHost(slot.host));
        if (slot.copied) cuda_check(cudaEventDestroy(slot.copied));
    }
    blas_destroy();  // before the weight stream: one of its cuBLAS handles is bound to it
    if (m.wgrad_stream) cuda_check(cudaStreamDestroy(m.wgrad_stream));
    if (m.wgrad_fork) cuda_check(cudaEventDestroy(m.wgrad_fork));
    for (cudaEvent_t e : m.wgrad_done)
        if (e) cuda_check(cudaEventDestroy(e));
    for (cudaEvent_t e : {m.grads_ready, m.wgrads_ready, m.reduced})
        if (e) cuda_check(cudaEventDestroy(e));
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
    if (B < 1 || T < 1 || B * T > m.B * m.T || T > m.config.maxT) fail("batch %dx%d does not fit the model buffers", B, T);
    const int BT = B * T;
    const size_t capacity = size_t(m.B) * m.T;
    const int index = m.next_batch_slot;
    BatchSlot& slot = m.batch_slots[index];
    m.next_batch_slot = (m.next_batch_slot + 1) % kBatchSlots;
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
    BatchSlot& slot = m.batch_slots[index];
    const size_t capacity = size_t(m.B) * m.T;
    cuda_check(cudaMemcpyAsync(m.inputs, slot.host, slot.tokens * sizeof(int), cudaMemcpyHostToDevice));
    if (slot.has_targets)
        cuda_check(cudaMemcpyAsync(m.targets, slot.host + capacity, slot.tokens * sizeof(int), cudaMemcpyHostToDevice));
    cuda_check(cudaMemcpyAsync(m.buckets, slot.host + 2 * capacity, slot.buckets.packed.size() * sizeof(int),
                               cudaMemcpyHostToDevice));
    cuda_check(cudaEventRecord(slot.copied));
    m.batch_slot = index;
}

inline void gpt_set_batch(GPT& m, const int* inputs, const int* targets, int B, int T) {
    gpt_upload_batch(m, gpt_stage_batch(m, inputs, targets, B, T));
}

// ---------------------------------------------------------------------------------------------
// Phase profiler (-pf 1): mark(name) records a CUDA event; the GPU time until the next mark is
// charged to `name` ("fwd.matmul", "bwd.attention", ...). Off by default (events cost a little);
// when off, mark() returns at once. Sums are read after the step's synchronisation.

struct Profiler {
    bool on = false;
    std::vector<cudaEvent_t> events;
    std::vector<const char*> names;  // names[i] is charged the time from events[i] to events[i + 1]
    size_t used = 0;
    std::vector<std::pair<std::string, double>> total_ms;  // in first-seen order
    int steps = 0;

    void mark(const char* name) {
        if (!on) return;
        if (used == events.size()) {
            cudaEvent_t e;
            cuda_check(cudaEventCreate(&e));
            events.push_back(e), names.push_back(nullptr);
        }
        cuda_check(cudaEventRecord(events[used]));
        names[used++] = name;
    }
    void discard() { used = 0; }  // drops marks made outside a training step (validation, sampling)
    // After a synchronisation: adds this step's spans to the totals.
    void collect() {
        if (!on) return;
        for (size_t i = 0; i + 1 < used; i++) {
            if (!names[i]) continue;
            float ms = 0;
            cuda_check(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
            auto it = std::find_if(total_ms.begin(), total_ms.end(), [&](auto& p) { return p.first == names[i]; });
            if (it == total_ms.end()) total_ms.emplace_back(names[i], ms);
            else it->second += ms;
        }
        used = 0;
        steps++;
    }
    void report() const {
        if (!on || steps == 0) return;
        double all = 0;
        for (auto& p : total_ms) all += p.second;
        printf("GPU time per step by phase (mean of %d steps, %.2f ms in all):\n", steps, all / steps);
        for (const char* prefix : {"fwd.", "bwd.", "opt."}) {
            double sum = 0;
            for (auto& p : total_ms)
                if (p.first.rfind(prefix, 0) == 0) sum += p.second;
            printf("  %-14s %8.3f ms  %5.1f%%\n", prefix, sum / steps, 100.0 * sum / all);
            for (auto& p : total_ms)
                if (p.first.rfind(prefix, 0) == 0)
                    printf("    %-16s %8.3f ms  %5.1f%%\n", p.first.c_str(), p.second / steps, 100.0 * p.second / all);
        }
    }
};
inline Profiler& profiler() {
    static Profiler p;
    return p;
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
    const ParameterTensors& p = m.params;
    const ActivationTensors& a = m.acts;
    const StatTensors& s = m.stats;
    const size_t btc = size_t(BT) * C;
    const int Cp = ln_ld(C);
    const size_t btcp = size_t(BT) * Cp;  // one layer of ln1 / ln2

    Profiler& prof = profiler();
    prof.mark("fwd.encoder");
    encoder_forward(a.encoded, m.inputs, p.wte, p.wpe, B, T, C);
    prof.mark("fwd.layernorm");
    layernorm_forward(a.ln1, s.ln1_mean, s.ln1_rstd, a.encoded, p.ln1w, p.ln1b, BT, C, LayerNormForwardOptions().with_out_ld(Cp));
    for (int l = 0; l < L; l++) {
        const floatX* x = l == 0 ? a.encoded : a.residual3 + (l - 1) * btc;  // this layer's input residual
        floatX* ln1 = a.ln1 + l * btcp;
        floatX* qkv = a.qkv + l * 3 * btc;
        floatX* atty = a.atty + l * btc;
        floatX* att = a.att + l * size_t(B) * NH * T * T;
        floatX* residual2 = a.residual2 + l * btc;
        floatX* ln2 = a.ln2 + l * btcp;
        floatX* fch = a.fch + l * 4 * btc;
        floatX* fch_gelu = m.recompute ? a.fch_gelu : a.fch_gelu + l * 4 * btc;  // -r 1: only for the next matmul
        floatX* residual3 = a.residual3 + l * btc;

        prof.mark("fwd.matmul");
        matmul_forward(qkv, ln1, p.qkvw + size_t(l) * 3 * C * C, p.qkvb + size_t(l) * 3 * C, BT, C, 3 * C,
                       MatmulForwardOptions<floatX>().with_inp_ld(Cp));
        prof.mark("fwd.attention");
#if !defined(ENABLE_FP32)  // flash attention is bf16 only
        if (m.flash) flash_attention_forward(atty, s.attn_lse + size_t(l) * NH * BT, qkv, B, T, NH, C / NH);
#endif
        if (!m.flash) attention_forward(atty, att, a.qkvr, a.yr, qkv, B, T, C, NH);
        // The residual adds ride in the projections' epilogues (residual2 = x + atty attprojw^T + attprojb,
        // matmul.cuh), so each LayerNorm after them reads one tensor, not two.
        prof.mark("fwd.matmul");
        matmul_forward(residual2, atty, p.attprojw + size_t(l) * C * C, p.attprojb + size_t(l) * C, BT, C, C,
                       MatmulForwardOptions<floatX>().with_residual(x));
        prof.mark("fwd.layernorm");
        layernorm_forward(ln2, s.ln2_mean + l * BT, s.ln2_rstd + l * BT, residual2, p.ln2w + l * C, p.ln2b + l * C, BT, C,
                          LayerNormForwardOptions().with_out_ld(Cp));
        prof.mark("fwd.matmul");
        if (m.gelu_fusion >= 1) {  // fch = ln2 fcw^T + fcb as the epilogue's auxiliary output, fch_gelu = gelu(fch)
            matmul_forward(fch_gelu, ln2, p.fcw + size_t(l) * 4 * C * C, p.fcb + size_t(l) * 4 * C, BT, C, 4 * C,
                           MatmulForwardOptions<floatX>().with_pre_gelu(fch).with_inp_ld(Cp));
        } else {
            matmul_forward(fch, ln2, p.fcw + size_t(l) * 4 * C * C, p.fcb + size_t(l) * 4 * C, BT, C, 4 * C,
                           MatmulForwardOptions<floatX>().with_inp_ld(Cp));
            prof.mark("fwd.gelu");
            gelu_forward(fch_gelu, fch, 4 * btc);
        }
        prof.mark("fwd.matmul");  // residual3 = residual2 + fch_gelu fcprojw^T + fcprojb
        matmul_forward(residual3, fch_gelu, p.fcprojw + size_t(l) * 4 * C * C, p.fcprojb + size_t(l) * C, BT, 4 * C, C,
                       MatmulForwardOptions<floatX>().with_residual(residual2));
        prof.mark("fwd.layernorm");  // ln_1 of the next layer, or ln_f
        if (l + 1 < L)
            layernorm_forward(a.ln1 + (l + 1) * btcp, s.ln1_mean + (l + 1) * BT, s.ln1_rstd + (l + 1) * BT, residual3,
                              p.ln1w + (l + 1) * C, p.ln1b + (l + 1) * C, BT, C, LayerNormForwardOptions().with_out_ld(Cp));
        else
            layernorm_forward(a.lnf, s.lnf_mean, s.lnf_rstd, residual3, p.lnfw, p.lnfb, BT, C);
    }
    if (!targets && size_t(BT) > kLogitsChunkRows)
        fail("gpt_forward: logits without targets are kept for at most %zu rows, asked for %d", kLogitsChunkRows, BT);
    for (int r0 = 0; r0 < BT; r0 += (int)kLogitsChunkRows) {
        const int rows = std::min(BT - r0, (int)kLogitsChunkRows);
        prof.mark("fwd.matmul");
#if !defined(ENABLE_FP32)
        if (m.exp_head && targets) {  // no logits: E, the losses, dlogits = diag(scale) E (lm_head.cuh)
            lm_head_exp_forward(a.logits, s.losses + r0, m.head_scale, m.head_shift, m.head_sums, a.lnf + size_t(r0) * C,
                                p.wte, m.targets + r0, rows, C, c.V, c.Vp, dloss);
            if (dloss == 0.0f) continue;
            prof.mark("bwd.matmul");  // dx = diag(scale) (E wte), dwte += E^T diag(scale) lnf
            lm_head_scale_rows(m.head_x, a.lnf + size_t(r0) * C, m.head_scale, rows, C);
            matmul_backward(a.dln + size_t(r0) * C, m.grads.wte, (floatX*)nullptr, a.logits, m.head_x, p.wte, rows, C, c.Vp);
            lm_head_scale_rows(a.dln + size_t(r0) * C, a.dln + size_t(r0) * C, m.head_scale, rows, C);
            continue;
        }
#endif
        matmul_forward(a.logits, a.lnf + size_t(r0) * C, p.wte, (const floatX*)nullptr, rows, C, c.Vp);  // tied to wte
        if (!targets) continue;
        prof.mark("fwd.classifier");
        fused_classifier(a.logits, s.losses + r0, m.targets + r0, dloss, rows, c.V, c.Vp);
        if (dloss == 0.0f) continue;
        prof.mark("bwd.matmul");  // the LM head's backward, counted with the backward's matmuls
        matmul_backward(a.dln + size_t(r0) * C, m.grads.wte, (floatX*)nullptr, a.logits, a.lnf + size_t(r0) * C, p.wte,
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
    profiler().mark("fwd.loss");
    loss_mean_kernel<<<1, kLossThreads>>>(&m.step->loss_sum, m.stats.losses, B * T);
    cuda_check_launch();
    profiler().mark(nullptr);
}

// Mean of the per-position losses of the last forward (synchronizes: for validation and tests).
inline float gpt_mean_loss(GPT& m, int B, int T) {
    cuda_check(cudaMemsetAsync(m.loss_scratch, 0, sizeof(double)));
    loss_mean_kernel<<<1, kLossThreads>>>(m.loss_scratch, m.stats.losses, B * T);
    cuda_check_launch();
    double mean = 0.0;
    cuda_check(cudaMemcpy(&mean, m.loss_scratch, sizeof(double), cudaMemcpyDeviceToHost));
    return (float)mean;
}

// Starts an optimizer step: the gradients and the step's loss sum accumulate from zero.
inline void gpt_zero_grad(GPT& m) {
    cuda_check(cudaMemsetAsync(m.grads_memory, 0, m.num_params * sizeof(floatX)));
    cuda_check(cudaMemsetAsync(m.step, 0, sizeof(StepStats)));
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
    if (!m.overlap) return 0;
    cuda_check(cudaEventRecord(m.wgrad_fork, 0));
    cuda_check(cudaStreamWaitEvent(m.wgrad_stream, m.wgrad_fork, 0));
    return m.wgrad_stream;
}
inline void wgrad_mark(GPT& m, WgradPoint point) {
    if (m.overlap) cuda_check(cudaEventRecord(m.wgrad_done[point], m.wgrad_stream));
}
inline void wgrad_wait(GPT& m, WgradPoint point) {
    if (m.overlap) cuda_check(cudaStreamWaitEvent(0, m.wgrad_done[point], 0));
}

// One linear layer's backward: dinp on the default stream, then dweight (+ dbias) on the weight
// stream, which marks `point` once it has read dout and inp. The fork comes first, so the weight
// gradients wait for dout only, not for dinp; dinp is enqueued first, so the GPU's block scheduler
// serves the chain's kernel before the weight stream's. (Enqueueing the weight gradients first
// measured a little slower: 574,280 against 579,943 tok/s at B=64, median of 3 runs each.)
// inp_ld != 0: inp is a LayerNorm output with its column of ones (rows of inp_ld = ln_ld(C)), and the
// weight and bias gradients come from one GEMM (matmul_backward_weight_bias, via m.wgrad_scratch,
// which the weight stream's GEMMs use one after another). 0: inp is (N, C).
template <typename T>
void linear_backward(GPT& m, T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N, int C,
                     int OC, const T* pre_gelu, WgradPoint point, int inp_ld = 0) {
    const cudaStream_t ws = wgrad_fork(m);
    matmul_backward<T>(dinp, nullptr, nullptr, dout, inp, weight, N, C, OC, MatmulBackwardOptions<T>().with_pre_gelu(pre_gelu));
    if (inp_ld) matmul_backward_weight_bias<T>(dweight, dbias, m.wgrad_scratch, dout, inp, inp_ld, N, C, OC, ws);
    else matmul_backward<T>(nullptr, dweight, dbias, dout, inp, weight, N, C, OC, MatmulBackwardOptions<T>().with_stream(ws));
    wgrad_mark(m, point);
}

// ---------------------------------------------------------------------------------------------
// Data parallel (several GPUs, distributed.cuh). In the last micro-batch of a step each layer's
// gradients are all-reduced as soon as the backward has finished them, on the communication stream,
// while the backward goes on with the layers below (the per-layer buckets of PyTorch's DDP): a
// layer's slices of the 12 per-layer tensors in one NCCL group, once its last LayerNorm backward (on
// the default stream) and its weight gradients (on the weight stream) are done. The embeddings, ln_f
// and the step's loss sum go last, after the encoder backward. Then every rank holds the same summed
// gradients, and computes the same global norm and the same skip decision from them.

constexpr bool kPerLayerTensor[NUM_PARAM_TENSORS] = {false, false, true, true, true, true, true, true,
                                                     true,  true,  true, true, true, true, false, false};

// The comm stream waits for everything enqueued so far on the default stream.
inline void comm_after_default_stream(GPT& m) {
    cuda_check(cudaEventRecord(m.grads_ready, 0));
    cuda_check(cudaStreamWaitEvent(m.dist->stream, m.grads_ready, 0));
}

// ... and on the weight stream.
inline void comm_wait_for_backward(GPT& m) {
    comm_after_default_stream(m);
    if (m.overlap) {
        cuda_check(cudaEventRecord(m.wgrads_ready, m.wgrad_stream));
        cuda_check(cudaStreamWaitEvent(m.dist->stream, m.wgrads_ready, 0));
    }
}

inline void reduce_layer_grads(GPT& m, int l) {
#if !defined(NO_NCCL)
    comm_wait_for_backward(m);
    const ParameterTensors& g = m.grads;
    floatX* const* tensors = reinterpret_cast<floatX* const*>(&g);
    nccl_check(ncclGroupStart());
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        if (!kPerLayerTensor[i]) continue;
        const size_t per_layer = m.param_sizes[i] / m.config.L;
        floatX* slice = tensors[i] + size_t(l) * per_layer;
        nccl_check(ncclAllReduce(slice, slice, per_layer, nccl_type<floatX>(), ncclSum, m.dist->comm.load(), m.dist->stream));
    }
    nccl_check(ncclGroupEnd());
#endif
}

// The last bucket, then the default stream waits for every all-reduce of the step.
inline void reduce_final_grads(GPT& m) {
#if !defined(NO_NCCL)
    comm_wait_for_backward(m);
    const ParameterTensors& g = m.grads;
    floatX* const* tensors = reinterpret_cast<floatX* const*>(&g);
    ncclComm_t comm = m.dist->comm.load();
    nccl_check(ncclGroupStart());
    for (int i = 0; i < NUM_PARAM_TENSORS; i++)
        if (!kPerLayerTensor[i]) nccl_check(ncclAllReduce(tensors[i], tensors[i], m.param_sizes[i], nccl_type<floatX>(), ncclSum, comm, m.dist->stream));
    nccl_check(ncclAllReduce(&m.step->loss_sum, &m.step->loss_sum, 1, ncclFloat64, ncclSum, comm, m.dist->stream));
    nccl_check(ncclGroupEnd());
    cuda_check(cudaEventRecord(m.reduced, m.dist->stream));
    cuda_check(cudaStreamWaitEvent(0, m.reduced, 0));
#endif
}

// Backward of the last forward (which must have had targets and a dloss). Gradients accumulate (+=)
// into m.grads, so several micro-batches add up to one step. Returns with all of it enqueued on the
// default stream (the weight stream joined). With `reduce` (the last micro-batch of a step on
// several GPUs) the gradients and the step's loss sum are also summed over the ranks.
inline void gpt_backward(GPT& m, int B, int T, bool reduce = false) {
    const GPTConfig& c = m.config;
    const int L = c.L, C = c.C, NH = c.NH, BT = B * T;
    const ParameterTensors& p = m.params;
    const ParameterTensors& g = m.grads;
    const ActivationTensors& a = m.acts;
    const StatTensors& s = m.stats;
    const size_t btc = size_t(BT) * C;
    const int Cp = ln_ld(C);
    const size_t btcp = size_t(BT) * Cp;  // one layer of ln1 / ln2
    floatX* const none = nullptr;

    Profiler& prof = profiler();
    prof.mark("bwd.other");
    cuda_check(cudaMemsetAsync(a.dresidual, 0, btc * sizeof(floatX)));
    // The LM head's backward ran in gpt_forward: a.dln holds the gradient of lnf.
    prof.mark("bwd.layernorm");
    // Each LayerNorm backward also adds its dresidual's column sums into the next linear layer's bias
    // gradient (that layer's dout is this dresidual): fcproj's of the layer below, attproj's of its own.
    layernorm_backward(a.dresidual, g.lnfw, g.lnfb, m.ln_scratch, a.dln, a.residual3 + (L - 1) * btc, p.lnfw, s.lnf_mean,
                       s.lnf_rstd, BT, C, LayerNormBackwardOptions<floatX>().with_next_dbias(g.fcprojb + size_t(L - 1) * C));
    for (int l = L - 1; l >= 0; l--) {
        const floatX* x = l == 0 ? a.encoded : a.residual3 + (l - 1) * btc;
        const floatX* ln1 = a.ln1 + l * btcp;
        const floatX* qkv = a.qkv + l * 3 * btc;
        const floatX* atty = a.atty + l * btc;
        const floatX* att = a.att + l * size_t(B) * NH * T * T;
        const floatX* residual2 = a.residual2 + l * btc;
        const floatX* ln2 = a.ln2 + l * btcp;
        const floatX* fch = a.fch + l * 4 * btc;
        floatX* fch_gelu = m.recompute ? a.fch_gelu : a.fch_gelu + l * 4 * btc;
        const size_t fc_w = size_t(l) * 4 * C * C;

        // MLP. dresidual is the gradient of residual3 = residual2 + fcproj, so also of fcproj.
        if (m.recompute) {  // -r 1: fcprojw's gradient needs this layer's GELU output, recomputed from fch
            // (rewriting fch_gelu is safe: the layer above's LayerNorm 2 waited for its last reader)
            prof.mark("bwd.gelu");
            gelu_forward(fch_gelu, fch, 4 * btc);
        }
        prof.mark("bwd.matmul");
        wgrad_wait(m, kReadDbig);  // the layer above's fc weight gradients read dbig
        // -ge 2: the epilogue multiplies by gelu'(fch), so dbig leaves as the gradient of fch.
        linear_backward(m, a.dbig, g.fcprojw + fc_w, none, a.dresidual, fch_gelu, p.fcprojw + fc_w, BT, 4 * C, C,
                        m.gelu_fusion >= 2 ? fch : none, kReadMlpDresidual);
        if (m.gelu_fusion < 2) {
            prof.mark("bwd.gelu");
            gelu_backward_inplace(a.dbig, fch, 4 * btc);
        }
        prof.mark("bwd.matmul");
        linear_backward(m, a.dln, g.fcw + fc_w, g.fcb + size_t(l) * 4 * C, a.dbig, ln2, p.fcw + fc_w, BT, C, 4 * C, none,
                        kReadDbig, Cp);
        // += into dresidual: it becomes the gradient of residual2.
        prof.mark("bwd.layernorm");
        wgrad_wait(m, kReadMlpDresidual);
        layernorm_backward(a.dresidual, g.ln2w + l * C, g.ln2b + l * C, m.ln_scratch, a.dln, residual2, p.ln2w + l * C,
                           s.ln2_mean + l * BT, s.ln2_rstd + l * BT, BT, C,
                           LayerNormBackwardOptions<floatX>().with_next_dbias(g.attprojb + size_t(l) * C));
        // Attention. dln now holds the gradient of atty, m.dqkv that of qkv.
        prof.mark("bwd.matmul");
        linear_backward(m, a.dln, g.attprojw + size_t(l) * C * C, none, a.dresidual, atty, p.attprojw + size_t(l) * C * C,
                        BT, C, C, none, kReadAttnDresidual);
        prof.mark("bwd.attention");
        wgrad_wait(m, kReadDqkv);  // the layer above's qkv weight gradients read m.dqkv
#if !defined(ENABLE_FP32)
        if (m.flash)
            flash_attention_backward(m.dqkv, m.flash_scratch, a.dln, atty, s.attn_lse + size_t(l) * NH * BT, qkv, B, T, NH,
                                     C / NH, FlashAttentionBackwardOptions().with_ds_scratch(m.flash_ds, m.flash_ds_bytes));
#endif
        if (!m.flash) attention_backward(m.dqkv, a.qkvr, a.dqkvr, a.yr, a.datt, a.dln, att, qkv, B, T, C, NH);
        prof.mark("bwd.matmul");
        linear_backward(m, a.dln, g.qkvw + size_t(l) * 3 * C * C, g.qkvb + size_t(l) * 3 * C, m.dqkv, ln1,
                        p.qkvw + size_t(l) * 3 * C * C, BT, C, 3 * C, none, kReadDqkv, Cp);
        // += into dresidual: it becomes the gradient of this layer's input x.
        prof.mark("bwd.layernorm");
        wgrad_wait(m, kReadAttnDresidual);
        layernorm_backward(a.dresidual, g.ln1w + l * C, g.ln1b + l * C, m.ln_scratch, a.dln, x, p.ln1w + l * C,
                           s.ln1_mean + l * BT, s.ln1_rstd + l * BT, BT, C,
                           LayerNormBackwardOptions<floatX>().with_next_dbias(l > 0 ? g.fcprojb + size_t(l - 1) * C : none));
        if (reduce) reduce_layer_grads(m, l);  // layer l's gradients are final (fcprojb's came from the layer above)
    }
    prof.mark("bwd.encoder");
    encoder_backward(g.wte, g.wpe, m.encoder_partials, a.dresidual, m.buckets, m.batch_slots[m.batch_slot].buckets, B, T,
                     C);
    prof.mark("bwd.join");  // the weight stream's last work (qkv's of layer 0), and so all of it
    wgrad_wait(m, kReadDqkv);
    if (reduce) {
        prof.mark("bwd.allreduce");  // what the all-reduces add to the step, beyond the overlap
        reduce_final_grads(m);
    }
    prof.mark(nullptr);
}

// Squared global gradient norm into m.step->norm_squared, for gpt_update (no synchronisation).
inline void gpt_grad_norm_squared(GPT& m) {
    profiler().mark("opt.grad_norm");
    global_norm_squared(&m.step->norm_squared, m.norm_partials, m.grads_memory, m.num_params);
}

struct AdamWConfig {
    float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
};

// One AdamW step (t counts from 1) after gpt_grad_norm_squared: gradients clipped to global norm
// grad_clip (<= 0: off); no update at all when the step's loss sum or gradient norm is non-finite.
// The decision is the device's (adamw.cuh); read it afterwards with gpt_step_stats and step_finite.
// On several GPUs each rank updates its shard [shard_lo, shard_hi) (its AdamW state and master
// weights), then the updated parameters are all-gathered in place: ZeRO stage 1. An element's update
// is the same arithmetic whichever rank does it.
inline void gpt_update(GPT& m, const AdamWConfig& h, float lr, int t, float grad_clip) {
    ParamTable table{};  // tensor ends relative to the shard's first element
    table.count = NUM_PARAM_TENSORS;
    table.decay_mask = PARAM_DECAY_MASK;
    size_t end = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) table.end[i] = std::max(end += m.param_sizes[i], m.shard_lo) - m.shard_lo;
    AdamWHyper hyper{lr, h.beta1, h.beta2, h.eps, h.weight_decay,
                     1.0f - std::pow(h.beta1, (float)t), 1.0f - std::pow(h.beta2, (float)t), grad_clip, m.step};
    profiler().mark("opt.adamw");
    if (m.shard_hi > m.shard_lo)  // (a tiny model on many GPUs can leave the last ranks nothing)
        adamw_update(m.params_memory + m.shard_lo, m.master, m.grads_memory + m.shard_lo, m.adam_m, m.adam_v,
                     m.shard_hi - m.shard_lo, table, hyper);
#if !defined(NO_NCCL)
    if (m.dist && m.dist->multi()) {
        profiler().mark("opt.allgather");
        Dist& d = *m.dist;
        const size_t shard = shard_size(m.num_params, d.world);
        comm_after_default_stream(m);
        nccl_check(ncclAllGather(m.params_memory + shard * d.rank, m.params_memory, shard, nccl_type<floatX>(), d.comm.load(), d.stream));
        cuda_check(cudaEventRecord(m.reduced, d.stream));
        cuda_check(cudaStreamWaitEvent(0, m.reduced, 0));
    }
#endif
    profiler().mark(nullptr);
}

// The step's loss sum and squared gradient norm (synchronizes: call after the step's kernels).
inline StepStats gpt_step_stats(GPT& m) {
    StepStats s;
    cuda_check(cudaMemcpy(&s, m.step, sizeof(StepStats), cudaMemcpyDeviceToHost));
    return s;
}

// The whole of a sharded fp32 array (master weights, AdamW moments) on the host of rank 0 (empty on
// the others): all-gathered chunk by chunk through a small device buffer, not a second full copy.
inline std::vector<float> gpt_gather_shards(GPT& m, const float* shard) {
    const size_t n = m.num_params;
    if (!m.dist || !m.dist->multi()) {
        std::vector<float> out(n);
        cuda_check(cudaMemcpy(out.data(), shard, n * sizeof(float), cudaMemcpyDeviceToHost));
        return out;
    }
    std::vector<float> out;
#if !defined(NO_NCCL)
    Dist& d = *m.dist;
    const size_t S = shard_size(n, d.world), chunk = std::min(S, size_t(1) << 22);
    float* gathered = static_cast<float*>(device_malloc(chunk * d.world * sizeof(float), "checkpoint gather"));
    comm_after_default_stream(m);  // after whatever wrote the shards
    std::vector<float> host(chunk * d.world);
    if (d.rank == 0) out.resize(n);
    for (size_t at = 0; at < S; at += chunk) {
        const size_t k = std::min(chunk, S - at);
        nccl_check(ncclAllGather(shard + at, gathered, k, ncclFloat32, d.comm.load(), d.stream));
        cuda_check(cudaStreamSynchronize(d.stream));
        if (d.rank != 0) continue;
        cuda_check(cudaMemcpy(host.data(), gathered, k * d.world * sizeof(float), cudaMemcpyDeviceToHost));
        place_gathered_chunk(out.data(), n, d.world, at, k, host.data());
    }
    cuda_check(cudaFree(gathered));
#endif
    return out;
}

// fp32 copy of the parameters (the master weights in bf16 builds), for checkpoints; on several GPUs
// on rank 0 only (empty elsewhere).
inline std::vector<float> gpt_params_fp32(GPT& m) {
    if (m.master) return gpt_gather_shards(m, m.master);
    std::vector<float> out(m.num_params);  // fp32 builds: the parameters themselves, whole on every rank
    cuda_check(cudaMemcpy(out.data(), m.params_memory, m.num_params * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
}

// Sets this rank's shard of the AdamW state from whole host arrays (a resumed checkpoint).
inline void gpt_set_optimizer_state(GPT& m, const std::vector<float>& adam_m, const std::vector<float>& adam_v) {
    const size_t count = (m.shard_hi - m.shard_lo) * sizeof(float);
    cuda_check(cudaMemcpy(m.adam_m, adam_m.data() + m.shard_lo, count, cudaMemcpyHostToDevice));
    cuda_check(cudaMemcpy(m.adam_v, adam_v.data() + m.shard_lo, count, cudaMemcpyHostToDevice));
}


// ---------------------------------------------------------------------------------------------
// Data loader: B x T windows of a token stream (one token file, or the shards a glob names, in
// sorted order: fileio.h), targets shifted by one. Window i is tokens [i B T, i B T + B T + 1) of the
// stream; an epoch visits every window once, in order, or in a permutation drawn from (seed, epoch)
// when shuffling. Its whole state is (epoch, cursor), which checkpoints save. Windows are read from
// the files as they are needed (pread), never the whole stream. gpt_reference.py train reads the
// same windows in the same order.

struct DataLoader {
    const TokenStream* stream = nullptr;
    int B = 0, T = 0;
    uint64_t windows = 0;  // B*T+1 tokens each, starting every B*T tokens
    bool shuffle = false;
    uint64_t seed = 0;
    uint64_t epoch = 0, cursor = 0;
    std::vector<uint32_t> order;  // the epoch's permutation (shuffling only; 4 bytes a window)
    std::vector<uint16_t> window;

    // `min_windows`: what one step needs (one window per rank); fewer is a bad input.
    void init(const TokenStream& s, int B_, int T_, bool shuffle_, uint64_t seed_, const char* flag, uint64_t min_windows = 1) {
        stream = &s, B = B_, T = T_, shuffle = shuffle_, seed = seed_;
        const uint64_t need = uint64_t(B) * T * min_windows + 1;
        if (s.total < need)
            fail("%s '%s' has %llu tokens, fewer than %s = %llu (use a smaller -b or -t%s)", flag, s.pattern.c_str(),
                 (unsigned long long)s.total, min_windows > 1 ? "B*T*ranks+1" : "B*T+1", (unsigned long long)need,
                 min_windows > 1 ? ", or fewer ranks" : "");
        windows = (s.total - 1) / (uint64_t(B) * T);
        if (shuffle && windows > UINT32_MAX) fail("%s '%s': %llu windows are too many to shuffle (use a larger -b or -t, or -sh 0)",
                                                  flag, s.pattern.c_str(), (unsigned long long)windows);
        seek(0, 0);
    }
    void seek(uint64_t epoch_, uint64_t cursor_) {
        epoch = epoch_, cursor = cursor_;
        if (!shuffle) return;
        order.resize(windows);
        for (uint64_t i = 0; i < windows; i++) order[i] = uint32_t(i);
        Rng rng(seed * 0x9E3779B97F4A7C15ull + epoch);
        for (uint64_t i = windows - 1; i > 0; i--) std::swap(order[i], order[rng.next() % (i + 1)]);
    }
    // The next window of the epoch (rolling into the next epoch), without reading it.
    uint64_t advance() {
        if (cursor >= windows) seek(epoch + 1, 0);
        const uint64_t i = cursor++;
        return shuffle ? order[i] : i;
    }
    void next(std::vector<int>& inputs, std::vector<int>& targets) {
        const size_t n = size_t(B) * T;
        window.resize(n + 1);
        stream->read(advance() * n, n + 1, window.data());
        inputs.resize(n), targets.resize(n);
        for (size_t i = 0; i < n; i++) inputs[i] = window[i], targets[i] = window[i + 1];
    }
};

// ---------------------------------------------------------------------------------------------
// Checkpoints: in the output folder, model_SSSSSSSS.bin (the format above, readable by
// gpt_reference.py, with a crc32) and state_SSSSSSSS.bin: 256 int32 header {magic 20251103, version
// 2, step, B, T, crc32, 0, 0, num_params (int64 at [8]), loader epoch (int64 at [10]), loader cursor
// (int64 at [12]), sampler RNG (uint64 at [14]), -sd seed (int64 at [16]), -sh shuffle ([18]),
// training data fingerprint ([19], TokenStream::fingerprint), training token count (int64 at [20]),
// -ge ([22]), -r ([23]), tokens per step (int64 at [24]; 0 in older files)} then fp32 master
// weights, AdamW m, AdamW v, whole (whatever the number of GPUs that wrote them, so a run saved on N
// GPUs resumes on M).
//
// The commit protocol: the model file is written first, then the state file, each atomically (temp
// file, fsync, rename, folder fsync: fileio.h). The state file is the commit record: a checkpoint
// is complete when its state file exists, and its model file was complete before that. A kill at
// any instant of a save therefore leaves every earlier checkpoint as it was and, at most, a temp
// file or a model file without its state file; neither counts as a checkpoint, and the next save
// removes them. Pruning (keep the newest K) runs only after a new checkpoint is complete and removes
// a checkpoint's state file before its model file.
//
// The run setup (B, T, seed, shuffle, training data) is recorded because the data position means
// nothing under another one: resuming with a different setup is an error, never a silent change of
// the data order. Another -ge or -r is allowed (a run may need -r 1 to fit a smaller GPU) with a
// warning: it rounds differently.

struct TrainState {
    int step = 0;  // completed optimizer steps
    uint64_t loader_epoch = 0, loader_cursor = 0, sampler_rng = 0;
    // The run setup the state belongs to.
    int B = 0, T = 0, shuffle = 0, gelu_fusion = 0, recompute = 0;
    int head = 0;  // the LM head the run had at the save: 1 the logits and the classifier, 2 the exp head
                   // (-lx 1), 0 not recorded (files written before the exp head: the logits)
    int64_t seed = 0;
    uint64_t data_tokens = 0, total_batch = 0;
    uint32_t data_crc = 0;
    std::vector<float> adam_m, adam_v;
};

inline std::string checkpoint_path(const std::string& dir, const char* kind, int step) {
    char name[64];
    snprintf(name, sizeof(name), "%s_%08d.bin", kind, step);
    return dir + "/" + name;
}

inline void put64(int32_t* h, int slot, uint64_t v) { memcpy(h + slot, &v, 8); }
inline uint64_t get64(const int32_t* h, int slot) {
    uint64_t v;
    memcpy(&v, h + slot, 8);
    return v;
}

inline bool write_model_file(const std::string& path, const GPTConfig& c, const std::vector<float>& params, std::string* error) {
    int32_t h[HEADER_INTS] = {CHECKPOINT_MAGIC, CHECKPOINT_VERSION, c.L, c.NH, c.C, c.maxT, c.V, c.Vp};
    h[8] = (int32_t)header_and_payload_crc(h, 8, params.data(), params.size() * sizeof(float));
    return write_file_atomic(path, {{h, sizeof(h)}, {params.data(), params.size() * sizeof(float)}}, error);
}

// Writes checkpoint st.step into dir (model file, then state file: the commit). On failure (a full
// disk, an I/O error) returns false with *error; nothing of this step is left behind and every
// earlier checkpoint is untouched.
inline bool write_checkpoint(const std::string& dir, const GPTConfig& config, const TrainState& st, const std::vector<float>& params,
                             const std::vector<float>& adam_m, const std::vector<float>& adam_v, std::string* error) {
    const size_t n = params.size(), bytes = n * sizeof(float);
    int32_t h[HEADER_INTS] = {STATE_MAGIC, STATE_VERSION, st.step, st.B, st.T};
    put64(h, 8, n);
    put64(h, 10, st.loader_epoch);
    put64(h, 12, st.loader_cursor);
    put64(h, 14, st.sampler_rng);
    put64(h, 16, (uint64_t)st.seed);
    h[18] = st.shuffle;
    h[19] = (int32_t)st.data_crc;
    put64(h, 20, st.data_tokens);
    h[22] = st.gelu_fusion, h[23] = st.recompute;
    put64(h, 24, st.total_batch);
    h[26] = st.head;
    uint32_t crc = crc32(h, sizeof(h));  // with the crc slot (h[5]) still 0
    crc = crc32(params.data(), bytes, crc);
    crc = crc32(adam_m.data(), bytes, crc);
    crc = crc32(adam_v.data(), bytes, crc);
    h[5] = (int32_t)crc;
    const std::string model_path = checkpoint_path(dir, "model", st.step), state_path = checkpoint_path(dir, "state", st.step);
    if (!write_model_file(model_path, config, params, error) ||
        !write_file_atomic(state_path, {{h, sizeof(h)}, {params.data(), bytes}, {adam_m.data(), bytes}, {adam_v.data(), bytes}}, error)) {
        // Not committed (or not known to be on disk: a failed folder sync comes after the rename):
        // leave nothing of it, the commit record first.
        unlink(state_path.c_str());
        unlink(model_path.c_str());
        return false;
    }
    return true;
}

// What an output folder holds: steps with a state file (checkpoints, newest first), steps with a
// model file only (a save that was not committed), steps with a state file only (a save cut short by
// an older version of this program, which wrote the state file first), and temp files of
// interrupted writes.
struct CheckpointScan {
    std::vector<int> states, orphan_models, lone_states;
    std::vector<std::string> temps;
    bool has_leftovers() const { return !orphan_models.empty() || !lone_states.empty() || !temps.empty(); }
};

inline CheckpointScan scan_checkpoints(const std::string& dir) {
    CheckpointScan scan;
    std::vector<int> models;
    DIR* d = opendir(dir.c_str());
    if (!d) return scan;
    while (dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        int step = -1;
        char tail = 0;
        const bool state = name.rfind("state_", 0) == 0, model = name.rfind("model_", 0) == 0;
        if (name.rfind(".write_test.tmp.", 0) == 0) scan.temps.push_back(dir + "/" + name);  // a killed folder probe
        if (!state && !model) continue;
        if (name.find(".tmp.") != std::string::npos) scan.temps.push_back(dir + "/" + name);
        else if (name.size() == 18 && sscanf(name.c_str() + 6, "%8d.bi%c", &step, &tail) == 2 && tail == 'n' && step >= 0)
            (state ? scan.states : models).push_back(step);
    }
    closedir(d);
    std::sort(scan.states.rbegin(), scan.states.rend());
    std::sort(models.begin(), models.end());
    for (int step : models)
        if (!std::binary_search(scan.states.rbegin(), scan.states.rend(), step)) scan.orphan_models.push_back(step);
    for (int step : scan.states)
        if (!std::binary_search(models.begin(), models.end(), step)) scan.lone_states.push_back(step);
    return scan;
}

// Steps that have a checkpoint (a state file) in `dir`, newest first.
inline std::vector<int> checkpoint_steps(const std::string& dir) { return scan_checkpoints(dir).states; }

// Removes what interrupted saves left (temp files, lone model or state files), then keeps the newest
// `keep` checkpoints up to step `written`, the one just saved. Called only after a new checkpoint is
// complete, or at the start of a run that found nothing complete to resume from (keep = 0: leftovers
// only). Checkpoints after `written` are left alone and not counted: a run resumed from an older
// checkpoint because the newer ones are damaged must not count those as the ones it keeps, or it
// would delete its own.
inline void prune_checkpoints(const std::string& dir, int keep, int written = INT_MAX) {
    const CheckpointScan scan = scan_checkpoints(dir);
    for (const std::string& path : scan.temps) unlink(path.c_str());
    for (int step : scan.orphan_models) unlink(checkpoint_path(dir, "model", step).c_str());
    for (int step : scan.lone_states) unlink(checkpoint_path(dir, "state", step).c_str());
    int kept = 0;
    for (int step : scan.states) {
        if (std::find(scan.lone_states.begin(), scan.lone_states.end(), step) != scan.lone_states.end()) continue;
        if (step > written) continue;
        if (keep <= 0 || ++kept <= keep) continue;
        unlink(checkpoint_path(dir, "state", step).c_str());  // the commit record first
        unlink(checkpoint_path(dir, "model", step).c_str());
    }
}

// Loads checkpoint `step` of dir: its state file (master weights, AdamW state, position) and the
// model file's config. false with *error when it cannot be used; *incomplete tells a save that never
// finished (no model file: a write cut short by an older version of this program) from a damaged
// checkpoint. Whether it fits this run's setup is the caller's check.
inline bool load_checkpoint(const std::string& dir, int step, HostModel& model, TrainState& st, std::string* error,
                            bool* incomplete) {
    *incomplete = false;
    const std::string model_path = checkpoint_path(dir, "model", step);
    if (!file_exists(model_path)) {
        *incomplete = true;
        *error = "its model file " + model_path + " is missing (a save that did not finish)";
        return false;
    }
    if (!read_checkpoint(model_path, model, error)) return false;
    const std::string path = checkpoint_path(dir, "state", step);
    InputFile f;
    if (!f.open_file(path, error)) return false;
    const size_t n = model.params.size();
    const uint64_t expected = HEADER_INTS * 4 + 3 * uint64_t(n) * sizeof(float);
    int32_t h[HEADER_INTS] = {};
    if (f.size < sizeof(h) || !f.read_at(0, h, sizeof(h), error) || h[0] != STATE_MAGIC || h[1] != STATE_VERSION) {
        *error = "'" + path + "' is not a training-state file of this version";
        return false;
    }
    if (f.size != expected || get64(h, 8) != n) {
        *error = "'" + path + "' has " + std::to_string(f.size) + " bytes, expected " + std::to_string(expected);
        return false;
    }
    std::vector<float> params(n);
    st.adam_m.resize(n), st.adam_v.resize(n);
    const size_t bytes = n * sizeof(float);
    if (!f.read_at(sizeof(h), params.data(), bytes, error) || !f.read_at(sizeof(h) + bytes, st.adam_m.data(), bytes, error) ||
        !f.read_at(sizeof(h) + 2 * bytes, st.adam_v.data(), bytes, error))
        return false;
    int32_t hz[HEADER_INTS];
    memcpy(hz, h, sizeof(h));
    hz[5] = 0;
    uint32_t crc = crc32(hz, sizeof(hz));
    crc = crc32(params.data(), bytes, crc);
    crc = crc32(st.adam_m.data(), bytes, crc);
    crc = crc32(st.adam_v.data(), bytes, crc);
    if ((uint32_t)h[5] != crc) {
        *error = "'" + path + "' fails its checksum (corrupt or partly written)";
        return false;
    }
    if (h[2] != step) {
        *error = "'" + path + "' holds step " + std::to_string(h[2]) + ", its name says " + std::to_string(step);
        return false;
    }
    model.params = std::move(params);  // the fp32 master weights (exact), not the model file's copy
    st.step = step;
    st.loader_epoch = get64(h, 10), st.loader_cursor = get64(h, 12), st.sampler_rng = get64(h, 14);
    st.B = h[3], st.T = h[4], st.seed = (int64_t)get64(h, 16), st.shuffle = h[18];
    st.data_crc = (uint32_t)h[19], st.data_tokens = get64(h, 20);
    st.gelu_fusion = h[22], st.recompute = h[23];
    st.total_batch = get64(h, 24);
    st.head = h[26];
    return true;
}

// The newest usable checkpoint of dir for -y 1. Returns true with model and st filled; false when
// there is none, with *damaged counting checkpoints that exist but cannot be loaded (a warning each:
// the caller refuses to start over on top of them). Saves that never finished are skipped with a
// warning and do not count: nothing complete is lost by starting over.
inline bool find_resume_checkpoint(const std::string& dir, HostModel& model, TrainState& st, int* damaged, bool verbose) {
    *damaged = 0;
    std::string error;
    for (int step : checkpoint_steps(dir)) {
        bool incomplete = false;
        if (load_checkpoint(dir, step, model, st, &error, &incomplete)) return true;
        if (!incomplete) (*damaged)++;
        if (verbose) fprintf(stderr, "warning: skipping checkpoint of step %d: %s\n", step, error.c_str());
    }
    return false;
}

// Writes a checkpoint of the model's current state (rank 0 writes; every rank takes part in the
// gather). On a failed write the run ends with one line: the earlier checkpoints are intact.
inline void save_checkpoint(GPT& m, const std::string& dir, const TrainState& st) {
    const std::vector<float> params = gpt_params_fp32(m), am = gpt_gather_shards(m, m.adam_m), av = gpt_gather_shards(m, m.adam_v);
    if (m.dist && m.dist->rank != 0) return;
    std::unique_ptr<DistSolo> solo(m.dist ? new DistSolo(*m.dist) : nullptr);  // the others wait while rank 0 writes
    std::string error;
    if (!write_checkpoint(dir, m.config, st, params, am, av, &error)) fail("writing checkpoint for step %d: %s", st.step, error.c_str());
    printf("checkpoint: wrote %s and %s\n", checkpoint_path(dir, "model", st.step).c_str(), checkpoint_path(dir, "state", st.step).c_str());
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
};

// One draw from `logits` (V of them). `scratch` avoids an allocation per token.
inline int sample_token(const std::vector<float>& logits, const SampleOptions& o, Rng& rng, std::vector<double>& scratch) {
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
    int last_kept = 0;
    for (int v = 0; v < V; v++) {
        const bool kept = scratch[v] >= cut;
        scratch[v] = kept ? std::exp(scratch[v] - max_s) : 0.0;
        if (kept) last_kept = v;
        sum += scratch[v];
    }
    double r = rng.uniform() * sum;
    for (int v = 0; v < V; v++)
        if ((r -= scratch[v]) < 0) return v;
    return last_kept;  // rounding left r >= 0
}

constexpr int kGenerateBucket = 64;

// Appends `count` tokens to `tokens` (which holds the context, at least one token), calling
// on_token(id) after each. Uses the model's buffers: a batch of one row of up to min(m.T, maxT).
template <typename F>
void gpt_generate(GPT& m, std::vector<int>& tokens, int count, const SampleOptions& o, Rng& rng, F on_token) {
    const GPTConfig& c = m.config;
    const int window = std::min(m.T, c.maxT), pad = tokens.empty() ? 0 : tokens.back();
    std::vector<floatX> row(c.Vp);
    std::vector<float> logits(c.V);
    std::vector<double> scratch;
    std::vector<int> batch;
    for (int i = 0; i < count; i++) {
        const int len = std::min((int)tokens.size(), window);
        const int T = std::min(window, (len + kGenerateBucket - 1) / kGenerateBucket * kGenerateBucket);
        batch.assign(tokens.end() - len, tokens.end());
        batch.resize(T, pad);  // positions after the context do not affect it (causal attention)
        gpt_set_batch(m, batch.data(), nullptr, 1, T);
        gpt_forward(m, 1, T, false, 0.0f);
        cuda_check(cudaMemcpy(row.data(), m.acts.logits + size_t(len - 1) * c.Vp, c.Vp * sizeof(floatX), cudaMemcpyDeviceToHost));
        for (int v = 0; v < c.V; v++) logits[v] = to_float(row[v]);
        tokens.push_back(sample_token(logits, o, rng, scratch));
        on_token(tokens.back());
    }
}

#ifndef GPT_NO_MAIN
// ---------------------------------------------------------------------------------------------
// Command line. Flags follow llm.c's; every value is range-checked (no division by zero anywhere),
// and a flag given twice is an error, not "the last one wins".

struct Options {
    std::string train_path = "data/tinyshakespeare/tiny_shakespeare_train.bin";
    std::string val_path = "data/tinyshakespeare/tiny_shakespeare_val.bin";
    std::string tokenizer_path = "data/gpt2_tokenizer.bin";
    std::string model = "d12";
    std::string out_dir;
    bool train_given = false, val_given = false, tokenizer_given = false, val_batches_given = false;
    int checkpoint_every = 0, checkpoint_keep = 2, resume = 0;
    int B = 16, T = 1024, max_steps = 100;
    long total_batch = 0;
    float lr = 6e-4f, final_lr_frac = 0.1f, weight_decay = 0.1f, grad_clip = 1.0f;
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
           "  -y <0|1>    resume from the newest complete checkpoint in -o (default %d)\n"
           "batch and schedule\n"
           "  -b <int>    micro-batch size B, per GPU (default %d)\n"
           "  -t <int>    sequence length T, at most the model's maxT (default %d)\n"
           "  -d <int>    total batch size in tokens, a multiple of B*T*GPUs (default B*T*GPUs: no accumulation)\n"
           "  -x <int>    optimizer steps, at most 99999999 (checkpoint names hold 8 digits; default %d)\n"
           "  -l <float>  peak learning rate (default %g)\n"
           "  -u <int>    warmup steps, linear from 0 (default %d)\n"
           "  -q <float>  final learning rate as a fraction of -l, cosine decay (default %g)\n"
           "  -c <float>  weight decay of matrices and embeddings (default %g)\n"
           "  -gc <float> global gradient-norm clip, 0 = off (default %g)\n"
           "  -sd <int>   seed of init, shuffling and sampling (default %ld)\n"
           "  -sh <0|1>   shuffle the training windows each epoch (default %d)\n"
           "validation and samples\n"
           "  -v <int>    validation loss every N steps, 0 = never (default %d)\n"
           "  -m <int>    validation batches, at most what the data holds (default %d)\n"
           "  -s <int>    print a sample every N steps, 0 = never (default %d)\n"
           "  -g <int>    tokens per sample (default %d)\n"
           "  -p <text>   prompt of the samples, after <|endoftext|> (default: none)\n"
           "  -tp <float> sampling temperature, 0 = greedy (default %g)\n"
           "  -k <int>    sample from the top-k tokens only, 0 = all (default %d)\n"
           "speed and memory\n"
           "  -fa <0|1>   flash attention where it runs (bf16 builds, head size 64/80/128), else cuBLAS attention (default %d)\n"
           "  -ge <0|1|2> GELU in cuBLASLt matmul epilogues: 0 = separate GELU kernels, 1 = fused in the forward,\n"
           "              2 = forward and backward (default %d; fp32 builds, the exact reference, keep 0)\n"
           "  -r <0|1>    1 = recompute GELU in the backward instead of keeping it: saves (L-1)*B*T*4C activations\n"
           "              (4.1 GiB at d12 B=64 bf16) for ~2.5%% of the step; with -ge 1/2 not bit-identical to -r 0 (default %d)\n"
           "  -ov <0|1>   1 = the backward's weight gradients on a second stream, overlapped: the same bits (default %d)\n"
           "  -tw <0|1>   1 = tune each matmul also over the configurations around cuBLASLt's heuristic (up to 3 s\n"
           "              a shape at start): the same bits, ~1%% faster at B=64 on an H100 (default %d)\n"
           "  -lx <0|1>   where it runs (bf16 builds on Hopper), 1 = the LM head's GEMM writes exp(logits) and the\n"
           "              classifier no pass over the logits: ~2.5%% faster at d12, other bits (default %d)\n"
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
           d.checkpoint_every, d.checkpoint_keep, d.resume, d.B, d.T, d.max_steps, d.lr, d.warmup, d.final_lr_frac,
           d.weight_decay, d.grad_clip, d.seed, d.shuffle, d.val_every, d.val_batches, d.sample_every, d.gen_len,
           d.temperature, d.top_k, d.flash, d.gelu_fusion, d.recompute, d.overlap, d.tune_wide, d.exp_head, d.profile, d.stall_seconds);
}

static Options parse_options(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; i += 2)  // flag positions only: "-h" as a flag's value (a prompt) is that value
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(o);
            exit(0);
        }
    std::vector<std::string> seen;
    for (int i = 1; i < argc; i += 2) {
        const std::string f = argv[i];
        check_flag_pair(argc, argv, i, seen, "-b 4");
        const char* v = argv[i + 1];
        const char* fl = argv[i];
        auto path = [&](std::string& out) {
            if (!*v) fail("flag %s: expected a path, got an empty string", fl);
            out = v;
        };
        if (f == "-i") path(o.train_path), o.train_given = true;
        else if (f == "-j") path(o.val_path), o.val_given = true;
        else if (f == "-z") path(o.tokenizer_path), o.tokenizer_given = true;
        else if (f == "-e") path(o.model);
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
        else if (f == "-c") o.weight_decay = (float)parse_float_flag(fl, v, 0.0, 10.0);
        else if (f == "-gc") o.grad_clip = (float)parse_float_flag(fl, v, 0.0, 1e6);
        else if (f == "-v") o.val_every = (int)parse_int_flag(fl, v, 0, 1 << 30);
        else if (f == "-m") o.val_batches = (int)parse_int_flag(fl, v, 1, 1 << 20), o.val_batches_given = true;
        else if (f == "-s") o.sample_every = (int)parse_int_flag(fl, v, 0, 1 << 30);
        else if (f == "-g") o.gen_len = (int)parse_int_flag(fl, v, 1, 65536);
        else if (f == "-p") {
            o.prompt = v;
            check_prompt_utf8(o.prompt);
        }
        else if (f == "-tp") o.temperature = (float)parse_float_flag(fl, v, 0.0, 100.0);
        else if (f == "-k") o.top_k = (int)parse_int_flag(fl, v, 0, 1 << 20);
        else if (f == "-sd") o.seed = parse_int_flag(fl, v, 0, 1l << 62);
        else if (f == "-sh") o.shuffle = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-pf") o.profile = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-fa") o.flash = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-ge") o.gelu_fusion = (int)parse_int_flag(fl, v, 0, 2);
        else if (f == "-r") o.recompute = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-ov") o.overlap = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-tw") o.tune_wide = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-lx") o.exp_head = (int)parse_int_flag(fl, v, 0, 1);
        else if (f == "-rz") path(o.rendezvous);
        else if (f == "-wt") o.stall_seconds = (int)parse_int_flag(fl, v, 0, 1 << 24);
        else fail("unknown flag %s (-h lists the flags)", argv[i]);
    }
    if ((long)o.B * o.T > (1l << 24)) fail("-b %d -t %d: B*T = %ld tokens per micro-batch is more than 16M", o.B, o.T, (long)o.B * o.T);
    if (o.resume && o.out_dir.empty()) fail("-y 1 resumes from the output folder: give it with -o");
    if (o.checkpoint_every > 0 && o.out_dir.empty()) fail("-n %d writes checkpoints into the output folder: give it with -o", o.checkpoint_every);
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

static float learning_rate(const Options& o, int step) {  // step counts from 0
    if (step < o.warmup) return o.lr * (step + 1) / o.warmup;
    const float span = std::max(1, o.max_steps - o.warmup);
    const float progress = std::min(1.0f, (step - o.warmup) / span);
    const float min_lr = o.lr * o.final_lr_frac;
    return min_lr + 0.5f * (o.lr - min_lr) * (1.0f + std::cos(3.14159265358979f * progress));
}

static std::string format_duration(double seconds) {
    char buf[32];
    const long s = (long)seconds;
    if (s >= 3600) snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, s / 60 % 60);
    else snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
    return buf;
}

// Preemption: the first SIGTERM or SIGINT asks the training loop to stop after the step in progress
// (and write a checkpoint when -o is set); a second one, a second or more later, ends the process at
// once, the default way. Signals within that second count as one: Ctrl-C reaches every process of
// the terminal's group, and a launcher (scripts/launch.sh, torchrun) passes it on as well.
constexpr int kExitStopped = 75;  // EX_TEMPFAIL: stopped early by a signal, resume with -y 1
static volatile sig_atomic_t g_stop_signal = 0;
static volatile time_t g_stop_time = 0;
static void on_stop_signal(int sig) {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
    if (g_stop_signal && now.tv_sec - g_stop_time >= 1) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    if (!g_stop_signal) g_stop_signal = sig, g_stop_time = now.tv_sec;
}

// main.log or metrics.csv: each row flushed as it is written. A row that cannot be written (a full
// disk) is said once on stderr and the run goes on: its checkpoints, written and checked on their own,
// are what a run must not lose.
struct RunLog {
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

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    std::set_new_handler(fail_out_of_host_memory);
    const Options o = parse_options(argc, argv);
    Dist dist;
    dist_from_env(dist);
    const bool lead = dist.rank == 0;  // rank 0 alone prints, logs, samples and writes
#if defined(NO_NCCL)
    if (dist.multi()) fail("%s started %d ranks, but this build has no NCCL (install it and rebuild)", dist.launcher.c_str(), dist.world);
#endif

    // 1. Validate every input on the host. Nothing touches the GPU, and nothing is written, before
    // every flag, file and folder has been checked.
    const int accum = micro_steps_per_rank(o.total_batch ? o.total_batch : long(o.B) * o.T * dist.world, o.B, o.T, dist.world);
    if (accum == 0)
        fail("-d %ld: the total batch size must be a multiple of B*T*GPUs = %d*%d*%d = %ld", o.total_batch, o.B, o.T, dist.world,
             long(o.B) * o.T * dist.world);
    const long total_batch = long(accum) * o.B * o.T * dist.world;
    HostModel host;
    TrainState state;
    std::string error;
    bool resumed = false;
    CheckpointScan scan;
    if (!o.out_dir.empty()) {
        if (lead) make_out_dir(o.out_dir, true);  // rank 0 alone writes there; the others read checkpoints
        scan = scan_checkpoints(o.out_dir);
    }
    // A new run must not share a folder with another run's checkpoints: pruning keeps the highest
    // steps, so it would delete this run's own checkpoints, and -y 1 would take the other run's.
    if (!o.resume && !scan.states.empty())
        fail("output folder '%s' already holds checkpoints (newest: step %d): resume with -y 1, or give another -o",
             o.out_dir.c_str(), scan.states[0]);
    if (o.resume) {
        int damaged = 0;
        resumed = find_resume_checkpoint(o.out_dir, host, state, &damaged, lead);
        // Starting over there would overwrite a run's complete (if damaged) checkpoints.
        if (!resumed && damaged > 0)
            fail("none of the %zu checkpoints in '%s' can be loaded (see the warnings): move them away to start over",
                 scan.states.size(), o.out_dir.c_str());
        if (!resumed && lead) {
            if (scan.states.empty() && !scan.has_leftovers()) printf("no checkpoint in %s: starting from -e %s\n", o.out_dir.c_str(), o.model.c_str());
            else fprintf(stderr, "warning: no complete checkpoint in %s (only what interrupted saves left): starting from -e %s\n",
                         o.out_dir.c_str(), o.model.c_str());
        }
        if (resumed && (state.B != o.B || state.T != o.T || state.seed != o.seed || state.shuffle != o.shuffle))
            fail("the checkpoint of step %d in '%s' was written with -b %d -t %d -sd %lld -sh %d: resume with the same flags "
                 "(given -b %d -t %d -sd %lld -sh %d)",
                 state.step, o.out_dir.c_str(), state.B, state.T, (long long)state.seed, state.shuffle, o.B, o.T,
                 (long long)o.seed, o.shuffle);
        // The tokens per step, whatever the number of GPUs (-d's default grows with it).
        if (resumed && state.total_batch != 0 && state.total_batch != (uint64_t)total_batch)
            fail("the checkpoint of step %d in '%s' was written with -d %llu tokens per step, this run has %ld: resume with "
                 "-d %llu", state.step, o.out_dir.c_str(), (unsigned long long)state.total_batch, total_batch,
                 (unsigned long long)state.total_batch);
        if (resumed && lead && (state.gelu_fusion != o.gelu_fusion || state.recompute != o.recompute))
            fprintf(stderr, "warning: the checkpoint of step %d was written with -ge %d -r %d, this run has -ge %d -r %d: "
                    "its losses will differ in rounding from an uninterrupted run\n", state.step, state.gelu_fusion,
                    state.recompute, o.gelu_fusion, o.recompute);
        // Else the final checkpoint would be labelled step -x while holding the later weights.
        if (resumed && state.step > o.max_steps)
            fail("-x %d is below step %d of the checkpoint in %s (give a larger -x to continue it)", o.max_steps,
                 state.step, o.out_dir.c_str());
    }
    // A descriptor's random init (seconds for d12) waits until every other input has been checked.
    const bool fresh_init = !resumed && config_from_descriptor(o.model, host.config);
    if (!resumed && !fresh_init) {
        if (looks_like_descriptor(o.model) && !file_exists(o.model))
            fail("-e %s: no such model file, and not a model name (d6, d12, d24, d36, d48)", o.model.c_str());
        if (!read_checkpoint(o.model, host, &error)) fail("-e %s: %s", o.model.c_str(), error.c_str());
    }
    const GPTConfig& c = host.config;
    if (o.T > c.maxT) fail("-t %d is larger than the model's maximum sequence length %d", o.T, c.maxT);
    TokenStream train_data, val_data;
    if (!train_data.open(o.train_path, c.V, &error)) fail("-i %s: %s", o.train_path.c_str(), error.c_str());
    DataLoader train, val;
    train.init(train_data, o.B, o.T, o.shuffle != 0, (uint64_t)o.seed, "-i", (uint64_t)dist.world);
    // Small data is read whole now (its fingerprint), so a bad token id fails before any GPU work;
    // a large corpus is checked as its windows are read.
    const uint64_t data_tokens = train_data.total;
    const uint32_t data_crc = train_data.fingerprint();
    std::string val_path = o.val_path;
    if (o.val_every > 0) {  // -v 0 never validates: no validation data is needed
        if (o.train_given && !o.val_given) {
            val_path = validation_beside(o.train_path);
            const std::vector<std::string> found = val_path.empty() ? std::vector<std::string>() : expand_glob(val_path);
            if (found.empty() || !file_exists(found[0]))
                fail("-i %s: no validation data beside it%s%s%s: give -j, or -v 0 to train without validation", o.train_path.c_str(),
                     val_path.empty() ? "" : " (looked for '", val_path.c_str(), val_path.empty() ? "" : "')");
        }
        if (!val_data.open(val_path, c.V, &error)) fail("-j %s: %s", val_path.c_str(), error.c_str());
        if (val_data.total <= TokenStream::kFullCrcTokens) val_data.fingerprint();  // reads (and checks) every token
        // Validation batches take up to B rows of T tokens: a small validation file (Tiny
        // Shakespeare's 32,768 tokens) still serves a large B with fewer rows per batch.
        const int val_rows = (int)std::min<uint64_t>(o.B, (val_data.total - 1) / o.T);
        if (val_rows < 1)
            fail("-j %s has %llu tokens, fewer than T+1 = %d (use a smaller -t, or -v 0)", val_path.c_str(),
                 (unsigned long long)val_data.total, o.T + 1);
        val.init(val_data, val_rows, o.T, false, 0, "-j");
    }
    if (resumed) {
        if (state.data_tokens != data_tokens || state.data_crc != data_crc)
            fail("-i '%s' (%llu tokens, fingerprint %08x) is not the training data of the checkpoint of step %d (%llu tokens, "
                 "fingerprint %08x)", o.train_path.c_str(), (unsigned long long)data_tokens, data_crc, state.step,
                 (unsigned long long)state.data_tokens, state.data_crc);
        if (state.loader_cursor > train.windows)  // only a damaged or hand-made state file gets here
            fail("checkpoint data position %llu is beyond the %llu windows of '%s'", (unsigned long long)state.loader_cursor,
                 (unsigned long long)train.windows, o.train_path.c_str());
        train.seek(state.loader_epoch, state.loader_cursor);
        if (lead) printf("resuming from step %d in %s\n", state.step, o.out_dir.c_str());
    }
    state.B = o.B, state.T = o.T, state.seed = o.seed, state.shuffle = o.shuffle;
    state.gelu_fusion = o.gelu_fusion, state.recompute = o.recompute;
    state.data_tokens = data_tokens, state.data_crc = data_crc, state.total_batch = (uint64_t)total_batch;
    Tokenizer tokenizer;
    const bool have_tokenizer = o.tokenizer_given || file_exists(o.tokenizer_path);
    if (have_tokenizer) tokenizer = read_tokenizer(o.tokenizer_path);
    if (have_tokenizer && tokenizer.vocab_size != c.V)
        fail("tokenizer '%s' has %d tokens, the model %d", o.tokenizer_path.c_str(), tokenizer.vocab_size, c.V);
    if (!o.prompt.empty() && !have_tokenizer)
        fail("-p needs the tokenizer (-z %s is missing): prepare it with data/prepare_tinyshakespeare.py", o.tokenizer_path.c_str());
    if (lead && o.sample_every > 0 && !have_tokenizer)
        fprintf(stderr, "warning: no tokenizer at %s: samples print token ids\n", o.tokenizer_path.c_str());
    const int eot = have_tokenizer && tokenizer.eot_token >= 0 ? tokenizer.eot_token : c.V - 1;
    std::vector<int> sample_context = {eot};
    if (!o.prompt.empty()) {
        const std::vector<int> p = tokenizer_encode(tokenizer, o.prompt);
        sample_context.insert(sample_context.end(), p.begin(), p.end());
    }
    const int start_step = resumed ? state.step : 0;
    if (lead && o.warmup >= o.max_steps && start_step < o.max_steps)
        fprintf(stderr, "warning: -u %d warm-up steps of -x %d: the learning rate never reaches -l %g (it peaks at %g)\n",
                o.warmup, o.max_steps, o.lr, learning_rate(o, o.max_steps - 1));
    const int val_batches = (int)std::min<uint64_t>(o.val_batches, val.windows);  // 0 when -v 0
    if (lead && o.val_every > 0 && o.val_batches_given && val_batches < o.val_batches)
        fprintf(stderr, "warning: -m %d: the validation data holds %d batches of %dx%d tokens; validating on those\n",
                o.val_batches, val_batches, val.B, o.T);

    // Several GPUs: the ranks meet, and each is refused unless its run setup is rank 0's.
    if (dist.multi()) {
        int devices = 0;
        if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
        if (devices != 1 && dist.local_rank >= devices)
            fail("rank %d has local rank %d, but this node has %d GPUs: start at most one rank per GPU", dist.rank, dist.local_rank, devices);
        // What must be the same on every rank, the most telling first: build, model, data, flags.
        std::string setup = std::string("build=") + PRECISION_NAME;
        auto add = [&](const char* key, const std::string& value) { setup += std::string(" ") + key + "=" + value; };
        add("model", "L" + std::to_string(c.L) + ",NH" + std::to_string(c.NH) + ",C" + std::to_string(c.C) + ",T" +
                         std::to_string(c.maxT) + ",V" + std::to_string(c.V) + ",Vp" + std::to_string(c.Vp));
        add("resumed-step", std::to_string(resumed ? state.step : -1));
        char data[64];
        snprintf(data, sizeof(data), "%llu:%08x", (unsigned long long)data_tokens, data_crc);
        add("data", data);
        for (int i = 1; i + 1 < argc; i += 2) add(argv[i], argv[i + 1]);  // the flags as given
        add("-d(tokens)", std::to_string(total_batch));
        if (setup.size() >= kSetupChars)
            fail("the run setup is %zu characters, more than the %d ranks can compare (shorter paths?)", setup.size(), kSetupChars - 1);
#if !defined(NO_NCCL)
        dist_rendezvous(dist, o.rendezvous, setup, [] {
            ncclUniqueId id;
            nccl_check(ncclGetUniqueId(&id));
            return id;
        });
#endif
        dist_start_watchdog(dist, o.stall_seconds);
    }

    if (fresh_init) host = random_init(host.config, (uint64_t)o.seed);

    // 2. The GPU: one per rank, the rank's local index on its node. Until here a signal ends the
    // program the default way (nothing has been written); from here on it stops the training loop
    // (on_stop_signal). It is blocked while the helper threads (CUDA's, NCCL's) start, so that they
    // inherit the block and only this thread takes it; SA_RESTART keeps it from cutting a system
    // call short.
    struct sigaction sa{};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    if (!cuda_device_available()) fail("no CUDA device found (train_gpt needs a GPU)");
    int devices = 0;
    cuda_check(cudaGetDeviceCount(&devices));
    // One visible GPU: the launcher gave this rank its own (srun --gpus-per-task, CUDA_VISIBLE_DEVICES
    // per rank). Several: the rank's local index picks one.
    const int device = devices == 1 ? 0 : dist.local_rank;
    if (device >= devices)
        fail("rank %d has local rank %d, but this node has %d GPUs: start at most one rank per GPU", dist.rank, dist.local_rank, devices);
    cuda_check(cudaSetDevice(device));
    cudaDeviceProp prop;
    cuda_check(cudaGetDeviceProperties(&prop, device));
    // Inputs are valid and there is a GPU: the output folder is made now (removed again, if still
    // empty, should the run fail), and what interrupted saves left in it is removed.
    if (!o.out_dir.empty() && lead) {
        static std::vector<std::string> made;
        made = make_out_dir(o.out_dir, false);
        atexit([] {
            for (size_t i = made.size(); i-- > 0;) rmdir(made[i].c_str());  // only empty folders go
        });
        if (!resumed && scan.has_leftovers()) prune_checkpoints(o.out_dir, 0);
    }
#if !defined(NO_NCCL)
    dist_init_nccl(dist);
#endif
    GPT m;
    m.dist = &dist;
    profiler().on = o.profile != 0;
    blas().tune_wide = o.tune_wide != 0;
    blas().tune_print = o.tune_wide != 0 && lead;  // -tw 1 prints what each plan's tuning kept
    gpt_create(m, host, o.B, o.T, o.flash != 0, o.gelu_fusion, o.recompute, o.overlap);
    if (o.exp_head && gpt_exp_head_usable(m)) {
        if (!resumed || state.head != 1) gpt_use_exp_head(m);
        else if (lead)  // written on the logits path (-lx 0, or after a refused row)
            printf("the checkpoint of step %d was written with the logits and the classifier: resuming so (-lx 0)\n", state.step);
    }
    if (resumed && lead && (state.head == 2) != m.exp_head) {
        fprintf(stderr, "warning: the checkpoint of step %d was written with the %s LM head, this run has the %s one: its losses "
                "will differ in rounding from an uninterrupted run\n", state.step, state.head == 2 ? "exp" : "logits",
                m.exp_head ? "exp" : "logits");
    }
    pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);  // (a signal that came meanwhile is taken now)
    if (resumed) {
        gpt_set_optimizer_state(m, state.adam_m, state.adam_v);
        state.adam_m = std::vector<float>(), state.adam_v = std::vector<float>();
    }
    host.params = std::vector<float>();
    const size_t real_params = m.num_params - size_t(c.Vp - c.V) * c.C;
    const double flops_per_token = 6.0 * real_params + 12.0 * c.L * c.C * o.T;
    const double peak_flops = sizeof(floatX) == 2 ? 989.4e12 : 66.9e12;
    const size_t optimizer_bytes = (shard_size(m.num_params, dist.world)) * sizeof(float) * (m.master ? 3 : 2);
    if (lead) {
        printf("device: %s | precision %s | %s attention | LM head %s | GELU fusion -ge %d, recompute -r %d, weight stream -ov %d, "
               "matmul tuning -tw %d | model L=%d NH=%d C=%d maxT=%d V=%d (Vp=%d), %zu parameters\n",
               prop.name, PRECISION_NAME, m.flash ? "flash" : "cuBLAS", m.exp_head ? "exp (-lx 1)" : "logits and classifier",
               m.gelu_fusion, m.recompute, (int)m.overlap, o.tune_wide,
               c.L, c.NH, c.C, c.maxT, c.V, c.Vp, real_params);
        if (dist.multi())
            printf("data parallel: %d ranks (%s), optimizer state sharded (ZeRO-1): %.2f GiB per GPU instead of %.2f\n", dist.world,
                   dist.launcher.c_str(), optimizer_bytes / 1073741824.0,
                   m.num_params * sizeof(float) * (m.master ? 3 : 2) / 1073741824.0);
        printf("batch: B=%d T=%d x %d GPUs, total %ld tokens per step (%d micro-steps per GPU) | train %llu tokens (%llu windows, "
               "%zu files), val %llu tokens (%d batches)\n",
               o.B, o.T, dist.world, total_batch, accum, (unsigned long long)train_data.total, (unsigned long long)train.windows,
               train_data.shards.size(), (unsigned long long)val_data.total, val_batches);
        if (o.val_every > 0 && val.B < o.B) printf("validation batches hold %d rows of T (the data is small)\n", val.B);
        printf("memory: %.2f GiB allocated for parameters, optimizer state, activations and scratch%s\n",
               m.bytes_allocated / 1073741824.0, m.recompute ? " (-r 1: GELU output of one layer, not L)" : "");
    }
    // The run folder's logs: main.log in llm.c's form ("s:STEP trl:LOSS" / "s:STEP tel:LOSS") and
    // metrics.csv (a header, then a row per step and per validation; scripts/plot_runs.py reads it).
    RunLog log, metrics;
    if (!o.out_dir.empty() && lead) {
        const std::string csv_path = o.out_dir + "/metrics.csv";
        struct stat csv_stat;
        const bool csv_new = stat(csv_path.c_str(), &csv_stat) != 0 || csv_stat.st_size == 0;  // empty: killed before its header
        log.open(o.out_dir + "/main.log");
        metrics.open(csv_path);
        if (csv_new) metrics.row("step,train_loss,val_loss,lr,grad_norm,step_ms,tokens_per_s\n");
    }

    AdamWConfig adam;
    adam.weight_decay = o.weight_decay;
    Rng sampler(state.sampler_rng ? state.sampler_rng : (uint64_t)o.seed ^ 0x5DEECE66Dull);
    const SampleOptions sample_options{o.temperature, o.top_k};
    std::vector<int> inputs, targets;
    std::vector<double> step_ms;
    float last_val = NAN, train_loss = NAN;
    int bad_steps = 0, last_checkpoint = resumed ? state.step : -1;
    size_t peak_used = 0;

    // The exp head writes a NaN loss for a row it refuses (lm_head.cuh: a token's loss above 44), which
    // makes the step (its update skipped) or the validation non-finite on every rank alike; then the
    // run goes on with the logits and the classifier. Any other non-finite step turns it off as well.
    auto exp_head_off = [&](int step, const char* what) {
        gpt_drop_exp_head(m);
        if (lead)
            fprintf(stderr, "warning: %s %d was non-finite with the exp LM head: the logits and the classifier (-lx 0) "
                            "from here on\n", what, step);
    };
    auto validate = [&](int step) {
        double sum = 0.0;
        for (;;) {
            val.seek(0, 0);
            sum = 0.0;
            for (int i = 0; i < val_batches; i++) {  // on several GPUs, batch i on rank i % world
                val.next(inputs, targets);
                if (i % dist.world != dist.rank) continue;
                gpt_set_batch(m, inputs.data(), targets.data(), val.B, o.T);
                gpt_forward(m, val.B, o.T, true, 0.0f);
                sum += gpt_mean_loss(m, val.B, o.T);
                dist_progress(dist);
            }
#if !defined(NO_NCCL)
            sum = dist_sum(dist, sum);
#endif
            if (std::isfinite(sum) || !m.exp_head) break;
            exp_head_off(step, "validation");  // a row it refused: this validation again with the logits
        }
        last_val = (float)(sum / val_batches);
        dist_progress(dist);
        if (!lead) return;
        printf("step %5d | val loss %.6f\n", step, last_val);
        log.row("s:%d tel:%.6f\n", step, last_val);
        metrics.row("%d,,%.6f,,,,\n", step, last_val);
    };
    auto sample = [&](int step) {
        if (!lead) return;  // the others go on to the next step's first collective and wait there
        DistSolo solo(dist);
        std::vector<int> tokens = sample_context;
        printf("step %5d | sample:\n---\n", step);
        if (have_tokenizer)
            for (size_t i = 1; i < tokens.size(); i++) fputs(tokenizer_decode(tokenizer, tokens[i]).c_str(), stdout);
        const bool tune = blas().tune;
        blas().tune = false;  // sampling's shapes are not worth a tuning pass (the bits are the same)
        gpt_generate(m, tokens, o.gen_len, sample_options, sampler, [&](int id) {
            if (have_tokenizer) fputs(tokenizer_decode(tokenizer, id).c_str(), stdout);
            else printf("%d ", id);
        });
        blas().tune = tune;
        printf("\n---\n");
    };
    auto checkpoint = [&](int step) {
        state.step = step, state.loader_epoch = train.epoch, state.loader_cursor = train.cursor, state.sampler_rng = sampler.state;
        state.head = m.exp_head ? 2 : 1;
        save_checkpoint(m, o.out_dir, state);
        if (lead) {
            DistSolo solo(dist);
            prune_checkpoints(o.out_dir, o.checkpoint_keep, step);
        }
        last_checkpoint = step;
        dist_progress(dist);
    };
    // A stop asked by a signal on any rank: every rank takes the same decision, at the same step.
    auto stop_requested = [&] {
        int stop = g_stop_signal != 0;
#if !defined(NO_NCCL)
        stop = dist_sum(dist, stop);
#endif
        return stop > 0;
    };
    // The training loop reads the next step's first batch while the GPU runs a step (staged); a stop
    // between steps puts the loader back to where that read began, so the checkpoint's data position
    // is the step's.
    int staged = -1;  // the slot of the next training batch, staged while the GPU ran the step before
    struct { uint64_t epoch, cursor; int micro; } before_stage{0, 0, 0};
    int micro_of_step = 0;  // (next_batch, below)
    auto unstage = [&] {
        if (staged < 0) return;
        train.seek(before_stage.epoch, before_stage.cursor);
        micro_of_step = before_stage.micro, staged = -1;
    };
    // The run's last steps, at a normal end or a stop: close the logs, then tell the other ranks this
    // one is done (so that none takes its end for a failure).
    auto close_run = [&] {
        log.close();
        metrics.close();
#if !defined(NO_NCCL)
        dist_finish(dist);
#endif
    };
    auto stop_now = [&](int step) {
        unstage();
        if (!o.out_dir.empty() && last_checkpoint != step) checkpoint(step);
        if (lead)
            printf("stopped at step %d by a signal%s\n", step,
                   o.out_dir.empty() ? " (no -o: nothing saved)" : ": resume with the same flags and -y 1");
        close_run();
        exit(kExitStopped);
    };

    // Each rank's share of a step: of the accum * world windows the step takes from the data, rank r
    // trains on the r-th run of `accum`, so one GPU accumulating accum * world micro-batches and
    // world GPUs see the same tokens in the same order.
    auto next_batch = [&] {
        if (micro_of_step == 0)
            for (int k = 0; k < dist.rank * accum; k++) train.advance();
        train.next(inputs, targets);
        if (++micro_of_step == accum) {
            micro_of_step = 0;
            for (int k = 0; k < (dist.world - 1 - dist.rank) * accum; k++) train.advance();
        }
    };

    // 3. Train. `step` counts completed optimizer steps.
    const double start = now_seconds();
    auto validates = [&](int step) { return o.val_every > 0 && step % o.val_every == 0; };
    auto samples = [&](int step) { return o.sample_every > 0 && step > 0 && step % o.sample_every == 0; };
    auto checkpoints = [&](int step) { return !o.out_dir.empty() && o.checkpoint_every > 0 && step % o.checkpoint_every == 0; };
    double last_end = NAN;   // when the previous step's synchronisation returned
    for (int step = start_step; step < o.max_steps; step++) {
        if (stop_requested()) stop_now(step);
        const bool interrupted = validates(step) || samples(step) || checkpoints(step);  // (the last step ended with one)
        if (validates(step)) validate(step);
        if (samples(step)) sample(step);

        // A step's time runs from the previous step's end (its printing and logging included), or from
        // here after validation, sampling or a checkpoint, to its own synchronisation.
        const double t0 = interrupted || std::isnan(last_end) ? now_seconds() : last_end;
        profiler().discard();
        // With -pf 1 a profiler started with --profile-from-start off (ncu, scripts/profile_step.sh)
        // sees exactly one steady step: the last.
        const bool profiled_step = o.profile && step + 1 == o.max_steps && step > start_step;
        if (profiled_step) cuda_check(cudaProfilerStart());
        // The whole step is enqueued without waiting on the GPU: the loss sum, the norm, the clipping
        // factor and the skip decision live on the device until the one synchronisation below. Each
        // batch's host work (reading, grouping tokens, pinned copy) is done while the GPU runs the
        // micro-batch before, this step's or the last step's; not across validation, sampling or a
        // checkpoint, which use the slots or record the loader's position.
        gpt_zero_grad(m);
        for (int micro = 0; micro < accum; micro++) {
            if (staged < 0) {
                next_batch();
                staged = gpt_stage_batch(m, inputs.data(), targets.data(), o.B, o.T);
            }
            gpt_upload_batch(m, staged);
            staged = -1;
            // The step's loss is the mean over all its tokens, on every GPU together.
            gpt_forward(m, o.B, o.T, true, 1.0f / (float(o.B) * o.T * accum * dist.world));
            gpt_accumulate_loss(m, o.B, o.T);
            const bool last = micro + 1 == accum;
            gpt_backward(m, o.B, o.T, last && dist.multi());
            if (!last || (step + 1 < o.max_steps && !checkpoints(step + 1) && !validates(step + 1) && !samples(step + 1))) {
                if (last) before_stage = {train.epoch, train.cursor, micro_of_step};
                next_batch();
                staged = gpt_stage_batch(m, inputs.data(), targets.data(), o.B, o.T);
            }
        }
        gpt_grad_norm_squared(m);
        const float lr = learning_rate(o, step);
        gpt_update(m, adam, lr, step + 1, o.grad_clip);  // writes nothing if the loss or norm is non-finite
        cuda_check(cudaDeviceSynchronize());
        if (profiled_step) cuda_check(cudaProfilerStop());
        last_end = now_seconds();
        dist_progress(dist);
        const double ms = (last_end - t0) * 1e3;
        const StepStats stats = gpt_step_stats(m);
        train_loss = (float)(stats.loss_sum / (accum * dist.world));
        const float norm = std::sqrt(stats.norm_squared);
        if (!step_finite(stats)) {  // the device's decision, from the same two values (the same on every rank)
            bad_steps++;
            if (m.exp_head) exp_head_off(step + 1, "step");
            if (lead)
                fprintf(stderr, "warning: step %d: non-finite %s, update skipped\n", step + 1,
                        std::isfinite(stats.loss_sum) ? "grad norm" : "loss");
            if (bad_steps >= 3)
                fail("stopping at step %d: %d steps in a row had a non-finite loss or gradient norm (last good checkpoint: %s)",
                     step + 1, bad_steps, last_checkpoint >= 0 ? checkpoint_path(o.out_dir, "model", last_checkpoint).c_str() : "none");
        } else {
            bad_steps = 0;
        }
        if (step > start_step) profiler().collect();  // the first step includes one-time set-up
        else profiler().discard();
        step_ms.push_back(ms);
        size_t free_b = 0, total_b = 0;
        cuda_check(cudaMemGetInfo(&free_b, &total_b));
        peak_used = std::max(peak_used, total_b - free_b);
        const double tok_s = total_batch / (ms * 1e-3);
        const double eta = (o.max_steps - step - 1) * ms * 1e-3;
        if (lead) {
            printf("step %5d/%d | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s | MFU %.1f%% | ETA %s\n", step + 1,
                   o.max_steps, train_loss, norm, lr, ms, tok_s, 100.0 * flops_per_token * tok_s / dist.world / peak_flops,
                   format_duration(eta).c_str());
            log.row("s:%d trl:%.6f\n", step + 1, train_loss);
            metrics.row("%d,%.6f,,%.6e,%.6f,%.3f,%.1f\n", step + 1, train_loss, lr, norm, ms, tok_s);
        }
        if (checkpoints(step + 1)) checkpoint(step + 1);
    }
    if (stop_requested()) stop_now(o.max_steps);
    if (o.val_every > 0) validate(o.max_steps);
    if (o.sample_every > 0) sample(o.max_steps);
    if (!o.out_dir.empty() && last_checkpoint != o.max_steps) checkpoint(o.max_steps);

    // Summary: median step time after warm-up (the first steps include cuBLAS heuristics and caches).
    std::vector<double> steady(step_ms.begin() + std::min<size_t>(step_ms.size() / 4, 5), step_ms.end());
    std::sort(steady.begin(), steady.end());
    const double median_ms = steady.empty() ? NAN : steady[steady.size() / 2];
    char val_text[32] = "-";  // no validation ran (-v 0)
    if (!std::isnan(last_val)) snprintf(val_text, sizeof(val_text), "%.6f", last_val);
    if (lead) {
        printf("done: %d steps in %s | final train loss %.6f | val loss %s | median step %.1f ms = %.0f tok/s | "
               "peak GPU memory %.2f GiB%s\n",
               (int)step_ms.size(), format_duration(now_seconds() - start).c_str(), train_loss, val_text, median_ms,
               total_batch / (median_ms * 1e-3), peak_used / 1073741824.0, dist.multi() ? " (rank 0)" : "");
        if (m.gelu_fusion > 0)
            printf("GELU fusion: %zu matmuls ran with a cuBLASLt GELU epilogue, %zu took the GELU kernels (no epilogue "
                   "algorithm for their shape)\n", blas().gelu_fused, blas().gelu_unfused);
        profiler().report();
    }
    close_run();
    gpt_free(m);
    return 0;
}
#endif
