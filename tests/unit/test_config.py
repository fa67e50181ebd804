import pytest

from deltabus import InvalidArgument, config

# Sets DELTABUS_* variables to values clients refuse: runs before the early scenarios start
# (tests/background.py), whose in-process clients read them.
CHANGES_ENVIRONMENT = True


def test_file_then_environment(tmp_path):
    f = tmp_path / "deltabus.conf"
    f.write_text("[deltabus]\nwarehouse = /data/wh\ntrigger_interval = 2\nallow_http = false\n")
    s = config.load(f, environ={"DELTABUS_ALLOW_HTTP": "1"})
    assert (s.warehouse, s.trigger_interval, s.allow_http) == ("/data/wh", 2.0, True)
    assert s.keys_path == "/data/wh/_keys" and s.checkpoint_path == "/data/wh/_checkpoints"
    assert s.with_overrides(trigger_interval=0.2, warehouse=None).trigger_interval == 0.2


def test_shipped_conf_matches_defaults():
    assert config.load(config.default_path(), environ={}) == config.Settings()


@pytest.mark.parametrize(
    "text, env, field",
    [
        ("[deltabus]\nbogus = 1\n", {}, "bogus"),
        ("", {"DELTABUS_TRIGGER_INTERVAL": "fast"}, "DELTABUS_TRIGGER_INTERVAL"),
        ("", {"DELTABUS_ALLOW_HTTP": "maybe"}, "DELTABUS_ALLOW_HTTP"),
        ("", {"DELTABUS_TRIGGER_INTERVAL": "0"}, "trigger_interval"),
    ],
)
def test_bad_settings_name_the_setting(tmp_path, text, env, field):
    f = tmp_path / "c.conf"
    f.write_text(text)
    with pytest.raises(InvalidArgument) as e:
        config.load(f, environ=env)
    assert field in e.value.field


def test_uri_warehouse_needs_local_key_dir():
    with pytest.raises(InvalidArgument):
        config.Settings(warehouse="s3://bucket/wh").keys_path
    assert config.Settings(warehouse="s3://bucket/wh", keys_dir="/secure/keys").keys_path == "/secure/keys"


def test_client_defaults_resolve_the_three_variables_with_one_truthy_rule():
    s = config.client_defaults({"DELTABUS_WAREHOUSE": "/w", "DELTABUS_ENGINE": "delta-rs", "DELTABUS_ALLOW_HTTP": " Yes "})
    assert (s.warehouse, s.engine, s.allow_http, s.engine_field) == ("/w", "delta-rs", True, "DELTABUS_ENGINE")
    assert config.client_defaults({}) == config.ClientSettings(engine_field="DELTABUS_ENGINE")
    assert config.client_defaults({"DELTABUS_WAREHOUSE": "", "DELTABUS_ENGINE": ""}).warehouse is None
    # The same strings mean the same thing for a job's Settings and for a client.
    for raw in ("1", "true", "on", "0", "off", ""):
        assert config.client_defaults({"DELTABUS_ALLOW_HTTP": raw}).allow_http == config.load(None, {"DELTABUS_ALLOW_HTTP": raw}).allow_http


def test_client_defaults_name_a_bad_engine_and_read_an_unknown_allow_http_as_false():
    with pytest.raises(InvalidArgument) as e:
        config.client_defaults({"DELTABUS_ENGINE": "hive"})
    assert e.value.field == "DELTABUS_ENGINE"
    # As e32aae7's clients: only the true strings of the one rule allow http; a job rejects "maybe".
    for raw in ("maybe", "2", "enabled"):
        assert config.client_defaults({"DELTABUS_ALLOW_HTTP": raw}).allow_http is False
        assert config.client_allow_http({"DELTABUS_ALLOW_HTTP": raw}) is False
    assert config.client_allow_http({"DELTABUS_ALLOW_HTTP": " ON "}) is True


def test_clients_construct_with_values_they_do_not_use(tmp_path, monkeypatch):
    """e32aae7 constructed both clients with DELTABUS_ALLOW_HTTP=maybe, and with a bad
    DELTABUS_ENGINE when given an engine: resolving the environment must not break them."""
    from deltabus import PublisherClient, SubscriberClient
    from deltabus.storage import open_engine

    wh = str(tmp_path / "wh")
    monkeypatch.setenv("DELTABUS_ALLOW_HTTP", "maybe")
    monkeypatch.delenv("DELTABUS_ENGINE", raising=False)
    PublisherClient(warehouse=wh)
    sub = SubscriberClient(warehouse=wh)
    assert sub._allow_http is False
    engine = open_engine(wh, engine="delta-rs")
    monkeypatch.setenv("DELTABUS_ENGINE", "bogus")
    assert PublisherClient(engine=engine).engine is engine
    assert SubscriberClient(engine=engine).engine is engine
    # Without an engine the bad value still fails, where it did before: on opening, naming it.
    with pytest.raises(InvalidArgument) as e:
        PublisherClient(warehouse=wh)
    assert e.value.field == "DELTABUS_ENGINE"


def test_engine_names_are_one_literal():
    from typing import get_args

    assert config.ENGINES == get_args(config.EngineName) == ("auto", "delta-rs", "delta-spark")
    with pytest.raises(InvalidArgument, match="engine"):
        config.Settings(engine="spark")  # type: ignore[arg-type]


def test_only_config_reads_the_environment():
    """Library modules get settings passed down; only deltabus/config.py reads os.environ."""
    import pathlib
    import re

    lib = pathlib.Path(config.__file__).parent
    pattern = re.compile(r"os\.environ|os\.getenv|getenv\(|environ\.get\(")
    readers = sorted(
        str(p.relative_to(lib)) for p in lib.rglob("*.py")
        if p.name != "config.py" and pattern.search(p.read_text(encoding="utf-8"))
    )
    assert readers == []


def test_the_delivery_history_is_on_unless_switched_off() -> None:
    from deltabus.config import ClientSettings, Settings, load
    from deltabus.errors import InvalidArgument

    assert Settings().delivery_history is True and ClientSettings().history is True
    assert load(None, {"DELTABUS_DELIVERY_HISTORY": "0"}).delivery_history is False
    with pytest.raises(InvalidArgument, match="DELTABUS_DELIVERY_HISTORY"):
        load(None, {"DELTABUS_DELIVERY_HISTORY": "maybe"})
    with pytest.raises(InvalidArgument) as e:
        ClientSettings(history="no")  # type: ignore[arg-type]
    assert e.value.field == "history"
