// Over RDMA dlcpd registers (pins) its buffers, which the locked-memory limit caps unless the
// process holds CAP_IPC_LOCK. A dlcpd that is not root gets it only from its file's capabilities:
// the container image sets cap_ipc_lock+p on it, and where the container's bounding set holds
// IPC_LOCK (the rdma overlay) the kernel puts it in the permitted set at exec, not the effective
// one (a file capability marked effective would fail the exec wherever the bounding set lacks it,
// the UDP deployment's). This raises it into the effective set.
#pragma once

namespace dlcp::server {

enum class IpcLock {
  kEffective,     // held already (root, or an effective file capability)
  kRaised,        // permitted, now effective
  kNotPermitted,  // not held: the locked-memory limit applies
};

IpcLock RaiseIpcLock();

}  // namespace dlcp::server
