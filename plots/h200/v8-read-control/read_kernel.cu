// A kernel that does nothing but read a buffer from HBM, as fast as a plain CUDA kernel can: the
// control beside V8 at decode sizes ("how long does any kernel take to stream these bytes at this
// size?"). Each thread keeps UNROLL 16-byte loads in flight (all issued before any is used), the grid
// strides over the buffer, and the values are folded into one word that is stored only if it equals
// a constant no buffer here holds (so the loads are live and nothing is written).
//
// Loaded from Python with ctypes (read_control.py); built on the CPU machine:
//   nvcc -O3 -arch=sm_90a -shared -Xcompiler -fPIC -o .cache/libread_kernel.so plots/h200/v8-read-control/read_kernel.cu
#include <cuda_runtime.h>
#include <cstdint>

template <int UNROLL>
__global__ void read_only(const int4 *__restrict__ buffer, size_t n, int *sink) {
    int acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
        int4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = __ldcs(buffer + i + u * stride);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) {
        int4 v = __ldcs(buffer + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x7fedcba9) *sink = acc;
}

extern "C" int read_bytes(const void *buffer, size_t bytes, int *sink, int blocks, int threads, int unroll,
                          void *stream) {
    const int4 *p = static_cast<const int4 *>(buffer);
    size_t n = bytes / sizeof(int4);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (unroll) {
        case 1: read_only<1><<<blocks, threads, 0, s>>>(p, n, sink); break;
        case 2: read_only<2><<<blocks, threads, 0, s>>>(p, n, sink); break;
        case 4: read_only<4><<<blocks, threads, 0, s>>>(p, n, sink); break;
        case 8: read_only<8><<<blocks, threads, 0, s>>>(p, n, sink); break;
        default: return -1;
    }
    return (int)cudaGetLastError();
}
