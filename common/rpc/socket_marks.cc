#include "common/rpc/socket_marks.h"

#include <grpc/support/sync.h>
#include <grpcpp/version_info.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <sys/socket.h>

#include <vector>

// gRPC's src/core/lib/iomgr/socket_mutator.h, 1.46 .. 1.60 (not installed with the headers).
struct grpc_socket_mutator;
struct grpc_mutate_socket_info;
struct grpc_socket_mutator_vtable {
  bool (*mutate_fd)(int fd, grpc_socket_mutator* mutator);
  int (*compare)(grpc_socket_mutator* a, grpc_socket_mutator* b);
  void (*destroy)(grpc_socket_mutator* mutator);
  bool (*mutate_fd_2)(const grpc_mutate_socket_info* info, grpc_socket_mutator* mutator);
};
struct grpc_socket_mutator {
  const grpc_socket_mutator_vtable* vtable;
  gpr_refcount refcount;
};
void grpc_socket_mutator_init(grpc_socket_mutator* mutator, const grpc_socket_mutator_vtable* vtable);

namespace dlcp {
namespace {

constexpr bool kSupported = GRPC_CPP_VERSION_MAJOR == 1 && GRPC_CPP_VERSION_MINOR >= 46 && GRPC_CPP_VERSION_MINOR <= 60;

struct DscpMutator {
  grpc_socket_mutator base;  // first: gRPC hands back a pointer to it
  uint8_t dscp;
};

bool Mutate(int fd, grpc_socket_mutator* m) {
  MarkSocketDscp(fd, reinterpret_cast<DscpMutator*>(m)->dscp);
  return true;  // marking never fails a connection
}
int Compare(grpc_socket_mutator* a, grpc_socket_mutator* b) {
  const uint8_t x = reinterpret_cast<DscpMutator*>(a)->dscp, y = reinterpret_cast<DscpMutator*>(b)->dscp;
  return x < y ? -1 : x > y;
}
void Destroy(grpc_socket_mutator* m) { delete reinterpret_cast<DscpMutator*>(m); }
const grpc_socket_mutator_vtable kVtable = {Mutate, Compare, Destroy, nullptr};

grpc_socket_mutator* NewMutator(uint8_t dscp) {
  auto* m = new DscpMutator{};
  m->dscp = dscp;
  grpc_socket_mutator_init(&m->base, &kVtable);
  return &m->base;
}

}  // namespace

bool SocketMarksSupported() { return kSupported; }

void MarkChannelDscp(grpc::ChannelArguments* args, uint8_t dscp) {
  if (kSupported) args->SetSocketMutator(NewMutator(dscp));
}

void MarkSocketDscp(int fd, uint8_t dscp) {
  const int tos = dscp << 2;
  // An IPv6 socket refuses IP_TOS, an IPv4 one IPV6_TCLASS: each takes its own.
  (void)setsockopt(fd, IPPROTO_IP, IP_TOS, &tos, sizeof(tos));
  (void)setsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &tos, sizeof(tos));
}

}  // namespace dlcp
