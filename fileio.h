// fileio.h: host-side file formats and helpers shared by the training program and its tools.
//   - InputFile / read_whole_file: regular files only (never a FIFO or device), read with pread,
//     bounded by the file's checked size
//   - write_file_atomic: temp file, fsync, rename, folder fsync
//   - TokenStream: llm.c's token files (256 x int32 header: magic 20240520, version 1, count; then
//     count uint16 tokens), one or many shards named by a glob, streamed window by window
//   - help_asked / for_each_flag / parse_int_flag / parse_float_flag: strict command lines
//   - crc32: the standard CRC-32 (zlib's), for checkpoint checksums
// Files are little-endian, as every machine this runs on is. Readers and writers return errors (a
// failed checkpoint write need not end a long run) or end in fail(): one line naming the file and
// what was expected.
#pragma once

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.cuh"

constexpr int TOKEN_FILE_MAGIC = 20240520;
constexpr int TOKEN_FILE_VERSION = 1;
constexpr int TOKENIZER_MAGIC = 20240328;
constexpr size_t FILE_HEADER_BYTES = 256 * sizeof(int32_t);

// llm.c's token file: this header, then `count` uint16 tokens.
struct TokenFileHeader {
    int32_t magic = TOKEN_FILE_MAGIC, version = TOKEN_FILE_VERSION;
    int32_t count = 0;
    int32_t unused[253] = {};
};
// llm.c's tokenizer file: this header, then each token as a length byte and its bytes.
struct TokenizerHeader {
    int32_t magic = TOKENIZER_MAGIC, version = 2;  // version 1 has no eot_token
    int32_t vocab_size = 0, eot_token = 0;
    int32_t unused[252] = {};
};
static_assert(sizeof(TokenFileHeader) == FILE_HEADER_BYTES && sizeof(TokenizerHeader) == FILE_HEADER_BYTES, "file headers");

// ---------------------------------------------------------------------------------------------
// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), the same value as zlib's crc32 and Python's
// zlib.crc32. Pass the previous result as `crc` to checksum data in pieces.

inline uint32_t crc32(const void* data, size_t n, uint32_t crc = 0) {
    static const std::vector<uint32_t> table = [] {
        std::vector<uint32_t> t(256);
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            t[i] = c;
        }
        return t;
    }();
    const uint8_t* p = static_cast<const uint8_t*>(data);
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

// ---------------------------------------------------------------------------------------------
// Input files. Every input is checked to be a regular file before it is opened: a FIFO would block
// the reader forever, a device (/dev/zero, /dev/urandom) never ends, a folder is not data. Reads go
// through pread at known offsets, so no allocation is ever sized by a header that was not first
// checked against the file's real size.

inline bool file_exists(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
}

inline bool is_folder(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The folder part of a path: "a/b/c.bin" -> "a/b", "c.bin" -> ".".
inline std::string dirname_of(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

// An open regular file, read with pread. Move-only; closes itself.
struct InputFile {
    std::string path;
    int fd = -1;
    uint64_t size = 0;

    InputFile() = default;
    InputFile(const InputFile&) = delete;
    InputFile& operator=(const InputFile&) = delete;
    InputFile(InputFile&& o) noexcept : path(std::move(o.path)), fd(o.fd), size(o.size) { o.fd = -1; }
    InputFile& operator=(InputFile&& o) noexcept {
        if (this != &o) {
            close_file();
            path = std::move(o.path), fd = o.fd, size = o.size, o.fd = -1;
        }
        return *this;
    }
    ~InputFile() { close_file(); }
    void close_file() {
        if (fd >= 0) close(fd);
        fd = -1;
    }

    bool open_file(const std::string& p, std::string* error) {
        close_file();
        path = p;
        struct stat st;
        if (stat(p.c_str(), &st) != 0) return set(error, "cannot open " + p + ": " + strerror(errno));
        if (S_ISDIR(st.st_mode)) return set(error, p + " is a folder, not a file");
        if (!S_ISREG(st.st_mode)) return set(error, p + " is not a regular file (a pipe, device or socket cannot be read as data)");
        // O_NONBLOCK: should the path be swapped for a FIFO after the stat, open still returns at once.
        fd = open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0) return set(error, "cannot open " + p + ": " + strerror(errno));
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            close_file();
            return set(error, p + " is not a regular file");
        }
        size = uint64_t(st.st_size);
        return true;
    }
    // Reads exactly n bytes at offset; a short read (the file shrank) is an error.
    bool read_at(uint64_t offset, void* dst, size_t n, std::string* error) const {
        char* p = static_cast<char*>(dst);
        while (n > 0) {
            const ssize_t got = pread(fd, p, std::min<size_t>(n, size_t(1) << 30), off_t(offset));
            if (got < 0 && errno == EINTR) continue;
            if (got < 0) return set(error, "cannot read " + path + ": " + strerror(errno));
            if (got == 0) return set(error, "cannot read " + path + ": it ended early (changed while in use?)");
            p += got, offset += uint64_t(got), n -= size_t(got);
        }
        return true;
    }

  private:
    static bool set(std::string* error, const std::string& what) {
        if (error) *error = what;
        return false;
    }
};

