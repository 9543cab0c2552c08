// distributed.cuh: data-parallel training over NCCL, one process per GPU, on one node or several.
//
//   dist_from_env      rank, world size and local rank from the launcher: torchrun-style RANK /
//                      WORLD_SIZE / LOCAL_RANK (scripts/launch.sh sets them), mpirun (OMPI_COMM_WORLD_*),
//                      or srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID); none of them: one process
//   dist_rendezvous    the ranks meet at rank 0 over TCP, before any GPU work. Rank 0 listens on the
//                      address the ranks are told, and on no other: MASTER_ADDR / MASTER_PORT, -rz
//                      HOST:PORT, a file on a shared file system (-rz file:PATH: rank 0 writes its address
//                      there), Slurm's first node, or 127.0.0.1 when every rank runs on this node. Each
//                      rank proves that it knows the run's secret (GPT_RUN_SECRET, or PATH.secret beside
//                      -rz file:PATH) by challenge and response before it learns anything, and rank 0
//                      proves it back; then each sends its run setup (flags, data, model), rank 0 refuses
//                      ranks whose setup differs from its own and sends every rank NCCL's unique id. One
//                      deadline bounds every step on every rank
//   dist_init_nccl     the NCCL communicator and a communication stream, after the GPU is chosen
//   watchdog           the TCP connections stay open for the whole run: a rank that dies closes them,
//                      and a thread on every rank notices within a second, as it notices NCCL's
//                      asynchronous errors, a run that makes no progress for -wt seconds and rank 0
//                      working alone (a checkpoint write) for longer than that; it then ends its rank
//                      with one `error:` line. So a failure ends every rank, never a hang.
//   dist_finish        a last barrier, then each rank tells rank 0 it is done before closing.
//
// Nothing here needs MPI: mpirun and srun only start the processes. With world size 1 nothing here
// runs at all (no socket, no secret, no communicator): one GPU trains exactly as without this file.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common.cuh"
#include "fileio.h"

#if !defined(NO_NCCL)
#include <nccl.h>
#define nccl_check(expr) nccl_check_impl((expr), #expr, __FILE__, __LINE__)
inline void nccl_check_impl(ncclResult_t r, const char* expr, const char* file, int line) {
    if (r != ncclSuccess) fail("NCCL: %s (%s) at %s:%d", ncclGetErrorString(r), expr, file, line);
}
#endif

// ---------------------------------------------------------------------------------------------
// Ranks and shards (host arithmetic, unit-tested without a GPU).

// The part [begin, end) of n elements that `rank` of `world` owns: equal shards of shard_size(n,
// world) elements (the last ones may be shorter or empty), so that the shards can be all-gathered
// in place from a buffer padded to world * shard_size elements.
inline size_t shard_size(size_t n, int world) { return (n + world - 1) / world; }
inline size_t shard_begin(size_t n, int world, int rank) { return std::min(n, shard_size(n, world) * rank); }
inline size_t shard_end(size_t n, int world, int rank) { return std::min(n, shard_size(n, world) * (rank + 1)); }

// A checkpoint holds whole arrays whatever the number of GPUs that wrote it. Rank 0 assembles them
// from all-gathers of `k` elements at offset `at` of every rank's shard: `gathered` holds rank r's
// k elements at [r k, (r + 1) k); this puts them where they belong in the whole array `out` of n.
inline void place_gathered_chunk(float* out, size_t n, int world, size_t at, size_t k, const float* gathered) {
    const size_t S = shard_size(n, world);
    for (int r = 0; r < world; r++) {
        const size_t first = r * S + at, count = first < n ? std::min(k, n - first) : 0;
        std::copy(gathered + r * k, gathered + r * k + count, out + first);
    }
}

// Micro-batches per step and rank for a total batch of `total_batch` tokens: -d must split into
// whole micro-batches of B*T tokens on every rank. Returns 0 when it does not (the caller says so).
inline int micro_steps_per_rank(long total_batch, long B, long T, int world) {
    const long per_step = B * T * world;
    return total_batch > 0 && total_batch % per_step == 0 ? int(total_batch / per_step) : 0;
}

// ---------------------------------------------------------------------------------------------
// Which rank this process is.

struct Dist {
    int rank = 0, world = 1, local_rank = 0, local_world = 1;
    std::string launcher = "single process";
    std::string rendezvous;  // "host:port" of rank 0's control socket, or "file:PATH"
    // Control connections: rank 0 holds one per other rank, the others one to rank 0.
    std::vector<int> peers;  // rank 0: peers[r] for r >= 1 (peers[0] unused); others: peers[0]
    std::atomic<int> done_count{0};  // rank 0: how many ranks said they are done (dist_finish)
    std::thread watchdog;
    std::atomic<bool> stopping{false};
    std::atomic<double> last_progress{0.0};
    std::atomic<bool> solo{false};  // rank 0 works alone (writes a checkpoint, samples): the others wait for it
    std::atomic<double> solo_since{0.0};  // when it began (bounded by -wt too)
    int stall_seconds = 0;  // -wt: no progress, or rank 0 alone, for this long ends the run (0: never)
    cudaStream_t stream = nullptr;  // the gradients' all-reduces run here, beside the backward
#if !defined(NO_NCCL)
    ncclUniqueId id{};
    std::atomic<ncclComm_t> comm{nullptr};
    void* scratch = nullptr;        // a few bytes of device memory for scalar reductions
#endif
    bool multi() const { return world > 1; }
};

inline void dist_progress(Dist& d) { d.last_progress.store(now_seconds()); }

inline bool env_int(const char* name, int* out) {
    const char* v = getenv(name);
    if (!v || !*v) return false;
    *out = (int)parse_int_flag(name, v, 0, 1 << 20);  // a malformed launcher variable is a one-line error
    return true;
}

// Rank, world size and local rank from the launcher's environment. Which launcher is tried first
// matters where several are nested: torchrun's variables are set explicitly, so they win; srun's
// SLURM_STEP_NUM_TASKS exists inside a job step only (a batch script alone does not start ranks).
inline void dist_from_env(Dist& d) {
    if (env_int("WORLD_SIZE", &d.world)) {
        d.launcher = "RANK/WORLD_SIZE";
        if (!env_int("RANK", &d.rank)) fail("WORLD_SIZE is set but RANK is not (set both, and LOCAL_RANK, for each process)");
        if (!env_int("LOCAL_RANK", &d.local_rank)) d.local_rank = d.rank;
        if (!env_int("LOCAL_WORLD_SIZE", &d.local_world)) d.local_world = -1;
    } else if (env_int("OMPI_COMM_WORLD_SIZE", &d.world)) {
        d.launcher = "mpirun";
        env_int("OMPI_COMM_WORLD_RANK", &d.rank);
        env_int("OMPI_COMM_WORLD_LOCAL_RANK", &d.local_rank);
        if (!env_int("OMPI_COMM_WORLD_LOCAL_SIZE", &d.local_world)) d.local_world = -1;
    } else if (env_int("SLURM_STEP_NUM_TASKS", &d.world)) {
        d.launcher = "srun";
        env_int("SLURM_PROCID", &d.rank);
        env_int("SLURM_LOCALID", &d.local_rank);
        int nodes = 0;
        d.local_world = env_int("SLURM_STEP_NUM_NODES", &nodes) && nodes == 1 ? d.world : -1;
    }
    if (d.world < 1) fail("%s: world size %d, expected at least 1", d.launcher.c_str(), d.world);
    if (d.rank < 0 || d.rank >= d.world) fail("%s: rank %d is outside the world of %d ranks", d.launcher.c_str(), d.rank, d.world);
    if (d.local_rank < 0 || d.local_rank >= d.world)
        fail("%s: local rank %d is outside the world of %d ranks", d.launcher.c_str(), d.local_rank, d.world);
}

