// amp::distributed: GradScaler across ranks, GradientAllReduce and the process-group set-up, in
// 2- and 3-process jobs on Gloo (each rank an amp_distributed_worker started as torchrun starts
// ranks, against a TCPStore this test hosts), plus single-process checks of errors.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <catch2/catch.hpp>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <amp/distributed.h>
#include <amp/info.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "support/temp_dir.h"
#include "support/rank_processes.h"

namespace {

namespace dist = amp::distributed;
using amp_test::RankResult;

// Runs `count` ranks of a `world`-rank job of the worker scenario `args`.
std::vector<RankResult> run_ranks(const std::vector<std::string>& args, int world, int count = 0,
                                  std::map<std::string, std::string> env = {},
                                  std::chrono::seconds deadline = std::chrono::seconds(90)) {
  c10d::TCPStoreOptions options;
  options.port = 0;  // a free port, bound before any rank starts
  options.isServer = true;
  options.waitWorkers = false;
  options.multiTenant = true;
  options.timeout = std::chrono::seconds(60);
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  amp_test::RankProcesses ranks(AMP_TEST_WORKER, args, world, count > 0 ? count : world,
                                store->getPort(), env);
  return ranks.wait_all(deadline);
}

// A port nobody listens on now (bound and released; the ranks bind it again right after).
uint16_t unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  ::close(fd);
  return ntohs(address.sin_port);
}

std::string describe(const std::vector<RankResult>& results) {
  std::string text;
  for (const auto& r : results) {
    text += "rank " + std::to_string(r.rank) + " status " + std::to_string(r.status) + "\n" +
            r.out + r.err;
  }
  return text;
}

void require_all_succeeded(const std::vector<RankResult>& results) {
  INFO(describe(results));
  for (const auto& r : results) REQUIRE(r.status == 0);
}

// A float32 as the worker prints it.
std::string bits(float value) {
  uint32_t word = 0;
  std::memcpy(&word, &value, sizeof word);
  char text[16];
  std::snprintf(text, sizeof text, "%08x", word);
  return text;
}

std::string bits(const std::vector<float>& values) {
  std::string text;
  for (size_t i = 0; i < values.size(); ++i) text += (i ? "," : "") + bits(values[i]);
  return text;
}

c10::intrusive_ptr<c10d::ProcessGroup> single_rank_group(const amp_test::TempDir& dir,
                                                         dist::GroupOptions options = {}) {
  auto store = c10::make_intrusive<c10d::FileStore>((dir.path() / "store").string(), 1);
  return dist::new_gloo_group(store, 0, 1, options.gloo_hostname("127.0.0.1"));
}

}  // namespace

TEST_CASE("An inf on one rank makes every rank skip, with equal scales and parameters",
          "[distributed]") {
  const int world = GENERATE(2, 3);
  const std::string optimizer = GENERATE("sgd", "fused_sgd", "fused_adamw");
  CAPTURE(world, optimizer);
  const auto results = run_ranks({"skip", optimizer, "sync"}, world);
  require_all_succeeded(results);
  INFO(describe(results));
  for (const auto& r : results) {
    CHECK(r.at("step1.found_inf") == bits(0.0f));
    CHECK(r.at("step2.found_inf") == bits(1.0f));  // rank 1's inf, seen by every rank
    CHECK(r.at("step3.found_inf") == bits(0.0f));
    CHECK(r.at("step1.scale") == bits(65536.0f));
    CHECK(r.at("step2.scale") == bits(32768.0f));
    CHECK(r.at("step4.scale") == bits(32768.0f));
    // The skipped step left the parameters as step 1 left them; the others moved them.
    CHECK(r.at("step2.params") == r.at("step1.params"));
    CHECK(r.at("step3.params") != r.at("step2.params"));
    CHECK(r.at("step4.params") == results[0].at("step4.params"));
    // The fused optimizers decide on the device: the flag's all-reduce adds no host read. The
    // non-fused step reads the flag once per step, as on one process.
    CHECK(r.at("host_reads") == (optimizer == "sgd" ? "4" : "0"));
  }
}

