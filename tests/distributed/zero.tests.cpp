// amp::distributed::ZeroRedundancyOptimizer: Python's partition, sharded steps with the bits of
// unsharded training (every inner optimizer, mixed dtypes, stochastic rounding), the skip across
// ranks, the consolidated and sharded checkpoints at other world sizes, and the refusals. The
// parity with PyTorch's own ZeroRedundancyOptimizer is in parity/zero_parity.py.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <amp/distributed.h>
#include <amp/distributed/zero_redundancy_optimizer.h>
#include <amp/optim.h>

#include "distributed/rank_jobs.h"
#include "support/cuda_syncs.h"
#include "support/temp_dir.h"

namespace {

namespace dist = amp::distributed;
using amp_test::describe;
using amp_test::RankResult;
using amp_test::run_passing_ranks;
using Catch::Contains;

struct Partition {
  std::vector<int64_t> owner, order, totals;
};

Partition partition(const std::vector<std::vector<int64_t>>& sizes, int64_t world) {
  Partition p;
  dist::partition_parameters(sizes, world, p.totals, p.owner, p.order);
  return p;
}

// Every rank printed `key` with the same value; returns it.
std::string same_on_every_rank(const std::vector<RankResult>& results, const std::string& key) {
  INFO(describe(results));
  REQUIRE(results.front().values.count(key) == 1);
  for (const auto& r : results) CHECK(r.values.at(key) == results.front().values.at(key));
  return results.front().values.at(key);
}

}  // namespace

TEST_CASE("The partition is Python's: by size, largest first, to the least loaded, lowest rank",
          "[distributed][zero]") {
  // One group: the two 4s tie (stable: the first first); each to the emptier rank, the lower
  // one on equal totals: 4->0, 4->1, 3->0, 2->1, 1->1 (7 and 6: rank 1).
  const auto one = partition({{1, 4, 2, 4, 3}}, 2);
  CHECK(one.order == std::vector<int64_t>{1, 3, 4, 2, 0});
  CHECK(one.owner == std::vector<int64_t>{1, 0, 1, 1, 0});
  CHECK(one.totals == std::vector<int64_t>{7, 7});
  // The totals carry into the next group: after 4->0 and 1->1, the 2 goes to rank 1.
  const auto two = partition({{4, 1}, {2}}, 2);
  CHECK(two.owner == std::vector<int64_t>{0, 1, 1});
  CHECK(two.order == std::vector<int64_t>{0, 1, 2});
  // More ranks than parameters: the last ranks own nothing.
  const auto sparse = partition({{3, 1}}, 4);
  CHECK(sparse.owner == std::vector<int64_t>{0, 1});
  CHECK(sparse.totals == std::vector<int64_t>{3, 1, 0, 0});
  // Continued from earlier totals, as add_param_group does.
  Partition carried = partition({{2, 2}}, 3);
  dist::partition_parameters({{7}}, 3, carried.totals, carried.owner, carried.order);
  CHECK(carried.owner == std::vector<int64_t>{0, 1, 2});
  CHECK_THROWS_WITH(partition({{1}}, 0), Contains("world_size must be >= 1, got 0"));
}

TEST_CASE("Sharded steps give the unsharded optimizer's bits, for every inner optimizer",
          "[distributed][zero]") {
  // optimizer, model, extra: amp's fused optimizers (bf16 weights beside a float32 LayerNorm with
  // master weights, Kahan or stochastic rounding) and LibTorch's, at 3 ranks.
  const std::vector<std::vector<std::string>> cases = {{"fused_adamw", "fp32", "none"},
                                                       {"fused_adamw", "mixed", "master"},
                                                       {"fused_adamw", "mixed", "kahan"},
                                                       {"fused_adamw", "mixed", "sr"},
                                                       {"lion", "mixed", "sr"},
                                                       {"torch_adamw", "fp32", "none"},
                                                       {"torch_sgd", "fp32", "none"},
                                                       {"fused_adamw", "tiny", "none"},
                                                       {"fused_adamw", "half", "master_unscale"},
                                                       {"fused_sgd", "mixed", "kahan"}};
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c[0] << " " << c[1] << " " << c[2]) {
      const auto results = run_passing_ranks({"zero_equal", c[0], c[1], c[2]}, 3);
      INFO(describe(results));
      int64_t sharded_bytes = 0;
      for (const auto& r : results) {
        for (int step = 0; step < 4; ++step) {
          CHECK(r.values.at("step" + std::to_string(step) + ".equal") == "1");
        }
        CHECK(r.values.at("changed") == "1");  // the steps did move the parameters
        sharded_bytes += std::stoll(r.values.at("state_bytes"));
      }
      // Each rank holds only its share: together exactly the unsharded state.
      const int64_t unsharded = std::stoll(same_on_every_rank(results, "unsharded_state_bytes"));
      CHECK(sharded_bytes == unsharded);
      for (const auto& r : results) CHECK(std::stoll(r.values.at("state_bytes")) < unsharded);
      CHECK(results[0].values.at("consolidated_equal") == "1");
      if (c[1] == "tiny") {
        // Two parameters, three ranks: rank 2 owns nothing and still takes part.
        CHECK(same_on_every_rank(results, "partition") == "0,1");
        CHECK(results[2].values.at("state_bytes") == "0");
      }
    }
  }
}

