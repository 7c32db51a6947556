// SPDX-License-Identifier: GPL-2.0
/* kubeplex's ebpf mode: Services load-balanced where a socket on the node names them.
 *
 * connect and sendmsg (unconnected UDP) replace a Service address with a backend chosen from
 * the maps and remember the Service address by socket cookie; recvmsg and getpeername put it
 * back, so replies and getpeername show the Service. No packet is ever NATed.
 *
 * A Service without endpoints (count 0) refuses: a sock_addr program can only allow (1) or deny
 * (0), and a denial alone is EPERM; bpf_set_retval(-ECONNREFUSED) first makes connect() and
 * sendto() fail with ECONNREFUSED, what a client sees from upstream's REJECT (and Cilium's).
 *
 * Not yet: IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) on IPv6 sockets pass unchanged. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "kubeplex_lb.h"

#define ECONNREFUSED 111
#define NSEC_PER_SEC 1000000000ULL

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KPX_SVC_MAX);
	__type(key, struct kpx_svc4_key);
	__type(value, struct kpx_svc_value);
} kpx_svc4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KPX_SVC_MAX);
	__type(key, struct kpx_svc6_key);
	__type(value, struct kpx_svc_value);
} kpx_svc6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KPX_BACKENDS_MAX);
	__type(key, struct kpx_backend_key);
	__type(value, struct kpx_backend_value);
} kpx_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, KPX_REVNAT_MAX);
	__type(key, struct kpx_revnat4_key);
	__type(value, struct kpx_revnat4_value);
} kpx_revnat4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, KPX_REVNAT_MAX);
	__type(key, struct kpx_revnat6_key);
	__type(value, struct kpx_revnat6_value);
} kpx_revnat6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, KPX_AFFINITY_MAX);
	__type(key, struct kpx_affinity_key);
	__type(value, struct kpx_affinity_value);
} kpx_affinity SEC(".maps");

/* The slot of the backend for this connection: the client's previous one while its affinity
 * entry is younger than the timeout, else a random one (remembered when affinity is on). */
static __always_inline __u16 choose_slot(struct bpf_sock_addr *ctx, const struct kpx_svc_value *svc)
{
	struct kpx_affinity_key akey = {};
	struct kpx_affinity_value aval = {};
	struct kpx_affinity_value *prev;
	__u64 now;

	if (!(svc->flags & KPX_FLAG_AFFINITY))
		return bpf_get_prandom_u32() % svc->count;

	akey.netns_cookie = bpf_get_netns_cookie(ctx);
	akey.svc_id = svc->svc_id;
	now = bpf_ktime_get_ns();
	prev = bpf_map_lookup_elem(&kpx_affinity, &akey);
	if (prev && prev->slot < svc->count &&
	    now - prev->last_used_ns < (__u64)svc->affinity_timeout * NSEC_PER_SEC)
		aval.slot = prev->slot;
	else
		aval.slot = bpf_get_prandom_u32() % svc->count;
	aval.last_used_ns = now;
	bpf_map_update_elem(&kpx_affinity, &akey, &aval, BPF_ANY);
	return aval.slot;
}

/* The backend for a Service value, or NULL when there is none (or none of this family). */
static __always_inline const struct kpx_backend_value *
pick_backend(struct bpf_sock_addr *ctx, const struct kpx_svc_value *svc, __u8 family)
{
	struct kpx_backend_key bkey = {};
	const struct kpx_backend_value *backend;

	bkey.svc_id = svc->svc_id;
	bkey.slot = choose_slot(ctx, svc);
	backend = bpf_map_lookup_elem(&kpx_backends, &bkey);
	if (!backend || backend->family != family)
		return NULL;
	return backend;
}

static __always_inline int refuse(void)
{
	bpf_set_retval(-ECONNREFUSED);
	return 0;
}

static __always_inline int translate4(struct bpf_sock_addr *ctx)
{
	struct kpx_svc4_key key = {};
	struct kpx_revnat4_key rkey = {};
	struct kpx_revnat4_value rval = {};
	const struct kpx_svc_value *svc;
	const struct kpx_backend_value *backend;

	key.addr = ctx->user_ip4;
	key.port = (__be16)ctx->user_port;
	key.proto = (__u8)ctx->protocol;
	svc = bpf_map_lookup_elem(&kpx_svc4, &key);
	if (!svc)
		return 1;
	if (svc->count == 0)
		return refuse();
	backend = pick_backend(ctx, svc, KPX_FAMILY_V4);
	if (!backend)
		return 1;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = backend->addr[0];
	rkey.port = backend->port;
	rval.addr = key.addr;
	rval.port = key.port;
	bpf_map_update_elem(&kpx_revnat4, &rkey, &rval, BPF_ANY);

	ctx->user_ip4 = backend->addr[0];
	ctx->user_port = backend->port;
	return 1;
}

