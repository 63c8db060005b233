// amp::distributed's process groups: torchrun's environment, the rendezvous store and Gloo
// groups. The only file that includes ProcessGroupGloo.hpp: gloo's own types stay opaque here
// (amp compiles against Debian's gloo headers, LibTorch carries a newer gloo), so nothing but
// the c10d API is used on them.
#include <amp/distributed.h>

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <string>

#include <ATen/Context.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "distributed/collective.h"

namespace amp::distributed {

namespace {

constexpr const char* kLaunchHint =
    "start the program with `torchrun --no-python --nproc-per-node N <program> [args]`, which "
    "sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT";

const char* variable(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// An integer variable in [low, high]; `fallback` when unset and not required.
int64_t integer_variable(const char* name, int64_t low, int64_t high, bool required,
                         int64_t fallback) {
  const char* text = variable(name);
  if (text == nullptr) {
    TORCH_CHECK(!required, "amp::distributed: the environment variable ", name, " is not set; ",
                kLaunchHint, ".");
    return fallback;
  }
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  TORCH_CHECK(errno == 0 && end != text && *end == '\0' && value >= low && value <= high,
              "amp::distributed: the environment variable ", name, "='", text,
              "' is not an integer in [", low, ", ", high, "]; ", kLaunchHint, ".");
  return value;
}

// c10d's message without the C++ backtrace c10::Error appends.
std::string cause(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    return c10_error->what_without_backtrace();
  }
  return error.what();
}

}  // namespace

bool launched_by_torchrun() {
  return variable("RANK") != nullptr && variable("WORLD_SIZE") != nullptr;
}

TorchrunEnv torchrun_env() {
  TorchrunEnv env;
  env.world_size =
      static_cast<int>(integer_variable("WORLD_SIZE", 1, std::numeric_limits<int>::max(), true, 1));
  env.rank = static_cast<int>(integer_variable("RANK", 0, env.world_size - 1, true, 0));
  env.local_rank = static_cast<int>(
      integer_variable("LOCAL_RANK", 0, std::numeric_limits<int>::max(), false, env.rank));
  env.restart_count = static_cast<int>(
      integer_variable("TORCHELASTIC_RESTART_COUNT", 0, std::numeric_limits<int>::max(), false, 0));
  const char* addr = variable("MASTER_ADDR");
  TORCH_CHECK(addr != nullptr,
              "amp::distributed: the environment variable MASTER_ADDR is not "
              "set; ",
              kLaunchHint, ".");
  env.master_addr = addr;
  env.master_port = static_cast<uint16_t>(integer_variable("MASTER_PORT", 1, 65535, true, 0));
  const char* agent = variable("TORCHELASTIC_USE_AGENT_STORE");
  env.agent_store = agent != nullptr && std::string(agent) == "True";
  return env;
}

c10::intrusive_ptr<c10d::Store> torchrun_store(const TorchrunEnv& env,
                                               std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = env.master_port;
  // Python's rule (torch.distributed.rendezvous): with torchrun's agent store every rank is a
  // client of the agent's server; otherwise rank 0 serves and waits for the others.
  options.isServer = !env.agent_store && env.rank == 0;
  options.numWorkers = env.agent_store ? std::nullopt : std::optional<size_t>(env.world_size);
  // Every instance counts itself in while rank 0 waits for the count (Python's
  // wait_for_workers=True); with the agent store nobody counts.
  options.waitWorkers = !env.agent_store;
  options.multiTenant = true;
  options.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& error) {
    TORCH_CHECK(false, "amp::distributed: rank ", env.rank, " of ", env.world_size, " could not ",
                options.isServer ? "host" : "reach", " the rendezvous store at ", env.master_addr,
                ":", env.master_port, " within ", timeout.count(),
                " ms (GroupOptions::timeout). Check that all WORLD_SIZE processes started and "
                "that MASTER_ADDR/MASTER_PORT are reachable. c10d said: ",
                cause(error));
  }
}

