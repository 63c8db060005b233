// A checkpoint archive as amp's examples write one (a small model, an AdamW state, a scaler and
// a format entry), shared by the archive tests and the load campaign.
#pragma once

#include <sstream>
#include <string>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/serialize/output-archive.h>

#include <amp/grad_scaler.h>

namespace amp_test {

/// The bytes of a checkpoint holding a trained Linear-ReLU-Linear model, its AdamW state after
/// one step, `scaler` and the entry "format" = 3.
inline std::string checkpoint_archive_bytes(const amp::GradScaler& scaler) {
  torch::nn::Sequential model(torch::nn::Linear(4, 3), torch::nn::ReLU(), torch::nn::Linear(3, 2));
  torch::optim::AdamW optimizer(model->parameters(), 0.1);
  model->forward(torch::ones({2, 4})).sum().backward();
  optimizer.step();
  torch::serialize::OutputArchive checkpoint, model_archive, optimizer_archive;
  model->save(model_archive);
  optimizer.save(optimizer_archive);
  checkpoint.write("model", model_archive);
  checkpoint.write("optimizer", optimizer_archive);
  checkpoint << scaler;
  checkpoint.write("format", c10::IValue(std::int64_t{3}));
  std::ostringstream out;
  checkpoint.save_to(out);
  return out.str();
}

}  // namespace amp_test
