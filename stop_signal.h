// stop_signal.h: preemption. The first SIGTERM or SIGINT asks the training loop to stop after the
// step in progress (and write a checkpoint when -o is set); a second one, a second or more later,
// ends the process at once, the default way. Signals within that second count as one: Ctrl-C reaches
// every process of the terminal's group, and a launcher (scripts/launch.sh, torchrun) passes it on as
// well. On several GPUs the ranks agree on the stop (StopRequest::agreed in train_gpt.cu), so every
// rank stops at the same step.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <time.h>

constexpr int kExitStopped = 75;  // EX_TEMPFAIL: stopped early by a signal, resume with -y 1

inline volatile sig_atomic_t g_stop_signal = 0;
inline volatile time_t g_stop_time = 0;

inline void on_stop_signal(int sig) {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
    if (g_stop_signal && now.tv_sec - g_stop_time >= 1) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    if (!g_stop_signal) g_stop_signal = sig, g_stop_time = now.tv_sec;
}

inline bool stop_signal_received() { return g_stop_signal != 0; }

// Until this is called a signal ends the program the default way (nothing has been written). From
// here on it stops the training loop. The signals stay blocked in this thread until
// stop_signals_unblock(), so that the helper threads started meanwhile (CUDA's, NCCL's) inherit the
// block and only this thread takes them; SA_RESTART keeps a signal from cutting a system call short.
inline void stop_signals_catch_blocked() {
    struct sigaction sa {};
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
}

inline void stop_signals_unblock() {  // (a signal that came meanwhile is taken now)
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);
}