TEST_CASE("CUDA scalers on two ranks sharing a GPU skip together over Gloo",
          "[distributed][cuda]") {
  const std::string optimizer = GENERATE("sgd", "fused_adamw");
  CAPTURE(optimizer);
  const auto results = run_ranks({"skip", optimizer, "sync", "cuda"}, 2);
  require_all_succeeded(results);
  INFO(describe(results));
  for (const auto& r : results) {
    CHECK(r.at("step1.found_inf") == bits(0.0f));
    CHECK(r.at("step2.found_inf") == bits(1.0f));
    CHECK(r.at("step2.scale") == bits(32768.0f));
    CHECK(r.at("step2.params") == r.at("step1.params"));
    CHECK(r.at("step4.params") == results[0].at("step4.params"));
  }
}

TEST_CASE("Without torchrun's agent store, rank 0 hosts the rendezvous store", "[distributed]") {
  // TORCHELASTIC_USE_AGENT_STORE=False (or a launcher other than torchrun): the ranks find no
  // store at MASTER_PORT, so rank 0 must start one there and the others connect to it.
  const uint16_t port = unused_port();
  amp_test::RankProcesses ranks(AMP_TEST_WORKER, {"join"}, 3, 3, port,
                                {{"TORCHELASTIC_USE_AGENT_STORE", "False"}});
  const auto results = ranks.wait_all(std::chrono::seconds(90));
  require_all_succeeded(results);
  for (const auto& r : results) CHECK(r.at("joined") == "3");
}

TEST_CASE("Without the found-inf sync the same job lets the ranks diverge", "[distributed]") {
  // The control of the case above: it shows that the scenario can fail.
  const auto results = run_ranks({"skip", "sgd", "nosync"}, 2);
  require_all_succeeded(results);
  INFO(describe(results));
  CHECK(results[0].at("step2.found_inf") == bits(0.0f));
  CHECK(results[1].at("step2.found_inf") == bits(1.0f));
  CHECK(results[0].at("step2.scale") == bits(65536.0f));
  CHECK(results[1].at("step2.scale") == bits(32768.0f));
  CHECK(results[0].at("step4.params") != results[1].at("step4.params"));
}

TEST_CASE("GradientAllReduce averages gradients over the ranks in every transfer dtype",
          "[distributed]") {
  // (world, comm dtype, bucket bytes, buckets expected)
  using Row = std::tuple<int, std::string, int64_t, int>;
  const Row row = GENERATE(Row{2, "fp32", 25 << 20, 1}, Row{3, "fp32", 4, 5}, Row{3, "bf16", 64, 4},
                           Row{3, "fp16", 25 << 20, 1}, Row{2, "fp16", 4, 5});
  const auto [world, comm, bucket_bytes, buckets] = row;
  CAPTURE(world, comm, bucket_bytes);
  const auto results = run_ranks({"all_reduce", comm, std::to_string(bucket_bytes)}, world);
  require_all_succeeded(results);
  INFO(describe(results));
  // Rank r's gradient element i of parameter j was world * (r + 1) * ((i + j) % 5 + 1): divided
  // by the world size and summed, every value is an integer that all three dtypes hold exactly.
  const std::vector<int64_t> numel{0, 1, 7, 15, 33, 2};
  for (const auto& r : results) {
    CHECK(r.at("buckets") == std::to_string(buckets));
    CHECK(r.at("grad0") == "empty");
    for (size_t j = 1; j < numel.size(); ++j) {
      std::vector<float> expected;
      for (int64_t i = 0; i < numel[j]; ++i) {
        double sum = 0;
        for (int rank = 0; rank < world; ++rank) {
          const bool has_grad = j != 5 && !(j == 4 && rank == 0);
          if (has_grad) sum += (rank + 1) * ((i + static_cast<int64_t>(j)) % 5 + 1);
        }
        expected.push_back(static_cast<float>(sum));
      }
      CHECK(r.at("grad" + std::to_string(j)) == bits(expected));
      CHECK(r.at("dtype" + std::to_string(j)) == "Float");  // back in the gradients' dtype
    }
  }
}

