/*
 * bench_redis.h -- what the Redis benchmarks (bench_stream.c, bench_handoff.c) share: a
 * loopback connection, a throw-away redis-server on a free port (stopped by the caller, by
 * pid), and the end of a RESP value (the floors count replies without parsing them).
 * Included once per program; the includes it needs come first in each.
 */
#ifndef LH_BENCH_REDIS_H
#define LH_BENCH_REDIS_H

static int tcp_to(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
        if (s >= 0) close(s);
        return -1;
    }
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return s;
}

static pid_t start_server(int *port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(s, (struct sockaddr *)&a, &len) != 0)
        return -1;
    close(s);
    *port = ntohs(a.sin_port);
    char p[16];
    snprintf(p, sizeof p, "%d", *port);
    pid_t pid = fork();
    if (pid == 0) {
        execlp("redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--loglevel", "warning", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 500; i++) {
        int c = tcp_to(*port);
        if (c >= 0) {
            close(c);
            return pid;
        }
        usleep(10000);
    }
    return -1;
}

/* End of the RESP value at b[i..n), or -1 while incomplete. */
static long value_end(const char *b, long n, long i) {
    const char *nl = i < n ? memchr(b + i, '\n', (size_t)(n - i)) : NULL;
    if (nl == NULL) return -1;
    long line = nl - b + 1, len = atol(b + i + 1);
    switch (b[i]) {
    case '$': case '=': case '!':
        return len < 0 ? line : line + len + 2 <= n ? line + len + 2 : -1;
    case '*': case '~': case '>': case '%': {
        long j = line;
        for (long k = b[i] == '%' ? 2 * len : len; k > 0 && j >= 0; k--) j = value_end(b, n, j);
        return j;
    }
    default:
        return line;
    }
}

#endif
