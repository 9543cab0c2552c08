// test_distributed: the host side of data-parallel training (distributed.cuh), without a GPU:
//   - shards: every element of n in exactly one rank's shard, for many n and world sizes
//   - -d arithmetic: micro-batches per rank, and the sizes that do not split
//   - resharding: arrays saved from N ranks' shards (place_gathered_chunk, chunk by chunk, as
//     train_gpt gathers them) are the whole arrays; M ranks then take back exactly their part
//   - launchers: rank, world and local rank from torchrun's, mpirun's and srun's variables;
//     malformed ones are one-line errors; Slurm's node lists
//   - SHA-256 and HMAC-SHA256 against the standards' test vectors; peer text made printable
//   - rendezvous (processes on this machine, over TCP and over a file): every rank gets rank 0's id;
//     a rank started with other flags is refused on every rank, naming what differs; a world-size
//     mismatch and two processes claiming one rank are errors
//   - the watchdog: a rank that dies ends the others within a few seconds with one line; a run that
//     makes no progress ends; ranks that finish normally end without an error
// Ends with `N passed, N failed, N skipped`.
#include <sys/wait.h>

#include <random>
#include <tuple>

#include "dev/lab.cuh"
#include "distributed.cuh"

static TestCounter counter;
static void report(const std::string& name, bool ok, const std::string& detail = "") {
    printf("  %-70s %s  %s\n", name.c_str(), ok ? "ok  " : "FAIL", detail.c_str());
    counter.record(ok);
}

// Runs fn in a child process; returns its exit code (or 128 + signal) and its stderr.
template <typename F> static int in_child(F fn, std::string* err = nullptr, pid_t* out_pid = nullptr) {
    int pipefd[2];
    if (pipe(pipefd) != 0) return -1;
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        dup2(pipefd[1], 2);
        fn();
        fflush(stdout);
        _exit(0);
    }
    close(pipefd[1]);
    if (out_pid) *out_pid = pid;
    std::string text;
    char buf[512];
    ssize_t n;
    while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) text.append(buf, size_t(n));
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (err) *err = text;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int free_port() {
    int port = 0;
    const int s = dist_listen("0", 1, &port);
    close(s);
    return port;
}

#if !defined(NO_NCCL)
static ncclUniqueId test_id() {  // what rank 0 hands out: a known pattern, no NCCL call
    ncclUniqueId id;
    for (size_t i = 0; i < sizeof(id.internal); i++) id.internal[i] = char(i * 7 + 3);
    return id;
}
#else
static int test_id() { return 0; }
#endif

// Starts `world` ranks (children) that rendezvous at `where`, rank r with setups[r]; each child then
// runs after(d) and exits 0. Returns each rank's exit code and stderr.
template <typename After>
static void run_ranks(int world, const std::string& where, const std::vector<std::string>& setups, std::vector<int>& codes,
                      std::vector<std::string>& errs, After after, std::vector<int> claimed = {}, std::vector<int> worlds = {}) {
    codes.assign(world, -1), errs.assign(world, "");
    std::vector<int> pipes(world);
    std::vector<pid_t> pids(world);
    fflush(stdout);
    for (int r = 0; r < world; r++) {
        int p[2];
        if (pipe(p) != 0) return;
        const pid_t pid = fork();
        if (pid == 0) {
            close(p[0]);
            dup2(p[1], 2);
            Dist d;
            d.rank = claimed.empty() ? r : claimed[r], d.world = worlds.empty() ? world : worlds[r];
            d.local_rank = d.rank, d.local_world = d.world;
            dist_rendezvous(d, where, setups[r], test_id);
#if !defined(NO_NCCL)
            const ncclUniqueId want = test_id();
            if (memcmp(&d.id, &want, sizeof(want)) != 0) fail("rank %d got another id than rank 0's", d.rank);
#endif
            after(d);
            _exit(0);
        }
        close(p[1]);
        pipes[r] = p[0], pids[r] = pid;
    }
    for (int r = 0; r < world; r++) {
        char buf[512];
        ssize_t n;
        while ((n = read(pipes[r], buf, sizeof(buf))) > 0) errs[r].append(buf, size_t(n));
        close(pipes[r]);
        int status = 0;
        waitpid(pids[r], &status, 0);
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
}

static std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }
static int count_lines(const std::string& s) { return (int)std::count(s.begin(), s.end(), '\n'); }

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

