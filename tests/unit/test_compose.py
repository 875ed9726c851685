"""Static checks of the Docker Compose demo cluster (no Docker engine needed).

docker-compose.yml is parsed with yaml.safe_load (anchors and `<<` merge keys
resolve) and cross-checked against infra/Dockerfile, .dockerignore,
pyproject.toml and the Python packages the containers will run.  The `replicated`
profile (kafka-1..3) is checked as run by the command the file's header documents.
"""

from __future__ import annotations

import base64
import fnmatch
import importlib.util
import json
import re
import shlex
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "infra" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = ROOT / "pyproject.toml"

# The demo cluster: module -> how many containers run it.
EXPECTED_MODULES = {
    "services.config": 1,
    "services.shard": 3,
    "services.router": 1,
    "services.balancer": 1,
    "services.range_deleter": 1,
    "services.dashboard": 1,
}


# --------------------------------------------------------------------------- helpers


def _load_compose() -> dict:
    with COMPOSE_FILE.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


_INTERP = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def interpolate(value: str, environ: dict[str, str] | None = None) -> str:
    """Compose-style `${VAR:-default}` interpolation.  Variables come from `environ` only
    (a documented command's assignments), else their defaults, so the result does not
    depend on the environment the tests run in."""
    environ = environ or {}

    def repl(m: re.Match) -> str:
        name, op = m.group("name"), m.group("op")
        if name in environ and (environ[name] or op != ":-"):
            return environ[name]
        if op in (":-", "-"):
            return m.group("arg")
        raise AssertionError(f"{value!r}: ${{{name}}} has no default")

    return _INTERP.sub(repl, value.replace("$$", "\0")).replace("\0", "$")


def env_of(svc: dict, environ: dict[str, str] | None = None) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): interpolate(str(v), environ) if v is not None else "" for k, v in env.items()}


def argv_of(svc: dict) -> list[str]:
    cmd = svc.get("command")
    if cmd is None:
        return []
    if isinstance(cmd, str):
        return shlex.split(cmd)
    return [str(a) for a in cmd]


def built_from_dockerfile(svc: dict) -> bool:
    build = svc.get("build")
    if build is None:
        return False
    if isinstance(build, str):
        context, dockerfile = build, "Dockerfile"
    else:
        context, dockerfile = build.get("context", "."), build.get("dockerfile", "Dockerfile")
    return (ROOT / context / dockerfile).resolve() == DOCKERFILE.resolve()


def find_service(services: dict, image_prefix: str) -> tuple[str, dict]:
    hits = [(n, s) for n, s in services.items() if str(s.get("image", "")).startswith(image_prefix)]
    assert len(hits) == 1, f"expected exactly one service with image {image_prefix}*, got {hits}"
    return hits[0]


