"""Server-side apply of one object through the Kubernetes API: the cluster's address and credentials, one PATCH.

Where the cluster is, as kubectl finds it: a kubeconfig named on the command line, else the first
file of ``$KUBECONFIG`` that exists, else ``~/.kube/config`` (each at its current context); else,
inside a pod, the service account's token and CA (``KUBERNETES_SERVICE_HOST``/``_PORT``). A kubeconfig user
may hold a token, a token file or a client certificate; an exec or auth-provider plugin (EKS, GKE's
gcloud) is not run: a service account's token is the credential a CronJob has anyway.

Every failure is a :class:`KubeError` whose message is one line saying what to do.
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import yaml

SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
FIELD_MANAGER: Final = "draftwatch"
APPLY_PATCH: Final = "application/apply-patch+yaml"
# The resource's plural name, as the API's paths and its RBAC rules spell it.
PLURALS: Final = {"HTTPRoute": "httproutes"}


class KubeError(Exception):
    """A cluster that cannot be reached or refused the object; the message is one line."""


@dataclass(frozen=True, slots=True)
class Cluster:
    """An API server's base URL, how its certificate is checked, and the credential sent to it."""

    server: str
    tls: ssl.SSLContext | bool
    token: str | None = None
    source: str = ""  # where the configuration came from, for the errors

    def __repr__(self) -> str:  # the token stays out of every log and traceback
        return f"Cluster(server={self.server!r}, source={self.source!r})"


