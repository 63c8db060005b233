// amp::distributed: GradScaler across ranks, DistributedDataParallel and the process-group set-up,
// in 2- and 3-process jobs on Gloo (each rank an amp_distributed_worker started as torchrun starts
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
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <amp/checkpoint.h>
#include <amp/distributed.h>
#include <amp/info.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "distributed/rank_jobs.h"
#include "support/rank_processes.h"
#include "support/temp_dir.h"

namespace {

namespace dist = amp::distributed;
using amp_test::describe;
using amp_test::RankResult;
using amp_test::require_all_succeeded;
using amp_test::run_passing_ranks;
using amp_test::run_ranks;
using amp_test::single_rank_group;

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

// Rank 2 of a 3-rank job exited with 3 (it died on purpose, under a 5-second timeout): ranks 0
// and 1 must fail within the timeout, before printing `unreached`, with `failure` followed by
// "<rank> of 3" in their error.
void require_survivors_failed(const std::vector<RankResult>& results, const std::string& unreached,
                              const std::string& failure) {
  INFO(describe(results));
  CHECK(results[2].status == 3);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(results[rank].status == 1);
    CHECK(results[rank].values.count(unreached) == 0);
    CHECK_THAT(results[rank].err, Catch::Contains(failure + std::to_string(rank) + " of 3"));
    CHECK(results[rank].seconds < 5.0 + 15.0);
  }
}

// A float32 as the worker prints it.
std::string bits(float value) {
  uint32_t word = 0;
  std::memcpy(&word, &value, sizeof word);
  char text[16];
  std::snprintf(text, sizeof text, "%08x", word);
  return text;
}

// The float32 a worker printed as one hex word.
float from_bits(const std::string& word) {
  const uint32_t bits = static_cast<uint32_t>(std::stoul(word, nullptr, 16));
  float value = 0.0f;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

std::string bits(const std::vector<float>& values) {
  std::string text;
  for (size_t i = 0; i < values.size(); ++i) text += (i ? "," : "") + bits(values[i]);
  return text;
}

}  // namespace

TEST_CASE("An inf on one rank makes every rank skip, with equal scales and parameters",
          "[distributed]") {
  const int world = GENERATE(2, 3);
  const std::string optimizer = GENERATE("sgd", "fused_sgd", "fused_adamw");
  CAPTURE(world, optimizer);
  const auto results = run_passing_ranks({"skip", optimizer, "sync"}, world);
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
  const auto results = run_passing_ranks({"skip", optimizer, "sync", "cuda"}, 2);
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
  const auto results = run_passing_ranks({"skip", "sgd", "nosync"}, 2);
  INFO(describe(results));
  CHECK(results[0].at("step2.found_inf") == bits(0.0f));
  CHECK(results[1].at("step2.found_inf") == bits(1.0f));
  CHECK(results[0].at("step2.scale") == bits(65536.0f));
  CHECK(results[1].at("step2.scale") == bits(32768.0f));
  CHECK(results[0].at("step4.params") != results[1].at("step4.params"));
}

TEST_CASE("DistributedDataParallel averages gradients over the ranks with every hook",
          "[distributed][ddp]") {
  // (world, hook, bucket_cap_mb, find unused, buckets in iteration 1, buckets in iteration 2)
  using Row = std::tuple<int, std::string, std::string, std::string, int, int>;
  const Row row =
      GENERATE(Row{2, "fp32", "25", "used", 1, 1}, Row{3, "fp32", "1e-7", "used", 1, 6},
               Row{3, "bf16", "25", "unused", 1, 1}, Row{3, "fp16", "1e-7", "unused", 6, 6},
               Row{2, "fp16", "25", "unused", 1, 1});
  const auto [world, comm, cap, unused, buckets1, buckets2] = row;
  CAPTURE(world, comm, cap, unused);
  const auto results = run_passing_ranks({"ddp_grads", comm, cap, unused}, world);
  INFO(describe(results));
  // Rank r's gradient element i of parameter j is world * (r + 1) * ((i + j) % 5 + 1): averaged,
  // every value is an integer that all three transfer dtypes hold exactly. With "unused",
  // parameter 4 is unused on rank 0 (it contributes zeros) and parameter 5 on every rank (its
  // gradient stays undefined, as in PyTorch's DDP).
  const std::vector<int64_t> numel{0, 1, 7, 15, 33, 2};
  for (const auto& r : results) {
    // One bucket for the first iteration, then rebuilt by the order gradients arrived in; with
    // find_unused_parameters the first planning is kept.
    CHECK(r.at("iteration1.buckets") == std::to_string(buckets1));
    CHECK(r.at("iteration2.buckets") == std::to_string(buckets2));
    CHECK(r.at("grad0") == "empty");
    for (size_t j = 1; j < numel.size(); ++j) {
      if (unused == "unused" && j == 5) {
        CHECK(r.at("grad5") == "undefined");
        continue;
      }
      std::vector<float> expected;
      for (int64_t i = 0; i < numel[j]; ++i) {
        double sum = 0;
        for (int rank = 0; rank < world; ++rank) {
          const bool used = unused != "unused" || !(j == 4 && rank == 0);
          if (used) sum += (rank + 1) * ((i + static_cast<int64_t>(j)) % 5 + 1);
        }
        expected.push_back(static_cast<float>(sum));
      }
      CHECK(r.at("grad" + std::to_string(j)) == bits(expected));
      CHECK(r.at("dtype" + std::to_string(j)) == "Float");  // back in the gradients' dtype
    }
  }
}

