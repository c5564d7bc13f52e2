/* LD_PRELOAD shim: logs every open for writing, mknod, socket, connect and bind to stderr.
   Used once by benchmarks/sandbox_cuda_matrix.py to see what the CUDA driver touches. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>

static void logp(const char *what, const char *path, int flags) {
  fprintf(stderr, "TRACE %s %s flags=0x%x\n", what, path ? path : "(null)", flags);
}
#define WRAP_OPEN(name)                                                        \
  int name(const char *path, int flags, ...) {                                 \
    static int (*real)(const char *, int, ...) = 0;                            \
    if (!real) real = dlsym(RTLD_NEXT, #name);                                 \
    va_list ap; va_start(ap, flags); int mode = va_arg(ap, int); va_end(ap);   \
    if (flags & (O_WRONLY | O_RDWR | O_CREAT)) logp(#name, path, flags);       \
    return real(path, flags, mode);                                            \
  }
WRAP_OPEN(open)
WRAP_OPEN(open64)
int openat(int dirfd, const char *path, int flags, ...) {
  static int (*real)(int, const char *, int, ...) = 0;
  if (!real) real = dlsym(RTLD_NEXT, "openat");
  va_list ap; va_start(ap, flags); int mode = va_arg(ap, int); va_end(ap);
  if (flags & (O_WRONLY | O_RDWR | O_CREAT)) logp("openat", path, flags);
  return real(dirfd, path, flags, mode);
}
int socket(int domain, int type, int protocol) {
  static int (*real)(int, int, int) = 0;
  if (!real) real = dlsym(RTLD_NEXT, "socket");
  fprintf(stderr, "TRACE socket domain=%d type=%d\n", domain, type);
  return real(domain, type, protocol);
}
int connect(int fd, const struct sockaddr *addr, socklen_t len) {
  static int (*real)(int, const struct sockaddr *, socklen_t) = 0;
  if (!real) real = dlsym(RTLD_NEXT, "connect");
  const char *p = (addr && addr->sa_family == AF_UNIX) ? ((const struct sockaddr_un *)addr)->sun_path : "";
  fprintf(stderr, "TRACE connect family=%d path=%s\n", addr ? addr->sa_family : -1, p[0] ? p : (p[1] ? p + 1 : ""));
  int r = real(fd, addr, len);
  fprintf(stderr, "TRACE connect -> %d\n", r);
  return r;
}
int mknod(const char *path, mode_t mode, dev_t dev) {
  static int (*real)(const char *, mode_t, dev_t) = 0;
  if (!real) real = dlsym(RTLD_NEXT, "mknod");
  logp("mknod", path, mode);
  return real(path, mode, dev);
}
