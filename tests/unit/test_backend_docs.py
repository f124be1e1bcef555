"""Every option a backend's settings model takes is named in its page under docs/backends/."""

from __future__ import annotations

from pathlib import Path

import pytest
from openengine_backends.mock import MockSettings
from openengine_backends.remote.settings import RemoteSettings
from openengine_gateway.spi import BackendSettings

DOCS = Path(__file__).resolve().parents[2] / "docs" / "backends"


@pytest.mark.parametrize(("page", "settings"), [("mock.md", MockSettings), ("remote.md", RemoteSettings)])
def test_every_option_is_documented(page: str, settings: type[BackendSettings]) -> None:
    text = (DOCS / page).read_text()
    assert [name for name in settings.model_fields if f"`{name}`" not in text] == []
