"""docker-compose.yml: references resolve, ports are unique, commands are real runwatch commands.

tests/integration/deploy runs the file for real (`make test-deploy`); these checks need no
Docker engine.
"""

from __future__ import annotations

import argparse
import base64
import re
from typing import Any

import pytest

from runwatch import cli
from runwatch.broker.acls import Role
from runwatch.broker.security import ADMIN_USER, AUTHORIZER, users
from runwatch.common.settings import (
    _SECURITY_ENV,
    ENV_BOOTSTRAP,
    ENV_SASL_PASSWORD,
    ENV_SASL_USERNAME,
)

from .support import (
    COMPOSE_DIR,
    COMPOSE_FILE,
    MissingVariable,
    interpolate_tree,
    variables_in,
)

RUNWATCH_SERVICES = ("topics", "processors", "controller", "sinks")
BROKERS = ("kafka-1", "kafka-2", "kafka-3")
SHARED_SECURITY_VARS = sorted(set(_SECURITY_ENV) - {ENV_SASL_USERNAME, ENV_SASL_PASSWORD})
"""Security settings every service reads from .env; the login is each service's own."""
LOGINS = {
    "topics": ADMIN_USER,
    "processors": Role.PROCESSORS.value,
    "controller": Role.CONTROLLER.value,
    "sinks": Role.SINKS.value,
}
"""The Kafka user each runwatch service logs in as."""
TOP_LEVEL = {"name", "services", "volumes", "secrets", "networks", "configs"}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


def _depends(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on", {})
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in deps.items()}


