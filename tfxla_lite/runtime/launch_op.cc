// TfxlaLiteLaunch: the TensorFlow custom op that runs one compiled cluster.
//
// Where it sits: the graph rewrite replaces each compiled cluster with one
// TfxlaLiteLaunch node whose `key` names an executable that Python registered
// in this process (tfxla_lite/runtime/loader.py, through the extern "C"
// functions at the end of this file). The kernel hands TF's own buffers to the
// executable, so inputs and outputs are never copied.
//
// Executable ABI (emitted by the codegen backends):
//   void entry(void** params, void** outputs, void* temp);   // C convention
//   params[i]  -> input i, dense row-major
//   outputs[j] -> output j, preallocated here with its registered shape, or an
//                 input TF no longer needs, forwarded, where the executable allows it
//   temp       -> an arena of temp_bytes bytes (NULL when temp_bytes == 0)
// Every non-empty buffer is 64-byte aligned; entry must be reentrant, since TF
// may run several launch nodes, or one node from several threads, at once. Each
// node keeps its temp arenas from launch to launch (ArenaPool): no page faults and
// no allocator round trip per call.
//
// Dynamic clusters (unknown dimensions, docs/architecture.md "Unknown dimensions"):
// a key registered with tfxla_lite_register_dynamic has no executable of its own
// but a compile callback into Python. The first launch with a new input
// signature (every input's shape, and the values of the value-keyed inputs,
// which are small shape tensors) calls it; the result, an executable or a
// refusal, is cached per signature. TfxlaLiteCompile answers "is there an
// executable for these inputs?" so that the graph can run the cluster's
// original TF ops instead (a StatelessIf emitted by tfxla_lite/rewrite.py, as
// TF's build_xla_ops_pass pairs _XlaCompile with a fallback branch).
// The callback takes the GIL itself (ctypes); TF runs kernels with the GIL
// released, and no lock of ours is held across the call.

#include <dlfcn.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"
#include "tsl/platform/threadpool.h"

namespace tfxla_lite {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::DataTypeString;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

// Bumped when the extern "C" signatures or the entry ABI change, so that the
// Python loader can refuse a stale library.
constexpr int kAbiVersion = 6;
constexpr uintptr_t kAlignment = 64;

using EntryFunction = void (*)(void** params, void** outputs, void* temp);

struct TensorSpec {
  DataType dtype;
  TensorShape shape;
};

// Python's owner of some machine code or callback (loader.py `_owners`, by token): it
// may be released once the last holder of this object is gone. The executable or
// dynamic cluster holding it is shared by the registry and by each launch running it,
// so an unregistered key's code stays mapped until its last launch returns; the
// destructor only records the token, and Python drops the owner when it next asks
// (tfxla_lite_take_released), since this may run on any TF thread without the GIL.
class OwnerToken {
 public:
  explicit OwnerToken(int64_t id) : id_(id) {}
  OwnerToken(const OwnerToken&) = delete;
  OwnerToken& operator=(const OwnerToken&) = delete;
  ~OwnerToken();

 private:
  int64_t id_;
};

struct ReleasedOwners {
  std::mutex mutex;
  std::vector<int64_t> ids;
};

ReleasedOwners& Released() {
  static ReleasedOwners* released = new ReleasedOwners;  // never destroyed: exit order
  return *released;
}

OwnerToken::~OwnerToken() {
  if (id_ == 0) return;
  ReleasedOwners& released = Released();
  std::lock_guard<std::mutex> lock(released.mutex);
  released.ids.push_back(id_);
}

std::shared_ptr<const OwnerToken> MakeOwnerToken(int64_t id) {
  return id == 0 ? nullptr : std::make_shared<const OwnerToken>(id);
}

struct Executable {
  EntryFunction entry;
  int64_t temp_bytes;
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  // Which node inputs are entry's params, in order; none: all of them. A
  // specialization of a dynamic cluster embeds its value-keyed inputs as
  // constants and does not take them.
  std::optional<std::vector<int>> param_inputs;
  // forward_from[j]: the param whose buffer output j may take over when TF no longer
  // needs that input (codegen/cpu/donation.py), or -1; empty: none.
  std::vector<int> forward_from;
  // Released when the last holder (registry, dynamic cache, running launch) lets go.
  std::shared_ptr<const OwnerToken> owner;
};

// What a compile callback returns (kept in sync with loader.py).
enum CompileOutcome : int {
  kCompiled = 0,    // the callback fulfilled the request
  kRefused = 1,     // no executable for this signature: run the fallback
  kFailed = 2,      // an error the op reports (must-compile mode)
  kRefuseAll = 3,   // refused, and every new signature from now on (megamorphic)
};

// Filled by Python, through tfxla_lite_fulfill / tfxla_lite_fail, during a callback.
struct CompileRequest {
  int num_inputs = 0;
  std::shared_ptr<const Executable> executable;
  std::string error;
};

// int callback(request, num_inputs, dtypes, ranks, dims_flat, data)
using CompileCallback = int (*)(void* request, int num_inputs, const int* dtypes,
                                const int* ranks, const int64_t* dims_flat,
                                const void* const* data);

struct DynamicCluster {
  CompileCallback callback;
  std::vector<DataType> input_dtypes;
  std::vector<PartialTensorShape> input_shapes;  // ranks known; -1 for unknown dims
  std::vector<bool> value_keyed;

  mutable std::mutex mutex;
  // signature -> executable; nullptr caches a refusal.
  std::unordered_map<std::string, std::shared_ptr<const Executable>> cache;
  bool refuse_all = false;
  int64_t refused = 0;  // signatures refused, the megamorphic ones included
  // Keeps the callback alive: a launch that found this cluster may still call it.
  std::shared_ptr<const OwnerToken> owner;
};

// Process-wide map from key to executable. Kernels take a shared_ptr under a
// reader lock, so an unregister during a launch never frees the entry that
// launch is reading, nor its code (the Python owner goes with the entry's OwnerToken).
class Registry {
 public:
  static Registry& Get() {
    static Registry* registry = new Registry;  // never destroyed: no exit-order races
    return *registry;
  }

  // Returns true when `key` replaced an existing executable.
  bool Put(const std::string& key, std::shared_ptr<const Executable> executable) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    auto [it, inserted] = executables_.insert_or_assign(key, std::move(executable));
    return !inserted;
  }

  std::shared_ptr<const Executable> Find(const std::string& key) const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = executables_.find(key);
    return it == executables_.end() ? nullptr : it->second;
  }

  bool PutDynamic(const std::string& key, std::shared_ptr<DynamicCluster> cluster) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    auto [it, inserted] = dynamic_.insert_or_assign(key, std::move(cluster));
    return !inserted;
  }

  std::shared_ptr<DynamicCluster> FindDynamic(const std::string& key) const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = dynamic_.find(key);
    return it == dynamic_.end() ? nullptr : it->second;
  }

  bool Erase(const std::string& key) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    const bool erased = executables_.erase(key) > 0;
    return dynamic_.erase(key) > 0 || erased;
  }

  int64_t Size() const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return static_cast<int64_t>(executables_.size() + dynamic_.size());
  }

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const Executable>> executables_;
  std::unordered_map<std::string, std::shared_ptr<DynamicCluster>> dynamic_;
};

bool IsAligned(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % kAlignment == 0;
}

char* AlignUp(char* pointer) {
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  return pointer + ((kAlignment - address % kAlignment) % kAlignment);
}

// A 64-byte aligned scratch buffer of `bytes` bytes, owned by `holder`.
absl::Status AllocateAligned(OpKernelContext* ctx, int64_t bytes, Tensor* holder,
                             char** aligned) {
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT8,
                                        TensorShape({bytes + static_cast<int64_t>(kAlignment)}),
                                        holder));
  *aligned = AlignUp(const_cast<char*>(holder->tensor_data().data()));
  return absl::OkStatus();
}

char* DataOf(const Tensor& tensor) { return const_cast<char*>(tensor.tensor_data().data()); }

// Temp arenas allocated and reused, over all launch nodes (tfxla_lite_arena_stats).
std::atomic<int64_t> arenas_allocated{0};
std::atomic<int64_t> arenas_reused{0};
// Outputs written in an input's own buffer (TF's input forwarding).
std::atomic<int64_t> outputs_forwarded{0};
// Variable writes done in the variable's own buffer (tfxla_lite_variables_in_place).
std::atomic<int64_t> variables_in_place{0};
// Launches, and nanoseconds summed over them: from the start of Run (signature checked)
// to the call of entry (output allocation, temp arena), and entry itself
// (tfxla_lite_launch_timing).
std::atomic<int64_t> launches_timed{0};
std::atomic<int64_t> launch_prologue_ns{0};
std::atomic<int64_t> launch_entry_ns{0};

struct Arena {
  char* data = nullptr;  // 64-byte aligned
  int64_t capacity = 0;
};

// The temp arenas of one launch node, reused from launch to launch. A fresh arena per
// launch is a fresh allocation, whose pages fault in again on every call when it is
// large (the allocator maps and unmaps it); an idle arena is already resident. A
// launch takes the smallest idle arena that fits, or allocates one, and gives it back
// when the entry returns, so concurrent launches of one node never share an arena.
// At most kMaxIdle arenas stay allocated between launches (the largest).
class ArenaPool {
 public:
  static constexpr size_t kMaxIdle = 4;

  ArenaPool() = default;
  ArenaPool(const ArenaPool&) = delete;
  ArenaPool& operator=(const ArenaPool&) = delete;
  ~ArenaPool() {
    for (Arena& arena : idle_) std::free(arena.data);
  }

