/* The minimal C host: the floor for any host of LLVM's interactive MLGO channel.
   It opens CHANNEL_BASE.in for writing first, then CHANNEL_BASE.out, and answers every decision with
   the compiler's own answer (inlining_default, the last feature), so its object is byte-identical to a
   plain compile. Shared by bench/host_overhead.py (one module at a time) and bench/build.py (a whole
   CMake build, through a CC/CXX wrapper). Prints: decisions t_open t_header t_last t_eof cpu_seconds.
   With a second argument "priority" it answers the register allocator's priority channel instead
   (features li_size int64, stage int64, weight float; advice float): 10^6 * weight, at most 4e9 —
   optgym's start rule for that problem, so its object is the optgym host's with that rule, byte for byte
   (bench/regalloc_host_cost.py). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char line[1 << 20];

int main(int argc, char **argv) {
    int priority = argc == 3 && strcmp(argv[2], "priority") == 0;
    if (argc != 2 && !priority) {
        fprintf(stderr, "usage: %s CHANNEL_BASE [priority]\n", argv[0]);
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    char in_path[4096], out_path[4096];
    snprintf(in_path, sizeof in_path, "%s.in", argv[1]);
    snprintf(out_path, sizeof out_path, "%s.out", argv[1]);
    /* Back off from 20 us to 1 ms: a tighter loop wakes often enough to slow clang down on a busy
       machine (each wake-up preempts it), a looser one adds latency. */
    struct timespec nap = {0, 20000};
    double give_up = now() + 600.0;
    int in_fd;
    for (;;) {
        in_fd = open(in_path, O_WRONLY | O_NONBLOCK);
        if (in_fd >= 0) break;
        if (errno != ENXIO) { perror(in_path); return 3; }
        if (now() > give_up) { fprintf(stderr, "the compiler never opened %s\n", in_path); return 3; }
        nanosleep(&nap, NULL);
        if (nap.tv_nsec < 1000000) nap.tv_nsec *= 2;
    }
    double t_open = now();
    fcntl(in_fd, F_SETFL, fcntl(in_fd, F_GETFL) & ~O_NONBLOCK);
    FILE *out = fopen(out_path, "rb");
    if (!out) { perror(out_path); return 3; }
    if (!fgets(line, sizeof line, out) || !strchr(line, '\n')) { fprintf(stderr, "no header line\n"); return 4; }
    double t_header = now();
    /* Crude but enough for the inliner: every tensor is int64_t [1]; count the features' names. The
       priority channel's three are fixed: int64 li_size, int64 stage, float weight. */
    long features = 0;
    for (char *p = line; (p = strstr(p, "\"name\"")) != NULL; p += 6) features++;
    if (strstr(line, "\"advice\"")) features--;
    if (features <= 0 || (priority && features != 3)) { fprintf(stderr, "unexpected features in the header\n"); return 4; }
    size_t size = priority ? 8 + 8 + 4 : (size_t)features * 8;
    char *tensor = malloc(size + 1);
    long decisions = 0;
    double t_last = t_header;
    while (fgets(line, sizeof line, out)) {
        if (strncmp(line, "{\"context\"", 10) == 0) continue;
        if (strncmp(line, "{\"observation\"", 14) != 0) { fprintf(stderr, "unexpected: %.80s\n", line); return 5; }
        if (fread(tensor, 1, size + 1, out) != size + 1 || tensor[size] != '\n') {
            fprintf(stderr, "observation %ld cut short\n", decisions);
            return 5;
        }
        if (priority) {
            float weight;
            memcpy(&weight, tensor + 16, 4);
            /* as optgym's log-linear scorer computes it, so the two agree to the last bit */
            double log_value = log(1e6) + log(weight > 1e-30 ? (double)weight : 1e-30);
            float answer = (float)(log_value >= log(4e9) ? 4e9 : exp(log_value));
            if (write(in_fd, &answer, 4) != 4) { perror("write advice"); return 6; }
        } else {
            int64_t answer;
            memcpy(&answer, tensor + size - 8, 8); /* inlining_default, the last feature */
            if (write(in_fd, &answer, 8) != 8) { perror("write advice"); return 6; }
        }
        decisions++;
        t_last = now();
    }
    double t_eof = now();
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
    printf("%ld %.9f %.9f %.9f %.9f %.9f\n", decisions, t_open, t_header, t_last, t_eof, cpu);
    return 0;
}
