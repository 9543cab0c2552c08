// checkpoint.h: the model and training-state files, and the commit protocol of a run folder's
// checkpoints. Host code only; test/checkpoint_tool.cu drives it without a GPU.
//
// Every file starts with a 256-int32 header, declared here as a struct with named fields; Python
// declares the same fields at the same places (gpt_reference.py, FORMATS), and test/test_formats.py
// checks that both sides write the same bytes for the same values.
//   model file  (ours, kModelFileMagic): the config, then every parameter as fp32 in the order of
//               GPT_PARAMETER_TENSORS (model_config.h), per-layer tensors stacked over the layers
//   llm.c's model file (kLlmcModelMagic): the same parameters, fp32 or bf16, no checksum
//   state file  (kTrainStateMagic): a run's position and setup, then fp32 master weights, AdamW m and
//               AdamW v, whole (whatever the number of GPUs that wrote them, so a run saved on N GPUs
//               resumes on M), then the outlier guard's two windows (outlier_guard.h's OutlierWindows,
//               header.outlier_bytes of them; files written before the guard have none: 0), then the
//               FP8 delayed scales' amax history (fp32, header.fp8_history_bytes of it: train_gpt's
//               Fp8Buffers; 0 without -f8 1 and in files from before it)
//   reference   (kReferenceMagic): test_gpt's input from gpt_reference.py state
// The token and tokenizer files are llm.c's (fileio.h: TokenFileHeader, TokenizerHeader).
//
// The commit protocol: the model file is written first, then the state file, each atomically (temp
// file, fsync, rename, folder fsync: fileio.h). The state file is the commit record: a checkpoint
// is complete when its state file exists, and its model file was complete before that. A kill at
// any instant of a save therefore leaves every earlier checkpoint as it was and, at most, a temp
// file or a model file without its state file; neither counts as a checkpoint, and the next save
// removes them. Pruning (keep the newest K) runs only after a new checkpoint is complete and removes
// a checkpoint's state file before its model file.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fileio.h"
#include "model_config.h"
#include "outlier_guard.h"

constexpr int32_t kModelFileMagic = 20251101, kModelFileVersion = 1;
constexpr int32_t kTrainStateMagic = 20251103, kTrainStateVersion = 2;
// The unit of a state file's data position: sequences of T+1 tokens (dataloader.h), or, in files
// written before the unit was recorded, windows of B*T+1 tokens starting every B*T.
constexpr int32_t kCursorWindows = 0, kCursorSequences = 1;
constexpr int32_t kLlmcModelMagic = 20240326, kLlmcModelFp32 = 3, kLlmcModelBf16 = 5;
constexpr int HEADER_INTS = 256;

struct ModelFileHeader {
    int32_t magic = kModelFileMagic, version = kModelFileVersion;
    int32_t L = 0, NH = 0, C = 0, maxT = 0, V = 0, Vp = 0;
    uint32_t crc = 0;  // crc32 of the header (with this field 0) and the parameters; 0 = not recorded
    int32_t unused[247] = {};
};

struct LlmcModelHeader {
    int32_t magic = kLlmcModelMagic, version = kLlmcModelFp32;  // kLlmcModelFp32 or kLlmcModelBf16
    int32_t maxT = 0, V = 0, L = 0, NH = 0, C = 0, Vp = 0;
    int32_t unused[248] = {};
};