TEST_CASE("A bucket's all-reduce starts while backward is still producing gradients",
          "[distributed][ddp]") {
  const auto results = run_passing_ranks({"overlap"}, 2);
  INFO(describe(results));
  for (const auto& r : results) {
    // Four Linear layers (8 parameters) in 3 buckets. The hook saw the first bucket (the last
    // layers) sent when only 4 of the 8 gradients existed: the first layer's were still to come.
    CHECK(r.at("buckets") == "3");
    CHECK(r.at("sent") == "0:4/8 1:6/8 2:8/8");
    CHECK(r.at("first_layer_pending_at_first_send") == "1");
    CHECK(r.at("params") == results[0].at("params"));  // the user's hook averaged correctly
  }
}

TEST_CASE("DistributedDataParallel refuses modules that differ across ranks, on every rank",
          "[distributed][ddp]") {
  using Row = std::pair<std::string, std::string>;
  const Row row = GENERATE(
      Row{"shape", "the element count is 280 on ranks 0 and 1 and 212 on rank 2"},
      Row{"count",
          "the count of parameters that require gradients is 6 on ranks 0 and 1 and 7 on rank 2"},
      Row{"dtype", "the hash of shapes and dtypes is 0x"},
      Row{"requires_grad",
          "the count of parameters that require gradients is 6 on ranks 0 and 1 and 5 on rank 2"});
  CAPTURE(row.first);
  const auto results = run_ranks({"fault", row.first}, 3);
  INFO(describe(results));
  for (const auto& r : results) {
    CHECK(r.status == 1);
    CHECK(r.values.count("constructed") == 0);
    CHECK_THAT(r.err, Catch::Contains("amp::distributed::DistributedDataParallel: the ranks' "
                                      "modules differ: ") &&
                          Catch::Contains(row.second) &&
                          Catch::Contains("Every rank must wrap the same model"));
  }
}

TEST_CASE("DistributedDataParallel's misuse ends in a sentence on every rank, without a hang",
          "[distributed][ddp]") {
  SECTION("a second wrapper over the same module") {
    const auto results = run_ranks({"fault", "twice"}, 2);
    INFO(describe(results));
    for (const auto& r : results) {
      CHECK(r.status == 1);
      CHECK(r.at("first") == "1");
      CHECK(r.values.count("second") == 0);
      CHECK_THAT(r.err, Catch::Contains("parameter 'fc1.weight' is already wrapped by another "
                                        "DistributedDataParallel"));
    }
  }
  SECTION("a forward whose output does not reach some parameters, without find_unused_parameters") {
    const auto results = run_ranks({"fault", "unused"}, 2);
    INFO(describe(results));
    for (const auto& r : results) {
      CHECK(r.status == 1);
      CHECK(r.at("iteration1") == "1");  // the first backward cannot know; the next forward does
      CHECK(r.values.count("iteration2") == 0);
      CHECK_THAT(
          r.err,
          Catch::Contains("DistributedDataParallel on rank " + std::to_string(r.rank) +
                          " of 2: Expected to have finished reduction in the prior "
                          "iteration") &&
              Catch::Contains("Parameter indices which did not receive grad for rank " +
                              std::to_string(r.rank) + ": 4 5") &&
              Catch::Contains("DistributedDataParallelOptions().find_unused_parameters(true)"));
    }
  }
  SECTION("no_sync() entered between a synced forward and its backward") {
    const auto results = run_ranks({"fault", "no_sync"}, 2);
    INFO(describe(results));
    for (const auto& r : results) {
      CHECK(r.status == 1);
      CHECK_THAT(r.err, Catch::Contains("no_sync() was entered while the backward of a synced "
                                        "forward can still run") &&
                            Catch::Contains("that backward would all-reduce even inside "
                                            "no_sync()"));
    }
  }
}

