// distributed.cuh: data-parallel training over NCCL, one process per GPU, on one node or several.
//
//   dist_from_env      rank, world size and local rank from the launcher: torchrun-style RANK /
//                      WORLD_SIZE / LOCAL_RANK (scripts/launch.sh sets them), mpirun (OMPI_COMM_WORLD_*),
//                      or srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID); none of them: one process
//   dist_rendezvous    the ranks meet at rank 0 over TCP, before any GPU work: each sends its run setup
//                      (flags, data, model), rank 0 refuses ranks whose setup differs from its own and
//                      sends every rank NCCL's unique id. Rank 0's address comes from MASTER_ADDR /
//                      MASTER_PORT, from a file on a shared file system (-rz file:PATH: rank 0 writes
//                      host and port there), from Slurm's node list, or is the local host when every rank
//                      runs on this node
//   dist_init_nccl     the NCCL communicator and a communication stream, after the GPU is chosen
//   watchdog           the TCP connections stay open for the whole run: a rank that dies closes them,
//                      and a thread on every rank notices within a second, as it notices NCCL's
//                      asynchronous errors and a run that makes no progress for -wt seconds; it then ends
//                      its rank with one `error:` line. So a failure ends every rank, never a hang.
//   dist_finish        a last barrier, then each rank tells rank 0 it is done before closing.
//
// Nothing here needs MPI: mpirun and srun only start the processes. With world size 1 nothing here
// runs at all (no socket, no communicator): one GPU trains exactly as without this file.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
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
    int stall_seconds = 0;  // -wt: no progress for this long ends the run (0: never)
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
// The control connections (TCP). Messages are fixed-size records; a closed connection is a rank that
// ended.

constexpr uint32_t kDistMagic = 0x47505452u;  // "GPTR"
constexpr int kSetupChars = 2048;

struct DistHello {
    uint32_t magic;
    int32_t rank, world, local_rank;
    uint64_t setup_hash;
    char host[64];
    char setup[kSetupChars];  // the run setup as "key=value" words, for a message saying what differs
};
enum : uint32_t { kDistSolo = 0x4F4C4F53u };  // "SOLO": rank 0 is alive, working alone (a save, a sample)
struct DistReply {
    uint32_t magic;
    int32_t ok;
    char message[512];
#if !defined(NO_NCCL)
    ncclUniqueId id;
#endif
};
enum : uint32_t { kDistDone = 0x454E4F44u };  // "DONE"

inline bool send_all(int fd, const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
        const ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        c += k, n -= size_t(k);
    }
    return true;
}
inline bool recv_all(int fd, void* p, size_t n) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
        const ssize_t k = recv(fd, c, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        c += k, n -= size_t(k);
    }
    return true;
}

inline bool split_host_port(const std::string& hp, std::string* host, std::string* port) {
    const size_t colon = hp.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == hp.size()) return false;
    *host = hp.substr(0, colon), *port = hp.substr(colon + 1);
    if (host->size() > 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
    return true;
}

// Rank 0: a listening socket on `port` ("0": any free port, which *bound_port returns).
inline int dist_listen(const std::string& port, int backlog, int* bound_port) {
    const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int v4 = fd < 0 ? socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1;
    const int s = fd >= 0 ? fd : v4;
    if (s < 0) fail("rendezvous: cannot make a socket: %s", strerror(errno));
    const int one = 1, zero = 0;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const long p = parse_int_flag("rendezvous port", port.c_str(), 0, 65535);
    int r;
    if (fd >= 0) {
        setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));  // IPv4 peers too
        sockaddr_in6 a{};
        a.sin6_family = AF_INET6, a.sin6_addr = in6addr_any, a.sin6_port = htons((uint16_t)p);
        r = bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    } else {
        sockaddr_in a{};
        a.sin_family = AF_INET, a.sin_addr.s_addr = htonl(INADDR_ANY), a.sin_port = htons((uint16_t)p);
        r = bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    }
    if (r != 0) fail("rendezvous: rank 0 cannot listen on port %ld: %s (another run on it? set MASTER_PORT or -rz)", p, strerror(errno));
    if (listen(s, backlog) != 0) fail("rendezvous: listen: %s", strerror(errno));
    sockaddr_storage got{};
    socklen_t len = sizeof(got);
    getsockname(s, reinterpret_cast<sockaddr*>(&got), &len);
    *bound_port = ntohs(got.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&got)->sin6_port
                                                  : reinterpret_cast<sockaddr_in*>(&got)->sin_port);
    return s;
}