TEST_CASE("A float16 transfer that overflows makes every rank skip, and bfloat16 does not overflow",
          "[distributed]") {
  const int world = GENERATE(2, 3);
  // Every rank overflows at once. The flags are combined with MAX: ATen's fused kernels skip only
  // on a flag of exactly 1, so a SUM (2 or 3 here) would let FusedAdamW and FusedSGD apply a
  // step with inf gradients.
  const std::string optimizer = GENERATE("sgd", "fused_sgd", "fused_adamw");
  const bool fused = optimizer != "sgd";
  CAPTURE(world, optimizer);
  const auto fp16 = run_ranks({"overflow", "fp16", optimizer}, world);
  require_all_succeeded(fp16);
  const auto bf16 = run_ranks({"overflow", "bf16", optimizer}, world);
  require_all_succeeded(bf16);
  INFO(describe(fp16) + describe(bf16));
  for (const auto& r : fp16) {
    CHECK(r.at("found_inf") == bits(1.0f));
    if (!fused) CHECK(r.at("taken") == "0");  // a fused step is decided on the device
    CHECK(r.at("scale") == bits(32768.0f));
    CHECK(r.at("params") == bits(std::vector<float>(4, 0.0f)));  // untouched by the skip
  }
  for (const auto& r : bf16) {
    CHECK(r.at("found_inf") == bits(0.0f));
    if (!fused) CHECK(r.at("taken") == "1");
    CHECK(r.at("scale") == bits(65536.0f));
    CHECK(r.at("params") != bits(std::vector<float>(4, 0.0f)));
    CHECK(r.at("params") == bf16[0].at("params"));
  }
}

TEST_CASE("bf16 weights with master copies, Kahan or stochastic rounding train alike on every rank",
          "[distributed][low_precision]") {
  const int world = GENERATE(2, 3);
  const std::string mode = GENERATE("master", "kahan", "sr");
  CAPTURE(world, mode);
  const auto results = run_ranks({"low_precision", mode}, world);
  require_all_succeeded(results);
  INFO(describe(results));
  for (const auto& r : results) {
    // The gradients were averaged in the parameters' dtype, and the parameters stayed bf16.
    CHECK(r.at("grad_dtype") == "BFloat16");
    CHECK(r.at("param_dtype") == "BFloat16");
    CHECK(r.at("step1.found_inf") == bits(0.0f));
    CHECK(r.at("step3.found_inf") == bits(1.0f));  // rank 1's NaN, seen by every rank
    CHECK(r.at("step2.params") != r.at("step1.params"));
    CHECK(r.at("step3.params") == r.at("step2.params"));  // skipped everywhere
    CHECK(r.at("step4.params") != r.at("step3.params"));
    // Same averaged gradients, same seed and positions: the same bits on every rank, state too.
    for (const char* key : {"step1.params", "step4.params", "state"}) {
      CHECK(r.at(key) == results[0].at(key));
    }
    CHECK(r.at("host_reads") == "0");
  }
}

TEST_CASE("Float8 delayed scaling with amax_all_reduce keeps every rank's histories and scales equal",
          "[distributed][fp8]") {
  const int world = GENERATE(2, 3);
  CAPTURE(world);
  const auto synced = run_ranks({"fp8_delayed", "sync"}, world);
  require_all_succeeded(synced);
  INFO(describe(synced));
  for (const auto& r : synced) {
    for (const char* key : {"amax_history_input", "amax_history_weight", "amax_history_grad_output",
                            "scale_input", "scale_weight", "scale_grad_output"}) {
      CHECK(r.at(key) == synced[0].at(key));
    }
  }
  // The input history holds, per step, the largest of the ranks' input amaxes. After three casts
  // of a 4-long history: [0, step1, step2, step3].
  std::vector<float> expected{0.0f};
  for (const char* step : {"step1.input_amax", "step2.input_amax", "step3.input_amax"}) {
    float largest = 0.0f;
    for (const auto& r : synced) {
      const uint32_t word = static_cast<uint32_t>(std::stoul(r.at(step), nullptr, 16));
      float value = 0.0f;
      std::memcpy(&value, &word, sizeof value);
      largest = std::max(largest, value);
    }
    expected.push_back(largest);
  }
  CHECK(synced[0].at("amax_history_input") == bits(expected));

  // Without the reduction each rank records its own amaxes, so the histories differ.
  const auto local = run_ranks({"fp8_delayed", "local"}, world);
  require_all_succeeded(local);
  INFO(describe(local));
  CHECK(local[0].at("amax_history_input") != local.back().at("amax_history_input"));
  CHECK(local[0].at("scale_input") != local.back().at("scale_input"));
}