TEST_CASE("A rank that dies between forward and backward makes the others' backward fail",
          "[distributed][ddp]") {
  const auto results = run_ranks({"fault", "dies"}, 3, 0, {{"AMP_TEST_TIMEOUT_MS", "5000"}});
  require_survivors_failed(results, "iteration1",
                           "the all-reduce of gradient bucket 1 (280 elements) failed on rank ");
}

TEST_CASE("A float16 transfer that overflows makes every rank skip, and bfloat16 does not overflow",
          "[distributed][ddp]") {
  const int world = GENERATE(2, 3);
  // Every rank overflows at once. The flags are combined with MAX: ATen's fused kernels skip only
  // on a flag of exactly 1, so a SUM (2 or 3 here) would let FusedAdamW and FusedSGD apply a
  // step with inf gradients.
  const std::string optimizer = GENERATE("sgd", "fused_sgd", "fused_adamw");
  const bool fused = optimizer != "sgd";
  CAPTURE(world, optimizer);
  const auto fp16 = run_passing_ranks({"overflow", "fp16", optimizer}, world);
  const auto bf16 = run_passing_ranks({"overflow", "bf16", optimizer}, world);
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
  const auto results = run_passing_ranks({"low_precision", mode}, world);
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

TEST_CASE(
    "Float8 delayed scaling with amax_all_reduce keeps every rank's histories and scales equal",
    "[distributed][fp8]") {
  const int world = GENERATE(2, 3);
  CAPTURE(world);
  const auto synced = run_passing_ranks({"fp8_delayed", "sync"}, world);
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
    for (const auto& r : synced) largest = std::max(largest, from_bits(r.at(step)));
    expected.push_back(largest);
  }
  CHECK(synced[0].at("amax_history_input") == bits(expected));
  // One batched all-reduce of the three amaxes per step, at the end of its backward (not one
  // per cast: nine).
  for (const auto& r : synced) CHECK(r.at("amax_reductions") == "3");

  // Without the reduction each rank records its own amaxes, so the histories differ.
  const auto local = run_passing_ranks({"fp8_delayed", "local"}, world);
  INFO(describe(local));
  CHECK(local[0].at("amax_history_input") != local.back().at("amax_history_input"));
  CHECK(local[0].at("scale_input") != local.back().at("scale_input"));
  CHECK(local[0].at("amax_reductions") == "0");
}

TEST_CASE("Batched float8 amax reductions run beside DistributedDataParallel's buckets",
          "[distributed][fp8]") {
  // The batch's all-reduce at the end of each backward shares the group with the reducer's
  // bucket all-reduces; every rank must issue them in the same order and end with the same
  // histories, scales and parameters.
  const int world = GENERATE(2, 3);
  CAPTURE(world);
  const auto results = run_passing_ranks({"fp8_delayed_ddp", "sync"}, world);
  INFO(describe(results));
  REQUIRE(results[0].values.count("0.amax_history_grad_output") == 1);
  REQUIRE(results[0].values.count("1.weight") == 1);
  for (const auto& r : results) {
    for (const auto& [key, value] : results[0].values) {
      if (key.find("input_amax") == std::string::npos) CHECK(r.at(key) == value);
    }
    CHECK(r.at("amax_reductions") == "3");  // one per step for six amaxes, not eighteen
  }
}