struct TrainStateHeader {
    int32_t magic = kTrainStateMagic, version = kTrainStateVersion;
    int32_t step = 0;  // completed optimizer steps
    int32_t B = 0, T = 0;
    uint32_t crc = 0;  // crc32 of the header (with this field 0), the three arrays and the outlier windows
    int32_t unused6[2] = {};
    uint64_t num_params = 0;
    uint64_t loader_epoch = 0, loader_cursor = 0;  // the data position (dataloader.h), in cursor_unit
    uint64_t sampler_rng = 0;
    int64_t seed = 0;          // -sd
    int32_t shuffle = 0;       // -sh
    uint32_t data_crc = 0;     // the training data's fingerprint (TokenStream::fingerprint)
    uint64_t data_tokens = 0;  // the training data's token count
    int32_t gelu_fusion = 0, recompute = 0;  // -ge, -r
    uint64_t total_batch = 0;  // tokens per step (0 in files written before it was recorded)
    int32_t head = 0;  // the LM head: 1 the logits and the classifier, 2 the exp head, 0 not recorded (the logits)
    // Bytes of the outlier guard's windows after the three arrays: sizeof(OutlierWindows), or 0 in
    // files written before the guard (they load with empty windows).
    uint32_t outlier_bytes = 0;
    int32_t fp8 = 0;  // -f8 (0 in files written before it was recorded, which trained in bf16)
    uint32_t fp8_history_bytes = 0;  // bytes of the FP8 amax history after the outlier windows (0: none)
    int64_t fp8_history_steps = 0;   // training steps that history has seen
    int32_t unused32[223] = {};
    int32_t cursor_unit = 0;  // loader_cursor's unit: kCursorSequences, or kCursorWindows (0: files from before it)
};

// test_gpt's input, written by gpt_reference.py state: one batch, the logits, the loss and every
// parameter gradient after one forward/backward, the losses of K AdamW steps with these settings.
constexpr int32_t kReferenceMagic = 20251102, kReferenceVersion = 1;
struct ReferenceHeader {
    int32_t magic = kReferenceMagic, version = kReferenceVersion;
    int32_t B = 0, T = 0, K = 0;
    int32_t L = 0, NH = 0, C = 0, maxT = 0, V = 0, Vp = 0;
    int32_t unused11[5] = {};
    float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, clip = 0;
    int32_t unused22[234] = {};
};

static_assert(sizeof(ReferenceHeader) == HEADER_INTS * 4 && offsetof(ReferenceHeader, lr) == 16 * 4, "reference header");
static_assert(sizeof(ModelFileHeader) == HEADER_INTS * 4 && offsetof(ModelFileHeader, crc) == 8 * 4, "model file header");
static_assert(sizeof(LlmcModelHeader) == HEADER_INTS * 4, "llm.c model file header");
static_assert(sizeof(TrainStateHeader) == HEADER_INTS * 4 && offsetof(TrainStateHeader, crc) == 5 * 4 &&
                  offsetof(TrainStateHeader, num_params) == 8 * 4 && offsetof(TrainStateHeader, seed) == 16 * 4 &&
                  offsetof(TrainStateHeader, data_tokens) == 20 * 4 && offsetof(TrainStateHeader, total_batch) == 24 * 4 &&
                  offsetof(TrainStateHeader, head) == 26 * 4 && offsetof(TrainStateHeader, outlier_bytes) == 27 * 4 &&
                  offsetof(TrainStateHeader, fp8) == 28 * 4 && offsetof(TrainStateHeader, fp8_history_bytes) == 29 * 4 &&
                  offsetof(TrainStateHeader, fp8_history_steps) == 30 * 4 &&
                  offsetof(TrainStateHeader, cursor_unit) == 255 * 4,
              "state file header");

// ---------------------------------------------------------------------------------------------
// Model files

inline GPTConfig config_of(const ModelFileHeader& h) { return GPTConfig{h.L, h.NH, h.C, h.maxT, h.V, h.Vp}; }
inline GPTConfig config_of(const LlmcModelHeader& h) { return GPTConfig{h.L, h.NH, h.C, h.maxT, h.V, h.Vp}; }

// crc32 of a header whose crc field is taken as 0, then of the payload.
template <typename Header> uint32_t header_and_payload_crc(const Header& header, const void* payload, size_t bytes) {
    Header h = header;
    h.crc = 0;
    return crc32(payload, bytes, crc32(&h, sizeof(h)));
}

