#include "client/packer/cuda/cuda_packer.h"
#include "client/packer/cuda/cuda_error.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cub/device/device_radix_sort.cuh>

#include "absl/strings/str_cat.h"
#include "common/classes/chunk_magnitude.h"
#include "common/wire/header_layout.h"
#include "common/wire/payload_encoding.h"

namespace dlcp {
namespace {

// What a block needs about its tensor; one entry per tensor, on the device.
struct DeviceTensor {
  uint64_t offset;         // first element in the input
  uint64_t packet_offset;  // first packet byte
  uint32_t elems, key, round, epoch;
  uint32_t first_chunk;
  ClassTiers tiers;
};

struct Args {
  const void* data;
  ElemType type;
  const DeviceTensor* tensors;
  const uint32_t* first_chunk;  // tensors + 1 entries
  uint32_t num_tensors;
  uint32_t chunk_elems;
  wire::Encoding encoding;
  uint32_t job, rank;
  uint64_t stride;
  uint8_t* packets;  // nullptr: no packets
};

__device__ uint32_t TensorOf(const uint32_t* first_chunk, uint32_t tensors, uint32_t chunk) {
  uint32_t lo = 0, hi = tensors;  // first_chunk[lo] <= chunk < first_chunk[hi]
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (first_chunk[mid] <= chunk) lo = mid; else hi = mid;
  }
  return lo;
}
__device__ uint32_t TensorOf(const Args& a, uint32_t chunk) { return TensorOf(a.first_chunk, a.num_tensors, chunk); }

// Elements of the chunk that starts at element `begin` of tensor t (only the last is short).
__device__ uint32_t ChunkElems(const Args& a, const DeviceTensor& t, uint64_t begin) {
  const uint64_t rest = t.elems - begin;
  return rest < a.chunk_elems ? static_cast<uint32_t>(rest) : a.chunk_elems;
}

// Four consecutive elements, as float.
struct Quad {
  float v[4];
};

template <ElemType T>
__device__ float LoadOne(const void* data, uint64_t i) {
  if constexpr (T == ElemType::kF32) return static_cast<const float*>(data)[i];
  const uint16_t h = static_cast<const uint16_t*>(data)[i];
  return T == ElemType::kF16 ? wire::F16ToF32(h) : wire::BF16ToF32(h);
}

// Elements i..i+3 of the input; `whole`: one aligned 16- or 8-byte load.
template <ElemType T>
__device__ Quad LoadQuad(const void* data, uint64_t i, bool whole) {
  Quad q;
  if constexpr (T == ElemType::kF32) {
    if (whole) {
      const float* f = static_cast<const float*>(data) + i;
      const float4 x = *reinterpret_cast<const float4*>(f);
      return Quad{{x.x, x.y, x.z, x.w}};
    }
  } else if (whole) {
    const uint2 x = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(data) + i);
    const uint16_t u[4] = {static_cast<uint16_t>(x.x), static_cast<uint16_t>(x.x >> 16), static_cast<uint16_t>(x.y),
                           static_cast<uint16_t>(x.y >> 16)};
    for (int k = 0; k < 4; ++k) q.v[k] = T == ElemType::kF16 ? wire::F16ToF32(u[k]) : wire::BF16ToF32(u[k]);
    return q;
  }
  for (int k = 0; k < 4; ++k) q.v[k] = LoadOne<T>(data, i + k);
  return q;
}

// Values i..i+3 of a payload; `whole`: one aligned store. The device is little-endian like the
// wire, so whole words hold the same bytes as StoreValue's.
template <wire::Encoding E>
__device__ void StoreQuad(uint8_t* payload, uint32_t i, const Quad& q, bool whole) {
  if (!whole) {
    for (int k = 0; k < 4; ++k) wire::StoreValue(payload, i + k, E, q.v[k]);
  } else if constexpr (E == wire::Encoding::kF32) {
    *reinterpret_cast<uint4*>(payload + 4 * i) =
        uint4{wire::FloatBits(q.v[0]), wire::FloatBits(q.v[1]), wire::FloatBits(q.v[2]), wire::FloatBits(q.v[3])};
  } else {
    uint32_t h[4];
    for (int k = 0; k < 4; ++k) h[k] = E == wire::Encoding::kF16 ? wire::F32ToF16(q.v[k]) : wire::F32ToBF16(q.v[k]);
    *reinterpret_cast<uint2*>(payload + 2 * i) = uint2{h[0] | h[1] << 16, h[2] | h[3] << 16};
  }
}