  // An arena of at least `bytes` bytes; data is nullptr when the allocation failed.
  Arena Take(int64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      int best = -1;
      for (int i = 0; i < static_cast<int>(idle_.size()); ++i) {
        if (idle_[i].capacity >= bytes &&
            (best < 0 || idle_[i].capacity < idle_[best].capacity)) {
          best = i;
        }
      }
      if (best >= 0) {
        Arena arena = idle_[best];
        idle_.erase(idle_.begin() + best);
        arenas_reused.fetch_add(1, std::memory_order_relaxed);
        return arena;
      }
    }
    const int64_t capacity =
        (bytes + static_cast<int64_t>(kAlignment) - 1) / kAlignment * kAlignment;
    Arena arena{static_cast<char*>(std::aligned_alloc(kAlignment, capacity)), capacity};
    if (arena.data != nullptr) arenas_allocated.fetch_add(1, std::memory_order_relaxed);
    return arena;
  }

  void Give(Arena arena) {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.push_back(arena);
    if (idle_.size() > kMaxIdle) {
      auto smallest = idle_.begin();
      for (auto it = idle_.begin(); it != idle_.end(); ++it) {
        if (it->capacity < smallest->capacity) smallest = it;
      }
      std::free(smallest->data);
      idle_.erase(smallest);
    }
  }

 private:
  std::mutex mutex_;
  std::vector<Arena> idle_;
};

// An arena taken from a pool for one launch; returned when it goes out of scope.
class ArenaLease {
 public:
  ArenaLease(ArenaPool& pool, int64_t bytes) : pool_(pool), arena_(pool.Take(bytes)) {}
  ArenaLease(const ArenaLease&) = delete;
  ArenaLease& operator=(const ArenaLease&) = delete;
  ~ArenaLease() {
    if (arena_.data != nullptr) pool_.Give(arena_);
  }
  char* data() const { return arena_.data; }

 private:
  ArenaPool& pool_;
  Arena arena_;
};

// -- Output pool: outputs in memory that is already mapped --------------------------------
//
// A fresh output of TF's allocator is fresh memory whenever it is large (glibc maps and
// unmaps every block above its mmap threshold), so the kernel that writes it takes a page
// fault per 4 KB page, and memory-bound kernels then run at a fraction of the bandwidth
// of a copy into mapped memory. The launch op allocates its large outputs here instead:
// blocks of a few size classes, handed to TF inside a TensorBuffer of our own
// (PooledBuffer) whose destructor gives the block back when TF, the caller and every
// op that forwarded the buffer have let go of it. A returned block waits, idle and
// mapped, for the next output of its size class.
//
// Bounded: the idle blocks never hold more than the cap in bytes (the oldest go first);
// a failed mapping releases every idle block and tries once more; a cap of 0 releases
// each block as it returns. Blocks of 2 MB and up are advised for transparent huge
// pages, so that a miss faults in 2 MB at a time. The pool is a process-lifetime object
// that is never destroyed (a tensor may be released during or after static
// destruction); its idle blocks are released at library unload (OutputPoolReleaser).

// Below this size an output comes from TF's allocator, whose heap reuses small blocks
// without faulting their pages again.
constexpr int64_t kPoolMinBytes = int64_t{256} << 10;
constexpr int64_t kPageBytes = 4096;
constexpr int64_t kHugePageBytes = int64_t{2} << 20;

// Counters of the output pool (tfxla_lite_output_pool_stats).
std::atomic<int64_t> pool_hits{0};         // outputs given an idle block
std::atomic<int64_t> pool_misses{0};       // outputs given a newly mapped block
std::atomic<int64_t> pool_bypassed{0};     // large outputs left to TF (pool off, failure)
std::atomic<int64_t> pool_returned{0};     // blocks given back by their TensorBuffer
std::atomic<int64_t> pool_released{0};     // blocks unmapped (over the cap, trimmed)

// The size class of an output of `bytes` bytes: four classes per power of two (at most
// a quarter wasted), whole pages, and whole huge pages from 2 MB on.
int64_t SizeClass(int64_t bytes) {
  if (bytes <= kPageBytes) return kPageBytes;
  int shift = 63 - __builtin_clzll(static_cast<uint64_t>(bytes - 1));  // 2^shift < bytes
  const int64_t step = std::max<int64_t>(int64_t{1} << std::max(shift - 2, 0), kPageBytes);
  int64_t size = (bytes + step - 1) / step * step;
  if (size >= kHugePageBytes) size = (size + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  return size;
}

struct Block {
  char* data = nullptr;  // page aligned (huge-page aligned from 2 MB on)
  int64_t capacity = 0;  // a size class
  int64_t mapped = 0;    // bytes of the mapping at data (capacity)
};

class OutputPool {
 public:
  static OutputPool& Get() {
    static OutputPool* pool = new OutputPool;  // never destroyed: see the section comment
    return *pool;
  }

  // Settings from tfxla_lite_set_output_pool; read on every output.
  std::atomic<bool> enabled{true};
  std::atomic<bool> huge_pages{true};

  // A block for an output of `bytes` bytes: an idle one of its class, else a new mapping;
  // data is nullptr when none can be mapped.
  Block Take(int64_t bytes) {
    const int64_t capacity = SizeClass(bytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = idle_.find(capacity);
      if (it != idle_.end()) {
        Block block = it->second.block;
        idle_.erase(it);
        idle_bytes_ -= capacity;
        in_use_bytes_ += capacity;
        pool_hits.fetch_add(1, std::memory_order_relaxed);
        return block;
      }
    }
    Block block = Map(capacity);
    if (block.data == nullptr) {
      // Under memory pressure the idle blocks are the first to go.
      Trim(0);
      block = Map(capacity);
    }
    if (block.data != nullptr) {
      std::lock_guard<std::mutex> lock(mutex_);
      in_use_bytes_ += capacity;
      pool_misses.fetch_add(1, std::memory_order_relaxed);
    }
    return block;
  }

  // Called by a PooledBuffer's destructor, on whatever thread released the tensor.
  void Give(Block block) {
    pool_returned.fetch_add(1, std::memory_order_relaxed);
    std::vector<Block> release;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_use_bytes_ -= block.capacity;
      if (block.capacity <= cap_bytes_) {
        // Room first, so that the idle bytes never pass the cap, not even for a moment.
        EvictOver(cap_bytes_ - block.capacity, &release);
        idle_.emplace(block.capacity, Idle{block, ++clock_});
        idle_bytes_ += block.capacity;
        peak_idle_bytes_ = std::max(peak_idle_bytes_, idle_bytes_);
      } else {
        release.push_back(block);
      }
    }
    for (const Block& unmapped : release) Unmap(unmapped);
  }

  // Keeps at most `bytes` bytes of idle blocks, releasing the oldest.
  void Trim(int64_t bytes) {
    std::vector<Block> release;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      EvictOver(bytes, &release);
    }
    for (const Block& unmapped : release) Unmap(unmapped);
  }

  // Sets the cap on idle bytes, and trims to it.
  void SetCap(int64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cap_bytes_ = bytes;
    }
    Trim(bytes);
  }

  void Read(int64_t* cap, int64_t* idle, int64_t* peak_idle, int64_t* in_use,
            int64_t* idle_blocks) {
    std::lock_guard<std::mutex> lock(mutex_);
    *cap = cap_bytes_;
    *idle = idle_bytes_;
    *peak_idle = peak_idle_bytes_;
    *in_use = in_use_bytes_;
    *idle_blocks = static_cast<int64_t>(idle_.size());
  }

  // The peak of idle bytes starts again from the bytes idle now.
  void ResetPeak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_idle_bytes_ = idle_bytes_;
  }

 private:
  struct Idle {
    Block block;
    uint64_t returned;  // when it was given back (a counter): the oldest goes first
  };

  OutputPool() = default;

  // Moves the oldest idle blocks to `release` until at most `bytes` bytes stay idle.
  void EvictOver(int64_t bytes, std::vector<Block>* release) {
    while (idle_bytes_ > bytes && !idle_.empty()) {
      auto oldest = idle_.begin();
      for (auto it = idle_.begin(); it != idle_.end(); ++it) {
        if (it->second.returned < oldest->second.returned) oldest = it;
      }
      idle_bytes_ -= oldest->second.block.capacity;
      release->push_back(oldest->second.block);
      idle_.erase(oldest);
    }
  }

  Block Map(int64_t capacity) const {
    const bool huge = capacity >= kHugePageBytes && huge_pages.load(std::memory_order_relaxed);
    // A huge page needs a 2 MB aligned address: map a huge page more, cut the ends off.
    const int64_t extra = huge ? kHugePageBytes : 0;
    void* mapping = mmap(nullptr, capacity + extra, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping == MAP_FAILED) return Block{};
    char* start = static_cast<char*>(mapping);
    char* data = start;
    if (huge) {
      const uintptr_t address = reinterpret_cast<uintptr_t>(start);
      data = start + (kHugePageBytes - address % kHugePageBytes) % kHugePageBytes;
      if (data > start) munmap(start, data - start);
      char* end = start + capacity + extra;
      if (end > data + capacity) munmap(data + capacity, end - (data + capacity));
      madvise(data, capacity, MADV_HUGEPAGE);  // advice only: a refusal changes nothing
    }
    return Block{data, capacity, capacity};
  }

  static void Unmap(const Block& block) {
    munmap(block.data, block.mapped);
    pool_released.fetch_add(1, std::memory_order_relaxed);
  }

  std::mutex mutex_;
  std::unordered_multimap<int64_t, Idle> idle_;  // size class -> idle blocks
  int64_t cap_bytes_ = int64_t{1} << 30;
  int64_t idle_bytes_ = 0;
  int64_t peak_idle_bytes_ = 0;
  int64_t in_use_bytes_ = 0;
  uint64_t clock_ = 0;
};

// Releases the idle blocks when the library is unloaded (at exit); the pool itself stays,
// with a cap of 0, so that a tensor released later still finds it and its block is
// unmapped at once.
struct OutputPoolReleaser {
  ~OutputPoolReleaser() { OutputPool::Get().SetCap(0); }
} output_pool_releaser;

// A tensor's buffer in a pool block; the block goes back to the pool when TF releases
// the last reference (the output, its slices, every op it was forwarded to).
class PooledBuffer : public tensorflow::TensorBuffer {
 public:
  PooledBuffer(Block block, int64_t bytes)
      : TensorBuffer(block.data), block_(block), bytes_(static_cast<size_t>(bytes)) {}

