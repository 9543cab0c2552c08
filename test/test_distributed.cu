// test_distributed: the host side of data-parallel training (distributed.cuh), without a GPU:
//   - shards: every element of n in exactly one rank's shard, for many n and world sizes
//   - -d arithmetic: micro-batches per rank, and the sizes that do not split
//   - resharding: arrays saved from N ranks' shards (place_gathered_chunk, chunk by chunk, as
//     train_gpt gathers them) are the whole arrays; M ranks then take back exactly their part
//   - launchers: rank, world and local rank from torchrun's, mpirun's and srun's variables;
//     malformed ones are one-line errors; Slurm's node lists
//   - SHA-256 and HMAC-SHA256 against the standards' test vectors; peer text made printable
//   - rendezvous (processes on this machine, over TCP on 127.0.0.1 and ::1, and over a file): every
//     rank gets rank 0's id; rank 0 listens on the address it was told only; a rank started with
//     other flags is refused on every rank, naming what differs; a world-size mismatch, an
//     out-of-range rank and two processes claiming one rank are errors
//   - the run secret: none, or too short, is a one-line error; a token file beside -rz file: works
//     and must be private; a stranger without it learns nothing and cannot end the run; a rank with
//     another secret, or a rank 0 that cannot prove it, is refused with one line
//   - deadlines: silent and slow connections do not delay the ranks; a rank 0 that never answers,
//     a full listen queue and a stale file cannot hold a rank past the timeout
//   - -rz file: mode 0600 with a per-run nonce, removed on every exit of rank 0 (fail, signal,
//     success), a live run's file is not taken over, a file naming another run's port is not joined
//   - messages: a foreign protocol and a malformed file say so; a failing rank prints one line
//   - the watchdog: a rank that dies ends the others within a few seconds with one line; a run that
//     makes no progress ends; a partial word does not stall it and an unknown word is an error;
//     rank 0 alone for longer than -wt ends the run; ranks that finish normally end without an error
// Every rank and stranger is a process or thread on this machine, on loopback; every wait is bounded
// (children are killed by alarm after kChildSeconds). Ends with `N passed, N failed, N skipped`.
#include <sys/stat.h>
#include <sys/wait.h>

#include <functional>
#include <random>
#include <tuple>

#include "dev/lab.cuh"
#include "distributed.cuh"

static TestCounter counter;
static void report(const std::string& name, bool ok, const std::string& detail = "") {
    printf("  %-70s %s  %s\n", name.c_str(), ok ? "ok  " : "FAIL", detail.c_str());
    counter.record(ok);
}

constexpr unsigned kChildSeconds = 60;  // no child process outlives this, whatever goes wrong
constexpr const char* kSecret = "test-secret-0123456789abcdef";

static std::string read_all(int fd) {
    std::string text;
    char buf[512];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) text.append(buf, size_t(n));
    return text;
}
static int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// Runs fn in a child process; returns its exit code (or 128 + signal) and its stderr.
template <typename F> static int in_child(F fn, std::string* err = nullptr) {
    int pipefd[2];
    if (pipe(pipefd) != 0) return -1;
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        dup2(pipefd[1], 2);
        alarm(kChildSeconds);
        fn();
        fflush(stdout);
        _exit(0);
    }
    close(pipefd[1]);
    const std::string text = read_all(pipefd[0]);
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (err) *err = text;
    return exit_code(status);
}

static int free_port() {
    int port = 0;
    const int s = dist_listen("127.0.0.1", "0", &port);
    close(s);
    return port;
}
static std::string local(int port) { return "127.0.0.1:" + std::to_string(port); }

#if !defined(NO_NCCL)
static ncclUniqueId test_id() {  // what rank 0 hands out: a known pattern, no NCCL call
    ncclUniqueId id;
    for (size_t i = 0; i < sizeof(id.internal); i++) id.internal[i] = char(i * 7 + 3);
    return id;
}
#else
static int test_id() { return 0; }
#endif

// Rank 1 of 2, alone in a child process, meeting rank 0 at `where` with `setup`: its exit code, and its
// stderr in *err. timeout > 0: GPT_RENDEZVOUS_TIMEOUT in the child.
static int lone_rank1(const std::string& where, const std::string& setup, std::string* err, int timeout = 0) {
    return in_child([&] {
        if (timeout > 0) setenv("GPT_RENDEZVOUS_TIMEOUT", std::to_string(timeout).c_str(), 1);
        Dist d;
        d.rank = 1, d.world = 2, d.local_world = 2;
        dist_rendezvous(d, where, setup, test_id);
    }, err);
}

// Ranks as child processes: each rendezvous at `where`, then runs after(d) and exits 0. prepare(r, d)
// runs in the child first (its environment, a rank it claims, its world).
using After = std::function<void(Dist&)>;
using Prepare = std::function<void(int, Dist&)>;
struct Ranks {
    std::vector<pid_t> pids;
    std::vector<int> pipes;
    std::vector<int> codes;
    std::vector<std::string> errs;
    std::string codes_text() const {
        std::string s = "exit codes";
        for (int c : codes) s += " " + std::to_string(c);
        return s;
    }
};
static void start_rank(Ranks& g, int r, int world, const std::string& where, const std::string& setup, After after,
                       Prepare prepare = nullptr) {
    int p[2];
    if (pipe(p) != 0) return;
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        dup2(p[1], 2);
        alarm(kChildSeconds);
        Dist d;
        d.rank = r, d.world = world, d.local_rank = r, d.local_world = world;
        if (prepare) prepare(r, d);
        dist_rendezvous(d, where, setup, test_id);
#if !defined(NO_NCCL)
        const ncclUniqueId want = test_id();
        if (memcmp(&d.id, &want, sizeof(want)) != 0) fail("rank %d got another id than rank 0's", d.rank);
#endif
        if (after) after(d);
        _exit(0);
    }
    close(p[1]);
    g.pids.push_back(pid), g.pipes.push_back(p[0]);
}
static void wait_ranks(Ranks& g) {
    g.codes.assign(g.pids.size(), -1), g.errs.assign(g.pids.size(), "");
    for (size_t i = 0; i < g.pids.size(); i++) {
        g.errs[i] = read_all(g.pipes[i]);
        close(g.pipes[i]);
        int status = 0;
        waitpid(g.pids[i], &status, 0);
        g.codes[i] = exit_code(status);
    }
}
static Ranks run_ranks(int world, const std::string& where, const std::vector<std::string>& setups, After after,
                       Prepare prepare = nullptr) {
    Ranks g;
    for (int r = 0; r < world; r++) start_rank(g, r, world, where, setups[r], after, prepare);
    wait_ranks(g);
    return g;
}