// Others: connects to host:port, retrying until `timeout` seconds have passed (rank 0 may start
// late); -1 (and *why) when nothing answered.
inline int dist_try_connect(const std::string& host, const std::string& port, double timeout, std::string* why) {
    const double until = now_seconds() + timeout;
    std::string last = "no answer";
    while (now_seconds() < until) {
        addrinfo hints{}, *res = nullptr;
        hints.ai_family = AF_UNSPEC, hints.ai_socktype = SOCK_STREAM;
        const int g = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
        if (g != 0) {
            last = gai_strerror(g);
        } else {
            for (addrinfo* a = res; a; a = a->ai_next) {
                const int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
                if (s < 0) continue;
                if (connect(s, a->ai_addr, a->ai_addrlen) == 0) {
                    freeaddrinfo(res);
                    const int one = 1;
                    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                    return s;
                }
                last = strerror(errno);
                close(s);
            }
            freeaddrinfo(res);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
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
        if (x != y) return "'" + y + "' where rank 0 has '" + x + "'";
    }
    return "a setup that differs";
}

inline double dist_timeout_seconds() {
    int s = 300;
    env_int("GPT_RENDEZVOUS_TIMEOUT", &s);
    return s;
}

// Every rank meets rank 0 (CPU only: no GPU is touched). `setup` is this rank's run setup; a rank
// whose setup differs from rank 0's is refused, and the run ends on every rank with one line.
// Rank 0 makes NCCL's unique id (make_id, called once every rank's setup is accepted) and sends it.
template <typename MakeId>
void dist_rendezvous(Dist& d, const std::string& spec, const std::string& setup, MakeId make_id) {
    d.rendezvous = dist_rendezvous_address(d, spec);
    const bool via_file = d.rendezvous.rfind("file:", 0) == 0;
    const std::string file = via_file ? d.rendezvous.substr(5) : "";
    const uint64_t hash = [&] {
        uint64_t h = 1469598103934665603ull;  // FNV-1a
        for (char c : setup) h = (h ^ (unsigned char)c) * 1099511628211ull;
        return h;
    }();
    if (setup.size() >= kSetupChars) fail("rendezvous: the run setup is %zu characters, at most %d", setup.size(), kSetupChars - 1);
    const double timeout = dist_timeout_seconds();
    std::string host, port;
    if (!via_file && !split_host_port(d.rendezvous, &host, &port))
        fail("rendezvous address '%s': expected HOST:PORT or file:PATH", d.rendezvous.c_str());
    if (d.rank == 0) {
        int bound = 0;
        const int ls = dist_listen(via_file ? "0" : port, d.world, &bound);
        if (via_file) {  // host and port for the others, written atomically (they poll for it)
            char name[256] = {};
            gethostname(name, sizeof(name) - 1);
            const std::string text = std::string(name) + " " + std::to_string(bound) + "\n";
            std::string error;
            if (!write_file_atomic(file, {{text.data(), text.size()}}, &error)) fail("rendezvous file: %s", error.c_str());
        }
        d.peers.assign(d.world, -1);
        std::vector<DistHello> hellos(d.world);
        const double until = now_seconds() + timeout;
        for (int joined = 1; joined < d.world;) {
            pollfd p{ls, POLLIN, 0};
            if (now_seconds() > until)
                fail("rendezvous: %d of %d ranks reached rank 0 within %.0f s", joined, d.world, timeout);
            if (poll(&p, 1, 200) <= 0) continue;
            const int s = accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
            if (s < 0) continue;
            timeval wait{5, 0}, forever{0, 0};  // a connection that says nothing must not stall the others
            setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
            DistHello h{};
            if (!recv_all(s, &h, sizeof(h)) || h.magic != kDistMagic) {
                close(s);  // not one of ours (a port scan, a stale run): ignore it
                continue;
            }
            setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &forever, sizeof(forever));
            const int one = 1;
            setsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
            h.setup[kSetupChars - 1] = 0, h.host[sizeof(h.host) - 1] = 0;
            if (h.world != d.world) fail("rendezvous: rank %d was started with a world of %d ranks, rank 0 with %d", h.rank, h.world, d.world);
            if (h.rank < 1 || h.rank >= d.world || d.peers[h.rank] >= 0)
                fail("rendezvous: two processes claim rank %d (check the launcher's rank variables)", h.rank);
            d.peers[h.rank] = s, hellos[h.rank] = h;
            joined++;
        }
        close(ls);
        if (via_file) unlink(file.c_str());
        // Every rank's setup against rank 0's: refuse the first that differs, on every rank.
        DistReply reply{};
        reply.magic = kDistMagic, reply.ok = 1;
        for (int r = 1; r < d.world && reply.ok; r++)
            if (hellos[r].setup_hash != hash || setup != hellos[r].setup) {
                reply.ok = 0;
                snprintf(reply.message, sizeof(reply.message), "rank %d (host %s) was started with %s: every rank needs the same "
                         "flags, data and model", r, hellos[r].host, setup_difference(setup, hellos[r].setup).c_str());
            }
#if !defined(NO_NCCL)
        if (reply.ok) d.id = make_id(), reply.id = d.id;
#endif
        for (int r = 1; r < d.world; r++) send_all(d.peers[r], &reply, sizeof(reply));
        if (!reply.ok) fail("%s", reply.message);
    } else {
        // Connect to rank 0; through a file, its address is read again after each failed attempt (a
        // file left by an earlier run names a port no one listens on until rank 0 rewrites it).
        int s = -1;
        std::string why = "no answer";
        const double until = now_seconds() + timeout;
        while (s < 0 && now_seconds() < until) {
            if (via_file) {
                std::vector<uint8_t> bytes;
                std::string error;
                char h[256] = {};
                int p = 0;
                if (!read_whole_file(file, bytes, &error, 4096) ||
                    sscanf(std::string(bytes.begin(), bytes.end()).c_str(), "%255s %d", h, &p) != 2) {
                    why = "no address in " + file + " yet";
                    std::this_thread::sleep_for(std::chrono::milliseconds(200));
                    continue;
                }
                host = h, port = std::to_string(p);
            }
            s = dist_try_connect(host, port, via_file ? 1.0 : until - now_seconds(), &why);
        }
        if (s < 0)
            fail("rendezvous: cannot reach rank 0 at %s within %.0f s (%s)", via_file ? file.c_str() : d.rendezvous.c_str(),
                 timeout, why.c_str());
        const int one = 1;
        setsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
        DistHello h{};
        h.magic = kDistMagic, h.rank = d.rank, h.world = d.world, h.local_rank = d.local_rank, h.setup_hash = hash;
        gethostname(h.host, sizeof(h.host) - 1);
        snprintf(h.setup, sizeof(h.setup), "%s", setup.c_str());
        DistReply reply{};
        if (!send_all(s, &h, sizeof(h)) || !recv_all(s, &reply, sizeof(reply)) || reply.magic != kDistMagic)
            fail("rendezvous: rank 0 at %s closed the connection (it failed or refused this run; see its error)", d.rendezvous.c_str());
        reply.message[sizeof(reply.message) - 1] = 0;
        if (!reply.ok) fail("rank 0 refused this rank: %s", reply.message);
#if !defined(NO_NCCL)
        d.id = reply.id;
#endif
        d.peers.assign(1, s);
    }
}

