/* Backend lanes: gives each thread of one lld process its own FIFO names for LLVM's interactive channels.
 *
 * clang-22 names each decision's channel with one command-line option per process (a static cl::opt), so
 * the ThinLTO backends that lld runs side by side on its threads would all open the same two FIFOs. Preloaded
 * into lld (LD_PRELOAD), this library rewrites the paths those threads open: the first thread that opens a
 * file under $OPTGYM_LANE_DIR keeps the names (lane 0), the k-th thread gets $OPTGYM_LANE_DIR/lane<k>/...
 * A thread keeps its lane for life, and lld runs one backend at a time per thread, so each lane is a
 * sequence of sessions, as in a link run with --thinlto-jobs=1. Only paths under $OPTGYM_LANE_DIR change;
 * a thread beyond $OPTGYM_LANES is refused (EBUSY), which fails the link instead of mixing two streams.
 * Built by optgym.toolchain.lanes with the system's clang; nothing in LLVM is modified.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *lane_dir;
static size_t lane_dir_length;
static int lane_count = 1;
static atomic_int threads_seen;
static __thread int this_lane = -1;

__attribute__((constructor)) static void read_environment(void) {
    lane_dir = getenv("OPTGYM_LANE_DIR");
    lane_dir_length = lane_dir ? strlen(lane_dir) : 0;
    const char *count = getenv("OPTGYM_LANES");
    lane_count = count ? atoi(count) : 1;
}

/* The path this thread opens instead of `path` (`buffer` holds a rewritten one), or NULL with errno set. */
static const char *lane_path(const char *path, char *buffer, size_t size) {
    if (!lane_dir || !path || strncmp(path, lane_dir, lane_dir_length) != 0 || path[lane_dir_length] != '/')
        return path;
    if (this_lane < 0)
        this_lane = atomic_fetch_add(&threads_seen, 1);
    if (this_lane >= lane_count) {
        errno = EBUSY;
        return NULL;
    }
    if (this_lane == 0)
        return path;
    if (snprintf(buffer, size, "%s/lane%d%s", lane_dir, this_lane, path + lane_dir_length) >= (int)size) {
        errno = ENAMETOOLONG;
        return NULL;
    }
    return buffer;
}

#define MODE_ARGUMENT(flags)                                                                                   \
    mode_t mode = 0;                                                                                           \
    if ((flags) & (O_CREAT | O_TMPFILE)) {                                                                     \
        va_list arguments;                                                                                     \
        va_start(arguments, flags);                                                                            \
        mode = va_arg(arguments, mode_t);                                                                      \
        va_end(arguments);                                                                                     \
    }

#define WRAP_OPEN(name)                                                                                        \
    int name(const char *path, int flags, ...) {                                                               \
        static int (*real)(const char *, int, ...);                                                            \
        if (!real)                                                                                             \
            real = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, #name);                                   \
        MODE_ARGUMENT(flags)                                                                                   \
        char buffer[4096];                                                                                     \
        const char *chosen = lane_path(path, buffer, sizeof buffer);                                           \
        return chosen ? real(chosen, flags, mode) : -1;                                                        \
    }

#define WRAP_OPENAT(name)                                                                                      \
    int name(int directory, const char *path, int flags, ...) {                                                \
        static int (*real)(int, const char *, int, ...);                                                       \
        if (!real)                                                                                             \
            real = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, #name);                              \
        MODE_ARGUMENT(flags)                                                                                   \
        char buffer[4096];                                                                                     \
        const char *chosen = lane_path(path, buffer, sizeof buffer);                                           \
        return chosen ? real(directory, chosen, flags, mode) : -1;                                             \
    }

WRAP_OPEN(open)
WRAP_OPEN(open64)
WRAP_OPENAT(openat)
WRAP_OPENAT(openat64)