def listeners(spec: str) -> dict[str, tuple[str, int]]:
    """'PLAINTEXT://:9092,CONTROLLER://0.0.0.0:9093' -> {name: (host, port)}."""
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        m = re.fullmatch(r"([A-Za-z0-9_]+)://([^:/]*):(\d+)", item)
        assert m, f"malformed listener {item!r}"
        out[m.group(1)] = (m.group(2), int(m.group(3)))
    return out


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and continuations joined."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    logical, buf = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        logical.append(buf)
        buf = ""
    if buf:
        logical.append(buf)
    out = []
    for line in logical:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def copy_sources() -> list[str]:
    """Sources of COPY/ADD instructions that come from the build context."""
    sources = []
    for instr, args in dockerfile_instructions():
        if instr not in ("COPY", "ADD"):
            continue
        if args.startswith("["):
            parts = json.loads(args)
        else:
            parts = shlex.split(args)
        flags = [p for p in parts if p.startswith("--")]
        if any(f.startswith("--from") for f in flags):
            continue
        paths = [p for p in parts if not p.startswith("--")]
        assert len(paths) >= 2, f"{instr} {args}: needs a source and a destination"
        sources.extend(paths[:-1])
    return sources


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Good-enough .dockerignore matching (last matching pattern wins, `!` negates)."""
    path = path.strip("/").removeprefix("./")
    ignored = False
    for pat in patterns:
        neg = pat.startswith("!")
        pat = pat.lstrip("!").strip("/").removeprefix("./")
        candidates = [path] + [str(p) for p in Path(path).parents if str(p) != "."]
        if any(fnmatch.fnmatchcase(c, pat) or fnmatch.fnmatchcase(c, pat.removeprefix("**/")) for c in candidates):
            ignored = not neg
    return ignored


def dockerignore_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def pyproject() -> dict:
    with PYPROJECT.open("rb") as fh:
        return tomllib.load(fh)


def module_entry_exists(module: str) -> tuple[bool, str]:
    """Can `python -m module` run?  Prefer the import system; for services.X fall
    back to services/X/__main__.py on disk (the package may be mid-development)."""
    spec = None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        if spec.submodule_search_locations:  # a package: needs __main__
            for loc in spec.submodule_search_locations:
                if (Path(loc) / "__main__.py").is_file():
                    return True, f"{loc}/__main__.py"
            return False, f"package {module} has no __main__.py"
        return True, str(spec.origin)
    parts = module.split(".")
    if parts[0] == "services":
        rel = Path(*parts)
        for candidate in (ROOT / rel / "__main__.py", ROOT / rel.with_suffix(".py")):
            if candidate.is_file():
                return True, str(candidate)
        return False, f"neither importable nor {rel}/__main__.py in the repo"
    return False, f"module {module} not importable"


# Load at import time so services can parametrize tests (a broken file fails collection).
COMPOSE = _load_compose()
SERVICES: dict = COMPOSE.get("services") or {}
BUILT = {name: svc for name, svc in SERVICES.items() if built_from_dockerfile(svc)}
# What a plain `docker compose up` runs: services without profiles are always enabled.
DEFAULT_SERVICES = {name: svc for name, svc in SERVICES.items() if not svc.get("profiles")}


# --------------------------------------------------------------------------- compose basics


def test_compose_has_services_built_from_the_dockerfile():
    assert isinstance(SERVICES, dict) and SERVICES
    assert len(BUILT) >= 8, (
        f"expected topics + config + 3 shards + router + balancer + range-deleter, got {sorted(BUILT)}"
    )
    for name, svc in BUILT.items():
        assert svc["build"]["context"] in (".", "./"), f"{name}: build context must be the repo root"


# --------------------------------------------------------------------------- kafka


def test_kafka_is_single_node_kraft():
    name, kafka = find_service(DEFAULT_SERVICES, "apache/kafka:")
    assert re.fullmatch(r"apache/kafka:4\.\d+\.\d+", kafka["image"]), kafka["image"]
    env = env_of(kafka)
    roles = {r.strip() for r in env["KAFKA_PROCESS_ROLES"].split(",")}
    assert roles == {"broker", "controller"}
    node_id = env["KAFKA_NODE_ID"]
    assert node_id.isdigit()

    lst = listeners(env["KAFKA_LISTENERS"])
    controller_names = env["KAFKA_CONTROLLER_LISTENER_NAMES"].split(",")
    assert controller_names and all(c in lst for c in controller_names)
    proto = dict(item.split(":", 1) for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(lst) <= set(proto), f"listeners without a security protocol: {set(lst) - set(proto)}"
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in lst
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] not in controller_names

    adv = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    assert set(adv) <= set(lst) and not set(adv) & set(controller_names)

    # 1@kafka:9093 — this node, reachable by service name, on the controller listener.
    voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    assert len(voters) == 1
    m = re.fullmatch(r"(\d+)@([^:]+):(\d+)", voters[0])
    assert m, voters
    assert m.group(1) == node_id
    assert m.group(2) in (name, kafka.get("hostname"))
    assert int(m.group(3)) in {lst[c][1] for c in controller_names}

    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR",
        "KAFKA_MIN_INSYNC_REPLICAS",
        "KAFKA_DEFAULT_REPLICATION_FACTOR",
    ):
        assert env.get(key) == "1", f"{key} must be 1 on a single broker (got {env.get(key)!r})"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"].lower() == "false"
    assert env["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"] == "0"
    assert "-Xmx" in env["KAFKA_HEAP_OPTS"]

    # KRaft storage format needs a fixed cluster id: base64url of 16 bytes, 22 chars.
    cid = env["CLUSTER_ID"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cid), cid
    assert len(base64.urlsafe_b64decode(cid + "==")) == 16

    # Log dirs live on a named volume, so topics survive `docker compose restart`.
    log_dir = env["KAFKA_LOG_DIRS"].split(",")[0]
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in kafka.get("volumes", [])}
    assert log_dir in mounts, f"{log_dir} is not a mounted volume"
    assert mounts[log_dir] in (COMPOSE.get("volumes") or {})


def test_kafka_has_a_healthcheck_and_a_host_listener():
    _, kafka = find_service(DEFAULT_SERVICES, "apache/kafka:")
    test = kafka["healthcheck"]["test"]
    cmd = " ".join(test) if isinstance(test, list) else test
    assert "/opt/kafka/bin/" in cmd and "--bootstrap-server" in cmd
    env = env_of(kafka)
    adv = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    lst = listeners(env["KAFKA_LISTENERS"])
    host = [(n, p) for n, (h, p) in adv.items() if h == "localhost"]
    assert host, "no listener advertised for clients on the host"
    published = {str(p).split(":")[-1] for p in kafka.get("ports", [])}
    for listener_name, port in host:
        assert lst[listener_name][1] == port
        assert str(port) in published, f"host listener port {port} is not published"


# --------------------------------------------------------------------------- zipkin


def test_zipkin_is_make_ups_version_in_memory():
    from infra.zipkin.local import ZIPKIN_VERSION

    _, zipkin = find_service(SERVICES, "openzipkin/zipkin:")
    # The official image of the server `make up` runs from Maven Central: one UI for both.
    assert zipkin["image"] == f"openzipkin/zipkin:{ZIPKIN_VERSION}", zipkin["image"]
    assert env_of(zipkin).get("STORAGE_TYPE", "mem") == "mem"
    published = {str(p).split(":")[-1] for p in zipkin.get("ports", [])}
    assert "9411" in published


# --------------------------------------------------------------------------- shardlog services


def test_demo_cluster_membership():
    modules: dict[str, list[list[str]]] = {}
    for svc in BUILT.values():
        argv = argv_of(svc)
        if argv[:2] == ["python", "-m"]:
            modules.setdefault(argv[2], []).append(argv[3:])
    for module, count in EXPECTED_MODULES.items():
        assert len(modules.get(module, [])) == count, f"{module}: want {count} containers, got {modules.get(module)}"
    shard_ids = []
    for args in modules["services.shard"]:
        assert "--shard-id" in args, args
        shard_ids.append(args[args.index("--shard-id") + 1])
    assert sorted(shard_ids) == ["s0", "s1", "s2"]


@pytest.mark.parametrize("name", sorted(BUILT))
def test_command_entry_point_exists(name):
    argv = argv_of(BUILT[name])
    assert argv, f"{name}: no command"
    if argv[0] in ("python", "python3"):
        assert argv[1] == "-m" and len(argv) >= 3, f"{name}: expected `python -m <module> ...`, got {argv}"
        module = argv[2]
        # The module's top-level package must be one pyproject installs.
        include = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
        assert any(fnmatch.fnmatchcase(module.split(".")[0], pat) for pat in include), (module, include)
        ok, where = module_entry_exists(module)
        assert ok, f"{name}: `python -m {module}`: {where}"
    elif argv[0] == "shardlog":
        assert len(argv) >= 2, f"{name}: bare `shardlog`"
        scripts = pyproject()["project"]["scripts"]
        assert scripts.get("shardlog") == "cli.main:app"
        main = ROOT / "cli" / "main.py"
        assert main.is_file(), f"{name}: cli/main.py does not exist"
        source = main.read_text(encoding="utf-8")
        for word in argv[1:]:
            if word.startswith("-"):
                break
            assert re.search(rf"\b{re.escape(word)}\b", source), f"{name}: cli/main.py never mentions {word!r}"
    else:
        pytest.fail(f"{name}: command must be `python -m <module>` or `shardlog <sub>`, got {argv}")


@pytest.mark.parametrize("name", sorted(BUILT))
def test_service_environment(name):
    env = env_of(BUILT[name])
    kafka_name, kafka = find_service(DEFAULT_SERVICES, "apache/kafka:")
    kenv = env_of(kafka)

    # KAFKA_BOOTSTRAP: the broker's in-network listener, by service name.
    assert "KAFKA_BOOTSTRAP" in env, name
    adv = listeners(kenv["KAFKA_ADVERTISED_LISTENERS"])
    lst = listeners(kenv["KAFKA_LISTENERS"])
    in_network = {p for n, (h, p) in adv.items() if h in (kafka_name, kafka.get("hostname"))}
    for server in env["KAFKA_BOOTSTRAP"].split(","):
        host, _, port = server.strip().rpartition(":")
        assert host == kafka_name, f"{name}: KAFKA_BOOTSTRAP host {host!r} is not the kafka service"
        assert int(port) in {p for _, p in lst.values()}, f"{name}: no listener on port {port}"
        assert int(port) in in_network, f"{name}: port {port} is not advertised as {kafka_name}:{port}"

    assert env.get("SHARDLOG_CLUSTER"), f"{name}: SHARDLOG_CLUSTER is empty"
    assert env.get("SHARDLOG_DATA_DIR", "").startswith("/"), f"{name}: SHARDLOG_DATA_DIR must be absolute"

    # Spans to Zipkin, as `make up`'s services send them.
    zipkin_name, _ = find_service(SERVICES, "openzipkin/zipkin:")
    url = urlparse(env.get("OTEL_EXPORTER_ZIPKIN_ENDPOINT", ""))
    assert url.hostname == zipkin_name, f"{name}: Zipkin endpoint {url.geturl()!r} is not the zipkin service"
    assert (url.scheme, url.port, url.path) == ("http", 9411, "/api/v2/spans"), url.geturl()
    assert env.get("OTEL_TRACES_EXPORTER") == "zipkin"
    assert env.get("OTEL_SERVICE_NAME", "").startswith("shardlog"), f"{name}: OTEL_SERVICE_NAME"


def test_otel_service_names_are_distinct():
    names = [env_of(svc).get("OTEL_SERVICE_NAME") for svc in BUILT.values()]
    assert None not in names
    assert len(set(names)) == len(names), names


def test_startup_order_and_restart_policy():
    kafka_name, _ = find_service(DEFAULT_SERVICES, "apache/kafka:")
    zipkin_name, _ = find_service(SERVICES, "openzipkin/zipkin:")
    one_shot = [n for n, s in BUILT.items() if argv_of(s)[:3] == ["shardlog", "topics", "create"]]
    assert len(one_shot) == 1, f"want exactly one `shardlog topics create` service, got {one_shot}"
    topics = one_shot[0]
    deps = BUILT[topics]["depends_on"]
    assert deps[kafka_name]["condition"] == "service_healthy"
    restart = str(SERVICES[topics].get("restart", "no"))
    assert restart == "no" or restart.startswith("on-failure"), f"{topics} is one-shot, restart={restart}"

    for name, svc in BUILT.items():
        if name == topics:
            continue
        deps = svc.get("depends_on") or {}
        assert isinstance(deps, dict), f"{name}: depends_on needs conditions"
        assert deps.get(topics, {}).get("condition") == "service_completed_successfully", name
        assert deps.get(zipkin_name, {}).get("condition") == "service_started", name
        assert svc.get("restart") == "unless-stopped", name


def test_each_service_keeps_its_state_on_its_own_named_volume():
    declared = COMPOSE.get("volumes") or {}
    seen: dict[str, str] = {}
    for name, svc in BUILT.items():
        if argv_of(svc)[:1] == ["shardlog"]:
            continue  # one-shot CLI, stateless
        data_dir = env_of(svc)["SHARDLOG_DATA_DIR"]
        mounts = {}
        for v in svc.get("volumes", []):
            if isinstance(v, dict):
                mounts[v["target"]] = v.get("source")
            else:
                src, target = str(v).split(":")[:2]
                mounts[target] = src
        assert data_dir in mounts, f"{name}: nothing mounted at SHARDLOG_DATA_DIR={data_dir}"
        vol = mounts[data_dir]
        assert vol in declared, f"{name}: {vol} is not a named volume"
        assert vol not in seen, f"{name} and {seen.get(vol)} share volume {vol}"
        seen[vol] = name


# --------------------------------------------------------------------------- replicated profile
#
# `COMPOSE_PROFILES=replicated ... docker compose up` runs kafka-1..3 instead of `kafka`.
# The command is the one docker-compose.yml's header documents; these tests take it from
# there, so the file and its documentation cannot drift apart.

REPLICATED_PROFILE = "replicated"
REPLICATED_BROKERS = ["kafka-1", "kafka-2", "kafka-3"]
DURABILITY = {  # as infra/kafka/local.py's _properties, on every broker
    "KAFKA_LOG_FLUSH_INTERVAL_MESSAGES": "1",  # fsync before acknowledging
    "KAFKA_BROKER_SESSION_TIMEOUT_MS": "5000",
    "KAFKA_BROKER_HEARTBEAT_INTERVAL_MS": "500",
}
REPLICATION_KEYS = {  # env var -> "factor" or "min_isr"
    "KAFKA_DEFAULT_REPLICATION_FACTOR": "factor",
    "KAFKA_MIN_INSYNC_REPLICAS": "min_isr",
    "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "factor",
    "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "factor",
    "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "min_isr",
    "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "factor",
    "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "min_isr",
}
BROKERS = {name: svc for name, svc in SERVICES.items() if str(svc.get("image", "")).startswith("apache/kafka:")}


def header_compose_commands() -> list[dict]:
    """The `[VAR=value ...] docker compose ...` lines of the file's leading comment block,
    parsed as Compose would read them."""
    commands = []
    for raw in COMPOSE_FILE.read_text(encoding="utf-8").splitlines():
        if not raw.startswith("#"):
            break
        try:
            argv = shlex.split(raw.lstrip("#").strip())
        except ValueError:
            continue
        env = {}
        while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):
            key, _, value = argv.pop(0).partition("=")
            env[key] = value
        if argv[:2] != ["docker", "compose"]:
            continue
        args = argv[2:]
        profiles, project, scale, sub = [], None, {}, None
        i = 0
        while i < len(args):
            arg = args[i]
            opt, eq, inline = arg.partition("=")
            takes_value = opt in ("--profile", "-p", "--project-name", "--scale")
            value = inline if (takes_value and eq) else (args[i + 1] if takes_value else None)
            i += 1 if (not takes_value or eq) else 2
            if opt == "--profile":
                profiles.append(value)
            elif opt in ("-p", "--project-name"):
                project = value
            elif opt == "--scale":
                svc, _, n = value.partition("=")
                scale[svc] = int(n)
            elif sub is None and not arg.startswith("-"):
                sub = arg
        if not profiles and env.get("COMPOSE_PROFILES"):
            profiles = [p.strip() for p in env["COMPOSE_PROFILES"].split(",") if p.strip()]
        project = project or env.get("COMPOSE_PROJECT_NAME") or COMPOSE.get("name")
        commands.append({"line": raw, "env": env, "sub": sub, "profiles": profiles, "project": project, "scale": scale})
    return commands


def enabled(profiles: list[str]) -> dict:
    """Compose's rule: a service without profiles is always enabled, one with profiles
    only when one of them is active."""
    return {n: s for n, s in SERVICES.items() if not s.get("profiles") or set(s["profiles"]) & set(profiles)}


def running(cmd: dict) -> dict:
    return {n: s for n, s in enabled(cmd["profiles"]).items() if cmd["scale"].get(n, 1) != 0}


def _the_up(replicated: bool) -> dict:
    ups = [
        c for c in header_compose_commands() if c["sub"] == "up" and (REPLICATED_PROFILE in c["profiles"]) == replicated
    ]
    assert len(ups) == 1, (
        f"the header must document exactly one {'replicated' if replicated else 'default'} "
        f"`docker compose up`, got {[c['line'] for c in ups]}"
    )
    return ups[0]


def test_the_profile_adds_kafka_1_to_3_and_the_default_keeps_one_broker():
    assert sorted(n for n, s in SERVICES.items() if s.get("profiles")) == REPLICATED_BROKERS
    for name in REPLICATED_BROKERS:
        assert SERVICES[name]["profiles"] == [REPLICATED_PROFILE], name
    # A plain `docker compose up` (and `up -d --build` as documented) runs exactly today's broker.
    default_up = _the_up(replicated=False)
    assert not default_up["profiles"] and not default_up["scale"] and not default_up["env"], default_up["line"]
    assert [n for n in running(default_up) if n in BROKERS] == ["kafka"]
    assert not SERVICES["kafka"].get("profiles")


def test_replicated_nodes_form_one_kraft_quorum():
    single = env_of(SERVICES["kafka"])
    envs = {name: env_of(SERVICES[name]) for name in REPLICATED_BROKERS}
    ids, voter_lines = {}, set()
    for name, env in envs.items():
        svc = SERVICES[name]
        assert svc["image"] == SERVICES["kafka"]["image"], f"{name}: same image as the single broker"
        assert svc.get("hostname") == name
        assert {r.strip() for r in env["KAFKA_PROCESS_ROLES"].split(",")} == {"broker", "controller"}
        ids[name] = env["KAFKA_NODE_ID"]
        voter_lines.add(env["KAFKA_CONTROLLER_QUORUM_VOTERS"])
        for key in (
            "KAFKA_CONTROLLER_LISTENER_NAMES",
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
            "KAFKA_INTER_BROKER_LISTENER_NAME",
            "KAFKA_AUTO_CREATE_TOPICS_ENABLE",
            "KAFKA_HEAP_OPTS",
            "KAFKA_LOG_DIRS",
            "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS",
        ):
            assert env[key] == single[key], f"{name}: {key} differs from the single broker's"
        lst = listeners(env["KAFKA_LISTENERS"])
        assert lst["PLAINTEXT"][1] == 9092 and lst["CONTROLLER"][1] == 9093, lst
        adv = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
        assert adv["PLAINTEXT"] == (name, 9092), f"{name}: replication and clients reach it as {name}:9092"
        assert "CONTROLLER" not in adv

    assert sorted(ids.values()) == ["1", "2", "3"], ids
    # Every node lists the same three voters: each node's id @ its hostname : its controller port.
    assert len(voter_lines) == 1, f"the quorum voters differ between nodes: {voter_lines}"
    voters = set()
    for v in voter_lines.pop().split(","):
        m = re.fullmatch(r"(\d+)@([^:]+):(\d+)", v.strip())
        assert m, v
        voters.add((m.group(1), m.group(2), int(m.group(3))))
    want = {
        (ids[n], SERVICES[n]["hostname"], listeners(envs[n]["KAFKA_LISTENERS"])["CONTROLLER"][1])
        for n in REPLICATED_BROKERS
    }
    assert voters == want

    cluster_ids = {env["CLUSTER_ID"] for env in envs.values()}
    assert len(cluster_ids) == 1, f"one cluster, one CLUSTER_ID: {cluster_ids}"
    cid = cluster_ids.pop()
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cid) and len(base64.urlsafe_b64decode(cid + "==")) == 16, cid


@pytest.mark.parametrize("name", sorted(BROKERS))
def test_replication_follows_the_number_of_brokers(name):
    """infra/kafka/local.py's rule: factor min(3, nodes), min.insync.replicas 2 with three
    copies (a write survives one broker down), 1 on a single node."""
    env = env_of(SERVICES[name])
    nodes = len(env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(","))
    factor = min(3, nodes)
    want = {"factor": str(factor), "min_isr": "2" if factor >= 3 else "1"}
    if name in REPLICATED_BROKERS:
        assert want == {"factor": "3", "min_isr": "2"}
    else:
        assert want == {"factor": "1", "min_isr": "1"}, "the default broker stays a single, unreplicated node"
    for key, kind in REPLICATION_KEYS.items():
        assert env.get(key) == want[kind], f"{name}: {key}={env.get(key)!r}, want {want[kind]}"


@pytest.mark.parametrize("name", sorted(BROKERS))
def test_every_broker_fsyncs_and_fences_like_the_local_deployment(name):
    env = env_of(SERVICES[name])
    for key, value in DURABILITY.items():
        assert env.get(key) == value, f"{name}: {key}={env.get(key)!r}, want {value}"
    assert env["KAFKA_HEAP_OPTS"].split() == ["-Xms256m", "-Xmx512m"]


def test_each_broker_keeps_its_log_on_its_own_named_volume():
    declared = COMPOSE.get("volumes") or {}
    seen: dict[str, str] = {}
    for name, svc in BROKERS.items():
        log_dir = env_of(svc)["KAFKA_LOG_DIRS"].split(",")[0]
        mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in svc.get("volumes", [])}
        assert log_dir in mounts, f"{name}: {log_dir} is not mounted"
        vol = mounts[log_dir]
        assert vol in declared, f"{name}: {vol} is not a named volume"
        assert vol not in seen, f"{name} and {seen.get(vol)} share volume {vol}"
        seen[vol] = name


def test_published_host_ports_are_unique():
    # Across every profile: `kafka` is not scaled to 0 unless the command says so.
    owners: dict[str, str] = {}
    for name, svc in SERVICES.items():
        for p in svc.get("ports", []):
            host_port = str(p).split(":")[-2] if ":" in str(p) else str(p)
            assert host_port not in owners, f"{name} and {owners[host_port]} both publish host port {host_port}"
            owners[host_port] = name


@pytest.mark.parametrize("name", REPLICATED_BROKERS)
def test_replicated_node_healthcheck_and_host_listener(name):
    svc = SERVICES[name]
    assert svc["healthcheck"] == SERVICES["kafka"]["healthcheck"]
    assert svc.get("restart") == "unless-stopped"
    env = env_of(svc)
    adv = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    lst = listeners(env["KAFKA_LISTENERS"])
    host = [(n, p) for n, (h, p) in adv.items() if h == "localhost"]
    assert len(host) == 1, f"{name}: one listener advertised for clients on the host"
    published = {str(p).split(":")[-1] for p in svc.get("ports", [])}
    listener_name, port = host[0]
    assert lst[listener_name][1] == port
    assert str(port) in published, f"{name}: host listener port {port} is not published"


def test_documented_replicated_command_points_every_service_at_the_three_brokers():
    up = _the_up(replicated=True)
    assert up["profiles"] == [REPLICATED_PROFILE], up["line"]
    assert up["project"] != COMPOSE["name"], (
        "its own project: the services' stores must not meet the single broker's log"
    )
    run = running(up)
    assert sorted(n for n in run if n in BROKERS) == REPLICATED_BROKERS, (
        f"the replicated stack must run kafka-1..3 and no single broker: {up['line']}"
    )
    assert set(BUILT) <= set(run)

    in_network = set()
    for b in REPLICATED_BROKERS:
        env = env_of(SERVICES[b])
        in_network |= {
            f"{h}:{p}" for h, p in listeners(env["KAFKA_ADVERTISED_LISTENERS"]).values() if h == SERVICES[b]["hostname"]
        }
    for name, svc in BUILT.items():
        env = env_of(svc, up["env"])
        servers = [s.strip() for s in env["KAFKA_BOOTSTRAP"].split(",")]
        assert len(servers) == len(set(servers))
        assert sorted(s.rpartition(":")[0] for s in servers) == REPLICATED_BROKERS, (
            f"{name}: KAFKA_BOOTSTRAP={env['KAFKA_BOOTSTRAP']!r} under the replicated command"
        )
        assert set(servers) <= in_network, f"{name}: {servers} are not the brokers' advertised listeners"
        # and nothing else changes: same cluster name, tracing, data dir as the default layout
        assert {k: v for k, v in env.items() if k != "KAFKA_BOOTSTRAP"} == {
            k: v for k, v in env_of(svc).items() if k != "KAFKA_BOOTSTRAP"
        }

    # The documented `down` addresses the same stack, profile included (else kafka-1..3 stay up).
    downs = [c for c in header_compose_commands() if c["sub"] == "down" and c["project"] == up["project"]]
    assert downs and all(REPLICATED_PROFILE in c["profiles"] for c in downs), "document the replicated `down`"


@pytest.mark.parametrize("replicated", [False, True], ids=["default", "replicated"])
def test_topics_waits_for_every_running_broker(replicated):
    up = _the_up(replicated)
    en, run = enabled(up["profiles"]), running(up)
    # Compose refuses a project whose enabled service needs a disabled one, unless `required: false`.
    for name, svc in en.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in SERVICES, f"{name} depends on undefined {dep}"
            if dep not in en:
                assert cond.get("required", True) is False, f"{name}: {dep} is disabled here, needs required: false"
            if cond.get("required", True) is False:
                # only a profile's service may be optional: the default broker must not be skipped
                assert SERVICES[dep].get("profiles"), f"{name}: {dep} always exists, keep it required"
    topics = [n for n, s in BUILT.items() if argv_of(s)[:3] == ["shardlog", "topics", "create"]]
    deps = BUILT[topics[0]]["depends_on"]
    for broker in (n for n in run if n in BROKERS):
        assert deps.get(broker, {}).get("condition") == "service_healthy", f"topics must wait for {broker}"


# --------------------------------------------------------------------------- image


def test_dockerfile_builds_the_package():
    assert DOCKERFILE.is_file()
    instrs = dockerfile_instructions()
    froms = [a.split()[0] for i, a in instrs if i == "FROM"]
    assert froms and all(f == "python:3.11-slim" for f in froms), froms
    runs = " ".join(a for i, a in instrs if i == "RUN")
    assert re.search(r"pip install --no-cache-dir (--\S+ )*\.(\s|$)", runs), "no `pip install --no-cache-dir .`"
    users = [a for i, a in instrs if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), f"last USER must be non-root, got {users}"
    workdirs = [a for i, a in instrs if i == "WORKDIR"]
    assert workdirs[-1] == "/app"


def test_dockerfile_copy_sources_exist_and_cover_the_package():
    sources = copy_sources()
    assert sources
    for src in sources:
        matches = list(ROOT.glob(src.rstrip("/"))) if any(c in src for c in "*?[") else [ROOT / src]
        assert any(m.exists() for m in matches), f"COPY source {src!r} does not exist in the repo"

    norm = {s.strip("/").removeprefix("./") for s in sources}
    assert "pyproject.toml" in norm
    readme = pyproject()["project"].get("readme")
    if isinstance(readme, str):
        assert readme in norm, f"pyproject's readme {readme} is not copied, `pip install .` would fail"
    # Every top-level package pyproject installs must be in the image.
    for pat in pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]:
        pkg = pat.rstrip("*").rstrip(".")
        assert pkg in norm, f"package {pkg} is not copied into the image"


def test_dockerignore():
    patterns = dockerignore_patterns()
    for must in (".git", ".venv", ".shardlog", "tests", "bench", "__pycache__"):
        assert dockerignored(must, patterns) or dockerignored(f"cli/{must}", patterns), f".dockerignore lets {must} in"
    for src in copy_sources():
        assert not dockerignored(src, patterns), f".dockerignore excludes COPY source {src}"
