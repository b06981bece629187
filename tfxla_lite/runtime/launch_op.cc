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
//   outputs[j] -> output j, preallocated here with its registered shape
//   temp       -> an arena of temp_bytes bytes (NULL when temp_bytes == 0)
// Every non-empty buffer is 64-byte aligned; entry must be reentrant, since TF
// may run several launch nodes, or one node from several threads, at once.

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

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
constexpr int kAbiVersion = 1;
constexpr uintptr_t kAlignment = 64;

using EntryFunction = void (*)(void** params, void** outputs, void* temp);

struct TensorSpec {
  DataType dtype;
  TensorShape shape;
};

struct Executable {
  EntryFunction entry;
  int64_t temp_bytes;
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
};

// Process-wide map from key to executable. Kernels take a shared_ptr under a
// reader lock, so an unregister during a launch never frees the entry that
// launch is reading (the code itself is kept alive by the Python owner).
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

  bool Erase(const std::string& key) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    return executables_.erase(key) > 0;
  }

  int64_t Size() const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return static_cast<int64_t>(executables_.size());
  }

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const Executable>> executables_;
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

class LaunchOp : public OpKernel {
 public:
  explicit LaunchOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("key", &key_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tout", &output_dtypes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_shapes", &output_shapes_));
    OP_REQUIRES(ctx, output_shapes_.size() == output_dtypes_.size(),
                Invalid(output_dtypes_.size(), " output dtypes but ", output_shapes_.size(),
                        " output shapes"));
  }

  void Compute(OpKernelContext* ctx) override {
    // Looked up on every launch, not once at construction: a kernel may be built
    // before its executable is registered, and a key may be re-registered.
    std::shared_ptr<const Executable> executable = Registry::Get().Find(key_);
    OP_REQUIRES(ctx, executable != nullptr,
                absl::NotFoundError(absl::StrCat(
                    "TfxlaLiteLaunch: no executable is registered under key '", key_,
                    "' in this process (was it unregistered, or compiled in another process?)")));
    OP_REQUIRES_OK(ctx, CheckSignature(ctx, *executable));

    const int num_inputs = ctx->num_inputs();
    const int num_outputs = ctx->num_outputs();
    std::vector<Tensor> holders;  // aligned copies; they live until the call returns
    holders.reserve(num_inputs + num_outputs);

    std::vector<void*> params(num_inputs);
    for (int i = 0; i < num_inputs; ++i) {
      const Tensor& input = ctx->input(i);
      params[i] = DataOf(input);
      if (input.NumElements() > 0 && !IsAligned(params[i])) {
        // TF's allocator aligns to 64 bytes, but a zero-copy slice of another tensor
        // may not be; copy rather than hand the kernel a misaligned buffer.
        char* aligned = nullptr;
        holders.emplace_back();
        OP_REQUIRES_OK(ctx, AllocateAligned(ctx, input.TotalBytes(), &holders.back(), &aligned));
        std::memcpy(aligned, params[i], input.TotalBytes());
        params[i] = aligned;
      }
    }

    std::vector<void*> outputs(num_outputs);
    std::vector<std::pair<int, char*>> copy_back;  // (output index, aligned buffer)
    for (int j = 0; j < num_outputs; ++j) {
      Tensor* output = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(j, executable->outputs[j].shape, &output));
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

    Tensor temp_holder;
    char* temp = nullptr;
    if (executable->temp_bytes > 0) {
      OP_REQUIRES_OK(ctx, AllocateAligned(ctx, executable->temp_bytes, &temp_holder, &temp));
    }

    executable->entry(params.data(), outputs.data(), temp);

    for (const auto& [j, aligned] : copy_back) {
      Tensor* output = ctx->mutable_output(j);
      std::memcpy(DataOf(*output), aligned, output->TotalBytes());
    }
  }

 private:
  template <typename... Args>
  absl::Status Invalid(const Args&... args) const {
    return absl::InvalidArgumentError(absl::StrCat("TfxlaLiteLaunch '", key_, "': ", args...));
  }

  // The executable reads its inputs blindly: every mismatch must be an error here.
  absl::Status CheckSignature(OpKernelContext* ctx, const Executable& executable) const {
    if (ctx->num_inputs() != static_cast<int>(executable.inputs.size())) {
      return Invalid("got ", ctx->num_inputs(), " inputs, but the executable takes ",
                     executable.inputs.size());
    }
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const Tensor& input = ctx->input(i);
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
    if (output_dtypes_.size() != executable.outputs.size()) {
      return Invalid("the node has ", output_dtypes_.size(), " outputs, but the executable has ",
                     executable.outputs.size());
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
};

// Reads `count` specs from the flat arrays of the extern "C" interface.
bool ReadSpecs(int count, const int* dtypes, const int* ranks, const int64_t* dims_flat,
               std::vector<TensorSpec>* specs) {
  if (count < 0 || (count > 0 && (dtypes == nullptr || ranks == nullptr))) return false;
  specs->reserve(count);
  int64_t offset = 0;
  for (int i = 0; i < count; ++i) {
    const int dtype = dtypes[i];
    if (!tensorflow::DataType_IsValid(dtype) || dtype == tensorflow::DT_INVALID ||
        tensorflow::IsRefType(static_cast<DataType>(dtype))) {
      return false;
    }
    if (ranks[i] < 0) return false;
    if (ranks[i] > 0 && dims_flat == nullptr) return false;
    TensorShape shape;
    absl::Span<const int64_t> dims(ranks[i] > 0 ? dims_flat + offset : nullptr, ranks[i]);
    if (!TensorShape::BuildTensorShape(dims, &shape).ok()) return false;
    offset += ranks[i];
    specs->push_back({static_cast<DataType>(dtype), std::move(shape)});
  }
  return true;
}

}  // namespace
}  // namespace tfxla_lite

