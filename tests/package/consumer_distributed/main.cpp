// Uses amp::distributed from the installed package: a one-rank Gloo group on a FileStore, a
// GradScaler whose flag is synced over it and DistributedDataParallel, for one skipped and one
// taken step.
#include <amp/distributed.h>
#include <amp/info.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include <torch/optim/sgd.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <unistd.h>

int main() {
  namespace dist = amp::distributed;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("amp_consumer_store_" + std::to_string(::getpid())))
                               .string();
  auto store = c10::make_intrusive<c10d::FileStore>(path, 1);
  auto group = dist::new_gloo_group(store, 0, 1, dist::GroupOptions().gloo_hostname("127.0.0.1"));
  amp::GradScaler scaler(c10::DeviceType::CPU,
                         amp::GradScalerOptions().found_inf_sync(dist::found_inf_sync(group)));
  auto model = std::make_shared<torch::nn::Module>();
  at::Tensor w = model->register_parameter("w", at::ones({3}));
  torch::optim::SGD optimizer({w}, 0.5);
  dist::DistributedDataParallel ddp(model, group);
  int taken = 0;
  for (int step = 0; step < 2; ++step) {
    optimizer.zero_grad();
    const at::Tensor loss = ddp.forward([&] { return w.sum() * (step == 0 ? INFINITY : 1.0); });
    scaler.scale(loss).backward();
    taken += scaler.step(optimizer) ? 1 : 0;
    scaler.update();
  }
  std::filesystem::remove(path);
  std::printf("amp %s, distributed %d: %d of 2 steps taken, scale %g\n", amp::version().c_str(),
              amp::built_with_distributed() ? 1 : 0, taken, scaler.get_scale());
  return taken == 1 && scaler.get_scale() == 32768.0 ? 0 : 1;
}
