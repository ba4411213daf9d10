"""lumos on Kubernetes: manifests (``lumos kubernetes manifest``), the readiness probe
(``lumos kubernetes probe``) and ``KubeCluster`` (create, scale, delete from Python).

```
Secret <name>-token ──(file, 0440)──► every pod: /var/run/lumos/token
Service <name>-head (gcs 6379, dashboard 8265, client 10001) ──► Deployment <name>-head (1 pod)
Deployment <name>-worker (replicas = workers) ── joins <name>-head:6379
each pod: python -m lumos.launch.node ... --node-ip-address $(POD_IP)
          /dev/shm = memory-backed emptyDir sized to the object store
          readiness: lumos kubernetes probe (authenticates to the GCS, finds its own node)
```

Rendering is pure (``render_manifests`` returns plain dicts); ``KubeCluster`` needs the
official client (``pip install 'lumos[kubernetes]'``), imported only when it is used.
"""

from __future__ import annotations

import argparse
import math
import secrets
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

from lumos.exceptions import LumosError

GCS_PORT = 6379
DASHBOARD_PORT = 8265
#: The head's client server, for ``lumos.init("lumos://<name>-head.<namespace>.svc:10001")``.
CLIENT_PORT = 10001
TOKEN_DIR = "/var/run/lumos"
TOKEN_FILE = f"{TOKEN_DIR}/token"
#: Room for the interpreter, workers and their heaps beyond the object store, per pod.
DEFAULT_HEADROOM_BYTES = 2 * 2**30


class KubernetesError(LumosError, RuntimeError):
    """A Kubernetes API call failed, or the cluster's pods did not become ready."""


@dataclass(slots=True)
class KubeSpec:
    """The shape of a lumos cluster on Kubernetes."""

    name: str = "lumos"
    namespace: str | None = None
    image: str = "lumos:0.1.0"
    #: Worker pods (the head runs tasks too).
    workers: int = 1
    #: CPUs per pod (requests and limits; the node advertises this many).
    cpus: int = 1
    #: GPUs per pod (``nvidia.com/gpu``).
    gpus: int = 0
    #: Object store bytes per pod; ``/dev/shm`` is sized to it.
    store_bytes: int = 2**30
    #: Memory limit per pod; None: the store plus 2 GiB.
    memory_bytes: int | None = None
    #: Run the head's client server and map it in the head Service (``client``, 10001).
    client_server: bool = True

    def check(self) -> None:
        import re
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?", self.name):
            raise ValueError(f"name must be a DNS label of at most 42 characters (lowercase, digits, '-'), "
                             f"got {self.name!r}")
        for field, low in (("workers", 0), ("cpus", 1), ("gpus", 0), ("store_bytes", 64 * 2**20)):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{field} must be an int >= {low}, got {value!r}")
        if self.memory_bytes is not None and self.memory_bytes <= self.store_bytes:
            raise ValueError(f"memory_bytes ({self.memory_bytes}) must exceed store_bytes ({self.store_bytes}): "
                             "the memory-backed /dev/shm counts against the pod's memory limit")

    @property
    def pod_memory_bytes(self) -> int:
        return self.memory_bytes if self.memory_bytes is not None else self.store_bytes + DEFAULT_HEADROOM_BYTES

    @property
    def head_service(self) -> str:
        return f"{self.name}-head"


def _mi(n: int) -> str:
    return f"{math.ceil(n / 2**20)}Mi"


