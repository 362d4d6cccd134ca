/* optgym: picolibc's stdin, stdout and stderr on the host's own, for a bare-metal program run under QEMU.
 *
 * picolibc's libsemihost gives the three streams one semihosting console: stdout and stderr come out mixed, and
 * under QEMU 7.2 stdin never reports end of file, so a program that reads its input to the end hangs. This
 * object, linked before -lc -lsemihost (optgym.corpus.target.BareMetalRuntime), defines the three streams
 * itself, each on the host's /dev/stdin, /dev/stdout or /dev/stderr opened through semihosting (SYS_OPEN, which
 * QEMU serves from the host's files): separate streams, and input that ends. stdout is buffered, stderr by line;
 * both are flushed at exit. Only for programs run under a debugger or an emulator that serves semihosting: on a
 * chip without one, every semihosting call traps.
 */
#include <semihost.h>
#include <stdio.h>

struct host_stream {
	FILE file;              /* first: a FILE * of this stream points here */
	const char *path;
	int mode;               /* SH_OPEN_* */
	int line_buffered;
	int fd;                 /* -2: not opened yet; -1: could not be opened */
	unsigned used;
	char buffer[256];
};

static int host_fd(struct host_stream *s)
{
	if (s->fd == -2)
		s->fd = sys_semihost_open(s->path, s->mode);
	return s->fd;
}

static int host_flush(FILE *file)
{
	struct host_stream *s = (struct host_stream *)file;
	if (s->used && host_fd(s) >= 0)
		sys_semihost_write(s->fd, s->buffer, s->used);
	s->used = 0;
	return 0;
}

static int host_put(char c, FILE *file)
{
	struct host_stream *s = (struct host_stream *)file;
	s->buffer[s->used++] = c;
	if (s->used == sizeof s->buffer || (c == '\n' && s->line_buffered))
		host_flush(file);
	return (unsigned char)c;
}

static int host_get(FILE *file)
{
	struct host_stream *s = (struct host_stream *)file;
	unsigned char c;
	if (host_fd(s) < 0)
		return _FDEV_ERR;
	/* SYS_READ answers how many bytes it did NOT read: 0 is one byte read, 1 the end of the input */
	return sys_semihost_read(s->fd, &c, 1) == 0 ? c : _FDEV_EOF;
}

static struct host_stream host_stdin = {
	FDEV_SETUP_STREAM(NULL, host_get, NULL, _FDEV_SETUP_READ), "/dev/stdin", SH_OPEN_R_B, 0, -2, 0, {0}};
static struct host_stream host_stdout = {
	FDEV_SETUP_STREAM(host_put, NULL, host_flush, _FDEV_SETUP_WRITE), "/dev/stdout", SH_OPEN_A_B, 0, -2, 0, {0}};
static struct host_stream host_stderr = {
	FDEV_SETUP_STREAM(host_put, NULL, host_flush, _FDEV_SETUP_WRITE), "/dev/stderr", SH_OPEN_A_B, 1, -2, 0, {0}};

FILE *const stdin = &host_stdin.file;
FILE *const stdout = &host_stdout.file;
FILE *const stderr = &host_stderr.file;

/* exit() runs destructors: what is still buffered reaches the host */
__attribute__((destructor)) static void host_streams_flush(void)
{
	host_flush(stdout);
	host_flush(stderr);
}
