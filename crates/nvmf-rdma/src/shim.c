/* A thin C layer over librdmacm and libibverbs for nvmf-rdma. ibv_post_send, ibv_post_recv and
 * ibv_poll_cq are static inline in verbs.h, and the CM and verbs structs are large: this file
 * exposes only flat calls with plain arguments, so the Rust side declares no C struct but one
 * small event and one work completion record defined here. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <stdint.h>
#include <stdlib.h>
#include <netdb.h>
#include <poll.h>
#include <endian.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

static int set_nonblocking(int fd)
{
	int flags = fcntl(fd, F_GETFL);
	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

/* A listening CM id on its own non-blocking event channel. Returns 0 or -errno; the bound port
 * (useful when 0 was asked) is written to *bound_port. */
int nr_listen(const char *addr, const char *port, int backlog, struct rdma_event_channel **ch_out,
	      struct rdma_cm_id **id_out, uint16_t *bound_port)
{
	struct rdma_addrinfo hints, *res = NULL;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id = NULL;
	int ret;

	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
	hints.ai_port_space = RDMA_PS_TCP;
	ret = rdma_getaddrinfo(addr, port, &hints, &res);
	if (ret)
		return errno ? -errno : -EINVAL;
	ch = rdma_create_event_channel();
	if (!ch) {
		ret = errno ? -errno : -ENODEV;
		rdma_freeaddrinfo(res);
		return ret;
	}
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) || rdma_bind_addr(id, res->ai_src_addr) ||
	    rdma_listen(id, backlog)) {
		ret = errno ? -errno : -EINVAL;
		if (id)
			rdma_destroy_id(id);
		rdma_destroy_event_channel(ch);
		rdma_freeaddrinfo(res);
		return ret;
	}
	rdma_freeaddrinfo(res);
	ret = set_nonblocking(ch->fd);
	if (ret) {
		rdma_destroy_id(id);
		rdma_destroy_event_channel(ch);
		return ret;
	}
	*bound_port = be16toh(rdma_get_src_port(id));
	*ch_out = ch;
	*id_out = id;
	return 0;
}

int nr_channel_fd(struct rdma_event_channel *ch) { return ch->fd; }

