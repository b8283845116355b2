// systemd's service notification protocol (sd_notify(3)) without libsystemd: one datagram of
// "KEY=value" lines to the Unix socket systemd names in $NOTIFY_SOCKET, so a Type=notify unit
// (deploy/systemd/dlcpd.service) counts as started only once dlcpd serves, and shows its status.
// Called from dlcpd's main thread; never blocks (a datagram to a local socket).
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dlcp::server {

// Sends `state` (e.g. "READY=1\nSTATUS=serving") to $NOTIFY_SOCKET: a path, or an abstract
// socket when it starts with '@'. OK without doing anything when dlcpd was not started by a
// service manager that listens (the variable is unset or empty).
absl::Status NotifyServiceManager(absl::string_view state);

}  // namespace dlcp::server