static std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }
static int count_lines(const std::string& s) { return (int)std::count(s.begin(), s.end(), '\n'); }
// Exactly one line, an `error:` line, that says `needle`.
static bool one_error(const std::string& err, const std::string& needle) {
    return count_lines(err) == 1 && err.rfind("error: ", 0) == 0 && err.find(needle) != std::string::npos;
}
static bool no_control_bytes(const std::string& s) {
    for (unsigned char c : s)
        if ((c < 0x20 && c != '\n') || c == 0x7f) return false;
    return true;
}
static bool wait_for(const std::function<bool()>& ready, double seconds) {
    const double until = now_seconds() + seconds;
    while (!ready()) {
        if (now_seconds() > until) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
}

// A connection to rank 0's port on 127.0.0.1, waiting (bounded) for it to listen.
static int raw_connect(int port, double seconds = 5) {
    std::string why;
    return dist_connect("127.0.0.1", std::to_string(port), now_seconds() + seconds, &why);
}
// What a stranger reads within `seconds` after its last message: the byte count before the end.
static size_t bytes_until_closed(int fd, double seconds, bool* closed) {
    char buf[4096];
    size_t got = 0, n = 0;
    const double until = now_seconds() + seconds;
    Io r;
    do {
        r = recv_before(fd, buf, sizeof(buf), until, &n);
        got += n;
    } while (r == Io::ok);
    *closed = r == Io::closed;
    return got;
}

// The local addresses (as /proc/net/tcp{,6} write them, hex) of the sockets listening on `port`.
static std::vector<std::string> listening_addresses(int port) {
    std::vector<std::string> found;
    for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
        FILE* f = fopen(table, "r");
        if (!f) continue;
        char line[512], address[64];
        unsigned p = 0, state = 0;
        while (fgets(line, sizeof(line), f))
            if (sscanf(line, " %*d: %63[0-9A-Fa-f]:%x %*s %x", address, &p, &state) == 3 && p == unsigned(port) && state == 0x0A)
                found.push_back(address);
        fclose(f);
    }
    return found;
}

// A listener on 127.0.0.1 that plays a wrong rank 0 on a thread: each connection gets play(fd).
struct FakeRank0 {
    int fd = -1, port = 0;
    std::thread thread;
    std::atomic<bool> stop{false};
    explicit FakeRank0(std::function<void(int)> play) {
        fd = dist_listen("127.0.0.1", "0", &port);
        thread = std::thread([this, play] {
            while (!stop.load()) {
                pollfd p{fd, POLLIN, 0};
                if (poll(&p, 1, 50) <= 0) continue;
                const int s = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
                if (s < 0) continue;
                play(s);
                close(s);
            }
        });
    }
    ~FakeRank0() {
        stop.store(true);
        thread.join();
        close(fd);
    }
};

// A process whose exit takes a while (a slow teardown, as CUDA's can be).
struct SlowExit {
    ~SlowExit() { std::this_thread::sleep_for(std::chrono::milliseconds(1500)); }
};

static std::string hex_of(const uint8_t* p, size_t n) { return hex_string(p, n); }
static std::string sha256_hex(const std::string& m) {
    Sha256 s;
    s.update(m.data(), m.size());
    uint8_t d[32];
    s.finish(d);
    return hex_of(d, 32);
}
static std::string hmac_hex(const std::string& key, const std::string& m) {
    uint8_t d[32];
    hmac_sha256(key, {{m.data(), m.size()}}, d);
    return hex_of(d, 32);
}

// Runs argv with the environment changed by `env` ("NAME=value" sets, "NAME" unsets); returns its
// exit code, and its stdout and stderr together.
static int run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env, std::string* out) {
    int pipefd[2];
    if (pipe(pipefd) != 0) return -1;
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        dup2(pipefd[1], 1), dup2(pipefd[1], 2);
        alarm(kChildSeconds);
        for (const std::string& e : env) {
            const size_t eq = e.find('=');
            if (eq == std::string::npos) unsetenv(e.c_str());
            else setenv(e.substr(0, eq).c_str(), e.substr(eq + 1).c_str(), 1);
        }
        std::vector<char*> args;
        for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        execvp(args[0], args.data());
        fprintf(stderr, "error: cannot run %s: %s\n", args[0], strerror(errno));
        _exit(127);
    }
    close(pipefd[1]);
    *out = read_all(pipefd[0]);
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return exit_code(status);
}

// --join: one rank of a run started by a launcher (its variables and secret): meet, end together.
static int join_from_env() {
    Dist d;
    dist_from_env(d);
    dist_rendezvous(d, "", "join-test", test_id);
    dist_start_watchdog(d, 0);
    dist_close(d);
    printf("rank %d of %d joined\n", d.rank, d.world);
    return 0;
}

static void usage(FILE* f) {
    fprintf(f, "usage: test_distributed [--join]\n"
               "  runs the host-side tests of distributed.cuh (no GPU), ending with `N passed, N failed, N skipped`\n"
               "  --join   be one rank of a run a launcher started (its RANK/WORLD_SIZE, mpirun's or srun's\n"
               "           variables and GPT_RUN_SECRET): meet rank 0, end together (the tests start it so)\n");
}

