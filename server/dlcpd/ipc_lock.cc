#include "server/dlcpd/ipc_lock.h"

#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace dlcp::server {

IpcLock RaiseIpcLock() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (syscall(SYS_capget, &header, data) != 0) return IpcLock::kNotPermitted;
  const unsigned word = CAP_IPC_LOCK / 32, bit = 1u << (CAP_IPC_LOCK % 32);
  if (data[word].effective & bit) return IpcLock::kEffective;
  if (!(data[word].permitted & bit)) return IpcLock::kNotPermitted;
  data[word].effective |= bit;
  return syscall(SYS_capset, &header, data) == 0 ? IpcLock::kRaised : IpcLock::kNotPermitted;
}

}  // namespace dlcp::server
