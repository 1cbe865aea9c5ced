"""The one settings model of every command (issue 10 item 7) and the local broker's cluster ids (item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.config import ConfigError, RouterEnv, load_config_file, load_settings, read_env
from streams.kafka.local import _CLUSTER_ID, _cluster_id, _saved_cluster_id
from streams.worker.env import WorkerEnv, read_worker_env


def test_defaults_match_the_design() -> None:
    env = read_env({})
    assert (env.bootstrap, env.app_id, env.partitions, env.data_dir) == (
        "localhost:9092",
        "chatwoot-router",
        12,
        Path("data"),
    )
    assert (env.retry_base_ms, env.sweep_interval_s, env.produce_timeout_ms) == (5000, 300.0, 1000)
    assert (env.read_timeout_s, env.keepalive_timeout_s, env.max_connections) == (10.0, 15.0, 512)
    assert env.topic("conversations") == "chatwoot-router.conversations"


def test_values_are_read_and_blank_means_unset() -> None:
    env = read_env(
        {
            "KAFKA_BOOTSTRAP_SERVERS": " 10.0.0.1:9092,[::1]:9093 ",
            "ROUTER_APP_ID": "prod.router_2",
            "ROUTER_PARTITIONS": " 24 ",
            "ROUTER_SWEEP_INTERVAL_S": "0.5",
            "ROUTER_PRODUCE_TIMEOUT_MS": "750",
            "ROUTER_READ_TIMEOUT_S": "",
            "ROUTER_CONFIG": "   ",
        }
    )
    assert env.bootstrap == "10.0.0.1:9092,[::1]:9093"
    assert (env.app_id, env.partitions, env.sweep_interval_s, env.produce_timeout_ms) == ("prod.router_2", 24, 0.5, 750)
    assert env.read_timeout_s == 10.0 and env.config_path is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ROUTER_PARTITIONS", "²"),
        ("ROUTER_PARTITIONS", "١٢"),
        ("ROUTER_PARTITIONS", "1_000"),
        ("ROUTER_PARTITIONS", "+3"),
        ("ROUTER_PARTITIONS", "100000"),
        ("ROUTER_RETRY_BASE_MS", "²"),
        ("ROUTER_RETRY_BASE_MS", "5e3"),
        ("ROUTER_SWEEP_INTERVAL_S", "inf"),
        ("ROUTER_SWEEP_INTERVAL_S", "Infinity"),
        ("ROUTER_SWEEP_INTERVAL_S", "nan"),
        ("ROUTER_SWEEP_INTERVAL_S", "0"),
        ("ROUTER_SWEEP_INTERVAL_S", "1e400"),
        ("ROUTER_SWEEP_INTERVAL_S", "99999999"),
        ("ROUTER_APP_ID", "a b"),
        ("ROUTER_APP_ID", "a/b"),
        ("ROUTER_APP_ID", "a:b"),
        ("ROUTER_APP_ID", "caf\udce9"),
        ("ROUTER_APP_ID", "x" * 121),
        ("KAFKA_BOOTSTRAP_SERVERS", "localhost:notaport"),
        ("KAFKA_BOOTSTRAP_SERVERS", "localhost:70000"),
        ("KAFKA_BOOTSTRAP_SERVERS", "a b:1"),
        ("ROUTER_MAX_CONNECTIONS", "0"),
        ("ROUTER_KEEPALIVE_TIMEOUT_S", "-5"),
        ("ROUTER_COMMIT_INTERVAL_MS", "50"),
        ("ROUTER_COMMIT_INTERVAL_MS", "2.8"),
    ],
)
def test_bad_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        read_env({name: value})
    assert caught.value.source == "environment" and caught.value.path == name
    text = str(caught.value)
    assert text.startswith(f"Invalid environment: {name}: must be ") and text.isprintable()


def test_the_worker_env_keeps_its_shape_on_top_of_the_model() -> None:
    env = read_worker_env({"ROUTER_APP_ID": "w", "ROUTER_PARTITIONS": "3", "ROUTER_DATA_DIR": "/tmp/s"})
    assert env == WorkerEnv(app_id="w", partitions=3, data_dir=Path("/tmp/s"))
    assert env.topic("effects") == "w.effects"
    assert env.commit_interval_ms == 2800
    assert read_worker_env({"ROUTER_COMMIT_INTERVAL_MS": "8000"}).commit_interval_ms == 8000
    with pytest.raises(ConfigError, match="ROUTER_SWEEP_INTERVAL_S"):
        read_worker_env({"ROUTER_SWEEP_INTERVAL_S": "inf"})


def test_secrets_come_through_the_model_and_never_show_in_its_repr(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(
        "chatwoot: {baseUrl: http://x}\nrouting: {botIds: {'1': 2}, accounts: {'1': {a: {assignee: 1, covers: c}}}}\n",
        encoding="utf-8",
    )
    environ = {
        "ROUTER_CONFIG": str(config),
        "CHATWOOT_TOKEN": "user-token-value",
        "CHATWOOT_AGENT_BOT_TOKENS": '{"1": "bot"}',
        "CHATWOOT_AGENT_BOT_SECRETS": '{"1": "whsec"}',
        "TYPESAFE_API_KEY": "tsk-value",
    }
    env = read_env(environ)
    assert "user-token-value" not in repr(env) and "tsk-value" not in repr(env)
    settings = load_settings(None, env)
    assert settings.secrets.agent_bot_secrets == {1: "whsec"}
    assert load_settings(None, environ) == settings


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xef\xbb\xbf{}", "chatwoot: Field required"),  # a UTF-8 BOM is fine
        (b"a: 1\n\xff\n", "line 2, column 1: not UTF-8 text"),
        (b"a: [1, 2\n", "line 2, column 1: expected ',' or ']', but got '<stream end>'"),
        (b'{\n\t"chatwoot": 1\n}', "chatwoot: Input should be"),  # tab-indented JSON is JSON, not broken YAML
        (b'{"a": NaN}', "NaN is not JSON"),
        (b"a: !!python/object:os.system x\n", "line 1, column 4: could not determine a constructor"),
        (b"a: \x00\n", "not allowed in YAML"),
    ],
)
def test_configuration_files_fail_with_one_readable_line(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "router.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as caught:
        load_config_file(path)
    text = str(caught.value)
    assert message in text and len(text.splitlines()) == 1 and text.isprintable()


def test_a_directory_or_missing_file_is_one_line(tmp_path: Path) -> None:
    for path in (tmp_path, tmp_path / "missing.yaml"):
        with pytest.raises(ConfigError, match=r"cannot read .*: ") as caught:
            load_config_file(path)
        assert len(str(caught.value).splitlines()) == 1


def test_error_text_escapes_control_characters_and_shortens_long_keys(tmp_path: Path) -> None:
    path = tmp_path / "router.json"
    routing = '{"botIds": {"1": 2}, "accounts": {"1": {"a": {"assignee": 1, "covers": "c"}}}}'
    path.write_text(
        '{"chatwoot": {"baseUrl": "http://x"}, "routing": ' + routing + ', "bad\\nkey' + "k" * 500 + '": 1}'
    )
    with pytest.raises(ConfigError) as caught:
        load_config_file(path)
    text = str(caught.value)
    assert text.startswith("Invalid CONFIG: bad\\nkey") and "Extra inputs are not permitted" in text
    assert "\n" not in text and len(text) < 700


def test_cluster_ids_never_start_with_a_dash() -> None:
    ids = [_cluster_id() for _ in range(5000)]  # about 78 of 5000 raw draws start with '-'
    assert all(_CLUSTER_ID.fullmatch(i) and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_saved_bad_cluster_id_is_repaired_and_a_formatted_one_is_kept(tmp_path: Path) -> None:
    logs = tmp_path / "kraft-logs"
    logs.mkdir()
    (tmp_path / "cluster.id").write_text("-bad-id-from-before-xx", encoding="utf-8")
    repaired = _saved_cluster_id(tmp_path, logs)
    assert _CLUSTER_ID.fullmatch(repaired) and not repaired.startswith("-")
    assert (tmp_path / "cluster.id").read_text(encoding="utf-8") == repaired
    assert _saved_cluster_id(tmp_path, logs) == repaired  # stable once good
    (logs / "meta.properties").write_text("version=1\ncluster.id=AbCdEfGhIjKlMnOpQrStUv\nnode.id=1\n", encoding="utf-8")
    assert _saved_cluster_id(tmp_path, logs) == "AbCdEfGhIjKlMnOpQrStUv"  # the formatted storage decides


def test_router_env_is_constructible_in_code() -> None:
    assert RouterEnv(partitions=3, app_id="x").topic("dlq") == "x.dlq"


def test_a_worker_id_asks_for_static_membership_and_is_checked_like_an_app_id() -> None:
    from streams.worker.env import read_worker_env

    assert read_worker_env({}).worker_id is None
    assert read_worker_env({"ROUTER_WORKER_ID": "router-worker-0"}).worker_id == "router-worker-0"
    try:
        read_env({"ROUTER_WORKER_ID": "a b"})
    except ConfigError as exc:
        assert "ROUTER_WORKER_ID" in str(exc)
    else:
        raise AssertionError("a worker id with a space was accepted")
