"""The connection to the Kubernetes API, through the ``kubernetes`` client: its loaders (the
kubeconfig of ``clientConnection.kubeconfig``, else the pod's service account), its
``Configuration`` (server, credentials and their refresh, TLS, proxy) and its REST client (the
urllib3 connection pool, client-go's retries, TCP keepalive).

What is not used is not imported. The package ``__init__``\\ s are skipped (see
:func:`kubeplex.core.startup.packages.register_bare`), and so is the generated ``ApiClient``.
kubeplex's requests answer with raw responses and are never deserialized into models, so the
``ApiClient`` would only add its imports, at each start: pydantic, dateutil's parser and a
thread pool.
:class:`ApiConnection` keeps the two parts of it that kubeplex uses, the ``Configuration`` and a
REST client, and :func:`api_request` prepares a request as its ``param_serialize`` does. The
kubeconfig loader's module is imported with what only its OIDC refresh calls deferred (see
:mod:`kubeplex.core.startup.deferred`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Protocol
from urllib.parse import quote

from kubeplex.core.config.kubeproxy import ClientConnectionConfiguration
from kubeplex.core.model.errors import KubeplexError
from kubeplex.core.sources.api_address import master_url
from kubeplex.core.startup.deferred import import_deferring
from kubeplex.core.startup.packages import register_bare

# ``kubernetes/__init__`` imports every part of the client (the dynamic client and its schema
# validation, streams, leader election, informers) and ``kubernetes/config/__init__`` both
# config loaders with OAuth, at each start; ``kubernetes/utils/__init__``, which the REST client
# reaches for its retry and keepalive helpers, adds YAML creation and metrics helpers. kubeplex
# uses the REST client and one loader.
register_bare("kubernetes", "kubernetes.config", "kubernetes.utils")

import kubernetes.client as k8s  # noqa: E402
from kubernetes.client import rest  # noqa: E402
from kubernetes.client.exceptions import ApiException as ApiException  # noqa: E402
from kubernetes.config.config_exception import ConfigException  # noqa: E402

log = logging.getLogger(__name__)

#: The User-Agent the client's ``ApiClient`` sends, sent here too.
USER_AGENT = f"OpenAPI-Generator/{k8s.__version__}/python"


class ApiTransport(Protocol):
    """What a request needs of a connection: an :class:`ApiConnection`, or the client's own
    ``kubernetes.client.ApiClient`` (tests hand one in)."""

    configuration: Any
    rest_client: Any
    default_headers: dict[str, str]

    def close(self) -> None: ...


class ApiConnection:
    """A ``Configuration`` and the REST client made for it: what kubeplex's requests use of
    ``kubernetes.client.ApiClient``, under the same attribute names."""

    def __init__(self, configuration: Any) -> None:
        self.configuration = configuration
        self.rest_client = rest.RESTClientObject(configuration)
        self.default_headers = {"User-Agent": USER_AGENT}

    def close(self) -> None:
        self.rest_client.close()

    def __enter__(self) -> ApiConnection:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def load_client_configuration(cc: ClientConnectionConfiguration, master: str = "") -> Any:
    """A dedicated ``kubernetes.client.Configuration`` (never the global default).

    From ``clientConnection.kubeconfig`` if set, else the in-cluster service account, like
    upstream kube-proxy (which does not fall back to ``~/.kube/config`` either).

    ``master`` (``--master``) overrides the server of either. Without a kubeconfig, the pod's
    service account goes to that address if one is mounted (kube-proxy would send no
    credentials there; the chart's ``apiServer.host`` relies on them); where none is mounted
    it is the address alone, as client-go makes it.
    """
    conf = _new_configuration()
    if cc.kubeconfig:
        try:
            _kubeconfig_loader()(
                config_file=cc.kubeconfig, client_configuration=conf, persist_config=False
            )
        except (ConfigException, OSError, ValueError, TypeError) as err:
            raise KubeplexError(
                f"clientConnection.kubeconfig {cc.kubeconfig}: cannot load: {err}"
            ) from err
    elif not master or _service_account_mounted():
        from kubernetes.config.incluster_config import load_incluster_config

        try:
            load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=conf
            )
        except ConfigException as err:
            raise KubeplexError(
                "no Kubernetes API to talk to: clientConnection.kubeconfig is empty and this is "
                f"not a pod with a service account ({err}); set clientConnection.kubeconfig in "
                "--config (or --master URL), or run from files with --manifests PATH"
            ) from err
    if master:
        _pin_host(conf, master_url(master, tls=_has_tls_settings(conf)))
    if cc.content_type and cc.content_type != "application/json":
        log.info(
            "clientConnection.contentType %s: the Python client speaks JSON only, using JSON",
            cc.content_type,
        )
    return conf


def _new_configuration() -> Any:
    """A ``kubernetes.client.Configuration`` with the client's default pool size (5
    connections per CPU), as every supported client release constructs it."""
    from kubernetes.client.configuration import Configuration

    return Configuration()


def _kubeconfig_loader() -> Any:
    """The client's ``load_kube_config``, imported only when used. Its module imports what
    refreshing an OIDC token calls (the ``ApiClient``, ``requests_oauthlib`` and ``oauthlib``'s
    OAuth 2 flows), at each start: that is imported at the first such refresh."""
    register_bare("oauthlib", "oauthlib.oauth2")
    module = import_deferring(
        "kubernetes.config.kube_config",
        {"requests_oauthlib": "OAuth2Session", "kubernetes.client": "ApiClient"},
    )
    return module.load_kube_config


def _service_account_mounted() -> bool:
    """Whether this is a pod with a service account, as client-go's in-cluster ``Possible``."""
    from kubernetes.config.incluster_config import (
        SERVICE_HOST_ENV_NAME,
        SERVICE_PORT_ENV_NAME,
        SERVICE_TOKEN_FILENAME,
    )

    return (
        bool(os.environ.get(SERVICE_HOST_ENV_NAME))
        and bool(os.environ.get(SERVICE_PORT_ENV_NAME))
        and os.path.isfile(SERVICE_TOKEN_FILENAME)
    )