// ---------------------------------------------------------------------------------------------
// The watchdog: one thread per rank (multi-rank runs only).

[[noreturn]] inline void dist_abort(const Dist& d, const std::string& why) {
    fprintf(stderr, "error: rank %d: %s\n", d.rank, why.c_str());
    fflush(stderr);
    _exit(1);  // from any thread, whatever the GPU is doing: the driver reclaims the context
}

inline void dist_watch(Dist* dp) {
    Dist& d = *dp;
    std::vector<pollfd> fds;
    std::vector<int> ranks;
    for (int r = 0; r < (int)d.peers.size(); r++)
        if (d.peers[r] >= 0) fds.push_back({d.peers[r], POLLIN, 0}), ranks.push_back(d.rank == 0 ? r : 0);
    while (!d.stopping.load()) {
        const int n = poll(fds.data(), fds.size(), 500);
        if (d.stopping.load()) return;
        for (size_t i = 0; n > 0 && i < fds.size(); i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            uint32_t word = 0;
            const bool got = recv_all(fds[i].fd, &word, sizeof(word));
            if (got && word == kDistDone && d.rank == 0) {
                d.done_count.fetch_add(1);
                fds[i].fd = -1;  // finished cleanly: its closing is no failure
                continue;
            }
            if (got && word == kDistSolo && d.rank != 0) {  // rank 0 is busy alone: waiting for it is progress
                dist_progress(d);
                continue;
            }
            if (d.stopping.load()) return;
            dist_abort(d, "rank " + std::to_string(ranks[i]) + " ended (its connection closed): ending this rank too");
        }
#if !defined(NO_NCCL)
        if (ncclComm_t c = d.comm.load()) {
            ncclResult_t async = ncclSuccess;
            if (ncclCommGetAsyncError(c, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
                dist_abort(d, std::string("NCCL: ") + ncclGetErrorString(async) + " (another rank failed, or the network did)");
        }
#endif
        if (d.rank == 0 && d.solo.load()) {  // tell the others, about every half second
            dist_progress(d);
            const uint32_t word = kDistSolo;
            for (const pollfd& p : fds)
                if (p.fd >= 0) send_all(p.fd, &word, sizeof(word));
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
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    d.watchdog = std::thread(dist_watch, &d);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

// Rank 0 alone at work (a checkpoint's files, a sample): the other ranks wait in their next
// collective, and their watchdogs must not count that as a stall.
struct DistSolo {
    Dist& d;
    explicit DistSolo(Dist& dist) : d(dist) { d.solo.store(d.multi() && d.rank == 0); }
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
        send_all(d.peers[0], &word, sizeof(word));
    } else if (d.watchdog.joinable()) {  // the watchdog counts the DONE words
        const double until = now_seconds() + 60;
        while (d.done_count.load() < d.world - 1 && now_seconds() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        d.stopping.store(true);
    } else {  // no watchdog: read them here
        for (int r = 1; r < d.world; r++) {
            pollfd p{d.peers[r], POLLIN, 0};
            uint32_t word = 0;
            if (poll(&p, 1, 60000) > 0) recv_all(d.peers[r], &word, sizeof(word));
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