TEST_CASE(
    "Under DistributedDataParallel without an amax reduction each rank keeps its own "
    "delayed-scaling histories",
    "[distributed][fp8][ddp]") {
  // DDP broadcasts rank 0's buffers before every forward; the float8 histories and scales are
  // rank-local (as Transformer Engine's metadata) and must hold each rank's own amaxes, or a
  // rank whose inputs are larger than rank 0's casts with rank 0's scale and saturates.
  const int world = GENERATE(2, 3);
  CAPTURE(world);
  const auto results = run_passing_ranks({"fp8_delayed_ddp", "local"}, world);
  INFO(describe(results));
  for (const auto& r : results) {
    // The first layer's input history after three casts of a 4-long history: [0, a1, a2, a3],
    // this rank's own input amaxes.
    std::vector<float> expected{0.0f};
    for (const char* step : {"step1.input_amax", "step2.input_amax", "step3.input_amax"}) {
      expected.push_back(from_bits(r.at(step)));
    }
    CHECK(r.at("0.amax_history_input") == bits(expected));
    CHECK(r.at("amax_reductions") == "0");
    // The gradients are still averaged: every rank holds the same parameters.
    CHECK(r.at("0.weight") == results[0].at("0.weight"));
    CHECK(r.at("1.weight") == results[0].at("1.weight"));
  }
  CHECK(results[0].at("0.amax_history_input") != results.back().at("0.amax_history_input"));
}

TEST_CASE(
    "A data-parallel run resumed from rank 0's checkpoint continues with the uninterrupted "
    "bits on every rank",
    "[distributed][ddp][save_load]") {
  // Model, FusedAdamW and a synced GradScaler saved by rank 0 after three steps (one of them
  // skipped for an inf on rank 1), loaded by every rank, wrapped in DDP again: the last three
  // steps give the bits of six steps in one go, on every rank. With two ranks whatever the
  // buckets (a sum of two is exact in any order); with three the ranks' gradients are added in
  // an order that follows the bucket layout, which must then be the same after the resume as
  // before it: find_unused_parameters keeps the first layout (without it DDP reduces the first
  // iteration in one bucket and rebuilds the buckets after it, in PyTorch too).
  const auto [world, mode] =
      GENERATE(std::make_pair(2, "default"), std::make_pair(2, "find_unused"),
               std::make_pair(3, "find_unused"));
  CAPTURE(world, mode);
  amp_test::TempDir dir("ddp_resume");
  const auto results = run_passing_ranks({"ddp_resume", dir.path().string(), mode}, world);
  INFO(describe(results));
  for (const auto& r : results) {
    for (const char* what : {"params", "scale", "state"}) {
      CAPTURE(what);
      CHECK(r.at(std::string("resumed.") + what) == r.at(std::string("whole.") + what));
      CHECK(r.at(std::string("whole.") + what) == results[0].at(std::string("whole.") + what));
    }
  }
  // The skip happened: the scale backed off once from 256 and grew in the clean steps.
  CHECK(results[0].at("whole.scale") != bits(256.0f));
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
  require_survivors_failed(results, "finished",
                           "the GradScaler's inf/NaN flag all-reduce failed on rank ");
}