int main(int argc, char** argv) {
    if (argc == 2 && std::string(argv[1]) == "--join") return join_from_env();
    if (argc == 2 && (std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help")) return usage(stdout), 0;
    if (argc > 1) {
        fprintf(stderr, "error: unknown argument '%s'\n", argv[1]);
        usage(stderr);
        return 1;
    }
    setenv("GPT_RENDEZVOUS_TIMEOUT", "10", 1);  // failing cases end in seconds, not minutes
    setenv(kSecretVariable, kSecret, 1);
    for (const char* v : {"MASTER_ADDR", "MASTER_PORT"}) unsetenv(v);
    printf("shards and batch arithmetic\n");
    {
        bool ok = true;
        std::string detail = "n in {0, 1, 7, 100, 12345, 124475904} x world in {1, 2, 3, 8, 64}";
        for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(100), size_t(12345), size_t(124475904)})
            for (int world : {1, 2, 3, 8, 64}) {
                size_t next = 0;
                for (int r = 0; r < world; r++) {
                    const size_t b = shard_begin(n, world, r), e = shard_end(n, world, r);
                    if (b != next || e < b || e - b > shard_size(n, world)) ok = false;
                    next = e;
                }
                if (next != n || shard_size(n, world) * world < n) ok = false;
            }
        report("every element in exactly one shard, shards contiguous and in order", ok, detail);
        report("-d 2048 at B=4 T=256: 2 micro-batches on 1 GPU, 1 on 2", micro_steps_per_rank(2048, 4, 256, 1) == 2 &&
                                                                             micro_steps_per_rank(2048, 4, 256, 2) == 1);
        report("-d 3072 at B=4 T=256 on 2 GPUs, or -d 1024 on 2: no whole split (0)",
               micro_steps_per_rank(3072, 4, 256, 2) == 0 && micro_steps_per_rank(1024, 4, 256, 2) == 0);
    }
    printf("resharding: saved from N ranks, resumed on M\n");
    {
        std::mt19937 gen(7);
        for (size_t n : {size_t(1001), size_t(64), size_t(5)})
            for (int N : {1, 2, 3, 8}) {
                std::vector<float> whole(n);
                for (float& x : whole) x = float(gen()) / 1e6f;
                const size_t S = shard_size(n, N);
                std::vector<std::vector<float>> shards(N, std::vector<float>(S, -7.0f));  // padding poisoned
                for (int r = 0; r < N; r++)
                    std::copy(whole.begin() + shard_begin(n, N, r), whole.begin() + shard_end(n, N, r), shards[r].begin());
                std::vector<float> saved(n, NAN), gathered;
                const size_t chunk = std::max<size_t>(1, S / 3);
                for (size_t at = 0; at < S; at += chunk) {  // as zero.cuh's dp_gather_shards does, chunk by chunk
                    const size_t k = std::min(chunk, S - at);
                    gathered.assign(k * N, 0.0f);
                    for (int r = 0; r < N; r++) std::copy(shards[r].begin() + at, shards[r].begin() + at + k, gathered.begin() + r * k);
                    place_gathered_chunk(saved.data(), n, N, at, k, gathered.data());
                }
                bool ok = saved == whole;
                for (int M : {1, 2, 5}) {  // resumed on M ranks: rank r takes [begin, end) of the whole arrays
                    std::vector<float> again;
                    for (int r = 0; r < M; r++)
                        again.insert(again.end(), saved.begin() + shard_begin(n, M, r), saved.begin() + shard_end(n, M, r));
                    ok = ok && again == whole;
                }
                report("n=" + std::to_string(n) + " saved from " + std::to_string(N) + " ranks, resumed on 1, 2, 5", ok);
            }
    }
    printf("launchers\n");
    {
        auto env_case = [](const char* name, std::vector<std::pair<const char*, const char*>> vars, int rank, int world, int local) {
            std::string err;
            const int code = in_child([&] {
                for (const char* v : {"WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE",
                                      "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                      "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_NODES"})
                    unsetenv(v);
                for (auto& kv : vars) setenv(kv.first, kv.second, 1);
                Dist d;
                dist_from_env(d);
                _exit(d.rank == rank && d.world == world && d.local_rank == local ? 0 : 3);
            }, &err);
            report(name, code == 0, code == 0 ? "" : "exit " + std::to_string(code) + " " + first_line(err));
        };
        env_case("no launcher: one process", {}, 0, 1, 0);
        env_case("torchrun style: WORLD_SIZE=4 RANK=2 LOCAL_RANK=0", {{"WORLD_SIZE", "4"}, {"RANK", "2"}, {"LOCAL_RANK", "0"}}, 2, 4, 0);
        env_case("mpirun: OMPI_COMM_WORLD_*", {{"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}},
                 5, 8, 1);
        env_case("srun: SLURM_STEP_NUM_TASKS, SLURM_PROCID, SLURM_LOCALID",
                 {{"SLURM_STEP_NUM_TASKS", "16"}, {"SLURM_PROCID", "9"}, {"SLURM_LOCALID", "1"}}, 9, 16, 1);
        env_case("torchrun's variables win over srun's", {{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"SLURM_STEP_NUM_TASKS", "16"},
                 {"SLURM_PROCID", "9"}}, 1, 2, 1);
        auto env_error = [](const char* name, std::vector<std::pair<const char*, const char*>> vars, const char* needle) {
            std::string err;
            const int code = in_child([&] {
                for (auto& kv : vars) setenv(kv.first, kv.second, 1);
                Dist d;
                dist_from_env(d);
            }, &err);
            report(name, code == 1 && count_lines(err) == 1 && err.rfind("error: ", 0) == 0 && err.find(needle) != std::string::npos,
                   first_line(err));
        };
        env_error("WORLD_SIZE=abc: one-line error", {{"WORLD_SIZE", "abc"}}, "WORLD_SIZE");
        env_error("WORLD_SIZE without RANK: one-line error", {{"WORLD_SIZE", "2"}}, "RANK");
        env_error("RANK=3 of WORLD_SIZE=2: one-line error", {{"WORLD_SIZE", "2"}, {"RANK", "3"}}, "outside");
        report("Slurm node lists: gpu[03-04,07],cpu1 -> gpu03; n1,n2 -> n1; a[9] -> a9; solo -> solo",
               slurm_first_host("gpu[03-04,07],cpu1") == "gpu03" && slurm_first_host("n1,n2") == "n1" && slurm_first_host("a[9]") == "a9" &&
               slurm_first_host("solo") == "solo");
    }

    printf("SHA-256 and HMAC-SHA256 (FIPS 180-4 and RFC 4231 test vectors)\n");
    {
        const std::pair<std::string, const char*> hashes[] = {
            {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
            {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
            {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
            {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
             "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
            {std::string(1000000, 'a'), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
        };
        for (const auto& h : hashes) {
            const std::string got = sha256_hex(h.first);
            report("SHA-256 of " + std::to_string(h.first.size()) + " bytes (" + h.first.substr(0, 8) + (h.first.size() > 8 ? "...)" : ")"),
                   got == h.second, got);
        }
        // The same million bytes fed in uneven pieces: block boundaries inside update().
        Sha256 s;
        const std::string a(1000000, 'a');
        for (size_t at = 0, k = 1; at < a.size(); at += k, k = k % 97 + 1) s.update(a.data() + at, std::min(k, a.size() - at));
        uint8_t d[32];
        s.finish(d);
        report("SHA-256 of the million bytes in pieces of 1 to 97 bytes", hex_of(d, 32) == hashes[4].second);
        const std::string key131(131, '\xaa');
        std::string key25;
        for (int i = 1; i <= 25; i++) key25 += char(i);
        const std::tuple<const char*, std::string, std::string, const char*> macs[] = {
            {"1", std::string(20, '\x0b'), "Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
            {"2", "Jefe", "what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
            {"3", std::string(20, '\xaa'), std::string(50, '\xdd'), "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
            {"4", key25, std::string(50, '\xcd'), "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
            {"6", key131, "Test Using Larger Than Block-Size Key - Hash Key First",
             "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
            {"7", key131, "This is a test using a larger than block-size key and a larger than block-size data. The key needs to be "
                          "hashed before being used by the HMAC algorithm.",
             "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
        };
        for (const auto& m : macs) {
            const std::string got = hmac_hex(std::get<1>(m), std::get<2>(m));
            report(std::string("HMAC-SHA256, RFC 4231 test case ") + std::get<0>(m), got == std::get<3>(m), got);
        }
        const std::string shown = printable("gpu\x1b[2J\x07\n\x9b" "7");
        report("peer text printed: control bytes become \\xNN", shown == "gpu\\x1b[2J\\x07\\x0a\\x9b7", shown);
    }

    printf("rendezvous\n");
    After quiet = [](Dist& d) { dist_close(d); };
    {
        Ranks g = run_ranks(3, local(free_port()), {"-b=4 -t=64", "-b=4 -t=64", "-b=4 -t=64"}, [](Dist& d) {
            dist_start_watchdog(d, 0);
            dist_close(d);
        });
#if defined(NO_NCCL)
        const char* what = "TCP, 3 ranks, the same setup: all end cleanly (a build without NCCL exchanges no id)";
#else
        const char* what = "TCP, 3 ranks, the same setup: every rank gets rank 0's id, all end cleanly";
#endif
        report(what, g.codes == std::vector<int>{0, 0, 0}, g.codes_text() + " " + first_line(g.errs[0] + g.errs[1] + g.errs[2]));
        const std::string file = "/tmp/gpt_rendezvous_test_" + std::to_string(getpid());
        g = run_ranks(2, "file:" + file, {"x=1", "x=1"}, quiet);
        report("a file on a shared file system, 2 ranks; the file is gone afterwards", g.codes == std::vector<int>{0, 0} && !file_exists(file),
               g.codes_text() + " " + first_line(g.errs[0] + g.errs[1]));
        std::string err;
        int code = in_child([] {
            unsetenv("MASTER_ADDR");
            Dist d;
            d.world = 4, d.local_world = 4;
            _exit(dist_rendezvous_address(d, "") == "127.0.0.1:29500" ? 0 : 3);
        }, &err);
        report("every rank on this node, no MASTER_ADDR: rank 0 is at 127.0.0.1:29500", code == 0, first_line(err));
        // Rank 0 told 127.0.0.1 listens there and nowhere else (not on every interface).
        const int port = free_port();
        Ranks r0;
        start_rank(r0, 0, 2, local(port), "a", quiet);
        std::vector<std::string> bound;
        wait_for([&] { return !(bound = listening_addresses(port)).empty(); }, 5);
        start_rank(r0, 1, 2, local(port), "a", quiet);
        wait_ranks(r0);
        report("rank 0 told 127.0.0.1 listens on 127.0.0.1 only (/proc/net/tcp)",
               bound == std::vector<std::string>{"0100007F"} && r0.codes == std::vector<int>{0, 0},
               "listening: " + (bound.empty() ? std::string("nothing") : bound[0]) + (bound.size() > 1 ? " and more" : "") + "; " +
                   r0.codes_text());
        // Ranks on several nodes, rank 0's host name resolving to loopback on its own node: an error
        // (the other nodes could not reach it), through MASTER_ADDR and through -rz file:.
        char name[256] = {};
        gethostname(name, sizeof(name) - 1);
        addrinfo hints{}, *res = nullptr;
        hints.ai_socktype = SOCK_STREAM;
        const bool name_is_loopback = getaddrinfo(name, "1", &hints, &res) == 0 && is_loopback(res->ai_addr);
        if (res) freeaddrinfo(res);
        if (name_is_loopback) {
            for (int via_file = 0; via_file < 2; via_file++) {
                std::string err;
                const std::string file = "/tmp/gpt_rendezvous_name_" + std::to_string(getpid());
                const int code = in_child([&] {
                    if (!via_file) setenv("MASTER_ADDR", name, 1), setenv("MASTER_PORT", std::to_string(free_port()).c_str(), 1);
                    Dist d;
                    d.world = 2, d.local_world = -1;  // not every rank on this node
                    dist_rendezvous(d, via_file ? "file:" + file : std::string(), "a", test_id);
                }, &err);
                report(std::string("several nodes, rank 0's name '") + name + "' resolves to loopback" + (via_file ? " (-rz file:)" : "") +
                           ": one line", code == 1 && one_error(err, "loopback address other nodes cannot reach") && !file_exists(file),
                       first_line(err));
            }
        } else {
            counter.skip("  several nodes, rank 0's name resolves to loopback: one line", "this host's name is not loopback");
        }
        int v6port = 0;
        const int v6 = in_child([&] {
            const int s = socket(AF_INET6, SOCK_STREAM, 0);
            sockaddr_in6 a{};
            a.sin6_family = AF_INET6, a.sin6_addr = in6addr_loopback;
            _exit(s >= 0 && bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 ? 0 : 3);
        });
        if (v6 == 0) {
            const int s = dist_listen("::1", "0", &v6port);
            close(s);
            g = run_ranks(2, "[::1]:" + std::to_string(v6port), {"a", "a"}, quiet);
            report("IPv6 loopback: rank 0 at [::1], 2 ranks", g.codes == std::vector<int>{0, 0}, g.codes_text() + " " + first_line(g.errs[0] + g.errs[1]));
        } else {
            counter.skip("  IPv6 loopback: rank 0 at [::1], 2 ranks", "no IPv6 loopback here");
        }
    }
    {
        Ranks g = run_ranks(3, local(free_port()), {"-b=4 -t=64 data=1:ab", "-b=4 -t=64 data=1:ab", "-b=8 -t=64 data=1:ab"}, quiet);
        const bool ok = g.codes == std::vector<int>{1, 1, 1} && g.errs[0].find("rank 2") != std::string::npos &&
                        g.errs[0].find("'-b=8' where rank 0 has '-b=4'") != std::string::npos && count_lines(g.errs[0]) == 1 &&
                        one_error(g.errs[2], "rank 0 refused the run: rank 2") && one_error(g.errs[1], "rank 0 refused the run: rank 2");
        report("rank 2 started with -b 8: refused on every rank, the difference named", ok, first_line(g.errs[0]));
        g = run_ranks(2, local(free_port()), {"a", "a"}, quiet, [](int r, Dist& d) { d.world = r == 1 ? 3 : 2; });
        report("rank 1 started with a world of 3, rank 0 with 2: one line on each", g.codes == std::vector<int>{1, 1} &&
               one_error(g.errs[0], "world of 3") && one_error(g.errs[1], "world of 3"), first_line(g.errs[0]));
        g = run_ranks(3, local(free_port()), {"a", "a", "a"}, quiet, [](int r, Dist& d) { d.rank = r == 2 ? 1 : r; });
        report("two processes claim rank 1: error", g.codes[0] == 1 && one_error(g.errs[0], "two processes claim rank 1"),
               first_line(g.errs[0]));
        g = run_ranks(2, local(free_port()), {"a", "a"}, quiet, [](int r, Dist& d) { d.rank = r == 1 ? 5 : 0; });
        report("a rank with the secret says it is rank 5 of 2: it is out of range, not a second rank 5",
               g.codes == std::vector<int>{1, 1} && one_error(g.errs[0], "says it is rank 5, outside the world of 2") &&
                   g.errs[0].find("two processes") == std::string::npos && one_error(g.errs[1], "outside the world"),
               first_line(g.errs[0]));
        g = run_ranks(2, local(free_port()), {"x=1 path=/data/a", "x=1 path=/data/\x1b]0;owned\x07\x1b[31mb"}, quiet);
        report("a setup with escape sequences: printed as \\xNN on every rank, no control byte",
               g.codes == std::vector<int>{1, 1} && no_control_bytes(g.errs[0]) && no_control_bytes(g.errs[1]) &&
                   g.errs[0].find("\\x1b]0;owned\\x07\\x1b[31mb") != std::string::npos && count_lines(g.errs[1]) == 1,
               first_line(g.errs[0]));
        const double t0 = now_seconds();
        std::string err;
        const int code = in_child([] {
            setenv("GPT_RENDEZVOUS_TIMEOUT", "2", 1);
            Dist d;
            d.rank = 1, d.world = 2;
            dist_rendezvous(d, local(free_port()), "a", test_id);
        }, &err);
        report("rank 0 never comes: one error within the time limit (2 s)",
               code == 1 && one_error(err, "cannot reach rank 0") && now_seconds() - t0 < 5, first_line(err));
    }

    printf("the run secret\n");
    {
        double t0 = now_seconds();
        Ranks g = run_ranks(2, local(free_port()), {"a", "a"}, quiet, [](int, Dist&) { unsetenv(kSecretVariable); });
        report("no secret: every rank ends at once with one line saying how to set one",
               g.codes == std::vector<int>{1, 1} && one_error(g.errs[0], "no run secret") && one_error(g.errs[1], "export GPT_RUN_SECRET=") &&
                   now_seconds() - t0 < 3, first_line(g.errs[0]));
        g = run_ranks(2, local(free_port()), {"a", "a"}, quiet, [](int, Dist&) { setenv(kSecretVariable, "short", 1); });
        report("a secret of 5 characters: one line on every rank", g.codes == std::vector<int>{1, 1} &&
               one_error(g.errs[0], "at least 16") && one_error(g.errs[1], "at least 16"), first_line(g.errs[0]));
        const std::string file = "/tmp/gpt_rendezvous_token_" + std::to_string(getpid()), token = dist_secret_file(file);
        FILE* f = fopen(token.c_str(), "w");
        fprintf(f, "a-token-from-a-file-0123456789\n");
        fclose(f);
        chmod(token.c_str(), 0600);
        g = run_ranks(2, "file:" + file, {"a", "a"}, quiet, [](int, Dist&) { unsetenv(kSecretVariable); });
        report("no GPT_RUN_SECRET, a token file beside -rz file: (mode 600): the ranks meet", g.codes == std::vector<int>{0, 0},
               g.codes_text() + " " + first_line(g.errs[0] + g.errs[1]));
        g = run_ranks(2, "file:" + file, {"a", "a"}, quiet, [](int r, Dist&) {
            unsetenv(kSecretVariable);
            if (r == 1) setenv(kSecretVariable, "another-secret-0123456789", 1), setenv("GPT_RENDEZVOUS_TIMEOUT", "2", 1);
            else setenv("GPT_RENDEZVOUS_TIMEOUT", "3", 1);
        });
        report("GPT_RUN_SECRET wins over the token file (rank 1 with another: it cannot join)", g.codes == std::vector<int>{1, 1} &&
               one_error(g.errs[1], "dropped this rank at its proof"), first_line(g.errs[1]));
        chmod(token.c_str(), 0644);
        g = run_ranks(2, "file:" + file, {"a", "a"}, quiet, [](int, Dist&) { unsetenv(kSecretVariable); });
        report("a token file others may read (mode 644): one line saying chmod 600", g.codes == std::vector<int>{1, 1} &&
               one_error(g.errs[0], "chmod 600") && one_error(g.errs[1], "chmod 600"), first_line(g.errs[0]));
        unlink(token.c_str());

        // Strangers first, the real rank 1 after them: none of them learns a setup word or the id,
        // none ends the run, and the run goes on.
        const int port = free_port();
        Ranks r0;
        start_rank(r0, 0, 2, local(port), "-b=4 secret-setup-word", quiet);
        bool all_dropped = true, learnt_nothing = true;
        std::string detail;
        auto stranger = [&](const char* what, std::function<void(int, const DistChallenge&)> act) {
            const int s = raw_connect(port);
            DistChallenge c{};
            const bool challenged = s >= 0 && recv_before(s, &c, sizeof(c), now_seconds() + 3) == Io::ok && c.magic == kDistMagic;
            if (challenged) act(s, c);
            bool closed = false;
            const size_t more = s >= 0 ? bytes_until_closed(s, 8, &closed) : 0;
            if (s >= 0) close(s);
            all_dropped = all_dropped && challenged && closed;
            learnt_nothing = learnt_nothing && more == 0;
            detail += std::string(what) + ": " + (challenged ? "" : "no challenge, ") + std::to_string(more) + " bytes" +
                      (closed ? ", dropped; " : ", not dropped; ");
        };
        stranger("a wrong proof", [](int s, const DistChallenge& c) {
            DistResponse r{};
            r.magic = kDistMagic, r.version = kDistVersion;
            memcpy(r.proof, c.nonce, 32);  // anything but the HMAC
            send_before(s, &r, sizeof(r), now_seconds() + 2);
        });
        stranger("the old hello (rank 7 of 1000)", [](int s, const DistChallenge&) {
            std::vector<int32_t> hello(600, 0);
            hello[0] = int32_t(kDistMagic), hello[1] = 7, hello[2] = 1000;
            send_before(s, hello.data(), hello.size() * 4, now_seconds() + 2);
        });
        stranger("a hello claiming rank 0 of 1", [](int s, const DistChallenge&) {
            std::vector<int32_t> hello(600, 0);
            hello[0] = int32_t(kDistMagic), hello[1] = 0, hello[2] = 1;
            send_before(s, hello.data(), hello.size() * 4, now_seconds() + 2);
        });
        stranger("a proof replayed from another channel", [&](int s, const DistChallenge&) {
            // A proof that is right for some other nonce of rank 0's (the stranger cannot get one for this nonce).
            std::string secret = kSecret;
            DistChannel other;
            other.secret = &secret;
            DistResponse r{};
            r.magic = kDistMagic, r.version = kDistVersion;
            other.mac("rank proof", nullptr, 0, r.proof);
            memcpy(r.nonce, other.rank_nonce, 32);
            send_before(s, &r, sizeof(r), now_seconds() + 2);
        });
        start_rank(r0, 1, 2, local(port), "-b=4 secret-setup-word", quiet);
        wait_ranks(r0);
        report("strangers without the secret are dropped, learning nothing; the run goes on", all_dropped && learnt_nothing &&
               r0.codes == std::vector<int>{0, 0} && r0.errs[0].empty(), detail + r0.codes_text());

        t0 = now_seconds();
        g = run_ranks(2, local(free_port()), {"a", "a"}, quiet, [](int r, Dist&) {
            setenv("GPT_RENDEZVOUS_TIMEOUT", "3", 1);
            if (r == 1) setenv(kSecretVariable, "another-secret-0123456789", 1);
        });
        report("rank 1 with another secret: one line each; rank 0 keeps listening until its time limit",
               g.codes == std::vector<int>{1, 1} && one_error(g.errs[1], "dropped this rank at its proof") &&
                   one_error(g.errs[0], "1 of 2 ranks") && g.errs[0].find("1 without the run secret's proof") != std::string::npos &&
                   now_seconds() - t0 > 2.5 && now_seconds() - t0 < 8,
               first_line(g.errs[1]) + " | " + first_line(g.errs[0]));

        // A rank 0 that does not know the secret: rank 1 tells it nothing after its proof.
        std::atomic<size_t> told{0};
        std::atomic<int> fake_saw{0};
        {
            FakeRank0 fake([&](int s) {
                DistChallenge c{};
                c.magic = kDistMagic, c.version = kDistVersion;
                send_before(s, &c, sizeof(c), now_seconds() + 2);
                DistResponse r{};
                if (recv_before(s, &r, sizeof(r), now_seconds() + 3) != Io::ok) return;
                fake_saw++;
                DistProof p{};
                memcpy(p.proof, r.proof, 32);  // its own proof back: the wrong label
                send_before(s, &p, sizeof(p), now_seconds() + 2);
                bool closed = false;
                told += bytes_until_closed(s, 3, &closed);
            });
            std::string err;
            const int code = lone_rank1(local(fake.port), "secret-setup-word", &err);
            report("a rank 0 that cannot prove the secret: rank 1 sends it no hello and ends with one line",
                   code == 1 && one_error(err, "could not prove that it knows the run secret") && fake_saw == 1 && told == 0,
                   first_line(err) + "; it got " + std::to_string(told.load()) + " bytes more");
        }
    }

    printf("the run secret through launchers (this program's --join mode as the ranks, on 127.0.0.1)\n");
    {
        const std::string self = "/proc/" + std::to_string(getpid()) + "/exe";
        char exe[4096] = {};
        const bool found = readlink(self.c_str(), exe, sizeof(exe) - 1) > 0;
        const std::vector<std::string> no_launcher = {"WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE",
                                                      "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_NODES"};
        auto with = [&](std::vector<std::string> env) {
            env.insert(env.begin(), no_launcher.begin(), no_launcher.end());
            env.push_back("MASTER_PORT=" + std::to_string(free_port()));
            return env;
        };
        std::string out;
        if (found && file_exists("scripts/launch.sh")) {
            int code = run_command({"bash", "scripts/launch.sh", "2", exe, "--join"}, with({kSecretVariable}), &out);
            report("scripts/launch.sh 2, no secret set: it makes one, and both ranks join", code == 0 &&
                   out.find("rank 0 of 2 joined") != std::string::npos && out.find("rank 1 of 2 joined") != std::string::npos,
                   "exit " + std::to_string(code) + " " + first_line(out));
            // Rank 1's one line; launch.sh then ends the others, which would otherwise wait out the
            // rendezvous. Among 4 ranks the 3 waiting end together, and launch.sh must collect them all
            // and exit, saying nothing more.
            for (const int ranks : {2, 4}) {
                code = run_command({"bash", "scripts/launch.sh", std::to_string(ranks), "bash", "-c",
                                    "[[ $RANK == 1 ]] && export GPT_RUN_SECRET=another-secret-0123456789; exec \"$0\" --join", exe},
                                   with({kSecretVariable, "GPT_RENDEZVOUS_TIMEOUT=3"}), &out);
                report("scripts/launch.sh " + std::to_string(ranks) +
                           ", rank 1 with another secret: refused, one line, the others ended with it, exit code 1",
                       code == 1 && count_lines(out) == 1 && out.find("error: rendezvous: rank 0 at 127.0.0.1:") != std::string::npos &&
                           out.find("dropped this rank at its proof") != std::string::npos,
                       "exit " + std::to_string(code) + " " + first_line(out));
            }
        } else {
            counter.skip("  scripts/launch.sh: its secret", "run from the repository's root to test scripts/launch.sh");
        }
        // mpirun's and srun's variables (as they set them, one node), the secret in the environment.
        auto pair = [&](bool mpirun, const std::vector<std::string>& extra, std::string* text) {
            const std::string port = "MASTER_PORT=" + std::to_string(free_port());
            std::vector<std::string> outs(2);
            std::vector<int> codes(2);
            std::vector<std::thread> ranks;
            for (int r = 0; r < 2; r++)
                ranks.emplace_back([&, r] {
                    const std::string rank = std::to_string(r);
                    std::vector<std::string> env = no_launcher;
                    if (mpirun)
                        env.insert(env.end(), {"OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=" + rank, "OMPI_COMM_WORLD_LOCAL_RANK=" + rank,
                                               "OMPI_COMM_WORLD_LOCAL_SIZE=2"});
                    else
                        env.insert(env.end(), {"SLURM_STEP_NUM_TASKS=2", "SLURM_PROCID=" + rank, "SLURM_LOCALID=" + rank, "SLURM_STEP_NUM_NODES=1"});
                    env.insert(env.end(), {port, "GPT_RENDEZVOUS_TIMEOUT=3"});
                    env.insert(env.end(), extra.begin(), extra.end());
                    codes[r] = run_command({exe, "--join"}, env, &outs[r]);
                });
            for (std::thread& t : ranks) t.join();
            *text = outs[0] + outs[1];
            return codes;
        };
        for (bool mpirun : {true, false}) {
            const std::string who = mpirun ? "mpirun's variables" : "srun's variables";
            std::vector<int> codes = pair(mpirun, {}, &out);
            report(who + ", GPT_RUN_SECRET passed on: both ranks join", codes == std::vector<int>{0, 0} &&
                   out.find("rank 1 of 2 joined") != std::string::npos, first_line(out));
            codes = pair(mpirun, {kSecretVariable}, &out);
            report(who + ", no secret: each rank ends at once with one line", codes == std::vector<int>{1, 1} && count_lines(out) == 2 &&
                   out.find("error: 2 ranks and no run secret") != std::string::npos, first_line(out));
        }
    }

    printf("deadlines\n");
    {
        // Silent connections and a slow sender opened before rank 1: the run does not wait for them.
        const int port = free_port();
        Ranks g;
        start_rank(g, 0, 2, local(port), "a", quiet);
        std::vector<int> silent;
        for (int i = 0; i < 40; i++) silent.push_back(raw_connect(port));
        std::atomic<bool> stop{false};
        std::thread slow([&] {
            const int s = raw_connect(port);
            const char byte = 'G';
            for (int i = 0; i < 40 && !stop.load(); i++) {
                if (send(s, &byte, 1, MSG_NOSIGNAL) != 1) break;
                std::this_thread::sleep_for(std::chrono::milliseconds(250));
            }
            close(s);
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        const double t0 = now_seconds();
        start_rank(g, 1, 2, local(port), "a", quiet);
        wait_ranks(g);
        const double took = now_seconds() - t0;
        stop.store(true);
        slow.join();
        for (int s : silent) close(s);
        report("40 silent connections and a byte-every-250-ms sender before rank 1: it joins at once", g.codes == std::vector<int>{0, 0} &&
               took < 3, std::to_string(took).substr(0, 4) + " s; " + g.codes_text());

        // A slow sender alone cannot hold rank 0 past its time limit.
        const int port2 = free_port();
        Ranks h;
        double t1 = now_seconds();
        start_rank(h, 0, 2, local(port2), "a", quiet, [](int, Dist&) { setenv("GPT_RENDEZVOUS_TIMEOUT", "2", 1); });
        std::thread slow2([&] {
            const int s = raw_connect(port2);
            const char byte = 'G';
            for (int i = 0; i < 40; i++) {
                if (send(s, &byte, 1, MSG_NOSIGNAL) != 1) break;
                std::this_thread::sleep_for(std::chrono::milliseconds(200));
            }
            close(s);
        });
        wait_ranks(h);
        double took2 = now_seconds() - t1;
        slow2.join();
        report("a slow sender alone: rank 0 ends at its time limit (2 s) with one line", h.codes[0] == 1 &&
               one_error(h.errs[0], "1 of 2 ranks") && took2 < 5, std::to_string(took2).substr(0, 4) + " s; " + first_line(h.errs[0]));

        // Rank 1 against a rank 0 that accepts and never answers, or answers the challenge only.
        for (int answer = 0; answer < 2; answer++) {
            FakeRank0 fake([answer](int s) {
                if (answer) {
                    DistChallenge c{};
                    c.magic = kDistMagic, c.version = kDistVersion;
                    send_before(s, &c, sizeof(c), now_seconds() + 2);
                }
                std::this_thread::sleep_for(std::chrono::seconds(4));
            });
            std::string err;
            t1 = now_seconds();
            const int code = lone_rank1(local(fake.port), "a", &err, 2);
            took2 = now_seconds() - t1;
            report(answer ? "rank 0 sends its challenge, then nothing: rank 1 ends within its time limit (2 s)"
                          : "rank 0 accepts and never answers: rank 1 ends within its time limit (2 s)",
                   code == 1 && count_lines(err) == 1 && took2 < 4 &&
                       err.find(answer ? "did not answer this rank's proof" : "said nothing") != std::string::npos,
                   std::to_string(took2).substr(0, 4) + " s; " + first_line(err));
        }

        // A full listen queue: the SYN is dropped; a blocking connect would wait for minutes.
        int qport = 0;
        const int q = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET, a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        bind(q, reinterpret_cast<sockaddr*>(&a), sizeof(a));
        listen(q, 0);
        socklen_t len = sizeof(a);
        getsockname(q, reinterpret_cast<sockaddr*>(&a), &len);
        qport = ntohs(a.sin_port);
        std::vector<int> fillers;
        for (int i = 0; i < 8; i++) {  // until connects no longer complete: the queue is full
            const int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
            connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
            fillers.push_back(s);
        }
        std::string err;
        t1 = now_seconds();
        const int code = lone_rank1(local(qport), "a", &err, 2);
        took2 = now_seconds() - t1;
        for (int s : fillers) close(s);
        close(q);
        report("rank 0's listen queue is full: rank 1 ends within its time limit (2 s)", code == 1 && count_lines(err) == 1 && took2 < 4,
               std::to_string(took2).substr(0, 4) + " s; " + first_line(err));
    }

    printf("-rz file:\n");
    {
        const std::string file = "/tmp/gpt_rendezvous_file_" + std::to_string(getpid());
        unlink(file.c_str());
        // Written 0600 whatever the umask, with an address on loopback and a nonce.
        Ranks g;
        start_rank(g, 0, 2, "file:" + file, "a", quiet, [](int, Dist&) { umask(022); });
        wait_for([&] { return file_exists(file); }, 5);
        struct stat st{};
        stat(file.c_str(), &st);
        DistFileAddress fa;
        std::string why;
        const bool parsed = read_rendezvous_file(file, &fa, &why);
        start_rank(g, 1, 2, "file:" + file, "a", quiet);
        wait_ranks(g);
        char mode[8];
        snprintf(mode, sizeof(mode), "%03o", unsigned(st.st_mode & 0777));
        report("the file: mode 600 under umask 022, 'ADDRESS PORT NONCE' with 127.0.0.1 and 32 hex digits",
               (st.st_mode & 0777) == 0600 && parsed && fa.host == "127.0.0.1" && fa.nonce.size() == 32 && g.codes == std::vector<int>{0, 0},
               std::string("mode ") + mode + ", " + (parsed ? fa.host + " " + fa.port + " " + fa.nonce : why));

        // Removed on every exit of rank 0: its time limit (fail), a signal.
        g = Ranks();
        start_rank(g, 0, 2, "file:" + file, "a", quiet, [](int, Dist&) { setenv("GPT_RENDEZVOUS_TIMEOUT", "1", 1); });
        const bool was = wait_for([&] { return file_exists(file); }, 5);
        wait_ranks(g);
        report("rank 0 fails (its time limit): the file is removed", was && g.codes[0] == 1 && !file_exists(file) &&
               one_error(g.errs[0], "1 of 2 ranks"), first_line(g.errs[0]));
        for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
            g = Ranks();
            start_rank(g, 0, 2, "file:" + file, "a", quiet, [](int, Dist&) {
                for (int s : {SIGTERM, SIGINT, SIGHUP}) signal(s, SIG_DFL);  // a shell's background job ignores SIGINT
            });
            const bool there = wait_for([&] { return file_exists(file); }, 5);
            kill(g.pids[0], sig);
            wait_ranks(g);
            report(std::string("rank 0 ends by ") + strsignal(sig) + ": the file is removed, the exit is the signal's",
                   there && g.codes[0] == 128 + sig && !file_exists(file), g.codes_text());
        }

        // Two runs given the same file: the second rank 0 does not take over the first's.
        Ranks a, b;
        start_rank(a, 0, 2, "file:" + file, "run-a", quiet);
        wait_for([&] { return file_exists(file); }, 5);
        std::vector<uint8_t> before, after;
        read_whole_file(file, before, &why);
        start_rank(b, 0, 2, "file:" + file, "run-b", quiet);
        wait_ranks(b);
        read_whole_file(file, after, &why);
        start_rank(a, 1, 2, "file:" + file, "run-a", quiet);
        wait_ranks(a);
        report("a second run's rank 0 on a live run's file: one line, and the first run goes on",
               b.codes[0] == 1 && one_error(b.errs[0], "still listens") && before == after && a.codes == std::vector<int>{0, 0},
               first_line(b.errs[0]) + "; first run: " + a.codes_text());

        // A stale file naming a port where something accepts and never answers: rank 1 does not hang on
        // it, and joins once rank 0 writes the file again.
        {
            FakeRank0 silent([](int) { std::this_thread::sleep_for(std::chrono::seconds(5)); });
            FILE* f = fopen(file.c_str(), "w");
            fprintf(f, "127.0.0.1 %d 0123456789abcdef0123456789abcdef\n", silent.port);
            fclose(f);
            g = Ranks();
            const double t0 = now_seconds();
            start_rank(g, 1, 2, "file:" + file, "a", quiet);
            std::this_thread::sleep_for(std::chrono::milliseconds(1500));
            start_rank(g, 0, 2, "file:" + file, "a", quiet);
            wait_ranks(g);
            report("a stale file naming a silent port: rank 1 joins rank 0 once it writes the file",
                   g.codes == std::vector<int>{0, 0} && now_seconds() - t0 < 9, g.codes_text() + " " + first_line(g.errs[0] + g.errs[1]));
        }

        // Another run's live rank 0 (the same secret) reached through a copy of its file with another
        // nonce, as a stale file of an earlier run would name it: not joined.
        const std::string other = file + "_other";
        Ranks run_b;
        start_rank(run_b, 0, 2, "file:" + other, "a", quiet);
        wait_for([&] { return file_exists(other); }, 5);
        DistFileAddress ob;
        read_rendezvous_file(other, &ob, &why);
        FILE* f = fopen(file.c_str(), "w");
        fprintf(f, "%s %s fedcba9876543210fedcba9876543210\n", ob.host.c_str(), ob.port.c_str());
        fclose(f);
        std::string err;
        int code = lone_rank1("file:" + file, "a", &err, 2);
        start_rank(run_b, 1, 2, "file:" + other, "a", quiet);
        wait_ranks(run_b);
        report("a file naming another run's rank 0 (another nonce): not joined; that run goes on", code == 1 && count_lines(err) == 1 &&
               err.find("dropped this rank at its proof") != std::string::npos && run_b.codes == std::vector<int>{0, 0},
               first_line(err) + "; other run: " + run_b.codes_text());

        // Messages: a malformed file, a missing one.
        f = fopen(file.c_str(), "w");
        fprintf(f, "some-host\x1b[31m 80\n");
        fclose(f);
        code = lone_rank1("file:" + file, "a", &err, 1);
        report("a malformed file: 'malformed' and what it holds (printable), not 'no address yet'",
               code == 1 && one_error(err, "is malformed") && err.find("\\x1b[31m") != std::string::npos && no_control_bytes(err),
               first_line(err));
        unlink(file.c_str());
        code = lone_rank1("file:" + file, "a", &err, 1);
        report("no file: 'no address yet'", code == 1 && one_error(err, "no address in " + file + " yet"), first_line(err));
        unlink(other.c_str());
    }

    printf("messages\n");
    {
        FakeRank0 web([](int s) {
            const char answer[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
            send_before(s, answer, sizeof(answer) - 1, now_seconds() + 2);
        });
        std::string err;
        const int code = lone_rank1(local(web.port), "a", &err);
        report("another program on rank 0's port: 'not this program's rendezvous', not 'closed the connection'",
               code == 1 && one_error(err, "is not this program's rendezvous") && err.find("closed") == std::string::npos, first_line(err));
        // Rank 1 fails while its exit is slow and rank 0 ends meanwhile: its own line only.
        Ranks g = run_ranks(2, local(free_port()), {"a", "a"}, [](Dist& d) {
            static SlowExit slow;  // destroyed after the watchdog's exit hook has run
            (void)slow;
            dist_start_watchdog(d, 0);
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            if (d.rank == 1) fail("rank 1 fails on its own");
            std::this_thread::sleep_for(std::chrono::milliseconds(400));
            _exit(3);  // rank 0 ends while rank 1 is still exiting
        });
        report("a failing rank 1 prints one line, not also rank 0's end", g.codes[1] == 1 && one_error(g.errs[1], "rank 1 fails on its own"),
               std::to_string(count_lines(g.errs[1])) + " lines: " + first_line(g.errs[1]));
    }

    printf("the watchdog\n");
    {
        double t0 = now_seconds();
        Ranks g = run_ranks(3, local(free_port()), {"a", "a", "a"}, [](Dist& d) {
            dist_start_watchdog(d, 0);
            if (d.rank == 1) _exit(9);  // dies without a word
            for (int i = 0; i < 400; i++) {  // the others would wait on it (20 s at most)
                dist_progress(d);
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            }
        });
        double took = now_seconds() - t0;
        bool ok = g.codes[0] == 1 && g.codes[1] == 9 && g.codes[2] == 1 && one_error(g.errs[0], "rank 1 ended") &&
                  one_error(g.errs[2], "rank 0 ended") && took < 15;
        report("rank 1 dies: ranks 0 and 2 end with one line each", ok,
               std::to_string(int(took)) + " s; rank 0: " + first_line(g.errs[0]) + " | rank 2: " + first_line(g.errs[2]));
        g = run_ranks(2, local(free_port()), {"a", "a"}, [](Dist& d) {
            dist_start_watchdog(d, 1);  // -wt 1
            if (d.rank == 0) std::this_thread::sleep_for(std::chrono::seconds(30));
            else for (int i = 0; i < 600; i++) dist_progress(d), std::this_thread::sleep_for(std::chrono::milliseconds(50));
        });
        report("rank 0 makes no progress for -wt 1 s: it ends, and so does rank 1",
               g.codes[0] == 1 && one_error(g.errs[0], "no progress for") && g.codes[1] == 1 && count_lines(g.errs[1]) == 1,
               first_line(g.errs[0]));
        t0 = now_seconds();
        g = run_ranks(3, local(free_port()), {"a", "a", "a"}, [](Dist& d) {
            dist_start_watchdog(d, 0);
            if (d.rank == 1) {  // one byte of a word, then nothing
                const char byte = 'D';
                send(d.peers[0], &byte, 1, MSG_NOSIGNAL);
            }
            if (d.rank == 2) {
                std::this_thread::sleep_for(std::chrono::milliseconds(500));
                _exit(9);
            }
            for (int i = 0; i < 400; i++) dist_progress(d), std::this_thread::sleep_for(std::chrono::milliseconds(50));
        });
        took = now_seconds() - t0;
        report("rank 1 sends 1 byte of a word: rank 0's watchdog still sees rank 2 die", g.codes[0] == 1 &&
               one_error(g.errs[0], "rank 2 ended") && took < 10, std::to_string(int(took)) + " s; " + first_line(g.errs[0]));
        g = run_ranks(2, local(free_port()), {"a", "a"}, [](Dist& d) {
            dist_start_watchdog(d, 0);
            if (d.rank == 1) {
                const uint32_t word = 0xdeadbeefu;
                send(d.peers[0], &word, sizeof(word), MSG_NOSIGNAL);
            }
            for (int i = 0; i < 200; i++) dist_progress(d), std::this_thread::sleep_for(std::chrono::milliseconds(50));
        });
        report("an unknown word from rank 1: rank 0 ends with one line naming it, rank 1 follows", g.codes == std::vector<int>{1, 1} &&
               one_error(g.errs[0], "sent 0xdeadbeef") && count_lines(g.errs[1]) == 1, first_line(g.errs[0]));
        t0 = now_seconds();
        g = run_ranks(2, local(free_port()), {"a", "a"}, [](Dist& d) {
            dist_start_watchdog(d, 2);  // -wt 2
            if (d.rank == 0) {
                DistSolo solo(d);  // a checkpoint write on a hung file system
                std::this_thread::sleep_for(std::chrono::seconds(30));
            }
            std::this_thread::sleep_for(std::chrono::seconds(30));  // rank 1 waits in a collective
        });
        took = now_seconds() - t0;
        report("rank 0 alone for longer than -wt 2 s: one line on every rank", g.codes == std::vector<int>{1, 1} &&
               one_error(g.errs[0], "worked alone") && one_error(g.errs[1], "rank 0 ended") && took < 7,
               std::to_string(int(took)) + " s; " + first_line(g.errs[0]) + " | " + first_line(g.errs[1]));
        g = run_ranks(2, local(free_port()), {"a", "a"}, [](Dist& d) {
            dist_start_watchdog(d, 3);  // -wt 3
            if (d.rank == 0) {
                for (int i = 0; i < 20; i++) dist_progress(d), std::this_thread::sleep_for(std::chrono::milliseconds(50));
                DistSolo solo(d);  // 2 s alone, within -wt
                std::this_thread::sleep_for(std::chrono::seconds(2));
            } else {
                std::this_thread::sleep_for(std::chrono::seconds(4));  // no progress of its own: rank 0's word keeps it alive
            }
            dist_close(d);
        });
        report("rank 0 alone for 2 s with -wt 3, rank 1 idle 4 s meanwhile: both end cleanly", g.codes == std::vector<int>{0, 0},
               g.codes_text() + " " + first_line(g.errs[0] + g.errs[1]));
    }
    return counter.finish();
}
