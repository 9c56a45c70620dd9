"""Who calls the JSON API (/api/v1/...) and /metrics: the same login as the page, given the way a script gives it.

A script sends ``Authorization: Basic`` with the page's user and password (serve --auth), or ``Authorization:
Bearer`` with one of the tokens of serve --api-token FILE (one a line: each is a login of its own, so the scripts
of two colleagues do not see each other's jobs); a browser that has logged in to the page may call it with its
cookie. The answer is the caller's login, as a name the API's jobs are owned by ("basic:wan", "token:2",
"page:<token>"). A server with no password and no tokens (the default, on this machine only) has one login for
everyone, "local".
"""
from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass
from pathlib import Path

LOCAL = "local"
# A token shorter than this is refused when the file is read: a guessable token is no login.
SHORTEST_TOKEN = 16


class TokenFileError(ValueError):
    """The --api-token file cannot be used; the message says why."""


def read_tokens(path: str | Path) -> tuple[str, ...]:
    """The tokens in ``path``: one a line, blank lines and lines starting with # left out."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"--api-token {path}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    tokens = tuple(line.strip() for line in lines if line.strip() and not line.strip().startswith("#"))
    if not tokens:
        raise TokenFileError(f"--api-token {path}: holds no token (one a line)")
    short = [number for number, token in enumerate(tokens, 1) if len(token) < SHORTEST_TOKEN or " " in token]
    if short:
        raise TokenFileError(f"--api-token {path}: token {short[0]} is shorter than {SHORTEST_TOKEN} characters or "
                             "holds a space; use long random tokens (python -c \"import secrets; "
                             "print(secrets.token_urlsafe(32))\")")
    return tokens


@dataclass(frozen=True)
class Credentials:
    """What a request says of its caller: its Authorization header and the page's login cookie (a token), if any."""
    authorization: str = ""
    page_token: str | None = None


@dataclass(frozen=True)
class ApiLogins:
    """Checks a caller against the page's accounts (gradio's ``auth``: {user: password}, or None: no password) and
    the API's tokens."""
    tokens: tuple[str, ...] = ()

    def needed(self, accounts) -> bool:
        """Whether the API needs a login at all (a password or tokens)."""
        return accounts is not None or bool(self.tokens)

    def login(self, credentials: Credentials, accounts, page_tokens) -> tuple[str | None, bool]:
        """(the caller's login, or None; whether it tried credentials that were wrong, which counts as a wrong
        password). ``page_tokens``: the page's live login tokens (gradio's)."""
        if not self.needed(accounts):
            return LOCAL, False
        scheme, _, value = credentials.authorization.strip().partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "bearer" and value:
            # Compared as bytes: compare_digest refuses str that is not ASCII (a header may hold any letter).
            given = value.encode("utf-8", "surrogateescape")
            number = next((i for i, token in enumerate(self.tokens, 1)
                           if hmac.compare_digest(token.encode("utf-8", "surrogateescape"), given)), None)
            return (f"token:{number}", False) if number else (None, True)
        if scheme == "basic" and value:
            user = _basic_user(value, accounts)
            return (f"basic:{user}", False) if user else (None, True)
        if credentials.authorization.strip():
            return None, True
        if credentials.page_token and credentials.page_token in (page_tokens or {}):
            return f"page:{credentials.page_token}", False
        return None, False


def _basic_user(value: str, accounts) -> str | None:
    """The user of a Basic credential whose password is the account's, else None (callable accounts are none of
    this app's: serve --auth gives one user and password)."""
    try:
        user, sep, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    if not sep or not isinstance(accounts, dict) or user not in accounts:
        return None
    return user if hmac.compare_digest(str(accounts[user]).encode(), password.encode("utf-8", "surrogateescape")) \
        else None