def _labels(spec: KubeSpec, component: str | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": "lumos", "app.kubernetes.io/instance": spec.name}
    if component:
        out["app.kubernetes.io/component"] = component
    return out


def _meta(spec: KubeSpec, name: str, component: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": _labels(spec, component)}
    if spec.namespace:
        meta["namespace"] = spec.namespace
    return meta


def _container(spec: KubeSpec, head: bool) -> dict[str, Any]:
    env: list[dict[str, Any]] = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    if head:
        env.append({"name": "LUMOS_ADDRESS", "value": f"$(POD_IP):{GCS_PORT}"})
        # The dashboard listens on every address of the pod: `kubectl port-forward` connects
        # to the pod's loopback, the Service to its pod IP.
        role = ["--head", "--port", str(GCS_PORT), "--dashboard-host", "0.0.0.0",
                "--dashboard-port", str(DASHBOARD_PORT)]
        ports = [{"name": "gcs", "containerPort": GCS_PORT, "protocol": "TCP"},
                 {"name": "dashboard", "containerPort": DASHBOARD_PORT, "protocol": "TCP"}]
        if spec.client_server:
            # Every address too, for the same reason as the dashboard.
            role += ["--client-server-host", "0.0.0.0", "--client-server-port", str(CLIENT_PORT)]
            ports.append({"name": "client", "containerPort": CLIENT_PORT, "protocol": "TCP"})
        else:
            role.append("--no-client-server")
    else:
        env.append({"name": "LUMOS_ADDRESS", "value": f"{spec.head_service}:{GCS_PORT}"})
        role = ["--address", "$(LUMOS_ADDRESS)"]
        ports = []
    args = [*role, "--token-file", TOKEN_FILE, "--node-ip-address", "$(POD_IP)", "--num-cpus", str(spec.cpus),
            "--num-gpus", str(spec.gpus), "--object-store-memory", str(spec.store_bytes),
            "--memory", str(spec.pod_memory_bytes - spec.store_bytes)]
    quantities = {"cpu": str(spec.cpus), "memory": _mi(spec.pod_memory_bytes)}
    if spec.gpus:
        quantities["nvidia.com/gpu"] = str(spec.gpus)
    probe = ('exec lumos kubernetes probe --address "$LUMOS_ADDRESS" --token-file '
             f'{TOKEN_FILE} --node-ip "$POD_IP"')
    container: dict[str, Any] = {
        "name": "lumos",
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", "lumos.launch.node"],
        "args": args,
        "env": env,
        "resources": {"requests": dict(quantities), "limits": dict(quantities)},
        "volumeMounts": [{"name": "token", "mountPath": TOKEN_DIR, "readOnly": True},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
        "readinessProbe": {"exec": {"command": ["sh", "-c", probe]}, "initialDelaySeconds": 2,
                           "periodSeconds": 10, "timeoutSeconds": 15, "failureThreshold": 3},
    }
    if ports:
        container["ports"] = ports
    return container


def _deployment(spec: KubeSpec, head: bool) -> dict[str, Any]:
    component = "head" if head else "worker"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(spec, f"{spec.name}-{component}", component),
        "spec": {
            "replicas": 1 if head else spec.workers,
            # A second head would be a second cluster: replace, never overlap.
            "strategy": {"type": "Recreate"} if head else {"type": "RollingUpdate"},
            "selector": {"matchLabels": _labels(spec, component)},
            "template": {
                "metadata": {"labels": _labels(spec, component)},
                "spec": {
                    # Service links would add LUMOS_HEAD_* variables; the containers get exactly `env`.
                    "enableServiceLinks": False,
                    "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                        "runAsNonRoot": True},
                    "terminationGracePeriodSeconds": 30,
                    "containers": [_container(spec, head)],
                    "volumes": [
                        {"name": "token", "secret": {"secretName": f"{spec.name}-token", "defaultMode": 0o440,
                                                     "items": [{"key": "token", "path": "token"}]}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _mi(spec.store_bytes)}},
                    ],
                },
            },
        },
    }


def render_manifests(spec: KubeSpec, token: str | None) -> list[dict[str, Any]]:
    """The cluster's objects: Secret (when ``token`` is given), head Service, head and worker
    Deployments. Pure: no API calls."""
    spec.check()
    objs: list[dict[str, Any]] = []
    if token is not None:
        objs.append({"apiVersion": "v1", "kind": "Secret", "metadata": _meta(spec, f"{spec.name}-token"),
                     "type": "Opaque", "stringData": {"token": token}})
    ports = [{"name": "gcs", "port": GCS_PORT, "targetPort": "gcs", "protocol": "TCP"},
             {"name": "dashboard", "port": DASHBOARD_PORT, "targetPort": "dashboard", "protocol": "TCP"}]
    if spec.client_server:
        ports.append({"name": "client", "port": CLIENT_PORT, "targetPort": "client", "protocol": "TCP"})
    objs.append({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec, spec.head_service, "head"),
        "spec": {"type": "ClusterIP", "selector": _labels(spec, "head"), "ports": ports},
    })
    objs.append(_deployment(spec, head=True))
    objs.append(_deployment(spec, head=False))
    return objs


