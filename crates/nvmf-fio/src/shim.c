/*
 * The fio side of the nvmf fio ioengine: the only code that touches fio's structures.
 *
 * Compiled by build.rs against the headers of the fio source tree (fio 3.33, configured so that
 * config-host.h exists); every field access goes through fio's own struct definitions, so no
 * offset is hard-coded anywhere. The NVMe/TCP work is done in Rust (src/lib.rs) behind the
 * nvmf_fio_* functions declared below. fio finds this engine through get_ioengine(), which the
 * Rust library exports and which returns &nvmf_fio_ops.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fio.h"
#include "optgroup.h"

/* ---- implemented in Rust (src/lib.rs) ---- */
struct nvmf_fio_conf {
	const char *traddr;
	const char *subnqn;
	const char *hostnqn;
	uint32_t trsvcid;
	uint32_t hdr_digest;
	uint32_t data_digest;
	uint32_t poll;
	uint32_t iodepth;
	uint32_t thread_number;
	uint64_t max_bs;
	/* TLS 1.3 (nvme-cli's --tls, --tls-key, --tls-key-identity); appended to keep the layout. */
	const char *tls_key;
	const char *tls_key_identity;
	uint32_t tls;
	uint32_t tls_compat;
};

extern void *nvmf_fio_job_open(const struct nvmf_fio_conf *conf, int *error);
extern void nvmf_fio_job_close(void *job);
extern int nvmf_fio_file_size(void *job, const struct nvmf_fio_conf *conf, const char *filename,
			      uint64_t *size);
extern int nvmf_fio_open_file(void *job, const char *filename, uint64_t *handle);
extern int nvmf_fio_queue(void *job, void *io_u, uint64_t handle, int op, uint64_t offset,
			  void *buf, uint64_t len);
extern int nvmf_fio_commit(void *job);
extern int nvmf_fio_getevents(void *job, unsigned int min, unsigned int max, int64_t timeout_ns);
extern void *nvmf_fio_event(void *job, int index, int *error);

/* Operation codes shared with Rust. */
enum { NVMF_OP_READ = 0, NVMF_OP_WRITE = 1, NVMF_OP_TRIM = 2, NVMF_OP_FLUSH = 3 };

/* ---- engine options (nvme-cli names) ---- */
struct nvmf_fio_options {
	void *pad; /* fio: engine option structs start with a pointer it owns */
	char *traddr;
	unsigned int trsvcid;
	char *subnqn;
	char *hostnqn;
	unsigned int hdr_digest;
	unsigned int data_digest;
	unsigned int completion; /* 0 = event, 1 = poll */
	unsigned int tls;
	char *tls_key;
	char *tls_key_identity;
	unsigned int tls_compat;
};