// A model file's header (ours or llm.c's), checked: magic, version, config, and the file's size
// against that config. Leaves `f` open for the parameters; *bf16 tells llm.c's bf16 files.
inline bool read_model_header(const std::string& path, InputFile& f, ModelFileHeader& ours, GPTConfig& c, bool* llmc,
                              bool* bf16, std::string* error) {
    if (!f.open_file(path, error)) return false;
    if (f.size < sizeof(ours)) {
        *error = "checkpoint '" + path + "' is truncated (" + std::to_string(f.size) + " bytes, no complete header)";
        return false;
    }
    if (!f.read_at(0, &ours, sizeof(ours), error)) return false;
    LlmcModelHeader llmc_header;
    memcpy(static_cast<void*>(&llmc_header), &ours, sizeof(llmc_header));
    *llmc = ours.magic == kLlmcModelMagic;
    if (!*llmc && ours.magic != kModelFileMagic) {
        *error = "'" + path + "' is not a model checkpoint (bad magic " + std::to_string(ours.magic) + ", expected " +
                 std::to_string(kModelFileMagic) + ", or llm.c's " + std::to_string(kLlmcModelMagic) + ")";
        return false;
    }
    if (*llmc ? (ours.version != kLlmcModelFp32 && ours.version != kLlmcModelBf16) : ours.version != kModelFileVersion) {
        *error = (*llmc ? "llm.c model file '" : "checkpoint '") + path + "' has version " + std::to_string(ours.version) +
                 ", expected " + (*llmc ? "3 (fp32) or 5 (bf16)" : std::to_string(kModelFileVersion));
        return false;
    }
    c = *llmc ? config_of(llmc_header) : config_of(ours);
    const std::string bad = config_error(c);
    if (!bad.empty()) {
        *error = "checkpoint '" + path + "': " + bad;
        return false;
    }
    *bf16 = *llmc && ours.version == kLlmcModelBf16;
    const uint64_t expected = sizeof(ours) + uint64_t(num_parameters(c)) * (*bf16 ? 2 : 4);
    if (f.size != expected) {
        *error = "checkpoint '" + path + "' has " + std::to_string(f.size) + " bytes, expected " + std::to_string(expected) +
                 " for its config (truncated or corrupt)";
        return false;
    }
    return true;
}

// The config of a model file, from its checked header (the parameters are not read).
inline bool read_model_config(const std::string& path, GPTConfig& c, std::string* error) {
    InputFile f;
    ModelFileHeader ours;
    bool llmc = false, bf16 = false;
    return read_model_header(path, f, ours, c, &llmc, &bf16, error);
}