TEST_CASE("An inf that one rank sees skips every rank's step, without found_inf_sync",
          "[distributed][zero]") {
  // Each rank its own gradients; rank 1's hold an inf at step 1. The stock GradScaler does not
  // combine flags: the ZeroRedundancyOptimizer does, so no rank waits for a broadcast that never
  // comes, and every scaler backs off.
  for (const std::string optimizer : {"fused_adamw", "torch_sgd"}) {
    DYNAMIC_SECTION(optimizer) {
      const auto results = run_passing_ranks({"zero_skip_unsynced", optimizer}, 2);
      for (int step = 0; step < 3; ++step) {
        same_on_every_rank(results, "step" + std::to_string(step) + ".scale");
        same_on_every_rank(results, "step" + std::to_string(step) + ".params");
      }
      CHECK(results[0].values.at("step1.params") == results[0].values.at("step0.params"));
      CHECK(results[0].values.at("step2.params") != results[0].values.at("step1.params"));
      CHECK(results[0].values.at("step0.scale") == "43800000");  // 256
      CHECK(results[0].values.at("step1.scale") == "43000000");  // 128: backed off
    }
  }
}

TEST_CASE("Consolidated and sharded checkpoints load unsharded and at 1, 2 and 3 ranks",
          "[distributed][zero]") {
  amp_test::TempDir dir("zero_roundtrip");
  const auto saved = run_passing_ranks({"zero_roundtrip", dir.path().string()}, 2);
  for (const auto& r : saved) {
    CHECK(r.values.at("unsharded.equal") == "1");
    CHECK(r.values.at("reloaded.equal") == "1");
  }
  const std::string after0 = same_on_every_rank(saved, "after0");
  const std::string after1 = same_on_every_rank(saved, "after1");
  CHECK(after0 != after1);
  for (const int world : {1, 3}) {
    DYNAMIC_SECTION(world << " ranks continue the 2-rank run") {
      const auto resumed = run_passing_ranks({"zero_resume", dir.path().string()}, world);
      CHECK(same_on_every_rank(resumed, "after0") == after0);
      CHECK(same_on_every_rank(resumed, "after1") == after1);
    }
  }
}

TEST_CASE("ZeroRedundancyOptimizer's misuse and damaged checkpoints end in sentences",
          "[distributed][zero]") {
  amp_test::TempDir dir("zero_errors");
  const auto results = run_passing_ranks({"zero_errors", dir.path().string()}, 2);
  INFO(describe(results));
  for (const auto& r : results) {
    const auto& v = r.values;
    CHECK_THAT(v.at("error.before_consolidating"),
               Contains("no state was consolidated yet; call consolidate_state_dict(to)"));
    CHECK_THAT(v.at("error.bad_to"), Contains("to=5 is not a rank of this group of 2"));
    CHECK_THAT(v.at("error.other_model"),
               Contains("parameter 4 has shape [9, 32] in the checkpoint but [8, 32] here"));
    CHECK_THAT(v.at("error.missing"), Contains("there is no"));
    CHECK_THAT(v.at("error.damaged_index"),
               Contains("zero-index.pt is damaged or not a checkpoint"));
    CHECK(v.at("unchanged.damaged_shard") == "1");
    CHECK(v.at("unchanged.after_all") == "1");
    CHECK(v.at("loaded_good") == "1");
    // Python's format of the consolidated state names FusedAdamW's implementation, and a group
    // of Python's Adam is refused with the shards unchanged.
    CHECK(v.at("python.fused") == "1");
    CHECK(v.at("python.decoupled") == "1");
    CHECK_THAT(v.at("error.python_adam_group"),
               Contains("param group 0 of the state has decoupled_weight_decay=False (Python's "
                        "Adam) but amp::optim::FusedAdamW's weight decay is decoupled"));
    CHECK(v.at("python.stepped_differs") == "1");
    CHECK(v.at("unchanged.python_adam_group") == "1");
    CHECK(v.at("loaded_python") == "1");
  }
  CHECK_THAT(results[1].values.at("error.not_target"),
             Contains("rank 1 holds no consolidated state; the last consolidate_state_dict "
                      "gathered it on rank 0"));
  // Rank 1 cut its shard: it names the file, rank 0 says another rank refused; neither loaded.
  CHECK_THAT(results[1].values.at("error.damaged_shard"),
             Contains("refused on rank 1 (nothing was loaded)"));
  CHECK_THAT(results[1].values.at("error.damaged_shard"), Contains("zero-shard-1-of-2.pt"));
  CHECK_THAT(results[0].values.at("error.damaged_shard"),
             Contains("another rank refused the checkpoint"));
}

