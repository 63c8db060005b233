// amp's comm hooks for DistributedDataParallel: one bucket's all-reduce with the arithmetic of
// Python's default reduction, fp16_compress_hook or bf16_compress_hook, failures as sentences.
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "distributed/ddp_parts.h"

namespace amp::distributed::detail {
namespace {

constexpr const char* kWho = kDdpName;

// One bucket's all-reduce, with Python's arithmetic for each CommHook, and failures rethrown as
// a sentence naming the bucket and the rank.
class AmpCommHook final
    : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  AmpCommHook(c10::intrusive_ptr<c10d::ProcessGroup> group, CommHook kind)
      : CppCommHookInterface(std::move(group)), kind_(kind) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    const int world = state_->getSize();
    at::Tensor buffer = bucket.getBufferRef();
    at::Tensor wire;
    if (kind_ == CommHook::kAllReduce) {
      // DDP without a hook scales each gradient by 1 / world as it enters the bucket; the same
      // product, here on the whole bucket.
      wire = buffer.mul_(1.0 / world);
    } else {
      // Divided in the transfer dtype before the sum, as Python's compression hooks do.
      wire = buffer.to(kind_ == CommHook::kFp16Compress ? at::kHalf : at::kBFloat16).div_(world);
    }
    std::vector<at::Tensor> tensors{wire};
    const std::string what = "the all-reduce of gradient bucket " +
                             std::to_string(bucket.getIndex() + 1) + " (" +
                             std::to_string(buffer.numel()) + " elements)";
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = state_->allreduce(tensors);
    } catch (const c10::Error& error) {
      TORCH_CHECK(false, failure(what, "could not start", "", error.what_without_backtrace()));
    }
    c10::intrusive_ptr<c10::ivalue::Future> sent = work->getFuture();
    // A child of the collective's future (the same devices, so CUDA streams are followed),
    // completed here so that a failure carries the sentence.
    c10::intrusive_ptr<c10::ivalue::Future> result = sent->createInstance(c10::TensorType::get());
    const bool copy_back = !wire.is_same(buffer);
    const std::string failed =
        failure(what, "failed",
                " (a rank died, left, or did not take part within the group's timeout)", "");
    sent->addCallback([result, buffer, wire, copy_back, failed](c10::ivalue::Future& done) mutable {
      // Runs on the backend's thread: nothing may escape, or backward would wait forever.
      try {
        if (done.hasError()) {
          result->setError(std::make_exception_ptr(
              c10::Error(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                         failed + done.tryRetrieveErrorMessage())));
          return;
        }
        if (copy_back) buffer.copy_(wire);
        result->markCompleted(c10::IValue(buffer));
      } catch (...) {
        if (!result->completed()) result->setError(std::current_exception());
      }
    });
    return result;
  }

 private:
  // "<who>: <what> <verb> on rank r of w<why>: <detail>"
  std::string failure(const std::string& what, const std::string& verb, const std::string& why,
                      const std::string& detail) const {
    return std::string(kWho) + ": " + what + " " + verb + " on rank " +
           std::to_string(state_->getRank()) + " of " + std::to_string(state_->getSize()) + why +
           ": " + detail;
  }

  CommHook kind_;
};

}  // namespace

std::unique_ptr<c10d::CommHookInterface> make_comm_hook(
    c10::intrusive_ptr<c10d::ProcessGroup> group, CommHook kind) {
  return std::make_unique<AmpCommHook>(std::move(group), kind);
}

}  // namespace amp::distributed::detail