  size_t size() const override { return bytes_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(bytes_));
    proto->set_allocated_bytes(block_.capacity);
  }
  bool GetAllocatedBytes(size_t* out_bytes) const override {
    *out_bytes = static_cast<size_t>(block_.capacity);
    return true;
  }
  // Owned, so that TF may forward it to another op's output (Tensor::RefCountIsOne).
  bool OwnsMemory() const override { return true; }
  tsl::AllocatorMemoryType GetMemoryType() const override {
    return tsl::AllocatorMemoryType::kHostPageable;
  }

 private:
  ~PooledBuffer() override { OutputPool::Get().Give(block_); }

  const Block block_;
  const size_t bytes_;
};

// Sets output j to a tensor in a pool block when the pool takes it: on, the output large
// and in memory of no special kind (a scoped allocation, NIC or GPU-compatible memory
// stay TF's). Returns the output, or nullptr when TF's allocator must make it.
Tensor* PooledOutput(OpKernelContext* ctx, int j, DataType dtype, const TensorShape& shape) {
  OutputPool& pool = OutputPool::Get();
  // Raw memory suits plain element types only (a string or variant needs constructing).
  if (!tensorflow::DataTypeCanUseMemcpy(dtype)) return nullptr;
  const int64_t bytes = shape.num_elements() * tensorflow::DataTypeSize(dtype);
  if (bytes < kPoolMinBytes) return nullptr;
  const tensorflow::AllocatorAttributes attributes = ctx->output_alloc_attr(j);
  if (!pool.enabled.load(std::memory_order_relaxed) || attributes.value != 0 ||
      attributes.scope_id != 0) {
    pool_bypassed.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  Block block = pool.Take(bytes);
  if (block.data == nullptr) {
    pool_bypassed.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  auto* buffer = new PooledBuffer(block, bytes);
  // The tensor takes a reference and set_output copies it; ours goes when `tensor` does.
  {
    Tensor tensor(dtype, shape, buffer);
    buffer->Unref();
    ctx->set_output(j, std::move(tensor));
  }
  return ctx->mutable_output(j);
}

// -- Parallel kernels on TF's intra-op thread pool ----------------------------------------
//
// Generated kernels cut a big range into parts and call
// `tfxla_lite_parallel(task, data, threads, 0)` (codegen/cpu/parallel.py), whose
// signature is libgomp's GOMP_parallel: `task(data)` claims parts from a counter in
// `data` until none is left, so any number of threads running it, the caller alone
// included, computes the whole range. Python binds the symbol to this library's
// function once the library is loaded (loader.py), to GOMP_parallel before that.
//
// A launch sets the thread's current pool (ScopedPool, around `entry`). With a pool,
// the default runtime (kTfPool) schedules up to threads - 1 closures on it for every
// region. The team runtime (kTfTeam) schedules them at a launch's first region, and a
// helper that starts stays for the launch's later regions too, spinning briefly between
// them and leaving the pool thread after a short idle time (or when the launch ends);
// the next region then schedules again: a launch pays the wake-up (Schedule) about once
// instead of once per region.
//
// Either way the caller runs `task(data)` itself, then closes the region: a helper that
// comes afterwards returns without touching `data` (which lives on the kernel's stack),
// and the caller waits only for the helpers that entered before it closed. A worker that
// TF has not scheduled yet (asleep, busy with other ops) thus never holds a launch up:
// the caller does its parts. Since the caller never waits for a helper to start, a
// launch on one of the pool's own threads cannot deadlock.

enum ParallelRuntime : int {
  kTfPool = 0,  // TF's intra-op pool of the launch, closures per region; libgomp without one
  kOpenMp = 1,  // libgomp's GOMP_parallel (its own team of threads)
  kSerial = 2,  // the caller alone
  kTfTeam = 3,  // TF's intra-op pool, helpers that stay for a launch; libgomp without one
};

// Read on every parallel region (relaxed: a switch may take a region or two to show).
std::atomic<int> parallel_runtime{kTfPool};
// What parallel regions ran on (tfxla_lite_parallel_stats): TF's pool, libgomp, the
// caller alone; and the pool's closures scheduled, those that ran the task (a team
// helper: of one region at least), and those that found no open region to enter.
std::atomic<int64_t> regions_on_pool{0};
std::atomic<int64_t> regions_on_openmp{0};
std::atomic<int64_t> regions_serial{0};
std::atomic<int64_t> workers_scheduled{0};
std::atomic<int64_t> workers_entered{0};
std::atomic<int64_t> workers_late{0};
// Where a pool region's time went (tfxla_lite_parallel_timing), nanoseconds summed over
// regions: the caller inside its own task, the caller waiting for the workers that
// entered, and the delay from scheduling a closure to its start (entered or late); and
// the caller's own time in Schedule (which wakes a sleeping worker).
std::atomic<int64_t> caller_schedule_ns{0};
std::atomic<int64_t> caller_task_ns{0};
std::atomic<int64_t> caller_join_ns{0};
std::atomic<int64_t> worker_start_ns{0};
// How long the caller spins for a worker finishing its last part before it sleeps
// (tfxla_lite_set_join_spin; read per region, so that A/B runs fit in one process).
std::atomic<int64_t> join_spin_ns{20000};
// How long a team helper waits for the launch's next region before it leaves the pool
// thread (tfxla_lite_set_team_idle); and the regions team helpers entered.
std::atomic<int64_t> team_idle_ns{20000};
std::atomic<int64_t> team_regions_entered{0};

using TaskFunction = void (*)(void*);
using GompParallel = void (*)(TaskFunction, void*, unsigned, unsigned);

// libgomp's entry point, where Python loaded libgomp RTLD_GLOBAL; nullptr otherwise.
GompParallel FindGompParallel() {
  static std::atomic<GompParallel> found{nullptr};
  GompParallel gomp = found.load(std::memory_order_acquire);
  if (gomp == nullptr) {
    gomp = reinterpret_cast<GompParallel>(dlsym(RTLD_DEFAULT, "GOMP_parallel"));
    if (gomp != nullptr) found.store(gomp, std::memory_order_release);
  }
  return gomp;
}

// One parallel region's state, shared by the caller and its closures; on the heap, so
// that a closure that runs after the caller returned still reads valid memory.
struct Region {
  static constexpr uint32_t kClosed = 1u << 31;    // the caller finished its task
  static constexpr uint32_t kSleeping = 1u << 30;  // the caller waits on `done`
  static constexpr uint32_t kCount = kSleeping - 1;  // workers inside `task`

  Region(TaskFunction task, void* data)
      : task(task), data(data), scheduled(std::chrono::steady_clock::now()) {}

  // Runs the task unless the region is closed (then `data` may be gone).
  void Work() {
    worker_start_ns.fetch_add(NanosecondsSince(scheduled), std::memory_order_relaxed);
    uint32_t state = state_.load(std::memory_order_acquire);
    do {
      if (state & kClosed) {
        workers_late.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    } while (!state_.compare_exchange_weak(state, state + 1, std::memory_order_acquire,
                                           std::memory_order_acquire));
    workers_entered.fetch_add(1, std::memory_order_relaxed);
    task(data);
    const uint32_t before = state_.fetch_sub(1, std::memory_order_acq_rel);
    if ((before & kCount) == 1 && (before & kSleeping)) {
      // Taking the mutex orders this wake-up after the caller's wait began.
      { std::lock_guard<std::mutex> lock(mutex_); }
      done_.notify_one();
    }
  }

  // Called by the caller once its own task returned: no worker may enter from now on;
  // returns when the workers that entered have left.
  void CloseAndWait() {
    uint32_t state = state_.fetch_or(kClosed, std::memory_order_acq_rel) | kClosed;
    if ((state & kCount) == 0) return;
    // A worker inside is finishing its last part (none are left to claim): a short
    // spin usually sees it leave without a sleep and a wake-up. Bounded in time, not in
    // iterations (a pause takes 10 to 140 cycles, by CPU), and short: on a busy machine
    // the worker may be waiting for the very core this spin holds.
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::nanoseconds(join_spin_ns.load(std::memory_order_relaxed));
    for (int spin = 1; (state & kCount) != 0; ++spin) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      state = state_.load(std::memory_order_acquire);
      if (spin % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
    }
    if ((state & kCount) == 0) return;
    std::unique_lock<std::mutex> lock(mutex_);
    state = state_.fetch_or(kSleeping, std::memory_order_acq_rel);
    done_.wait(lock, [this] { return (state_.load(std::memory_order_acquire) & kCount) == 0; });
  }

  static int64_t NanosecondsSince(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now() - start).count();
  }

  const TaskFunction task;
  void* const data;
  const std::chrono::steady_clock::time_point scheduled;

 private:
  std::atomic<uint32_t> state_{0};
  std::mutex mutex_;
  std::condition_variable done_;
};

// A launch's team: the regions of one launch, run one after another by its caller, and
// the helpers that stay for them. `state_` packs the region's number (high 32 bits), the
// closed and sleeping flags and the count of helpers inside the task, so that a helper
// enters only the region it saw open; `task` and `data` are written by the caller before
// it opens a region (release) and read by a helper after it entered (acquire), and
// change only while the region is closed with nobody inside. On the heap: a helper may
// start after its launch ended.
class Team {
 public:
  static constexpr uint64_t kClosed = 1u << 31;
  static constexpr uint64_t kSleeping = 1u << 30;
  static constexpr uint64_t kCount = kSleeping - 1;
  static constexpr int kEpochShift = 32;

  Team() : state_(kClosed) {}

  // The caller: opens the next region; returns how many helpers to schedule so that
  // `helpers` serve it (helpers already in the team, started or queued, count).
  int Open(TaskFunction task, void* data, int helpers) {
    task_ = task;
    data_ = data;
    epoch_ += 1;
    state_.store(static_cast<uint64_t>(epoch_) << kEpochShift, std::memory_order_release);
    int members = members_.load(std::memory_order_relaxed);
    const int missing = helpers - members;
    if (missing <= 0) return 0;
    members_.fetch_add(missing, std::memory_order_relaxed);
    return missing;
  }

  // The caller, once its own task returned: no helper may enter the region from now on;
  // returns when the helpers that entered have left it (spin, then sleep: as Region).
  void CloseAndWait() {
    uint64_t state = state_.fetch_or(kClosed, std::memory_order_acq_rel) | kClosed;
    if ((state & kCount) == 0) return;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::nanoseconds(join_spin_ns.load(std::memory_order_relaxed));
    for (int spin = 1; (state & kCount) != 0; ++spin) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      state = state_.load(std::memory_order_acquire);
      if (spin % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
    }
    if ((state & kCount) == 0) return;
    std::unique_lock<std::mutex> lock(mutex_);
    state_.fetch_or(kSleeping, std::memory_order_acq_rel);
    done_.wait(lock, [this] { return (state_.load(std::memory_order_acquire) & kCount) == 0; });
    state_.fetch_and(~kSleeping, std::memory_order_relaxed);
  }

  // The caller, when the launch ends: helpers leave at their next look.
  void Disband() { disbanded_.store(true, std::memory_order_release); }

  // A helper (a pool closure): enters every region it sees open until the team is
  // disbanded or no region opened for `team_idle_ns`.
  void Serve(std::chrono::steady_clock::time_point scheduled) {
    worker_start_ns.fetch_add(Region::NanosecondsSince(scheduled), std::memory_order_relaxed);
    const int64_t idle_ns = team_idle_ns.load(std::memory_order_relaxed);
    uint64_t seen = 0;  // the last region number this helper entered or found closed
    int64_t entered = 0;
    auto idle_since = std::chrono::steady_clock::now();
    for (int spin = 1;; ++spin) {
      if (disbanded_.load(std::memory_order_acquire)) break;
      uint64_t state = state_.load(std::memory_order_acquire);
      const uint64_t epoch = state >> kEpochShift;
      if (epoch != seen) {
        seen = epoch;
        if (TryEnter(state)) {
          ++entered;
          task_(data_);
          Leave();
        }
        idle_since = std::chrono::steady_clock::now();
        spin = 0;
        continue;
      }
      // Spins, not sched_yield: under load a yielding helper is off its core for whole
      // time slices when the next region opens, and counts as present all the while.
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      if (spin % 64 == 0 &&
          std::chrono::steady_clock::now() - idle_since > std::chrono::nanoseconds(idle_ns)) {
        break;
      }
    }
    members_.fetch_sub(1, std::memory_order_relaxed);
    team_regions_entered.fetch_add(entered, std::memory_order_relaxed);
    (entered > 0 ? workers_entered : workers_late).fetch_add(1, std::memory_order_relaxed);
  }

 private:
  // Enters the region `state` describes if it is still that one and open.
  bool TryEnter(uint64_t state) {
    const uint64_t epoch = state >> kEpochShift;
    while ((state >> kEpochShift) == epoch && !(state & kClosed)) {
      if (state_.compare_exchange_weak(state, state + 1, std::memory_order_acquire,
                                       std::memory_order_acquire)) {
        return true;
      }
    }
    return false;
  }

  void Leave() {
    const uint64_t before = state_.fetch_sub(1, std::memory_order_acq_rel);
    if ((before & kCount) == 1 && (before & kSleeping)) {
      // Taking the mutex orders this wake-up after the caller's wait began.
      { std::lock_guard<std::mutex> lock(mutex_); }
      done_.notify_one();
    }
  }

  std::atomic<uint64_t> state_;
  std::atomic<int> members_{0};
  std::atomic<bool> disbanded_{false};
  uint32_t epoch_ = 0;  // the caller's alone
  TaskFunction task_ = nullptr;
  void* data_ = nullptr;
  std::mutex mutex_;
  std::condition_variable done_;
};

// This thread's launch: its pool and, from its first team region on, its team. Set for
// one launch (around `entry`); restores the previous one (nested launches).
class ScopedPool;
thread_local ScopedPool* current_scope = nullptr;

class ScopedPool {
 public:
  explicit ScopedPool(tsl::thread::ThreadPool* pool) : pool_(pool), previous_(current_scope) {
    current_scope = this;
  }
  ScopedPool(const ScopedPool&) = delete;
  ScopedPool& operator=(const ScopedPool&) = delete;
  ~ScopedPool() {
    if (team_ != nullptr) team_->Disband();
    current_scope = previous_;
  }

  tsl::thread::ThreadPool* pool() const { return pool_; }
  const std::shared_ptr<Team>& team() {
    if (team_ == nullptr) team_ = std::make_shared<Team>();
    return team_;
  }

 private:
  tsl::thread::ThreadPool* const pool_;
  ScopedPool* const previous_;
  std::shared_ptr<Team> team_;
};

// The default (kTfPool): closures scheduled for this region alone.
void RunOnPool(tsl::thread::ThreadPool* pool, TaskFunction task, void* data,
               unsigned threads) {
  const int helpers = static_cast<int>(
      std::min<int64_t>(static_cast<int64_t>(threads) - 1, pool->NumThreads()));
  if (helpers <= 0) {
    regions_serial.fetch_add(1, std::memory_order_relaxed);
    task(data);
    return;
  }
  regions_on_pool.fetch_add(1, std::memory_order_relaxed);
  workers_scheduled.fetch_add(helpers, std::memory_order_relaxed);
  auto region = std::make_shared<Region>(task, data);
  for (int i = 0; i < helpers; ++i) pool->Schedule([region] { region->Work(); });
  const auto started = std::chrono::steady_clock::now();
  caller_schedule_ns.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(started - region->scheduled).count(),
      std::memory_order_relaxed);
  task(data);
  const auto finished = std::chrono::steady_clock::now();
  region->CloseAndWait();
  caller_task_ns.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(finished - started).count(),
      std::memory_order_relaxed);
  caller_join_ns.fetch_add(Region::NanosecondsSince(finished), std::memory_order_relaxed);
}

