"""The ingest key of a request: ``Authorization: Bearer <key>``, or HTTP Basic with a key pair.

Basic is how the Langfuse SDK (and other clients made for a public/secret key pair) authenticate:
``Basic base64(<public key>:<secret key>)``. The secret key is the project's ingest key itself
(``td_<prefix>_<secret>``), checked exactly like a Bearer key (same memory of checked keys, same
revocation); the public key is that key's public part, ``td_<prefix>``, as the Settings page lists
it. A pair whose halves do not belong together is refused before the key is even looked up, so it
neither authenticates nor counts as a use of the key.
"""

from __future__ import annotations

import base64
import binascii

from projects.models import ApiKey
from projects.services import (api_key_authenticate, api_key_authenticate_cached, api_key_public_key,
                               api_key_record_use, api_key_use_due)

from config.fast_path import db_call
from .http import ApiError

_SCHEMES = "'Bearer <key>' or 'Basic base64(<public key>:<key>)'"


def _bad_authorization(problem: str, scheme: str = "Bearer") -> ApiError:
    return ApiError(401, "bad_authorization", problem, headers={"WWW-Authenticate": scheme})


def _basic_pair(credentials: str) -> tuple[str, str]:
    """(secret key, public key) from Basic credentials, or an ApiError (401) naming the problem."""
    scheme = 'Basic realm="tracedash"'
    try:
        decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):  # not base64, or not UTF-8 text once decoded
        raise _bad_authorization("the Basic credentials are not valid base64 of '<public key>:<key>'", scheme) from None
    public, colon, secret = decoded.partition(":")
    if not colon:
        raise _bad_authorization("the Basic credentials have no ':' between the public key and the key", scheme)
    if not public.strip() or not secret.strip():
        raise _bad_authorization("the Basic credentials need both a public key and a key, "
                                 "'<public key>:<key>'", scheme)
    return secret.strip(), public.strip()


def _credentials(request) -> tuple[str, str | None]:
    """(key, public key or None for Bearer) from the Authorization header, or an ApiError (401)
    saying what is wrong."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    value = value.strip()
    if not header:
        raise ApiError(401, "missing_key", "send the project's ingest key as 'Authorization: Bearer <key>' "
                       "(or 'Authorization: Basic base64(<public key>:<key>)')",
                       headers={"WWW-Authenticate": "Bearer"})
    if scheme.lower() == "bearer" and value:
        return value, None
    if scheme.lower() == "basic" and value:
        return _basic_pair(value)
    raise _bad_authorization(f"the Authorization header must be {_SCHEMES}")


def _invalid_key() -> ApiError:
    return ApiError(401, "invalid_key", "the ingest key is unknown or revoked",
                    headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})


def _key_of(request) -> str:
    """The key to authenticate; for a Basic pair, only when its public key is the key's own."""
    raw_key, public = _credentials(request)
    if public is None:
        return raw_key
    expected = api_key_public_key(raw_key=raw_key)
    if expected is None:  # not a tracedash key at all (a Langfuse sk-lf-… key, say)
        raise _invalid_key()
    if public != expected:
        raise ApiError(401, "invalid_key",
                       "the public key (the Basic user name) does not belong to this key: it must be the key's "
                       "public key as Settings lists it, td_ and the key's 12 hex characters",
                       headers={"WWW-Authenticate": 'Basic realm="tracedash"'})
    return raw_key


def authenticate_request(request) -> ApiKey:
    """The ingest key from ``Authorization: Bearer <key>`` or Basic, or an ApiError (401)."""
    key = api_key_authenticate(raw_key=_key_of(request))
    if key is None:
        raise _invalid_key()
    return key


async def authenticate_request_async(request) -> ApiKey:
    """``authenticate_request`` for async views: a key this process checked recently is answered
    from memory on the event loop; otherwise (and for the once-a-minute "last used" write) the
    database is asked in a thread."""
    token = _key_of(request)
    key = api_key_authenticate_cached(raw_key=token)
    if key is None:
        key = await db_call(api_key_authenticate, raw_key=token)
        if key is None:
            raise _invalid_key()
    elif api_key_use_due(key=key):
        await db_call(api_key_record_use, key=key)
    return key
