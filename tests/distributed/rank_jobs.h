// What the multi-process suites share (distributed.tests.cpp, zero.tests.cpp): a job of worker
// ranks started as torchrun starts them, its results described, and a one-rank Gloo group.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <amp/distributed.h>

#include "support/rank_processes.h"
#include "support/temp_dir.h"

namespace amp_test {

/// Runs `count` ranks of a `world`-rank job of the worker scenario `args` (AMP_TEST_WORKER).
inline std::vector<RankResult> run_ranks(const std::vector<std::string>& args, int world,
                                         int count = 0, std::map<std::string, std::string> env = {},
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

/// Every rank's status and output, for a failed check.
inline std::string describe(const std::vector<RankResult>& results) {
  std::string text;
  for (const auto& r : results) {
    text += "rank " + std::to_string(r.rank) + " status " + std::to_string(r.status) + "\n" +
            r.out + r.err;
  }
  return text;
}

/// Requires every rank to have exited 0.
inline void require_all_succeeded(const std::vector<RankResult>& results) {
  INFO(describe(results));
  for (const auto& r : results) REQUIRE(r.status == 0);
}

/// run_ranks() for a job every rank of which must exit 0: requires it, and returns the results.
inline std::vector<RankResult> run_passing_ranks(const std::vector<std::string>& args, int world,
                                                 std::map<std::string, std::string> env = {}) {
  auto results = run_ranks(args, world, 0, std::move(env));
  require_all_succeeded(results);
  return results;
}

/// A Gloo group of this process alone (a FileStore in `dir`).
inline c10::intrusive_ptr<c10d::ProcessGroup> single_rank_group(
    const amp_test::TempDir& dir, amp::distributed::GroupOptions options = {}) {
  auto store = c10::make_intrusive<c10d::FileStore>((dir.path() / "store").string(), 1);
  return amp::distributed::new_gloo_group(store, 0, 1, options.gloo_hostname("127.0.0.1"));
}

}  // namespace amp_test
