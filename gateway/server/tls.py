"""TLS for the gRPC port: a certificate and key, and optionally a client CA for mutual TLS.

With a client CA every client must present a certificate signed by it (the handshake fails
otherwise, before any RPC runs); without one, clients verify the server only. Files are read
when the server starts, so a bad path stops startup with a message naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the server's certificate chain and key, and the CA that signs client certificates."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate."""
        return self.client_ca_file is not None

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials from the files; raises ``OSError`` naming an unreadable file."""
        key = _read(self.key_file)
        chain = _read(self.cert_file)
        client_ca = _read(self.client_ca_file) if self.client_ca_file is not None else None
        return grpc.ssl_server_credentials(
            [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise OSError(f"{path}: cannot read TLS file: {exc.strerror}") from None


__all__ = ["TlsFiles"]
