// amp_test::RankProcesses: posix_spawn of the ranks into one process group, output to files,
// a polling wait with a deadline, and SIGKILL + waitpid for every rank on the way out.
#include "support/rank_processes.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/remove_tree.h"

extern char** environ;

namespace amp_test {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

const std::string& RankResult::at(const std::string& key) const {
  const auto it = values.find(key);
  if (it == values.end()) {
    throw std::runtime_error("rank " + std::to_string(rank) + " printed no '" + key + "' (status " +
                             std::to_string(status) + ")\nstdout:\n" + out + "\nstderr:\n" + err);
  }
  return it->second;
}

RankProcesses::RankProcesses(const std::string& program, const std::vector<std::string>& args,
                             int world_size, int count, uint16_t master_port,
                             const std::map<std::string, std::string>& extra_env) {
  static int serial = 0;
  folder_ = (std::filesystem::temp_directory_path() /
             ("amp_ranks_" + std::to_string(::getpid()) + "_" + std::to_string(serial++)))
                .string();
  remove_tree(folder_);
  std::filesystem::create_directories(folder_);
  start_ = std::chrono::steady_clock::now();
  for (int rank = 0; rank < count; ++rank) {
    std::map<std::string, std::string> env;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      const std::string text = *entry;
      const auto eq = text.find('=');
      if (eq != std::string::npos) env[text.substr(0, eq)] = text.substr(eq + 1);
    }
    env["RANK"] = std::to_string(rank);
    env["LOCAL_RANK"] = std::to_string(rank);
    env["WORLD_SIZE"] = std::to_string(world_size);
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = std::to_string(master_port);
    env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
    env["OMP_NUM_THREADS"] = "1";
    env["AMP_TEST_PARENT_PID"] = std::to_string(::getpid());
    for (const auto& [key, value] : extra_env) env[key] = value;
    std::vector<std::string> env_text;
    for (const auto& [key, value] : env) env_text.push_back(key + "=" + value);
    std::vector<char*> envp;
    for (auto& text : env_text) envp.push_back(text.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_text{program};
    argv_text.insert(argv_text.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& text : argv_text) argv.push_back(text.data());
    argv.push_back(nullptr);

    const std::string out = folder_ + "/rank" + std::to_string(rank) + ".out";
    const std::string err = folder_ + "/rank" + std::to_string(rank) + ".err";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    // All ranks in one new process group, led by rank 0: one kill(-group) stops them all.
    posix_spawnattr_setpgroup(&attributes, group_);
    pid_t pid = 0;
    const int rc =
        posix_spawn(&pid, program.c_str(), &actions, &attributes, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    if (rc != 0) {
      kill_and_reap();
      throw std::runtime_error("posix_spawn of " + program + " failed: " + std::strerror(rc));
    }
    if (group_ == 0) group_ = pid;
    pids_.push_back(pid);
    reaped_.push_back(false);
    RankResult result;
    result.rank = rank;
    results_.push_back(result);
  }
}

std::vector<RankResult> RankProcesses::wait_all(std::chrono::milliseconds deadline) {
  const auto until = start_ + deadline;
  size_t left = pids_.size();
  while (left > 0) {
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (reaped_[i]) continue;
      int status = 0;
      const pid_t done = ::waitpid(pids_[i], &status, WNOHANG);
      if (done != pids_[i]) continue;
      reaped_[i] = true;
      --left;
      results_[i].status = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      results_[i].seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() >= until) {
      kill_and_reap();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (size_t i = 0; i < pids_.size(); ++i) {
    RankResult& result = results_[i];
    result.out = read_file(folder_ + "/rank" + std::to_string(i) + ".out");
    result.err = read_file(folder_ + "/rank" + std::to_string(i) + ".err");
    std::istringstream lines(result.out);
    std::string line;
    while (std::getline(lines, line)) {
      const auto space = line.find(' ');
      if (space == std::string::npos) continue;
      result.values[line.substr(0, space)] = line.substr(space + 1);
    }
  }
  return results_;
}

void RankProcesses::kill_and_reap() {
  // Only while one of ours is unreaped: the group's id cannot have been reused then.
  const bool running = std::find(reaped_.begin(), reaped_.end(), false) != reaped_.end();
  if (group_ != 0 && running) ::kill(-group_, SIGKILL);
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (reaped_[i]) continue;
    int status = 0;
    while (::waitpid(pids_[i], &status, 0) < 0 && errno == EINTR) {
    }
    reaped_[i] = true;
    results_[i].status = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    results_[i].seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
}

RankProcesses::~RankProcesses() {
  kill_and_reap();
  remove_tree(folder_);
}

}  // namespace amp_test
