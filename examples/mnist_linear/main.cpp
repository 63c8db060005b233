// The seed's training program in C++: Linear(784, 10) on MNIST-format images, SGD, cross-entropy,
// with the forward pass (model and loss) under amp::AutocastGuard.
#include <amp/autocast.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "common/cli.h"
#include "common/idx.h"

namespace {

constexpr std::int64_t kImageSide = 28;
constexpr std::int64_t kImagePixels = kImageSide * kImageSide;
constexpr std::int64_t kNumClasses = 10;
// Test images per forward pass when measuring accuracy; only bounds memory.
constexpr std::int64_t kEvalChunk = 1000;

/// A value of --precision: how the forward pass runs.
struct Precision {
  std::string_view name;
  std::string_view description;
  /// The autocast dtype, or nullopt to run without autocast (all float32).
  std::optional<c10::ScalarType> autocast_dtype;
};

// fp16 joins this table with the GradScaler issue; a precision that needs loss scaling will say
// so here and train_epoch() will route backward/step through the scaler.
constexpr std::array kPrecisions = {
    Precision{"fp32", "float32 throughout, autocast off", std::nullopt},
    Precision{"bf16", "bfloat16 autocast on CPU", c10::ScalarType::BFloat16},
};

/// The program's settings; the defaults are the seed's.
struct Settings {
  std::filesystem::path data_dir = "/usr/share/datasets/fashion-mnist";
  std::int64_t epochs = 5;
  std::int64_t batch_size = 64;
  double lr = 0.01;
  std::int64_t seed = 0;
  Precision precision = kPrecisions[1];  // bf16
};

/// The seed's MyModel: flattens each image and applies one linear layer.
struct MyModelImpl : torch::nn::Module {
  MyModelImpl() : fc(register_module("fc", torch::nn::Linear(kImagePixels, kNumClasses))) {}

  torch::Tensor forward(const torch::Tensor& x) { return fc(x.view({-1, kImagePixels})); }

  torch::nn::Linear fc;
};
TORCH_MODULE(MyModel);

/// One half of the dataset as tensors: images [N, 1, 28, 28] float32 in [0, 1], labels [N] int64.
struct Dataset {
  torch::Tensor images;
  torch::Tensor labels;

