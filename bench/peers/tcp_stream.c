/* The ring ceiling for `bench allreduce`: what a ring all-reduce over this
 * machine's TCP could reach at best. An all-reduce of S bytes over n ranks
 * must send and receive at least 2(n-1)/n * S bytes per rank (Patarasuk and
 * Yuan's bandwidth bound, which the ring meets). Here every rank streams
 * exactly that much per operation to its right neighbour and reads as much
 * from its left one, both at once, with no sums, no framing and nothing to
 * wait for between operations: a ring all-reduce's traffic with everything
 * else taken out. Its busbw (bytes / time * 2(n-1)/n) bounds what a ring
 * (ours, gloo's, OpenMPI's) can reach over TCP. With 2 ranks every
 * all-reduce is this one exchange, so there it bounds any implementation.
 * With more ranks than cores, an algorithm of fewer steps can pass it:
 * OpenMPI's recursive halving and doubling (Rabenseifner) at 4 ranks on 2
 * cores, 1 MiB (BENCHMARKS.md).
 *
 * Args: RANK WORLD ADDR0,ADDR1,... SIZE:ITERS...  (ADDR is 127.0.0.1:PORT)
 * Prints one JSON line per size, as the other peers do.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what) {
	perror(what);
	exit(1);
}

static struct sockaddr_in addr_of(const char *list, int i) {
	char buf[4096];
	snprintf(buf, sizeof buf, "%s", list);
	char *tok = strtok(buf, ",");
	for (int k = 0; k < i && tok; k++) tok = strtok(NULL, ",");
	if (!tok) {
		fprintf(stderr, "tcp_stream: no address for rank %d\n", i);
		exit(2);
	}
	char *colon = strrchr(tok, ':');
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(colon + 1))};
	*colon = 0;
	inet_pton(AF_INET, tok, &a.sin_addr);
	return a;
}

/* stream sends total bytes to right and reads total bytes from left, both
 * without blocking, sleeping in poll(2) only when neither can move. */
static void stream(int right, int left, char *out, char *in, size_t chunk, size_t total) {
	size_t sent = 0, got = 0;
	while (sent < total || got < total) {
		int moved = 0;
		if (sent < total) {
			size_t off = sent % chunk, n = chunk - off;
			if (n > total - sent) n = total - sent;
			ssize_t w = write(right, out + off, n);
			if (w > 0) sent += w, moved = 1;
			else if (w < 0 && errno != EAGAIN && errno != EINTR) die("write");
		}
		if (got < total) {
			size_t off = got % chunk, n = chunk - off;
			if (n > total - got) n = total - got;
			ssize_t r = read(left, in + off, n);
			if (r > 0) got += r, moved = 1;
			else if (r == 0) {
				fprintf(stderr, "tcp_stream: left neighbour closed\n");
				exit(1);
			} else if (errno != EAGAIN && errno != EINTR) die("read");
		}
		if (!moved) {
			struct pollfd p[2] = {{right, sent < total ? POLLOUT : 0, 0}, {left, got < total ? POLLIN : 0, 0}};
			poll(p, 2, 1000);
		}
	}
}

int main(int argc, char **argv) {
	if (argc < 5) {
		fprintf(stderr, "usage: tcp_stream RANK WORLD ADDRS SIZE:ITERS...\n");
		return 2;
	}
	int rank = atoi(argv[1]), world = atoi(argv[2]), one = 1;
	struct sockaddr_in me = addr_of(argv[3], rank), next = addr_of(argv[3], (rank + 1) % world);
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(ls, (void *)&me, sizeof me) || listen(ls, 4)) die("listen");
	int right = -1;
	for (int tries = 0; right < 0; tries++) {
		int s = socket(AF_INET, SOCK_STREAM, 0);
		if (connect(s, (void *)&next, sizeof next) == 0) {
			right = s;
			break;
		}
		close(s);
		if (tries > 2000) die("connect");
		usleep(5000);
	}
	int left = accept(ls, NULL, NULL);
	if (left < 0) die("accept");
	close(ls);
	setsockopt(right, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	setsockopt(left, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	fcntl(right, F_SETFL, O_NONBLOCK);
	fcntl(left, F_SETFL, O_NONBLOCK);
	for (int a = 4; a < argc; a++) {
		long size, iters;
		if (sscanf(argv[a], "%ld:%ld", &size, &iters) != 2) {
			fprintf(stderr, "tcp_stream: %s is not SIZE:ITERS\n", argv[a]);
			return 2;
		}
		/* The ring's traffic per operation: 2(n-1) chunks of size/n. */
		size_t per_op = 2 * (size_t)(world - 1) * (size_t)(size / world);
		if (per_op == 0) per_op = 1;
		char *out = malloc(per_op), *in = malloc(per_op);
		memset(out, 1, per_op);
		memset(in, 0, per_op);
		long warm = iters / 10 < 2 ? 2 : iters / 10;
		stream(right, left, out, in, per_op, per_op * warm);
		char token = 0;
		stream(right, left, &token, &token, 1, 1); /* all ranks are here */
		double t0 = now();
		stream(right, left, out, in, per_op, per_op * iters);
		double elapsed = now() - t0;
		printf("{\"rank\": %d, \"bytes\": %ld, \"iters\": %ld, \"seconds\": %.9f}\n", rank, size, iters, elapsed);
		fflush(stdout);
		free(out);
		free(in);
	}
	stream(right, left, &(char){0}, &(char){0}, 1, 1);
	return 0;
}