// The first host of a Slurm node list: "gpu[03-04,07],cpu1" -> "gpu03".
inline std::string slurm_first_host(const std::string& list) {
    const size_t comma = list.find(','), bracket = list.find('[');
    if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket)) return list.substr(0, comma);
    const size_t end = list.find_first_of("-,]", bracket + 1);
    if (end == std::string::npos) return list.substr(0, bracket);
    return list.substr(0, bracket) + list.substr(bracket + 1, end - bracket - 1);
}

// Where rank 0 listens. `spec` is -rz: "" (from the environment), "HOST:PORT", or "file:PATH".
inline std::string dist_rendezvous_address(const Dist& d, const std::string& spec) {
    if (!spec.empty()) return spec;
    const char* addr = getenv("MASTER_ADDR");
    const char* port = getenv("MASTER_PORT");
    const std::string p = port && *port ? port : "29500";  // torchrun's default port
    if (addr && *addr) return std::string(addr) + ":" + p;
    if (d.local_world == d.world) return "127.0.0.1:" + p;  // every rank on this node
    const char* nodes = getenv("SLURM_STEP_NODELIST");
    if (d.launcher == "srun" && nodes && *nodes) return slurm_first_host(nodes) + ":" + p;
    fail("%d ranks over several nodes: say where rank 0 listens with MASTER_ADDR (its host) and MASTER_PORT, or with "
         "-rz HOST:PORT or -rz file:PATH (a file on a file system every node sees)", d.world);
}

// ---------------------------------------------------------------------------------------------
// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), for the rendezvous' challenge and response. Each
// rank hashes a few kilobytes once, so plain code is fast enough; test/test_distributed checks them
// against the standards' test vectors.

