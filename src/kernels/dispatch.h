// Device dispatch for amp's kernels that are not operators of their own (the optimizers'
// element steps): one entry per device type, the CPU one always there, the CUDA one registered
// by the CUDA glue file when the library is built with CUDA. No stubs: a device without an entry
// gets a sentence. (amp's public ops, amp::non_finite_check_and_unscale_ and friends, are
// dispatcher operators: the PyTorch dispatcher picks their CPU or CUDA kernel by dispatch key.)
#pragma once

#include <atomic>

#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

namespace amp::kernels {

/// `Fn` is a function pointer type. Define one DeviceDispatch per kernel family in a baseline
/// translation unit with its CPU function; the CUDA file registers its function with
/// AMP_REGISTER_CUDA_KERNEL at static initialisation.
template <typename Fn>
class DeviceDispatch {
 public:
  /// `what` names the kernel family in errors ("the low-precision optimizer step").
  constexpr DeviceDispatch(const char* what, Fn cpu) : what_(what), cpu_(cpu), cuda_(nullptr) {}
  DeviceDispatch(const DeviceDispatch&) = delete;
  DeviceDispatch& operator=(const DeviceDispatch&) = delete;

  /// The function for `device`. Throws c10::Error for CUDA in a build without CUDA and for any
  /// other device type.
  Fn operator[](c10::DeviceType device) const {
    if (device == c10::DeviceType::CPU) return cpu_;
    if (device == c10::DeviceType::CUDA) {
      const Fn cuda = cuda_.load(std::memory_order_acquire);
      TORCH_CHECK(cuda != nullptr, "amp: ", what_,
                  " has no CUDA kernel in this build of amp (AMP_WITH_CUDA=OFF); build amp with "
                  "CUDA or keep these tensors on the CPU.");
      return cuda;
    }
    TORCH_CHECK(false, "amp: ", what_, " runs on CPU and CUDA tensors, not on ", device, ".");
  }

  /// Called once, by the CUDA glue file's registrar.
  void register_cuda(Fn cuda) { cuda_.store(cuda, std::memory_order_release); }

 private:
  const char* what_;
  Fn cpu_;
  std::atomic<Fn> cuda_;
};

}  // namespace amp::kernels

/// Registers `fn` as the CUDA entry of `dispatch` when the library is loaded.
#define AMP_REGISTER_CUDA_KERNEL(dispatch, fn)             \
  static const bool amp_cuda_kernel_registered_##fn = [] { \
    (dispatch).register_cuda(fn);                          \
    return true;                                           \
  }()
