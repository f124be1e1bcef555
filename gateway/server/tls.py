"""TLS for the gRPC port: a certificate and key, and optionally a client CA for mutual TLS.

With a client CA every client must present a certificate signed by it (the handshake fails
otherwise, before any RPC runs); without one, clients verify the server only. Files are checked
before any engine starts, so a bad file stops startup with a message naming it.
"""

from __future__ import annotations

import ssl
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

    def check(self) -> None:
        """Load the files as Python's ``ssl`` would: raises ``OSError`` naming what is wrong (an
        unreadable file, no PEM, a key that is not the certificate's, a bad CA), which grpc would
        only report as a failed bind."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            files = f"{self.cert_file} and {self.key_file}"
            raise OSError(f"{files}: not a PEM certificate chain and its key: {exc}") from None
        if self.client_ca_file is not None:
            try:
                context.load_verify_locations(cafile=self.client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise OSError(f"{self.client_ca_file}: not a PEM client CA: {exc}") from None

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
