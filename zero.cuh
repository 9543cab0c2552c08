// zero.cuh: data parallelism over the ranks of distributed.cuh: gradient buckets, ZeRO-1 shards and
// their all-gathers, the sums of host values, behind calls the training step makes whatever the
// build. In a build without NCCL (make NCCL=0) a run has one rank and each call is a no-op there.
//
// Gradient buckets. In the last micro-batch of a step each layer's gradients are all-reduced as soon
// as the backward has finished them, on the communication stream, while the backward goes on with the
// layers below (the per-layer buckets of PyTorch's DDP): a layer's slices of the per-layer tensors in
// one NCCL group, once its last LayerNorm backward (on the default stream) and its weight gradients
// (on the weight stream) are done. The embeddings, ln_f and the step's loss sum go last, after the
// encoder backward. Then every rank holds the same summed gradients, and computes the same global
// norm and the same skip decision from them.
//
// ZeRO stage 1. The optimizer state of elements [lo, hi) of the flat parameter vector lives on this
// rank only (shard_begin / shard_end); with one GPU the shard is everything. The parameter and
// gradient buffers hold world * shard_size elements (the tail past the parameter count is padding), so
// the updated shards are all-gathered in place.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "common.cuh"
#include "distributed.cuh"

// One tensor of the gradient buffer, as the buckets see it.
struct GradientTensor {
    void* data = nullptr;
    size_t count = 0;        // elements in all
    bool per_layer = false;  // L equal slices, one per layer, each reduced with its layer
};

struct DataParallel {
    Dist* dist = nullptr;
    size_t lo = 0, hi = 0;  // this rank's shard of the flat parameter vector
    size_t shard = 0;       // shard_size: elements per rank (the last ranks' shards may be shorter)
    int layers = 0;
    std::vector<GradientTensor> grads;
    cudaEvent_t grads_ready = nullptr, wgrads_ready = nullptr, reduced = nullptr;

    bool multi() const { return dist && dist->multi(); }
    int rank() const { return dist ? dist->rank : 0; }
    int world() const { return dist ? dist->world : 1; }
    size_t padded() const { return shard * world(); }  // elements of the parameter and gradient buffers
};