void nr_listener_close(struct rdma_event_channel *ch, struct rdma_cm_id *id)
{
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

/* One CM event, copied out so that it can be acknowledged at once. */
struct nr_event {
	int type;
	int status;
	struct rdma_cm_id *id;
	uint8_t private_data[64];
	uint8_t private_data_len;
	uint8_t responder_resources;
	uint8_t initiator_depth;
};

/* 1 with *ev filled, 0 when no event waits, -errno on error. */
int nr_get_event(struct rdma_event_channel *ch, struct nr_event *ev)
{
	struct rdma_cm_event *e;
	uint8_t len;

	if (rdma_get_cm_event(ch, &e))
		return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
	memset(ev, 0, sizeof(*ev));
	ev->type = e->event;
	ev->status = e->status;
	ev->id = e->id;
	/* A request's, an accept's (ESTABLISHED on the host) and a reject's private data. */
	if (e->event == RDMA_CM_EVENT_CONNECT_REQUEST || e->event == RDMA_CM_EVENT_ESTABLISHED ||
	    e->event == RDMA_CM_EVENT_REJECTED) {
		len = e->param.conn.private_data_len;
		if (len > sizeof(ev->private_data))
			len = sizeof(ev->private_data);
		if (e->param.conn.private_data)
			memcpy(ev->private_data, e->param.conn.private_data, len);
		ev->private_data_len = len;
		ev->responder_resources = e->param.conn.responder_resources;
		ev->initiator_depth = e->param.conn.initiator_depth;
	}
	rdma_ack_cm_event(e);
	return 1;
}

/* ---- the active (host) side ---- */

/* Waits up to timeout_ms for the next event on a non-blocking channel: 1 with *ev, 0 on
 * timeout, -errno. */
static int wait_event(struct rdma_event_channel *ch, struct nr_event *ev, int timeout_ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	int r = nr_get_event(ch, ev);

	if (r)
		return r;
	r = poll(&p, 1, timeout_ms);
	if (r < 0)
		return -errno;
	return r ? nr_get_event(ch, ev) : 0;
}

/* Resolves addr:port (address, then route) on a new id of a new non-blocking channel, waiting
 * up to timeout_ms for each step. Returns 0 or -errno (-ETIMEDOUT, -EHOSTUNREACH when the CM
 * reports an error event, its status in *cm_status). */
int nr_resolve(const char *addr, const char *port, int timeout_ms, struct rdma_event_channel **ch_out,
	       struct rdma_cm_id **id_out, int *cm_status)
{
	struct rdma_addrinfo hints, *res = NULL;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id = NULL;
	struct nr_event ev;
	int ret, step;

	*cm_status = 0;
	memset(&hints, 0, sizeof(hints));
	hints.ai_port_space = RDMA_PS_TCP;
	ret = rdma_getaddrinfo(addr, port, &hints, &res);
	if (ret)
		return errno ? -errno : -EINVAL;
	ch = rdma_create_event_channel();
	if (!ch) {
		ret = errno ? -errno : -ENODEV;
		rdma_freeaddrinfo(res);
		return ret;
	}
	ret = set_nonblocking(ch->fd);
	if (!ret && rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		ret = errno ? -errno : -ENOMEM;
	if (!ret && rdma_resolve_addr(id, res->ai_src_addr, res->ai_dst_addr, timeout_ms))
		ret = errno ? -errno : -EINVAL;
	rdma_freeaddrinfo(res);
	for (step = 0; !ret && step < 2; step++) {
		int want = step ? RDMA_CM_EVENT_ROUTE_RESOLVED : RDMA_CM_EVENT_ADDR_RESOLVED;
		int r = wait_event(ch, &ev, timeout_ms);
		if (r < 0)
			ret = r;
		else if (r == 0)
			ret = -ETIMEDOUT;
		else if (ev.type != want) {
			*cm_status = ev.status;
			ret = -EHOSTUNREACH;
		} else if (!step && rdma_resolve_route(id, timeout_ms))
			ret = errno ? -errno : -EINVAL;
	}
	if (ret) {
		if (id)
			rdma_destroy_id(id);
		rdma_destroy_event_channel(ch);
		return ret;
	}
	*ch_out = ch;
	*id_out = id;
	return 0;
}

void nr_channel_close(struct rdma_event_channel *ch) { rdma_destroy_event_channel(ch); }

int nr_reject(struct rdma_cm_id *id, const void *data, uint8_t len)
{
	int ret = rdma_reject(id, data, len) ? -errno : 0;
	rdma_destroy_id(id);
	return ret;
}

/* The verbs resources of one connection: a PD, a completion channel, one CQ for both queues and
 * an RC QP on the CM id. */
struct nr_conn {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cc;
	struct ibv_cq *cq;
	int qp_created;
};

void nr_conn_destroy(struct nr_conn *c)
{
	if (!c)
		return;
	if (c->qp_created)
		rdma_destroy_qp(c->id);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	if (c->cc)
		ibv_destroy_comp_channel(c->cc);
	if (c->pd)
		ibv_dealloc_pd(c->pd);
	if (c->id)
		rdma_destroy_id(c->id);
	free(c);
}

/* Creates the resources of a connection request's id (which it then owns, also on failure). */
int nr_conn_create(struct rdma_cm_id *id, uint32_t send_wr, uint32_t recv_wr, struct nr_conn **out)
{
	struct ibv_qp_init_attr attr;
	struct nr_conn *c = calloc(1, sizeof(*c));
	int ret;

	if (!c) {
		rdma_destroy_id(id);
		return -ENOMEM;
	}
	c->id = id;
	c->pd = ibv_alloc_pd(id->verbs);
	if (!c->pd)
		goto fail;
	c->cc = ibv_create_comp_channel(id->verbs);
	if (!c->cc)
		goto fail;
	c->cq = ibv_create_cq(id->verbs, (int)(send_wr + recv_wr), NULL, c->cc, 0);
	if (!c->cq)
		goto fail;
	if (set_nonblocking(c->cc->fd) || ibv_req_notify_cq(c->cq, 0))
		goto fail;
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = send_wr;
	attr.cap.max_recv_wr = recv_wr;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, c->pd, &attr))
		goto fail;
	c->qp_created = 1;
	*out = c;
	return 0;
fail:
	ret = errno ? -errno : -ENOMEM;
	nr_conn_destroy(c);
	return ret;
}

int nr_conn_accept(struct nr_conn *c, const void *data, uint8_t len, uint8_t responder_resources,
		   uint8_t initiator_depth)
{
	struct rdma_conn_param p;

	memset(&p, 0, sizeof(p));
	p.private_data = data;
	p.private_data_len = len;
	p.responder_resources = responder_resources;
	p.initiator_depth = initiator_depth;
	p.rnr_retry_count = 7;
	p.flow_control = 1;
	return rdma_accept(c->id, &p) ? -errno : 0;
}