def _pin_host(conf: Any, host: str) -> None:
    """Set the server, and keep it: both loaders' credential refresh, run before each request
    from any thread, sets every field they loaded again (the server among them) and itself
    as the refresh hook. It is given a view of the configuration that keeps both."""
    conf.host = host
    refresh = conf.refresh_api_key_hook
    if refresh is not None:
        conf.refresh_api_key_hook = lambda configuration: refresh(_HostPinned(configuration))


class _HostPinned:
    """A ``Configuration`` whose server and refresh hook the loaders cannot replace."""

    _KEPT = frozenset({"host", "refresh_api_key_hook"})

    def __init__(self, conf: Any) -> None:
        object.__setattr__(self, "_conf", conf)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conf, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._KEPT:
            setattr(self._conf, name, value)


def _has_tls_settings(conf: Any) -> bool:
    """Whether a host without a scheme is reached over https (client-go's ``defaultTLS``)."""
    return bool(
        conf.ssl_ca_cert
        or conf.cert_file
        or not conf.verify_ssl
        or getattr(conf, "tls_server_name", None)
    )


def make_api_client(cc: ClientConnectionConfiguration, master: str = "") -> ApiConnection:
    """The connection for ``clientConnection``, to ``master`` if given (``--master``)."""
    return ApiConnection(load_client_configuration(cc, master))


def api_request(
    api: ApiTransport,
    method: str,
    path: str,
    *,
    path_params: Mapping[str, str] | None = None,
    query: Iterable[tuple[str, Any]] = (),
    body: Any = None,
    content_type: str | None = None,
    timeout: Any = None,
) -> Any:
    """One request through the connection's REST client, with its configuration's server and
    credentials, answered by the raw ``urllib3`` response; a non-2xx status raises
    :class:`ApiException` as the generated methods do with ``_preload_content=False``.

    The request is the one ``ApiClient.param_serialize`` prepares: its default headers, path
    parameters quoted with ``safe_chars_for_path_param``, the credentials of the
    ``BearerToken`` auth setting (read at each request: the loaders' refresh hooks run), query
    values lowercased if booleans and quoted. The generated API classes (``CoreV1Api`` ...) are
    not used: importing them builds hundreds of pydantic models (about a second at start), for
    the few requests kubeplex makes.
    """
    conf = api.configuration
    headers: dict[str, Any] = {"Accept": "application/json"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    headers.update(api.default_headers)
    for key, value in (path_params or {}).items():
        path = path.replace("{" + key + "}", quote(str(value), safe=conf.safe_chars_for_path_param))
    params = list(query)
    for setting in conf.auth_settings().values():
        _apply_auth(setting, headers, params)
    url = conf.host + path
    if params:
        url += "?" + "&".join(f"{key}={quote(_query_value(value))}" for key, value in params)
    resp = api.rest_client.request(
        method, url, headers=headers, body=body, _request_timeout=timeout
    )
    if not 200 <= resp.status <= 299:
        resp.read()
        raise ApiException.from_response(http_resp=resp, body=None, data=None)
    return resp.response


def _apply_auth(setting: Mapping[str, Any], headers: dict[str, Any], params: list[Any]) -> None:
    """One of ``Configuration.auth_settings()``, applied as ``ApiClient`` applies it."""
    if setting["in"] == "header":
        headers[setting["key"]] = setting["value"]
    elif setting["in"] == "query":
        params.append((setting["key"], setting["value"]))
    elif setting["in"] == "cookie":
        cookie = quote(str(setting["value"]), safe="!#$%&'()*+-./:<=>?@[]^_`{|}~%+/=")
        previous = headers.get("Cookie")
        headers["Cookie"] = f"{previous + '; ' if previous else ''}{setting['key']}={cookie}"
    else:
        raise KubeplexError(f"credentials to send in {setting['in']!r}: not supported")


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