void RunOnTeam(ScopedPool& scope, TaskFunction task, void* data, unsigned threads) {
  tsl::thread::ThreadPool* pool = scope.pool();
  const int helpers = static_cast<int>(
      std::min<int64_t>(static_cast<int64_t>(threads) - 1, pool->NumThreads()));
  if (helpers <= 0) {
    regions_serial.fetch_add(1, std::memory_order_relaxed);
    task(data);
    return;
  }
  regions_on_pool.fetch_add(1, std::memory_order_relaxed);
  const std::shared_ptr<Team>& team = scope.team();
  const auto opened = std::chrono::steady_clock::now();
  const int missing = team->Open(task, data, helpers);
  if (missing > 0) {
    workers_scheduled.fetch_add(missing, std::memory_order_relaxed);
    for (int i = 0; i < missing; ++i) {
      pool->Schedule([team = team, opened] { team->Serve(opened); });
    }
  }
  const auto started = std::chrono::steady_clock::now();
  caller_schedule_ns.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(started - opened).count(),
      std::memory_order_relaxed);
  task(data);
  const auto finished = std::chrono::steady_clock::now();
  team->CloseAndWait();
  caller_task_ns.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(finished - started).count(),
      std::memory_order_relaxed);
  caller_join_ns.fetch_add(Region::NanosecondsSince(finished), std::memory_order_relaxed);
}

void RunParallel(TaskFunction task, void* data, unsigned threads, unsigned flags) {
  const int runtime = parallel_runtime.load(std::memory_order_relaxed);
  if (runtime == kSerial || threads <= 1) {
    regions_serial.fetch_add(1, std::memory_order_relaxed);
    task(data);
    return;
  }
  if (current_scope != nullptr && current_scope->pool() != nullptr) {
    if (runtime == kTfTeam) {
      RunOnTeam(*current_scope, task, data, threads);
      return;
    }
    if (runtime == kTfPool) {
      RunOnPool(current_scope->pool(), task, data, threads);
      return;
    }
  }
  if (GompParallel gomp = FindGompParallel()) {
    regions_on_openmp.fetch_add(1, std::memory_order_relaxed);
    gomp(task, data, threads, flags);
    return;
  }
  regions_serial.fetch_add(1, std::memory_order_relaxed);
  task(data);
}

template <typename... Args>
absl::Status InvalidFor(const std::string& key, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat("TfxlaLiteLaunch '", key, "': ", args...));
}

// The cache key of one launch of a dynamic cluster: every input's dtype and dims,
// and the bytes of the value-keyed inputs.
std::string SignatureOf(OpKernelContext* ctx, const DynamicCluster& cluster) {
  std::string signature;
  for (int i = 0; i < ctx->num_inputs(); ++i) {
    const Tensor& input = ctx->input(i);
    const int32_t head[2] = {static_cast<int32_t>(input.dtype()), input.dims()};
    signature.append(reinterpret_cast<const char*>(head), sizeof(head));
    for (int d = 0; d < input.dims(); ++d) {
      const int64_t size = input.dim_size(d);
      signature.append(reinterpret_cast<const char*>(&size), sizeof(size));
    }
    if (cluster.value_keyed[i]) {
      signature.append(input.tensor_data().data(), input.tensor_data().size());
    }
  }
  return signature;
}

