#include "tests/integration/process_harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/base/host_port.h"
#include "tests/common/text_files.h"

namespace dlcp::testing {
namespace {

pid_t Spawn(const std::vector<std::string>& argv, int out_fd) {
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // its own group, so a kill reaches any children (dlcp-bench spawns workers)
    if (out_fd >= 0) {
      dup2(out_fd, STDOUT_FILENO);
      dup2(out_fd, STDERR_FILENO);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// Waits for pid until the deadline; returns the exit code, or -1 after killing its group.
int WaitOrKill(pid_t pid, absl::Time deadline) {
  int status = 0;
  while (MonotonicNow() < deadline) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(-pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

}  // namespace

ProcessResult RunProcess(const std::vector<std::string>& argv, absl::Duration timeout) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return {};
  pid_t pid = Spawn(argv, fds[1]);
  close(fds[1]);
  ProcessResult result;
  const absl::Time deadline = MonotonicNow() + timeout;
  char buf[4096];
  for (;;) {
    int left = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - MonotonicNow())));
    pollfd p{fds[0], POLLIN, 0};
    if (left == 0 || poll(&p, 1, std::min(left, 200)) < 0) break;
    if (p.revents & (POLLIN | POLLHUP)) {
      ssize_t n = read(fds[0], buf, sizeof(buf));
      if (n <= 0) break;
      result.out.append(buf, n);
    }
  }
  close(fds[0]);
  result.exit_code = WaitOrKill(pid, deadline + absl::Seconds(1));
  return result;
}

std::unique_ptr<BackgroundProcess> BackgroundProcess::Start(const std::vector<std::string>& argv) {
  auto p = std::unique_ptr<BackgroundProcess>(new BackgroundProcess());
  char tmpl[] = "/tmp/dlcp-proc-XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd < 0) return nullptr;
  p->log_ = tmpl;
  p->pid_ = Spawn(argv, fd);
  close(fd);
  return p;
}

void BackgroundProcess::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

ProcessResult BackgroundProcess::Wait(absl::Duration timeout) {
  ProcessResult r;
  if (pid_ > 0) {
    r.exit_code = WaitOrKill(pid_, MonotonicNow() + timeout);
    pid_ = -1;
  }
  r.out = Output();
  return r;
}

std::string BackgroundProcess::Output() const { return ReadFile(log_); }

bool BackgroundProcess::WaitForOutput(const std::string& text, absl::Duration timeout) const {
  const absl::Time deadline = MonotonicNow() + timeout;
  while (Output().find(text) == std::string::npos) {
    if (MonotonicNow() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

BackgroundProcess::~BackgroundProcess() {
  if (pid_ > 0) {
    kill(-pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
  if (!log_.empty()) unlink(log_.c_str());
}

std::vector<std::string> WithEnvironment(const std::vector<std::string>& env, std::vector<std::string> argv) {
  if (env.empty()) return argv;
  std::vector<std::string> with = {"/usr/bin/env"};
  with.insert(with.end(), env.begin(), env.end());
  with.insert(with.end(), argv.begin(), argv.end());
  return with;
}

std::unique_ptr<Daemon> Daemon::Start(const std::string& binary, const std::vector<std::string>& flags,
                                      const std::vector<std::string>& env) {
  auto d = std::unique_ptr<Daemon>(new Daemon());
  char tmpl[] = "/tmp/dlcpd-test-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return nullptr;
  d->dir_ = tmpl;
  std::vector<std::string> argv = {binary, "--host=127.0.0.1", "--port=0", "--data-port=0", "--log-level=warning",
                                   absl::StrCat("--ready-file=", d->dir_, "/ready")};
  bool tls = false, host_socket = false;
  for (const std::string& f : flags) {
    tls = tls || f.rfind("--tls-cert", 0) == 0;
    host_socket = host_socket || f.rfind("--host-socket", 0) == 0;
    if (f.rfind("--host=", 0) == 0) d->host_ = f.substr(7);  // the last one counts, as for dlcpd
  }
  if (!tls) argv.push_back("--plaintext");
  // Its own host socket, never the host's default one, which another test's dlcpd may serve.
  if (!host_socket) argv.push_back(absl::StrCat("--host-socket=", d->host_socket()));
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv = WithEnvironment(env, std::move(argv));
  int log = open((d->dir_ + "/log").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  d->pid_ = Spawn(argv, log);
  close(log);
  const absl::Time deadline = MonotonicNow() + absl::Seconds(10);
  while (MonotonicNow() < deadline) {
    const std::string text = ReadFile(d->dir_ + "/ready");
    auto field = [&](const std::string& key, int* out) {
      size_t p = text.find("\"" + key + "\":");
      if (p == std::string::npos) return false;
      p += key.size() + 3;
      return absl::SimpleAtoi(text.substr(p, text.find(',', p) - p), out);
    };
    if (field("control_port", &d->control_port_) && field("metrics_port", &d->metrics_port_) &&
        field("health_port", &d->health_port_)) {
      return d;
    }
    int status;
    if (waitpid(d->pid_, &status, WNOHANG) == d->pid_) {
      d->pid_ = -1;
      return nullptr;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return nullptr;
}

Daemon::~Daemon() {
  Stop(absl::Seconds(5), /*drain=*/false);
  if (!dir_.empty()) {
    std::string cmd = "rm -rf " + dir_;
    int unused = std::system(cmd.c_str());
    (void)unused;
  }
}

std::string Daemon::Log() const { return ReadFile(dir_ + "/log"); }

int Daemon::Stop(absl::Duration timeout, bool drain) {
  if (pid_ <= 0) return 0;
  kill(pid_, SIGTERM);
  // Another signal number: two pending SIGTERMs would merge into one.
  if (!drain) kill(pid_, SIGINT);
  int code = WaitOrKill(pid_, MonotonicNow() + timeout);
  pid_ = -1;
  return code;
}

double Scraped(const std::string& body, const std::string& prefix) {
  double total = 0;
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (line.empty() || line[0] == '#' || !absl::StartsWith(line, prefix)) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) total += v;
  }
  return total;
}

double NumberAfter(const std::string& text, const std::string& key, size_t from) {
  const size_t at = text.find("\"" + key + "\":", from);
  if (at == std::string::npos) return -1;
  double v = -1;
  const std::string rest = text.substr(at + key.size() + 3);
  return absl::SimpleAtod(rest.substr(0, rest.find_first_of(",}]")), &v) ? v : -1;
}

std::string HttpGet(int port, const std::string& path, absl::Duration timeout) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  timeval tv{static_cast<time_t>(absl::ToInt64Seconds(timeout)), 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(0x7f000001);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
    std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[8192];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
    }
  }
  close(fd);
  size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

std::string Daemon::control() const { return JoinHostPort(host_, control_port_); }

}  // namespace dlcp::testing
