"""Keys never reach a file: the one way to give the judge its key is the environment variable named
by ``evaluation.judge.api_key_env``; a URL carrying credentials (``user:password@``, a key in the
query), and an ``api_key_env`` that is not a variable's name or looks like a key itself, are refused
where settings are checked (never repeating the value), and every log line, error message and stored
reply passes through :func:`redact` on its way out."""

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
    # user:password@host (a scheme is short: unbounded, a long run of letters took quadratic time)
    re.compile(r"([a-z][a-z0-9+.-]{0,31}://)[^/\s@\"']+@", re.I),
    re.compile(r"(?i)([?&;](?:[^=&#\s\"']{0,100}(?:key|token|secret|password|passwd|pwd|auth|credential)"
               r"[^=&#\s\"']{0,100}|sig|signature|code)=)[^&#\s\"']+"),
]


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # the name of an environment variable (POSIX shells')
ENV_NAME_LENGTH = 100
# what keys look like: a provider's prefix (OpenAI sk-/sk-proj-, Hugging Face hf_, GitHub ghp_/github_pat_,
# GitLab glpat-, Groq gsk_, xAI xai-, Slack xox?-, AWS AKIA..., Google AIza...) followed by the key, or a run of
# 20 or more letters and digits with no underscore that mixes both (no variable's name looks like that)
_KEY_LIKE = [
    re.compile(r"(?:sk|pk|rk|hf|ghp|gho|ghu|ghs|ghr|gsk|glpat|xai|xox[abpr]|github_pat)[-_][A-Za-z0-9_-]{12,}"),
    re.compile(r"AKIA[0-9A-Z]{16}"),
    re.compile(r"AIza[0-9A-Za-z_-]{30,}"),
]
_RUN = re.compile(r"[A-Za-z0-9]{20,}")


def looks_like_key(text: str) -> bool:
    """Whether ``text`` looks like an API key or token rather than the name of the variable that holds one
    (in time linear in its length)."""
    if any(p.match(text) for p in _KEY_LIKE):
        return True
    return any(re.search(r"[0-9]", run) and re.search(r"[A-Za-z]", run)
               for run in (m.group(0) for m in _RUN.finditer(text)))


def env_name_problem(value: str) -> str | None:
    """What is wrong with ``value`` as the name of the environment variable holding the judge's key, without
    repeating it (it may be the key itself), or None for a plain name (``OPENAI_API_KEY``)."""
    fix = ("put the key in an environment variable and give its name here (e.g. OPENAI_API_KEY); the value is "
           "not repeated")
    if looks_like_key(value):
        return f"looks like a key itself, not the name of an environment variable: {fix}"
    if ENV_NAME.fullmatch(value) is None:
        return (f"is not the name of an environment variable (letters, digits and _, not starting with a digit): "
                f"{fix}")
    if len(value) > ENV_NAME_LENGTH:
        return f"is longer than {ENV_NAME_LENGTH} characters, no environment variable's name: {fix}"
    return None


# the value given to api_key_env (a JSON or Python mapping, a flag): shown only when it is a variable's plain name
_ENV_SETTING = re.compile(r"(?i)(api[-_]key[-_]env[\"']?\s*[:=]?\s*[\"']?)([^\s\"',}&]+)")


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` with the given secrets, and anything that looks like an auth header, a key or
    credentials in a URL, replaced by ``[redacted]`` (a server that echoes its request puts the key
    in its error body)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    text = _ENV_SETTING.sub(lambda m: m.group(0) if env_name_problem(m.group(2)) is None
                            else m.group(1) + "[redacted]", text)
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