// A push's header, its class left 0 for ClassesInOrder or ClassesByCounting to fill in. Written
// here, beside the payload, the packet's bytes go out in whole sectors; a later kernel writing 48
// scattered bytes per chunk took a quarter of the time of packing the payloads. Threads 0-2 of
// the warp store 16 bytes each.
__device__ void WriteHeader(const Args& a, const DeviceTensor& t, uint32_t c, uint32_t payload_len, uint8_t* out,
                            uint32_t l) {
  const bool whole = reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (whole ? l >= wire::kHeaderSize / 16 : l != 0) return;
  wire::Header h;
  h.type = wire::MsgType::kPush;
  h.job = a.job;
  h.key = t.key;
  h.round = t.round;
  h.chunk = c;
  h.chunk_count = t.tiers.chunks;
  h.tensor_elems = t.elems;
  h.rank = static_cast<uint16_t>(a.rank);
  h.epoch = t.epoch;
  h.payload_len = payload_len;
  h.encoding = static_cast<uint8_t>(a.encoding);
  if (!whole) return wire::EncodeHeaderBytes(h, out);
  alignas(16) uint8_t bytes[wire::kHeaderSize];
  wire::EncodeHeaderBytes(h, bytes);
  reinterpret_cast<uint4*>(out)[l] = reinterpret_cast<const uint4*>(bytes)[l];
}

// One warp per chunk, so that no block-wide barrier sits between loads. Lane j of
// chunk_magnitude.h (elements j, j + 256, ... in order) lives in thread j / 4 % 32, slot
// j % 4 + 4 * (j / 128): a thread loads four neighbours at a time, and the fold's first step is
// within a thread, the next five are shuffles, and the last two within thread 0 again.
constexpr uint32_t kWarp = 32;
constexpr uint32_t kChunksPerBlock = 8;
static_assert(kNormLanes == 8 * kWarp, "the lane layout below is for 256 lanes");

template <ElemType T, wire::Encoding E>
__global__ void __launch_bounds__(kWarp * kChunksPerBlock)
    PackChunks(Args a, uint32_t chunks, double* magnitudes, uint64_t* keys, uint32_t* index) {
  const uint32_t chunk = blockIdx.x * kChunksPerBlock + threadIdx.x / kWarp;
  if (chunk >= chunks) return;  // the whole warp: shuffles below need every thread
  const uint32_t l = threadIdx.x % kWarp;
  const DeviceTensor& t = a.tensors[TensorOf(a, chunk)];
  const uint32_t c = chunk - t.first_chunk;
  const uint64_t begin = static_cast<uint64_t>(c) * a.chunk_elems;
  const uint32_t n = ChunkElems(a, t, begin);
  const void* in = static_cast<const uint8_t*>(a.data) + (t.offset + begin) * ElemWidth(T);
  uint8_t* payload = a.packets ? a.packets + t.packet_offset + c * a.stride + wire::kHeaderSize : nullptr;
  const bool whole_in = reinterpret_cast<uintptr_t>(in) % (4 * ElemWidth(T)) == 0;
  const bool whole_out = payload && reinterpret_cast<uintptr_t>(payload) % (4 * wire::EncodingWidth(E)) == 0;
  if (payload) WriteHeader(a, t, c, n * wire::EncodingWidth(E), payload - wire::kHeaderSize, l);
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  auto add = [&](uint32_t h, const Quad& q) {
    for (int k = 0; k < 4; ++k) lane[4 * h + k] += static_cast<double>(q.v[k]) * static_cast<double>(q.v[k]);
  };
  auto at = [&](uint32_t row, uint32_t h) { return row * kNormLanes + h * (kNormLanes / 2) + 4 * l; };
  const uint32_t rows = n / kNormLanes;
  uint32_t r = 0;
  if (whole_in && (whole_out || !payload)) {
    // Every load of a batch is issued before its first store (a store could alias a later load,
    // so the compiler keeps them in order): a thread keeps 8 loads in flight, not 1.
    constexpr uint32_t kBatch = 4;
    for (; r + kBatch <= rows; r += kBatch) {
      Quad q[kBatch][2];
#pragma unroll
      for (uint32_t b = 0; b < kBatch; ++b) {
        for (uint32_t h = 0; h < 2; ++h) q[b][h] = LoadQuad<T>(in, at(r + b, h), true);
      }
#pragma unroll
      for (uint32_t b = 0; b < kBatch; ++b) {
        for (uint32_t h = 0; h < 2; ++h) {
          add(h, q[b][h]);
          if (payload) StoreQuad<E>(payload, at(r + b, h), q[b][h], true);
        }
      }
    }
  }
  for (; r < rows; ++r) {
    for (uint32_t h = 0; h < 2; ++h) {
      const Quad q = LoadQuad<T>(in, at(r, h), whole_in);
      add(h, q);
      if (payload) StoreQuad<E>(payload, at(r, h), q, whole_out);
    }
  }
  for (uint32_t h = 0; h < 2; ++h) {  // the short last row
    for (uint32_t k = 0; k < 4; ++k) {
      const uint32_t i = at(rows, h) + k;
      if (i >= n) continue;
      const float v = LoadOne<T>(in, i);
      lane[4 * h + k] += static_cast<double>(v) * static_cast<double>(v);
      if (payload) wire::StoreValue(payload, i, E, v);
    }
  }
  // FoldLanes: lane j += lane j + s for j < s. Threads past s / 4 compute lanes nobody reads.
  for (int k = 0; k < 4; ++k) lane[k] += lane[4 + k];  // s = 128
  for (uint32_t d = 16; d > 0; d >>= 1) {                // s = 64 .. 4
    for (int k = 0; k < 4; ++k) lane[k] += __shfl_down_sync(0xffffffffu, lane[k], d);
  }
  if (l == 0) {
    lane[0] += lane[2];  // s = 2
    lane[1] += lane[3];
    lane[0] += lane[1];  // s = 1
    magnitudes[chunk] = lane[0];
    keys[chunk] = MagnitudeOrderKey(lane[0]);
    index[chunk] = chunk;
  }
}