TEST_CASE("A rank that stops taking part makes the others fail at the timeout", "[distributed]") {
  const auto results = run_ranks({"stalls"}, 3, 0, {{"AMP_TEST_TIMEOUT_MS", "3000"}});
  INFO(describe(results));
  CHECK(results[2].status == 0);  // it slept 12 s and left
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(results[rank].status == 1);
    CHECK(results[rank].values.count("finished") == 0);
    CHECK_THAT(results[rank].err,
               Catch::Contains("the all-reduce of gradient bucket 1 (4 elements) failed on rank " +
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
  CHECK_THROWS_WITH(dist::DistributedDataParallel(torch::nn::Linear(3, 2), group),
                    Catch::Contains("the module's parameters are cpu tensors, but the process "
                                    "group (backend gloo) serves cuda"));
}

// A one-parameter module for the single-process cases.
struct Weights : torch::nn::Module {
  explicit Weights(at::Tensor value) { w = register_parameter("w", std::move(value)); }
  at::Tensor w;
};

TEST_CASE("One rank: the sync and DistributedDataParallel change nothing", "[distributed][ddp]") {
  amp_test::TempDir dir("distributed_single");
  auto group = single_rank_group(dir);
  amp::GradScaler synced(c10::DeviceType::CPU,
                         amp::GradScalerOptions().found_inf_sync(dist::found_inf_sync(group)));
  amp::GradScaler plain(c10::DeviceType::CPU);
  auto a = std::make_shared<Weights>(at::ones({3}));
  at::Tensor b = at::ones({3}).requires_grad_();
  torch::optim::SGD opt_a({a->w}, 0.5), opt_b({b}, 0.5);
  dist::DistributedDataParallel ddp(a, group);
  CHECK(ddp.parameters().size() == 1);
  CHECK(ddp.buckets() == std::vector<std::vector<size_t>>{{0}});
  for (int step = 0; step < 3; ++step) {
    opt_a.zero_grad();
    opt_b.zero_grad();
    const at::Tensor out = ddp.forward([&] { return a->w.sum() * 3; });
    synced.scale(out).backward();
    plain.scale(b.sum() * 3).backward();
    if (step == 1) {
      a->w.mutable_grad()[0].fill_(NAN);
      b.mutable_grad()[0].fill_(NAN);
    }
    // unscale_ without a step records flags the update combines on its own.
    synced.unscale_(opt_a);
    plain.unscale_(opt_b);
    CHECK(synced.step(opt_a).outcome == plain.step(opt_b).outcome);
    synced.update();
    plain.update();
    CHECK(synced.get_scale() == plain.get_scale());
    CHECK(torch::equal(a->w, b));
  }
  CHECK(synced.get_scale() == 32768.0);
}

TEST_CASE("DistributedDataParallel::forward passes tensors, vectors and tuples through",
          "[distributed][ddp]") {
  amp_test::TempDir dir("distributed_forward");
  auto group = single_rank_group(dir);
  auto module = std::make_shared<Weights>(at::full({2}, 2.0f));
  dist::DistributedDataParallel ddp(
      module, group, dist::DistributedDataParallelOptions().find_unused_parameters(true));
  const auto pair = ddp.forward([&] {
    return std::make_tuple(module->w * 3, std::vector<at::Tensor>{module->w + 1, module->w * 0});
  });
  CHECK(torch::equal(std::get<0>(pair), torch::full({2}, 6.0f)));
  CHECK(std::get<1>(pair).size() == 2);
  (std::get<0>(pair).sum() + std::get<1>(pair)[0].sum()).backward();
  CHECK(torch::equal(module->w.grad(), torch::full({2}, 4.0f)));
  {
    auto guard = ddp.no_sync();
    ddp.forward([&] { return module->w.sum(); }).backward();  // accumulates locally
  }
  CHECK(torch::equal(module->w.grad(), torch::full({2}, 5.0f)));
}

TEST_CASE("With find_unused_parameters, an output the loss leaves out does not stall the reduction",
          "[distributed][ddp]") {
  amp_test::TempDir dir("distributed_unused_output");
  auto group = single_rank_group(dir);
  auto module = std::make_shared<torch::nn::Module>();
  at::Tensor a = module->register_parameter("a", at::ones({2}));
  at::Tensor b = module->register_parameter("b", at::ones({2}));
  dist::DistributedDataParallel ddp(
      module, group, dist::DistributedDataParallelOptions().find_unused_parameters(true));
  for (int iteration = 0; iteration < 3; ++iteration) {
    ddp.zero_grad();
    // `b` is reached from the second output, so the graph search counts it as used; the loss
    // uses only the first. The outputs pass through DDP's sink, and `b` reports to the Reducer
    // with no gradient instead of being waited for (the next forward would throw otherwise).
    const auto outputs = ddp.forward([&] {
      return std::vector<at::Tensor>{a * 2, b * 3, at::Tensor()};  // an empty optional output too
    });
    outputs[0].sum().backward();
    CHECK(torch::equal(a.grad(), torch::full({2}, 2.0f)));
    CHECK_FALSE(b.grad().defined());
  }
}

// A comm hook of the user's that counts the buckets sent (one rank: the sum is the bucket itself).
class CountingHook final
    : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  CountingHook(c10::intrusive_ptr<c10d::ProcessGroup> group, std::shared_ptr<int> sent)
      : CppCommHookInterface(std::move(group)), sent_(std::move(sent)) {}
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    ++*sent_;
    std::vector<at::Tensor> tensors{bucket.getBufferRef()};
    return state_->allreduce(tensors)->getFuture();
  }

 private:
  std::shared_ptr<int> sent_;
};