TEST_CASE("Scalers configured differently across ranks are refused on every rank",
          "[distributed]") {
  const auto results = run_ranks({"options_differ"}, 3);
  INFO(describe(results));
  for (const auto& r : results) {
    CHECK(r.status == 1);
    CHECK_THAT(r.err,
               Catch::Contains("the scalers of the 3 ranks are configured differently: "
                               "backoff_factor is 0.5 on ranks 0 and 1 and 0.25 on rank 2; "
                               "growth_interval is 2000 on ranks 0 and 1 and 1000 on rank 2."));
    CHECK(r.values.count("constructed") == 0);
  }
}

TEST_CASE("A rank that never joins makes the others fail within the timeout", "[distributed]") {
  // Three ranks announced, two started, a 3-second timeout.
  const auto results = run_ranks({"join"}, 3, 2, {{"AMP_TEST_TIMEOUT_MS", "3000"}});
  INFO(describe(results));
  REQUIRE(results.size() == 2);
  for (const auto& r : results) {
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains("rank " + std::to_string(r.rank) +
                                      " of 3 could not connect to the other ranks within 3000 ms"));
    CHECK(r.seconds < 3.0 + 15.0);  // the timeout plus start-up, far from the 90-second deadline
  }
}

TEST_CASE("A rank that dies makes the others fail with a sentence instead of hanging",
          "[distributed]") {
  const auto results = run_ranks({"dies"}, 3, 0, {{"AMP_TEST_TIMEOUT_MS", "5000"}});
  INFO(describe(results));
  CHECK(results[2].status == 3);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(results[rank].status == 1);
    CHECK(results[rank].values.count("finished") == 0);
    CHECK_THAT(results[rank].err,
               Catch::Contains("the GradScaler's inf/NaN flag all-reduce failed on rank " +
                               std::to_string(rank) + " of 3"));
    CHECK(results[rank].seconds < 5.0 + 15.0);
  }
}

TEST_CASE("A rank that stops taking part makes the others fail at the timeout", "[distributed]") {
  const auto results = run_ranks({"stalls"}, 3, 0, {{"AMP_TEST_TIMEOUT_MS", "3000"}});
  INFO(describe(results));
  CHECK(results[2].status == 0);  // it slept 12 s and left
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(results[rank].status == 1);
    CHECK(results[rank].values.count("finished") == 0);
    CHECK_THAT(results[rank].err,
               Catch::Contains("the gradient all-reduce of bucket 1 of 1 failed on rank " +
                               std::to_string(rank) + " of 3"));
    // Failed at the 3-second timeout, well before the sleeper woke up 12 s after joining.
    CHECK(results[rank].seconds + 5.0 < results[2].seconds);
  }
}

TEST_CASE("A process group that does not serve the tensors' device is refused with a sentence",
          "[distributed]") {
  amp_test::TempDir dir("distributed_backend");
  // Gloo registered for CUDA tensors only (no GPU needed to make it).
  auto group =
      single_rank_group(dir, dist::GroupOptions().gloo_device_types({c10::DeviceType::CUDA}));
  CHECK_THROWS_WITH(
      amp::GradScaler(c10::DeviceType::CPU,
                      amp::GradScalerOptions().found_inf_sync(dist::found_inf_sync(group))),
      Catch::Contains("the scaler's inf/NaN flags are cpu tensors, but the process group (backend "
                      "gloo) serves cuda. Use a Gloo group (new_gloo_group) for CPU tensors"));
  at::Tensor w = at::zeros({3}).requires_grad_();
  CHECK_THROWS_WITH(dist::GradientAllReduce({w}, group),
                    Catch::Contains("parameter 0's gradients are cpu tensors, but the process "
                                    "group (backend gloo) serves cuda"));
}

