// fault_inject.c: an LD_PRELOAD library for the tests of checkpoint writing. It counts the file
// operations a program makes and, at the N-th, kills it or makes the operation fail:
//
//   FAULT_AT=N          the operation to act on (counted from 1); unset: only count (and trace)
//   FAULT_ACTION=kill   SIGKILL the process just before that operation (the default)
//               enospc  make it fail with ENOSPC (a full disk); eio: with EIO (an I/O error)
//               term    send the process SIGTERM, then do the operation; int: SIGINT
//   FAULT_ONLY=TEXT     count only operations on paths containing TEXT (the checkpoint folder)
//   FAULT_AFTER=TEXT    start counting at the first operation on a path containing TEXT (a save's
//                       first file, e.g. model_00000010), so that N counts from that save's start
//   FAULT_TRACE=FILE    append one line per counted operation to FILE: "N op path"
//   FAULT_SLEEP_MS=MS   sleep MS milliseconds before every counted operation (slows a run down, e.g.
//                       its reads of the training data, so that a test can signal it mid-run)
//
// Operations: create (mkstemp, open with O_CREAT), read (pread), write, fsync (of a file), close,
// rename, dirsync (fsync of a folder), dirclose, unlink. open and pread are intercepted under every
// name glibc gives them (open64, the fortified __open_2 and __pread_chk, openat, ...), so every
// file's path is known and every read counted.
// Build: make build/test/libfault_inject.so.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FDS 4096
static char* fd_paths[MAX_FDS];  // what each open file descriptor refers to, for FAULT_ONLY
static long counter = 0;
static int armed = 0;  // FAULT_AFTER seen

static void remember(int fd, const char* path) {
    if (fd < 0 || fd >= MAX_FDS) return;
    free(fd_paths[fd]);
    fd_paths[fd] = path ? strdup(path) : NULL;
}
static const char* path_of(int fd) { return fd >= 0 && fd < MAX_FDS && fd_paths[fd] ? fd_paths[fd] : ""; }

// 0: go on; else the errno the operation fails with (the process is killed for FAULT_ACTION=kill).
static int fault(const char* op, const char* path) {
    const char* only = getenv("FAULT_ONLY");
    if (only && *only && !strstr(path, only)) return 0;
    const char* after = getenv("FAULT_AFTER");
    if (after && *after && !armed) {
        if (!strstr(path, after)) return 0;
        armed = 1;
    }
    const long n = ++counter;
    const char* sleep_ms = getenv("FAULT_SLEEP_MS");
    if (sleep_ms && *sleep_ms) usleep((useconds_t)(atol(sleep_ms) * 1000));
    const char* trace = getenv("FAULT_TRACE");
    if (trace && *trace) {
        int (*real_open)(const char*, int, ...) = dlsym(RTLD_NEXT, "open");
        ssize_t (*real_write)(int, const void*, size_t) = dlsym(RTLD_NEXT, "write");
        int (*real_close)(int) = dlsym(RTLD_NEXT, "close");
        const int fd = real_open(trace, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            char line[PATH_MAX + 64];
            const int len = snprintf(line, sizeof(line), "%ld %s %s\n", n, op, path);
            if (real_write(fd, line, (size_t)len) < 0) {}
            real_close(fd);
        }
    }
    const char* at = getenv("FAULT_AT");
    if (!at || atol(at) != n) return 0;
    const char* action = getenv("FAULT_ACTION");
    if (!action || !strcmp(action, "kill")) {
        kill(getpid(), SIGKILL);
        pause();
    }
    if (!strcmp(action, "term") || !strcmp(action, "int")) {
        kill(getpid(), !strcmp(action, "term") ? SIGTERM : SIGINT);
        return 0;
    }
    return !strcmp(action, "enospc") ? ENOSPC : EIO;
}

#define REAL(ret, name, ...) static ret (*real_##name)(__VA_ARGS__); if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name)

int mkstemp(char* tmpl) {
    REAL(int, mkstemp, char*);
    int e = fault("create", tmpl);
    if (e) return errno = e, -1;
    const int fd = real_mkstemp(tmpl);
    remember(fd, tmpl);
    return fd;
}

int mkostemp(char* tmpl, int flags) {
    REAL(int, mkostemp, char*, int);
    int e = fault("create", tmpl);
    if (e) return errno = e, -1;
    const int fd = real_mkostemp(tmpl, flags);
    remember(fd, tmpl);
    return fd;
}

