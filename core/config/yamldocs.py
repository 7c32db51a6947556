"""The YAML loader of config files: duplicate keys recorded, dates left as strings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    _Base = yaml.SafeLoader
else:  # libyaml's parser where PyYAML has it: faster, and its messages are go-yaml's
    _Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _YamlMapping(dict[Any, Any]):
    """A mapping that remembers which keys it saw twice (PyYAML keeps the last silently)."""

    duplicates: tuple[str, ...] = ()


class Loader(_Base):
    """SafeLoader (on libyaml) that records duplicate keys and leaves dates as strings,
    closer to what sigs.k8s.io/yaml hands kube-proxy."""


Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _construct_mapping(loader: Loader, node: yaml.MappingNode) -> _YamlMapping:
    seen: set[Any] = set()
    duplicates: list[str] = []
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # "<<" merges may be overridden by explicit keys; that is not a duplicate
        key = loader.construct_object(key_node, deep=True)
        try:
            if key in seen:
                duplicates.append(str(key))
            seen.add(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "found an unhashable mapping key", key_node.start_mark
            ) from None
    result = _YamlMapping(loader.construct_mapping(node, deep=True))
    result.duplicates = tuple(duplicates)
    return result


Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def yaml_problem(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    if mark is None:
        return f"malformed YAML: {problem}"
    return f"malformed YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