TEST_CASE("The outputs of DistributedDataParallel::forward can be modified in place",
          "[distributed][ddp]") {
  // With find_unused_parameters (every iteration) or static_graph (the first) the outputs pass
  // through DDP's sink; Python's sink returns clones so that `loss /= accumulation` works.
  const std::string mode = GENERATE("find_unused_parameters", "static_graph", "plain");
  CAPTURE(mode);
  amp_test::TempDir dir("distributed_in_place");
  auto group = single_rank_group(dir);
  auto module = std::make_shared<Weights>(at::full({3}, 2.0f));
  dist::DistributedDataParallel ddp(module, group,
                                    dist::DistributedDataParallelOptions()
                                        .find_unused_parameters(mode == "find_unused_parameters")
                                        .static_graph(mode == "static_graph"));
  for (int iteration = 0; iteration < 2; ++iteration) {
    ddp.zero_grad();
    at::Tensor loss = ddp.forward([&] { return (module->w * module->w).sum(); });
    loss /= 4;  // gradient accumulation over 4 micro-batches
    auto outputs = ddp.forward([&] { return std::vector<at::Tensor>{module->w * 3}; });
    outputs[0].mul_(2);
    (loss + outputs[0].sum()).backward();
    // d/dw (w^2 / 4 + 6 w) = w / 2 + 6 = 7.
    CHECK(torch::equal(module->w.grad(), at::full({3}, 7.0f)));
  }
}

TEST_CASE("After a synced forward whose backward never ran, no_sync() and later steps proceed",
          "[distributed][ddp]") {
  // A validation forward through ddp.forward with grad mode on, or a batch dropped after a
  // non-finite loss, leaves the Reducer waiting for a backward that never comes. Once its
  // outputs are gone that backward can never run: no_sync() must work, and its backward must stay
  // local. While they live, the backward could still run and all-reduce: no_sync() refuses.
  const bool find_unused = GENERATE(false, true);
  CAPTURE(find_unused);
  amp_test::TempDir dir("distributed_abandoned_forward");
  auto group = single_rank_group(dir);
  auto module = std::make_shared<Weights>(at::full({2}, 1.0f));
  dist::DistributedDataParallel ddp(
      module, group, dist::DistributedDataParallelOptions().find_unused_parameters(find_unused));
  auto sent = std::make_shared<int>(0);
  ddp.register_comm_hook(std::make_unique<CountingHook>(group, sent));
  const auto forward = [&] { return ddp.forward([&] { return (module->w * 2).sum(); }); };

  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    ddp.zero_grad();
    { const at::Tensor validation = forward(); }  // grad mode on, never backpropagated
    const int before = *sent;
    {
      auto guard = ddp.no_sync();
      forward().backward();  // accumulates locally
    }
    CHECK(*sent == before);
    forward().backward();  // synced: reduces the accumulated gradient
    CHECK(*sent == before + 1);
    CHECK(torch::equal(module->w.grad(), at::full({2}, 4.0f)));
  }
  // A dropped synced forward followed by another synced one: the later backward reduces.
  { const at::Tensor dropped = forward(); }
  ddp.zero_grad();
  forward().backward();
  CHECK(torch::equal(module->w.grad(), at::full({2}, 2.0f)));

  // The refusal stays where it is true: the synced forward's loss is alive.
  at::Tensor pending = forward();
  CHECK_THROWS_WITH(
      ddp.no_sync(),
      Catch::Contains("no_sync() was entered while the backward of a synced forward can "
                      "still run") &&
          Catch::Contains("release those tensors"));
  pending = at::Tensor();  // the graph is gone: the backward can no longer run
  {
    auto guard = ddp.no_sync();
    forward().backward();
  }
}

TEST_CASE("A static_graph model's first iteration must be synced before no_sync()",
          "[distributed][ddp]") {
  // Python's Reducer fails there with an internal assert; amp says what to do instead.
  amp_test::TempDir dir("distributed_static_no_sync");
  auto group = single_rank_group(dir);
  auto module = std::make_shared<Weights>(at::full({2}, 1.0f));
  dist::DistributedDataParallel ddp(module, group,
                                    dist::DistributedDataParallelOptions().static_graph(true));
  CHECK_THROWS_WITH(ddp.no_sync(),
                    Catch::Contains("no_sync() was entered before the first backward of a "
                                    "static_graph model") &&
                        Catch::Contains("run the first forward and backward outside no_sync()"));
  ddp.forward([&] { return module->w.sum(); }).backward();
  {
    auto guard = ddp.no_sync();
    ddp.forward([&] { return module->w.sum(); }).backward();
  }
  CHECK(torch::equal(module->w.grad(), at::full({2}, 2.0f)));
}

