// Starts the ranks of a multi-process test as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE) against a TCPStore this process hosts, waits for
// them with a deadline, and kills and reaps every one of them whatever happens.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <sys/types.h>  // pid_t

namespace amp_test {

/// What one rank did: how it ended, when, and what it printed.
struct RankResult {
  int rank = 0;
  /// The exit code, or -signal when killed (-9 when the deadline passed).
  int status = 0;
  /// Seconds from the start to its exit.
  double seconds = 0.0;
  std::string out;
  std::string err;
  /// The stdout lines "key value" as key -> value.
  std::map<std::string, std::string> values;

  /// The value of `key`; fails the test (throws) when the rank did not print it.
  const std::string& at(const std::string& key) const;
};

/// `count` processes of `program args...`, ranks 0..count-1 of a job of `world_size` ranks
/// (count < world_size starts a job with ranks missing).
class RankProcesses {
 public:
  RankProcesses(const std::string& program, const std::vector<std::string>& args, int world_size,
                int count, uint16_t master_port,
                const std::map<std::string, std::string>& extra_env = {});
  /// Kills whatever still runs (the whole process group) and reaps every process.
  ~RankProcesses();
  RankProcesses(const RankProcesses&) = delete;
  RankProcesses& operator=(const RankProcesses&) = delete;

  /// Waits until all exited or `deadline` passed (then kills the rest); one result per rank.
  std::vector<RankResult> wait_all(std::chrono::milliseconds deadline);

 private:
  void kill_and_reap();

  std::string folder_;
  std::vector<pid_t> pids_;
  std::vector<RankResult> results_;
  std::vector<bool> reaped_;
  pid_t group_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace amp_test
