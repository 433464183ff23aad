/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sendmsg() for this process, in front of libc's: a memif peer that hangs up
 * must not take the dataplane down.
 *
 * DPDK 22.11's net_memif server, on accepting a control connection, registers
 * the socket with the EAL's interrupt thread and sends its HELLO. When that
 * send fails (the client already closed: EPIPE), its error path closes the
 * socket and frees the channel without unregistering the callback; the
 * interrupt thread then re-arms a closed fd and calls rte_panic() ("Error
 * adding fd N epoll_ctl, Bad file descriptor"). Any local process that
 * connects to the server's socket and closes at once aborts the dataplane,
 * and a client dataplane that stops during its handshake did so one start in
 * four (dataplane/BENCH.md, fourteenth round). The distribution's DPDK cannot
 * be patched from here; this wrapper is the smallest place that changes the
 * outcome:
 * - every sendmsg() of the process carries MSG_NOSIGNAL, so a peer's hang-up
 *   is an error return, never a SIGPIPE (the PMD sends without the flag);
 * - on an AF_UNIX SOCK_SEQPACKET socket (memif's control channel: nothing
 *   else in the process uses that type) a send to a peer that has gone
 *   (EPIPE, ECONNRESET) reports the message sent. The channel stays
 *   registered, the interrupt thread sees the hang-up on its next read (EOF)
 *   and the PMD takes the channel down on its own, correct path. A message
 *   to a peer that has gone is lost either way; only the bookkeeping differs.
 *
 * close() likewise, for a zero-copy memif client: the PMD lends its peer the
 * EAL's memory by the EAL's own file descriptor of each segment list
 * (rte_memseg_get_fd(), not a duplicate) and closes it once the link is up
 * and again when it goes down. The EAL keeps the number; the next fd the
 * process opens takes it, so the client's next connection (its server
 * restarted) handed the server an eventfd or a socket for its memory, the
 * server's mmap() failed (ENODEV) and the link never came back; a consumer
 * published the same stale number (dp_port_rx_file()). The port registers
 * those fds (dp_guard_keep_fd()) before its first start and this close()
 * leaves them open: they live as long as the EAL, which is the process.
 *
 *
 * And close() and munmap() make the EAL's interrupt thread wait for the
 * bursts in flight. net_memif tears a link down in that thread (its peer
 * hung up): it clears the connected flag, closes the queues' fds, then
 * unmaps the peer's memory, while an RX or TX burst that passed the flag a
 * moment before may still be copying into it. A zero-copy client killed
 * mid-stream took its server down that way (SIGSEGV in the driver's copy).
 * Every burst of the dataplane runs inside dp_guard_burst_enter() / _leave()
 * (a counter per lcore, port.h); the interrupt thread's first close() or
 * munmap() after the flag waits until no burst is in flight. A burst that
 * starts after the flag was cleared returns at once.
 *
 * The executable exports the three symbols (meson: --export-dynamic-symbol)
 * so the PMD, loaded as a plugin, binds to them.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <rte_lcore.h>

#include "port.h"
#include <sys/syscall.h>
#include <unistd.h>

#define KEEP_MAX 64
static int keep[KEEP_MAX];
static unsigned n_keep; /* written by the main thread before the link starts, read by any */

int dp_guard_keep_fd(int fd)
{
	unsigned n = __atomic_load_n(&n_keep, __ATOMIC_ACQUIRE);

	if (fd < 0)
		return -EBADF;
	for (unsigned i = 0; i < n; i++)
		if (keep[i] == fd)
			return 0;
	if (n == KEEP_MAX)
		return -ENOSPC;
	keep[n] = fd;
	__atomic_store_n(&n_keep, n + 1, __ATOMIC_RELEASE);
	return 0;
}

/* one counter per lcore (the last for threads that are none), a line each */
struct gate {
	unsigned n;
} __attribute__((aligned(64)));
static struct gate gates[RTE_MAX_LCORE + 1];

static struct gate *my_gate(void)
{
	unsigned l = rte_lcore_id();

	return &gates[l < RTE_MAX_LCORE ? l : RTE_MAX_LCORE];
}

void dp_guard_burst_enter(void)
{
	__atomic_fetch_add(&my_gate()->n, 1, __ATOMIC_SEQ_CST);
}

void dp_guard_burst_leave(void)
{
	__atomic_fetch_sub(&my_gate()->n, 1, __ATOMIC_RELEASE);
}

/* In the EAL's interrupt thread: no burst in flight on return. */
static void quiesce_bursts(void)
{
	static __thread int intr = -1; /* this thread is the interrupt thread: unknown, no, yes */

	if (intr < 0) {
		char name[16] = "";

		pthread_getname_np(pthread_self(), name, sizeof(name));
		intr = strcmp(name, "eal-intr-thread") == 0;
	}
	if (!intr)
		return;
	for (unsigned i = 0; i <= RTE_MAX_LCORE; i++)
		while (__atomic_load_n(&gates[i].n, __ATOMIC_SEQ_CST))
			sched_yield();
}

int munmap(void *addr, size_t len)
{
	quiesce_bursts();
	return (int)syscall(SYS_munmap, addr, len);
}

int close(int fd)
{
	unsigned n = __atomic_load_n(&n_keep, __ATOMIC_ACQUIRE);

	quiesce_bursts();

	for (unsigned i = 0; i < n; i++)
		if (keep[i] == fd)
			return 0;
	return (int)syscall(SYS_close, fd);
}

static int memif_channel(int fd)
{
	int type = 0;
	struct sockaddr_storage a;
	socklen_t tl = sizeof(type), al = sizeof(a);

	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) || type != SOCK_SEQPACKET)
		return 0;
	return getsockname(fd, (struct sockaddr *)&a, &al) == 0 && a.ss_family == AF_UNIX;
}

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	long n = syscall(SYS_sendmsg, fd, msg, flags | MSG_NOSIGNAL);

	if (n >= 0 || (errno != EPIPE && errno != ECONNRESET))
		return (ssize_t)n;
	int e = errno;
	if (!memif_channel(fd)) {
		errno = e;
		return -1;
	}
	size_t len = 0;
	for (size_t i = 0; i < (size_t)msg->msg_iovlen; i++)
		len += msg->msg_iov[i].iov_len;
	return (ssize_t)len;
}