def find_cluster(
    kubeconfig: Path | None = None,
    environ: Mapping[str, str] | None = None,
    service_account: Path = SERVICE_ACCOUNT,
) -> Cluster:
    """The cluster to talk to, in kubectl's order (see the module docstring)."""
    env = os.environ if environ is None else environ
    if kubeconfig is not None:
        return from_kubeconfig(kubeconfig)
    candidates = [Path(p) for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    candidates.append(Path(env.get("HOME", str(Path.home()))) / ".kube" / "config")
    for path in candidates:
        if path.is_file():
            return from_kubeconfig(path)
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if host and port and (service_account / "token").is_file():
        return in_cluster(host, port, service_account)
    raise KubeError(
        f"no cluster configuration: no kubeconfig at {', '.join(map(str, candidates))}, and not in a pod "
        "(KUBERNETES_SERVICE_HOST unset or no service-account token): pass --kubeconfig FILE or set KUBECONFIG"
    )


def in_cluster(host: str, port: str, service_account: Path = SERVICE_ACCOUNT) -> Cluster:
    """The pod's service account: its token, and the cluster's CA to check the API server by."""
    host = f"[{host}]" if ":" in host else host  # an IPv6 address
    token = (service_account / "token").read_text().strip()
    ca = service_account / "ca.crt"
    tls = ssl.create_default_context(cafile=str(ca)) if ca.is_file() else True
    return Cluster(f"https://{host}:{port}", tls, token, f"the service account at {service_account}")


def from_kubeconfig(path: Path) -> Cluster:
    """The current context's cluster and user in the kubeconfig at ``path``."""
    where = f"kubeconfig {path}"
    try:
        config = yaml.safe_load(path.read_text())
    except OSError as error:
        raise KubeError(f"{where}: cannot read it ({error.strerror}): pass --kubeconfig FILE") from None
    except yaml.YAMLError as error:
        raise KubeError(f"{where}: not YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise KubeError(f"{where}: expected a kubeconfig (clusters, users, contexts), got {type(config).__name__}")
    current = config.get("current-context")
    if not current:
        raise KubeError(f"{where}: current-context is not set: run kubectl config use-context NAME")
    context = _named(config, "contexts", "context", current, where)
    cluster = _named(config, "clusters", "cluster", context.get("cluster"), where)
    user = _named(config, "users", "user", context.get("user"), where) if context.get("user") else {}
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeError(
            f"{where}: cluster {context.get('cluster')!r} server={server!r}: expected an https:// (or http://) URL"
        )
    base = path.parent
    verified = server.startswith("https://") and not cluster.get("insecure-skip-tls-verify")
    tls = _tls(cluster, user, base, where) if verified else False
    for plugin in ("exec", "auth-provider"):
        if plugin in user and not (user.get("token") or user.get("tokenFile")):
            raise KubeError(
                f"{where}: user {context.get('user')!r} authenticates with an {plugin} plugin, which draftwatch "
                "does not run: give it a token (kubectl create token SERVICE_ACCOUNT) or run it in the cluster"
            )
    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = _read(base, user["tokenFile"], where).decode().strip()
    return Cluster(server.rstrip("/"), tls, token or None, f"{where}, context {current!r}")


def _named(config: dict[str, Any], section: str, key: str, name: Any, where: str) -> dict[str, Any]:
    for entry in config.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name and isinstance(entry.get(key), dict):
            found: dict[str, Any] = entry[key]
            return found
    raise KubeError(f"{where}: no {key} named {name!r} in {section}: fix the context or run kubectl config view")


def _tls(cluster: dict[str, Any], user: dict[str, Any], base: Path, where: str) -> ssl.SSLContext:
    """A context trusting the cluster's CA (the system's if none), with the user's client certificate if any."""
    context = ssl.create_default_context()
    ca = _data_or_file(cluster, "certificate-authority", base, where)
    if ca is not None:
        try:
            context.load_verify_locations(cadata=ca.decode())
        except (ssl.SSLError, UnicodeDecodeError) as error:
            raise KubeError(f"{where}: certificate-authority is not a PEM certificate ({error})") from None
    cert = _data_or_file(user, "client-certificate", base, where)
    key = _data_or_file(user, "client-key", base, where)
    if cert is not None and key is not None:
        # ssl loads a certificate and key from files only: a private temporary folder, gone once loaded.
        with tempfile.TemporaryDirectory() as folder:
            files = Path(folder) / "cert.pem", Path(folder) / "key.pem"
            for file, data in zip(files, (cert, key), strict=True):
                file.touch(mode=0o600)
                file.write_bytes(data)
            try:
                context.load_cert_chain(*files)
            except ssl.SSLError as error:
                raise KubeError(f"{where}: client-certificate and client-key do not load ({error})") from None
    return context


def _data_or_file(entry: dict[str, Any], key: str, base: Path, where: str) -> bytes | None:
    """``KEY-data`` (base64 PEM) or the file ``KEY`` names, relative to the kubeconfig's folder."""
    if entry.get(f"{key}-data"):
        try:
            return base64.b64decode(entry[f"{key}-data"], validate=True)
        except ValueError:
            raise KubeError(f"{where}: {key}-data is not base64") from None
    return _read(base, entry[key], where) if entry.get(key) else None


def _read(base: Path, name: str, where: str) -> bytes:
    try:
        return (base / Path(name).expanduser()).read_bytes()
    except OSError as error:
        raise KubeError(f"{where}: cannot read {name} ({error.strerror})") from None


def apply(cluster: Cluster, obj: Mapping[str, Any], timeout_s: float = 30.0) -> tuple[int, dict[str, Any]]:
    """Server-side apply ``obj`` as field manager ``draftwatch``: the status (201 created, 200 updated) and the
    object the API server stored. The body is JSON, which is YAML, as client-go sends an apply patch.

    ``force``: draftwatch owns the route's fields, so a field another manager set (a hand's kubectl
    edit) is taken back rather than failing every run with a conflict.
    """
    group_version, kind = obj["apiVersion"], obj["kind"]
    name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
    plural = PLURALS[kind]
    url = f"{cluster.server}/apis/{group_version}/namespaces/{namespace}/{plural}/{name}"
    headers = {"Content-Type": APPLY_PATCH, "Accept": "application/json"}
    if cluster.token:
        headers["Authorization"] = f"Bearer {cluster.token}"
    params = {"fieldManager": FIELD_MANAGER, "force": "true"}
    try:
        with httpx.Client(verify=cluster.tls, timeout=timeout_s) as client:
            response = client.patch(url, params=params, headers=headers, content=json.dumps(obj).encode())
    except httpx.ConnectError as error:
        reason = str(error) or type(error).__name__
        hint = "check the server's certificate-authority" if "CERTIFICATE" in reason.upper() else "is it up?"
        raise KubeError(f"cannot reach the Kubernetes API at {cluster.server} ({reason}): {hint}") from None
    except httpx.HTTPError as error:
        raise KubeError(f"the Kubernetes API at {cluster.server}: {type(error).__name__} {error}") from None
    if response.status_code in (200, 201):
        return response.status_code, response.json()
    raise KubeError(_refusal(response, cluster, group_version, plural, namespace))


def _refusal(response: httpx.Response, cluster: Cluster, group_version: str, plural: str, namespace: str) -> str:
    """What a refusal means and what to do, from the API's Status object (or a bare 404 page)."""
    try:
        status = response.json()
    except ValueError:
        status = {}
    text = status.get("message") if isinstance(status, dict) else None
    message = " ".join(str(text or response.text[:300]).split())
    group = group_version.split("/")[0]
    code = response.status_code
    if code == 401:
        return (f"the Kubernetes API at {cluster.server} refused the credential of {cluster.source} (401 "
                "Unauthorized): the token is missing, expired or revoked")  # fmt: skip
    if code == 403:
        verb = re.search(r"cannot (\w+) resource", message)
        missing = verb.group(1) if verb else "patch"
        return (f"forbidden (403): RBAC does not let {cluster.source} {missing} {plural}.{group} in namespace "
                f"{namespace!r}: bind a Role granting get, patch and create on {plural} there (deploy/gateway/) "
                f"[{message}]")  # fmt: skip
    if code == 404:
        details = status.get("details") if isinstance(status, dict) else None
        if isinstance(details, dict) and details.get("kind") == "namespaces":
            return f"namespace {namespace!r} does not exist (404): create it or pass --namespace"
        return (f"the API server does not serve {group_version} {plural} (404): install the Gateway API CRDs "
                "(standard channel, v1.0 or later) in the cluster")  # fmt: skip
    return f"the Kubernetes API refused the {plural} object ({code} {response.reason_phrase}): {message}"
