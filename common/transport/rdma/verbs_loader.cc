#include "common/transport/rdma/verbs_loader.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace dlcp::rdma {
namespace {

constexpr const char* kLibrary = "libibverbs.so.1";

template <typename Fn>
bool Bind(void* lib, Fn* slot, const char* name, const char* version, std::string* missing) {
  void* sym = dlvsym(lib, name, version);
  if (sym == nullptr) {
    absl::StrAppend(missing, missing->empty() ? "" : ", ", name, "@", version);
    return false;
  }
  *slot = reinterpret_cast<Fn>(sym);
  return true;
}

absl::StatusOr<Verbs> Load() {
  void* lib = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load ", kLibrary, " (", why ? why : "unknown error",
        "): install rdma-core's user space (Debian: apt-get install libibverbs1 ibverbs-providers), or use "
        "--transport=udp"));
  }
  Verbs v;
  std::string missing;
  constexpr const char* k11 = "IBVERBS_1.1";
  Bind(lib, &v.get_device_list, "ibv_get_device_list", k11, &missing);
  Bind(lib, &v.free_device_list, "ibv_free_device_list", k11, &missing);
  Bind(lib, &v.get_device_name, "ibv_get_device_name", k11, &missing);
  Bind(lib, &v.open_device, "ibv_open_device", k11, &missing);
  Bind(lib, &v.close_device, "ibv_close_device", k11, &missing);
  Bind(lib, &v.query_device, "ibv_query_device", k11, &missing);
  Bind(lib, &v.query_port_compat, "ibv_query_port", k11, &missing);
  Bind(lib, &v.query_gid_ex, "_ibv_query_gid_ex", "IBVERBS_1.11", &missing);
  Bind(lib, &v.alloc_pd, "ibv_alloc_pd", k11, &missing);
  Bind(lib, &v.dealloc_pd, "ibv_dealloc_pd", k11, &missing);
  Bind(lib, &v.reg_mr, "ibv_reg_mr", k11, &missing);
  Bind(lib, &v.dereg_mr, "ibv_dereg_mr", k11, &missing);
  Bind(lib, &v.create_comp_channel, "ibv_create_comp_channel", "IBVERBS_1.0", &missing);
  Bind(lib, &v.destroy_comp_channel, "ibv_destroy_comp_channel", "IBVERBS_1.0", &missing);
  Bind(lib, &v.create_cq, "ibv_create_cq", k11, &missing);
  Bind(lib, &v.destroy_cq, "ibv_destroy_cq", k11, &missing);
  Bind(lib, &v.get_cq_event, "ibv_get_cq_event", k11, &missing);
  Bind(lib, &v.ack_cq_events, "ibv_ack_cq_events", k11, &missing);
  Bind(lib, &v.create_srq, "ibv_create_srq", k11, &missing);
  Bind(lib, &v.destroy_srq, "ibv_destroy_srq", k11, &missing);
  Bind(lib, &v.modify_srq, "ibv_modify_srq", k11, &missing);
  Bind(lib, &v.get_async_event, "ibv_get_async_event", k11, &missing);
  Bind(lib, &v.ack_async_event, "ibv_ack_async_event", k11, &missing);
  Bind(lib, &v.event_type_str, "ibv_event_type_str", k11, &missing);
  Bind(lib, &v.create_qp, "ibv_create_qp", k11, &missing);
  Bind(lib, &v.destroy_qp, "ibv_destroy_qp", k11, &missing);
  Bind(lib, &v.modify_qp, "ibv_modify_qp", k11, &missing);
  Bind(lib, &v.create_ah, "ibv_create_ah", k11, &missing);
  Bind(lib, &v.destroy_ah, "ibv_destroy_ah", k11, &missing);
  Bind(lib, &v.wc_status_str, "ibv_wc_status_str", k11, &missing);
  if (!missing.empty()) {
    dlclose(lib);
    return absl::FailedPreconditionError(absl::StrCat(
        kLibrary, " lacks ", missing, ": rdma-core 32 or newer is needed (Debian 11 and later ship it)"));
  }
  return v;  // the library stays loaded for the process's lifetime
}

}  // namespace

int Verbs::QueryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) const {
  verbs_context* vctx = verbs_get_ctx_op(context, query_port);
  if (vctx == nullptr) {
    std::memset(attr, 0, sizeof(*attr));
    return query_port_compat(context, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
  }
  return vctx->query_port(context, port, attr, sizeof(*attr));
}

absl::StatusOr<const Verbs*> LoadVerbs() {
  static std::once_flag once;
  static absl::StatusOr<Verbs>* loaded = nullptr;
  std::call_once(once, [] { loaded = new absl::StatusOr<Verbs>(Load()); });
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace dlcp::rdma