// A whole regular file of at most max_bytes (the bound keeps a huge or wrong file from being
// allocated: callers pass what their format can need).
inline bool read_whole_file(const std::string& path, std::vector<uint8_t>& bytes, std::string* error,
                            uint64_t max_bytes = uint64_t(1) << 30) {
    bytes.clear();
    InputFile f;
    if (!f.open_file(path, error)) return false;
    if (f.size > max_bytes) {
        if (error) *error = path + " has " + std::to_string(f.size) + " bytes, more than the " + std::to_string(max_bytes) +
                            " this kind of file can have";
        return false;
    }
    bytes.resize(f.size);
    return f.read_at(0, bytes.data(), bytes.size(), error);
}

// ---------------------------------------------------------------------------------------------
// Atomic writes. Temp file in the same folder (rename is atomic only within one file system), every
// chunk written, fsync, rename over `path`, then fsync of the folder: a crash leaves either the old
// file or the new one, never half of one, and once this returns true the new name is on disk. On
// failure the temp file is removed and `path` is untouched. `mode`: the new file's permissions
// (0600 for a file that only its owner may read).

inline bool sync_folder_of(const std::string& path, std::string* error) {
    const size_t slash = path.find_last_of('/');
    const std::string folder = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    const int dir_fd = open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0 || fsync(dir_fd) != 0) {
        if (error) *error = "cannot sync folder " + folder + ": " + strerror(errno);
        if (dir_fd >= 0) close(dir_fd);
        return false;
    }
    close(dir_fd);
    return true;
}

inline bool write_file_atomic(const std::string& path, const std::vector<std::pair<const void*, size_t>>& chunks,
                              std::string* error, mode_t mode = 0644) {
    auto set_error = [&](const char* what, const std::string& target) {
        if (error) *error = std::string(what) + " " + target + ": " + strerror(errno);
        return false;
    };
    std::string tmp = path + ".tmp.XXXXXX";
    int fd = mkstemp(&tmp[0]);
    if (fd < 0) return set_error("cannot create a temp file for", path);
    if (mode != 0600) fchmod(fd, mode);  // mkstemp makes it 0600; a checkpoint is an ordinary file (0644)
    auto abandon = [&](const char* what, const std::string& target) {
        set_error(what, target);
        if (fd >= 0) close(fd);
        unlink(tmp.c_str());
        return false;
    };
    for (const auto& chunk : chunks) {
        const char* p = static_cast<const char*>(chunk.first);
        size_t left = chunk.second;
        while (left > 0) {
            ssize_t n = write(fd, p, std::min<size_t>(left, size_t(1) << 30));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                if (n == 0) errno = ENOSPC;
                return abandon("cannot write", tmp);
            }
            p += n;
            left -= size_t(n);
        }
    }
    if (fsync(fd) != 0) return abandon("cannot fsync", tmp);
    const int closed = close(fd);
    fd = -1;
    if (closed != 0) return abandon("cannot close", tmp);
    if (rename(tmp.c_str(), path.c_str()) != 0) return abandon("cannot rename a temp file onto", path);
    // The rename lives in the folder: sync it too, so the new name is on disk before anything (the
    // next file of a checkpoint, pruning older checkpoints) relies on it.
    return sync_folder_of(path, error);
}

// ---------------------------------------------------------------------------------------------
// Token files and token streams. A token file is llm.c's: 256 x int32 header (magic 20240520,
// version 1, token count), then that many uint16 tokens. A TokenStream is the concatenation of the
// token files a glob pattern names, in sorted path order (data/prepare_text.py writes shards
// NAME_train_000001.bin, NAME_train_000002.bin, ...). It is read window by window with pread: only
// the headers are read at open, so a corpus of any size takes a few MB of host memory.

