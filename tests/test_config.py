from __future__ import annotations

import pytest
from pydantic import ValidationError

from memsvc.config import Settings
from memsvc.transports.cli.main import settings_from_args


def test_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSVC_LISTEN", "127.0.0.1:6000")
    monkeypatch.setenv("MEMSVC_DATA_DIR", "/tmp/from-env")
    monkeypatch.setenv("MEMSVC_EMBED_FALLBACK", "false")
    s = settings_from_args(["serve", "--listen", "0.0.0.0:7000"])
    assert s.listen == "0.0.0.0:7000"
    assert str(s.data_dir) == "/tmp/from-env"
    assert s.embed_fallback is False
    assert settings_from_args(["serve", "--embed-fallback"]).embed_fallback is True


def test_defaults_listen_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("MEMSVC_LISTEN", "MEMSVC_DATA_DIR"):
        monkeypatch.delenv(key, raising=False)
    s = settings_from_args(["serve"])
    assert s.listen == "127.0.0.1:50051"
    assert s.embed_model == "BAAI/bge-small-zh-v1.5"


def test_invalid_settings_rejected() -> None:
    with pytest.raises(ValueError):
        settings_from_args(["serve", "--listen", "no-port"])
    with pytest.raises(ValueError):
        settings_from_args(["serve", "--chunk-max-turns", "2", "--chunk-overlap-turns", "2"])


def test_cors_origins_are_origins() -> None:
    assert Settings(
        http_cors_origins=" https://a.example, http://127.0.0.1:8080/ "
    ).cors_origins == [
        "https://a.example",
        "http://127.0.0.1:8080",
    ]
    assert Settings().cors_origins == []
    with pytest.raises(ValidationError, match=r"http_cors_origins: 'https://a\.example/app'"):
        Settings(http_cors_origins="https://a.example/app")