TEST_CASE("consolidate_state_dict reached by one rank only fails at the timeout with a sentence",
          "[distributed][zero]") {
  const auto results =
      run_passing_ranks({"zero_partial_consolidate"}, 2, {{"AMP_TEST_TIMEOUT_MS", "3000"}});
  INFO(describe(results));
  CHECK_THAT(results[0].values.at("error.partial"),
             Contains("consolidate_state_dict (every rank must call it, with the same to=0) "
                      "failed on rank 0 of 2"));
}

TEST_CASE("Two ranks sharing a GPU over Gloo shard CUDA parameters with the unsharded bits",
          "[distributed][zero][cuda]") {
  const auto results = run_passing_ranks({"zero_equal", "fused_adamw", "mixed", "sr", "cuda"}, 2);
  INFO(describe(results));
  for (const auto& r : results) {
    for (int step = 0; step < 4; ++step) {
      CHECK(r.values.at("step" + std::to_string(step) + ".equal") == "1");
    }
    CHECK(r.values.at("changed") == "1");
  }
  CHECK(results[0].values.at("consolidated_equal") == "1");
}

TEST_CASE("On NCCL a fused inner optimizer steps and skips without a host sync",
          "[distributed][zero][cuda]") {
  REQUIRE(dist::built_with_nccl());
  amp_test::TempDir dir("zero_nccl");
  auto store = c10::make_intrusive<c10d::FileStore>((dir.path() / "store").string(), 1);
  auto group = dist::new_nccl_group(store, 0, 1);
  const auto cuda = at::TensorOptions(c10::DeviceType::CUDA);
  at::manual_seed(4);
  std::vector<at::Tensor> sharded{at::randn({33, 7}, cuda).requires_grad_(),
                                  at::randn({5}, cuda).to(at::kBFloat16).requires_grad_()};
  std::vector<at::Tensor> reference;
  for (const auto& p : sharded) reference.push_back(p.detach().clone().requires_grad_());
  const auto options = amp::optim::FusedAdamWOptions(1e-2).weight_decay(0.1).master_weights(true);
  dist::ZeroRedundancyOptimizer zero(
      sharded, dist::shard_optimizer<amp::optim::FusedAdamW>(options), group,
      dist::ZeroRedundancyOptimizerOptions().parameters_as_bucket_view(true));
  amp::optim::FusedAdamW unsharded(reference, options);
  amp::GradScaler scaler_a(c10::DeviceType::CUDA), scaler_b(c10::DeviceType::CUDA);
  for (int step = 0; step < 3; ++step) {
    const float bad = step == 1 ? INFINITY : 1.0f;  // step 1 overflows and is skipped
    for (auto* params : {&sharded, &reference}) {
      for (auto& p : *params) p.mutable_grad() = at::full_like(p, 0.25 * (step + 1)) * bad;
    }
    scaler_a.unscale_(zero);  // checked on the device, flag combined over the group in step()
    scaler_b.unscale_(unsharded);
    CHECK(amp_test::syncs_in([&] { scaler_a.step(zero); }) == 0);
    scaler_b.step(unsharded);
    scaler_a.update();
    scaler_b.update();
    for (size_t i = 0; i < sharded.size(); ++i) {
      CHECK(at::equal(sharded[i].detach().cpu().view(at::kByte).reshape({-1}),
                      reference[i].detach().cpu().view(at::kByte).reshape({-1})));
    }
  }
  CHECK(scaler_a.get_scale() == scaler_b.get_scale());
  // The sharded checkpoint round-trips on CUDA.
  zero.save_sharded((dir.path() / "ckpt").string());
  const int64_t bytes = zero.state_bytes();
  zero.load_sharded((dir.path() / "ckpt").string());
  CHECK(zero.state_bytes() == bytes);
  CHECK(bytes == dist::optimizer_state_bytes(unsharded));
}