int main() {
    setenv("GPT_RENDEZVOUS_TIMEOUT", "10", 1);  // failing cases end in seconds, not minutes
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
                for (size_t at = 0; at < S; at += chunk) {  // as gpt_gather_shards does, chunk by chunk
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
    std::vector<int> codes;
    std::vector<std::string> errs;
    auto quiet = [](Dist& d) { dist_close(d); };
    {
        const std::string where = "127.0.0.1:" + std::to_string(free_port());
        run_ranks(3, where, {"-b=4 -t=64", "-b=4 -t=64", "-b=4 -t=64"}, codes, errs, [](Dist& d) {
            dist_start_watchdog(d, 0);
            dist_close(d);
        });
#if defined(NO_NCCL)
        const char* what = "TCP, 3 ranks, the same setup: all end cleanly (a build without NCCL exchanges no id)";
#else
        const char* what = "TCP, 3 ranks, the same setup: every rank gets rank 0's id, all end cleanly";
#endif
        report(what,
               codes == std::vector<int>{0, 0, 0}, "exit codes " + std::to_string(codes[0]) + " " + std::to_string(codes[1]) + " " +
                                                        std::to_string(codes[2]) + " " + first_line(errs[0] + errs[1] + errs[2]));
        const std::string file = "file:/tmp/gpt_rendezvous_test_" + std::to_string(getpid());
        run_ranks(2, file, {"x=1", "x=1"}, codes, errs, quiet);
        report("a file on a shared file system, 2 ranks", codes == std::vector<int>{0, 0}, first_line(errs[0] + errs[1]));
    }
    {
        const std::string where = "127.0.0.1:" + std::to_string(free_port());
        run_ranks(3, where, {"-b=4 -t=64 data=1:ab", "-b=4 -t=64 data=1:ab", "-b=8 -t=64 data=1:ab"}, codes, errs, quiet);
        const bool ok = codes == std::vector<int>{1, 1, 1} && errs[0].find("rank 2") != std::string::npos &&
                        errs[0].find("'-b=8' where rank 0 has '-b=4'") != std::string::npos && count_lines(errs[0]) == 1 &&
                        errs[2].find("rank 0 refused this rank") != std::string::npos && count_lines(errs[2]) == 1;
        report("rank 2 started with -b 8: refused on every rank, the difference named", ok, first_line(errs[0]));
        run_ranks(2, "127.0.0.1:" + std::to_string(free_port()), {"a", "a"}, codes, errs, quiet, {}, {2, 3});
        report("rank 1 started with a world of 3, rank 0 with 2: error", codes[0] == 1 && errs[0].find("world of 3") != std::string::npos,
               first_line(errs[0]));
        run_ranks(3, "127.0.0.1:" + std::to_string(free_port()), {"a", "a", "a"}, codes, errs, quiet, {0, 1, 1});
        report("two processes claim rank 1: error", codes[0] == 1 && errs[0].find("two processes claim rank 1") != std::string::npos,
               first_line(errs[0]));
        const double t0 = now_seconds();
        std::string err;
        const int code = in_child([] {
            setenv("GPT_RENDEZVOUS_TIMEOUT", "2", 1);
            Dist d;
            d.rank = 1, d.world = 2;
            dist_rendezvous(d, "127.0.0.1:" + std::to_string(free_port()), "a", test_id);
        }, &err);
        report("rank 0 never comes: one error within the time limit (2 s)", code == 1 && err.find("cannot reach rank 0") != std::string::npos &&
                                                                                  now_seconds() - t0 < 10, first_line(err));
    }
    printf("the watchdog\n");
    {
        const std::string where = "127.0.0.1:" + std::to_string(free_port());
        const double t0 = now_seconds();
        run_ranks(3, where, {"a", "a", "a"}, codes, errs, [](Dist& d) {
            dist_start_watchdog(d, 0);
            if (d.rank == 1) _exit(9);  // dies without a word
            for (;;) {  // the others would wait forever on it
                dist_progress(d);
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            }
        });
        const double took = now_seconds() - t0;
        const bool ok = codes[0] == 1 && codes[1] == 9 && codes[2] == 1 && errs[0].find("rank 1 ended") != std::string::npos &&
                        errs[2].find("rank 0 ended") != std::string::npos && count_lines(errs[0]) == 1 && took < 15;
        report("rank 1 dies: ranks 0 and 2 end with one line each", ok,
               std::to_string(int(took)) + " s; rank 0: " + first_line(errs[0]) + " | rank 2: " + first_line(errs[2]));
        run_ranks(2, "127.0.0.1:" + std::to_string(free_port()), {"a", "a"}, codes, errs, [](Dist& d) {
            dist_start_watchdog(d, 1);  // -wt 1
            if (d.rank == 0) std::this_thread::sleep_for(std::chrono::seconds(30));
            else for (;;) dist_progress(d), std::this_thread::sleep_for(std::chrono::milliseconds(50));
        });
        report("rank 0 makes no progress for -wt 1 s: it ends, and so does rank 1",
               codes[0] == 1 && errs[0].find("no progress for") != std::string::npos && codes[1] == 1, first_line(errs[0]));
    }
    return counter.finish();
}