inline void dp_create(DataParallel& dp, Dist* dist, size_t num_params, int layers) {
    dp.dist = dist, dp.layers = layers;
    const int world = dp.world(), rank = dp.rank();
    dp.shard = shard_size(num_params, world);
    dp.lo = shard_begin(num_params, world, rank), dp.hi = shard_end(num_params, world, rank);
    if (dp.multi())
        for (cudaEvent_t* e : {&dp.grads_ready, &dp.wgrads_ready, &dp.reduced}) cuda_check(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
}

inline void dp_destroy(DataParallel& dp) {
    for (cudaEvent_t e : {dp.grads_ready, dp.wgrads_ready, dp.reduced})
        if (e) cuda_check(cudaEventDestroy(e));
    dp = DataParallel();
}

#if !defined(NO_NCCL)
// The comm stream waits for everything enqueued so far on the default stream ...
inline void dp_after_default_stream(DataParallel& dp) {
    cuda_check(cudaEventRecord(dp.grads_ready, 0));
    cuda_check(cudaStreamWaitEvent(dp.dist->stream, dp.grads_ready, 0));
}
// ... and on the weight stream (null: none).
inline void dp_after_backward(DataParallel& dp, cudaStream_t wgrad_stream) {
    dp_after_default_stream(dp);
    if (wgrad_stream) {
        cuda_check(cudaEventRecord(dp.wgrads_ready, wgrad_stream));
        cuda_check(cudaStreamWaitEvent(dp.dist->stream, dp.wgrads_ready, 0));
    }
}
// The default stream waits for the comm stream's work so far.
inline void dp_join(DataParallel& dp) {
    cuda_check(cudaEventRecord(dp.reduced, dp.dist->stream));
    cuda_check(cudaStreamWaitEvent(0, dp.reduced, 0));
}
#endif

// Layer l's gradients are final: its bucket's all-reduce starts.
template <typename T> void dp_reduce_layer(DataParallel& dp, int l, cudaStream_t wgrad_stream) {
#if !defined(NO_NCCL)
    if (!dp.multi()) return;
    dp_after_backward(dp, wgrad_stream);
    nccl_check(ncclGroupStart());
    for (const GradientTensor& g : dp.grads) {
        if (!g.per_layer) continue;
        const size_t slice = g.count / dp.layers;
        T* p = static_cast<T*>(g.data) + size_t(l) * slice;
        nccl_check(ncclAllReduce(p, p, slice, nccl_type<T>(), ncclSum, dp.dist->comm.load(), dp.dist->stream));
    }
    nccl_check(ncclGroupEnd());
#endif
}

// The last bucket (the tensors not per layer, the step's loss sum, and the largest of the ranks' FP8
// amaxes, amax_count floats' bits, for the delayed scales), then the default stream waits for every
// all-reduce of the step.
template <typename T>
void dp_reduce_rest(DataParallel& dp, double* loss_sum, cudaStream_t wgrad_stream, unsigned* amax_bits = nullptr, int amax_count = 0) {
#if !defined(NO_NCCL)
    if (!dp.multi()) return;
    dp_after_backward(dp, wgrad_stream);
    ncclComm_t comm = dp.dist->comm.load();
    nccl_check(ncclGroupStart());
    for (const GradientTensor& g : dp.grads)
        if (!g.per_layer) nccl_check(ncclAllReduce(g.data, g.data, g.count, nccl_type<T>(), ncclSum, comm, dp.dist->stream));
    nccl_check(ncclAllReduce(loss_sum, loss_sum, 1, ncclFloat64, ncclSum, comm, dp.dist->stream));
    if (amax_count > 0)  // non-negative floats order as their bits do
        nccl_check(ncclAllReduce(amax_bits, amax_bits, amax_count, ncclUint32, ncclMax, comm, dp.dist->stream));
    nccl_check(ncclGroupEnd());
    dp_join(dp);
#endif
}

// Every rank's updated shard of `params` (world * shard elements) to every rank, in place.
template <typename T> void dp_all_gather_params(DataParallel& dp, T* params) {
#if !defined(NO_NCCL)
    if (!dp.multi()) return;
    dp_after_default_stream(dp);
    nccl_check(ncclAllGather(params + dp.shard * dp.rank(), params, dp.shard, nccl_type<T>(), dp.dist->comm.load(), dp.dist->stream));
    dp_join(dp);
#endif
}

// The whole of a sharded fp32 array (master weights, AdamW moments) on the host of rank 0 (empty on
// the others): all-gathered chunk by chunk through a small device buffer, not a second full copy.
inline std::vector<float> dp_gather_shards(DataParallel& dp, const float* shard, size_t n) {
    if (!dp.multi()) {
        std::vector<float> out(n);
        cuda_check(cudaMemcpy(out.data(), shard, n * sizeof(float), cudaMemcpyDeviceToHost));
        return out;
    }
    std::vector<float> out;
#if !defined(NO_NCCL)
    Dist& d = *dp.dist;
    const size_t S = dp.shard, chunk = std::min(S, size_t(1) << 22);
    float* gathered = static_cast<float*>(device_malloc(chunk * d.world * sizeof(float), "checkpoint gather"));
    dp_after_default_stream(dp);  // after whatever wrote the shards
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

// ---------------------------------------------------------------------------------------------
// The ranks' life cycle and host values, one rank or several, with or without NCCL.

// Ends a run that several ranks started in a build that cannot join them.
inline void dp_check_build(const Dist& d) {
#if defined(NO_NCCL)
    if (d.multi()) fail("%s started %d ranks, but this build has no NCCL (install it and rebuild)", d.launcher.c_str(), d.world);
#else
    (void)d;
#endif
}

// The ranks meet at rank 0 and each is refused unless its setup is rank 0's (distributed.cuh); then
// the watchdog starts.
inline void dp_meet(Dist& d, const std::string& rendezvous, const std::string& setup, int stall_seconds) {
    if (!d.multi()) return;
#if !defined(NO_NCCL)
    dist_rendezvous(d, rendezvous, setup, [] {
        ncclUniqueId id;
        nccl_check(ncclGetUniqueId(&id));
        return id;
    });
#endif
    dist_start_watchdog(d, stall_seconds);
}

inline void dp_init_comm(Dist& d) {
#if !defined(NO_NCCL)
    dist_init_nccl(d);
#else
    (void)d;
#endif
}

// Sum of one host value over the ranks (synchronizes).
template <typename T> T dp_sum(Dist& d, T value) {
#if !defined(NO_NCCL)
    return dist_sum(d, value);
#else
    (void)d;
    return value;
#endif
}

// The last barrier; each rank tells rank 0 it is done.
inline void dp_finish(Dist& d) {
#if !defined(NO_NCCL)
    dist_finish(d);
#else
    (void)d;
#endif
}