def to_yaml(objs: Sequence[dict[str, Any]]) -> str:
    import yaml
    return str(yaml.safe_dump_all(list(objs), sort_keys=False, default_flow_style=False))


def new_token() -> str:
    return secrets.token_hex(32)


# ----------------------------------------------------------------------------- probe


def probe(address: str, token_file: str, node_ip: str | None, timeout_s: float = 10.0) -> str:
    """Authenticate to the GCS and, with ``node_ip``, find an ALIVE node at that address.

    Returns a one-line description; raises ``KubernetesError`` saying what is missing.
    """
    from lumos._private.config import Config
    from lumos._private.transport.connection import parse_address
    from lumos.launch.node import NodeStartError, gcs_nodes, read_token
    try:
        token = read_token(token_file, {})
        gcs = parse_address(address)
    except (NodeStartError, ValueError) as e:
        raise KubernetesError(str(e)) from None
    if not isinstance(gcs, tuple):
        raise KubernetesError(f"--address must be HOST:PORT, got {address!r}")
    try:
        nodes = gcs_nodes(gcs, token, Config.resolve(), timeout_s)
    except (ConnectionError, PermissionError) as e:
        raise KubernetesError(str(e)) from None
    alive = [n for n in nodes if n.state == "ALIVE"]
    if node_ip is not None:
        mine = [n for n in alive if n.address.host == node_ip]
        if not mine:
            raise KubernetesError(f"the GCS at {address} has no alive node at {node_ip} (yet)")
        return f"node {mine[0].node_id.hex()[:8]} at {node_ip} is alive; cluster has {len(alive)} node(s)"
    return f"the GCS at {address} answers; cluster has {len(alive)} node(s)"


# ----------------------------------------------------------------------------- KubeCluster


def _client() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise ImportError("KubeCluster needs the Kubernetes client: pip install 'lumos[kubernetes]'") from None
    return kubernetes


#: Where a pod finds its own namespace (in-cluster configuration).
_SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _default_namespace(k8s: Any) -> str:
    """The kubeconfig context's namespace, else this pod's, else "default"."""
    try:
        ns = k8s.config.list_kube_config_contexts()[1]["context"].get("namespace")
        if ns:
            return str(ns)
    except (k8s.config.ConfigException, OSError, KeyError, TypeError):
        pass
    try:
        with open(_SERVICE_ACCOUNT_NAMESPACE) as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


