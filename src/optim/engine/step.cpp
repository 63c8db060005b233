// The step engine's entry (step.h): the device's step for the slots, and the master-weights path
// for float32 master gradients, which runs the rule on the master copies as float32 parameters.
#include "optim/engine/step.h"

#include <ATen/ATen.h>

namespace amp::optim::detail {

void run_step(size_t rule, const std::vector<StepSlot>& slots, const void* hyper,
              const StepArgs& args) {
  std::vector<StepSlot> direct, through_master;
  for (const StepSlot& slot : slots) {
    (slot.float32_grad.defined() ? through_master : direct).push_back(slot);
  }
  if (!direct.empty()) rule_step[direct[0].param.device().type()](rule, direct, hyper, args);
  if (!through_master.empty()) {
    std::vector<StepSlot> float32 = through_master;
    for (StepSlot& slot : float32) {
      slot.param = slot.master;
      slot.grad = slot.float32_grad;
      slot.master = at::Tensor();
      slot.comp = at::Tensor();
    }
    StepArgs float32_args = args;
    float32_args.write_back = WriteBack::kRoundNearest;
    rule_step[float32[0].param.device().type()](rule, float32, hyper, float32_args);
    for (const StepSlot& slot : through_master) {
      const at::Tensor rounded = slot.master.to(slot.param.scalar_type());
      // A skipped step leaves the parameter as it is, as the write-back would.
      slot.param.copy_(args.found_inf.defined()
                           ? at::where(args.found_inf.ne(0), slot.param, rounded)
                           : rounded);
      slot.master.mutable_grad() = at::Tensor();
    }
  }
}

}  // namespace amp::optim::detail
