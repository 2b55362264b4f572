"""Who may open the WebSocket: token and Origin checks on the opening handshake, without I/O.

Two threats: anyone on the network reaching a server that listens beyond loopback (answered by a mandatory token), and a
hostile web page in the user's own browser opening a socket to the server (cross-site WebSocket hijacking, answered by
checking `Origin`). Clients that are not browsers send no Origin and are judged by the token alone.

The token reaches the server once in the page's URL (`/?token=...`, the link the user opens on a phone); the page
answers with an HttpOnly, SameSite=Strict cookie and a redirect to the bare URL, so the token leaves the address bar,
the history and any Referer, and the browser sends it with the WebSocket handshake on its own. Scripts and other sites
never see it. Non-browser clients use `Authorization: Bearer` (or `?token=` on /ws).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from web.config import WebConfig

_WILDCARDS = ("0.0.0.0", "::", "")
TOKEN_COOKIE_MAX_AGE_S = 30 * 24 * 3600


@dataclass(frozen=True, slots=True)
class Denied:
    status: int
    reason: str


def _host_part(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def own_origins(config: WebConfig, port: int, local_hosts: Iterable[str] = ()) -> frozenset[str]:
    """The origins of pages this server itself serves: loopback names, the bound host and, when bound to every
    interface, `local_hosts` (this machine's name and LAN addresses); plus the configured allowlist."""
    hosts = {"127.0.0.1", "localhost", "[::1]"}
    if config.host not in _WILDCARDS:  # a wildcard address is never what a browser shows as the origin
        hosts.add(_host_part(config.host))
    else:
        hosts.update(_host_part(h) for h in local_hosts)
    default_port = 443 if config.tls else 80
    suffix = "" if port == default_port else f":{port}"
    own = frozenset(f"{config.scheme}://{h.lower()}{suffix}" for h in hosts)
    return own | frozenset(o.rstrip("/").lower() for o in config.allowed_origins)


def token_cookie_name(port: int) -> str:
    """Cookies ignore ports; the port in the name keeps two servers on one machine from overwriting each other's."""
    return f"voice_assistant_token_{port}"


def request_token(path: str, headers: Mapping[str, str], cookie_name: str | None = None) -> str | None:
    auth = headers.get("Authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    values = [v for k, v in parse_qsl(urlsplit(path).query) if k == "token"]
    if values:
        return values[0]
    if cookie_name is not None and (raw := headers.get("Cookie")):
        try:
            morsel = SimpleCookie(raw).get(cookie_name)
        except CookieError:
            return None
        return unquote(morsel.value) if morsel is not None else None
    return None


def token_matches(config: WebConfig, given: str) -> bool:
    return config.token is not None and hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), config.token.encode("utf-8")
    )


def same_origin_by_address(config: WebConfig, origin: str, host_header: str | None) -> bool:
    """True when a server bound to every interface is reached by IP address and the page's origin is that address.

    A LAN address cannot be listed in advance (DHCP), but the browser says which one it used in `Host`; an address,
    unlike a name, cannot be re-pointed at another machine by a hostile page (DNS rebinding), so Origin == Host is
    the server's own page."""
    if config.host not in _WILDCARDS or not host_header:
        return False
    parts = urlsplit(origin)
    if parts.scheme != config.scheme or not parts.hostname:
        return False
    try:
        ipaddress.ip_address(parts.hostname)
    except ValueError:
        return False
    return origin.lower() == f"{config.scheme}://{host_header.lower()}"


def check_websocket_access(
    config: WebConfig,
    port: int,
    path: str,
    headers: Mapping[str, str],
    origins: frozenset[str] | None = None,
) -> Denied | None:
    """None when the handshake may proceed, else the HTTP status and reason to refuse it with."""
    origin = headers.get("Origin")
    if origin is not None:
        allowed = origins if origins is not None else own_origins(config, port)
        origin = origin.rstrip("/")
        if origin.lower() not in allowed and not same_origin_by_address(config, origin, headers.get("Host")):
            shown = origin[:100]
            return Denied(403, f"origin {shown!r} is not allowed (start the server with --allow-origin {shown})")
    if config.token is not None:
        given = request_token(path, headers, token_cookie_name(port))
        if given is None:
            return Denied(401, "a token is required: open the page as /?token=... or send 'Authorization: Bearer'")
        if not token_matches(config, given):
            return Denied(401, "invalid token")
    return None


@dataclass(frozen=True, slots=True)
class TokenRedirect:
    """The page was opened with `?token=`: set the cookie and send the browser to `location`, the URL without it."""

    location: str
    set_cookie: str


def page_token_redirect(config: WebConfig, port: int, path: str) -> TokenRedirect | Denied | None:
    """What to do with a page request that may carry `?token=`: None to serve it as is, a redirect that moves a valid
    token into a cookie, or a refusal of a wrong one (before any cookie is set)."""
    parts = urlsplit(path)
    query = parse_qsl(parts.query, keep_blank_values=True)
    given = [value for key, value in query if key == "token"]
    if not given:
        return None
    if config.token is None:
        return TokenRedirect(_without_token(parts.path, query), "")
    if not token_matches(config, given[0]):
        return Denied(401, "invalid token")
    value = quote(config.token, safe="")
    cookie = f"{token_cookie_name(port)}={value}; Path=/; Max-Age={TOKEN_COOKIE_MAX_AGE_S}; HttpOnly; SameSite=Strict"
    if config.tls:
        cookie += "; Secure"
    return TokenRedirect(_without_token(parts.path, query), cookie)


def _without_token(path: str, query: list[tuple[str, str]]) -> str:
    rest = [(k, v) for k, v in query if k != "token"]
    return (path or "/") + (f"?{urlencode(rest)}" if rest else "")