// Finds or compiles the executable of a dynamic cluster for this launch's inputs;
// sets *executable to nullptr when the cluster refuses them (run the fallback).
absl::Status Specialize(OpKernelContext* ctx, const std::string& key, DynamicCluster& cluster,
                        std::shared_ptr<const Executable>* executable) {
  const int num_inputs = ctx->num_inputs();
  if (num_inputs != static_cast<int>(cluster.input_dtypes.size())) {
    return InvalidFor(key, "got ", num_inputs, " inputs, but the cluster takes ",
                      cluster.input_dtypes.size());
  }
  for (int i = 0; i < num_inputs; ++i) {
    const Tensor& input = ctx->input(i);
    if (input.dtype() != cluster.input_dtypes[i]) {
      return InvalidFor(key, "input ", i, " has dtype ", DataTypeString(input.dtype()),
                        " but the cluster expects ", DataTypeString(cluster.input_dtypes[i]));
    }
    if (!cluster.input_shapes[i].IsCompatibleWith(input.shape())) {
      return InvalidFor(key, "input ", i, " has shape ", input.shape().DebugString(),
                        " but the cluster expects ", cluster.input_shapes[i].DebugString());
    }
  }
  const std::string signature = SignatureOf(ctx, cluster);
  {
    std::lock_guard<std::mutex> lock(cluster.mutex);
    auto it = cluster.cache.find(signature);
    if (it != cluster.cache.end()) {
      *executable = it->second;
      return absl::OkStatus();
    }
    if (cluster.refuse_all) {
      *executable = nullptr;  // not cached: a megamorphic cluster's signatures are unbounded
      return absl::OkStatus();
    }
  }

  // Not held across the callback: Python may take long, and other signatures of this
  // cluster must still run. Two launches may compile one signature at once; Python
  // dedupes, and the first result stored wins.
  std::vector<int> dtypes(num_inputs + 1), ranks(num_inputs + 1);
  std::vector<int64_t> dims;
  std::vector<const void*> data(num_inputs + 1);
  for (int i = 0; i < num_inputs; ++i) {
    const Tensor& input = ctx->input(i);
    dtypes[i] = input.dtype();
    ranks[i] = input.dims();
    for (int d = 0; d < input.dims(); ++d) dims.push_back(input.dim_size(d));
    // A resource handle (a variable the cluster binds) has no flat bytes to pass.
    data[i] = tensorflow::DataTypeCanUseMemcpy(input.dtype()) ? input.tensor_data().data()
                                                               : nullptr;
  }
  dims.push_back(0);  // never empty
  CompileRequest request;
  request.num_inputs = num_inputs;
  const int outcome = cluster.callback(&request, num_inputs, dtypes.data(), ranks.data(),
                                       dims.data(), data.data());

  std::lock_guard<std::mutex> lock(cluster.mutex);
  switch (outcome) {
    case kCompiled:
      if (request.executable == nullptr) {
        return absl::InternalError(absl::StrCat("TfxlaLiteLaunch '", key,
                                                "': the compile callback reported success but "
                                                "fulfilled nothing"));
      }
      *executable = cluster.cache.emplace(signature, request.executable).first->second;
      return absl::OkStatus();
    case kRefused: {
      auto [it, inserted] = cluster.cache.emplace(signature, nullptr);
      cluster.refused += inserted ? 1 : 0;
      *executable = it->second;
      return absl::OkStatus();
    }
    case kRefuseAll:
      cluster.refuse_all = true;
      ++cluster.refused;
      *executable = nullptr;
      return absl::OkStatus();
    default:
      return InvalidFor(key, "compiling for these input shapes failed: ",
                        request.error.empty() ? "(no message)" : request.error);
  }
}

// The values a launch reads: each input's tensor, and for a resource input the buffer of
// the variable it names, looked up and locked for the whole launch as TF's XlaLaunch
// locks its variables: in increasing order of their mutexes' addresses (the order TF's
// own multi-variable kernels use), exclusively when the launch writes the variable and
// shared otherwise. Released, in reverse order, when the launch is done.
class BoundInputs {
 public:
  BoundInputs() = default;
  BoundInputs(const BoundInputs&) = delete;
  BoundInputs& operator=(const BoundInputs&) = delete;
  ~BoundInputs() {
    for (auto it = locked_.rbegin(); it != locked_.rend(); ++it) {
      if (it->second) {
        it->first->mu()->unlock();
      } else {
        it->first->mu()->unlock_shared();
      }
    }
  }

  // `written`: the inputs whose variables the launch writes (`variable_writes`).
  absl::Status Bind(OpKernelContext* ctx, const std::vector<int>& written) {
    const int n = ctx->num_inputs();
    values_.resize(n);
    variables_.resize(n);
    std::vector<std::pair<tensorflow::Var*, bool>> order;  // (variable, exclusive)
    for (int i = 0; i < n; ++i) {
      if (ctx->input_dtype(i) != tensorflow::DT_RESOURCE) {
        values_[i] = &ctx->input(i);
        continue;
      }
      TF_RETURN_IF_ERROR(tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, i),
                                                    &variables_[i]));
      const bool writes = std::find(written.begin(), written.end(), i) != written.end();
      order.emplace_back(variables_[i].get(), writes);
    }
    for (const int i : written) {
      if (i < 0 || i >= n || variables_[i] == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "TfxlaLiteLaunch: variable_writes names input ", i, ", not a resource input"));
      }
    }
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return a.first->mu() < b.first->mu();
    });
    for (size_t k = 0; k < order.size(); ++k) {
      if (k > 0 && order[k].first == order[k - 1].first) {
        // One variable behind two handles: a write through one would change what the
        // other reads in the middle of the kernel.
        if (order[k].second || order[k - 1].second) {
          return absl::InvalidArgumentError(
              "TfxlaLiteLaunch: a variable it writes is passed twice");
        }
        continue;
      }
      if (order[k].second) {
        order[k].first->mu()->lock();
      } else {
        order[k].first->mu()->lock_shared();
      }
      locked_.push_back(order[k]);
    }
    for (int i = 0; i < n; ++i) {
      tensorflow::Var* variable = variables_[i].get();
      if (variable == nullptr) continue;
      if (!variable->is_initialized) {
        return absl::FailedPreconditionError(absl::StrCat(
            "TfxlaLiteLaunch: the variable of input ", i, " (",
            tensorflow::HandleFromInput(ctx, i).name(), ") is not initialized"));
      }
      values_[i] = variable->tensor();
    }
    return absl::OkStatus();
  }

  // Input i's value: its tensor, or its variable's.
  const Tensor& value(int i) const { return *values_[i]; }
  // Input i's variable (locked), or nullptr when it is not a resource input.
  tensorflow::Var* variable(int i) const { return variables_[i].get(); }

 private:
  std::vector<const Tensor*> values_;
  std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>> variables_;
  std::vector<std::pair<tensorflow::Var*, bool>> locked_;
};

