// fileio.h: host-side file formats and helpers shared by the training program and its tools.
//   - read_token_file: llm.c's token file (256 x int32 header: magic 20240520, version 1, count; then
//     count uint16 tokens), written by data/prepare_tinyshakespeare.py
//   - read_tokenizer / tokenizer_decode: llm.c's tokenizer file (256 x int32 header: magic 20240328,
//     version 1 or 2, vocab size, eot token (version 2); then per token a uint8 length and its bytes)
//   - write_file_atomic / read_whole_file / file_exists: checkpoints and logs; these return errors
//     instead of exiting, so a failed checkpoint write need not end a long run
//   - parse_int_flag / parse_float_flag: strict command-line numbers
//   - crc32: the standard CRC-32 (zlib's), for checkpoint checksums
// Files are little-endian, as every machine this runs on is. Input errors end in fail(): one line
// naming the file and what was expected.
#pragma once

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
#include <sys/stat.h>
#include <unistd.h>

#include "common.cuh"

constexpr int TOKEN_FILE_MAGIC = 20240520;
constexpr int TOKEN_FILE_VERSION = 1;
constexpr int TOKENIZER_MAGIC = 20240328;
constexpr size_t FILE_HEADER_BYTES = 256 * sizeof(int32_t);

// ---------------------------------------------------------------------------------------------
// Whole files, atomic writes.

inline bool file_exists(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
}

inline bool read_whole_file(const std::string& path, std::vector<uint8_t>& bytes, std::string* error) {
    bytes.clear();
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) {
        if (error) *error = "cannot open " + path + ": " + strerror(errno);
        return false;
    }
    // Read in chunks until EOF rather than trusting a size from fseek/ftell: works for pipes too.
    uint8_t buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) bytes.insert(bytes.end(), buf, buf + n);
    bool ok = !ferror(f);
    if (!ok && error) *error = "cannot read " + path + ": " + strerror(errno);
    fclose(f);
    return ok;
}