static __always_inline int translate6(struct bpf_sock_addr *ctx)
{
	struct kpx_svc6_key key = {};
	struct kpx_revnat6_key rkey = {};
	struct kpx_revnat6_value rval = {};
	const struct kpx_svc_value *svc;
	const struct kpx_backend_value *backend;

	key.addr[0] = ctx->user_ip6[0];
	key.addr[1] = ctx->user_ip6[1];
	key.addr[2] = ctx->user_ip6[2];
	key.addr[3] = ctx->user_ip6[3];
	key.port = (__be16)ctx->user_port;
	key.proto = (__u8)ctx->protocol;
	svc = bpf_map_lookup_elem(&kpx_svc6, &key);
	if (!svc)
		return 1;
	if (svc->count == 0)
		return refuse();
	backend = pick_backend(ctx, svc, KPX_FAMILY_V6);
	if (!backend)
		return 1;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	__builtin_memcpy(rkey.addr, backend->addr, sizeof(rkey.addr));
	rkey.port = backend->port;
	__builtin_memcpy(rval.addr, key.addr, sizeof(rval.addr));
	rval.port = key.port;
	bpf_map_update_elem(&kpx_revnat6, &rkey, &rval, BPF_ANY);

	ctx->user_ip6[0] = backend->addr[0];
	ctx->user_ip6[1] = backend->addr[1];
	ctx->user_ip6[2] = backend->addr[2];
	ctx->user_ip6[3] = backend->addr[3];
	ctx->user_port = backend->port;
	return 1;
}

/* Shows the Service address where the socket saw a backend it was translated to. */
static __always_inline int reverse4(struct bpf_sock_addr *ctx)
{
	struct kpx_revnat4_key rkey = {};
	const struct kpx_revnat4_value *rval;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = ctx->user_ip4;
	rkey.port = (__be16)ctx->user_port;
	rval = bpf_map_lookup_elem(&kpx_revnat4, &rkey);
	if (rval) {
		ctx->user_ip4 = rval->addr;
		ctx->user_port = rval->port;
	}
	return 1;
}

static __always_inline int reverse6(struct bpf_sock_addr *ctx)
{
	struct kpx_revnat6_key rkey = {};
	const struct kpx_revnat6_value *rval;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr[0] = ctx->user_ip6[0];
	rkey.addr[1] = ctx->user_ip6[1];
	rkey.addr[2] = ctx->user_ip6[2];
	rkey.addr[3] = ctx->user_ip6[3];
	rkey.port = (__be16)ctx->user_port;
	rval = bpf_map_lookup_elem(&kpx_revnat6, &rkey);
	if (rval) {
		ctx->user_ip6[0] = rval->addr[0];
		ctx->user_ip6[1] = rval->addr[1];
		ctx->user_ip6[2] = rval->addr[2];
		ctx->user_ip6[3] = rval->addr[3];
		ctx->user_port = rval->port;
	}
	return 1;
}

SEC("cgroup/connect4")
int kpx_connect4(struct bpf_sock_addr *ctx)
{
	return translate4(ctx);
}

SEC("cgroup/connect6")
int kpx_connect6(struct bpf_sock_addr *ctx)
{
	return translate6(ctx);
}

SEC("cgroup/sendmsg4")
int kpx_sendmsg4(struct bpf_sock_addr *ctx)
{
	return translate4(ctx);
}

SEC("cgroup/sendmsg6")
int kpx_sendmsg6(struct bpf_sock_addr *ctx)
{
	return translate6(ctx);
}

SEC("cgroup/recvmsg4")
int kpx_recvmsg4(struct bpf_sock_addr *ctx)
{
	return reverse4(ctx);
}

SEC("cgroup/recvmsg6")
int kpx_recvmsg6(struct bpf_sock_addr *ctx)
{
	return reverse6(ctx);
}

SEC("cgroup/getpeername4")
int kpx_getpeername4(struct bpf_sock_addr *ctx)
{
	return reverse4(ctx);
}

SEC("cgroup/getpeername6")
int kpx_getpeername6(struct bpf_sock_addr *ctx)
{
	return reverse6(ctx);
}