struct Sha256 {
    uint32_t h[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au, 0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    uint8_t block[64] = {};
    size_t used = 0;     // bytes waiting in block
    uint64_t bytes = 0;  // bytes hashed so far
    void update(const void* data, size_t n) {
        const uint8_t* p = static_cast<const uint8_t*>(data);
        bytes += n;
        while (n > 0) {
            const size_t k = std::min(n, sizeof(block) - used);
            memcpy(block + used, p, k);
            used += k, p += k, n -= k;
            if (used == sizeof(block)) compress(), used = 0;
        }
    }
    // The digest; the object is spent afterwards.
    void finish(uint8_t digest[32]) {
        const uint64_t bits = bytes * 8;
        uint8_t pad[72] = {0x80};  // 0x80, zeros up to 56 bytes mod 64, then the length in bits, big-endian
        const size_t zeros = used < 56 ? 56 - used : 120 - used;
        for (int i = 0; i < 8; i++) pad[zeros + i] = uint8_t(bits >> (56 - 8 * i));
        update(pad, zeros + 8);
        for (int i = 0; i < 32; i++) digest[i] = uint8_t(h[i / 4] >> (24 - 8 * (i % 4)));
    }

  private:
    static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
    void compress() {
        static const uint32_t k[64] = {
            0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
            0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
            0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
            0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
            0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
            0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
            0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
            0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};
        uint32_t w[64];
        for (int i = 0; i < 16; i++)
            w[i] = uint32_t(block[4 * i]) << 24 | uint32_t(block[4 * i + 1]) << 16 | uint32_t(block[4 * i + 2]) << 8 | block[4 * i + 3];
        for (int i = 16; i < 64; i++) {
            const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
            const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
        for (int i = 0; i < 64; i++) {
            const uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
            const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
        }
        h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
    }
};

// HMAC-SHA256 of the concatenated `parts` under `key`.
inline void hmac_sha256(const std::string& key, const std::vector<std::pair<const void*, size_t>>& parts, uint8_t mac[32]) {
    uint8_t k[64] = {};  // a key longer than a block is hashed first
    if (key.size() > sizeof(k)) {
        Sha256 s;
        s.update(key.data(), key.size());
        s.finish(k);
    } else {
        memcpy(k, key.data(), key.size());
    }
    uint8_t pad[64], inner_digest[32];
    Sha256 inner, outer;
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
    inner.update(pad, sizeof(pad));
    for (const auto& p : parts) inner.update(p.first, p.second);
    inner.finish(inner_digest);
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
    outer.update(pad, sizeof(pad));
    outer.update(inner_digest, sizeof(inner_digest));
    outer.finish(mac);
}

// Compares two MACs in a time that does not depend on where they differ.
inline bool same_mac(const uint8_t* a, const uint8_t* b) {
    uint8_t diff = 0;
    for (int i = 0; i < 32; i++) diff |= a[i] ^ b[i];
    return diff == 0;
}

// n bytes from the kernel's random generator (the rendezvous' nonces).
inline void random_bytes(void* p, size_t n) {
    uint8_t* c = static_cast<uint8_t*>(p);
    while (n > 0) {
        const ssize_t k = getrandom(c, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) fail("rendezvous: no random bytes from the kernel: %s", strerror(errno));
        c += k, n -= size_t(k);
    }
}

inline std::string hex_string(const uint8_t* p, size_t n) {
    static const char digits[] = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; i++) s += digits[p[i] >> 4], s += digits[p[i] & 15];
    return s;
}

// Text from a peer (a host name, setup words, a reply, a file's contents) as it may be printed:
// every byte other than printable ASCII becomes \xNN, so no escape sequence reaches a terminal or a log.
inline std::string printable(const std::string& s) {
    std::string out;
    for (unsigned char c : s) {
        if (c >= 0x20 && c < 0x7f) {
            out += char(c);
        } else {
            char esc[5];
            snprintf(esc, sizeof(esc), "\\x%02x", c);
            out += esc;
        }
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// The run's secret. Every rank must prove that it knows it before rank 0 tells it anything, and
// rank 0 proves it back before a rank takes its NCCL id; it never crosses the wire. It comes from the
// launcher's environment (scripts/launch.sh makes one per run; mpirun -x and srun pass it on), or
// from a token file beside -rz file:PATH that only its owner can read. A run of several ranks
// without one is refused: anyone who reaches rank 0's port could otherwise join it.

constexpr const char* kSecretVariable = "GPT_RUN_SECRET";
constexpr size_t kSecretMinChars = 16;

// The token file for -rz file:PATH.
inline std::string dist_secret_file(const std::string& rendezvous_file) { return rendezvous_file + ".secret"; }

inline std::string dist_run_secret(const Dist& d, const std::string& rendezvous_file) {
    const char* v = getenv(kSecretVariable);
    std::string secret, from = kSecretVariable;
    if (v && *v) {
        secret = v;
    } else if (!rendezvous_file.empty() && file_exists(dist_secret_file(rendezvous_file))) {
        from = dist_secret_file(rendezvous_file);
        const int fd = open(from.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        struct stat st{};
        if (fd < 0 || fstat(fd, &st) != 0) fail("run secret: cannot open %s: %s", from.c_str(), strerror(errno));
        if (!S_ISREG(st.st_mode)) fail("run secret: %s is not a regular file", from.c_str());
        if (st.st_uid != geteuid()) fail("run secret: %s belongs to another user (uid %u): make your own", from.c_str(), unsigned(st.st_uid));
        if (st.st_mode & 077)
            fail("run secret: others may read %s (mode %03o): chmod 600 %s", from.c_str(), unsigned(st.st_mode & 0777), from.c_str());
        char buf[1024];
        const ssize_t n = read(fd, buf, sizeof(buf));
        close(fd);
        if (n < 0 || size_t(n) == sizeof(buf)) fail("run secret: %s: %s", from.c_str(), n < 0 ? strerror(errno) : "more than 1023 bytes");
        secret.assign(buf, size_t(n));
        while (!secret.empty() && isspace((unsigned char)secret.back())) secret.pop_back();  // the newline an editor adds
    } else {
        fail("%d ranks and no run secret: give every rank the same random %s (scripts/launch.sh makes one; mpirun -x %s; "
             "srun passes the environment)%s, e.g. export %s=$(head -c 24 /dev/urandom | base64)",
             d.world, kSecretVariable, kSecretVariable,
             rendezvous_file.empty() ? "" : (", or put one in " + dist_secret_file(rendezvous_file) + " (mode 600)").c_str(),
             kSecretVariable);
    }
    if (secret.size() < kSecretMinChars)
        fail("run secret: %s holds %zu characters; use at least %zu random ones, the same on every rank (e.g. $(head -c 24 "
             "/dev/urandom | base64))", from.c_str(), secret.size(), kSecretMinChars);
    return secret;
}

// ---------------------------------------------------------------------------------------------
// The control connections (TCP). Messages are fixed-size records; a closed connection is a rank that
// ended. The rendezvous, in order, each step before one deadline:
//   rank 0 -> rank r   DistChallenge   a fresh nonce, sent as soon as the connection is accepted
//   rank r -> rank 0   DistResponse    rank r's nonce and its proof: an HMAC of both nonces under the secret
//   rank 0 -> rank r   DistProof       rank 0's proof (another label): a peer that did not prove the
//                                      secret has been dropped before this, having learnt nothing
//   rank r -> rank 0   DistHello       rank, world, host, run setup; MAC'd under the secret and both nonces
//   rank 0 -> rank r   DistReply       accepted or refused (and why), NCCL's id; MAC'd the same way
// With -rz file:PATH, the per-run nonce rank 0 wrote to the file enters every MAC too, so a rank
// that read a stale file cannot join whatever now listens on that port.

constexpr uint32_t kDistMagic = 0x47505452u;  // "GPTR"
constexpr uint32_t kDistVersion = 2;
constexpr int kSetupChars = 2048;
constexpr int kNonceBytes = 32;

struct DistChallenge {
    uint32_t magic, version;
    uint8_t nonce[kNonceBytes];
};
struct DistResponse {
    uint32_t magic, version;
    uint8_t nonce[kNonceBytes];
    uint8_t proof[32];
};
struct DistProof {
    uint8_t proof[32];
};
struct DistHello {
    int32_t rank, world, local_rank, unused;
    char host[64];
    char setup[kSetupChars];  // the run setup as "key=value" words, for a message saying what differs
    uint8_t mac[32];
};
struct DistReply {
    int32_t ok, unused;
    char message[512];
#if !defined(NO_NCCL)
    ncclUniqueId id;
#endif
    uint8_t mac[32];
};
enum : uint32_t {
    kDistSolo = 0x4F4C4F53u,  // "SOLO", rank 0 -> others: rank 0 is alive, working alone (a save, a sample)
    kDistDone = 0x454E4F44u,  // "DONE", others -> rank 0: this rank ends normally
};

// What one connection's MACs are computed over: the secret, both nonces and the rendezvous file's nonce.
struct DistChannel {
    const std::string* secret = nullptr;
    std::string file_nonce;  // -rz file: the nonce in the file; "" otherwise
    uint8_t lead_nonce[kNonceBytes] = {}, rank_nonce[kNonceBytes] = {};
    // MAC of `label` (which step, and who sends it: a proof cannot be replayed as another) and data.
    void mac(const char* label, const void* data, size_t n, uint8_t out[32]) const {
        hmac_sha256(*secret, {{label, strlen(label) + 1}, {lead_nonce, kNonceBytes}, {rank_nonce, kNonceBytes},
                              {file_nonce.data(), file_nonce.size()}, {data, n}}, out);
    }
    template <typename Record> void sign(const char* label, Record& r) const { mac(label, &r, offsetof(Record, mac), r.mac); }
    template <typename Record> bool signed_by(const char* label, const Record& r) const {
        uint8_t want[32];
        mac(label, &r, offsetof(Record, mac), want);
        return same_mac(want, r.mac);
    }
};

// Sends or receives exactly n bytes before `until` (a now_seconds() time), whether the socket blocks
// or not. `got` (receiving): how many bytes came, to tell silence from a cut record.
enum class Io { ok, closed, late, failed };
inline Io send_before(int fd, const void* p, size_t n, double until) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
        const ssize_t k = send(fd, c, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            c += k, n -= size_t(k);
            continue;
        }
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return errno == EPIPE ? Io::closed : Io::failed;
        const double left = until - now_seconds();
        if (left <= 0) return Io::late;
        pollfd q{fd, POLLOUT, 0};
        poll(&q, 1, int(std::min(left, 1.0) * 1000) + 1);
    }
    return Io::ok;
}
inline Io recv_before(int fd, void* p, size_t n, double until, size_t* got = nullptr) {
    char* c = static_cast<char*>(p);
    size_t have = 0;
    Io result = Io::ok;
    while (have < n) {
        const ssize_t k = recv(fd, c + have, n - have, MSG_DONTWAIT);
        if (k > 0) {
            have += size_t(k);
            continue;
        }
        if (k == 0) {
            result = Io::closed;
            break;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            result = errno == ECONNRESET ? Io::closed : Io::failed;
            break;
        }
        const double left = until - now_seconds();
        if (left <= 0) {
            result = Io::late;
            break;
        }
        pollfd q{fd, POLLIN, 0};
        poll(&q, 1, int(std::min(left, 1.0) * 1000) + 1);
    }
    if (got) *got = have;
    return result;
}

inline bool split_host_port(const std::string& hp, std::string* host, std::string* port) {
    const size_t colon = hp.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == hp.size()) return false;
    *host = hp.substr(0, colon), *port = hp.substr(colon + 1);
    if (host->size() > 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
    return true;
}

inline bool is_loopback(const sockaddr* a) {
    if (a->sa_family == AF_INET) return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
    if (a->sa_family != AF_INET6) return false;
    const in6_addr& x = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&x) || (IN6_IS_ADDR_V4MAPPED(&x) && x.s6_addr[12] == 127);
}

inline std::string numeric_host(const sockaddr* a, socklen_t len) {
    char text[NI_MAXHOST] = "?";
    getnameinfo(a, len, text, sizeof(text), nullptr, 0, NI_NUMERICHOST);
    return text;
}

// Rank 0: a socket listening on `host` (an address of this node; its first that can be bound) and
// `port` ("0": any free port). *bound_port and *bound_host: what it got. Fails when the host is no
// address of this node (the others could not reach rank 0 there) or the port is taken.
inline int dist_listen(const std::string& host, const std::string& port, int* bound_port, std::string* bound_host = nullptr,
                       bool* loopback = nullptr) {
    parse_int_flag("rendezvous port", port.c_str(), 0, 65535);
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC, hints.ai_socktype = SOCK_STREAM, hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    const int g = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
    if (g != 0) fail("rendezvous: rank 0 cannot look up its address '%s': %s", printable(host).c_str(), gai_strerror(g));
    int s = -1, why = 0;
    for (addrinfo* a = res; a && s < 0; a = a->ai_next) {
        s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (s < 0) continue;
        const int one = 1;
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        // The listen queue holds every rank arriving at once, and more: connections waiting there
        // are read together once accepted, so a few silent ones cannot keep a rank out.
        if (bind(s, a->ai_addr, a->ai_addrlen) != 0 || listen(s, SOMAXCONN) != 0) why = errno, close(s), s = -1;
    }
    freeaddrinfo(res);
    if (s < 0)
        fail("rendezvous: rank 0 cannot listen on %s port %s: %s (is it an address of this node? another run on that port? "
             "set MASTER_ADDR and MASTER_PORT, or -rz)", printable(host).c_str(), port.c_str(), strerror(why));
    sockaddr_storage got{};
    socklen_t len = sizeof(got);
    getsockname(s, reinterpret_cast<sockaddr*>(&got), &len);
    *bound_port = ntohs(got.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&got)->sin6_port
                                                  : reinterpret_cast<sockaddr_in*>(&got)->sin_port);
    if (bound_host) *bound_host = numeric_host(reinterpret_cast<sockaddr*>(&got), len);
    if (loopback) *loopback = is_loopback(reinterpret_cast<sockaddr*>(&got));
    return s;
}

