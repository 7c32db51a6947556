"""Manifests built from libyaml's events are exactly what CSafeLoader builds: the same values of
the same types, and the same error (from CSafeLoader itself) for anything else."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeplex.core.sources import manifest_loader
from kubeplex.core.sources.manifest_loader import ManifestFileError

LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def typed(value: Any) -> Any:
    """``value`` with the type of every part spelled out (True == 1 == 1.0 otherwise)."""
    if isinstance(value, dict):
        return ("dict", [(typed(k), typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [typed(v) for v in value])
    return (type(value).__name__, value)


def reference(text: str) -> Any:
    try:
        return typed(list(yaml.load_all(text, Loader=LOADER)))
    except yaml.YAMLError as err:
        return ("error", manifest_loader._yaml_problem(err))


def ours(text: str) -> Any:
    try:
        return typed(manifest_loader._load_yaml(text))
    except ManifestFileError as err:
        return ("error", str(err))


SCALARS = [
    "443", "0", "-0", "+7", "007", "012", "0x1F", "0o17", "0b101", "1_000", "1:30", "190:20:30",
    "1.5", ".inf", "-.Inf", ".NaN", "1e3", "6.8523015e+5", "~", "null", "Null", "NULL", "",
    "true", "True", "TRUE", "yes", "Yes", "NO", "on", "Off", "y", "n", "2025-06-01",
    "2025-06-01T12:00:00Z", "2001-12-14 21:59:43.10 -5", "<<", "=", "web", "10.96.0.1",
    "'443'", '"true"', "'~'", "k:{\"port\":80}", "é", "a b", "-", "- x", "[1, 2]", "{a: 1}",
    "!!str 443", "!!int '7'", "!!binary aGVsbG8=", "! 443", "&a 1", "*a", "|\n  text\n",
    ">\n  folded\n  text\n", "@bad", "`bad", "'unterminated", "\t", "%", "?",
]  # fmt: skip


@pytest.mark.parametrize("scalar", SCALARS)
@pytest.mark.parametrize("layout", ["v: {}\n", "- {}\n", "{}\n", "{}: v\n", "a:\n  b: {}\n"])
def test_every_scalar_is_built_as_csafeloader_builds_it(scalar: str, layout: str) -> None:
    text = layout.format(scalar)
    assert ours(text) == reference(text), text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# only a comment\n",
        "---\n",
        "---\n---\n",
        "a: 1\n---\nb: 2\n...\n---\n- 3\n",
        "a: 1\na: 2\n",  # duplicate keys: the last value, at the first key's place
        "a: 1\nb: 2\na: 3\n",
        "? [a, b]\n: complex key\n",
        "? {a: 1}\n: complex key\n",
        "base: &b {x: 1}\nderived:\n  <<: *b\n  y: 2\n",
        "<<: {x: 1}\n",
        "a: [1, {b: [2, 3]}, []]\n",
        "{a: 1, b: [x, y], c: {}}\n",
        "a:\n- 1\n- - 2\n  - 3\n",
        "items:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: web}\n",
        "a: b: c\n",
        "a: [1, 2\n",
        "- a\nb: c\n",
        "a: 1\n b: 2\n",
        "\ufeffa: 1\n",
        "a: !!set {x, y}\n",
        "a: !!omap [x: 1]\n",
        "a: !custom 1\n",
        "%YAML 1.1\n---\na: 1\n",
        "%TAG !k! tag:yaml.org,2002:\n---\na: !k!int 5\n",
        "~: null key\n",
        "1: int key\ntrue: bool key\n",
    ],
)
def test_documents_are_built_as_csafeloader_builds_them(text: str) -> None:
    assert ours(text) == reference(text), text


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-(2**70), 2**70),
            st.floats(allow_nan=False),
            st.text(max_size=12),
            st.sampled_from(SCALARS),
        ),
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(
                st.one_of(st.text(max_size=8), st.integers(), st.booleans()), children, max_size=4
            ),
        ),
        max_leaves=20,
    ),
    st.sampled_from([None, False, True]),
    st.booleans(),
)
def test_dumped_data_loads_as_csafeloader_loads_it(
    data: Any, flow: bool | None, several: bool
) -> None:
    docs = [data, {"k": data}] if several else [data]
    text = yaml.safe_dump_all(docs, default_flow_style=flow, allow_unicode=True)
    assert ours(text) == reference(text), text


def test_an_api_dump_takes_the_event_path() -> None:
    text = (
        "apiVersion: v1\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata:\n"
        "    creationTimestamp: '2025-06-01T12:00:00Z'\n    name: web\n    namespace: bench\n"
        "    resourceVersion: '101'\n  spec:\n    clusterIP: 10.96.0.2\n    ports:\n"
        "    - port: 80\n      protocol: TCP\n      targetPort: 8080\n  status:\n"
        "    loadBalancer: {}\nkind: List\nmetadata:\n  resourceVersion: ''\n"
    )
    built = manifest_loader._load_plain(text)
    assert built is not None
    assert typed(built) == reference(text)
    assert built[0]["items"][0]["spec"]["ports"][0]["port"] == 80