c10::intrusive_ptr<c10d::ProcessGroup> new_gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int world_size,
                                                      const GroupOptions& options) {
  constexpr const char* kWho = "amp::distributed::new_gloo_group";
  detail::check_group_arguments(store, rank, world_size, options, kWho);
  std::vector<c10::DeviceType> device_types = options.gloo_device_types();
  if (device_types.empty()) {
    device_types.push_back(c10::DeviceType::CPU);
    if (at::hasCUDA()) device_types.push_back(c10::DeviceType::CUDA);
  }
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(detail::next_group_prefix("gloo"), store);
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
  try {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout());
    gloo_options->devices.push_back(
        options.gloo_hostname().empty()
            ? c10d::ProcessGroupGloo::createDefaultDevice()
            : c10d::ProcessGroupGloo::createDeviceForHostname(options.gloo_hostname()));
    // The constructor connects every pair of ranks: it returns once all joined.
    gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, world_size, gloo_options);
  } catch (const std::exception& error) {
    TORCH_CHECK(false, kWho, ": rank ", rank, " of ", world_size,
                " could not connect to the other ranks within ", options.timeout().count(),
                " ms (GroupOptions::timeout). Check that all ", world_size,
                " processes started and share the store. c10d said: ", cause(error));
  }
  auto group = c10::make_intrusive<c10d::ProcessGroup>(prefixed, rank, world_size);
  for (const c10::DeviceType type : device_types) {
    group->setBackend(type, c10d::ProcessGroup::BackendType::GLOO, gloo);
  }
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
}

namespace {

// torchrun's store, under a prefix of this attempt: a restarted job never reads the keys of an
// earlier one.
c10::intrusive_ptr<c10d::Store> attempt_store(const TorchrunEnv& env,
                                              std::chrono::milliseconds timeout) {
  return c10::make_intrusive<c10d::PrefixStore>("amp/attempt" + std::to_string(env.restart_count),
                                                torchrun_store(env, timeout));
}

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> init_gloo_from_torchrun(const GroupOptions& options) {
  const TorchrunEnv env = torchrun_env();
  return new_gloo_group(attempt_store(env, options.timeout()), env.rank, env.world_size, options);
}

c10::intrusive_ptr<c10d::ProcessGroup> init_nccl_from_torchrun(const GroupOptions& options) {
  const TorchrunEnv env = torchrun_env();
  TORCH_CHECK(built_with_nccl() && at::hasCUDA(),
              "amp::distributed::init_nccl_from_torchrun: NCCL groups need CUDA and an amp built "
              "with them (built_with_nccl() is ",
              built_with_nccl() ? "true" : "false", ", CUDA is ",
              at::hasCUDA() ? "available" : "not available",
              "); use init_gloo_from_torchrun for CPU training.");
  const auto& guard = *c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  TORCH_CHECK(env.local_rank < guard.deviceCount(),
              "amp::distributed::init_nccl_from_torchrun: "
              "LOCAL_RANK=",
              env.local_rank, " but this machine has ", guard.deviceCount(),
              " GPUs; start at most that many processes per node (--nproc-per-node).");
  guard.setDevice(
      c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(env.local_rank)));
  return new_nccl_group(attempt_store(env, options.timeout()), env.rank, env.world_size, options);
}

#ifndef AMP_DISTRIBUTED_WITH_NCCL
bool built_with_nccl() { return false; }

c10::intrusive_ptr<c10d::ProcessGroup> new_nccl_group(const c10::intrusive_ptr<c10d::Store>&, int,
                                                      int, const GroupOptions&) {
  TORCH_CHECK(false,
              "amp::distributed::new_nccl_group: this amp was built without NCCL process "
              "groups (AMP_WITH_CUDA=OFF or no NCCL headers); rebuild amp with CUDA, or use "
              "new_gloo_group (Gloo also moves CUDA tensors, through host memory).");
}
#endif

}  // namespace amp::distributed
