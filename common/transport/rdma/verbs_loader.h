// libibverbs, loaded at run time. dlcp binaries do not link against rdma-core, so the same
// binaries start on nodes without it; the RDMA transport asks for the library when it is first
// chosen and explains what to install when it is missing.
//
// Every entry is bound with dlvsym to the symbol version rdma-core has exported since 2017
// (IBVERBS_1.1; ibv_query_gid_ex since IBVERBS_1.11), never to whatever version happens to be
// the default. Verbs that verbs.h implements inline through the device's ops table
// (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) need no entry here.
//
// Threading: LoadVerbs may be called from any thread; it loads once and the table it returns
// lives until the process exits.
#pragma once

#include <infiniband/verbs.h>

#include "absl/status/statusor.h"

namespace dlcp::rdma {

struct Verbs {
  ibv_device** (*get_device_list)(int* num_devices);
  void (*free_device_list)(ibv_device** list);
  const char* (*get_device_name)(ibv_device* device);
  ibv_context* (*open_device)(ibv_device* device);
  int (*close_device)(ibv_context* context);
  int (*query_device)(ibv_context* context, ibv_device_attr* attr);
  // The pre-extension entry; QueryPort below prefers the device's extended op, as verbs.h does.
  int (*query_port_compat)(ibv_context* context, uint8_t port, _compat_ibv_port_attr* attr);
  int (*query_gid_ex)(ibv_context* context, uint32_t port, uint32_t index, ibv_gid_entry* entry, uint32_t flags,
                      size_t entry_size);
  ibv_pd* (*alloc_pd)(ibv_context* context);
  int (*dealloc_pd)(ibv_pd* pd);
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, size_t length, int access);
  int (*dereg_mr)(ibv_mr* mr);
  ibv_comp_channel* (*create_comp_channel)(ibv_context* context);
  int (*destroy_comp_channel)(ibv_comp_channel* channel);
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector);
  int (*destroy_cq)(ibv_cq* cq);
  int (*get_cq_event)(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context);
  void (*ack_cq_events)(ibv_cq* cq, unsigned int nevents);
  ibv_srq* (*create_srq)(ibv_pd* pd, ibv_srq_init_attr* attr);
  int (*destroy_srq)(ibv_srq* srq);
  int (*modify_srq)(ibv_srq* srq, ibv_srq_attr* attr, int mask);
  // The device context's asynchronous events (an SRQ's limit reached, a port going down).
  int (*get_async_event)(ibv_context* context, ibv_async_event* event);
  void (*ack_async_event)(ibv_async_event* event);
  const char* (*event_type_str)(ibv_event_type event);
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr);
  int (*destroy_qp)(ibv_qp* qp);
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int mask);
  ibv_ah* (*create_ah)(ibv_pd* pd, ibv_ah_attr* attr);
  int (*destroy_ah)(ibv_ah* ah);
  const char* (*wc_status_str)(ibv_wc_status status);

  // verbs.h's inline ibv_query_port, without its reference to the library's own symbol.
  int QueryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) const;
};

// The library's table, or FailedPrecondition naming the package to install. Loads
// "libibverbs.so.1" by its soname once per process.
absl::StatusOr<const Verbs*> LoadVerbs();

}  // namespace dlcp::rdma
