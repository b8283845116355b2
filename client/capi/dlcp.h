/* dlcp C API: for trainers written in languages other than C++. Every function returns 0 on
 * success or a nonzero absl status code, and writes a message into err (if err_len > 0).
 * Thread-safe like dlcp::Client. Never aborts the process. */
#ifndef DLCP_C_API_H_
#define DLCP_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dlcp_client dlcp_client;
typedef struct dlcp_op dlcp_op;

/* Zero it, set size to sizeof(dlcp_options), then the fields. The library reads only the fields
 * that fit in size, and takes the defaults for the rest, so a program built against this header
 * keeps working with a later library whose options have grown; a size too small for job_name is
 * INVALID_ARGUMENT (3). */
typedef struct {
  size_t size;
  const char* aggregators; /* "host:port[,host:port...]" */
  const char* job_name;
  uint32_t world_size;
  uint32_t rank;
  uint32_t chunk_bytes;    /* 0: fit the data plane (8192 over UDP, MTU - 56 over RDMA) */
  uint32_t op_timeout_ms;  /* 0: default (60000) */
  /* gRPC security: TLS unless plaintext is nonzero. NULL or "" for unset files. */
  int plaintext;
  const char* tls_ca;          /* CA of the aggregators' certificates; NULL: system roots */
  const char* tls_cert;        /* client certificate, for mutual TLS */
  const char* tls_key;
  const char* tls_server_name; /* name to verify in the aggregators' certificates */
  double loss_bound;           /* ε (docs/bounded-loss.md); 0: DLCP_LOSS_BOUND, else exact; negative: exact */
} dlcp_options;

/* Set size to sizeof(dlcp_round_stats) before passing one in. The library writes only the fields
 * that fit in it, so a program built against this header keeps working with a later library
 * whose stats have grown; a size too small for key is INVALID_ARGUMENT (3). */
typedef struct {
  size_t size;
  uint32_t key;
  uint32_t round;
  double time_ms;
  uint64_t retransmits;
  uint32_t min_contributors;
  uint64_t left_out;           /* this worker's contributions left out of the aggregate (bounded loss) */
  uint64_t droppable_total;    /* all workers' droppable contributions, over every shard's STOP */
  uint64_t droppable_missing;  /* ... and how many of them are missing: at most ε of the total */
} dlcp_round_stats;

/* The library's version, e.g. "0.1.0". */
const char* dlcp_version(void);

int dlcp_connect(const dlcp_options* options, dlcp_client** out, char* err, size_t err_len);
/* The same, with settings beyond dlcp_options as "name=value,name=value" (NULL or "": none), e.g.
 * "payload_encoding=bf16,on_aggregator_loss=remap". Every client option is a setting, by the
 * names of docs/configuration.md's "Client options" table, but for those whose values are lists (aggregators,
 * dscp), which a comma-separated string cannot carry: they come from the struct or the
 * environment. A setting given here wins over the struct's field.
 * Options neither gives come from DLCP_* environment variables (DLCP_WINDOW_BYTES=...), then the
 * defaults. An unknown name or a bad value is INVALID_ARGUMENT (3), and the message names it. */
int dlcp_connect_with(const dlcp_options* options, const char* settings, dlcp_client** out, char* err,
                      size_t err_len);
/* Starts an in-place sum of data[0..n) over the job; data must stay valid until dlcp_op_wait. */
int dlcp_allreduce_start(dlcp_client* c, uint32_t key, float* data, size_t n, dlcp_op** out, char* err, size_t err_len);
/* Waits up to timeout_ms for the op; returns 4 (DEADLINE_EXCEEDED) if not done yet, else frees it.
 * stats may be NULL; a bad stats->size is refused before the wait, and the op stays valid. */
int dlcp_op_wait(dlcp_op* op, uint32_t timeout_ms, dlcp_round_stats* stats, char* err, size_t err_len);
/* Blocking convenience: start and wait for the op's own deadline. */
int dlcp_allreduce(dlcp_client* c, uint32_t key, float* data, size_t n, dlcp_round_stats* stats, char* err,
                   size_t err_len);
/* Data packets this client dropped since it connected: those dropped for `reason` (a name as in
 * the aggregator's dlcp_rejects_total, e.g. "bad_mac", "unknown_source", or "unknown_round" for
 * late copies of results, normal under loss), or all of them for NULL. 0 for a NULL client or a
 * reason that never occurred. Any thread. */
uint64_t dlcp_rejects(const dlcp_client* c, const char* reason);
/* Result datagrams the kernel dropped since the client connected because its receive buffer was
 * full: loss on this host, which repairs make good (raise net.core.rmem_max). Not counted by
 * dlcp_rejects. 0 over RDMA and for a NULL client. Any thread. */
uint64_t dlcp_rx_overflows(const dlcp_client* c);
/* Over RDMA, how often the client's receive queue ran out of posted buffers since it connected:
 * the NIC then drops what arrives, counted only in the port's sysfs hw_counters (mlx5:
 * out_of_buffer). Episodes, not datagrams; repairs make the loss good (raise the
 * rdma_recv_slots option). 0 over UDP and for a NULL client. Any thread. */
uint64_t dlcp_rx_queue_ran_dry(const dlcp_client* c);
/* Over RDMA, one counter of the NIC port the client's data plane runs on, as its driver exports
 * it in sysfs hw_counters (e.g. "out_of_buffer" on mlx5: datagrams dropped for want of a posted
 * receive buffer; docs/rdma.md). The port's count since it came up, every process on it
 * included. Returns 0 and sets *value, or NOT_FOUND (5) for a counter the port lacks and over UDP
 * (no port of its own), INVALID_ARGUMENT (3) for a NULL argument or a name that cannot be a
 * counter's (e.g. with a slash). Reads a file: not from a latency-critical thread. Any thread. */
int dlcp_port_counter(const dlcp_client* c, const char* name, uint64_t* value, char* err, size_t err_len);
/* Leaves the job and frees the client. Blocks for at most the control-call deadline. An
 * aggregator that is unreachable, or no longer holds the job, is logged and not an error. */
int dlcp_close(dlcp_client* c, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif /* DLCP_C_API_H_ */