  std::int64_t size() const { return labels.size(0); }
};

Dataset load_dataset(const std::filesystem::path& dir, amp_examples::MnistSplit split) {
  amp_examples::MnistData data = amp_examples::load_mnist(dir, split, kNumClasses);
  if (data.rows != kImageSide || data.cols != kImageSide) {
    throw amp_examples::DataError(
        fmt::format("{}: the images are {}x{} pixels; this model takes {}x{} images",
                    data.images_file.string(), data.rows, data.cols, kImageSide, kImageSide));
  }
  // from_blob only views the bytes; the conversions copy them into tensors that own their memory.
  const torch::Tensor pixels =
      torch::from_blob(data.images.data(), {data.count, 1, kImageSide, kImageSide}, torch::kUInt8);
  const torch::Tensor labels = torch::from_blob(data.labels.data(), {data.count}, torch::kUInt8);
  // Scaled to [0, 1] like torchvision's ToTensor, the seed's only transform.
  return {pixels.to(torch::kFloat32).div_(255), labels.to(torch::kInt64)};
}

/// The outputs of one forward pass.
struct Forward {
  torch::Tensor logits;
  torch::Tensor loss;
};

/// The forward pass of one batch, under autocast when the precision asks for it. A disabled
/// guard (fp32) still opens a region, so both precisions run the same code, as Python's
/// `autocast(enabled=...)` idiom does.
Forward forward_pass(MyModel& model, const torch::Tensor& images, const torch::Tensor& labels,
                     const Precision& precision) {
  amp::AutocastGuard autocast(torch::kCPU, precision.autocast_dtype,
                              precision.autocast_dtype.has_value());
  torch::Tensor logits = model->forward(images);
  torch::Tensor loss = torch::nn::functional::cross_entropy(logits, labels);
  return {std::move(logits), std::move(loss)};
}

/// One pass over the shuffled training set in batches (the last one may be smaller, as with
/// DataLoader's default drop_last=False). Returns the mean loss per training image.
double train_epoch(MyModel& model, torch::optim::SGD& optimizer, const Dataset& train,
                   const Settings& settings) {
  model->train();
  const torch::Tensor order = torch::randperm(train.size(), torch::kInt64);
  // Summed as a tensor so the loop never waits for a value on the host; read once at the end.
  torch::Tensor loss_sum = torch::zeros({}, torch::kFloat64);
  for (std::int64_t start = 0; start < train.size(); start += settings.batch_size) {
    const torch::Tensor batch =
        order.slice(0, start, std::min(start + settings.batch_size, train.size()));
    const torch::Tensor images = train.images.index_select(0, batch);
    const torch::Tensor labels = train.labels.index_select(0, batch);

    optimizer.zero_grad();
    const torch::Tensor loss = forward_pass(model, images, labels, settings.precision).loss;
    loss.backward();
    optimizer.step();
    loss_sum += loss.detach() * batch.size(0);
  }
  return loss_sum.item<double>() / static_cast<double>(train.size());
}

/// The fraction of test images classified correctly, with the same precision as training.
double evaluate(MyModel& model, const Dataset& test, const Precision& precision) {
  model->eval();
  torch::NoGradGuard no_grad;
  amp::AutocastGuard autocast(torch::kCPU, precision.autocast_dtype,
                              precision.autocast_dtype.has_value());
  torch::Tensor correct = torch::zeros({}, torch::kInt64);
  for (std::int64_t start = 0; start < test.size(); start += kEvalChunk) {
    const std::int64_t end = std::min(start + kEvalChunk, test.size());
    const torch::Tensor predicted = model->forward(test.images.slice(0, start, end)).argmax(1);
    correct += predicted.eq(test.labels.slice(0, start, end)).sum();
  }
  return static_cast<double>(correct.item<std::int64_t>()) / static_cast<double>(test.size());
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void run(const Settings& settings) {
  const auto start = std::chrono::steady_clock::now();
  const Dataset train = load_dataset(settings.data_dir, amp_examples::MnistSplit::kTrain);
  const Dataset test = load_dataset(settings.data_dir, amp_examples::MnistSplit::kTest);
  fmt::print("data: {} training and {} test images from {} ({:.2f} s)\n", train.size(), test.size(),
             settings.data_dir.string(), seconds_since(start));
  fmt::print("precision {} ({}), epochs {}, batch size {}, lr {}, seed {}\n",
             settings.precision.name, settings.precision.description, settings.epochs,
             settings.batch_size, settings.lr, settings.seed);
  std::fflush(stdout);

  torch::manual_seed(static_cast<std::uint64_t>(settings.seed));
  MyModel model;
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(settings.lr));

  {
    // Shows autocast at work: under bf16 the linear layer computes in bfloat16 while
    // cross-entropy, on autocast's float32 list, still returns float32.
    torch::NoGradGuard no_grad;
    const Forward probe = forward_pass(model, train.images.slice(0, 0, 1),
                                       train.labels.slice(0, 0, 1), settings.precision);
    fmt::print("forward pass: logits {}, loss {}\n", c10::toString(probe.logits.scalar_type()),
               c10::toString(probe.loss.scalar_type()));
  }

  const auto training_start = std::chrono::steady_clock::now();
  double accuracy = 0;
  for (std::int64_t epoch = 1; epoch <= settings.epochs; ++epoch) {
    const auto epoch_start = std::chrono::steady_clock::now();
    const double loss = train_epoch(model, optimizer, train, settings);
    accuracy = evaluate(model, test, settings.precision);
    fmt::print("epoch {}/{}: mean train loss {:.6f}, test accuracy {:.2f}%, {:.2f} s\n", epoch,
               settings.epochs, loss, 100 * accuracy, seconds_since(epoch_start));
    std::fflush(stdout);
  }
  fmt::print("done: precision {}, test accuracy {:.2f}%, training {:.2f} s, total {:.2f} s\n",
             settings.precision.name, 100 * accuracy, seconds_since(training_start),
             seconds_since(start));
}

amp_examples::CommandLine make_command_line(Settings& settings) {
  using amp_examples::parse_integer;
  amp_examples::CommandLine cli(
      "mnist_linear",
      "Trains the seed's linear classifier (Linear(784, 10), SGD, cross-entropy) on an\n"
      "MNIST-format dataset with the forward pass under amp::AutocastGuard, and prints\n"
      "the mean training loss and the test accuracy of each epoch.");
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  cli.add_option("data", "DIR",
                 fmt::format("folder with {{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte[.gz] "
                             "(default {})",
                             settings.data_dir.string()),
                 [&](std::string_view value) { settings.data_dir = value; });
  cli.add_option(
      "epochs", "N", fmt::format("passes over the training set (default {})", settings.epochs),
      [&](std::string_view value) { settings.epochs = parse_integer("--epochs", value, 1, kMax); });
  cli.add_option("batch-size", "N",
                 fmt::format("images per SGD step (default {})", settings.batch_size),
                 [&](std::string_view value) {
                   settings.batch_size = parse_integer("--batch-size", value, 1, kMax);
                 });
  cli.add_option("lr", "RATE", fmt::format("SGD learning rate (default {})", settings.lr),
                 [&](std::string_view value) {
                   settings.lr = amp_examples::parse_positive_number("--lr", value);
                 });
  cli.add_option(
      "seed", "N",
      fmt::format("seed of the weights' initialisation and the shuffling (default {})",
                  settings.seed),
      [&](std::string_view value) { settings.seed = parse_integer("--seed", value, 0, kMax); });
  std::vector<std::string_view> names;
  for (const Precision& precision : kPrecisions) names.push_back(precision.name);
  cli.add_option("precision", fmt::format("{{{}}}", fmt::join(names, ",")),
                 fmt::format("forward-pass precision (default {})", settings.precision.name),
                 [&settings, names](std::string_view value) {
                   settings.precision =
                       kPrecisions[amp_examples::parse_choice("--precision", value, names)];
                 });
  return cli;
}

}  // namespace

int main(int argc, char* argv[]) {
  Settings settings;
  const amp_examples::CommandLine cli = make_command_line(settings);
  try {
    if (!cli.parse(argc, argv)) {
      fmt::print("{}", cli.usage());
      return 0;
    }
  } catch (const amp_examples::UsageError& error) {
    fmt::print(stderr, "mnist_linear: error: {}\n\n{}", error.what(), cli.usage());
    return amp_examples::kUsageExitCode;
  }

  try {
    run(settings);
  } catch (const amp_examples::DataError& error) {
    fmt::print(stderr,
               "mnist_linear: error: {}\n(--data DIR names a folder holding "
               "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and "
               "t10k-labels-idx1-ubyte, each raw or gzipped with a .gz suffix)\n",
               error.what());
    return 1;
  } catch (const c10::Error& error) {
    fmt::print(stderr, "mnist_linear: error: {}\n", error.what_without_backtrace());
    return 1;
  }
  return 0;
}