TEST_CASE("gradient_as_bucket_view makes gradients views that DDP's zero_grad clears",
          "[distributed][ddp]") {
  amp_test::TempDir dir("distributed_bucket_view");
  auto group = single_rank_group(dir);
  auto module = std::make_shared<Weights>(at::ones({3}));
  dist::DistributedDataParallel ddp(
      module, group, dist::DistributedDataParallelOptions().gradient_as_bucket_view(true));
  torch::optim::SGD optimizer({module->w}, 0.5);
  for (int iteration = 0; iteration < 2; ++iteration) {  // the second on rebuilt buckets
    ddp.zero_grad();
    CHECK_FALSE(module->w.grad().defined());
    ddp.forward([&] { return (module->w * 2).sum(); }).backward();
    CHECK(module->w.grad().is_view());  // into the bucket, not a copy
    CHECK(torch::equal(module->w.grad(), torch::full({3}, 2.0f)));
  }
  ddp.zero_grad(/*set_to_none=*/false);
  CHECK(torch::equal(module->w.grad(), torch::zeros({3})));
  // LibTorch's own zero_grad detach_()es first, which a view refuses: hence ddp.zero_grad().
  CHECK_THROWS_WITH(optimizer.zero_grad(), Catch::Contains("Can't detach views in-place"));
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
  auto module = std::make_shared<Weights>(at::ones({5}, cuda));
  torch::optim::SGD optimizer({module->w}, 0.5);
  dist::DistributedDataParallel ddp(
      module, group,
      dist::DistributedDataParallelOptions().comm_hook(dist::CommHook::kFp16Compress));
  // Scaled by 2^16: step 1's gradients, 2^15, travel exactly in float16; step 2's, 2^17, overflow
  // float16 in transfer, and the step is skipped.
  for (int step = 1; step <= 2; ++step) {
    optimizer.zero_grad();
    const at::Tensor loss = ddp.forward([&] { return module->w.sum() * (step == 1 ? 0.5 : 2.0); });
    scaler.scale(loss).backward();
    const amp::StepResult result = scaler.step(optimizer);
    scaler.update();
    CHECK(result.found_inf.device().is_cuda());
    CHECK(result.found_inf.item<float>() == (step == 1 ? 0.0f : 1.0f));
  }
  CHECK(torch::equal(module->w.cpu(), torch::full({5}, 0.75f)));  // 1 - 0.5 * 0.5, then skipped
  CHECK(scaler.get_scale() == 32768.0);
  CHECK_THROWS_WITH(
      amp::GradScaler(c10::DeviceType::CPU,
                      amp::GradScalerOptions().found_inf_sync(dist::found_inf_sync(group))),
      Catch::Contains("the scaler's inf/NaN flags are cpu tensors, but the process group (backend "
                      "nccl) serves cuda"));
}

TEST_CASE("DistributedDataParallel on two ranks sharing a GPU over Gloo averages CUDA gradients",
          "[distributed][cuda]") {
  const auto results = run_passing_ranks({"ddp_grads", "fp16", "1e-7", "unused", "cuda"}, 2);
  INFO(describe(results));
  const std::vector<int64_t> numel{0, 1, 7, 15, 33, 2};
  for (const auto& r : results) {
    CHECK(r.at("iteration2.buckets") == "6");
    CHECK(r.at("grad5") == "undefined");
    for (size_t j = 1; j < 5; ++j) {
      std::vector<float> expected;
      for (int64_t i = 0; i < numel[j]; ++i) {
        const int k = static_cast<int>((i + static_cast<int64_t>(j)) % 5 + 1);
        expected.push_back(static_cast<float>(j == 4 ? 2 * k : 3 * k));  // rank 0 skips p4
      }
      CHECK(r.at("grad" + std::to_string(j)) == bits(expected));
    }
  }
}

