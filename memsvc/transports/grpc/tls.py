"""The server's TLS files (MEMSVC_TLS_CERT_FILE, MEMSVC_TLS_KEY_FILE, MEMSVC_TLS_CLIENT_CA_FILE),
read and checked when `memsvc serve` starts, before the model loads: a missing, unreadable
or malformed file, or a key that is not the certificate's, is one line naming the setting
and the file (issue 84: a missing server.key was a FileNotFoundError traceback from
grpc.ssl_server_credentials). gRPC and the HTTP listener then serve the same files."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from memsvc.config import Settings


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    client_ca: Path | None
    cert_pem: bytes
    key_pem: bytes
    client_ca_pem: bytes | None

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)],
            root_certificates=self.client_ca_pem,
            require_client_auth=self.client_ca_pem is not None,
        )


def _read(setting: str, path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SystemExit(f"memsvc: {setting}={path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise SystemExit(f"memsvc: {setting}={path}: not a PEM file (no '-----BEGIN' line)")
    return data


def tls_files(settings: Settings) -> TlsFiles | None:
    """The TLS files, read and checked; None when TLS is off (configuration has already
    refused a certificate without its key, or the reverse)."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    cert = _read("MEMSVC_TLS_CERT_FILE", settings.tls_cert_file)
    key = _read("MEMSVC_TLS_KEY_FILE", settings.tls_key_file)
    ca_path = settings.tls_client_ca_file
    ca = _read("MEMSVC_TLS_CLIENT_CA_FILE", ca_path) if ca_path is not None else None
    try:  # the certificate parses, the key parses and is the certificate's
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
            settings.tls_cert_file, settings.tls_key_file
        )
    except (ssl.SSLError, ValueError) as exc:
        raise SystemExit(
            f"memsvc: MEMSVC_TLS_CERT_FILE={settings.tls_cert_file} with MEMSVC_TLS_KEY_FILE="
            f"{settings.tls_key_file}: {getattr(exc, 'reason', None) or exc} (a certificate"
            " chain and its own private key, both PEM)"
        ) from None
    if ca is not None:
        try:
            ssl.create_default_context(cadata=ca.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError) as exc:
            raise SystemExit(
                f"memsvc: MEMSVC_TLS_CLIENT_CA_FILE={ca_path}: not a CA certificate ({exc})"
            ) from None
    return TlsFiles(settings.tls_cert_file, settings.tls_key_file, ca_path, cert, key, ca)