class KubeCluster:
    """A lumos cluster on Kubernetes, created from Python with the official client.

    Args:
        workers, cpus, gpus, store_bytes, memory_bytes, image, name: see ``KubeSpec``.
        namespace: where the objects go (default: the kubeconfig context's, else "default").
        wait: wait until the head and every worker pod is ready.
        timeout_s: how long to wait.
        api_client: a ``kubernetes.client.ApiClient``; default: from kubeconfig, else in-cluster.

    Raises:
        ImportError: the ``kubernetes`` package is missing.
        KubernetesError: an API call failed, or the pods were not ready within ``timeout_s``.

    Example:
        >>> cluster = KubeCluster(workers=4, cpus=8, gpus=1, image="registry.example/lumos:0.1.0")
        >>> cluster.scale(8)
        >>> cluster.close()
    """

    def __init__(self, workers: int = 1, cpus: int = 1, gpus: int = 0, store_bytes: int = 2**30,
                 memory_bytes: int | None = None, *, image: str = "lumos:0.1.0", name: str = "lumos",
                 namespace: str | None = None, client_server: bool = True, wait: bool = True,
                 timeout_s: float = 300.0, api_client: Any = None) -> None:
        k8s = _client()
        if api_client is None:
            try:
                k8s.config.load_kube_config()
            except (k8s.config.ConfigException, OSError):
                k8s.config.load_incluster_config()
            api_client = k8s.client.ApiClient()
        if namespace is None:
            namespace = _default_namespace(k8s)
        self.spec = KubeSpec(name=name, namespace=namespace, image=image, workers=workers, cpus=cpus, gpus=gpus,
                             store_bytes=store_bytes, memory_bytes=memory_bytes, client_server=client_server)
        self.spec.check()
        import urllib3
        self._k8s = k8s
        #: What a failed API call raises: an HTTP error status, or no answer at all.
        self._api_errors = (k8s.client.ApiException, urllib3.exceptions.HTTPError, OSError)
        self._core = k8s.client.CoreV1Api(api_client)
        self._apps = k8s.client.AppsV1Api(api_client)
        #: The cluster token (also in the Secret ``<name>-token``).
        self.token = new_token()
        self._created: list[tuple[str, str]] = []
        try:
            for obj in render_manifests(self.spec, self.token):
                self._create(obj)
            if wait:
                self.wait_ready(timeout_s)
        except BaseException:
            self.close()
            raise

    @property
    def namespace(self) -> str:
        return str(self.spec.namespace)

    @property
    def address(self) -> str:
        """The GCS address inside the Kubernetes cluster (the head Service)."""
        return f"{self.spec.head_service}.{self.namespace}.svc:{GCS_PORT}"

    @property
    def client_address(self) -> str:
        """``lumos://`` address of the head's client server inside the Kubernetes cluster (a
        JupyterHub pod, say); from outside, ``kubectl port-forward svc/<name>-head 10001`` and
        ``lumos://localhost:10001``. "" when the cluster runs none."""
        if not self.spec.client_server:
            return ""
        return f"lumos://{self.spec.head_service}.{self.namespace}.svc:{CLIENT_PORT}"

    def __repr__(self) -> str:
        return f"KubeCluster(name={self.spec.name!r}, namespace={self.namespace!r}, workers={self.spec.workers})"

    def __enter__(self) -> "KubeCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _api_error(self, what: str, e: Exception) -> KubernetesError:
        status = getattr(e, "status", None)
        reason = getattr(e, "reason", None) or str(e)
        return KubernetesError(f"{what} in namespace {self.namespace} failed"
                               f"{f' (HTTP {status})' if status else ''}: {reason}")

    def _create(self, obj: dict[str, Any]) -> None:
        kind, name = obj["kind"], obj["metadata"]["name"]
        create = {"Secret": self._core.create_namespaced_secret,
                  "Service": self._core.create_namespaced_service,
                  "Deployment": self._apps.create_namespaced_deployment}[kind]
        try:
            create(self.namespace, obj)
        except self._api_errors as e:
            raise self._api_error(f"creating {kind} {name}", e) from None
        self._created.append((kind, name))

    def ready_pods(self) -> tuple[int, int]:
        """``(ready heads, ready workers)`` as the Deployments report them."""
        out = []
        for component in ("head", "worker"):
            try:
                d = self._apps.read_namespaced_deployment_status(f"{self.spec.name}-{component}", self.namespace)
            except self._api_errors as e:
                raise self._api_error(f"reading Deployment {self.spec.name}-{component}", e) from None
            out.append(int(d.status.ready_replicas or 0))
        return out[0], out[1]

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            head, workers = self.ready_pods()
            if head >= 1 and workers >= self.spec.workers:
                return
            if time.monotonic() > deadline:
                raise KubernetesError(f"{head}/1 head and {workers}/{self.spec.workers} worker pods ready after "
                                      f"{timeout_s:.0f}s; see `kubectl -n {self.namespace} describe pods "
                                      f"-l app.kubernetes.io/instance={self.spec.name}`")
            time.sleep(2.0)

    def scale(self, workers: int, *, wait: bool = True, timeout_s: float = 300.0) -> None:
        """Set the worker Deployment's replicas."""
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
            raise ValueError(f"workers must be an int >= 0, got {workers!r}")
        name = f"{self.spec.name}-worker"
        try:
            self._apps.patch_namespaced_deployment_scale(name, self.namespace, {"spec": {"replicas": workers}})
        except self._api_errors as e:
            raise self._api_error(f"scaling Deployment {name}", e) from None
        self.spec.workers = workers
        if wait:
            self.wait_ready(timeout_s)

    def close(self) -> None:
        """Delete what this object created (workers first, the Secret last)."""
        delete = {"Secret": self._core.delete_namespaced_secret,
                  "Service": self._core.delete_namespaced_service,
                  "Deployment": self._apps.delete_namespaced_deployment}
        errors = []
        while self._created:
            kind, name = self._created.pop()
            try:
                delete[kind](name, self.namespace, propagation_policy="Foreground")
            except self._api_errors as e:
                if getattr(e, "status", None) != 404:
                    errors.append(str(self._api_error(f"deleting {kind} {name}", e)))
        if errors:
            raise KubernetesError("; ".join(errors))


