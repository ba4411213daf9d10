"""Kubernetes manifests: they load into the official client's typed models, and the pods'
containers work when run as local processes with the environment and files they get.

No Kubernetes runs here. ``run_container`` plays the kubelet for one container: it sets
exactly the container's ``env`` (``$(VAR)`` expanded as the kubelet does, ``status.podIP``
from the downward API = 127.0.0.1), writes the Secret's keys into the token volume with
its ``defaultMode``, expands ``command``/``args`` and runs them. What it must change, it
changes in one place: mount paths point into a temporary directory (a container has its
own filesystem), the head Service's DNS name and 0.0.0.0 become 127.0.0.1 and the GCS
port is a free one (all "pods" share this host's network), and each container gets its
own ``LUMOS_TMPDIR`` (a container has its own /tmp).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from typing import Any

import pytest
import yaml

from lumos.launch import kubernetes as kube
from tests.conftest import wait_for
from tests.launch.conftest import WORKLOAD, free_ports, login_status

k8s_models = pytest.importorskip("kubernetes.client.models")

LUMOS = os.path.join(os.path.dirname(sys.executable), "lumos")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object,
              "datetime": str, "date": str}


def load_strict(data: Any, type_name: str, where: str) -> Any:
    """Build the client's model for ``data``, failing on any field the model does not have
    and on a missing required field.

    Clients from v35 on are pydantic models (``extra="forbid"``, required fields); older
    ones are plain classes whose setters reject a missing required field, walked here.
    """
    if type_name.startswith(("list[", "List[")):
        assert isinstance(data, list), f"{where}: expected a list"
        return [load_strict(x, type_name[5:-1], f"{where}[{i}]") for i, x in enumerate(data)]
    if type_name.startswith(("dict(", "Dict[")):
        assert isinstance(data, dict), f"{where}: expected a mapping"
        inner = type_name[5:-1].split(", ", 1)[1]
        return {k: load_strict(v, inner, f"{where}.{k}") for k, v in data.items()}
    if type_name in PRIMITIVES:
        assert isinstance(data, PRIMITIVES[type_name]) and not (type_name == "int" and isinstance(data, bool)), \
            f"{where}: expected {type_name}, got {data!r}"
        return data
    klass = getattr(k8s_models, type_name)
    assert isinstance(data, dict), f"{where}: expected an object for {type_name}"
    if hasattr(klass, "model_validate"):
        assert klass.model_config.get("extra") == "forbid"
        return klass.model_validate(data)
    by_json = {v: k for k, v in klass.attribute_map.items()}
    unknown = set(data) - set(by_json)
    assert not unknown, f"{where}: {type_name} has no fields {sorted(unknown)}"
    kwargs = {by_json[k]: load_strict(v, klass.openapi_types[by_json[k]], f"{where}.{k}") for k, v in data.items()}
    return klass(**kwargs)


#: A driver in client mode: the ``lumos://`` address and a copy of the token file are all it has.
CLIENT_DRIVER = """
import sys
import lumos
lumos.init(sys.argv[1], _token=sys.argv[2])
f = lumos.remote(lambda x: x * 2)
print("result", lumos.get(f.remote(21), timeout=60))
lumos.shutdown()
"""


MODELS = {("v1", "Secret"): "V1Secret", ("v1", "Service"): "V1Service", ("apps/v1", "Deployment"): "V1Deployment"}


@pytest.mark.parametrize("options", [
    dict(),
    dict(workers=4, cpus=8, gpus=2, store_bytes=8 * 2**30, namespace="ml", name="big", client_server=False),
])
def test_rendered_objects_load_into_the_client_models(options: dict[str, Any]) -> None:
    spec = kube.KubeSpec(**options)
    token = kube.new_token()
    objs = list(yaml.safe_load_all(kube.to_yaml(kube.render_manifests(spec, token))))
    assert [o["kind"] for o in objs] == ["Secret", "Service", "Deployment", "Deployment"]
    for obj in objs:
        model = load_strict(obj, MODELS[(obj["apiVersion"], obj["kind"])], obj["kind"])
        assert model.metadata.name.startswith(spec.name)
    # The check itself catches a misspelt field and a missing required one.
    misspelt = yaml.safe_load(yaml.safe_dump(objs[2]).replace("readinessProbe", "readinesProbe"))
    with pytest.raises((ValueError, AssertionError), match="readinesProbe"):
        load_strict(misspelt, "V1Deployment", "Deployment")
    no_image_name = yaml.safe_load(yaml.safe_dump(objs[3]))
    del no_image_name["spec"]["template"]["spec"]["containers"][0]["name"]
    with pytest.raises((ValueError, AssertionError), match="name"):
        load_strict(no_image_name, "V1Deployment", "Deployment")
    secret, service, head, worker = objs
    assert secret["stringData"]["token"] == token
    assert token not in yaml.safe_dump_all(objs[1:]), "the token belongs in the Secret only"
    assert worker["spec"]["replicas"] == spec.workers
    assert service["spec"]["selector"] == head["spec"]["template"]["metadata"]["labels"]
    for dep in (head, worker):
        pod = dep["spec"]["template"]["spec"]
        c = pod["containers"][0]
        limits = c["resources"]["limits"]
        assert limits["cpu"] == str(spec.cpus)
        assert limits.get("nvidia.com/gpu") == (str(spec.gpus) if spec.gpus else None)
        shm = next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]
        assert shm == {"medium": "Memory", "sizeLimit": f"{spec.store_bytes // 2**20}Mi"}
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        secret_vol = next(v for v in pod["volumes"] if v["name"] == "token")["secret"]
        assert secret_vol["secretName"] == secret["metadata"]["name"]
        assert "lumos kubernetes probe" in " ".join(c["readinessProbe"]["exec"]["command"])
        if options.get("namespace"):
            assert dep["metadata"]["namespace"] == options["namespace"]
    # The head's client server: a named container port, mapped by the head Service.
    head_c = head["spec"]["template"]["spec"]["containers"][0]
    client_port = kube.CLIENT_PORT if spec.client_server else None
    assert ({"name": "client", "containerPort": kube.CLIENT_PORT, "protocol": "TCP"} in head_c["ports"]) \
        == spec.client_server
    assert ({"name": "client", "port": client_port, "targetPort": "client", "protocol": "TCP"}
            in service["spec"]["ports"]) == spec.client_server
    assert ("--no-client-server" in head_c["args"]) != spec.client_server


def test_committed_manifests_are_the_default_rendering() -> None:
    with open(os.path.join(REPO, "deploy", "kubernetes", "lumos.yaml")) as f:
        committed = f.read()
    rendered = subprocess.run([os.path.join(os.path.dirname(sys.executable), "lumos"), "kubernetes", "manifest",
                               "--no-secret"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert committed.split("---\n", 1)[1] == rendered, \
        "deploy/kubernetes/lumos.yaml is stale: regenerate it (see its first lines)"


def test_manifest_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="memory_bytes"):
        kube.render_manifests(kube.KubeSpec(store_bytes=2**30, memory_bytes=2**29), None)
    with pytest.raises(ValueError, match="DNS label"):
        kube.render_manifests(kube.KubeSpec(name="Lumos_1"), None)


def test_kube_cluster_reports_an_unreachable_api_server_and_leaves_nothing() -> None:
    from kubernetes import client
    (port,) = free_ports(1)
    config = client.Configuration()
    config.host = f"http://127.0.0.1:{port}"  # nothing listens there
    config.retries = 0
    with pytest.raises(kube.KubernetesError, match=r"creating Secret lumos-token in namespace default failed"):
        kube.KubeCluster(workers=1, namespace="default", api_client=client.ApiClient(config))


# ----------------------------------------------------------------------------- containers as processes


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion: defined variables only, ``$$`` escapes."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


class Pod:
    """One container of a Deployment's pod template, run as a local process."""

    def __init__(self, deployment: dict[str, Any], secret: dict[str, Any], root: str, gcs_port: int,
                 client_port: int = 0):
        pod = deployment["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        self.root = tempfile.mkdtemp(prefix="pod", dir=root)
        mounts = {}
        for vm in c["volumeMounts"]:
            vol = next(v for v in pod["volumes"] if v["name"] == vm["name"])
            if "secret" in vol:
                path = os.path.join(self.root, vm["name"])
                os.mkdir(path)
                assert vol["secret"]["secretName"] == secret["metadata"]["name"]
                for item in vol["secret"]["items"]:
                    file = os.path.join(path, item["path"])
                    with open(file, "w") as f:
                        f.write(secret["stringData"][item["key"]])
                    os.chmod(file, vol["secret"]["defaultMode"])
                mounts[vm["mountPath"]] = path
            else:
                assert vol["emptyDir"]["medium"] == "Memory" and vm["mountPath"] == "/dev/shm"
        service = f"{kube.KubeSpec().head_service}:{kube.GCS_PORT}"

        def local(arg: str) -> str:
            if arg == str(kube.GCS_PORT):
                return str(gcs_port)
            if arg == str(kube.CLIENT_PORT):
                return str(client_port)
            if arg == "0.0.0.0":
                return "127.0.0.1"  # all of the pod's addresses; here, the pods share the machine's
            arg = arg.replace(service, f"127.0.0.1:{kube.GCS_PORT}").replace(f":{kube.GCS_PORT}", f":{gcs_port}")
            for mount, path in mounts.items():
                arg = arg.replace(mount, path)
            return arg
        env: dict[str, str] = {}
        for var in c["env"]:
            if "valueFrom" in var:
                assert var["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
                env[var["name"]] = "127.0.0.1"
            else:
                env[var["name"]] = local(expand(var["value"], env))
        self.env = env
        self.argv = [local(expand(a, env)) for a in c["command"] + c["args"]]
        self.probe = [local(a) for a in c["readinessProbe"]["exec"]["command"]]
        # The image's PATH puts its python and `lumos` first; each container has its own /tmp.
        self.base = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
                     "LUMOS_TMPDIR": os.path.join(self.root, "tmp")}
        with open(os.path.join(self.root, "out"), "wb") as out:
            self.proc = subprocess.Popen(self.argv, env={**self.base, **env}, stdout=out, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        assert self.proc.poll() is None, f"container exited ({self.proc.returncode}): {self.output()}"
        return subprocess.run(self.probe, env={**self.base, **self.env}, capture_output=True,
                              timeout=30).returncode == 0

    def output(self) -> str:
        with open(os.path.join(self.root, "out"), errors="replace") as f:
            return f.read()

    def terminate(self) -> int:
        """What the kubelet does: SIGTERM, SIGKILL after terminationGracePeriodSeconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"container ignored SIGTERM: {self.output()}") from None


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_head_and_two_workers_run_from_their_manifests_and_run_a_task_on_every_pod(short_root: str) -> None:
    from tests.conftest import check_no_leaks
    spec = kube.KubeSpec(workers=2, cpus=1, store_bytes=128 * 2**20, memory_bytes=1024 * 2**20)
    secret, service, head, worker = kube.render_manifests(spec, kube.new_token())
    port, client_port = free_ports(2)
    pods: list[Pod] = []
    try:
        # Workers first: Kubernetes does not order the Deployments, so workers wait for the head.
        pods += [Pod(worker, secret, short_root, port) for _ in range(worker["spec"]["replicas"])]
        pods.append(Pod(head, secret, short_root, port, client_port))
        for pod in pods:
            assert secret["stringData"]["token"] not in " ".join(pod.argv)
        try:
            wait_for(lambda: all(p.ready() for p in pods), 120, 0.5)
        except AssertionError:
            raise AssertionError("pods not ready:\n" + "\n".join(p.output() for p in pods)) from None
        token_file = pods[-1].argv[pods[-1].argv.index("--token-file") + 1]
        assert oct(os.stat(token_file).st_mode & 0o777) == oct(0o440)
        # The dashboard (on every address of the head pod) takes the link `login-url` makes.
        base = re.search(r"lumos dashboard: (\S+)", pods[-1].output()).group(1)  # type: ignore[union-attr]
        link = subprocess.run([LUMOS, "kubernetes", "login-url", "--token-file", token_file,
                               "--url", base.replace(socket.gethostname(), "127.0.0.1")],
                              capture_output=True, text=True, timeout=60, check=True).stdout.strip()
        assert login_status(link) == 302
        assert login_status(link.split("token=")[0] + "token=" + "0" * 40) == 403
        out = subprocess.run([sys.executable, "-c", WORKLOAD, f"127.0.0.1:{port}", token_file],
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "LUMOS_TMPDIR": os.path.join(short_root, "driver")})
        assert out.returncode == 0, out.stdout + out.stderr
        result = yaml.safe_load(out.stdout.strip().splitlines()[-1])
        assert len(result["nodes"]) == 3 and result["ran_on"] == result["nodes"]
        # A notebook with no node of its own connects through the head's client server.
        client = f"lumos://127.0.0.1:{client_port}"
        assert f"lumos client address: {client}" in pods[-1].output()
        driven = subprocess.run([sys.executable, "-c", CLIENT_DRIVER, client, token_file],
                                capture_output=True, text=True, timeout=120)
        assert driven.returncode == 0 and "result 42" in driven.stdout, driven.stdout + driven.stderr
        # The probe authenticates: a wrong token is not ready.
        bad = os.path.join(short_root, "bad-token")
        with open(bad, "w") as f:
            f.write(kube.new_token())
        refused = subprocess.run([LUMOS, "kubernetes", "probe",
                                  "--address", f"127.0.0.1:{port}", "--token-file", bad],
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1 and "token is wrong" in refused.stderr, refused.stderr
        # A node with the wrong token does not start, and says why.
        joiner = subprocess.run([sys.executable, "-m", "lumos.launch.node", "--address", f"127.0.0.1:{port}",
                                 "--token-file", bad, "--node-ip-address", "127.0.0.1", "--join-timeout-s", "20"],
                                capture_output=True, text=True, timeout=60,
                                env={**os.environ, "LUMOS_TMPDIR": os.path.join(short_root, "joiner")})
        assert joiner.returncode == 2 and "token is wrong" in joiner.stderr, joiner.stderr
    finally:
        codes = [p.terminate() for p in pods]
    assert codes == [0] * len(pods), [p.output() for p in pods]
    check_no_leaks(None)
    for pod in pods:
        for session in os.listdir(pod.base["LUMOS_TMPDIR"]):
            stores = [d for d in os.listdir("/dev/shm") if d.startswith(f"lumos-{session}-")]
            assert not stores, f"object stores left behind: {stores}"



# ----------------------------------------------------------------------------- KubeCluster against a stand-in API


class FakeApiServer:
    """Just enough of the Kubernetes API for KubeCluster: create, read status, scale, delete
    of Secrets, Services and Deployments in one namespace, over real HTTP. Deployments
    report every replica ready at once (no pods run). Stands in for a real API server,
    which no test here can reach; the official client does all the (de)serialisation."""

    def __init__(self) -> None:
        import http.server
        import json
        import threading
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, code: int, obj: dict[str, Any]) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            @property
            def route(self) -> str:
                return self.path.split("?", 1)[0]

            def _body(self) -> Any:
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")

            def do_POST(self) -> None:
                outer.requests.append(("POST", self.route))
                obj = self._body()
                outer.objects[f"{self.route}/{obj['metadata']['name']}"] = obj
                self._reply(201, obj)

            def do_GET(self) -> None:
                outer.requests.append(("GET", self.route))
                obj = outer.objects.get(self.route.removesuffix("/status"))
                if obj is None:
                    self._reply(404, {"kind": "Status", "apiVersion": "v1", "code": 404, "reason": "NotFound"})
                    return
                n = obj["spec"]["replicas"]
                self._reply(200, {**obj, "status": {"replicas": n, "readyReplicas": n, "availableReplicas": n}})

            def do_PATCH(self) -> None:
                outer.requests.append(("PATCH", self.route))
                obj = outer.objects[self.route.removesuffix("/scale")]
                obj["spec"]["replicas"] = self._body()["spec"]["replicas"]
                self._reply(200, {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": obj["metadata"],
                                  "spec": {"replicas": obj["spec"]["replicas"]}})

            def do_DELETE(self) -> None:
                outer.requests.append(("DELETE", self.route))
                obj = outer.objects.pop(self.route, None)
                if "/services/" in self.route and obj is not None:
                    self._reply(200, obj)  # as the real API does: the deleted Service
                else:
                    self._reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="fake-kube-api", daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def test_kube_cluster_creates_scales_and_deletes_the_rendered_objects() -> None:
    from kubernetes import client
    api = FakeApiServer()
    try:
        config = client.Configuration()
        config.host = api.url
        cluster = kube.KubeCluster(workers=2, cpus=4, namespace="ml", api_client=client.ApiClient(config),
                                   timeout_s=30)
        prefix = "/api/v1/namespaces/ml"
        apps = "/apis/apps/v1/namespaces/ml"
        assert sorted(api.objects) == sorted([f"{prefix}/secrets/lumos-token", f"{prefix}/services/lumos-head",
                                              f"{apps}/deployments/lumos-head", f"{apps}/deployments/lumos-worker"])
        expected = kube.render_manifests(cluster.spec, cluster.token)
        for obj in expected:
            sent = next(v for k, v in api.objects.items() if k.endswith(f"/{obj['metadata']['name']}")
                        and obj["kind"].lower() in k)
            assert sent == obj
        assert cluster.address == "lumos-head.ml.svc:6379"
        assert cluster.client_address == "lumos://lumos-head.ml.svc:10001"
        cluster.scale(5)
        assert api.objects[f"{apps}/deployments/lumos-worker"]["spec"]["replicas"] == 5
        assert ("PATCH", f"{apps}/deployments/lumos-worker/scale") in api.requests
        cluster.close()
        assert api.objects == {}
        deletes = [path for verb, path in api.requests if verb == "DELETE"]
        assert deletes[0].endswith("/deployments/lumos-worker") and deletes[-1].endswith("/secrets/lumos-token")
    finally:
        api.close()