REGISTER_OP("TfxlaLiteLaunch")
    .Input("args: Tin")
    .Output("results: Tout")
    .Attr("key: string")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 0")
    .Attr("output_shapes: list(shape) >= 0")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
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
    })
    .Doc(R"doc(
Runs a tfxla-lite compiled cluster registered in this process under `key`.
)doc");

REGISTER_KERNEL_BUILDER(Name("TfxlaLiteLaunch").Device(tensorflow::DEVICE_CPU),
                        tfxla_lite::LaunchOp);

#define TFXLA_LITE_EXPORT extern "C" __attribute__((visibility("default")))

// Returns 0 when `key` is new, 1 when it replaced an executable, -1 on bad arguments.
TFXLA_LITE_EXPORT int tfxla_lite_register(const char* key, void* fn, int64_t temp_bytes, int n_in,
                                          const int* in_dtypes, const int* in_ranks,
                                          const int64_t* in_dims_flat, int n_out,
                                          const int* out_dtypes, const int* out_ranks,
                                          const int64_t* out_dims_flat) {
  if (key == nullptr || fn == nullptr || temp_bytes < 0) return -1;
  try {
    auto executable = std::make_shared<tfxla_lite::Executable>();
    executable->entry = reinterpret_cast<tfxla_lite::EntryFunction>(fn);
    executable->temp_bytes = temp_bytes;
    if (!tfxla_lite::ReadSpecs(n_in, in_dtypes, in_ranks, in_dims_flat, &executable->inputs) ||
        !tfxla_lite::ReadSpecs(n_out, out_dtypes, out_ranks, out_dims_flat,
                               &executable->outputs)) {
      return -1;
    }
    return tfxla_lite::Registry::Get().Put(key, std::move(executable)) ? 1 : 0;
  } catch (...) {
    return -1;
  }
}

// Returns 1 when `key` was registered (and is now removed), 0 otherwise.
TFXLA_LITE_EXPORT int tfxla_lite_unregister(const char* key) {
  if (key == nullptr) return 0;
  return tfxla_lite::Registry::Get().Erase(key) ? 1 : 0;
}

TFXLA_LITE_EXPORT int64_t tfxla_lite_registry_size() {
  return tfxla_lite::Registry::Get().Size();
}

TFXLA_LITE_EXPORT int tfxla_lite_abi_version() { return tfxla_lite::kAbiVersion; }
