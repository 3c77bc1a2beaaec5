"""A throwaway certificate authority made with the real openssl: a CA, server and client certificates.

The server's certificate is for 127.0.0.1 and localhost (subjectAltName, which Go's TLS requires), the
client's carries clientAuth; each is valid for a day, its key an unencrypted P-256 PEM.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.peers import require_binary


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _run(*args: str, cwd: Path) -> None:
    subprocess.run([require_binary("openssl"), *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _new_key(name: str, cwd: Path) -> None:
    _run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{name}.key", cwd=cwd)


class CertificateAuthority:
    """A CA in `folder` (ca.crt, ca.key) that signs server and client certificates on demand."""

    def __init__(self, folder: Path, name: str = "fleetlens-test-ca") -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        _new_key("ca", folder)
        _run(
            "req", "-x509", "-new", "-key", "ca.key", "-out", "ca.crt", "-days", "1",
            "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=folder,
        )  # fmt: skip
        self.cert = folder / "ca.crt"

    def issue(self, name: str, *, client: bool = False) -> Pair:
        """A certificate `name`.crt and key `name`.key signed by this CA, for a server or a client."""
        _new_key(name, self.folder)
        _run(
            "req",
            "-new",
            "-key",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
            cwd=self.folder,
        )
        usage = "clientAuth" if client else "serverAuth"
        extensions = self.folder / f"{name}.ext"
        extensions.write_text(
            f"extendedKeyUsage={usage}\nkeyUsage=critical,digitalSignature\n"
            + ("" if client else "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        )
        _run(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "1", "-extfile", extensions.name, "-out", f"{name}.crt",
            cwd=self.folder,
        )  # fmt: skip
        return Pair(self.folder / f"{name}.crt", self.folder / f"{name}.key")
