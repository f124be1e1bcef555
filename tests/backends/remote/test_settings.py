"""``RemoteSettings``: errors name the key; the token comes from the environment when asked."""

from __future__ import annotations

import pytest
from openengine_backends import remote
from openengine_backends.remote import RemoteBackend, RemoteSettings
from openengine_gateway.config import engine_settings
from openengine_gateway.errors import ConfigurationError
from openengine_gateway.spi import BackendSettings


def test_target_is_required_and_flags_convert() -> None:
    with pytest.raises(ConfigurationError, match="target"):
        engine_settings(RemoteSettings, {"model": "m"}, "engines[0] (remote) options")
    settings = engine_settings(
        RemoteSettings, {"target": "h:1", "tls": True, "call_timeout_s": "2.5", "kv_events": "off"}, "flags"
    )
    assert isinstance(settings, RemoteSettings)
    assert (settings.tls, settings.call_timeout_s, settings.kv_events) == (True, 2.5, "off")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"token": "a", "token_env": "B"}, "token or token_env"),
        ({"cert_file": "/c.pem"}, "cert_file and key_file go together"),
        ({"kv_events": "sometimes"}, "kv_events"),
        ({"target": ""}, "target"),
        ({"tagret": "h:1"}, "tagret"),
    ],
)
def test_inconsistent_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        engine_settings(RemoteSettings, {"target": "h:1", **options}, "options")


def test_bearer_token(monkeypatch: pytest.MonkeyPatch) -> None:
    assert RemoteSettings(target="h:1").bearer_token() is None
    assert RemoteSettings(target="h:1", token="t").bearer_token() == "t"
    monkeypatch.setenv("FRONT_TOKEN", "from-env")
    assert RemoteSettings(target="h:1", token_env="FRONT_TOKEN").bearer_token() == "from-env"
    monkeypatch.delenv("FRONT_TOKEN")
    with pytest.raises(ValueError, match="FRONT_TOKEN"):
        RemoteSettings(target="h:1", token_env="FRONT_TOKEN").bearer_token()


def test_the_driver_registers_like_any_plugin() -> None:
    assert remote.__all__ == ["RemoteBackend", "RemoteSettings"]
    assert RemoteBackend.name == "remote" and RemoteBackend.Settings is RemoteSettings
    with pytest.raises(TypeError, match="RemoteSettings"):
        RemoteBackend(BackendSettings())