class LaunchOp : public OpKernel {
 public:
  explicit LaunchOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("key", &key_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tout", &output_dtypes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_shapes", &output_shapes_));
    if (ctx->HasAttr("variable_writes")) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("variable_writes", &variable_writes_));
    }
    OP_REQUIRES(ctx, output_shapes_.size() == output_dtypes_.size(),
                Invalid(output_dtypes_.size(), " output dtypes but ", output_shapes_.size(),
                        " output shapes"));
  }

  void Compute(OpKernelContext* ctx) override {
    // Looked up on every launch, not once at construction: a kernel may be built
    // before its executable is registered, and a key may be re-registered.
    std::shared_ptr<const Executable> executable = Registry::Get().Find(key_);
    BoundInputs inputs;
    OP_REQUIRES_OK(ctx, inputs.Bind(ctx, variable_writes_));
    if (executable != nullptr) {
      OP_REQUIRES_OK(ctx, CheckSignature(ctx, *executable, inputs));
    } else {
      std::shared_ptr<DynamicCluster> cluster = Registry::Get().FindDynamic(key_);
      OP_REQUIRES(ctx, cluster != nullptr,
                  absl::NotFoundError(absl::StrCat(
                      "TfxlaLiteLaunch: no executable is registered under key '", key_,
                      "' in this process (was it unregistered, or compiled in another "
                      "process?)")));
      OP_REQUIRES_OK(ctx, Specialize(ctx, key_, *cluster, &executable));
      OP_REQUIRES(ctx, executable != nullptr,
                  Invalid("no executable for input shapes ", InputShapes(ctx),
                          " (the cluster refused them) and this node has no fallback"));
      OP_REQUIRES_OK(ctx, CheckOutputs(*executable));
    }
    Run(ctx, *executable, inputs);
  }

 private:
  void Run(OpKernelContext* ctx, const Executable& executable, const BoundInputs& inputs) {
    const auto begun = std::chrono::steady_clock::now();
    const std::optional<std::vector<int>>& selected = executable.param_inputs;
    const int num_params =
        selected.has_value() ? static_cast<int>(selected->size()) : ctx->num_inputs();
    const int num_node_outputs = ctx->num_outputs();
    const int num_outputs = num_node_outputs + static_cast<int>(variable_writes_.size());
    std::vector<Tensor> holders;  // aligned copies; they live until the call returns
    holders.reserve(num_params + num_outputs);

    std::vector<void*> params(num_params);
    std::vector<bool> copied(num_params, false);
    for (int p = 0; p < num_params; ++p) {
      const Tensor& input = inputs.value(selected.has_value() ? (*selected)[p] : p);
      params[p] = DataOf(input);
      if (input.NumElements() > 0 && !IsAligned(params[p])) {
        copied[p] = true;
        // TF's allocator aligns to 64 bytes, but a zero-copy slice of another tensor
        // may not be; copy rather than hand the kernel a misaligned buffer.
        char* aligned = nullptr;
        holders.emplace_back();
        OP_REQUIRES_OK(ctx, AllocateAligned(ctx, input.TotalBytes(), &holders.back(), &aligned));
        std::memcpy(aligned, params[p], input.TotalBytes());
        params[p] = aligned;
      }
    }

    std::vector<void*> outputs(num_outputs);
    std::vector<std::pair<int, char*>> copy_back;  // (output index, aligned buffer)
    // New values of the written variables that could not be written in place.
    std::vector<std::optional<Tensor>> stores(variable_writes_.size());
    for (int j = num_node_outputs; j < num_outputs; ++j) {
      const int input_index = variable_writes_[j - num_node_outputs];
      tensorflow::Var* variable = inputs.variable(input_index);
      const TensorSpec& spec = executable.outputs[j];
      Tensor* current = variable->tensor();
      // XLA's input/output aliasing: the kernel writes over the variable's own buffer
      // when the executable allows it (that parameter is read only by the kernel making
      // this output) and no other tensor holds the buffer (TF's RefCountIsOne, as in
      // PrepareToUpdateVariable); else into a new buffer, stored after the kernel ran.
      const int from = j < static_cast<int>(executable.forward_from.size())
                           ? executable.forward_from[j] : -1;
      const int param = selected.has_value() ? -1 : input_index;
      if (from >= 0 && from == param && !copied[from] && current->RefCountIsOne() &&
          current->dtype() == spec.dtype && current->shape() == spec.shape) {
        outputs[j] = DataOf(*current);
        variables_in_place.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      Tensor& value = stores[j - num_node_outputs].emplace();
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(spec.dtype, spec.shape, &value));
      outputs[j] = DataOf(value);
      if (value.NumElements() > 0 && !IsAligned(outputs[j])) {
        holders.emplace_back();
        char* aligned = nullptr;
        OP_REQUIRES_OK(ctx, AllocateAligned(ctx, value.TotalBytes(), &holders.back(), &aligned));
        copy_back.emplace_back(j, aligned);
        outputs[j] = aligned;
      }
    }
    for (int j = 0; j < num_node_outputs; ++j) {
      Tensor* output = nullptr;
      // An input TF no longer needs becomes the output when the executable allows it
      // (the input's buffer, not an aligned copy of it).
      const int from = j < static_cast<int>(executable.forward_from.size())
                           ? executable.forward_from[j] : -1;
      const TensorSpec& spec = executable.outputs[j];
      if (from >= 0 && from < num_params && !copied[from] &&
          inputs.variable(selected.has_value() ? (*selected)[from] : from) == nullptr) {
        const int input_index = selected.has_value() ? (*selected)[from] : from;
        if (ctx->forward_input_to_output_with_shape(input_index, j, spec.shape, &output)) {
          outputs_forwarded.fetch_add(1, std::memory_order_relaxed);
        }
      }
      // Else memory that is already mapped (the output pool), else TF's allocator.
      if (output == nullptr) output = PooledOutput(ctx, j, spec.dtype, spec.shape);
      if (output == nullptr) OP_REQUIRES_OK(ctx, ctx->allocate_output(j, spec.shape, &output));
      outputs[j] = DataOf(*output);
      if (output->NumElements() > 0 && !IsAligned(outputs[j])) {
        char* aligned = nullptr;
        holders.emplace_back();
        OP_REQUIRES_OK(ctx,
                       AllocateAligned(ctx, output->TotalBytes(), &holders.back(), &aligned));
        copy_back.emplace_back(j, aligned);
        outputs[j] = aligned;
      }
    }

    std::optional<ArenaLease> arena;
    char* temp = nullptr;
    if (executable.temp_bytes > 0) {
      arena.emplace(arenas_, executable.temp_bytes);
      temp = arena->data();
      OP_REQUIRES(ctx, temp != nullptr,
                  absl::ResourceExhaustedError(absl::StrCat(
                      "TfxlaLiteLaunch '", key_, "': cannot allocate a temp arena of ",
                      executable.temp_bytes, " bytes")));
    }

    {
      // Parallel kernels run their parts on this op's intra-op pool (tfxla_lite_parallel).
      ScopedPool pool(ctx->device()->tensorflow_cpu_worker_threads()->workers);
      const auto entered = std::chrono::steady_clock::now();
      executable.entry(params.data(), outputs.data(), temp);
      const auto returned = std::chrono::steady_clock::now();
      launches_timed.fetch_add(1, std::memory_order_relaxed);
      launch_prologue_ns.fetch_add(
          std::chrono::duration_cast<std::chrono::nanoseconds>(entered - begun).count(),
          std::memory_order_relaxed);
      launch_entry_ns.fetch_add(
          std::chrono::duration_cast<std::chrono::nanoseconds>(returned - entered).count(),
          std::memory_order_relaxed);
    }

    for (const auto& [j, aligned] : copy_back) {
      Tensor* output = j < num_node_outputs ? ctx->mutable_output(j)
                                            : &*stores[j - num_node_outputs];
      std::memcpy(DataOf(*output), aligned, output->TotalBytes());
    }
    for (size_t k = 0; k < stores.size(); ++k) {
      if (!stores[k].has_value()) continue;  // written in place
      // The old buffer stays with whoever still holds it (copy-on-write).
      *inputs.variable(variable_writes_[k])->tensor() = std::move(*stores[k]);
    }
  }

  template <typename... Args>
  absl::Status Invalid(const Args&... args) const {
    return InvalidFor(key_, args...);
  }

  static std::string InputShapes(OpKernelContext* ctx) {
    std::string text;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      absl::StrAppend(&text, i == 0 ? "" : ", ", ctx->input(i).shape().DebugString());
    }
    return text;
  }

  // The executable reads its inputs blindly: every mismatch must be an error here.
  absl::Status CheckSignature(OpKernelContext* ctx, const Executable& executable,
                              const BoundInputs& inputs) const {
    if (ctx->num_inputs() != static_cast<int>(executable.inputs.size())) {
      return Invalid("got ", ctx->num_inputs(), " inputs, but the executable takes ",
                     executable.inputs.size());
    }
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const Tensor& input = inputs.value(i);
      const TensorSpec& spec = executable.inputs[i];
      if (input.dtype() != spec.dtype) {
        return Invalid("input ", i, " has dtype ", DataTypeString(input.dtype()),
                       " but the executable expects ", DataTypeString(spec.dtype));
      }
      if (input.shape() != spec.shape) {
        return Invalid("input ", i, " has shape ", input.shape().DebugString(),
                       " but the executable expects ", spec.shape.DebugString());
      }
    }
    return CheckOutputs(executable);
  }

  absl::Status CheckOutputs(const Executable& executable) const {
    if (output_dtypes_.size() + variable_writes_.size() != executable.outputs.size()) {
      return Invalid("the node has ", output_dtypes_.size(), " outputs and ",
                     variable_writes_.size(), " variable writes, but the executable has ",
                     executable.outputs.size(), " outputs");
    }
    for (size_t j = 0; j < output_dtypes_.size(); ++j) {
      const TensorSpec& spec = executable.outputs[j];
      if (output_dtypes_[j] != spec.dtype) {
        return Invalid("output ", j, " is declared ", DataTypeString(output_dtypes_[j]),
                       " but the executable produces ", DataTypeString(spec.dtype));
      }
      // The graph's shape inference used output_shapes; it must agree with what runs.
      if (!output_shapes_[j].IsCompatibleWith(spec.shape)) {
        return Invalid("output ", j, " is declared with shape ",
                       output_shapes_[j].DebugString(), " but the executable produces ",
                       spec.shape.DebugString());
      }
    }
    return absl::OkStatus();
  }

  std::string key_;
  tensorflow::DataTypeVector output_dtypes_;
  std::vector<PartialTensorShape> output_shapes_;
  // The resource inputs whose variables take the executable's outputs after the node's
  // own, in order.
  std::vector<int> variable_writes_;
  ArenaPool arenas_;
};

// TfxlaLiteCompile: true when the cluster under `key` has an executable for these
// inputs (compiling it now if needed), false when the fallback must run.
class CompileOp : public OpKernel {
 public:
  explicit CompileOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("key", &key_));
  }

  void Compute(OpKernelContext* ctx) override {
    bool compiled = Registry::Get().Find(key_) != nullptr;
    if (!compiled) {
      std::shared_ptr<DynamicCluster> cluster = Registry::Get().FindDynamic(key_);
      OP_REQUIRES(ctx, cluster != nullptr,
                  absl::NotFoundError(absl::StrCat(
                      "TfxlaLiteCompile: no cluster is registered under key '", key_,
                      "' in this process")));
      std::shared_ptr<const Executable> executable;
      OP_REQUIRES_OK(ctx, Specialize(ctx, key_, *cluster, &executable));
      compiled = executable != nullptr;
    }
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &output));
    output->scalar<bool>()() = compiled;
  }

 private:
  std::string key_;
};

// Whether a temp arena of `bytes` can be asked for: the pool rounds it up to kAlignment
// in int64, which must not overflow.
bool IsValidTempBytes(int64_t bytes) {
  return bytes >= 0 &&
         bytes <= std::numeric_limits<int64_t>::max() - static_cast<int64_t>(kAlignment);
}

// Whether one spec of the extern "C" interface is usable: a real, non-reference dtype,
// a rank of at least 0, and dims to read when the rank is positive.
bool IsValidSpec(int dtype, int rank, const int64_t* dims_flat) {
  if (!tensorflow::DataType_IsValid(dtype) || dtype == tensorflow::DT_INVALID ||
      tensorflow::IsRefType(static_cast<DataType>(dtype))) {
    return false;
  }
  return rank >= 0 && (rank == 0 || dims_flat != nullptr);
}

// Reads `count` specs from the flat arrays of the extern "C" interface.
bool ReadSpecs(int count, const int* dtypes, const int* ranks, const int64_t* dims_flat,
               std::vector<TensorSpec>* specs) {
  if (count < 0 || (count > 0 && (dtypes == nullptr || ranks == nullptr))) return false;
  specs->reserve(count);
  int64_t offset = 0;
  for (int i = 0; i < count; ++i) {
    const int dtype = dtypes[i];
    if (!IsValidSpec(dtype, ranks[i], dims_flat)) return false;
    TensorShape shape;
    absl::Span<const int64_t> dims(ranks[i] > 0 ? dims_flat + offset : nullptr, ranks[i]);
    if (!TensorShape::BuildTensorShape(dims, &shape).ok()) return false;
    offset += ranks[i];
    specs->push_back({static_cast<DataType>(dtype), std::move(shape)});
  }
  return true;
}