// Paths matching `pattern`, sorted. A pattern without wildcards, or one that names a path that exists
// (a folder `run[1]` holds no glob), is taken as that path as it is.
inline std::vector<std::string> expand_glob(const std::string& pattern) {
    struct stat st;
    if (pattern.find_first_of("*?[") == std::string::npos || lstat(pattern.c_str(), &st) == 0) return {pattern};
    std::vector<std::string> paths;
    glob_t g;
    if (glob(pattern.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++) paths.emplace_back(g.gl_pathv[i]);
    globfree(&g);
    std::sort(paths.begin(), paths.end());
    return paths;
}

struct TokenStream {
    struct Shard {
        InputFile file;
        uint64_t first = 0, count = 0;  // its tokens are [first, first + count) of the stream
    };
    std::string pattern;
    std::vector<Shard> shards;
    uint64_t total = 0;
    int vocab_size = 0;

    // Opens every file of `pattern` and checks its header against its size. false + *error on a
    // bad input (the caller names the flag).
    bool open(const std::string& pat, int vocab, std::string* error) {
        pattern = pat, vocab_size = vocab, shards.clear(), total = 0;
        const std::vector<std::string> paths = expand_glob(pat);
        if (paths.empty()) {
            *error = "no file matches '" + pat + "'";
            return false;
        }
        for (const std::string& p : paths) {
            Shard s;
            if (!s.file.open_file(p, error)) return false;
            const char* name = p.c_str();
            char buf[256];
            if (s.file.size < FILE_HEADER_BYTES) {
                snprintf(buf, sizeof(buf), "token file %s: %llu bytes, expected at least a %zu-byte header", name,
                         (unsigned long long)s.file.size, FILE_HEADER_BYTES);
                *error = buf;
                return false;
            }
            TokenFileHeader header;
            if (!s.file.read_at(0, &header, FILE_HEADER_BYTES, error)) return false;
            if (header.magic != TOKEN_FILE_MAGIC) {
                snprintf(buf, sizeof(buf), "token file %s: magic %d, expected %d (not a token file from data/)", name,
                         header.magic, TOKEN_FILE_MAGIC);
                *error = buf;
                return false;
            }
            if (header.version != TOKEN_FILE_VERSION) {
                snprintf(buf, sizeof(buf), "token file %s: version %d, expected %d (uint16 GPT-2 tokens)", name, header.version,
                         TOKEN_FILE_VERSION);
                *error = buf;
                return false;
            }
            if (header.count < 1) {
                snprintf(buf, sizeof(buf), "token file %s: header says %d tokens, expected at least 1", name, header.count);
                *error = buf;
                return false;
            }
            s.count = uint64_t(header.count);
            if (s.file.size != FILE_HEADER_BYTES + 2 * s.count) {
                snprintf(buf, sizeof(buf), "token file %s: %llu bytes, expected %llu (header + %llu uint16 tokens); truncated or corrupt?",
                         name, (unsigned long long)s.file.size, (unsigned long long)(FILE_HEADER_BYTES + 2 * s.count),
                         (unsigned long long)s.count);
                *error = buf;
                return false;
            }
            s.first = total;
            total += s.count;
            shards.push_back(std::move(s));
        }
        return true;
    }

    // Tokens [start, start + n) of the stream into out, each checked against the vocabulary (one bad
    // id would index past the embedding table on the GPU). fail() names the file and position.
    void read(uint64_t start, size_t n, uint16_t* out) const {
        if (start + n > total) fail("token stream '%s': tokens %llu..%llu asked, it holds %llu", pattern.c_str(),
                                    (unsigned long long)start, (unsigned long long)(start + n), (unsigned long long)total);
        // The shard holding `start`: the last whose first token is <= start.
        size_t i = std::upper_bound(shards.begin(), shards.end(), start, [](uint64_t v, const Shard& s) { return v < s.first; }) -
                   shards.begin() - 1;
        std::string error;
        while (n > 0) {
            const Shard& s = shards[i];
            const uint64_t local = start - s.first;
            const size_t take = (size_t)std::min<uint64_t>(n, s.count - local);
            if (!s.file.read_at(FILE_HEADER_BYTES + 2 * local, out, 2 * take, &error)) fail("token file %s", error.c_str());
            for (size_t k = 0; k < take; k++)
                if (out[k] >= vocab_size)
                    fail("token file %s: token %u at position %llu, expected ids below the vocab size %d", s.file.path.c_str(),
                         out[k], (unsigned long long)(local + k), vocab_size);
            out += take, start += take, n -= take, i++;
        }
    }

    // What a checkpoint records of its training data. Up to kFullCrcTokens tokens: the crc32 of all
    // of them, in order. Beyond: the crc32 of 64 spread blocks of 64K tokens and the count, so that
    // resuming a run on a multi-GB corpus does not read all of it.
    static constexpr uint64_t kFullCrcTokens = uint64_t(1) << 24;
    uint32_t fingerprint() const {
        std::vector<uint16_t> chunk;
        uint32_t crc = 0;
        auto add = [&](uint64_t at, size_t n) {
            chunk.resize(n);
            read(at, n, chunk.data());
            crc = crc32(chunk.data(), n * sizeof(uint16_t), crc);
        };
        if (total <= kFullCrcTokens) {
            for (uint64_t at = 0; at < total; at += uint64_t(1) << 20) add(at, (size_t)std::min<uint64_t>(uint64_t(1) << 20, total - at));
            return crc;
        }
        const uint64_t block = uint64_t(1) << 16;
        for (int k = 0; k < 64; k++) add((total - block) / 63 * k, block);
        return crc32(&total, sizeof(total), crc);
    }
};

// A single token file read whole (tools and tests; training streams with TokenStream).
struct TokenFile {
    std::string path;
    std::vector<uint16_t> tokens;
};

inline TokenFile read_token_file(const std::string& path, int vocab_size) {
    TokenStream stream;
    std::string error;
    if (!stream.open(path, vocab_size, &error)) fail("%s", error.rfind("token file", 0) == 0 ? error.c_str() : ("token file: " + error).c_str());
    TokenFile out{path, std::vector<uint16_t>(stream.total)};
    stream.read(0, out.tokens.size(), out.tokens.data());
    return out;
}

// ---------------------------------------------------------------------------------------------
// Command lines. Numbers: the whole string must be the number ("12x", "" and " 1" are errors), so a
// typo never silently becomes 0 or a truncated value.

// argv[i] starts a flag-value pair: a flag (not a stray word), with a value, given once (a flag given
// twice is an error, not "the last one wins"). `seen` collects the flags so far; `example` shows one.
// -h or --help among the flags (flag positions only: "-h" as a flag's value, a prompt say, is that value).
inline bool help_asked(int argc, char** argv) {
    for (int i = 1; i < argc; i += 2)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return true;
    return false;
}

// Calls take(flag, flag_name, value) for each "-flag value" pair of the command line, in order, after
// checking its form: a flag starts with '-', has a value, and is given once ("the last one wins"
// would hide a typo). `example` shows the form in the message.
template <typename Take> void for_each_flag(int argc, char** argv, const char* example, Take take) {
    std::vector<std::string> seen;
    for (int i = 1; i < argc; i += 2) {
        const std::string f = argv[i];
        if (f.size() < 2 || f[0] != '-') fail("unexpected argument '%s' (flags look like %s; -h lists them)", argv[i], example);
        if (i + 1 >= argc) fail("flag %s needs a value (-h lists the flags)", argv[i]);
        if (std::find(seen.begin(), seen.end(), f) != seen.end()) fail("flag %s is given twice", argv[i]);
        seen.push_back(f);
        take(f, argv[i], argv[i + 1]);
    }
}

inline long parse_int_flag(const char* flag, const char* value, long min, long max) {
    if (!value) fail("flag %s: expected an integer in [%ld, %ld], got nothing", flag, min, max);
    char* end = nullptr;
    errno = 0;
    long x = strtol(value, &end, 10);
    bool whole = value[0] != '\0' && !isspace((unsigned char)value[0]) && *end == '\0';
    if (!whole || errno == ERANGE || x < min || x > max)
        fail("flag %s: expected an integer in [%ld, %ld], got '%s'", flag, min, max, value);
    return x;
}

inline double parse_float_flag(const char* flag, const char* value, double min, double max) {
    if (!value) fail("flag %s: expected a number in [%g, %g], got nothing", flag, min, max);
    char* end = nullptr;
    errno = 0;
    double x = strtod(value, &end);
    bool whole = value[0] != '\0' && !isspace((unsigned char)value[0]) && *end == '\0';
    // !(x >= min) rather than x < min: also true for nan.
    if (!whole || errno == ERANGE || !std::isfinite(x) || !(x >= min) || !(x <= max))
        fail("flag %s: expected a number in [%g, %g], got '%s'", flag, min, max, value);
    return x;
}
