from __future__ import annotations

import pytest


@pytest.fixture
def own_state(monkeypatch, tmp_path):
    """The test's secrets in its own state directory; loopback reached without a proxy; no
    token or run secret from the shell that started the tests."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("GAP_TOKEN", raising=False)
    monkeypatch.delenv("GAP_RUN_SECRET", raising=False)
