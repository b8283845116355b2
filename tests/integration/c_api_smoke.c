/* Exercises the C API from C: two workers (threads) sum a tensor through a real dlcpd, and bad
 * calls return nonzero codes with messages. Usage: c_api_smoke HOST:PORT. Exit 0 on success. */
#define _POSIX_C_SOURCE 200809L /* pthread barriers and readlink under -std=c11 */

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client/capi/dlcp.h"

static const char* g_agg;
static pthread_barrier_t g_connected, g_poked;

/* Sends three bytes to every UDP socket of this process bound to 127.0.0.1 or to any address:
 * each client reads one of its sockets (the others only send), and must count one truncated
 * datagram. The sockets are this process's own descriptors, asked for their addresses; reading
 * /proc/net/udp instead could list a socket twice (or not at all) while other processes open and
 * close theirs, and two pokes made two drops. Returns how many it sent to, or -1. */
static int poke_own_udp_sockets(void) {
  int fds[512];
  int n = 0, sent = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == NULL) return -1;
  struct dirent* e;
  while ((e = readdir(dir)) != NULL && n < 512) {
    char path[300], link[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    ssize_t len = readlink(path, link, sizeof(link) - 1);
    if (len <= 0) continue;
    link[len] = 0;
    if (strncmp(link, "socket:", 7) == 0) fds[n++] = atoi(e->d_name);
  }
  closedir(dir);
  int out = socket(AF_INET, SOCK_DGRAM, 0);
  if (out < 0) return -1;
  for (int i = 0; i < n; ++i) {
    int type = 0;
    socklen_t tlen = sizeof(type);
    struct sockaddr_in at;
    socklen_t alen = sizeof(at);
    if (fds[i] == out || getsockopt(fds[i], SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 || type != SOCK_DGRAM) continue;
    if (getsockname(fds[i], (struct sockaddr*)&at, &alen) != 0 || at.sin_family != AF_INET || at.sin_port == 0) continue;
    if (at.sin_addr.s_addr != htonl(0x7f000001u) && at.sin_addr.s_addr != htonl(INADDR_ANY)) continue;
    at.sin_addr.s_addr = htonl(0x7f000001u);
    if (sendto(out, "abc", 3, 0, (struct sockaddr*)&at, sizeof(at)) == 3) ++sent;
  }
  close(out);
  return sent;
}

struct worker {
  uint32_t rank;
  int ok;
};

static void* run(void* arg) {
  struct worker* w = (struct worker*)arg;
  char err[256];
  dlcp_options o;
  memset(&o, 0, sizeof(o));
  o.size = sizeof(o);
  o.aggregators = g_agg;
  o.job_name = "c-api-smoke";
  o.world_size = 2;
  o.rank = w->rank;
  o.chunk_bytes = 1024;
  o.op_timeout_ms = 20000;
  o.loss_bound = -1; /* fully reliable: the sums are checked exactly */
  o.plaintext = 1;
  dlcp_client* c = NULL;
  /* bfloat16 payloads: every value and sum here is a small integer, exact in 8 bits of mantissa. */
  const int connected = dlcp_connect_with(&o, "payload_encoding=bf16, on_aggregator_loss=fail, adaptive_window=true, path_steering=false, nack_filter=true, pacing=true", &c, err, sizeof(err)) == 0;
  if (!connected) fprintf(stderr, "rank %u connect: %s\n", w->rank, err);
  /* Every client counts what it drops: three bytes to each of them before the rounds. Both ranks
   * pass both barriers, connected or not, so neither waits for good. */
  pthread_barrier_wait(&g_connected);
  if (w->rank == 0 && connected && poke_own_udp_sockets() < 2) {
    fprintf(stderr, "rank 0: could not reach the clients' sockets\n");
  }
  pthread_barrier_wait(&g_poked);
  if (!connected) return NULL;
  float data[1000];
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 1000; ++i) data[i] = (float)(i % 17 + w->rank * 100 + round);
    dlcp_round_stats st;
    memset(&st, 0, sizeof(st));
    st.size = sizeof(st);
    if (dlcp_allreduce(c, 42, data, 1000, &st, err, sizeof(err)) != 0) {
      fprintf(stderr, "rank %u allreduce: %s\n", w->rank, err);
      return NULL;
    }
    for (int i = 0; i < 1000; ++i) {
      float want = (float)(2 * (i % 17) + 100 + 2 * round);
      if (data[i] != want) {
        fprintf(stderr, "rank %u: [%d] = %g, want %g\n", w->rank, i, data[i], want);
        return NULL;
      }
    }
    if (st.round != (uint32_t)round || st.min_contributors != 2) {
      fprintf(stderr, "rank %u: stats round %u contributors %u\n", w->rank, st.round, st.min_contributors);
      return NULL;
    }
  }
  /* Stats without a size are refused before anything starts; stats from an older, shorter header
   * get only the fields it has. */
  dlcp_round_stats unsized;
  memset(&unsized, 0, sizeof(unsized));
  if (dlcp_allreduce(c, 42, data, 1000, &unsized, err, sizeof(err)) != 3 || !strstr(err, "sizeof(dlcp_round_stats)")) {
    fprintf(stderr, "rank %u: stats without a size were not refused: %s\n", w->rank, err);
    return NULL;
  }
  dlcp_round_stats older;
  memset(&older, 0xab, sizeof(older));
  older.size = offsetof(dlcp_round_stats, retransmits);
  if (dlcp_allreduce(c, 42, data, 1000, &older, err, sizeof(err)) != 0) {
    fprintf(stderr, "rank %u allreduce with shorter stats: %s\n", w->rank, err);
    return NULL;
  }
  uint64_t untouched;
  memset(&untouched, 0xab, sizeof(untouched));
  if (older.round != 3 || older.retransmits != untouched || older.droppable_missing != untouched) {
    fprintf(stderr, "rank %u: shorter stats: round %u, fields past its size %s\n", w->rank, older.round,
            older.retransmits != untouched ? "written" : "kept");
    return NULL;
  }
  /* An empty tensor is refused with INVALID_ARGUMENT (3) and a message. */
  dlcp_op* op = NULL;
  if (dlcp_allreduce_start(c, 7, data, 0, &op, err, sizeof(err)) != 0 ||
      dlcp_op_wait(op, 1000, NULL, err, sizeof(err)) != 3 || strlen(err) == 0) {
    fprintf(stderr, "rank %u: empty tensor was not refused\n", w->rank);
    return NULL;
  }
  /* The rounds' results came in on the same socket after the three bytes, so they were read. */
  if (dlcp_rejects(c, "truncated") != 1 || dlcp_rejects(c, NULL) < 1 || dlcp_rejects(c, "no_such_reason") != 0 ||
      dlcp_rejects(NULL, NULL) != 0 || dlcp_rx_overflows(NULL) != 0 || dlcp_rx_queue_ran_dry(NULL) != 0 ||
      dlcp_rx_queue_ran_dry(c) != 0 /* UDP */) {
    fprintf(stderr,
            "rank %u: dropped packets miscounted: %llu truncated, %llu in all (%llu by the kernel, receive queue "
            "ran dry %llu times)\n",
            w->rank, (unsigned long long)dlcp_rejects(c, "truncated"), (unsigned long long)dlcp_rejects(c, NULL),
            (unsigned long long)dlcp_rx_overflows(c), (unsigned long long)dlcp_rx_queue_ran_dry(c));
    return NULL;
  }
  /* Port counters are an RDMA NIC's: over UDP there is none to read, and that is NOT_FOUND (5)
   * with a message, never a value; NULL arguments are INVALID_ARGUMENT (3). */
  uint64_t value = 77;
  err[0] = '\0';
  if (dlcp_port_counter(c, "out_of_buffer", &value, err, sizeof(err)) != 5 || value != 77 ||
      strstr(err, "out_of_buffer") == NULL || dlcp_port_counter(NULL, "x", &value, err, sizeof(err)) != 3 ||
      dlcp_port_counter(c, NULL, &value, err, sizeof(err)) != 3 || dlcp_port_counter(c, "x", NULL, err, sizeof(err)) != 3) {
    fprintf(stderr, "rank %u: dlcp_port_counter over UDP: %s (value %llu)\n", w->rank, err, (unsigned long long)value);
    return NULL;
  }
  if (dlcp_close(c, err, sizeof(err)) != 0) {
    fprintf(stderr, "rank %u close: %s\n", w->rank, err);
    return NULL;
  }
  w->ok = 1;
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: c_api_smoke HOST:PORT\n");
    return 2;
  }
  g_agg = argv[1];
  char err[256];
  dlcp_client* c = NULL;
  if (dlcp_connect(NULL, &c, err, sizeof(err)) != 3) {
    fprintf(stderr, "null options were not refused\n");
    return 1;
  }
  /* A bad setting is refused before any call, naming it. */
  dlcp_options bad;
  memset(&bad, 0, sizeof(bad));
  bad.aggregators = g_agg;
  bad.job_name = "c-api-bad";
  bad.world_size = 1;
  bad.plaintext = 1;
  /* Options without a size are refused, saying what to set. */
  if (dlcp_connect(&bad, &c, err, sizeof(err)) != 3 || !strstr(err, "sizeof(dlcp_options)")) {
    fprintf(stderr, "options without a size were not refused: %s\n", err);
    return 1;
  }
  /* One from an older, shorter header: the fields past its size are not read (world_size here). */
  bad.size = offsetof(dlcp_options, world_size);
  if (dlcp_connect(&bad, &c, err, sizeof(err)) != 3 || !strstr(err, "for option world_size")) {
    fprintf(stderr, "a field past the options' size was read: %s\n", err);
    return 1;
  }
  bad.size = sizeof(bad);
  if (dlcp_connect_with(&bad, "payload_encoding=fp8", &c, err, sizeof(err)) != 3 || !strstr(err, "payload_encoding")) {
    fprintf(stderr, "a bad payload_encoding was not refused: %s\n", err);
    return 1;
  }
  if (dlcp_connect_with(&bad, "adaptive_window=maybe", &c, err, sizeof(err)) != 3 || !strstr(err, "adaptive_window")) {
    fprintf(stderr, "a bad adaptive_window was not refused: %s\n", err);
    return 1;
  }
  if (dlcp_connect_with(&bad, "colour=blue", &c, err, sizeof(err)) != 3 || !strstr(err, "colour")) {
    fprintf(stderr, "an unknown setting was not refused: %s\n", err);
    return 1;
  }
  pthread_barrier_init(&g_connected, NULL, 2);
  pthread_barrier_init(&g_poked, NULL, 2);
  struct worker w[2] = {{0, 0}, {1, 0}};
  pthread_t t[2];
  for (int i = 0; i < 2; ++i) pthread_create(&t[i], NULL, run, &w[i]);
  for (int i = 0; i < 2; ++i) pthread_join(t[i], NULL);
  if (!w[0].ok || !w[1].ok) return 1;
  printf("c api: ok\n");
  return 0;
}