__device__ void SetClass(const Args& a, const DeviceTensor& t, uint32_t c, uint32_t rank, uint8_t* classes) {
  const uint8_t cls = ClassAtRank(rank, t.tiers);
  classes[t.first_chunk + c] = cls;
  if (a.packets) a.packets[t.packet_offset + c * a.stride + wire::kOffClass] = cls;
}

// One thread per position p of the order (chunk indices across all tensors, each tensor's in rank
// order): the chunk there gets its rank's class, in `classes` and in its packet's header.
__global__ void ClassesInOrder(Args a, uint32_t chunks, const uint32_t* order, uint8_t* classes) {
  const uint32_t p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= chunks) return;
  const DeviceTensor& t = a.tensors[TensorOf(a, p)];
  SetClass(a, t, order[p] - t.first_chunk, p - t.first_chunk, classes);
}

// Up to this many chunks per tensor, ranks are counted rather than sorted: a warp per chunk counts
// the chunks of its tensor that rank before it (a smaller key, or an equal key and a lower
// index), n / 32 steps per warp in one kernel. The radix sort's ten dependent kernels take about
// 100 us on an H200 at any size; packing 64 MiB (8192 chunks) took 0.094 ms counting and 0.147 ms
// sorting.
constexpr uint32_t kMaxCountedChunks = 8192;

__global__ void __launch_bounds__(kWarp * kChunksPerBlock)
    ClassesByCounting(Args a, uint32_t chunks, const uint64_t* keys, uint8_t* classes) {
  const uint32_t chunk = blockIdx.x * kChunksPerBlock + threadIdx.x / kWarp;
  if (chunk >= chunks) return;  // the whole warp
  const uint32_t l = threadIdx.x % kWarp;
  const DeviceTensor& t = a.tensors[TensorOf(a, chunk)];
  const uint64_t key = keys[chunk];
  uint32_t before = 0;
  for (uint32_t j = t.first_chunk + l; j < t.first_chunk + t.tiers.chunks; j += kWarp) {
    const uint64_t other = keys[j];
    before += other < key || (other == key && j < chunk);
  }
  for (uint32_t d = kWarp / 2; d > 0; d >>= 1) before += __shfl_down_sync(0xffffffffu, before, d);
  if (l == 0) SetClass(a, t, chunk - t.first_chunk, before, classes);
}

