"""The self-signed certificate of `serve --self-signed`: made once, reused, renewed when it no longer fits."""

from __future__ import annotations

import datetime as dt
import ssl
import stat
from pathlib import Path

import pytest

from web.tls import TLSConfigError, names_to_cover, self_signed_certificate, server_ssl_context

NAMES = {"localhost", "127.0.0.1", "::1", "192.168.1.20"}


def test_made_once_valid_for_the_names_and_reused(tmp_path: Path) -> None:
    from cryptography import x509

    first = self_signed_certificate(tmp_path, NAMES)
    assert first.created and set(first.names) == NAMES
    assert len(first.fingerprint.split(":")) == 32
    assert stat.S_IMODE(first.key_file.stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate(first.cert_file.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1", "192.168.1.20"}
    assert isinstance(server_ssl_context(first.cert_file, first.key_file), ssl.SSLContext)

    again = self_signed_certificate(tmp_path, {"localhost", "192.168.1.20"})
    assert not again.created and again.fingerprint == first.fingerprint


def test_renewed_for_a_new_address_or_near_expiry(tmp_path: Path) -> None:
    first = self_signed_certificate(tmp_path, NAMES)
    moved = self_signed_certificate(tmp_path, {"localhost", "10.0.0.7"})
    assert moved.created and moved.fingerprint != first.fingerprint
    assert {"10.0.0.7", "192.168.1.20"} <= set(moved.names)  # old names kept
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=820)
    renewed = self_signed_certificate(tmp_path, {"localhost"}, now=later)
    assert renewed.created and renewed.fingerprint != moved.fingerprint


def test_a_key_that_does_not_match_is_a_clear_error(tmp_path: Path) -> None:
    one = self_signed_certificate(tmp_path / "one", {"localhost"})
    two = self_signed_certificate(tmp_path / "two", {"localhost"})
    with pytest.raises(TLSConfigError, match="cannot use"):
        server_ssl_context(one.cert_file, two.key_file)
    with pytest.raises(TLSConfigError, match="not found"):
        server_ssl_context(tmp_path / "missing.pem", two.key_file)


def test_names_cover_loopback_and_the_served_host() -> None:
    assert {"localhost", "127.0.0.1", "::1", "192.168.5.5"} <= names_to_cover("192.168.5.5")
    assert "0.0.0.0" not in names_to_cover("0.0.0.0")
