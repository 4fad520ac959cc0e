"""docker-compose.cluster.yml (2 shards x 2 replicas + ClickHouse Keeper) and its configs under
deploy/clickhouse/, and the ClickHouse release the compose files pin.

Static checks (no Docker here): the override is valid YAML, names four ClickHouse nodes and a Keeper,
each node mounts the shared cluster config and its own macros, the macros are distinct, the
``remote_servers`` cluster lists exactly those nodes by shard and carries the name the app services
are configured with, and the Keeper the nodes use is the Keeper service. The pinned server is the
release line chdb embeds, so the dialect the tests run is the one production runs.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from config.env import load
from tests.test_cluster_ddl import CLUSTER

ROOT = Path(__file__).resolve().parent.parent
OVERRIDE = ROOT / "docker-compose.cluster.yml"
BASE = ROOT / "docker-compose.yml"
APP_SERVICES = ("migrate", "web", "worker", "beat")


@pytest.fixture(scope="module")
def services() -> dict:
    data = yaml.safe_load(OVERRIDE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data["services"]


@pytest.fixture(scope="module")
def base_services() -> dict:
    return yaml.safe_load(BASE.read_text())["services"]


def _nodes(services: dict) -> dict:
    return {name: s for name, s in services.items() if str(s.get("image", "")).startswith("clickhouse/clickhouse-server:")}


def _mounts(service: dict) -> dict[str, str]:
    """container path -> host path of the service's bind mounts"""
    out = {}
    for volume in service.get("volumes") or []:
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            out[target] = source
    return out


def _xml(path: str) -> ET.Element:
    file = ROOT / path
    assert file.is_file(), f"{path} is missing"
    return ET.parse(file).getroot()


def test_four_clickhouse_nodes_and_a_keeper(services, base_services):
    nodes = _nodes(services)
    assert len(nodes) == 4, sorted(nodes)
    assert "clickhouse" in nodes  # the node the app's TRACEDASH_CLICKHOUSE_URL names
    assert {s["image"] for s in nodes.values()} == {base_services["clickhouse"]["image"]}
    keepers = [n for n, s in services.items() if str(s.get("image", "")).startswith("clickhouse/clickhouse-keeper:")]
    assert keepers == ["keeper"]
    # Keeper of the same release as the servers
    assert services["keeper"]["image"].split(":")[1] == base_services["clickhouse"]["image"].split(":")[1]
    for name, node in nodes.items():
        assert node.get("hostname") == name, name  # remote_servers and replication reach it by this name


def test_each_node_has_its_own_distinct_macros(services):
    seen = {}
    for name, node in _nodes(services).items():
        mounts = _mounts(node)
        assert mounts.get("/etc/clickhouse-server/config.d/cluster.xml") == "./deploy/clickhouse/cluster.xml", name
        macros_file = mounts.get("/etc/clickhouse-server/config.d/macros.xml")
        assert macros_file, name
        root = _xml(macros_file)
        macros = {child.tag: child.text for child in root.find("macros")}
        assert set(macros) == {"shard", "replica"}, name
        assert root.findtext("interserver_http_host") == name
        seen[name] = (macros["shard"], macros["replica"])
    assert len(set(seen.values())) == 4
    # replica names are unique cluster-wide: schema_migrations is one replication group over all nodes
    assert len({replica for _, replica in seen.values()}) == 4
    shards = sorted({shard for shard, _ in seen.values()})
    assert len(shards) == 2 and all(sum(s == shard for s, _ in seen.values()) == 2 for shard in shards)


def test_remote_servers_list_the_nodes_by_shard_under_the_configured_cluster_name(services, tmp_path):
    config = _xml("deploy/clickhouse/cluster.xml")
    clusters = list(config.find("remote_servers"))
    assert [c.tag for c in clusters] == [CLUSTER]
    for name in APP_SERVICES:
        assert services[name]["environment"]["TRACEDASH_CLICKHOUSE_CLUSTER"] == CLUSTER, name
    # what the app makes of it at start-up
    assert load({"TRACEDASH_DATA_DIR": str(tmp_path), "TRACEDASH_CLICKHOUSE_CLUSTER": CLUSTER}).clickhouse_cluster == CLUSTER
    macros = {}
    for name, node in _nodes(services).items():
        root = _xml(_mounts(node)["/etc/clickhouse-server/config.d/macros.xml"])
        macros[name] = root.findtext("macros/shard")
    listed = {}
    for index, shard in enumerate(clusters[0].findall("shard")):
        assert shard.findtext("internal_replication") == "true"  # Replicated tables copy each other
        hosts = [replica.findtext("host") for replica in shard.findall("replica")]
        assert len(hosts) == 2
        for replica in shard.findall("replica"):
            assert replica.findtext("port") == "9000"
            assert replica.find("user").get("from_env") == "CLICKHOUSE_USER"
            assert replica.find("password").get("from_env") == "CLICKHOUSE_PASSWORD"
        # the hosts of one <shard> are the nodes whose {shard} macro is the same
        assert len({macros[host] for host in hosts}) == 1, hosts
        listed.update({host: index for host in hosts})
    assert sorted(listed) == sorted(macros)
    assert len(set(listed.values())) == 2


def test_the_nodes_use_the_keeper_service(services):
    config = _xml("deploy/clickhouse/cluster.xml")
    keeper = _xml("deploy/clickhouse/keeper.xml")
    port = keeper.findtext("keeper_server/tcp_port")
    assert [(n.findtext("host"), n.findtext("port")) for n in config.findall("zookeeper/node")] == [("keeper", port)]
    assert keeper.findtext("keeper_server/raft_configuration/server/hostname") == "keeper"
    assert _mounts(services["keeper"]) == {"/etc/clickhouse-keeper/keeper_config.xml": "./deploy/clickhouse/keeper.xml"}
    for name, node in _nodes(services).items():
        assert "keeper" in node.get("depends_on", {}), name


def test_migrate_waits_for_every_node(services):
    waits = set(services["migrate"]["depends_on"]) | {"clickhouse"}  # the base file waits for `clickhouse`
    assert set(_nodes(services)) <= waits


@pytest.mark.clickhouse
def test_the_pinned_server_is_the_release_line_chdb_embeds(clickhouse_store, base_services, services):
    version = clickhouse_store.query("SELECT version()", tag="tests.version").scalar()
    line = ".".join(version.split(".")[:2])
    for image in (base_services["clickhouse"]["image"], *(s["image"] for s in _nodes(services).values())):
        tag = image.split(":")[1]
        assert ".".join(tag.split(".")[:2]) == line, f"{image} is not ClickHouse {line}, which chdb embeds ({version})"
