/* The maps of kubeplex's ebpf mode, byte for byte as backends/ebpf/layout.py packs them.
 * Addresses and ports are in network order; every other integer is in host order. Every pad
 * is explicit and written as zero, so a key hashes the same from C and from Python. */
#ifndef KUBEPLEX_LB_H
#define KUBEPLEX_LB_H

#include <linux/types.h>

#define KPX_PROTO_TCP 6
#define KPX_PROTO_UDP 17

/* Service value flag: pick the client's previous backend while its affinity entry is fresh. */
#define KPX_FLAG_AFFINITY (1 << 0)

#define KPX_FAMILY_V4 4
#define KPX_FAMILY_V6 6

#define KPX_SVC_MAX 65536
#define KPX_BACKENDS_MAX 262144
#define KPX_REVNAT_MAX 262144
#define KPX_AFFINITY_MAX 65536
#define KPX_SLOTS_MAX KPX_BACKENDS_MAX

/* kpx_svc4 / kpx_svc6 (HASH): one entry per entry point a node-started connection may use. */
struct kpx_svc4_key {
	__be32 addr;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

struct kpx_svc6_key {
	__u32 addr[4];
	__be16 port;
	__u8 proto;
	__u8 pad;
};

struct kpx_svc_value {
	__u32 svc_id;
	__u16 count; /* endpoints to choose among; 0: refuse the connect */
	__u16 flags;
	__u32 affinity_timeout; /* seconds */
};

/* kpx_backends (HASH): slots 0..count-1 of a service. */
struct kpx_backend_key {
	__u32 svc_id;
	__u16 slot;
	__u16 pad;
};

struct kpx_backend_value {
	__u32 addr[4]; /* IPv4: addr[0] */
	__be16 port;
	__u8 family; /* 4 or 6 */
	__u8 pad;
};

/* kpx_slots (HASH): the slot of each endpoint of a Service with affinity, so that an affinity
 * entry names its endpoint, not a slot: a sync may move an endpoint to another slot. */
struct kpx_slot_key {
	__u32 svc_id;
	__be16 port;
	__u16 pad;
	__u32 addr[4]; /* IPv4: addr[0] */
};

struct kpx_slot_value {
	__u16 slot;
	__u16 pad;
};

/* kpx_revnat4 / kpx_revnat6 (LRU_HASH): written by connect/sendmsg, read by
 * recvmsg/getpeername so replies and getpeername show the Service address. */
struct kpx_revnat4_key {
	__u64 cookie; /* socket cookie */
	__be32 addr;  /* backend */
	__be16 port;
	__u16 pad;
};

struct kpx_revnat4_value {
	__be32 addr; /* service */
	__be16 port;
	__u16 pad;
};

struct kpx_revnat6_key {
	__u64 cookie;
	__u32 addr[4];
	__be16 port;
	__u16 pad;
	__u32 pad2;
};

struct kpx_revnat6_value {
	__u32 addr[4];
	__be16 port;
	__u16 pad;
};

/* kpx_affinity (LRU_HASH): a client (its network namespace) and the endpoint it was given. */
struct kpx_affinity_key {
	__u64 netns_cookie;
	__u32 svc_id;
	__u32 pad;
};

struct kpx_affinity_value {
	__u32 addr[4]; /* the endpoint, as in kpx_backends */
	__be16 port;
	__u16 pad;
	__u32 pad2;
	__u64 last_used_ns;
};

_Static_assert(sizeof(struct kpx_svc4_key) == 8, "layout.SVC4_KEY");
_Static_assert(sizeof(struct kpx_svc6_key) == 20, "layout.SVC6_KEY");
_Static_assert(sizeof(struct kpx_svc_value) == 12, "layout.SVC_VALUE");
_Static_assert(sizeof(struct kpx_backend_key) == 8, "layout.BACKEND_KEY");
_Static_assert(sizeof(struct kpx_backend_value) == 20, "layout.BACKEND_VALUE");
_Static_assert(sizeof(struct kpx_slot_key) == 24, "layout.SLOT_KEY");
_Static_assert(sizeof(struct kpx_slot_value) == 4, "layout.SLOT_VALUE");
_Static_assert(sizeof(struct kpx_revnat4_key) == 16, "layout.REVNAT4_KEY");
_Static_assert(sizeof(struct kpx_revnat4_value) == 8, "layout.REVNAT4_VALUE");
_Static_assert(sizeof(struct kpx_revnat6_key) == 32, "layout.REVNAT6_KEY");
_Static_assert(sizeof(struct kpx_revnat6_value) == 20, "layout.REVNAT6_VALUE");
_Static_assert(sizeof(struct kpx_affinity_key) == 16, "layout.AFFINITY_KEY");
_Static_assert(sizeof(struct kpx_affinity_value) == 32, "layout.AFFINITY_VALUE");

#endif
