"""Certificates for the TLS tests, made with openssl by the test: a CA per name and
certificates it signs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from lh_redis_server import _in_ci


def require_openssl() -> None:
    """Skip without openssl (a failure under CI)."""
    if shutil.which("openssl") is None:
        if _in_ci():
            pytest.fail("openssl is required for the TLS tests under CI")
        pytest.skip("no openssl to make the test's certificates")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str) -> None:
    """``d/NAME.crt`` and ``d/NAME.key``: a self-signed CA."""
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt",
             "-days", "2", "-subj", f"/CN={name}", cwd=d)


def make_cert(d: Path, name: str, ca: str, san: str) -> None:
    """``d/NAME.crt`` and ``d/NAME.key``, signed by the CA ``ca`` for ``san``
    (``DNS:localhost,IP:127.0.0.1``)."""
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={name}", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