// Others: a connection to host:port, tried again until `until` (rank 0 may start late); each attempt
// is a non-blocking connect bounded by the deadline, so a full listen queue or a lost SYN cannot
// hold it. -1 (and *why) when nothing answered in time.
inline int dist_connect(const std::string& host, const std::string& port, double until, std::string* why) {
    std::string last = "no answer";
    do {
        addrinfo hints{}, *res = nullptr;
        hints.ai_family = AF_UNSPEC, hints.ai_socktype = SOCK_STREAM, hints.ai_flags = AI_NUMERICSERV;
        const int g = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
        if (g != 0) last = gai_strerror(g);
        for (addrinfo* a = g == 0 ? res : nullptr; a; a = a->ai_next) {
            const int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
            if (s < 0) continue;
            int err = connect(s, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
            if (err == EINPROGRESS) {
                pollfd q{s, POLLOUT, 0};
                const double left = std::min(until - now_seconds(), 3.0);  // a lost SYN: the next attempt sends another
                if (left > 0 && poll(&q, 1, int(left * 1000) + 1) > 0) {
                    socklen_t len = sizeof(err);
                    getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
                } else {
                    err = ETIMEDOUT;
                }
            }
            if (err == 0) {
                freeaddrinfo(res);
                const int one = 1;
                setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                setsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
                return s;
            }
            last = strerror(err);
            close(s);
        }
        if (g == 0) freeaddrinfo(res);
        const double left = until - now_seconds();
        if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(std::min(left, 0.1)));
    } while (now_seconds() < until);
    *why = last;
    return -1;
}

// The first word of `a` and `b` ("key=value" words) that differs, for the refusal message.
inline std::string setup_difference(const std::string& a, const std::string& b) {
    auto words = [](const std::string& s) {
        std::vector<std::string> w;
        size_t i = 0;
        while (i < s.size()) {
            const size_t j = s.find(' ', i);
            w.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
            if (j == std::string::npos) break;
            i = j + 1;
        }
        return w;
    };
    const std::vector<std::string> wa = words(a), wb = words(b);
    for (size_t i = 0; i < std::max(wa.size(), wb.size()); i++) {
        const std::string x = i < wa.size() ? wa[i] : "(nothing)", y = i < wb.size() ? wb[i] : "(nothing)";
        if (x != y) return "'" + printable(y) + "' where rank 0 has '" + printable(x) + "'";
    }
    return "a setup that differs";
}

inline double dist_timeout_seconds() {
    int s = 300;
    env_int("GPT_RENDEZVOUS_TIMEOUT", &s);
    return s;
}

// ---------------------------------------------------------------------------------------------
// -rz file:PATH. Rank 0 writes "ADDRESS PORT NONCE" there (mode 0600, atomically), the others read it.
// The nonce is new for each run and enters every MAC, so a rank that read a stale file (an earlier
// run's) cannot join whatever run listens on the port it names now, even one with the same secret.
// Rank 0 refuses a file whose run still listens, and removes its own file once every rank has joined,
// and on every way out before that: fail(), exit, SIGINT, SIGTERM, SIGHUP.

struct DistFileAddress {
    std::string host, port, nonce;
};
constexpr int kFileNonceBytes = 16;  // written as 32 hex digits

// False (and *why: missing, unreadable or malformed, in words) when there is no address to use.
inline bool read_rendezvous_file(const std::string& path, DistFileAddress* out, std::string* why) {
    std::vector<uint8_t> bytes;
    std::string error;
    if (!file_exists(path)) {
        *why = "no address in " + path + " yet";
        return false;
    }
    if (!read_whole_file(path, bytes, &error, 4096)) {
        *why = error;
        return false;
    }
    const std::string text(bytes.begin(), bytes.end());
    std::vector<std::string> words;
    for (size_t i = 0; i < text.size();) {
        const size_t j = text.find_first_of(" \n", i);
        const size_t end = j == std::string::npos ? text.size() : j;
        if (end > i) words.push_back(text.substr(i, end - i));
        i = end + 1;
    }
    char* end = nullptr;
    const long port = words.size() == 3 ? strtol(words[1].c_str(), &end, 10) : 0;
    const bool ok = words.size() == 3 && words[0].size() < 256 && end && !*end && port > 0 && port < 65536 &&
                    words[2].size() == 2 * kFileNonceBytes && words[2].find_first_not_of("0123456789abcdef") == std::string::npos &&
                    text.back() == '\n';
    if (!ok) {
        *why = path + " is malformed: expected 'ADDRESS PORT NONCE', found '" + printable(text.substr(0, 200)) + "'";
        return false;
    }
    *out = {words[0], words[1], words[2]};
    return true;
}

// What rank 0 removes on its way out: its own file only (the same inode), never a later run's.
struct DistFileOwner {
    char path[4096];
    dev_t dev;
    ino_t ino;
    volatile sig_atomic_t armed;
    struct sigaction old[3];
};
inline DistFileOwner& dist_file_owner() {
    static DistFileOwner owner{};
    return owner;
}
constexpr int kDistFileSignals[3] = {SIGINT, SIGTERM, SIGHUP};

