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
 * The executable exports the symbol (meson: --export-dynamic-symbol) so the
 * PMD, loaded as a plugin, binds to it.
 */
#include <errno.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

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