static struct fio_option options[] = {
	{
		.name = "traddr",
		.lname = "NVMe/TCP target address",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct nvmf_fio_options, traddr),
		.help = "Target address (IPv4, IPv6 or host name), as nvme-cli --traddr",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NETIO,
	},
	{
		.name = "trsvcid",
		.lname = "NVMe/TCP target port",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct nvmf_fio_options, trsvcid),
		.def = "4420",
		.minval = 1,
		.maxval = 65535,
		.help = "Target TCP port, as nvme-cli --trsvcid",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NETIO,
	},
	{
		.name = "subnqn",
		.lname = "Subsystem NQN",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct nvmf_fio_options, subnqn),
		.help = "NVM subsystem NQN to connect to, as nvme-cli --nqn",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NETIO,
	},
	{
		.name = "hostnqn",
		.lname = "Host NQN",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct nvmf_fio_options, hostnqn),
		.help = "Host NQN (default: /etc/nvme/hostnqn, else a random uuid NQN)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NETIO,
	},
	{
		.name = "hdr_digest",
		.lname = "Header digest",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct nvmf_fio_options, hdr_digest),
		.def = "0",
		.help = "Ask for PDU header digests (CRC32C)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NETIO,
	},
	{
		.name = "data_digest",
		.lname = "Data digest",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct nvmf_fio_options, data_digest),
		.def = "0",
		.help = "Ask for PDU data digests (CRC32C)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NETIO,
	},
	{
		.name = "completion",
		.lname = "Completion mode",
		.type = FIO_OPT_STR,
		.off1 = offsetof(struct nvmf_fio_options, completion),
		.def = "event",
		.help = "How getevents waits: poll (spin on the socket) or event (sleep in ppoll)",
		.posval = {
			{ .ival = "event", .oval = 0, .help = "sleep in ppoll(2) until the socket is readable" },
			{ .ival = "poll", .oval = 1, .help = "spin on non-blocking reads" },
		},
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NETIO,
	},
	{
		.name = "tls",
		.lname = "TLS 1.3",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct nvmf_fio_options, tls),
		.def = "0",
		.help = "Secure the connection with TLS 1.3 and a PSK (needs tls_key), as nvme-cli --tls",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NETIO,
	},
	{
		.name = "tls_key",
		.lname = "TLS PSK",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct nvmf_fio_options, tls_key),
		.help = "Configured PSK, NVMeTLSkey-1:HH:<base64>: as nvme gen-tls-key prints it; implies tls",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NETIO,
	},
	{
		.name = "tls_key_identity",
		.lname = "TLS PSK identity",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct nvmf_fio_options, tls_key_identity),
		.help = "PSK identity version to offer: 1 (NVMe1R.., default), 0 (NVMe0R..), or an identity "
			"written out whose version is used",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NETIO,
	},
	{
		.name = "tls_compat",
		.lname = "TLS PSK compat derivation",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct nvmf_fio_options, tls_compat),
		.def = "0",
		.help = "Derive the TLS PSK as libnvme before 1.16 does (nvme-cli --compat; Debian trixie's "
			"nvme-cli 2.13), for a kernel target holding such keys",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_NETIO,
	},
	{
		.name = NULL,
	},
};

static unsigned long long max_bs(struct thread_data *td)
{
	unsigned long long m = td->o.max_bs[DDIR_READ];

	if (td->o.max_bs[DDIR_WRITE] > m)
		m = td->o.max_bs[DDIR_WRITE];
	if (td->o.max_bs[DDIR_TRIM] > m)
		m = td->o.max_bs[DDIR_TRIM];
	return m;
}

static void fill_conf(struct thread_data *td, struct nvmf_fio_conf *c)
{
	struct nvmf_fio_options *o = td->eo;

	memset(c, 0, sizeof(*c));
	c->traddr = o ? o->traddr : NULL;
	c->subnqn = o ? o->subnqn : NULL;
	c->hostnqn = o ? o->hostnqn : NULL;
	c->trsvcid = o ? o->trsvcid : 4420;
	c->hdr_digest = o ? o->hdr_digest : 0;
	c->data_digest = o ? o->data_digest : 0;
	c->poll = o ? o->completion : 0;
	c->iodepth = td->o.iodepth ? td->o.iodepth : 1;
	c->thread_number = td->thread_number;
	c->max_bs = max_bs(td);
	c->tls = o ? o->tls : 0;
	c->tls_key = o ? o->tls_key : NULL;
	c->tls_key_identity = o ? o->tls_key_identity : NULL;
	c->tls_compat = o ? o->tls_compat : 0;
}

extern struct ioengine_ops nvmf_fio_ops;

/* td_verror() calls __td_verror, which the fio binary does not export: set the fields here. */
static void set_error(struct thread_data *td, int err, const char *what)
{
	if (!td->error) {
		td->error = err;
		snprintf(td->verror, sizeof(td->verror), "%s: %s", what, strerror(err));
	}
}

static int nvmf_init(struct thread_data *td)
{
	struct nvmf_fio_conf c;
	int err = 0;

	/* A cheap check that this build's struct thread_data matches the running fio's. */
	if (td->io_ops != &nvmf_fio_ops) {
		fprintf(stderr, "nvmf: engine built against fio headers that do not match this fio "
				"(struct thread_data differs); rebuild with the running fio's source\n");
		return 1;
	}
	fill_conf(td, &c);
	td->io_ops_data = nvmf_fio_job_open(&c, &err);
	if (!td->io_ops_data) {
		set_error(td, err ? err : EIO, "nvmf init");
		return 1;
	}
	return 0;
}