TEST_CASE("Bad distributed arguments are refused with sentences", "[distributed]") {
  amp_test::TempDir dir("distributed_args");
  auto group = single_rank_group(dir);
  torch::nn::Linear linear(3, 2);
  CHECK_THROWS_WITH(dist::DistributedDataParallel(
                        linear, group, dist::DistributedDataParallelOptions().bucket_cap_mb(0)),
                    Catch::Contains("bucket_cap_mb must be > 0 (MiB) and below 8e12; got 0"));
  CHECK_THROWS_WITH(
      dist::DistributedDataParallel(linear, group,
                                    dist::DistributedDataParallelOptions().first_bucket_cap_mb(-1)),
      Catch::Contains("first_bucket_cap_mb must be > 0 (MiB) and below 8e12; got -1"));
  CHECK_THROWS_WITH(dist::DistributedDataParallel(std::make_shared<torch::nn::Module>(), group),
                    Catch::Contains("the module has no parameters that require gradients"));
  CHECK_THROWS_WITH(dist::DistributedDataParallel(std::shared_ptr<torch::nn::Module>(), group),
                    Catch::Contains("module is null"));
  CHECK_THROWS_WITH(dist::DistributedDataParallel(linear, nullptr),
                    Catch::Contains("the process group is null"));
  torch::nn::Embedding sparse(torch::nn::EmbeddingOptions(4, 2).sparse(true));
  CHECK_THROWS_WITH(
      dist::DistributedDataParallel(sparse, group),
      Catch::Contains("'weight' belongs to an Embedding or EmbeddingBag with sparse=true"));
  {
    dist::DistributedDataParallel ddp(linear, group);
    ddp.forward([&] { return linear->forward(at::ones({1, 3})); });
    CHECK_THROWS_WITH(ddp.register_comm_hook(nullptr), Catch::Contains("got a null hook"));
  }
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

// Two Linear layers and a third the find_unused_parameters case leaves out on odd iterations.
struct CheckpointNet : torch::nn::Module {
  CheckpointNet() {
    torch::manual_seed(3);
    a = register_module("a", torch::nn::Linear(8, 16));
    b = register_module("b", torch::nn::Linear(16, 4));
    extra = register_module("extra", torch::nn::Linear(4, 4));
  }
  at::Tensor forward(const at::Tensor& x, bool use_extra) {
    const auto h = b(torch::gelu(a(x)));
    return use_extra ? extra(h) : h;
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, extra{nullptr};
};

TEST_CASE("A checkpointed model trains under DistributedDataParallel as the plain one",
          "[distributed][ddp][checkpoint]") {
  // The recomputation runs inside backward and builds a graph no backward runs through: the
  // Reducer sees each parameter's gradient once, from the checkpointed graph, with the graph
  // search of find_unused_parameters and the first-iteration tracing of static_graph as well.
  const std::string mode = GENERATE("plain", "find_unused_parameters", "static_graph");
  CAPTURE(mode);
  amp_test::TempDir dir("distributed_checkpoint");
  auto group = single_rank_group(dir);
  const auto options = dist::DistributedDataParallelOptions()
                           .find_unused_parameters(mode == "find_unused_parameters")
                           .static_graph(mode == "static_graph");
  auto plain = std::make_shared<CheckpointNet>();
  auto checkpointed = std::make_shared<CheckpointNet>();
  dist::DistributedDataParallel plain_ddp(plain, group, options);
  dist::DistributedDataParallel checkpointed_ddp(checkpointed, group, options);
  torch::optim::SGD plain_sgd(plain->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD checkpointed_sgd(checkpointed->parameters(),
                                     torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int iteration = 0; iteration < 4; ++iteration) {
    const bool use_extra = mode != "find_unused_parameters" || iteration % 2 == 0;
    torch::manual_seed(100 + iteration);
    const auto x = torch::randn({6, 8});
    plain_sgd.zero_grad();
    plain_ddp.forward([&] { return plain->forward(x, use_extra); }).square().mean().backward();
    plain_sgd.step();
    checkpointed_sgd.zero_grad();
    checkpointed_ddp
        .forward([&] {
          return amp::checkpoint(
              [net = checkpointed](const at::Tensor& t, bool e) { return net->forward(t, e); }, x,
              use_extra);
        })
        .square()
        .mean()
        .backward();
    checkpointed_sgd.step();
    CAPTURE(iteration);
    CHECK(checkpointed->extra->weight.grad().defined() == plain->extra->weight.grad().defined());
    const auto expected = plain->parameters();
    const auto actual = checkpointed->parameters();
    for (size_t i = 0; i < expected.size(); ++i) CHECK(torch::equal(actual[i], expected[i]));
  }
}