// tensor[p]: the tensor that chunk order[p] belongs to.
__global__ void TensorsOf(const uint32_t* first_chunk, uint32_t tensors, uint32_t chunks, const uint32_t* order,
                          uint32_t* tensor) {
  const uint32_t p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= chunks) return;
  tensor[p] = TensorOf(first_chunk, tensors, order[p]);
}

template <ElemType T>
cudaError_t LaunchPackChunksOf(const Args& a, uint32_t chunks, cudaStream_t stream, double* magnitudes, uint64_t* keys,
                               uint32_t* index) {
  const uint32_t blocks = (chunks + kChunksPerBlock - 1) / kChunksPerBlock;
  const uint32_t threads = kWarp * kChunksPerBlock;
  switch (a.encoding) {
    case wire::Encoding::kF16:
      PackChunks<T, wire::Encoding::kF16><<<blocks, threads, 0, stream>>>(a, chunks, magnitudes, keys, index);
      break;
    case wire::Encoding::kBF16:
      PackChunks<T, wire::Encoding::kBF16><<<blocks, threads, 0, stream>>>(a, chunks, magnitudes, keys, index);
      break;
    default:
      PackChunks<T, wire::Encoding::kF32><<<blocks, threads, 0, stream>>>(a, chunks, magnitudes, keys, index);
  }
  return cudaGetLastError();
}

cudaError_t LaunchPackChunks(const Args& a, uint32_t chunks, cudaStream_t stream, double* magnitudes, uint64_t* keys,
                             uint32_t* index) {
  switch (a.type) {
    case ElemType::kF16: return LaunchPackChunksOf<ElemType::kF16>(a, chunks, stream, magnitudes, keys, index);
    case ElemType::kBF16: return LaunchPackChunksOf<ElemType::kBF16>(a, chunks, stream, magnitudes, keys, index);
    default: return LaunchPackChunksOf<ElemType::kF32>(a, chunks, stream, magnitudes, keys, index);
  }
}


// A buffer in device memory, or in pinned host memory, that only grows.
template <typename T, bool kPinned = false>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  ~DeviceBuffer() { Free(); }
  void Free() {
    if (ptr) kPinned ? cudaFreeHost(ptr) : cudaFree(ptr);
    ptr = nullptr;
    count = 0;
  }
  absl::Status Reserve(size_t n) {
    if (n <= count) return absl::OkStatus();
    Free();
    if (kPinned) {
      DLCP_CUDA_RETURN(cudaMallocHost(&ptr, n * sizeof(T)));
    } else {
      DLCP_CUDA_RETURN(cudaMalloc(&ptr, n * sizeof(T)));
    }
    count = n;
    return absl::OkStatus();
  }
};
template <typename T>
using PinnedBuffer = DeviceBuffer<T, true>;

// Where `p` lives; device and managed memory count as the device's, pinned host memory as host.
absl::StatusOr<cudaMemoryType> MemoryOf(const void* p) {
  cudaPointerAttributes attr{};
  DLCP_CUDA_RETURN(cudaPointerGetAttributes(&attr, p));
  return attr.type == cudaMemoryTypeManaged ? cudaMemoryTypeDevice : attr.type;
}

class CudaPacker : public Packer {
 public:
  CudaPacker(int device, const ClassPolicyOptions& policy) : device_(device), policy_(policy) {}
  ~CudaPacker() override {
    if (stream_) cudaStreamDestroy(stream_);
    if (side_) cudaStreamDestroy(side_);
    if (packed_) cudaEventDestroy(packed_);
  }
  const char* name() const override { return "cuda"; }

