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
 * An IPv6 socket naming an IPv4-mapped address (::ffff:a.b.c.d, a dual-stack socket reaching
 * an IPv4 Service) is translated as the IPv4 socket would be, through the IPv4 maps, and the
 * backend it gets is IPv4-mapped too. */
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
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KPX_SLOTS_MAX);
	__type(key, struct kpx_slot_key);
	__type(value, struct kpx_slot_value);
} kpx_slots SEC(".maps");

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

/* The backend for a Service value, or NULL when there is none (or none of this family). With
 * affinity: the client's previous endpoint while its entry is younger than the timeout and the
 * endpoint is still one of the Service's (kpx_slots says in which slot now), else a random one;
 * the endpoint chosen is remembered. */
static __always_inline const struct kpx_backend_value *
pick_backend(struct bpf_sock_addr *ctx, const struct kpx_svc_value *svc, __u8 family)
{
	struct kpx_backend_key bkey = {};
	struct kpx_affinity_key akey = {};
	struct kpx_affinity_value aval = {};
	struct kpx_slot_key skey = {};
	const struct kpx_affinity_value *prev;
	const struct kpx_slot_value *moved;
	const struct kpx_backend_value *backend;
	__u64 now = 0;

	bkey.svc_id = svc->svc_id;
	bkey.slot = bpf_get_prandom_u32() % svc->count;
	if (svc->flags & KPX_FLAG_AFFINITY) {
		akey.netns_cookie = bpf_get_netns_cookie(ctx);
		akey.svc_id = svc->svc_id;
		now = bpf_ktime_get_ns();
		prev = bpf_map_lookup_elem(&kpx_affinity, &akey);
		if (prev && now - prev->last_used_ns < (__u64)svc->affinity_timeout * NSEC_PER_SEC) {
			skey.svc_id = svc->svc_id;
			skey.port = prev->port;
			__builtin_memcpy(skey.addr, prev->addr, sizeof(skey.addr));
			moved = bpf_map_lookup_elem(&kpx_slots, &skey);
			if (moved && moved->slot < svc->count)
				bkey.slot = moved->slot;
		}
	}
	backend = bpf_map_lookup_elem(&kpx_backends, &bkey);
	if (!backend || backend->family != family)
		return NULL;
	if (svc->flags & KPX_FLAG_AFFINITY) {
		__builtin_memcpy(aval.addr, backend->addr, sizeof(aval.addr));
		aval.port = backend->port;
		aval.last_used_ns = now;
		bpf_map_update_elem(&kpx_affinity, &akey, &aval, BPF_ANY);
	}
	return backend;
}

/* What a Service lookup found. */
#define KPX_PASS 0
#define KPX_REFUSE 1
#define KPX_TRANSLATED 2

static __always_inline int refuse(void)
{
	bpf_set_retval(-ECONNREFUSED);
	return 0;
}

/* The IPv4 Service at addr (and the context's port and protocol): KPX_PASS when there is none
 * (or no backend of its family), KPX_REFUSE without endpoints, else KPX_TRANSLATED with the
 * backend in *to / *to_port and the Service remembered for the reverse path. IPv4 sockets and
 * IPv6 ones naming an IPv4-mapped address (::ffff:a.b.c.d) share it. */
static __always_inline int service4(struct bpf_sock_addr *ctx, __be32 addr, __be32 *to,
				    __be16 *to_port)
{
	struct kpx_svc4_key key = {};
	struct kpx_revnat4_key rkey = {};
	struct kpx_revnat4_value rval = {};
	const struct kpx_svc_value *svc;
	const struct kpx_backend_value *backend;

	key.addr = addr;
	key.port = (__be16)ctx->user_port;
	key.proto = (__u8)ctx->protocol;
	svc = bpf_map_lookup_elem(&kpx_svc4, &key);
	if (!svc)
		return KPX_PASS;
	if (svc->count == 0)
		return KPX_REFUSE;
	backend = pick_backend(ctx, svc, KPX_FAMILY_V4);
	if (!backend)
		return KPX_PASS;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = backend->addr[0];
	rkey.port = backend->port;
	rval.addr = key.addr;
	rval.port = key.port;
	bpf_map_update_elem(&kpx_revnat4, &rkey, &rval, BPF_ANY);

	*to = backend->addr[0];
	*to_port = backend->port;
	return KPX_TRANSLATED;
}

static __always_inline int translate4(struct bpf_sock_addr *ctx)
{
	__be32 to = 0;
	__be16 to_port = 0;
	int found = service4(ctx, ctx->user_ip4, &to, &to_port);

	if (found == KPX_REFUSE)
		return refuse();
	if (found == KPX_TRANSLATED) {
		ctx->user_ip4 = to;
		ctx->user_port = to_port;
	}
	return 1;
}

/* ::ffff:a.b.c.d, an IPv4 address on an IPv6 socket (a dual-stack one). */
static __always_inline int v4_mapped(struct bpf_sock_addr *ctx)
{
	return ctx->user_ip6[0] == 0 && ctx->user_ip6[1] == 0 &&
	       ctx->user_ip6[2] == bpf_htonl(0x0000ffff);
}

/* Not inlined: inlined, the compiler merges its writes of the context with translate6's
 * into one through a moved context pointer, which the verifier refuses. */
static __noinline int translate4in6(struct bpf_sock_addr *ctx)
{
	__be32 to = 0;
	__be16 to_port = 0;
	int found = service4(ctx, ctx->user_ip6[3], &to, &to_port);

	if (found == KPX_REFUSE)
		return refuse();
	if (found == KPX_TRANSLATED) {
		ctx->user_ip6[3] = to;
		ctx->user_port = to_port;
	}
	return 1;
}

static __always_inline int translate6(struct bpf_sock_addr *ctx)
{
	struct kpx_svc6_key key = {};
	struct kpx_revnat6_key rkey = {};
	struct kpx_revnat6_value rval = {};
	const struct kpx_svc_value *svc;
	const struct kpx_backend_value *backend;

	if (v4_mapped(ctx))
		return translate4in6(ctx);
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

/* The Service a socket's connection to the IPv4 backend addr (and the context's port) was
 * translated from, or NULL. */
static __always_inline const struct kpx_revnat4_value *service_of4(struct bpf_sock_addr *ctx,
								   __be32 addr)
{
	struct kpx_revnat4_key rkey = {};

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = addr;
	rkey.port = (__be16)ctx->user_port;
	return bpf_map_lookup_elem(&kpx_revnat4, &rkey);
}

/* Shows the Service address where the socket saw a backend it was translated to. */
static __always_inline int reverse4(struct bpf_sock_addr *ctx)
{
	const struct kpx_revnat4_value *rval = service_of4(ctx, ctx->user_ip4);

	if (rval) {
		ctx->user_ip4 = rval->addr;
		ctx->user_port = rval->port;
	}
	return 1;
}

/* Not inlined, as translate4in6. */
static __noinline int reverse4in6(struct bpf_sock_addr *ctx)
{
	const struct kpx_revnat4_value *rval = service_of4(ctx, ctx->user_ip6[3]);

	if (rval) {
		ctx->user_ip6[3] = rval->addr;
		ctx->user_port = rval->port;
	}
	return 1;
}

static __always_inline int reverse6(struct bpf_sock_addr *ctx)
{
	struct kpx_revnat6_key rkey = {};
	const struct kpx_revnat6_value *rval;

	if (v4_mapped(ctx))
		return reverse4in6(ctx);
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