static int open_common(int (*real)(const char*, int, ...), const char* path, int flags, mode_t mode) {
    if (flags & O_CREAT) {
        int e = fault("create", path);
        if (e) return errno = e, -1;
    }
    const int fd = real(path, flags, mode);
    remember(fd, path);
    return fd;
}

int open(const char* path, int flags, ...) {
    REAL(int, open, const char*, int, ...);
    va_list ap;
    va_start(ap, flags);
    const mode_t mode = (flags & O_CREAT) ? va_arg(ap, mode_t) : 0;
    va_end(ap);
    return open_common(real_open, path, flags, mode);
}

int __open_2(const char* path, int flags) {
    REAL(int, __open_2, const char*, int);
    const int fd = real___open_2(path, flags);
    remember(fd, path);
    return fd;
}

int __open64_2(const char* path, int flags) {
    REAL(int, __open64_2, const char*, int);
    const int fd = real___open64_2(path, flags);
    remember(fd, path);
    return fd;
}

int openat(int dirfd, const char* path, int flags, ...) {
    REAL(int, openat, int, const char*, int, ...);
    va_list ap;
    va_start(ap, flags);
    const mode_t mode = (flags & O_CREAT) ? va_arg(ap, mode_t) : 0;
    va_end(ap);
    if (flags & O_CREAT) {
        int e = fault("create", path);
        if (e) return errno = e, -1;
    }
    const int fd = real_openat(dirfd, path, flags, mode);
    remember(fd, path);
    return fd;
}

ssize_t pread(int fd, void* buf, size_t n, off_t offset) {
    REAL(ssize_t, pread, int, void*, size_t, off_t);
    int e = fault("read", path_of(fd));
    if (e) return errno = e, -1;
    return real_pread(fd, buf, n, offset);
}

ssize_t pread64(int fd, void* buf, size_t n, off_t offset) {
    REAL(ssize_t, pread64, int, void*, size_t, off_t);
    int e = fault("read", path_of(fd));
    if (e) return errno = e, -1;
    return real_pread64(fd, buf, n, offset);
}

// The fortified reads (_FORTIFY_SOURCE, the default of some distributions' compilers).
ssize_t __pread_chk(int fd, void* buf, size_t n, off_t offset, size_t buflen) {
    REAL(ssize_t, __pread_chk, int, void*, size_t, off_t, size_t);
    int e = fault("read", path_of(fd));
    if (e) return errno = e, -1;
    return real___pread_chk(fd, buf, n, offset, buflen);
}

ssize_t __pread64_chk(int fd, void* buf, size_t n, off_t offset, size_t buflen) {
    REAL(ssize_t, __pread64_chk, int, void*, size_t, off_t, size_t);
    int e = fault("read", path_of(fd));
    if (e) return errno = e, -1;
    return real___pread64_chk(fd, buf, n, offset, buflen);
}

int open64(const char* path, int flags, ...) {
    REAL(int, open64, const char*, int, ...);
    va_list ap;
    va_start(ap, flags);
    const mode_t mode = (flags & O_CREAT) ? va_arg(ap, mode_t) : 0;
    va_end(ap);
    return open_common(real_open64, path, flags, mode);
}

ssize_t write(int fd, const void* buf, size_t n) {
    REAL(ssize_t, write, int, const void*, size_t);
    if (fd > 2) {
        int e = fault("write", path_of(fd));
        if (e) return errno = e, -1;
    }
    return real_write(fd, buf, n);
}

static int sync_common(int (*real)(int), int fd) {
    struct stat st;
    const int dir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
    int e = fault(dir ? "dirsync" : "fsync", path_of(fd));
    if (e) return errno = e, -1;
    return real(fd);
}
int fsync(int fd) {
    REAL(int, fsync, int);
    return sync_common(real_fsync, fd);
}
int fdatasync(int fd) {
    REAL(int, fdatasync, int);
    return sync_common(real_fdatasync, fd);
}

int close(int fd) {
    REAL(int, close, int);
    if (fd > 2 && fd < MAX_FDS && fd_paths[fd]) {
        struct stat st;
        const int dir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
        int e = fault(dir ? "dirclose" : "close", path_of(fd));
        remember(fd, NULL);
        if (e) {
            real_close(fd);
            return errno = e, -1;
        }
    }
    return real_close(fd);
}

int rename(const char* from, const char* to) {
    REAL(int, rename, const char*, const char*);
    int e = fault("rename", to);
    if (e) return errno = e, -1;
    return real_rename(from, to);
}

int unlink(const char* path) {
    REAL(int, unlink, const char*);
    int e = fault("unlink", path);
    if (e) return errno = e, -1;
    return real_unlink(path);
}