def _volume_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of each short-syntax mount."""
    out = []
    for entry in service.get("volumes", []):
        assert isinstance(entry, str), f"use short volume syntax: {entry!r}"
        source, target, *_ = entry.split(":")
        out.append((source, target))
    return out


def _is_bind(source: str) -> bool:
    return source.startswith((".", "/", "~"))


def _listen_ports(services: dict[str, dict[str, Any]]) -> list[tuple[str, int]]:
    """(service, port) of every port a service listens on, on the host network."""
    out = []
    for name in BROKERS:
        for listener in services[name]["environment"]["KAFKA_LISTENERS"].split(","):
            out.append((name, int(listener.rsplit(":", 1)[1])))
    sinks = services["sinks"]["command"]
    out.append(("sinks", int(sinks[sinks.index("--metrics-port") + 1])))
    for arg in services["prometheus"]["command"]:
        if arg.startswith("--web.listen-address="):
            out.append(("prometheus", int(arg.rsplit(":", 1)[1])))
    out.append(("grafana", int(services["grafana"]["environment"]["GF_SERVER_HTTP_PORT"])))
    return out


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("runwatch has no subcommands")


def test_top_level_keys(raw_compose: dict[str, Any]) -> None:
    unknown = {k for k in raw_compose if k not in TOP_LEVEL and not k.startswith("x-")}
    assert not unknown, f"unknown top-level keys: {unknown}"
    assert set(raw_compose["services"]) >= {
        *BROKERS,
        *RUNWATCH_SERVICES,
        "prometheus",
        "grafana",
    }


def test_every_service_has_an_image(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        assert svc.get("image") or svc.get("build"), f"{name}: neither image nor build"


def test_runwatch_services_share_the_project_image(services: dict[str, dict[str, Any]]) -> None:
    images = {services[n]["image"] for n in RUNWATCH_SERVICES if n != "controller"}
    assert images == {"runwatch:local"}, f"runwatch services should share one image: {images}"
    for name, svc in services.items():
        assert "build" not in svc, f"{name}: images come from compose/images/build.sh"


def test_local_images_by_default(services: dict[str, dict[str, Any]]) -> None:
    # No registry is needed: compose/images/build.sh makes these from Debian's mirror.
    assert {services[b]["image"] for b in BROKERS} == {"runwatch/kafka:local"}
    assert services["prometheus"]["image"] == "runwatch/prometheus:local"
    assert (COMPOSE_DIR / "images" / "build.sh").is_file()


def test_controller_image_has_torch_and_is_opt_in(services: dict[str, dict[str, Any]]) -> None:
    controller = services["controller"]
    assert controller["image"] != services["processors"]["image"]
    assert controller["profiles"] == ["train"], "torch gangs start only when asked for"


def test_grafana_is_opt_in(services: dict[str, dict[str, Any]]) -> None:
    assert services["grafana"]["profiles"] == ["grafana"], "not in Debian: needs a registry"


def test_default_services_do_not_need_profile_services(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, svc in services.items():
        if svc.get("profiles"):
            continue
        for dep in _depends(svc):
            assert not services[dep].get("profiles"), f"{name} needs {dep}, which is opt-in"


def test_depends_on_resolves(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        for dep, condition in _depends(svc).items():
            assert dep in services, f"{name} depends on unknown service {dep!r}"
            assert dep != name
            assert condition in CONDITIONS, f"{name} -> {dep}: bad condition {condition!r}"
            if condition == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy"
            if condition == "service_completed_successfully":
                assert services[dep].get("restart", "no") == "no", (
                    f"{dep} is waited on to complete but restarts"
                )


def test_depends_on_has_no_cycle(services: dict[str, dict[str, Any]]) -> None:
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"dependency cycle: {' -> '.join((*path, name))}"
        if name in done:
            return
        for dep in _depends(services[name]):
            visit(dep, (*path, name))
        done.add(name)

    for name in services:
        visit(name, ())


def test_volume_references_resolve(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    used: set[str] = set()
    for name, svc in compose["services"].items():
        for source, target in _volume_mounts(svc):
            assert target.startswith("/"), f"{name}: mount target {target!r} is not absolute"
            if _is_bind(source):
                if source.startswith("."):
                    path = (COMPOSE_DIR / source).resolve()
                    assert path.exists(), f"{name}: bind source {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source!r} is not declared"
                used.add(source)
    assert declared == used, f"declared but unused volumes: {declared - used}"


def test_secret_references_resolve(compose: dict[str, Any]) -> None:
    declared = compose.get("secrets") or {}
    for name, svc in compose["services"].items():
        for secret in svc.get("secrets", []):
            secret_name = secret if isinstance(secret, str) else secret["source"]
            assert secret_name in declared, f"{name}: secret {secret_name!r} is not declared"
    for secret, spec in declared.items():
        assert "file" in spec or "environment" in spec, f"secret {secret}: no source"


def test_host_networking_only(raw_compose: dict[str, Any]) -> None:
    assert "networks" not in raw_compose, "no bridge network: every service on the host's"
    for name, svc in raw_compose["services"].items():
        assert svc.get("network_mode") == "host", f"{name}: network_mode is not host"
        assert not svc.get("ports") and not svc.get("networks"), f"{name}: publishes or joins"


def test_listen_ports_are_unique(services: dict[str, dict[str, Any]]) -> None:
    ports = _listen_ports(services)
    assert len(ports) == 3 * 2 + 3
    seen: dict[int, str] = {}
    for name, port in ports:
        assert 0 < port < 65536
        assert port not in seen, f"port {port} used by {seen[port]} and {name}"
        seen[port] = name


def test_listen_ports_are_unique_with_defaults(raw_compose: dict[str, Any]) -> None:
    # No .env at all: only the required variables given.
    services = interpolate_tree(raw_compose, {"GRAFANA_ADMIN_PASSWORD": "x"})["services"]
    ports = [p for _, p in _listen_ports(services)]
    assert len(ports) == len(set(ports))


def test_processors_are_replicated(services: dict[str, dict[str, Any]]) -> None:
    assert services["processors"]["deploy"]["replicas"] >= 2


def test_required_variables_fail_loudly_without_env(raw_compose: dict[str, Any]) -> None:
    with pytest.raises(MissingVariable, match="GRAFANA_ADMIN_PASSWORD"):
        interpolate_tree(raw_compose, {})


def test_env_example_documents_every_variable(env_example: dict[str, str]) -> None:
    used = variables_in(COMPOSE_FILE.read_text())
    missing = sorted(set(used) - set(env_example))
    assert not missing, f"variables used in docker-compose.yml but not in .env.example: {missing}"
    unused = sorted(set(env_example) - set(used))
    assert not unused, f".env.example sets variables docker-compose.yml never reads: {unused}"
    for name, op in used.items():
        if op in (":?", "?"):
            assert env_example[name], f"{name} is required; give it a value in .env.example"


@pytest.mark.parametrize("service", RUNWATCH_SERVICES)
def test_command_is_a_runwatch_subcommand(
    service: str, services: dict[str, dict[str, Any]]
) -> None:
    command = services[service]["command"]
    assert isinstance(command, list), f"{service}: write the command as a list"
    assert command[0] == "runwatch", f"{service}: command does not run runwatch: {command}"
    sub = command[1]
    assert sub in cli.COMMANDS, f"{service}: `runwatch {sub}` is not a runwatch command"
    available = _subcommands()
    if sub not in available:
        pytest.skip(f"{cli.COMMANDS[sub]} does not exist yet: cannot check `runwatch {sub}` flags")
    try:
        args = cli.build_parser().parse_args(command[1:])
    except SystemExit as exc:  # argparse's way of refusing
        pytest.fail(f"{service}: `{' '.join(command)}` is refused by runwatch's parser ({exc})")
    assert args.command == sub


@pytest.mark.parametrize("service", RUNWATCH_SERVICES)
def test_security_settings_reach_every_kafka_client(
    service: str, raw_compose: dict[str, Any]
) -> None:
    env = raw_compose["services"][service]["environment"]
    assert isinstance(env, dict), f"{service}: write environment as a mapping"
    for var in [ENV_BOOTSTRAP, *SHARED_SECURITY_VARS]:
        assert var in env, f"{service} does not pass {var} through"
        assert var in variables_in(str(env[var])), f"{service}: {var} is not read from .env"


@pytest.mark.parametrize(("service", "user"), LOGINS.items())
def test_every_service_logs_in_as_its_role_with_its_own_secret(
    service: str, user: str, services: dict[str, dict[str, Any]], compose: dict[str, Any]
) -> None:
    svc = services[service]
    env = svc["environment"]
    assert env["RUNWATCH_SECURITY_PROTOCOL"] == "SASL_PLAINTEXT"
    assert env["RUNWATCH_SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert env["RUNWATCH_SASL_USERNAME"] == user
    assert "RUNWATCH_SASL_PASSWORD" not in env, "keep passwords out of the environment"
    secret = f"kafka_{user}"
    assert env["RUNWATCH_SASL_PASSWORD_FILE"] == f"/run/secrets/{secret}"
    assert secret in svc["secrets"]
    assert compose["secrets"][secret]["file"] == f"./secrets/kafka/{user}"
    others = {f"kafka_{u}" for u in users()} - {secret}
    if service == "controller":  # its ranks log in as trainer (ranks_environ)
        assert env["RUNWATCH_TRAINER_SASL_USERNAME"] == Role.TRAINER.value
        assert env["RUNWATCH_TRAINER_SASL_PASSWORD_FILE"] == "/run/secrets/kafka_trainer"
        others.discard("kafka_trainer")
    assert not others & set(svc["secrets"]), f"{service} holds another role's password"


def test_every_user_has_a_password_file(compose: dict[str, Any]) -> None:
    files = {k: v["file"] for k, v in compose["secrets"].items() if k.startswith("kafka_")}
    assert files == {f"kafka_{u}": f"./secrets/kafka/{u}" for u in users()}


def test_the_topics_service_applies_the_roles_acls(services: dict[str, dict[str, Any]]) -> None:
    command = services["topics"]["command"]
    assert command[command.index("--acls") + 1] == "apply"
    for name in ("processors", "sinks"):  # the names the ACLs grant: the defaults
        assert "--app-id" not in services[name]["command"]
        assert "--group" not in services[name]["command"]


def test_every_security_variable_is_in_env_example(env_example: dict[str, str]) -> None:
    for var in SHARED_SECURITY_VARS:
        assert var in env_example, var
        assert env_example[var] == "", f"{var}: leave empty in the example (the defaults)"
    assert env_example["RUNWATCH_KAFKA_USERS_DIR"] == "./secrets/kafka"


@pytest.mark.parametrize("service", ["processors", "controller"])
def test_command_key_comes_from_a_secret(
    service: str, services: dict[str, dict[str, Any]], compose: dict[str, Any]
) -> None:
    svc = services[service]
    path = svc["environment"]["RUNWATCH_COMMAND_KEY_FILE"]
    m = re.fullmatch(r"/run/secrets/(\w+)", path)
    assert m, f"{service}: RUNWATCH_COMMAND_KEY_FILE={path} is not a docker secret"
    assert m.group(1) in svc.get("secrets", [])
    assert m.group(1) in compose["secrets"]
    assert "RUNWATCH_COMMAND_KEY" not in svc["environment"], "keep the key out of the env"


def test_topics_runs_once_after_every_broker_is_healthy(
    services: dict[str, dict[str, Any]],
) -> None:
    # Every broker registered before it counts them: replication 3, min.insync.replicas 2.
    topics = services["topics"]
    assert topics["command"][:3] == ["runwatch", "topics", "create"]
    assert topics["restart"] == "no"
    assert _depends(topics) == dict.fromkeys(BROKERS, "service_healthy")
    for name in ("processors", "controller", "sinks"):
        assert _depends(services[name]).get("topics") == "service_completed_successfully"


def test_sinks_metrics_on_loopback_and_archive_on_a_volume(
    services: dict[str, dict[str, Any]],
) -> None:
    command = services["sinks"]["command"]
    assert command[command.index("--metrics-host") + 1] == "127.0.0.1"
    health = " ".join(services["sinks"]["healthcheck"]["test"])
    assert f"127.0.0.1:{command[command.index('--metrics-port') + 1]}/metrics" in health
    archive = command[command.index("--archive") + 1]
    assert archive in {t for _, t in _volume_mounts(services["sinks"])}, "archive not on a volume"


class TestKafka:
    @pytest.fixture(params=BROKERS)
    def kafka(self, request: pytest.FixtureRequest, services: dict[str, dict[str, Any]]) -> Any:
        return services[request.param]

    @pytest.fixture
    def env(self, kafka: dict[str, Any]) -> dict[str, str]:
        return {k: str(v) for k, v in kafka["environment"].items()}

    def test_local_image(self, kafka: dict[str, Any]) -> None:
        assert kafka["image"] == "runwatch/kafka:local"

    def test_kraft_combined_node_in_a_three_voter_quorum(self, env: dict[str, str]) -> None:
        assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
        node = env["KAFKA_NODE_ID"]
        voters = dict(v.split("@") for v in env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(","))
        assert set(voters) == {"1", "2", "3"} and node in voters
        listeners = dict(
            (lst.split("://")[0], lst.split(":")[-1]) for lst in env["KAFKA_LISTENERS"].split(",")
        )
        controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
        assert voters[node].split(":")[1] == listeners[controller]
        protocol_map = dict(
            p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
        )
        assert set(listeners) <= set(protocol_map)
        assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in listeners
        advertised = [a.split("://")[0] for a in env["KAFKA_ADVERTISED_LISTENERS"].split(",")]
        assert controller not in advertised and set(advertised) <= set(listeners)

    def test_replication_of_a_three_node_cluster(self, env: dict[str, str]) -> None:
        from runwatch.schemas.topics import replication_for

        rule = replication_for(len(BROKERS))
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == str(rule.factor)
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == str(rule.min_insync)
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == str(rule.factor)
        assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == str(rule.factor)
        assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == str(rule.min_insync)
        assert env["KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"] == "false"
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"

    def test_scram_logins_only_and_acls_checked(self, env: dict[str, str]) -> None:
        protocols = dict(
            p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
        )
        assert set(protocols.values()) == {"SASL_PLAINTEXT"}, "a listener without a login"
        assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] == "SASL_PLAINTEXT"
        assert env["KAFKA_AUTHORIZER_CLASS_NAME"] == AUTHORIZER
        assert env["KAFKA_SUPER_USERS"] == f"User:{ADMIN_USER}"
        assert env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"

    def test_the_same_security_properties_as_the_embedded_broker(self, env: dict[str, str]) -> None:
        """Every property of a secure embedded broker, as a KAFKA_ variable of the image."""
        embedded = ensure_credentials_free_properties()
        for prop, value in embedded.items():
            var = _kafka_env_name(prop)
            assert var in env, f"{prop} ({var}) is not set on the compose brokers"
            if "jaas" not in prop:
                assert env[var] == value, (prop, env[var], value)

    def test_the_brokers_password_comes_from_the_users_dir(
        self, kafka: dict[str, Any], env: dict[str, str]
    ) -> None:
        jaas = [v for k, v in env.items() if k.endswith("_SASL_JAAS_CONFIG")]
        assert len(jaas) == 2
        ref = f"${{dir:{env['SCRAM_USERS_DIR']}:{ADMIN_USER}}}"
        for value in jaas:
            passwords = re.findall(r'(?:password|user_admin)="([^"]*)"', value)
            assert passwords and all(p == ref for p in passwords), value
        assert env["KAFKA_CONFIG_PROVIDERS"] == "dir"
        mounts = [v for v in kafka["volumes"] if v.split(":")[1] == env["SCRAM_USERS_DIR"]]
        assert mounts == [f"./secrets/kafka:{env['SCRAM_USERS_DIR']}:ro"]

    def test_cluster_id_is_a_base64_uuid(self, env: dict[str, str]) -> None:
        raw = base64.urlsafe_b64decode(env["CLUSTER_ID"] + "==")
        assert len(env["CLUSTER_ID"]) == 22 and len(raw) == 16

    def test_data_dir_is_its_own_volume(self, kafka: dict[str, Any], env: dict[str, str]) -> None:
        targets = {t: s for s, t in _volume_mounts(kafka)}
        assert env["KAFKA_LOG_DIRS"] in targets
        assert not _is_bind(targets[env["KAFKA_LOG_DIRS"]])
        assert targets[env["KAFKA_LOG_DIRS"]] == f"{env['KAFKA_NODE_ID'].join(['kafka-', ''])}-data"

    def test_healthcheck(self, kafka: dict[str, Any]) -> None:
        assert kafka["healthcheck"]["test"] == ["CMD", "/opt/kafka/bin/kafka-healthy"]
        assert (COMPOSE_DIR / "images" / "kafka" / "opt" / "bin" / "kafka-healthy").is_file()

    def test_clients_bootstrap_from_every_broker(
        self, env: dict[str, str], services: dict[str, dict[str, Any]]
    ) -> None:
        advertised = {a.split("://")[1] for a in env["KAFKA_ADVERTISED_LISTENERS"].split(",")}
        for name in RUNWATCH_SERVICES:
            bootstrap = set(services[name]["environment"][ENV_BOOTSTRAP].split(","))
            assert advertised <= bootstrap, (name, advertised, bootstrap)


def test_gitignored_secret_and_tls_dirs() -> None:
    # The default secret/TLS locations exist (so docker does not create them as root) and
    # keep their contents out of git.
    for d in ("secrets", "tls"):
        ignore = (COMPOSE_DIR / d / ".gitignore").read_text().split()
        assert ignore[0] == "*", d


def _kafka_env_name(prop: str) -> str:
    """The image's KAFKA_ variable of a property (kafka-run: `_` -> `.`, `__` -> `_`, `___` -> `-`)."""
    return "KAFKA_" + prop.replace("_", "__").replace("-", "___").replace(".", "_").upper()


def ensure_credentials_free_properties() -> dict[str, str]:
    """A secure embedded broker's properties (with throwaway passwords)."""
    from runwatch.broker.security import Credentials

    return Credentials(dict.fromkeys(users(), "x")).broker_properties()