TEST_CASE("One rank: the sync and the all-reduce change nothing", "[distributed]") {
  amp_test::TempDir dir("distributed_single");
  auto group = single_rank_group(dir);
  amp::GradScaler synced(c10::DeviceType::CPU,
                         amp::GradScalerOptions().found_inf_sync(dist::found_inf_sync(group)));
  amp::GradScaler plain(c10::DeviceType::CPU);
  at::Tensor a = at::ones({3}).requires_grad_();
  at::Tensor b = at::ones({3}).requires_grad_();
  torch::optim::SGD opt_a({a}, 0.5), opt_b({b}, 0.5);
  dist::GradientAllReduce reducer({a}, group);
  for (int step = 0; step < 3; ++step) {
    opt_a.zero_grad();
    opt_b.zero_grad();
    synced.scale(a.sum() * 3).backward();
    plain.scale(b.sum() * 3).backward();
    if (step == 1) {
      a.mutable_grad()[0].fill_(NAN);
      b.mutable_grad()[0].fill_(NAN);
    }
    reducer.all_reduce_();
    // unscale_ without a step records flags the update combines on its own.
    synced.unscale_(opt_a);
    plain.unscale_(opt_b);
    CHECK(synced.step(opt_a).outcome == plain.step(opt_b).outcome);
    synced.update();
    plain.update();
    CHECK(synced.get_scale() == plain.get_scale());
    CHECK(torch::equal(a, b));
  }
  CHECK(synced.get_scale() == 32768.0);
}

TEST_CASE("A one-rank NCCL group syncs a CUDA scaler and averages CUDA gradients",
          "[distributed][cuda]") {
  REQUIRE(dist::built_with_nccl());
  amp_test::TempDir dir("distributed_nccl");
  auto store = c10::make_intrusive<c10d::FileStore>((dir.path() / "store").string(), 1);
  auto group = dist::new_nccl_group(store, 0, 1);
  const auto cuda = at::TensorOptions(c10::DeviceType::CUDA);
  amp::GradScaler scaler(c10::DeviceType::CUDA,
                         amp::GradScalerOptions().found_inf_sync(dist::found_inf_sync(group)));
  at::Tensor w = at::ones({5}, cuda).requires_grad_();
  torch::optim::SGD optimizer({w}, 0.5);
  dist::GradientAllReduce reducer({w}, group,
                                  dist::GradientAllReduceOptions().comm_dtype(at::kHalf));
  // Scaled by 2^16: step 1's gradients, 2^15, travel exactly in float16; step 2's, 2^17, overflow
  // float16 in transfer, and the step is skipped.
  for (int step = 1; step <= 2; ++step) {
    optimizer.zero_grad();
    scaler.scale(w.sum() * (step == 1 ? 0.5 : 2.0)).backward();
    reducer.all_reduce_();
    const amp::StepResult result = scaler.step(optimizer);
    scaler.update();
    CHECK(result.found_inf.device().is_cuda());
    CHECK(result.found_inf.item<float>() == (step == 1 ? 0.0f : 1.0f));
  }
  CHECK(torch::equal(w.cpu(), torch::full({5}, 0.75f)));  // 1 - 0.5 * 0.5, then skipped
  CHECK(scaler.get_scale() == 32768.0);
  CHECK_THROWS_WITH(
      amp::GradScaler(c10::DeviceType::CPU,
                      amp::GradScalerOptions().found_inf_sync(dist::found_inf_sync(group))),
      Catch::Contains("the scaler's inf/NaN flags are cpu tensors, but the process group (backend "
                      "nccl) serves cuda"));
}