inline void dist_remove_own_file() {  // async-signal-safe
    DistFileOwner& o = dist_file_owner();
    if (!o.armed) return;
    o.armed = 0;
    struct stat st;
    if (stat(o.path, &st) == 0 && st.st_dev == o.dev && st.st_ino == o.ino) unlink(o.path);
}
inline void dist_file_signal(int sig) {
    dist_remove_own_file();
    signal(sig, SIG_DFL);
    raise(sig);  // delivered as this handler returns: the process ends as the signal would have ended it
}
// After the rendezvous: the file is gone, the signals are the caller's again.
inline void dist_release_file() {
    DistFileOwner& o = dist_file_owner();
    dist_remove_own_file();
    for (int i = 0; i < 3; i++) sigaction(kDistFileSignals[i], &o.old[i], nullptr);
}

// Rank 0: writes the file; returns its nonce.
inline std::string dist_write_rendezvous_file(const std::string& path, const std::string& host, int port) {
    DistFileAddress other;
    std::string why;
    if (read_rendezvous_file(path, &other, &why)) {  // another run's? Refused while its rank 0 still answers.
        const double until = now_seconds() + 1.0;
        std::string ignored;
        const int s = dist_connect(other.host, other.port, until, &ignored);
        DistChallenge c{};
        const bool live = s >= 0 && recv_before(s, &c, sizeof(c), until) == Io::ok && c.magic == kDistMagic;
        if (s >= 0) close(s);
        if (live)
            fail("rendezvous: %s belongs to a run whose rank 0 still listens at %s port %s: give each run its own -rz file",
                 path.c_str(), printable(other.host).c_str(), other.port.c_str());
    }
    uint8_t raw[kFileNonceBytes];
    random_bytes(raw, sizeof(raw));
    const std::string nonce = hex_string(raw, sizeof(raw));
    const std::string text = host + " " + std::to_string(port) + " " + nonce + "\n";
    DistFileOwner& o = dist_file_owner();
    if (path.size() >= sizeof(o.path)) fail("rendezvous file: the path has %zu characters, at most %zu", path.size(), sizeof(o.path) - 1);
    static bool at_exit = false;
    if (!at_exit) at_exit = atexit(dist_remove_own_file) == 0;
    // The signals wait while the file is written and its owner recorded: one that comes meanwhile is
    // taken after, and finds the file to remove.
    sigset_t block, before;
    sigemptyset(&block);
    struct sigaction sa{};
    sa.sa_handler = dist_file_signal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; i++) {
        sigaddset(&block, kDistFileSignals[i]);
        sigaction(kDistFileSignals[i], nullptr, &o.old[i]);
        if (o.old[i].sa_handler == SIG_DFL) sigaction(kDistFileSignals[i], &sa, nullptr);  // an ignored signal (nohup) stays ignored
    }
    sigprocmask(SIG_BLOCK, &block, &before);
    std::string error;
    if (!write_file_atomic(path, {{text.data(), text.size()}}, &error, 0600)) fail("rendezvous file: %s", error.c_str());
    struct stat st{};
    if (stat(path.c_str(), &st) != 0) fail("rendezvous file: %s vanished as it was written: %s", path.c_str(), strerror(errno));
    snprintf(o.path, sizeof(o.path), "%s", path.c_str());
    o.dev = st.st_dev, o.ino = st.st_ino, o.armed = 1;
    sigprocmask(SIG_SETMASK, &before, nullptr);
    return nonce;
}

// ---------------------------------------------------------------------------------------------
// The rendezvous.

// Where rank 0 listens and what the others connect to.
struct DistPlace {
    std::string host, port;  // HOST:PORT (from -rz, MASTER_ADDR / MASTER_PORT, Slurm or this node)
    std::string file;        // -rz file:PATH: the file (rank 0 then listens on bind_host, any free port)
    std::string bind_host;   // what rank 0 binds: host; with -rz file: MASTER_ADDR, 127.0.0.1 when every rank
                             // runs here, else this node's name
};

inline DistPlace dist_place(const Dist& d, const std::string& where) {
    DistPlace p;
    const char* addr = getenv("MASTER_ADDR");
    const bool master_addr = addr && *addr;
    if (where.rfind("file:", 0) == 0) {
        p.file = where.substr(5);
        if (p.file.empty()) fail("-rz file:PATH: the path is empty");
        p.port = "0";
        if (master_addr) {
            p.bind_host = addr;
        } else if (d.local_world == d.world) {
            p.bind_host = "127.0.0.1";
        } else {
            char name[256] = {};
            gethostname(name, sizeof(name) - 1);
            p.bind_host = name;
        }
        return p;
    }
    if (!split_host_port(where, &p.host, &p.port))
        fail("rendezvous address '%s': expected HOST:PORT or file:PATH", printable(where).c_str());
    p.bind_host = p.host;
    return p;
}

// Rank 0's view of one connection until it has said hello.
struct DistPending {
    int fd = -1;
    bool proven = false;  // it proved the secret; its hello comes next
    double drop_at = 0;   // an unproven connection gets this long
    DistChannel channel;
    std::vector<uint8_t> got;  // the record being read
    size_t want = 0;
};

struct DistJoined {
    int fd = -1;
    DistChannel channel;
    DistHello hello{};
};

// Rank 0: a refusal to every connection that proved the secret, then the one error line. The others
// print it too: every rank ends with one line saying why.
[[noreturn]] inline void dist_refuse(std::vector<DistJoined>& joined, const std::string& message) {
    DistReply reply{};
    reply.ok = 0;
    snprintf(reply.message, sizeof(reply.message), "%s", message.c_str());
    for (DistJoined& j : joined) {
        j.channel.sign("reply", reply);
        if (j.fd >= 0) send_before(j.fd, &reply, sizeof(reply), now_seconds() + 2);
    }
    fail("%s", message.c_str());
}