// Reads `count` partial shapes (-1: unknown dim) of dtypes from the extern "C" arrays.
bool ReadPartialSpecs(int count, const int* dtypes, const int* ranks, const int64_t* dims_flat,
                      std::vector<DataType>* out_dtypes, std::vector<PartialTensorShape>* shapes) {
  if (count < 0 || (count > 0 && (dtypes == nullptr || ranks == nullptr))) return false;
  int64_t offset = 0;
  for (int i = 0; i < count; ++i) {
    const int dtype = dtypes[i];
    if (!IsValidSpec(dtype, ranks[i], dims_flat)) return false;
    PartialTensorShape shape;
    absl::Span<const int64_t> dims(ranks[i] > 0 ? dims_flat + offset : nullptr, ranks[i]);
    if (!PartialTensorShape::BuildPartialTensorShape(dims, &shape).ok()) return false;
    offset += ranks[i];
    out_dtypes->push_back(static_cast<DataType>(dtype));
    shapes->push_back(std::move(shape));
  }
  return true;
}

}  // namespace
}  // namespace tfxla_lite

REGISTER_OP("TfxlaLiteCompile")
    .Input("args: Tin")
    .Output("compiled: bool")
    .Attr("key: string")
    .Attr("Tin: list(type) >= 0")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
True when the dynamic cluster registered under `key` has (or now compiles) an
executable for these inputs; false when its original TF ops must run instead.
)doc");

REGISTER_KERNEL_BUILDER(Name("TfxlaLiteCompile").Device(tensorflow::DEVICE_CPU),
                        tfxla_lite::CompileOp);

namespace {
// The launch ops' outputs take the shapes of their `output_shapes` attribute.
absl::Status LaunchShapes(tensorflow::shape_inference::InferenceContext* c) {
  std::vector<tensorflow::PartialTensorShape> shapes;
  TF_RETURN_IF_ERROR(c->GetAttr("output_shapes", &shapes));
  if (static_cast<int>(shapes.size()) != c->num_outputs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TfxlaLiteLaunch: ", c->num_outputs(), " outputs but ", shapes.size(),
        " output_shapes"));
  }
  for (int j = 0; j < c->num_outputs(); ++j) {
    tensorflow::shape_inference::ShapeHandle handle;
    TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[j], &handle));
    c->set_output(j, handle);
  }
  return absl::OkStatus();
}
}  // namespace

REGISTER_OP("TfxlaLiteLaunch")
    .Input("args: Tin")
    .Output("results: Tout")
    .Attr("key: string")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 0")
    .Attr("output_shapes: list(shape) >= 0")
    .Attr("variable_writes: list(int) = []")
    .SetShapeFn(LaunchShapes)
    .Doc(R"doc(
Runs a tfxla-lite compiled cluster registered in this process under `key`.
)doc");

// The same launch for a cluster that reads or writes variables: stateful, as XlaLaunch,
// so that TF runs it when no one reads its results and orders a function holding it
// with the caller's writes. Clusters that only compute stay on the stateless op, which
// TF may prune.
REGISTER_OP("TfxlaLiteVariableLaunch")
    .Input("args: Tin")
    .Output("results: Tout")
    .Attr("key: string")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 0")
    .Attr("output_shapes: list(shape) >= 0")
    .Attr("variable_writes: list(int) = []")
    .SetIsStateful()
    .SetShapeFn(LaunchShapes)
    .Doc(R"doc(
Runs a tfxla-lite compiled cluster registered under `key` that writes the variables of
the resource inputs `variable_writes`.
)doc");

REGISTER_KERNEL_BUILDER(Name("TfxlaLiteLaunch").Device(tensorflow::DEVICE_CPU),
                        tfxla_lite::LaunchOp);
REGISTER_KERNEL_BUILDER(Name("TfxlaLiteVariableLaunch").Device(tensorflow::DEVICE_CPU),
                        tfxla_lite::LaunchOp);

#define TFXLA_LITE_EXPORT extern "C" __attribute__((visibility("default")))

// Returns 0 when `key` is new, 1 when it replaced an executable, -1 on bad arguments.
// `forward_from[j]` (n_out entries, or NULL for none): the input whose buffer output j
// may take over when TF no longer needs it, or -1.
// `owner` (tfxla_lite_register_owned; 0: none) is reported by tfxla_lite_take_released
// once the executable is unregistered or replaced and no launch runs it any more.
TFXLA_LITE_EXPORT int tfxla_lite_register_owned(int64_t owner, const char* key, void* fn,
                                                int64_t temp_bytes, int n_in,
                                                const int* in_dtypes, const int* in_ranks,
                                                const int64_t* in_dims_flat, int n_out,
                                                const int* out_dtypes, const int* out_ranks,
                                                const int64_t* out_dims_flat,
                                                const int* forward_from) {
  if (key == nullptr || fn == nullptr || !tfxla_lite::IsValidTempBytes(temp_bytes)) return -1;
  try {
    auto executable = std::make_shared<tfxla_lite::Executable>();
    executable->entry = reinterpret_cast<tfxla_lite::EntryFunction>(fn);
    executable->temp_bytes = temp_bytes;
    if (!tfxla_lite::ReadSpecs(n_in, in_dtypes, in_ranks, in_dims_flat, &executable->inputs) ||
        !tfxla_lite::ReadSpecs(n_out, out_dtypes, out_ranks, out_dims_flat,
                               &executable->outputs)) {
      return -1;
    }
    if (forward_from != nullptr) {
      for (int j = 0; j < n_out; ++j) {
        const int from = forward_from[j];
        if (from < -1 || from >= n_in) return -1;
        // Same dtype and shape, or TF would refuse (and the kernel would not fit).
        if (from >= 0 && (executable->inputs[from].dtype != executable->outputs[j].dtype ||
                          executable->inputs[from].shape != executable->outputs[j].shape)) {
          return -1;
        }
        executable->forward_from.push_back(from);
      }
    }
    // Last: a refused registration must not report its owner as released.
    executable->owner = tfxla_lite::MakeOwnerToken(owner);
    return tfxla_lite::Registry::Get().Put(key, std::move(executable)) ? 1 : 0;
  } catch (...) {
    return -1;
  }
}

TFXLA_LITE_EXPORT int tfxla_lite_register(const char* key, void* fn, int64_t temp_bytes, int n_in,
                                          const int* in_dtypes, const int* in_ranks,
                                          const int64_t* in_dims_flat, int n_out,
                                          const int* out_dtypes, const int* out_ranks,
                                          const int64_t* out_dims_flat,
                                          const int* forward_from) {
  return tfxla_lite_register_owned(0, key, fn, temp_bytes, n_in, in_dtypes, in_ranks,
                                   in_dims_flat, n_out, out_dtypes, out_ranks, out_dims_flat,
                                   forward_from);
}

// Registers a dynamic cluster: `callback` compiles it for each new input signature.
// `value_keyed[i]` != 0 puts input i's bytes into the signature. Returns 0 when `key`
// is new, 1 when it replaced a dynamic cluster, -1 on bad arguments.
// `owner` (0: none) is reported by tfxla_lite_take_released once the cluster is
// unregistered or replaced and no launch holds it any more.
TFXLA_LITE_EXPORT int tfxla_lite_register_dynamic(const char* key, void* callback, int n_in,
                                                  const int* in_dtypes, const int* in_ranks,
                                                  const int64_t* in_dims_flat,
                                                  const int* value_keyed, int64_t owner) {
  if (key == nullptr || callback == nullptr || (n_in > 0 && value_keyed == nullptr)) return -1;
  try {
    auto cluster = std::make_shared<tfxla_lite::DynamicCluster>();
    cluster->callback = reinterpret_cast<tfxla_lite::CompileCallback>(callback);
    if (!tfxla_lite::ReadPartialSpecs(n_in, in_dtypes, in_ranks, in_dims_flat,
                                      &cluster->input_dtypes, &cluster->input_shapes)) {
      return -1;
    }
    for (int i = 0; i < n_in; ++i) cluster->value_keyed.push_back(value_keyed[i] != 0);
    cluster->owner = tfxla_lite::MakeOwnerToken(owner);
    return tfxla_lite::Registry::Get().PutDynamic(key, std::move(cluster)) ? 1 : 0;
  } catch (...) {
    return -1;
  }
}

// Called by a compile callback: the executable for the request's signature.
// `param_inputs` lists the node inputs that are entry's params. Returns 0, or -1 on
// bad arguments (the callback should then report kFailed).
// `owner` (0: none) is reported by tfxla_lite_take_released once the cluster that
// caches the executable is gone and no launch runs it any more.
TFXLA_LITE_EXPORT int tfxla_lite_fulfill(void* request, void* fn, int64_t temp_bytes,
                                         int n_params, const int* param_inputs, int n_out,
                                         const int* out_dtypes, const int* out_ranks,
                                         const int64_t* out_dims_flat, int64_t owner) {
  if (request == nullptr || fn == nullptr || !tfxla_lite::IsValidTempBytes(temp_bytes) ||
      n_params < 0 || (n_params > 0 && param_inputs == nullptr)) {
    return -1;
  }
  auto* pending = static_cast<tfxla_lite::CompileRequest*>(request);
  for (int p = 0; p < n_params; ++p) {
    if (param_inputs[p] < 0 || param_inputs[p] >= pending->num_inputs) return -1;
  }
  try {
    auto executable = std::make_shared<tfxla_lite::Executable>();
    executable->entry = reinterpret_cast<tfxla_lite::EntryFunction>(fn);
    executable->temp_bytes = temp_bytes;
    if (!tfxla_lite::ReadSpecs(n_out, out_dtypes, out_ranks, out_dims_flat,
                               &executable->outputs)) {
      return -1;
    }
    executable->param_inputs.emplace(param_inputs, param_inputs + n_params);
    executable->owner = tfxla_lite::MakeOwnerToken(owner);
    pending->executable = std::move(executable);
    return 0;
  } catch (...) {
    return -1;
  }
}

// Called by a compile callback before it returns kFailed: the error message.
TFXLA_LITE_EXPORT void tfxla_lite_fail(void* request, const char* message) {
  if (request != nullptr && message != nullptr) {
    static_cast<tfxla_lite::CompileRequest*>(request)->error = message;
  }
}

