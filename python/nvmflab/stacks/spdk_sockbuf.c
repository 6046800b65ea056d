/*
 * LD_PRELOAD shim for a load generator that cannot size its socket buffers: every
 * setsockopt(SOL_SOCKET, SO_RCVBUF or SO_SNDBUF) asking for less than NVMFLAB_SOCKBUF_MIN
 * bytes asks for that many instead. SPDK 24.01's spdk_nvme_perf gives its `ssl` socket 4 KiB
 * send and 64 KiB receive buffers and has no option to change them (spdk_sockbuf.py); this
 * gives it what its `posix` socket has. Without the variable, or with a value that is not a
 * positive number, every call passes through unchanged.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/socket.h>

typedef int (*setsockopt_fn)(int, int, int, const void *, socklen_t);

static long floor_bytes(void)
{
	const char *text = getenv("NVMFLAB_SOCKBUF_MIN");
	char *end;
	long value;

	if (text == NULL || *text == '\0') {
		return 0;
	}
	errno = 0;
	value = strtol(text, &end, 10);
	if (errno != 0 || *end != '\0' || value <= 0 || value > INT_MAX) {
		return 0;
	}
	return value;
}

int setsockopt(int fd, int level, int name, const void *value, socklen_t len)
{
	static setsockopt_fn real;
	int raised;

	if (real == NULL) {
		real = (setsockopt_fn)dlsym(RTLD_NEXT, "setsockopt");
		if (real == NULL) {
			errno = ENOSYS;
			return -1;
		}
	}
	if (level == SOL_SOCKET && (name == SO_RCVBUF || name == SO_SNDBUF) && value != NULL &&
	    len == sizeof(int)) {
		long floor = floor_bytes();
		if (floor > 0 && *(const int *)value < floor) {
			raised = (int)floor;
			return real(fd, level, name, &raised, sizeof(raised));
		}
	}
	return real(fd, level, name, value, len);
}