// Reads and validates a model file: ours or llm.c's. On any problem returns false with *error set
// (resume skips a bad checkpoint; a model given by -e is fatal). The header's config is checked
// against the file's size before anything is allocated.
inline bool read_model_file(const std::string& path, HostModel& m, std::string* error) {
    InputFile f;
    ModelFileHeader ours;
    GPTConfig c;
    bool llmc = false, bf16 = false;
    if (!read_model_header(path, f, ours, c, &llmc, &bf16, error)) return false;
    const size_t n = num_parameters(c);
    m.config = c;
    m.params.resize(n);
    if (!bf16) {
        if (!f.read_at(sizeof(ours), m.params.data(), n * sizeof(float), error)) return false;
    } else {  // bf16 -> fp32 is exact: the bf16 bits are the top half of the float's
        std::vector<uint16_t> half(n);
        if (!f.read_at(sizeof(ours), half.data(), n * sizeof(uint16_t), error)) return false;
        for (size_t i = 0; i < n; i++) {
            const uint32_t bits = uint32_t(half[i]) << 16;
            memcpy(&m.params[i], &bits, sizeof(bits));
        }
    }
    if (!llmc && ours.crc != 0 && ours.crc != header_and_payload_crc(ours, m.params.data(), n * sizeof(float))) {
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

inline bool write_model_file(const std::string& path, const GPTConfig& c, const std::vector<float>& params, std::string* error) {
    ModelFileHeader h;
    h.L = c.L, h.NH = c.NH, h.C = c.C, h.maxT = c.maxT, h.V = c.V, h.Vp = c.Vp;
    h.crc = header_and_payload_crc(h, params.data(), params.size() * sizeof(float));
    return write_file_atomic(path, {{&h, sizeof(h)}, {params.data(), params.size() * sizeof(float)}}, error);
}

// Whether `path` is a safetensors file (Hugging Face's format: an 8-byte header length, then JSON).
inline bool looks_like_safetensors(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;  // (a FIFO would block the open)
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return false;
    unsigned char head[9] = {};
    const bool read = fread(head, 1, sizeof(head), f) == sizeof(head);
    fclose(f);
    return read && head[8] == '{';
}

// Where `path` is a Hugging Face model (a folder with config.json or safetensors files, or a
// safetensors file), how to convert it into a model file; else "".
inline std::string hugging_face_hint(const std::string& path) {
    const bool folder = is_folder(path);
    const bool hf = folder ? file_exists(path + "/config.json") || file_exists(path + "/model.safetensors") ||
                                 file_exists(path + "/model.safetensors.index.json")
                           : looks_like_safetensors(path);
    if (!hf) return "";
    return std::string("a Hugging Face ") + (folder ? "model folder" : "safetensors file") +
           "; convert it first: $(cat build/python) gpt_reference.py import " + (folder ? path : dirname_of(path)) + " --out model.bin";
}

// ---------------------------------------------------------------------------------------------
// Checkpoints of a run folder: model_SSSSSSSS.bin and state_SSSSSSSS.bin.
//
// The run setup (T, seed, shuffle, training data, tokens per step) is recorded because the data
// position means nothing under another one: resuming with a different setup is an error, never a
// silent change of the data order. B is recorded too, but the data order does not depend on it (nor
// on the number of GPUs), so a run may resume with another. Another -ge or -r is allowed (a run may
// need -r 1 to fit a smaller GPU) with a warning: it rounds differently.

struct TrainState {
    int step = 0;  // completed optimizer steps
    uint64_t loader_epoch = 0, loader_cursor = 0, sampler_rng = 0;  // the data position in sequences
    bool shuffled_windows = false;  // an older file's position in a shuffled epoch of windows: no sequence continues it
    // The run setup the state belongs to.
    int B = 0, T = 0, shuffle = 0, gelu_fusion = 0, recompute = 0, fp8 = 0;
    int head = 0;  // as TrainStateHeader::head
    int64_t seed = 0;
    uint64_t data_tokens = 0, total_batch = 0;
    uint32_t data_crc = 0;
    OutlierWindows outliers;  // the outlier guard's (empty when the file predates it)
    std::vector<float> adam_m, adam_v;
    std::vector<float> fp8_history;  // -f8 1's amax history (empty without it, or in older files)
    int64_t fp8_history_steps = 0;
};

inline std::string checkpoint_path(const std::string& dir, const char* kind, int step) {
    char name[64];
    snprintf(name, sizeof(name), "%s_%08d.bin", kind, step);
    return dir + "/" + name;
}

inline TrainStateHeader state_header(const TrainState& st, size_t num_params) {
    TrainStateHeader h;
    h.step = st.step, h.B = st.B, h.T = st.T;
    h.num_params = num_params;
    h.loader_epoch = st.loader_epoch, h.loader_cursor = st.loader_cursor, h.sampler_rng = st.sampler_rng;
    h.seed = st.seed, h.shuffle = st.shuffle, h.data_crc = st.data_crc, h.data_tokens = st.data_tokens;
    h.gelu_fusion = st.gelu_fusion, h.recompute = st.recompute, h.fp8 = st.fp8;
    h.total_batch = st.total_batch, h.head = st.head;
    h.cursor_unit = kCursorSequences;
    h.outlier_bytes = sizeof(OutlierWindows);
    h.fp8_history_bytes = uint32_t(st.fp8_history.size() * sizeof(float));
    h.fp8_history_steps = st.fp8_history_steps;
    return h;
}

inline void state_from_header(const TrainStateHeader& h, TrainState& st) {
    st.step = h.step, st.B = h.B, st.T = h.T;
    st.loader_epoch = h.loader_epoch, st.loader_cursor = h.loader_cursor, st.sampler_rng = h.sampler_rng;
    st.seed = h.seed, st.shuffle = h.shuffle, st.data_crc = h.data_crc, st.data_tokens = h.data_tokens;
    st.gelu_fusion = h.gelu_fusion, st.recompute = h.recompute, st.fp8 = h.fp8;
    st.total_batch = h.total_batch, st.head = h.head;
    st.fp8_history_steps = h.fp8_history_steps;
    // An older file counts windows of B*T tokens: window i is sequences [i B, i B + B), so a position
    // in order converts exactly, and one at its epoch's last window (whose next read was the next
    // epoch's first window) is the next epoch's start. A shuffled one is a permutation of windows,
    // which none continues.
    st.shuffled_windows = h.cursor_unit == kCursorWindows && h.shuffle;
    if (h.cursor_unit == kCursorWindows && !h.shuffle) {
        const uint64_t window = uint64_t(h.B) * h.T, windows = window && h.data_tokens ? (h.data_tokens - 1) / window : 0;
        if (windows && h.loader_cursor == windows) st.loader_epoch = h.loader_epoch + 1, st.loader_cursor = 0;
        else st.loader_cursor = h.loader_cursor * uint64_t(h.B);
    }
}

// The state file's crc32: the header (crc 0), the three arrays, then header.outlier_bytes of `outliers`
// and header.fp8_history_bytes of fp8_history (none for a file that predates them, whose crc stays what
// it was).
inline uint32_t state_crc(const TrainStateHeader& header, const std::vector<float>& params, const std::vector<float>& adam_m,
                          const std::vector<float>& adam_v, const OutlierWindows& outliers, const std::vector<float>& fp8_history) {
    TrainStateHeader h = header;
    h.crc = 0;
    const size_t bytes = params.size() * sizeof(float);
    uint32_t crc = crc32(&h, sizeof(h));
    crc = crc32(params.data(), bytes, crc);
    crc = crc32(adam_m.data(), bytes, crc);
    crc = crc32(adam_v.data(), bytes, crc);
    crc = crc32(&outliers, header.outlier_bytes, crc);
    return crc32(fp8_history.data(), header.fp8_history_bytes, crc);
}

// Writes checkpoint st.step into dir (model file, then state file: the commit). On failure (a full
// disk, an I/O error) returns false with *error; nothing of this step is left behind and every
// earlier checkpoint is untouched.
inline bool write_checkpoint(const std::string& dir, const GPTConfig& config, const TrainState& st, const std::vector<float>& params,
                             const std::vector<float>& adam_m, const std::vector<float>& adam_v, std::string* error) {
    const size_t bytes = params.size() * sizeof(float);
    TrainStateHeader h = state_header(st, params.size());
    h.crc = state_crc(h, params, adam_m, adam_v, st.outliers, st.fp8_history);
    const std::string model_path = checkpoint_path(dir, "model", st.step), state_path = checkpoint_path(dir, "state", st.step);
    if (!write_model_file(model_path, config, params, error) ||
        !write_file_atomic(state_path, {{&h, sizeof(h)}, {params.data(), bytes}, {adam_m.data(), bytes}, {adam_v.data(), bytes},
                                        {&st.outliers, sizeof(st.outliers)},
                                        {st.fp8_history.data(), st.fp8_history.size() * sizeof(float)}}, error)) {
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
    if (!read_model_file(model_path, model, error)) return false;
    const std::string path = checkpoint_path(dir, "state", step);
    InputFile f;
    if (!f.open_file(path, error)) return false;
    const size_t n = model.params.size();
    TrainStateHeader h;
    if (f.size < sizeof(h) || !f.read_at(0, &h, sizeof(h), error) || h.magic != kTrainStateMagic ||
        h.version != kTrainStateVersion || (h.cursor_unit != kCursorWindows && h.cursor_unit != kCursorSequences)) {
        *error = "'" + path + "' is not a training-state file of this version";
        return false;
    }
    if (h.outlier_bytes != 0 && h.outlier_bytes != sizeof(OutlierWindows)) {
        *error = "'" + path + "' says its outlier windows take " + std::to_string(h.outlier_bytes) + " bytes, expected " +
                 std::to_string(sizeof(OutlierWindows)) + " (or 0)";
        return false;
    }
    if (h.fp8_history_bytes % sizeof(float) || h.fp8_history_bytes > (64u << 20) || h.fp8_history_steps < 0) {
        *error = "'" + path + "' says its FP8 amax history takes " + std::to_string(h.fp8_history_bytes) + " bytes after " +
                 std::to_string(h.fp8_history_steps) + " steps (whole floats, at most 64 MiB, and steps >= 0)";
        return false;
    }
    const uint64_t expected = sizeof(h) + 3 * uint64_t(n) * sizeof(float) + h.outlier_bytes + h.fp8_history_bytes;
    if (f.size != expected || h.num_params != n) {
        *error = "'" + path + "' has " + std::to_string(f.size) + " bytes, expected " + std::to_string(expected);
        return false;
    }
    std::vector<float> params(n);
    st.adam_m.resize(n), st.adam_v.resize(n);
    const size_t bytes = n * sizeof(float);
    OutlierWindows outliers;  // empty unless the file holds them
    std::vector<float> fp8_history(h.fp8_history_bytes / sizeof(float));
    if (!f.read_at(sizeof(h), params.data(), bytes, error) || !f.read_at(sizeof(h) + bytes, st.adam_m.data(), bytes, error) ||
        !f.read_at(sizeof(h) + 2 * bytes, st.adam_v.data(), bytes, error) ||
        !f.read_at(sizeof(h) + 3 * bytes, &outliers, h.outlier_bytes, error) ||
        !f.read_at(sizeof(h) + 3 * bytes + h.outlier_bytes, fp8_history.data(), h.fp8_history_bytes, error))
        return false;
    if (h.crc != state_crc(h, params, st.adam_m, st.adam_v, outliers, fp8_history)) {
        *error = "'" + path + "' fails its checksum (corrupt or partly written)";
        return false;
    }
    if (!outlier_window_valid(outliers.loss) || !outlier_window_valid(outliers.norm)) {
        *error = "'" + path + "' holds outlier windows no run could have written (a count, position or value out of range)";
        return false;
    }
    if (h.step != step) {
        *error = "'" + path + "' holds step " + std::to_string(h.step) + ", its name says " + std::to_string(step);
        return false;
    }
    model.params = std::move(params);  // the fp32 master weights (exact), not the model file's copy
    state_from_header(h, st);
    st.outliers = outliers;
    st.fp8_history = std::move(fp8_history);
    return true;
}

// The model file -e names: a model file as it is, or a run folder's newest complete checkpoint. Ends
// with one line for a Hugging Face folder or file (how to convert it) or a folder without checkpoints.
inline std::string model_file_of(const std::string& model) {
    const std::string hf = hugging_face_hint(model);
    if (!hf.empty()) fail("-e %s: %s", model.c_str(), hf.c_str());
    if (!is_folder(model)) return model;
    for (int step : checkpoint_steps(model))
        if (file_exists(checkpoint_path(model, "model", step))) return checkpoint_path(model, "model", step);
    fail("-e %s: the folder holds no complete checkpoint (train with -o %s first)", model.c_str(), model.c_str());
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
