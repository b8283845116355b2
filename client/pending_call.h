// A unary gRPC call (callback API) in flight with a deadline, for callers that block on its
// answer: CallWithDeadline for one call, PendingCall to have several in flight at once.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <optional>
#include <utility>

#include "absl/time/time.h"
#include "common/base/clock.h"

namespace dlcp {

// One unary callback-API call in flight, with a deadline. Several may be started before any is
// waited for: they then run at once, so N unreachable aggregators cost one deadline, not N.
// Not movable (gRPC holds its context and messages); Wait() blocks for at most the deadline plus
// a margin, and the destructor waits too, since gRPC's callback refers to this object.
template <typename Req, typename Resp>
class PendingCall {
 public:
  template <typename Fn>
  PendingCall(Fn&& start, Req req, absl::Duration timeout)
      : req_(std::move(req)), give_up_(MonotonicNow() + timeout + absl::Seconds(2)), result_(done_.get_future()) {
    ctx_.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
    start(&ctx_, &req_, &resp_, [this](grpc::Status s) { done_.set_value(std::move(s)); });
  }
  PendingCall(const PendingCall&) = delete;
  PendingCall& operator=(const PendingCall&) = delete;
  ~PendingCall() { Wait(); }

  // gRPC completes the call by its deadline; the margin only covers scheduling delay. Past it,
  // cancel and wait for the callback, which gRPC then runs at once.
  const grpc::Status& Wait() {
    if (!status_) {
      const absl::Duration left = std::max(give_up_ - MonotonicNow(), absl::ZeroDuration());
      if (result_.wait_for(absl::ToChronoNanoseconds(left)) != std::future_status::ready) {
        ctx_.TryCancel();
        result_.wait();
      }
      status_ = result_.get();
    }
    return *status_;
  }
  Resp& response() { return resp_; }  // valid once Wait() has returned

 private:
  grpc::ClientContext ctx_;
  Req req_;
  Resp resp_;
  absl::Time give_up_;
  std::promise<grpc::Status> done_;
  std::future<grpc::Status> result_;
  std::optional<grpc::Status> status_;
};

// Runs one unary callback-API call with a deadline and waits for it (bounded by the deadline).
template <typename Req, typename Resp, typename Fn>
grpc::Status CallWithDeadline(Fn&& start, const Req& req, Resp* resp, absl::Duration timeout) {
  PendingCall<Req, Resp> call(std::forward<Fn>(start), req, timeout);
  grpc::Status st = call.Wait();
  *resp = std::move(call.response());
  return st;
}

}  // namespace dlcp