// Counts of a dynamic cluster: signatures compiled and refused, and whether it
// refuses every new one. Returns 0, or -1 when `key` is no dynamic cluster.
TFXLA_LITE_EXPORT int tfxla_lite_dynamic_stats(const char* key, int64_t* compiled,
                                               int64_t* refused, int* refuse_all) {
  if (key == nullptr) return -1;
  std::shared_ptr<tfxla_lite::DynamicCluster> cluster =
      tfxla_lite::Registry::Get().FindDynamic(key);
  if (cluster == nullptr) return -1;
  std::lock_guard<std::mutex> lock(cluster->mutex);
  if (compiled != nullptr) {
    *compiled = 0;
    for (const auto& entry : cluster->cache) *compiled += entry.second != nullptr ? 1 : 0;
  }
  if (refused != nullptr) *refused = cluster->refused;
  if (refuse_all != nullptr) *refuse_all = cluster->refuse_all ? 1 : 0;
  return 0;
}

// Returns 1 when `key` was registered (and is now removed), 0 otherwise.
TFXLA_LITE_EXPORT int tfxla_lite_unregister(const char* key) {
  if (key == nullptr) return 0;
  return tfxla_lite::Registry::Get().Erase(key) ? 1 : 0;
}

// Moves up to `capacity` owner tokens whose holders are all gone into `out`; returns
// how many. Python calls it until it returns less than `capacity`.
TFXLA_LITE_EXPORT int64_t tfxla_lite_take_released(int64_t* out, int64_t capacity) {
  if (out == nullptr || capacity <= 0) return 0;
  tfxla_lite::ReleasedOwners& released = tfxla_lite::Released();
  std::lock_guard<std::mutex> lock(released.mutex);
  const int64_t count = std::min<int64_t>(capacity, released.ids.size());
  std::copy(released.ids.end() - count, released.ids.end(), out);
  released.ids.resize(released.ids.size() - count);
  return count;
}

TFXLA_LITE_EXPORT int64_t tfxla_lite_registry_size() {
  return tfxla_lite::Registry::Get().Size();
}

TFXLA_LITE_EXPORT int tfxla_lite_abi_version() { return tfxla_lite::kAbiVersion; }

// Temp arenas the launch nodes of this process allocated, and launches that reused one.
TFXLA_LITE_EXPORT void tfxla_lite_arena_stats(int64_t* allocated, int64_t* reused) {
  if (allocated != nullptr) *allocated = tfxla_lite::arenas_allocated.load();
  if (reused != nullptr) *reused = tfxla_lite::arenas_reused.load();
}

// Outputs that took over an input's buffer, over all launches of this process.
TFXLA_LITE_EXPORT int64_t tfxla_lite_variables_in_place() {
  return tfxla_lite::variables_in_place.load(std::memory_order_relaxed);
}

TFXLA_LITE_EXPORT int64_t tfxla_lite_forwarded_outputs() {
  return tfxla_lite::outputs_forwarded.load();
}

// The parallel-region runtime of generated kernels: libgomp's GOMP_parallel signature
// (see "Parallel kernels on TF's intra-op thread pool" above).
TFXLA_LITE_EXPORT void tfxla_lite_parallel(void (*task)(void*), void* data, unsigned threads,
                                           unsigned flags) {
  tfxla_lite::RunParallel(task, data, threads, flags);
}

// Chooses what parallel regions run on from the next region on: 0 TF's intra-op pool
// with closures per region, 3 the pool with a team per launch (libgomp outside a launch
// for both), 1 libgomp, 2 the caller alone. Returns the previous choice, or -1 for an
// unknown one (nothing changes).
TFXLA_LITE_EXPORT int tfxla_lite_set_parallel_runtime(int runtime) {
  if (runtime < tfxla_lite::kTfPool || runtime > tfxla_lite::kTfTeam) return -1;
  return tfxla_lite::parallel_runtime.exchange(runtime, std::memory_order_relaxed);
}

// The runtime parallel regions use now (see tfxla_lite_set_parallel_runtime).
TFXLA_LITE_EXPORT int tfxla_lite_parallel_runtime() {
  return tfxla_lite::parallel_runtime.load(std::memory_order_relaxed);
}

// Nanoseconds summed over the pool regions since the process started: the callers in
// their own task, the callers waiting for entered workers, and the closures' delay from
// Schedule to their start; and the callers' time in Schedule.
TFXLA_LITE_EXPORT void tfxla_lite_parallel_timing(int64_t* caller_task, int64_t* caller_join,
                                                  int64_t* worker_start,
                                                  int64_t* caller_schedule) {
  if (caller_schedule != nullptr) *caller_schedule = tfxla_lite::caller_schedule_ns.load();
  if (caller_task != nullptr) *caller_task = tfxla_lite::caller_task_ns.load();
  if (caller_join != nullptr) *caller_join = tfxla_lite::caller_join_ns.load();
  if (worker_start != nullptr) *worker_start = tfxla_lite::worker_start_ns.load();
}

// Launches since the process started, and nanoseconds summed over them: Run's prologue
// (output allocation, temp arena) and the executable's entry.
TFXLA_LITE_EXPORT void tfxla_lite_launch_timing(int64_t* launches, int64_t* prologue,
                                                int64_t* entry) {
  if (launches != nullptr) *launches = tfxla_lite::launches_timed.load();
  if (prologue != nullptr) *prologue = tfxla_lite::launch_prologue_ns.load();
  if (entry != nullptr) *entry = tfxla_lite::launch_entry_ns.load();
}

// Sets how long a pool region's caller spins for its last workers before it sleeps, in
// nanoseconds (negative: unchanged); returns the previous value.
TFXLA_LITE_EXPORT int64_t tfxla_lite_set_join_spin(int64_t nanoseconds) {
  if (nanoseconds < 0) return tfxla_lite::join_spin_ns.load();
  return tfxla_lite::join_spin_ns.exchange(nanoseconds, std::memory_order_relaxed);
}

// Sets how long a team helper waits for its launch's next region before it leaves the
// pool thread, in nanoseconds (negative: unchanged); returns the previous value.
TFXLA_LITE_EXPORT int64_t tfxla_lite_set_team_idle(int64_t nanoseconds) {
  if (nanoseconds < 0) return tfxla_lite::team_idle_ns.load();
  return tfxla_lite::team_idle_ns.exchange(nanoseconds, std::memory_order_relaxed);
}

// Regions team helpers entered since the process started (one helper, several regions).
TFXLA_LITE_EXPORT int64_t tfxla_lite_team_regions_entered() {
  return tfxla_lite::team_regions_entered.load();
}

// Counts since the process started: regions run on TF's pool, on libgomp, and by the
// caller alone; the pool closures scheduled, those that ran the task, and those that
// found it done (scheduled = entered + late once the pool has run them all).
TFXLA_LITE_EXPORT void tfxla_lite_parallel_stats(int64_t* on_pool, int64_t* on_openmp,
                                                 int64_t* serial, int64_t* scheduled,
                                                 int64_t* entered, int64_t* late) {
  if (on_pool != nullptr) *on_pool = tfxla_lite::regions_on_pool.load();
  if (on_openmp != nullptr) *on_openmp = tfxla_lite::regions_on_openmp.load();
  if (serial != nullptr) *serial = tfxla_lite::regions_serial.load();
  if (scheduled != nullptr) *scheduled = tfxla_lite::workers_scheduled.load();
  if (entered != nullptr) *entered = tfxla_lite::workers_entered.load();
  if (late != nullptr) *late = tfxla_lite::workers_late.load();
}

// Configures the output pool from the next output on: `enabled` 1 takes large outputs
// from the pool, 0 leaves every output to TF's allocator; `cap_bytes` bounds the idle
// blocks (0: each block is unmapped as it returns), trimming them to it now; `huge_pages`
// 1 advises new blocks of 2 MB and up for transparent huge pages. A negative argument
// leaves its setting unchanged.
TFXLA_LITE_EXPORT void tfxla_lite_set_output_pool(int enabled, int64_t cap_bytes,
                                                  int huge_pages) {
  tfxla_lite::OutputPool& pool = tfxla_lite::OutputPool::Get();
  if (enabled >= 0) pool.enabled.store(enabled != 0, std::memory_order_relaxed);
  if (huge_pages >= 0) pool.huge_pages.store(huge_pages != 0, std::memory_order_relaxed);
  if (cap_bytes >= 0) pool.SetCap(cap_bytes);
}

// Releases the oldest idle blocks of the output pool until at most `bytes` stay idle.
TFXLA_LITE_EXPORT void tfxla_lite_trim_output_pool(int64_t bytes) {
  tfxla_lite::OutputPool::Get().Trim(std::max<int64_t>(bytes, 0));
}

// The output pool now: counts since the process started (outputs given an idle block, a
// new block, or left to TF's allocator although large; blocks returned and unmapped),
// then the cap, the bytes idle, the peak of idle bytes (since the last reset), the bytes
// held by live tensors, the idle blocks, and the settings (enabled, huge pages). `values`
// holds 12 entries. `reset_peak` != 0 restarts the peak from the bytes idle now.
TFXLA_LITE_EXPORT void tfxla_lite_output_pool_stats(int64_t* values, int reset_peak) {
  tfxla_lite::OutputPool& pool = tfxla_lite::OutputPool::Get();
  values[0] = tfxla_lite::pool_hits.load();
  values[1] = tfxla_lite::pool_misses.load();
  values[2] = tfxla_lite::pool_bypassed.load();
  values[3] = tfxla_lite::pool_returned.load();
  values[4] = tfxla_lite::pool_released.load();
  pool.Read(&values[5], &values[6], &values[7], &values[8], &values[9]);
  values[10] = pool.enabled.load() ? 1 : 0;
  values[11] = pool.huge_pages.load() ? 1 : 0;
  if (reset_peak != 0) pool.ResetPeak();
}
