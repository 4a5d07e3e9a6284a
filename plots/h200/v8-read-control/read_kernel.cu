// Kernels that do nothing but read a buffer from HBM: the controls beside V8 at decode sizes ("how
// long does any kernel take to stream these bytes at this size, and does V8's way of moving them,
// TMA boxes through a ring, cost anything by itself?"). Loaded from Python with ctypes
// (read_control.py); built on the CPU machine:
//   nvcc -O3 -arch=sm_90a -shared -Xcompiler -fPIC -o .cache/libread_kernel.so plots/h200/v8-read-control/read_kernel.cu
//
// read_bytes: each thread keeps UNROLL 16-byte loads in flight (all issued before any is used), the
// grid strides over the buffer, and the values are folded into one word that is stored only if it
// equals a constant no buffer here holds (so the loads are live and nothing is written).
//
// read_tma: V8's transport without its arithmetic. The buffer is an int32 matrix [rows, cols] (the
// packed weight: [N_pad / 4, K / 2]), cut into boxes of [box_rows, 64] (V8's int4 box is [16, 64]:
// 4 KiB). The CTAs share the boxes out in row-band-major order (as V8's CTAs take a row tile's K
// range); each CTA's one thread keeps STAGES boxes in flight through an mbarrier ring (TMA
// completes the transaction; the thread waits on the stage's parity, reads a word of the box, and
// issues the box STAGES further into the same stage). No cluster, no tokens, no scales. Each box
// contributes one word to an xor that the CTA adds to *sink, which read_control.py checks against
// the same words taken on the host: a ring that skipped or repeated a box would not match.
#include <cuda.h>
#include <cudaTypedefs.h>
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

__device__ inline uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ inline void wait_parity(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n .reg .pred done;\n wait:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra wait;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

__device__ inline void issue_box(const CUtensorMap *map, uint32_t dst, uint32_t bar, int col, int row, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            dst),
        "l"((uint64_t)map), "r"(col), "r"(row), "r"(bar)
        : "memory");
}

template <int STAGES>
__global__ void read_tma_kernel(const __grid_constant__ CUtensorMap map, int bands, int boxes_per_band, int box_rows,
                                int *sink) {
    extern __shared__ __align__(1024) int smem[];
    __shared__ __align__(8) uint64_t full[STAGES];
    const uint32_t box_words = box_rows * 64, box_bytes = box_words * 4;
    // this CTA's share of the boxes, in row-band-major order
    long total = (long)bands * boxes_per_band;
    long first = total * blockIdx.x / gridDim.x, last = total * (blockIdx.x + 1) / gridDim.x;
    int count = (int)(last - first);
    if (threadIdx.x != 0) return;
    for (int s = 0; s < STAGES; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&full[s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    auto issue = [&](int i) {  // this CTA's box i into stage i % STAGES
        long box = first + i;
        int s = i % STAGES;
        issue_box(&map, smem_addr(smem + s * box_words), smem_addr(&full[s]), (int)(box % boxes_per_band) * 64,
                  (int)(box / boxes_per_band) * box_rows, box_bytes);
    };
    for (int i = 0; i < STAGES && i < count; ++i) issue(i);
    int acc = 0;
    for (int i = 0; i < count; ++i) {
        int s = i % STAGES;
        wait_parity(smem_addr(&full[s]), (i / STAGES) & 1);
        acc ^= smem[s * box_words + ((first + i) & 63)];  // word (box & 63) of the box's first row
        if (i + STAGES < count) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the read above before TMA rewrites the stage
            issue(i + STAGES);
        }
    }
    atomicXor(sink, acc);  // one word a CTA: the caller checks the xor of every box's word once
}

static PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    if (!fn) {
        cudaDriverEntryPointQueryResult status;
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&fn, 12000, cudaEnableDefault, &status);
    }
    return fn;
}

template <int STAGES>
static int launch_tma(const CUtensorMap &map, int bands, int boxes_per_band, int box_rows, int *sink, int blocks,
                      cudaStream_t s) {
    int smem = STAGES * box_rows * 64 * 4;
    cudaFuncSetAttribute(read_tma_kernel<STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    read_tma_kernel<STAGES><<<blocks, 32, smem, s>>>(map, bands, boxes_per_band, box_rows, sink);
    return (int)cudaGetLastError();
}

// buffer: int32 [rows, cols] row-major, cols a multiple of 64, rows a multiple of box_rows
extern "C" int read_tma(const void *buffer, int rows, int cols, int box_rows, int stages, int *sink, int blocks,
                        void *stream) {
    auto encode = encode_tiled();
    if (!encode) return -2;
    CUtensorMap map;
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)cols * 4};
    cuuint32_t box[2] = {64, (cuuint32_t)box_rows};
    cuuint32_t element_strides[2] = {1, 1};
    CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_INT32, 2, const_cast<void *>(buffer), dims, strides, box,
                        element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return -3;
    int bands = rows / box_rows, boxes_per_band = cols / 64;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (stages) {
        case 2: return launch_tma<2>(map, bands, boxes_per_band, box_rows, sink, blocks, s);
        case 4: return launch_tma<4>(map, bands, boxes_per_band, box_rows, sink, blocks, s);
        case 8: return launch_tma<8>(map, bands, boxes_per_band, box_rows, sink, blocks, s);
        case 16: return launch_tma<16>(map, bands, boxes_per_band, box_rows, sink, blocks, s);
        default: return -1;
    }
}
