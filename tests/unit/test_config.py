import pytest

from deltabus import InvalidArgument, config


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
