/*
 * Guest-side relay for the 9p socket transport: joins a virtio-serial port
 * (whose host end is the 9p server's unix socket) to a unix socket in the
 * guest, so the kernel can `mount -t 9p -o trans=unix SOCK`.
 * (trans=fd on the port itself does not work: the virtio console driver has
 * no write_iter.)
 *
 * Usage: relay PORT_DEVICE SOCKET_PATH
 * Listens on SOCKET_PATH, serves one connection at a time, copying bytes both
 * ways until either side closes. Exits when the port reaches end of file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define BUF_SIZE (256 * 1024)

static int write_all(int fd, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                struct pollfd pfd = {.fd = fd, .events = POLLOUT};
                poll(&pfd, 1, 1000);
                continue;
            }
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Copies one chunk from -> to. Returns 1 on data, 0 on EOF, -1 on error. */
static int pump(int from, int to, char *buf)
{
    ssize_t n = read(from, buf, BUF_SIZE);
    if (n < 0)
        return (errno == EINTR || errno == EAGAIN) ? 1 : -1;
    if (n == 0)
        return 0;
    return write_all(to, buf, (size_t)n) == 0 ? 1 : -1;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s PORT_DEVICE SOCKET_PATH\n", argv[0]);
        return 2;
    }
    int port = open(argv[1], O_RDWR | O_CLOEXEC);
    if (port < 0) {
        fprintf(stderr, "relay: open %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(argv[2]) >= sizeof(addr.sun_path)) {
        fprintf(stderr, "relay: socket path too long\n");
        return 2;
    }
    strcpy(addr.sun_path, argv[2]);
    unlink(argv[2]);
    int lsock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lsock < 0 || bind(lsock, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(lsock, 1) < 0) {
        fprintf(stderr, "relay: listen on %s: %s\n", argv[2], strerror(errno));
        return 1;
    }
    char *buf = malloc(BUF_SIZE);
    if (!buf)
        return 1;
    for (;;) {
        int conn = accept4(lsock, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "relay: accept: %s\n", strerror(errno));
            return 1;
        }
        for (;;) {
            struct pollfd pfd[2] = {{.fd = port, .events = POLLIN}, {.fd = conn, .events = POLLIN}};
            if (poll(pfd, 2, -1) < 0) {
                if (errno == EINTR)
                    continue;
                return 1;
            }
            if (pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) {
                int rc = pump(port, conn, buf);
                if (rc <= 0) {
                    fprintf(stderr, "relay: port %s\n", rc == 0 ? "closed" : strerror(errno));
                    close(conn);
                    return rc == 0 ? 0 : 1;
                }
            }
            if (pfd[1].revents & (POLLIN | POLLHUP | POLLERR)) {
                if (pump(conn, port, buf) <= 0)
                    break; /* the mount went away; wait for the next one */
            }
        }
        close(conn);
    }
}