TEST_CASE("Bad distributed arguments are refused with sentences", "[distributed]") {
  amp_test::TempDir dir("distributed_args");
  auto group = single_rank_group(dir);
  at::Tensor w = at::zeros({3}).requires_grad_();
  CHECK_THROWS_WITH(
      dist::GradientAllReduce({w}, group, dist::GradientAllReduceOptions().bucket_bytes(0)),
      Catch::Contains("bucket_bytes must be > 0; got 0"));
  CHECK_THROWS_WITH(
      dist::GradientAllReduce({w}, group, dist::GradientAllReduceOptions().comm_dtype(at::kDouble)),
      Catch::Contains("comm_dtype must be at::kHalf or at::kBFloat16"));
  CHECK_THROWS_WITH(dist::GradientAllReduce({at::Tensor()}, group),
                    Catch::Contains("parameter 0 is undefined"));
  CHECK_THROWS_WITH(dist::GradientAllReduce({w}, nullptr),
                    Catch::Contains("the process group is null"));
  CHECK_THROWS_WITH(dist::found_inf_sync(nullptr), Catch::Contains("the process group is null"));
  auto store = c10::make_intrusive<c10d::FileStore>((dir.path() / "other").string(), 1);
  CHECK_THROWS_WITH(dist::new_gloo_group(store, 1, 1),
                    Catch::Contains("rank must be in [0, world_size=1); got 1"));
  CHECK_THROWS_WITH(
      dist::new_gloo_group(store, 0, 1, dist::GroupOptions().timeout(std::chrono::milliseconds(0))),
      Catch::Contains("GroupOptions::timeout must be > 0 ms; got 0 ms"));
  if (!dist::built_with_nccl() || !torch::cuda::is_available()) {
    CHECK_THROWS_WITH(dist::new_nccl_group(store, 0, 1),
                      Catch::Contains("amp::distributed::new_nccl_group: "));
  }
}

TEST_CASE("torchrun's variables are read, and missing or invalid ones named", "[distributed]") {
  struct Saved {
    std::vector<std::pair<std::string, std::optional<std::string>>> values;
    Saved() {
      for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                               "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT"}) {
        const char* value = std::getenv(name);
        values.emplace_back(name, value ? std::optional<std::string>(value) : std::nullopt);
        ::unsetenv(name);
      }
    }
    ~Saved() {
      for (const auto& [name, value] : values) {
        if (value)
          ::setenv(name.c_str(), value->c_str(), 1);
        else
          ::unsetenv(name.c_str());
      }
    }
  } saved;
  CHECK_FALSE(dist::launched_by_torchrun());
  CHECK_THROWS_WITH(dist::torchrun_env(),
                    Catch::Contains("the environment variable WORLD_SIZE is not set; start the "
                                    "program with `torchrun --no-python --nproc-per-node N"));
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "2", 1);
  CHECK_THROWS_WITH(
      dist::torchrun_env(),
      Catch::Contains("the environment variable RANK='2' is not an integer in [0, 1]"));
  ::setenv("RANK", "1", 1);
  ::setenv("MASTER_ADDR", "10.0.0.7", 1);
  ::setenv("MASTER_PORT", "70000", 1);
  CHECK_THROWS_WITH(dist::torchrun_env(),
                    Catch::Contains("MASTER_PORT='70000' is not an integer in [1, 65535]"));
  ::setenv("MASTER_PORT", "29500", 1);
  ::setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  ::setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
  const dist::TorchrunEnv env = dist::torchrun_env();
  CHECK(dist::launched_by_torchrun());
  CHECK(env.rank == 1);
  CHECK(env.world_size == 2);
  CHECK(env.local_rank == 1);  // RANK when LOCAL_RANK is unset
  CHECK(env.restart_count == 2);
  CHECK(env.master_addr == "10.0.0.7");
  CHECK(env.master_port == 29500);
  CHECK(env.agent_store);
  CHECK(amp::built_with_distributed());
}
