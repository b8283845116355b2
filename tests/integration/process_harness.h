// Runs the real binaries for tests: starts processes with deadlines, captures their output, and
// kills whatever is still running when the test ends.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace dlcp::testing {

struct ProcessResult {
  int exit_code = -1;  // -1: killed at the deadline
  std::string out;     // stdout and stderr together
};

// Runs argv to completion, or kills it at the timeout.
ProcessResult RunProcess(const std::vector<std::string>& argv, absl::Duration timeout);

// argv run through /usr/bin/env with `env` (NAME=VALUE) added to its environment; argv as it is
// when `env` is empty.
std::vector<std::string> WithEnvironment(const std::vector<std::string>& env, std::vector<std::string> argv);

// GET http://127.0.0.1:port/path; the body, or empty on any failure (bounded by `timeout`).
std::string HttpGet(int port, const std::string& path, absl::Duration timeout);
// In a Prometheus scrape, the sum of every sample of a metric whose name and labels start with
// `prefix` (with the full label set, that one sample's value); 0 if none does.
double Scraped(const std::string& body, const std::string& prefix);
// In JSON text, the number after the first `"key":` at or after `from`; -1 if none.
double NumberAfter(const std::string& text, const std::string& key, size_t from = 0);

// A process running in the background, its output going to a file; killed (with its process group)
// when destroyed if still running.
class BackgroundProcess {
 public:
  static std::unique_ptr<BackgroundProcess> Start(const std::vector<std::string>& argv);
  ~BackgroundProcess();
  int pid() const { return pid_; }
  void Signal(int sig);
  // Waits up to `timeout` for exit; exit_code -1 if it had to be killed.
  ProcessResult Wait(absl::Duration timeout);
  // Its output so far; it may still be running.
  std::string Output() const;
  // Polls Output() until it contains `text` or `timeout` passes; true if it did.
  bool WaitForOutput(const std::string& text, absl::Duration timeout) const;

 private:
  int pid_ = -1;
  std::string log_;
};

// A dlcpd on ephemeral ports, stopped without draining (SIGTERM and SIGINT, then SIGKILL) when
// destroyed: the workers a test leaves behind were killed, and no one is left to tell.
class Daemon {
 public:
  // Starts dlcpd on 127.0.0.1 (or the flags' --host) with extra flags, and `env` (NAME=VALUE) added to its environment, and waits
  // (bounded) for its ready file.
  static std::unique_ptr<Daemon> Start(const std::string& binary, const std::vector<std::string>& flags,
                                       const std::vector<std::string>& env = {});
  ~Daemon();
  std::string control() const;
  int metrics_port() const { return metrics_port_; }  // -1 unless started with --metrics-port
  int health_port() const { return health_port_; }    // -1 unless started with --health-port
  int pid() const { return pid_; }
  // Its --host-socket, unless the flags chose another.
  std::string host_socket() const { return dir_ + "/host.sock"; }
  // Its log so far (stdout and stderr).
  std::string Log() const;
  // Sends SIGTERM and waits up to `timeout`; returns the exit code, or -1 if it had to be killed.
  // dlcpd drains first (up to --drain-timeout-ms) unless `drain` is false, which sends SIGINT
  // right after: a second signal stops it at once.
  int Stop(absl::Duration timeout, bool drain = true);

 private:
  int pid_ = -1;
  int control_port_ = 0;
  std::string host_ = "127.0.0.1";  // its --host
  int metrics_port_ = -1;
  int health_port_ = -1;
  std::string dir_;
};

}  // namespace dlcp::testing
