"""HTTPS for the browser client: the user's own certificate, or a self-signed one made once and kept in the cache.

A browser grants the microphone only to a secure context: `http://127.0.0.1` counts, `http://192.168.1.20` does not.
So talking from a phone on the home network needs HTTPS. `--self-signed` makes an ECDSA P-256 certificate with the
`cryptography` library, valid for localhost, the loopback addresses, this machine's name and its LAN addresses (plus
the served host), and keeps it under the cache so a phone that accepted it once keeps trusting the same key. It is
made again only when it no longer covers the names needed (a new LAN address) or is about to expire. Its SHA-256
fingerprint is printed at start: compare it with what the phone's browser shows before accepting the warning.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CERT_NAME = "self-signed-cert.pem"
KEY_NAME = "self-signed-key.pem"
VALID_DAYS = 825  # the longest validity Apple's platforms accept for a TLS server certificate
RENEW_BEFORE_DAYS = 30
_WILDCARDS = ("0.0.0.0", "::", "")


class TLSConfigError(ValueError):
    """The certificate or key cannot be used; the message says which file and why."""


@dataclass(frozen=True, slots=True)
class Certificate:
    cert_file: Path
    key_file: Path
    fingerprint: str  # SHA-256 of the DER certificate, as colon-separated hex (what browsers show)
    names: tuple[str, ...]  # DNS names and IP addresses it is valid for
    created: bool  # made on this start (False: reused from the cache)


def server_ssl_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A TLS server context for the certificate chain and key; TLS 1.2 at least."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except FileNotFoundError as err:
        raise TLSConfigError(f"TLS file not found: {err.filename}") from None
    except ssl.SSLError as err:
        raise TLSConfigError(f"cannot use {cert_file} with {key_file}: {err.reason or err}") from None
    return context


def local_addresses() -> set[str]:
    """This machine's own IP addresses as other devices on the network see them (best effort, no traffic sent)."""
    found: set[str] = set()
    for probe_family, probe_address in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        # connect() on a UDP socket only picks the outgoing interface; no packet leaves the machine
        try:
            with socket.socket(probe_family, socket.SOCK_DGRAM) as probe:
                probe.connect((probe_address, 9))
                found.add(probe.getsockname()[0])
        except OSError:
            continue
    with contextlib.suppress(OSError):
        found.update(str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None))
    return {address.split("%")[0] for address in found}


def names_to_cover(host: str) -> set[str]:
    """Every name and address a browser may use to reach a server bound to `host`."""
    names = {"localhost", "127.0.0.1", "::1"}
    hostname = socket.gethostname()
    if hostname:
        names.update({hostname, f"{hostname}.local"} if "." not in hostname else {hostname})
    if host not in _WILDCARDS:
        names.add(host)
    else:
        names.update(local_addresses())
    return names


def fingerprint_sha256(cert_pem: bytes) -> str:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    digest = x509.load_pem_x509_certificate(cert_pem).fingerprint(hashes.SHA256())
    return ":".join(f"{byte:02X}" for byte in digest)


def self_signed_certificate(cache_dir: Path, names: Iterable[str], now: dt.datetime | None = None) -> Certificate:
    """The cached self-signed certificate when it covers `names` and is not about to expire, else a new one."""
    now = now or dt.datetime.now(dt.UTC)
    wanted = {_normal(name) for name in names}
    cert_file, key_file = cache_dir / CERT_NAME, cache_dir / KEY_NAME
    if cert_file.is_file() and key_file.is_file():
        covered = _covered_names(cert_file.read_bytes(), now)
        if covered is not None and wanted <= covered:
            return Certificate(
                cert_file, key_file, fingerprint_sha256(cert_file.read_bytes()), tuple(sorted(covered)), created=False
            )
        wanted |= covered or set()  # keep the names it had, so a device that used one of them still matches
    cert_pem, key_pem = _make_certificate(sorted(wanted), now)
    cache_dir.mkdir(parents=True, exist_ok=True)
    _write_private(key_file, key_pem)
    cert_file.write_bytes(cert_pem)
    return Certificate(cert_file, key_file, fingerprint_sha256(cert_pem), tuple(sorted(wanted)), created=True)


def _normal(name: str) -> str:
    name = name.strip("[]").lower()
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


def _covered_names(cert_pem: bytes, now: dt.datetime) -> set[str] | None:
    """The names a cached certificate is valid for, or None when it is unreadable or expires soon."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    if cert.not_valid_after_utc - now < dt.timedelta(days=RENEW_BEFORE_DAYS) or cert.not_valid_before_utc > now:
        return None
    names = {_normal(n) for n in san.get_values_for_type(x509.DNSName)}
    names |= {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return names


def _make_certificate(names: list[str], now: dt.datetime) -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "voice-assistant on " + (socket.gethostname() or "localhost")[:40]),
        ]
    )
    alt_names: list[x509.GeneralName] = []
    for name in names:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt_names.append(x509.DNSName(name))
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _write_private(path: Path, data: bytes) -> None:
    """Write a private key readable by this user only, never world-readable even for a moment."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