/* Connects a resolved id's QP with the NVMe-oF private data. We are the responder of the
 * target's RDMA READs and WRITEs: as many reads in flight as the device allows. */
int nr_conn_connect(struct nr_conn *c, const void *data, uint8_t len)
{
	struct rdma_conn_param p;
	struct ibv_device_attr attr;

	if (ibv_query_device(c->id->verbs, &attr))
		return errno ? -errno : -EIO;
	memset(&p, 0, sizeof(p));
	p.private_data = data;
	p.private_data_len = len;
	p.responder_resources = attr.max_qp_rd_atom > 255 ? 255 : attr.max_qp_rd_atom;
	p.initiator_depth = attr.max_qp_init_rd_atom > 255 ? 255 : attr.max_qp_init_rd_atom;
	p.retry_count = 7;
	p.rnr_retry_count = 7;
	p.flow_control = 1;
	return rdma_connect(c->id, &p) ? -errno : 0;
}

int nr_conn_disconnect(struct nr_conn *c) { return rdma_disconnect(c->id) ? -errno : 0; }
struct rdma_cm_id *nr_conn_id(struct nr_conn *c) { return c->id; }
int nr_conn_comp_fd(struct nr_conn *c) { return c->cc->fd; }

/* Takes a pending completion-channel event (if any) and re-arms the CQ: call before polling. */
int nr_conn_rearm(struct nr_conn *c)
{
	struct ibv_cq *cq;
	void *ctx;
	while (ibv_get_cq_event(c->cc, &cq, &ctx) == 0)
		ibv_ack_cq_events(cq, 1);
	return ibv_req_notify_cq(c->cq, 0) ? -errno : 0;
}

struct ibv_mr *nr_reg_mr(struct nr_conn *c, void *addr, size_t len)
{
	return ibv_reg_mr(c->pd, addr, len, IBV_ACCESS_LOCAL_WRITE);
}
/* A region the peer may RDMA READ and WRITE (the host's data buffers). */
struct ibv_mr *nr_reg_mr_remote(struct nr_conn *c, void *addr, size_t len)
{
	return ibv_reg_mr(c->pd, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
}
uint32_t nr_mr_lkey(struct ibv_mr *mr) { return mr->lkey; }
uint32_t nr_mr_rkey(struct ibv_mr *mr) { return mr->rkey; }
int nr_dereg_mr(struct ibv_mr *mr) { return ibv_dereg_mr(mr) ? -errno : 0; }

int nr_post_recv(struct nr_conn *c, uint64_t wr_id, void *addr, uint32_t len, uint32_t lkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
	return -ibv_post_recv(c->id->qp, &wr, &bad);
}

/* op: 0 SEND, 1 SEND with invalidate of inv_rkey, 2 RDMA WRITE, 3 RDMA READ. */
int nr_post_send(struct nr_conn *c, int op, uint64_t wr_id, int signaled, void *addr, uint32_t len,
		 uint32_t lkey, uint64_t raddr, uint32_t rkey, uint32_t inv_rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = len ? 1 : 0;
	wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
	switch (op) {
	case 0: wr.opcode = IBV_WR_SEND; break;
	case 1: wr.opcode = IBV_WR_SEND_WITH_INV; wr.invalidate_rkey = inv_rkey; break;
	case 2: wr.opcode = IBV_WR_RDMA_WRITE; break;
	case 3: wr.opcode = IBV_WR_RDMA_READ; break;
	default: return -EINVAL;
	}
	if (op >= 2) {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	return -ibv_post_send(c->id->qp, &wr, &bad);
}

struct nr_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t byte_len;
	uint32_t is_recv;
};

/* Up to n completions into out; returns how many, or -errno. */
int nr_poll(struct nr_conn *c, struct nr_wc *out, int n)
{
	struct ibv_wc wc[32];
	int got, i;

	if (n > 32)
		n = 32;
	got = ibv_poll_cq(c->cq, n, wc);
	if (got < 0)
		return -EIO;
	for (i = 0; i < got; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].byte_len = wc[i].byte_len;
		out[i].is_recv = (wc[i].opcode & IBV_WC_RECV) ? 1 : 0;
	}
	return got;
}

const char *nr_event_name(int type) { return rdma_event_str((enum rdma_cm_event_type)type); }
const char *nr_wc_status_name(uint32_t s) { return ibv_wc_status_str((enum ibv_wc_status)s); }