  absl::Status Pack(const PackInput& in, PackOutput* out) override {
    absl::StatusOr<PackLayout> layout = PlanPack(in, policy_);
    if (!layout.ok()) return layout.status();
    if (in.write_packets && out->packets == nullptr) return absl::InvalidArgumentError("pack: no packet buffer");
    DLCP_CUDA_RETURN(cudaSetDevice(device_));
    if (!stream_) DLCP_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    if (!side_) DLCP_CUDA_RETURN(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    if (!packed_) DLCP_CUDA_RETURN(cudaEventCreateWithFlags(&packed_, cudaEventDisableTiming));
    absl::StatusOr<cudaMemoryType> input = MemoryOf(in.data);
    if (!input.ok()) return input.status();
    if (*input != cudaMemoryTypeDevice) return absl::InvalidArgumentError("pack: the input must be CUDA device memory");
    uint8_t* packets = nullptr;  // where the kernels write
    bool stage = false;          // then copied to out->packets, ordinary host memory
    if (in.write_packets) {
      absl::StatusOr<cudaMemoryType> where = MemoryOf(out->packets);
      if (!where.ok()) return where.status();
      stage = *where == cudaMemoryTypeUnregistered;
      if (stage) {
        if (absl::Status s = staged_.Reserve(layout->packet_bytes()); !s.ok()) return s;
        packets = staged_.ptr;
      } else {
        packets = out->packets;
      }
    }
    const uint32_t chunks = layout->chunks();
    const uint32_t tensors = static_cast<uint32_t>(in.tensors.size());
    std::vector<DeviceTensor> table(tensors);
    for (uint32_t t = 0; t < tensors; ++t) {
      const PackTensor& pt = in.tensors[t];
      table[t] = DeviceTensor{pt.offset, layout->packet_offset[t], pt.elems, pt.key, pt.round, pt.epoch,
                              layout->first_chunk[t], layout->tiers[t]};
    }
    for (absl::Status s : {tensors_.Reserve(tensors), first_.Reserve(tensors + 1), magnitudes_.Reserve(chunks),
                           keys_.Reserve(chunks), sorted_keys_.Reserve(chunks), index_.Reserve(chunks),
                           sorted_index_.Reserve(chunks), classes_.Reserve(chunks)}) {
      if (!s.ok()) return s;
    }
    DLCP_CUDA_RETURN(cudaMemcpyAsync(tensors_.ptr, table.data(), tensors * sizeof(DeviceTensor),
                                     cudaMemcpyHostToDevice, stream_));
    DLCP_CUDA_RETURN(cudaMemcpyAsync(first_.ptr, layout->first_chunk.data(), (tensors + 1) * sizeof(uint32_t),
                                     cudaMemcpyHostToDevice, stream_));
    const Args a{in.data, in.type, tensors_.ptr, first_.ptr, tensors, in.chunk_elems, in.encoding,
                 in.job, in.rank, layout->stride, packets};
    DLCP_CUDA_RETURN(LaunchPackChunks(a, chunks, stream_, magnitudes_.ptr, keys_.ptr, index_.ptr));
    DLCP_CUDA_RETURN(cudaEventRecord(packed_, stream_));
    uint32_t largest = 0;  // chunks of the largest tensor
    for (const ClassTiers& tiers : layout->tiers) largest = std::max(largest, tiers.chunks);
    if (policy_.kind != ClassPolicyOptions::Kind::kUniform && largest <= kMaxCountedChunks) {
      ClassesByCounting<<<(chunks + kChunksPerBlock - 1) / kChunksPerBlock, kWarp * kChunksPerBlock, 0, stream_>>>(
          a, chunks, keys_.ptr, classes_.ptr);
    } else {
      const uint32_t* order = index_.ptr;  // every rank's class is the same under the uniform policy
      if (policy_.kind != ClassPolicyOptions::Kind::kUniform) {
        absl::StatusOr<const uint32_t*> sorted = RankOrder(chunks, tensors);
        if (!sorted.ok()) return sorted.status();
        order = *sorted;
      }
      ClassesInOrder<<<(chunks + 255) / 256, 256, 0, stream_>>>(a, chunks, order, classes_.ptr);
    }
    DLCP_CUDA_RETURN(cudaGetLastError());
    // Through pinned memory, whose copies run without this thread: the magnitudes travel while the
    // sort runs, and reach `out` before the classes are ready.
    for (absl::Status s : {host_magnitudes_.Reserve(chunks), host_classes_.Reserve(chunks)}) {
      if (!s.ok()) return s;
    }
    DLCP_CUDA_RETURN(cudaStreamWaitEvent(side_, packed_, 0));
    DLCP_CUDA_RETURN(cudaMemcpyAsync(host_magnitudes_.ptr, magnitudes_.ptr, chunks * sizeof(double),
                                     cudaMemcpyDeviceToHost, side_));
    DLCP_CUDA_RETURN(cudaMemcpyAsync(host_classes_.ptr, classes_.ptr, chunks, cudaMemcpyDeviceToHost, stream_));
    if (stage) {
      DLCP_CUDA_RETURN(cudaMemcpyAsync(out->packets, packets, layout->packet_bytes(), cudaMemcpyDeviceToHost, stream_));
    }
    DLCP_CUDA_RETURN(cudaStreamSynchronize(side_));
    out->magnitudes.assign(host_magnitudes_.ptr, host_magnitudes_.ptr + chunks);
    DLCP_CUDA_RETURN(cudaStreamSynchronize(stream_));
    out->classes.assign(host_classes_.ptr, host_classes_.ptr + chunks);
    return absl::OkStatus();
  }

 private:
  // Every chunk index, each tensor's in rank order (ascending MagnitudeOrderKey: largest first,
  // lower index among equals). Two stable device-wide radix sorts, by key and then by tensor,
  // rather than CUB's segmented sort, which gives each tensor one block: a 1 GiB tensor's 131072
  // chunks took over a millisecond that way.
  absl::StatusOr<const uint32_t*> RankOrder(uint32_t chunks, uint32_t tensors) {
    const int n = static_cast<int>(chunks);
    const int tensor_bits = tensors > 1 ? 32 - __builtin_clz(tensors - 1) : 0;
    size_t by_key = 0, by_tensor = 0;
    DLCP_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(nullptr, by_key, keys_.ptr, sorted_keys_.ptr, index_.ptr,
                                                     sorted_index_.ptr, n, 0, 64, stream_));
    if (tensors > 1) {
      for (absl::Status s : {tensor_of_.Reserve(chunks), sorted_tensor_.Reserve(chunks)}) {
        if (!s.ok()) return s;
      }
      DLCP_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(nullptr, by_tensor, tensor_of_.ptr, sorted_tensor_.ptr,
                                                       sorted_index_.ptr, index_.ptr, n, 0, tensor_bits, stream_));
    }
    // Never null: CUB reads a null scratch pointer as "tell me the size" and sorts nothing.
    size_t temp = std::max<size_t>({by_key, by_tensor, 1});
    if (absl::Status s = temp_.Reserve(temp); !s.ok()) return s;
    DLCP_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(temp_.ptr, temp, keys_.ptr, sorted_keys_.ptr, index_.ptr,
                                                     sorted_index_.ptr, n, 0, 64, stream_));
    if (tensors == 1) return sorted_index_.ptr;
    TensorsOf<<<(chunks + 255) / 256, 256, 0, stream_>>>(first_.ptr, tensors, chunks, sorted_index_.ptr,
                                                         tensor_of_.ptr);
    DLCP_CUDA_RETURN(cudaGetLastError());
    DLCP_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(temp_.ptr, temp, tensor_of_.ptr, sorted_tensor_.ptr,
                                                     sorted_index_.ptr, index_.ptr, n, 0, tensor_bits, stream_));
    return index_.ptr;
  }

  int device_;
  ClassPolicyOptions policy_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t side_ = nullptr;  // the magnitudes' copy to the host
  cudaEvent_t packed_ = nullptr;
  DeviceBuffer<DeviceTensor> tensors_;
  DeviceBuffer<uint32_t> first_, index_, sorted_index_, tensor_of_, sorted_tensor_;
  DeviceBuffer<double> magnitudes_;
  DeviceBuffer<uint64_t> keys_, sorted_keys_;
  DeviceBuffer<uint8_t> classes_, temp_, staged_;
  PinnedBuffer<double> host_magnitudes_;
  PinnedBuffer<uint8_t> host_classes_;
};

}  // namespace

absl::Status CudaDeviceStatus() {
  int count = 0;  // the runtime leaves it unset when it fails
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("no usable CUDA device: cudaGetDeviceCount returned error ",
                                               static_cast<int>(e), " (", cudaGetErrorString(e), ")"));
  }
  if (count <= 0) return absl::UnavailableError("no CUDA device");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Packer>> CreateCudaPacker(int device, const ClassPolicyOptions& policy) {
  if (absl::Status s = CudaDeviceStatus(); !s.ok()) return s;
  int count = 0;
  cudaGetDeviceCount(&count);
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " does not exist (", count, " found)"));
  }
  if (absl::Status s = ValidateClassPolicy(policy); !s.ok()) return s;
  return std::make_unique<CudaPacker>(device, policy);
}

}  // namespace dlcp
