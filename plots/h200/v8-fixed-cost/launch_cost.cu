// What a launch costs before any work, by its shape: V8's grid at 1 x 4096 x 4096 (128 CTAs of 160
// threads, 28 KiB of dynamic shared memory, clusters of 2 with a cluster barrier at the start and at
// the end) against the same grid without clusters, without shared memory, without the barriers.
// Each kernel writes one word a CTA (so no launch is empty to the compiler). Timed with CUDA events
// around each launch, after an L2 flush by reading 512 MiB (as V8's bench), median of 200; and back to
// back (2000 launches, their mean). Build: nvcc -O3 -arch=sm_90a -o launch_cost launch_cost.cu
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <vector>

__global__ void plain(int *out) {
    extern __shared__ int smem[];
    if (threadIdx.x == 0) out[blockIdx.x] = blockIdx.x;
}

__global__ void __cluster_dims__(2, 1, 1) clustered(int *out) {
    extern __shared__ int smem[];
    if (threadIdx.x == 0) out[blockIdx.x] = blockIdx.x;
}

__global__ void __cluster_dims__(2, 1, 1) clustered_barriers(int *out) {
    extern __shared__ int smem[];
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    if (threadIdx.x == 0) out[blockIdx.x] = blockIdx.x;
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

__global__ void flush(const int4 *buffer, size_t n, int *sink) {
    int4 acc = make_int4(0, 0, 0, 0);
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int4 v = buffer[i];
        acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678) *sink = 1;
}

template <typename Launch>
void time(const char *name, Launch launch, const int4 *buffer, size_t n, int *sink) {
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    for (int i = 0; i < 20; ++i) launch();
    std::vector<float> flushed;
    for (int i = 0; i < 200; ++i) {
        flush<<<528, 512>>>(buffer, n, sink);
        cudaEventRecord(start);
        launch();
        cudaEventRecord(stop);
        cudaEventSynchronize(stop);
        float ms;
        cudaEventElapsedTime(&ms, start, stop);
        flushed.push_back(ms * 1e3f);
    }
    std::sort(flushed.begin(), flushed.end());
    cudaEventRecord(start);
    for (int i = 0; i < 2000; ++i) launch();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms;
    cudaEventElapsedTime(&ms, start, stop);
    printf("%-44s flushed median %6.2f us (p10 %6.2f, p90 %6.2f)   back to back %6.2f us\n", name,
           flushed[100], flushed[20], flushed[180], ms * 1e3f / 2000);
}

int main() {
    const int grid = 128, block = 160, shared = 28 * 1024 + 672;  // V8 8/1/2/4/64 at 1 x 4096 x 4096
    size_t n = (512ull << 20) / sizeof(int4);
    int4 *buffer;
    int *out, *sink;
    cudaMalloc(&buffer, n * sizeof(int4));
    cudaMemset(buffer, 1, n * sizeof(int4));
    cudaMalloc(&out, grid * sizeof(int));
    cudaMalloc(&sink, sizeof(int));
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("%s, grid %d x %d threads\n", prop.name, grid, block);
    time("plain, no shared memory", [&] { plain<<<grid, block>>>(out); }, buffer, n, sink);
    time("plain, 28.7 KiB shared", [&] { plain<<<grid, block, shared>>>(out); }, buffer, n, sink);
    time("clusters of 2, no shared memory", [&] { clustered<<<grid, block>>>(out); }, buffer, n, sink);
    time("clusters of 2, 28.7 KiB shared", [&] { clustered<<<grid, block, shared>>>(out); }, buffer, n, sink);
    time("clusters of 2, 28.7 KiB, two cluster barriers", [&] { clustered_barriers<<<grid, block, shared>>>(out); },
         buffer, n, sink);
    cudaError_t error = cudaDeviceSynchronize();
    printf("%s\n", cudaGetErrorString(error));
    return error != cudaSuccess;
}
