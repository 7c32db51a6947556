"""Manifests built to hurt, each with what the one error about it says: the hostile manifests
tests load them (tests/unit/test_manifests_hostile.py) and run a node on them
(tests/kernel/test_manifests_hostile_kernel.py)."""

from __future__ import annotations


def deep_yaml(levels: int) -> str:
    return (
        "apiVersion: v1\nkind: Service\nmetadata: {name: deep, namespace: prod}\n"
        "spec:\n  clusterIP: 10.96.0.9\n  ports: [{name: http, port: 80}]\n"
        f"  extra: {'[' * levels}{']' * levels}\n"
    )


def deep_json(levels: int) -> str:
    return (
        '{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "deep"}, '
        f'"spec": {{"x": {"[" * levels}{"]" * levels}}}}}'
    )


def alias_bomb(levels: int = 9, field: str = "spec") -> str:
    """The billion laughs: each level nine aliases of the one before (9**9 strings)."""
    pad = "    " if field == "namespace" else "  "
    lines = [f'{pad}a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"{pad}a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]")
    body = "\n".join(lines) + "\n"
    if field == "namespace":
        return (
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: bomb\n  namespace:\n"
            + body
            + "spec: {clusterIP: 10.96.0.9, ports: [{name: http, port: 80}]}\n"
        )
    return (
        "apiVersion: v1\nkind: Service\nmetadata: {name: bomb, namespace: prod}\n"
        "spec:\n  clusterIP: 10.96.0.9\n  ports: [{name: http, port: 80}]\n" + body
    )


NODE_TYPE_LIST = (
    "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\n"
    "status:\n  addresses:\n  - {type: [InternalIP], address: 172.18.0.5}\n"
)

#: file name, text, what the one error about it says.
HOSTILE = [
    ("list-items.yaml", "apiVersion: v1\nkind: List\nitems: 5\n", "items: must be a list, got 5"),
    ("node-type.yaml", NODE_TYPE_LIST, "status.addresses[0].type: must be a string"),
    ("deep.yaml", deep_yaml(995), "nested deeper than 100 levels"),
    ("deep.json", deep_json(100_000), "nested deeper than 100 levels"),
    ("deep-900.json", deep_json(900), "nested deeper than 100 levels"),
    ("bomb.yaml", alias_bomb(), "aliases expand"),
    ("bomb-ns.yaml", alias_bomb(field="namespace"), "aliases expand"),
    ("recursive.yaml", "kind: Service\nmetadata: &m {name: r, x: [*m]}\n", "recursive alias"),
    ("name-list.yaml", "kind: Service\nmetadata: {name: [a], namespace: prod}\n", "metadata.name"),
    (
        "ns-map.yaml",
        "kind: Service\nmetadata: {name: a, namespace: {x: 1}}\n",
        "metadata.namespace",
    ),
]
