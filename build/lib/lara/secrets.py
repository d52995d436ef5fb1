"""Keys never reach a file: the one way to give the judge its key is the environment variable named
by ``evaluation.judge.api_key_env``; a URL carrying credentials (``user:password@``, a key in the
query) is refused where settings are checked, and every log line, error message and stored reply
passes through :func:`redact` on its way out."""

from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl, urlsplit

# query parameters that carry a credential (api-key=, access_token=, sig=, ...)
SECRET_QUERY = re.compile(r"(?i)^(?:.*(?:key|token|secret|password|passwd|pwd|auth|credential).*|sig|signature|code)$")

_PATTERNS = [
    re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(bearer\s+)?[^\s\"',}]+"),
    re.compile(r"(?i)(bearer\s+)[^\s\"',}]+"),
    re.compile(r"(?i)((?:api[-_]?key|x-api-key)[\"']?\s*[:=]\s*[\"']?)[^\s\"',}&]+"),
    re.compile(r"\b(sk-)[A-Za-z0-9_\-]{8,}"),
    re.compile(r"([a-z][a-z0-9+.-]*://)[^/\s@\"']+@", re.I),  # user:password@host
    re.compile(r"(?i)([?&;](?:[^=&#\s\"']*(?:key|token|secret|password|passwd|pwd|auth|credential)[^=&#\s\"']*"
               r"|sig|signature|code)=)[^&#\s\"']+"),
]


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` with the given secrets, and anything that looks like an auth header, a key or
    credentials in a URL, replaced by ``[redacted]`` (a server that echoes its request puts the key
    in its error body)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + "[redacted]" + ("@" if m.group(0).endswith("@") else ""), text)
    return text


def url_credentials(url: str) -> list[str]:
    """What in ``url`` is a credential (named, never shown): its user info, its credential-like query keys."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = ["user:password@" if parts.password is not None else "a user name@"] if parts.username else []
    found += [f"the query parameter {k}" for k, _ in parse_qsl(parts.query, keep_blank_values=True)
              if SECRET_QUERY.match(k)]
    return found


class RedactingFilter(logging.Filter):
    """Log filter that runs every record's message through :func:`redact`."""

    def __init__(self, secrets: tuple[str, ...] = ()):
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message, self.secrets)
        if clean != message:
            record.msg, record.args = clean, None
        return True