static void nvmf_cleanup(struct thread_data *td)
{
	if (td->io_ops_data) {
		nvmf_fio_job_close(td->io_ops_data);
		td->io_ops_data = NULL;
	}
}

static int nvmf_get_file_size(struct thread_data *td, struct fio_file *f)
{
	struct nvmf_fio_conf c;
	uint64_t size = 0;
	int r;

	if (fio_file_size_known(f))
		return 0;
	fill_conf(td, &c);
	r = nvmf_fio_file_size(td->io_ops_data, &c, f->file_name, &size);
	if (r) {
		set_error(td, r, "nvmf get_file_size");
		return 1;
	}
	f->real_file_size = size;
	fio_file_set_size_known(f);
	return 0;
}

static int nvmf_open_file(struct thread_data *td, struct fio_file *f)
{
	uint64_t handle = 0;
	int r;

	if (!td->io_ops_data)
		return 1;
	r = nvmf_fio_open_file(td->io_ops_data, f->file_name, &handle);
	if (r) {
		set_error(td, r, "nvmf open_file");
		return 1;
	}
	f->engine_pos = handle;
	return 0;
}

static int nvmf_close_file(struct thread_data *td, struct fio_file *f)
{
	return 0;
}

static enum fio_q_status nvmf_queue(struct thread_data *td, struct io_u *io_u)
{
	int op, r;

	fio_ro_check(td, io_u);
	switch (io_u->ddir) {
	case DDIR_READ: op = NVMF_OP_READ; break;
	case DDIR_WRITE: op = NVMF_OP_WRITE; break;
	case DDIR_TRIM: op = NVMF_OP_TRIM; break;
	case DDIR_SYNC:
	case DDIR_DATASYNC:
	case DDIR_SYNC_FILE_RANGE: op = NVMF_OP_FLUSH; break;
	default:
		io_u->error = EINVAL;
		return FIO_Q_COMPLETED;
	}
	r = nvmf_fio_queue(td->io_ops_data, io_u, io_u->file->engine_pos, op, io_u->offset,
			   io_u->xfer_buf, io_u->xfer_buflen);
	if (r == 0)
		return FIO_Q_QUEUED;
	if (r == 1)
		return FIO_Q_BUSY;
	io_u->error = -r;
	return FIO_Q_COMPLETED;
}

static int nvmf_commit(struct thread_data *td)
{
	int r = nvmf_fio_commit(td->io_ops_data);

	if (r < 0)
		set_error(td, -r, "nvmf commit");
	return r;
}

static int nvmf_getevents(struct thread_data *td, unsigned int min, unsigned int max,
			  const struct timespec *t)
{
	int64_t ns = t ? (int64_t)t->tv_sec * 1000000000LL + t->tv_nsec : -1;

	int r = nvmf_fio_getevents(td->io_ops_data, min, max, ns);

	/* fio records a negative getevents result as a negative errno: record it first. */
	if (r < 0)
		set_error(td, -r, "nvmf getevents");
	return r;
}

static struct io_u *nvmf_event(struct thread_data *td, int event)
{
	int error = 0;
	struct io_u *io_u = nvmf_fio_event(td->io_ops_data, event, &error);

	if (io_u) {
		io_u->error = error;
		io_u->resid = error ? io_u->xfer_buflen : 0;
	}
	return io_u;
}

struct ioengine_ops nvmf_fio_ops = {
	.name = "nvmf",
	.version = FIO_IOOPS_VERSION,
	.flags = FIO_DISKLESSIO | FIO_NOEXTEND | FIO_NODISKUTIL,
	.init = nvmf_init,
	.queue = nvmf_queue,
	.commit = nvmf_commit,
	.getevents = nvmf_getevents,
	.event = nvmf_event,
	.cleanup = nvmf_cleanup,
	.open_file = nvmf_open_file,
	.close_file = nvmf_close_file,
	.get_file_size = nvmf_get_file_size,
	.options = options,
	.option_struct_size = sizeof(struct nvmf_fio_options),
};

struct ioengine_ops *nvmf_fio_shim_ops(void)
{
	return &nvmf_fio_ops;
}