// Rank 0 gathers the others: every connection is read at once (poll), a connection gets a few seconds
// to prove the secret, and one that fails is dropped without a word while rank 0 keeps listening.
// Only a rank that proved the secret can end the run, with a message saying what is wrong.
inline std::vector<DistJoined> dist_gather(Dist& d, int listener, const std::string& secret, const std::string& file_nonce,
                                           double until, double timeout) {
    constexpr double kProveSeconds = 5;
    const size_t max_pending = size_t(d.world) + 64;
    std::vector<DistJoined> joined(d.world);  // by rank; [0] unused
    std::vector<DistPending> pending;
    int ranks = 1;                             // ranks joined, rank 0 included
    int unproven = 0, foreign = 0, gave_up = 0;  // connections dropped: no proof of the secret; no rendezvous; proven, then closed
    auto drop = [&](size_t i, int* count) {
        close(pending[i].fd);
        pending.erase(pending.begin() + i);
        (*count)++;
    };
    auto joined_list = [&](int extra_fd, const DistChannel* extra) {
        std::vector<DistJoined> all;
        for (int r = 1; r < d.world; r++)
            if (joined[r].fd >= 0) all.push_back(joined[r]);
        if (extra_fd >= 0) all.push_back({extra_fd, *extra, {}});
        return all;
    };
    while (ranks < d.world) {
        const double now = now_seconds();
        if (now > until) {
            std::string dropped;
            if (unproven + foreign > 0)
                dropped = " (connections dropped: " + std::to_string(unproven) + " without the run secret's proof, " +
                          std::to_string(foreign) + " speaking no rendezvous)";
            std::vector<DistJoined> all = joined_list(-1, nullptr);
            dist_refuse(all, "rendezvous: " + std::to_string(ranks) + " of " + std::to_string(d.world) + " ranks reached rank 0 within " +
                                 std::to_string(int(timeout)) + " s" + dropped);
        }
        for (size_t i = 0; i < pending.size();)  // unproven connections past their few seconds
            if (!pending[i].proven && now > pending[i].drop_at) drop(i, &foreign);
            else i++;
        std::vector<pollfd> fds(1, pollfd{listener, POLLIN, 0});
        for (const DistPending& p : pending) fds.push_back({p.fd, POLLIN, 0});
        if (poll(fds.data(), fds.size(), int(std::min(until - now, 0.2) * 1000) + 1) <= 0) continue;
        for (size_t i = pending.size(); i-- > 0;) {  // from the back: dropping one leaves the others' indices
            if (!(fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            DistPending& p = pending[i];
            const ssize_t k = recv(p.fd, p.got.data() + (p.got.size() - p.want), p.want, MSG_DONTWAIT);
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
            if (k <= 0) {
                drop(i, p.proven ? &gave_up : &foreign);  // a proven rank that gave up prints its own line
                continue;
            }
            p.want -= size_t(k);
            if (p.want > 0) continue;
            if (!p.proven) {
                DistResponse r;
                memcpy(&r, p.got.data(), sizeof(r));
                if (r.magic != kDistMagic || r.version != kDistVersion) {
                    drop(i, &foreign);
                    continue;
                }
                memcpy(p.channel.rank_nonce, r.nonce, kNonceBytes);
                uint8_t want[32];
                p.channel.mac("rank proof", nullptr, 0, want);
                if (!same_mac(want, r.proof)) {
                    drop(i, &unproven);
                    continue;
                }
                DistProof proof;
                p.channel.mac("rank 0 proof", nullptr, 0, proof.proof);
                if (send_before(p.fd, &proof, sizeof(proof), now_seconds() + 2) != Io::ok) {
                    drop(i, &foreign);
                    continue;
                }
                p.proven = true;
                p.got.assign(sizeof(DistHello), 0), p.want = sizeof(DistHello);
                continue;
            }
            DistHello h;
            memcpy(&h, p.got.data(), sizeof(h));
            if (!p.channel.signed_by("hello", h)) {
                drop(i, &unproven);
                continue;
            }
            h.setup[kSetupChars - 1] = 0, h.host[sizeof(h.host) - 1] = 0;
            const int fd = p.fd;
            const DistChannel channel = p.channel;
            pending.erase(pending.begin() + i);
            // From here on the peer knows the secret: what is wrong with it is the run's error.
            const std::string who = "rank " + std::to_string(h.rank) + " (host " + printable(h.host) + ")";
            if (h.world != d.world) {
                std::vector<DistJoined> all = joined_list(fd, &channel);
                dist_refuse(all, "rendezvous: " + who + " was started with a world of " + std::to_string(h.world) +
                                     " ranks, rank 0 with " + std::to_string(d.world));
            }
            if (h.rank < 0 || h.rank >= d.world) {
                std::vector<DistJoined> all = joined_list(fd, &channel);
                dist_refuse(all, "rendezvous: a process on host " + printable(h.host) + " says it is rank " + std::to_string(h.rank) +
                                     ", outside the world of " + std::to_string(d.world) + " ranks (check the launcher's rank variables)");
            }
            if (h.rank == 0 || joined[h.rank].fd >= 0) {
                std::vector<DistJoined> all = joined_list(fd, &channel);
                dist_refuse(all, "rendezvous: two processes claim rank " + std::to_string(h.rank) + " (check the launcher's rank variables)");
            }
            joined[h.rank] = {fd, channel, h};
            ranks++;
        }
        if (!(fds[0].revents & POLLIN)) continue;
        for (int n = 0; n < 64; n++) {  // what waits in the listen queue, a bounded number at a time
            const int s = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (s < 0) break;
            if (pending.size() >= max_pending) {  // the oldest unproven connection makes room
                for (size_t i = 0; i < pending.size(); i++)
                    if (!pending[i].proven) {
                        drop(i, &foreign);
                        break;
                    }
            }
            const int one = 1;
            setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            setsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
            DistPending p;
            p.fd = s, p.drop_at = now_seconds() + kProveSeconds;
            p.channel.secret = &secret, p.channel.file_nonce = file_nonce;
            random_bytes(p.channel.lead_nonce, kNonceBytes);
            DistChallenge c{};
            c.magic = kDistMagic, c.version = kDistVersion;
            memcpy(c.nonce, p.channel.lead_nonce, kNonceBytes);
            if (pending.size() >= max_pending || send_before(s, &c, sizeof(c), now_seconds() + 1) != Io::ok) {
                close(s);
                foreign++;
                continue;
            }
            p.got.assign(sizeof(DistResponse), 0), p.want = sizeof(DistResponse);
            pending.push_back(std::move(p));
        }
    }
    for (const DistPending& p : pending) close(p.fd);  // late strangers
    return joined;
}

// One attempt of a non-zero rank to join rank 0 over the connection s. Returns 1 when joined, 0 when
// another attempt may succeed (through a file that may be stale), -1 when it cannot (*why says why).
inline int dist_join(Dist& d, int s, const DistChannel& base, const std::string& setup, const std::string& where,
                     double prove_until, double until, std::string* why) {
    DistChannel channel = base;
    DistChallenge c{};
    size_t got = 0;
    const Io ci = recv_before(s, &c, sizeof(c), prove_until, &got);
    if (ci == Io::late && got == 0) {
        *why = "rank 0 at " + where + " accepted the connection but said nothing";
        return 0;
    }
    if (ci != Io::ok) {
        *why = got == 0 ? "rank 0 at " + where + " closed the connection without a word (it failed, or this is another program)"
                        : "rank 0 at " + where + " sent " + std::to_string(got) + " bytes of " + std::to_string(sizeof(c)) +
                              " and stopped: this is not this program's rendezvous";
        return 0;
    }
    if (c.magic != kDistMagic) {
        *why = "what answers at " + where + " is not this program's rendezvous (another program on that port?)";
        return 0;
    }
    if (c.version != kDistVersion) {
        *why = "rank 0 at " + where + " speaks rendezvous version " + std::to_string(c.version) + ", this rank " +
               std::to_string(kDistVersion) + ": build every rank from the same source";
        return -1;
    }
    memcpy(channel.lead_nonce, c.nonce, kNonceBytes);
    random_bytes(channel.rank_nonce, kNonceBytes);
    DistResponse r{};
    r.magic = kDistMagic, r.version = kDistVersion;
    memcpy(r.nonce, channel.rank_nonce, kNonceBytes);
    channel.mac("rank proof", nullptr, 0, r.proof);
    DistProof proof{};
    if (send_before(s, &r, sizeof(r), prove_until) != Io::ok) {
        *why = "rank 0 at " + where + " closed the connection before this rank's proof";
        return 0;
    }
    const Io pi = recv_before(s, &proof, sizeof(proof), prove_until);
    if (pi == Io::late) {
        *why = "rank 0 at " + where + " did not answer this rank's proof of the run secret";
        return 0;
    }
    if (pi != Io::ok) {
        *why = "rank 0 at " + where + " dropped this rank at its proof of the run secret: every rank needs the same " +
               kSecretVariable + " (or that port is another run's)";
        return 0;
    }
    uint8_t want[32];
    channel.mac("rank 0 proof", nullptr, 0, want);
    if (!same_mac(want, proof.proof)) {  // not rank 0 of this run: it learns nothing more
        *why = "what answers at " + where + " could not prove that it knows the run secret: this rank told it nothing";
        return 0;
    }
    DistHello h{};
    h.rank = d.rank, h.world = d.world, h.local_rank = d.local_rank;
    gethostname(h.host, sizeof(h.host) - 1);
    snprintf(h.setup, sizeof(h.setup), "%s", setup.c_str());
    channel.sign("hello", h);
    DistReply reply{};
    if (send_before(s, &h, sizeof(h), until) != Io::ok) {
        *why = "rank 0 at " + where + " closed the connection (it failed: see its error)";
        return -1;
    }
    const Io ri = recv_before(s, &reply, sizeof(reply), until);
    if (ri != Io::ok) {
        *why = ri == Io::late ? "rank 0 at " + where + " gave no answer in time (a rank missing?)"
                              : "rank 0 at " + where + " closed the connection before its answer (it failed: see its error)";
        return -1;
    }
    if (!channel.signed_by("reply", reply)) {
        *why = "rank 0's answer does not carry the run secret's MAC: this rank ignores it";
        return -1;
    }
    reply.message[sizeof(reply.message) - 1] = 0;
    if (!reply.ok) {
        *why = "rank 0 refused the run: " + printable(reply.message);
        return -1;
    }
#if !defined(NO_NCCL)
    d.id = reply.id;
#endif
    return 1;
}

// Every rank meets rank 0 (CPU only: no GPU is touched). `setup` is this rank's run setup; a rank
// whose setup differs from rank 0's is refused, and the run ends on every rank with one line.
// Rank 0 makes NCCL's unique id (make_id, called once every rank's setup is accepted) and sends it.
// One deadline (GPT_RENDEZVOUS_TIMEOUT seconds, default 300) bounds every step on every rank.
template <typename MakeId>
void dist_rendezvous(Dist& d, const std::string& spec, const std::string& setup, MakeId make_id) {
    d.rendezvous = dist_rendezvous_address(d, spec);
    const DistPlace place = dist_place(d, d.rendezvous);
    if (setup.size() >= kSetupChars) fail("rendezvous: the run setup is %zu characters, at most %d", setup.size(), kSetupChars - 1);
    const std::string secret = dist_run_secret(d, place.file);
    const double timeout = dist_timeout_seconds(), until = now_seconds() + timeout;
    if (d.rank == 0) {
        int bound = 0;
        bool loopback = false;
        std::string host;
        const int ls = dist_listen(place.bind_host, place.port, &bound, &host, &loopback);
        // A node's name that resolves to loopback on the node itself (as a Debian-style /etc/hosts
        // maps it to 127.0.1.1) would leave rank 0 out of the other nodes' reach. A loopback address
        // named as such is the user's word that every rank runs here.
        in6_addr literal;
        const bool said_loopback = place.bind_host == "localhost" || inet_pton(AF_INET, place.bind_host.c_str(), &literal) == 1 ||
                                   inet_pton(AF_INET6, place.bind_host.c_str(), &literal) == 1;
        if (loopback && !said_loopback && d.local_world != d.world)
            fail("rendezvous: rank 0's host name %s resolves to %s on its own node, a loopback address other nodes cannot reach: "
                 "set MASTER_ADDR to this node's address on the network they share", printable(place.bind_host).c_str(), host.c_str());
        std::string file_nonce;
        if (!place.file.empty()) {
            if (host == "0.0.0.0" || host == "::") {  // MASTER_ADDR named every interface: the others need a name
                char name[256] = {};
                gethostname(name, sizeof(name) - 1);
                host = name;
            }
            file_nonce = dist_write_rendezvous_file(place.file, host, bound);
        }
        std::vector<DistJoined> joined = dist_gather(d, ls, secret, file_nonce, until, timeout);
        close(ls);
        if (!place.file.empty()) dist_release_file();
        // Every rank's setup against rank 0's: refuse the first that differs, on every rank.
        DistReply reply{};
        reply.ok = 1;
        for (int r = 1; r < d.world && reply.ok; r++)
            if (setup != joined[r].hello.setup) {
                reply.ok = 0;
                snprintf(reply.message, sizeof(reply.message), "rank %d (host %s) was started with %s: every rank needs the same "
                         "flags, data and model", r, printable(joined[r].hello.host).c_str(),
                         setup_difference(setup, joined[r].hello.setup).c_str());
            }
#if !defined(NO_NCCL)
        if (reply.ok) d.id = make_id(), reply.id = d.id;
#endif
        d.peers.assign(d.world, -1);
        for (int r = 1; r < d.world; r++) {
            joined[r].channel.sign("reply", reply);
            send_before(joined[r].fd, &reply, sizeof(reply), now_seconds() + 5);
            d.peers[r] = joined[r].fd;
        }
        if (!reply.ok) fail("%s", reply.message);
        return;
    }
    // The others connect to rank 0. Through a file, its address is read again after each failed
    // attempt: a file left by an earlier run names a port that is no one's, or another run's, until
    // rank 0 rewrites it; the per-run nonce in it tells the runs apart.
    DistChannel base;
    base.secret = &secret;
    std::string why = "no answer";
    while (now_seconds() < until) {
        std::string host = place.host, port = place.port, where = d.rendezvous;
        if (!place.file.empty()) {
            DistFileAddress a;
            if (!read_rendezvous_file(place.file, &a, &why)) {
                std::this_thread::sleep_for(std::chrono::milliseconds(200));
                continue;
            }
            host = a.host, port = a.port, base.file_nonce = a.nonce;
            where = printable(host) + " port " + port + " (from " + place.file + ")";
        }
        const double attempt = place.file.empty() ? until : std::min(until, now_seconds() + 3);
        std::string unreachable;
        const int s = dist_connect(host, port, attempt, &unreachable);
        if (s < 0) {
            why = "cannot reach rank 0 at " + where + ": " + unreachable;
            continue;
        }
        const int joined = dist_join(d, s, base, setup, where, attempt, until, &why);
        if (joined == 1) {
            d.peers.assign(1, s);
            return;
        }
        close(s);
        if (joined < 0 || place.file.empty()) fail("rendezvous: %s", why.c_str());
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    fail("rendezvous: rank %d found no rank 0 within %.0f s: %s", d.rank, timeout, why.c_str());
}

// ---------------------------------------------------------------------------------------------
// The watchdog: one thread per rank (multi-rank runs only).

// Set when the process has begun to exit (fail(), the end of main): the watchdog then ends the rank
// without a line of its own, so that a rank that failed prints one line, not also a peer's end it
// sees while its exit runs.
inline std::atomic<bool>& dist_exiting() {
    static std::atomic<bool> exiting{false};
    return exiting;
}

[[noreturn]] inline void dist_abort(const Dist& d, const std::string& why) {
    // The others learn at once, even where this process cannot end yet (a thread stuck in the kernel,
    // on a hung file system, keeps its sockets open until it returns).
    for (int fd : d.peers)
        if (fd >= 0) shutdown(fd, SHUT_RDWR);
    if (!dist_exiting().load()) {
        const std::string line = "error: rank " + std::to_string(d.rank) + ": " + why + "\n";
        fwrite(line.data(), 1, line.size(), stderr);
        fflush(stderr);
    }
    _exit(1);  // from any thread, whatever the GPU is doing: the driver reclaims the context
}

inline void dist_watch(Dist* dp) {
    Dist& d = *dp;
    struct Peer {
        int rank;
        uint8_t word[4];
        size_t have;  // bytes of the next word read so far: a word may come in pieces
    };
    std::vector<pollfd> fds;
    std::vector<Peer> peers;
    for (int r = 0; r < (int)d.peers.size(); r++)
        if (d.peers[r] >= 0) fds.push_back({d.peers[r], POLLIN, 0}), peers.push_back({d.rank == 0 ? r : 0, {}, 0});
    while (!d.stopping.load()) {
        const int n = poll(fds.data(), fds.size(), 500);
        if (d.stopping.load()) return;
        for (size_t i = 0; n > 0 && i < fds.size(); i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            Peer& p = peers[i];
            const ssize_t k = recv(fds[i].fd, p.word + p.have, sizeof(p.word) - p.have, MSG_DONTWAIT);
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
            if (k <= 0) {
                if (d.stopping.load()) return;
                dist_abort(d, "rank " + std::to_string(p.rank) + " ended (its connection closed): ending this rank too");
            }
            p.have += size_t(k);
            if (p.have < sizeof(p.word)) continue;
            p.have = 0;
            uint32_t word;
            memcpy(&word, p.word, sizeof(word));
            if (word == kDistDone && d.rank == 0) {
                d.done_count.fetch_add(1);
                fds[i].fd = -1;  // finished cleanly: its closing is no failure
            } else if (word == kDistSolo && d.rank != 0) {
                dist_progress(d);  // rank 0 is busy alone: waiting for it is progress
            } else {
                char hex[16];
                snprintf(hex, sizeof(hex), "0x%08x", word);
                dist_abort(d, "rank " + std::to_string(p.rank) + " sent " + hex + " on its control connection, no word of this "
                              "program's: ending this rank");
            }
        }
#if !defined(NO_NCCL)
        if (ncclComm_t c = d.comm.load()) {
            ncclResult_t async = ncclSuccess;
            if (ncclCommGetAsyncError(c, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
                dist_abort(d, std::string("NCCL: ") + ncclGetErrorString(async) + " (another rank failed, or the network did)");
        }
#endif
        if (d.rank == 0 && d.solo.load()) {  // tell the others, about every half second; alone for -wt at most
            const double alone = now_seconds() - d.solo_since.load();
            if (d.stall_seconds > 0 && alone > d.stall_seconds)
                dist_abort(d, "rank 0 has worked alone (a checkpoint write, a sample) for more than -wt " +
                              std::to_string(d.stall_seconds) + " s: ending this rank");
            dist_progress(d);
            const uint32_t word = kDistSolo;
            for (const pollfd& p : fds)
                if (p.fd >= 0) send_before(p.fd, &word, sizeof(word), now_seconds() + 0.5);
        }
        const double idle = now_seconds() - d.last_progress.load();
        if (d.stall_seconds > 0 && idle > d.stall_seconds)
            dist_abort(d, "no progress for " + std::to_string((int)idle) + " s (a stuck collective? -wt sets this limit)");
    }
}

// The watchdog thread takes no signals (SIGINT, SIGTERM go to the training loop's thread).
inline void dist_start_watchdog(Dist& d, int stall_seconds) {
    if (!d.multi()) return;
    d.stall_seconds = stall_seconds;
    dist_progress(d);
    static bool at_exit = false;
    if (!at_exit) at_exit = atexit([] { dist_exiting().store(true); }) == 0;
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    d.watchdog = std::thread(dist_watch, &d);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

// Rank 0 alone at work (a checkpoint's files, a sample): the other ranks wait in their next
// collective, and their watchdogs must not count that as a stall. The section itself is bounded by
// -wt: a write to a hung file system ends the run with one line on every rank.
struct DistSolo {
    Dist& d;
    explicit DistSolo(Dist& dist) : d(dist) {
        d.solo_since.store(now_seconds());
        d.solo.store(d.multi() && d.rank == 0);
    }
    ~DistSolo() { d.solo.store(false), dist_progress(d); }
};

#if !defined(NO_NCCL)
// ---------------------------------------------------------------------------------------------
// NCCL.

inline void dist_init_nccl(Dist& d) {
    if (!d.multi()) return;
    ncclComm_t c = nullptr;
    nccl_check(ncclCommInitRank(&c, d.world, d.id, d.rank));
    d.comm.store(c);
    cuda_check(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
    cuda_check(cudaMalloc(&d.scratch, 64));
}

template <typename T> ncclDataType_t nccl_type();
template <> inline ncclDataType_t nccl_type<float>() { return ncclFloat32; }
template <> inline ncclDataType_t nccl_type<double>() { return ncclFloat64; }
template <> inline ncclDataType_t nccl_type<int>() { return ncclInt32; }
template <> inline ncclDataType_t nccl_type<__nv_bfloat16>() { return ncclBfloat16; }

// Sum of one host value over the ranks (synchronizes; for validation losses and stop requests).
template <typename T> T dist_sum(Dist& d, T value) {
    if (!d.multi()) return value;
    cuda_check(cudaMemcpy(d.scratch, &value, sizeof(T), cudaMemcpyHostToDevice));
    nccl_check(ncclAllReduce(d.scratch, d.scratch, 1, nccl_type<T>(), ncclSum, d.comm.load(), 0));
    cuda_check(cudaMemcpy(&value, d.scratch, sizeof(T), cudaMemcpyDeviceToHost));
    return value;
}

#endif  // NCCL

// The ranks end together: every rank has done its GPU work (the barrier), then each tells rank 0 it is
// done and closes its connection; rank 0 waits (a bounded time) for all of them, so that no rank
// mistakes another's normal end for a failure.
inline void dist_close(Dist& d) {
    if (!d.multi()) return;
    if (d.rank != 0) {
        d.stopping.store(true);
        const uint32_t word = kDistDone;
        send_before(d.peers[0], &word, sizeof(word), now_seconds() + 5);
    } else if (d.watchdog.joinable()) {  // the watchdog counts the DONE words
        const double until = now_seconds() + 60;
        while (d.done_count.load() < d.world - 1 && now_seconds() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        d.stopping.store(true);
    } else {  // no watchdog: read them here
        const double until = now_seconds() + 60;
        for (int r = 1; r < d.world; r++) {
            uint32_t word = 0;
            recv_before(d.peers[r], &word, sizeof(word), until);
        }
    }
    if (d.watchdog.joinable()) d.watchdog.join();
    for (int fd : d.peers)
        if (fd >= 0) close(fd);
    d.peers.clear();
}

#if !defined(NO_NCCL)
inline void dist_finish(Dist& d) {
    if (!d.multi()) return;
    dist_sum(d, 0);  // a barrier
    dist_close(d);
    if (ncclComm_t c = d.comm.exchange(nullptr)) ncclCommDestroy(c);
    if (d.stream) cuda_check(cudaStreamDestroy(d.stream));
    if (d.scratch) cuda_check(cudaFree(d.scratch));
}
#endif