# ----------------------------------------------------------------------------- command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="kubernetes_command", required=True)
    m = sub.add_parser("manifest", help="print the cluster's Kubernetes objects as YAML")
    m.add_argument("--name", default="lumos", help="prefix of every object's name (default lumos)")
    m.add_argument("--namespace", default=None, help="metadata.namespace (default: none, kubectl's -n applies)")
    m.add_argument("--image", default="lumos:0.1.0", help="container image built from deploy/Dockerfile")
    m.add_argument("--workers", type=int, default=1, help="worker pods (default 1)")
    m.add_argument("--cpus", type=int, default=1, help="CPUs per pod (default 1)")
    m.add_argument("--gpus", type=int, default=0, help="GPUs per pod (nvidia.com/gpu; default 0)")
    m.add_argument("--store-bytes", type=int, default=2**30, help="object store bytes per pod (default 1 GiB)")
    m.add_argument("--memory-bytes", type=int, default=None, help="memory limit per pod (default: store + 2 GiB)")
    m.add_argument("--no-client-server", action="store_true",
                   help="run no client server on the head (lumos:// drivers outside the pods cannot connect)")
    m.add_argument("--no-secret", action="store_true",
                   help="leave the token Secret out (create <name>-token yourself, key `token`)")
    m.set_defaults(kubernetes_func=_cmd_manifest)
    pr = sub.add_parser("probe", help="readiness check: authenticate to the GCS, find this node")
    pr.add_argument("--address", required=True, help="HOST:PORT of the GCS")
    pr.add_argument("--token-file", required=True)
    pr.add_argument("--node-ip", default=None, help="also require an alive node at this address")
    pr.add_argument("--timeout", type=float, default=10.0)
    pr.set_defaults(kubernetes_func=_cmd_probe)
    lu = sub.add_parser("login-url", help="the dashboard's login link, from the cluster token")
    lu.add_argument("--token-file", required=True,
                    help="the cluster token, e.g. from `kubectl get secret lumos-token -o "
                         "jsonpath='{.data.token}' | base64 -d`")
    lu.add_argument("--url", default=f"http://localhost:{DASHBOARD_PORT}",
                    help=f"where the dashboard is reached (default http://localhost:{DASHBOARD_PORT}, "
                         "as `kubectl port-forward svc/lumos-head 8265` serves it)")
    lu.set_defaults(kubernetes_func=_cmd_login_url)


def run(args: argparse.Namespace) -> int:
    return int(args.kubernetes_func(args))


def _cmd_manifest(args: argparse.Namespace) -> int:
    spec = KubeSpec(name=args.name, namespace=args.namespace, image=args.image, workers=args.workers,
                    cpus=args.cpus, gpus=args.gpus, store_bytes=args.store_bytes, memory_bytes=args.memory_bytes,
                    client_server=not args.no_client_server)
    try:
        objs = render_manifests(spec, None if args.no_secret else new_token())
    except ValueError as e:
        print(f"lumos kubernetes manifest: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(to_yaml(objs))
    return 0


def _cmd_probe(args: argparse.Namespace) -> int:
    try:
        print(probe(args.address, args.token_file, args.node_ip, args.timeout))
    except KubernetesError as e:
        print(f"lumos kubernetes probe: not ready: {e}", file=sys.stderr)
        return 1
    return 0


def login_url(token_file: str, url: str) -> str:
    """The dashboard's login link at ``url`` (it carries a key derived from the token)."""
    from lumos.dashboard.auth import login_token
    from lumos.launch.node import read_token
    return f"{url.rstrip('/')}/login?token={login_token(read_token(token_file, {}))}"


def _cmd_login_url(args: argparse.Namespace) -> int:
    from lumos.launch.node import NodeStartError
    try:
        print(login_url(args.token_file, args.url))
    except NodeStartError as e:
        print(f"lumos kubernetes login-url: error: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lumos.launch.kubernetes")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
