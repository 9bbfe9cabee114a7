"""Backend URLs in messages: redaction that fails closed, scrubbing secrets out of error
text, strict checks before a URL reaches a driver, and escaping of control characters.

Every message, log line, ``repr`` and status output that shows a backend URL goes through
:func:`redact`; every error text from a driver that may quote one goes through :func:`scrub`.
Neither trusts the URL to parse: the password is whatever follows the first ``:`` of
everything between ``//`` and the *last* ``@`` (so an unescaped ``/``, ``?``, ``#`` or ``@`` in
it is still hidden), and a URL whose redacted form does not parse is shown as
:data:`PLACEHOLDER`.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

__all__ = ["PLACEHOLDER", "redact", "scrub", "secrets_of", "check_url", "escape_control", "url_problem"]

PLACEHOLDER = "<unparseable URL>"

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
# Schemes whose path is a file name (may hold '@'): credentials could only sit in an authority.
_PATH_SCHEMES = ("sqlite", "file", "memory", "unix")
# Query keys whose values are secrets (libpq password / sslpassword, tokens, keys...).
_SECRET_KEYS = ("pass", "pwd", "secret", "token", "key", "cred")
# A URL without a scheme is shown only when it cannot be a credential (``bogus``, ``./x.db``).
_PLAIN = re.compile(r"[A-Za-z0-9._/~\-]*")
# C0 controls, DEL, C1 controls, and the Unicode line separators and bidi overrides.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def escape_control(text: str) -> str:
    """``text`` with control characters (C0, DEL, C1, ESC, line separators, bidi overrides)
    written as ``\\xNN`` / ``\\uNNNN``, so a value read from a lock service cannot drive the
    terminal it is printed on."""

    def esc(m: re.Match[str]) -> str:
        c = ord(m.group())
        return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"

    return _CONTROL.sub(esc, text)


def _split(url: str) -> tuple[str, str, str | None, str, str | None, str | None] | None:
    """(scheme, '//' or '', userinfo, host and path, query, fragment), split loosely: the
    userinfo runs to the last '@'. ``None`` without a scheme."""
    m = _SCHEME.match(url)
    if m is None:
        return None
    scheme, body = m.group(1), url[m.end():]
    prefix = "//" if body.startswith("//") else ""
    body = body[len(prefix):]
    if scheme.lower() in _PATH_SCHEMES:
        # Only an authority can hold credentials; the path may hold '@' of its own.
        end = len(body) if not prefix else next((i for i, c in enumerate(body) if c in "/?#"), len(body))
        at = body.rfind("@", 0, end) if prefix else -1
    else:
        at = body.rfind("@")
    userinfo = body[:at] if at >= 0 else None
    rest = body[at + 1:] if at >= 0 else body
    rest, hash_, fragment = rest.partition("#")
    hostpath, q, query = rest.partition("?")
    return scheme, prefix, userinfo, hostpath, (query if q else None), (fragment if hash_ else None)


def _secret_key(key: str) -> bool:
    k = unquote(key).lower()
    return any(s in k for s in _SECRET_KEYS)


def redact(url: object) -> str:
    """``url`` fit for a message: the password (and any secret query value) replaced by
    ``***``, the fragment dropped, control characters escaped; :data:`PLACEHOLDER` when the
    result would not parse as a URL. Never raises, never returns the secret."""
    try:
        if not isinstance(url, str):
            return PLACEHOLDER
        parts = _split(url)
        if parts is None:
            return escape_control(url) if _PLAIN.fullmatch(url) else PLACEHOLDER
        scheme, prefix, userinfo, hostpath, query, fragment = parts
        out = f"{scheme}:{prefix}"
        if userinfo is not None:
            user, colon, _ = userinfo.partition(":")
            out += f"{user}:***@" if colon else "***@"
        out += hostpath
        if query is not None:
            items = []
            for item in re.split(r"([&;])", query):
                key, eq, _ = item.partition("=")
                items.append(f"{key}=***" if eq and _secret_key(key) else item)
            out += "?" + "".join(items)
        if fragment:
            out += "#***"
        urlsplit(out)  # raises on what no driver would read (an unclosed '[')
        return escape_control(out)
    except Exception:  # noqa: BLE001 - fail closed
        return PLACEHOLDER


def secrets_of(url: object, *, user_only: bool = True) -> list[str]:
    """The strings of ``url`` that must not appear in a message, longest first: the
    password (raw, percent-decoded, and with the delimiters a driver may strip from an
    unescaped one), a user-only userinfo (unless ``user_only`` is false), and the values of
    secret query keys."""
    if not isinstance(url, str):
        return []
    found: set[str] = set()
    parts = _split(url)
    if parts is not None:
        _, _, userinfo, _, query, fragment = parts
        if userinfo is not None:
            _, colon, pw = userinfo.partition(":")
            # A userinfo without ':' is a user name to most drivers, but may be a misplaced
            # password: scrubbed too, unless too short to scrub without mangling the message.
            secret = pw if colon else (userinfo if user_only and len(userinfo) >= 4 else "")
            found.update((secret, unquote(secret)))
            found.add(re.sub(r"[/?#@:]", "", secret))
            found.update(p for p in re.split(r"[/?#@:]", secret) if len(p) >= 3)
        for item in re.split(r"[&;]", query or ""):
            key, eq, value = item.partition("=")
            if eq and _secret_key(key):
                found.update((value, unquote(value), unquote(value.replace("+", " "))))
        if fragment:
            found.add(fragment)
    # As a driver's message may quote them: repr-escaped, or escaped by escape_control.
    found.update([repr(s)[1:-1] for s in found] + [escape_control(s) for s in found])
    return sorted((s for s in found if s), key=len, reverse=True)


def scrub(text: object, url: object, *, escape: bool = True) -> str:
    """``text`` (an error message from a driver, which may quote ``url`` or parts of it) with
    the URL redacted, its secrets replaced by ``***`` and (``escape``) control characters
    escaped."""
    out = str(text)
    if isinstance(url, str) and url:
        out = out.replace(url, redact(url))
        for s in secrets_of(url):
            out = out.replace(s, "***")
    return escape_control(out) if escape else out


def url_problem(url: str) -> str | None:
    """Why ``url`` (a URL with an authority: redis, postgresql, etcd...) would be misread by
    a driver in a way that can put its secret in an error or on the wire, or ``None``. The
    reason never quotes the URL."""
    parts = _split(url)
    if parts is None:
        return "not a URL (SCHEME://...)"
    scheme, prefix, userinfo, hostpath, query, fragment = parts
    if _CONTROL.search(url) or any(c.isspace() for c in url):
        return "the URL holds a space or control character (percent-encode it)"
    if userinfo is not None and prefix:
        # An authority ends at the first '/', '?' or '#': an '@' after one means the user name or
        # password holds it unescaped, and a driver would read part of the password as host or path.
        if any(c in userinfo for c in "/?#@"):
            return "the user name or password holds '/', '?', '#' or '@': percent-encode it (%2F, %3F, %23, %40)"
        if _BAD_ESCAPE.search(userinfo):
            return "bad percent-escape in the user name or password (write '%' as %25)"
    if _BAD_ESCAPE.search(hostpath) or _BAD_ESCAPE.search(query or "") or _BAD_ESCAPE.search(fragment or ""):
        return "bad percent-escape in the URL (write '%' as %25)"
    if hostpath.count("[") != hostpath.count("]"):
        return "unbalanced '[' in the host (an IPv6 address is written [ADDRESS]:PORT)"
    return None


def check_url(url: str) -> None:
    """Raise ``ValueError`` (with the redacted URL, never the raw one) when
    :func:`url_problem` finds one."""
    why = url_problem(url)
    if why is not None:
        raise ValueError(f"bad URL {redact(url)}: {why}")
