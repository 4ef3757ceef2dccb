"""Test certificates made with ``openssl``: a LOCAL STAND-IN for a managed service's CA.

``Certificates(directory).make()`` writes, each key 0600:

* ``ca.pem`` / ``ca.key`` — the CA that signs everything below;
* ``server.pem`` / ``server.key`` — the servers' certificate, subjectAltName ``IP:127.0.0.1`` and
  ``DNS:localhost`` only (any other address a client uses is "another host");
* ``client.pem`` / ``client.key`` — a client certificate (``REQUIRE X509`` accounts, mutual TLS);
* ``other-ca.pem`` — a second CA that signed none of them (the wrong-CA case).

EC P-256 keys: the whole set takes ~0.1 s.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVER_NAMES = "IP:127.0.0.1,DNS:localhost"


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()[-500:]}")


@dataclass(frozen=True)
class Certificates:
    directory: Path

    def path(self, name: str) -> str:
        return str(Path(self.directory) / name)

    @property
    def ca(self) -> str:
        return self.path("ca.pem")

    @property
    def other_ca(self) -> str:
        return self.path("other-ca.pem")

    @property
    def server_cert(self) -> str:
        return self.path("server.pem")

    @property
    def server_key(self) -> str:
        return self.path("server.key")

    @property
    def client_cert(self) -> str:
        return self.path("client.pem")

    @property
    def client_key(self) -> str:
        return self.path("client.key")

    def make(self) -> "Certificates":
        d = Path(self.directory)
        d.mkdir(mode=0o700, parents=True, exist_ok=True)  # the keys inside are never readable by others
        if (d / "client.pem").exists():
            return self
        key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        for ca in ("ca", "other-ca"):
            _openssl("req", "-x509", *key, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "3650",
                     "-subj", f"/CN=airflow-sync test {ca}", "-addext", "basicConstraints=critical,CA:TRUE",
                     "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
        for name, usage, names in (("server", "serverAuth", SERVER_NAMES), ("client", "clientAuth", "")):
            _openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
                     f"/CN=airflow-sync test {name}", cwd=d)
            extensions = f"extendedKeyUsage={usage}\n" + (f"subjectAltName={names}\n" if names else "")
            (d / f"{name}.ext").write_text(extensions)
            _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                     "-out", f"{name}.pem", "-days", "3650", "-extfile", f"{name}.ext", cwd=d)
        for file in d.glob("*.key"):
            os.chmod(file, 0o600)  # as a server expects of its key
        return self
