// loopback_copy: what sending 512 KiB frames over a loopback TCP socket
// costs the writer, by write(2) (mode 0) or by vmsplice(2) into a pipe and
// splice(2) into the socket (mode 1), with a thread reading them. It prints
// the writer thread's CPU time per frame and the wall time per frame.
// BENCHMARKS.md ("TCP at 1 MiB with 2 ranks: both sides at the copy floor").
//
//   gcc -O2 -o /tmp/loopback_copy bench/peers/loopback_copy.c -lpthread
//   for i in 1 2 3; do /tmp/loopback_copy 0; /tmp/loopback_copy 1; done
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define FRAME (512 * 1024)
static int reader_fd;
static const int frames = 2000;

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *reader(void *arg) {
	(void)arg;
	char *b = aligned_alloc(4096, FRAME);
	for (int i = 0; i < frames; i++) {
		for (size_t got = 0; got < FRAME;) {
			ssize_t n = read(reader_fd, b + got, FRAME - got);
			if (n <= 0) {
				perror("read");
				exit(1);
			}
			got += n;
		}
	}
	return NULL;
}

int main(int argc, char **argv) {
	int mode = argc > 1 ? atoi(argv[1]) : 0, one = 1;
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	socklen_t alen = sizeof a;
	if (bind(ls, (void *)&a, sizeof a) || listen(ls, 1) || getsockname(ls, (void *)&a, &alen)) {
		perror("listen");
		return 1;
	}
	int w = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(w, (void *)&a, sizeof a)) {
		perror("connect");
		return 1;
	}
	reader_fd = accept(ls, NULL, NULL);
	setsockopt(w, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	pthread_t th;
	pthread_create(&th, NULL, reader, NULL);
	char *buf = aligned_alloc(4096, FRAME);
	memset(buf, 1, FRAME);
	int p[2];
	if (pipe(p)) {
		perror("pipe");
		return 1;
	}
	fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
	double t0 = now();
	for (int i = 0; i < frames; i++) {
		for (size_t off = 0; off < FRAME;) {
			if (mode == 0) {
				ssize_t n = write(w, buf + off, FRAME - off);
				if (n < 0) {
					perror("write");
					return 1;
				}
				off += n;
				continue;
			}
			struct iovec v = {buf + off, FRAME - off};
			ssize_t m = vmsplice(p[1], &v, 1, 0);
			if (m < 0) {
				perror("vmsplice");
				return 1;
			}
			for (ssize_t left = m; left > 0;) {
				ssize_t n = splice(p[0], NULL, w, NULL, left, SPLICE_F_MORE);
				if (n < 0) {
					perror("splice");
					return 1;
				}
				left -= n;
			}
			off += m;
		}
	}
	struct rusage ru;
	getrusage(RUSAGE_THREAD, &ru);
	double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
	pthread_join(th, NULL);
	double t = now() - t0;
	printf("%s: writer CPU %.1f us per 512 KiB frame; %.1f us per frame, %.2f GB/s\n",
	       mode == 0 ? "write" : "vmsplice+splice", cpu / frames * 1e6, t / frames * 1e6, (double)FRAME * frames / t / 1e9);
	return 0;
}