// Temp file in the same folder (rename is atomic only within one file system), every chunk written,
// fsync, then rename over `path`: a crash leaves either the old file or the new one, never half of
// one. On failure the temp file is removed and `path` is untouched.
inline bool write_file_atomic(const std::string& path, const std::vector<std::pair<const void*, size_t>>& chunks,
                              std::string* error) {
    auto set_error = [&](const char* what, const std::string& target) {
        if (error) *error = std::string(what) + " " + target + ": " + strerror(errno);
        return false;
    };
    std::string tmp = path + ".tmp.XXXXXX";
    int fd = mkstemp(&tmp[0]);
    if (fd < 0) return set_error("cannot create a temp file for", path);
    fchmod(fd, 0644);  // mkstemp makes it 0600; a checkpoint is an ordinary file
    for (const auto& chunk : chunks) {
        const char* p = static_cast<const char*>(chunk.first);
        size_t left = chunk.second;
        while (left > 0) {
            ssize_t n = write(fd, p, left);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                set_error("cannot write", tmp);
                close(fd);
                unlink(tmp.c_str());
                return false;
            }
            p += n;
            left -= size_t(n);
        }
    }
    if (fsync(fd) != 0) {
        set_error("cannot fsync", tmp);
        close(fd);
        unlink(tmp.c_str());
        return false;
    }
    if (close(fd) != 0) {
        set_error("cannot close", tmp);
        unlink(tmp.c_str());
        return false;
    }
    if (rename(tmp.c_str(), path.c_str()) != 0) {
        set_error("cannot rename a temp file onto", path);
        unlink(tmp.c_str());
        return false;
    }
    // The rename lives in the folder: sync it too, so after a power loss the new name is on disk
    // before anything (pruning older checkpoints, say) relies on it.
    const size_t slash = path.find_last_of('/');
    const std::string folder = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    const int dir_fd = open(folder.c_str(), O_RDONLY | O_DIRECTORY);
    if (dir_fd >= 0) {
        fsync(dir_fd);
        close(dir_fd);
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// Token files.

struct TokenFile {
    std::string path;
    std::vector<uint16_t> tokens;
};

inline TokenFile read_token_file(const std::string& path, int vocab_size) {
    std::vector<uint8_t> bytes;
    std::string error;
    if (!read_whole_file(path, bytes, &error)) fail("token file: %s", error.c_str());
    const char* p = path.c_str();
    if (bytes.size() < FILE_HEADER_BYTES)
        fail("token file %s: %zu bytes, expected at least a %zu-byte header", p, bytes.size(), FILE_HEADER_BYTES);
    int32_t header[256];
    memcpy(header, bytes.data(), FILE_HEADER_BYTES);
    if (header[0] != TOKEN_FILE_MAGIC)
        fail("token file %s: magic %d, expected %d (not a token file from data/prepare_tinyshakespeare.py?)", p,
             header[0], TOKEN_FILE_MAGIC);
    if (header[1] != TOKEN_FILE_VERSION)
        fail("token file %s: version %d, expected %d (uint16 GPT-2 tokens)", p, header[1], TOKEN_FILE_VERSION);
    int64_t count = header[2];
    if (count < 1) fail("token file %s: header says %lld tokens, expected at least 1", p, (long long)count);
    size_t expected = FILE_HEADER_BYTES + 2 * size_t(count);
    if (bytes.size() != expected)
        fail("token file %s: %zu bytes, expected %zu (header + %lld uint16 tokens); truncated or corrupt?", p,
             bytes.size(), expected, (long long)count);
    TokenFile out{path, std::vector<uint16_t>(count)};
    memcpy(out.tokens.data(), bytes.data() + FILE_HEADER_BYTES, 2 * size_t(count));
    // One bad id would index past the embedding table on the GPU; catch it here, with its position.
    for (size_t i = 0; i < out.tokens.size(); i++)
        if (out.tokens[i] >= vocab_size)
            fail("token file %s: token %u at position %zu, expected ids below the vocab size %d", p, out.tokens[i], i,
                 vocab_size);
    return out;
}

// ---------------------------------------------------------------------------------------------
// Tokenizer (for printing samples).

struct Tokenizer {
    std::vector<std::string> pieces;  // pieces[id] = the raw bytes of token id (not always valid UTF-8)
    int eot_token = -1;               // -1 in version-1 files, which do not record it
    int vocab_size = 0;
};

inline Tokenizer read_tokenizer(const std::string& path) {
    std::vector<uint8_t> bytes;
    std::string error;
    if (!read_whole_file(path, bytes, &error)) fail("tokenizer: %s", error.c_str());
    const char* p = path.c_str();
    if (bytes.size() < FILE_HEADER_BYTES)
        fail("tokenizer %s: %zu bytes, expected at least a %zu-byte header", p, bytes.size(), FILE_HEADER_BYTES);
    int32_t header[256];
    memcpy(header, bytes.data(), FILE_HEADER_BYTES);
    if (header[0] != TOKENIZER_MAGIC)
        fail("tokenizer %s: magic %d, expected %d (not a tokenizer file from data/prepare_tinyshakespeare.py?)", p,
             header[0], TOKENIZER_MAGIC);
    if (header[1] != 1 && header[1] != 2) fail("tokenizer %s: version %d, expected 1 or 2", p, header[1]);
    Tokenizer tok;
    tok.vocab_size = header[2];
    if (tok.vocab_size < 1) fail("tokenizer %s: vocab size %d, expected at least 1", p, tok.vocab_size);
    if (header[1] == 2) {
        tok.eot_token = header[3];
        if (tok.eot_token < 0 || tok.eot_token >= tok.vocab_size)
            fail("tokenizer %s: eot token %d, expected an id in [0, %d)", p, tok.eot_token, tok.vocab_size);
    }
    tok.pieces.reserve(tok.vocab_size);
    size_t pos = FILE_HEADER_BYTES;
    for (int id = 0; id < tok.vocab_size; id++) {
        if (pos >= bytes.size() || pos + 1 + bytes[pos] > bytes.size())
            fail("tokenizer %s: ends inside token %d of %d (%zu bytes); truncated?", p, id, tok.vocab_size,
                 bytes.size());
        size_t len = bytes[pos];
        if (len == 0) fail("tokenizer %s: token %d has length 0, expected at least 1 byte", p, id);
        tok.pieces.emplace_back(reinterpret_cast<const char*>(bytes.data() + pos + 1), len);
        pos += 1 + len;
    }
    if (pos != bytes.size())
        fail("tokenizer %s: %zu bytes after the last of %d tokens, expected none", p, bytes.size() - pos,
             tok.vocab_size);
    return tok;
}

inline const std::string& tokenizer_decode(const Tokenizer& tok, int token) {
    if (token < 0 || token >= tok.vocab_size)
        fail("tokenizer_decode: token %d, expected an id in [0, %d)", token, tok.vocab_size);
    return tok.pieces[token];
}

// ---------------------------------------------------------------------------------------------
// Command-line numbers. The whole string must be the number ("12x", "" and " 1" are errors), so a
// typo never silently becomes 0 or a truncated value.

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
