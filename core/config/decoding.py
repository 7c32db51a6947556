"""The generic decoder behind the config file: JSON/YAML data into frozen dataclasses and back.

A dataclass field opts in with metadata (``json``: its camelCase name, ``kind``: which decoder,
``zero_is_unset``, ``cls`` for a nested section). Every problem is collected in an
:class:`Errors` with its field path, so a file's errors are reported at once; values print in
the file's JSON form (:func:`show`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from kubeplex.core.config.addresses import parse_cidr
from kubeplex.core.config.durations import DurationError, format_duration, parse_duration
from kubeplex.core.model.errors import FieldError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# The logging section belongs to component-base; its decoder below knows these two.
LOG_FORMATS = ("json", "text")
_DURATION_HINT = 'must be a duration string such as "30s" or "1m30s"'

# component-base's SetRecommendedLoggingConfiguration.
LOGGING_DEFAULTS: dict[str, Any] = {"format": "text", "flushFrequency": "5s", "verbosity": 0}


class Errors:
    """The problems found so far, each with its field path, in the order they were found."""

    def __init__(self) -> None:
        self.items: list[FieldError] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(FieldError(path, message))


# --- decoding ------------------------------------------------------------------------------

_Decoder = Callable[[object, str, Errors, Mapping[str, Any]], Any]
_D = TypeVar("_D", bound="DataclassInstance")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _mapping(value: object, path: str, errs: Errors) -> dict[Any, Any] | None:
    if not isinstance(value, dict):
        errs.add(path, f"must be a mapping, got {show(value)}")
        return None
    for key in getattr(value, "duplicates", ()):
        errs.add(_join(path, key), "duplicate field")
    return value


def decode(
    cls: type[_D],
    value: object,
    path: str,
    errs: Errors,
    extra_keys: Iterable[str] = (),
) -> _D:
    specs = [f for f in fields(cls) if "json" in f.metadata]
    doc = _mapping(value, path, errs)
    if doc is None:
        return cls()
    known = {f.metadata["json"] for f in specs} | set(extra_keys)
    for key in doc:
        if not isinstance(key, str) or key not in known:
            errs.add(_join(path, str(key)), "unknown field")
    kwargs: dict[str, Any] = {}
    for f in specs:
        name = f.metadata["json"]
        raw = doc.get(name)
        if raw is None:  # absent or null: Go leaves the field unset
            continue
        decoded = _DECODERS[f.metadata["kind"]](raw, _join(path, name), errs, f.metadata)
        if decoded is None or (f.metadata["zero_is_unset"] and not decoded):
            continue
        kwargs[f.name] = decoded
    return cls(**kwargs)


def _decode_bool(value: object, path: str, errs: Errors, meta: Mapping[str, Any]) -> Any:
    if isinstance(value, bool):
        return value
    errs.add(path, f"must be a boolean, got {show(value)}")
    return None


def _decode_str(value: object, path: str, errs: Errors, meta: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        return value
    # sigs.k8s.io/yaml turns scalars into strings when the Go field is a string, so
    # `showHiddenMetricsForVersion: 1.33` works upstream; keep that.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    errs.add(path, f"must be a string, got {show(value)}")
    return None


def _decode_int32(value: object, path: str, errs: Errors, meta: Mapping[str, Any]) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        errs.add(path, f"must be an integer, got {show(value)}")
        return None
    if not -(2**31) <= value < 2**31:
        errs.add(path, f"must be a 32-bit integer, got {value}")
        return None
    return value


def _decode_float(value: object, path: str, errs: Errors, meta: Mapping[str, Any]) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        errs.add(path, f"must be a number, got {show(value)}")
        return None
    return float(value)


def _decode_duration(value: object, path: str, errs: Errors, meta: Mapping[str, Any]) -> Any:
    # metav1.Duration only unmarshals from a JSON string; a bare number is an error upstream.
    if not isinstance(value, str):
        errs.add(path, f"{_DURATION_HINT}, got {show(value)}")
        return None
    try:
        return parse_duration(value)
    except DurationError as e:
        errs.add(path, f"{_DURATION_HINT}, got {show(value)} ({e.reason})")
        return None


def _decode_str_list(value: object, path: str, errs: Errors, meta: Mapping[str, Any]) -> Any:
    if not isinstance(value, list):
        errs.add(path, f"must be a list of strings, got {show(value)}")
        return None
    items = [
        "" if item is None else _decode_str(item, f"{path}[{i}]", errs, meta)
        for i, item in enumerate(value)
    ]
    return None if None in items else tuple(items)


def _decode_cidr_list(value: object, path: str, errs: Errors, meta: Mapping[str, Any]) -> Any:
    items = _decode_str_list(value, path, errs, meta)
    if items is None:
        return None
    networks = []
    for i, item in enumerate(items):
        network = parse_cidr(item)
        if network is None:
            errs.add(f"{path}[{i}]", f"must be a valid CIDR, got {show(item)}")
        networks.append(network)
    return None if None in networks else tuple(networks)


def _decode_cidr_csv(value: object, path: str, errs: Errors, meta: Mapping[str, Any]) -> Any:
    text = _decode_str(value, path, errs, meta)
    if not text:
        return None
    parts = text.split(",")
    if len(parts) > 2:
        errs.add(
            path,
            f"must be one CIDR or an IPv4,IPv6 pair (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48), "
            f"got {show(text)}",
        )
        return None
    networks = [parse_cidr(p) for p in parts]
    for part, network in zip(parts, networks, strict=True):
        if network is None:
            errs.add(
                path,
                "must be a valid CIDR (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48), "
                f"got {show(part)}",
            )
    valid = [n for n in networks if n is not None]
    if len(valid) != len(networks):
        return None
    if len(valid) == 2 and valid[0].version == valid[1].version:
        errs.add(path, f"must be a dual-stack pair, one IPv4 and one IPv6 CIDR, got {show(text)}")
        return None
    return tuple(valid)


def _decode_bool_map(value: object, path: str, errs: Errors, meta: Mapping[str, Any]) -> Any:
    doc = _mapping(value, path, errs)
    if doc is None:
        return None
    out: dict[str, bool] = {}
    for key, item in doc.items():
        name = key if isinstance(key, str) else show(key)
        if isinstance(item, bool):
            out[name] = item
        else:
            errs.add(_join(path, name), f"must be a boolean, got {show(item)}")
    return MappingProxyType(out)


def _decode_section(value: object, path: str, errs: Errors, meta: Mapping[str, Any]) -> Any:
    return decode(meta["cls"], value, path, errs)


def _decode_logging(value: object, path: str, errs: Errors, meta: Mapping[str, Any]) -> Any:
    # Loose on purpose: LoggingConfiguration belongs to component-base and grows on its own,
    # so only its documented keys are type-checked and anything else is passed through.
    doc = _mapping(value, path, errs)
    if doc is None:
        return None
    before = len(errs.items)
    fmt = doc.get("format")
    if fmt is not None and fmt != "":
        if not isinstance(fmt, str):
            errs.add(f"{path}.format", f"must be a string, got {show(fmt)}")
        elif fmt not in LOG_FORMATS:
            errs.add(
                f"{path}.format",
                f"unsupported log format {show(fmt)}, must be one of: {', '.join(LOG_FORMATS)}",
            )
    flush = doc.get("flushFrequency")
    flush_zero = flush is None
    if isinstance(flush, str):
        flush_zero = _decode_duration(flush, f"{path}.flushFrequency", errs, meta) == 0
    elif flush is not None:
        # TimeOrMetaDuration: a duration string or integer nanoseconds.
        if isinstance(flush, bool) or not isinstance(flush, int):
            errs.add(
                f"{path}.flushFrequency",
                f"{_DURATION_HINT} or integer nanoseconds, got {show(flush)}",
            )
        flush_zero = flush == 0
    _check_verbosity(doc.get("verbosity"), f"{path}.verbosity", errs)
    vmodule = doc.get("vmodule")
    if vmodule is not None:
        if not isinstance(vmodule, list):
            errs.add(f"{path}.vmodule", f"must be a list, got {show(vmodule)}")
        else:
            for i, item in enumerate(vmodule):
                item_path = f"{path}.vmodule[{i}]"
                entry = _mapping(item, item_path, errs)
                if entry is None:
                    continue
                pattern = entry.get("filePattern")
                if not isinstance(pattern, str) or not pattern:
                    errs.add(f"{item_path}.filePattern", f"must be a string, got {show(pattern)}")
                _check_verbosity(entry.get("verbosity"), f"{item_path}.verbosity", errs)
    options = doc.get("options")
    opts = _mapping(options, f"{path}.options", errs) if options is not None else None
    for name in LOG_FORMATS:
        sub = opts.get(name) if opts is not None else None
        sub_path = f"{path}.options.{name}"
        routing = _mapping(sub, sub_path, errs) if sub is not None else None
        if routing is None:
            continue
        split = routing.get("splitStream")
        if split is not None and not isinstance(split, bool):
            errs.add(f"{sub_path}.splitStream", f"must be a boolean, got {show(split)}")
        size = routing.get("infoBufferSize")
        if size is not None and (isinstance(size, bool) or not isinstance(size, str | int)):
            errs.add(
                f"{sub_path}.infoBufferSize",
                f"must be a quantity such as 512 or 64Ki, got {show(size)}",
            )
    if len(errs.items) != before:
        return None
    merged = {str(k): v for k, v in doc.items()}
    if not merged.get("format"):
        merged["format"] = LOGGING_DEFAULTS["format"]
    if flush_zero:
        merged["flushFrequency"] = LOGGING_DEFAULTS["flushFrequency"]
    if merged.get("verbosity") is None:
        merged["verbosity"] = LOGGING_DEFAULTS["verbosity"]
    return freeze(merged)


def _check_verbosity(value: object, path: str, errs: Errors) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
        errs.add(path, f"must be a non-negative integer, got {show(value)}")


_DECODERS: dict[str, _Decoder] = {
    "bool": _decode_bool,
    "str": _decode_str,
    "int32": _decode_int32,
    "float": _decode_float,
    "duration": _decode_duration,
    "str_list": _decode_str_list,
    "cidr_list": _decode_cidr_list,
    "cidr_csv": _decode_cidr_csv,
    "bool_map": _decode_bool_map,
    "section": _decode_section,
    "logging": _decode_logging,
}


# --- encoding ------------------------------------------------------------------------------


def encode(obj: DataclassInstance) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(obj):
        if "json" not in f.metadata:
            continue
        value = getattr(obj, f.name)
        kind = f.metadata["kind"]
        if kind == "duration":
            value = format_duration(value)
        elif kind == "section":
            value = encode(value)
        elif kind == "cidr_csv":
            value = ",".join(str(n) for n in value)
        elif kind in ("cidr_list", "str_list"):
            value = [str(v) for v in value]
        elif kind in ("bool_map", "logging"):
            value = thaw(value)
        out[f.metadata["json"]] = value
    return out


def freeze(value: Any) -> Any:
    """Deep read-only copy of plain YAML data: mappings become MappingProxyType, lists tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


# --- value printing ------------------------------------------------------------------------


def _go_float(value: float) -> str:
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def show(value: object) -> str:
    """A value as it would look in the file's JSON form, for "got ..." in messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, int):
        return str(value)
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
