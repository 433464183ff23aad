/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The kernel TCP baseline of scripts/dp-bench: two processes on this
 * machine, a sender writing fixed-size messages back to back over loopback
 * and a receiver reading each one whole (as a KV-page consumer would),
 * for --seconds. iperf3 stops at 1 MiB writes; this one takes any size.
 *   tcp_stream --size BYTES [--seconds S] [--port P] [--cpus S,R]
 * --cpus pins the sender to CPU S and the receiver to CPU R (default: where
 * the scheduler puts them).
 * Prints "tcp: N messages, B bytes, T s, X GB/s, Y msg/s" (receiver's view).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int recv_side(int lfd, size_t size, double secs)
{
	int fd = accept(lfd, NULL, NULL);
	if (fd < 0) {
		fprintf(stderr, "accept() failed: %s\n", strerror(errno));
		return 1;
	}
	char *buf = malloc(size);
	unsigned long long msgs = 0;
	double t0 = 0, t = 0;
	for (;;) {
		size_t got = 0;
		while (got < size) {
			ssize_t r = read(fd, buf + got, size - got);
			if (r <= 0)
				goto done;
			got += (size_t)r;
			if (!t0)
				t0 = now_s();
		}
		msgs++;
		t = now_s();
		if (t - t0 >= secs)
			break;
	}
done:
	close(fd);
	free(buf);
	if (!msgs || t <= t0) {
		fprintf(stderr, "tcp: no whole message received\n");
		return 1;
	}
	double dt = t - t0;
	printf("tcp: %llu messages, %llu bytes, %.3f s, %.3f GB/s, %.0f msg/s\n", msgs,
	       msgs * (unsigned long long)size, dt, (double)msgs * (double)size / dt / 1e9,
	       (double)msgs / dt);
	return 0;
}

static int send_side(int port, size_t size)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		fprintf(stderr, "connect(127.0.0.1:%d) failed: %s\n", port, strerror(errno));
		return 1;
	}
	char *buf = malloc(size);
	memset(buf, 0x5a, size);
	for (;;) {
		size_t put = 0;
		while (put < size) {
			ssize_t r = write(fd, buf + put, size - put);
			if (r <= 0) {
				free(buf);
				close(fd);
				return 0; /* the receiver has its figure and closed */
			}
			put += (size_t)r;
		}
	}
}

static void pin(int cpu)
{
	cpu_set_t set;

	if (cpu < 0)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set))
		fprintf(stderr, "sched_setaffinity(%d) failed: %s\n", cpu, strerror(errno));
}

int main(int argc, char **argv)
{
	size_t size = 0;
	double secs = 5;
	int port = 5231, cpu_s = -1, cpu_r = -1;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--size"))
			size = strtoul(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--seconds"))
			secs = atof(argv[i + 1]);
		else if (!strcmp(argv[i], "--port"))
			port = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--cpus") && sscanf(argv[i + 1], "%d,%d", &cpu_s, &cpu_r) != 2)
			cpu_s = cpu_r = -1;
	}
	if (!size) {
		fprintf(stderr, "usage: tcp_stream --size BYTES [--seconds S] [--port P] [--cpus S,R]\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	int lfd = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) || listen(lfd, 1)) {
		fprintf(stderr, "bind/listen(127.0.0.1:%d) failed: %s: pick another --port\n", port,
			strerror(errno));
		return 1;
	}
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, "fork() failed: %s\n", strerror(errno));
		return 1;
	}
	if (pid == 0) {
		close(lfd);
		pin(cpu_s);
		_exit(send_side(port, size));
	}
	pin(cpu_r);
	int rc = recv_side(lfd, size, secs);
	close(lfd);
	int st;
	waitpid(pid, &st, 0);
	return rc;
}
